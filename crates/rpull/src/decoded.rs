//! Decompression on its own thread, for a layer that inflates ([`crate::decoding`] decides):
//! the layer's decoder runs ahead of its tar extraction, so the two overlap instead of taking
//! turns on one thread. Decoded bytes travel in recycled buffers over a bounded channel (memory
//! per layer: `DEPTH` x `CHUNK`).

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, channel, sync_channel};

/// Bytes per decoded buffer.
pub(crate) const CHUNK: usize = 256 * 1024;
/// Buffers in flight between the decoder and the extractor.
const DEPTH: usize = 8;

/// The decoder side: fills buffers and sends them.
pub(crate) struct DecodedSender {
    full: SyncSender<Vec<u8>>,
    empty: Receiver<Vec<u8>>,
}

/// The extractor side: a `Read` over the decoded buffers; end of stream when the sender is
/// dropped. The sender is also dropped when the decoder fails, so the caller must check the
/// decoder's result before trusting an end of stream (the pipeline does: its error wins).
pub(crate) struct DecodedReader {
    full: Receiver<Vec<u8>>,
    empty: Sender<Vec<u8>>,
    current: Vec<u8>,
    position: usize,
}

pub(crate) fn decoded_channel() -> (DecodedSender, DecodedReader) {
    let (full_tx, full_rx) = sync_channel(DEPTH);
    let (empty_tx, empty_rx) = channel();
    (
        DecodedSender {
            full: full_tx,
            empty: empty_rx,
        },
        DecodedReader {
            full: full_rx,
            empty: empty_tx,
            current: Vec::new(),
            position: 0,
        },
    )
}

impl DecodedSender {
    /// Decodes `source` to its end into the channel. Returns the bytes sent; stops early
    /// (without error) when the reader went away.
    pub(crate) fn pump(self, source: &mut impl Read) -> io::Result<u64> {
        let mut total = 0;
        loop {
            let mut buffer = match self.empty.try_recv() {
                Ok(buffer) => buffer,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => Vec::with_capacity(CHUNK),
            };
            // Recycled buffers are mostly full-length already: resize zeroes only the tail.
            buffer.resize(CHUNK, 0);
            let filled = fill(source, &mut buffer)?;
            if filled == 0 {
                return Ok(total);
            }
            buffer.truncate(filled);
            total += filled as u64;
            if self.full.send(buffer).is_err() {
                return Ok(total);
            }
        }
    }
}

/// Reads until `buffer` is full or the stream ends.
fn fill(source: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match source.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

impl Read for DecodedReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        crate::channel_reader::read_through_buffer(self, out)
    }
}

/// The extractor writes files' data straight from the decoded buffers.
impl BufRead for DecodedReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.position == self.current.len() {
            let next = match self.full.recv() {
                Ok(next) => next,
                Err(_) => return Ok(&[]),
            };
            let done = std::mem::replace(&mut self.current, next);
            self.position = 0;
            if done.capacity() > 0 {
                let _ = self.empty.send(done);
            }
        }
        Ok(&self.current[self.position..])
    }

    fn consume(&mut self, amount: usize) {
        self.position = (self.position + amount).min(self.current.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_in_order_and_whole() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let (sender, mut reader) = decoded_channel();
        let source = data.clone();
        let pump = std::thread::spawn(move || sender.pump(&mut &source[..]));
        let mut out = Vec::new();
        // Small reads exercise buffer boundaries.
        let mut chunk = [0u8; 7001];
        loop {
            let n = reader.read(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(pump.join().unwrap().unwrap(), data.len() as u64);
        assert_eq!(out, data);
    }

    #[test]
    fn buffers_are_lent_whole_and_consumed_in_pieces() {
        let data: Vec<u8> = (0..(2 * CHUNK + 1000) as u32)
            .map(|i| (i % 253) as u8)
            .collect();
        let (sender, mut reader) = decoded_channel();
        let source = data.clone();
        let pump = std::thread::spawn(move || sender.pump(&mut &source[..]));
        let mut out = Vec::new();
        let mut lent = Vec::new();
        loop {
            let available = reader.fill_buf().unwrap();
            if available.is_empty() {
                break;
            }
            lent.push(available.len());
            // Part of a buffer, then the rest of it: the next `fill_buf` lends the remainder.
            let take = available.len().min(100_000);
            out.extend_from_slice(&available[..take]);
            reader.consume(take);
        }
        assert_eq!(pump.join().unwrap().unwrap(), data.len() as u64);
        assert_eq!(out, data);
        assert_eq!(
            lent,
            [
                CHUNK,
                CHUNK - 100_000,
                CHUNK - 200_000,
                CHUNK,
                CHUNK - 100_000,
                CHUNK - 200_000,
                1000
            ]
        );
        // Consuming past the end of a buffer is clamped.
        reader.consume(10);
        assert!(reader.fill_buf().unwrap().is_empty());
    }

    #[test]
    fn reader_gone_stops_the_pump() {
        let (sender, reader) = decoded_channel();
        drop(reader);
        let data = vec![1u8; 10 * CHUNK];
        assert_eq!(sender.pump(&mut &data[..]).unwrap(), CHUNK as u64);
    }
}
