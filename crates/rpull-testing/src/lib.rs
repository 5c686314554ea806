//! rpull-testing: the harness every rpull integration test uses. Real `docker-registry`
//! processes (plain, htpasswd, TLS, token auth), fixture images built from code and pushed or
//! written as OCI layouts, tree snapshots and comparison, umoci as the reference unpacker, and a
//! counting HTTP proxy. Nothing here is mocked.

mod certs;
mod dir_layer;
mod http;
mod image;
mod layer;
mod proxy;
mod push;
mod registry;
mod token;
mod tree;
mod umoci;

pub use dir_layer::layer_from_dir;
pub use image::{
    Image, ImageBuilder, ImageIndex, ImageLayer, IndexBuilder, LayerData, ManifestFormat, Platform,
    media_type, sha256_file,
};
pub use layer::{Blob, Compression, DEFAULT_MTIME, LayerBuilder, sha256_digest};
pub use proxy::TestProxy;
pub use push::PUSH_CHUNK_SIZE;
pub use registry::{
    REGISTRY_BINARY, RegistryAuth, RegistryOptions, TestRegistry, free_port, plain_config_yaml,
};
pub use rpull_registry;
pub use tar::{EntryType, Header};
pub use token::{TOKEN_ISSUER, TOKEN_SERVICE, TokenIssuer, TokenOptions};
pub use tree::{DiffOptions, EntryKind, TreeEntry, TreeSnapshot, assert_trees_equal, diff};
pub use umoci::{umoci_binary, umoci_unpack};
