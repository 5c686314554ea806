//! `finalize_tree`: directory metadata, once every layer is merged.

use std::collections::HashMap;
use std::os::fd::AsFd;
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

/// Applies the metadata of explicit directory entries (owner when `chown`, mode, xattrs, mtime), in
/// layer order with later layers winning.
///
/// A directory's record is dropped when a later layer removed it (a whiteout of it or an ancestor,
/// an opaque marker on an ancestor), and paths that are no longer directories are skipped.
/// Directories are processed deepest first so that a read-only directory does not block its
/// children when not running as root.
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
    ordered.sort_by(|a, b| depth(b.0).cmp(&depth(a.0)).then(a.0.cmp(b.0)));

    let mut policy = XattrPolicy::new(options.chown);
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for (path, directory) in ordered {
        let dir = if path.is_empty() {
            rustix::fs::openat(tree.root(), c".", flags, Mode::empty())
        } else {
            let (parent, name) = split_parent(path);
            let parent = match tree.lookup_dir(parent, path) {
                Ok(parent) => parent,
                Err(ExtractError::Io { source, .. })
                    if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
                {
                    continue;
                }
                Err(error) => return Err(error),
            };
            let name = std::ffi::CString::new(name)
                .map_err(|_| invalid(path, "the name contains a NUL byte"))?;
            rustix::fs::openat(parent.as_fd(), &name, flags, Mode::empty())
        };
        let dir = match dir {
            Ok(dir) => dir,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {
                debug!(path = %crate::resolve::lossy(path), "no longer a directory; metadata skipped");
                continue;
            }
            Err(errno) => return Err(io_error(path, "opening directory", errno)),
        };
        apply_fd_parts(
            dir.as_fd(),
            Some(directory.mode),
            options.chown.then_some((directory.uid, directory.gid)),
            &directory.xattrs,
            directory.mtime,
            &mut policy,
            path,
        )?;
    }
    Ok(())
}
