//! The seam between the extractor and the system calls that write regular files.

use std::ffi::CStr;
use std::fmt::Debug;
use std::io::{self, Read};
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use crate::options::IoBackendKind;

/// Creates regular files and writes their data.
///
/// The extractor resolves and creates everything else itself (directories, symlinks, hardlinks,
/// metadata); a backend only sees the hot path of a layer: `create_file`, `write_data`,
/// `close_file` for every regular file, in tar order. The contract is chosen so that an io_uring
/// backend can batch submissions:
///
/// * `create_file` returns a descriptor synchronously (the extractor applies owner, mode, xattrs and
///   times through it right after `write_data`).
/// * `write_data` reads the entry's data from `data` (the tar stream; it must consume it to the end
///   before returning, because the next entry follows in the same stream) into buffers the backend
///   owns, so it chooses write sizes. When it returns, later system calls on the descriptor must
///   observe the data (metadata such as mtime and setuid bits is applied after it).
/// * `close_file` may be deferred and batched; errors of deferred work are reported by `flush`.
/// * `flush` is a barrier: every operation accepted so far is complete when it returns. The
///   extractor calls it at the end of a layer.
pub trait IoBackend: Debug + Send {
    /// Creates `name` in the directory `parent`, which must not exist
    /// (`O_CREAT|O_EXCL|O_NOFOLLOW`), writable, mode 0600 until the extractor sets the real one.
    fn create_file(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd>;
    /// Copies `data` to its end into `file`; returns the number of bytes written.
    fn write_data(&mut self, file: BorrowedFd<'_>, data: &mut dyn Read) -> io::Result<u64>;
    /// Closes a file created by `create_file`.
    fn close_file(&mut self, file: OwnedFd) -> io::Result<()>;
    /// Completes everything accepted so far.
    fn flush(&mut self) -> io::Result<()>;
}

/// Plain blocking `openat`/`write`/`close`, filling a 1 MiB buffer before each write so that big
/// files take few system calls and small files take exactly one write.
#[derive(Debug)]
pub struct StdBackend {
    buffer: Vec<u8>,
}

const STD_BUFFER_SIZE: usize = 1 << 20;

impl StdBackend {
    /// A backend with its own 1 MiB buffer.
    pub fn new() -> Self {
        Self {
            buffer: vec![0; STD_BUFFER_SIZE],
        }
    }
}

impl Default for StdBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl IoBackend for StdBackend {
    fn create_file(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(rustix::fs::openat(
            parent,
            name,
            flags,
            Mode::from_raw_mode(0o600),
        )?)
    }

    fn write_data(&mut self, file: BorrowedFd<'_>, data: &mut dyn Read) -> io::Result<u64> {
        let mut total = 0u64;
        loop {
            // Fill the buffer (a decoder upstream may hand out small pieces), then write it at once.
            let mut filled = 0;
            while filled < self.buffer.len() {
                match data.read(&mut self.buffer[filled..]) {
                    Ok(0) => break,
                    Ok(read) => filled += read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            }
            if filled == 0 {
                return Ok(total);
            }
            let mut written = 0;
            while written < filled {
                match rustix::io::write(file, &self.buffer[written..filled]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(count) => written += count,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(errno) => return Err(errno.into()),
                }
            }
            total += filled as u64;
            if filled < self.buffer.len() {
                return Ok(total);
            }
        }
    }

    fn close_file(&mut self, file: OwnedFd) -> io::Result<()> {
        drop(file);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub(crate) fn new_backend(kind: IoBackendKind) -> Box<dyn IoBackend> {
    match kind {
        IoBackendKind::Std => Box::new(StdBackend::new()),
    }
}
