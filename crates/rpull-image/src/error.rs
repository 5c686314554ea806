use std::path::PathBuf;

use rpull_registry::{DigestError, ReferenceError};

/// What went wrong building, writing or pushing an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file could not be read or written (fs-err errors name their path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Tarring a tree failed at `path`.
    #[error("tarring {path}")]
    Tar {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `index.json` of an OCI layout is not what it should be.
    #[error("OCI layout index {path}: {reason}")]
    Layout { path: PathBuf, reason: String },
    /// The reference to push to does not parse.
    #[error("parsing reference {reference:?}")]
    Reference {
        reference: String,
        #[source]
        source: ReferenceError,
    },
    /// A blob's digest string does not parse.
    #[error("parsing digest {digest:?}")]
    Digest {
        digest: String,
        #[source]
        source: DigestError,
    },
    /// The registry refused or failed a request.
    #[error("{what}")]
    Registry {
        what: String,
        #[source]
        source: Box<rpull_registry::Error>,
    },
}
