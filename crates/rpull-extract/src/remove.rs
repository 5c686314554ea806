//! Removal of whole subtrees through descriptors, never following symlinks.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::backend::IoBackend;

/// Removes `name` in `dir`, whatever it is; a directory is removed with everything below it. A
/// symlink is removed itself, never followed. `ENOENT` is returned as is. The unlinks go through
/// `backend` (listing and opening the directories on the way are plain system calls).
pub(crate) fn remove_all_at(
    backend: &mut dyn IoBackend,
    dir: BorrowedFd<'_>,
    name: &CStr,
) -> Result<(), Errno> {
    match backend.unlink(dir, name, false) {
        // Linux answers EISDIR for a directory (POSIX allows EPERM).
        Err(Errno::ISDIR | Errno::PERM) => {}
        other => return other,
    }
    let child = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    remove_children(backend, child.as_fd())?;
    backend.unlink(dir, name, true)
}

/// Removes everything inside the directory `dir` (which must be readable, not `O_PATH`), through
/// `backend` as [`remove_all_at`] does.
pub(crate) fn remove_children(
    backend: &mut dyn IoBackend,
    dir: BorrowedFd<'_>,
) -> Result<(), Errno> {
    for entry in list_dir(dir)? {
        match remove_all_at(backend, dir, &entry.name) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

/// One name of a directory listing.
pub(crate) struct Listed {
    pub(crate) name: CString,
    /// Its type as the listing gives it (`d_type`); `None` where the file system does not say.
    pub(crate) kind: Option<FileType>,
}

/// The names in directory `dir` except `.` and `..`, with their types, collected first so that
/// the directory can be changed while they are processed.
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> Result<Vec<Listed>, Errno> {
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut reader = Dir::new(fd)?;
    let mut listed = Vec::new();
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            let kind = match entry.file_type() {
                FileType::Unknown => None,
                kind => Some(kind),
            };
            listed.push(Listed {
                name: name.to_owned(),
                kind,
            });
        }
    }
    Ok(listed)
}
