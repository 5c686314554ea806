//! Where a layer's tar comes from: its decoder runs on the extraction thread while decoding is
//! little more than a copy (plain tar, stored deflate blocks, zstd raw blocks: compressed bytes
//! about as many as decoded ones), and moves to a decode thread of its own, for good, once a
//! window of the stream shows real compression. Inflating then overlaps with extraction; a copy
//! is cheaper done where its bytes are written than handed between two threads
//! (docs/performance.md, "What changed").

use std::io::{self, BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{Scope, ScopedJoinHandle};

use rpull_decompress::Decoder;
use tracing::debug;

use crate::channel_reader::read_through_buffer;
use crate::decoded::{CHUNK, DecodedReader, decoded_channel};

/// Decoded bytes in each window whose compression is looked at. Larger than what a decoder
/// reads ahead (a chunk of the download, a zstd block), so the count of compressed bytes
/// consumed is close to what the window's decoded bytes came from.
const WINDOW: u64 = 8 << 20;

/// A window stays on the extraction thread while its compressed bytes are at least this many
/// tenths of its decoded ones. Stored and incompressible blocks come to 9.99-10; an inflate
/// that does work (the realistic image's three big layers: 2.4-4.4) to less.
const INLINE_TENTHS: u64 = 9;

/// Whether a window of `compressed` bytes that decoded to `decoded` is cheap enough to decode
/// on the extraction thread.
fn cheap(compressed: u64, decoded: u64) -> bool {
    compressed.saturating_mul(10) >= decoded.saturating_mul(INLINE_TENTHS)
}

/// Counts the compressed bytes a decoder consumes from `inner`, for [`LayerDecoding`].
pub(crate) struct Metered<R> {
    inner: R,
    consumed: Arc<AtomicU64>,
}

impl<R> Metered<R> {
    pub(crate) fn new(inner: R) -> Self {
        Metered {
            inner,
            consumed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The counter [`LayerDecoding::new`] reads.
    pub(crate) fn counter(&self) -> Arc<AtomicU64> {
        self.consumed.clone()
    }
}

impl<R: BufRead> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read_through_buffer(self, buf)
    }
}

impl<R: BufRead> BufRead for Metered<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
        // One writer (whichever thread holds the decoder); read between windows.
        self.consumed.fetch_add(amount as u64, Ordering::Relaxed);
    }
}

/// A layer's decoded bytes, read by its extraction. Like [`DecodedReader`], it ends the stream
/// when the decoder fails: [`finish`](Self::finish) then returns the decoder's error, which
/// explains whatever the extraction made of the cut stream, so it must be checked first.
pub(crate) struct LayerDecoding<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    source: Source<'scope>,
    /// Compressed bytes the decoder has consumed (a [`Metered`] counter).
    consumed: Arc<AtomicU64>,
    failed: Option<io::Error>,
}

enum Source<'scope> {
    Inline(Inline<'scope>),
    Thread {
        reader: DecodedReader,
        thread: ScopedJoinHandle<'scope, io::Result<u64>>,
    },
    /// After a failure on the extraction thread: no more bytes.
    Gone,
}

struct Inline<'scope> {
    /// One `read` of the decoder per empty buffer.
    decoder: BufReader<Decoder<'scope>>,
    decoded: u64,
    /// Decoded and compressed bytes where the current window began.
    window: (u64, u64),
}

impl<'scope, 'env> LayerDecoding<'scope, 'env> {
    /// Starts on the extraction thread; `consumed` counts the compressed bytes `decoder` reads
    /// ([`Metered::counter`]). A decode thread, if one is needed, is started in `scope`.
    pub(crate) fn new(
        scope: &'scope Scope<'scope, 'env>,
        decoder: Decoder<'scope>,
        consumed: Arc<AtomicU64>,
    ) -> Self {
        let window = (0, consumed.load(Ordering::Relaxed));
        LayerDecoding {
            scope,
            source: Source::Inline(Inline {
                decoder: BufReader::with_capacity(CHUNK, decoder),
                decoded: 0,
                window,
            }),
            consumed,
            failed: None,
        }
    }

    /// Whether the decoder has moved to a thread of its own.
    pub(crate) fn on_own_thread(&self) -> bool {
        matches!(self.source, Source::Thread { .. })
    }

    /// Ends the decoding: waits for the decode thread, if there is one (its reader is dropped
    /// first, so a decoder the extraction stopped reading stops too), and returns the
    /// decoder's error, if any.
    pub(crate) fn finish(self) -> io::Result<()> {
        let thread = match self.source {
            Source::Thread { reader, thread } => {
                drop(reader);
                Some(
                    thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                )
            }
            Source::Inline(_) | Source::Gone => None,
        };
        match (self.failed, thread) {
            (Some(error), _) => Err(error),
            (None, Some(result)) => result.map(drop),
            (None, None) => Ok(()),
        }
    }

