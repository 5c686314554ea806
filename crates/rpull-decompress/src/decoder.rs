use std::io::{self, BufRead, Cursor, Read};

use tracing::debug;

use crate::{Codec, DecompressError};

/// A streaming decoder over a layer's compressed bytes; reading it yields the layer tar.
pub struct Decoder<'a> {
    inner: Box<dyn Read + Send + 'a>,
    codec: Codec,
}

impl std::fmt::Debug for Decoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

impl Decoder<'_> {
    /// The codec actually used (the sniffed one when the declared one was wrong).
    pub fn codec(&self) -> Codec {
        self.codec
    }
}

impl Read for Decoder<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

/// The inflate implementation behind [`Codec::Gzip`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GzipBackend {
    /// ISA-L's `isal_inflate` (the `isal` feature, on by default): 1.6-1.95x zlib-rs's speed on
    /// the machines rpull is measured on.
    #[cfg(feature = "isal")]
    Isal,
    /// flate2 on zlib-rs, in pure Rust.
    ZlibRs,
}

impl GzipBackend {
    /// Every backend this build has, fastest first.
    pub const ALL: &'static [GzipBackend] = &[
        #[cfg(feature = "isal")]
        GzipBackend::Isal,
        GzipBackend::ZlibRs,
    ];

    /// A short name for reports (`isal`, `zlib-rs`).
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "isal")]
            GzipBackend::Isal => "isal",
            GzipBackend::ZlibRs => "zlib-rs",
        }
    }
}

impl Default for GzipBackend {
    /// ISA-L when the build has it, zlib-rs otherwise.
    fn default() -> Self {
        GzipBackend::ALL[0]
    }
}

impl std::fmt::Display for GzipBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Wraps `reader` in a decoder for the layer's codec, gzip on the default [`GzipBackend`].
///
/// The codec is taken from the stream's magic bytes, as docker does: a layer declared
/// `tar+gzip` whose bytes are zstd (or plain tar) is decoded as what it is, with a `debug!`
/// line saying so. `declared` only matters for that message.
pub fn decoder<'a, R>(declared: Codec, reader: R) -> Result<Decoder<'a>, DecompressError>
where
    R: BufRead + Send + 'a,
{
    decoder_with(declared, reader, GzipBackend::default())
}

