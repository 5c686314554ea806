//! Staged layers merged in order: whiteouts, opaque directories, replacements, hardlinks, and the
//! final tree of a multi-layer image asserted exactly.

mod common;

backend_tests!(
    three_layers_on_a_base_give_the_exact_tree,
    staged_hardlinks_keep_their_identity_through_rename,
    opaque_root_directory_hides_everything_below,
    whiteout_of_something_absent_is_ignored,
    a_whiteout_and_an_entry_for_the_same_path_in_one_layer_keep_the_entry,
    deferred_hardlink_replaces_what_the_root_has,
    later_layer_writes_through_a_symlink_of_an_earlier_layer,
    writing_through_a_symlink_agrees_with_one_layer,
    an_explicit_directory_entry_replaces_a_symlink_of_an_earlier_layer,
    whiteouts_opaque_markers_and_hardlinks_resolve_through_earlier_symlinks,
    writing_through_a_symlink_to_a_file_is_invalid,
);

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{Layer, Sandbox, inode, node, plain_options, snapshot};
use rpull_extract::ExtractError;

fn three_layers_on_a_base_give_the_exact_tree() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .dir("etc", 0o755)
        .file("etc/passwd", 0o644, b"root:x:0:0")
        .file("etc/shadow", 0o600, b"secret")
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/tool", 0o755, b"v1")
        .dir("var", 0o755)
        .dir("var/cache", 0o755)
        .file("var/cache/a", 0o644, b"a")
        .dir("var/cache/sub", 0o755)
        .file("var/cache/sub/b", 0o644, b"b")
        .dir("dir-to-file", 0o755)
        .file("dir-to-file/child", 0o644, b"gone")
        .file("file-to-dir", 0o644, b"gone")
        .symlink("symlink-to-dir", "usr")
        .dir("dir-to-symlink", 0o755)
        .file("dir-to-symlink/child", 0o644, b"gone")
        .dir("whited-then-implicit", 0o700)
        .dir("redeclared", 0o755)
        .bytes();
    let first = Layer::new()
        .whiteout("etc/.wh.shadow")
        .dir("var/cache", 0o755)
        .whiteout("var/cache/.wh..wh..opq")
        .file("var/cache/c", 0o644, b"c")
        .file("usr/bin/tool", 0o700, b"v2")
        .hardlink("usr/bin/tool-alias", "usr/bin/tool") // target in this layer: linked in staging
        .hardlink("etc/passwd-", "etc/passwd") // target in the base: deferred to the merge
        .file("dir-to-file", 0o640, b"was a dir")
        .dir("file-to-dir", 0o711)
        .file("file-to-dir/child", 0o644, b"new child")
        .dir("symlink-to-dir", 0o755)
        .file("symlink-to-dir/own", 0o644, b"own")
        .symlink("dir-to-symlink", "etc")
        .whiteout(".wh.whited-then-implicit")
        .bytes();
    let second = Layer::new()
        .whiteout(".wh.dir-to-file")
        .file("usr/bin/.wh.tool-alias", 0o644, b"") // whiteout of a staged hardlink of layer 1
        .file("etc/motd", 0o644, b"hello")
        .file("whited-then-implicit/x", 0o644, b"x") // parent comes back without an entry
        .dir("redeclared", 0o750) // metadata of the later layer wins
        .bytes();
    let options = plain_options();
    let summaries = sandbox.apply(&[base, first, second], &options).unwrap();
    assert_eq!(summaries[1].deferred_hardlinks.len(), 1);
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("dir-to-symlink", 'l', 0, b"etc"),
            node("etc", 'd', 0o755, b""),
            node("etc/motd", 'f', 0o644, b"hello"),
            node("etc/passwd", 'f', 0o644, b"root:x:0:0"),
            node("etc/passwd-", 'f', 0o644, b"root:x:0:0"),
            node("file-to-dir", 'd', 0o711, b""),
            node("file-to-dir/child", 'f', 0o644, b"new child"),
            node("redeclared", 'd', 0o750, b""),
            node("symlink-to-dir", 'd', 0o755, b""),
            node("symlink-to-dir/own", 'f', 0o644, b"own"),
            node("usr", 'd', 0o755, b""),
            node("usr/bin", 'd', 0o755, b""),
            node("usr/bin/tool", 'f', 0o700, b"v2"),
            node("var", 'd', 0o755, b""),
            node("var/cache", 'd', 0o755, b""),
            node("var/cache/c", 'f', 0o644, b"c"),
            node("whited-then-implicit", 'd', 0o755, b""),
            node("whited-then-implicit/x", 'f', 0o644, b"x"),
        ]
    );
    let root = &sandbox.root;
    assert_eq!(
        inode(&root.join("etc/passwd")),
        inode(&root.join("etc/passwd-")),
        "cross-layer hardlink"
    );
    assert_eq!(
        fs::metadata(root.join("usr/bin/tool")).unwrap().nlink(),
        1,
        "the whited-out alias is gone"
    );
    sandbox.assert_untouched();
}

