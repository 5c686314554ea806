//! Ranged parallel download of large blobs (`PullOptions::chunk_size`): the tree is the same
//! as with one stream, the digest is still verified over the whole blob, and the registry really
//! served byte ranges.

mod common;

use common::{Env, assert_nothing_committed, chain};
use std::time::Duration;

use futures_util::StreamExt as _;
use rpull::registry::RangeBudget;
use rpull::{Digest, PullError, PullOptions, Reference};
use rpull_testing::{
    Compression, CuttingRelay, ImageBuilder, LayerBuilder, random_bytes, sha256_digest,
};

fn ranged(chunk_size: u64) -> PullOptions {
    PullOptions {
        chunk_size: Some(chunk_size),
        connections_per_blob: 3,
        ..PullOptions::default()
    }
}

/// Responses of the registry's access log with HTTP status 206 (Partial Content). The status
/// field is matched whole: "206" alone also turns up in durations and byte counts.
fn partial_responses(env: &Env) -> usize {
    env.registry
        .log()
        .lines()
        .filter(|l| l.contains("response completed") && l.contains("http.response.status=206"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn ranged_pull_gives_the_same_tree_and_uses_ranges() {
    let env = Env::start();
    let payload = random_bytes(1_000_003, 7);
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("big", &payload, 0o644),
            Compression::None,
        )
        .layer(
            LayerBuilder::new().file("small", "tiny", 0o644),
            Compression::Gzip,
        )
        .build();
    let reference = env.push(&image, "ranged:1").await;
    let before = partial_responses(&env);
    let dest = env.dest("ranged");
    env.puller(ranged(64 * 1024))
        .pull(&reference, &dest)
        .await
        .expect("ranged pull");
    assert_eq!(std::fs::read(dest.join("big")).unwrap(), payload);
    assert_eq!(std::fs::read_to_string(dest.join("small")).unwrap(), "tiny");
    // The 1 MB layer is > 15 chunks of 64 KiB; the small one is one stream.
    let ranges = partial_responses(&env) - before;
    assert!(
        ranges >= 15,
        "expected byte-range responses in the registry log, saw {ranges}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupted_blob_fails_verification_when_ranged() {
    let env = Env::start();
    let payload = random_bytes(300_000, 9);
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("big", &payload, 0o644),
            Compression::None,
        )
        .build();
    let reference = env.push(&image, "ranged:bad").await;
    let layer = &image.layers[0];
    let hex = layer.digest.strip_prefix("sha256:").unwrap();
    let data = env
        .registry
        .storage_dir()
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[200_000] ^= 0x55; // in the fourth 64 KiB range
    std::fs::write(&data, &bytes).unwrap();
    let dest = env.dest("bad");
    let error = env
        .puller(ranged(64 * 1024))
        .pull(&reference, &dest)
        .await
        .expect_err("corrupted blob");
    assert!(
        matches!(error, PullError::Verify { index: 0, .. }),
        "{}",
        chain(&error)
    );
    let text = chain(&error);
    assert!(
        text.contains(&layer.digest) && text.contains(&sha256_digest(&bytes)),
        "{text}"
    );
    assert_nothing_committed(&dest);
}

#[tokio::test(flavor = "multi_thread")]
async fn blob_of_exactly_one_chunk_is_one_stream() {
    let env = Env::start();
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("f", random_bytes(10_000, 3), 0o644),
            Compression::Gzip,
        )
        .build();
    let reference = env.push(&image, "ranged:small").await;
    let size = image.layers[0].size;
    let before = partial_responses(&env);
    env.puller(ranged(size))
        .pull(&reference, &env.dest("one"))
        .await
        .expect("pull");
    assert_eq!(
        partial_responses(&env),
        before,
        "a blob no larger than the chunk size is not split"
    );
}

/// Ranges reach the caller in views of at most `RANGE_SLICE` bytes, whatever the chunk size, so
/// that the pull's queues, which count chunks, never hold whole ranges (peak RSS with
/// `--chunk-size`, tests/cli/memory.rs); together they are still the blob, in order.
#[tokio::test(flavor = "multi_thread")]
async fn ranges_are_handed_on_in_slices_of_at_most_range_slice() {
    use rpull::registry::RANGE_SLICE;

    let env = Env::start();
    let payload = random_bytes(3 * RANGE_SLICE + 1000, 9);
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("big", &payload, 0o644),
            Compression::None,
        )
        .build();
    let reference = env.push(&image, "slices:1").await;
    let layer = &image.layers[0];
    let digest: rpull::Digest = layer.digest.parse().expect("a valid digest");
    let client = env.registry.client().expect("registry client");
    let items: Vec<_> = client
        .get_blob_ranged(
            &reference,
            &digest,
            layer.size,
            2 * RANGE_SLICE as u64,
            2,
            &RangeBudget::new(rpull::DEFAULT_RANGE_BUDGET),
        )
        .map(|item| item.expect("a range"))
        .collect()
        .await;
    let sizes: Vec<usize> = items.iter().map(|item| item.len()).collect();
    assert!(
        sizes.iter().all(|&size| size <= RANGE_SLICE),
        "items of {sizes:?} bytes, over {RANGE_SLICE}"
    );
    assert_eq!(sha256_digest(&items.concat()), layer.digest);
}