/// [`decoder`] with gzip on `gzip`.
pub fn decoder_with<'a, R>(
    declared: Codec,
    mut reader: R,
    gzip: GzipBackend,
) -> Result<Decoder<'a>, DecompressError>
where
    R: BufRead + Send + 'a,
{
    let mut prefix = [0u8; 4];
    let mut filled = 0;
    while filled < prefix.len() {
        match reader.read(&mut prefix[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DecompressError::Read(e)),
        }
    }
    let actual = Codec::sniff(&prefix[..filled]).unwrap_or(Codec::Identity);
    if actual != declared {
        debug!(%declared, %actual, "layer bytes do not match the declared media type; using the codec the magic bytes show");
    }
    let stream = Cursor::new(prefix[..filled].to_vec()).chain(reader);
    let inner: Box<dyn Read + Send + 'a> = match actual {
        Codec::Identity => Box::new(stream),
        Codec::Gzip => match gzip {
            #[cfg(feature = "isal")]
            GzipBackend::Isal => {
                Box::new(crate::isal::IsalGzipDecoder::new(stream).map_err(DecompressError::Read)?)
            }
            GzipBackend::ZlibRs => Box::new(flate2::bufread::MultiGzDecoder::new(stream)),
        },
        Codec::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(stream).map_err(DecompressError::Read)?,
        ),
    };
    Ok(Decoder {
        inner,
        codec: actual,
    })
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Write};

    use super::*;

    fn payload() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::stream::encode_all(data, 3).unwrap()
    }

    /// Decodes with every gzip backend, which must agree; returns their common result.
    fn decode(declared: Codec, bytes: &[u8]) -> (Codec, Vec<u8>) {
        let mut results = GzipBackend::ALL.iter().map(|&gzip| {
            // A 7-byte buffer makes the sniffing read cross BufRead chunk boundaries.
            let mut dec = decoder_with(declared, BufReader::with_capacity(7, bytes), gzip).unwrap();
            let mut out = Vec::new();
            dec.read_to_end(&mut out).unwrap();
            (dec.codec(), out)
        });
        let first = results.next().unwrap();
        for other in results {
            assert!(other == first, "gzip backends disagree");
        }
        first
    }

    #[test]
    fn each_codec_round_trips() {
        let data = payload();
        assert_eq!(
            decode(Codec::Gzip, &gzip(&data)),
            (Codec::Gzip, data.clone())
        );
        assert_eq!(
            decode(Codec::Zstd, &zstd(&data)),
            (Codec::Zstd, data.clone())
        );
        assert_eq!(
            decode(Codec::Identity, &data),
            (Codec::Identity, data.clone())
        );
    }

    #[test]
    fn declared_codec_that_lies_is_overridden_by_magic_bytes() {
        let data = payload();
        assert_eq!(
            decode(Codec::Gzip, &zstd(&data)),
            (Codec::Zstd, data.clone())
        );
        assert_eq!(
            decode(Codec::Zstd, &gzip(&data)),
            (Codec::Gzip, data.clone())
        );
        assert_eq!(decode(Codec::Gzip, &data), (Codec::Identity, data.clone()));
    }

    #[test]
    fn concatenated_gzip_members_and_zstd_frames() {
        let (a, b) = (b"first member ".repeat(1000), b"second member".repeat(1000));
        let mut gz = gzip(&a);
        gz.extend(gzip(&b));
        let mut zs = zstd(&a);
        zs.extend(zstd(&b));
        let joined = [a, b].concat();
        assert_eq!(decode(Codec::Gzip, &gz).1, joined);
        assert_eq!(decode(Codec::Zstd, &zs).1, joined);
    }

    #[test]
    fn empty_and_tiny_streams() {
        assert_eq!(decode(Codec::Identity, b""), (Codec::Identity, Vec::new()));
        assert_eq!(
            decode(Codec::Gzip, b"ab"),
            (Codec::Identity, b"ab".to_vec())
        );
    }

    #[test]
    fn corrupt_gzip_fails_when_read() {
        let good = gzip(&payload());
        let n = good.len();
        let mut bad_crc = good.clone();
        bad_crc[n - 6] ^= 0xff; // CRC32 in the trailer
        let mut bad_length = good.clone();
        bad_length[n - 2] ^= 0xff; // ISIZE in the trailer
        let mut bad_data = good.clone();
        bad_data[n / 2] ^= 0xff;
        for &backend in GzipBackend::ALL {
            for (what, bytes) in [
                ("crc", &bad_crc[..]),
                ("length", &bad_length[..]),
                ("data", &bad_data[..]),
                ("truncated", &good[..1000]),
                ("no trailer", &good[..n - 8]),
                ("half a trailer", &good[..n - 3]),
            ] {
                let mut dec = decoder_with(Codec::Gzip, bytes, backend).unwrap();
                let result = io::copy(&mut dec, &mut io::sink());
                assert!(result.is_err(), "{backend}: {what} was accepted");
            }
            // A valid member followed by garbage is an error too, not a silent stop.
            let mut garbage = good.clone();
            garbage.extend_from_slice(b"\x1f\x8bnot a member at all");
            let mut dec = decoder_with(Codec::Gzip, &garbage[..], backend).unwrap();
            assert!(
                io::copy(&mut dec, &mut io::sink()).is_err(),
                "{backend}: trailing garbage"
            );
        }
    }

    #[test]
    fn gzip_backends_agree_on_large_and_odd_streams() {
        // Stored, fast and best compression; a member with an empty payload; reads of odd sizes.
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i % 7) as u8)
            .collect();
        let mut streams = Vec::new();
        let mut expected = Vec::new();
        for level in [0, 1, 9] {
            let mut enc =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
            enc.write_all(&data).unwrap();
            streams.push(enc.finish().unwrap());
            expected.push(data.clone());
        }
        let mut with_empty = gzip(b"");
        with_empty.extend(gzip(&data[..1000]));
        with_empty.extend(gzip(b""));
        streams.push(with_empty);
        expected.push(data[..1000].to_vec());
        for (stream, expected) in streams.iter().zip(&expected) {
            let mut outputs = Vec::new();
            for &backend in GzipBackend::ALL {
                let mut dec = decoder_with(
                    Codec::Gzip,
                    BufReader::with_capacity(4093, &stream[..]),
                    backend,
                )
                .unwrap();
                let mut out = Vec::new();
                let mut buf = vec![0u8; 65_537];
                loop {
                    let n = dec.read(&mut buf[..(out.len() % 65_537).max(1)]).unwrap();
                    if n == 0 {
                        break;
                    }
                    out.extend_from_slice(&buf[..n]);
                }
                outputs.push(out);
            }
            for output in &outputs {
                assert!(output == expected, "a gzip backend decoded wrong bytes");
            }
        }
    }

    #[test]
    fn the_default_gzip_backend_is_the_fastest_built() {
        assert_eq!(GzipBackend::default(), GzipBackend::ALL[0]);
        #[cfg(feature = "isal")]
        assert_eq!(GzipBackend::default(), GzipBackend::Isal);
    }
}
