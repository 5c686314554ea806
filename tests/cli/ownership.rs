//! Owners and special files: applied as root, dropped with `--no-chown`, and automatically off
//! for an unprivileged user (with one warning for skipped device nodes).

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rpull_testing::{
    Compression, EntryType, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry,
};

use crate::common::{Sandbox, block_on};

const NOBODY: u32 = 65534;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `home/user` (a directory owned by 1000:1000) and `home/user/file` (owned by 1000:1001).
fn owned_layer() -> LayerBuilder {
    LayerBuilder::new()
        .entry_with("home/user", EntryType::Directory, [], |h| {
            h.set_mode(0o750);
            h.set_uid(1000);
            h.set_gid(1000);
        })
        .file_with("home/user/file", "mine\n", |h| {
            h.set_uid(1000);
            h.set_gid(1001);
        })
}

fn owner(path: PathBuf) -> (u32, u32) {
    let meta =
        std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.uid(), meta.gid())
}

#[test]
fn no_chown_leaves_files_to_the_current_user() {
    if !is_root() {
        eprintln!("skipped: owners from layers are only applied when running as root");
        return;
    }
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let image = ImageBuilder::new()
        .layer(owned_layer(), Compression::Gzip)
        .build();
    block_on(registry.push_image(&image, "owned:1")).expect("push");
    let reference = registry.reference("owned:1");
    let sandbox = Sandbox::new();

    let chowned = sandbox.join("chowned");
    sandbox.rpull().pull(&reference, &chowned).success();
    assert_eq!(owner(chowned.join("home/user")), (1000, 1000));
    assert_eq!(owner(chowned.join("home/user/file")), (1000, 1001));

    let plain = sandbox.join("plain");
    sandbox
        .rpull()
        .arg("--no-chown")
        .pull(&reference, &plain)
        .success();
    assert_eq!(owner(plain.join("home/user")), (0, 0));
    assert_eq!(owner(plain.join("home/user/file")), (0, 0));
    assert_eq!(
        std::fs::read_to_string(plain.join("home/user/file")).unwrap(),
        "mine\n"
    );
}

fn make_world_writable(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

#[test]
fn unprivileged_user_skips_owners_and_devices_with_one_warning() {
    if !is_root() {
        eprintln!("skipped: needs root to run rpull as another user");
        return;
    }
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let image = ImageBuilder::new()
        .layer(
            owned_layer().char_device("dev/null", 0o666, 1, 3),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new()
                .block_device("dev/loop0", 0o660, 7, 0)
                .file("after", "x", 0o644),
            Compression::Zstd,
        )
        .build();
    block_on(registry.push_image(&image, "dev:1")).expect("push");
    let sandbox = Sandbox::new();
    make_world_writable(sandbox.path());
    make_world_writable(&sandbox.home());
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .run_as(NOBODY, NOBODY)
        .arg("--json")
        .pull(&registry.reference("dev:1"), &dest);
    outcome.success();
    assert_eq!(owner(dest.join("home/user/file")), (NOBODY, NOBODY));
    assert_eq!(std::fs::read_to_string(dest.join("after")).unwrap(), "x");
    assert!(
        std::fs::symlink_metadata(dest.join("dev/null")).is_err(),
        "no device node as non-root"
    );
    assert!(
        std::fs::symlink_metadata(dest.join("dev/loop0")).is_err(),
        "no device node as non-root"
    );
    let warnings: Vec<&str> = outcome.stderr.lines().collect();
    assert_eq!(
        warnings.len(),
        1,
        "exactly one warning about skipped devices\n{outcome}"
    );
    assert!(
        warnings[0].contains("WARN") && warnings[0].contains("device"),
        "{outcome}"
    );
}
