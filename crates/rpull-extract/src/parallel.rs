//! [`ParallelBackend`]: small regular files of a layer created and written by worker threads while
//! the extracting thread goes on parsing the tar.
//!
//! Extracting a layer of small files is almost all kernel time in `openat`, `write`, `futimens`
//! and `close` (90% of the samples of a 150k-file layer, docs/performance.md); tmpfs and ext4 run
//! those calls from two threads at nearly twice the rate of one, in the same directories or not.
//! So the extracting thread puts each small file into a batch and hands it to a worker: its data
//! as a view of the source's buffer when the source lends it ([`crate::LayerSource`], through
//! [`crate::extract_layer_from`]: a pull's decoded buffers, a [`crate::SharedReader`]), else
//! copied into the batch. Everything else (directories, symlinks, hardlinks, big files,
//! replacements) stays on the extracting thread, in tar order.
//!
//! **The extracting thread writes too.** When a worker's queue is full, the extracting thread
//! writes the batch it was about to send itself instead of waiting for room, unless the batch has
//! a name handed to a worker before it (then it waits, so that the name's entries are written in
//! tar order). So one worker and the extracting thread share the files in whatever proportion
//! keeps both busy, with no third thread taking turns with them on two cores, and the files the
//! extracting thread writes are copied from data it has just read, on its own core. Measured
//! (docs/performance.md, "What changed"): a 150k-file layer into tmpfs on a 2-vCPU host took
//! 0.606 s against 0.654 s with two workers and the extracting thread waiting (medians of 10
//! alternating rounds), the cores idle 0.04 CPU-s against 0.11.
//!
//! What keeps the result identical to a sequential extraction:
//!
//! * A file goes to the worker chosen by a hash of its (parent directory inode, name): two
//!   entries for the same name land on the same worker, in tar order.
//! * A batch the extracting thread writes itself holds no name that was pending when its files
//!   were queued: an earlier entry of that name may still be in a worker's queue. Such a batch
//!   waits for room in the queue instead.
//! * Every name handed to a worker and not yet known to be written is *pending*. A namespace
//!   operation on a pending name ([`IoBackend::mkdir`], [`symlink`](IoBackend::symlink),
//!   [`link`](IoBackend::link) to or from it) waits for all workers first ([`IoBackend::flush`]);
//!   a rename or unlink always does (it may remove a directory holding pending files). The
//!   extractor flushes before hardlinks and device nodes, which look at names on their own.
//! * A file whose name this layer made a directory or a symlink (which a replacement would remove,
//!   with the directory descriptors the extractor caches through them) is written on the
//!   extracting thread, after a flush, as [`StdBackend`] does, and reported by
//!   [`take_replaced`](IoBackend::take_replaced). A worker only ever replaces a regular file (an
//!   earlier entry of the same name, on the same worker) or a non-directory made by this layer;
//!   it never removes a directory.
//! * The target must be empty when the layer starts (a staging directory, or the root for layer
//!   0); otherwise [`new_backend`](crate::backend::new_backend) uses [`StdBackend`].
//!
//! **Creating on the extracting thread** ([`ParallelBackend::creating_files_here`]). Where making
//! an inode is most of a small file's cost and threads making them at once contend (ext4 without
//! a journal, after deletes: docs/performance.md), the extracting thread makes each queued file
//! itself (`openat`, in tar order) and hands the open descriptor to the worker, which writes the
//! data, sets the metadata and closes it. The name exists from then on, so a later entry of the
//! same name replaces it at once, as on the extracting thread; the inode it leaves open is still
//! written, then dropped with its last descriptor. Descriptors handed over are counted for the
//! whole process and held to [`open_created_limit`]; past it, a file is written on the extracting
//! thread.
//!
//! Memory: at most [`QUEUED_PER_LAYER`] batches queued in all (split evenly between the workers,
//! at least 2 each), plus one being filled and one being written per worker, each batch with at
//! most [`BATCH_BYTES`] of data: about 3 MiB of file data per layer with 1 or 2 workers, 4 MiB
//! with 4. Data held as views counts toward a batch's bytes as copies do, and keeps whole buffers
//! of the source alive: a lending source holds at most [`crate::LENT_BYTES`] of them lent at once
//! (its [`crate::Lender`]) and copies past that. Files above [`MAX_QUEUED_FILE`] are written by
//! the extracting thread.

use std::collections::HashSet;
use std::ffi::CStr;
use std::fmt;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::io::{self, BufRead, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use bytes::Bytes;
use rustix::fs::Mode;
use rustix::io::Errno;
use tracing::debug;

use crate::backend::{
    CREATE_FLAGS, DirectBuffer, FileMetadata, FileSource, IoBackend, NewFile, StdBackend,
    apply_file_metadata, syscall, write_all,
};
use crate::error::{ExtractError, entry_path, io_error};
use crate::metadata::XattrPolicy;
use crate::source::LENT_BYTES;
use crate::summary::{Timestamp, Xattr};

/// Files up to this size go to the workers; bigger ones are written by the extracting thread
/// (large writes gain nothing from a second thread, and would make batches large).
pub(crate) const MAX_QUEUED_FILE: u64 = 256 * 1024;
/// A batch is sent before a file would take its data past this many bytes (a queued file is never
/// bigger: [`MAX_QUEUED_FILE`] is at most this)...
const BATCH_BYTES: usize = 256 * 1024;
const _: () = assert!(MAX_QUEUED_FILE as usize <= BATCH_BYTES);
/// ... or when it holds this many files.
const BATCH_FILES: usize = 128;
/// Batches queued for the workers of one layer, split evenly between them
/// ([`queued_per_worker`]); past that the extracting thread writes a batch itself.
///
/// What is queued must outlast the extracting thread's waits for a core (from `perf sched
/// latency`: with every core busy writing, it waited 0.9 ms on average to run after a wake-up, up
/// to 3.7 ms). On tmpfs a batch of 128 small files is about 1.4 ms of a worker's work, so 8
/// batches are about 11 ms of it.
///
/// The queued batches' views must also stay well within the source's [`LENT_BYTES`]: each keeps
/// its source buffers lent, and past that budget the source stops lending and every file is copied
/// into its batch. The extracting thread writes only when the queue is full, so the queue stays
/// full: 32 batches (until session 53) held about the whole budget of 8 MiB, and 40% of a 150k-file
/// layer's files were copied; with 8, only the files that straddle two buffers are (2.5k). Measured
/// on 2 cores (docs/performance.md, "What changed", session 53): that extraction into /dev/shm took
/// 34 ms less (paired median of 16 alternating rounds, 13 of them faster) and 51 ms less CPU.
const QUEUED_PER_LAYER: usize = 8;
/// The views of every batch held at once (the queued ones, and one being filled and one being
/// written per worker, for up to 4 workers, the default's most) fit in the lending budget even
/// with each batch's data in two of the source's buffers of 256 KiB.
const _: () = assert!((QUEUED_PER_LAYER + 2 * 4) * 2 * BATCH_BYTES <= LENT_BYTES);

/// Batches queued per worker when a layer has `threads` of them.
fn queued_per_worker(threads: usize) -> usize {
    (QUEUED_PER_LAYER / threads.max(1)).max(2)
}

/// Descriptors of files made on the extracting thread and not yet closed by their worker, at most
/// this many in the whole process ([`open_created_limit`]), whatever the soft limit of open files.
/// 1024 is 8 full batches, about 10 ms of a worker's work on ext4 after a delete (where the
/// extracting thread, making the inodes, is the slower of the two and the queue seldom fills).
const MAX_OPEN_CREATED: usize = 1024;

/// Descriptors of files made on the extracting thread and not yet closed, in every backend of the
/// process ([`Created`]), held to [`open_created_limit`].
static OPEN_CREATED: OpenBudget = OpenBudget {
    open: AtomicUsize::new(0),
    limit: None,
};

/// How many files made on the extracting thread may wait open for their worker, in the whole
/// process: a quarter of the soft limit of open files (`RLIMIT_NOFILE`, read once), at most
/// [`MAX_OPEN_CREATED`]. Several layers are extracted at once, and the rest of the limit is left
/// for their directories, the downloads and the caller.
fn open_created_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        soft.map_or(MAX_OPEN_CREATED, |soft| {
            usize::try_from(soft / 4)
                .map_or(MAX_OPEN_CREATED, |quarter| quarter.min(MAX_OPEN_CREATED))
        })
    })
}

