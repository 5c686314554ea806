//! `decompress-1core` and `decompress-all`: the layer blobs held locally decoded to a sink.

use rpull_decompress::Codec;
use std::io::{self, BufReader, Read};
use std::time::Instant;

use super::local::READ_BUFFER;
use super::{
    CachePolicy, LocalLayer, LocalLayers, Meter, check_runs, mb_per_s, median_index, stage_result,
};
use crate::error::BenchError;
use crate::{CodecThroughput, StageResult, Summary};

/// How the layers share the cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecompressMode {
    /// One thread decodes every layer, one after the other.
    OneCore,
    /// One thread per layer, all started together.
    AllCores,
}

impl DecompressMode {
    /// The stage name.
    pub fn stage(self) -> &'static str {
        match self {
            DecompressMode::OneCore => "decompress-1core",
            DecompressMode::AllCores => "decompress-all",
        }
    }
}

/// Measures decoding every layer from its local blob to a sink, `runs` times. `bytes_in` is the
/// sum of the blob sizes, `bytes_out` the sum of the tar sizes.
pub fn decompress(
    layers: &LocalLayers,
    mode: DecompressMode,
    runs: usize,
    cache: &CachePolicy,
) -> Result<StageResult, BenchError> {
    check_runs(runs)?;
    let how = match mode {
        DecompressMode::OneCore => "one thread, layers one after the other",
        DecompressMode::AllCores => "one thread per layer, all at once",
    };
    let description = format!(
        "{} layers ({}) decoded from blobs on {} to a sink, {how}",
        layers.layers.len(),
        layers.codec_summary(),
        super::extract::describe_location(&layers.dir),
    );
    let mut samples = Vec::with_capacity(runs);
    let mut per_layer_runs: Vec<Vec<f64>> = Vec::with_capacity(runs);
    let mut notes = Vec::new();
    for _ in 0..runs {
        cache.before_run(&mut notes);
        let meter = Meter::start();
        let per_layer = match mode {
            DecompressMode::OneCore => {
                // Its own thread, so this is the same work as AllCores with one layer at a time.
                let all = &layers.layers;
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| all.iter().map(decode_layer).collect::<Result<Vec<_>, _>>())
                        .join()
                        .map_err(|_| BenchError::Panic("decompress"))?
                })?
            }
            DecompressMode::AllCores => std::thread::scope(|scope| {
                let handles: Vec<_> = layers
                    .layers
                    .iter()
                    .map(|layer| scope.spawn(move || decode_layer(layer)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().map_err(|_| BenchError::Panic("decompress"))?)
                    .collect::<Result<Vec<_>, _>>()
            })?,
        };
        let mut sample = meter.stop();
        sample.bytes_in = layers.compressed_bytes();
        sample.bytes_out = per_layer.iter().map(|(bytes, _)| bytes).sum();
        samples.push(sample);
        per_layer_runs.push(per_layer.into_iter().map(|(_, seconds)| seconds).collect());
    }
    let median_run = median_index(&samples.iter().map(|s| s.seconds).collect::<Vec<_>>());
    let mut result = stage_result(mode.stage(), description, samples, notes);
    result.codecs = codec_throughput(&layers.layers, &per_layer_runs[median_run]);
    if mode == DecompressMode::OneCore {
        // Alone on its core, a layer's decode time is its own; the slowest one bounds a pipeline.
        let slowest: Vec<f64> = per_layer_runs
            .iter()
            .map(|run| run.iter().copied().fold(0.0, f64::max))
            .collect();
        result.critical_path_seconds = Summary::of(&slowest);
    }
    Ok(result)
}

/// Decodes one layer to a sink: (tar bytes, seconds).
fn decode_layer(layer: &LocalLayer) -> Result<(u64, f64), BenchError> {
    let started = Instant::now();
    let decode_error = |source| BenchError::Decompress {
        index: layer.index,
        digest: layer.digest.clone(),
        path: layer.blob.clone(),
        source,
    };
    let file =
        fs_err::File::open(&layer.blob).map_err(|e| BenchError::io("opening", &layer.blob, e))?;
    let mut decoder =
        rpull_decompress::decoder(layer.declared, BufReader::with_capacity(READ_BUFFER, file))
            .map_err(|e| decode_error(io::Error::other(e)))?;
    // The extractor reads in blocks of this order; io::copy's 8 KiB would add call overhead.
    let mut buffer = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        match decoder.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(decode_error(e)),
        }
    }
    Ok((total, started.elapsed().as_secs_f64()))
}

/// What decodes `codec` in this build (what `rpull pull` runs).
fn implementation(codec: Codec) -> &'static str {
    match codec {
        Codec::Gzip => rpull_decompress::GzipBackend::default().name(),
        Codec::Zstd => "libzstd",
        Codec::Identity => "copy",
    }
}

fn codec_throughput(layers: &[LocalLayer], seconds: &[f64]) -> Vec<CodecThroughput> {
    let mut codecs: Vec<(CodecThroughput, f64)> = Vec::new();
    for (layer, &secs) in layers.iter().zip(seconds) {
        let name = layer.codec.name();
        let index = match codecs.iter().position(|(c, _)| c.codec == name) {
            Some(i) => i,
            None => {
                codecs.push((
                    CodecThroughput {
                        codec: name.to_owned(),
                        implementation: implementation(layer.codec).to_owned(),
                        layers: 0,
                        bytes_in: 0,
                        bytes_out: 0,
                        mb_per_s_in: None,
                        mb_per_s_out: None,
                    },
                    0.0,
                ));
                codecs.len() - 1
            }
        };
        let (codec, total) = &mut codecs[index];
        codec.layers += 1;
        codec.bytes_in += layer.compressed_bytes;
        codec.bytes_out += layer.tar_bytes;
        *total += secs;
    }
    codecs
        .into_iter()
        .map(|(mut codec, secs)| {
            codec.mb_per_s_in = mb_per_s(codec.bytes_in, secs);
            codec.mb_per_s_out = mb_per_s(codec.bytes_out, secs);
            codec
        })
        .collect()
}
