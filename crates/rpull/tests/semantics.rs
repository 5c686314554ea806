//! OCI layer semantics (image-spec `layer.md`), through a real registry: one multi-layer fixture
//! with every kind of entry, checked entry by entry and compared with `umoci unpack`'s rootfs.

mod common;

use std::collections::BTreeSet;

use common::{Env, chain, is_root, snapshot};
use rpull::{ExtractOptions, PullOptions};
use rpull_testing::{
    Compression, DiffOptions, EntryKind, EntryType, Header, Image, ImageBuilder, LayerBuilder,
    TreeEntry, TreeSnapshot, assert_trees_equal, diff, umoci_unpack,
};

const T0: u64 = 1_700_000_000;
const T1: u64 = 1_710_000_000;
const T3: u64 = 1_720_000_000;
const OLD: u64 = 1_600_000_000;

/// `security.capability` v2 (`VFS_CAP_REVISION_2`) with the effective flag and `cap_net_raw`
/// (bit 13) permitted: what `setcap cap_net_raw+ep` writes.
const CAP_NET_RAW: [u8; 20] = [
    1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

fn long_dir() -> String {
    format!("long/{}", "d".repeat(60))
}
/// 127 bytes: a GNU long-name entry (`././@LongLink`).
fn gnu_long_file() -> String {
    format!("{}/{}", long_dir(), "f".repeat(60))
}
/// A PAX `path` record.
fn pax_long_file() -> String {
    format!("long/{}", "p".repeat(120))
}
/// Over 100 bytes: a GNU long link target.
fn long_symlink_target() -> String {
    format!("{}/{}", "d".repeat(60), "f".repeat(60))
}
/// Carried by a PAX `linkpath` record.
fn pax_link_target() -> String {
    format!("/{}", "q".repeat(150))
}

/// One PAX record, `"<len> key=value\n"` where len counts the whole record.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut length = rest + 1;
    while length != rest + length.to_string().len() {
        length = rest + length.to_string().len();
    }
    let mut out = format!("{length} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

fn owned(uid: u64, gid: u64, mode: u32, mtime: Option<u64>) -> impl FnOnce(&mut Header) {
    move |h: &mut Header| {
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mode(mode);
        if let Some(mtime) = mtime {
            h.set_mtime(mtime);
        }
    }
}

fn layer0() -> LayerBuilder {
    let mut layer = LayerBuilder::new()
        .dir("bin", 0o755)
        .dir("dev", 0o755)
        .dir("etc", 0o755)
        .dir("home", 0o755)
        .entry_with(
            "home/user",
            EntryType::Directory,
            [],
            owned(1000, 1000, 0o700, None),
        )
        .file_with(
            "home/user/notes",
            "notes\n",
            owned(1000, 1000, 0o600, Some(OLD)),
        );
    // A symlink owned by a user: lchown, not chown of the (missing) target.
    let mut link = layer.raw_header(b"home/user/link", EntryType::Symlink);
    link.set_mode(0o777);
    link.set_uid(1000);
    link.set_gid(1000);
    link.set_link_name("notes").unwrap();
    layer = layer
        .raw(link, [])
        .dir("lib", 0o755)
        .file("lib/libc.so", "libc v1\n", 0o755)
        // Not 0755, so an implicit parent made by a later layer cannot pass for it.
        .dir("opt", 0o750)
        .dir("opt/dir-to-file", 0o755)
        .file("opt/dir-to-file/child", "child\n", 0o644)
        .file("opt/file-to-dir", "was a file\n", 0o644)
        .dir("opt/gone", 0o755)
        .file("opt/gone/inner", "inner\n", 0o644)
        // A read-only directory with a child: its mode can only be applied after the child.
        .dir("ro", 0o555)
        .file("ro/file", "under a read-only directory\n", 0o444)
        .dir("srv", 0o755)
        .entry_with(
            "srv/shared",
            EntryType::Directory,
            [],
            owned(0, 100, 0o2775, None),
        )
        .dir("tmp", 0o1777)
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .dir("usr/lib", 0o755)
        .file("usr/bin/busybox", "busybox\n", 0o755)
        .hardlink("usr/bin/busybox-hardlink", "usr/bin/busybox")
        .symlink("bin/sh", "../usr/bin/busybox")
        .symlink("etc/localtime", "/usr/share/zoneinfo/Etc/UTC")
        .file("usr/bin/su", "su\n", 0o4755)
        // setuid on a file owned by someone else: chown clears setuid, so the mode must come after.
        .file_with(
            "usr/bin/suid-user",
            "suid\n",
            owned(1000, 1000, 0o4750, None),
        )
        .file_with("usr/bin/wall", "wall\n", owned(0, 5, 0o2755, None))
        .xattr("usr/bin/ping", "security.capability", CAP_NET_RAW)
        .xattr("usr/bin/ping", "user.origin", "rpull-test")
        .file("usr/bin/ping", "ping\n", 0o755)
        .file("etc/hostname", "base\n", 0o644)
        .file_with(
            "etc/shadow",
            "root:*:19000::::::\n",
            owned(0, 42, 0o640, None),
        )
        .dir("var", 0o755)
        .dir("var/lib", 0o755)
        .file("var/lib/removed", "whited out later\n", 0o644)
        .dir("var/cache", 0o755)
        .file("var/cache/a", "a\n", 0o644)
        .file("var/cache/b", "b\n", 0o644)
        .dir("long", 0o755)
        .dir(&long_dir(), 0o755)
        .file(&gnu_long_file(), "gnu long name\n", 0o644)
        .file_pax_path(&pax_long_file(), "pax long name\n", 0o644)
        .symlink("long/link-long-target", &long_symlink_target())
        .hardlink("long/hardlink-long", &gnu_long_file())
        .raw_file(b"etc/caf\xe9", "latin-1 name\n")
        .raw_link(b"etc/caf\xe9-link", EntryType::Symlink, b"caf\xe9")
        .char_device("dev/null", 0o666, 1, 3)
        .block_device("dev/loop0", 0o660, 7, 0)
        .fifo("dev/initctl", 0o600);
    // A symlink whose target is in a PAX `linkpath` record; the header's own link name is a decoy.
    let records = pax_record("linkpath", pax_link_target().as_bytes());
    let mut pax = layer.raw_header(b"long/PaxHeaders/pax-link", EntryType::XHeader);
    pax.set_size(records.len() as u64);
    layer
        .raw(pax, records)
        .raw_link(b"long/pax-link", EntryType::Symlink, b"decoy")
}

fn layer1() -> LayerBuilder {
    LayerBuilder::new()
        .mtime(T1)
        .whiteout("var/lib/removed")
        .opaque("var/cache")
        .file("var/cache/c", "fresh\n", 0o644)
        // No entries for `opt` itself: its parent must keep layer 0's metadata.
        .file("opt/dir-to-file", "now a file\n", 0o644)
        .dir("opt/file-to-dir", 0o750)
        .file("opt/file-to-dir/child", "now a directory\n", 0o644)
        .whiteout("opt/gone")
        .hardlink("usr/lib/libc-hardlink", "lib/libc.so")
        .file("etc/hostname", "changed\n", 0o644)
}

fn layer3() -> LayerBuilder {
    LayerBuilder::new()
        .mtime(T3)
        .file_with("srv/shared/data", "shared\n", owned(1000, 100, 0o664, None))
        .hardlink("srv/shared/data-link", "srv/shared/data")
        .file("etc/motd", "welcome\n", 0o644)
        .whiteout("home/user/link")
}

/// gzip and plain layers only: Debian's umoci refuses zstd.
fn fixture() -> Image {
    ImageBuilder::new()
        .layer(layer0(), Compression::Gzip)
        .layer(layer1(), Compression::Gzip)
        .layer(LayerBuilder::new(), Compression::None)
        .layer(layer3(), Compression::Gzip)
        .build()
}

fn expected_paths() -> BTreeSet<Vec<u8>> {
    let mut paths: BTreeSet<Vec<u8>> = [
        "bin",
        "bin/sh",
        "dev",
        "dev/initctl",
        "dev/loop0",
        "dev/null",
        "etc",
        "etc/hostname",
        "etc/localtime",
        "etc/motd",
        "etc/shadow",
        "home",
        "home/user",
        "home/user/notes",
        "lib",
        "lib/libc.so",
        "long",
        "long/hardlink-long",
        "long/link-long-target",
        "long/pax-link",
        "opt",
        "opt/dir-to-file",
        "opt/file-to-dir",
        "opt/file-to-dir/child",
        "ro",
        "ro/file",
        "srv",
        "srv/shared",
        "srv/shared/data",
        "srv/shared/data-link",
        "tmp",
        "usr",
        "usr/bin",
        "usr/bin/busybox",
        "usr/bin/busybox-hardlink",
        "usr/bin/ping",
        "usr/bin/su",
        "usr/bin/suid-user",
        "usr/bin/wall",
        "usr/lib",
        "usr/lib/libc-hardlink",
        "var",
        "var/cache",
        "var/cache/c",
        "var/lib",
    ]
    .iter()
    .map(|p| p.as_bytes().to_vec())
    .collect();
    for path in [long_dir(), gnu_long_file(), pax_long_file()] {
        paths.insert(path.into_bytes());
    }
    paths.insert(b"etc/caf\xe9".to_vec());
    paths.insert(b"etc/caf\xe9-link".to_vec());
    paths
}

#[track_caller]
fn entry<'a>(tree: &'a TreeSnapshot, path: &str) -> &'a TreeEntry {
    tree.get(path)
        .unwrap_or_else(|| panic!("{path} missing from {}", tree.root.display()))
}

