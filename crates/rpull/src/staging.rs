//! The staging directory: a hidden sibling of the destination on the same filesystem, so the
//! finished tree can be renamed into place, and removed whole when the pull fails.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tracing::debug;

use crate::PullError;

const MARKER: &str = ".rpull-staging-";

#[derive(Debug)]
pub(crate) struct Staging {
    dir: PathBuf,
    /// `dir/rootfs-ID`, renamed to the destination by [`Staging::commit`].
    rootfs: PathBuf,
    /// `dir/layers-ID`, holding a directory per layer extracted apart from the root.
    layers: PathBuf,
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PullError + 'a {
    move |source| PullError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

impl Staging {
    /// Creates `PARENT/.NAME.rpull-staging-ID/` (ID: `PID-NANOS`) with `rootfs-ID/` and
    /// `layers-ID/` in it, and removes staging directories that earlier rpull processes (now
    /// dead) left for the same destination.
    ///
    /// On ext4 without a journal the staging directory is marked as the top of directory
    /// hierarchies ([`rpull_extract::spread_new_trees`]), so that its two subdirectories, whose
    /// names differ from pull to pull, are placed in block groups chosen afresh rather than next
    /// to the parent, where a tree deleted just before (`rm -rf` of the previous pull, or
    /// `--force`) leaves inodes that ext4 scans past on every allocation
    /// ([`rpull_extract::recent_deletes_slow_creation`]).
    pub(crate) fn create(dest: &Path) -> Result<Staging, PullError> {
        let (parent, name) = split(dest)?;
        fs::create_dir_all(&parent).map_err(io_err("creating the parent of", dest))?;
        remove_stale(&parent, &name);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let id = format!("{}-{nanos}", std::process::id());
        let dir = parent.join(format!(".{name}{MARKER}{id}"));
        fs::create_dir(&dir).map_err(io_err("creating staging directory", &dir))?;
        match rpull_extract::spread_new_trees(&dir) {
            Ok(false) => {}
            Ok(true) => {
                debug!(path = %dir.display(), "staging directory marked as a top directory (ext4 without a journal)")
            }
            Err(error) => {
                debug!(path = %dir.display(), %error, "could not mark the staging directory as a top directory")
            }
        }
        let staging = Staging {
            rootfs: dir.join(format!("rootfs-{id}")),
            layers: dir.join(format!("layers-{id}")),
            dir,
        };
        fs::create_dir(&staging.rootfs).map_err(io_err("creating", &staging.rootfs))?;
        fs::create_dir(&staging.layers).map_err(io_err("creating", &staging.layers))?;
        Ok(staging)
    }

    pub(crate) fn rootfs(&self) -> PathBuf {
        self.rootfs.clone()
    }

    /// A new empty directory for layer `index`'s entries.
    pub(crate) fn new_layer_dir(&self, index: usize) -> Result<PathBuf, PullError> {
        let path = self.layers.join(index.to_string());
        fs::create_dir(&path).map_err(io_err("creating", &path))?;
        Ok(path)
    }

    /// Renames the finished root to `dest`. A `dest` that is an empty directory is replaced;
    /// a non-empty one only with `force` (it is moved into staging first and removed with it).
    pub(crate) fn commit(&self, dest: &Path, force: bool) -> Result<(), PullError> {
        let rootfs = self.rootfs();
        match destination_state(dest)? {
            DestinationState::Missing | DestinationState::EmptyDir => {}
            DestinationState::Occupied if force => {
                let old = self.dir.join("replaced");
                fs::rename(dest, &old).map_err(io_err("moving aside the old", dest))?;
            }
            DestinationState::Occupied => {
                return Err(PullError::DestinationNotEmpty {
                    path: dest.to_owned(),
                });
            }
        }
        fs::rename(&rootfs, dest).map_err(io_err("renaming the pulled tree to", dest))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = remove_all(&self.dir) {
            tracing::warn!(path = %self.dir.display(), error = %e, "could not remove the staging directory");
        }
    }
}

/// Removes a tree even where a layer made directories read-only.
fn remove_all(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(dir);
            fs::remove_dir_all(dir)
        }
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            make_writable(&entry.path());
        }
    }
}

