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
    remove_typed(backend, dir, name, None)
}

/// [`remove_all_at`], with the type a directory listing (or a failed rename) gave: a directory is
/// opened and emptied straight away, without first trying to unlink it as a file.
pub(crate) fn remove_typed(
    backend: &mut dyn IoBackend,
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: Option<FileType>,
) -> Result<(), Errno> {
    let listed_dir = kind == Some(FileType::Directory);
    if !listed_dir {
        match backend.unlink(dir, name, false) {
            // Linux answers EISDIR for a directory (POSIX allows EPERM).
            Err(Errno::ISDIR | Errno::PERM) => {}
            other => return other,
        }
    }
    let child = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(child) => child,
        // Listed as a directory, but something else replaced it since: remove that.
        Err(Errno::NOTDIR | Errno::LOOP) if listed_dir => {
            return remove_typed(backend, dir, name, None);
        }
        Err(errno) => return Err(errno),
    };
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
        match remove_typed(backend, dir, &entry.name, entry.kind) {
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

#[cfg(test)]
pub(crate) mod tests {
    use std::io::BufRead;

    use super::*;
    use crate::backend::{NewFile, StdBackend};
    use crate::error::ExtractError;

    /// The std backend, recording each unlink: the name, `remove_dir`, and whether it failed.
    #[derive(Debug)]
    pub(crate) struct Recording {
        inner: StdBackend,
        pub(crate) unlinks: Vec<(String, bool, Option<Errno>)>,
    }

    impl Recording {
        pub(crate) fn new() -> Recording {
            Recording {
                inner: StdBackend::new(false),
                unlinks: Vec::new(),
            }
        }

        /// The unlinks that failed, with their error.
        pub(crate) fn failed(&self) -> Vec<(String, bool, Option<Errno>)> {
            self.unlinks
                .iter()
                .filter(|(_, _, error)| error.is_some())
                .cloned()
                .collect()
        }
    }

    impl IoBackend for Recording {
        fn write_file(
            &mut self,
            file: &NewFile<'_>,
            data: &mut dyn BufRead,
        ) -> Result<u64, ExtractError> {
            self.inner.write_file(file, data)
        }
        fn flush(&mut self) -> Result<(), ExtractError> {
            self.inner.flush()
        }
        fn has_pending(&self) -> bool {
            self.inner.has_pending()
        }
        fn take_replaced(&mut self) -> bool {
            self.inner.take_replaced()
        }
        fn unlink(
            &mut self,
            dir: BorrowedFd<'_>,
            name: &CStr,
            remove_dir: bool,
        ) -> Result<(), Errno> {
            let result = self.inner.unlink(dir, name, remove_dir);
            let name = String::from_utf8_lossy(name.to_bytes()).into_owned();
            self.unlinks.push((name, remove_dir, result.err()));
            result
        }
    }

    /// A tree goes whole, a symlink in it is removed and not followed, and the directories a
    /// listing names are emptied without a failing unlink first: only the top one, whose type
    /// nothing told, gets one.
    #[test]
    fn a_tree_is_removed_without_following_links_or_unlinking_listed_directories_as_files() {
        let work = tempfile::tempdir().unwrap();
        let (root, outside) = (work.path().join("root"), work.path().join("outside"));
        std::fs::create_dir_all(root.join("d/sub/deeper")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("kept"), "x").unwrap();
        std::fs::write(root.join("d/f"), "f").unwrap();
        std::fs::write(root.join("d/sub/deeper/g"), "g").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("d/sub/link")).unwrap();
        let dir = std::fs::File::open(&root).unwrap();
        let mut backend = Recording::new();
        remove_all_at(&mut backend, dir.as_fd(), c"d").unwrap();

        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        assert_eq!(std::fs::read(outside.join("kept")).unwrap(), b"x");
        assert_eq!(
            backend.failed(),
            [("d".to_owned(), false, Some(Errno::ISDIR))],
            "{:?}",
            backend.unlinks
        );
        // Every directory removed as one, every other entry as a file.
        let mut removed: Vec<(String, bool)> = backend
            .unlinks
            .iter()
            .filter(|(_, _, error)| error.is_none())
            .map(|(name, dir, _)| (name.clone(), *dir))
            .collect();
        removed.sort();
        let expected: Vec<(String, bool)> = [
            ("d", true),
            ("deeper", true),
            ("f", false),
            ("g", false),
            ("link", false),
            ("sub", true),
        ]
        .iter()
        .map(|(name, dir)| (name.to_string(), *dir))
        .collect();
        assert_eq!(removed, expected);
        // ENOENT is returned as is.
        assert_eq!(
            remove_all_at(&mut backend, dir.as_fd(), c"d"),
            Err(Errno::NOENT)
        );
    }
}
