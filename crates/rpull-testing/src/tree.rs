//! `TreeSnapshot`: everything an extracted tree is judged on, per path (raw bytes, so non-UTF-8
//! names are fine), and `diff` to compare two of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};

/// The kind of a tree entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

/// What was recorded for one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Content length for files, 0 otherwise.
    pub size: u64,
    /// `sha256:<hex>` of the content, files only.
    pub sha256: Option<String>,
    /// Symlink target bytes.
    pub link_target: Option<Vec<u8>>,
    /// `(major, minor)` for devices.
    pub device: Option<(u32, u32)>,
    /// All xattrs (every namespace readable to us, incl. `security.capability`).
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `(seconds, nanoseconds)`.
    pub mtime: (i64, i64),
    /// `(dev, ino)`; compared only through hardlink groups.
    pub inode: (u64, u64),
    pub nlink: u64,
}

/// A recorded tree. Keys are paths relative to the root (the root itself is not recorded).
#[derive(Debug, Clone)]
pub struct TreeSnapshot {
    pub root: PathBuf,
    pub entries: BTreeMap<Vec<u8>, TreeEntry>,
}

/// What `diff` compares beyond kind, mode, size, content, link targets and devices (always).
#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// mtimes (seconds) of files and symlinks.
    pub mtimes: bool,
    /// mtimes (seconds) of directories.
    pub dir_mtimes: bool,
    /// Compare nanoseconds too.
    pub mtime_nanos: bool,
    pub owners: bool,
    pub xattrs: bool,
    /// Hardlink groups (sets of paths sharing an inode).
    pub hardlinks: bool,
    /// Paths (and everything below them) left out of the comparison.
    pub ignore: Vec<Vec<u8>>,
}

impl Default for DiffOptions {
    /// Everything but directory mtimes and nanoseconds.
    fn default() -> Self {
        DiffOptions {
            mtimes: true,
            dir_mtimes: false,
            mtime_nanos: false,
            owners: true,
            xattrs: true,
            hardlinks: true,
            ignore: Vec::new(),
        }
    }
}

impl DiffOptions {
    /// Kind, mode, size, content, link targets and hardlinks only.
    pub fn content_only() -> Self {
        DiffOptions {
            mtimes: false,
            owners: false,
            xattrs: false,
            ..Self::default()
        }
    }

    pub fn ignore(mut self, path: impl AsRef<[u8]>) -> Self {
        self.ignore.push(path.as_ref().to_vec());
        self
    }

    fn ignored(&self, path: &[u8]) -> bool {
        self.ignore.iter().any(|prefix| {
            path == prefix.as_slice()
                || (path.starts_with(prefix) && path.get(prefix.len()) == Some(&b'/'))
        })
    }
}

impl TreeSnapshot {
    /// Walks `root` without following symlinks, hashing every file.
    pub fn capture(root: &Path) -> Result<TreeSnapshot> {
        let mut entries = BTreeMap::new();
        walk(root, Vec::new(), &mut entries)
            .with_context(|| format!("snapshotting {}", root.display()))?;
        Ok(TreeSnapshot {
            root: root.to_owned(),
            entries,
        })
    }

    pub fn get(&self, path: impl AsRef<[u8]>) -> Option<&TreeEntry> {
        self.entries.get(path.as_ref())
    }

    pub fn paths(&self) -> impl Iterator<Item = &[u8]> {
        self.entries.keys().map(Vec::as_slice)
    }

    /// Sets of paths (size >= 2) that are the same inode.
    pub fn hardlink_groups(&self) -> BTreeSet<BTreeSet<Vec<u8>>> {
        let mut by_inode: BTreeMap<(u64, u64), BTreeSet<Vec<u8>>> = BTreeMap::new();
        for (path, entry) in &self.entries {
            if entry.kind != EntryKind::Dir && entry.nlink > 1 {
                by_inode
                    .entry(entry.inode)
                    .or_default()
                    .insert(path.clone());
            }
        }
        by_inode
            .into_values()
            .filter(|group| group.len() > 1)
            .collect()
    }
}

fn walk(root: &Path, relative: Vec<u8>, entries: &mut BTreeMap<Vec<u8>, TreeEntry>) -> Result<()> {
    let dir = if relative.is_empty() {
        root.to_owned()
    } else {
        root.join(std::ffi::OsStr::from_bytes(&relative))
    };
    for dirent in fs_err::read_dir(&dir)? {
        let dirent = dirent?;
        let mut rel = relative.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(dirent.file_name().as_bytes());
        let path = dirent.path();
        let meta = fs_err::symlink_metadata(&path)?;
        let file_type = meta.file_type();
        let kind = if file_type.is_dir() {
            EntryKind::Dir
        } else if file_type.is_file() {
            EntryKind::File
        } else if file_type.is_symlink() {
            EntryKind::Symlink
        } else if file_type.is_char_device() {
            EntryKind::CharDevice
        } else if file_type.is_block_device() {
            EntryKind::BlockDevice
        } else if file_type.is_fifo() {
            EntryKind::Fifo
        } else {
            EntryKind::Socket
        };
        let sha256 = if kind == EntryKind::File {
            let mut hasher = Sha256::new();
            std::io::copy(&mut fs_err::File::open(&path)?, &mut hasher)?;
            Some(format!("sha256:{}", hex::encode(hasher.finalize())))
        } else {
            None
        };
        let link_target = if kind == EntryKind::Symlink {
            Some(fs_err::read_link(&path)?.as_os_str().as_bytes().to_vec())
        } else {
            None
        };
        let device = matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice).then(|| {
            (
                rustix::fs::major(meta.rdev()),
                rustix::fs::minor(meta.rdev()),
            )
        });
        let mut xattrs = BTreeMap::new();
        if let Ok(names) = xattr::list(&path) {
            for name in names {
                if let Ok(Some(value)) = xattr::get(&path, &name) {
                    xattrs.insert(name.as_bytes().to_vec(), value);
                }
            }
        }
        let entry = TreeEntry {
            kind,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            size: if kind == EntryKind::File {
                meta.len()
            } else {
                0
            },
            sha256,
            link_target,
            device,
            xattrs,
            mtime: (meta.mtime(), meta.mtime_nsec()),
            inode: (meta.dev(), meta.ino()),
            nlink: meta.nlink(),
        };
        entries.insert(rel.clone(), entry);
        if kind == EntryKind::Dir {
            walk(root, rel, entries)?;
        }
    }
    Ok(())
}

