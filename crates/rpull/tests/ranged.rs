//! Ranged parallel download of large blobs (`PullOptions::chunk_size`): the tree is the same
//! as with one stream, the digest is still verified over the whole blob, and the registry really
//! served byte ranges.

mod common;

use common::{Env, assert_nothing_committed, chain};
use rpull::{PullError, PullOptions};
use rpull_testing::{Compression, ImageBuilder, LayerBuilder, random_bytes, sha256_digest};

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
    use futures_util::StreamExt as _;
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
        .get_blob_ranged(&reference, &digest, layer.size, 2 * RANGE_SLICE as u64, 2)
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
