//! `merge_layer`: apply a staged layer on top of the root with renames and unlinks only.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use tracing::{debug, instrument};

use crate::error::{ExtractError, invalid, io_error};
use crate::name::split_parent;
use crate::options::ExtractOptions;
use crate::remove::{list_dir, remove_all_at, remove_children};
use crate::resolve::{Tree, file_type_at};
use crate::summary::{LayerSummary, MergeStats};

const DIR_READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Applies the layer extracted into `staged` on top of `root`, in this order:
///
/// 1. whiteouts delete their path from the root (parents resolved inside the root, following
///    symlinks confined to it; the final component is never followed),
/// 2. opaque directories have their content in the root removed,
/// 3. staged entries move in: absent from the root -> one `rename` (a whole subtree at once);
///    directory on both sides -> merged recursively; anything else -> the root's entry is removed
///    (recursively) and the staged one renamed in. Symlinks in the root are never followed.
/// 4. deferred hardlinks are linked to their (earlier-layer) targets, replacing what is there.
///
/// `staged` is removed when done. Directory metadata is left to [`finalize_tree`](crate::finalize_tree).
#[instrument(skip_all, fields(staged = %staged.display()))]
pub fn merge_layer(
    root: &Path,
    staged: &Path,
    summary: &LayerSummary,
    options: &ExtractOptions,
) -> Result<MergeStats, ExtractError> {
    let _ = options; // Nothing option-dependent yet: the merge only renames and unlinks.
    let tree = Tree::open(root)?;
    let mut stats = MergeStats::default();

    for whiteout in &summary.whiteouts {
        let path = whiteout.as_os_str().as_bytes();
        let (parent, name) = split_parent(path);
        let name = c_name(name, path)?;
        let Some(dir) = lookup_existing_dir(&tree, parent, path)? else {
            continue;
        };
        match remove_all_at(dir.as_fd(), &name) {
            Ok(()) => stats.whiteouts_applied += 1,
            Err(Errno::NOENT) => {}
            Err(errno) => return Err(io_error(path, "applying whiteout of", errno)),
        }
    }

    for opaque in &summary.opaque_dirs {
        let path = opaque.as_os_str().as_bytes();
        let dir = if path.is_empty() {
            Some(
                rustix::fs::openat(tree.root(), c".", DIR_READ_FLAGS, Mode::empty())
                    .map_err(|errno| io_error(path, "opening", errno))?,
            )
        } else {
            let (parent, name) = split_parent(path);
            let name = c_name(name, path)?;
            match lookup_existing_dir(&tree, parent, path)? {
                // Not followed if it is a symlink: the staged directory will replace it.
                Some(parent) => {
                    match rustix::fs::openat(parent, &name, DIR_READ_FLAGS, Mode::empty()) {
                        Ok(dir) => Some(dir),
                        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => None,
                        Err(errno) => {
                            return Err(io_error(path, "opening opaque directory", errno));
                        }
                    }
                }
                None => None,
            }
        };
        if let Some(dir) = dir {
            remove_children(dir.as_fd())
                .map_err(|errno| io_error(path, "emptying opaque directory", errno))?;
            stats.opaque_dirs_applied += 1;
        }
    }

    let staged_dir = rustix::fs::open(staged, DIR_READ_FLAGS, Mode::empty())
        .map_err(|errno| io_error(staged.as_os_str().as_bytes(), "opening staged layer", errno))?;
    let root_dir = rustix::fs::openat(tree.root(), c".", DIR_READ_FLAGS, Mode::empty())
        .map_err(|errno| io_error(b"", "opening root", errno))?;
    let mut path = Vec::new();
    merge_dir(root_dir.as_fd(), staged_dir.as_fd(), &mut path, &mut stats)?;

    for hardlink in &summary.deferred_hardlinks {
        link_deferred(
            &tree,
            hardlink.link.as_os_str().as_bytes(),
            hardlink.target.as_os_str().as_bytes(),
        )?;
        stats.hardlinks_linked += 1;
    }

    drop(staged_dir);
    remove_staged(staged)?;
    debug!(?stats, "layer merged");
    Ok(stats)
}

/// Moves the content of `staged` into `root`; `path` is the directory's path relative to the root
/// (for error messages), extended and restored as the recursion goes.
fn merge_dir(
    root: BorrowedFd<'_>,
    staged: BorrowedFd<'_>,
    path: &mut Vec<u8>,
    stats: &mut MergeStats,
) -> Result<(), ExtractError> {
    let names =
        list_dir(staged).map_err(|errno| io_error(path, "listing staged directory", errno))?;
    for name in names {
        let length = path.len();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name.to_bytes());
        let result = merge_entry(root, staged, &name, path, stats);
        path.truncate(length);
        result?;
    }
    Ok(())
}

