//! Pushing images and indexes with `rpull_registry::Client`: blobs the repository already has are
//! skipped, blobs another repository of the registry has are mounted, the rest are uploaded
//! (in memory: one monolithic upload; file-backed: chunked), then the manifest.

use std::time::Instant;

use rpull_registry::{Client, Digest, Reference};
use tracing::debug;

use crate::{Blob, Image, ImageError, ImageIndex, LayerData};

/// Chunk size for `push_blob_chunked` of file-backed layers.
pub const PUSH_CHUNK_SIZE: usize = 16 << 20;

/// How to push.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// PATCH size of chunked uploads (file-backed layers).
    pub chunk_size: usize,
    /// Repositories of the same registry to mount missing blobs from when they have them.
    pub mount_from: Vec<String>,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            chunk_size: PUSH_CHUNK_SIZE,
            mount_from: Vec::new(),
        }
    }
}

/// What a push did and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct PushReport {
    /// The reference pushed to.
    pub reference: String,
    /// Digest of the manifest (or index) pushed under the tag.
    pub digest: Digest,
    /// Wall seconds from the first request to the manifest's acceptance.
    pub seconds: f64,
    /// Blob bytes uploaded (mounted and present blobs not counted).
    pub uploaded_bytes: u64,
    /// Blobs uploaded.
    pub blobs_uploaded: usize,
    /// Blobs mounted from another repository.
    pub blobs_mounted: usize,
    /// Blobs the repository already had.
    pub blobs_present: usize,
}

fn parse(reference: &str) -> Result<(Reference, String), ImageError> {
    let parsed: Reference = reference.parse().map_err(|source| ImageError::Reference {
        reference: reference.to_owned(),
        source,
    })?;
    let tag = parsed.tag().unwrap_or("latest").to_owned();
    Ok((parsed, tag))
}

fn digest(digest: &str) -> Result<Digest, ImageError> {
    Digest::parse(digest).map_err(|source| ImageError::Digest {
        digest: digest.to_owned(),
        source,
    })
}

fn registry_error(what: String) -> impl FnOnce(rpull_registry::Error) -> ImageError {
    move |source| ImageError::Registry {
        what,
        source: Box::new(source),
    }
}

#[derive(Default)]
struct Counts {
    uploaded_bytes: u64,
    blobs_uploaded: usize,
    blobs_mounted: usize,
    blobs_present: usize,
}

