//! Confinement, through a real registry: hostile layers either fail the pull with an error that
//! names the entry (and leave nothing behind), or, for absolute names and absolute symlinks,
//! land inside DIR. Nothing beside DIR or elsewhere on the machine is ever touched.
//!
//! Every single-layer case runs twice: as layer 0 (extracted straight into the staging root) and
//! as layer 1 (extracted into its own staging directory, then merged), since the two take
//! different paths through the extractor.

mod common;

use std::path::{Path, PathBuf};

use common::{Env, chain, snapshot, staging_left};
use rpull::PullError;
use rpull_extract::ExtractError;
use rpull_testing::{
    Compression, DiffOptions, EntryType, ImageBuilder, LayerBuilder, TreeSnapshot, diff,
};

#[derive(Debug, Clone)]
enum Expect {
    /// The pull fails with `ExtractError::Escape` naming this entry.
    Escape(String),
    /// A whiteout: the pull fails with `ExtractError::Escape` naming the whiteout entry or the
    /// path it whites out (`s/.wh.x` or `s/x`). With `noop_allowed` (the whiteout's own layer is
    /// the only one with the symlink on its way, and whiteouts only delete from lower layers)
    /// it may also succeed. Either way nothing outside is touched.
    WhiteoutEscape {
        entry: String,
        target: String,
        noop_allowed: bool,
    },
    /// The pull succeeds and these files (path in DIR, content) exist.
    Inside(Vec<(String, &'static str)>),
}

struct Case {
    name: String,
    layers: Vec<Vec<u8>>,
    expect: Expect,
    /// Symlinks (path in DIR, target) that must still be symlinks when the pull succeeds.
    kept_symlinks: Vec<(String, String)>,
}

fn case(name: &str, layers: Vec<LayerBuilder>, expect: Expect) -> Case {
    Case {
        name: name.to_owned(),
        layers: layers.into_iter().map(LayerBuilder::build).collect(),
        expect,
        kept_symlinks: Vec::new(),
    }
}

impl Case {
    fn keeps_symlink(mut self, path: &str, target: &str) -> Case {
        self.kept_symlinks
            .push((path.to_owned(), target.to_owned()));
        self
    }
}

fn escape(entry: &str) -> Expect {
    Expect::Escape(entry.to_owned())
}

fn whiteout_escape_or_noop(entry: &str, target: &str) -> Expect {
    Expect::WhiteoutEscape {
        entry: entry.to_owned(),
        target: target.to_owned(),
        noop_allowed: true,
    }
}

fn whiteout_escape(entry: &str, target: &str) -> Expect {
    Expect::WhiteoutEscape {
        entry: entry.to_owned(),
        target: target.to_owned(),
        noop_allowed: false,
    }
}

fn inside(files: &[(&str, &'static str)]) -> Expect {
    Expect::Inside(files.iter().map(|(p, c)| ((*p).to_owned(), *c)).collect())
}

fn l() -> LayerBuilder {
    LayerBuilder::new()
}

/// Where a case runs: `parent/` holds DIR (`rootfs`), a sentinel file and a sentinel directory
/// beside it; `outside` is another directory elsewhere, named by absolute hostile entries.
struct Sandbox {
    parent: PathBuf,
    dest: PathBuf,
    outside: PathBuf,
}

impl Sandbox {
    fn new(base: &Path, name: &str, outside: &Path) -> Sandbox {
        let parent = base.join(name);
        std::fs::create_dir_all(parent.join("outside/deeper")).unwrap();
        std::fs::write(parent.join("sentinel"), "sentinel\n").unwrap();
        std::fs::write(parent.join("outside/keep"), "keep\n").unwrap();
        std::fs::write(parent.join("outside/deeper/keep"), "keep\n").unwrap();
        Sandbox {
            dest: parent.join("rootfs"),
            parent,
            outside: outside.to_owned(),
        }
    }

    /// Everything the pull must not touch: the parent without DIR, and the outside directory.
    fn capture(&self) -> (TreeSnapshot, TreeSnapshot) {
        (snapshot(&self.parent), snapshot(&self.outside))
    }
}

/// Strict: kinds, modes, contents, owners, xattrs, and every mtime to the nanosecond (so an
/// entry created and removed again inside a sentinel directory shows).
fn strict() -> DiffOptions {
    DiffOptions {
        dir_mtimes: true,
        mtime_nanos: true,
        ..DiffOptions::default()
    }
    .ignore("rootfs")
}

fn escape_entry(error: &PullError) -> Option<&Path> {
    match error {
        PullError::Extract {
            source: ExtractError::Escape { entry, .. },
            ..
        } => Some(entry),
        _ => None,
    }
}

/// Runs every case (as layer 0 and as layer 1 when it has one layer) and panics with all
/// the failures at once.
async fn run(outside: &Path, cases: Vec<Case>) {
    let env = Env::start();
    let mut failures = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let mut variants = vec![("", case.layers.clone())];
        if case.layers.len() == 1 {
            let benign = l()
                .dir("benign", 0o755)
                .file("benign/file", "benign\n", 0o644)
                .build();
            variants.push(("-as-layer-1", vec![benign, case.layers[0].clone()]));
        }
        for (suffix, layers) in variants {
            let label = format!("{}{suffix}", case.name);
            if let Err(failure) = run_one(&env, outside, n, &label, &layers, case).await {
                failures.push(format!("{label}: {failure}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} confinement failures:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

async fn run_one(
    env: &Env,
    outside: &Path,
    n: usize,
    label: &str,
    layers: &[Vec<u8>],
    case: &Case,
) -> Result<(), String> {
    let expect = &case.expect;
    let sandbox = Sandbox::new(env.tmp.path(), label, outside);
    let before = sandbox.capture();
    let mut image = ImageBuilder::new();
    for (i, tar) in layers.iter().enumerate() {
        // Alternate codecs; the confinement logic must not depend on them.
        image = image.layer_tar(
            tar,
            if i % 2 == 0 {
                Compression::Gzip
            } else {
                Compression::None
            },
        );
    }
    let reference = env
        .push(&image.build(), &format!("hostile/case{n}:{label}"))
        .await;
    let result = env.pull(&reference, &sandbox.dest).await;

    let after = sandbox.capture();
    let mut problems = Vec::new();
    for (b, a) in [(&before.0, &after.0), (&before.1, &after.1)] {
        let changes = diff(b, a, &strict());
        if !changes.is_empty() {
            problems.push(format!("touched outside DIR: {}", changes.join("; ")));
        }
    }
    if let Some(e) = after.0.get("sentinel")
        && e.nlink != 1
    {
        problems.push(format!("the sentinel gained {} hardlinks", e.nlink - 1));
    }
    let staging = staging_left(&sandbox.dest);
    if !staging.is_empty() {
        problems.push(format!("staging left behind: {staging:?}"));
    }
    for planted in ["/etc/rpull-planted", "/rpull-planted"] {
        if Path::new(planted).exists() {
            problems.push(format!("{planted} was created on the host"));
        }
    }

    match (expect, &result) {
        (Expect::Escape(entry), Err(error)) => {
            let message = chain(error);
            match escape_entry(error) {
                Some(named) if named == Path::new(entry) => {}
                _ => problems.push(format!(
                    "expected an Escape naming {entry:?}, got {error:?} ({message})"
                )),
            }
            if !message.contains(entry.as_str()) {
                problems.push(format!("the message does not name {entry:?}: {message}"));
            }
            if std::fs::symlink_metadata(&sandbox.dest).is_ok() {
                problems.push("DIR exists after the failed pull".to_owned());
            }
        }
        (Expect::WhiteoutEscape { entry, target, .. }, Err(error)) => {
            let message = chain(error);
            let named = escape_entry(error);
            if named != Some(Path::new(entry)) && named != Some(Path::new(target)) {
                problems.push(format!(
                    "expected an Escape naming {entry:?} or {target:?}, got {error:?} ({message})"
                ));
            }
            if std::fs::symlink_metadata(&sandbox.dest).is_ok() {
                problems.push("DIR exists after the failed pull".to_owned());
            }
        }
        (
            Expect::WhiteoutEscape {
                noop_allowed: true, ..
            },
            Ok(_),
        ) => {}
        (
            Expect::WhiteoutEscape {
                entry,
                noop_allowed: false,
                ..
            },
            Ok(_),
        ) => {
            problems.push(format!(
                "expected an Escape naming {entry:?}, the pull succeeded"
            ));
        }
        (Expect::Escape(entry), Ok(_)) => {
            problems.push(format!(
                "expected an Escape naming {entry:?}, the pull succeeded"
            ));
        }
        (Expect::Inside(files), Ok(_)) => {
            for (path, content) in files {
                let path = path.replace("{outside}", outside.to_str().unwrap());
                match std::fs::read_to_string(sandbox.dest.join(path.trim_start_matches('/'))) {
                    Ok(actual) if actual == *content => {}
                    other => {
                        problems.push(format!("DIR/{path}: expected {content:?}, got {other:?}"))
                    }
                }
            }
        }
        (Expect::Inside(_), Err(error)) => {
            problems.push(format!("expected success, got {}", chain(error)))
        }
    }
    if result.is_ok() {
        for (path, target) in &case.kept_symlinks {
            match std::fs::read_link(sandbox.dest.join(path)) {
                Ok(actual) if actual == Path::new(target) => {}
                other => problems.push(format!(
                    "DIR/{path}: expected a symlink to {target:?}, got {other:?}"
                )),
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// A directory outside the test's temporary tree, with a file in it, that absolute hostile
/// names and targets point at.
fn outside_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rpull-outside-")
        .tempdir()
        .unwrap();
    std::fs::write(dir.path().join("keep"), "outside\n").unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_climb_out() {
    let outside = outside_dir();
    run(
        outside.path(),
        vec![
            case(
                "dotdot",
                vec![l().raw_file(b"../sentinel", "pwned")],
                escape("../sentinel"),
            ),
            case(
                "dotdot-twice",
                vec![l().raw_file(b"../../sentinel", "pwned")],
                escape("../../sentinel"),
            ),
            case(
                "dotdot-new-file",
                vec![l().raw_file(b"../planted", "pwned")],
                escape("../planted"),
            ),
            case(
                "dotdot-dir",
                vec![l().raw_file(b"../outside/keep", "pwned")],
                escape("../outside/keep"),
            ),
            case(
                "a-dotdot-dotdot",
                vec![l().dir("a", 0o755).raw_file(b"a/../../sentinel", "pwned")],
                escape("a/../../sentinel"),
            ),
            case(
                "deep",
                vec![l().raw_file(b"a/b/../../../../../../../../../../rpull-planted", "pwned")],
                escape("a/b/../../../../../../../../../../rpull-planted"),
            ),
            case(
                "dotdot-directory",
                vec![l().raw_header_entry(b"../newdir", EntryType::Directory)],
                escape("../newdir"),
            ),
            case(
                "dotdot-symlink",
                vec![l().raw_link(b"../link", EntryType::Symlink, b"/")],
                escape("../link"),
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_names_land_inside() {
    let outside = outside_dir();
    let planted = format!("{}/planted", outside.path().display());
    run(
        outside.path(),
        vec![
            case(
                "absolute-etc",
                vec![l().raw_file(b"/etc/rpull-planted", "inside\n")],
                inside(&[("etc/rpull-planted", "inside\n")]),
            ),
            case(
                "absolute-outside-dir",
                vec![
                    l().raw_file(planted.as_bytes(), "inside\n")
                        .raw_file(b"//rpull-planted", "root\n"),
                ],
                inside(&[
                    ("{outside}/planted", "inside\n"),
                    ("rpull-planted", "root\n"),
                ]),
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_escapes() {
    let outside = outside_dir();
    let outside_bytes = outside.path().to_str().unwrap().as_bytes().to_vec();
    run(
        outside.path(),
        vec![
            case(
                "relative-up",
                vec![
                    l().symlink("l", "../../..")
                        .raw_file(b"l/sentinel", "pwned"),
                ],
                escape("l/sentinel"),
            ),
            case(
                "relative-up-one",
                vec![l().symlink("l", "..").raw_file(b"l/sentinel", "pwned")],
                escape("l/sentinel"),
            ),
            case(
                "relative-up-dir",
                vec![l().symlink("l", "../outside").dir("l/newdir", 0o755)],
                escape("l/newdir"),
            ),
            case(
                "relative-up-deeper",
                vec![
                    l().symlink("l", "../outside")
                        .raw_file(b"l/deeper/keep", "pwned"),
                ],
                escape("l/deeper/keep"),
            ),
            case(
                "nested-up",
                vec![
                    l().dir("a", 0o755)
                        .dir("a/b", 0o755)
                        .symlink("a/b/l", "../../..")
                        .raw_file(b"a/b/l/sentinel", "pwned"),
                ],
                escape("a/b/l/sentinel"),
            ),
            case(
                "chained",
                vec![
                    l().symlink("a", "b/d")
                        .symlink("b", "c")
                        .dir("c", 0o755)
                        .symlink("c/d", "../..")
                        .raw_file(b"a/sentinel", "pwned"),
                ],
                escape("a/sentinel"),
            ),
            case(
                "absolute-then-up",
                vec![l().symlink("up", "/..").raw_file(b"up/sentinel", "pwned")],
                escape("up/sentinel"),
            ),
            case(
                "dir-swapped-for-symlink-same-layer",
                vec![
                    l().dir("d", 0o755)
                        .symlink("d", "../..")
                        .raw_file(b"d/sentinel", "pwned"),
                ],
                escape("d/sentinel"),
            ),
            // Absolute targets resolve inside DIR: these land inside.
            case(
                "absolute-root",
                vec![l().symlink("l", "/").raw_file(b"l/etc/x", "inside\n")],
                inside(&[("etc/x", "inside\n")]),
            )
            .keeps_symlink("l", "/"),
            case(
                "absolute-outside-dir",
                vec![
                    l().raw_link(b"l", EntryType::Symlink, &outside_bytes)
                        .raw_file(b"l/planted", "inside\n"),
                ],
                inside(&[("{outside}/planted", "inside\n")]),
            )
            .keeps_symlink("l", outside.path().to_str().unwrap()),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardlink_escapes() {
    let outside = outside_dir();
    run(
        outside.path(),
        vec![
            case(
                "hardlink-etc-passwd",
                vec![l().raw_link(b"hostile-link", EntryType::Link, b"../../etc/passwd")],
                escape("hostile-link"),
            ),
            case(
                "hardlink-sentinel",
                vec![l().raw_link(b"hostile-link", EntryType::Link, b"../sentinel")],
                escape("hostile-link"),
            ),
            case(
                "hardlink-sentinel-2",
                vec![l().raw_link(b"hostile-link", EntryType::Link, b"../../sentinel")],
                escape("hostile-link"),
            ),
            case(
                "hardlink-through-symlink",
                vec![l().symlink("s", "../..").raw_link(
                    b"hostile-link",
                    EntryType::Link,
                    b"s/sentinel",
                )],
                escape("hostile-link"),
            ),
            case(
                "hardlink-through-earlier-symlink",
                vec![
                    l().symlink("s", ".."),
                    l().raw_link(b"hostile-link", EntryType::Link, b"s/sentinel"),
                ],
                escape("hostile-link"),
            ),
            // An absolute symlink on the way resolves inside DIR.
            case(
                "hardlink-through-absolute-symlink",
                vec![
                    l().dir("etc", 0o755)
                        .file("etc/passwd", "inside\n", 0o644)
                        .symlink("s", "/etc")
                        .raw_link(b"hostile-link", EntryType::Link, b"s/passwd"),
                ],
                inside(&[("hostile-link", "inside\n"), ("etc/passwd", "inside\n")]),
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whiteout_escapes() {
    let outside = outside_dir();
    run(
        outside.path(),
        vec![
            case(
                "whiteout-dotdot",
                vec![l().raw_file(b"../.wh.sentinel", "")],
                escape("../.wh.sentinel"),
            ),
            case(
                "whiteout-dotdot-dir",
                vec![l().raw_file(b"../.wh.outside", "")],
                escape("../.wh.outside"),
            ),
            case(
                "whiteout-a-dotdot",
                vec![l().dir("a", 0o755).raw_file(b"a/../../.wh.sentinel", "")],
                escape("a/../../.wh.sentinel"),
            ),
            // Only this layer has `s`: the whiteout has nothing below it to delete.
            case(
                "whiteout-through-symlink",
                vec![l().symlink("s", "../..").raw_file(b"s/.wh.sentinel", "")],
                whiteout_escape_or_noop("s/.wh.sentinel", "s/sentinel"),
            )
            .keeps_symlink("s", "../.."),
            case(
                "whiteout-through-earlier-symlink",
                vec![l().symlink("s", ".."), l().raw_file(b"s/.wh.sentinel", "")],
                whiteout_escape("s/.wh.sentinel", "s/sentinel"),
            ),
            case(
                "whiteout-through-symlink-in-both-layers",
                vec![
                    l().symlink("s", "../.."),
                    l().symlink("s", "../..").raw_file(b"s/.wh.sentinel", ""),
                ],
                whiteout_escape("s/.wh.sentinel", "s/sentinel"),
            ),
            case(
                "opaque-dotdot",
                vec![l().raw_file(b"../outside/.wh..wh..opq", "")],
                escape("../outside/.wh..wh..opq"),
            ),
        ],
    )
    .await;
}

/// A raw directory entry (the harness has raw files and links only).
trait RawEntry {
    fn raw_header_entry(self, name: &[u8], entry_type: EntryType) -> Self;
}

impl RawEntry for LayerBuilder {
    fn raw_header_entry(self, name: &[u8], entry_type: EntryType) -> Self {
        let mut header = self.raw_header(name, entry_type);
        header.set_mode(0o755);
        self.raw(header, [])
    }
}

/// A later layer writing beneath a path that an earlier layer made a symlink: the symlink is
/// followed inside DIR (as umoci and docker do) and an escape through it fails the pull, the
/// same as within one layer. The symlink itself stays a symlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_layers_writing_through_symlinks_of_earlier_layers() {
    let outside = outside_dir();
    run(
        outside.path(),
        vec![
            case(
                "dir-swapped-for-symlink-later-layer",
                vec![
                    l().dir("d", 0o755).file("d/file", "x", 0o644),
                    l().symlink("d", "../.."),
                    l().raw_file(b"d/sentinel", "pwned"),
                ],
                escape("d/sentinel"),
            ),
            case(
                "symlink-in-earlier-layer",
                vec![
                    l().symlink("l", "../.."),
                    l().raw_file(b"l/sentinel", "pwned"),
                ],
                escape("l/sentinel"),
            ),
            case(
                "absolute-in-earlier-layer",
                vec![l().symlink("l", "/"), l().raw_file(b"l/etc/y", "inside\n")],
                inside(&[("etc/y", "inside\n")]),
            )
            .keeps_symlink("l", "/"),
            case(
                "opaque-through-earlier-symlink",
                vec![
                    l().symlink("s", "../outside"),
                    l().raw_file(b"s/.wh..wh..opq", ""),
                ],
                // docker leaves a symlinked directory alone for an opaque marker under it.
                whiteout_escape_or_noop("s/.wh..wh..opq", "s"),
            )
            .keeps_symlink("s", "../outside"),
        ],
    )
    .await;
}
