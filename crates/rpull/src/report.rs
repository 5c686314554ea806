use std::path::PathBuf;

use rpull_registry::Digest;

use crate::FsyncPolicy;
use serde::Serialize;

/// What a successful pull did.
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    /// The normalised reference that was pulled.
    pub reference: String,
    /// Digest of the platform manifest.
    pub manifest_digest: Digest,
    /// `os/arch[/variant]` of the image.
    pub platform: String,
    /// Where the tree is.
    pub destination: PathBuf,
    /// Per layer, in manifest order.
    pub layers: Vec<LayerReport>,
    /// Sum of the layers' compressed sizes.
    pub compressed_bytes: u64,
    /// Sum of the layers' tar sizes.
    pub uncompressed_bytes: u64,
    /// Wall time of the whole pull, resolve to commit.
    pub seconds: f64,
    /// The durability policy applied (`auto` resolved to `end` or `none`).
    pub fsync: FsyncPolicy,
    /// Seconds spent in `syncfs`/`fsync` (included in `seconds`).
    pub sync_seconds: f64,
}

/// One layer of a [`PullReport`].
#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    /// Layer digest (of the compressed blob).
    pub digest: Digest,
    /// Media type as declared.
    pub media_type: String,
    /// Codec the bytes actually had.
    pub codec: String,
    /// Compressed size.
    pub compressed_bytes: u64,
    /// Size of the tar stream.
    pub uncompressed_bytes: u64,
    /// Tar entries applied (whiteouts included).
    pub entries: u64,
    /// Seconds from the first requested byte to the last verified byte.
    pub download_seconds: f64,
    /// Seconds from the first byte to the end of extraction into staging.
    pub extract_seconds: f64,
}
