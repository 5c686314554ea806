//! Layer sources that lend their buffers: [`LayerSource`], [`Lender`], [`LendingBuffer`] and
//! [`SharedReader`].
//!
//! The write threads of [`crate::ParallelBackend`] write small files later, on another thread, so
//! each file's data must outlive the source's buffer it was read from. Copied into the batch, it
//! costs the extracting thread a copy of every byte (about 3% of the CPU of a 150k-file
//! extraction, docs/performance.md). A source that lends its buffer instead hands the batch a
//! view ([`Bytes`]) that keeps the buffer alive until the file is written.
//!
//! A view keeps its *whole* buffer: a small file between two big ones would pin 256 KiB for a few
//! bytes. So every buffer lent is counted by a [`Lender`], which refuses to lend past its limit
//! (the caller then copies, as before) and takes each buffer back when its last view is dropped.

use std::io::{self, BufRead, Read};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// How much one source lends at most at once, in whole buffers: what the write threads' queued
/// batches of one layer held as copies before views (32 batches of 256 KiB). Their queue is
/// smaller than that since session 53 (`parallel.rs`, `QUEUED_PER_LAYER`: a queue that held the
/// whole budget made the source copy 40% of a layer's small files): with the default number of
/// write threads (at most 4) their views stay within it.
///
/// Each source (a layer being extracted) has a [`Lender`] of its own, so that lent buffers come
/// back to the source that lent them. With one lender for all the layers of a pull, a layer that
/// lends little took the buffers that another layer's views gave back into its own pool at each
/// refill, and the lending layer's decoder made new ones: the realistic image's pull peaked at
/// 166-228 MB instead of 94-115 MB with a lender per layer (the growth of the decoder's pool is
/// what rpull's test `lent_buffers_come_back_to_their_own_decoder` checks).
pub const LENT_BYTES: usize = 8 * 1024 * 1024;

/// A layer tar's bytes ([`crate::extract_layer_from`]) that may be lent as views of the source's
/// own buffers.
pub trait LayerSource: BufRead {
    /// The next `len` bytes as one view, consumed, when all of them are in the buffer that
    /// [`fill_buf`](BufRead::fill_buf) returns now and the source may lend it; otherwise `None`,
    /// with nothing consumed. The view stays valid (and its buffer unused) until it is dropped.
    fn lend(&mut self, len: usize) -> Option<Bytes>;
}

impl<T: LayerSource + ?Sized> LayerSource for &mut T {
    fn lend(&mut self, len: usize) -> Option<Bytes> {
        (**self).lend(len)
    }
}

/// Any [`BufRead`] as a [`LayerSource`] (or a file's [`FileSource`](crate::FileSource)) that
/// never lends.
pub(crate) struct NoLending<R>(pub(crate) R);

impl<R: BufRead> Read for NoLending<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.0.read(buffer)
    }
}

impl<R: BufRead> BufRead for NoLending<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.0.fill_buf()
    }

    fn consume(&mut self, count: usize) {
        self.0.consume(count);
    }
}

impl<R: BufRead> LayerSource for NoLending<R> {
    fn lend(&mut self, _len: usize) -> Option<Bytes> {
        None
    }
}

impl<R: BufRead> crate::backend::FileSource for NoLending<R> {
    fn lend_rest(&mut self) -> Option<Bytes> {
        None
    }
}

/// Counts the bytes of the buffers lent as views, at most `limit` at once, and keeps each buffer
/// given back (when its last view is dropped, on whatever thread) for a source to fill again.
#[derive(Debug)]
pub struct Lender {
    out: AtomicUsize,
    /// Buffers lent since the lender was made.
    total: AtomicU64,
    limit: usize,
    back: Mutex<Vec<Vec<u8>>>,
}

impl Lender {
    /// A lender of at most `limit` bytes of buffers at once.
    pub fn new(limit: usize) -> Arc<Lender> {
        Arc::new(Lender {
            out: AtomicUsize::new(0),
            total: AtomicU64::new(0),
            limit,
            back: Mutex::new(Vec::new()),
        })
    }

    /// `buffer[..len]` as a view that owns the buffer (its slices share it), charged the
    /// buffer's whole length, or the buffer again when that would take the lender past its limit.
    ///
    /// # Panics
    /// When `len` is past the buffer's end.
    pub fn lend(self: &Arc<Self>, buffer: Vec<u8>, len: usize) -> Result<Bytes, Vec<u8>> {
        assert!(len <= buffer.len(), "lending past the buffer's end");
        let charge = buffer.len();
        let taken = self
            .out
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |out| {
                (out + charge <= self.limit).then_some(out + charge)
            });
        if taken.is_err() {
            return Err(buffer);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(Bytes::from_owner(Loan {
            buffer,
            len,
            charge,
            lender: Arc::clone(self),
        }))
    }

