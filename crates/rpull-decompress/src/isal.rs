//! gzip through ISA-L's `isal_inflate` (hand-tuned x86-64/aarch64 assembly): on the 2-vCPU VMs
//! rpull is measured on it inflates 1.6-1.95x as fast as zlib-rs (docs/performance.md, docs/criterion.md).
//!
//! The C side (csrc/isal_gzip.c) keeps `struct inflate_state` opaque; this side feeds it from a
//! `BufRead` without copying the input, and handles concatenated members as gzip(1) and
//! `MultiGzDecoder` do.

use std::ffi::c_int;
use std::io::{self, BufRead, Read};
use std::ptr::NonNull;

#[repr(C)]
struct InflateState {
    _opaque: [u8; 0],
}

unsafe extern "C" {
    fn rpull_isal_gzip_new() -> *mut InflateState;
    fn rpull_isal_gzip_reset(state: *mut InflateState);
    fn rpull_isal_gzip_free(state: *mut InflateState);
    fn rpull_isal_gzip_inflate(
        state: *mut InflateState,
        input: *const u8,
        input_len: usize,
        consumed: *mut usize,
        output: *mut u8,
        output_len: usize,
        produced: *mut usize,
        member_end: *mut c_int,
    ) -> c_int;
}

/// ISA-L's inflate state (about 40 KiB on the heap), owned.
struct State(NonNull<InflateState>);

// The state is plain memory owned by this value; ISA-L keeps no thread-local or global state.
unsafe impl Send for State {}

impl State {
    fn new() -> io::Result<Self> {
        // SAFETY: allocates and initialises a state, or returns NULL.
        let raw = unsafe { rpull_isal_gzip_new() };
        NonNull::new(raw).map(State).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                "allocating ISA-L's inflate state",
            )
        })
    }

    fn reset(&mut self) {
        // SAFETY: the pointer came from rpull_isal_gzip_new and is not freed.
        unsafe { rpull_isal_gzip_reset(self.0.as_ptr()) }
    }

    /// One `isal_inflate` call: (consumed, produced, member complete).
    fn inflate(&mut self, input: &[u8], output: &mut [u8]) -> io::Result<(usize, usize, bool)> {
        let (mut consumed, mut produced, mut member_end) = (0usize, 0usize, 0 as c_int);
        // SAFETY: the state is valid; ISA-L reads at most `input.len()` bytes of `input` and
        // writes at most `output.len()` bytes of `output`, both live for the call.
        let status = unsafe {
            rpull_isal_gzip_inflate(
                self.0.as_ptr(),
                input.as_ptr(),
                input.len(),
                &mut consumed,
                output.as_mut_ptr(),
                output.len(),
                &mut produced,
                &mut member_end,
            )
        };
        if status < 0 {
            return Err(status_error(status));
        }
        Ok((consumed, produced, member_end != 0))
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: allocated by rpull_isal_gzip_new, freed once.
        unsafe { rpull_isal_gzip_free(self.0.as_ptr()) }
    }
}

/// The error for a negative `isal_inflate` status (igzip_lib.h).
fn status_error(status: c_int) -> io::Error {
    let what = match status {
        -1 => "invalid deflate block",
        -2 => "invalid deflate symbol",
        -3 => "invalid deflate lookback distance",
        -4 => "invalid gzip header",
        -5 => "gzip header names an unsupported compression method",
        -6 => "gzip checksum mismatch (CRC32 or length in the trailer)",
        -9 => "invalid operation",
        _ => "inflate failed",
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("corrupt gzip stream: {what} (ISA-L status {status})"),
    )
}

/// A streaming gzip decoder over `R`: every member of a multi-member stream, each checked against
/// its trailer. A stream that ends inside a member is an `UnexpectedEof` error.
pub(crate) struct IsalGzipDecoder<R> {
    reader: R,
    state: State,
    /// The current member's trailer was checked; more input starts a new member.
    member_done: bool,
    /// The stream ended after a complete member.
    finished: bool,
}

impl<R: BufRead> IsalGzipDecoder<R> {
    pub(crate) fn new(reader: R) -> io::Result<Self> {
        Ok(Self {
            reader,
            state: State::new()?,
            member_done: false,
            finished: false,
        })
    }
}

impl<R: BufRead> Read for IsalGzipDecoder<R> {
    fn read(&mut self, output: &mut [u8]) -> io::Result<usize> {
        if output.is_empty() || self.finished {
            return Ok(0);
        }
        loop {
            let input = self.reader.fill_buf()?;
            if self.member_done {
                if input.is_empty() {
                    self.finished = true;
                    return Ok(0);
                }
                // Another member follows.
                self.state.reset();
                self.member_done = false;
            }
            let at_end = input.is_empty();
            let (consumed, produced, member_end) = self.state.inflate(input, output)?;
            self.reader.consume(consumed);
            self.member_done = member_end;
            if produced > 0 {
                return Ok(produced);
            }
            if member_end {
                continue;
            }
            if at_end {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "gzip stream ends inside a member (truncated layer)",
                ));
            }
            if consumed == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "corrupt gzip stream: ISA-L made no progress",
                ));
            }
        }
    }
}