    /// Ends the stream after the decoder on the extraction thread failed; [`finish`](Self::finish)
    /// returns `error`.
    fn stop(&mut self, error: io::Error) {
        self.failed = Some(error);
        self.source = Source::Gone;
    }

    /// At the end of a window of the inline decoder's output (its buffer consumed): moves the
    /// decoder to a thread of its own if the window was compressed.
    fn look_at_window(&mut self) {
        let Source::Inline(inline) = &mut self.source else {
            return;
        };
        if !inline.decoder.buffer().is_empty() || inline.decoded - inline.window.0 < WINDOW {
            return;
        }
        let consumed = self.consumed.load(Ordering::Relaxed);
        let (decoded, compressed) = (inline.decoded - inline.window.0, consumed - inline.window.1);
        if cheap(compressed, decoded) {
            inline.window = (inline.decoded, consumed);
            return;
        }
        let Source::Inline(inline) = std::mem::replace(&mut self.source, Source::Gone) else {
            unreachable!("matched above");
        };
        debug!(
            decoded = inline.decoded,
            window_decoded = decoded,
            window_compressed = compressed,
            "the layer inflates: decoding moves to a thread of its own"
        );
        let (sender, reader) = decoded_channel();
        // Its buffer is empty: the decoder carries on from the next byte the extraction wants.
        let mut decoder = inline.decoder.into_inner();
        let spawned = std::thread::Builder::new()
            .name("rpull-decode".into())
            .spawn_scoped(self.scope, move || sender.pump(&mut decoder));
        match spawned {
            Ok(thread) => self.source = Source::Thread { reader, thread },
            Err(error) => self.failed = Some(error),
        }
    }
}

/// A read of at least [`CHUNK`] bytes with the inline decoder's buffer empty (a big file's data
/// read into the buffer of an `O_DIRECT` write) is decoded straight into `out`, past that buffer:
/// the decoder's output is then copied once, not twice. Every other read is served from the
/// buffer.
impl Read for LayerDecoding<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        // Small reads (the tar crate's headers) go straight to the buffer, which looks at the
        // window itself.
        if out.len() < CHUNK {
            return read_through_buffer(self, out);
        }
        self.look_at_window();
        if let Source::Inline(inline) = &mut self.source
            && inline.decoder.buffer().is_empty()
        {
            // BufReader reads into `out` directly when its buffer is empty and `out` is at least
            // its capacity.
            return match inline.decoder.read(out) {
                Ok(read) => {
                    inline.decoded += read as u64;
                    Ok(read)
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => Err(error),
                Err(error) => {
                    self.stop(error);
                    Ok(0)
                }
            };
        }
        read_through_buffer(self, out)
    }
}

/// The extractor writes files' data straight from the decoded buffers.
impl BufRead for LayerDecoding<'_, '_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.look_at_window();
        if let Source::Inline(inline) = &mut self.source
            && inline.decoder.buffer().is_empty()
        {
            loop {
                match inline.decoder.fill_buf() {
                    Ok(refilled) => {
                        inline.decoded += refilled.len() as u64;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        self.stop(error);
                        break;
                    }
                }
            }
        }
        match &mut self.source {
            Source::Inline(inline) => Ok(inline.decoder.buffer()),
            Source::Thread { reader, .. } => reader.fill_buf(),
            Source::Gone => Ok(&[]),
        }
    }

    fn consume(&mut self, amount: usize) {
        match &mut self.source {
            Source::Inline(inline) => inline.decoder.consume(amount),
            Source::Thread { reader, .. } => reader.consume(amount),
            Source::Gone => {}
        }
    }
}

