//! `merge_layer`: apply a staged layer on top of the root with renames and unlinks only.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use tracing::{debug, instrument};

use crate::backend::{IoBackend, new_backend};
use crate::error::{ExtractError, invalid, io_error};
use crate::name::split_parent;
use crate::options::ExtractOptions;
use crate::remove::{Listed, list_dir, remove_all_at, remove_children, remove_typed};
use crate::resolve::{Tree, file_type_at, lossy, walk_beneath};
use crate::summary::{LayerSummary, MergeStats};

const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

const DIR_READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Applies the layer extracted into `staged` on top of `root`, in this order:
///
/// 1. whiteouts delete their path from the root (parents resolved inside the root, following
///    symlinks confined to it; the final component is never followed),
/// 2. opaque directories have their content in the root removed (resolved the same way; an opaque
///    directory that has no entry of its own in the layer follows a symlink in the root, as
///    umoci does, while one with its own entry replaces the symlink and empties nothing),
/// 3. staged entries move in: a non-directory -> one `rename`, which replaces a non-directory of
///    the root atomically (a directory of the root there is removed first); a directory absent
///    from the root -> one `rename` (its whole subtree at once); a directory on both sides ->
///    merged recursively; a directory created only as the parent of other entries (no entry of
///    its own) over a symlink of the root -> the symlink is resolved inside the root and the
///    directory's content merged into its target (docker and umoci write through such symlinks:
///    `lib -> usr/lib` then `lib/libfoo.so`); a directory over anything else -> the root's entry
///    is removed and the staged one renamed in.
/// 4. deferred hardlinks are linked to their (earlier-layer) targets, replacing what is there.
///
/// Paths on the way are always resolved inside the root: a symlink whose target climbs above it
/// is an [`ExtractError::Escape`] naming the layer's entry, as it is within one layer.
///
/// `staged` is removed when done. Directory metadata is left to [`finalize_tree`](crate::finalize_tree).
#[instrument(skip_all, fields(staged = %staged.display()))]
pub fn merge_layer(
    root: &Path,
    staged: &Path,
    summary: &LayerSummary,
    options: &ExtractOptions,
) -> Result<MergeStats, ExtractError> {
    // The merge writes no regular file (no write threads, no direct writes): the backend runs
    // its renames, links, unlinks and mkdirs.
    let mut backend = new_backend(options.backend, options.chown, root, 1, false, false)?;
    merge_with(root, staged, summary, backend.as_mut())
}

/// [`merge_layer`] with the given backend.
pub(crate) fn merge_with(
    root: &Path,
    staged: &Path,
    summary: &LayerSummary,
    backend: &mut dyn IoBackend,
) -> Result<MergeStats, ExtractError> {
    let mut merge = Merge {
        tree: Tree::open(root)?,
        backend,
        explicit: summary
            .directories
            .iter()
            .map(|directory| directory.path.as_os_str().as_bytes())
            .collect(),
        stats: MergeStats::default(),
    };

    for whiteout in &summary.whiteouts {
        let path = whiteout.as_os_str().as_bytes();
        let (parent, name) = split_parent(path);
        let name = c_name(name, path)?;
        let Some(dir) = merge.existing_dir(parent, path)? else {
            continue;
        };
        match remove_all_at(&mut *merge.backend, dir.as_fd(), &name) {
            Ok(()) => merge.stats.whiteouts_applied += 1,
            Err(Errno::NOENT) => {}
            Err(errno) => return Err(io_error(path, "applying whiteout of", errno)),
        }
    }

    for opaque in &summary.opaque_dirs {
        let path = opaque.as_os_str().as_bytes();
        let mut marker = path.to_vec();
        if !marker.is_empty() {
            marker.push(b'/');
        }
        marker.extend_from_slice(OPAQUE_MARKER);
        let Some(dir) = merge.existing_dir(path, &marker)? else {
            continue;
        };
        // `existing_dir` gives an `O_PATH` descriptor; listing needs a readable one.
        let dir = rustix::fs::openat(dir, c".", DIR_READ_FLAGS, Mode::empty())
            .map_err(|errno| io_error(path, "opening opaque directory", errno))?;
        remove_children(&mut *merge.backend, dir.as_fd())
            .map_err(|errno| io_error(path, "emptying opaque directory", errno))?;
        merge.stats.opaque_dirs_applied += 1;
    }

    let staged_dir = rustix::fs::open(staged, DIR_READ_FLAGS, Mode::empty())
        .map_err(|errno| io_error(staged.as_os_str().as_bytes(), "opening staged layer", errno))?;
    let root_dir = rustix::fs::openat(merge.tree.root(), c".", DIR_READ_FLAGS, Mode::empty())
        .map_err(|errno| io_error(b"", "opening root", errno))?;
    let mut path = Vec::new();
    merge.merge_dir(root_dir.as_fd(), staged_dir.as_fd(), &mut path)?;

    for hardlink in &summary.deferred_hardlinks {
        // Resolved after the merge: parents that are symlinks of an earlier layer (and were not
        // replaced by a directory entry of this layer) are followed inside the root.
        link_deferred(
            &merge.tree,
            &mut *merge.backend,
            hardlink.link.as_os_str().as_bytes(),
            hardlink.target.as_os_str().as_bytes(),
        )?;
        merge.stats.hardlinks_linked += 1;
    }

    drop(staged_dir);
    remove_staged(&mut *merge.backend, staged)?;
    let stats = merge.stats;
    debug!(?stats, "layer merged");
    Ok(stats)
}

