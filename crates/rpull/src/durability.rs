//! When pulled data is made durable: `--fsync none|layer|end|auto`.
//!
//! Never per file: a `syncfs` of the destination's filesystem after the tree is complete
//! (`end`) writes back everything the pull left dirty in one call, which is what a pull needs
//! before it reports success on a disk; on tmpfs there is nothing to write back.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::Serialize;

/// The durability policy of a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// `end` on a disk filesystem, `none` on tmpfs/ramfs.
    #[default]
    Auto,
    /// Leave write-back to the kernel (what docker and podman do).
    None,
    /// `syncfs` after each layer is extracted, and at the end.
    Layer,
    /// One `syncfs` of the destination filesystem before the tree is renamed into place, and an
    /// fsync of the destination's parent directory after the rename.
    End,
}

impl FsyncPolicy {
    /// The policy actually applied to a tree at `path`: `Auto` becomes `End` or `None`.
    pub fn resolve(self, path: &Path) -> FsyncPolicy {
        match self {
            FsyncPolicy::Auto if is_memory_filesystem(path) => FsyncPolicy::None,
            FsyncPolicy::Auto => FsyncPolicy::End,
            other => other,
        }
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsyncPolicy::Auto => "auto",
            FsyncPolicy::None => "none",
            FsyncPolicy::Layer => "layer",
            FsyncPolicy::End => "end",
        })
    }
}

impl FromStr for FsyncPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(FsyncPolicy::Auto),
            "none" => Ok(FsyncPolicy::None),
            "layer" => Ok(FsyncPolicy::Layer),
            "end" => Ok(FsyncPolicy::End),
            other => Err(format!(
                "unknown fsync policy {other:?} (expected none, layer, end or auto)"
            )),
        }
    }
}

/// tmpfs and ramfs keep everything in memory: there is nothing to write back.
fn is_memory_filesystem(path: &Path) -> bool {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    match rustix::fs::statfs(path) {
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        Ok(stat) => matches!(stat.f_type as u64, TMPFS_MAGIC | RAMFS_MAGIC),
        Err(_) => false,
    }
}

/// `syncfs` of the filesystem holding `path`.
pub(crate) fn syncfs(path: &Path) -> std::io::Result<()> {
    let dir = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )?;
    rustix::fs::syncfs(&dir)?;
    Ok(())
}

/// `fsync` of a directory, so a rename inside it is durable.
pub(crate) fn fsync_dir(path: &Path) -> std::io::Result<()> {
    let dir = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )?;
    rustix::fs::fsync(&dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for policy in [
            FsyncPolicy::Auto,
            FsyncPolicy::None,
            FsyncPolicy::Layer,
            FsyncPolicy::End,
        ] {
            assert_eq!(policy.to_string().parse::<FsyncPolicy>(), Ok(policy));
        }
        assert!(
            "always"
                .parse::<FsyncPolicy>()
                .unwrap_err()
                .contains("always")
        );
    }

    #[test]
    fn auto_is_none_on_tmpfs_and_end_on_disk() {
        if Path::new("/dev/shm").is_dir() && is_memory_filesystem(Path::new("/dev/shm")) {
            assert_eq!(
                FsyncPolicy::Auto.resolve(Path::new("/dev/shm")),
                FsyncPolicy::None
            );
        }
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        if !is_memory_filesystem(disk.path()) {
            assert_eq!(FsyncPolicy::Auto.resolve(disk.path()), FsyncPolicy::End);
        }
        assert_eq!(
            FsyncPolicy::Layer.resolve(Path::new("/dev/shm")),
            FsyncPolicy::Layer
        );
    }
}