/// Lends the decoded buffers of a decode thread; the inline decoder's buffer is refilled in
/// place, so it lends nothing.
impl rpull_extract::LayerSource for LayerDecoding<'_, '_> {
    fn lend(&mut self, len: usize) -> Option<bytes::Bytes> {
        match &mut self.source {
            Source::Thread { reader, .. } => reader.lend(len),
            Source::Inline(_) | Source::Gone => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Write};

    use rpull_decompress::Codec;

    use super::*;

    /// Bytes no codec can shrink (xorshift).
    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    /// Bytes that deflate to about a third, like a layer of text: words of a small vocabulary
    /// in random order.
    fn compressible(len: usize) -> Vec<u8> {
        const WORDS: [&str; 16] = [
            "layer ",
            "image ",
            "blob ",
            "digest ",
            "manifest ",
            "tar ",
            "gzip ",
            "zstd ",
            "registry ",
            "pull ",
            "extract ",
            "write ",
            "file ",
            "directory ",
            "link ",
            "root ",
        ];
        let mut text = Vec::with_capacity(len + 16);
        for choice in random(len, 7) {
            if text.len() >= len {
                break;
            }
            text.extend_from_slice(WORDS[usize::from(choice % 16)].as_bytes());
        }
        text.truncate(len);
        text
    }

    fn gzip(data: &[u8], level: u32) -> Vec<u8> {
        let mut encoder =
            flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    struct Decoded {
        bytes: Vec<u8>,
        on_own_thread: bool,
        finished: io::Result<()>,
        /// The most bytes one `read` returned.
        largest_read: usize,
    }

    /// How a test reads a [`LayerDecoding`], as the extractor does.
    #[derive(Clone, Copy, Debug)]
    enum Reads {
        /// Lent buffers, consumed in pieces (tar headers, buffered writes).
        Lent,
        /// `read`s into a buffer of this many bytes until it is full (a big file's `O_DIRECT`
        /// writes).
        Into(usize),
        /// A lent piece of 700 bytes, then `read`s into a buffer of this many until it is full,
        /// in turn: the first such read finds the inline decoder's buffer partly consumed.
        Mixed(usize),
    }

    /// Decodes `layer` through a [`LayerDecoding`] read as `reads` says, from 64 KiB pieces of
    /// input as the download hands them on.
    fn decode(layer: &[u8]) -> Decoded {
        decode_with(layer, 64 << 10, Reads::Lent)
    }

    /// Decodes `layer` from pieces of `piece` bytes of input, read as `reads` says.
    fn decode_with(layer: &[u8], piece: usize, reads: Reads) -> Decoded {
        std::thread::scope(|scope| {
            let metered = Metered::new(BufReader::with_capacity(piece, layer));
            let counter = metered.counter();
            let decoder = rpull_decompress::decoder(Codec::Gzip, metered).unwrap();
            let mut decoding = LayerDecoding::new(scope, decoder, counter);
            let mut bytes = Vec::new();
            let mut largest_read = 0;
            let mut lend_next = true;
            loop {
                let into = match reads {
                    Reads::Lent => None,
                    Reads::Into(len) => Some(len),
                    Reads::Mixed(len) => (!lend_next).then_some(len),
                };
                lend_next = !lend_next;
                let Some(len) = into else {
                    let available = decoding.fill_buf().unwrap();
                    if available.is_empty() {
                        break;
                    }
                    let take = available.len().min(match reads {
                        Reads::Mixed(_) => 700,
                        _ => 100_000,
                    });
                    bytes.extend_from_slice(&available[..take]);
                    decoding.consume(take);
                    continue;
                };
                // Until the buffer is full or the stream ends, as `O_DIRECT` writes fill theirs.
                let start = bytes.len();
                bytes.resize(start + len, 0);
                let mut filled = 0;
                while filled < len {
                    let read = decoding.read(&mut bytes[start + filled..]).unwrap();
                    largest_read = largest_read.max(read);
                    if read == 0 {
                        break;
                    }
                    filled += read;
                }
                bytes.truncate(start + filled);
                if filled < len {
                    break;
                }
            }
            Decoded {
                bytes,
                on_own_thread: decoding.on_own_thread(),
                finished: decoding.finish(),
                largest_read,
            }
        })
    }

    #[test]
    fn windows_are_cheap_when_compressed_bytes_are_nine_tenths_of_decoded() {
        assert!(cheap(1_000_000, 1_000_000));
        assert!(cheap(1_000_005, 1_000_000));
        assert!(cheap(900_000, 1_000_000));
        assert!(!cheap(899_999, 1_000_000));
        assert!(!cheap(300_000, 1_000_000));
    }

    #[test]
    fn stored_incompressible_and_plain_layers_are_decoded_on_the_extraction_thread() {
        let data = random(3 * WINDOW as usize, 1);
        let layers = [
            ("stored blocks", gzip(&data, 0)),
            ("gzip -6 of random bytes", gzip(&data, 6)),
            (
                "zstd of random bytes",
                zstd::stream::encode_all(&data[..], 3).unwrap(),
            ),
            ("plain tar", data.clone()),
        ];
        for (name, layer) in layers {
            let decoded = decode(&layer);
            decoded.finished.unwrap();
            assert!(decoded.bytes == data, "{name}: bytes differ");
            assert!(!decoded.on_own_thread, "{name}: moved to a decode thread");
        }
    }

    #[test]
    fn a_layer_that_inflates_moves_to_a_decode_thread_with_nothing_lost() {
        let data = compressible(3 * WINDOW as usize);
        let gzipped = gzip(&data, 6);
        assert!(gzipped.len() * 2 < data.len(), "the test data compresses");
        for layer in [gzipped, zstd::stream::encode_all(&data[..], 3).unwrap()] {
            let decoded = decode(&layer);
            decoded.finished.unwrap();
            assert!(decoded.bytes == data, "bytes differ");
            assert!(decoded.on_own_thread);
        }
        // A stream that starts incompressible moves at the first window that inflates.
        let mut mixed = random(2 * WINDOW as usize, 3);
        mixed.extend(compressible(2 * WINDOW as usize));
        let decoded = decode(&gzip(&mixed, 6));
        decoded.finished.unwrap();
        assert!(decoded.bytes == mixed, "bytes differ");
        assert!(decoded.on_own_thread);
    }

    #[test]
    fn a_layer_smaller_than_a_window_stays_on_the_extraction_thread() {
        let data = compressible(WINDOW as usize - 1);
        let decoded = decode(&gzip(&data, 6));
        decoded.finished.unwrap();
        assert!(decoded.bytes == data, "bytes differ");
        assert!(!decoded.on_own_thread);
    }

    #[test]
    fn a_decoder_error_ends_the_stream_and_is_returned_by_finish() {
        // Damaged on the extraction thread (a stored block's length), and after the move.
        let data = random(WINDOW as usize / 2, 5);
        let mut stored = gzip(&data, 0);
        stored[12] ^= 0xff;
        let compressible = compressible(3 * WINDOW as usize);
        let mut inflating = gzip(&compressible, 6);
        let end = inflating.len();
        // The trailer's CRC-32.
        inflating[end - 6] ^= 0x01;
        // Read as lent buffers, and as big reads: the first of those fails past the inline
        // buffer, in the decoder's own read.
        let reads = [Reads::Lent, Reads::Into(4 << 20), Reads::Mixed(4 << 20)];
        for (layer, on_own_thread) in [(stored, false), (inflating, true)] {
            for reads in reads {
                let decoded = decode_with(&layer, 64 << 10, reads);
                assert_eq!(decoded.on_own_thread, on_own_thread, "{reads:?}");
                let error = decoded.finished.expect_err("a damaged stream fails");
                // The decoder's own error (ISA-L says InvalidData, zlib-rs InvalidInput for a bad
                // block), not what the reader made of a stream cut short.
                assert!(
                    matches!(
                        error.kind(),
                        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput
                    ),
                    "{reads:?}: {error}"
                );
            }
        }
    }

    #[test]
    fn a_big_read_decodes_past_the_inline_buffer_into_the_callers() {
        let data = random(3 * WINDOW as usize, 11);
        let big = 4 << 20;
        for (name, layer) in [
            ("stored blocks", gzip(&data, 0)),
            ("plain tar", data.clone()),
        ] {
            for reads in [Reads::Into(big), Reads::Mixed(big)] {
                let decoded = decode_with(&layer, big, reads);
                decoded.finished.unwrap();
                assert!(decoded.bytes == data, "{name}, {reads:?}: bytes differ");
                assert!(!decoded.on_own_thread, "{name}, {reads:?}: moved");
                // Through the inline decoder's buffer, a read gets at most what it holds.
                assert!(
                    decoded.largest_read > CHUNK,
                    "{name}, {reads:?}: at most {} bytes a read",
                    decoded.largest_read
                );
            }
        }
        // Reads smaller than the inline buffer are served from it, and lose nothing.
        let decoded = decode_with(&gzip(&data, 0), big, Reads::Into(CHUNK - 1));
        decoded.finished.unwrap();
        assert!(decoded.bytes == data, "bytes differ");
    }

    #[test]
    fn big_reads_of_a_layer_that_inflates_move_it_to_a_decode_thread() {
        let mut mixed = random(2 * WINDOW as usize, 13);
        mixed.extend(compressible(2 * WINDOW as usize));
        for reads in [Reads::Into(4 << 20), Reads::Mixed(4 << 20)] {
            let decoded = decode_with(&gzip(&mixed, 6), 64 << 10, reads);
            decoded.finished.unwrap();
            assert!(decoded.bytes == mixed, "{reads:?}: bytes differ");
            assert!(decoded.on_own_thread, "{reads:?}: stayed inline");
        }
    }
}
