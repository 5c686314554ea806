//! The seam between the extractor and the system calls that create and write regular files.

use std::ffi::CStr;
use std::fmt::Debug;
use std::io::{self, BufRead, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use tracing::debug;

use crate::error::{ExtractError, entry_path, io_error};
use crate::metadata::{XattrPolicy, apply_fd_parts};
use crate::options::IoBackendKind;
use crate::parallel::ParallelBackend;
use crate::remove::remove_all_at;
use crate::summary::{Timestamp, Xattr};
use crate::uring::UringBackend;

/// Buffer size for file data: files up to this size take exactly one write, bigger ones one write
/// per 256 KiB.
///
/// Not larger: ext4 on this project's kernel (6.18) builds its page-cache folios as large as each
/// write allows, and a 1 MiB write wants order-8 (1 MiB) folios, 2 MiB writes order-9. On a VM
/// that reports free memory to its host (virtio-balloon free page reporting, blocks of order 9
/// and up), such folios come from memory the host has taken back, and copying into them ran 3-4x
/// (1 MiB writes) and over 10x (2 MiB) slower than into the small folios of 64-512 KiB writes
/// (docs/design.md, "Writes no larger than 256 KiB"). One write per 256 KiB costs a few thousand
/// system calls per GiB, nothing measurable on tmpfs.
pub(crate) const BUFFER_SIZE: usize = 256 << 10;

/// The capacity to give a `BufReader` over a layer tar read from a file, for
/// [`extract_layer`](crate::extract_layer): the std backend writes a file's data straight from
/// that buffer, one write per fill of it, so its capacity is the size of those writes; 256 KiB,
/// the largest write the backends make in any case (`BUFFER_SIZE`).
pub const TAR_READ_BUFFER: usize = BUFFER_SIZE;

/// Flags of every regular file the extractor creates: it must not exist, and a symlink in its
/// place is never followed.
pub(crate) const CREATE_FLAGS: OFlags = OFlags::WRONLY
    .union(OFlags::CREATE)
    .union(OFlags::EXCL)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The metadata a backend applies to a regular file once its data has landed.
#[derive(Debug, Clone, Copy)]
pub struct FileMetadata<'a> {
    /// Permission bits including setuid/setgid/sticky, to apply after the data; `None` when the
    /// file got its final mode when it was created ([`NewFile::create_mode`]).
    pub mode: Option<u32>,
    /// `(uid, gid)` to apply, after the data and before the mode (chown clears setuid/setgid);
    /// `None` leaves the creator's.
    pub owner: Option<(u32, u32)>,
    /// Modification time (the access time is set to the same value); applied last, because any
    /// later write would change it.
    pub mtime: Timestamp,
    /// Extended attributes, applied after the owner (chown clears `security.capability`).
    pub xattrs: &'a [Xattr],
}

/// One regular file for [`IoBackend::write_file`].
#[derive(Debug, Clone, Copy)]
pub struct NewFile<'a> {
    /// The directory to create the file in. Shared so that a backend that defers work keeps the
    /// directory open until that work is done without duplicating a descriptor per file.
    pub parent: &'a Arc<OwnedFd>,
    /// The final component (never `.`, `..` or containing `/`).
    pub name: &'a CStr,
    /// The entry's path inside the layer, for error messages.
    pub entry: &'a [u8],
    /// The size recorded in the tar header (a hint: `data` is read to its end).
    pub size: u64,
    /// The mode to create the file with (before the umask), e.g. `0o600` when the real mode is
    /// applied afterwards.
    pub create_mode: u32,
    /// Owner, mode, xattrs and times, applied after the data.
    pub metadata: FileMetadata<'a>,
}

/// A regular file's data as [`IoBackend::write_file_from`] gets it: its bytes to read, and
/// perhaps to borrow whole.
pub trait FileSource: BufRead {
    /// All of the file's data still to come as one view of the source's buffer, consumed, when
    /// the source lends it (it is all in one buffer, and the source's [`crate::Lender`] is under
    /// its limit); otherwise `None`, with nothing consumed.
    fn lend_rest(&mut self) -> Option<bytes::Bytes>;
}

