//! The question of moby PR 48602: does the size of the copy buffer matter when a layer's files are
//! written? One 256 MiB file (1 GiB with `RPULL_BENCH_FULL=1`) written from memory with plain
//! `write(2)` calls of 16 KiB .. 1 MiB (`File::write_all` per chunk), to tmpfs and to disk.
//!
//! Timed: `open(O_CREAT|O_EXCL)` + the writes + `close`, into the page cache (no fsync, as an
//! extraction). Outside timing: unlink and, on disk, `sync`. Throughput is bytes written.

mod common;

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use common::{Fs, KIB, MIB, Scratch};

const SIZES: [usize; 7] = [
    16 * KIB,
    32 * KIB,
    64 * KIB,
    128 * KIB,
    256 * KIB,
    512 * KIB,
    MIB,
];

fn bench(c: &mut Criterion) {
    common::print_load("write_size");
    let total = if common::full() {
        1024 * MIB
    } else {
        256 * MIB
    };
    let data = common::Content::new(0x7772_6974).mixed(total);

    for fs in Fs::ALL {
        let Some(mut scratch) = Scratch::new(fs) else {
            continue;
        };
        let mut group = c.benchmark_group(format!("write_size/{}MiB/{}", total / MIB, fs.name()));
        common::quick(&mut group);
        group.throughput(Throughput::Bytes(total as u64));
        for chunk in SIZES {
            group.bench_with_input(
                BenchmarkId::from_parameter(format!("{}KiB", chunk / KIB)),
                &chunk,
                |b, &chunk| {
                    b.iter_custom(|iters| {
                        let mut timed = Duration::ZERO;
                        for _ in 0..iters {
                            let path = scratch.fresh();
                            let start = Instant::now();
                            let mut file = OpenOptions::new()
                                .write(true)
                                .create_new(true)
                                .open(&path)
                                .expect("creating the file");
                            for piece in black_box(&data).chunks(chunk) {
                                file.write_all(piece).expect("writing");
                            }
                            drop(file);
                            timed += start.elapsed();
                            scratch.discard(&path);
                        }
                        timed
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
