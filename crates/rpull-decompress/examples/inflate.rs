//! Times each gzip backend over a file: `cargo run --release -p rpull-decompress --example
//! inflate -- FILE.gz [RUNS]`. Prints MB/s of output per backend (one core, file in memory).

use std::io::Read;
use std::time::Instant;

use rpull_decompress::{Codec, GzipBackend, decoder_with};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: inflate FILE.gz [RUNS]");
    let runs: usize = args
        .next()
        .map_or(3, |runs| runs.parse().expect("RUNS is a number"));
    let compressed = std::fs::read(&path).expect("reading the file");
    let mut buffer = vec![0u8; 256 * 1024];
    for &backend in GzipBackend::ALL {
        let mut times = Vec::new();
        let mut out = 0u64;
        for _ in 0..runs {
            let start = Instant::now();
            let mut decoder = decoder_with(Codec::Gzip, &compressed[..], backend).expect("decoder");
            out = 0;
            loop {
                let read = decoder.read(&mut buffer).expect("inflating");
                if read == 0 {
                    break;
                }
                out += read as u64;
            }
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{backend:8} {out} bytes out, median {median:.3} s of {runs} = {:.0} MB/s",
            out as f64 / median / 1e6
        );
    }
}
