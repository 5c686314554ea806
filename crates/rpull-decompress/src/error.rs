use thiserror::Error;

/// What can go wrong choosing or running a codec.
#[derive(Debug, Error)]
pub enum DecompressError {
    /// The layer's media type is not one rpull knows how to unpack.
    #[error("unsupported layer media type {media_type:?}")]
    UnsupportedMediaType {
        /// The media type as the manifest declared it.
        media_type: String,
    },
    /// Reading the first bytes of the stream failed.
    #[error("reading the start of the layer stream")]
    Read(#[source] std::io::Error),
}
