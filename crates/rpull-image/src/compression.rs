use std::io::{self, Write};

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    None,
    #[default]
    Gzip,
    Zstd,
}

impl Compression {
    /// Compresses a whole tar held in memory (gzip level 6, zstd level 3).
    pub fn compress(self, tar: &[u8]) -> Vec<u8> {
        match self {
            Compression::None => tar.to_vec(),
            Compression::Gzip => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                encoder.write_all(tar).expect("gzip into memory");
                encoder.finish().expect("gzip into memory")
            }
            Compression::Zstd => zstd::encode_all(tar, 3).expect("zstd into memory"),
        }
    }
}

/// A streaming compressor in front of `W`. Fast levels (gzip 1, zstd 1): file-backed layers exist
/// to move many bytes, not to be small.
pub(crate) enum Encoder<W: Write> {
    None(W),
    Gzip(flate2::write::GzEncoder<W>),
    Zstd(zstd::Encoder<'static, W>),
}

impl<W: Write> Encoder<W> {
    /// `level`: gzip 0-9 or zstd 1-22; `None` is the fast default (1 for both).
    pub(crate) fn new(compression: Compression, level: Option<u32>, sink: W) -> io::Result<Self> {
        Ok(match compression {
            Compression::None => Encoder::None(sink),
            Compression::Gzip => {
                let level = flate2::Compression::new(level.unwrap_or(1).min(9));
                Encoder::Gzip(flate2::write::GzEncoder::new(sink, level))
            }
            Compression::Zstd => Encoder::Zstd(zstd::Encoder::new(
                sink,
                level.unwrap_or(1).clamp(1, 22) as i32,
            )?),
        })
    }

    /// Ends the compressed stream and returns the sink, flushed.
    pub(crate) fn finish(self) -> io::Result<W> {
        let mut sink = match self {
            Encoder::None(w) => w,
            Encoder::Gzip(w) => w.finish()?,
            Encoder::Zstd(w) => w.finish()?,
        };
        sink.flush()?;
        Ok(sink)
    }
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::None(w) => w.write(buf),
            Encoder::Gzip(w) => w.write(buf),
            Encoder::Zstd(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::None(w) => w.flush(),
            Encoder::Gzip(w) => w.flush(),
            Encoder::Zstd(w) => w.flush(),
        }
    }
}
