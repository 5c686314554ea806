//! The std backend (files written on the extracting thread or by write threads) and the io_uring
//! backend give identical trees, metadata included, and report failures of deferred work naming
//! the entry.

mod common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use common::{Layer, Sandbox, is_root};
use rpull_extract::{
    ExtractError, ExtractOptions, IoBackendKind, LENT_BYTES, Lender, SharedReader, extract_layer,
    extract_layer_from,
};
use tar::EntryType;

/// Everything observable about one entry of a tree.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Node {
    path: PathBuf,
    kind: char,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    /// File content or symlink target.
    data: Vec<u8>,
    mtime: (i64, i64),
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Index of the first path with the same inode (hardlinks), or the path itself.
    identity: PathBuf,
}

fn full_snapshot(root: &Path) -> Vec<Node> {
    let mut nodes = Vec::new();
    let mut inodes = std::collections::HashMap::new();
    walk(root, root, &mut nodes, &mut inodes);
    nodes.sort();
    nodes
}

fn walk(
    root: &Path,
    dir: &Path,
    nodes: &mut Vec<Node>,
    inodes: &mut std::collections::HashMap<u64, PathBuf>,
) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let metadata = fs::symlink_metadata(&path).unwrap();
        let relative = path.strip_prefix(root).unwrap().to_path_buf();
        let file_type = metadata.file_type();
        let (kind, data) = if file_type.is_dir() {
            ('d', Vec::new())
        } else if file_type.is_symlink() {
            (
                'l',
                fs::read_link(&path)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            )
        } else if file_type.is_file() {
            ('f', fs::read(&path).unwrap())
        } else if file_type.is_fifo() {
            ('p', Vec::new())
        } else {
            ('c', metadata.rdev().to_le_bytes().to_vec())
        };
        let identity = inodes
            .entry(metadata.ino())
            .or_insert_with(|| relative.clone())
            .clone();
        nodes.push(Node {
            path: relative,
            kind,
            mode: metadata.mode() & 0o7777,
            uid: metadata.uid(),
            gid: metadata.gid(),
            size: if kind == 'd' { 0 } else { metadata.size() },
            data,
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            xattrs: xattrs(&path),
            identity,
        });
        if kind == 'd' {
            walk(root, &path, nodes, inodes);
        }
    }
}

fn xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut names = vec![0u8; 4096];
    let length = match rustix::fs::llistxattr(path, &mut names) {
        Ok(length) => length,
        Err(rustix::io::Errno::NOTSUP) => return Vec::new(),
        Err(errno) => panic!("listxattr {}: {errno}", path.display()),
    };
    let mut result = Vec::new();
    for name in names[..length]
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
    {
        let mut value = vec![0u8; 4096];
        let name_c = std::ffi::CString::new(name).unwrap();
        let length = rustix::fs::lgetxattr(path, name_c.as_c_str(), &mut value).unwrap();
        result.push((name.to_vec(), value[..length].to_vec()));
    }
    result.sort();
    result
}

