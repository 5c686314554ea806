//! Confined path resolution: every parent directory is opened beneath the root.
//!
//! The fast path is `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, one component at a time from
//! a cache of already opened parent directories. When the kernel refuses (an absolute symlink or a
//! `..` that leaves the starting directory gives `EXDEV`; old kernels give `ENOSYS`) or a directory
//! is missing, [`walk_beneath`] resolves the whole prefix from the root over `O_PATH|O_NOFOLLOW`
//! descriptors: absolute symlink targets restart at the root, a `..` above the root is an
//! [`ExtractError::Escape`].

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::backend::IoBackend;
use crate::error::{ExtractError, escape, io_error};

/// Symlinks followed while resolving one path before giving up with `ELOOP` (the kernel's limit).
const MAX_SYMLINKS: u32 = 40;
/// Mode of directories created because an entry needs a parent that has no entry of its own.
pub(crate) const IMPLICIT_DIR_MODE: u32 = 0o755;

static OPENAT2_UNAVAILABLE: AtomicBool = AtomicBool::new(false);

const DIR_PATH_FLAGS: OFlags = OFlags::PATH.union(OFlags::DIRECTORY).union(OFlags::CLOEXEC);

/// A root directory plus a cache of opened parent directories, keyed by their normalised path.
///
/// The cache is a stack along one path (`a`, `a/b`, `a/b/c`): tar streams list entries depth first,
/// so the next entry's parent almost always shares a prefix with the previous one. Anything that
/// removes or replaces an existing path must call [`Tree::invalidate`].
#[derive(Debug)]
pub(crate) struct Tree {
    /// Shared (like the cached directories) so that an io backend can keep a parent open until its
    /// deferred work there is done, without a `dup` per file.
    root: Arc<OwnedFd>,
    cached_path: Vec<u8>,
    /// (end of this directory's path in `cached_path`, its descriptor)
    cached: Vec<(usize, Arc<OwnedFd>)>,
}

impl Tree {
    pub(crate) fn open(root: &Path) -> Result<Self, ExtractError> {
        let fd = rustix::fs::open(root, DIR_PATH_FLAGS, Mode::empty()).map_err(|errno| {
            io_error(root.as_os_str().as_bytes(), "opening root directory", errno)
        })?;
        Ok(Self {
            root: Arc::new(fd),
            cached_path: Vec::new(),
            cached: Vec::new(),
        })
    }

    pub(crate) fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Forgets every cached descriptor; call after removing or replacing anything.
    pub(crate) fn invalidate(&mut self) {
        self.cached.clear();
        self.cached_path.clear();
    }

    /// Opens the directory at normalised path `dir` (following symlinks inside the root), creating
    /// missing directories with [`IMPLICIT_DIR_MODE`] through `create` when it is a backend (`None`
    /// creates nothing). `entry` names the errors.
    pub(crate) fn parent_dir(
        &mut self,
        dir: &[u8],
        create: Option<&mut (dyn IoBackend + '_)>,
        entry: &[u8],
    ) -> Result<BorrowedFd<'_>, ExtractError> {
        Ok(self.shared_parent_dir(dir, create, entry)?.as_fd())
    }

    /// [`Tree::parent_dir`] as a shared descriptor.
    pub(crate) fn shared_parent_dir(
        &mut self,
        dir: &[u8],
        mut create: Option<&mut (dyn IoBackend + '_)>,
        entry: &[u8],
    ) -> Result<&Arc<OwnedFd>, ExtractError> {
        if dir.is_empty() {
            return Ok(&self.root);
        }
        // Keep the deepest cached directory that is a prefix of `dir`.
        while let Some(&(end, _)) = self.cached.last() {
            if dir.len() >= end
                && dir[..end] == self.cached_path[..end]
                && (dir.len() == end || dir[end] == b'/')
            {
                break;
            }
            self.cached.pop();
        }
        let mut start = self.cached.last().map_or(0, |&(end, _)| end);
        self.cached_path.truncate(start);
        if start == dir.len() {
            return Ok(self.cached.last().map_or(&self.root, |(_, fd)| fd));
        }
        if start > 0 {
            start += 1; // skip the '/'
        }
        for component in dir[start..].split(|byte| *byte == b'/') {
            let end = start + component.len();
            let fd = {
                let current = self
                    .cached
                    .last()
                    .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd());
                match open_beneath(current, component) {
                    Ok(fd) => fd,
                    // Missing, absolute symlink, `..` out of `current`, not a directory, ELOOP...:
                    // the walk from the root gives the authoritative answer.
                    Err(_) => {
                        walk_beneath(self.root.as_fd(), &dir[..end], create.as_deref_mut(), entry)?
                    }
                }
            };
            if !self.cached_path.is_empty() {
                self.cached_path.push(b'/');
            }
            self.cached_path.extend_from_slice(component);
            self.cached.push((end, Arc::new(fd)));
            start = end + 1;
        }
        Ok(self.cached.last().map_or(&self.root, |(_, fd)| fd))
    }

