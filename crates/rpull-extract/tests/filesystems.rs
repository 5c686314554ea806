//! The pipeline's choices per file system, on real file systems: ext4 with and without a journal,
//! each made with `mkfs.ext4` in a file and loop-mounted (as root; skipped otherwise, saying so).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Layer, is_root, snapshot};
use rpull_extract::{
    CreateGate, ExtractOptions, IoBackendKind, extract_layer, finalize_tree,
    parallel_creation_scales, preallocation_helps, recent_deletes_slow_creation,
    split_creation_helps, spread_new_trees,
};

/// An ext4 file system made in a file under a temporary directory and mounted on another; it is
/// unmounted (and its loop device released) when dropped.
struct LoopExt4 {
    mount_point: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopExt4 {
    /// `Err` names why it could not be made, for the skip message.
    fn new(journal: bool) -> Result<Self, String> {
        let features = if journal {
            "has_journal"
        } else {
            "^has_journal"
        };
        Self::with_options(&["-O", features])
    }

    /// One made by `mkfs.ext4 -q -F OPTIONS`.
    fn with_options(options: &[&str]) -> Result<Self, String> {
        // On the disk, not in /tmp: the image must not live on the file system it stands for.
        let dir = tempfile::Builder::new()
            .prefix("rpull-fs-test")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .map_err(|e| e.to_string())?;
        let image = dir.path().join("ext4.img");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(64 << 20))
            .map_err(|e| e.to_string())?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .args(options)
            .arg(&image))?;
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).map_err(|e| e.to_string())?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount_point))?;
        Ok(Self {
            mount_point,
            _dir: dir,
        })
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount_point).status();
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Whether jbd2 runs a journal for the device of the file system mounted at `mount_point`, as
/// procfs says (`/proc/fs/jbd2/DEVICE-8`, 8 being the journal's inode): a second source beside
/// the sysfs file `parallel_creation_scales` reads.
fn jbd2_journal(mount_point: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let device = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?, fields.next()?))
        })
        .find(|(_, point)| Path::new(point) == mount_point)
        .map(|(device, _)| device.trim_start_matches("/dev/").to_owned())
        .expect("the mount is in /proc/self/mounts");
    Path::new(&format!("/proc/fs/jbd2/{device}-8")).is_dir()
}

#[test]
fn ext4_with_a_journal_gets_write_threads_and_no_gate_and_without_one_neither() {
    if !is_root() {
        eprintln!("skipped: mounting a loop ext4 needs root");
        return;
    }
    let (journaled, plain) = match (LoopExt4::new(true), LoopExt4::new(false)) {
        (Ok(journaled), Ok(plain)) => (journaled, plain),
        (Err(why), _) | (_, Err(why)) => {
            // A container without loop devices or CAP_SYS_ADMIN.
            eprintln!("skipped: cannot make a loop ext4: {why}");
            return;
        }
    };
    let auto = ExtractOptions::for_current_user();

    assert!(jbd2_journal(&journaled.mount_point));
    assert_eq!(parallel_creation_scales(&journaled.mount_point), Some(true));
    assert_eq!(
        auto.write_threads_for(&journaled.mount_point),
        ExtractOptions::default_write_threads()
    );
    assert_eq!(CreateGate::for_target(&journaled.mount_point), None);
    assert_eq!(split_creation_helps(&journaled.mount_point), Some(false));
    assert!(!auto.creates_on_extracting_thread(&journaled.mount_point));

    assert_eq!(
        recent_deletes_slow_creation(&journaled.mount_point),
        Some(false)
    );
    assert!(!spread_new_trees(&journaled.mount_point).unwrap());
    assert!(!is_top_directory(&journaled.mount_point));

    assert!(!jbd2_journal(&plain.mount_point));
    assert_eq!(parallel_creation_scales(&plain.mount_point), Some(false));
    assert_eq!(recent_deletes_slow_creation(&plain.mount_point), Some(true));
    assert_eq!(auto.write_threads_for(&plain.mount_point), 1);
    assert!(CreateGate::for_target(&plain.mount_point).is_some());
    assert_eq!(split_creation_helps(&plain.mount_point), Some(true));
    assert!(auto.creates_on_extracting_thread(&plain.mount_point));
    let two = ExtractOptions {
        write_threads: 2,
        ..auto.clone()
    };
    assert!(!two.creates_on_extracting_thread(&plain.mount_point));

    // A layer of small files applied with those defaults gives the same tree on both, gate and
    // write threads or not.
    let mut layer = Layer::new().dir("etc", 0o755);
    for d in 0..4 {
        layer = layer.files_in(&format!("d{d}"), 300);
    }
    let tar = layer.bytes();
    let mut trees = Vec::new();
    for fs in [&journaled, &plain] {
        let root = fs.mount_point.join("rootfs");
        std::fs::create_dir(&root).unwrap();
        let options = ExtractOptions {
            create_gate: CreateGate::for_target(&root),
            ..auto.clone()
        };
        let summary = extract_layer(tar.as_slice(), &root, &options).unwrap();
        assert_eq!(summary.files, 1200);
        finalize_tree(&root, &[summary], &options).unwrap();
        trees.push(snapshot(&root));
    }
    assert_eq!(trees[0], trees[1]);
}

