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
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PullError + 'a {
    move |source| PullError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

impl Staging {
    /// Creates `PARENT/.NAME.rpull-staging-PID-NANOS/` with `rootfs/` and `layers/` in it, and
    /// removes staging directories that earlier rpull processes (now dead) left for the same
    /// destination.
    pub(crate) fn create(dest: &Path) -> Result<Staging, PullError> {
        let (parent, name) = split(dest)?;
        fs::create_dir_all(&parent).map_err(io_err("creating the parent of", dest))?;
        remove_stale(&parent, &name);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir = parent.join(format!(".{name}{MARKER}{}-{nanos}", std::process::id()));
        fs::create_dir(&dir).map_err(io_err("creating staging directory", &dir))?;
        let staging = Staging { dir };
        fs::create_dir(staging.rootfs()).map_err(io_err("creating", &staging.rootfs()))?;
        fs::create_dir(staging.dir.join("layers")).map_err(io_err("creating", &staging.dir))?;
        Ok(staging)
    }

    pub(crate) fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// A new empty directory for layer `index`'s entries.
    pub(crate) fn new_layer_dir(&self, index: usize) -> Result<PathBuf, PullError> {
        let path = self.dir.join("layers").join(index.to_string());
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
