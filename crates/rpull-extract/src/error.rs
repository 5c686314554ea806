use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Everything that can go wrong while extracting, merging or finalizing a layer.
///
/// Every variant names the entry (the path inside the layer or the root, displayed lossily when it
/// is not UTF-8); file-system failures carry the OS error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExtractError {
    /// The tar stream itself could not be read (truncated stream, bad header, decoder error), in
    /// a header or in an entry's data.
    #[error("reading the layer tar stream{}", at_entry(entry))]
    Tar {
        /// The entry whose data or extension records were being read, or, when a header could not
        /// be read, the last entry read successfully (empty before the first one).
        entry: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A file-system operation on an entry failed.
    #[error("{operation} {}", entry.display())]
    Io {
        /// The entry, relative to the root of the tree being written.
        entry: PathBuf,
        /// What was being done, e.g. "creating file".
        operation: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The entry tries to reach outside the root: its name, its hardlink target, a whiteout or a
    /// symlink on its way climbs above the root with `..`.
    #[error("entry {} escapes the root: {detail}", entry.display())]
    Escape {
        /// The offending entry.
        entry: PathBuf,
        /// Why it escapes.
        detail: String,
    },
    /// The entry cannot be applied (it names the root itself as a non-directory, contains a NUL
    /// byte, is a hardlink without a target, ...).
    #[error("invalid entry {}: {detail}", entry.display())]
    Invalid {
        /// The offending entry.
        entry: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
}

/// ` at entry NAME`, or nothing before the first entry.
fn at_entry(entry: &Path) -> String {
    if entry.as_os_str().is_empty() {
        String::new()
    } else {
        format!(" at entry {}", entry.display())
    }
}

/// A path for an error message, from the raw bytes of an entry name.
pub(crate) fn entry_path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}

pub(crate) fn io_error(
    entry: &[u8],
    operation: &'static str,
    source: impl Into<io::Error>,
) -> ExtractError {
    ExtractError::Io {
        entry: entry_path(entry),
        operation,
        source: source.into(),
    }
}

pub(crate) fn escape(entry: &[u8], detail: impl Into<String>) -> ExtractError {
    ExtractError::Escape {
        entry: entry_path(entry),
        detail: detail.into(),
    }
}

pub(crate) fn invalid(entry: &[u8], detail: impl Into<String>) -> ExtractError {
    ExtractError::Invalid {
        entry: entry_path(entry),
        detail: detail.into(),
    }
}
