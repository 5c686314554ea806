//! Memory stays bounded whatever the layer's size: a pull of an image whose layers are far
//! larger than the bound keeps the process's peak RSS under 256 MiB (measured from its VmHWM,
//! not from wait4, whose ru_maxrss includes the parent's RSS at fork).

use rpull_bench::resources::run_measured;
use rpull_testing::{
    Compression, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry, random_bytes,
};

use crate::common::{Sandbox, block_on};

const LIMIT: u64 = 256 << 20;

#[test]
fn peak_rss_stays_under_256_mib_for_layers_larger_than_that() {
    pull_big_layers(&[], LIMIT);
}

/// Ranged downloads hold the range being read as it streams and, ahead of it, at most the pull's
/// range budget (64 MiB), however many connections each layer has: with 8 connections of 8 MiB
/// on each of the two layers, the limit is 128 MiB, which a plain pull of these layers stays well
/// under (57 MiB measured), plus the budget. Without the budget, 8 connections per layer would
/// hold up to 128 MiB of ranges in flight.
#[test]
fn peak_rss_stays_under_256_mib_with_ranged_downloads() {
    pull_big_layers(
        &["--chunk-size", "8MiB", "--connections-per-blob", "8"],
        (128 << 20) + rpull::DEFAULT_RANGE_BUDGET,
    );
}

/// Pulls two layers of 192 MiB each (384 MiB in all, uncompressed and gzip) at once, with
/// `options`, and checks the files and that the peak RSS is under `limit` bytes.
fn pull_big_layers(options: &[&str], limit: u64) {
    let registry = TestRegistry::start(RegistryOptions::plain()).unwrap();
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("a/big", random_bytes(192 << 20, 1), 0o644),
            Compression::None,
        )
        .layer(
            LayerBuilder::new().file("b/big", random_bytes(192 << 20, 2), 0o644),
            Compression::Gzip,
        )
        .build();
    block_on(registry.push_image(&image, "big:1")).expect("push");
    drop(image);

    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let mut command = sandbox
        .rpull()
        .args(["pull", "--quiet", "--fsync", "none"])
        .args(options)
        .arg(registry.reference("big:1"))
        .arg(&dest)
        .into_command();
    let run = run_measured(&mut command).expect("running rpull");
    assert!(run.status.success(), "rpull failed: {}", run.stderr_tail);
    assert_eq!(
        std::fs::metadata(dest.join("a/big")).unwrap().len(),
        192 << 20
    );
    assert_eq!(
        std::fs::metadata(dest.join("b/big")).unwrap().len(),
        192 << 20
    );
    let peak = run.sample.peak_rss_bytes.expect("peak RSS measured");
    // The measurement must see the process at all (a few MiB at least).
    assert!(peak > 4 << 20, "implausible peak RSS {peak}");
    assert!(
        peak < limit,
        "peak RSS {} MiB is over the {} MiB bound",
        peak >> 20,
        limit >> 20
    );
}
