//! Concurrent layer downloads, judged by the order of events only (no timing), so a noisy
//! machine cannot make these flaky.

mod common;

use std::collections::BTreeSet;

use common::{Env, chain, layer_states, paths, snapshot};
use rpull::{LayerState, PullEvent, PullOptions};
use rpull_testing::{Compression, Image, ImageBuilder, LayerBuilder, random_bytes};

const LAYERS: usize = 4;

/// Four layers of 3 MiB each (many chunks and progress events per layer), each also
/// overwriting `order`.
fn image() -> Image {
    let mut image = ImageBuilder::new();
    for i in 0..LAYERS {
        image = image.layer(
            LayerBuilder::new()
                .file(
                    &format!("layer{i}.bin"),
                    random_bytes(3 << 20, i as u64 + 1),
                    0o644,
                )
                .file("order", format!("{i}"), 0o644),
            Compression::Gzip,
        );
    }
    image.build()
}

/// Checks what holds at any concurrency: each layer goes Downloading -> Verified -> Extracted ->
/// Merged exactly once, layers merge in order, progress ends at the layer's size, `Resolved`
/// comes first and `Committed` last, and the tree is right.
fn check_common(events: &[PullEvent], image: &Image, dest: &std::path::Path) {
    assert!(
        matches!(events.first(), Some(PullEvent::Resolved { .. })),
        "{:?}",
        events.first()
    );
    assert!(
        matches!(events.last(), Some(PullEvent::Committed { .. })),
        "{:?}",
        events.last()
    );
    let states = layer_states(events);
    for index in 0..LAYERS {
        let sequence: Vec<LayerState> = states
            .iter()
            .filter(|(i, _)| *i == index)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(
            sequence,
            [
                LayerState::Downloading,
                LayerState::Verified,
                LayerState::Extracted,
                LayerState::Merged
            ],
            "layer {index}"
        );
        let last_progress = events.iter().rev().find_map(|e| match e {
            PullEvent::LayerProgress {
                index: i,
                downloaded,
                total,
            } if *i == index => Some((*downloaded, *total)),
            _ => None,
        });
        assert_eq!(
            last_progress,
            Some((image.layers[index].size, image.layers[index].size)),
            "layer {index}"
        );
    }
    let merged: Vec<usize> = states
        .iter()
        .filter(|(_, s)| *s == LayerState::Merged)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        merged,
        (0..LAYERS).collect::<Vec<_>>(),
        "layers merge in order"
    );

    let tree = snapshot(dest);
    assert_eq!(
        paths(&tree),
        [
            "layer0.bin",
            "layer1.bin",
            "layer2.bin",
            "layer3.bin",
            "order"
        ]
    );
    assert_eq!(std::fs::read_to_string(dest.join("order")).unwrap(), "3");
}

/// The layers between `Downloading` and `Verified` after each state event, in order.
fn in_flight_over_time(events: &[PullEvent]) -> Vec<BTreeSet<usize>> {
    let mut in_flight = BTreeSet::new();
    let mut history = Vec::new();
    for (index, state) in layer_states(events) {
        match state {
            LayerState::Downloading => {
                in_flight.insert(index);
            }
            LayerState::Verified => {
                in_flight.remove(&index);
            }
            _ => {}
        }
        history.push(in_flight.clone());
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_download_concurrently() {
    let env = Env::start();
    let image = image();
    let reference = env.push(&image, "concurrency/four:v1").await;
    let dest = env.dest("rootfs");
    let (puller, events) = env.recording_puller(PullOptions {
        max_concurrent_downloads: LAYERS,
        ..PullOptions::default()
    });
    puller
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let events = events.lock().unwrap().clone();
    check_common(&events, &image, &dest);

    // Every task takes its download slot as soon as it starts, and a layer is merged only after
    // all its bytes went through the extractor: more than one layer is downloading before the
    // first merge.
    let states = layer_states(&events);
    let first_merge = states
        .iter()
        .position(|(_, s)| *s == LayerState::Merged)
        .unwrap();
    let downloading_before_merge: BTreeSet<usize> = states[..first_merge]
        .iter()
        .filter(|(_, s)| *s == LayerState::Downloading)
        .map(|(i, _)| *i)
        .collect();
    assert!(
        downloading_before_merge.len() > 1,
        "only {downloading_before_merge:?} downloading before the first merge: {states:?}"
    );

    // And at some point more than one layer was between Downloading and Verified at once.
    let most = in_flight_over_time(&events)
        .iter()
        .map(BTreeSet::len)
        .max()
        .unwrap();
    assert!(most > 1, "downloads never overlapped: {states:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_download_at_a_time_when_limited_to_one() {
    let env = Env::start();
    let image = image();
    let reference = env.push(&image, "concurrency/four:v1").await;
    let dest = env.dest("rootfs");
    let (puller, events) = env.recording_puller(PullOptions {
        max_concurrent_downloads: 1,
        ..PullOptions::default()
    });
    puller
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let events = events.lock().unwrap().clone();
    check_common(&events, &image, &dest);

    let history = in_flight_over_time(&events);
    let states = layer_states(&events);
    assert!(
        history.iter().all(|set| set.len() <= 1),
        "downloads overlapped with a limit of 1: {states:?}"
    );
    // Progress of a layer only while it holds the slot: between its Downloading and Verified.
    let mut holder = None;
    for event in &events {
        match event {
            PullEvent::LayerState {
                index,
                state: LayerState::Downloading,
                ..
            } => holder = Some(*index),
            PullEvent::LayerState {
                index,
                state: LayerState::Verified,
                ..
            } => {
                assert_eq!(holder, Some(*index));
                holder = None;
            }
            PullEvent::LayerProgress { index, .. } => {
                assert_eq!(holder, Some(*index), "progress outside the slot")
            }
            _ => {}
        }
    }
}
