/// Which [`IoBackend`](crate::IoBackend) writes regular files and runs the namespace operations
/// (directories, symlinks, hardlinks, renames, unlinks) of extraction and merge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoBackendKind {
    /// Blocking system calls with large buffers ([`StdBackend`](crate::StdBackend)).
    #[default]
    Std,
    /// io_uring: file writes and closes batched into few submissions; directories, symlinks,
    /// hardlinks, renames and unlinks through the ring where the kernel has the operation, one at
    /// a time ([`UringBackend`](crate::UringBackend)). Extraction and merge fail when io_uring is
    /// unavailable.
    Uring,
    /// [`Uring`](Self::Uring) when io_uring is available (probed once per process: ring setup and
    /// the operations the backend needs), [`Std`](Self::Std) otherwise.
    Auto,
}

impl IoBackendKind {
    /// The backend that will actually be used, and why io_uring is not when it was asked for
    /// (`Auto` or `Uring`) and is unavailable: `ENOSYS` (kernel without io_uring), `EPERM` (seccomp,
    /// `/proc/sys/kernel/io_uring_disabled`), missing WRITE or CLOSE (kernel older than 5.6). An
    /// explicit `Uring` that resolves to `Std` makes extraction fail with that reason. (A missing
    /// namespace operation is no reason: that operation stays a system call.)
    pub fn resolve(self) -> (IoBackendKind, Option<String>) {
        match self {
            IoBackendKind::Std => (IoBackendKind::Std, None),
            IoBackendKind::Uring | IoBackendKind::Auto => match crate::uring::availability() {
                Ok(_) => (IoBackendKind::Uring, None),
                Err(reason) => (IoBackendKind::Std, Some(reason.clone())),
            },
        }
    }
}

/// How layers are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractOptions {
    /// Apply the uid/gid recorded in the layer (`lchown` semantics). Needs `CAP_CHOWN`; when set, a
    /// `security.capability` xattr that cannot be stored is an error rather than a warning.
    pub chown: bool,
    /// Create character/block devices and fifos. When unset they are skipped and counted in
    /// [`LayerSummary::skipped_special_files`](crate::LayerSummary::skipped_special_files).
    pub special_files: bool,
    /// The backend that writes regular files.
    pub backend: IoBackendKind,
    /// Threads that create and write a layer's small regular files with the std backend
    /// ([`ParallelBackend`](crate::ParallelBackend)), while the extracting thread parses the tar
    /// and does everything else in order; `1` writes them on the extracting thread, `0` chooses
    /// ([`write_threads_for`](Self::write_threads_for)). Used for a layer extracted into an empty
    /// directory (as the pipeline does), not by the io_uring backend.
    pub write_threads: usize,
}

impl ExtractOptions {
    /// `chown` and `special_files` only when running as root (effective uid 0), the std backend,
    /// write threads chosen per destination (`0`).
    pub fn for_current_user() -> Self {
        let root = rustix::process::geteuid().is_root();
        Self {
            chown: root,
            special_files: root,
            backend: IoBackendKind::Std,
            write_threads: 0,
        }
    }

    /// The write threads for a layer extracted into `target`: `write_threads` when set, else one
    /// per core (at most 4) on tmpfs and 1 on other file systems.
    ///
    /// Measured (docs/performance.md): on tmpfs two threads create small files at twice the rate
    /// of one. On the ext4 disks of the benchmark VMs (no journal) two threads were 12-23% slower
    /// end to end after earlier deletes: inode allocation then scans for inodes not deleted
    /// recently (`recently_deleted`, `find_inode_bit`), and two threads contend there.
    pub fn write_threads_for(&self, target: &std::path::Path) -> usize {
        if self.write_threads > 0 {
            return self.write_threads;
        }
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        match rustix::fs::statfs(target) {
            // `f_type` is i64 on x86-64 glibc, another integer type elsewhere.
            #[allow(clippy::unnecessary_cast)]
            Ok(stat) if stat.f_type as i64 == TMPFS_MAGIC => Self::default_write_threads(),
            _ => 1,
        }
    }

    /// One write thread per core, at most 4.
    pub fn default_write_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |cores| cores.get().min(4))
    }
}

impl Default for ExtractOptions {
    fn default() -> Self {
        Self::for_current_user()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn write_threads_are_chosen_per_file_system_unless_set() {
        let auto = ExtractOptions::for_current_user();
        assert_eq!(auto.write_threads, 0);
        let set = ExtractOptions {
            write_threads: 3,
            ..auto.clone()
        };
        assert_eq!(set.write_threads_for(Path::new("/")), 3);
        let is_tmpfs = |path: &str| {
            rustix::fs::statfs(path).is_ok_and(|stat| {
                #[allow(clippy::unnecessary_cast)]
                let kind = stat.f_type as i64;
                kind == 0x0102_1994
            })
        };
        for path in ["/dev/shm", env!("CARGO_MANIFEST_DIR")] {
            let expected = if is_tmpfs(path) {
                ExtractOptions::default_write_threads()
            } else {
                1
            };
            assert_eq!(auto.write_threads_for(Path::new(path)), expected, "{path}");
        }
        // A destination that cannot be inspected gets one thread.
        assert_eq!(auto.write_threads_for(Path::new("/no/such/dir")), 1);
    }
}