    /// A buffer whose views have all been dropped, if there is one.
    pub fn take_back(&self) -> Option<Vec<u8>> {
        self.back
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
    }

    /// Bytes of the buffers lent and not yet given back.
    pub fn out(&self) -> usize {
        self.out.load(Ordering::Acquire)
    }

    /// Buffers lent since the lender was made.
    pub fn lent_in_all(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// The owner of a lent buffer: gives it back to its [`Lender`] when the last view is dropped.
struct Loan {
    buffer: Vec<u8>,
    len: usize,
    charge: usize,
    lender: Arc<Lender>,
}

impl AsRef<[u8]> for Loan {
    fn as_ref(&self) -> &[u8] {
        &self.buffer[..self.len]
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        let buffer = std::mem::take(&mut self.buffer);
        self.lender
            .back
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(buffer);
        self.lender.out.fetch_sub(self.charge, Ordering::AcqRel);
    }
}

/// The buffer a source reads from: its own, or lent (and shared with views).
enum Buffer {
    Own { bytes: Vec<u8>, len: usize },
    Lent(Bytes),
}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        match self {
            Buffer::Own { bytes, len } => &bytes[..*len],
            Buffer::Lent(bytes) => bytes,
        }
    }
}

/// The buffer a lending source reads from, and its place in it: what a [`LayerSource`] built over
/// refilled buffers (the pull's decoded buffers, [`SharedReader`]) keeps, so that its `fill_buf`,
/// `consume` and `lend` are these.
///
/// The buffer stays the source's own until the first lend out of it; it then belongs to its
/// views and to the [`Lender`], which has it back for the source ([`LendingBuffer::take_back`])
/// once every view is dropped.
pub struct LendingBuffer {
    current: Buffer,
    position: usize,
    lender: Arc<Lender>,
}

impl std::fmt::Debug for LendingBuffer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LendingBuffer")
            .field("len", &self.current.bytes().len())
            .field("position", &self.position)
            .field("lender", &self.lender)
            .finish()
    }
}

impl LendingBuffer {
    /// Empty, lending within `lender`'s budget.
    pub fn new(lender: Arc<Lender>) -> Self {
        Self {
            current: Buffer::Own {
                bytes: Vec::new(),
                len: 0,
            },
            position: 0,
            lender,
        }
    }

    /// The bytes not yet consumed.
    pub fn available(&self) -> &[u8] {
        &self.current.bytes()[self.position..]
    }

    /// Consumes `count` bytes (at most what is available).
    pub fn consume(&mut self, count: usize) {
        self.position = (self.position + count).min(self.current.bytes().len());
    }

    /// Makes `bytes[..len]` the buffer, from its start. Returns the buffer it replaces when that
    /// was still the source's own; a lent one comes back through [`take_back`](Self::take_back).
    ///
    /// # Panics
    /// When `len` is past the buffer's end.
    pub fn replace(&mut self, bytes: Vec<u8>, len: usize) -> Option<Vec<u8>> {
        assert!(len <= bytes.len(), "a buffer filled past its end");
        self.position = 0;
        match std::mem::replace(&mut self.current, Buffer::Own { bytes, len }) {
            Buffer::Own { bytes, .. } => Some(bytes),
            Buffer::Lent(_) => None,
        }
    }

    /// A buffer whose views have all been dropped, if there is one.
    pub fn take_back(&self) -> Option<Vec<u8>> {
        self.lender.take_back()
    }

    /// Its lender (how many buffers are out).
    pub fn lender(&self) -> &Arc<Lender> {
        &self.lender
    }

    /// [`LayerSource::lend`]: the next `len` bytes as a view, when they are all available.
    pub fn lend(&mut self, len: usize) -> Option<Bytes> {
        let end = self.position.checked_add(len)?;
        if len == 0 || end > self.current.bytes().len() {
            return None;
        }
        if let Buffer::Own { bytes, len: filled } = &mut self.current {
            let (bytes, filled) = (std::mem::take(bytes), *filled);
            match self.lender.lend(bytes, filled) {
                Ok(view) => self.current = Buffer::Lent(view),
                Err(bytes) => {
                    self.current = Buffer::Own { bytes, len: filled };
                    return None;
                }
            }
        }
        let Buffer::Lent(whole) = &self.current else {
            unreachable!("lent above")
        };
        let view = whole.slice(self.position..end);
        self.position = end;
        Some(view)
    }
}