#[track_caller]
fn assert_file(tree: &TreeSnapshot, path: &str, content: &str, mode: u32) {
    let e = entry(tree, path);
    assert_eq!(e.kind, EntryKind::File, "{path}");
    assert_eq!(e.mode, mode, "{path}: mode {:o}", e.mode);
    assert_eq!(
        e.sha256.as_deref(),
        Some(rpull_testing::sha256_digest(content.as_bytes()).as_str()),
        "{path}"
    );
}

#[track_caller]
fn assert_symlink(tree: &TreeSnapshot, path: impl AsRef<[u8]>, target: impl AsRef<[u8]>) {
    let path = path.as_ref();
    let e = tree
        .get(path)
        .unwrap_or_else(|| panic!("{} missing", path.escape_ascii()));
    assert_eq!(e.kind, EntryKind::Symlink, "{}", path.escape_ascii());
    assert_eq!(
        e.link_target.as_deref(),
        Some(target.as_ref()),
        "{}: targets are kept verbatim",
        path.escape_ascii()
    );
}

#[track_caller]
fn assert_owner(tree: &TreeSnapshot, path: &str, uid: u32, gid: u32) {
    let e = entry(tree, path);
    assert_eq!((e.uid, e.gid), (uid, gid), "{path}: owner");
}

fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("skipped {test}: owners, devices and security.capability need root");
    true
}

/// Every item of layer.md, asserted exactly on rpull's tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_semantic_applied_exactly() {
    if skip_unless_root("every_layer_semantic_applied_exactly") {
        return;
    }
    let env = Env::start();
    let dest = env
        .push_and_pull(&fixture(), "semantics/all:v1", "rootfs")
        .await;
    let tree = snapshot(&dest);

    let actual: BTreeSet<Vec<u8>> = tree.entries.keys().cloned().collect();
    let expected = expected_paths();
    let show = |set: BTreeSet<&Vec<u8>>| {
        set.into_iter()
            .map(|p| p.escape_ascii().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        actual,
        expected,
        "unexpected: {:?}; missing: {:?}",
        show(actual.difference(&expected).collect()),
        show(expected.difference(&actual).collect())
    );

    // Regular files, later layers winning, dir <-> file replacement, whiteouts, opaque dirs.
    assert_file(&tree, "etc/hostname", "changed\n", 0o644);
    assert_file(&tree, "etc/motd", "welcome\n", 0o644);
    assert_file(&tree, "var/cache/c", "fresh\n", 0o644);
    assert_file(&tree, "opt/dir-to-file", "now a file\n", 0o644);
    assert_eq!(entry(&tree, "opt/file-to-dir").kind, EntryKind::Dir);
    assert_eq!(entry(&tree, "opt/file-to-dir").mode, 0o750);
    assert_file(&tree, "opt/file-to-dir/child", "now a directory\n", 0o644);
    assert_eq!(
        entry(&tree, "opt").mode,
        0o750,
        "an implicit parent in a later layer keeps the lower metadata"
    );

    // Permission bits, including setuid / setgid / sticky, and read-only directories.
    assert_file(&tree, "usr/bin/su", "su\n", 0o4755);
    assert_file(&tree, "usr/bin/suid-user", "suid\n", 0o4750);
    assert_file(&tree, "usr/bin/wall", "wall\n", 0o2755);
    assert_eq!(entry(&tree, "tmp").mode, 0o1777);
    assert_eq!(entry(&tree, "srv/shared").mode, 0o2775);
    assert_eq!(entry(&tree, "ro").mode, 0o555);
    assert_file(&tree, "ro/file", "under a read-only directory\n", 0o444);
    assert_eq!(entry(&tree, "home/user").mode, 0o700);

    // Owners (we are root).
    assert_owner(&tree, "home/user", 1000, 1000);
    assert_owner(&tree, "home/user/notes", 1000, 1000);
    assert_owner(&tree, "usr/bin/suid-user", 1000, 1000);
    assert_owner(&tree, "usr/bin/wall", 0, 5);
    assert_owner(&tree, "etc/shadow", 0, 42);
    assert_owner(&tree, "srv/shared", 0, 100);
    assert_owner(&tree, "srv/shared/data", 1000, 100);
    assert_owner(&tree, "usr/bin/busybox", 0, 0);

    // mtimes of files, symlinks and directories (set after their children were created).
    let mtime = |path: &str| entry(&tree, path).mtime;
    assert_eq!(mtime("home/user/notes"), (OLD as i64, 0));
    assert_eq!(mtime("etc/hostname"), (T1 as i64, 0));
    assert_eq!(mtime("etc/motd"), (T3 as i64, 0));
    assert_eq!(mtime("bin/sh"), (T0 as i64, 0), "symlink mtime (lutimes)");
    assert_eq!(mtime("usr/bin/busybox"), (T0 as i64, 0));
    assert_eq!(
        mtime("ro"),
        (T0 as i64, 0),
        "directory mtime after its child was written"
    );
    assert_eq!(mtime(&long_dir()), (T0 as i64, 0));
    assert_eq!(mtime("opt/file-to-dir"), (T1 as i64, 0));

    // Symlinks, relative and absolute, long and non-UTF-8 targets: all verbatim.
    assert_symlink(&tree, "bin/sh", "../usr/bin/busybox");
    assert_symlink(&tree, "etc/localtime", "/usr/share/zoneinfo/Etc/UTC");
    assert_symlink(&tree, "long/link-long-target", long_symlink_target());
    assert_symlink(&tree, "long/pax-link", pax_link_target());
    assert_symlink(&tree, b"etc/caf\xe9-link", b"caf\xe9");
    assert!(
        tree.get("home/user/link").is_none(),
        "whiteout of a symlink"
    );

    // Hardlinks: within a layer, to a file of an earlier layer, with a long target.
    let groups: BTreeSet<BTreeSet<String>> = tree
        .hardlink_groups()
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect()
        })
        .collect();
    let expected_groups: BTreeSet<BTreeSet<String>> = [
        vec![
            "usr/bin/busybox".to_owned(),
            "usr/bin/busybox-hardlink".to_owned(),
        ],
        vec!["lib/libc.so".to_owned(), "usr/lib/libc-hardlink".to_owned()],
        vec![gnu_long_file(), "long/hardlink-long".to_owned()],
        vec![
            "srv/shared/data".to_owned(),
            "srv/shared/data-link".to_owned(),
        ],
    ]
    .into_iter()
    .map(|g| g.into_iter().collect())
    .collect();
    assert_eq!(groups, expected_groups);
    assert_file(&tree, "usr/lib/libc-hardlink", "libc v1\n", 0o755);

    // Long names (GNU and PAX) and a non-UTF-8 name.
    assert_file(&tree, &gnu_long_file(), "gnu long name\n", 0o644);
    assert_file(&tree, &pax_long_file(), "pax long name\n", 0o644);
    let latin1 = tree.get(b"etc/caf\xe9").expect("non-UTF-8 name");
    assert_eq!(
        latin1.sha256.as_deref(),
        Some(rpull_testing::sha256_digest(b"latin-1 name\n").as_str())
    );

    // Devices and fifos (root).
    let dev = |path: &str| {
        let e = entry(&tree, path);
        (e.kind, e.mode, e.device)
    };
    assert_eq!(
        dev("dev/null"),
        (EntryKind::CharDevice, 0o666, Some((1, 3)))
    );
    assert_eq!(
        dev("dev/loop0"),
        (EntryKind::BlockDevice, 0o660, Some((7, 0)))
    );
    assert_eq!(dev("dev/initctl"), (EntryKind::Fifo, 0o600, None));

    // xattrs, including security.capability (which a chown after it would have cleared).
    let ping = entry(&tree, "usr/bin/ping");
    assert_eq!(
        ping.xattrs
            .get(&b"security.capability"[..])
            .map(Vec::as_slice),
        Some(&CAP_NET_RAW[..])
    );
    if xattr_supported(&env) {
        assert_eq!(
            ping.xattrs.get(&b"user.origin"[..]).map(Vec::as_slice),
            Some(&b"rpull-test"[..])
        );
    } else {
        eprintln!(
            "note: the file system under {} refuses user.* xattrs; not checked",
            env.tmp.path().display()
        );
    }
}

