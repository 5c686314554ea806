use crate::filesystem::{parallel_creation_scales, split_creation_helps};

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
    /// Threads that create and write a layer's small regular files with the std backend, the
    /// extracting thread (which parses the tar and does everything else in order) among them:
    /// `1` writes them on the extracting thread; `N` above 1 hands them to `N - 1` write threads
    /// ([`ParallelBackend`](crate::ParallelBackend)), and the extracting thread writes a batch
    /// itself whenever their queue is full; `0` chooses
    /// ([`write_threads_for`](Self::write_threads_for)). Used for a layer extracted into an empty
    /// directory (as the pipeline does), not by the io_uring backend. With one, where
    /// [`creates_on_extracting_thread`](Self::creates_on_extracting_thread), the extracting thread
    /// makes the files and a write thread of their own writes them.
    pub write_threads: usize,
    /// With one write thread ([`write_threads_for`](Self::write_threads_for) is 1): `Some(true)`
    /// makes each small regular file on the extracting thread, in tar order, and leaves its data,
    /// metadata and close to a write thread
    /// ([`ParallelBackend::creating_files_here`](crate::ParallelBackend::creating_files_here));
    /// `Some(false)` writes it all on the extracting thread; `None` chooses per destination
    /// ([`split_creation_helps`](crate::split_creation_helps): ext4 without a journal). Like
    /// write threads, used for a layer extracted into an empty directory with the std backend.
    pub create_on_extracting_thread: Option<bool>,
    /// Extractions given clones of one gate make their inodes one at a time: the `openat` that
    /// creates a regular file, `mkdirat` and `symlinkat` hold it, on the extracting thread and on
    /// its write threads alike. `None`: no gate. The pipeline shares one gate between the layers
    /// of a pull into anything but tmpfs, ramfs and ext4 with a journal
    /// ([`CreateGate::for_target`]).
    pub create_gate: Option<CreateGate>,
    /// Write the data of regular files of 8 MiB or more with `O_DIRECT`, straight to the device
    /// rather than into the page cache, where big files get their blocks first (ext4:
    /// [`preallocation_helps`](crate::preallocation_helps)), with the std backend (and the
    /// extracting thread of its write threads). For an extraction that is made durable
    /// afterwards: each write then waits for the device, which the `syncfs` would have waited
    /// for anyway, and the data is neither copied into the page cache nor written back from it.
    /// The pipeline sets it when a pull syncs (`--fsync end` or `layer`, and `auto` on a disk).
    ///
    /// A second thread writes each 4 MiB while the next is filled (decoded straight into its
    /// buffer where the source can), so a big file takes about as long as the device needs to
    /// write it.
    ///
    /// Measured (docs/performance.md, "What changed"): pulls of 1 GB in one file into ext4 took
    /// about 10% less time and 8-12% less CPU of the machine; with the second thread, extracting
    /// that file from a tar on tmpfs took a third to 40% less time, and pulls of the realistic image
    /// into ext4 3-6% less, in alternating pulls.
    pub direct_writes: bool,
}

/// Makes the inode-creating system calls of the extractions that share it one at a time.
///
/// Measured on the ext4 of the benchmark VMs (no journal), four layers extracted at once right
/// after a large delete: their inode allocations contend in ext4's scan past recently deleted
/// inodes, and the realistic image's pull spent 4.4-5.8 s of system time, 2.7-3.0 s with a gate
/// (docs/performance.md). Unlike a limit on the layers extracted at once, every layer keeps
/// decoding and downloading. With the io_uring backend, a `mkdirat` or `symlinkat` through the
/// ring also submits the file writes queued before it while it holds the gate.
#[derive(Debug, Clone, Default)]
pub struct CreateGate(std::sync::Arc<std::sync::Mutex<()>>);

impl CreateGate {
    /// A new gate, shared by cloning it.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new gate for extractions into `target` unless inodes made there by several threads at
    /// once were measured to be made faster ([`parallel_creation_scales`]: tmpfs, ramfs, ext4 with
    /// a journal, where creating from several threads at once is what makes small files fast);
    /// `None` there or when `target` cannot be inspected.
    pub fn for_target(target: &std::path::Path) -> Option<Self> {
        (parallel_creation_scales(target) == Some(false)).then(Self::new)
    }

    /// The gate for several layers extracted at once into `target`: the caller's `given` gate if
    /// there is one, else [`for_target`](Self::for_target). Clone the result into each layer's
    /// [`ExtractOptions::create_gate`] so that they share it.
    pub fn shared_for(given: Option<&CreateGate>, target: &std::path::Path) -> Option<Self> {
        given.cloned().or_else(|| Self::for_target(target))
    }

    /// Runs `work` holding the gate: no extraction that shares it makes an inode meanwhile.
    pub fn while_held<T>(&self, work: impl FnOnce() -> T) -> T {
        self.hold(work)
    }

    /// Runs `create` holding the gate.
    pub(crate) fn hold<T>(&self, create: impl FnOnce() -> T) -> T {
        // A panic while holding it poisons nothing that needs repair: the mutex guards no data.
        let _held = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        create()
    }
}

/// Gates are equal when they are clones of one gate.
impl PartialEq for CreateGate {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CreateGate {}

impl ExtractOptions {
    /// `chown` and `special_files` only when running as root (effective uid 0), the std backend,
    /// write threads and where files are made chosen per destination (`0`, `None`), no gate, no
    /// direct writes.
    pub fn for_current_user() -> Self {
        let root = rustix::process::geteuid().is_root();
        Self {
            chown: root,
            special_files: root,
            backend: IoBackendKind::Std,
            write_threads: 0,
            create_on_extracting_thread: None,
            create_gate: None,
            direct_writes: false,
        }
    }

