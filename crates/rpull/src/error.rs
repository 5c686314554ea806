use std::path::PathBuf;

use rpull_registry::Digest;
use thiserror::Error;

/// Why a pull failed. Each variant names the layer or path involved.
#[derive(Debug, Error)]
pub enum PullError {
    /// Talking to the registry failed (resolve, auth, transport).
    #[error(transparent)]
    Registry(Box<rpull_registry::Error>),
    /// The manifest lists a layer whose media type rpull cannot unpack.
    #[error("layer {index} ({digest}) of {reference}")]
    UnsupportedLayer {
        /// Reference being pulled.
        reference: String,
        /// Position in the manifest.
        index: usize,
        /// Layer digest.
        digest: Digest,
        /// What was wrong with the media type.
        #[source]
        source: rpull_decompress::DecompressError,
    },
    /// Downloading a layer failed.
    #[error("downloading layer {index} ({digest})")]
    Download {
        /// Position in the manifest.
        index: usize,
        /// Layer digest.
        digest: Digest,
        /// What went wrong.
        #[source]
        source: Box<rpull_registry::Error>,
    },
    /// A layer's bytes did not match its descriptor.
    #[error("layer {index} ({digest}) failed verification")]
    Verify {
        /// Position in the manifest.
        index: usize,
        /// Layer digest.
        digest: Digest,
        /// Expected and actual digest or size.
        #[source]
        source: rpull_registry::VerifyError,
    },
    /// Decompressing a layer failed.
    #[error("decompressing layer {index} ({digest})")]
    Decompress {
        /// Position in the manifest.
        index: usize,
        /// Layer digest.
        digest: Digest,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// Extracting or merging a layer failed.
    #[error("extracting layer {index} ({digest})")]
    Extract {
        /// Position in the manifest.
        index: usize,
        /// Layer digest.
        digest: Digest,
        /// Names the entry and the cause.
        #[source]
        source: rpull_extract::ExtractError,
    },
    /// The destination exists and is not empty (use `force`).
    #[error("destination {} exists and is not empty (use --force to replace it)", path.display())]
    DestinationNotEmpty {
        /// The destination.
        path: PathBuf,
    },
    /// A filesystem operation of the pipeline itself failed (staging, commit).
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The pull was cancelled (Ctrl-C); nothing was committed.
    #[error("pull cancelled")]
    Cancelled,
}

impl From<rpull_registry::Error> for PullError {
    fn from(error: rpull_registry::Error) -> Self {
        PullError::Registry(Box::new(error))
    }
}