/// The state of one [`merge_layer`].
struct Merge<'a, 'b> {
    tree: Tree,
    /// Runs the renames, links, unlinks and the mkdirs of directories created on the way.
    backend: &'b mut dyn IoBackend,
    /// Directories that had their own entry in the layer: over a non-directory of the root they
    /// replace it, while directories created only as parents follow a symlink there.
    explicit: HashSet<&'a [u8]>,
    stats: MergeStats,
}

impl Merge<'_, '_> {
    /// The directory at `path` in the root (symlinks on the way followed inside the root), or
    /// `None` when it does not exist, is not a directory, or is a non-directory of the root that a
    /// directory entry of this layer replaces (so nothing of the root below it survives the merge).
    /// `entry` names the errors.
    fn existing_dir(&self, path: &[u8], entry: &[u8]) -> Result<Option<OwnedFd>, ExtractError> {
        if path.is_empty() {
            return lookup_existing_dir(&self.tree, path, entry);
        }
        // Every prefix of `path`, shortest first, that had its own directory entry in this layer.
        let ends = path
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte == b'/')
            .map(|(end, _)| end)
            .chain([path.len()]);
        for end in ends {
            let prefix = &path[..end];
            if !self.explicit.contains(prefix) {
                continue;
            }
            let (parent, name) = split_parent(prefix);
            let Some(parent) = lookup_existing_dir(&self.tree, parent, entry)? else {
                return Ok(None);
            };
            let name = c_name(name, entry)?;
            let kind = file_type_at(parent.as_fd(), &name)
                .map_err(|errno| io_error(entry, "inspecting", errno))?;
            if kind != Some(FileType::Directory) {
                return Ok(None);
            }
        }
        lookup_existing_dir(&self.tree, path, entry)
    }

    /// Moves the content of `staged` into `root`; `path` is the directory's path relative to the
    /// root (for error messages), extended and restored as the recursion goes.
    fn merge_dir(
        &mut self,
        root: BorrowedFd<'_>,
        staged: BorrowedFd<'_>,
        path: &mut Vec<u8>,
    ) -> Result<(), ExtractError> {
        let entries =
            list_dir(staged).map_err(|errno| io_error(path, "listing staged directory", errno))?;
        for entry in entries {
            let length = path.len();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(entry.name.to_bytes());
            let result = self.merge_entry(root, staged, &entry, path);
            path.truncate(length);
            result?;
        }
        Ok(())
    }

    fn merge_entry(
        &mut self,
        root: BorrowedFd<'_>,
        staged: BorrowedFd<'_>,
        entry: &Listed,
        path: &mut Vec<u8>,
    ) -> Result<(), ExtractError> {
        let name = entry.name.as_c_str();
        let staged_type = match entry.kind {
            Some(kind) => Some(kind),
            // The listing did not say (`DT_UNKNOWN`).
            None => file_type_at(staged, name)
                .map_err(|errno| io_error(path, "inspecting staged", errno))?,
        };
        if staged_type != Some(FileType::Directory) {
            // One rename, which replaces a non-directory of the root atomically; a directory
            // there answers EISDIR and is removed first.
            return match self.backend.rename(staged, name, root, name, false) {
                Ok(()) => {
                    self.stats.renamed += 1;
                    Ok(())
                }
                Err(Errno::ISDIR) => {
                    self.replace(root, staged, name, Some(FileType::Directory), path)
                }
                Err(errno) => Err(io_error(path, "moving staged entry to", errno)),
            };
        }
        let inspect =
            || file_type_at(root, name).map_err(|errno| io_error(path, "inspecting", errno));
        let root_type = match self.backend.rename(staged, name, root, name, true) {
            Ok(()) => {
                self.stats.renamed += 1;
                return Ok(());
            }
            Err(Errno::EXIST) => inspect()?,
            // File systems without RENAME_NOREPLACE: look before renaming.
            Err(Errno::INVAL | Errno::NOSYS) => {
                let root_type = inspect()?;
                if root_type.is_none() {
                    self.backend
                        .rename(staged, name, root, name, false)
                        .map_err(|errno| io_error(path, "moving staged entry to", errno))?;
                    self.stats.renamed += 1;
                    return Ok(());
                }
                root_type
            }
            Err(errno) => return Err(io_error(path, "moving staged entry to", errno)),
        };
        if root_type == Some(FileType::Directory) {
            let staged_child = rustix::fs::openat(staged, name, DIR_READ_FLAGS, Mode::empty())
                .map_err(|errno| io_error(path, "opening staged directory", errno))?;
            let root_child = rustix::fs::openat(root, name, DIR_READ_FLAGS, Mode::empty())
                .map_err(|errno| io_error(path, "opening directory", errno))?;
            self.stats.merged_dirs += 1;
            return self.merge_dir(root_child.as_fd(), staged_child.as_fd(), path);
        }
        if root_type == Some(FileType::Symlink) && !self.explicit.contains(path.as_slice()) {
            return self.merge_through_symlink(staged, name, path);
        }
        // A staged directory replaces the root's non-directory (an explicit directory entry
        // replaces a symlink, as moby's createTarFile does): rename cannot swap kinds, so the
        // root's entry goes first.
        self.replace(root, staged, name, root_type, path)
    }

    /// Removes the root's entry `name` (recursively) and renames the staged one in.
    fn replace(
        &mut self,
        root: BorrowedFd<'_>,
        staged: BorrowedFd<'_>,
        name: &CStr,
        root_type: Option<FileType>,
        path: &[u8],
    ) -> Result<(), ExtractError> {
        // The root entry's type, where a failed rename or a look told it, spares a directory the
        // unlink that would fail first. Gone already (something else deleting in the tree): then
        // this is a plain rename.
        let removed = match remove_typed(&mut *self.backend, root, name, root_type) {
            Ok(()) => true,
            Err(Errno::NOENT) => false,
            Err(errno) => return Err(io_error(path, "removing replaced", errno)),
        };
        self.backend
            .rename(staged, name, root, name, false)
            .map_err(|errno| io_error(path, "moving staged entry to", errno))?;
        if removed {
            self.stats.replaced += 1;
        } else {
            self.stats.renamed += 1;
        }
        Ok(())
    }

    /// The staged directory `path` was only created as the parent of other entries and the root
    /// has a symlink there: the symlink stays and the directory's content goes where it leads,
    /// resolved inside the root (an absolute target from the root; missing directories created as
    /// in one layer). A target above the root is an escape and a target that is not a directory
    /// is invalid (docker and umoci fail there too), both naming an entry of the staged directory.
    fn merge_through_symlink(
        &mut self,
        staged: BorrowedFd<'_>,
        name: &CStr,
        path: &mut Vec<u8>,
    ) -> Result<(), ExtractError> {
        let staged_child = rustix::fs::openat(staged, name, DIR_READ_FLAGS, Mode::empty())
            .map_err(|errno| io_error(path, "opening staged directory", errno))?;
        let Some(entry) = self.first_entry(staged_child.as_fd(), path)? else {
            // Nothing to write through the symlink (the parent of a deferred hardlink or of an
            // opaque marker, resolved on their own with their own names).
            debug!(entry = %lossy(path), "empty implicit directory over a symlink; symlink kept");
            return Ok(());
        };
        let target = match walk_beneath(self.tree.root(), path, Some(&mut *self.backend), &entry) {
            Ok(target) => target,
            Err(ExtractError::Io { source, .. })
                if source.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                return Err(invalid(
                    &entry,
                    format!(
                        "{} is a symlink of an earlier layer that does not lead to a directory",
                        lossy(path)
                    ),
                ));
            }
            Err(error) => return Err(error),
        };
        let target = rustix::fs::openat(&target, c".", DIR_READ_FLAGS, Mode::empty())
            .map_err(|errno| io_error(path, "opening symlinked directory", errno))?;
        debug!(entry = %lossy(path), "implicit directory over a symlink of an earlier layer; writing through it");
        self.stats.merged_dirs += 1;
        self.merge_dir(target.as_fd(), staged_child.as_fd(), path)
    }

    /// An entry of the layer inside the staged directory `dir` (at `path`) to name in errors: the
    /// first name, descending through directories that have no entry of their own; `None` when
    /// `dir` is empty.
    fn first_entry(
        &self,
        dir: BorrowedFd<'_>,
        path: &[u8],
    ) -> Result<Option<Vec<u8>>, ExtractError> {
        let first = list_dir(dir)
            .map_err(|errno| io_error(path, "listing staged directory", errno))?
            .into_iter()
            .map(|entry| entry.name)
            .min();
        let Some(name) = first else {
            return Ok(None);
        };
        let mut child = path.to_vec();
        child.push(b'/');
        child.extend_from_slice(name.to_bytes());
        if !self.explicit.contains(child.as_slice())
            && let Ok(subdir) = rustix::fs::openat(dir, &name, DIR_READ_FLAGS, Mode::empty())
            && let Some(deeper) = self.first_entry(subdir.as_fd(), &child)?
        {
            return Ok(Some(deeper));
        }
        Ok(Some(child))
    }
}

