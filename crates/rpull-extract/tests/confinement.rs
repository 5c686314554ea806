//! Hostile layers: nothing outside the root is ever created, changed or deleted.

mod common;

backend_tests!(
    names_climbing_above_the_root,
    long_hostile_names_via_pax_and_gnu,
    absolute_names_land_inside_the_root,
    relative_symlink_escapes,
    absolute_symlinks_resolve_inside_the_root,
    chained_symlinks,
    directory_swapped_for_a_symlink_by_a_later_entry,
    directory_swapped_for_a_symlink_by_a_later_layer,
    later_layer_through_a_symlink_of_an_earlier_layer_escapes,
    later_layer_through_an_absolute_symlink_of_an_earlier_layer_lands_inside,
    writing_over_a_symlink_replaces_it,
    hardlinks_whose_target_is_outside,
    whiteouts_aimed_outside,
);

use std::fs;

use common::{Layer, Sandbox, assert_escape, node, os, plain_options, snapshot};
use rpull_extract::{ExtractError, extract_layer};
use tar::EntryType;

/// Extracts `layer` straight into the root (layer 0) and into a staging directory; both must fail
/// with an Escape naming `entry`.
fn assert_escapes_in_root_and_staging(layer: &[u8], entry: &str) {
    let sandbox = Sandbox::new();
    assert_escape(extract_layer(layer, &sandbox.root, &plain_options()), entry);
    assert_escape(
        extract_layer(layer, &sandbox.staging(1), &plain_options()),
        entry,
    );
    sandbox.assert_untouched();
}

fn names_climbing_above_the_root() {
    for name in [
        "../x",
        "a/../../x",
        "/../x",
        "./../sentinel",
        "..",
        "a/b/../../../escaped",
    ] {
        for kind in [
            EntryType::Regular,
            EntryType::Directory,
            EntryType::Symlink,
            EntryType::Link,
            EntryType::Fifo,
        ] {
            let mut layer = Layer::new().dir("a", 0o755).dir("a/b", 0o755);
            let link = matches!(kind, EntryType::Symlink | EntryType::Link).then_some(&b"a"[..]);
            layer.entry(kind, name.as_bytes(), link, 0o644, b"", &[]);
            assert_escapes_in_root_and_staging(&layer.bytes(), name);
        }
    }
}

fn long_hostile_names_via_pax_and_gnu() {
    let name = format!("{}{}x", "a/".repeat(40), "../".repeat(41));
    let layer = Layer::new().file(&name, 0o644, b"x").bytes();
    assert_escapes_in_root_and_staging(&layer, &name);
    let mut gnu = Layer::new();
    gnu.long_names = common::LongNames::Gnu;
    let layer = gnu.file(&name, 0o644, b"x").bytes();
    assert_escapes_in_root_and_staging(&layer, &name);
}

fn absolute_names_land_inside_the_root() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .file("/etc/x", 0o644, b"inside")
        .file("//usr/./bin/../lib/y", 0o644, b"y")
        .bytes();
    extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(fs::read(sandbox.root.join("etc/x")).unwrap(), b"inside");
    assert_eq!(fs::read(sandbox.root.join("usr/lib/y")).unwrap(), b"y");
    sandbox.assert_untouched();
}

fn relative_symlink_escapes() {
    for (target, entry) in [
        ("../../..", "link/file"),
        ("..", "link/sentinel"),
        ("../outside", "link/secret"),
        ("a/../..", "link/x"),
    ] {
        let layer = Layer::new()
            .symlink("link", target)
            .file(entry, 0o644, b"pwned")
            .bytes();
        assert_escapes_in_root_and_staging(&layer, entry);
        let layer = Layer::new()
            .symlink("link", target)
            .dir(entry, 0o755)
            .bytes();
        assert_escapes_in_root_and_staging(&layer, entry);
    }
}

fn absolute_symlinks_resolve_inside_the_root() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .symlink("link", "/")
        .file("link/etc/x", 0o644, b"inside")
        .symlink("deep", "/usr/lib/")
        .file("deep/libz.so", 0o644, b"z")
        .bytes();
    extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(fs::read(sandbox.root.join("etc/x")).unwrap(), b"inside");
    assert_eq!(
        fs::read(sandbox.root.join("usr/lib/libz.so")).unwrap(),
        b"z"
    );
    assert_eq!(
        fs::read_link(sandbox.root.join("link")).unwrap(),
        os(b"/"),
        "targets are kept verbatim"
    );
    sandbox.assert_untouched();
    // An absolute target that then climbs above the root is still an escape.
    let layer = Layer::new()
        .symlink("up", "/..")
        .file("up/x", 0o644, b"x")
        .bytes();
    assert_escapes_in_root_and_staging(&layer, "up/x");
}

