//! Manifest resolution: tag or digest -> (index -> platform) -> image manifest, verified.

use std::collections::BTreeMap;

use bytes::Bytes;
use oci_spec::image::{ImageIndex, ImageManifest};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use tracing::{debug, instrument};

use crate::client::{Client, scope, status_error};
use crate::digest::{Digest, Hasher};
use crate::error::Error;
use crate::platform::Platform;
use crate::reference::Reference;
use crate::transport::RequestSpec;

/// OCI image manifest.
pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker image manifest, schema 2.
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list.
pub const MEDIA_TYPE_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker schema 1 manifest (unsigned); detected only to reject it.
pub const MEDIA_TYPE_DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
/// Docker schema 1 manifest (signed); detected only to reject it.
pub const MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED: &str =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// Everything we ask for, so that schema 1 is at least *reported* rather than converted.
const ACCEPTED: [&str; 6] = [
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_OCI_MANIFEST,
    MEDIA_TYPE_DOCKER_MANIFEST,
    MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED,
    MEDIA_TYPE_DOCKER_SCHEMA1,
];

/// A pointer to content: media type, digest, size (and optional extras).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Media type of the content (layer media types are judged by the caller).
    pub media_type: String,
    /// Digest of the content.
    pub digest: Digest,
    /// Size in bytes.
    pub size: u64,
    /// Alternative download locations (foreign / non-distributable layers); left as-is.
    pub urls: Vec<String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// An image manifest resolved for one platform.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// The reference as asked for.
    pub reference: Reference,
    /// Digest of the image manifest (not of the index).
    pub manifest_digest: Digest,
    /// Media type of the image manifest.
    pub manifest_media_type: String,
    /// The exact manifest bytes (what `manifest_digest` hashes).
    pub manifest: Bytes,
    /// Digest of the index / manifest list the manifest was chosen from, if any.
    pub index_digest: Option<Digest>,
    /// The platform chosen from the index (`None` for a single-platform manifest).
    pub platform: Option<Platform>,
    /// The image config blob.
    pub config: Descriptor,
    /// Layers, base first.
    pub layers: Vec<Descriptor>,
}

/// One fetched manifest document.
struct Fetched {
    body: Bytes,
    media_type: String,
    digest: Digest,
}

impl Client {
    /// Resolves `reference` to the image manifest for `platform`: fetches the tag or digest,
    /// verifies digests, picks the platform from an index, rejects schema 1 and unknown types.
    #[instrument(skip_all, fields(reference = %reference, platform = %platform))]
    pub async fn resolve(
        &self,
        reference: &Reference,
        platform: &Platform,
    ) -> Result<ResolvedImage, Error> {
        let top = self
            .fetch_manifest(
                reference,
                &reference.manifest_reference(),
                reference.digest(),
            )
            .await?;
        match kind(&top.media_type) {
            Kind::Manifest => image_from(reference, top, None, None),
            Kind::Index => {
                let index: ImageIndex = parse(reference, &top)?;
                let mut available = Vec::new();
                let mut chosen = None;
                for entry in index.manifests() {
                    let Some(entry_platform) = entry.platform().as_ref().map(Platform::from) else {
                        continue;
                    };
                    if entry_platform.os == "unknown" {
                        // Attestations and other non-image entries (buildkit).
                        continue;
                    }
                    if chosen.is_none() && platform.matches(&entry_platform) {
                        chosen = Some((entry.digest().to_string(), entry_platform.clone()));
                    }
                    available.push(entry_platform);
                }
                let Some((digest, chosen_platform)) = chosen else {
                    return Err(Error::NoMatchingPlatform {
                        reference: reference.to_string(),
                        wanted: platform.clone(),
                        available,
                    });
                };
                let digest = Digest::parse(&digest)?;
                debug!(platform = %chosen_platform, %digest, "chose manifest from index");
                let child = self
                    .fetch_manifest(reference, digest.as_str(), Some(&digest))
                    .await?;
                match kind(&child.media_type) {
                    Kind::Manifest => {
                        image_from(reference, child, Some(top.digest), Some(chosen_platform))
                    }
                    Kind::Schema1 => Err(Error::Schema1 {
                        reference: reference.to_string(),
                    }),
                    Kind::Index | Kind::Unknown => Err(Error::ManifestUnknownMediaType {
                        reference: format!("{}@{digest}", reference.name()),
                        media_type: child.media_type,
                    }),
                }
            }
            Kind::Schema1 => Err(Error::Schema1 {
                reference: reference.to_string(),
            }),
            Kind::Unknown => Err(Error::ManifestUnknownMediaType {
                reference: reference.to_string(),
                media_type: top.media_type,
            }),
        }
    }

