//! The io_uring backend: file data written by the kernel while the extractor goes on.
//!
//! Every regular file is created with a plain `openat` (so its name exists at once, exactly as
//! with the std backend, and the extractor never has to wait for it), its data is read into
//! buffers the backend owns and queued as positioned WRITEs ([`BUFFER_SIZE`], 256 KiB, each; at
//! most [`MAX_IN_FLIGHT_BYTES`] in flight). The kernel takes many of them per `io_uring_enter`;
//! on tmpfs and ext4 buffered writes are run by io_uring's worker threads, so the copy into the
//! page cache runs on another core while the next entries are parsed. When a file's writes have
//! completed, its metadata (owner, mode, xattrs, mtime: io_uring has no operation for them) is
//! applied through its own descriptor, which is then closed by a CLOSE batched into the next
//! submission.
//! Applying metadata through the descriptor rather than by name keeps later entries that replace
//! the name, or its directory, from being affected.
//!
//! Directories, symlinks, hardlinks, renames and unlinks go through the same ring (MKDIRAT,
//! SYMLINKAT, LINKAT, RENAMEAT, UNLINKAT) where the kernel has the operation, and are plain system
//! calls otherwise (probed once per process). Each is submitted alone and waited for: its result
//! (`EEXIST`, `EISDIR`, ...) decides what the caller does next. They need not wait for the pending
//! file work: that work goes through the files' own descriptors, never by name, so creating,
//! renaming or removing a name (even a pending file's) cannot change what it does, exactly as with
//! the std backend, where the same file's data would already be written.
//!
//! Measured alternative (see `docs/io-uring.md`): a linked `OPENAT (direct descriptor) -> WRITE ->
//! CLOSE` chain per file, metadata by name afterwards. It was slower: io_uring never runs an
//! `O_CREAT` open inline, so every file cost a hand-off to a worker thread, and metadata by name
//! forced a barrier before any later entry of the same directory and name.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::io::{self, BufRead};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::OnceLock;

use io_uring::{IoUring, Probe, cqueue, opcode, squeue, types};
use rustix::io::Errno;
use tracing::debug;

use crate::backend::{
    BUFFER_SIZE, FileMetadata, IoBackend, NewFile, apply_file_metadata, create_replacing, fill,
    preallocate, syscall,
};
use crate::error::{ExtractError, entry_path, io_error};
use crate::metadata::XattrPolicy;
use crate::summary::{Timestamp, Xattr};

/// Submission queue entries (the completion queue gets twice as many).
const RING_ENTRIES: u32 = 256;
/// Bytes of file data the kernel may still be reading from our buffers; past it we wait.
pub(crate) const MAX_IN_FLIGHT_BYTES: usize = 32 << 20;
/// Spare [`BUFFER_SIZE`] buffers kept for big files: as many as can be in flight, so that a big
/// file does not allocate (mmap, fault in, unmap) a fresh buffer per chunk.
const POOLED_BUFFERS: usize = MAX_IN_FLIGHT_BYTES / BUFFER_SIZE;

/// `user_data` of a WRITE: the file in bits 32..64, the buffer in bits 0..32. A CLOSE has
/// [`CLOSE_DATA`] (nothing to do when it completes), the namespace operation being waited for
/// [`NAMESPACE_DATA`]. Neither can be a WRITE's: files and buffers are numbered from 0 and only
/// entries in flight (at most the CQ size) hold a number.
const CLOSE_DATA: u64 = u64::MAX;
const NAMESPACE_DATA: u64 = u64::MAX - 1;

/// The namespace operations the ring runs; the others are plain system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NamespaceOps {
    pub(crate) mkdir: bool,
    pub(crate) symlink: bool,
    pub(crate) link: bool,
    pub(crate) rename: bool,
    pub(crate) unlink: bool,
}

impl NamespaceOps {
    /// Every namespace operation as a system call.
    #[cfg(test)]
    pub(crate) const NONE: Self = Self {
        mkdir: false,
        symlink: false,
        link: false,
        rename: false,
        unlink: false,
    };

    /// `(opcode name, on the ring)` of each operation.
    fn names(self) -> [(&'static str, bool); 5] {
        [
            ("MKDIRAT", self.mkdir),
            ("SYMLINKAT", self.symlink),
            ("LINKAT", self.link),
            ("RENAMEAT", self.rename),
            ("UNLINKAT", self.unlink),
        ]
    }
}

/// Whether io_uring can be used here, probed once per process: the ring is set up, the
/// operations the backend needs are probed. `Ok` says which namespace operations the ring has.
pub(crate) fn availability() -> &'static Result<NamespaceOps, String> {
    static PROBE: OnceLock<Result<NamespaceOps, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let result = probe();
        match &result {
            Ok(ops) => {
                debug!("io_uring is available");
                let missing: Vec<&str> = ops
                    .names()
                    .into_iter()
                    .filter(|(_, supported)| !supported)
                    .map(|(name, _)| name)
                    .collect();
                if !missing.is_empty() {
                    debug!(
                        missing = %missing.join(", "),
                        "io_uring lacks these namespace operations; they stay plain system calls"
                    );
                }
            }
            Err(reason) => debug!(%reason, "io_uring is unavailable"),
        }
        result
    })
}