    /// Like [`Tree::parent_dir`] without creating anything or touching the cache (hardlink targets,
    /// whiteouts, merge and finalize lookups).
    pub(crate) fn lookup_dir(&self, dir: &[u8], entry: &[u8]) -> Result<OwnedFd, ExtractError> {
        if !dir.is_empty()
            && let Ok(fd) = open_beneath(self.root.as_fd(), dir)
        {
            return Ok(fd);
        }
        walk_beneath(self.root.as_fd(), dir, None, entry)
    }

    /// The directory at `path` opened with `flags` by one `openat2` confined beneath the root
    /// (`RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS`; `flags` should hold `O_NOFOLLOW` when the final
    /// component must not be a symlink). Any error, including an absolute symlink on the way that
    /// the root would confine, is only a "not this way": callers fall back to
    /// [`Tree::lookup_dir`] and an `openat` of the name, which give the authoritative answer.
    pub(crate) fn open_beneath_with(&self, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        openat2_beneath(self.root.as_fd(), path, flags)
    }
}

/// `openat2(dir, path, O_PATH|O_DIRECTORY, RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS)`.
fn open_beneath(dir: BorrowedFd<'_>, path: &[u8]) -> Result<OwnedFd, Errno> {
    openat2_beneath(dir, path, DIR_PATH_FLAGS)
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS)`; `ENOSYS` once openat2 was
/// found missing.
fn openat2_beneath(dir: BorrowedFd<'_>, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
    if OPENAT2_UNAVAILABLE.load(Ordering::Relaxed) {
        return Err(Errno::NOSYS);
    }
    let result = rustix::fs::openat2(
        dir,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    );
    if matches!(result, Err(Errno::NOSYS)) {
        tracing::debug!("openat2 is not available (ENOSYS); resolving paths with a userspace walk");
        OPENAT2_UNAVAILABLE.store(true, Ordering::Relaxed);
    }
    result
}

/// Resolves the normalised relative `path` to a directory beneath `root`, component by component
/// over `O_PATH|O_NOFOLLOW` descriptors, following symlinks inside the root: an absolute target
/// restarts at the root, a `..` above the root is an escape. Missing directories are created with
/// [`IMPLICIT_DIR_MODE`] through `create` when it is a backend (`None` creates nothing).
pub(crate) fn walk_beneath(
    root: BorrowedFd<'_>,
    path: &[u8],
    mut create: Option<&mut (dyn IoBackend + '_)>,
    entry: &[u8],
) -> Result<OwnedFd, ExtractError> {
    let fail = |operation: &'static str, errno: Errno| io_error(entry, operation, errno);
    // Components still to resolve, last one first.
    let mut pending: Vec<Vec<u8>> = path
        .split(|byte| *byte == b'/')
        .rev()
        .map(<[u8]>::to_vec)
        .collect();
    // Directories opened so far below the root; empty means "at the root".
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut symlinks = 0;
    while let Some(component) = pending.pop() {
        match component.as_slice() {
            b"" | b"." => continue,
            b".." => {
                if stack.pop().is_none() {
                    return Err(escape(entry, "a symlink on the way leads above the root"));
                }
                continue;
            }
            _ => {}
        }
        let current = stack.last().map_or(root, |fd| fd.as_fd());
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = rustix::fs::openat(current, component.as_slice(), flags, Mode::empty());
        let fd = match (opened, create.as_deref_mut()) {
            (Ok(fd), _) => fd,
            (Err(Errno::NOENT), Some(backend)) => {
                // A name with a NUL byte never gets here: `openat` refused it with EINVAL.
                let name = CString::new(component)
                    .map_err(|_| fail("creating parent directory", Errno::INVAL))?;
                match backend.mkdir(current, &name, 0o700) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(errno) => return Err(fail("creating parent directory", errno)),
                }
                let dir = rustix::fs::openat(
                    current,
                    &name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| fail("opening parent directory", errno))?;
                // fchmod: the mode given to mkdirat is filtered by the umask.
                rustix::fs::fchmod(&dir, Mode::from_raw_mode(IMPLICIT_DIR_MODE))
                    .map_err(|errno| fail("setting mode of parent directory", errno))?;
                stack.push(dir);
                continue;
            }
            (Err(errno), _) => return Err(fail("opening parent directory", errno)),
        };
        let stat =
            rustix::fs::fstat(&fd).map_err(|errno| fail("inspecting parent directory", errno))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => stack.push(fd),
            FileType::Symlink => {
                symlinks += 1;
                if symlinks > MAX_SYMLINKS {
                    return Err(fail("resolving parent directory", Errno::LOOP));
                }
                let target = rustix::fs::readlinkat(&fd, c"", Vec::new())
                    .map_err(|errno| fail("reading symlink on the way", errno))?;
                let target = target.as_bytes();
                if target.first() == Some(&b'/') {
                    stack.clear();
                }
                pending.extend(target.split(|byte| *byte == b'/').rev().map(<[u8]>::to_vec));
            }
            _ => return Err(fail("opening parent directory", Errno::NOTDIR)),
        }
    }
    match stack.pop() {
        Some(fd) => Ok(fd),
        None => rustix::fs::openat(root, c".", DIR_PATH_FLAGS, Mode::empty())
            .map_err(|errno| fail("opening root directory", errno)),
    }
}

/// The file type of `name` in `dir`, without following a final symlink; `None` when it does not exist.
pub(crate) fn file_type_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<Option<FileType>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(errno) => Err(errno),
    }
}

/// A displayable path for log lines.
pub(crate) fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    OsStr::from_bytes(bytes).to_string_lossy()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, std::path::PathBuf) {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("root");
        std::fs::create_dir_all(root.join("real/sub")).unwrap();
        symlink("/real", root.join("absolute")).unwrap();
        symlink("real", root.join("relative")).unwrap();
        symlink("../..", root.join("real/up")).unwrap();
        symlink("loop2", root.join("loop1")).unwrap();
        symlink("loop1", root.join("loop2")).unwrap();
        (temp, root)
    }

    fn inode(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    #[test]
    fn walk_follows_symlinks_inside_the_root() {
        let (_temp, root) = setup();
        let tree = Tree::open(&root).unwrap();
        let sub = std::fs::metadata(root.join("real/sub")).unwrap();
        use std::os::unix::fs::MetadataExt;
        for path in [
            &b"real/sub"[..],
            b"absolute/sub",
            b"relative/sub",
            b"absolute/../real/sub",
        ] {
            let fd = walk_beneath(tree.root(), path, None, b"entry").unwrap();
            assert_eq!(inode(&fd), sub.ino(), "{}", lossy(path));
            let fd = tree.lookup_dir(path, b"entry").unwrap();
            assert_eq!(inode(&fd), sub.ino(), "{}", lossy(path));
        }
    }

    #[test]
    fn walk_refuses_to_climb_above_the_root() {
        let (_temp, root) = setup();
        let tree = Tree::open(&root).unwrap();
        let error = walk_beneath(tree.root(), b"real/up/x", None, b"the-entry").unwrap_err();
        assert!(
            matches!(&error, ExtractError::Escape { entry, .. } if entry == Path::new("the-entry")),
            "{error}"
        );
    }

    #[test]
    fn walk_gives_eloop_on_symlink_loops() {
        let (_temp, root) = setup();
        let tree = Tree::open(&root).unwrap();
        let error = walk_beneath(tree.root(), b"loop1/x", None, b"entry").unwrap_err();
        assert!(
            matches!(&error, ExtractError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP)),
            "{error}"
        );
    }

    #[test]
    fn walk_creates_missing_directories_behind_absolute_symlinks() {
        let (_temp, root) = setup();
        let mut tree = Tree::open(&root).unwrap();
        let mut backend = crate::StdBackend::new(false);
        tree.parent_dir(b"absolute/new/deeper", Some(&mut backend), b"entry")
            .unwrap();
        assert!(root.join("real/new/deeper").is_dir());
        // The cache answers the same path again and its children.
        tree.parent_dir(b"absolute/new/deeper/more", Some(&mut backend), b"entry")
            .unwrap();
        assert!(root.join("real/new/deeper/more").is_dir());
    }
}
