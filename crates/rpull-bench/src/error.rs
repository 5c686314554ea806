use std::io;
use std::path::PathBuf;

use rpull::Digest;
use rpull::registry::{Error as RegistryError, VerifyError};
use thiserror::Error;

/// What can stop a measurement. Each variant names the blob, layer, path or command involved.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The reference could not be resolved to an image manifest.
    #[error("resolving {reference}")]
    Resolve {
        /// The reference as given.
        reference: String,
        /// The registry's error (boxed: it is large and errors are rare).
        #[source]
        source: Box<RegistryError>,
    },
    /// A blob (or a byte range of it) could not be fetched.
    #[error("fetching blob {digest} of {reference}{}", range.as_ref().map(|(s, e)| format!(" (bytes {s}..{e})")).unwrap_or_default())]
    Fetch {
        /// The image reference.
        reference: String,
        /// The blob.
        digest: Digest,
        /// The byte range asked for, when ranged.
        range: Option<(u64, u64)>,
        /// The registry's error (boxed: it is large and errors are rare).
        #[source]
        source: Box<RegistryError>,
    },
    /// A blob's bytes did not match its descriptor.
    #[error("blob {digest} failed verification")]
    Verify {
        /// The blob.
        digest: Digest,
        /// Expected vs actual size or digest.
        #[source]
        source: VerifyError,
    },
    /// Decoding a layer failed.
    #[error("decompressing layer {index} ({digest}) from {path}")]
    Decompress {
        /// Layer index in the manifest.
        index: usize,
        /// The layer's digest.
        digest: Digest,
        /// The local copy of the blob.
        path: PathBuf,
        /// The decoder's error.
        #[source]
        source: io::Error,
    },
    /// Applying a layer tar failed.
    #[error("extracting layer {index} from {tar} into {target}")]
    Extract {
        /// Layer index in the manifest.
        index: usize,
        /// The decompressed layer tar.
        tar: PathBuf,
        /// Where it was being applied.
        target: PathBuf,
        /// The extractor's error (boxed: it is large and errors are rare).
        #[source]
        source: Box<rpull_extract::ExtractError>,
    },
    /// A file-system operation failed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done ("creating", "reading", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A child process (the end-to-end `rpull pull`) could not run or failed.
    #[error("`{command}` {outcome}{}", if stderr.is_empty() { String::new() } else { format!(": {}", stderr.trim()) })]
    Command {
        /// The command line.
        command: String,
        /// "could not be started: ..." or "exited with exit status: 1".
        outcome: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// The options do not make sense (no runs, a zero chunk size, ...).
    #[error("{0}")]
    Invalid(String),
    /// A worker thread panicked.
    #[error("a {0} thread panicked")]
    Panic(&'static str),
}

impl BenchError {
    /// An [`BenchError::Io`] for `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        BenchError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
