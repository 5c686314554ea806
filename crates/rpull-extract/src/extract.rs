//! `extract_layer`: one tar stream into one directory.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode};
use rustix::io::Errno;
use tar::EntryType;
use tracing::{debug, instrument, warn};

use crate::backend::{FileMetadata, IoBackend, NewFile, new_backend};
use crate::error::{ExtractError, entry_path, escape, invalid, io_error};
use crate::metadata::{Creation, EntryMetadata, XattrPolicy, apply_nofollow};
use crate::name::{normalize, split_parent};
use crate::options::ExtractOptions;
use crate::remove::remove_all_at;
use crate::resolve::{Tree, file_type_at, lossy};
use crate::source::{LayerSource, NoLending};
use crate::summary::{DeferredHardlink, DirectoryMetadata, LayerSummary};
use crate::walk::TarWalk;

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// The buffer a regular file's data is read through when it cannot be read straight from the
/// source: a GNU sparse file, whose data the walk interleaves with holes.
const SPARSE_BUFFER: usize = 64 * 1024;

/// Extracts one layer tar (uncompressed) into `target`: an existing empty staging directory, or the
/// root for layer 0.
///
/// Whiteouts and opaque markers are recorded in the summary and never created; hardlinks whose
/// target this layer did not write are recorded as deferred. Directories are created `0700` (so a
/// read-only directory can still receive its children); their metadata is recorded for
/// [`finalize_tree`](crate::finalize_tree). Nothing outside `target` is created, changed or
/// deleted: names climbing above it are [`ExtractError::Escape`], symlinks are followed only inside it.
///
/// `tar` is a [`BufRead`] because regular files' data is written straight from its buffer (one
/// write per [`BufRead::fill_buf`], at most 256 KiB): a byte slice, or a
/// [`BufReader`] of [`TAR_READ_BUFFER`](crate::TAR_READ_BUFFER) over a file.
pub fn extract_layer(
    tar: impl BufRead,
    target: &Path,
    options: &ExtractOptions,
) -> Result<LayerSummary, ExtractError> {
    extract_layer_from(&mut NoLending(tar), target, options)
}

/// [`extract_layer`] from a source that may lend its buffers ([`LayerSource`]): the write
/// threads of small files then keep views of the source's buffers instead of copies of the
/// files' data (a [`SharedReader`](crate::SharedReader) over a file, a pull's decoded buffers).
#[instrument(skip_all, fields(target = %target.display()))]
pub fn extract_layer_from(
    tar: &mut dyn LayerSource,
    target: &Path,
    options: &ExtractOptions,
) -> Result<LayerSummary, ExtractError> {
    // Entered before the backend is made: its write threads take the gate with them.
    let _gate = crate::backend::syscall::GateScope::enter(options.create_gate.clone());
    let mut backend = new_backend(
        options.backend,
        options.chown,
        target,
        options.write_threads_for(target),
        options.creates_on_extracting_thread(target),
        options.direct_writes_into(target),
    )?;
    extract_with(tar, target, options, backend.as_mut())
}

/// [`extract_layer`] with the given backend (`options.backend` is not looked at).
pub(crate) fn extract_with(
    tar: &mut dyn LayerSource,
    target: &Path,
    options: &ExtractOptions,
    backend: &mut dyn IoBackend,
) -> Result<LayerSummary, ExtractError> {
    let _gate = crate::backend::syscall::GateScope::enter(options.create_gate.clone());
    let tree = Tree::open(target)?;
    let creation = Creation::probe(target, tree.root());
    let mut extractor = Extractor {
        tree,
        creation,
        options,
        backend,
        summary: LayerSummary::default(),
        xattrs: XattrPolicy::new(options.chown),
        metadata: EntryMetadata::default(),
        path: Vec::new(),
        link: Vec::new(),
        name: Vec::new(),
        deferred: HashSet::new(),
        warned_special: false,
    };
    let mut walk = TarWalk::new(tar);
    let walked = loop {
        match walk.next_entry() {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(source) => {
                break Err(ExtractError::Tar {
                    entry: entry_path(&extractor.path),
                    source,
                });
            }
        }
        if let Err(error) = extractor.entry(&mut walk) {
            break Err(error);
        }
    };
    // The backend's deferred work comes first in tar order: its error, if any, is the one to
    // report (an entry may have failed only because a write thread had).
    let flushed = extractor.flush();
    match (walked, flushed) {
        (_, Err(deferred)) => return Err(deferred),
        (Err(error), Ok(())) => return Err(error),
        (Ok(()), Ok(())) => {}
    }
    let summary = extractor.summary;
    debug!(
        entries = summary.entries,
        files = summary.files,
        bytes = summary.bytes_written,
        whiteouts = summary.whiteouts.len(),
        deferred_hardlinks = summary.deferred_hardlinks.len(),
        "layer extracted"
    );
    Ok(summary)
}