    /// The write threads for a layer extracted into `target`, the extracting thread counted
    /// ([`write_threads`](Self::write_threads)): `write_threads` when set, else one per core (at
    /// most 4) where inodes made by several threads at once were measured to be made faster
    /// (tmpfs, ramfs, ext4 with a journal: [`parallel_creation_scales`]), and 1 elsewhere or when
    /// `target` cannot be inspected.
    ///
    /// Measured (docs/performance.md): on tmpfs two threads create small files at twice the rate
    /// of one, on ext4 with a journal 1.7x. On the ext4 disks of the benchmark VMs (no journal)
    /// two threads were 12-23% slower end to end after earlier deletes: inode allocation then
    /// scans for inodes not deleted recently (`recently_deleted`, `find_inode_bit`), and two
    /// threads contend there. Counting the extracting thread among them: on 2 cores one write
    /// thread sharing the files with the extracting thread extracted a 150k-file layer 7% faster
    /// into tmpfs (10 alternating rounds) than two write threads with the extracting thread
    /// waiting for them, and a scratch build of it 12% faster into ext4 with a journal (6 rounds;
    /// session 52, docs/performance.md).
    pub fn write_threads_for(&self, target: &std::path::Path) -> usize {
        if self.write_threads > 0 {
            return self.write_threads;
        }
        match parallel_creation_scales(target) {
            Some(true) => Self::default_write_threads(),
            _ => 1,
        }
    }

    /// Whether the small files of a layer extracted into `target` are made on the extracting
    /// thread and written by one write thread: only with one write thread
    /// ([`write_threads_for`](Self::write_threads_for)), and then as
    /// [`create_on_extracting_thread`](Self::create_on_extracting_thread) says, or where
    /// [`split_creation_helps`](crate::split_creation_helps) when it is `None`.
    pub fn creates_on_extracting_thread(&self, target: &std::path::Path) -> bool {
        self.write_threads_for(target) == 1
            && self
                .create_on_extracting_thread
                .unwrap_or_else(|| split_creation_helps(target) == Some(true))
    }

    /// Whether files of 8 MiB and more extracted into `target` are written with `O_DIRECT`:
    /// [`direct_writes`](Self::direct_writes) set and `target` on a file system where big files
    /// get their blocks first ([`preallocation_helps`](crate::preallocation_helps): ext4).
    pub fn direct_writes_into(&self, target: &std::path::Path) -> bool {
        self.direct_writes && crate::filesystem::preallocation_helps(target) == Some(true)
    }

    /// One thread writing small files per core, at most 4, the extracting thread counted.
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
        // tmpfs: one per core. (ext4 with and without a journal: tests/filesystems.rs.)
        if crate::filesystem_type(Path::new("/dev/shm")).as_deref() == Some("tmpfs") {
            assert_eq!(
                auto.write_threads_for(Path::new("/dev/shm")),
                ExtractOptions::default_write_threads()
            );
        }
        // A destination that cannot be inspected gets one thread.
        assert_eq!(auto.write_threads_for(Path::new("/no/such/dir")), 1);
        // Files made on the extracting thread: chosen per file system (ext4 without a journal:
        // tests/filesystems.rs), and only with one write thread.
        assert!(!auto.creates_on_extracting_thread(Path::new("/no/such/dir")));
        if crate::filesystem_type(Path::new("/dev/shm")).as_deref() == Some("tmpfs") {
            assert!(!auto.creates_on_extracting_thread(Path::new("/dev/shm")));
        }
        let here = ExtractOptions {
            create_on_extracting_thread: Some(true),
            ..auto.clone()
        };
        assert!(here.creates_on_extracting_thread(Path::new("/no/such/dir")));
        let here_but_three = ExtractOptions {
            write_threads: 3,
            ..here.clone()
        };
        assert!(!here_but_three.creates_on_extracting_thread(Path::new("/no/such/dir")));
        // Direct writes only when asked for, and only on ext4 (tests/filesystems.rs).
        let direct = ExtractOptions {
            direct_writes: true,
            ..auto.clone()
        };
        assert!(!auto.direct_writes_into(Path::new("/no/such/dir")));
        assert!(!direct.direct_writes_into(Path::new("/no/such/dir")));
        assert!(!direct.direct_writes_into(Path::new("/proc/self")));
    }

    #[test]
    fn a_create_gate_only_where_creation_does_not_scale_and_clones_are_one_gate() {
        if crate::filesystem_type(Path::new("/dev/shm")).as_deref() == Some("tmpfs") {
            assert_eq!(CreateGate::for_target(Path::new("/dev/shm")), None);
        }
        assert_eq!(CreateGate::for_target(Path::new("/no/such/dir")), None);
        let gate = CreateGate::new();
        assert_eq!(gate.clone(), gate);
        assert_ne!(CreateGate::new(), gate);
        // A caller's gate is kept even on tmpfs; without one, the target decides.
        assert_eq!(
            CreateGate::shared_for(Some(&gate), Path::new("/dev/shm")),
            Some(gate.clone())
        );
        assert_eq!(
            CreateGate::shared_for(None, Path::new(env!("CARGO_MANIFEST_DIR"))).is_some(),
            CreateGate::for_target(Path::new(env!("CARGO_MANIFEST_DIR"))).is_some()
        );
    }
}
