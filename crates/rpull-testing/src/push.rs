//! Pushing fixture images with the real `rpull_registry::Client`, and a client configured for a
//! `TestRegistry`.

use anyhow::{Context, Result};
use rpull_registry::{Client, CredentialStore, Credentials, Digest, Reference};

use crate::image::{Image, ImageIndex, LayerData};
use crate::registry::TestRegistry;

/// Chunk size for `push_blob_chunked` of file-backed layers.
pub const PUSH_CHUNK_SIZE: usize = 16 << 20;

fn parse(reference: &str) -> Result<(Reference, String)> {
    let parsed: Reference = reference
        .parse()
        .with_context(|| format!("parsing reference {reference:?}"))?;
    let tag = parsed.tag().unwrap_or("latest").to_owned();
    Ok((parsed, tag))
}

fn digest(digest: &str) -> Result<Digest> {
    Digest::parse(digest).with_context(|| format!("parsing digest {digest:?}"))
}

impl Image {
    /// Pushes layers and config (skipping blobs the repository has), then the manifest under the
    /// reference's tag (`latest` if none). Returns the manifest digest.
    pub async fn push(&self, client: &Client, reference: &str) -> Result<Digest> {
        let (repo, tag) = parse(reference)?;
        self.push_blobs(client, &repo).await?;
        let pushed = client
            .push_manifest(
                &repo,
                &tag,
                &self.manifest.media_type,
                self.manifest.bytes.clone(),
            )
            .await
            .with_context(|| format!("pushing the manifest of {reference}"))?;
        Ok(pushed)
    }

    async fn push_blobs(&self, client: &Client, repo: &Reference) -> Result<()> {
        for layer in &self.layers {
            let layer_digest = digest(&layer.digest)?;
            if client.blob_exists(repo, &layer_digest).await? {
                continue;
            }
            match &layer.data {
                LayerData::Memory(bytes) => {
                    client.push_blob(repo, &layer_digest, bytes.clone()).await
                }
                LayerData::File(path) => {
                    let file = tokio::fs::File::open(path)
                        .await
                        .with_context(|| format!("opening {}", path.display()))?;
                    client
                        .push_blob_chunked(repo, &layer_digest, file, PUSH_CHUNK_SIZE)
                        .await
                }
            }
            .with_context(|| format!("pushing layer {} to {}", layer.digest, repo.name()))?;
        }
        let config_digest = digest(&self.config.digest)?;
        if !client.blob_exists(repo, &config_digest).await? {
            client
                .push_blob(repo, &config_digest, self.config.bytes.clone())
                .await
                .with_context(|| {
                    format!("pushing config {} to {}", self.config.digest, repo.name())
                })?;
        }
        Ok(())
    }
}

impl ImageIndex {
    /// Pushes every image (blobs, then its manifest by digest), then the index under the tag.
    /// Returns the index digest.
    pub async fn push(&self, client: &Client, reference: &str) -> Result<Digest> {
        let (repo, tag) = parse(reference)?;
        for image in &self.images {
            image.push_blobs(client, &repo).await?;
            client
                .push_manifest(
                    &repo,
                    &image.manifest.digest,
                    &image.manifest.media_type,
                    image.manifest.bytes.clone(),
                )
                .await
                .with_context(|| {
                    format!("pushing manifest {} of {reference}", image.manifest.digest)
                })?;
        }
        let pushed = client
            .push_manifest(
                &repo,
                &tag,
                &self.index.media_type,
                self.index.bytes.clone(),
            )
            .await
            .with_context(|| format!("pushing the index of {reference}"))?;
        Ok(pushed)
    }
}

impl TestRegistry {
    /// A client set up for this registry: plain HTTP or its CA, its credentials, and no
    /// credentials from the user's docker/podman files.
    pub fn client(&self) -> Result<Client> {
        let mut builder = Client::builder()
            .plain_http(!self.is_tls())
            .credential_store(CredentialStore::empty());
        if let Some(ca) = self.ca_cert_path() {
            builder = builder.ca_cert(ca);
        }
        if let Some((user, password)) = self.credentials() {
            builder = builder.credentials(&self.host(), Credentials::basic(user, password));
        }
        Ok(builder.build()?)
    }

    /// Pushes `image` as `repo_tag` (e.g. `"app:1.0"`) with `client()`.
    pub async fn push_image(&self, image: &Image, repo_tag: &str) -> Result<Digest> {
        image.push(&self.client()?, &self.reference(repo_tag)).await
    }

    /// Pushes `index` as `repo_tag` with `client()`.
    pub async fn push_index(&self, index: &ImageIndex, repo_tag: &str) -> Result<Digest> {
        index.push(&self.client()?, &self.reference(repo_tag)).await
    }
}
