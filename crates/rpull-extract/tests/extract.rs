//! Extraction of single layers: entry kinds, names, metadata, within-layer replacement.

mod common;

backend_tests!(
    files_dirs_symlinks_and_hardlinks,
    empty_layers,
    truncated_stream_is_a_tar_error,
    decoder_error_in_file_data_is_a_tar_error_not_a_write_error,
    error_messages_do_not_repeat_their_source,
    long_names_and_link_names_pax_and_gnu,
    non_utf8_names_end_to_end,
    permission_bits_including_setuid_setgid_sticky,
    mtimes_of_files_symlinks_and_directories,
    read_only_directories_still_receive_children,
    metadata_of_many_directories_shared_among_threads,
    owners_when_chown,
    xattrs_from_pax_records,
    special_files_created_or_skipped,
    later_entries_replace_earlier_ones_within_a_layer,
    whiteouts_and_opaque_markers_are_recorded_not_created,
    hardlink_to_a_file_of_an_earlier_layer_is_deferred,
    a_later_entry_cancels_a_deferred_hardlink,
    root_directory_entry_metadata,
    a_held_create_gate_holds_back_files_directories_and_symlinks,
    file_data_spanning_many_source_buffers,
    gnu_sparse_file_gets_its_holes,
    an_extension_header_over_1_mib_is_refused,
);

use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::{Layer, LongNames, MTIME, Sandbox, inode, is_root, node, os, plain_options, snapshot};
use rpull_extract::{ExtractError, ExtractOptions, extract_layer, finalize_tree};
use tar::EntryType;

fn files_dirs_symlinks_and_hardlinks() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .dir("etc", 0o755)
        .file("etc/hosts", 0o644, b"127.0.0.1 localhost\n")
        .file("bin/tool", 0o755, b"#!/bin/sh\n") // no entry for bin/: created implicitly
        .symlink("etc/localtime", "/usr/share/zoneinfo/UTC")
        .hardlink("bin/tool-again", "bin/tool")
        .bytes();
    let summary = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    finalize_tree(
        &sandbox.root,
        std::slice::from_ref(&summary),
        &plain_options(),
    )
    .unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("bin", 'd', 0o755, b""),
            node("bin/tool", 'f', 0o755, b"#!/bin/sh\n"),
            node("bin/tool-again", 'f', 0o755, b"#!/bin/sh\n"),
            node("etc", 'd', 0o755, b""),
            node("etc/hosts", 'f', 0o644, b"127.0.0.1 localhost\n"),
            node("etc/localtime", 'l', 0, b"/usr/share/zoneinfo/UTC"),
        ]
    );
    assert_eq!(
        inode(&sandbox.root.join("bin/tool")),
        inode(&sandbox.root.join("bin/tool-again"))
    );
    assert_eq!(
        (
            summary.entries,
            summary.files,
            summary.dirs,
            summary.symlinks,
            summary.hardlinks
        ),
        (5, 2, 1, 1, 1)
    );
    assert_eq!(summary.bytes_written, 30);
    assert!(summary.deferred_hardlinks.is_empty());
    assert_eq!(summary.directories.len(), 1, "only etc/ had its own entry");
}

fn empty_layers() {
    let sandbox = Sandbox::new();
    // A tar with only the end-of-archive blocks, and a completely empty stream.
    let summary = extract_layer(
        Layer::new().bytes().as_slice(),
        &sandbox.root,
        &plain_options(),
    )
    .unwrap();
    assert_eq!(summary.entries, 0);
    let summary = extract_layer(&b""[..], &sandbox.root, &plain_options()).unwrap();
    assert_eq!(summary.entries, 0);
    assert!(snapshot(&sandbox.root).is_empty());
}

fn truncated_stream_is_a_tar_error() {
    let sandbox = Sandbox::new();
    let layer = Layer::new().file("big", 0o644, &[7u8; 4096]).bytes();
    let error = extract_layer(&layer[..1024], &sandbox.root, &plain_options()).unwrap_err();
    assert!(
        matches!(&error, ExtractError::Tar { entry, .. } if entry == Path::new("big")),
        "{error:?}"
    );
    assert!(error.to_string().contains("big"), "{error}");
}