fn merge_entry(
    root: BorrowedFd<'_>,
    staged: BorrowedFd<'_>,
    name: &CStr,
    path: &mut Vec<u8>,
    stats: &mut MergeStats,
) -> Result<(), ExtractError> {
    match rustix::fs::renameat_with(staged, name, root, name, RenameFlags::NOREPLACE) {
        Ok(()) => {
            stats.renamed += 1;
            return Ok(());
        }
        Err(Errno::EXIST) => {}
        // File systems without RENAME_NOREPLACE: look before renaming.
        Err(Errno::INVAL | Errno::NOSYS)
            if file_type_at(root, name)
                .map_err(|errno| io_error(path, "inspecting", errno))?
                .is_none() =>
        {
            rustix::fs::renameat(staged, name, root, name)
                .map_err(|errno| io_error(path, "moving staged entry to", errno))?;
            stats.renamed += 1;
            return Ok(());
        }
        Err(Errno::INVAL | Errno::NOSYS) => {}
        Err(errno) => return Err(io_error(path, "moving staged entry to", errno)),
    }
    let staged_type =
        file_type_at(staged, name).map_err(|errno| io_error(path, "inspecting staged", errno))?;
    let root_type =
        file_type_at(root, name).map_err(|errno| io_error(path, "inspecting", errno))?;
    if staged_type == Some(FileType::Directory) && root_type == Some(FileType::Directory) {
        let staged_child = rustix::fs::openat(staged, name, DIR_READ_FLAGS, Mode::empty())
            .map_err(|errno| io_error(path, "opening staged directory", errno))?;
        let root_child = rustix::fs::openat(root, name, DIR_READ_FLAGS, Mode::empty())
            .map_err(|errno| io_error(path, "opening directory", errno))?;
        stats.merged_dirs += 1;
        return merge_dir(root_child.as_fd(), staged_child.as_fd(), path, stats);
    }
    // Anything else replaces what the root has. A non-directory over a non-directory is one atomic
    // rename; otherwise the root's entry has to go first (rename cannot swap kinds).
    if root_type == Some(FileType::Directory) || staged_type == Some(FileType::Directory) {
        match remove_all_at(root, name) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(errno) => return Err(io_error(path, "removing replaced", errno)),
        }
    }
    rustix::fs::renameat(staged, name, root, name)
        .map_err(|errno| io_error(path, "moving staged entry to", errno))?;
    stats.replaced += 1;
    Ok(())
}

/// `link` becomes another name of `target`, both resolved inside the root.
fn link_deferred(tree: &Tree, link: &[u8], target: &[u8]) -> Result<(), ExtractError> {
    let (target_parent, target_name) = split_parent(target);
    let target_name = c_name(target_name, link)?;
    let target_dir = tree.lookup_dir(target_parent, link)?;
    let (link_parent, link_name) = split_parent(link);
    let link_name = c_name(link_name, link)?;
    let link_dir = tree.lookup_dir(link_parent, link)?;
    let create = || {
        rustix::fs::linkat(
            &target_dir,
            &target_name,
            &link_dir,
            &link_name,
            AtFlags::empty(),
        )
    };
    match create() {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => {
            remove_all_at(link_dir.as_fd(), &link_name)
                .map_err(|errno| io_error(link, "removing replaced", errno))?;
            create().map_err(|errno| io_error(link, "creating hardlink", errno))
        }
        Err(errno) => Err(io_error(link, "creating hardlink", errno)),
    }
}

/// The directory `parent` in the root, or `None` when it does not exist (nothing to white out).
fn lookup_existing_dir(
    tree: &Tree,
    parent: &[u8],
    entry: &[u8],
) -> Result<Option<OwnedFd>, ExtractError> {
    match tree.lookup_dir(parent, entry) {
        Ok(dir) => Ok(Some(dir)),
        Err(ExtractError::Io { source, .. })
            if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
        {
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

fn c_name(name: &[u8], entry: &[u8]) -> Result<CString, ExtractError> {
    CString::new(name).map_err(|_| invalid(entry, "the name contains a NUL byte"))
}

/// Removes the (now mostly empty) staging directory.
fn remove_staged(staged: &Path) -> Result<(), ExtractError> {
    let bytes = staged.as_os_str().as_bytes();
    let parent = match staged.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = staged
        .file_name()
        .ok_or_else(|| invalid(bytes, "staging directory has no name"))?;
    let parent = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| io_error(bytes, "opening parent of staging directory", errno))?;
    remove_all_at(parent.as_fd(), &c_name(name.as_bytes(), bytes)?)
        .map_err(|errno| io_error(bytes, "removing staging directory", errno))
}