fn probe() -> Result<NamespaceOps, String> {
    let ring: IoUring = IoUring::new(8).map_err(|error| setup_failure(&error))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|error| format!("probing io_uring operations: {error} (needs Linux 5.6)"))?;
    let missing: Vec<&str> = [
        ("WRITE", opcode::Write::CODE),
        ("CLOSE", opcode::Close::CODE),
    ]
    .into_iter()
    .filter(|(_, code)| !probe.is_supported(*code))
    .map(|(name, _)| name)
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "io_uring lacks {} (kernel too old)",
            missing.join(", ")
        ));
    }
    // Optional: without one, that operation stays a system call. IORING_FEAT_SUBMIT_STABLE (5.5,
    // older than all of them) guarantees the kernel has copied an entry's paths once it took the
    // entry, which a failed wait relies on (see `UringBackend::run`).
    let stable = ring.params().is_feature_submit_stable();
    let has = |code| stable && probe.is_supported(code);
    Ok(NamespaceOps {
        mkdir: has(opcode::MkDirAt::CODE),
        symlink: has(opcode::SymlinkAt::CODE),
        link: has(opcode::LinkAt::CODE),
        rename: has(opcode::RenameAt::CODE),
        unlink: has(opcode::UnlinkAt::CODE),
    })
}

/// Why `io_uring_setup` failed, with the sysctl that usually explains it.
fn setup_failure(error: &io::Error) -> String {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|value| value.trim().to_owned())
        .unwrap_or_else(|_| "absent".to_owned());
    let cause = match error.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel has no io_uring, or a seccomp filter hides it",
        Some(libc::EPERM) => {
            "refused: kernel.io_uring_disabled (1 = root or io_uring_group only, 2 = off) or a seccomp filter"
        }
        Some(libc::ENOMEM) => "not enough locked memory (RLIMIT_MEMLOCK) for the ring",
        _ => "unexpected error",
    };
    format!("io_uring_setup failed: {error}; {cause} (kernel.io_uring_disabled = {disabled})")
}

/// A file whose writes are queued or running.
#[derive(Debug)]
struct PendingFile {
    /// Open until the metadata is applied; then closed by a CLOSE in the ring.
    fd: OwnedFd,
    entry: Vec<u8>,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    mtime: Timestamp,
    xattrs: Vec<Xattr>,
    /// WRITEs pushed to the ring and not completed yet.
    ops: u32,
    /// No more WRITEs will be queued for it.
    queued_all: bool,
    failure: Option<io::Error>,
}

/// Writes file data through io_uring and runs the namespace operations the kernel's io_uring has;
/// see the module documentation.
pub struct UringBackend {
    ring: IoUring,
    /// The namespace operations run on the ring (the others are system calls).
    ops: NamespaceOps,
    /// The result of the namespace operation being waited for, once its completion is reaped.
    namespace_result: Option<i32>,
    /// Namespace operations run on the ring so far.
    namespace_ops: u64,
    /// Waiting for a namespace operation failed: the ring is never entered again, so that an
    /// entry still queued, which points to the caller's names, is never submitted.
    broken: bool,
    xattrs: XattrPolicy,
    files: Vec<Option<PendingFile>>,
    free_files: Vec<u32>,
    /// Buffers of WRITEs in flight by id (the buffer and the length written from it).
    buffers: Vec<Option<(Vec<u8>, u32)>>,
    free_buffers: Vec<u32>,
    /// Spare [`BUFFER_SIZE`] buffers.
    pool: Vec<Vec<u8>>,
    /// Entries pushed and not completed (queued or submitted).
    in_flight_ops: usize,
    in_flight_bytes: usize,
    /// The first failure of deferred work, returned by the next call.
    error: Option<ExtractError>,
    replaced: bool,
    /// Whether files of 8 MiB and more get their blocks before their writes are queued.
    preallocate: bool,
    /// Files whose writes completed, to finish outside the reaping loop.
    done: VecDeque<u32>,
    /// Dropping: completions only release resources.
    draining: bool,
}

impl std::fmt::Debug for UringBackend {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("UringBackend")
            .field("in_flight_ops", &self.in_flight_ops)
            .field("in_flight_bytes", &self.in_flight_bytes)
            .field("ops", &self.ops)
            .field("namespace_ops", &self.namespace_ops)
            .finish_non_exhaustive()
    }
}

