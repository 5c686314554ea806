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
    /// `/proc/sys/kernel/io_uring_disabled`), missing operations (kernel older than 5.19). An
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
    /// and does everything else in order; `1` (or `0`) writes them on the extracting thread.
    /// Used for a layer extracted into an empty directory (as the pipeline does), not by the
    /// io_uring backend.
    pub write_threads: usize,
}

impl ExtractOptions {
    /// `chown` and `special_files` only when running as root (effective uid 0), the std backend,
    /// [`default_write_threads`](Self::default_write_threads).
    pub fn for_current_user() -> Self {
        let root = rustix::process::geteuid().is_root();
        Self {
            chown: root,
            special_files: root,
            backend: IoBackendKind::Std,
            write_threads: Self::default_write_threads(),
        }
    }

    /// One write thread per core (at most 4): file creation scales with cores on tmpfs and ext4.
    pub fn default_write_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |cores| cores.get().min(4))
    }
}

impl Default for ExtractOptions {
    fn default() -> Self {
        Self::for_current_user()
    }
}