const RANGE: u64 = 64 * 1024;

/// An image of one uncompressed layer of about `bytes`, pushed as `repo_tag`: its reference and
/// its layer's digest and size.
async fn one_blob(env: &Env, bytes: usize, repo_tag: &str) -> (Reference, Digest, u64) {
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("big", random_bytes(bytes, 5), 0o644),
            Compression::None,
        )
        .build();
    let reference = env.push(&image, repo_tag).await;
    let layer = &image.layers[0];
    (
        reference,
        layer.digest.parse().expect("a valid digest"),
        layer.size,
    )
}

/// Reads a ranged download to its end, pausing after each item like a busy reader; returns the
/// bytes.
async fn read_slowly(
    stream: impl futures_util::Stream<Item = Result<bytes::Bytes, rpull::registry::Error>>,
    pause: Duration,
) -> Vec<u8> {
    let mut stream = std::pin::pin!(stream);
    let mut bytes = Vec::new();
    while let Some(item) = stream.next().await {
        bytes.extend_from_slice(&item.expect("a ranged download"));
        tokio::time::sleep(pause).await;
    }
    bytes
}

/// Ranges fetched ahead of a slow reader fill the budget and never pass it, however many
/// connections the blob may use.
#[tokio::test(flavor = "multi_thread")]
async fn ranges_fetched_ahead_stay_within_the_budget() {
    let env = Env::start();
    let (reference, digest, size) = one_blob(&env, 24 * RANGE as usize, "budget:1").await;
    let client = env.registry.client().expect("registry client");
    let budget = RangeBudget::new(3 * RANGE);
    let stream = client.get_blob_ranged(&reference, &digest, size, RANGE, 8, &budget);
    let bytes = read_slowly(stream, Duration::from_millis(2)).await;
    assert_eq!(sha256_digest(&bytes), digest.to_string());
    let peak = budget.peak_bytes();
    assert!(
        (2 * RANGE..=3 * RANGE).contains(&peak),
        "{peak} bytes were held ahead at most, with a budget of {} and 7 connections ahead",
        3 * RANGE
    );
}

/// A blob whose reader has stopped keeps the budget it holds, and another blob sharing that
/// budget still downloads: the range being read never waits for the budget.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_blob_does_not_hold_up_another_sharing_its_budget() {
    let env = Env::start();
    let (reference, digest, size) = one_blob(&env, 8 * RANGE as usize, "budget:2").await;
    let client = env.registry.client().expect("registry client");
    let budget = RangeBudget::new(RANGE);
    let mut stalled = client.get_blob_ranged(&reference, &digest, size, RANGE, 4, &budget);
    stalled
        .next()
        .await
        .expect("a first item")
        .expect("the first bytes");
    // The stalled download has reserved the whole budget for its next range.
    tokio::time::timeout(Duration::from_secs(10), async {
        while budget.peak_bytes() < RANGE {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the stalled download reserves the budget");
    let other = client.get_blob_ranged(&reference, &digest, size, RANGE, 4, &budget);
    let bytes = tokio::time::timeout(Duration::from_secs(60), read_slowly(other, Duration::ZERO))
        .await
        .expect("the second download finishes while the first holds the budget");
    assert_eq!(sha256_digest(&bytes), digest.to_string());
    assert_eq!(budget.peak_bytes(), RANGE);
    drop(stalled);
}

/// An image of one uncompressed layer of about `bytes` pushed as `repo_tag`, and a relay in front
/// of the registry that cuts its first `cuts` connections after `cut_after` bytes of responses:
/// the relay, the reference through it, and the layer's digest and size.
async fn behind_cutting_relay(
    env: &Env,
    bytes: usize,
    repo_tag: &str,
    cut_after: u64,
    cuts: usize,
) -> (CuttingRelay, Reference, Digest, u64) {
    let (_, digest, size) = one_blob(env, bytes, repo_tag).await;
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], env.registry.port()));
    let relay = CuttingRelay::start(upstream, cut_after, cuts).expect("starting the relay");
    let reference = format!("127.0.0.1:{}/{repo_tag}", relay.addr().port())
        .parse()
        .expect("a valid reference");
    (relay, reference, digest, size)
}

