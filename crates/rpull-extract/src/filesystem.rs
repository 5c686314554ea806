//! What kind of file system a destination is on: in memory or not (for the pipeline's
//! choices), and its type's name (for reports).

use std::path::Path;

/// Whether `path` is on a file system that keeps everything in memory (tmpfs, ramfs): there is
/// nothing to write back, and no on-disk inode allocator for several threads to contend in.
/// `None` when it cannot be inspected.
///
/// The pipeline decides three things with it: the write threads of a layer
/// ([`ExtractOptions::write_threads_for`](crate::ExtractOptions::write_threads_for)), the
/// inode-creation gate ([`CreateGate::for_target`](crate::CreateGate::for_target)) and the
/// durability policy `auto` of `rpull` (no `syncfs` in memory).
pub fn in_memory_filesystem(path: &Path) -> Option<bool> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    // `f_type` is i64 on x86-64 glibc, another integer type elsewhere.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(path)
        .ok()
        .map(|stat| matches!(stat.f_type as u64, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// The type of the file system holding `path` (`ext4`, `tmpfs`, ...), from `/proc/self/mounts`
/// (the longest matching mount point), for reports; `None` when it cannot be read.
pub fn filesystem_type(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_device, mount_point, fs_type) = (fields.next()?, fields.next()?, fields.next()?);
            let mount_point = mount_point.replace("\\040", " ");
            path.starts_with(&mount_point)
                .then(|| (mount_point.len(), fs_type.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs_type)| fs_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_file_systems_are_tmpfs_and_ramfs() {
        for path in ["/dev/shm", "/proc", env!("CARGO_MANIFEST_DIR"), "/"] {
            let path = Path::new(path);
            // Two sources: statfs's magic number, and the mount table's name.
            let Some(kind) = filesystem_type(path) else {
                continue;
            };
            assert_eq!(
                in_memory_filesystem(path),
                Some(kind == "tmpfs" || kind == "ramfs"),
                "{} is on {kind}",
                path.display()
            );
        }
        assert_eq!(in_memory_filesystem(Path::new("/no/such/dir")), None);
    }

    #[test]
    fn filesystem_types() {
        assert_eq!(
            filesystem_type(Path::new("/proc/self")).as_deref(),
            Some("proc")
        );
        if Path::new("/dev/shm").exists() {
            assert_eq!(
                filesystem_type(Path::new("/dev/shm")).as_deref(),
                Some("tmpfs")
            );
        }
        assert_eq!(filesystem_type(Path::new("/no/such/dir")), None);
    }
}