/// `link` becomes another name of `target`, both resolved inside the root.
fn link_deferred(
    tree: &Tree,
    backend: &mut dyn IoBackend,
    link: &[u8],
    target: &[u8],
) -> Result<(), ExtractError> {
    let (target_parent, target_name) = split_parent(target);
    let target_name = c_name(target_name, link)?;
    let target_dir = tree.lookup_dir(target_parent, link)?;
    let (link_parent, link_name) = split_parent(link);
    let link_name = c_name(link_name, link)?;
    let link_dir = tree.lookup_dir(link_parent, link)?;
    let create = |backend: &mut dyn IoBackend| {
        backend.link(
            target_dir.as_fd(),
            &target_name,
            link_dir.as_fd(),
            &link_name,
        )
    };
    match create(backend) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => {
            remove_all_at(backend, link_dir.as_fd(), &link_name)
                .map_err(|errno| io_error(link, "removing replaced", errno))?;
            create(backend).map_err(|errno| io_error(link, "creating hardlink", errno))
        }
        Err(errno) => Err(io_error(link, "creating hardlink", errno)),
    }
}

/// The directory `path` in the root, or `None` when it does not exist or is not a directory
/// (nothing to white out).
fn lookup_existing_dir(
    tree: &Tree,
    path: &[u8],
    entry: &[u8],
) -> Result<Option<OwnedFd>, ExtractError> {
    match tree.lookup_dir(path, entry) {
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
fn remove_staged(backend: &mut dyn IoBackend, staged: &Path) -> Result<(), ExtractError> {
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
    remove_all_at(backend, parent.as_fd(), &c_name(name.as_bytes(), bytes)?)
        .map_err(|errno| io_error(bytes, "removing staging directory", errno))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::remove::tests::Recording;

    /// A file of a later layer over a directory of an earlier one: the rename that fails with
    /// `EISDIR` has told the directory's type, so its removal makes no failing unlink. The only
    /// one left is the staging directory's own, whose type nothing told.
    #[test]
    fn a_directory_replaced_by_a_file_is_removed_without_a_failing_unlink() {
        let temp = tempfile::tempdir().unwrap();
        let (root, staged) = (temp.path().join("root"), temp.path().join("staged"));
        fs::create_dir_all(root.join("d/sub")).unwrap();
        fs::write(root.join("d/sub/f"), "old").unwrap();
        fs::create_dir(&staged).unwrap();
        fs::write(staged.join("d"), "new").unwrap();

        let mut backend = Recording::new();
        let stats = merge_with(&root, &staged, &LayerSummary::default(), &mut backend).unwrap();

        assert_eq!(fs::read(root.join("d")).unwrap(), b"new");
        assert_eq!(stats.replaced, 1);
        assert!(!staged.exists());
        assert_eq!(
            backend.failed(),
            [("staged".to_owned(), false, Some(Errno::ISDIR))],
            "{:?}",
            backend.unlinks
        );
    }
}