    /// GETs `/v2/<repo>/manifests/<target>`; verifies against `expected` when pulling by digest,
    /// else against the registry's `Docker-Content-Digest` when it uses the same algorithm.
    async fn fetch_manifest(
        &self,
        reference: &Reference,
        target: &str,
        expected: Option<&Digest>,
    ) -> Result<Fetched, Error> {
        let spec = RequestSpec::new(
            Method::GET,
            format!("/v2/{}/manifests/{target}", reference.repository()),
        )
        .header(ACCEPT, &ACCEPTED.join(", "));
        let response = self
            .execute(reference, &[scope(reference.repository(), "pull")], &spec)
            .await?;
        if response.status() != StatusCode::OK {
            let what = format!(
                "{}{}{target}",
                reference.name(),
                if target.contains(':') { "@" } else { ":" }
            );
            return Err(status_error(reference, "GET", response, Some(what)).await);
        }
        let header_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned());
        let reported = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v.trim()).ok());
        let body = read_limited(response, reference).await?;
        let media_type = match header_type.filter(|t| is_manifest_type(t)) {
            Some(t) => t,
            None => sniff_media_type(&body),
        };
        let check = expected.or(reported.as_ref());
        let algorithm = check.map_or(crate::DigestAlgorithm::Sha256, Digest::algorithm);
        let actual = {
            let mut hasher = Hasher::new(algorithm);
            hasher.update(&body);
            hasher.finish()
        };
        // Schema 1 digests cover the payload without its JWS signatures, so they never match the
        // body; it is rejected by the caller anyway, with a better message than a mismatch.
        if let Some(check) = check
            && &actual != check
            && !matches!(kind(&media_type), Kind::Schema1)
        {
            let at = if target.contains(':') { '@' } else { ':' };
            return Err(Error::DigestMismatch {
                what: format!("manifest {}{at}{target}", reference.name()),
                expected: check.clone(),
                actual,
            });
        }
        Ok(Fetched {
            body,
            media_type,
            digest: actual,
        })
    }
}

/// containerd's limit: a manifest is metadata, and a hostile registry must not make us buffer gigabytes.
const MAX_MANIFEST_SIZE: usize = 4 * 1024 * 1024;

async fn read_limited(
    mut response: reqwest::Response,
    reference: &Reference,
) -> Result<Bytes, Error> {
    let url = crate::error::display_url(response.url());
    let too_large = || Error::InvalidManifest {
        reference: reference.to_string(),
        media_type: "?".to_owned(),
        message: format!("larger than the {MAX_MANIFEST_SIZE}-byte limit for manifests ({url})"),
    };
    if response
        .content_length()
        .is_some_and(|len| len > MAX_MANIFEST_SIZE as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_MANIFEST_SIZE {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Bytes::from(body)),
            Err(source) => {
                return Err(Error::Transport {
                    url,
                    error: source.without_url(),
                });
            }
        }
    }
}

enum Kind {
    Manifest,
    Index,
    Schema1,
    Unknown,
}

fn kind(media_type: &str) -> Kind {
    match media_type {
        MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST => Kind::Manifest,
        MEDIA_TYPE_OCI_INDEX | MEDIA_TYPE_DOCKER_MANIFEST_LIST => Kind::Index,
        MEDIA_TYPE_DOCKER_SCHEMA1 | MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED => Kind::Schema1,
        _ => Kind::Unknown,
    }
}

/// Whether a Content-Type is specific enough to trust (not `application/json`, `text/plain`...).
fn is_manifest_type(media_type: &str) -> bool {
    media_type.starts_with("application/vnd.")
}

/// For registries that send a generic Content-Type: the body's `mediaType`, else its shape.
fn sniff_media_type(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        schema_version: Option<u64>,
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        config: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
        fs_layers: Option<serde_json::Value>,
    }
    let Ok(probe) = serde_json::from_slice::<Probe>(body) else {
        return "application/octet-stream (not JSON)".to_owned();
    };
    if let Some(media_type) = probe.media_type {
        return media_type;
    }
    if probe.schema_version == Some(1) || probe.fs_layers.is_some() {
        return MEDIA_TYPE_DOCKER_SCHEMA1.to_owned();
    }
    if probe.manifests.is_some() {
        return MEDIA_TYPE_OCI_INDEX.to_owned();
    }
    if probe.config.is_some() && probe.layers.is_some() {
        return MEDIA_TYPE_OCI_MANIFEST.to_owned();
    }
    "application/json (unrecognised manifest)".to_owned()
}

