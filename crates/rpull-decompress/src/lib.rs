//! Layer codecs for rpull: the codec of a layer from its media type and its first bytes, and a
//! streaming decoder for it (gzip on ISA-L, or on flate2's zlib-rs backend without the `isal` feature; zstd; identity).

mod codec;
mod decoder;
mod error;
#[cfg(feature = "isal")]
mod isal;

pub use codec::{Codec, MediaTypeKind};
pub use decoder::{Decoder, GzipBackend, decoder, decoder_with};
pub use error::DecompressError;
