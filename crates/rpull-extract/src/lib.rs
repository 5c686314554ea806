//! Apply OCI image layers (uncompressed tar streams) to a directory tree, confined to its root.
//!
//! Layer 0 is extracted straight into the root with [`extract_layer`]; every later layer is extracted
//! into its own empty staging directory (concurrently with the others) and then applied in order with
//! [`merge_layer`]. [`finalize_tree`] applies directory metadata once every layer is merged.
//! See `docs/design.md` for the pipeline and the confinement rules.

mod backend;
mod error;
mod extract;
mod filesystem;
mod finalize;
mod merge;
mod metadata;
mod name;
mod options;
mod parallel;
mod remove;
mod resolve;
mod source;
mod summary;
mod uring;
mod walk;

pub use backend::{FileMetadata, FileSource, IoBackend, NewFile, StdBackend, TAR_READ_BUFFER};
pub use error::ExtractError;
pub use extract::{extract_layer, extract_layer_from};
pub use filesystem::{
    filesystem_type, in_memory_filesystem, parallel_creation_scales, preallocation_helps,
    recent_deletes_slow_creation, split_creation_helps, spread_new_trees,
};
pub use finalize::finalize_tree;
pub use merge::merge_layer;
pub use options::{CreateGate, ExtractOptions, IoBackendKind};
pub use parallel::ParallelBackend;
pub use source::{LENT_BYTES, LayerSource, Lender, LendingBuffer, SharedReader};
pub use summary::{
    DeferredHardlink, DirectoryMetadata, LayerSummary, MergeStats, Timestamp, Xattr,
};
pub use uring::UringBackend;