/// Yields `data`, then fails the way a truncated gzip stream does.
struct FailingReader<'a> {
    data: &'a [u8],
}

impl Read for FailingReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.data.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "incomplete deflate stream",
            ));
        }
        let count = buffer.len().min(self.data.len());
        buffer[..count].copy_from_slice(&self.data[..count]);
        self.data = &self.data[count..];
        Ok(count)
    }
}

/// Regression: a decoder error while reading a file's data was reported as a failure to write it.
/// It is a tar (stream) error naming the entry, and the cause is printed once in a cause chain.
fn decoder_error_in_file_data_is_a_tar_error_not_a_write_error() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .file("small", 0o644, b"s")
        .file("payload", 0o644, &[7u8; 200 * 1024])
        .bytes();
    let reader = FailingReader {
        data: &layer[..layer.len() / 2],
    };
    let error = extract_layer(
        std::io::BufReader::new(reader),
        &sandbox.root,
        &plain_options(),
    )
    .unwrap_err();
    match &error {
        ExtractError::Tar { entry, source } => {
            assert_eq!(entry, Path::new("payload"));
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
        }
        other => panic!("expected a tar error naming payload, got {other:?}"),
    }
    assert_eq!(
        error.to_string(),
        "reading the layer tar stream at entry payload"
    );
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    assert_eq!(
        chain,
        "reading the layer tar stream at entry payload: incomplete deflate stream"
    );
}

/// Display strings leave the cause to `source()`, so that a printed chain does not repeat it.
fn error_messages_do_not_repeat_their_source() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .file("file", 0o644, b"f")
        .file("file/child", 0o644, b"c")
        .bytes();
    let error = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap_err();
    let ExtractError::Io { source, .. } = &error else {
        panic!("expected an Io error, got {error:?}");
    };
    assert!(!error.to_string().contains(&source.to_string()), "{error}");
    assert!(error.to_string().contains("file/child"), "{error}");
    // A header with a bad checksum before any entry: no entry to name.
    let error = extract_layer(&[b'x'; 1024][..], &sandbox.root, &plain_options()).unwrap_err();
    let ExtractError::Tar { entry, .. } = &error else {
        panic!("expected a tar error, got {error:?}");
    };
    assert_eq!(entry, Path::new(""));
    assert_eq!(error.to_string(), "reading the layer tar stream");
}

fn long_names_and_link_names_pax_and_gnu() {
    for style in [LongNames::Pax, LongNames::Gnu] {
        let sandbox = Sandbox::new();
        let long_dir = format!("{}/{}", "d".repeat(90), "e".repeat(90));
        let long_file = format!("{long_dir}/{}", "f".repeat(120));
        let long_target = format!("/{}", "t".repeat(150));
        let mut layer = Layer::new();
        layer.long_names = style;
        let layer = layer
            .dir(&long_dir, 0o755)
            .file(&long_file, 0o644, b"long")
            .symlink(
                &format!("{long_dir}/symlink-{}", "s".repeat(100)),
                &long_target,
            )
            .hardlink(
                &format!("{long_dir}/hardlink-{}", "h".repeat(100)),
                &long_file,
            )
            .bytes();
        let summary = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
        assert_eq!(summary.entries, 4, "{style:?}");
        let root = &sandbox.root;
        assert_eq!(
            fs::read(root.join(&long_file)).unwrap(),
            b"long",
            "{style:?}"
        );
        let symlink = root.join(format!("{long_dir}/symlink-{}", "s".repeat(100)));
        assert_eq!(
            fs::read_link(symlink).unwrap().to_str().unwrap(),
            long_target,
            "{style:?}"
        );
        let hardlink = root.join(format!("{long_dir}/hardlink-{}", "h".repeat(100)));
        assert_eq!(inode(&hardlink), inode(&root.join(&long_file)), "{style:?}");
    }
}