fn parse<T: serde::de::DeserializeOwned>(
    reference: &Reference,
    fetched: &Fetched,
) -> Result<T, Error> {
    serde_json::from_slice(&fetched.body).map_err(|e| Error::InvalidManifest {
        reference: reference.to_string(),
        media_type: fetched.media_type.clone(),
        message: e.to_string(),
    })
}

fn image_from(
    reference: &Reference,
    fetched: Fetched,
    index_digest: Option<Digest>,
    platform: Option<Platform>,
) -> Result<ResolvedImage, Error> {
    let manifest: ImageManifest = parse(reference, &fetched)?;
    let convert = |d: &oci_spec::image::Descriptor| -> Result<Descriptor, Error> {
        Ok(Descriptor {
            media_type: d.media_type().to_string(),
            digest: Digest::parse(d.digest().as_ref())?,
            size: d.size(),
            urls: d.urls().clone().unwrap_or_default(),
            annotations: d
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        })
    };
    Ok(ResolvedImage {
        reference: reference.clone(),
        manifest_digest: fetched.digest,
        manifest_media_type: fetched.media_type,
        manifest: fetched.body,
        index_digest,
        platform,
        config: convert(manifest.config())?,
        layers: manifest
            .layers()
            .iter()
            .map(convert)
            .collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::image::{MediaType, ToDockerV2S2 as _};

    #[test]
    fn constants_agree_with_oci_spec() {
        assert_eq!(MEDIA_TYPE_OCI_MANIFEST, MediaType::ImageManifest.as_ref());
        assert_eq!(MEDIA_TYPE_OCI_INDEX, MediaType::ImageIndex.as_ref());
        assert_eq!(
            MEDIA_TYPE_DOCKER_MANIFEST,
            MediaType::ImageManifest.to_docker_v2s2().unwrap()
        );
        assert_eq!(
            MEDIA_TYPE_DOCKER_MANIFEST_LIST,
            MediaType::ImageIndex.to_docker_v2s2().unwrap()
        );
    }

    #[test]
    fn sniffing() {
        let cases = [
            (
                r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json"}"#,
                MEDIA_TYPE_DOCKER_MANIFEST,
            ),
            (
                r#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#,
                MEDIA_TYPE_DOCKER_SCHEMA1,
            ),
            (
                r#"{"schemaVersion":2,"manifests":[]}"#,
                MEDIA_TYPE_OCI_INDEX,
            ),
            (
                r#"{"schemaVersion":2,"config":{},"layers":[]}"#,
                MEDIA_TYPE_OCI_MANIFEST,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(sniff_media_type(body.as_bytes()), expected, "{body}");
        }
        assert!(matches!(kind(&sniff_media_type(b"garbage")), Kind::Unknown));
        assert!(matches!(kind(&sniff_media_type(b"{}")), Kind::Unknown));
    }

    #[test]
    fn docker_manifest_converts() {
        let body = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_DOCKER_MANIFEST,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": 2,
                "digest": Digest::sha256_of(b"{}").to_string()
            },
            "layers": [{
                "mediaType": "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
                "size": 5,
                "digest": Digest::sha256_of(b"layer").to_string(),
                "urls": ["https://example.invalid/layer"]
            }]
        })
        .to_string();
        let fetched = Fetched {
            body: Bytes::from(body.clone()),
            media_type: MEDIA_TYPE_DOCKER_MANIFEST.to_owned(),
            digest: Digest::sha256_of(body.as_bytes()),
        };
        let reference = Reference::parse("localhost:5000/a/b:t").unwrap();
        let image = image_from(&reference, fetched, None, None).unwrap();
        assert_eq!(image.config.size, 2);
        assert_eq!(image.layers.len(), 1);
        assert_eq!(
            image.layers[0].media_type,
            "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
        );
        assert_eq!(
            image.layers[0].urls,
            vec!["https://example.invalid/layer".to_owned()]
        );
        assert_eq!(image.manifest_digest, Digest::sha256_of(body.as_bytes()));
    }
}