/// Creates regular files, writes their data and applies their metadata, and creates, renames and
/// removes names (directories, symlinks, hardlinks).
///
/// A backend sees the hot path of a layer, one [`write_file`](Self::write_file) per regular file,
/// in tar order, and the namespace operations of the extractor and the merge
/// ([`mkdir`](Self::mkdir), [`symlink`](Self::symlink), [`link`](Self::link),
/// [`rename`](Self::rename), [`unlink`](Self::unlink)). Device nodes and fifos (`mknodat`), metadata
/// by name and the confined path walks stay plain system calls in the extractor. A backend may
/// defer file work (queue it and complete it later, in batches); the contract keeps the
/// extractor's view consistent:
///
/// * `write_file` consumes `data` to its end before returning (the next entry follows in the same
///   stream), and reports a failure to read it as [`ExtractError::Tar`] naming the entry.
/// * When the name exists (an earlier entry of the layer, or anything already in the target), what
///   is there is removed first, recursively, as a later tar entry replaces an earlier one, and
///   [`take_replaced`](Self::take_replaced) returns `true` afterwards: the extractor must forget
///   cached directory descriptors.
/// * The data lands before the metadata; the mtime is applied last.
/// * Errors of deferred work name their entry and are returned by a later `write_file` or by
///   `flush`. After an error the backend must not be used again (dropping it is fine).
/// * [`flush`](Self::flush) is a barrier: every file accepted so far exists with its data and
///   metadata when it returns. The extractor calls it before anything that could depend on a
///   pending file (an operation on the same name, a hardlink, a removal, another directory, the
///   end of the layer).
/// * A namespace operation has taken effect when it returns (its result decides what the caller
///   does next), in order after every file accepted so far: a backend that defers something a
///   name depends on (creating the file, metadata by name) completes that first. Its errors are
///   the bare [`Errno`] of the operation (the caller names the entry); errors of deferred file
///   work are not mixed into them (a failure of the backend itself is returned as the operation's
///   errno and again by the next `write_file` or `flush`). Directory descriptors and names are
///   borrowed for the call only.
///
/// The namespace operations default to the plain `*at` system calls.
pub trait IoBackend: Debug + Send {
    /// Creates `file.name` in `file.parent` (`O_CREAT|O_EXCL|O_NOFOLLOW`), writes `data` to its
    /// end into it and applies `file.metadata`, now or later. Returns the number of bytes read from
    /// `data` (all of which are, or will be, written).
    ///
    /// `data` is a [`BufRead`] so that a backend that writes as it goes can write from its
    /// buffer ([`BufRead::fill_buf`]), which is the source's own (the decoded buffers of a pull),
    /// without copying the data into a buffer of its own first.
    fn write_file(
        &mut self,
        file: &NewFile<'_>,
        data: &mut dyn BufRead,
    ) -> Result<u64, ExtractError>;
    /// [`write_file`](Self::write_file), with data that may lend the file's bytes as a view of
    /// the source's buffer ([`FileSource::lend_rest`]): a backend that writes the file later may
    /// keep the view instead of a copy. By default the data is written as any other.
    fn write_file_from(
        &mut self,
        file: &NewFile<'_>,
        data: &mut dyn FileSource,
    ) -> Result<u64, ExtractError> {
        self.write_file(file, data)
    }
    /// Completes everything accepted so far.
    fn flush(&mut self) -> Result<(), ExtractError>;
    /// Whether accepted files may still be incomplete (always `false` for a backend that does
    /// everything in `write_file`).
    fn has_pending(&self) -> bool;
    /// Whether an existing entry was removed to create a file since the last call.
    fn take_replaced(&mut self) -> bool;

    /// `mkdirat(dir, name, mode)`: creates the directory `name` with `mode` (before the umask).
    fn mkdir(&mut self, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
        syscall::mkdir(dir, name, mode)
    }

    /// `symlinkat(target, dir, name)`: creates the symlink `name` holding `target` verbatim.
    fn symlink(&mut self, target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        syscall::symlink(target, dir, name)
    }

    /// `linkat(old_dir, old_name, new_dir, new_name, 0)`: `new_name` becomes another name of the
    /// inode at `old_name` (a symlink there is linked itself, not followed).
    fn link(
        &mut self,
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
    ) -> Result<(), Errno> {
        syscall::link(old_dir, old_name, new_dir, new_name)
    }

    /// `renameat(old_dir, old_name, new_dir, new_name)`, or `renameat2(.., RENAME_NOREPLACE)` when
    /// `noreplace` (`EEXIST` when `new_name` exists; `EINVAL` from file systems without it).
    fn rename(
        &mut self,
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        syscall::rename(old_dir, old_name, new_dir, new_name, noreplace)
    }

    /// `unlinkat(dir, name, 0)`, or `unlinkat(dir, name, AT_REMOVEDIR)` (an empty directory) when
    /// `remove_dir`. A directory without `remove_dir` gives `EISDIR` (Linux).
    fn unlink(&mut self, dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> Result<(), Errno> {
        syscall::unlink(dir, name, remove_dir)
    }
}

/// The namespace operations as plain system calls: the defaults of [`IoBackend`], and what a
/// backend falls back to when it cannot do one itself.
pub(crate) mod syscall {
    use std::cell::RefCell;
    use std::ffi::CStr;
    use std::os::fd::BorrowedFd;

    use rustix::fs::{AtFlags, Mode, RenameFlags};
    use rustix::io::Errno;

    use crate::options::CreateGate;

    thread_local! {
        /// The gate of the extraction running on this thread ([`GateScope`]).
        static GATE: RefCell<Option<CreateGate>> = const { RefCell::new(None) };
    }

