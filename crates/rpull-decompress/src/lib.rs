//! Layer codecs for rpull: the codec of a layer from its media type and its first bytes, and a
//! streaming decoder for it (gzip on flate2's zlib-rs backend, zstd, identity).

mod codec;
mod decoder;
mod error;

pub use codec::{Codec, MediaTypeKind};
pub use decoder::{Decoder, decoder};
pub use error::DecompressError;