enum BlobSource<'a> {
    Memory(&'a bytes::Bytes),
    File(&'a std::path::Path),
}

impl Image {
    /// Pushes layers and config (skipping blobs the repository has), then the manifest under the
    /// reference's tag (`latest` if none). Returns the manifest digest.
    pub async fn push(&self, client: &Client, reference: &str) -> Result<Digest, ImageError> {
        Ok(self
            .push_with(client, reference, &PushOptions::default())
            .await?
            .digest)
    }

    /// [`Image::push`] with options, reporting what was uploaded and the time it took.
    pub async fn push_with(
        &self,
        client: &Client,
        reference: &str,
        options: &PushOptions,
    ) -> Result<PushReport, ImageError> {
        push_tagged(client, reference, &self.manifest, async |repo, counts| {
            self.push_blobs(client, repo, options, counts).await
        })
        .await
    }

    async fn push_blobs(
        &self,
        client: &Client,
        repo: &Reference,
        options: &PushOptions,
        counts: &mut Counts,
    ) -> Result<(), ImageError> {
        for layer in &self.layers {
            let source = match &layer.data {
                LayerData::Memory(bytes) => BlobSource::Memory(bytes),
                LayerData::File(path) => BlobSource::File(path),
            };
            push_blob(
                client,
                repo,
                &layer.digest,
                layer.size,
                source,
                options,
                counts,
            )
            .await?;
        }
        let config = &self.config;
        push_blob(
            client,
            repo,
            &config.digest,
            config.size(),
            BlobSource::Memory(&config.bytes),
            options,
            counts,
        )
        .await
    }
}

async fn push_blob(
    client: &Client,
    repo: &Reference,
    blob_digest: &str,
    size: u64,
    source: BlobSource<'_>,
    options: &PushOptions,
    counts: &mut Counts,
) -> Result<(), ImageError> {
    let parsed = digest(blob_digest)?;
    let name = repo.name();
    if client
        .blob_exists(repo, &parsed)
        .await
        .map_err(registry_error(format!(
            "checking for blob {blob_digest} in {name}"
        )))?
    {
        counts.blobs_present += 1;
        return Ok(());
    }
    for from in &options.mount_from {
        if from == repo.repository() {
            continue;
        }
        let from_name = format!("{}/{from}", repo.registry());
        let from_repo: Reference = from_name.parse().map_err(|source| ImageError::Reference {
            reference: from_name.clone(),
            source,
        })?;
        let there = client
            .blob_exists(&from_repo, &parsed)
            .await
            .map_err(registry_error(format!(
                "checking for blob {blob_digest} in {}",
                from_repo.name()
            )))?;
        if there
            && client
                .mount_blob(repo, from, &parsed)
                .await
                .map_err(registry_error(format!(
                    "mounting blob {blob_digest} from {from} into {name}"
                )))?
        {
            debug!(digest = blob_digest, from, "mounted");
            counts.blobs_mounted += 1;
            return Ok(());
        }
    }
    let what = format!("pushing blob {blob_digest} to {name}");
    match source {
        BlobSource::Memory(bytes) => client.push_blob(repo, &parsed, bytes.clone()).await,
        BlobSource::File(path) => {
            let file = tokio::fs::File::open(path).await.map_err(|e| {
                ImageError::Io(std::io::Error::new(
                    e.kind(),
                    format!("opening {}: {e}", path.display()),
                ))
            })?;
            client
                .push_blob_chunked(repo, &parsed, file, options.chunk_size)
                .await
        }
    }
    .map_err(registry_error(what))?;
    counts.blobs_uploaded += 1;
    counts.uploaded_bytes += size;
    Ok(())
}

async fn push_manifest(
    client: &Client,
    repo: &Reference,
    tag: &str,
    manifest: &Blob,
    reference: &str,
) -> Result<Digest, ImageError> {
    client
        .push_manifest(repo, tag, &manifest.media_type, manifest.bytes.clone())
        .await
        .map_err(registry_error(format!(
            "pushing the manifest of {reference}"
        )))
}

/// What every push does around its own part: parses `reference`, runs `content` (which pushes
/// everything `tagged` refers to, counting the blobs), pushes `tagged` under the reference's tag
/// (`latest` if none) and reports, timed from the first request to the tag's acceptance.
async fn push_tagged(
    client: &Client,
    reference: &str,
    tagged: &Blob,
    content: impl AsyncFnOnce(&Reference, &mut Counts) -> Result<(), ImageError>,
) -> Result<PushReport, ImageError> {
    let started = Instant::now();
    let (repo, tag) = parse(reference)?;
    let mut counts = Counts::default();
    content(&repo, &mut counts).await?;
    let digest = push_manifest(client, &repo, &tag, tagged, reference).await?;
    Ok(PushReport {
        reference: reference.to_owned(),
        digest,
        seconds: started.elapsed().as_secs_f64(),
        uploaded_bytes: counts.uploaded_bytes,
        blobs_uploaded: counts.blobs_uploaded,
        blobs_mounted: counts.blobs_mounted,
        blobs_present: counts.blobs_present,
    })
}

impl ImageIndex {
    /// Pushes every image (blobs, then its manifest by digest), then the index under the tag.
    /// Returns the index digest.
    pub async fn push(&self, client: &Client, reference: &str) -> Result<Digest, ImageError> {
        Ok(self
            .push_with(client, reference, &PushOptions::default())
            .await?
            .digest)
    }

    /// [`ImageIndex::push`] with options, reporting what was uploaded and the time it took.
    pub async fn push_with(
        &self,
        client: &Client,
        reference: &str,
        options: &PushOptions,
    ) -> Result<PushReport, ImageError> {
        push_tagged(client, reference, &self.index, async |repo, counts| {
            for image in &self.images {
                image.push_blobs(client, repo, options, counts).await?;
                let what = format!("{reference} (manifest {})", image.manifest.digest);
                push_manifest(client, repo, &image.manifest.digest, &image.manifest, &what).await?;
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The push futures stay `Send`, so callers can spawn them.
    #[test]
    fn push_futures_are_send() {
        let image = crate::ImageBuilder::new().build();
        let index = crate::IndexBuilder::new(crate::ManifestFormat::default())
            .image(image.clone())
            .build();
        let client = Client::new().expect("a client");
        let options = PushOptions::default();
        assert_send(&image.push(&client, "localhost:5000/a:1"));
        assert_send(&image.push_with(&client, "localhost:5000/a:1", &options));
        assert_send(&index.push(&client, "localhost:5000/a:1"));
        assert_send(&index.push_with(&client, "localhost:5000/a:1", &options));
    }
}
