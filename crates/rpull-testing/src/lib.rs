//! rpull-testing: the harness every rpull integration test uses. Real `docker-registry`
//! processes (plain, htpasswd, TLS, token auth), fixture images built from code and pushed or
//! written as OCI layouts, tree snapshots and comparison, umoci as the reference unpacker, and a
//! counting HTTP proxy. Nothing here is mocked. The image builders themselves are `rpull-image`
//! (published), re-exported here under the names the tests use.

mod certs;
mod http;
mod image;
mod layer;
mod proxy;
mod push;
mod random;
mod registry;
mod relay;
mod token;
mod tree;
mod umoci;

pub use layer::{DEFAULT_MTIME, LayerBuilder};
pub use proxy::TestProxy;
pub use random::random_bytes;
pub use relay::CuttingRelay;
// The image builders and push moved to the published `rpull-image`; the same names stay here.
pub use registry::{
    REGISTRY_BINARY, RegistryAuth, RegistryOptions, TestRegistry, free_port, plain_config_yaml,
};
pub use rpull_image;
pub use rpull_image::{
    Blob, Compression, Image, ImageBuilder, ImageIndex, ImageLayer, IndexBuilder, IntoLayerTar,
    LayerData, LayerWriter, ManifestFormat, PUSH_CHUNK_SIZE, Platform, PushOptions, PushReport,
    layer_from_dir, layer_from_tar, media_type, sha256_digest, sha256_file,
};
pub use rpull_registry;
pub use tar::{EntryType, Header};
pub use token::{TOKEN_ISSUER, TOKEN_SERVICE, TokenIssuer, TokenOptions};
pub use tree::{DiffOptions, EntryKind, TreeEntry, TreeSnapshot, assert_trees_equal, diff};
pub use umoci::{umoci_binary, umoci_unpack};
