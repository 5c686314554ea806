//! rpull: pull an OCI image into a root filesystem as one stream.
//!
//! Layers download concurrently; each is verified (digest and size) as its bytes arrive,
//! decompressed and extracted into its own staging directory while it downloads, and the staged
//! layers are merged in order into the final tree, which is renamed into place only when
//! everything succeeded.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rpull::{Puller, Reference};
//! let puller = Puller::builder().build()?;
//! let reference: Reference = "127.0.0.1:5000/library/alpine:3.20".parse()?;
//! let report = puller.pull(&reference, std::path::Path::new("rootfs")).await?;
//! println!("{} layers, {} bytes", report.layers.len(), report.compressed_bytes);
//! # Ok(()) }
//! ```

mod channel_reader;
mod decoded;
mod decoding;
mod durability;
mod error;
mod events;
mod options;
mod pipeline;
mod puller;
mod report;
mod staging;

pub use durability::FsyncPolicy;
pub use error::PullError;
pub use events::{LayerState, PullEvent};
pub use options::{
    DEFAULT_CONNECTIONS_PER_BLOB, DEFAULT_MAX_CONCURRENT_DOWNLOADS, DEFAULT_RANGE_BUDGET,
    PullOptions,
};
pub use puller::{Puller, PullerBuilder};
pub use report::{LayerReport, PullReport};

pub use rpull_extract::{ExtractOptions, IoBackendKind};
pub use rpull_registry::{CredentialStore, Credentials, Digest, Platform, Reference};

/// The registry client (transport, auth, manifests, blobs), for embedders that configure it.
pub use rpull_registry as registry;