    /// While alive, this thread's inode-creating calls hold `gate` (when there is one).
    pub(crate) struct GateScope(Option<CreateGate>);

    impl GateScope {
        pub(crate) fn enter(gate: Option<CreateGate>) -> GateScope {
            GateScope(GATE.with(|current| current.replace(gate)))
        }
    }

    impl Drop for GateScope {
        fn drop(&mut self) {
            let outer = self.0.take();
            GATE.with(|current| *current.borrow_mut() = outer);
        }
    }

    /// The gate of the extraction running on this thread, if any.
    pub(crate) fn current_gate() -> Option<CreateGate> {
        GATE.with(|current| current.borrow().clone())
    }

    /// Runs `create`, holding this thread's gate if it has one. (`create` never enters a
    /// [`GateScope`], so the borrow of the gate for its duration cannot conflict.)
    pub(crate) fn gated<T>(create: impl FnOnce() -> T) -> T {
        GATE.with(|current| match &*current.borrow() {
            Some(gate) => gate.hold(create),
            None => create(),
        })
    }

    pub(crate) fn mkdir(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
        gated(|| rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)))
    }

    pub(crate) fn symlink(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        gated(|| rustix::fs::symlinkat(target, dir, name))
    }

    pub(crate) fn link(
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
    ) -> Result<(), Errno> {
        rustix::fs::linkat(old_dir, old_name, new_dir, new_name, AtFlags::empty())
    }

    pub(crate) fn rename(
        old_dir: BorrowedFd<'_>,
        old_name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        if noreplace {
            rustix::fs::renameat_with(old_dir, old_name, new_dir, new_name, RenameFlags::NOREPLACE)
        } else {
            rustix::fs::renameat(old_dir, old_name, new_dir, new_name)
        }
    }

    pub(crate) fn unlink(dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> Result<(), Errno> {
        let flags = if remove_dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(dir, name, flags)
    }
}

/// Plain blocking `openat`/`write`/`fchown`/`fchmod`/`futimens`/`close`, writing each file's data
/// straight from the buffer of the [`BufRead`] it is given: one `write` per
/// [`fill_buf`](BufRead::fill_buf), of at most 256 KiB.
#[derive(Debug)]
pub struct StdBackend {
    xattrs: XattrPolicy,
    replaced: bool,
    /// Whether files of [`PREALLOCATE_FROM`] bytes or more get their blocks first.
    pub(crate) preallocate: bool,
    /// Whether files of [`PREALLOCATE_FROM`] bytes or more are written with `O_DIRECT`
    /// ([`write_direct`]), through this buffer (made at the first such file).
    pub(crate) direct: Option<DirectBuffer>,
}

impl StdBackend {
    /// A backend; `chown` makes a refused `security.capability` xattr an error (see
    /// [`ExtractOptions::chown`](crate::ExtractOptions::chown)).
    pub fn new(chown: bool) -> Self {
        Self {
            xattrs: XattrPolicy::new(chown),
            replaced: false,
            preallocate: false,
            direct: None,
        }
    }

    /// The same backend, allocating the blocks of files of 8 MiB and more before writing them
    /// when `preallocate` ([`preallocation_helps`](crate::preallocation_helps) says where).
    pub fn preallocating(mut self, preallocate: bool) -> Self {
        self.preallocate = preallocate;
        self
    }

    /// The same backend, writing the data of files of 8 MiB and more past the page cache
    /// (`O_DIRECT`) when `direct`, where the file system accepts it: for an extraction that is
    /// made durable afterwards ([`ExtractOptions::direct_writes`](crate::ExtractOptions::direct_writes)
    /// says when it pays).
    pub fn writing_direct(mut self, direct: bool) -> Self {
        self.direct = direct.then(DirectBuffer::default);
        self
    }
}

impl IoBackend for StdBackend {
    fn write_file(
        &mut self,
        file: &NewFile<'_>,
        data: &mut dyn BufRead,
    ) -> Result<u64, ExtractError> {
        let parent = file.parent.as_fd();
        let (fd, replaced) = create_replacing(self, parent, file.name, file.create_mode)
            .map_err(|errno| io_error(file.entry, "creating file", errno))?;
        self.replaced |= replaced;
        if self.preallocate {
            preallocate(fd.as_fd(), file.size);
        }
        let total = match &mut self.direct {
            Some(buffer) if file.size >= PREALLOCATE_FROM => {
                write_direct(fd.as_fd(), data, file.entry, buffer.get())?
            }
            _ => write_from(fd.as_fd(), data, file.entry)?,
        };
        apply_file_metadata(fd.as_fd(), &file.metadata, &mut self.xattrs, file.entry)?;
        Ok(total)
    }

    fn flush(&mut self) -> Result<(), ExtractError> {
        Ok(())
    }

    fn has_pending(&self) -> bool {
        false
    }

    fn take_replaced(&mut self) -> bool {
        std::mem::take(&mut self.replaced)
    }
}

