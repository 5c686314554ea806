//! End to end: `rpull::Puller::pull` of a small multi-layer image from a local `docker-registry`
//! (started by rpull-testing, storage on its temporary directory) into tmpfs, with default
//! options (8 concurrent downloads, std backend, no fsync on tmpfs).
//!
//! The image: 4 layers, ~64 MiB of tar (`RPULL_BENCH_FULL=1`: ~256 MiB): 5,000 small files
//! (gzip), a big mixed layer (zstd), a mid-size mixed layer (gzip) and a 3-file config layer.
//! Each iteration pulls into a fresh destination; deleting it is outside timing.
//! Throughput is bytes of tar (uncompressed), as `rpull bench` reports.

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rpull::{PullOptions, Puller, Reference};
use rpull_testing::{Compression, ImageBuilder, RegistryOptions, TestRegistry};

use common::{Fs, KIB, MIB, Scratch};

fn bench(c: &mut Criterion) {
    common::print_load("pull");
    let registry = match TestRegistry::start(RegistryOptions::plain()) {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("note: skipping the pull bench: cannot start docker-registry: {e:#}");
            return;
        }
    };
    let Some(mut scratch) = Scratch::new(Fs::Tmpfs) else {
        return;
    };
    let scale = if common::full() { 4 } else { 1 };
    let layers = [
        (
            common::small_files_tar(0x7075_6c31, 5_000, 8 * KIB),
            Compression::Gzip,
        ),
        (
            common::layer_tar(0x7075_6c32, 32 * MIB * scale),
            Compression::Zstd,
        ),
        (
            common::layer_tar(0x7075_6c33, 12 * MIB * scale),
            Compression::Gzip,
        ),
        (
            common::small_files_tar(0x7075_6c34, 3, 4 * KIB),
            Compression::Gzip,
        ),
    ];
    let tar_bytes: usize = layers.iter().map(|(tar, _)| tar.len()).sum();
    let image = layers
        .iter()
        .fold(ImageBuilder::new(), |image, (tar, compression)| {
            image.layer_tar(tar, *compression)
        })
        .build();
    drop(layers);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime
        .block_on(registry.push_image(&image, "bench/app:1"))
        .expect("pushing the bench image");
    let reference: Reference = registry
        .reference("bench/app:1")
        .parse()
        .expect("a reference");
    let puller = Puller::builder()
        .client(registry.client().expect("registry client"))
        .options(PullOptions::default())
        .build()
        .expect("puller");
    let report = runtime
        .block_on(puller.pull(&reference, &scratch.fresh()))
        .expect("first pull");
    eprintln!(
        "pull: {} layers, {} bytes compressed, {tar_bytes} bytes of tar",
        report.layers.len(),
        report.compressed_bytes
    );

    let mut group = c.benchmark_group(format!("pull/{}MiB-4-layers", tar_bytes / MIB));
    common::quick(&mut group);
    group.throughput(Throughput::Bytes(tar_bytes as u64));
    group.bench_function("tmpfs", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let dest = scratch.fresh();
                let start = Instant::now();
                runtime
                    .block_on(puller.pull(&reference, &dest))
                    .unwrap_or_else(|e| panic!("pulling {reference}: {e}"));
                timed += start.elapsed();
                scratch.discard(&dest);
            }
            timed
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
