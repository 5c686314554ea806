//! The question of moby PR 48602: does the size of the copy buffer matter when a layer's files are
//! written? One 256 MiB file (1 GiB with `RPULL_BENCH_FULL=1`) written from memory with plain
//! `write(2)` calls of 16 KiB .. 1 MiB (`File::write_all` per chunk), to tmpfs and to disk.
//!
//! Timed: `open(O_CREAT|O_EXCL)` + the writes + `close`, into the page cache (no fsync, as an
//! extraction). Outside timing: unlink and, on disk, `sync`. Throughput is bytes written.
//!
//! A second group, `write_size_after_idle/.../disk`, waits [`IDLE`] before each write (outside
//! timing), as a pull does after its registry and caches went quiet: on a VM that reports free
//! memory to its host, the large page-cache folios that ext4 builds for large writes then come
//! from memory the host took back (docs/design.md, "Writes no larger than 256 KiB"). Back to
//! back, as in the first group, each file reuses the memory the previous one just freed.

mod common;

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
    criterion_main,
};

use common::{Fs, KIB, MIB, Scratch};

const SIZES: [usize; 8] = [
    16 * KIB,
    32 * KIB,
    64 * KIB,
    128 * KIB,
    256 * KIB,
    512 * KIB,
    MIB,
    2 * MIB,
];

/// The write sizes of the after-idle group: rpull's (256 KiB) and the two above the cliff.
const IDLE_SIZES: [usize; 3] = [256 * KIB, MIB, 2 * MIB];

/// How long memory stays free before each write of the after-idle group (free page reporting
/// reports blocks about 2 s after they are freed).
const IDLE: Duration = Duration::from_secs(4);

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
        sweep(group, &mut scratch, &data, &SIZES, Duration::ZERO);
    }

    let Some(mut scratch) = Scratch::new(Fs::Disk) else {
        return;
    };
    let mut group = c.benchmark_group(format!(
        "write_size_after_idle/{}MiB/{}",
        total / MIB,
        Fs::Disk.name()
    ));
    // One write per sample: each waits IDLE, so criterion's time targets cannot apply.
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(1));
    sweep(group, &mut scratch, &data, &IDLE_SIZES, IDLE);
}

/// One bench per write size in `sizes`, each iteration waiting `idle` (outside timing) first.
fn sweep(
    mut group: BenchmarkGroup<'_, WallTime>,
    scratch: &mut Scratch,
    data: &[u8],
    sizes: &[usize],
    idle: Duration,
) {
    group.throughput(Throughput::Bytes(data.len() as u64));
    for &chunk in sizes {
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{}KiB", chunk / KIB)),
            &chunk,
            |b, &chunk| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            std::thread::sleep(idle);
                            write_one(scratch, data, chunk)
                        })
                        .sum()
                })
            },
        );
    }
    group.finish();
}

/// Writes `data` to a new file in `chunk`-sized `write(2)` calls; returns the time of the
/// create, writes and close. The file is removed (and, on disk, synced) outside the timing.
fn write_one(scratch: &mut Scratch, data: &[u8], chunk: usize) -> Duration {
    let path = scratch.fresh();
    let start = Instant::now();
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("creating the file");
    for piece in black_box(data).chunks(chunk) {
        file.write_all(piece).expect("writing");
    }
    drop(file);
    let timed = start.elapsed();
    scratch.discard(&path);
    timed
}

criterion_group!(benches, bench);
criterion_main!(benches);
