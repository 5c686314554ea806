//! Pushing blobs (monolithic, chunked, cross-repository mount) and manifests.

use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_RANGE, CONTENT_TYPE, LOCATION};
use reqwest::{Method, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::{debug, instrument};
use url::Url;

use crate::client::{Client, scope, status_error};
use crate::digest::{Digest, Hasher};
use crate::error::{Error, display_url};
use crate::reference::Reference;
use crate::transport::RequestSpec;

const OCTET_STREAM: &str = "application/octet-stream";

impl Client {
    /// Whether `repo` already has the blob (`HEAD /v2/<repo>/blobs/<digest>`). Tag/digest of
    /// `repo` are ignored.
    pub async fn blob_exists(&self, repo: &Reference, digest: &Digest) -> Result<bool, Error> {
        let spec = RequestSpec::new(
            Method::HEAD,
            format!("/v2/{}/blobs/{digest}", repo.repository()),
        );
        let response = self
            .execute(repo, &[scope(repo.repository(), "pull")], &spec)
            .await?;
        match response.status() {
            status if status.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(status_error(repo, "HEAD", response, None).await),
        }
    }

    /// Uploads `data` as blob `digest` in one request (POST an upload session, then
    /// `PUT <location>?digest=`).
    #[instrument(skip_all, fields(repo = %repo.name(), digest = %digest, size = data.len()))]
    pub async fn push_blob(
        &self,
        repo: &Reference,
        digest: &Digest,
        data: Bytes,
    ) -> Result<(), Error> {
        let actual = {
            let mut hasher = Hasher::new(digest.algorithm());
            hasher.update(&data);
            hasher.finish()
        };
        if &actual != digest {
            return Err(Error::DigestMismatch {
                what: format!("blob to push to {}", repo.name()),
                expected: digest.clone(),
                actual,
            });
        }
        let scopes = push_scopes(repo);
        let location = self.start_upload(repo, &scopes, None).await?.location;
        self.finish_upload(repo, &scopes, location, digest, data)
            .await
    }

    /// Uploads the blob read from `reader` in PATCH requests of `chunk_size` bytes, then
    /// `PUT ?digest=`. Holds one chunk in memory. Checks the digest before committing.
    #[instrument(skip_all, fields(repo = %repo.name(), digest = %digest, chunk_size))]
    pub async fn push_blob_chunked(
        &self,
        repo: &Reference,
        digest: &Digest,
        mut reader: impl AsyncRead + Unpin + Send,
        chunk_size: usize,
    ) -> Result<(), Error> {
        let chunk_size = chunk_size.max(1);
        let scopes = push_scopes(repo);
        let mut location = self.start_upload(repo, &scopes, None).await?.location;
        let mut hasher = Hasher::new(digest.algorithm());
        let mut offset = 0u64;
        loop {
            let chunk = read_chunk(&mut reader, chunk_size)
                .await
                .map_err(|source| Error::Read {
                    digest: digest.clone(),
                    source,
                })?;
            if chunk.is_empty() {
                break;
            }
            hasher.update(&chunk);
            let end = offset + chunk.len() as u64 - 1;
            let mut spec = RequestSpec::to_url(Method::PATCH, location.clone())
                .header(CONTENT_TYPE, OCTET_STREAM)
                .header(CONTENT_RANGE, &format!("{offset}-{end}"))
                .body(chunk);
            spec.retry = false;
            let response = self.execute(repo, &scopes, &spec).await?;
            if response.status() != StatusCode::ACCEPTED && !response.status().is_success() {
                return Err(status_error(repo, "PATCH", response, None).await);
            }
            location = resolve_location(&response)?;
            offset = end + 1;
        }
        let actual = hasher.finish();
        if &actual != digest {
            self.cancel_upload(repo, &scopes, location).await;
            return Err(Error::DigestMismatch {
                what: format!("blob to push to {}", repo.name()),
                expected: digest.clone(),
                actual,
            });
        }
        debug!(bytes = offset, "chunks uploaded; committing");
        self.finish_upload(repo, &scopes, location, digest, Bytes::new())
            .await
    }

    /// Asks the registry to mount `digest` from repository `from` (same registry) into `repo`.
    /// Returns `true` if mounted (201); `false` if the registry opened an upload session
    /// instead (202), which is cancelled.
    pub async fn mount_blob(
        &self,
        repo: &Reference,
        from: &str,
        digest: &Digest,
    ) -> Result<bool, Error> {
        let scopes = vec![scope(repo.repository(), "pull,push"), scope(from, "pull")];
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("mount", digest.as_str())
            .append_pair("from", from)
            .finish();
        let upload = self.start_upload(repo, &scopes, Some(&query)).await?;
        if upload.status == StatusCode::CREATED {
            return Ok(true);
        }
        debug!(%digest, from, "registry did not mount; cancelling the upload session it opened");
        self.cancel_upload(repo, &scopes, upload.location).await;
        Ok(false)
    }

    /// Uploads a manifest under `tag` (or a digest string) with `media_type` as Content-Type.
    /// Returns its sha256 digest, checked against the registry's `Docker-Content-Digest`.
    #[instrument(skip_all, fields(repo = %repo.name(), tag, media_type))]
    pub async fn push_manifest(
        &self,
        repo: &Reference,
        tag: &str,
        media_type: &str,
        body: Bytes,
    ) -> Result<Digest, Error> {
        let digest = Digest::sha256_of(&body);
        let spec = RequestSpec::new(
            Method::PUT,
            format!("/v2/{}/manifests/{tag}", repo.repository()),
        )
        .header(CONTENT_TYPE, media_type)
        .body(body);
        let response = self.execute(repo, &push_scopes(repo), &spec).await?;
        if !response.status().is_success() {
            return Err(status_error(repo, "PUT", response, None).await);
        }
        let reported = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok());
        if let Some(reported) = reported
            && reported.algorithm() == digest.algorithm()
            && reported != digest
        {
            return Err(Error::DigestMismatch {
                what: format!("manifest pushed to {}:{tag}", repo.name()),
                expected: digest,
                actual: reported,
            });
        }
        Ok(digest)
    }

    /// `POST /v2/<repo>/blobs/uploads/[?query]`; returns the status and resolved Location.
    async fn start_upload(
        &self,
        repo: &Reference,
        scopes: &[String],
        query: Option<&str>,
    ) -> Result<Upload, Error> {
        let mut path = format!("/v2/{}/blobs/uploads/", repo.repository());
        if let Some(query) = query {
            path.push('?');
            path.push_str(query);
        }
        let spec = RequestSpec::new(Method::POST, path).body(Bytes::new());
        let response = self.execute(repo, scopes, &spec).await?;
        let status = response.status();
        if status == StatusCode::CREATED && query.is_some() {
            // A successful mount: there is no session to continue.
            return Ok(Upload {
                status,
                location: response.url().clone(),
            });
        }
        if status != StatusCode::ACCEPTED {
            return Err(status_error(repo, "POST", response, None).await);
        }
        Ok(Upload {
            status,
            location: resolve_location(&response)?,
        })
    }

    /// `PUT <location>&digest=<digest>` with the last (or only) bytes.
    async fn finish_upload(
        &self,
        repo: &Reference,
        scopes: &[String],
        location: Url,
        digest: &Digest,
        data: Bytes,
    ) -> Result<(), Error> {
        let mut url = location;
        url.query_pairs_mut().append_pair("digest", digest.as_str());
        let spec = RequestSpec::to_url(Method::PUT, url)
            .header(CONTENT_TYPE, OCTET_STREAM)
            .body(data);
        let response = self.execute(repo, scopes, &spec).await?;
        if !response.status().is_success() {
            return Err(status_error(repo, "PUT", response, None).await);
        }
        debug!(%digest, "blob committed");
        Ok(())
    }

    /// Best effort: a failed cancel only leaves a session the registry will expire.
    async fn cancel_upload(&self, repo: &Reference, scopes: &[String], location: Url) {
        let spec = RequestSpec::to_url(Method::DELETE, location);
        match self.execute(repo, scopes, &spec).await {
            Ok(response) => debug!(status = %response.status(), "upload session cancelled"),
            Err(error) => debug!(%error, "cancelling the upload session failed; ignoring"),
        }
    }
}

