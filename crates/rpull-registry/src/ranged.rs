//! Ranged parallel download of one blob: consecutive byte ranges fetched over several
//! connections at once and handed out in order, for registries where one stream is slow
//! (object-store backends, small TLS records). Each range is fetched whole (memory: at most
//! `connections` ranges per blob) and retried on transient errors, so a broken connection costs
//! one range, not the blob. The caller verifies the digest over the bytes in order, as for
//! [`Client::get_blob`].

use std::ops::Range;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt as _};
use tracing::debug;

use crate::client::Client;
use crate::digest::Digest;
use crate::error::Error;
use crate::reference::Reference;

/// Attempts per range (the first one included).
const RANGE_ATTEMPTS: u32 = 4;

/// The byte ranges `0..size` split into spans of `chunk_size` (the last one shorter).
pub fn split_ranges(size: u64, chunk_size: u64) -> Vec<Range<u64>> {
    let chunk_size = chunk_size.max(1);
    (0..size.div_ceil(chunk_size))
        .map(|i| i * chunk_size..((i + 1) * chunk_size).min(size))
        .collect()
}

impl Client {
    /// Fetches bytes `range` of blob `digest` whole, retrying transient failures (also a
    /// connection that breaks mid-range). A short or long answer is a protocol error.
    pub async fn fetch_blob_range(
        &self,
        repo: &Reference,
        digest: &Digest,
        range: Range<u64>,
    ) -> Result<Bytes, Error> {
        let mut attempt = 1;
        loop {
            match self.fetch_range_once(repo, digest, range.clone()).await {
                Err(e) if e.is_retryable() && attempt < RANGE_ATTEMPTS => {
                    debug!(%digest, start = range.start, end = range.end, attempt, error = %e, "retrying a byte range");
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn fetch_range_once(
        &self,
        repo: &Reference,
        digest: &Digest,
        range: Range<u64>,
    ) -> Result<Bytes, Error> {
        let expected = range.end - range.start;
        let mut stream = self.get_blob_range(repo, digest, range.clone()).await?;
        let mut buffer = BytesMut::with_capacity(expected as usize);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if buffer.len() as u64 + chunk.len() as u64 > expected {
                break;
            }
            buffer.extend_from_slice(&chunk);
        }
        if buffer.len() as u64 != expected {
            return Err(Error::Protocol {
                url: format!("{}@{digest}", repo.name()),
                message: format!(
                    "range {}..{} of the blob came back with {} bytes instead of {expected}",
                    range.start,
                    range.end,
                    buffer.len()
                ),
            });
        }
        Ok(buffer.freeze())
    }

    /// Blob `digest` of `size` bytes as `chunk_size` ranges fetched `connections` at a time, in
    /// order. A registry that ignores `Range` makes the first item a protocol error (the
    /// caller can fall back to [`Client::get_blob`]).
    pub fn get_blob_ranged(
        &self,
        repo: &Reference,
        digest: &Digest,
        size: u64,
        chunk_size: u64,
        connections: usize,
    ) -> Pin<Box<dyn Stream<Item = Result<Bytes, Error>> + Send>> {
        let (client, repo, digest) = (self.clone(), repo.clone(), digest.clone());
        Box::pin(
            futures_util::stream::iter(split_ranges(size, chunk_size))
                .map(move |range| {
                    let (client, repo, digest) = (client.clone(), repo.clone(), digest.clone());
                    async move { client.fetch_blob_range(&repo, &digest, range).await }
                })
                .buffered(connections.max(1)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_blob_exactly() {
        assert_eq!(split_ranges(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(split_ranges(8, 4), vec![0..4, 4..8]);
        assert_eq!(split_ranges(3, 4), vec![0..3]);
        assert_eq!(split_ranges(0, 4), Vec::<Range<u64>>::new());
        assert_eq!(split_ranges(5, 0), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
    }
}