/// Whether the file system of the test's temporary directory stores `user.*` xattrs. There is
/// no xattr crate among the dev-dependencies, so python3 (when installed) sets one on a probe
/// file; without python3 the file system is assumed to store them and the assertions run.
fn xattr_supported(env: &Env) -> bool {
    let probe = env.tmp.path().join(".xattr-probe");
    std::fs::write(&probe, "").unwrap();
    let script = "import os, sys; os.setxattr(sys.argv[1], 'user.rpull-probe', b'1')";
    let refused = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&probe)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| !status.success());
    std::fs::remove_file(&probe).unwrap();
    !refused
}

/// `extract.chown = false`: every entry belongs to the user running the pull (root here), the
/// modes are still applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_chown_leaves_files_owned_by_the_caller() {
    if skip_unless_root("no_chown_leaves_files_owned_by_the_caller") {
        return;
    }
    let env = Env::start();
    let reference = env.push(&fixture(), "semantics/nochown:v1").await;
    let dest = env.dest("rootfs");
    let options = PullOptions {
        extract: ExtractOptions {
            chown: false,
            ..ExtractOptions::for_current_user()
        },
        ..PullOptions::default()
    };
    env.puller(options)
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let tree = snapshot(&dest);
    let foreign: Vec<_> = tree
        .entries
        .iter()
        .filter(|(_, e)| (e.uid, e.gid) != (0, 0))
        .map(|(p, e)| format!("{} {}:{}", p.escape_ascii(), e.uid, e.gid))
        .collect();
    assert!(foreign.is_empty(), "entries not owned by root: {foreign:?}");
    assert_file(&tree, "usr/bin/suid-user", "suid\n", 0o4750);
    assert_eq!(entry(&tree, "home/user").mode, 0o700);
    assert_eq!(tree.entries.len(), expected_paths().len());
}

