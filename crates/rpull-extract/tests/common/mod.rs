//! Helpers shared by the extraction tests: in-memory layers (including hand-made hostile headers),
//! a sandbox with a sentinel next to the root, and exact tree snapshots.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::cell::Cell;

use rpull_extract::{
    ExtractError, ExtractOptions, IoBackendKind, LayerSummary, extract_layer, finalize_tree,
    merge_layer,
};
use tar::{EntryType, Header};

pub const MTIME: u64 = 1_600_000_000;

/// How an over-long name is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongNames {
    Pax,
    Gnu,
}

/// Builds a layer tar in memory, entry by entry, with raw byte names (no validation).
pub struct Layer {
    builder: tar::Builder<Vec<u8>>,
    pub long_names: LongNames,
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
            long_names: LongNames::Pax,
        }
    }

    pub fn dir(mut self, name: &str, mode: u32) -> Self {
        self.entry(EntryType::Directory, name.as_bytes(), None, mode, b"", &[]);
        self
    }

    pub fn file(mut self, name: &str, mode: u32, content: &[u8]) -> Self {
        self.entry(
            EntryType::Regular,
            name.as_bytes(),
            None,
            mode,
            content,
            &[],
        );
        self
    }

    /// `count` small files `DIR/fNNN`, each with its own content.
    pub fn files_in(mut self, dir: &str, count: usize) -> Self {
        for index in 0..count {
            let content = format!("{dir} file {index}\n").repeat(index % 7 + 1);
            self = self.file(&format!("{dir}/f{index:03}"), 0o644, content.as_bytes());
        }
        self
    }

    pub fn symlink(mut self, name: &str, target: &str) -> Self {
        self.entry(
            EntryType::Symlink,
            name.as_bytes(),
            Some(target.as_bytes()),
            0o777,
            b"",
            &[],
        );
        self
    }

    pub fn hardlink(mut self, name: &str, target: &str) -> Self {
        self.entry(
            EntryType::Link,
            name.as_bytes(),
            Some(target.as_bytes()),
            0o644,
            b"",
            &[],
        );
        self
    }

    pub fn whiteout(self, name: &str) -> Self {
        self.file(name, 0o644, b"")
    }

    /// Appends one entry; names and link names longer than 100 bytes go through pax records or GNU
    /// long-name entries (see `long_names`); `pax` adds raw pax records.
    pub fn entry(
        &mut self,
        kind: EntryType,
        name: &[u8],
        link: Option<&[u8]>,
        mode: u32,
        data: &[u8],
        pax: &[(&str, &[u8])],
    ) {
        let mut records: Vec<(&str, &[u8])> = pax.to_vec();
        let long_name = name.len() > 100;
        let long_link = link.is_some_and(|link| link.len() > 100);
        if self.long_names == LongNames::Pax {
            if long_name {
                records.push(("path", name));
            }
            if long_link {
                records.push(("linkpath", link.unwrap()));
            }
        } else {
            if long_name {
                self.gnu_long(EntryType::GNULongName, name);
            }
            if long_link {
                self.gnu_long(EntryType::GNULongLink, link.unwrap());
            }
        }
        if !records.is_empty() {
            self.builder.append_pax_extensions(records).unwrap();
        }
        let mut header = Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_mtime(MTIME);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(data.len() as u64);
        let bytes = header.as_mut_bytes();
        let short = &name[..name.len().min(100)];
        bytes[..short.len()].copy_from_slice(short);
        if let Some(link) = link {
            let short = &link[..link.len().min(100)];
            bytes[157..157 + short.len()].copy_from_slice(short);
        }
        header.set_cksum();
        self.builder.append(&header, data).unwrap();
    }

    fn gnu_long(&mut self, kind: EntryType, value: &[u8]) {
        let mut header = Header::new_gnu();
        header.as_mut_bytes()[..13].copy_from_slice(b"././@LongLink");
        header.set_entry_type(kind);
        header.set_mode(0o644);
        let mut data = value.to_vec();
        data.push(0);
        header.set_size(data.len() as u64);
        header.set_cksum();
        self.builder.append(&header, data.as_slice()).unwrap();
    }

    pub fn bytes(self) -> Vec<u8> {
        self.builder.into_inner().unwrap()
    }
}

/// A temp dir holding `root/`, `staging/`, a `sentinel` file and an `outside/` directory; hostile
/// layers must leave everything but `root/` and `staging/` exactly as it was.
pub struct Sandbox {
    pub temp: tempfile::TempDir,
    pub root: PathBuf,
}

