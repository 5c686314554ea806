//! Decompression on its own thread, for a layer that inflates ([`crate::decoding`] decides):
//! the layer's decoder runs ahead of its tar extraction, so the two overlap instead of taking
//! turns on one thread. Decoded bytes travel in recycled buffers over a bounded channel (memory
//! per layer: `DEPTH` x `CHUNK`).

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, channel, sync_channel};

use bytes::Bytes;
use rpull_extract::{LENT_BYTES, LayerSource, Lender, LendingBuffer};

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
    /// The buffer being read, lent in part or whole to the write threads (its views keep it
    /// until they are dropped, and its lender then has it back for the decoder).
    current: LendingBuffer,
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
            // A lender per layer: its buffers come back to its own decoder.
            current: LendingBuffer::new(Lender::new(LENT_BYTES)),
        },
    )
}

impl DecodedSender {
    /// Decodes `source` to its end into the channel. Returns the bytes sent; stops early
    /// (without error) when the reader went away.
    pub(crate) fn pump(self, source: &mut impl Read) -> io::Result<u64> {
        self.pump_counting(source, &mut 0)
    }

    /// [`pump`](Self::pump), counting in `made` the buffers it had to make (none was back).
    fn pump_counting(self, source: &mut impl Read, made: &mut usize) -> io::Result<u64> {
        let mut total = 0;
        loop {
            let mut buffer = match self.empty.try_recv() {
                Ok(buffer) => buffer,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                    *made += 1;
                    Vec::with_capacity(CHUNK)
                }
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
        while self.current.available().is_empty() {
            let next = match self.full.recv() {
                Ok(next) => next,
                Err(_) => return Ok(&[]),
            };
            let len = next.len();
            // A lent buffer goes back to the decoder once its last view is written (below, at
            // this or a later refill).
            if let Some(done) = self.current.replace(next, len)
                && done.capacity() > 0
            {
                let _ = self.empty.send(done);
            }
            while let Some(back) = self.current.take_back() {
                let _ = self.empty.send(back);
            }
        }
        Ok(self.current.available())
    }

    fn consume(&mut self, amount: usize) {
        self.current.consume(amount);
    }
}

/// Small files' data lent to the write threads as views of the decoded buffers.
impl LayerSource for DecodedReader {
    fn lend(&mut self, len: usize) -> Option<Bytes> {
        self.current.lend(len)
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

    /// Views lent out of the decoded buffers keep their bytes while the decoder goes on refilling
    /// buffers (a lent buffer goes back to it only once its views are dropped), and the stream
    /// read past them is whole.
    #[test]
    fn lent_views_survive_the_recycling() {
        let data: Vec<u8> = (0..(20 * CHUNK) as u32).map(|i| (i % 241) as u8).collect();
        let (sender, mut reader) = decoded_channel();
        let source = data.clone();
        let pump = std::thread::spawn(move || sender.pump(&mut &source[..]));
        let (mut position, mut views, mut out, mut lent) = (0usize, Vec::new(), Vec::new(), 0);
        loop {
            let available = reader.fill_buf().unwrap().len();
            if available == 0 {
                break;
            }
            // Every 10,000th byte or so, 3,000 bytes lent (when they are in this buffer).
            if position % 10_000 < 3000
                && let Some(view) = reader.lend(3000)
            {
                out.extend_from_slice(&view);
                // Every other view is dropped at once: its buffer can go back to the decoder.
                lent += 1;
                if lent % 2 == 0 {
                    views.push((position, view));
                }
                position += 3000;
                continue;
            }
            let step = available.min(7001);
            out.extend_from_slice(&reader.fill_buf().unwrap()[..step]);
            reader.consume(step);
            position += step;
        }
        assert_eq!(pump.join().unwrap().unwrap(), data.len() as u64);
        assert_eq!(out, data);
        assert!(views.len() > 50, "{} views kept", views.len());
        for (at, view) in &views {
            assert_eq!(&view[..], &data[*at..*at + 3000], "view at {at}");
        }
    }

    /// Buffers lent by a layer's reader come back to that layer's decoder, so each decoder's
    /// pool stays within its channel, the buffer being read and its lender's budget, while
    /// another layer is read beside it. With one lender for both, the reader that lends nothing
    /// sent the other's buffers, given back by their views, to its own decoder at each refill,
    /// and the lending layer's decoder made a new buffer for most of them (over 1,000 for 1,500
    /// buffers read; a pull's peak RSS about 200 MB instead of 100).
    #[test]
    fn lent_buffers_come_back_to_their_own_decoder() {
        /// `len` bytes of `byte(i)`, made as they are read.
        struct Pattern(usize, usize);
        impl Read for Pattern {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                let count = out.len().min(self.1 - self.0);
                for (at, byte) in out[..count].iter_mut().enumerate() {
                    *byte = byte_at(self.0 + at);
                }
                self.0 += count;
                Ok(count)
            }
        }
        fn byte_at(at: usize) -> u8 {
            (at % 239) as u8
        }
        let len = 300 * CHUNK;
        let bound = DEPTH + 2 + LENT_BYTES / CHUNK;
        let layers: Vec<_> = (0..2)
            .map(|layer| {
                let (sender, mut reader) = decoded_channel();
                let pump = std::thread::spawn(move || {
                    let mut made = 0;
                    let total = sender.pump_counting(&mut Pattern(0, len), &mut made);
                    (total.unwrap(), made)
                });
                let read = std::thread::spawn(move || {
                    // The first layer lends 100 bytes of each buffer and drops the view three
                    // buffers later; the second lends nothing (as a layer of big files).
                    let (mut held, mut out) = (std::collections::VecDeque::new(), 0usize);
                    loop {
                        let available = reader.fill_buf().unwrap().len();
                        if available == 0 {
                            break;
                        }
                        if layer == 0
                            && let Some(view) = reader.lend(100.min(available))
                        {
                            assert!(view.iter().enumerate().all(|(i, b)| *b == byte_at(out + i)));
                            out += view.len();
                            held.push_back(view);
                        }
                        let rest = reader.fill_buf().unwrap().len();
                        reader.consume(rest);
                        out += rest;
                        while held.len() > 3 {
                            held.pop_front();
                        }
                    }
                    out
                });
                (pump, read)
            })
            .collect();
        for (pump, read) in layers {
            assert_eq!(read.join().unwrap(), len);
            let (total, made) = pump.join().unwrap();
            assert_eq!(total, len as u64);
            assert!(
                made <= bound,
                "the decoder made {made} buffers (bound {bound})"
            );
        }
    }

    #[test]
    fn reader_gone_stops_the_pump() {
        let (sender, reader) = decoded_channel();
        drop(reader);
        let data = vec![1u8; 10 * CHUNK];
        assert_eq!(sender.pump(&mut &data[..]).unwrap(), CHUNK as u64);
    }
}
