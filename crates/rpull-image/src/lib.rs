//! rpull-image: build OCI images and push them.
//!
//! Layers come from a directory tree ([`layer_from_dir`]), a tar stream ([`layer_from_tar`]),
//! entries written one by one ([`LayerWriter`]) or a tar held in memory
//! ([`ImageLayer::from_tar`]). File-backed layers are compressed while they are written, and
//! both digests (the blob's and the tar's `diff_id`) are computed on the way, so a multi-GB
//! layer never sits in memory. [`ImageBuilder`] assembles the config and the manifest (OCI or
//! Docker schema 2), [`IndexBuilder`] an index / manifest list; an image is written as an OCI
//! layout or pushed ([`Image::push_with`]: monolithic or chunked uploads, cross-repository mounts,
//! timed).

mod blob;
mod compression;
mod error;
mod image;
mod layer;
mod layout;
mod push;

pub use blob::{Blob, sha256_digest, sha256_file};
pub use compression::Compression;
pub use error::ImageError;
pub use image::{
    Image, ImageBuilder, ImageIndex, IndexBuilder, IntoLayerTar, ManifestFormat, Platform,
    media_type,
};
pub use layer::{
    ImageLayer, LayerData, LayerSizes, LayerWriter, layer_from_dir, layer_from_tar, pax_records,
};
pub use push::{PUSH_CHUNK_SIZE, PushOptions, PushReport};
pub use rpull_registry;