/// A count of open descriptors held to a limit ([`OPEN_CREATED`]).
struct OpenBudget {
    open: AtomicUsize,
    /// `None`: [`open_created_limit`].
    limit: Option<usize>,
}

impl OpenBudget {
    /// One more open, or `None` at the limit.
    fn take(&'static self) -> Option<CreatedSlot> {
        let limit = self.limit.unwrap_or_else(open_created_limit);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < limit).then_some(open + 1)
            })
            .ok()
            .map(|_| CreatedSlot(self))
    }
}

/// A place in an [`OpenBudget`], given back when dropped.
struct CreatedSlot(&'static OpenBudget);

impl Drop for CreatedSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A file made on the extracting thread, open until its worker has written it (or its batch is
/// dropped after an error).
struct Created {
    fd: OwnedFd,
    _slot: CreatedSlot,
}

/// A queued file's data: a range of its batch's arena (copied there), or a view of the source's
/// buffer that the source lent ([`crate::FileSource::lend_rest`]).
enum JobData {
    Arena((usize, usize)),
    View(Bytes),
}

/// One file of a batch: its name and entry path are ranges of the batch's buffers.
struct Job {
    parent: Arc<OwnedFd>,
    /// The file, when the extracting thread made it ([`ParallelBackend::creating_files_here`]).
    created: Option<Created>,
    data: JobData,
    /// NUL-terminated.
    name: (usize, usize),
    entry: (usize, usize),
    create_mode: u32,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    mtime: Timestamp,
    xattrs: Vec<Xattr>,
}

#[derive(Default)]
struct Batch {
    jobs: Vec<Job>,
    data: Arena,
    /// Bytes of the batch's files held as views (not in `data`).
    viewed: usize,
    names: Vec<u8>,
    /// A file of the batch has a name that was pending when it was queued: the batch goes
    /// through its worker's queue (after that name's earlier entry), never written by the
    /// extracting thread ([`ParallelBackend::send`]).
    follows_pending: bool,
}

impl Batch {
    /// Whether the batch is ready to send: [`BATCH_FILES`] files, or [`BATCH_BYTES`] of data.
    fn is_full(&self) -> bool {
        self.jobs.len() >= BATCH_FILES || self.bytes() >= BATCH_BYTES
    }

    /// Whether a file of `size` bytes would take the data of this batch, which has files, past
    /// [`BATCH_BYTES`]: it goes into the next one.
    fn has_no_room_for(&self, size: u64) -> bool {
        !self.jobs.is_empty() && (self.bytes() as u64).saturating_add(size) > BATCH_BYTES as u64
    }

    /// The batch's file data, copied or viewed.
    fn bytes(&self) -> usize {
        self.data.len() + self.viewed
    }

    /// Empties the batch for reuse, keeping its buffers.
    fn clear(&mut self) {
        self.jobs.clear();
        self.data.clear();
        self.viewed = 0;
        self.names.clear();
        self.follows_pending = false;
    }

    /// Writes the batch's files in order, as a worker does; after an error (this batch's or a
    /// worker's) skips the rest. Returns the first error of this batch.
    fn write(&mut self, shared: &Shared, xattrs: &mut XattrPolicy) -> Result<(), ExtractError> {
        for index in 0..self.jobs.len() {
            if shared.failed.load(Ordering::Acquire) {
                break;
            }
            // Closed as soon as it is written.
            let created = self.jobs[index].created.take();
            write_job(self, &self.jobs[index], created, xattrs)?;
        }
        Ok(())
    }
}

/// The file data of a batch: `bytes[..len]`. The bytes past `len` are initialized leftovers of
/// earlier batches (batches are recycled), which the next files overwrite in place: unlike
/// `read_to_end` into a cleared `Vec`, nothing is zeroed again before it is read into.
#[derive(Default)]
struct Arena {
    bytes: Vec<u8>,
    len: usize,
}

impl Arena {
    /// How much the arena grows (and zeroes) at a time: a step, not a doubling, so that only
    /// bytes about to be read into are touched and the resident size follows the data.
    const GROWTH: usize = 64 * 1024;

    fn len(&self) -> usize {
        self.len
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn get(&self, (start, end): (usize, usize)) -> &[u8] {
        &self.bytes[start..end]
    }

    /// Appends up to `limit` bytes of `data` (stopping at its end); returns how many. On an
    /// error nothing is appended.
    fn read_at_most(&mut self, data: &mut dyn Read, limit: usize) -> io::Result<usize> {
        let start = self.len;
        while self.len - start < limit {
            if self.len == self.bytes.len() {
                // Zeroed once, when the arena grows; reused as it is afterwards. (`resize` still
                // doubles the capacity, so growing by steps copies no more than doubling would.)
                self.bytes.resize(self.bytes.len() + Self::GROWTH, 0);
            }
            let end = self.bytes.len().min(start + limit);
            match data.read(&mut self.bytes[self.len..end]) {
                Ok(0) => break,
                Ok(read) => self.len += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.len = start;
                    return Err(error);
                }
            }
        }
        Ok(self.len - start)
    }
}

enum Message {
    Batch(Batch),
    /// Reply once everything before this message is done.
    Barrier(SyncSender<()>),
}

/// What the workers share with the extracting thread: the first error, and a flag to skip work
/// after it.
#[derive(Default)]
struct Shared {
    failed: AtomicBool,
    error: Mutex<Option<ExtractError>>,
    /// Tests hold the workers before each batch, to fill their queues.
    #[cfg(test)]
    pause: tests::Pause,
}

impl Shared {
    fn fail(&self, error: ExtractError) {
        let mut slot = self
            .error
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn take_error(&self) -> Option<ExtractError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take()
    }
}

struct Worker {
    sender: Option<SyncSender<Message>>,
    batch: Batch,
    thread: Option<JoinHandle<()>>,
}

/// Writes small regular files on `threads` worker threads; see the module documentation.
pub struct ParallelBackend {
    workers: Vec<Worker>,
    shared: Arc<Shared>,
    /// The extracting thread's own writer: big files, replacements of directories and symlinks.
    inline: StdBackend,
    /// Hashes of the (directory, name) keys handed to workers since the last flush. A collision
    /// only costs an unneeded flush.
    pending: KeySet,
    /// Hashes of the keys this layer made a directory or a symlink, never removed. A collision
    /// only sends a file to the extracting thread.
    made: KeySet,
    /// The last parent seen and its (device, inode), to stat each directory once per run of files.
    last_parent: Option<(Arc<OwnedFd>, (u64, u64))>,
    /// Recycled batch buffers.
    spare: Receiver<Batch>,
    replaced: bool,
    /// Set when a worker's error has been returned: the backend must not be used again.
    poisoned: bool,
    /// Queued files are made on the extracting thread ([`creating_files_here`](Self::creating_files_here)).
    create_here: bool,
    /// Where their descriptors are counted: [`OPEN_CREATED`] (tests give a budget of their own).
    budget: &'static OpenBudget,
    /// The extracting thread's xattr policy for the batches it writes itself.
    xattrs: XattrPolicy,
    /// Batches written by the extracting thread, and sent to workers, and files copied into a
    /// batch instead of lent as a view (for the debug line at the end).
    written_here: usize,
    sent: usize,
    copied: usize,
}

impl fmt::Debug for ParallelBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParallelBackend")
            .field("threads", &self.workers.len())
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// A set of [`key_hash`] values. They are SipHash already, so the set uses them as they are
/// instead of hashing them a second time.
type KeySet = HashSet<u64, BuildHasherDefault<KeyHasher>>;

/// The [`Hasher`] of [`KeySet`]: the `u64` written is the hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; anything else still gets a usable (FNV-style) hash.
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// The hash of the key (parent directory's device and inode, name) that `pending`, `made` and the
/// choice of worker go by. `DefaultHasher::new()` is SipHash with fixed keys: the same key always
/// goes to the same worker.
fn key_hash(directory: (u64, u64), name: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    directory.hash(&mut hasher);
    name.hash(&mut hasher);
    hasher.finish()
}

impl ParallelBackend {
    /// A backend with `threads` workers (at least 1). `chown` as for [`StdBackend::new`]. The
    /// workers create files under the [`CreateGate`](crate::CreateGate) of the extraction that
    /// makes the backend, if it has one.
    pub fn new(threads: usize, chown: bool) -> io::Result<Self> {
        let gate = syscall::current_gate();
        let shared = Arc::new(Shared::default());
        let queued = queued_per_worker(threads);
        let (recycle, spare) = sync_channel(threads.max(1) * (queued + 2));
        let mut workers = Vec::new();
        for index in 0..threads.max(1) {
            let (sender, receiver) = sync_channel(queued);
            let shared = Arc::clone(&shared);
            let recycle = recycle.clone();
            let gate = gate.clone();
            let thread = std::thread::Builder::new()
                .name(format!("rpull-write-{index}"))
                .spawn(move || {
                    let _gate = syscall::GateScope::enter(gate);
                    work(receiver, &shared, &recycle, chown)
                })?;
            workers.push(Worker {
                sender: Some(sender),
                batch: Batch::default(),
                thread: Some(thread),
            });
        }
        Ok(Self {
            workers,
            shared,
            inline: StdBackend::new(chown),
            pending: KeySet::default(),
            made: KeySet::default(),
            last_parent: None,
            spare,
            replaced: false,
            poisoned: false,
            create_here: false,
            budget: &OPEN_CREATED,
            xattrs: XattrPolicy::new(chown),
            written_here: 0,
            sent: 0,
            copied: 0,
        })
    }

    /// The same backend, making each queued file on the extracting thread (`openat`, under the
    /// gate if there is one) and leaving its data, metadata and close to the worker, when `here`
    /// (see the module documentation). For one worker where making inodes does not scale with
    /// threads ([`ExtractOptions::creates_on_extracting_thread`](crate::ExtractOptions::creates_on_extracting_thread)).
    ///
    /// Measured (docs/performance.md, "What changed"): a layer of 150k small files extracted into
    /// this project's VM's ext4 (no journal) right after a delete took 3.72-3.79 s this way against
    /// 4.90-5.15 s on the extracting thread alone (GNU tar 5.45-6.13 s), 4 alternating rounds.
    pub fn creating_files_here(mut self, here: bool) -> Self {
        self.create_here = here;
        self
    }

    /// The same backend, allocating the blocks of files of 8 MiB and more before writing them
    /// when `preallocate` (those are written by the extracting thread: see
    /// [`StdBackend::preallocating`]).
    pub fn preallocating(mut self, preallocate: bool) -> Self {
        self.inline.preallocate = preallocate;
        self
    }

    /// The same backend, writing files of 8 MiB and more past the page cache when `direct`
    /// (those are written by the extracting thread: see [`StdBackend::writing_direct`]).
    pub fn writing_direct(mut self, direct: bool) -> Self {
        self.inline.direct = direct.then(DirectBuffer::default);
        self
    }

    /// The (device, inode) of `dir`: from `last_parent` when it is that open descriptor (kept open
    /// there, so its number cannot have been reused), else `fstat`.
    fn identity(&self, dir: BorrowedFd<'_>) -> Result<(u64, u64), Errno> {
        match &self.last_parent {
            Some((last, identity)) if last.as_raw_fd() == dir.as_raw_fd() => Ok(*identity),
            _ => {
                let stat = rustix::fs::fstat(dir)?;
                Ok((stat.st_dev, stat.st_ino))
            }
        }
    }

    /// [`identity`](Self::identity) of a file's parent, which becomes `last_parent`: files come
    /// in runs of the same directory, so each directory is stat'ed once per run.
    fn directory_key(&mut self, parent: &Arc<OwnedFd>) -> Result<(u64, u64), Errno> {
        let identity = self.identity(parent.as_fd())?;
        if !matches!(&self.last_parent, Some((last, _)) if Arc::ptr_eq(last, parent)) {
            self.last_parent = Some((Arc::clone(parent), identity));
        }
        Ok(identity)
    }

    fn key_of(&self, dir: BorrowedFd<'_>, name: &CStr) -> Result<u64, Errno> {
        Ok(key_hash(self.identity(dir)?, name.to_bytes()))
    }

    /// Waits for the workers when `name` in `dir` may be a pending file.
    fn settle(&mut self, dir: BorrowedFd<'_>, name: &CStr) -> Result<u64, Errno> {
        let key = self.key_of(dir, name)?;
        if self.pending.contains(&key) {
            self.settle_all()?;
        }
        Ok(key)
    }

    /// Waits for the workers before a namespace operation. A worker's error stays for the next
    /// `write_file` or `flush` (the extractor flushes after a failed entry, so the deferred error,
    /// earlier in tar order, is the one reported); the operation fails with `EIO` meanwhile.
    fn settle_all(&mut self) -> Result<(), Errno> {
        if self.poisoned {
            return Err(Errno::IO);
        }
        self.wait_all().map_err(|_| Errno::IO)?;
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(Errno::IO);
        }
        Ok(())
    }

    /// Sends every partial batch, waits until the workers have done everything sent, and returns
    /// a worker's error (once: after that, as after any error, the workers write nothing more).
    fn barrier(&mut self) -> Result<(), ExtractError> {
        self.wait_all()?;
        self.worker_error()
    }

    /// A worker's error, once; the backend refuses files from then on.
    fn worker_error(&mut self) -> Result<(), ExtractError> {
        match self.shared.take_error() {
            Some(error) => {
                self.poisoned = true;
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// Sends every partial batch and waits until the workers have done everything sent.
    fn wait_all(&mut self) -> Result<(), ExtractError> {
        for index in 0..self.workers.len() {
            self.send(index)?;
        }
        self.drain();
        self.pending.clear();
        Ok(())
    }

    /// Before accepting a file: a worker's error (once), or a refusal after any error.
    fn check(&mut self) -> Result<(), ExtractError> {
        self.worker_error()?;
        if self.poisoned {
            return Err(poisoned());
        }
        Ok(())
    }

    /// Sends worker `index`'s batch if it has files; when the worker's queue is full, writes it
    /// on this thread instead, unless it follows a pending name (see the module documentation).
    fn send(&mut self, index: usize) -> Result<(), ExtractError> {
        if self.workers[index].batch.jobs.is_empty() {
            return Ok(());
        }
        let worker = &mut self.workers[index];
        // An empty batch (no allocation) until the sent one's place is taken by a recycled one.
        let batch = std::mem::take(&mut worker.batch);
        let Some(sender) = worker.sender.as_ref() else {
            return self.worker_gone();
        };
        let message = if batch.follows_pending {
            Message::Batch(batch)
        } else {
            match sender.try_send(Message::Batch(batch)) {
                Ok(()) => {
                    self.sent_from(index);
                    return Ok(());
                }
                Err(TrySendError::Full(Message::Batch(batch))) => {
                    return self.write_here(index, batch);
                }
                Err(TrySendError::Full(other) | TrySendError::Disconnected(other)) => other,
            }
        };
        if sender.send(message).is_err() {
            return self.worker_gone();
        }
        self.sent_from(index);
        Ok(())
    }

    /// Counts worker `index`'s batch as sent and gives the worker a recycled one to fill next.
    fn sent_from(&mut self, index: usize) {
        self.sent += 1;
        let mut fresh = self.spare.try_recv().unwrap_or_default();
        fresh.clear();
        self.workers[index].batch = fresh;
    }

    /// Writes `batch` (worker `index`'s, whose queue is full) on this thread. On an error, waits
    /// for what the workers have queued first, so that an error of theirs (earlier in tar order)
    /// is the one reported.
    fn write_here(&mut self, index: usize, mut batch: Batch) -> Result<(), ExtractError> {
        self.written_here += 1;
        let result = batch.write(&self.shared, &mut self.xattrs);
        // The worker's next batch to fill, its buffers reused.
        batch.clear();
        self.workers[index].batch = batch;
        if let Err(error) = result {
            self.drain();
            self.shared.fail(error);
        }
        Ok(())
    }

    /// Waits until the workers have done everything queued, sending nothing more.
    fn drain(&mut self) {
        let (done, wait) = sync_channel(self.workers.len());
        let mut expected = 0;
        for worker in &self.workers {
            if let Some(sender) = &worker.sender
                && sender.send(Message::Barrier(done.clone())).is_ok()
            {
                expected += 1;
            }
        }
        for _ in 0..expected {
            if wait.recv().is_err() {
                break;
            }
        }
    }

    /// The error for a worker that is gone (it panicked), or its own error if it left one.
    fn worker_gone(&mut self) -> Result<(), ExtractError> {
        self.check()?;
        Err(io_error(
            b"",
            "handing files to a write thread",
            io::Error::other("the write thread exited"),
        ))
    }

    /// Queues `file` (whose data is read here, to its end) for worker `index`, made here first
    /// when given a `slot` ([`creating_files_here`](Self::creating_files_here)). Returns `None`
    /// (nothing queued or made, `data` partly read into `spill`) when the data is longer than
    /// [`MAX_QUEUED_FILE`].
    fn queue(
        &mut self,
        index: usize,
        file: &NewFile<'_>,
        data: &mut dyn FileSource,
        spill: &mut Vec<u8>,
        slot: Option<CreatedSlot>,
        follows_pending: bool,
    ) -> Result<Option<u64>, ExtractError> {
        if self.workers[index].batch.has_no_room_for(file.size) {
            self.send(index)?;
        }
        let batch = &mut self.workers[index].batch;
        let start = batch.data.len();
        // A view when the source lends the file whole, else a copy into the batch's arena.
        let lent = if file.size > 0 {
            data.lend_rest()
        } else {
            None
        };
        let (job_data, read) = match lent {
            Some(view) => {
                let len = view.len();
                (JobData::View(view), len)
            }
            None => {
                self.copied += usize::from(file.size > 0);
                let read = batch
                    .data
                    .read_at_most(data, MAX_QUEUED_FILE as usize + 1)
                    .map_err(|source| ExtractError::Tar {
                        entry: entry_path(file.entry),
                        source,
                    })?;
                if read > MAX_QUEUED_FILE as usize {
                    spill.extend_from_slice(batch.data.get((start, batch.data.len())));
                    batch.data.truncate(start);
                    return Ok(None);
                }
                (JobData::Arena((start, batch.data.len())), read)
            }
        };
        let created = match slot {
            Some(slot) => {
                match create_file(file.parent.as_fd(), file.name, file.create_mode, file.entry) {
                    Ok(fd) => Some(Created { fd, _slot: slot }),
                    Err(error) => {
                        batch.data.truncate(start);
                        return Err(error);
                    }
                }
            }
            None => None,
        };
        if let JobData::View(view) = &job_data {
            batch.viewed += view.len();
        }
        let name_start = batch.names.len();
        batch.names.extend_from_slice(file.name.to_bytes_with_nul());
        let entry_start = batch.names.len();
        batch.names.extend_from_slice(file.entry);
        batch.follows_pending |= follows_pending;
        batch.jobs.push(Job {
            parent: Arc::clone(file.parent),
            created,
            data: job_data,
            name: (name_start, entry_start),
            entry: (entry_start, batch.names.len()),
            create_mode: file.create_mode,
            mode: file.metadata.mode,
            owner: file.metadata.owner,
            mtime: file.metadata.mtime,
            xattrs: file.metadata.xattrs.to_vec(),
        });
        if batch.is_full() {
            self.send(index)?;
        }
        Ok(Some(read as u64))
    }
}

fn poisoned() -> ExtractError {
    io_error(
        b"",
        "writing files",
        io::Error::other("an earlier write failed"),
    )
}

impl IoBackend for ParallelBackend {
    fn write_file(
        &mut self,
        file: &NewFile<'_>,
        data: &mut dyn BufRead,
    ) -> Result<u64, ExtractError> {
        self.write_file_from(file, &mut crate::source::NoLending(data))
    }

    fn write_file_from(
        &mut self,
        file: &NewFile<'_>,
        data: &mut dyn FileSource,
    ) -> Result<u64, ExtractError> {
        self.check()?;
        let directory = self
            .directory_key(file.parent)
            .map_err(|errno| io_error(file.entry, "inspecting the directory of", errno))?;
        let key = key_hash(directory, file.name.to_bytes());
        let mut spill = Vec::new();
        if file.size <= MAX_QUEUED_FILE && !self.made.contains(&key) {
            // Made here: only with a place for its descriptor, else written here below.
            let slot = if self.create_here {
                self.budget.take()
            } else {
                None
            };
            if !self.create_here || slot.is_some() {
                let index = (key % self.workers.len() as u64) as usize;
                let follows_pending = self.pending.contains(&key);
                if let Some(written) =
                    self.queue(index, file, data, &mut spill, slot, follows_pending)?
                {
                    self.pending.insert(key);
                    return Ok(written);
                }
            }
        }
        // On this thread: a big file (or one whose data outgrew its header), or one replacing a
        // directory or symlink of this layer. Nothing pending may be in the way.
        if self.pending.contains(&key) || self.made.contains(&key) {
            self.barrier()?;
        }
        self.check()?;
        let written = self
            .inline
            .write_file(file, &mut io::Cursor::new(spill).chain(data))?;
        self.replaced |= self.inline.take_replaced();
        // The key stays in `made` although the name is a regular file now: a later file of the
        // same name is written here too. Removing it could drop another key of the same hash.
        Ok(written)
    }

    fn flush(&mut self) -> Result<(), ExtractError> {
        self.barrier()
    }

    fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn take_replaced(&mut self) -> bool {
        std::mem::take(&mut self.replaced)
    }

    fn mkdir(&mut self, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
        let key = self.settle(dir, name)?;
        let result = syscall::mkdir(dir, name, mode);
        // Also on EEXIST: the caller may replace what is there with a directory.
        self.made.insert(key);
        result
    }

    fn symlink(&mut self, target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        let key = self.settle(dir, name)?;
        let result = syscall::symlink(target, dir, name);
        self.made.insert(key);
        result
    }

    fn link(
        &mut self,
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
    ) -> Result<(), Errno> {
        self.settle(old_dir, old_name)?;
        self.settle(new_dir, new_name)?;
        syscall::link(old_dir, old_name, new_dir, new_name)
    }

    fn rename(
        &mut self,
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        // Either side may be a directory holding pending files.
        self.settle_all()?;
        syscall::rename(old_dir, old_name, new_dir, new_name, noreplace)
    }

    fn unlink(&mut self, dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> Result<(), Errno> {
        // A directory being removed may hold pending files.
        self.settle_all()?;
        syscall::unlink(dir, name, remove_dir)
    }
}

impl Drop for ParallelBackend {
    fn drop(&mut self) {
        // Whatever is still queued is skipped (after a successful flush nothing is): the extraction
        // failed or was dropped, and its caller deletes the directory, which must not race with
        // the workers, hence the join.
        if self.sent + self.written_here > 0 {
            debug!(
                batches_sent = self.sent,
                batches_written_here = self.written_here,
                files_copied = self.copied,
                "small files written"
            );
        }
        self.shared.failed.store(true, Ordering::Release);
        for worker in &mut self.workers {
            worker.sender = None;
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// A worker: writes each batch's files in order; after an error, skips the rest.
fn work(receiver: Receiver<Message>, shared: &Shared, recycle: &SyncSender<Batch>, chown: bool) {
    let mut xattrs = XattrPolicy::new(chown);
    for message in receiver {
        match message {
            Message::Batch(mut batch) => {
                #[cfg(test)]
                shared.pause.wait();
                if let Err(error) = batch.write(shared, &mut xattrs) {
                    shared.fail(error);
                }
                // Recycled without its directory descriptors (nor, after an error, the files
                // made on the extracting thread and not written).
                batch.jobs.clear();
                let _ = recycle.try_send(batch);
            }
            Message::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Makes the regular file `name` in `parent` (under the gate, if there is one). An earlier entry
/// of the same name (a regular file queued before, or a non-directory of this layer) is replaced,
/// as a later tar entry replaces an earlier one; directories and symlinks of this layer never get
/// here.
fn create_file(
    parent: BorrowedFd<'_>,
    name: &CStr,
    create_mode: u32,
    entry: &[u8],
) -> Result<OwnedFd, ExtractError> {
    let mode = Mode::from_raw_mode(create_mode);
    let create = || syscall::gated(|| rustix::fs::openat(parent, name, CREATE_FLAGS, mode));
    match create() {
        Err(Errno::EXIST) => {
            debug!(entry = %String::from_utf8_lossy(entry), "replacing an earlier entry of the same layer");
            syscall::unlink(parent, name, false)
                .map_err(|errno| io_error(entry, "removing the earlier entry at", errno))?;
            create()
        }
        other => other,
    }
    .map_err(|errno| io_error(entry, "creating file", errno))
}

/// Writes `job`: makes the file unless the extracting thread did (`created`), writes its data,
/// applies its metadata and closes it.
fn write_job(
    batch: &Batch,
    job: &Job,
    created: Option<Created>,
    xattrs: &mut XattrPolicy,
) -> Result<(), ExtractError> {
    let entry = &batch.names[job.entry.0..job.entry.1];
    let made;
    let fd = match &created {
        Some(created) => created.fd.as_fd(),
        None => {
            let name = CStr::from_bytes_with_nul(&batch.names[job.name.0..job.name.1])
                .map_err(|_| io_error(entry, "creating file", Errno::INVAL))?;
            made = create_file(job.parent.as_fd(), name, job.create_mode, entry)?;
            made.as_fd()
        }
    };
    let data = match &job.data {
        JobData::Arena(range) => batch.data.get(*range),
        JobData::View(view) => view,
    };
    write_all(fd, data).map_err(|errno| io_error(entry, "writing", errno))?;
    let metadata = FileMetadata {
        mode: job.mode,
        owner: job.owner,
        mtime: job.mtime,
        xattrs: &job.xattrs,
    };
    apply_file_metadata(fd.as_fd(), &metadata, xattrs, entry)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::path::{Path, PathBuf};

    use super::*;

    /// Yields `data`, then fails.
    struct FailingAfter<'a>(&'a [u8]);

    impl Read for FailingAfter<'_> {
        fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::Error::other("broken stream"));
            }
            let count = buffer.len().min(self.0.len());
            buffer[..count].copy_from_slice(&self.0[..count]);
            self.0 = &self.0[count..];
            Ok(count)
        }
    }

    #[test]
    fn the_arena_appends_across_growth_steps_and_stops_at_the_limit() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut arena = Arena::default();
        arena.read_at_most(&mut Cursor::new(b"abc"), 10).unwrap();
        let read = arena
            .read_at_most(&mut Cursor::new(&data[..]), 300_000)
            .unwrap();
        assert_eq!(read, data.len());
        assert_eq!(arena.get((0, 3)), b"abc");
        assert_eq!(arena.get((3, arena.len())), &data[..]);

        // A stream longer than the limit: exactly `limit` bytes, the rest left in the stream.
        let mut long = Cursor::new(&data[..]);
        let before = arena.len();
        assert_eq!(arena.read_at_most(&mut long, 70_001).unwrap(), 70_001);
        assert_eq!(arena.get((before, arena.len())), &data[..70_001]);
        assert_eq!(long.position(), 70_001);
    }

    #[test]
    fn a_cleared_arena_is_reused_without_growing_and_an_error_appends_nothing() {
        let mut arena = Arena::default();
        arena
            .read_at_most(&mut Cursor::new(vec![1u8; 100_000]), 200_000)
            .unwrap();
        let allocated = arena.bytes.len();
        arena.clear();
        assert_eq!(
            arena
                .read_at_most(&mut Cursor::new(vec![2u8; 50_000]), 200_000)
                .unwrap(),
            50_000
        );
        assert_eq!(arena.bytes.len(), allocated);
        assert!(arena.get((0, arena.len())).iter().all(|&byte| byte == 2));

        let error = arena
            .read_at_most(&mut FailingAfter(&[3u8; 1000]), 200_000)
            .unwrap_err();
        assert_eq!(error.to_string(), "broken stream");
        assert_eq!(arena.len(), 50_000);
    }

    fn open_dir(path: &Path) -> Arc<OwnedFd> {
        Arc::new(
            rustix::fs::open(
                path,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                Mode::empty(),
            )
            .unwrap(),
        )
    }

    fn write(
        backend: &mut ParallelBackend,
        parent: &Arc<OwnedFd>,
        name: &CStr,
        data: &[u8],
    ) -> Result<u64, ExtractError> {
        backend.write_file(&new_file(parent, name, data.len()), &mut Cursor::new(data))
    }

    /// The regular file `name` in `parent`, of `size` bytes, mode 0644, with the tests' mtime.
    fn new_file<'a>(parent: &'a Arc<OwnedFd>, name: &'a CStr, size: usize) -> NewFile<'a> {
        NewFile {
            parent,
            name,
            entry: name.to_bytes(),
            size: size as u64,
            create_mode: 0o644,
            metadata: FileMetadata {
                mode: None,
                owner: None,
                mtime: Timestamp {
                    seconds: 1_600_000_000,
                    nanoseconds: 5,
                },
                xattrs: &[],
            },
        }
    }

    /// What any thread of this process (each has its table in /proc/self/task/*/fd) has open
    /// under `dir`.
    fn open_under(dir: &Path) -> Vec<PathBuf> {
        let dir = dir.canonicalize().unwrap();
        let mut open = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            // A thread that ended meanwhile has no table left to read.
            let Ok(descriptors) = std::fs::read_dir(task.path().join("fd")) else {
                continue;
            };
            for descriptor in descriptors.flatten() {
                if let Ok(target) = std::fs::read_link(descriptor.path())
                    && target.starts_with(&dir)
                {
                    open.push(target);
                }
            }
        }
        open
    }

    /// Files in 40 directories of `root`, through `backend`, the directories' descriptors dropped
    /// here as soon as their files are queued (the queued files hold them).
    fn write_in_directories(backend: &mut ParallelBackend, root: &Path) -> Vec<PathBuf> {
        let root = root.canonicalize().unwrap();
        let mut written = Vec::new();
        for directory in 0..40 {
            let path = root.join(format!("d{directory}"));
            std::fs::create_dir(&path).unwrap();
            let parent = open_dir(&path);
            for file in 0..20 {
                let name = std::ffi::CString::new(format!("f{file}")).unwrap();
                write(backend, &parent, &name, &[file as u8; 100]).unwrap();
                written.push(path.join(format!("f{file}")));
            }
        }
        written
    }

    #[test]
    fn written_files_are_closed_by_the_flush_and_directories_with_the_backend() {
        let root = tempfile::tempdir().unwrap();
        let mut backend = ParallelBackend::new(2, false).unwrap();
        let written = write_in_directories(&mut backend, root.path());
        backend.flush().unwrap();
        // Written and closed: only directories may still be open.
        let open = open_under(root.path());
        assert!(
            open.iter().all(|path| !written.contains(path)),
            "still open after the flush: {open:?}"
        );
        for (index, path) in written.iter().enumerate() {
            assert_eq!(std::fs::read(path).unwrap(), vec![(index % 20) as u8; 100]);
        }
        // Every directory descriptor the jobs held is closed once the backend is gone.
        drop(backend);
        assert_eq!(open_under(root.path()), Vec::<PathBuf>::new());
    }

    #[test]
    fn small_files_are_deferred_until_flush_and_big_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let mut backend = ParallelBackend::new(2, false).unwrap();
        let names: Vec<std::ffi::CString> = (0..300)
            .map(|index| std::ffi::CString::new(format!("f{index}")).unwrap())
            .collect();
        for (index, name) in names.iter().enumerate() {
            let data = vec![index as u8; index * 10];
            assert_eq!(
                write(&mut backend, &parent, name, &data).unwrap(),
                data.len() as u64
            );
        }
        assert!(backend.has_pending());
        let big = vec![7u8; MAX_QUEUED_FILE as usize + 1];
        write(&mut backend, &parent, c"big", &big).unwrap();
        // Written on the calling thread: there when write_file returns.
        assert_eq!(std::fs::read(dir.path().join("big")).unwrap(), big);
        backend.flush().unwrap();
        assert!(!backend.has_pending());
        for (index, name) in names.iter().enumerate() {
            let path = dir.path().join(name.to_str().unwrap());
            assert_eq!(std::fs::read(&path).unwrap(), vec![index as u8; index * 10]);
            let stat = rustix::fs::stat(&path).unwrap();
            assert_eq!((stat.st_mtime, stat.st_mtime_nsec), (1_600_000_000, 5));
        }
    }

    /// A budget of open files made here of the test's own, not the process's.
    fn test_budget(limit: usize) -> &'static OpenBudget {
        Box::leak(Box::new(OpenBudget {
            open: AtomicUsize::new(0),
            limit: Some(limit),
        }))
    }

    #[test]
    fn files_made_on_the_extracting_thread_are_there_at_once_and_written_by_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let mut backend = ParallelBackend::new(1, false)
            .unwrap()
            .creating_files_here(true);
        let budget = test_budget(1000);
        backend.budget = budget;
        let names: Vec<std::ffi::CString> = (0..300)
            .map(|index| std::ffi::CString::new(format!("f{index}")).unwrap())
            .collect();
        for (index, name) in names.iter().enumerate() {
            write(&mut backend, &parent, name, &vec![index as u8; index * 10]).unwrap();
            // Made before `write_file` returned, in tar order.
            assert!(dir.path().join(name.to_str().unwrap()).exists());
        }
        assert!(backend.has_pending());
        // Made here, so a name the kernel refuses fails `write_file` itself, naming the entry, where
        // a worker's failure would only show at the next `write_file` or `flush`.
        let long = std::ffi::CString::new("n".repeat(300)).unwrap();
        match write(&mut backend, &parent, &long, b"refused") {
            Err(ExtractError::Io {
                entry,
                operation,
                source,
            }) => {
                assert_eq!(entry, std::path::PathBuf::from("n".repeat(300)));
                assert_eq!(operation, "creating file");
                assert_eq!(source.raw_os_error(), Some(libc::ENAMETOOLONG));
            }
            other => panic!("expected the creation to fail here, got {other:?}"),
        }
        // A later entry of the same name replaces the one made here at once; the later one wins
        // although the worker still writes the earlier inode.
        write(&mut backend, &parent, c"f7", b"second").unwrap();
        backend.flush().unwrap();
        assert!(!backend.has_pending());
        assert_eq!(budget.open.load(Ordering::Acquire), 0, "all closed");
        for (index, name) in names.iter().enumerate() {
            let path = dir.path().join(name.to_str().unwrap());
            let expected = if index == 7 {
                b"second".to_vec()
            } else {
                vec![index as u8; index * 10]
            };
            assert_eq!(std::fs::read(&path).unwrap(), expected, "{path:?}");
            let stat = rustix::fs::stat(&path).unwrap();
            assert_eq!((stat.st_mtime, stat.st_mtime_nsec), (1_600_000_000, 5));
        }
    }

    #[test]
    fn past_the_limit_of_open_files_made_here_a_file_is_written_on_the_extracting_thread() {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let budget = test_budget(2);
        let mut backend = ParallelBackend::new(1, false)
            .unwrap()
            .creating_files_here(true);
        backend.budget = budget;
        // Every place taken, as by files waiting for the worker.
        let held = [budget.take().unwrap(), budget.take().unwrap()];
        assert!(budget.take().is_none());
        write(&mut backend, &parent, c"inline", b"written here").unwrap();
        // No place was left: written on this thread, data and all, before `write_file` returned.
        assert_eq!(
            std::fs::read(dir.path().join("inline")).unwrap(),
            b"written here"
        );
        assert!(!backend.has_pending());
        drop(held);
        write(&mut backend, &parent, c"queued", b"by the worker").unwrap();
        assert!(backend.has_pending());
        backend.flush().unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("queued")).unwrap(),
            b"by the worker"
        );
        assert_eq!(budget.open.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_limit_of_open_files_made_here_is_a_quarter_of_the_soft_limit_at_most_1024() {
        let limit = open_created_limit();
        assert!(limit <= MAX_OPEN_CREATED, "{limit}");
        if let Some(soft) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            assert!(limit as u64 <= soft / 4, "{limit} of {soft}");
        }
    }

    #[test]
    fn a_namespace_operation_on_a_pending_name_sees_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let mut backend = ParallelBackend::new(3, false).unwrap();
        for round in 0..50 {
            let name = std::ffi::CString::new(format!("n{round}")).unwrap();
            write(&mut backend, &parent, &name, b"pending").unwrap();
            // As on a sequential extraction: the file exists, so mkdir says EEXIST.
            assert_eq!(
                backend.mkdir(parent.as_fd(), &name, 0o755),
                Err(Errno::EXIST)
            );
            assert!(!backend.has_pending(), "the mkdir waited for the file");
        }
        // A file replacing a directory of this layer is written on the calling thread and reported.
        backend.mkdir(parent.as_fd(), c"dir", 0o755).unwrap();
        write(&mut backend, &parent, c"dir", b"now a file").unwrap();
        assert!(backend.take_replaced());
        assert_eq!(
            std::fs::read(dir.path().join("dir")).unwrap(),
            b"now a file"
        );
        // The same name twice in a row: the later one wins.
        write(&mut backend, &parent, c"twice", b"first").unwrap();
        write(&mut backend, &parent, c"twice", b"second").unwrap();
        backend.flush().unwrap();
        assert_eq!(std::fs::read(dir.path().join("twice")).unwrap(), b"second");
    }

    #[test]
    fn a_batch_holds_at_most_its_bytes_and_the_queue_is_per_layer() {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let mut backend = ParallelBackend::new(1, false).unwrap();
        let sizes = [100_000, 100_000, 100_000, BATCH_BYTES, 10, 200_000, 70_000];
        let mut held = Vec::new();
        for (index, size) in sizes.into_iter().enumerate() {
            let name = std::ffi::CString::new(format!("f{index}")).unwrap();
            let data = vec![index as u8; size];
            write(&mut backend, &parent, &name, &data).unwrap();
            let batch = &backend.workers[0].batch;
            held.push(batch.data.len());
            // No queued file is bigger than a batch (the compile-time check on MAX_QUEUED_FILE).
            assert!(
                batch.data.len() <= BATCH_BYTES,
                "file {index}: a batch of {} files holds {} bytes",
                batch.jobs.len(),
                batch.data.len()
            );
        }
        // 2 x 100 kB fit in 256 KiB and the third starts a new batch; a file of BATCH_BYTES fills
        // one and is sent at once; 10 bytes start the next, which 200 kB joins and 70 kB does not.
        assert_eq!(held, [100_000, 200_000, 100_000, 0, 10, 200_010, 70_000]);
        backend.flush().unwrap();
        for (index, size) in sizes.into_iter().enumerate() {
            let written = std::fs::read(dir.path().join(format!("f{index}"))).unwrap();
            assert_eq!(written, vec![index as u8; size], "f{index}");
        }

        // The layer's queue is split between its workers, at least 2 each.
        assert_eq!(queued_per_worker(1), QUEUED_PER_LAYER);
        assert_eq!(queued_per_worker(2), QUEUED_PER_LAYER / 2);
        assert_eq!(queued_per_worker(4), QUEUED_PER_LAYER / 4);
        assert_eq!(queued_per_worker(64), 2);
    }

    /// Holds the workers before each batch while set ([`Shared`]).
    #[derive(Default)]
    pub(super) struct Pause {
        paused: Mutex<bool>,
        resumed: std::sync::Condvar,
    }

    impl Pause {
        fn set(&self, paused: bool) {
            *self.paused.lock().unwrap() = paused;
            self.resumed.notify_all();
        }

        pub(super) fn wait(&self) {
            let mut paused = self.paused.lock().unwrap();
            while *paused {
                paused = self.resumed.wait(paused).unwrap();
            }
        }
    }

    /// Resumes `backend`'s workers after `millis`, from another thread (the test's own may be
    /// waiting for them by then).
    fn resume_later(backend: &ParallelBackend, millis: u64) -> std::thread::JoinHandle<()> {
        let shared = Arc::clone(&backend.shared);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(millis));
            shared.pause.set(false);
        })
    }

    /// A file of 200 kB is a batch of its own (a second would take it past BATCH_BYTES).
    const OWN_BATCH: usize = 200_000;

    /// A directory, its descriptor and a backend of one worker, held until another thread
    /// resumes it `millis` from now (the handle of that thread).
    fn held_backend(
        millis: u64,
    ) -> (
        tempfile::TempDir,
        Arc<OwnedFd>,
        ParallelBackend,
        std::thread::JoinHandle<()>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let backend = ParallelBackend::new(1, false).unwrap();
        backend.shared.pause.set(true);
        let resume = resume_later(&backend, millis);
        (dir, parent, backend, resume)
    }

    /// Files `f0` to `f{count - 1}`, each a batch of its own, of bytes of their index.
    fn write_batches(backend: &mut ParallelBackend, parent: &Arc<OwnedFd>, count: usize) {
        for index in 0..count {
            let name = std::ffi::CString::new(format!("f{index}")).unwrap();
            write(backend, parent, &name, &vec![index as u8; OWN_BATCH]).unwrap();
        }
    }

    /// Files `f0` to `f{count - 1}` in `dir` hold `size` bytes of their index each.
    fn assert_files(dir: &Path, count: usize, size: usize) {
        for index in 0..count {
            let written = std::fs::read(dir.join(format!("f{index}"))).unwrap();
            assert_eq!(written, vec![index as u8; size], "f{index}");
        }
    }

    #[test]
    fn a_full_queue_is_written_by_the_extracting_thread() {
        // Were the queue's last batches waited for, the worker would be resumed first.
        let (dir, parent, mut backend, resume) = held_backend(2000);
        // One batch taken by the held worker, QUEUED_PER_LAYER queued, and more.
        let files = QUEUED_PER_LAYER + 8;
        write_batches(&mut backend, &parent, files);
        // The worker holds the first batches; the last ones (sent when the next file came) were
        // written here, whole, with their metadata.
        assert!(!dir.path().join("f0").exists());
        let here = dir.path().join(format!("f{}", files - 2));
        assert_eq!(
            std::fs::read(&here).unwrap(),
            vec![(files - 2) as u8; OWN_BATCH]
        );
        let mtime = std::fs::metadata(&here).unwrap().modified().unwrap();
        assert_eq!(
            mtime,
            std::time::UNIX_EPOCH + std::time::Duration::new(1_600_000_000, 5)
        );
        assert!(backend.written_here >= 5, "{}", backend.written_here);
        backend.shared.pause.set(false);
        backend.flush().unwrap();
        resume.join().unwrap();
        assert_files(dir.path(), files, OWN_BATCH);
    }

    #[test]
    fn a_full_queue_still_takes_lent_files_as_views() {
        // A layer of files of 4 KiB read as extraction reads it (a `SharedReader` lending within
        // LENT_BYTES, each file's data from `TarWalk::file_data`), in buffers of 56 whole
        // entries (header and data), so that no file straddles two buffers and every one can be
        // lent. The worker is held, so its batch, the queued ones and the one being filled keep
        // their buffers lent all along, and the extracting thread writes the rest. All of them
        // must fit in the lender's budget: past it the source stops lending and every file is
        // copied into its batch.
        const SIZE: usize = 4096;
        const PER_BUFFER: usize = 56;
        let files = (QUEUED_PER_LAYER + 8) * (BATCH_BYTES / SIZE);
        let mut builder = tar::Builder::new(Vec::new());
        for index in 0..files {
            let mut header = tar::Header::new_gnu();
            header.set_size(SIZE as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(
                    &mut header,
                    format!("f{index}"),
                    &vec![index as u8; SIZE][..],
                )
                .unwrap();
        }
        let layer = builder.into_inner().unwrap();
        let (dir, parent, mut backend, resume) = held_backend(2000);
        let mut reader = crate::source::SharedReader::with_lender(
            &layer[..],
            PER_BUFFER * (512 + SIZE),
            crate::source::Lender::new(LENT_BYTES),
        );
        let mut walk = crate::walk::TarWalk::new(&mut reader);
        while walk.next_entry().unwrap() {
            let name = std::ffi::CString::new(walk.path_bytes().into_owned()).unwrap();
            backend
                .write_file_from(&new_file(&parent, &name, SIZE), &mut walk.file_data())
                .unwrap();
        }
        assert!(backend.written_here >= 5, "{}", backend.written_here);
        assert_eq!(backend.copied, 0, "files copied instead of lent");
        backend.shared.pause.set(false);
        backend.flush().unwrap();
        resume.join().unwrap();
        assert_files(dir.path(), files, SIZE);
    }

    #[test]
    fn a_batch_with_a_name_still_queued_waits_for_its_worker() {
        // Long after the writes below that go through, which take a few milliseconds.
        let (dir, parent, mut backend, resume) = held_backend(1000);
        write(&mut backend, &parent, c"same", &[1; OWN_BATCH]).unwrap();
        write_batches(&mut backend, &parent, QUEUED_PER_LAYER + 4);
        assert!(backend.written_here > 0);
        // The queue is full, and this batch holds a name that the held worker has not written
        // yet: it waits for room instead of being written here, before the earlier entry.
        write(&mut backend, &parent, c"same", &[3; OWN_BATCH]).unwrap();
        backend.flush().unwrap();
        resume.join().unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("same")).unwrap(),
            vec![3; OWN_BATCH]
        );
    }

    #[test]
    fn a_failure_written_here_waits_for_the_workers_earlier_one() {
        let (_dir, parent, mut backend, resume) = held_backend(1000);
        let first = std::ffi::CString::new("a".repeat(300)).unwrap();
        write(&mut backend, &parent, &first, &[1; OWN_BATCH]).unwrap();
        write_batches(&mut backend, &parent, QUEUED_PER_LAYER + 1);
        // Written here (the queue is full), failing while the worker still holds the first.
        let second = std::ffi::CString::new("b".repeat(300)).unwrap();
        write(&mut backend, &parent, &second, &[3; OWN_BATCH]).unwrap();
        write(&mut backend, &parent, c"next", &[4; OWN_BATCH]).ok();
        let error = backend.flush().unwrap_err();
        resume.join().unwrap();
        match error {
            ExtractError::Io { entry, source, .. } => {
                assert_eq!(entry, Path::new(first.to_str().unwrap()));
                assert_eq!(source.raw_os_error(), Some(libc::ENAMETOOLONG));
            }
            other => panic!("expected the worker's error, got {other:?}"),
        }
    }

    #[test]
    fn a_write_threads_failure_names_its_entry_once_and_stops_the_backend() {
        let dir = tempfile::tempdir().unwrap();
        let parent = open_dir(dir.path());
        let mut backend = ParallelBackend::new(2, false).unwrap();
        write(&mut backend, &parent, c"fine", b"ok").unwrap();
        let long = std::ffi::CString::new("n".repeat(300)).unwrap();
        write(&mut backend, &parent, &long, b"too long a name").unwrap();
        match backend.flush() {
            Err(ExtractError::Io {
                entry,
                operation,
                source,
            }) => {
                assert_eq!(entry, Path::new(long.to_str().unwrap()));
                assert_eq!(operation, "creating file");
                assert_eq!(source.raw_os_error(), Some(libc::ENAMETOOLONG));
            }
            other => panic!("expected the worker's error, got {other:?}"),
        }
        assert!(write(&mut backend, &parent, c"later", b"refused").is_err());
        assert!(!dir.path().join("later").exists());
    }
}