struct Upload {
    status: StatusCode,
    location: Url,
}

fn push_scopes(repo: &Reference) -> Vec<String> {
    vec![scope(repo.repository(), "pull,push")]
}

/// The response's Location, resolved against the request URL (it may be relative, absolute, and
/// carry its own query string).
fn resolve_location(response: &Response) -> Result<Url, Error> {
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Error::Protocol {
            url: display_url(response.url()),
            message: format!("HTTP {} without a Location header", response.status()),
        })?;
    response.url().join(location).map_err(|e| Error::Protocol {
        url: display_url(response.url()),
        message: format!("unusable Location header: {e}"),
    })
}

/// Reads until `chunk_size` bytes or end of input.
async fn read_chunk(
    reader: &mut (impl AsyncRead + Unpin),
    chunk_size: usize,
) -> std::io::Result<Bytes> {
    let mut buffer = BytesMut::with_capacity(chunk_size);
    while buffer.len() < chunk_size {
        let mut limited = (&mut *reader).take((chunk_size - buffer.len()) as u64);
        if limited.read_buf(&mut buffer).await? == 0 {
            break;
        }
    }
    Ok(buffer.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_chunk_fills_and_ends() {
        let data = [7u8; 10];
        let mut reader = &data[..];
        assert_eq!(read_chunk(&mut reader, 4).await.unwrap().len(), 4);
        assert_eq!(read_chunk(&mut reader, 4).await.unwrap().len(), 4);
        assert_eq!(read_chunk(&mut reader, 4).await.unwrap().len(), 2);
        assert!(read_chunk(&mut reader, 4).await.unwrap().is_empty());
    }

    #[test]
    fn digest_query_appends_to_existing_query() {
        let base = Url::parse("http://localhost:5000/v2/a/blobs/uploads/").unwrap();
        let mut relative = base.join("/v2/a/blobs/uploads/uuid?_state=abc").unwrap();
        relative
            .query_pairs_mut()
            .append_pair("digest", "sha256:00");
        assert_eq!(
            relative.as_str(),
            "http://localhost:5000/v2/a/blobs/uploads/uuid?_state=abc&digest=sha256%3A00"
        );
        let absolute = base.join("https://other:443/upload/x").unwrap();
        assert_eq!(absolute.as_str(), "https://other/upload/x");
    }
}