fn staged_hardlinks_keep_their_identity_through_rename() {
    let sandbox = Sandbox::new();
    let base = Layer::new().dir("usr", 0o755).bytes();
    let layer = Layer::new()
        .dir("usr/lib", 0o755) // renamed in as a whole subtree
        .file("usr/lib/libc.so.6", 0o755, b"elf")
        .hardlink("usr/lib/libc.so", "usr/lib/libc.so.6")
        .hardlink("usr/libc-top", "usr/lib/libc.so.6") // a different directory, renamed separately
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    let root = &sandbox.root;
    let original = inode(&root.join("usr/lib/libc.so.6"));
    assert_eq!(inode(&root.join("usr/lib/libc.so")), original);
    assert_eq!(inode(&root.join("usr/libc-top")), original);
    assert_eq!(fs::metadata(root.join("usr/libc-top")).unwrap().nlink(), 3);
}

fn opaque_root_directory_hides_everything_below() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .file("a", 0o644, b"a")
        .dir("d", 0o755)
        .file("d/b", 0o644, b"b")
        .bytes();
    let layer = Layer::new()
        .whiteout(".wh..wh..opq")
        .file("c", 0o644, b"c")
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(snapshot(&sandbox.root), vec![node("c", 'f', 0o644, b"c")]);
}

fn whiteout_of_something_absent_is_ignored() {
    let sandbox = Sandbox::new();
    let base = Layer::new().file("a", 0o644, b"a").bytes();
    let layer = Layer::new()
        .whiteout(".wh.missing")
        .whiteout("no/such/dir/.wh.x")
        .whiteout("a/.wh.not-a-dir")
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(snapshot(&sandbox.root), vec![node("a", 'f', 0o644, b"a")]);
}

fn a_whiteout_and_an_entry_for_the_same_path_in_one_layer_keep_the_entry() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .dir("d", 0o755)
        .file("d/old", 0o644, b"old")
        .bytes();
    let layer = Layer::new()
        .whiteout(".wh.d")
        .dir("d", 0o755)
        .file("d/new", 0o644, b"new")
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("d", 'd', 0o755, b""),
            node("d/new", 'f', 0o644, b"new")
        ]
    );
}

fn deferred_hardlink_replaces_what_the_root_has() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .file("target", 0o644, b"t")
        .file("link", 0o644, b"old")
        .dir("dirlink", 0o755)
        .bytes();
    let layer = Layer::new()
        .hardlink("link", "target")
        .hardlink("dirlink", "target")
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    let root = &sandbox.root;
    assert_eq!(inode(&root.join("link")), inode(&root.join("target")));
    assert_eq!(inode(&root.join("dirlink")), inode(&root.join("target")));
}

/// Regression (merged /usr): a later layer writing beneath a symlink of an earlier layer, with no
/// directory entry of its own for it, writes through the symlink, which stays a symlink (docker,
/// umoci). Relative, absolute and chained targets resolve inside the root; missing directories
/// behind the symlink are created.
fn later_layer_writes_through_a_symlink_of_an_earlier_layer() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .dir("usr", 0o755)
        .dir("usr/lib", 0o755)
        .file("usr/lib/libc.so", 0o755, b"libc")
        .dir("usr/share", 0o755)
        .symlink("usr/lib/share", "../share")
        .symlink("lib", "usr/lib")
        .symlink("lib64", "/usr/lib")
        .symlink("dangling", "usr/missing")
        .bytes();
    let layer = Layer::new()
        .file("lib/libfoo.so", 0o755, b"foo")
        .file("lib64/ld.so", 0o755, b"ld")
        .file("lib/share/doc", 0o644, b"doc") // a symlink behind a symlink
        .file("lib/new/deeper/x", 0o644, b"x") // renamed in behind the symlink
        .file("dangling/y", 0o644, b"y") // umoci creates the missing target too
        .bytes();
    let summaries = sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert!(summaries[1].directories.is_empty());
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("dangling", 'l', 0, b"usr/missing"),
            node("lib", 'l', 0, b"usr/lib"),
            node("lib64", 'l', 0, b"/usr/lib"),
            node("usr", 'd', 0o755, b""),
            node("usr/lib", 'd', 0o755, b""),
            node("usr/lib/ld.so", 'f', 0o755, b"ld"),
            node("usr/lib/libc.so", 'f', 0o755, b"libc"),
            node("usr/lib/libfoo.so", 'f', 0o755, b"foo"),
            node("usr/lib/new", 'd', 0o755, b""),
            node("usr/lib/new/deeper", 'd', 0o755, b""),
            node("usr/lib/new/deeper/x", 'f', 0o644, b"x"),
            node("usr/lib/share", 'l', 0, b"../share"),
            node("usr/missing", 'd', 0o755, b""),
            node("usr/missing/y", 'f', 0o644, b"y"),
            node("usr/share", 'd', 0o755, b""),
            node("usr/share/doc", 'f', 0o644, b"doc"),
        ]
    );
    sandbox.assert_untouched();
}