fn chained_symlinks() {
    let layer = Layer::new()
        .symlink("a", "b")
        .symlink("b", "c/../..")
        .dir("c", 0o755)
        .file("a/x", 0o644, b"x")
        .bytes();
    assert_escapes_in_root_and_staging(&layer, "a/x");
    let layer = Layer::new()
        .symlink("a", "/b")
        .symlink("b", "../../outside")
        .file("a/secret", 0o644, b"x")
        .bytes();
    assert_escapes_in_root_and_staging(&layer, "a/secret");

    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .symlink("c", "/d")
        .symlink("d", "/real")
        .dir("real", 0o755)
        .file("c/x", 0o644, b"x")
        .bytes();
    extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(fs::read(sandbox.root.join("real/x")).unwrap(), b"x");
    sandbox.assert_untouched();

    let layer = Layer::new()
        .symlink("loop1", "loop2")
        .symlink("loop2", "loop1")
        .file("loop1/x", 0o644, b"x")
        .bytes();
    let sandbox = Sandbox::new();
    let error = extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap_err();
    assert!(
        matches!(&error, ExtractError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP)),
        "{error}"
    );
    sandbox.assert_untouched();
}

fn directory_swapped_for_a_symlink_by_a_later_entry() {
    // The parent-directory cache must not keep using the replaced directory.
    let layer = Layer::new()
        .dir("d", 0o755)
        .file("d/ok", 0o644, b"ok")
        .symlink("d", "../..")
        .file("d/x", 0o644, b"pwned")
        .bytes();
    assert_escapes_in_root_and_staging(&layer, "d/x");
    let layer = Layer::new()
        .dir("d", 0o755)
        .dir("d/e", 0o755)
        .symlink("d", "/")
        .file("d/e/x", 0o644, b"x")
        .bytes();
    let sandbox = Sandbox::new();
    extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(
        fs::read(sandbox.root.join("e/x")).unwrap(),
        b"x",
        "resolved through the new symlink, inside the root"
    );
    sandbox.assert_untouched();
}

fn directory_swapped_for_a_symlink_by_a_later_layer() {
    // Regression: a later layer writing beneath the symlink (with no directory entry of its own)
    // follows it inside the root, like the same entries in one layer; climbing above the root is
    // an escape naming the entry.
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .dir("d", 0o755)
        .file("d/file", 0o644, b"x")
        .bytes();
    let swap = Layer::new().symlink("d", "../..").bytes();
    let write = Layer::new().file("d/sentinel", 0o644, b"pwned").bytes();
    assert_escape(
        sandbox.apply(&[base, swap, write], &plain_options()),
        "d/sentinel",
    );
    sandbox.assert_untouched();

    let sandbox = Sandbox::new();
    let base = Layer::new().dir("e", 0o755).bytes();
    let swap = Layer::new().symlink("e", "/").bytes();
    let write = Layer::new().file("e/sentinel", 0o644, b"inside").bytes();
    sandbox
        .apply(&[base, swap, write], &plain_options())
        .unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("e", 'l', 0, b"/"),
            node("sentinel", 'f', 0o644, b"inside"),
        ]
    );
    sandbox.assert_untouched();
}

/// The symlink of an earlier layer, then entries beneath it: the merge fails exactly as the same
/// entries in one layer do, naming the entry (descending through directories that have no entry
/// of their own), and leaves everything outside alone.
fn later_layer_through_a_symlink_of_an_earlier_layer_escapes() {
    for (target, entry) in [
        ("../..", "l/sentinel"),
        ("..", "l/sentinel"),
        ("../outside", "l/secret"),
        ("/..", "l/x"),
        ("a/../..", "l/deep/er/x"),
    ] {
        let single = Layer::new()
            .symlink("l", target)
            .file(entry, 0o644, b"pwned")
            .bytes();
        assert_escapes_in_root_and_staging(&single, entry);
        let sandbox = Sandbox::new();
        let base = Layer::new().symlink("l", target).bytes();
        let layer = Layer::new().file(entry, 0o644, b"pwned").bytes();
        assert_escape(sandbox.apply(&[base, layer], &plain_options()), entry);
        sandbox.assert_untouched();
    }
    // Chained through a symlink of the root that climbs out.
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .symlink("a", "/b")
        .symlink("b", "../../outside")
        .bytes();
    let layer = Layer::new().file("a/secret", 0o644, b"x").bytes();
    assert_escape(sandbox.apply(&[base, layer], &plain_options()), "a/secret");
    sandbox.assert_untouched();
    // A symlink loop is ELOOP, not a replaced symlink.
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .symlink("loop1", "loop2")
        .symlink("loop2", "loop1")
        .bytes();
    let layer = Layer::new().file("loop1/x", 0o644, b"x").bytes();
    let error = sandbox.apply(&[base, layer], &plain_options()).unwrap_err();
    assert!(
        matches!(&error, ExtractError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP)),
        "{error}"
    );
    sandbox.assert_untouched();
}

fn later_layer_through_an_absolute_symlink_of_an_earlier_layer_lands_inside() {
    let sandbox = Sandbox::new();
    let base = Layer::new().symlink("l", "/").bytes();
    let layer = Layer::new().file("l/etc/y", 0o644, b"inside").bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("etc", 'd', 0o755, b""),
            node("etc/y", 'f', 0o644, b"inside"),
            node("l", 'l', 0, b"/"),
        ]
    );
    sandbox.assert_untouched();
}