/// `openat(parent, name, CREATE_FLAGS, mode)`; when the name exists, removes what is there
/// (recursively, through `backend`'s namespace operations) and creates it again. The `bool` says
/// whether something was removed (for [`IoBackend::take_replaced`]).
pub(crate) fn create_replacing(
    backend: &mut dyn IoBackend,
    parent: BorrowedFd<'_>,
    name: &CStr,
    mode: u32,
) -> Result<(OwnedFd, bool), Errno> {
    let create = || {
        syscall::gated(|| rustix::fs::openat(parent, name, CREATE_FLAGS, Mode::from_raw_mode(mode)))
    };
    match create() {
        Err(Errno::EXIST) => {
            debug!(name = ?name, "replacing an earlier entry of the same layer");
            match remove_all_at(backend, parent, name) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(errno) => return Err(errno),
            }
            Ok((create()?, true))
        }
        other => Ok((other?, false)),
    }
}

/// Files of at least this many bytes get their blocks allocated before their data is written,
/// where the backend preallocates ([`preallocation_helps`](crate::preallocation_helps)).
pub(crate) const PREALLOCATE_FROM: u64 = 8 << 20;

/// Allocates the blocks of the new file `fd` for `size` bytes without changing its size
/// (`fallocate` with `FALLOC_FL_KEEP_SIZE`), when it is [`PREALLOCATE_FROM`] bytes or more and at
/// most half of the space the file system has free. A refusal only costs the gain: the writes
/// that follow allocate as they would have, and report any error of their own (a full disk among
/// them) naming the file.
///
/// The size is the tar header's, which a hostile layer may state without the data to back it: the
/// extraction then fails at the missing data, and the half of the free space is what such a file
/// can take until what was extracted is removed (by a pull, with its staging directory). (Data
/// it does carry, a gzip bomb's, is written either way.)
pub(crate) fn preallocate(fd: BorrowedFd<'_>, size: u64) {
    if size < PREALLOCATE_FROM {
        return;
    }
    let free = match rustix::fs::fstatvfs(fd) {
        Ok(stat) => stat.f_bavail.saturating_mul(stat.f_frsize),
        Err(errno) => {
            debug!(%errno, "could not read the free space before allocating a file's blocks");
            return;
        }
    };
    if size > free / 2 {
        debug!(
            size,
            free, "a file of more than half the free space is not allocated ahead"
        );
        return;
    }
    if let Err(errno) = rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::KEEP_SIZE, 0, size) {
        debug!(%errno, size, "could not allocate a file's blocks before writing it");
    }
}

/// Writes `data` to its end into `fd` straight from `data`'s buffer, one write per
/// [`BufRead::fill_buf`] of at most [`BUFFER_SIZE`]: no copy but the kernel's. A file takes one
/// write when its data is in one buffer of the source, two when it straddles two (the pipeline's
/// decoded buffers are 256 KiB). Returns the bytes written. Failing to read `data` is
/// [`ExtractError::Tar`] naming `entry`.
pub(crate) fn write_from(
    fd: BorrowedFd<'_>,
    data: &mut dyn BufRead,
    entry: &[u8],
) -> Result<u64, ExtractError> {
    let mut total = 0u64;
    loop {
        let chunk = match data.fill_buf() {
            Ok(chunk) => chunk,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(data_error(entry, source)),
        };
        if chunk.is_empty() {
            return Ok(total);
        }
        let count = chunk.len().min(BUFFER_SIZE);
        write_all(fd, &chunk[..count]).map_err(|errno| io_error(entry, "writing", errno))?;
        data.consume(count);
        total += count as u64;
    }
}

/// The alignment of `O_DIRECT` writes: their memory, file offset and length. 4 KiB is a multiple
/// of every block device's logical block size that Linux supports up to the page size.
const DIRECT_ALIGN: usize = 4096;

/// The size of each `O_DIRECT` write ([`write_direct`]). Measured (docs/performance.md): cold
/// pulls of 1 GB in one file into ext4, 12 alternating rounds in two orders, medians: buffered
/// 1.17 s, 1 MiB direct writes 1.135 s, 4 MiB 1.095 s.
pub(crate) const DIRECT_WRITE: usize = 4 << 20;

/// The memory [`write_direct`] reads a file's data into, aligned as `O_DIRECT` needs
/// ([`DIRECT_ALIGN`]): two buffers of [`DIRECT_WRITE`] bytes, one filled while the other is
/// written, allocated at the first use and then kept, so the host backs them once.
#[derive(Debug, Default)]
pub(crate) struct DirectBuffer {
    memory: Vec<u8>,
}

impl DirectBuffer {
    /// The two aligned buffers of [`DIRECT_WRITE`] bytes.
    pub(crate) fn get(&mut self) -> [&mut [u8]; 2] {
        if self.memory.is_empty() {
            self.memory = vec![0; 2 * DIRECT_WRITE + DIRECT_ALIGN];
        }
        let start = self.memory.as_ptr().align_offset(DIRECT_ALIGN);
        let (first, second) =
            self.memory[start..start + 2 * DIRECT_WRITE].split_at_mut(DIRECT_WRITE);
        [first, second]
    }
}

