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

/// Wraps `reader` in a decoder for the layer's codec.
///
/// The codec is taken from the stream's magic bytes, as docker does: a layer declared
/// `tar+gzip` whose bytes are zstd (or plain tar) is decoded as what it is, with a `debug!`
/// line saying so. `declared` only matters for that message.
pub fn decoder<'a, R>(declared: Codec, mut reader: R) -> Result<Decoder<'a>, DecompressError>
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
        Codec::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(stream)),
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

    fn decode(declared: Codec, bytes: &[u8]) -> (Codec, Vec<u8>) {
        // A 7-byte buffer makes the sniffing read cross BufRead chunk boundaries.
        let mut dec = decoder(declared, BufReader::with_capacity(7, bytes)).unwrap();
        let mut out = Vec::new();
        dec.read_to_end(&mut out).unwrap();
        (dec.codec(), out)
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
        let mut gz = gzip(&payload());
        let n = gz.len();
        gz[n - 6] ^= 0xff; // CRC32 in the trailer
        let mut dec = decoder(Codec::Gzip, &gz[..]).unwrap();
        assert!(io::copy(&mut dec, &mut io::sink()).is_err());
        let truncated = &gzip(&payload())[..1000];
        let mut dec = decoder(Codec::Gzip, truncated).unwrap();
        assert!(io::copy(&mut dec, &mut io::sink()).is_err());
    }
}