/// Deterministic bytes of `length` for file `seed`.
fn content(seed: usize, length: usize) -> Vec<u8> {
    let mut state = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Layers that exercise every path of both backends: many small files across directories (more
/// than a ring holds, more than the descriptor slots), empty and exactly-1-MiB files, files of a
/// few MiB (the chunked path), metadata of every kind, replacements within a layer, hardlinks to
/// files still pending, and later layers with whiteouts and opaque directories.
fn layers() -> Vec<Vec<u8>> {
    let mut base = Layer::new();
    let owner: &[(&str, &[u8])] = if is_root() {
        &[("uid", b"1234"), ("gid", b"5678")]
    } else {
        &[]
    };
    // Every directory has its own entry: an implicit one gets the time of its creation.
    for dir in [&b"etc"[..], b"data", b"bin"] {
        base.entry(EntryType::Directory, dir, None, 0o755, b"", &[]);
    }
    for dir in 0..12 {
        let dir_name = format!("data/d{dir:02}");
        base.entry(
            EntryType::Directory,
            dir_name.as_bytes(),
            None,
            0o750,
            b"",
            &[],
        );
        for file in 0..200 {
            let seed = dir * 1000 + file;
            let name = format!("{dir_name}/f{file:03}");
            let mode = [0o644, 0o600, 0o755, 0o444, 0o4755, 0o2711][file % 6];
            let mut pax: Vec<(&str, &[u8])> = owner.to_vec();
            let mtime = format!("{}.{:09}", 1_500_000_000 + seed, seed * 7);
            pax.push(("mtime", mtime.as_bytes()));
            if file % 50 == 0 {
                pax.push(("SCHILY.xattr.user.note", b"from pax"));
            }
            base.entry(
                EntryType::Regular,
                name.as_bytes(),
                None,
                mode,
                &content(seed, (seed * 37) % 9000),
                &pax,
            );
        }
        // A hardlink to a file of this directory that may still be pending.
        base.entry(
            EntryType::Link,
            format!("{dir_name}/link").as_bytes(),
            Some(format!("{dir_name}/f007").as_bytes()),
            0o644,
            b"",
            &[],
        );
    }
    let base = base
        .file("empty", 0o640, b"")
        .file("exactly-one-mib", 0o644, &content(1, 1 << 20))
        // The backends' write buffer is 256 KiB: one file of exactly one buffer, one a byte over.
        .file("exactly-one-buffer", 0o644, &content(5, 256 << 10))
        .file("one-buffer-and-a-byte", 0o644, &content(6, (256 << 10) + 1))
        .file("big", 0o755, &content(2, 3 * (1 << 20) + 12345))
        .file("dup", 0o644, b"first")
        .file("dup", 0o600, b"second wins")
        .dir("becomes-file", 0o755)
        .file("becomes-file/child", 0o644, b"gone")
        .file("becomes-file", 0o644, b"now a file")
        .file("becomes-dir", 0o644, b"gone")
        .dir("becomes-dir", 0o711)
        .file("becomes-dir/child", 0o644, b"kept")
        .file("x", 0o644, b"file then symlink")
        .symlink("x", "etc")
        .file("etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .symlink("etc/link", "passwd")
        .file("bin/tool", 0o755, &content(3, 5000))
        .hardlink("bin/tool-again", "bin/tool")
        .file("bin/tool", 0o700, b"replaced after a hardlink")
        // One directory under two names: the same file written through both goes through one
        // write thread, in order.
        .dir("real", 0o755)
        .symlink("alias", "real")
        .file("real/same", 0o644, b"through the real name")
        .file("alias/same", 0o640, b"through the symlink, last")
        .file("alias/only-alias", 0o644, b"through the symlink")
        // A directory full of files still pending, replaced by a symlink, then written through.
        .dir("doomed", 0o755)
        .files_in("doomed", 40)
        .symlink("doomed", "real")
        .file("doomed/after", 0o644, b"through the new symlink")
        // A pending file whose name becomes a directory, then a file again.
        .file("flip", 0o644, b"first a file")
        .dir("flip", 0o755)
        .file("flip/inside", 0o644, b"gone with the directory")
        .file("flip", 0o600, b"a file at last")
        .bytes();
    let second = Layer::new()
        .whiteout("data/d03/.wh.f005")
        .whiteout("data/d04/.wh..wh..opq")
        .file("data/d04/new", 0o644, b"after opaque")
        .file("data/d05/f010", 0o600, b"replaced by a later layer")
        .file("big", 0o644, &content(4, 2 * (1 << 20)))
        .hardlink("etc/passwd-hard", "etc/passwd")
        .bytes();
    vec![base, second]
}

fn apply(
    backend: IoBackendKind,
    write_threads: usize,
    create_on_extracting_thread: bool,
) -> (Sandbox, Vec<Node>) {
    apply_lending(backend, write_threads, create_on_extracting_thread, None)
}

/// [`apply`], the layers read through a `SharedReader` of `buffer`-byte buffers when given.
fn apply_lending(
    backend: IoBackendKind,
    write_threads: usize,
    create_on_extracting_thread: bool,
    buffer: Option<usize>,
) -> (Sandbox, Vec<Node>) {
    let sandbox = Sandbox::new();
    let options = ExtractOptions {
        backend,
        write_threads,
        create_on_extracting_thread: Some(create_on_extracting_thread),
        ..ExtractOptions::for_current_user()
    };
    sandbox.apply_lending(&layers(), &options, buffer).unwrap();
    let snapshot = full_snapshot(&sandbox.root);
    (sandbox, snapshot)
}

#[test]
fn std_parallel_and_uring_give_identical_trees() {
    let (_std_sandbox, std_tree) = apply(IoBackendKind::Std, 1, false);
    assert!(std_tree.len() > 2200, "{} entries", std_tree.len());
    let mut others = vec![("parallel x2", apply(IoBackendKind::Std, 2, false))];
    others.push(("parallel x5", apply(IoBackendKind::Std, 5, false)));
    others.push((
        "made on the extracting thread",
        apply(IoBackendKind::Std, 1, true),
    ));
    // Small files lent as views of the source's buffers: buffers smaller than many files (which
    // are then copied), and as big as a pull's decoded buffers.
    for buffer in [4096, 256 << 10] {
        others.push((
            "parallel x2, lent",
            apply_lending(IoBackendKind::Std, 2, false, Some(buffer)),
        ));
        others.push((
            "made on the extracting thread, lent",
            apply_lending(IoBackendKind::Std, 1, true, Some(buffer)),
        ));
        others.push((
            "std, from a lending source",
            apply_lending(IoBackendKind::Std, 1, false, Some(buffer)),
        ));
    }
    match IoBackendKind::Uring.resolve() {
        (IoBackendKind::Std, Some(reason)) => {
            eprintln!("skipping the uring tree: io_uring unavailable: {reason}")
        }
        _ => others.push(("uring", apply(IoBackendKind::Uring, 1, false))),
    }
    for (name, (_sandbox, tree)) in &others {
        assert_eq!(std_tree.len(), tree.len(), "{name}");
        for (std_node, node) in std_tree.iter().zip(tree) {
            assert_eq!(std_node, node, "{name}");
        }
    }
    // Spot checks that the trees are the intended ones, not merely equal.
    let find = |path: &str| {
        std_tree
            .iter()
            .find(|node| node.path == Path::new(path))
            .unwrap_or_else(|| panic!("{path} missing"))
    };
    assert_eq!(find("dup").data, b"second wins");
    assert_eq!(find("dup").mode, 0o600);
    assert_eq!(find("becomes-file").kind, 'f');
    assert_eq!(find("becomes-dir").kind, 'd');
    assert_eq!(find("x").kind, 'l');
    assert_eq!(find("bin/tool").data, b"replaced after a hardlink");
    assert_eq!(find("bin/tool-again").data, content(3, 5000));
    assert_eq!(find("data/d00/link").identity, Path::new("data/d00/f007"));
    assert_eq!(find("data/d01/f004").mode, 0o4755);
    assert_eq!(find("data/d01/f004").mtime, (1_500_001_004, 1004 * 7));
    assert_eq!(find("big").size, 2 * (1 << 20));
    assert_eq!(find("real/same").data, b"through the symlink, last");
    assert_eq!(find("real/same").mode, 0o640);
    assert_eq!(find("real/only-alias").data, b"through the symlink");
    assert_eq!(find("doomed").kind, 'l');
    assert_eq!(find("real/after").data, b"through the new symlink");
    assert_eq!(find("flip").data, b"a file at last");
    assert_eq!(find("flip").mode, 0o600);
    assert_eq!(find("exactly-one-mib").size, 1 << 20);
    assert_eq!(find("exactly-one-buffer").data, content(5, 256 << 10));
    assert_eq!(
        find("one-buffer-and-a-byte").data,
        content(6, (256 << 10) + 1)
    );
    assert!(
        std_tree
            .iter()
            .all(|node| node.path != Path::new("data/d03/f005"))
    );
    assert_eq!(
        std_tree
            .iter()
            .filter(|node| node.path.starts_with("data/d04"))
            .count(),
        2,
        "data/d04 and data/d04/new"
    );
    if is_root() {
        assert_eq!(
            (find("data/d02/f001").uid, find("data/d02/f001").gid),
            (1234, 5678)
        );
    }
}

/// The write threads keep views of a lending source's buffers instead of copying small files'
/// data (every buffer given back once the layer is extracted, and the files right); the std
/// backend, which writes each file as it comes, borrows none.
#[test]
fn write_threads_borrow_the_sources_buffers() {
    let layer = Layer::new()
        .dir("data", 0o755)
        .files_in("data", 300)
        .bytes();
    for (write_threads, create_here, borrows) in
        [(2, false, true), (1, true, true), (1, false, false)]
    {
        let sandbox = Sandbox::new();
        let options = ExtractOptions {
            backend: IoBackendKind::Std,
            write_threads,
            create_on_extracting_thread: Some(create_here),
            ..ExtractOptions::for_current_user()
        };
        let mut source =
            SharedReader::with_lender(layer.as_slice(), 64 << 10, Lender::new(LENT_BYTES));
        let lender = std::sync::Arc::clone(source.lender());
        extract_layer_from(&mut source, &sandbox.root, &options).unwrap();
        drop(source);
        let case = format!("{write_threads} write threads, made here: {create_here}");
        assert_eq!(lender.out(), 0, "{case}");
        assert_eq!(lender.lent_in_all() > 0, borrows, "{case}");
        for index in [0, 1, 150, 299] {
            let content = format!("data file {index}\n").repeat(index % 7 + 1);
            assert_eq!(
                fs::read(sandbox.root.join(format!("data/f{index:03}"))).unwrap(),
                content.as_bytes(),
                "{case}"
            );
        }
    }
}

/// A failure to create a file among files whose writes are in flight names the entry, and the
/// backend (dropped with writes in flight) waits for them.
#[test]
fn failures_name_the_entry() {
    for (backend, write_threads, create_here) in [
        (IoBackendKind::Std, 1, false),
        (IoBackendKind::Std, 2, false),
        (IoBackendKind::Std, 1, true),
        (IoBackendKind::Uring, 1, false),
    ] {
        if backend.resolve().0 != backend {
            continue;
        }
        let sandbox = Sandbox::new();
        let long = format!("dir/{}", "n".repeat(300));
        let layer = Layer::new()
            .dir("dir", 0o755)
            .file("dir/before", 0o644, b"ok")
            .file(&long, 0o644, b"too long")
            .file("dir/after", 0o644, b"ok")
            .bytes();
        let options = ExtractOptions {
            backend,
            write_threads,
            create_on_extracting_thread: Some(create_here),
            ..common::plain_options()
        };
        match extract_layer(layer.as_slice(), &sandbox.root, &options) {
            Err(ExtractError::Io {
                entry,
                operation,
                source,
            }) => {
                assert_eq!(entry, Path::new(&long), "{backend:?}");
                assert_eq!(operation, "creating file", "{backend:?}");
                assert_eq!(
                    source.raw_os_error(),
                    Some(libc::ENAMETOOLONG),
                    "{backend:?}"
                );
            }
            other => panic!("{backend:?}: expected an Io error naming the entry, got {other:?}"),
        }
    }
}

/// Asking for io_uring explicitly resolves to it here, or says why not.
#[test]
fn explicit_uring_resolves_or_explains() {
    match IoBackendKind::Uring.resolve() {
        (IoBackendKind::Uring, None) => {
            assert_eq!(IoBackendKind::Auto.resolve(), (IoBackendKind::Uring, None));
        }
        (IoBackendKind::Std, Some(reason)) => {
            assert!(!reason.is_empty());
            let sandbox = Sandbox::new();
            let options = ExtractOptions {
                backend: IoBackendKind::Uring,
                ..common::plain_options()
            };
            let error = extract_layer(&b""[..], &sandbox.root, &options).unwrap_err();
            assert!(error.to_string().contains("io_uring"), "{error}");
        }
        other => panic!("unexpected resolution {other:?}"),
    }
    assert_eq!(IoBackendKind::Std.resolve(), (IoBackendKind::Std, None));
}
