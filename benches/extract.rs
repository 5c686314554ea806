//! `rpull_extract::extract_layer` of an in-memory tar: many small files vs one huge file, std vs
//! io_uring backend, into tmpfs (`/dev/shm`) and disk (`/var/tmp`).
//!
//! * `small`: 20,000 files of 0-8 KiB in 200 directories (~80 MiB of tar); `RPULL_BENCH_FULL=1`:
//!   100,000 files, as in docs/io-uring.md.
//! * `huge`: one 256 MiB file; `RPULL_BENCH_FULL=1`: 1 GiB.
//!
//! Every iteration extracts into a fresh directory; only `extract_layer` is timed (it returns after
//! the backend's final flush). Deleting the tree, and on disk `sync`ing, happen outside timing,
//! so that the next iteration starts without this one's writeback; on disk the small-file trees
//! are deleted only when the group ends (`Scratch::discard_later` says why). No fsync is timed: this is
//! extraction into the page cache, as a pull does before its single `syncfs`.
//! Throughput is bytes of tar.

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rpull_extract::{ExtractOptions, IoBackendKind, extract_layer};

use common::{Fs, KIB, MIB, Scratch};

fn backends() -> Vec<(&'static str, IoBackendKind)> {
    let mut out = vec![("std", IoBackendKind::Std)];
    match IoBackendKind::Uring.resolve() {
        (IoBackendKind::Uring, _) => out.push(("uring", IoBackendKind::Uring)),
        (_, reason) => eprintln!(
            "note: io_uring unavailable, skipping the uring backend: {}",
            reason.unwrap_or_default()
        ),
    }
    out
}

/// `many_files`: leave the trees on disk until the end of the group (see `Scratch::discard_later`).
fn bench_layer(c: &mut Criterion, name: &str, tar: &[u8], many_files: bool) {
    let mut group = c.benchmark_group(format!("extract/{name}"));
    common::quick(&mut group);
    group.throughput(Throughput::Bytes(tar.len() as u64));
    for fs in Fs::ALL {
        let Some(mut scratch) = Scratch::new(fs) else {
            continue;
        };
        for (backend_name, backend) in backends() {
            let options = ExtractOptions {
                backend,
                ..ExtractOptions::for_current_user()
            };
            group.bench_function(format!("{backend_name}/{}", fs.name()), |b| {
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let dir = scratch.fresh();
                        std::fs::create_dir(&dir).expect("creating the target");
                        let start = Instant::now();
                        let summary = extract_layer(tar, &dir, &options)
                            .unwrap_or_else(|e| panic!("extracting into {}: {e}", dir.display()));
                        timed += start.elapsed();
                        assert!(summary.files > 0);
                        if many_files {
                            scratch.discard_later(&dir);
                        } else {
                            scratch.discard(&dir);
                        }
                    }
                    timed
                })
            });
        }
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    common::print_load("extract");
    let (files, huge) = if common::full() {
        (100_000, 1024 * MIB)
    } else {
        (20_000, 256 * MIB)
    };
    let small = common::small_files_tar(0x736d_616c, files, 8 * KIB);
    eprintln!(
        "extract: small = {files} files, {} bytes of tar",
        small.len()
    );
    bench_layer(c, &format!("small-{}k-files", files / 1000), &small, true);
    drop(small);

    let big = common::one_file_tar(0x6875_6765, huge);
    bench_layer(c, &format!("huge-{}MiB-file", huge / MIB), &big, false);
}

criterion_group!(benches, bench);
criterion_main!(benches);