/// A buffer of [`write_direct`] on its way to the writing thread: its first `filled` bytes are
/// the file's next data; `last` when the data ends there.
struct Filled<'a> {
    buffer: &'a mut [u8],
    filled: usize,
    last: bool,
}

/// Writes `data` to its end into the new file `fd` with `O_DIRECT`: read into one of `buffers`
/// (whose addresses and lengths are multiples of [`DIRECT_ALIGN`], both the same length; a source
/// that can decodes straight into it, [`read_into`]) while a second thread writes the other, one
/// write per buffer, straight to the device, without filling the page cache or leaving anything
/// for write-back. The read and the device's write overlap: the file takes about as long as the
/// device needs. What is left after the last whole block (the tail) is written through the page
/// cache, with `O_DIRECT` cleared. Where the file system refuses `O_DIRECT`, on `fcntl` or on a
/// write (`EINVAL`), the rest is written through the page cache. Returns the bytes written;
/// failing to read `data` is [`ExtractError::Tar`] naming `entry`, failing to write it
/// [`ExtractError::Io`].
///
/// For an extraction that is made durable afterwards: the writes wait for the device, which
/// the final `syncfs` would have waited for anyway.
pub(crate) fn write_direct(
    fd: BorrowedFd<'_>,
    data: &mut dyn BufRead,
    entry: &[u8],
    buffers: [&mut [u8]; 2],
) -> Result<u64, ExtractError> {
    let len = buffers[0].len();
    debug_assert!(
        buffers.iter().all(|buffer| buffer.len() == len
            && buffer.as_ptr().addr().is_multiple_of(DIRECT_ALIGN)
            && buffer.len().is_multiple_of(DIRECT_ALIGN)),
        "O_DIRECT buffers must be aligned and of one length"
    );
    let flags = match rustix::fs::fcntl_getfl(fd) {
        Ok(flags) => flags,
        Err(errno) => return Err(io_error(entry, "reading the flags of", errno)),
    };
    if let Err(errno) = rustix::fs::fcntl_setfl(fd, flags | OFlags::DIRECT) {
        debug!(%errno, "O_DIRECT refused; writing through the page cache");
        return write_from(fd, data, entry);
    }
    // Filled buffers go to the writing thread in file order and come back empty.
    let (to_writer, filled) = std::sync::mpsc::sync_channel::<Filled<'_>>(2);
    let (returned, empty) = std::sync::mpsc::sync_channel::<&mut [u8]>(2);
    for buffer in buffers {
        returned
            .send(buffer)
            .expect("the channel holds both buffers");
    }
    std::thread::scope(|scope| {
        let writer = std::thread::Builder::new()
            .name("rpull-direct".into())
            .spawn_scoped(scope, move || write_filled(fd, flags, filled, returned));
        let writer = match writer {
            Ok(writer) => writer,
            Err(error) => {
                debug!(%error, "no thread to write with O_DIRECT; writing through the page cache");
                clear_direct(fd, flags)
                    .map_err(|(operation, errno)| io_error(entry, operation, errno))?;
                return write_from(fd, data, entry);
            }
        };
        let mut total = 0u64;
        let read = loop {
            // No buffer comes back once the writer has stopped on an error, which its join
            // returns.
            let Ok(buffer) = empty.recv() else {
                break Ok(());
            };
            let filled = match read_into(buffer, data, entry) {
                Ok(filled) => filled,
                Err(error) => break Err(error),
            };
            total += filled as u64;
            let last = filled < len;
            if to_writer
                .send(Filled {
                    buffer,
                    filled,
                    last,
                })
                .is_err()
                || last
            {
                break Ok(());
            }
        };
        drop(to_writer);
        let written = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        read?;
        written.map_err(|(operation, errno)| io_error(entry, operation, errno))?;
        Ok(total)
    })
}