/// The differential test: rpull's tree and umoci's rootfs of the same image are identical in
/// paths, kinds, modes, sizes, contents, link targets, hardlink groups, owners, xattrs and
/// file mtimes, and directory mtimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_tree_as_umoci_unpack() {
    let env = Env::start();
    let image = fixture();
    let layout = env.dest("layout");
    image.write_oci_layout(&layout, "v1").unwrap();
    let Some(umoci_root) = umoci_unpack(&layout, "v1", &env.dest("bundle")).expect("umoci unpack")
    else {
        eprintln!(
            "skipped same_tree_as_umoci_unpack: umoci not installed (apt-get install -y umoci)"
        );
        return;
    };
    let dest = env
        .push_and_pull(&image, "semantics/umoci:v1", "rootfs")
        .await;

    let ours = snapshot(&dest);
    let theirs = snapshot(&umoci_root);
    let options = DiffOptions {
        dir_mtimes: true,
        ..DiffOptions::default()
    };
    let differences = diff(&ours, &theirs, &options);
    assert!(
        differences.is_empty(),
        "rpull vs umoci:\n  {}",
        differences.join("\n  ")
    );
    assert_trees_equal(&ours, &theirs, &options);
    assert_eq!(ours.entries.len(), expected_paths().len());
}

/// A later layer that writes beneath a symlink of an earlier layer (merged /usr: `lib ->
/// usr/lib`, then `lib/libfoo.so`): the write goes through the symlink, which stays a symlink,
/// as with umoci and docker. Replacing the symlink with a directory would break every path
/// through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_layer_writes_through_a_symlink_of_an_earlier_layer() {
    let env = Env::start();
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("usr", 0o755)
                .dir("usr/lib", 0o755)
                .file("usr/lib/libc.so", "libc\n", 0o755)
                .symlink("lib", "usr/lib")
                .symlink("lib64", "/usr/lib"),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new()
                .file("lib/libfoo.so", "foo\n", 0o755)
                .file("lib64/ld.so", "ld\n", 0o755),
            Compression::Gzip,
        )
        .build();
    let dest = env
        .push_and_pull(&image, "semantics/merged-usr:v1", "rootfs")
        .await;
    let ours = snapshot(&dest);
    assert_symlink(&ours, "lib", "usr/lib");
    assert_symlink(&ours, "lib64", "/usr/lib");
    assert_file(&ours, "usr/lib/libfoo.so", "foo\n", 0o755);
    assert_file(&ours, "usr/lib/ld.so", "ld\n", 0o755);
    assert_file(&ours, "usr/lib/libc.so", "libc\n", 0o755);

    let layout = env.dest("layout");
    image.write_oci_layout(&layout, "v1").unwrap();
    let Some(umoci_root) = umoci_unpack(&layout, "v1", &env.dest("bundle")).expect("umoci unpack")
    else {
        eprintln!("skipped the umoci comparison: umoci not installed (apt-get install -y umoci)");
        return;
    };
    assert_trees_equal(&ours, &snapshot(&umoci_root), &DiffOptions::default());
}
