//! Streaming blob downloads: whole (`GET`) or a byte range (`Range`, 206 required).

use std::fmt;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use reqwest::header::RANGE;
use reqwest::{Method, Response, StatusCode};
use tracing::{debug, instrument};

use crate::client::{Client, scope, status_error};
use crate::digest::Digest;
use crate::error::{Error, display_url};
use crate::reference::Reference;
use crate::transport::RequestSpec;

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A blob's bytes as they arrive; never buffered whole. Transient failures are retried only
/// before the first chunk was handed out. Verify the content with a
/// [`DigestVerifier`](crate::DigestVerifier).
pub struct BlobStream {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, Error>> + Send>>,
    content_length: Option<u64>,
}

impl BlobStream {
    /// The Content-Length the registry announced, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }
}

impl fmt::Debug for BlobStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobStream")
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

impl Stream for BlobStream {
    type Item = Result<Bytes, Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Client {
    /// Streams blob `digest` of `repo` (tag/digest of `repo` ignored). Redirects (e.g. to a CDN)
    /// are followed; Authorization is not forwarded to another host.
    #[instrument(skip_all, fields(repo = %repo.name(), digest = %digest))]
    pub async fn get_blob(&self, repo: &Reference, digest: &Digest) -> Result<BlobStream, Error> {
        self.blob_stream(repo, digest, None).await
    }

    /// Streams bytes `range.start..range.end` of blob `digest`; the registry must answer 206.
    #[instrument(skip_all, fields(repo = %repo.name(), digest = %digest, start = range.start, end = range.end))]
    pub async fn get_blob_range(
        &self,
        repo: &Reference,
        digest: &Digest,
        range: Range<u64>,
    ) -> Result<BlobStream, Error> {
        if range.start >= range.end {
            return Err(Error::Protocol {
                url: format!("{}@{digest}", repo.name()),
                message: format!("empty byte range {}..{}", range.start, range.end),
            });
        }
        self.blob_stream(repo, digest, Some(range)).await
    }

    async fn blob_stream(
        &self,
        repo: &Reference,
        digest: &Digest,
        range: Option<Range<u64>>,
    ) -> Result<BlobStream, Error> {
        let response = self.open_blob(repo, digest, range.as_ref()).await?;
        let content_length = response.content_length();
        let state = StreamState {
            client: self.clone(),
            repo: repo.clone(),
            digest: digest.clone(),
            range,
            url: display_url(response.url()),
            body: Box::pin(response.bytes_stream()),
            handed_out: false,
            retries_left: self.inner.retries,
            done: false,
        };
        Ok(BlobStream {
            inner: Box::pin(futures_util::stream::unfold(state, next_chunk)),
            content_length,
        })
    }

    /// Sends the GET (with request-level retries) and checks the status.
    async fn open_blob(
        &self,
        repo: &Reference,
        digest: &Digest,
        range: Option<&Range<u64>>,
    ) -> Result<Response, Error> {
        let mut spec = RequestSpec::new(
            Method::GET,
            format!("/v2/{}/blobs/{digest}", repo.repository()),
        );
        if let Some(range) = range {
            spec = spec.header(RANGE, &format!("bytes={}-{}", range.start, range.end - 1));
        }
        let response = self
            .execute(repo, &[scope(repo.repository(), "pull")], &spec)
            .await?;
        let status = response.status();
        match (status, range) {
            (StatusCode::OK, None) | (StatusCode::PARTIAL_CONTENT, Some(_)) => Ok(response),
            (StatusCode::OK, Some(_)) => Err(Error::Protocol {
                url: display_url(response.url()),
                message: "registry ignored the Range header (HTTP 200 instead of 206)".to_owned(),
            }),
            _ => Err(status_error(
                repo,
                "GET",
                response,
                Some(format!("{}@{digest}", repo.name())),
            )
            .await),
        }
    }
}

struct StreamState {
    client: Client,
    repo: Reference,
    digest: Digest,
    range: Option<Range<u64>>,
    url: String,
    body: Body,
    handed_out: bool,
    retries_left: u32,
    done: bool,
}

async fn next_chunk(mut state: StreamState) -> Option<(Result<Bytes, Error>, StreamState)> {
    if state.done {
        return None;
    }
    loop {
        match state.body.next().await {
            Some(Ok(chunk)) if chunk.is_empty() => continue,
            Some(Ok(chunk)) => {
                state.handed_out = true;
                return Some((Ok(chunk), state));
            }
            None => return None,
            Some(Err(source)) => {
                let error = Error::Transport {
                    url: state.url.clone(),
                    error: source.without_url(),
                };
                if state.handed_out || state.retries_left == 0 || !error.is_retryable() {
                    state.done = true;
                    return Some((Err(error), state));
                }
                state.retries_left -= 1;
                debug!(%error, "blob body failed before the first byte; re-requesting");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                match state
                    .client
                    .open_blob(&state.repo, &state.digest, state.range.as_ref())
                    .await
                {
                    Ok(response) => {
                        state.url = display_url(response.url());
                        state.body = Box::pin(response.bytes_stream());
                    }
                    Err(error) => {
                        state.done = true;
                        return Some((Err(error), state));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_stream_is_send_unpin() {
        fn assert_traits<T: Stream<Item = Result<Bytes, Error>> + Send + Unpin>() {}
        assert_traits::<BlobStream>();
    }
}
