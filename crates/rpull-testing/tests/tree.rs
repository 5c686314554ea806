//! Tree snapshots, `diff`, `layer_from_dir` and umoci, checked against each other.

use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::Path;

use anyhow::Result;
use rpull_testing::{
    Compression, DiffOptions, EntryKind, ImageBuilder, LayerBuilder, TreeSnapshot,
    assert_trees_equal, diff, layer_from_dir, umoci_unpack,
};

fn set_mtime(path: &Path, secs: i64) {
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// A tree with one of everything we can make without privileges (plus an xattr if supported).
fn sample_tree(root: &Path) {
    fs::create_dir_all(root.join("dir/sub")).unwrap();
    fs::write(root.join("dir/file"), "content").unwrap();
    fs::set_permissions(root.join("dir/file"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::write(root.join("a"), "hardlinked").unwrap();
    fs::hard_link(root.join("a"), root.join("dir/a-link")).unwrap();
    symlink("../a", root.join("dir/sub/up")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        0o600.into(),
        0,
    )
    .unwrap();
    fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"bad-\xff-name")),
        "x",
    )
    .unwrap();
    let _ = xattr::set(root.join("dir/file"), "user.rpull", b"value");
    // Every file gets a fixed time: two trees made across a second boundary differ otherwise.
    let files: [&[u8]; 5] = [b"a", b"dir/file", b"dir/sub/up", b"fifo", b"bad-\xff-name"];
    for path in files {
        set_mtime(&root.join(std::ffi::OsStr::from_bytes(path)), 1_600_000_000);
    }
}

#[test]
fn identical_trees_have_no_differences_and_changes_are_named() -> Result<()> {
    let work = tempfile::tempdir()?;
    let (left, right) = (work.path().join("left"), work.path().join("right"));
    sample_tree(&left);
    sample_tree(&right);
    let options = DiffOptions::default();
    assert_trees_equal(
        &TreeSnapshot::capture(&left)?,
        &TreeSnapshot::capture(&right)?,
        &options,
    );

    let snapshot = TreeSnapshot::capture(&left)?;
    assert_eq!(snapshot.get("dir/file").unwrap().mode, 0o4755);
    assert_eq!(snapshot.get("fifo").unwrap().kind, EntryKind::Fifo);
    assert_eq!(
        snapshot.get("dir/sub/up").unwrap().link_target.as_deref(),
        Some(&b"../a"[..])
    );
    assert!(snapshot.get(b"bad-\xff-name").is_some());
    assert_eq!(snapshot.hardlink_groups().len(), 1);

    // Each change must be reported, naming the path.
    fs::write(right.join("dir/file"), "CONTENT")?;
    fs::set_permissions(right.join("dir/file"), fs::Permissions::from_mode(0o755))?;
    fs::remove_file(right.join("dir/sub/up"))?;
    symlink("../b", right.join("dir/sub/up"))?;
    fs::remove_file(right.join("dir/a-link"))?;
    fs::write(right.join("dir/a-link"), "hardlinked")?;
    fs::write(right.join("extra"), "")?;
    set_mtime(&right.join("a"), 1_600_000_001);
    std::os::unix::fs::lchown(right.join("fifo"), Some(1234), Some(1234))?;
    let differences = diff(
        &TreeSnapshot::capture(&left)?,
        &TreeSnapshot::capture(&right)?,
        &options,
    );
    let text = differences.join("\n");
    for expected in [
        "dir/file: mode 4755 vs 755",
        "dir/file: content",
        "dir/sub/up: symlink target ../a vs ../b",
        "hardlink group [a, dir/a-link] only in",
        "extra: only in",
        "a: mtime 1600000000",
        "fifo: owner 0:0 vs 1234:1234",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // Options turn comparisons off.
    let relaxed = DiffOptions {
        mtimes: false,
        owners: false,
        hardlinks: false,
        ..DiffOptions::default()
    }
    .ignore("extra");
    let text = diff(
        &TreeSnapshot::capture(&left)?,
        &TreeSnapshot::capture(&right)?,
        &relaxed,
    )
    .join("\n");
    assert!(
        !text.contains("mtime")
            && !text.contains("owner")
            && !text.contains("hardlink")
            && !text.contains("extra"),
        "{text}"
    );
    Ok(())
}

/// layer_from_dir -> OCI layout -> umoci unpack must reproduce the source tree exactly.
#[test]
fn umoci_unpacks_a_dir_layer_identically() -> Result<()> {
    let work = tempfile::tempdir()?;
    let src = work.path().join("src");
    sample_tree(&src);
    std::os::unix::fs::lchown(src.join("dir/sub"), Some(1000), Some(1001))?;
    // umoci 0.4.7 (Debian) knows no zstd layers.
    for compression in [Compression::Gzip, Compression::None] {
        let name = format!("{compression:?}");
        let layer = layer_from_dir(
            &src,
            compression,
            &work.path().join(format!("layer-{name}")),
        )?;
        let image = ImageBuilder::new().image_layer(layer).build();
        let layout = work.path().join("layout");
        image.write_oci_layout(&layout, &name)?;
        let Some(rootfs) =
            umoci_unpack(&layout, &name, &work.path().join(format!("bundle-{name}")))?
        else {
            eprintln!("skipped: umoci not installed (apt-get install -y umoci)");
            return Ok(());
        };
        assert_trees_equal(
            &TreeSnapshot::capture(&src)?,
            &TreeSnapshot::capture(&rootfs)?,
            &DiffOptions::default(),
        );
    }
    Ok(())
}

/// A layered fixture image unpacked by umoci: whiteouts, opaque dirs, hardlinks, xattrs and
/// owners come out as the builder meant them.
#[test]
fn umoci_applies_builder_layers() -> Result<()> {
    let work = tempfile::tempdir()?;
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/keep", "keep", 0o644)
                .file("etc/gone", "gone", 0o644)
                .dir("var", 0o755)
                .file("var/old", "old", 0o644)
                .file_with("home", "owned", |h| {
                    h.set_uid(1000);
                    h.set_gid(1000);
                    h.set_mtime(1_234_567_890);
                }),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new()
                .whiteout("etc/gone")
                .opaque("var")
                .file("var/new", "new", 0o600)
                .xattr("bin", "user.note", "hi")
                .file("bin", "#!/bin/sh\n", 0o755)
                .hardlink("bin2", "bin")
                .symlink("link", "/etc/keep"),
            Compression::None,
        )
        .build();
    let layout = work.path().join("layout");
    image.write_oci_layout(&layout, "t")?;
    let Some(rootfs) = umoci_unpack(&layout, "t", &work.path().join("bundle"))? else {
        eprintln!("skipped: umoci not installed (apt-get install -y umoci)");
        return Ok(());
    };
    let tree = TreeSnapshot::capture(&rootfs)?;
    let paths: Vec<String> = tree
        .paths()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    assert_eq!(
        paths,
        [
            "bin", "bin2", "etc", "etc/keep", "home", "link", "var", "var/new"
        ]
    );
    let home = tree.get("home").unwrap();
    assert_eq!(
        (home.uid, home.gid, home.mtime.0),
        (1000, 1000, 1_234_567_890)
    );
    assert_eq!(tree.get("var/new").unwrap().mode, 0o600);
    assert_eq!(tree.hardlink_groups().len(), 1);
    if xattr::SUPPORTED_PLATFORM {
        let bin = tree.get("bin").unwrap();
        assert_eq!(
            bin.xattrs.get(&b"user.note"[..]).map(Vec::as_slice),
            Some(&b"hi"[..]),
            "{:?}",
            bin.xattrs
        );
    }
    Ok(())
}
