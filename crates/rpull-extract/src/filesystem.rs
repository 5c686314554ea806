//! What kind of file system a destination is on: in memory or not, whether inodes made there by
//! several threads at once are made faster and whether a new tree should be kept away from inodes
//! deleted just before (for the pipeline's choices), and its type's name (for reports).

use std::path::Path;

const TMPFS_MAGIC: u64 = 0x0102_1994;
const RAMFS_MAGIC: u64 = 0x8584_58f6;
const EXT4_SUPER_MAGIC: u64 = 0xef53;

/// Whether `path` is on a file system that keeps everything in memory (tmpfs, ramfs): there is
/// nothing to write back. `None` when it cannot be inspected.
///
/// `rpull`'s durability policy `auto` makes no `syncfs` there.
pub fn in_memory_filesystem(path: &Path) -> Option<bool> {
    statfs_magic(path).map(|magic| matches!(magic, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Whether several threads making inodes at once in `path`'s file system were measured to make
/// them faster than one: on tmpfs, ramfs and ext4 with a journal; `false` on every other file
/// system, and on ext4 whose journal cannot be told; `None` when `path` cannot be inspected.
///
/// The pipeline decides two things with it: the write threads of a layer
/// ([`ExtractOptions::write_threads_for`](crate::ExtractOptions::write_threads_for)) and the
/// inode-creation gate ([`CreateGate::for_target`](crate::CreateGate::for_target)).
///
/// Measured (docs/performance.md, on this project's 2-core VMs): without a journal, ext4 skips
/// free inodes deleted in the last minutes when it allocates one (`recently_deleted`, checked only
/// when the file system has no journal), and threads that create at once contend in that scan:
/// right after a large delete, two write threads were slower than one. With a journal there is no
/// such scan: a layer of 150k small files took 1.7-1.9 s with two write threads against 3.0-3.2 s
/// with one (GNU tar 3.6-3.7 s), and whole pulls were faster too. On XFS two threads made that
/// layer 1.45x faster but the realistic image's pull 3-5% slower; on btrfs two threads were no
/// faster for the layer and the realistic pull 9% slower. So those keep one thread and the gate.
pub fn parallel_creation_scales(path: &Path) -> Option<bool> {
    Some(match statfs_magic(path)? {
        TMPFS_MAGIC | RAMFS_MAGIC => true,
        EXT4_SUPER_MAGIC => ext4_has_journal(path) == Some(true),
        _ => false,
    })
}

/// Whether a layer's small files are made faster in `path`'s file system when one thread makes
/// every inode (the extracting thread, in tar order) and a write thread writes their data, sets
/// their metadata and closes them: on ext4 without a journal, where it was measured; `false` on
/// every other file system and on ext4 whose journal cannot be told; `None` when `path` cannot be
/// inspected. It matters where one write thread is used ([`parallel_creation_scales`] is false).
///
/// Measured (docs/performance.md, "What changed", on this project's 2-core VMs, whose root ext4
/// has no journal): there making an inode right after a large delete is most of a small file's
/// cost (`openat` 67% of the samples of one thread doing it all, about half of that the
/// allocator's scan past recently deleted inodes), and two threads making inodes at once
/// contend. With the rest on a write thread, a layer of 150k small files took 3.72-3.79 s against
/// 4.90-5.15 s (GNU tar 5.45-6.13 s), 4 alternating rounds. The file systems are those of
/// [`recent_deletes_slow_creation`] today, but the two were measured apart and may part.
pub fn split_creation_helps(path: &Path) -> Option<bool> {
    Some(match statfs_magic(path)? {
        EXT4_SUPER_MAGIC => ext4_has_journal(path) == Some(false),
        _ => false,
    })
}

/// Whether big files written into `path`'s file system get their blocks allocated before their
/// data (`fallocate` keeping the size, for files of 8 MiB up to half the free space): on ext4
/// only, where it was measured; `None` when `path` cannot be inspected.
///
/// Measured (docs/performance.md, on this project's 2-core VMs): while a pull's early write-back
/// (a `syncfs` per 64 MiB) allocates the blocks of a big file's written part, ext4 holds the
/// file's `i_data_sem`, and the extraction thread waited for it in `ext4_da_get_block_prep` on
/// its next `write` (97-103 ms in 14-15 waits in two traced 1 GB pulls). With the blocks
/// allocated first, a third traced pull did not wait there, and the realistic image's pulls into
/// ext4 were 1-6% faster in all four alternating sets, 1 GB pulls 2-6% faster in three sets and
/// even in the fourth. On tmpfs `fallocate` would fill the file with zeroed pages before writing
/// them again; on XFS and btrfs it measured no faster, and other file systems were not measured.
pub fn preallocation_helps(path: &Path) -> Option<bool> {
    Some(statfs_magic(path)? == EXT4_SUPER_MAGIC)
}

/// Whether a new tree made in `path`'s file system right after a large delete should be placed
/// away from the inodes just freed: on ext4 without a journal, which skips inodes deleted in the
/// last minute (six while their inode table block is not written back) when it allocates one
/// (`recently_deleted`), so that a tree made where another was just deleted scans past all of
/// them for each new inode. `false` on every other file system and on ext4 whose journal cannot
/// be told; `None` when `path` cannot be inspected.
///
/// The pull marks its staging directory where this is true ([`spread_new_trees`]).
/// Measured (docs/performance.md, "What changed", on this project's 2-core VMs, whose root ext4
/// has no journal): the realistic image's pull right after the delete of its previous tree took
/// 6.49-6.85 s (5.3-5.6 s of system time) before and 3.16-3.41 s (1.8-1.9) with the staging
/// directory marked, about what it took into new directories with no tree deleted before them
/// (3.11-3.35 s).
pub fn recent_deletes_slow_creation(path: &Path) -> Option<bool> {
    Some(match statfs_magic(path)? {
        EXT4_SUPER_MAGIC => ext4_has_journal(path) == Some(false),
        _ => false,
    })
}

/// Where [`recent_deletes_slow_creation`] says so, marks the directory `dir` as the top of
/// directory hierarchies (`FS_TOPDIR_FL`, `chattr +T`); `Ok(true)` when it did, `Ok(false)` where
/// nothing is to be done. A pull's staging directory and the bench's extract stage call it on the
/// directory that will hold their new trees.
///
/// ext4's Orlov allocator then places each new subdirectory of `dir` as it places those of the
/// file system's root: in the block group with the fewest directories among those with at least
/// the average free inodes and blocks, searched from a group chosen by a hash of the
/// subdirectory's name, instead of next to `dir`. Subdirectories with new names therefore start
/// their trees in groups of their own, not in the groups of a tree deleted just before (which
/// are often where a plain subdirectory would go, next to their common parent). Everything under
/// such a subdirectory is placed next to it, as usual. The flag is not inherited.
///
/// Fails where the file system refuses the flag; the directory can still be used as it is.
pub fn spread_new_trees(dir: &Path) -> std::io::Result<bool> {
    use rustix::fs::{IFlags, Mode, OFlags};
    if recent_deletes_slow_creation(dir) != Some(true) {
        return Ok(false);
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    let flags = rustix::fs::ioctl_getflags(&fd)?;
    rustix::fs::ioctl_setflags(&fd, flags | IFlags::TOPDIR)?;
    Ok(true)
}

fn statfs_magic(path: &Path) -> Option<u64> {
    // `f_type` is i64 on x86-64 glibc, another integer type elsewhere.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(path).ok().map(|stat| stat.f_type as u64)
}

/// Whether the ext4 file system holding `path` has a journal: the kernel names its journal
/// thread in `/sys/fs/ext4/DEVICE/journal_task`, and writes `<none>` there without one. `None`
/// when that cannot be read (no sysfs, a device sysfs does not name).
fn ext4_has_journal(path: &Path) -> Option<bool> {
    let name = block_device_name(path)?;
    let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task")).ok()?;
    Some(task.trim() != "<none>")
}

/// The block device holding `path`'s file system as the kernel names it (`vda`, `nvme0n1p2`,
/// `dm-0`, `loop0`), from its device number and `/sys/dev/block`.
fn block_device_name(path: &Path) -> Option<String> {
    let device = rustix::fs::stat(path).ok()?.st_dev;
    let (major, minor) = (rustix::fs::major(device), rustix::fs::minor(device));
    let link = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    Some(link.file_name()?.to_str()?.to_owned())
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
    fn creation_scales_except_on_ext4_without_a_journal() {
        assert_eq!(parallel_creation_scales(Path::new("/no/such/dir")), None);
        // Not measured: procfs is taken as any other file system.
        assert_eq!(
            parallel_creation_scales(Path::new("/proc/self")),
            Some(false)
        );
        if filesystem_type(Path::new("/dev/shm")).as_deref() == Some("tmpfs") {
            assert_eq!(parallel_creation_scales(Path::new("/dev/shm")), Some(true));
        }
        // The checkout's file system, against a second source when it is ext4: jbd2 lists its
        // journals in /proc/fs/jbd2 as DEVICE-8 (8: the journal's inode). Loop-mounted ext4 with
        // and without a journal: tests/filesystems.rs.
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
        if filesystem_type(checkout).as_deref() == Some("ext4") {
            let name = block_device_name(checkout).unwrap();
            let journal = Path::new(&format!("/proc/fs/jbd2/{name}-8")).is_dir();
            assert_eq!(parallel_creation_scales(checkout), Some(journal));
        }
    }

    #[test]
    fn recent_deletes_slow_creation_on_ext4_without_a_journal_only() {
        assert_eq!(
            recent_deletes_slow_creation(Path::new("/no/such/dir")),
            None
        );
        assert_eq!(
            recent_deletes_slow_creation(Path::new("/proc/self")),
            Some(false)
        );
        if filesystem_type(Path::new("/dev/shm")).as_deref() == Some("tmpfs") {
            assert_eq!(
                recent_deletes_slow_creation(Path::new("/dev/shm")),
                Some(false)
            );
        }
        // The checkout's file system, against jbd2's list of journals when it is ext4 (as above).
        // Loop-mounted ext4 with and without a journal: tests/filesystems.rs.
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
        if filesystem_type(checkout).as_deref() == Some("ext4") {
            let name = block_device_name(checkout).unwrap();
            let journal = Path::new(&format!("/proc/fs/jbd2/{name}-8")).is_dir();
            assert_eq!(recent_deletes_slow_creation(checkout), Some(!journal));
        }
    }

    #[test]
    fn big_files_are_preallocated_on_ext4_only() {
        assert_eq!(preallocation_helps(Path::new("/no/such/dir")), None);
        assert_eq!(preallocation_helps(Path::new("/proc/self")), Some(false));
        for path in ["/dev/shm", env!("CARGO_MANIFEST_DIR"), "/"] {
            let path = Path::new(path);
            if let Some(kind) = filesystem_type(path) {
                assert_eq!(preallocation_helps(path), Some(kind == "ext4"), "{kind}");
            }
        }
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