/// The same layers extracted as one layer give the same tree: the two paths agree.
fn writing_through_a_symlink_agrees_with_one_layer() {
    let base = Layer::new()
        .dir("usr", 0o755)
        .dir("usr/lib", 0o755)
        .symlink("lib", "usr/lib");
    let merged = Sandbox::new();
    merged
        .apply(
            &[
                base.bytes(),
                Layer::new().file("lib/libfoo.so", 0o755, b"foo").bytes(),
            ],
            &plain_options(),
        )
        .unwrap();
    let single = Sandbox::new();
    let layer = Layer::new()
        .dir("usr", 0o755)
        .dir("usr/lib", 0o755)
        .symlink("lib", "usr/lib")
        .file("lib/libfoo.so", 0o755, b"foo")
        .bytes();
    single.apply(&[layer], &plain_options()).unwrap();
    assert_eq!(snapshot(&merged.root), snapshot(&single.root));
}

/// A directory entry of its own replaces the symlink (moby's createTarFile removes a non-directory
/// at a directory entry's path); the symlink's target is left alone, also by whiteouts and opaque
/// markers beneath the new directory.
fn an_explicit_directory_entry_replaces_a_symlink_of_an_earlier_layer() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .dir("usr", 0o755)
        .dir("usr/lib", 0o755)
        .file("usr/lib/libc.so", 0o755, b"libc")
        .file("usr/lib/keep", 0o644, b"keep")
        .dir("usr/lib/sub", 0o755)
        .file("usr/lib/sub/keep", 0o644, b"keep")
        .symlink("lib", "usr/lib")
        .bytes();
    let layer = Layer::new()
        .dir("lib", 0o750)
        .file("lib/own", 0o644, b"own")
        .whiteout("lib/.wh.keep")
        .whiteout("lib/sub/.wh..wh..opq")
        .bytes();
    sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("lib", 'd', 0o750, b""),
            node("lib/own", 'f', 0o644, b"own"),
            node("lib/sub", 'd', 0o755, b""),
            node("usr", 'd', 0o755, b""),
            node("usr/lib", 'd', 0o755, b""),
            node("usr/lib/keep", 'f', 0o644, b"keep"),
            node("usr/lib/libc.so", 'f', 0o755, b"libc"),
            node("usr/lib/sub", 'd', 0o755, b""),
            node("usr/lib/sub/keep", 'f', 0o644, b"keep"),
        ]
    );
}

/// Whiteouts, opaque markers and deferred hardlinks beneath a symlink of an earlier layer (with
/// no directory entry in the later layer) resolve through it, as umoci does.
fn whiteouts_opaque_markers_and_hardlinks_resolve_through_earlier_symlinks() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .dir("usr", 0o755)
        .dir("usr/lib", 0o755)
        .file("usr/lib/libc.so", 0o755, b"libc")
        .file("usr/lib/gone", 0o644, b"gone")
        .dir("usr/lib/cache", 0o755)
        .file("usr/lib/cache/old", 0o644, b"old")
        .symlink("lib", "usr/lib")
        .symlink("lib64", "/usr/lib")
        .bytes();
    let layer = Layer::new()
        .whiteout("lib/.wh.gone")
        .whiteout("lib64/cache/.wh..wh..opq")
        .file("lib/cache/new", 0o644, b"new")
        .hardlink("lib/libc-alias", "lib64/libc.so")
        .bytes();
    let summaries = sandbox.apply(&[base, layer], &plain_options()).unwrap();
    assert_eq!(summaries[1].deferred_hardlinks.len(), 1);
    assert_eq!(
        snapshot(&sandbox.root),
        vec![
            node("lib", 'l', 0, b"usr/lib"),
            node("lib64", 'l', 0, b"/usr/lib"),
            node("usr", 'd', 0o755, b""),
            node("usr/lib", 'd', 0o755, b""),
            node("usr/lib/cache", 'd', 0o755, b""),
            node("usr/lib/cache/new", 'f', 0o644, b"new"),
            node("usr/lib/libc-alias", 'f', 0o755, b"libc"),
            node("usr/lib/libc.so", 'f', 0o755, b"libc"),
        ]
    );
    let root = &sandbox.root;
    assert_eq!(
        inode(&root.join("usr/lib/libc-alias")),
        inode(&root.join("usr/lib/libc.so"))
    );
    sandbox.assert_untouched();
}

/// Writing beneath a symlink of an earlier layer that leads to a file fails naming the entry, as
/// docker (ENOTDIR) and umoci do; nothing is replaced.
fn writing_through_a_symlink_to_a_file_is_invalid() {
    let sandbox = Sandbox::new();
    let base = Layer::new()
        .file("file", 0o644, b"f")
        .symlink("link", "file")
        .bytes();
    let layer = Layer::new().file("link/x", 0o644, b"x").bytes();
    match sandbox.apply(&[base, layer], &plain_options()) {
        Err(ExtractError::Invalid { entry, .. }) => assert_eq!(entry, Path::new("link/x")),
        other => panic!("expected Invalid naming link/x, got {other:?}"),
    }
    assert_eq!(
        fs::read_link(sandbox.root.join("link")).unwrap(),
        Path::new("file")
    );
    sandbox.assert_untouched();
}