#[test]
fn subdirectories_of_a_top_directory_start_in_block_groups_of_their_own() {
    if !is_root() {
        eprintln!("skipped: mounting a loop ext4 needs root");
        return;
    }
    // 64 block groups of 1 MiB (256 inodes each), not gathered into flex groups, so that where
    // a directory's inode is tells its group apart.
    let fs = match LoopExt4::with_options(&[
        "-O",
        "^has_journal,^flex_bg",
        "-b",
        "1024",
        "-g",
        "1024",
        "-N",
        "16384",
    ]) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: cannot make a loop ext4: {why}");
            return;
        }
    };
    let inodes_per_group = 16384 / 64;
    let group = |path: &Path| (std::fs::metadata(path).unwrap().ino() - 1) / inodes_per_group;
    let groups_of_subdirectories = |parent: &Path| {
        let mut groups: Vec<u64> = (0..8)
            .map(|i| {
                let dir = parent.join(format!("tree-{i}"));
                std::fs::create_dir(&dir).unwrap();
                group(&dir)
            })
            .collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    };
    // Below the root, as a staging directory is: plain, then marked.
    let plain = fs.mount_point.join("a/plain");
    let marked = fs.mount_point.join("a/marked");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::create_dir_all(&marked).unwrap();
    assert!(spread_new_trees(&marked).unwrap());
    assert!(is_top_directory(&marked));
    assert!(!is_top_directory(&plain));
    // A plain directory's subdirectories stay in its group; a marked one's are spread.
    assert_eq!(groups_of_subdirectories(&plain), vec![group(&plain)]);
    let spread = groups_of_subdirectories(&marked);
    assert!(spread.len() >= 4, "groups {spread:?}");
    // The mark is not inherited: a tree renamed out of the staging directory carries none.
    assert!(!is_top_directory(&marked.join("tree-0")));
}

/// Whether the directory at `path` carries `FS_TOPDIR_FL` (`lsattr -d` shows `T`).
fn is_top_directory(path: &Path) -> bool {
    use rustix::fs::{IFlags, Mode, OFlags};
    let dir = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    rustix::fs::ioctl_getflags(dir)
        .unwrap()
        .contains(IFlags::TOPDIR)
}

/// `FIEMAP_EXTENT_DELALLOC`: the extent's blocks are not allocated yet (delayed allocation).
const FIEMAP_EXTENT_DELALLOC: u32 = 0x4;

/// The flags of each extent of the file at `path`, as `FS_IOC_FIEMAP` reports them without
/// writing anything back first.
fn extent_flags(path: &Path) -> Vec<u32> {
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [Extent; 64],
    }
    // _IOWR('f', 11, struct fiemap): the 32-byte header.
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    let file = std::fs::File::open(path).unwrap();
    let mut map = Fiemap {
        start: 0,
        length: u64::MAX,
        flags: 0,
        mapped_extents: 0,
        extent_count: 64,
        reserved: 0,
        extents: [Extent::default(); 64],
    };
    // SAFETY: FS_IOC_FIEMAP reads the header and writes at most `extent_count` extents into the
    // array that follows it, which has that many.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            FS_IOC_FIEMAP,
            &mut map,
        )
    };
    assert_eq!(rc, 0, "FIEMAP of {}", path.display());
    map.extents[..map.mapped_extents as usize]
        .iter()
        .map(|extent| extent.flags)
        .collect()
}

/// A loop-mounted ext4 with a journal, or `None` (saying why the test is skipped) where one cannot
/// be made: not root, or no loop devices.
fn journaled_ext4() -> Option<LoopExt4> {
    if !is_root() {
        eprintln!("skipped: mounting a loop ext4 needs root");
        return None;
    }
    LoopExt4::new(true)
        .map_err(|why| eprintln!("skipped: cannot make a loop ext4: {why}"))
        .ok()
}