struct Extractor<'a> {
    tree: Tree,
    /// What a new file gets without asking (skips `fchmod`/`fchown` that would change nothing).
    creation: Creation,
    options: &'a ExtractOptions,
    /// Writes the regular files and runs the namespace operations (mkdir, symlink, link, unlink).
    backend: &'a mut dyn IoBackend,
    summary: LayerSummary,
    xattrs: XattrPolicy,
    metadata: EntryMetadata,
    /// The current entry's normalised path (reused buffer).
    path: Vec<u8>,
    /// The current hardlink's normalised target (reused buffer).
    link: Vec<u8>,
    /// The current final component, NUL-terminated (reused buffer).
    name: Vec<u8>,
    /// Paths of `summary.deferred_hardlinks`, so that a later entry for the same path cancels one.
    deferred: HashSet<Vec<u8>>,
    warned_special: bool,
}

impl Extractor<'_> {
    fn entry(&mut self, walk: &mut TarWalk<'_>) -> Result<(), ExtractError> {
        let kind = walk.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            return Ok(());
        }
        let raw_path = walk.path_bytes();
        if let Err(detail) = normalize(&raw_path, &mut self.path) {
            return Err(escape(&raw_path, detail));
        }
        drop(raw_path);
        self.summary.entries += 1;
        // Move the buffers out so that slices of them can be passed to `&mut self` methods.
        let path = std::mem::take(&mut self.path);
        let mut name = std::mem::take(&mut self.name);
        let result = self.entry_at(walk, kind, &path, &mut name);
        self.path = path;
        self.name = name;
        result
    }

    fn entry_at(
        &mut self,
        walk: &mut TarWalk<'_>,
        kind: EntryType,
        path: &[u8],
        name_buffer: &mut Vec<u8>,
    ) -> Result<(), ExtractError> {
        let (parent, name) = split_parent(path);
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            return self.whiteout(path, parent, name, hidden);
        }
        self.metadata
            .read(walk.header(), walk.pax_extensions())
            .map_err(|source| ExtractError::Tar {
                entry: entry_path(path),
                source,
            })?;
        if !self.deferred.is_empty() && self.deferred.remove(path) {
            // A later entry for the same path wins over a hardlink deferred to the merge.
            self.summary
                .deferred_hardlinks
                .retain(|link| link.link.as_os_str().as_encoded_bytes() != path);
        }
        if path.is_empty() {
            if kind != EntryType::Directory {
                return Err(invalid(path, "a non-directory entry names the root itself"));
            }
            self.record_directory(path);
            return Ok(());
        }
        name_buffer.clear();
        name_buffer.extend_from_slice(name);
        name_buffer.push(0);
        let name = CStr::from_bytes_with_nul(name_buffer)
            .map_err(|_| invalid(path, "the name contains a NUL byte"))?;
        match kind {
            EntryType::Directory => self.directory(path, parent, name),
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(walk, path, parent, name)
            }
            EntryType::Symlink => {
                let target = walk
                    .link_name_bytes()
                    .ok_or_else(|| invalid(path, "symlink without a target"))?;
                self.symlink(path, parent, name, &target)
            }
            EntryType::Link => {
                let target = walk
                    .link_name_bytes()
                    .ok_or_else(|| invalid(path, "hardlink without a target"))?;
                self.hardlink(path, parent, name, &target)
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                self.special(walk.header(), kind, path, parent, name)
            }
            other => {
                debug!(entry = %lossy(path), kind = ?other, "skipping unsupported tar entry type");
                Ok(())
            }
        }
    }

    /// `.wh..wh..opq` and `.wh.NAME`: recorded for the merge, never created.
    fn whiteout(
        &mut self,
        path: &[u8],
        parent: &[u8],
        name: &[u8],
        hidden: &[u8],
    ) -> Result<(), ExtractError> {
        if name == OPAQUE_MARKER {
            // The directory itself exists in this layer even when the tar has no entry for it.
            self.tree
                .parent_dir(parent, Some(&mut *self.backend), path)?;
            self.summary.opaque_dirs.push(entry_path(parent));
            return Ok(());
        }
        if hidden.starts_with(WHITEOUT_PREFIX) {
            // Other `.wh..wh.` names are aufs internals (e.g. `.wh..wh.plnk`), not content.
            debug!(entry = %lossy(path), "skipping aufs metadata entry");
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(invalid(path, "whiteout without a name to hide"));
        }
        let mut hidden_path = Vec::with_capacity(path.len());
        if !parent.is_empty() {
            hidden_path.extend_from_slice(parent);
            hidden_path.push(b'/');
        }
        hidden_path.extend_from_slice(hidden);
        self.summary.whiteouts.push(entry_path(&hidden_path));
        Ok(())
    }

    fn record_directory(&mut self, path: &[u8]) {
        self.summary.dirs += 1;
        self.summary.directories.push(DirectoryMetadata {
            path: entry_path(path),
            mode: self.metadata.mode,
            uid: self.metadata.uid,
            gid: self.metadata.gid,
            mtime: self.metadata.mtime,
            xattrs: std::mem::take(&mut self.metadata.xattrs),
        });
    }

    fn directory(&mut self, path: &[u8], parent: &[u8], name: &CStr) -> Result<(), ExtractError> {
        let dir = self
            .tree
            .parent_dir(parent, Some(&mut *self.backend), path)?;
        match self.backend.mkdir(dir, name, 0o700) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                let existing =
                    file_type_at(dir, name).map_err(|errno| io_error(path, "inspecting", errno))?;
                if existing != Some(FileType::Directory) {
                    // A file, symlink, ... replaced by a directory.
                    self.replace(parent, name, path, |backend, dir| {
                        backend.mkdir(dir, name, 0o700)
                    })?;
                }
            }
            Err(errno) => return Err(io_error(path, "creating directory", errno)),
        }
        self.record_directory(path);
        Ok(())
    }

    fn file(
        &mut self,
        walk: &mut TarWalk<'_>,
        path: &[u8],
        parent: &[u8],
        name: &CStr,
    ) -> Result<(), ExtractError> {
        let size = walk.size();
        let (create_mode, mode, owner) = self.creation.plan(
            self.metadata.mode,
            self.metadata.uid,
            self.metadata.gid,
            self.options.chown,
        );
        let parent_dir = self
            .tree
            .shared_parent_dir(parent, Some(&mut *self.backend), path)?;
        let file = NewFile {
            parent: parent_dir,
            name,
            entry: path,
            size,
            create_mode,
            metadata: FileMetadata {
                mode,
                owner,
                mtime: self.metadata.mtime,
                xattrs: &self.metadata.xattrs,
            },
        };
        // The data straight from the source's buffers, unless the walk has to map it (a GNU sparse
        // file).
        let written = if walk.is_sparse() {
            let mut data = BufReader::with_capacity(SPARSE_BUFFER, walk.sparse_data());
            self.backend.write_file(&file, &mut data)?
        } else {
            self.backend.write_file_from(&file, &mut walk.file_data())?
        };
        if self.backend.take_replaced() {
            // What was removed may have been a cached directory or a symlink on a cached path.
            self.tree.invalidate();
        }
        self.summary.files += 1;
        self.summary.bytes_written += written;
        Ok(())
    }

    /// Completes everything the backend has pending (at the end of the layer: a pending file is
    /// already created when `write_file` returns, and its data and metadata land through its own
    /// descriptor, so no entry of the layer can depend on them).
    fn flush(&mut self) -> Result<(), ExtractError> {
        self.backend.flush()?;
        if self.backend.take_replaced() {
            self.tree.invalidate();
        }
        Ok(())
    }

    fn symlink(
        &mut self,
        path: &[u8],
        parent: &[u8],
        name: &CStr,
        target: &[u8],
    ) -> Result<(), ExtractError> {
        // The target is stored verbatim: it is only ever resolved by our own confined walk. A NUL
        // byte in it is the EINVAL `symlinkat` would give.
        let target = CString::new(target).map_err(|_| io_error(path, "creating", Errno::INVAL))?;
        self.create(parent, name, path, |backend, dir| {
            backend.symlink(&target, dir, name)
        })?;
        let dir = self.tree.parent_dir(parent, None, path)?;
        apply_nofollow(
            dir,
            name,
            &self.metadata,
            self.options.chown,
            &mut self.xattrs,
            path,
        )?;
        self.summary.symlinks += 1;
        Ok(())
    }

    fn hardlink(
        &mut self,
        path: &[u8],
        parent: &[u8],
        name: &CStr,
        target: &[u8],
    ) -> Result<(), ExtractError> {
        // The target is looked up by name (is it in this layer?): a file the backend has not
        // created yet must be there first.
        if self.backend.has_pending() {
            self.flush()?;
        }
        let mut link = std::mem::take(&mut self.link);
        let result = self.hardlink_to(path, parent, name, target, &mut link);
        self.link = link;
        result
    }

    fn hardlink_to(
        &mut self,
        path: &[u8],
        parent: &[u8],
        name: &CStr,
        raw_target: &[u8],
        target: &mut Vec<u8>,
    ) -> Result<(), ExtractError> {
        normalize(raw_target, target)
            .map_err(|detail| escape(path, format!("hardlink target: {detail}")))?;
        self.summary.hardlinks += 1;
        if target.as_slice() == path {
            return Ok(()); // a link to itself: nothing to do
        }
        if target.is_empty() {
            return Err(invalid(path, "hardlink to the root directory"));
        }
        let (target_parent, target_name) = split_parent(target);
        let target_name = CString::new(target_name)
            .map_err(|_| invalid(path, "hardlink target contains a NUL byte"))?;
        let target_dir = match self.tree.lookup_dir(target_parent, path) {
            Ok(dir) => Some(dir),
            Err(ExtractError::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
            {
                None
            }
            Err(error) => return Err(error),
        };
        let present = match &target_dir {
            Some(dir) => file_type_at(dir.as_fd(), &target_name)
                .map_err(|errno| io_error(path, "inspecting hardlink target of", errno))?,
            None => None,
        };
        match (target_dir, present) {
            (Some(target_dir), Some(_)) => {
                self.create(parent, name, path, |backend, dir| {
                    backend.link(target_dir.as_fd(), &target_name, dir, name)
                })?;
            }
            _ => {
                // Not written by this layer: a file of an earlier layer, linked by the merge.
                let dir = self
                    .tree
                    .parent_dir(parent, Some(&mut *self.backend), path)?;
                if file_type_at(dir, name)
                    .map_err(|errno| io_error(path, "inspecting", errno))?
                    .is_some()
                {
                    remove_all_at(&mut *self.backend, dir, name)
                        .map_err(|errno| io_error(path, "removing", errno))?;
                    self.tree.invalidate();
                }
                debug!(entry = %lossy(path), target = %lossy(target), "hardlink target not in this layer; deferred to the merge");
                self.summary.deferred_hardlinks.push(DeferredHardlink {
                    link: entry_path(path),
                    target: entry_path(target),
                });
                self.deferred.insert(path.to_vec());
            }
        }
        Ok(())
    }

    fn special(
        &mut self,
        header: &tar::Header,
        kind: EntryType,
        path: &[u8],
        parent: &[u8],
        name: &CStr,
    ) -> Result<(), ExtractError> {
        if !self.options.special_files {
            self.summary.skipped_special_files += 1;
            // The count goes into the summary; the caller warns once for the whole image.
            if !self.warned_special {
                self.warned_special = true;
                debug!(entry = %lossy(path), "skipping device nodes and fifos in this layer (special files are off)");
            }
            return Ok(());
        }
        // mknodat and chmod by name do not go through the backend: settle its pending files first
        // (one may have this name).
        if self.backend.has_pending() {
            self.flush()?;
        }
        let major = header.device_major().ok().flatten().unwrap_or(0);
        let minor = header.device_minor().ok().flatten().unwrap_or(0);
        let file_type = match kind {
            EntryType::Char => FileType::CharacterDevice,
            EntryType::Block => FileType::BlockDevice,
            _ => FileType::Fifo,
        };
        let mode = Mode::from_raw_mode(self.metadata.mode);
        let device = rustix::fs::makedev(major, minor);
        // No io_uring operation for mknodat: always the system call.
        self.create(parent, name, path, |_, dir| {
            rustix::fs::mknodat(dir, name, file_type, mode, device)
        })?;
        let dir = self.tree.parent_dir(parent, None, path)?;
        apply_nofollow(
            dir,
            name,
            &self.metadata,
            self.options.chown,
            &mut self.xattrs,
            path,
        )?;
        // The mode given to mknodat is filtered by the umask, and chown may clear setgid. A device
        // cannot be opened to fchmod it (opening has side effects, a fifo blocks), so chmod by name:
        // the node was created by the mknodat above, it is not a symlink.
        rustix::fs::chmodat(dir, name, mode, AtFlags::empty())
            .map_err(|errno| io_error(path, "changing mode of", errno))?;
        self.summary.special_files += 1;
        Ok(())
    }

    /// Runs `operation` (which creates `name` in the parent directory, given the backend and the
    /// parent); when the name exists, removes what is there (a tar entry replaces an earlier one)
    /// and runs it again.
    fn create<T>(
        &mut self,
        parent: &[u8],
        name: &CStr,
        path: &[u8],
        mut operation: impl FnMut(&mut dyn IoBackend, BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, ExtractError> {
        let dir = self
            .tree
            .parent_dir(parent, Some(&mut *self.backend), path)?;
        match operation(&mut *self.backend, dir) {
            Ok(value) => Ok(value),
            Err(Errno::EXIST) => self.replace(parent, name, path, operation),
            Err(errno) => Err(io_error(path, "creating", errno)),
        }
    }

    fn replace<T>(
        &mut self,
        parent: &[u8],
        name: &CStr,
        path: &[u8],
        operation: impl FnMut(&mut dyn IoBackend, BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, ExtractError> {
        replace_with(
            &mut self.tree,
            &mut *self.backend,
            parent,
            name,
            path,
            operation,
        )
    }
}

/// Removes whatever is at `parent/name` and runs `operation` to create the new entry.
fn replace_with<T>(
    tree: &mut Tree,
    backend: &mut dyn IoBackend,
    parent: &[u8],
    name: &CStr,
    path: &[u8],
    mut operation: impl FnMut(&mut dyn IoBackend, BorrowedFd<'_>) -> Result<T, Errno>,
) -> Result<T, ExtractError> {
    let dir = tree.parent_dir(parent, Some(&mut *backend), path)?;
    debug!(entry = %lossy(path), "replacing an earlier entry of the same layer");
    match remove_all_at(&mut *backend, dir, name) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(errno) => return Err(io_error(path, "removing the earlier entry at", errno)),
    }
    // What was removed may have been a cached directory or a symlink on a cached path.
    tree.invalidate();
    let dir = tree.parent_dir(parent, Some(&mut *backend), path)?;
    operation(backend, dir).map_err(|errno| io_error(path, "creating", errno))
}
