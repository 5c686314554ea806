//! SHA-256 and SHA-512 of 64 MiB (256 MiB with `RPULL_BENCH_FULL=1`) with `sha2` 0.10, what
//! `rpull_registry::DigestVerifier` uses, and through the verifier itself fed in 64 KiB pieces
//! (about what a blob stream delivers). Throughput is bytes hashed.
//!
//! sha2 0.10 picks its x86-64 code at run time: SHA-256 uses the SHA extensions (SHA-NI) when the
//! CPU has `sha`, `sse2`, `ssse3` and `sse4.1`; SHA-512 uses AVX2 when present (there is no SHA-512
//! instruction it uses). The bench prints which applies, and `openssl dgst` on the same bytes (on
//! tmpfs) once, as a reference.

mod common;

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rpull_registry::{Digest, DigestVerifier};
use sha2::Digest as _;

use common::{KIB, MIB};

fn print_cpu_paths() {
    #[cfg(target_arch = "x86_64")]
    {
        let shani = std::is_x86_feature_detected!("sha")
            && std::is_x86_feature_detected!("sse2")
            && std::is_x86_feature_detected!("ssse3")
            && std::is_x86_feature_detected!("sse4.1");
        let avx2 = std::is_x86_feature_detected!("avx2");
        eprintln!(
            "hash: sha2 0.10 on this CPU: SHA-256 {}, SHA-512 {}",
            if shani { "SHA-NI" } else { "software" },
            if avx2 { "AVX2" } else { "software" },
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("hash: not x86-64; sha2 chooses its own code path");
}

/// `openssl dgst -ALG FILE`, best of 3 (process start included, ~ms), as MB/s; `None` without
/// openssl.
fn openssl_mb_per_s(algorithm: &str, file: &Path, len: usize) -> Option<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let out = Command::new("openssl")
            .args(["dgst", &format!("-{algorithm}")])
            .arg(file)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    Some(len as f64 / best / 1e6)
}

fn print_openssl(data: &[u8]) {
    let Some(scratch) = common::Scratch::new(common::Fs::Tmpfs) else {
        return;
    };
    let mut scratch = scratch;
    let file = scratch.fresh();
    std::fs::write(&file, data).expect("writing the openssl input");
    let version = Command::new("openssl")
        .arg("version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    for algorithm in ["sha256", "sha512"] {
        match openssl_mb_per_s(algorithm, &file, data.len()) {
            Some(rate) => eprintln!(
                "hash: reference: `openssl dgst -{algorithm}` ({version}) {rate:.0} MB/s, best of 3"
            ),
            None => eprintln!("hash: reference: openssl not available"),
        }
    }
    scratch.discard(&file);
}

fn bench(c: &mut Criterion) {
    common::print_load("hash");
    print_cpu_paths();
    let size = if common::full() { 256 * MIB } else { 64 * MIB };
    let data = common::Content::new(0x6861_7368).mixed(size);
    print_openssl(&data);
    let expected = Digest::sha256_of(&data);

    let mut group = c.benchmark_group(format!("hash/{}MiB", size / MIB));
    common::quick(&mut group);
    group.throughput(Throughput::Bytes(size as u64));
    group.bench_function("sha256/sha2", |b| {
        b.iter(|| sha2::Sha256::digest(black_box(&data)))
    });
    group.bench_function("sha512/sha2", |b| {
        b.iter(|| sha2::Sha512::digest(black_box(&data)))
    });
    group.bench_function("sha256/DigestVerifier-64KiB-pieces", |b| {
        b.iter(|| {
            let mut verifier = DigestVerifier::new(&expected, Some(size as u64));
            for piece in black_box(&data).chunks(64 * KIB) {
                verifier.update(piece);
            }
            verifier.finish().expect("the digest of the data")
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
