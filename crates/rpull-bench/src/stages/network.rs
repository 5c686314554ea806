//! `network` and `network-ranged`: every blob of the image fetched at once, digest and size
//! verified as the bytes pass (hashed on a thread of its own, as a pull does), the bytes
//! discarded.

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use rpull::registry::{BackgroundVerifier, Client, Descriptor, RangeBudget};
use rpull::{DEFAULT_RANGE_BUDGET, Reference};
use tokio::task::JoinSet;
use tracing::{debug, instrument};

use super::{BenchImage, CachePolicy, Meter, check_runs, format_size, stage_result};
use crate::StageResult;
use crate::error::BenchError;

/// Connections per blob for ranged GETs, as `rpull pull --chunk-size` has by default: one streams
/// the range being verified, the others fetch ranges ahead within the run's [`RangeBudget`] of
/// [`DEFAULT_RANGE_BUDGET`], shared by all blobs as in a pull.
pub const RANGE_WINDOW: usize = rpull::DEFAULT_CONNECTIONS_PER_BLOB;

/// How each blob is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchMode {
    /// One GET per blob.
    Stream,
    /// Ranged GETs of this many bytes, [`RANGE_WINDOW`] in flight per blob.
    Ranged(u64),
}

/// Measures fetching every blob (layers and config) at once, one tokio task per blob, `runs`
/// times. `bytes_in` is the sum of the blob sizes.
pub async fn network(
    image: &BenchImage,
    mode: FetchMode,
    runs: usize,
    cache: &CachePolicy,
) -> Result<StageResult, BenchError> {
    check_runs(runs)?;
    let blobs = image.blobs();
    let total: u64 = blobs.iter().map(|b| b.size).sum();
    let (stage, how) = match mode {
        FetchMode::Stream => ("network", "one GET per blob".to_owned()),
        FetchMode::Ranged(chunk) => {
            if chunk == 0 {
                return Err(BenchError::Invalid(
                    "--chunk-size must be at least 1 byte".to_owned(),
                ));
            }
            (
                "network-ranged",
                format!(
                    "ranged GETs of {}, {RANGE_WINDOW} in flight per blob, {} ahead in all",
                    format_size(chunk),
                    format_size(DEFAULT_RANGE_BUDGET)
                ),
            )
        }
    };
    let description = format!(
        "every blob ({} layers + config, {total} bytes) fetched at once, {how}; sha256 (on a thread of its own, as a pull) and size verified, bytes discarded",
        image.resolved.layers.len()
    );
    let mut samples = Vec::with_capacity(runs);
    let mut notes = Vec::new();
    for _ in 0..runs {
        cache.before_run(&mut notes);
        let meter = Meter::start();
        let bytes = fetch_image(image, mode).await?;
        let mut sample = meter.stop();
        sample.bytes_in = bytes;
        samples.push(sample);
    }
    Ok(stage_result(stage, description, samples, notes))
}

/// Fetches and verifies every blob of `image` at once (one task per blob); returns the bytes
/// received. The first failure is returned, naming its blob.
pub async fn fetch_image(image: &BenchImage, mode: FetchMode) -> Result<u64, BenchError> {
    let mut tasks = JoinSet::new();
    let budget = RangeBudget::new(DEFAULT_RANGE_BUDGET);
    for blob in image.blobs() {
        let client = image.client.clone();
        let reference = image.reference.clone();
        let budget = budget.clone();
        tasks.spawn(async move {
            match mode {
                FetchMode::Stream => fetch_blob(&client, &reference, &blob).await,
                FetchMode::Ranged(chunk) => {
                    fetch_blob_ranged(&client, &reference, &blob, chunk, &budget).await
                }
            }
        });
    }
    let mut total = 0;
    while let Some(joined) = tasks.join_next().await {
        // Dropping the JoinSet on an early return aborts the other downloads.
        total += joined.map_err(|_| BenchError::Panic("download"))??;
    }
    Ok(total)
}

#[instrument(skip_all, fields(digest = %blob.digest))]
async fn fetch_blob(
    client: &Client,
    reference: &Reference,
    blob: &Descriptor,
) -> Result<u64, BenchError> {
    let fetch_error = |source| BenchError::Fetch {
        reference: reference.to_string(),
        digest: blob.digest.clone(),
        range: None,
        source: Box::new(source),
    };
    let stream = client
        .get_blob(reference, &blob.digest)
        .await
        .map_err(fetch_error)?;
    let seen = verify_stream(blob, stream, fetch_error).await?;
    debug!(bytes = seen, "blob verified");
    Ok(seen)
}

#[instrument(skip_all, fields(digest = %blob.digest, chunk))]
async fn fetch_blob_ranged(
    client: &Client,
    reference: &Reference,
    blob: &Descriptor,
    chunk: u64,
    budget: &RangeBudget,
) -> Result<u64, BenchError> {
    if blob.size == 0 {
        // No range can describe an empty blob.
        return fetch_blob(client, reference, blob).await;
    }
    let fetch_error = |source| BenchError::Fetch {
        reference: reference.to_string(),
        digest: blob.digest.clone(),
        range: None,
        source: Box::new(source),
    };
    // The same ranged download `rpull pull --chunk-size` runs (in order, each range retried on
    // transient errors), so the stage measures what users get.
    let chunks = client.get_blob_ranged(
        reference,
        &blob.digest,
        blob.size,
        chunk,
        RANGE_WINDOW,
        budget,
    );
    verify_stream(blob, chunks, fetch_error).await
}

/// Feeds `stream` to a verifier of `blob` (hashed on a thread of its own, as a pull does) and
/// returns the bytes seen; stops as soon as more than the blob's size has arrived.
async fn verify_stream<E>(
    blob: &Descriptor,
    stream: impl Stream<Item = Result<Bytes, E>>,
    fetch_error: impl Fn(E) -> BenchError,
) -> Result<u64, BenchError> {
    let mut stream = std::pin::pin!(stream);
    let mut verifier = BackgroundVerifier::spawn(&blob.digest, Some(blob.size));
    while let Some(chunk) = stream.next().await {
        verifier.update(chunk.map_err(&fetch_error)?).await;
        if verifier.overran() {
            break;
        }
    }
    let seen = verifier.bytes_seen();
    verifier
        .finish()
        .await
        .map_err(|source| BenchError::Verify {
            digest: blob.digest.clone(),
            source,
        })?;
    Ok(seen)
}
