//! Decompression of one layer-like tar (64 MiB; 256 MiB with `RPULL_BENCH_FULL=1`), per codec and
//! backend, from memory to nothing; throughput is bytes of *output* (the tar).
//!
//! * `gzip/isal`: `rpull_decompress::decoder_with(.., GzipBackend::Isal)`, ISA-L's `isal_inflate`,
//!   what rpull runs (the default backend of a build with the `isal` feature).
//! * `gzip/zlib-rs`: `rpull_decompress::decoder_with(.., GzipBackend::ZlibRs)`, flate2's
//!   `MultiGzDecoder` on zlib-rs (what rpull runs when built without ISA-L).
//! * `gzip/miniz_oxide`: flate2's pure-Rust default backend, driven directly (flate2's backend is
//!   one feature for the whole build, so it cannot sit beside zlib-rs), with the same CRC-32 check
//!   of the gzip trailer flate2 does.
//! * `zstd/libzstd`: `rpull_decompress::decoder` on the zstd crate.
//!
//! Gzip is level 6 (docker's and pigz's default), zstd level 3 (the zstd CLI's default).

mod common;

use std::hint::black_box;
use std::io::Read;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use miniz_oxide::inflate::stream::{InflateState, inflate};
use miniz_oxide::{DataFormat, MZError, MZFlush, MZStatus};
use rpull_decompress::{Codec, GzipBackend, decoder_with};

use common::{KIB, MIB};

/// Reads the whole stream into a reused buffer of the size the extractor reads with, returning
/// the byte count.
fn drain(mut reader: impl Read, buf: &mut [u8]) -> usize {
    let mut total = 0;
    loop {
        match reader.read(buf) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) => panic!("decoding: {e}"),
        }
    }
}

fn rpull_decoder(codec: Codec, compressed: &[u8], buf: &mut [u8]) -> usize {
    rpull_gzip(GzipBackend::default(), codec, compressed, buf)
}

fn rpull_gzip(backend: GzipBackend, codec: Codec, compressed: &[u8], buf: &mut [u8]) -> usize {
    drain(
        decoder_with(codec, compressed, backend).expect("decoder"),
        buf,
    )
}

/// Length of a gzip member header (RFC 1952) at the start of `data`.
fn gzip_header_len(data: &[u8]) -> usize {
    assert_eq!(&data[..3], &[0x1f, 0x8b, 8], "not a gzip member");
    let flags = data[3];
    let mut pos = 10;
    if flags & 0x04 != 0 {
        pos += 2 + usize::from(u16::from_le_bytes([data[pos], data[pos + 1]]));
    }
    for bit in [0x08, 0x10] {
        if flags & bit != 0 {
            pos += data[pos..].iter().position(|&b| b == 0).expect("NUL") + 1;
        }
    }
    if flags & 0x02 != 0 {
        pos += 2;
    }
    pos
}

/// One gzip member (what flate2 writes) inflated by miniz_oxide, CRC-32 and size checked.
fn miniz_gunzip(compressed: &[u8], buf: &mut [u8], state: &mut InflateState) -> usize {
    let mut input = &compressed[gzip_header_len(compressed)..];
    state.reset(DataFormat::Raw);
    let mut crc = flate2::Crc::new();
    let mut total = 0;
    loop {
        let result = inflate(state, input, buf, MZFlush::None);
        input = &input[result.bytes_consumed..];
        crc.update(&buf[..result.bytes_written]);
        total += result.bytes_written;
        match result.status {
            Ok(MZStatus::StreamEnd) => break,
            Ok(_) | Err(MZError::Buf) => {}
            Err(e) => panic!("inflating: {e:?}"),
        }
    }
    let trailer = &input[..8];
    assert_eq!(crc.sum().to_le_bytes(), trailer[..4], "CRC-32");
    assert_eq!((total as u32).to_le_bytes(), trailer[4..], "ISIZE");
    total
}

fn bench(c: &mut Criterion) {
    common::print_load("decompress");
    let size = if common::full() { 256 * MIB } else { 64 * MIB };
    let tar = common::layer_tar(0x6465_636f, size);
    let gzip = {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        std::io::Write::write_all(&mut enc, &tar).expect("gzip");
        enc.finish().expect("gzip")
    };
    let zstd = zstd::stream::encode_all(&tar[..], 3).expect("zstd");
    eprintln!(
        "decompress: tar {} bytes; gzip -6 {} bytes (ratio {:.2}); zstd -3 {} bytes (ratio {:.2})",
        tar.len(),
        gzip.len(),
        tar.len() as f64 / gzip.len() as f64,
        zstd.len(),
        tar.len() as f64 / zstd.len() as f64,
    );

    // The tar crate asks for what it needs; a `read_to_end`-like 128 KiB buffer is in between.
    let mut buf = vec![0u8; 128 * KIB];
    let mut state = InflateState::new_boxed(DataFormat::Raw);
    // Every backend must give back the tar before it is timed.
    for &backend in GzipBackend::ALL {
        assert_eq!(rpull_gzip(backend, Codec::Gzip, &gzip, &mut buf), tar.len());
    }
    assert_eq!(miniz_gunzip(&gzip, &mut buf, &mut state), tar.len());
    assert_eq!(rpull_decoder(Codec::Zstd, &zstd, &mut buf), tar.len());

    let mut group = c.benchmark_group(format!("decompress/{}MiB", size / MIB));
    common::quick(&mut group);
    group.throughput(Throughput::Bytes(tar.len() as u64));
    for &backend in GzipBackend::ALL {
        group.bench_function(format!("gzip/{backend}"), |b| {
            b.iter(|| rpull_gzip(backend, Codec::Gzip, black_box(&gzip), &mut buf))
        });
    }
    group.bench_function("gzip/miniz_oxide", |b| {
        b.iter(|| miniz_gunzip(black_box(&gzip), &mut buf, &mut state))
    });
    group.bench_function("zstd/libzstd", |b| {
        b.iter(|| rpull_decoder(Codec::Zstd, black_box(&zstd), &mut buf))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