/// The writing thread of [`write_direct`]: writes each buffer that comes in, in order, with
/// `O_DIRECT` up to its last whole block and the rest (the last buffer's tail) through the page
/// cache, and sends it back. A write refused with `EINVAL` clears `O_DIRECT` (`flags` are the
/// file's own) and writes the rest through the page cache. Stops at the first other error,
/// which it returns with what it was doing.
fn write_filled<'a>(
    fd: BorrowedFd<'_>,
    flags: OFlags,
    filled: std::sync::mpsc::Receiver<Filled<'a>>,
    returned: std::sync::mpsc::SyncSender<&'a mut [u8]>,
) -> Result<(), (&'static str, Errno)> {
    let mut direct = true;
    for Filled {
        buffer,
        filled,
        last,
    } in filled
    {
        let whole = filled - filled % DIRECT_ALIGN;
        let mut rest = &buffer[..whole];
        while !rest.is_empty() {
            match rustix::io::write(fd, rest) {
                Ok(0) => return Err(("writing", Errno::NOSPC)),
                Ok(count) => rest = &rest[count..],
                Err(Errno::INTR) => {}
                Err(Errno::INVAL) if direct => {
                    debug!("O_DIRECT write refused; writing through the page cache");
                    clear_direct(fd, flags)?;
                    direct = false;
                }
                Err(errno) => return Err(("writing", errno)),
            }
        }
        let tail = &buffer[whole..filled];
        if !tail.is_empty() {
            if direct {
                clear_direct(fd, flags)?;
                direct = false;
            }
            write_all(fd, tail).map_err(|errno| ("writing", errno))?;
        }
        if last || returned.send(buffer).is_err() {
            break;
        }
    }
    Ok(())
}

/// Puts back the file's own `flags` (those it had before `O_DIRECT` was set), so that what follows
/// goes through the page cache; a failure comes with what was being done.
fn clear_direct(fd: BorrowedFd<'_>, flags: OFlags) -> Result<(), (&'static str, Errno)> {
    rustix::fs::fcntl_setfl(fd, flags).map_err(|errno| ("clearing O_DIRECT on", errno))
}

/// Reads `data` into `buffer` until it is full or the data ends; returns the bytes read. Through
/// `read`, not `fill_buf`: a source that can decode or read straight into a buffer this large
/// does ([`std::io::BufReader`] past its own buffer, the pipeline's inline decoder), instead of
/// being copied out of its own buffer here. Failing to read `data` is [`ExtractError::Tar`]
/// naming `entry`.
fn read_into(
    buffer: &mut [u8],
    data: &mut dyn BufRead,
    entry: &[u8],
) -> Result<usize, ExtractError> {
    fill(buffer, data).map_err(|source| data_error(entry, source))
}

/// Failing to read the data of `entry`: [`ExtractError::Tar`] naming it.
fn data_error(entry: &[u8], source: io::Error) -> ExtractError {
    ExtractError::Tar {
        entry: entry_path(entry),
        source,
    }
}

/// Reads from `data` until `buffer` is full or the data ends; returns the bytes read.
pub(crate) fn fill(buffer: &mut [u8], data: &mut dyn Read) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match data.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// `write` until all of `bytes` is written (at the file offset).
pub(crate) fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> Result<(), Errno> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(Errno::NOSPC),
            Ok(count) => bytes = &bytes[count..],
            Err(Errno::INTR) => {}
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

/// Owner, mode, xattrs and times through the descriptor of a regular file whose data is written.
pub(crate) fn apply_file_metadata(
    fd: BorrowedFd<'_>,
    metadata: &FileMetadata<'_>,
    policy: &mut XattrPolicy,
    entry: &[u8],
) -> Result<(), ExtractError> {
    apply_fd_parts(
        fd,
        metadata.mode,
        metadata.owner,
        metadata.xattrs,
        metadata.mtime,
        policy,
        entry,
    )
}

/// The backend for `kind`; `Auto` falls back to std (with a `debug!` line saying why) when
/// io_uring is unavailable, while an explicit `Uring` fails. Std with `write_threads > 1` into an
/// empty `target` is a [`ParallelBackend`] with `write_threads - 1` workers (the extracting
/// thread writes too), and so is std with one write thread and `create_here` (one worker, which
/// writes the files the extracting thread makes: [`ParallelBackend::creating_files_here`]).
/// Each preallocates big files where [`preallocation_helps`](crate::preallocation_helps) on
/// `target`'s file system, and the std ones write them with `O_DIRECT` when `direct`
/// ([`ExtractOptions::direct_writes_into`](crate::ExtractOptions::direct_writes_into)).
pub(crate) fn new_backend(
    kind: IoBackendKind,
    chown: bool,
    target: &Path,
    write_threads: usize,
    create_here: bool,
    direct: bool,
) -> Result<Box<dyn IoBackend>, ExtractError> {
    let preallocate = crate::filesystem::preallocation_helps(target) == Some(true);
    let std_backend = || {
        StdBackend::new(chown)
            .preallocating(preallocate)
            .writing_direct(direct)
    };
    let (resolved, reason) = kind.resolve();
    match resolved {
        IoBackendKind::Uring => match UringBackend::new(chown) {
            Ok(backend) => Ok(Box::new(backend.preallocating(preallocate))),
            Err(error) if kind == IoBackendKind::Auto => {
                debug!(%error, "io_uring backend could not be set up; using the std backend");
                Ok(Box::new(std_backend()))
            }
            Err(error) => Err(io_error(
                target.as_os_str().as_encoded_bytes(),
                "setting up the io_uring backend for",
                error,
            )),
        },
        IoBackendKind::Auto | IoBackendKind::Std => {
            if let Some(reason) = &reason {
                debug!(%reason, "io_uring unavailable; using the std backend");
            }
            if kind == IoBackendKind::Uring {
                return Err(io_error(
                    target.as_os_str().as_encoded_bytes(),
                    "setting up the io_uring backend for",
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        reason.unwrap_or_else(|| "io_uring is unavailable".to_owned()),
                    ),
                ));
            }
            let create_here = create_here && write_threads <= 1;
            if (write_threads > 1 || create_here) && is_empty_dir(target) {
                // The extracting thread is one of the `write_threads`: it writes batches too
                // when the write threads' queue is full.
                match ParallelBackend::new(write_threads.saturating_sub(1).max(1), chown) {
                    Ok(backend) => {
                        return Ok(Box::new(
                            backend
                                .creating_files_here(create_here)
                                .preallocating(preallocate)
                                .writing_direct(direct),
                        ));
                    }
                    Err(error) => {
                        debug!(%error, "could not start write threads; writing files on the extracting thread");
                    }
                }
            }
            Ok(Box::new(std_backend()))
        }
    }
}

