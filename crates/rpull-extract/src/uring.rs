//! The io_uring backend: file data written by the kernel while the extractor goes on.
//!
//! Every regular file is created with a plain `openat` (so its name exists at once, exactly as
//! with the std backend, and the extractor never has to wait for it), its data is read into
//! buffers the backend owns and queued as positioned WRITEs (1 MiB each, at most
//! [`MAX_IN_FLIGHT_BYTES`] in flight). The kernel takes many of them per `io_uring_enter`; on tmpfs
//! and ext4 buffered writes are run by io_uring's worker threads, so the copy into the page cache
//! runs on another core while the next entries are parsed. When a file's writes have completed,
//! its metadata (owner, mode, xattrs, mtime: io_uring has no operation for them) is applied
//! through its own descriptor, which is then closed by a CLOSE batched into the next submission.
//! Applying metadata through the descriptor rather than by name keeps later entries that replace
//! the name, or its directory, from being affected.
//!
//! Measured alternative (see `docs/io-uring.md`): a linked `OPENAT (direct descriptor) -> WRITE ->
//! CLOSE` chain per file, metadata by name afterwards. It was slower: io_uring never runs an
//! `O_CREAT` open inline, so every file cost a hand-off to a worker thread, and metadata by name
//! forced a barrier before any later entry of the same directory and name.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::OnceLock;

use io_uring::{IoUring, Probe, cqueue, opcode, types};
use tracing::debug;

use crate::backend::{
    BUFFER_SIZE, FileMetadata, IoBackend, NewFile, apply_file_metadata, create_replacing, fill,
};
use crate::error::{ExtractError, entry_path, io_error};
use crate::metadata::XattrPolicy;
use crate::summary::{Timestamp, Xattr};

/// Submission queue entries (the completion queue gets twice as many).
const RING_ENTRIES: u32 = 256;
/// Bytes of file data the kernel may still be reading from our buffers; past it we wait.
pub(crate) const MAX_IN_FLIGHT_BYTES: usize = 32 << 20;
/// Spare 1 MiB buffers kept for big files: as many as can be in flight, so that a big file does
/// not allocate (mmap, fault in, unmap) a fresh buffer per chunk.
const POOLED_BUFFERS: usize = MAX_IN_FLIGHT_BYTES / BUFFER_SIZE;

/// `user_data` of a WRITE: the file in bits 32..64, the buffer in bits 0..32. A CLOSE has
/// [`CLOSE_DATA`] (nothing to do when it completes).
const CLOSE_DATA: u64 = u64::MAX;

/// Whether io_uring can be used here, probed once per process: the ring is set up, the
/// operations the backend needs are probed.
pub(crate) fn availability() -> &'static Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let result = probe();
        match &result {
            Ok(()) => debug!("io_uring is available"),
            Err(reason) => debug!(%reason, "io_uring is unavailable"),
        }
        result
    })
}

fn probe() -> Result<(), String> {
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
    Ok(())
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

/// Writes file data through io_uring; see the module documentation.
pub struct UringBackend {
    ring: IoUring,
    xattrs: XattrPolicy,
    files: Vec<Option<PendingFile>>,
    free_files: Vec<u32>,
    /// Buffers of WRITEs in flight by id (the buffer and the length written from it).
    buffers: Vec<Option<(Vec<u8>, u32)>>,
    free_buffers: Vec<u32>,
    /// Spare 1 MiB buffers.
    pool: Vec<Vec<u8>>,
    /// Entries pushed and not completed (queued or submitted).
    in_flight_ops: usize,
    in_flight_bytes: usize,
    /// The first failure of deferred work, returned by the next call.
    error: Option<ExtractError>,
    replaced: bool,
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
            .finish_non_exhaustive()
    }
}

impl UringBackend {
    /// Sets up a ring of its own. `chown` makes a refused `security.capability` xattr an error
    /// (see [`ExtractOptions::chown`](crate::ExtractOptions::chown)).
    pub fn new(chown: bool) -> io::Result<Self> {
        if let Err(reason) = availability() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, reason.clone()));
        }
        Ok(Self {
            ring: IoUring::new(RING_ENTRIES)?,
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
            done: VecDeque::new(),
            draining: false,
        })
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
    fn write_file(&mut self, file: &NewFile<'_>, data: &mut dyn Read) -> Result<u64, ExtractError> {
        self.check()?;
        let fd = create_replacing(
            file.parent.as_fd(),
            file.name,
            file.create_mode,
            &mut self.replaced,
        )
        .map_err(|errno| io_error(file.entry, "creating file", errno))?;
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
            // Small files get a buffer of their own size; big ones 1 MiB buffers from the pool.
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
}

impl UringBackend {
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