fn non_utf8_names_end_to_end() {
    let sandbox = Sandbox::new();
    let mut layer = Layer::new();
    layer.entry(EntryType::Directory, b"caf\xe9", None, 0o755, b"", &[]);
    layer.entry(
        EntryType::Regular,
        b"caf\xe9/\xff\xfe.txt",
        None,
        0o644,
        b"latin-1",
        &[],
    );
    layer.entry(
        EntryType::Symlink,
        b"caf\xe9/link",
        Some(b"\xff\xfe.txt"),
        0o777,
        b"",
        &[],
    );
    layer.entry(
        EntryType::Link,
        b"hard\x80",
        Some(b"caf\xe9/\xff\xfe.txt"),
        0o644,
        b"",
        &[],
    );
    let summary = extract_layer(layer.bytes().as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(summary.directories[0].path, os(b"caf\xe9"));
    let root = &sandbox.root;
    assert_eq!(
        fs::read(root.join(os(b"caf\xe9/\xff\xfe.txt"))).unwrap(),
        b"latin-1"
    );
    assert_eq!(
        fs::read_link(root.join(os(b"caf\xe9/link")))
            .unwrap()
            .as_os_str()
            .as_bytes(),
        b"\xff\xfe.txt"
    );
    assert_eq!(
        fs::read(root.join(os(b"caf\xe9/link"))).unwrap(),
        b"latin-1"
    );
    assert_eq!(
        inode(&root.join(os(b"hard\x80"))),
        inode(&root.join(os(b"caf\xe9/\xff\xfe.txt")))
    );
}

fn permission_bits_including_setuid_setgid_sticky() {
    let sandbox = Sandbox::new();
    let options = common::options();
    let layer = Layer::new()
        .file("setuid", 0o4755, b"x")
        .file("setgid", 0o2755, b"x")
        .file("private", 0o600, b"x")
        .file("readonly", 0o444, b"x")
        .dir("tmp", 0o1777)
        .bytes();
    let summary = extract_layer(layer.as_slice(), &sandbox.root, &options).unwrap();
    finalize_tree(&sandbox.root, &[summary], &options).unwrap();
    let mode = |name: &str| {
        fs::symlink_metadata(sandbox.root.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(
        mode("setuid"),
        0o4755,
        "chown (when root) must come before chmod: chown clears setuid"
    );
    assert_eq!(mode("setgid"), 0o2755);
    assert_eq!(mode("private"), 0o600);
    assert_eq!(mode("readonly"), 0o444);
    assert_eq!(mode("tmp"), 0o1777);
}

fn mtimes_of_files_symlinks_and_directories() {
    let sandbox = Sandbox::new();
    let mut layer = Layer::new();
    layer.entry(EntryType::Directory, b"dir", None, 0o755, b"", &[]);
    layer.entry(EntryType::Regular, b"dir/file", None, 0o644, b"data", &[]);
    layer.entry(
        EntryType::Symlink,
        b"dir/link",
        Some(b"file"),
        0o777,
        b"",
        &[("mtime", b"1234567890.25")],
    );
    let summary = extract_layer(layer.bytes().as_slice(), &sandbox.root, &plain_options()).unwrap();
    finalize_tree(&sandbox.root, &[summary], &plain_options()).unwrap();
    let metadata = |name: &str| fs::symlink_metadata(sandbox.root.join(name)).unwrap();
    assert_eq!(metadata("dir/file").mtime(), MTIME as i64);
    assert_eq!(
        metadata("dir/link").mtime(),
        1_234_567_890,
        "symlink mtime via utimensat(AT_SYMLINK_NOFOLLOW)"
    );
    assert_eq!(metadata("dir/link").mtime_nsec(), 250_000_000);
    assert_eq!(
        metadata("dir").mtime(),
        MTIME as i64,
        "directory mtime applied after its children"
    );
}

fn read_only_directories_still_receive_children() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .dir("ro", 0o555)
        .dir("ro/sub", 0o500)
        .file("ro/sub/file", 0o400, b"x")
        .bytes();
    let summary = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    let mode = |name: &str| {
        fs::symlink_metadata(sandbox.root.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("ro") & 0o700, 0o700, "writable while extracting");
    finalize_tree(&sandbox.root, &[summary], &plain_options()).unwrap();
    assert_eq!(
        (mode("ro"), mode("ro/sub"), mode("ro/sub/file")),
        (0o555, 0o500, 0o400)
    );
    // Let the temp dir clean up.
    fs::set_permissions(
        sandbox.root.join("ro/sub"),
        fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    fs::set_permissions(sandbox.root.join("ro"), fs::Permissions::from_mode(0o700)).unwrap();
}

/// Enough directories at one depth for `finalize_tree` to share them among threads (more than
/// 128 per thread), each with its own mode and mtime, under read-only parents, plus one reached
/// through an absolute symlink (the slower lookup that confines it to the root).
fn metadata_of_many_directories_shared_among_threads() {
    const COUNT: usize = 600;
    const MODES: [u32; 4] = [0o755, 0o750, 0o500, 0o711];
    let sandbox = Sandbox::new();
    let mut layer = Layer::new();
    let mtime = |seconds: usize| seconds.to_string().into_bytes();
    layer.entry(
        EntryType::Directory,
        b"many",
        None,
        0o555,
        b"",
        &[("mtime", &mtime(1_000_000_000))],
    );
    for index in 0..COUNT {
        let dir = format!("many/d{index:03}");
        let mode = MODES[index % MODES.len()];
        layer.entry(
            EntryType::Directory,
            dir.as_bytes(),
            None,
            mode,
            b"",
            &[("mtime", &mtime(1_500_000_000 + index))],
        );
        let sub = format!("{dir}/s");
        layer.entry(
            EntryType::Directory,
            sub.as_bytes(),
            None,
            0o555,
            b"",
            &[("mtime", &mtime(1_600_000_000 + index))],
        );
        layer.entry(
            EntryType::Regular,
            format!("{sub}/file").as_bytes(),
            None,
            0o444,
            index.to_string().as_bytes(),
            &[],
        );
    }
    layer.entry(
        EntryType::Symlink,
        b"abs",
        Some(b"/many/d001"),
        0o777,
        b"",
        &[],
    );
    layer.entry(
        EntryType::Directory,
        b"abs/inner",
        None,
        0o701,
        b"",
        &[("mtime", &mtime(1_700_000_000))],
    );
    let summary = extract_layer(layer.bytes().as_slice(), &sandbox.root, &plain_options()).unwrap();
    finalize_tree(&sandbox.root, &[summary], &plain_options()).unwrap();

    let metadata = |name: &str| fs::symlink_metadata(sandbox.root.join(name)).unwrap();
    let mode_and_mtime = |name: &str| {
        let metadata = metadata(name);
        (metadata.permissions().mode() & 0o7777, metadata.mtime())
    };
    assert_eq!(mode_and_mtime("many"), (0o555, 1_000_000_000));
    for index in 0..COUNT {
        let dir = format!("many/d{index:03}");
        let expected = (MODES[index % MODES.len()], 1_500_000_000 + index as i64);
        assert_eq!(mode_and_mtime(&dir), expected, "{dir}");
        assert_eq!(
            mode_and_mtime(&format!("{dir}/s")),
            (0o555, 1_600_000_000 + index as i64),
            "{dir}/s"
        );
        assert_eq!(
            fs::read_to_string(sandbox.root.join(format!("{dir}/s/file"))).unwrap(),
            index.to_string()
        );
    }
    assert!(metadata("abs").file_type().is_symlink());
    assert_eq!(
        mode_and_mtime("many/d001/inner"),
        (0o701, 1_700_000_000),
        "through the absolute symlink"
    );
    // Let the temp dir clean up.
    for index in 0..COUNT {
        let dir = sandbox.root.join(format!("many/d{index:03}"));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(dir.join("s"), fs::Permissions::from_mode(0o700)).unwrap();
    }
    fs::set_permissions(sandbox.root.join("many"), fs::Permissions::from_mode(0o700)).unwrap();
}

fn owners_when_chown() {
    if !is_root() {
        eprintln!("skipping owners_when_chown: needs euid 0 to chown");
        return;
    }
    let sandbox = Sandbox::new();
    let options = ExtractOptions {
        chown: true,
        ..common::options()
    };
    let mut layer = Layer::new();
    let mut entry = |kind, name: &[u8], link: Option<&[u8]>, mode| {
        layer.entry(
            kind,
            name,
            link,
            mode,
            b"",
            &[("uid", b"1234"), ("gid", b"5678")],
        );
    };
    entry(EntryType::Directory, b"dir", None, 0o2775);
    entry(EntryType::Regular, b"dir/suid", None, 0o4755);
    entry(
        EntryType::Symlink,
        b"dir/link",
        Some(b"/nonexistent"),
        0o777,
    );
    let summary = extract_layer(layer.bytes().as_slice(), &sandbox.root, &options).unwrap();
    finalize_tree(&sandbox.root, &[summary], &options).unwrap();
    for name in ["dir", "dir/suid", "dir/link"] {
        let metadata = fs::symlink_metadata(sandbox.root.join(name)).unwrap();
        assert_eq!((metadata.uid(), metadata.gid()), (1234, 5678), "{name}");
    }
    let mode = |name: &str| {
        fs::symlink_metadata(sandbox.root.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("dir/suid"), 0o4755, "setuid survives chown");
    assert_eq!(mode("dir"), 0o2775);
}

fn xattrs_from_pax_records() {
    let sandbox = Sandbox::new();
    // A v2 file capability: cap_net_raw (bit 13) permitted + effective.
    let capability: &[u8] = &[
        0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let mut layer = Layer::new();
    layer.entry(
        EntryType::Directory,
        b"dir",
        None,
        0o755,
        b"",
        &[("SCHILY.xattr.user.dir", b"on a dir")],
    );
    layer.entry(
        EntryType::Regular,
        b"dir/file",
        None,
        0o644,
        b"x",
        &[("SCHILY.xattr.user.comment", b"hello\0bytes")],
    );
    if is_root() {
        layer.entry(
            EntryType::Regular,
            b"dir/ping",
            None,
            0o755,
            b"x",
            &[("SCHILY.xattr.security.capability", capability)],
        );
    }
    let options = common::options();
    let summary = extract_layer(layer.bytes().as_slice(), &sandbox.root, &options).unwrap();
    finalize_tree(&sandbox.root, &[summary], &options).unwrap();
    let get = |name: &str, xattr: &str| {
        let mut buffer = vec![0u8; 256];
        match rustix::fs::lgetxattr(sandbox.root.join(name).as_path(), xattr, &mut buffer) {
            Ok(length) => Some(buffer[..length].to_vec()),
            Err(rustix::io::Errno::NOTSUP) => None,
            Err(errno) => panic!("getxattr {name} {xattr}: {errno}"),
        }
    };
    let Some(comment) = get("dir/file", "user.comment") else {
        eprintln!("skipping xattr assertions: this file system does not support user xattrs");
        return;
    };
    assert_eq!(comment, b"hello\0bytes");
    assert_eq!(get("dir", "user.dir").unwrap(), b"on a dir");
    if is_root() {
        assert_eq!(get("dir/ping", "security.capability").unwrap(), capability);
    } else {
        eprintln!("skipping security.capability assertion: needs euid 0");
    }
}

fn special_files_created_or_skipped() {
    let build = || {
        let mut layer = Layer::new();
        layer.entry(EntryType::Fifo, b"fifo", None, 0o640, b"", &[]);
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(EntryType::Char);
        header.set_path("null").unwrap();
        header.set_mode(0o666);
        header.set_device_major(1).unwrap();
        header.set_device_minor(3).unwrap();
        header.set_size(0);
        header.set_cksum();
        let mut bytes = layer.bytes();
        // Re-open the archive to append the device (Layer::entry has no device numbers).
        bytes.truncate(bytes.len() - 1024);
        let mut builder = tar::Builder::new(bytes);
        builder.append(&header, &[][..]).unwrap();
        builder.into_inner().unwrap()
    };
    let sandbox = Sandbox::new();
    let summary = extract_layer(build().as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(
        (summary.skipped_special_files, summary.special_files),
        (2, 0)
    );
    assert!(snapshot(&sandbox.root).is_empty());

    if !is_root() {
        eprintln!("skipping device creation: needs euid 0 for mknod");
        return;
    }
    let sandbox = Sandbox::new();
    let options = ExtractOptions {
        special_files: true,
        ..common::options()
    };
    let summary = extract_layer(build().as_slice(), &sandbox.root, &options).unwrap();
    assert_eq!(
        (summary.skipped_special_files, summary.special_files),
        (0, 2)
    );
    let fifo = fs::symlink_metadata(sandbox.root.join("fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.permissions().mode() & 0o7777, 0o640);
    let null = fs::symlink_metadata(sandbox.root.join("null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(null.rdev(), rustix::fs::makedev(1, 3));
}

fn later_entries_replace_earlier_ones_within_a_layer() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        // directory replaced by a file
        .dir("a", 0o755)
        .file("a/child", 0o644, b"gone")
        .file("a", 0o600, b"now a file")
        // file replaced by a directory
        .file("b", 0o644, b"gone")
        .dir("b", 0o750)
        .file("b/child", 0o644, b"kept")
        // symlink replaced by a directory, and a directory by a symlink
        .symlink("c", "/somewhere")
        .dir("c", 0o755)
        .dir("d", 0o755)
        .file("d/child", 0o644, b"gone")
        .symlink("d", "c")
        // file replaced by a file (a hardlink to the old one keeps the old content)
        .file("e", 0o644, b"old")
        .hardlink("e-old", "e")
        .file("e", 0o644, b"new")
        // directory over directory: kept, children merged, last metadata wins
        .dir("f", 0o700)
        .file("f/one", 0o644, b"1")
        .dir("f", 0o751)
        .file("f/two", 0o644, b"2")
        .bytes();
    let summary = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    finalize_tree(&sandbox.root, &[summary], &plain_options()).unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("a", 'f', 0o600, b"now a file"),
            node("b", 'd', 0o750, b""),
            node("b/child", 'f', 0o644, b"kept"),
            node("c", 'd', 0o755, b""),
            node("d", 'l', 0, b"c"),
            node("e", 'f', 0o644, b"new"),
            node("e-old", 'f', 0o644, b"old"),
            node("f", 'd', 0o751, b""),
            node("f/one", 'f', 0o644, b"1"),
            node("f/two", 'f', 0o644, b"2"),
        ]
    );
}

fn whiteouts_and_opaque_markers_are_recorded_not_created() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .whiteout("etc/.wh.passwd")
        .whiteout(".wh.top")
        .dir("var", 0o755)
        .whiteout("var/.wh..wh..opq")
        .whiteout("opaque-without-entry/.wh..wh..opq")
        .whiteout(".wh..wh.plnk")
        .bytes();
    let staging = sandbox.staging(1);
    let summary = extract_layer(layer.as_slice(), &staging, &plain_options()).unwrap();
    assert_eq!(summary.whiteouts, [os(b"etc/passwd"), os(b"top")]);
    assert_eq!(
        summary.opaque_dirs,
        [os(b"var"), os(b"opaque-without-entry")]
    );
    assert_eq!(
        snapshot(&staging),
        vec![
            node("opaque-without-entry", 'd', 0o755, b""),
            node("var", 'd', 0o700, b"")
        ]
    );
}

fn hardlink_to_a_file_of_an_earlier_layer_is_deferred() {
    let sandbox = Sandbox::new();
    let staging = sandbox.staging(1);
    let layer = Layer::new()
        .hardlink("bin/link", "/usr/bin/tool")
        .file("bin/own", 0o644, b"x")
        .hardlink("bin/own-link", "bin/own")
        .bytes();
    let summary = extract_layer(layer.as_slice(), &staging, &plain_options()).unwrap();
    assert_eq!(summary.deferred_hardlinks.len(), 1);
    assert_eq!(summary.deferred_hardlinks[0].link, os(b"bin/link"));
    assert_eq!(summary.deferred_hardlinks[0].target, os(b"usr/bin/tool"));
    assert_eq!(summary.hardlinks, 2);
    assert!(!staging.join("bin/link").exists());
    assert_eq!(
        inode(&staging.join("bin/own")),
        inode(&staging.join("bin/own-link"))
    );
}

fn a_later_entry_cancels_a_deferred_hardlink() {
    let sandbox = Sandbox::new();
    let staging = sandbox.staging(1);
    let layer = Layer::new()
        .hardlink("x", "lower")
        .file("x", 0o644, b"mine")
        .bytes();
    let summary = extract_layer(layer.as_slice(), &staging, &plain_options()).unwrap();
    assert!(summary.deferred_hardlinks.is_empty());
    assert_eq!(fs::read(staging.join("x")).unwrap(), b"mine");
}

fn root_directory_entry_metadata() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .dir("./", 0o751)
        .file("./a", 0o644, b"a")
        .bytes();
    let summary = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(summary.directories[0].path, os(b""));
    finalize_tree(&sandbox.root, &[summary], &plain_options()).unwrap();
    assert_eq!(
        fs::metadata(&sandbox.root).unwrap().permissions().mode() & 0o7777,
        0o751
    );
    let error = extract_layer(
        Layer::new().file("./", 0o644, b"").bytes().as_slice(),
        &sandbox.root,
        &plain_options(),
    );
    assert!(
        matches!(error, Err(rpull_extract::ExtractError::Invalid { .. })),
        "{error:?}"
    );
}

/// Each kind of entry waits for a gate held elsewhere, and is made once it is let go.
fn a_held_create_gate_holds_back_files_directories_and_symlinks() {
    let layers = [
        // At the root, so that no directory has to be made first: only the file's own `openat`
        // can wait.
        (
            "hosts",
            Layer::new().file("hosts", 0o644, b"127.0.0.1 localhost\n"),
        ),
        ("usr", Layer::new().dir("usr", 0o755)),
        ("lib", Layer::new().symlink("lib", "usr/lib")),
    ];
    for (made, layer) in layers {
        let sandbox = Sandbox::new();
        let gate = rpull_extract::CreateGate::new();
        let options = ExtractOptions {
            create_gate: Some(gate.clone()),
            ..plain_options()
        };
        let layer = layer.bytes();
        let (root, path) = (sandbox.root.clone(), sandbox.root.join(made));
        let extracted = gate.while_held(|| {
            let extraction = std::thread::spawn(move || {
                extract_layer(layer.as_slice(), &root, &options).map(|_| ())
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(
                fs::symlink_metadata(&path).is_err(),
                "{made} was made while the gate was held"
            );
            extraction
        });
        extracted.join().unwrap().unwrap();
        assert!(fs::symlink_metadata(&path).is_ok(), "{made} was not made");
    }
}

fn patterned(seed: u8, length: usize) -> Vec<u8> {
    (0..length)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

/// Regular files' data is written from the source's own buffer (`BufRead::fill_buf`), past the
/// tar crate. Read through a buffer of an odd size, every file's data starts and ends inside
/// one, spans many, and the headers after it must still be found where they are.
fn file_data_spanning_many_source_buffers() {
    let sizes = [
        0usize,
        1,
        511,
        512,
        513,
        4099,
        70_000,
        300_000,
        (1 << 20) + 3,
    ];
    let mut layer = Layer::new().dir("d", 0o755);
    for (index, size) in sizes.iter().enumerate() {
        layer = layer.file(
            &format!("d/f{index}"),
            0o644,
            &patterned(index as u8, *size),
        );
    }
    let layer = layer
        // A long name: a pax record ahead of the entry, read by the tar crate.
        .file(
            &format!("d/{}", "n".repeat(150)),
            0o600,
            &patterned(99, 9000),
        )
        .hardlink("d/link", "d/f6")
        .file("d/last", 0o644, b"after everything")
        .bytes();
    for capacity in [700, 4099] {
        let sandbox = Sandbox::new();
        let summary = extract_layer(
            std::io::BufReader::with_capacity(capacity, layer.as_slice()),
            &sandbox.root,
            &common::options(),
        )
        .unwrap();
        assert_eq!(summary.files, sizes.len() as u64 + 2, "capacity {capacity}");
        for (index, size) in sizes.iter().enumerate() {
            assert_eq!(
                fs::read(sandbox.root.join(format!("d/f{index}"))).unwrap(),
                patterned(index as u8, *size),
                "d/f{index} through a {capacity}-byte buffer"
            );
        }
        assert_eq!(
            fs::read(sandbox.root.join(format!("d/{}", "n".repeat(150)))).unwrap(),
            patterned(99, 9000)
        );
        assert_eq!(
            inode(&sandbox.root.join("d/link")),
            inode(&sandbox.root.join("d/f6"))
        );
        assert_eq!(
            fs::read(sandbox.root.join("d/last")).unwrap(),
            b"after everything"
        );
        sandbox.assert_untouched();
    }
}

/// A GNU sparse entry's stored data is not its content: the tar crate maps it around the holes,
/// so it is read through the tar crate, not straight from the source.
fn gnu_sparse_file_gets_its_holes() {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(EntryType::GNUSparse);
    header.set_path("sparse").unwrap();
    header.set_mode(0o644);
    header.set_mtime(MTIME);
    // 1024 bytes stored: 512 at offset 0 and 512 at offset 8192, of 8704 in all.
    header.set_size(1024);
    {
        let gnu = header.as_gnu_mut().unwrap();
        gnu.sparse[0].offset = *b"00000000000\0";
        gnu.sparse[0].numbytes = *b"00000001000\0";
        gnu.sparse[1].offset = *b"00000020000\0";
        gnu.sparse[1].numbytes = *b"00000001000\0";
        gnu.realsize = *b"00000021000\0";
    }
    header.set_cksum();
    let mut stored = vec![b'a'; 512];
    stored.extend_from_slice(&[b'b'; 512]);
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, stored.as_slice()).unwrap();
    let mut after = tar::Header::new_gnu();
    after.set_size(5);
    after.set_mode(0o644);
    after.set_mtime(MTIME);
    after.set_cksum();
    builder
        .append_data(&mut after, "after", &b"later"[..])
        .unwrap();
    let layer = builder.into_inner().unwrap();

    let sandbox = Sandbox::new();
    extract_layer(layer.as_slice(), &sandbox.root, &common::options()).unwrap();
    let mut expected = vec![b'a'; 512];
    expected.resize(8192, 0);
    expected.extend_from_slice(&[b'b'; 512]);
    assert_eq!(fs::read(sandbox.root.join("sparse")).unwrap(), expected);
    assert_eq!(fs::read(sandbox.root.join("after")).unwrap(), b"later");
}

/// A GNU long name (or pax header) of more than 1 MiB is refused before it is read, as Go's
/// `archive/tar` refuses it: the layer fails with a tar error naming the entry before it, and the
/// entries before it are written as usual.
fn an_extension_header_over_1_mib_is_refused() {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    header.set_mtime(MTIME);
    builder
        .append_data(&mut header, "before", &b"first"[..])
        .unwrap();
    let mut long = tar::Header::new_gnu();
    long.set_path("././@LongLink").unwrap();
    long.set_entry_type(EntryType::GNULongName);
    let name = vec![b'n'; (1 << 20) + 1];
    long.set_size(name.len() as u64);
    long.set_cksum();
    builder.append(&long, name.as_slice()).unwrap();
    let mut file = tar::Header::new_gnu();
    file.set_size(1);
    file.set_mode(0o644);
    builder.append_data(&mut file, "short", &b"x"[..]).unwrap();
    let layer = builder.into_inner().unwrap();

    let sandbox = Sandbox::new();
    let error = extract_layer(layer.as_slice(), &sandbox.root, &common::options()).unwrap_err();
    let ExtractError::Tar { entry, source } = &error else {
        panic!("expected a tar error, got {error:?}");
    };
    assert_eq!(entry, Path::new("before"));
    assert_eq!(
        source.to_string(),
        "a long name entry of 1048577 bytes (at most 1048576)"
    );
    assert_eq!(fs::read(sandbox.root.join("before")).unwrap(), b"first");
    assert!(!sandbox.root.join("short").exists());
}
