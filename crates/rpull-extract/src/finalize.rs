//! `finalize_tree`: directory metadata, once every layer is merged.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use tracing::{debug, instrument};

use crate::error::{ExtractError, invalid, io_error};
use crate::metadata::{XattrPolicy, apply_fd_parts};
use crate::name::split_parent;
use crate::options::ExtractOptions;
use crate::resolve::Tree;
use crate::summary::{DirectoryMetadata, LayerSummary};

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Applies the metadata of explicit directory entries (owner when `chown`, mode, xattrs, mtime), in
/// layer order with later layers winning.
///
/// A directory's record is dropped when a later layer removed it (a whiteout of it or an ancestor,
/// an opaque marker on an ancestor), and paths that are no longer directories are skipped.
/// Directories are processed deepest first so that a read-only directory does not block its
/// children when not running as root; the directories of one depth are shared among up to one
/// thread per core (at least 128 directories each).
#[instrument(skip_all, fields(root = %root.display(), layers = summaries.len()))]
pub fn finalize_tree(
    root: &Path,
    summaries: &[LayerSummary],
    options: &ExtractOptions,
) -> Result<(), ExtractError> {
    let tree = Tree::open(root)?;
    // Latest layer that removed each path (whiteout) or the content of each directory (opaque).
    let mut whited_out: HashMap<&[u8], usize> = HashMap::new();
    let mut emptied: HashMap<&[u8], usize> = HashMap::new();
    for (layer, summary) in summaries.iter().enumerate() {
        for path in &summary.whiteouts {
            whited_out.insert(path.as_os_str().as_bytes(), layer);
        }
        for path in &summary.opaque_dirs {
            emptied.insert(path.as_os_str().as_bytes(), layer);
        }
    }
    let removed_later = |path: &[u8], layer: usize| {
        let mut prefix_end = Some(path.len());
        while let Some(end) = prefix_end {
            let prefix = &path[..end];
            if whited_out.get(prefix).is_some_and(|&by| by > layer) {
                return true;
            }
            if end < path.len() && emptied.get(prefix).is_some_and(|&by| by > layer) {
                return true;
            }
            prefix_end = if end == 0 {
                None
            } else {
                Some(split_parent(prefix).0.len())
            };
        }
        false
    };
    let mut latest: HashMap<&[u8], &DirectoryMetadata> = HashMap::new();
    for (layer, summary) in summaries.iter().enumerate() {
        for directory in &summary.directories {
            let path = directory.path.as_os_str().as_bytes();
            if removed_later(path, layer) {
                continue;
            }
            latest.insert(path, directory);
        }
    }
    let mut ordered: Vec<(&[u8], &DirectoryMetadata)> = latest.into_iter().collect();
    let depth = |path: &[u8]| {
        if path.is_empty() {
            0
        } else {
            1 + path.iter().filter(|byte| **byte == b'/').count()
        }
    };
    ordered.sort_by_cached_key(|&(path, _)| (std::cmp::Reverse(depth(path)), path));

    // One depth at a time, deepest first, each depth shared among threads: a directory's
    // metadata touches neither its parent nor its siblings, and a shallower depth starts only
    // once the deeper one is done, so a read-only directory never blocks its children when not
    // running as root.
    let policy = XattrPolicy::new(options.chown);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    for level in ordered.chunk_by(|a, b| depth(a.0) == depth(b.0)) {
        finalize_level(&tree, level, options.chown, &policy, workers)?;
    }
    Ok(())
}

/// Fewest directories worth a thread of their own in [`finalize_level`].
const DIRECTORIES_PER_THREAD: usize = 128;

/// Applies the metadata of `level` (directories of one depth) on up to `workers` threads.
fn finalize_level(
    tree: &Tree,
    level: &[(&[u8], &DirectoryMetadata)],
    chown: bool,
    policy: &XattrPolicy,
    workers: usize,
) -> Result<(), ExtractError> {
    let apply = |directories| finalize_directories(tree, directories, chown, &mut policy.clone());
    let workers = workers.min(level.len() / DIRECTORIES_PER_THREAD).max(1);
    if workers == 1 {
        return apply(level);
    }
    let share = level.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let mut shares = level.chunks(share);
        let own = shares.next().unwrap_or_default();
        let mut results = Vec::with_capacity(workers);
        let mut spawned = Vec::with_capacity(workers);
        for directories in shares {
            match std::thread::Builder::new()
                .name("rpull-finalize".to_owned())
                .spawn_scoped(scope, move || apply(directories))
            {
                Ok(handle) => spawned.push(handle),
                // No thread to be had: this one does the share.
                Err(_) => results.push(apply(directories)),
            }
        }
        results.push(apply(own));
        for handle in spawned {
            results.push(
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        results.into_iter().collect()
    })
}

/// Applies the metadata of `directories`, one after the other.
fn finalize_directories(
    tree: &Tree,
    directories: &[(&[u8], &DirectoryMetadata)],
    chown: bool,
    policy: &mut XattrPolicy,
) -> Result<(), ExtractError> {
    for &(path, directory) in directories {
        let Some(dir) = open_directory(tree, path)? else {
            continue;
        };
        apply_fd_parts(
            dir.as_fd(),
            Some(directory.mode),
            chown.then_some((directory.uid, directory.gid)),
            &directory.xattrs,
            directory.mtime,
            policy,
            path,
        )?;
    }
    Ok(())
}

/// Opens the directory at `path` beneath the root (`O_NOFOLLOW`); `None` when it is no longer a
/// directory (removed, replaced by a file or a symlink).
fn open_directory(tree: &Tree, path: &[u8]) -> Result<Option<OwnedFd>, ExtractError> {
    let dir = if path.is_empty() {
        rustix::fs::openat(tree.root(), c".", DIR_FLAGS, Mode::empty())
    } else if let Ok(dir) = tree.open_beneath_with(path, DIR_FLAGS) {
        // One openat2 where the path resolves beneath the root without an absolute symlink on
        // the way; below, the parent's lookup and an openat of the name give the same answer
        // (and the authoritative one on every other path) with more calls.
        Ok(dir)
    } else {
        let (parent, name) = split_parent(path);
        let parent = match tree.lookup_dir(parent, path) {
            Ok(parent) => parent,
            Err(ExtractError::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
            {
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        let name = std::ffi::CString::new(name)
            .map_err(|_| invalid(path, "the name contains a NUL byte"))?;
        rustix::fs::openat(parent.as_fd(), &name, DIR_FLAGS, Mode::empty())
    };
    match dir {
        Ok(dir) => Ok(Some(dir)),
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {
            debug!(path = %crate::resolve::lossy(path), "no longer a directory; metadata skipped");
            Ok(None)
        }
        Err(errno) => Err(io_error(path, "opening directory", errno)),
    }
}
