//! The bridge between a layer's download task (async) and its extraction thread (blocking).

use std::io::{self, BufRead, Read};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;
use tokio_util::sync::CancellationToken;

use crate::durability::WritebackCounter;

/// Reads the chunks a download task sends; end of stream when the sender is dropped.
/// Reading fails with [`io::ErrorKind::Interrupted`]-free `Other` errors once the pull is
/// cancelled, so an extraction stuck waiting for bytes returns promptly.
pub(crate) struct ChannelReader {
    rx: Receiver<Bytes>,
    chunk: Bytes,
    cancel: CancellationToken,
    runtime: Handle,
    done: bool,
}

impl ChannelReader {
    pub(crate) fn new(rx: Receiver<Bytes>, cancel: CancellationToken, runtime: Handle) -> Self {
        ChannelReader {
            rx,
            chunk: Bytes::new(),
            cancel,
            runtime,
            done: false,
        }
    }

    /// Reads and drops everything still to come, so the download can finish and verify the
    /// whole blob even when extraction stopped early.
    pub(crate) fn drain(&mut self) -> io::Result<u64> {
        let mut total = self.chunk.len() as u64;
        self.chunk = Bytes::new();
        while !self.done {
            match self.next_chunk()? {
                Some(c) => total += c.len() as u64,
                None => self.done = true,
            }
        }
        Ok(total)
    }

    fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        let cancel = self.cancel.clone();
        let rx = &mut self.rx;
        self.runtime.block_on(async {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(io::Error::other("pull cancelled")),
                chunk = rx.recv() => Ok(chunk),
            }
        })
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read_through_buffer(self, buf)
    }
}

/// `Read::read` of a reader whose bytes are in its [`BufRead`] buffer: a copy out of it.
pub(crate) fn read_through_buffer(reader: &mut impl BufRead, out: &mut [u8]) -> io::Result<usize> {
    let available = reader.fill_buf()?;
    let n = available.len().min(out.len());
    out[..n].copy_from_slice(&available[..n]);
    reader.consume(n);
    Ok(n)
}

impl BufRead for ChannelReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.chunk.is_empty() && !self.done {
            match self.next_chunk()? {
                Some(chunk) => self.chunk = chunk,
                None => self.done = true,
            }
        }
        Ok(&self.chunk)
    }

    fn consume(&mut self, amount: usize) {
        let _ = self.chunk.split_to(amount);
    }
}

/// Bytes a [`CountingReader`] reads between two reports to the write-back counter, which the
/// layers share: one atomic add per MiB rather than per read (tar reads each 512-byte header).
const WRITEBACK_REPORT_STEP: u64 = 1 << 20;

/// Counts the bytes read through it, and reports them to the pull's early write-back, if any
/// (every [`WRITEBACK_REPORT_STEP`]: the last part of a layer is left to the final sync).
pub(crate) struct CountingReader<R> {
    inner: R,
    count: u64,
    writeback: Option<WritebackCounter>,
    reported: u64,
}

impl<R> CountingReader<R> {
    pub(crate) fn new(inner: R, writeback: Option<WritebackCounter>) -> Self {
        CountingReader {
            inner,
            count: 0,
            writeback,
            reported: 0,
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }
}

impl<R> CountingReader<R> {
    fn counted(&mut self, n: usize) {
        self.count += n as u64;
        if let Some(writeback) = &self.writeback
            && self.count - self.reported >= WRITEBACK_REPORT_STEP
        {
            writeback.add(self.count - self.reported);
            self.reported = self.count;
        }
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counted(n);
        Ok(n)
    }
}

/// The extractor writes files' data straight from the inner reader's buffer and consumes it.
impl<R: BufRead> BufRead for CountingReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
        self.counted(amount);
    }
}

/// Bytes lent are consumed, and counted as such.
impl<R: rpull_extract::LayerSource> rpull_extract::LayerSource for CountingReader<R> {
    fn lend(&mut self, len: usize) -> Option<bytes::Bytes> {
        let view = self.inner.lend(len)?;
        self.counted(len);
        Some(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_read_and_what_is_consumed() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut reader = CountingReader::new(io::BufReader::with_capacity(3000, &data[..]), None);
        let mut header = [0u8; 512];
        reader.read_exact(&mut header).unwrap();
        assert_eq!(reader.count(), 512);
        // Consumed from the buffer without a copy, as the extractor writes file data.
        let available = reader.fill_buf().unwrap().len();
        assert_eq!(available, 3000 - 512);
        reader.consume(available);
        assert_eq!(reader.count(), 3000);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert_eq!(reader.count(), 10_000);
        assert_eq!(rest, &data[3000..]);
    }
}