/// A connection that breaks in the middle of the range being read costs only the rest of that
/// range: it is asked for again from the first byte not received, and the blob is whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_range_cut_mid_body_resumes_where_it_broke() {
    let env = Env::start();
    let chunk = 4 * RANGE;
    // Two connections cut after 100 kB of responses each: both inside the first range.
    let (relay, reference, digest, size) =
        behind_cutting_relay(&env, 4 * chunk as usize, "cut:1", 100_000, 2).await;
    let client = env.registry.client().expect("registry client");
    let budget = RangeBudget::new(rpull::DEFAULT_RANGE_BUDGET);
    // One connection: every range is read as it streams.
    let stream = client.get_blob_ranged(&reference, &digest, size, chunk, 1, &budget);
    let bytes = read_slowly(stream, Duration::ZERO).await;
    assert_eq!(sha256_digest(&bytes), digest.to_string());
    assert_eq!(relay.cuts_left(), 0, "both cuts happened");
    let ranges = relay.ranges();
    let resumed: Vec<_> = ranges
        .iter()
        .filter(|(start, end)| start % chunk != 0 && end % chunk == 0)
        .collect();
    assert_eq!(
        resumed.len(),
        2,
        "two requests for the rest of the first range, in {ranges:?}"
    );
    assert!(
        resumed
            .iter()
            .all(|(start, end)| *start < *end && *end == chunk)
    );
}

/// A range fetched ahead whose connection breaks costs only its rest, as the head does: it is asked
/// for again from the first byte not received, never again whole, and the blob arrives whole and
/// in order. The first three connections are cut inside their first range (the relay cuts after
/// 40 kB of responses, ranges are 64 KiB); with 4 connections, at most one of them carries the
/// head (range 0), so at least two carry ranges fetched ahead.
#[tokio::test(flavor = "multi_thread")]
async fn cut_ranges_fetched_ahead_resume_where_they_broke() {
    let env = Env::start();
    let (relay, reference, digest, size) =
        behind_cutting_relay(&env, 16 * RANGE as usize, "cut:2", 40_000, 3).await;
    let client = env.registry.client().expect("registry client");
    let budget = RangeBudget::new(rpull::DEFAULT_RANGE_BUDGET);
    let stream = client.get_blob_ranged(&reference, &digest, size, RANGE, 4, &budget);
    let bytes = read_slowly(stream, Duration::ZERO).await;
    assert_eq!(sha256_digest(&bytes), digest.to_string());
    assert_eq!(relay.cuts_left(), 0, "all three cuts happened");
    let ranges = relay.ranges();
    let resumed: Vec<_> = ranges
        .iter()
        .filter(|(start, end)| {
            start % RANGE != 0 && end % RANGE == 0 && start / RANGE == (end - 1) / RANGE
        })
        .collect();
    assert_eq!(
        resumed.len(),
        3,
        "each cut range is asked for again from where it broke: {ranges:?}"
    );
    // The head starts at range 0, so resumed requests past it are ranges fetched ahead.
    assert!(
        resumed.iter().filter(|(start, _)| *start >= RANGE).count() >= 2,
        "ranges fetched ahead resumed: {ranges:?}"
    );
    let mut seen = std::collections::HashSet::new();
    let whole_again: Vec<_> = ranges
        .iter()
        .filter(|(start, _)| start % RANGE == 0)
        .filter(|range| !seen.insert(*range))
        .collect();
    assert!(
        whole_again.is_empty(),
        "no range is asked for whole twice: {whole_again:?} in {ranges:?}"
    );
}