/// Whether `dir` is a directory with no entries (false when it cannot be read).
fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Read};

    use super::*;

    /// Two buffers of `len` bytes of zeroes at addresses aligned for `O_DIRECT`, inside `memory`.
    fn aligned(memory: &mut Vec<u8>, len: usize) -> [&mut [u8]; 2] {
        *memory = vec![0; 2 * len + DIRECT_ALIGN];
        let start = memory.as_ptr().align_offset(DIRECT_ALIGN);
        let (first, second) = memory[start..start + 2 * len].split_at_mut(len);
        [first, second]
    }

    /// Reads of at most `piece` bytes of `data`; remembers the biggest buffer it was asked to fill.
    struct Pieces<'a> {
        data: &'a [u8],
        piece: usize,
        largest_ask: usize,
    }

    impl<'a> Pieces<'a> {
        fn new(data: &'a [u8], piece: usize) -> Self {
            Pieces {
                data,
                piece,
                largest_ask: 0,
            }
        }
    }

    impl Read for Pieces<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.largest_ask = self.largest_ask.max(out.len());
            let count = out.len().min(self.piece).min(self.data.len());
            out[..count].copy_from_slice(&self.data[..count]);
            self.data = &self.data[count..];
            Ok(count)
        }
    }

    /// A new file in `dir`, opened as the backends create files.
    fn create(dir: &Path, name: &str) -> OwnedFd {
        rustix::fs::open(dir.join(name), CREATE_FLAGS, Mode::from_raw_mode(0o644)).unwrap()
    }

    #[test]
    fn direct_writes_give_the_same_file_for_every_size_around_the_blocks_and_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let mut memory = Vec::new();
        // Four blocks per write, so that a file takes several writes and a tail.
        let buffer_len = 4 * DIRECT_ALIGN;
        for size in [
            0,
            1,
            DIRECT_ALIGN - 1,
            DIRECT_ALIGN,
            DIRECT_ALIGN + 1,
            buffer_len - 1,
            buffer_len,
            buffer_len + 1,
            3 * buffer_len + DIRECT_ALIGN + 123,
        ] {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            // A source whose reads straddle the blocks and the buffer.
            let mut source = BufReader::with_capacity(3000, Pieces::new(&data, 1000));
            let name = format!("file-{size}");
            let fd = create(dir.path(), &name);
            let buffers = aligned(&mut memory, buffer_len);
            let written = write_direct(fd.as_fd(), &mut source, name.as_bytes(), buffers).unwrap();
            drop(fd);
            assert_eq!(written, size as u64, "{size} bytes");
            assert_eq!(
                std::fs::read(dir.path().join(&name)).unwrap(),
                data,
                "{size} bytes"
            );
        }
    }

    #[test]
    fn a_direct_write_reads_its_source_straight_into_the_aligned_buffers() {
        // Past a source's own buffer: the pipeline's decoder then decodes into the aligned
        // buffer instead of into its own, from which the data would be copied again.
        let dir = tempfile::tempdir().unwrap();
        let mut memory = Vec::new();
        let buffer_len = 4 * DIRECT_ALIGN;
        let data: Vec<u8> = (0..3 * buffer_len + 10)
            .map(|i| (i * 3 % 251) as u8)
            .collect();
        let mut source = BufReader::with_capacity(3000, Pieces::new(&data, buffer_len));
        let fd = create(dir.path(), "big");
        let buffers = aligned(&mut memory, buffer_len);
        let written = write_direct(fd.as_fd(), &mut source, b"big", buffers).unwrap();
        drop(fd);
        assert_eq!(written, data.len() as u64);
        assert_eq!(std::fs::read(dir.path().join("big")).unwrap(), data);
        // Through `fill_buf`, the source is asked for its buffer's 3000 bytes at a time.
        assert_eq!(source.get_ref().largest_ask, buffer_len);
    }

    #[test]
    fn a_direct_write_whose_source_fails_names_the_entry() {
        struct Cut;
        impl Read for Cut {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("the layer ends here"))
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut memory = Vec::new();
        let buffers = aligned(&mut memory, 4 * DIRECT_ALIGN);
        let data = vec![9u8; 5 * DIRECT_ALIGN + 10];
        let mut source = BufReader::new(data.as_slice().chain(Cut));
        let fd = create(dir.path(), "cut");
        let error = write_direct(fd.as_fd(), &mut source, b"usr/lib/big.so", buffers).unwrap_err();
        assert!(
            matches!(&error, ExtractError::Tar { entry, .. } if entry.as_os_str() == "usr/lib/big.so"),
            "{error:?}"
        );
    }

    #[test]
    fn the_next_buffer_is_filled_while_the_last_is_written() {
        /// Tells `passed` once it is asked for the byte at `at` or a later one.
        struct Watch<'a> {
            data: &'a [u8],
            read: usize,
            at: usize,
            passed: Option<std::sync::mpsc::Sender<()>>,
        }
        impl Read for Watch<'_> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                if self.read >= self.at
                    && let Some(passed) = self.passed.take()
                {
                    passed.send(()).unwrap();
                }
                let count = (&self.data[self.read..]).read(out)?;
                self.read += count;
                Ok(count)
            }
        }
        // The file is a pipe of 64 KiB (`O_DIRECT` makes it a packet pipe), and each buffer is
        // 128 KiB: the first buffer's write waits for the pipe's reader, which starts reading only
        // once the data of the second buffer has been asked for (or after 10 s). Copying and
        // writing one after the other on one thread never asks for it before the reader reads.
        let (from_pipe, into_pipe) = rustix::pipe::pipe().unwrap();
        rustix::pipe::fcntl_setpipe_size(&into_pipe, 64 << 10).unwrap();
        let buffer_len = 32 * DIRECT_ALIGN;
        let data: Vec<u8> = (0..3 * buffer_len + 100)
            .map(|i| (i * 13 % 251) as u8)
            .collect();
        let (passed, asked) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let overlapped = asked
                .recv_timeout(std::time::Duration::from_secs(10))
                .is_ok();
            // Reads of a whole packet at least: a packet pipe drops what a shorter read leaves.
            let (mut out, mut packet) = (Vec::new(), vec![0; 64 << 10]);
            let mut pipe = std::fs::File::from(from_pipe);
            loop {
                match pipe.read(&mut packet).unwrap() {
                    0 => break (overlapped, out),
                    count => out.extend_from_slice(&packet[..count]),
                }
            }
        });
        let mut source = BufReader::with_capacity(
            3000,
            Watch {
                data: &data,
                read: 0,
                at: buffer_len,
                passed: Some(passed),
            },
        );
        let mut memory = Vec::new();
        let buffers = aligned(&mut memory, buffer_len);
        let written = write_direct(into_pipe.as_fd(), &mut source, b"big.bin", buffers).unwrap();
        drop(into_pipe);
        let (overlapped, out) = reader.join().unwrap();
        assert_eq!(written, data.len() as u64);
        assert!(out == data, "the pipe got other bytes");
        assert!(
            overlapped,
            "the second buffer was not filled while the first was being written"
        );
    }

    #[test]
    fn a_direct_write_the_file_refuses_names_the_entry_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("read-only"), b"").unwrap();
        // Open for reading only: every write fails (EBADF) on the writing thread, which must
        // stop the copying one too, whatever the length of the data.
        let fd = rustix::fs::open(
            dir.path().join("read-only"),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let mut memory = Vec::new();
        let data = vec![1u8; 64 * DIRECT_ALIGN];
        let mut source = BufReader::with_capacity(3000, data.as_slice());
        let buffers = aligned(&mut memory, 4 * DIRECT_ALIGN);
        let error = write_direct(fd.as_fd(), &mut source, b"opt/big.bin", buffers).unwrap_err();
        assert!(
            matches!(&error, ExtractError::Io { entry, operation: "writing", source }
                if entry.as_os_str() == "opt/big.bin" && source.raw_os_error() == Some(Errno::BADF.raw_os_error())),
            "{error:?}"
        );
    }

    #[test]
    fn the_direct_buffers_are_aligned_apart_and_kept() {
        let mut buffer = DirectBuffer::default();
        let [first, second] = buffer.get();
        assert_eq!((first.len(), second.len()), (DIRECT_WRITE, DIRECT_WRITE));
        assert!(first.as_ptr().addr().is_multiple_of(DIRECT_ALIGN));
        assert!(second.as_ptr().addr().is_multiple_of(DIRECT_ALIGN));
        let addresses = (first.as_ptr(), second.as_ptr());
        assert_eq!(first.as_ptr_range().end, second.as_ptr());
        let [first, second] = buffer.get();
        assert_eq!((first.as_ptr(), second.as_ptr()), addresses);
    }
}
