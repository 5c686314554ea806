//! rpull-registry: the OCI Distribution protocol for rpull — references, digests, platforms,
//! transport (HTTPS / HTTP / TLS options / proxies), auth (challenges, token cache, docker and
//! podman credential files, credential helpers), manifest resolution, streaming blob GET, digest
//! verification as bytes arrive (inline, or on a blocking-pool thread), and push.

#![warn(missing_docs)]

mod auth;
mod background;
mod blob;
mod client;
mod credentials;
mod digest;
mod error;
mod manifest;
mod platform;
mod push;
mod ranged;
mod reference;
mod tls;
mod transport;

pub use background::BackgroundVerifier;
pub use blob::BlobStream;
pub use client::{Client, ClientBuilder};
pub use credentials::{CredentialError, CredentialStore, Credentials};
pub use digest::{Digest, DigestAlgorithm, DigestError, DigestVerifier, Hasher, VerifyError};
pub use error::Error;
pub use manifest::{
    Descriptor, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_DOCKER_SCHEMA1, MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED, MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST, ResolvedImage,
};
pub use platform::{Platform, PlatformError};
pub use ranged::{RANGE_SLICE, RangeBudget, split_ranges};
pub use reference::{DOCKER_HUB, DOCKER_HUB_API_HOST, Reference, ReferenceError};