fn writing_over_a_symlink_replaces_it() {
    let sandbox = Sandbox::new();
    let layer = Layer::new()
        .symlink("s", "../sentinel")
        .file("s", 0o644, b"mine")
        .symlink("o", "../outside")
        .dir("o", 0o755)
        .bytes();
    extract_layer(layer.as_slice(), &sandbox.root, &plain_options()).unwrap();
    assert_eq!(fs::read(sandbox.root.join("s")).unwrap(), b"mine");
    assert!(
        fs::symlink_metadata(sandbox.root.join("o"))
            .unwrap()
            .is_dir()
    );
    sandbox.assert_untouched();
}

fn hardlinks_whose_target_is_outside() {
    let layer = Layer::new().hardlink("h", "../../etc/passwd").bytes();
    assert_escapes_in_root_and_staging(&layer, "h");
    let layer = Layer::new().hardlink("h", "../sentinel").bytes();
    assert_escapes_in_root_and_staging(&layer, "h");
    // Through a symlink pointing outside (same layer).
    let layer = Layer::new()
        .symlink("l", "../..")
        .hardlink("h", "l/sentinel")
        .bytes();
    assert_escapes_in_root_and_staging(&layer, "h");
    // Through a symlink of an earlier layer: the deferred link fails during the merge.
    let sandbox = Sandbox::new();
    let base = Layer::new().symlink("l", "..").bytes();
    let layer = Layer::new().hardlink("h", "l/sentinel").bytes();
    assert_escape(sandbox.apply(&[base, layer], &plain_options()), "h");
    sandbox.assert_untouched();
    // A deferred hardlink whose own parent is a symlink of an earlier layer leading outside.
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .file("target", 0o644, b"t")
        .symlink("l", "..")
        .bytes();
    let layer = Layer::new().hardlink("l/h", "target").bytes();
    assert_escape(sandbox.apply(&[base, layer], &plain_options()), "l/h");
    sandbox.assert_untouched();
    // Through an absolute symlink: resolved inside the root.
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .symlink("l", "/")
        .dir("etc", 0o755)
        .file("etc/file", 0o644, b"f")
        .bytes();
    let layer = Layer::new().hardlink("h", "l/etc/file").bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(
        common::inode(&sandbox.root.join("h")),
        common::inode(&sandbox.root.join("etc/file"))
    );
    sandbox.assert_untouched();
}

fn whiteouts_aimed_outside() {
    let layer = Layer::new().whiteout("../.wh.sentinel").bytes();
    assert_escapes_in_root_and_staging(&layer, "../.wh.sentinel");
    let layer = Layer::new().whiteout("a/../../.wh.outside").bytes();
    assert_escapes_in_root_and_staging(&layer, "a/../../.wh.outside");
    let layer = Layer::new().whiteout(".wh...").bytes();
    let sandbox = Sandbox::new();
    assert!(matches!(
        extract_layer(layer.as_slice(), &sandbox.staging(1), &plain_options()),
        Err(ExtractError::Invalid { .. })
    ));

    // Through a relative symlink of an earlier layer: an escape during the merge.
    let sandbox = Sandbox::new();
    let base = Layer::new().symlink("l", "..").bytes();
    let layer = Layer::new().whiteout("l/.wh.sentinel").bytes();
    assert_escape(
        sandbox.apply(&[base, layer], &plain_options()),
        "l/sentinel",
    );
    sandbox.assert_untouched();

    // Through an absolute symlink: deletes inside the root only.
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .symlink("l", "/")
        .dir("etc", 0o755)
        .file("etc/f", 0o644, b"f")
        .file("etc/g", 0o644, b"g")
        .bytes();
    let layer = Layer::new().whiteout("l/etc/.wh.f").bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("etc", 'd', 0o755, b""),
            node("etc/g", 'f', 0o644, b"g"),
            node("l", 'l', 0, b"/")
        ]
    );
    sandbox.assert_untouched();

    // An opaque marker behind a symlink to the outside never empties the outside: an escape, as
    // in one layer; the symlink is kept.
    let layer = Layer::new()
        .symlink("o", "../outside")
        .whiteout("o/.wh..wh..opq")
        .bytes();
    assert_escapes_in_root_and_staging(&layer, "o/.wh..wh..opq");
    let sandbox = Sandbox::new();
    let base = Layer::new().symlink("o", "../outside").bytes();
    let layer = Layer::new().whiteout("o/.wh..wh..opq").bytes();
    assert_escape(
        sandbox.apply(&[base, layer], &plain_options()),
        "o/.wh..wh..opq",
    );
    assert_eq!(
        snapshot(&sandbox.root),
        vec![node("o", 'l', 0, b"../outside")]
    );
    sandbox.assert_untouched();
    // With a directory entry of its own the directory replaces the symlink and empties nothing.
    let sandbox = Sandbox::new();
    let base = Layer::new().symlink("o", "../outside").bytes();
    let layer = Layer::new()
        .dir("o", 0o755)
        .whiteout("o/.wh..wh..opq")
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(snapshot(&sandbox.root), vec![node("o", 'd', 0o755, b"")]);
    sandbox.assert_untouched();
}