pub const SENTINEL: &[u8] = b"do not touch";

impl Sandbox {
    pub fn new() -> Self {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("root");
        fs::create_dir(&root).unwrap();
        fs::create_dir(temp.path().join("staging")).unwrap();
        fs::write(temp.path().join("sentinel"), SENTINEL).unwrap();
        fs::create_dir(temp.path().join("outside")).unwrap();
        fs::write(temp.path().join("outside/secret"), SENTINEL).unwrap();
        Self { temp, root }
    }

    pub fn staging(&self, layer: usize) -> PathBuf {
        let path = self.temp.path().join("staging").join(layer.to_string());
        fs::create_dir(&path).unwrap();
        path
    }

    /// Nothing next to the root was created, changed or deleted.
    pub fn assert_untouched(&self) {
        let mut names: Vec<_> = fs::read_dir(self.temp.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["outside", "root", "sentinel", "staging"],
            "entries next to the root changed"
        );
        assert_eq!(
            fs::read(self.temp.path().join("sentinel")).unwrap(),
            SENTINEL
        );
        let outside: Vec<_> = fs::read_dir(self.temp.path().join("outside"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(outside, ["secret"]);
        assert_eq!(
            fs::read(self.temp.path().join("outside/secret")).unwrap(),
            SENTINEL
        );
        let parent_of_temp: Vec<_> = fs::read_dir(self.temp.path().parent().unwrap())
            .unwrap()
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name() == "x" || entry.file_name() == "escaped")
            .collect();
        assert!(
            parent_of_temp.is_empty(),
            "something was created above the sandbox"
        );
    }

    /// Layer 0 into the root, the others into their own staging directories concurrently (as the
    /// pipeline does), then merged in order and finalized.
    pub fn apply(
        &self,
        layers: &[Vec<u8>],
        options: &ExtractOptions,
    ) -> Result<Vec<LayerSummary>, ExtractError> {
        self.apply_lending(layers, options, None)
    }

    /// [`apply`](Self::apply), each layer read through a [`rpull_extract::SharedReader`] of
    /// `buffer`-byte buffers when given (its small files lent to the write threads as views).
    pub fn apply_lending(
        &self,
        layers: &[Vec<u8>],
        options: &ExtractOptions,
        buffer: Option<usize>,
    ) -> Result<Vec<LayerSummary>, ExtractError> {
        let staging: Vec<PathBuf> = (1..layers.len()).map(|layer| self.staging(layer)).collect();
        let results: Vec<Result<LayerSummary, ExtractError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = layers
                .iter()
                .enumerate()
                .map(|(index, layer)| {
                    let target = if index == 0 {
                        self.root.clone()
                    } else {
                        staging[index - 1].clone()
                    };
                    scope.spawn(move || match buffer {
                        None => extract_layer(layer.as_slice(), &target, options),
                        Some(size) => {
                            let mut source = rpull_extract::SharedReader::with_lender(
                                layer.as_slice(),
                                size,
                                rpull_extract::Lender::new(rpull_extract::LENT_BYTES),
                            );
                            let lender = std::sync::Arc::clone(source.lender());
                            let summary =
                                rpull_extract::extract_layer_from(&mut source, &target, options);
                            // Every view is dropped once the layer is extracted: with the
                            // reader, nothing is lent any more.
                            drop(source);
                            assert_eq!(lender.out(), 0, "buffers still lent");
                            summary
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .collect()
        });
        let mut summaries = Vec::new();
        for (index, result) in results.into_iter().enumerate() {
            let summary = result?;
            if index > 0 {
                merge_layer(&self.root, &staging[index - 1], &summary, options)?;
                assert!(
                    !staging[index - 1].exists(),
                    "merge_layer must remove the staging directory"
                );
            }
            summaries.push(summary);
        }
        finalize_tree(&self.root, &summaries, options)?;
        Ok(summaries)
    }
}

/// One node of a tree snapshot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    pub path: String,
    pub kind: char,
    pub mode: u32,
    /// File content, symlink target, empty for directories.
    pub data: Vec<u8>,
}

pub fn node(path: &str, kind: char, mode: u32, data: &[u8]) -> Node {
    Node {
        path: path.to_owned(),
        kind,
        mode,
        data: data.to_vec(),
    }
}

/// Every entry below `root`, sorted by path (lossy paths; byte-exact checks are done separately).
pub fn snapshot(root: &Path) -> Vec<Node> {
    let mut nodes = Vec::new();
    walk(root, root, &mut nodes);
    nodes.sort();
    nodes
}

fn walk(root: &Path, dir: &Path, nodes: &mut Vec<Node>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let metadata = fs::symlink_metadata(&path).unwrap();
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mode = metadata.permissions().mode() & 0o7777;
        let file_type = metadata.file_type();
        if file_type.is_dir() {
            nodes.push(Node {
                path: relative,
                kind: 'd',
                mode,
                data: Vec::new(),
            });
            walk(root, &path, nodes);
        } else if file_type.is_symlink() {
            let target = fs::read_link(&path).unwrap();
            nodes.push(Node {
                path: relative,
                kind: 'l',
                mode: 0,
                data: target.as_os_str().as_bytes().to_vec(),
            });
        } else if file_type.is_file() {
            nodes.push(Node {
                path: relative,
                kind: 'f',
                mode,
                data: fs::read(&path).unwrap(),
            });
        } else if file_type.is_fifo() {
            nodes.push(Node {
                path: relative,
                kind: 'p',
                mode,
                data: Vec::new(),
            });
        } else {
            nodes.push(Node {
                path: relative,
                kind: 'c',
                mode,
                data: metadata.rdev().to_le_bytes().to_vec(),
            });
        }
    }
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub fn inode(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap().ino()
}

pub fn os(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

thread_local! {
    /// The backend, write threads and where files are made of the test running on this thread
    /// (see [`backend_tests!`]).
    static BACKEND: Cell<(IoBackendKind, usize, Option<bool>)> =
        const { Cell::new((IoBackendKind::Std, 1, Some(false))) };
}

/// Write threads of the `parallel` variant (the extracting thread and two workers): more than the
/// cores of a CI machine, so that workers really overlap and get descheduled mid-batch.
pub const PARALLEL_THREADS: usize = 3;

/// Runs `test` with [`options`] and [`plain_options`] selecting `backend`, `write_threads` and
/// `create_on_extracting_thread`. io_uring being unavailable (seccomp,
/// `kernel.io_uring_disabled`) skips the uring variant loudly.
pub fn with_backend(
    backend: IoBackendKind,
    write_threads: usize,
    create_on_extracting_thread: Option<bool>,
    test: fn(),
) {
    if let (IoBackendKind::Std, Some(reason)) = backend.resolve()
        && backend == IoBackendKind::Uring
    {
        eprintln!("skipping the io_uring variant: {reason}");
        return;
    }
    BACKEND.with(|cell| cell.set((backend, write_threads, create_on_extracting_thread)));
    test();
}

/// Turns each named test function (no `#[test]` of its own) into a module with one test per
/// backend, `NAME::std` (files written on the extracting thread), `NAME::parallel` (std with
/// [`PARALLEL_THREADS`] write threads), `NAME::split` (std, files made on the extracting thread
/// and written by one write thread) and `NAME::uring`: every extraction test runs on all four.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn std() {
                    $crate::common::with_backend(
                        rpull_extract::IoBackendKind::Std,
                        1,
                        Some(false),
                        super::$name,
                    );
                }
                #[test]
                fn parallel() {
                    $crate::common::with_backend(
                        rpull_extract::IoBackendKind::Std,
                        $crate::common::PARALLEL_THREADS,
                        None,
                        super::$name,
                    );
                }
                #[test]
                fn split() {
                    $crate::common::with_backend(
                        rpull_extract::IoBackendKind::Std,
                        1,
                        Some(true),
                        super::$name,
                    );
                }
                #[test]
                fn uring() {
                    $crate::common::with_backend(
                        rpull_extract::IoBackendKind::Uring,
                        1,
                        None,
                        super::$name,
                    );
                }
            }
        )*
    };
}

/// The options of the current user, with the backend of the running test.
pub fn options() -> ExtractOptions {
    let (backend, write_threads, create_on_extracting_thread) = BACKEND.with(Cell::get);
    ExtractOptions {
        backend,
        write_threads,
        create_on_extracting_thread,
        ..ExtractOptions::for_current_user()
    }
}

/// Options for tests that must behave the same as root and as a normal user.
pub fn plain_options() -> ExtractOptions {
    ExtractOptions {
        chown: false,
        special_files: false,
        ..options()
    }
}

pub fn assert_escape(result: Result<impl std::fmt::Debug, ExtractError>, expected_entry: &str) {
    match result {
        Err(ExtractError::Escape { entry, detail }) => {
            assert_eq!(
                entry,
                Path::new(expected_entry),
                "escape names the wrong entry ({detail})"
            );
        }
        other => panic!("expected an Escape error for {expected_entry}, got {other:?}"),
    }
}