#[test]
fn big_files_get_their_blocks_before_their_data_on_ext4() {
    let Some(fs) = journaled_ext4() else {
        return;
    };
    assert_eq!(preallocation_helps(&fs.mount_point), Some(true));
    // 8 MiB is where preallocation starts; the small file is left to delayed allocation.
    let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 253) as u8).collect();
    let small = vec![5u8; 1 << 20];
    let tar = Layer::new()
        .file("big", 0o644, &big)
        .file("small", 0o644, &small)
        .bytes();
    for (backend, write_threads) in [
        (IoBackendKind::Std, 1),
        (IoBackendKind::Std, 2),
        (IoBackendKind::Uring, 1),
    ] {
        if backend.resolve().0 != backend {
            eprintln!("skipped {backend:?}: io_uring is unavailable here");
            continue;
        }
        let root = fs.mount_point.join(format!("{backend:?}-{write_threads}"));
        std::fs::create_dir(&root).unwrap();
        let options = ExtractOptions {
            backend,
            write_threads,
            ..ExtractOptions::for_current_user()
        };
        extract_layer(tar.as_slice(), &root, &options).unwrap();
        // Nothing has been written back yet: the big file's blocks exist already (unwritten
        // extents), the small file's are still to be allocated.
        let flags = extent_flags(&root.join("big"));
        assert!(
            !flags.is_empty() && flags.iter().all(|f| f & FIEMAP_EXTENT_DELALLOC == 0),
            "{backend:?} x{write_threads}: big file extents {flags:x?}"
        );
        let flags = extent_flags(&root.join("small"));
        assert!(
            flags.iter().any(|f| f & FIEMAP_EXTENT_DELALLOC != 0),
            "{backend:?} x{write_threads}: small file extents {flags:x?}"
        );
        assert_eq!(std::fs::read(root.join("big")).unwrap(), big);
        assert_eq!(std::fs::read(root.join("small")).unwrap(), small);
    }
}

#[test]
fn a_file_of_more_than_half_the_free_space_is_not_allocated_ahead() {
    let Some(fs) = journaled_ext4() else {
        return;
    };
    // Three quarters of what is free: more than half of it, and still room to write it.
    let stat = rustix::fs::statvfs(&fs.mount_point).unwrap();
    let free = stat.f_bavail * stat.f_frsize;
    let size = (free * 3 / 4) & !0xfffff;
    assert!(
        size >= 8 << 20,
        "a {free}-byte file system is too small for this test"
    );
    let data = vec![3u8; size as usize];
    let tar = Layer::new().file("big", 0o644, &data).bytes();
    let root = fs.mount_point.join("rootfs");
    std::fs::create_dir(&root).unwrap();
    extract_layer(tar.as_slice(), &root, &ExtractOptions::for_current_user()).unwrap();
    // Written, by delayed allocation: its blocks were not allocated before its data.
    let flags = extent_flags(&root.join("big"));
    assert!(
        flags.iter().any(|f| f & FIEMAP_EXTENT_DELALLOC != 0),
        "extents {flags:x?}"
    );
    assert_eq!(std::fs::read(root.join("big")).unwrap(), data);
}

/// Whether the first page of the file at `path` is in the page cache: a read of it that may not
/// wait for the device (`preadv2` with `RWF_NOWAIT`) succeeds only then.
fn first_page_cached(path: &Path) -> bool {
    let file = std::fs::File::open(path).unwrap();
    let mut page = [0u8; 4096];
    let iov = libc::iovec {
        iov_base: page.as_mut_ptr().cast(),
        iov_len: page.len(),
    };
    // SAFETY: one iovec over `page`, which outlives the call.
    let rc = unsafe {
        libc::preadv2(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            &iov,
            1,
            0,
            libc::RWF_NOWAIT,
        )
    };
    if rc < 0 {
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.raw_os_error(),
            Some(libc::EAGAIN),
            "preadv2 of {}",
            path.display()
        );
        return false;
    }
    true
}

#[test]
fn big_files_are_written_past_the_page_cache_on_ext4_when_asked() {
    let Some(fs) = journaled_ext4() else {
        return;
    };
    // 8 MiB and more is written with O_DIRECT, here with a tail that is not a whole block (which
    // goes through the page cache); the small file always goes through the page cache.
    let big: Vec<u8> = (0..(8 << 20) + 1000)
        .map(|i: u32| (i % 251) as u8)
        .collect();
    let small = vec![5u8; 1 << 20];
    let tar = Layer::new()
        .file("big", 0o644, &big)
        .file("small", 0o644, &small)
        .bytes();
    for direct_writes in [true, false] {
        for write_threads in [1, 2] {
            let root = fs
                .mount_point
                .join(format!("direct-{direct_writes}-{write_threads}"));
            std::fs::create_dir(&root).unwrap();
            let options = ExtractOptions {
                backend: IoBackendKind::Std,
                write_threads,
                direct_writes,
                ..ExtractOptions::for_current_user()
            };
            assert_eq!(options.direct_writes_into(&root), direct_writes);
            extract_layer(tar.as_slice(), &root, &options).unwrap();
            let case = format!("direct_writes {direct_writes}, x{write_threads}");
            assert_eq!(
                first_page_cached(&root.join("big")),
                !direct_writes,
                "{case}: the big file's first page"
            );
            assert!(
                first_page_cached(&root.join("small")),
                "{case}: the small file"
            );
            assert_eq!(std::fs::read(root.join("big")).unwrap(), big, "{case}");
            assert_eq!(std::fs::read(root.join("small")).unwrap(), small, "{case}");
        }
    }
}