pub(crate) enum DestinationState {
    Missing,
    EmptyDir,
    Occupied,
}

pub(crate) fn destination_state(dest: &Path) -> Result<DestinationState, PullError> {
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(DestinationState::Missing),
        Err(e) => Err(PullError::Io {
            action: "checking destination",
            path: dest.to_owned(),
            source: e,
        }),
        Ok(meta) if meta.is_dir() => {
            let mut entries = fs::read_dir(dest).map_err(io_err("reading destination", dest))?;
            Ok(if entries.next().is_none() {
                DestinationState::EmptyDir
            } else {
                DestinationState::Occupied
            })
        }
        Ok(_) => Ok(DestinationState::Occupied),
    }
}

fn split(dest: &Path) -> Result<(PathBuf, String), PullError> {
    let absolute = std::path::absolute(dest).map_err(io_err("resolving", dest))?;
    let name = absolute
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    match (absolute.parent(), name) {
        (Some(parent), Some(name)) if name != ".." => Ok((parent.to_owned(), name)),
        _ => Err(PullError::Io {
            action: "choosing a staging directory for",
            path: dest.to_owned(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "the destination needs a parent directory and a name",
            ),
        }),
    }
}

/// Staging directories of processes that no longer run (killed with SIGKILL, power loss).
fn remove_stale(parent: &Path, name: &str) {
    let prefix = format!(".{name}{MARKER}");
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            debug!(path = %entry.path().display(), pid, "removing a staging directory left by a dead rpull process");
            let _ = remove_all(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_top_directory(path: &Path) -> bool {
        use rustix::fs::{IFlags, Mode, OFlags};
        let dir =
            rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        // File systems without inode flags (tmpfs has only a few) have none to show.
        rustix::fs::ioctl_getflags(dir).is_ok_and(|flags| flags.contains(IFlags::TOPDIR))
    }

    #[test]
    fn a_staging_names_its_root_and_layers_apart_and_marks_itself_where_deletes_slow_creation() {
        // On the file system of /tmp: this project's VMs have ext4 without a journal there; any
        // other is checked for the other answer. Loop-mounted ext4: rpull-extract's
        // tests/filesystems.rs.
        let parent = tempfile::tempdir().unwrap();
        let dest = parent.path().join("tree");
        let first = Staging::create(&dest).unwrap();
        let second = Staging::create(&dest).unwrap();
        assert_ne!(first.rootfs(), second.rootfs());
        assert_ne!(first.layers, second.layers);
        for staging in [&first, &second] {
            // Both are named after the staging directory's own ID, so that ext4 hashes new names.
            let id = staging.dir.file_name().unwrap().to_str().unwrap();
            let id = id.split(MARKER).nth(1).unwrap();
            assert_eq!(staging.rootfs(), staging.dir.join(format!("rootfs-{id}")));
            assert_eq!(staging.layers, staging.dir.join(format!("layers-{id}")));
            assert!(staging.rootfs().is_dir() && staging.layers.is_dir());
            let layer = staging.new_layer_dir(3).unwrap();
            assert_eq!(layer, staging.layers.join("3"));
            assert!(layer.is_dir());
            let marked = rpull_extract::recent_deletes_slow_creation(&staging.dir) == Some(true);
            assert_eq!(is_top_directory(&staging.dir), marked);
            // The mark stays on the staging directory; the tree renamed out of it has none.
            assert!(!is_top_directory(&staging.rootfs()));
        }
        first.commit(&dest, false).unwrap();
        assert!(dest.is_dir() && !is_top_directory(&dest));
        let dirs = [first.dir.clone(), second.dir.clone()];
        drop((first, second));
        assert!(dirs.iter().all(|dir| !dir.exists()));
        assert_eq!(fs::read_dir(parent.path()).unwrap().count(), 1);
    }
}