impl UringBackend {
    /// Sets up a ring of its own. `chown` makes a refused `security.capability` xattr an error
    /// (see [`ExtractOptions::chown`](crate::ExtractOptions::chown)).
    pub fn new(chown: bool) -> io::Result<Self> {
        let ops = match availability() {
            Ok(ops) => *ops,
            Err(reason) => return Err(io::Error::new(io::ErrorKind::Unsupported, reason.clone())),
        };
        Ok(Self {
            ring: IoUring::new(RING_ENTRIES)?,
            ops,
            namespace_result: None,
            namespace_ops: 0,
            broken: false,
            xattrs: XattrPolicy::new(chown),
            files: Vec::new(),
            free_files: Vec::new(),
            buffers: Vec::new(),
            free_buffers: Vec::new(),
            pool: Vec::new(),
            in_flight_ops: 0,
            in_flight_bytes: 0,
            error: None,
            replaced: false,
            preallocate: false,
            done: VecDeque::new(),
            draining: false,
        })
    }

    /// The same backend, allocating the blocks of files of 8 MiB and more before writing them
    /// when `preallocate` ([`preallocation_helps`](crate::preallocation_helps) says where).
    pub fn preallocating(mut self, preallocate: bool) -> Self {
        self.preallocate = preallocate;
        self
    }

