//! What kind of file system a destination is on.

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The file system type of the mount holding `path`, from `/proc/self/mounts` (the longest
    /// matching mount point): an oracle independent of `statfs`.
    fn mount_type(path: &Path) -> Option<String> {
        let path = std::fs::canonicalize(path).ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        mounts
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (_device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
                let point = point.replace("\\040", " ");
                path.starts_with(&point)
                    .then(|| (point.len(), kind.to_owned()))
            })
            .max_by_key(|(length, _)| *length)
            .map(|(_, kind)| kind)
    }

    #[test]
    fn memory_file_systems_are_tmpfs_and_ramfs() {
        for path in ["/dev/shm", "/proc", env!("CARGO_MANIFEST_DIR"), "/"] {
            let path = Path::new(path);
            let Some(kind) = mount_type(path) else {
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
}