/// A [`BufRead`] over `R` that lends its buffers ([`LayerSource`]): a layer tar read from a file
/// (`rpull bench`'s extract stage) as a pull reads its decoded buffers.
#[derive(Debug)]
pub struct SharedReader<R> {
    inner: R,
    size: usize,
    buffer: LendingBuffer,
}

impl<R: Read> SharedReader<R> {
    /// Reads `inner` into buffers of `size` bytes, lent within a budget of [`LENT_BYTES`].
    pub fn new(inner: R, size: usize) -> Self {
        Self::with_lender(inner, size, Lender::new(LENT_BYTES))
    }

    /// Reads `inner` into buffers of `size` bytes, lent within `lender`'s budget.
    pub fn with_lender(inner: R, size: usize, lender: Arc<Lender>) -> Self {
        Self {
            inner,
            size: size.max(1),
            buffer: LendingBuffer::new(lender),
        }
    }

    /// Its lender (for tests: how many buffers are out).
    pub fn lender(&self) -> &Arc<Lender> {
        self.buffer.lender()
    }
}

impl<R: Read> Read for SharedReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let count = available.len().min(buffer.len());
        buffer[..count].copy_from_slice(&available[..count]);
        self.consume(count);
        Ok(count)
    }
}

impl<R: Read> BufRead for SharedReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.buffer.available().is_empty() {
            // The current buffer when it is not lent, else one given back, else a new one.
            let mut spare = self
                .buffer
                .replace(Vec::new(), 0)
                .or_else(|| self.buffer.take_back())
                .unwrap_or_default();
            // Zeroed once, when new; a buffer read into before is read into again as it is.
            if spare.len() < self.size {
                spare.resize(self.size, 0);
            }
            let read = loop {
                match self.inner.read(&mut spare[..self.size]) {
                    Ok(read) => break read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        self.buffer.replace(spare, 0);
                        return Err(error);
                    }
                }
            };
            self.buffer.replace(spare, read);
        }
        Ok(self.buffer.available())
    }

    fn consume(&mut self, count: usize) {
        self.buffer.consume(count);
    }
}

impl<R: Read> LayerSource for SharedReader<R> {
    fn lend(&mut self, len: usize) -> Option<Bytes> {
        self.buffer.lend(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Views stay right after the reader has moved on and refilled (a view's buffer is never
    /// read into again while the view lives); a lend that does not fit in the buffer is refused
    /// and consumes nothing.
    #[test]
    fn views_outlive_refills_and_refusals_consume_nothing() {
        let source = data(10_000);
        let mut reader = SharedReader::with_lender(&source[..], 1000, Lender::new(64_000));
        let mut views = Vec::new();
        let mut position = 0;
        while position < source.len() {
            let available = reader.fill_buf().unwrap().len();
            assert!(available > 0);
            // 300 bytes at a time: every fourth lend straddles two buffers and is refused.
            match reader.lend(300) {
                Some(view) => {
                    views.push((position, view));
                    position += 300;
                }
                None => {
                    assert!(300 > available || position + 300 > source.len());
                    let step = available.min(300);
                    reader.consume(step);
                    position += step;
                }
            }
        }
        assert!(views.len() > 20);
        for (at, view) in &views {
            assert_eq!(&view[..], &source[*at..*at + 300], "view at {at}");
        }
        assert!(reader.fill_buf().unwrap().is_empty());
    }

    /// At most `limit` buffers are out; dropping their views gives them back, and the reader
    /// reads into the buffers given back instead of new ones.
    #[test]
    fn the_limit_holds_and_dropped_views_give_their_buffers_back() {
        let source = data(100_000);
        let mut reader = SharedReader::with_lender(&source[..], 1000, Lender::new(3000));
        let mut held = Vec::new();
        for _ in 0..5 {
            reader.fill_buf().unwrap();
            match reader.lend(100) {
                Some(view) => held.push(view),
                None => break,
            }
            let rest = reader.fill_buf().unwrap().len();
            reader.consume(rest);
        }
        assert_eq!(held.len(), 3, "the fourth buffer is not lent");
        assert_eq!(reader.lender().out(), 3000);
        drop(held);
        assert_eq!(reader.lender().out(), 0);
        reader.fill_buf().unwrap();
        let view = reader
            .lend(100)
            .expect("lends again once the views are gone");
        assert_eq!(reader.lender().out(), 1000);
        drop(view);
    }
}