    fn check(&mut self) -> Result<(), ExtractError> {
        match self.error.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn file(&mut self, index: u32) -> &mut PendingFile {
        self.files[index as usize]
            .as_mut()
            .expect("a completion for a file that is still pending")
    }

    /// Makes room for one more submission and `bytes` more in flight.
    fn reserve(&mut self, bytes: usize) -> Result<(), ExtractError> {
        let cq_capacity = self.ring.params().cq_entries() as usize;
        loop {
            if self.in_flight_ops > 0
                && (self.in_flight_ops >= cq_capacity
                    || self.in_flight_bytes + bytes > MAX_IN_FLIGHT_BYTES)
            {
                self.enter(1)?;
                // May queue CLOSEs: check the submission queue again.
                self.finish_done();
            } else if self.ring.submission().is_full() {
                self.submit()?;
            } else {
                return Ok(());
            }
        }
    }

    fn submit(&mut self) -> Result<(), ExtractError> {
        self.enter(0)
    }

    /// Submits what is queued, waits for at least `want` completions and takes every available one.
    fn enter(&mut self, want: usize) -> Result<(), ExtractError> {
        if self.broken {
            return Err(io_error(
                b"",
                "submitting to io_uring in",
                io::Error::other("waiting for an earlier operation failed"),
            ));
        }
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => break,
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                // The completion queue is full: reap, then retry.
                Err(error) if error.raw_os_error() == Some(libc::EBUSY) => self.reap(),
                Err(error) => return Err(io_error(b"", "submitting to io_uring in", error)),
            }
        }
        self.reap();
        Ok(())
    }

    fn reap(&mut self) {
        let completions: Vec<cqueue::Entry> = self.ring.completion().collect();
        for completion in completions {
            self.complete(completion.user_data(), completion.result());
        }
    }

    fn complete(&mut self, user_data: u64, result: i32) {
        self.in_flight_ops -= 1;
        if user_data == NAMESPACE_DATA {
            debug_assert!(
                self.namespace_result.is_none(),
                "one namespace operation at a time"
            );
            self.namespace_result = Some(result);
            return;
        }
        if user_data == CLOSE_DATA {
            // close(2) errors after the data was written and the metadata applied are not
            // actionable (std ignores them when dropping a file too).
            return;
        }
        let index = (user_data >> 32) as u32;
        let buffer = user_data as u32;
        let (data, length) = self.buffers[buffer as usize]
            .take()
            .expect("a completion for a buffer in flight");
        self.free_buffers.push(buffer);
        self.in_flight_bytes -= length as usize;
        if data.capacity() == BUFFER_SIZE && self.pool.len() < POOLED_BUFFERS {
            self.pool.push(data);
        }
        let file = self.file(index);
        if file.failure.is_none() {
            if result < 0 {
                file.failure = Some(io::Error::from_raw_os_error(-result));
            } else if result as u32 != length {
                // A short write to a regular file means the file system is full.
                file.failure = Some(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        file.ops -= 1;
        if file.ops == 0 && file.queued_all {
            self.done.push_back(index);
        }
    }

    /// Applies the metadata of every file whose writes completed and closes it.
    fn finish_done(&mut self) {
        while let Some(index) = self.done.pop_front() {
            let file = self.files[index as usize]
                .take()
                .expect("a completed file is pending");
            self.free_files.push(index);
            if self.draining {
                continue;
            }
            if let Err(error) = self.finish(file)
                && self.error.is_none()
            {
                self.error = Some(error);
            }
        }
    }

    fn finish(&mut self, file: PendingFile) -> Result<(), ExtractError> {
        if let Some(source) = file.failure {
            return Err(io_error(&file.entry, "writing", source));
        }
        let metadata = FileMetadata {
            mode: file.mode,
            owner: file.owner,
            mtime: file.mtime,
            xattrs: &file.xattrs,
        };
        apply_file_metadata(file.fd.as_fd(), &metadata, &mut self.xattrs, &file.entry)?;
        if self.ring.submission().is_full() {
            drop(file.fd);
        } else {
            let raw = file.fd.into_raw_fd();
            let close = opcode::Close::new(types::Fd(raw))
                .build()
                .user_data(CLOSE_DATA);
            // SAFETY: the descriptor was given up by `into_raw_fd`: the CLOSE owns it and nothing
            // else uses or closes it. It points to no memory.
            let pushed = unsafe { self.ring.submission().push(&close) };
            match pushed {
                Ok(()) => self.in_flight_ops += 1,
                // SAFETY: not queued, so still ours alone.
                Err(_) => drop(unsafe { OwnedFd::from_raw_fd(raw) }),
            }
        }
        Ok(())
    }

    /// Queues a WRITE of `data[..length]` at `offset` for file `index`, taking the buffer.
    fn queue_write(
        &mut self,
        index: u32,
        data: Vec<u8>,
        length: usize,
        offset: u64,
    ) -> Result<(), ExtractError> {
        self.reserve(length)?;
        let raw = self.file(index).fd.as_raw_fd();
        let buffer = match self.free_buffers.pop() {
            Some(buffer) => buffer,
            None => {
                self.buffers.push(None);
                (self.buffers.len() - 1) as u32
            }
        };
        let pointer = data.as_ptr();
        self.buffers[buffer as usize] = Some((data, length as u32));
        let write = opcode::Write::new(types::Fd(raw), pointer, length as u32)
            .offset(offset)
            .build()
            .user_data((u64::from(index) << 32) | u64::from(buffer));
        // SAFETY: the buffer is owned by `self.buffers` until this write's completion is reaped
        // (its heap allocation does not move when the table grows), and `Drop` waits for every
        // operation in flight; the descriptor is owned by the pending file, which is only closed
        // after all its writes completed.
        let pushed = unsafe { self.ring.submission().push(&write) };
        assert!(pushed.is_ok(), "reserve made room in the submission queue");
        self.in_flight_ops += 1;
        self.in_flight_bytes += length;
        self.file(index).ops += 1;
        Ok(())
    }
}

impl IoBackend for UringBackend {
    fn write_file(
        &mut self,
        file: &NewFile<'_>,
        data: &mut dyn BufRead,
    ) -> Result<u64, ExtractError> {
        self.check()?;
        // An existing name is removed through the ring (UNLINKAT), like any other unlink.
        let (fd, replaced) =
            create_replacing(self, file.parent.as_fd(), file.name, file.create_mode)
                .map_err(|errno| io_error(file.entry, "creating file", errno))?;
        self.replaced |= replaced;
        if self.preallocate {
            preallocate(fd.as_fd(), file.size);
        }
        let read_error = |source| ExtractError::Tar {
            entry: entry_path(file.entry),
            source,
        };
        if file.size == 0 {
            // Nothing to write: done now, as the std backend would.
            apply_file_metadata(fd.as_fd(), &file.metadata, &mut self.xattrs, file.entry)?;
            return Ok(0);
        }
        let index = self.add_file(fd, file);
        let mut offset = 0u64;
        let result = loop {
            // Small files get a buffer of their own size; big ones BUFFER_SIZE buffers from the
            // pool.
            let mut buffer = if file.size < BUFFER_SIZE as u64 {
                vec![0; file.size as usize]
            } else {
                self.pool.pop().unwrap_or_else(|| vec![0; BUFFER_SIZE])
            };
            let filled = match fill(&mut buffer, data) {
                Ok(filled) => filled,
                Err(source) => break Err(read_error(source)),
            };
            if filled == 0 {
                break Ok(());
            }
            if let Err(error) = self.queue_write(index, buffer, filled, offset) {
                break Err(error);
            }
            offset += filled as u64;
            if file.size >= BUFFER_SIZE as u64 {
                // Let the kernel start on a big file's chunk while the next one is read.
                if let Err(error) = self.submit() {
                    break Err(error);
                }
                self.finish_done();
            }
            if offset >= file.size {
                break Ok(());
            }
        };
        let pending = self.file(index);
        pending.queued_all = true;
        if pending.ops == 0 {
            self.done.push_back(index);
        }
        self.finish_done();
        result?;
        self.check()?;
        Ok(offset)
    }

    fn flush(&mut self) -> Result<(), ExtractError> {
        while self.in_flight_ops > 0 || !self.ring.submission().is_empty() {
            self.enter(1)?;
            // Finishing files queues their CLOSEs: loop until those completed too.
            self.finish_done();
        }
        self.check()
    }

    fn has_pending(&self) -> bool {
        self.in_flight_ops > 0
    }

    fn take_replaced(&mut self) -> bool {
        std::mem::take(&mut self.replaced)
    }

    fn mkdir(&mut self, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
        if !self.ops.mkdir {
            return syscall::mkdir(dir, name, mode);
        }
        let entry = opcode::MkDirAt::new(types::Fd(dir.as_raw_fd()), name.as_ptr())
            .mode(mode)
            .build();
        // SAFETY: `dir` and `name` are borrowed until this call returns.
        syscall::gated(|| unsafe { self.run(entry) })
    }

    fn symlink(&mut self, target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        if !self.ops.symlink {
            return syscall::symlink(target, dir, name);
        }
        let entry =
            opcode::SymlinkAt::new(types::Fd(dir.as_raw_fd()), target.as_ptr(), name.as_ptr())
                .build();
        // SAFETY: `target`, `dir` and `name` are borrowed until this call returns.
        syscall::gated(|| unsafe { self.run(entry) })
    }

    fn link(
        &mut self,
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
    ) -> Result<(), Errno> {
        if !self.ops.link {
            return syscall::link(old_dir, old_name, new_dir, new_name);
        }
        let entry = opcode::LinkAt::new(
            types::Fd(old_dir.as_raw_fd()),
            old_name.as_ptr(),
            types::Fd(new_dir.as_raw_fd()),
            new_name.as_ptr(),
        )
        .build();
        // SAFETY: both directories and both names are borrowed until this call returns.
        unsafe { self.run(entry) }
    }

    fn rename(
        &mut self,
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        if !self.ops.rename {
            return syscall::rename(old_dir, old_name, new_dir, new_name, noreplace);
        }
        let entry = opcode::RenameAt::new(
            types::Fd(old_dir.as_raw_fd()),
            old_name.as_ptr(),
            types::Fd(new_dir.as_raw_fd()),
            new_name.as_ptr(),
        )
        .flags(if noreplace { libc::RENAME_NOREPLACE } else { 0 })
        .build();
        // SAFETY: both directories and both names are borrowed until this call returns.
        unsafe { self.run(entry) }
    }

    fn unlink(&mut self, dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> Result<(), Errno> {
        if !self.ops.unlink {
            return syscall::unlink(dir, name, remove_dir);
        }
        let entry = opcode::UnlinkAt::new(types::Fd(dir.as_raw_fd()), name.as_ptr())
            .flags(if remove_dir { libc::AT_REMOVEDIR } else { 0 })
            .build();
        // SAFETY: `dir` and `name` are borrowed until this call returns.
        unsafe { self.run(entry) }
    }
}

impl UringBackend {
    /// Runs one namespace operation on the ring and waits for it: the caller needs its result
    /// before going on. WRITE and CLOSE completions reaped meanwhile are handled as usual (and
    /// files whose writes completed are finished afterwards). A failure of the ring itself is kept
    /// for the next `write_file` or `flush` and returned as its errno.
    ///
    /// # Safety
    ///
    /// The names and directory descriptors `entry` refers to must stay valid until this returns.
    unsafe fn run(&mut self, entry: squeue::Entry) -> Result<(), Errno> {
        if let Err(error) = self.reserve(0) {
            return Err(self.ring_failed(error));
        }
        let entry = entry.user_data(NAMESPACE_DATA);
        // SAFETY: what `entry` points to is valid until we return (the caller's promise), and we
        // return once its completion is reaped, or when waiting failed: then `broken` keeps the
        // ring from being entered again, so an entry still queued is never submitted, while one
        // the kernel took had its names copied when it did (IORING_FEAT_SUBMIT_STABLE, required
        // by the probe).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        assert!(pushed.is_ok(), "reserve made room in the submission queue");
        self.in_flight_ops += 1;
        self.namespace_ops += 1;
        let result = loop {
            if let Some(result) = self.namespace_result.take() {
                break result;
            }
            if let Err(error) = self.enter(1) {
                self.broken = true;
                return Err(self.ring_failed(error));
            }
        };
        self.finish_done();
        if result < 0 {
            Err(Errno::from_raw_os_error(-result))
        } else {
            Ok(())
        }
    }

    /// Keeps `error` (the ring itself failed) for the next `write_file` or `flush`, and gives the
    /// errno for the namespace operation that met it.
    fn ring_failed(&mut self, error: ExtractError) -> Errno {
        let errno = match &error {
            ExtractError::Io { source, .. } => source.raw_os_error().map(Errno::from_raw_os_error),
            _ => None,
        };
        if self.error.is_none() {
            self.error = Some(error);
        }
        errno.unwrap_or(Errno::IO)
    }

    /// Namespace operations run on the ring so far (not those that fell back to system calls).
    #[cfg(test)]
    pub(crate) fn ring_namespace_ops(&self) -> u64 {
        self.namespace_ops
    }

    fn add_file(&mut self, fd: OwnedFd, file: &NewFile<'_>) -> u32 {
        let pending = PendingFile {
            fd,
            entry: file.entry.to_vec(),
            mode: file.metadata.mode,
            owner: file.metadata.owner,
            mtime: file.metadata.mtime,
            xattrs: file.metadata.xattrs.to_vec(),
            ops: 0,
            queued_all: false,
            failure: None,
        };
        match self.free_files.pop() {
            Some(index) => {
                self.files[index as usize] = Some(pending);
                index
            }
            None => {
                self.files.push(Some(pending));
                (self.files.len() - 1) as u32
            }
        }
    }
}

impl Drop for UringBackend {
    fn drop(&mut self) {
        // The kernel may still read buffers of writes in flight: wait for all of them before the
        // buffers are freed. If waiting fails, leak them instead.
        self.draining = true;
        if self.broken {
            debug!("the io_uring ring failed; leaking the buffers of writes in flight");
            std::mem::forget(std::mem::take(&mut self.buffers));
            return;
        }
        while self.in_flight_ops > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {
                    self.reap();
                    self.finish_done();
                }
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(error) if error.raw_os_error() == Some(libc::EBUSY) => self.reap(),
                Err(error) => {
                    debug!(%error, "cannot wait for io_uring writes; leaking their buffers");
                    std::mem::forget(std::mem::take(&mut self.buffers));
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    use std::sync::Arc;

    use rustix::fs::{Mode, OFlags};

    use super::*;
    use crate::options::ExtractOptions;

    /// A ring with every namespace operation, or `None` (said loudly) where the kernel lacks one.
    fn backend() -> Option<UringBackend> {
        match availability() {
            Ok(ops) if ops.names().iter().all(|(_, supported)| *supported) => {
                Some(UringBackend::new(false).unwrap())
            }
            Ok(ops) => {
                eprintln!("skipping: io_uring lacks some namespace operations: {ops:?}");
                None
            }
            Err(reason) => {
                eprintln!("skipping: io_uring unavailable: {reason}");
                None
            }
        }
    }

    /// An `O_PATH` directory descriptor, as the extractor's confined walks give.
    fn open_dir(path: &Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    fn ino(path: &Path) -> u64 {
        fs::symlink_metadata(path).unwrap().ino()
    }

    /// Runs every operation through `backend` in a fresh directory and checks the result on disk.
    fn exercise(backend: &mut UringBackend) {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let dir = open_dir(root);
        let dir = dir.as_fd();

        backend.mkdir(dir, c"d", 0o750).unwrap();
        assert!(fs::symlink_metadata(root.join("d")).unwrap().is_dir());
        let sub = open_dir(&root.join("d"));

        // Stored verbatim, never resolved.
        backend.symlink(c"../nowhere/x", dir, c"s").unwrap();
        assert_eq!(
            fs::read_link(root.join("s")).unwrap(),
            Path::new("../nowhere/x")
        );

        fs::write(root.join("f"), b"content of f").unwrap();
        backend.link(dir, c"f", dir, c"h").unwrap();
        assert_eq!(ino(&root.join("h")), ino(&root.join("f")));

        // Into another directory; with NOREPLACE and a free name it is a plain rename.
        backend
            .rename(dir, c"h", sub.as_fd(), c"moved", true)
            .unwrap();
        assert!(!root.join("h").exists());
        assert_eq!(ino(&root.join("d/moved")), ino(&root.join("f")));

        fs::write(root.join("g"), b"content of g").unwrap();
        assert_eq!(
            backend.rename(dir, c"g", dir, c"f", true),
            Err(Errno::EXIST)
        );
        assert_eq!(fs::read(root.join("f")).unwrap(), b"content of f");
        assert_eq!(fs::read(root.join("g")).unwrap(), b"content of g");
        backend.rename(dir, c"g", dir, c"f", false).unwrap();
        assert_eq!(fs::read(root.join("f")).unwrap(), b"content of g");
        assert!(!root.join("g").exists());

        // The symlink itself goes, not what it names.
        backend.unlink(dir, c"s", false).unwrap();
        assert!(fs::symlink_metadata(root.join("s")).is_err());
        // `remove_all_at` relies on EISDIR for a directory without AT_REMOVEDIR.
        assert_eq!(backend.unlink(dir, c"d", false), Err(Errno::ISDIR));
        backend.unlink(sub.as_fd(), c"moved", false).unwrap();
        backend.unlink(dir, c"d", true).unwrap();
        assert!(fs::symlink_metadata(root.join("d")).is_err());
        let mut left: Vec<_> = fs::read_dir(root)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["f"]);
        assert!(!backend.has_pending());
    }

    #[test]
    fn namespace_operations_run_on_the_ring() {
        let Some(mut backend) = backend() else {
            return;
        };
        exercise(&mut backend);
        // mkdir, symlink, link, 3 renames, 4 unlinks.
        assert_eq!(backend.ring_namespace_ops(), 10);
        backend.flush().unwrap();
    }

    #[test]
    fn missing_operations_fall_back_to_system_calls() {
        let Some(mut backend) = backend() else {
            return;
        };
        backend.ops = NamespaceOps::NONE;
        exercise(&mut backend);
        assert_eq!(backend.ring_namespace_ops(), 0);
    }

    #[test]
    fn namespace_errors_are_the_operations_errno() {
        let Some(mut backend) = backend() else {
            return;
        };
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        fs::create_dir(root.join("full")).unwrap();
        fs::write(root.join("full/file"), b"x").unwrap();
        fs::write(root.join("file"), b"x").unwrap();
        let dir = open_dir(root);
        let dir = dir.as_fd();
        let cases: [(&str, Result<(), Errno>, Errno); 10] = [
            (
                "mkdir over a directory",
                backend.mkdir(dir, c"full", 0o755),
                Errno::EXIST,
            ),
            (
                "mkdir over a file",
                backend.mkdir(dir, c"file", 0o755),
                Errno::EXIST,
            ),
            (
                "symlink over a file",
                backend.symlink(c"t", dir, c"file"),
                Errno::EXIST,
            ),
            (
                "link of nothing",
                backend.link(dir, c"missing", dir, c"new"),
                Errno::NOENT,
            ),
            (
                "link over a file",
                backend.link(dir, c"file", dir, c"full"),
                Errno::EXIST,
            ),
            (
                "rename of nothing",
                backend.rename(dir, c"missing", dir, c"new", false),
                Errno::NOENT,
            ),
            (
                "rename NOREPLACE over a directory",
                backend.rename(dir, c"file", dir, c"full", true),
                Errno::EXIST,
            ),
            (
                "unlink of nothing",
                backend.unlink(dir, c"missing", false),
                Errno::NOENT,
            ),
            (
                "rmdir of a full directory",
                backend.unlink(dir, c"full", true),
                Errno::NOTEMPTY,
            ),
            (
                "rmdir of a file",
                backend.unlink(dir, c"file", true),
                Errno::NOTDIR,
            ),
        ];
        for (what, result, errno) in cases {
            assert_eq!(result, Err(errno), "{what}");
        }
        assert_eq!(backend.ring_namespace_ops(), 10);
        // Failed operations leave nothing behind: the ring is idle and the backend usable.
        assert_eq!(backend.in_flight_ops, 0);
        assert!(!backend.has_pending());
        assert!(backend.error.is_none());
        backend.flush().unwrap();
        assert!(root.join("full/file").exists() && root.join("file").exists());
        assert!(!root.join("new").exists());
    }

    fn metadata(seconds: i64) -> FileMetadata<'static> {
        FileMetadata {
            mode: None,
            owner: None,
            mtime: Timestamp {
                seconds,
                nanoseconds: 0,
            },
            xattrs: &[],
        }
    }

    /// Namespace operations on names of files whose writes and closes are still in the ring: their
    /// completions are told apart, and the files land complete under their new names.
    #[test]
    fn namespace_operations_among_pending_writes() {
        let Some(mut backend) = backend() else {
            return;
        };
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let parent = Arc::new(open_dir(root));
        let big: Vec<u8> = (0..(3 << 20) + 4321).map(|i| (i % 251) as u8).collect();
        let write = |backend: &mut UringBackend, name: &CStr, data: &[u8], mtime| {
            let file = NewFile {
                parent: &parent,
                name,
                entry: name.to_bytes(),
                size: data.len() as u64,
                create_mode: 0o644,
                metadata: metadata(mtime),
            };
            let written = backend.write_file(&file, &mut &data[..]).unwrap();
            assert_eq!(written, data.len() as u64);
        };
        write(&mut backend, c"big", &big, 1_000_000_000);
        for index in 0..50u8 {
            let name = std::ffi::CString::new(format!("small{index}")).unwrap();
            write(&mut backend, &name, &[index; 100], 1_000_000_100);
        }
        assert!(backend.has_pending(), "writes or closes are in flight");
        let dir = parent.as_fd();
        backend.link(dir, c"big", dir, c"big-link").unwrap();
        backend
            .rename(dir, c"big", dir, c"big-moved", true)
            .unwrap();
        backend.unlink(dir, c"small7", false).unwrap();
        backend.mkdir(dir, c"small7", 0o755).unwrap();
        // A file replacing a pending one: removed through the ring too.
        write(&mut backend, c"small8", b"replaced", 1_000_000_200);
        assert!(backend.take_replaced());
        assert_eq!(backend.ring_namespace_ops(), 5);
        backend.flush().unwrap();
        assert!(!backend.has_pending());

        assert_eq!(fs::read(root.join("big-moved")).unwrap(), big);
        assert_eq!(ino(&root.join("big-link")), ino(&root.join("big-moved")));
        assert_eq!(
            fs::metadata(root.join("big-link")).unwrap().mtime(),
            1_000_000_000
        );
        assert!(!root.join("big").exists());
        assert!(root.join("small7").is_dir());
        assert_eq!(fs::read(root.join("small8")).unwrap(), b"replaced");
        assert_eq!(
            fs::metadata(root.join("small8")).unwrap().mtime(),
            1_000_000_200
        );
        assert_eq!(fs::read(root.join("small9")).unwrap(), [9u8; 100]);
    }

    /// Appends one entry to a layer being built.
    fn entry(
        builder: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        path: &str,
        link: Option<&str>,
        data: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_mtime(1_600_000_000);
        header.set_size(data.len() as u64);
        if let Some(link) = link {
            header.set_link_name(link).unwrap();
        }
        builder.append_data(&mut header, path, data).unwrap();
    }

    /// `extract_layer` and `merge_layer` with the uring backend send their directories, symlinks,
    /// hardlinks, renames and unlinks to the ring, and the trees come out right.
    #[test]
    fn extraction_and_merge_use_the_ring() {
        use tar::EntryType::{Directory, Link, Regular, Symlink};
        let Some(mut backend) = backend() else {
            return;
        };
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("root");
        let staged = temp.path().join("staged");
        fs::create_dir(&root).unwrap();
        fs::create_dir(&staged).unwrap();
        let options = ExtractOptions {
            chown: false,
            special_files: false,
            ..ExtractOptions::default()
        };

        // A layer's bytes extracted with `backend` (a source that lends nothing).
        let extract = |layer: &[u8], target: &Path, backend: &mut UringBackend| {
            crate::extract::extract_with(
                &mut crate::source::NoLending(layer),
                target,
                &options,
                backend,
            )
            .unwrap()
        };
        let mut base = tar::Builder::new(Vec::new());
        entry(&mut base, Directory, "a", None, b""); // mkdir
        entry(&mut base, Regular, "a/f", None, b"file");
        entry(&mut base, Symlink, "a/s", Some("f"), b""); // symlink
        entry(&mut base, Link, "a/h", Some("a/f"), b""); // link
        entry(&mut base, Regular, "b/c/file", None, b"old"); // mkdir b, mkdir b/c (implicit)
        entry(&mut base, Regular, "keep", None, b"kept");
        // mkdir (EEXIST), unlink the file, mkdir
        entry(&mut base, Directory, "a/h", None, b"");
        let base = base.into_inner().unwrap();
        let summary = extract(&base, &root, &mut backend);
        assert_eq!(backend.ring_namespace_ops(), 8);
        assert_eq!(summary.files, 3);
        assert_eq!(fs::read_link(root.join("a/s")).unwrap(), Path::new("f"));
        assert!(root.join("a/h").is_dir());
        assert_eq!(fs::read(root.join("b/c/file")).unwrap(), b"old");
        assert_eq!(fs::read(root.join("a/f")).unwrap(), b"file");

        let mut layer = tar::Builder::new(Vec::new());
        entry(&mut layer, Regular, "a/.wh.s", None, b""); // recorded, never created
        entry(&mut layer, Regular, "b/c/file", None, b"new");
        entry(&mut layer, Regular, "new/x", None, b"x");
        entry(&mut layer, Link, "keep-link", Some("keep"), b""); // deferred to the merge
        let layer = layer.into_inner().unwrap();
        let mut backend = UringBackend::new(false).unwrap();
        let summary = extract(&layer, &staged, &mut backend);
        // mkdir b, b/c, new (implicit parents in the staging directory)
        assert_eq!(backend.ring_namespace_ops(), 3);
        assert_eq!(summary.deferred_hardlinks.len(), 1);

        let mut backend = UringBackend::new(false).unwrap();
        let stats = crate::merge::merge_with(&root, &staged, &summary, &mut backend).unwrap();
        // Whiteout: unlink a/s. Merge: rename NOREPLACE of the directories b and b/c (EEXIST
        // each), one rename of the file b/c/file over the old one, rename NOREPLACE of new.
        // Deferred hardlink: link. Staging directory: unlink of it (EISDIR; b and b/c, which its
        // listing names as directories, get none), rmdir of b/c, b and itself.
        assert_eq!(backend.ring_namespace_ops(), 1 + 4 + 1 + 4);
        assert_eq!(stats.whiteouts_applied, 1);
        assert_eq!(stats.hardlinks_linked, 1);
        assert!(fs::symlink_metadata(root.join("a/s")).is_err());
        assert_eq!(fs::read(root.join("b/c/file")).unwrap(), b"new");
        assert_eq!(fs::read(root.join("new/x")).unwrap(), b"x");
        assert_eq!(ino(&root.join("keep-link")), ino(&root.join("keep")));
        assert!(!staged.exists());
    }
}