struct Shown<'a>(&'a [u8]);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}

/// Human-readable differences from `a` to `b`; empty means identical under `options`.
pub fn diff(a: &TreeSnapshot, b: &TreeSnapshot, options: &DiffOptions) -> Vec<String> {
    let mut out = Vec::new();
    for (path, left) in &a.entries {
        if options.ignored(path) {
            continue;
        }
        let shown = Shown(path);
        let Some(right) = b.entries.get(path) else {
            out.push(format!("{shown}: only in {}", a.root.display()));
            continue;
        };
        if left.kind != right.kind {
            out.push(format!("{shown}: kind {:?} vs {:?}", left.kind, right.kind));
            continue;
        }
        if left.mode != right.mode {
            out.push(format!("{shown}: mode {:o} vs {:o}", left.mode, right.mode));
        }
        if left.size != right.size {
            out.push(format!("{shown}: size {} vs {}", left.size, right.size));
        } else if left.sha256 != right.sha256 {
            out.push(format!(
                "{shown}: content {:?} vs {:?}",
                left.sha256, right.sha256
            ));
        }
        if left.link_target != right.link_target {
            let show = |t: &Option<Vec<u8>>| {
                t.as_deref()
                    .map(|t| Shown(t).to_string())
                    .unwrap_or_default()
            };
            out.push(format!(
                "{shown}: symlink target {} vs {}",
                show(&left.link_target),
                show(&right.link_target)
            ));
        }
        if left.device != right.device {
            out.push(format!(
                "{shown}: device {:?} vs {:?}",
                left.device, right.device
            ));
        }
        if options.owners && (left.uid, left.gid) != (right.uid, right.gid) {
            out.push(format!(
                "{shown}: owner {}:{} vs {}:{}",
                left.uid, left.gid, right.uid, right.gid
            ));
        }
        if options.xattrs && left.xattrs != right.xattrs {
            let show = |x: &BTreeMap<Vec<u8>, Vec<u8>>| {
                x.iter()
                    .map(|(k, v)| format!("{}={}", Shown(k), Shown(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            out.push(format!(
                "{shown}: xattrs {{{}}} vs {{{}}}",
                show(&left.xattrs),
                show(&right.xattrs)
            ));
        }
        let check_mtime = if left.kind == EntryKind::Dir {
            options.dir_mtimes
        } else {
            options.mtimes
        };
        if check_mtime {
            let (l, r) = if options.mtime_nanos {
                (left.mtime, right.mtime)
            } else {
                ((left.mtime.0, 0), (right.mtime.0, 0))
            };
            if l != r {
                out.push(format!(
                    "{shown}: mtime {}.{:09} vs {}.{:09}",
                    l.0, l.1, r.0, r.1
                ));
            }
        }
    }
    for path in b.entries.keys() {
        if !options.ignored(path) && !a.entries.contains_key(path) {
            out.push(format!("{}: only in {}", Shown(path), b.root.display()));
        }
    }
    if options.hardlinks {
        let keep = |groups: BTreeSet<BTreeSet<Vec<u8>>>| -> BTreeSet<BTreeSet<Vec<u8>>> {
            groups
                .into_iter()
                .map(|g| {
                    g.into_iter()
                        .filter(|p| !options.ignored(p))
                        .collect::<BTreeSet<_>>()
                })
                .filter(|g| g.len() > 1)
                .collect()
        };
        let (left, right) = (keep(a.hardlink_groups()), keep(b.hardlink_groups()));
        let show = |g: &BTreeSet<Vec<u8>>| {
            g.iter()
                .map(|p| Shown(p).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for group in left.difference(&right) {
            out.push(format!(
                "hardlink group [{}] only in {}",
                show(group),
                a.root.display()
            ));
        }
        for group in right.difference(&left) {
            out.push(format!(
                "hardlink group [{}] only in {}",
                show(group),
                b.root.display()
            ));
        }
    }
    out
}

/// Panics with the full difference list unless the trees are identical under `options`.
#[track_caller]
pub fn assert_trees_equal(a: &TreeSnapshot, b: &TreeSnapshot, options: &DiffOptions) {
    let differences = diff(a, b, options);
    assert!(
        differences.is_empty(),
        "trees differ ({} vs {}):\n  {}",
        a.root.display(),
        b.root.display(),
        differences.join("\n  ")
    );
}
