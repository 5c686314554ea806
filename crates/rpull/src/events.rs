use rpull_registry::Digest;
use serde::Serialize;

/// Where a layer is in the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerState {
    /// Waiting for a download slot.
    Waiting,
    /// Bytes are arriving and being extracted as they come.
    Downloading,
    /// All bytes arrived and matched the digest; extraction may still be finishing.
    Verified,
    /// Extracted into its staging directory.
    Extracted,
    /// Merged into the final tree.
    Merged,
}

/// Progress of a pull, in the order it happens. Serialised as one JSON object per event
/// (`{"event": "layer_progress", ...}`) by the CLI's `--json`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PullEvent {
    /// The reference was resolved to a manifest.
    Resolved {
        /// The normalised reference.
        reference: String,
        /// The digest of the platform manifest.
        manifest_digest: Digest,
        /// `os/arch[/variant]` chosen.
        platform: String,
        /// Layer digests and compressed sizes, in order.
        layers: Vec<(Digest, u64)>,
    },
    /// A layer changed state.
    LayerState {
        /// Position of the layer in the manifest.
        index: usize,
        /// Its digest.
        digest: Digest,
        /// The new state.
        state: LayerState,
    },
    /// Bytes of a layer arrived (sent at most every 64 KiB or so per layer).
    LayerProgress {
        /// Position of the layer in the manifest.
        index: usize,
        /// Compressed bytes received so far.
        downloaded: u64,
        /// Compressed size from the manifest.
        total: u64,
    },
    /// The tree was renamed into place.
    Committed {
        /// The destination directory.
        path: String,
    },
}
