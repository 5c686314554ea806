//! Sweeps: the same measurement at several values of one parameter.
//!
//! * `concurrency`: end-to-end pulls with `--max-concurrent-downloads N`;
//! * `chunk-size`: the `network-ranged` stage with ranged GETs of N bytes;
//! * `clients`: N simultaneous `network` pulls (every blob fetched and verified, one stream per
//!   blob), all started together; every client's own seconds are the sample, as the registry's
//!   pull reports tabulate them (min, max, mean, 90th percentile).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Barrier;

use crate::error::BenchError;
use crate::stages::{
    BenchImage, CachePolicy, FetchMode, PullCommand, RANGE_WINDOW, fetch_image, format_size,
    mb_per_s,
};
use crate::{Summary, SweepPoint, SweepResult};

/// A point from one seconds value per measurement; `bytes` are moved per measurement, `parallel`
/// measurements ran at once (for the aggregate rate).
fn point(value: u64, seconds: &[f64], bytes: u64, parallel: usize) -> SweepPoint {
    let summary = Summary::of(seconds);
    let mean = (!seconds.is_empty()).then(|| seconds.iter().sum::<f64>() / seconds.len() as f64);
    SweepPoint {
        value,
        count: seconds.len(),
        seconds: summary,
        mean_seconds: mean,
        p90_seconds: Summary::percentile(seconds, 90.0),
        mb_per_s: summary.and_then(|s| mb_per_s(bytes * parallel as u64, s.median)),
    }
}

/// End-to-end pulls into `dir` at each `--max-concurrent-downloads` value.
pub fn concurrency_sweep(
    pull: &PullCommand,
    reference: &str,
    dir: &Path,
    compressed_bytes: u64,
    values: &[usize],
    runs: usize,
    cache: &CachePolicy,
) -> Result<SweepResult, BenchError> {
    let mut notes = Vec::new();
    let mut points = Vec::with_capacity(values.len());
    for &value in values {
        if value == 0 {
            return Err(BenchError::Invalid(
                "--concurrency values must be at least 1".to_owned(),
            ));
        }
        let mut seconds = Vec::with_capacity(runs);
        for _ in 0..runs {
            seconds.push(
                crate::stages::end_to_end::pull_sample(
                    pull,
                    reference,
                    dir,
                    Some(value),
                    cache,
                    &mut notes,
                )?
                .seconds,
            );
        }
        points.push(point(value as u64, &seconds, compressed_bytes, 1));
    }
    Ok(SweepResult {
        parameter: "concurrency".to_owned(),
        description: format!(
            "end-to-end `rpull pull --max-concurrent-downloads N` into {}; seconds over {runs} run(s); MB/s of compressed bytes at the median",
            dir.display()
        ),
        points,
    })
}

/// The ranged network stage at each chunk size.
pub async fn chunk_size_sweep(
    image: &BenchImage,
    values: &[u64],
    runs: usize,
    cache: &CachePolicy,
) -> Result<SweepResult, BenchError> {
    let mut notes = Vec::new();
    let bytes: u64 = image.blobs().iter().map(|b| b.size).sum();
    let mut points = Vec::with_capacity(values.len());
    for &value in values {
        if value == 0 {
            return Err(BenchError::Invalid(
                "--chunk-size values must be at least 1 byte".to_owned(),
            ));
        }
        let mut seconds = Vec::with_capacity(runs);
        for _ in 0..runs {
            cache.before_run(&mut notes);
            let started = Instant::now();
            fetch_image(image, FetchMode::Ranged(value)).await?;
            seconds.push(started.elapsed().as_secs_f64());
        }
        points.push(point(value, &seconds, bytes, 1));
    }
    Ok(SweepResult {
        parameter: "chunk-size".to_owned(),
        description: format!(
            "network-ranged: every blob fetched at once in ranged GETs of N bytes ({RANGE_WINDOW} in flight per blob), verified; \
             seconds over {runs} run(s); MB/s of blob bytes at the median"
        ),
        points,
    })
}

/// N clients each fetching and verifying every blob, all started together, at each N.
pub async fn clients_sweep(
    image: &BenchImage,
    values: &[usize],
    runs: usize,
    cache: &CachePolicy,
) -> Result<SweepResult, BenchError> {
    let mut notes = Vec::new();
    let bytes: u64 = image.blobs().iter().map(|b| b.size).sum();
    let mut points = Vec::with_capacity(values.len());
    for &clients in values {
        if clients == 0 {
            return Err(BenchError::Invalid(
                "--clients values must be at least 1".to_owned(),
            ));
        }
        let mut seconds = Vec::with_capacity(runs * clients);
        for _ in 0..runs {
            cache.before_run(&mut notes);
            seconds.extend(run_clients(image, clients).await?);
        }
        points.push(point(clients as u64, &seconds, bytes, clients));
    }
    Ok(SweepResult {
        parameter: "clients".to_owned(),
        description: format!(
            "N simultaneous pulls of every blob (one GET per blob, verified, discarded), started together on one connection \
             pool (each GET in flight has its own connection); seconds = each client's own time over {runs} run(s) x N; \
             MB/s = N x image bytes / median client seconds"
        ),
        points,
    })
}

/// Every client's seconds, from the common start.
async fn run_clients(image: &BenchImage, clients: usize) -> Result<Vec<f64>, BenchError> {
    let barrier = Arc::new(Barrier::new(clients));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let image = image.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            let started = Instant::now();
            fetch_image(&image, FetchMode::Stream).await?;
            Ok::<_, BenchError>(started.elapsed().as_secs_f64())
        });
    }
    let mut seconds = Vec::with_capacity(clients);
    while let Some(joined) = tasks.join_next().await {
        seconds.push(joined.map_err(|_| BenchError::Panic("client"))??);
    }
    Ok(seconds)
}

/// `8 MiB` for chunk sizes, the plain number for the others.
pub fn format_value(parameter: &str, value: u64) -> String {
    if parameter == "chunk-size" {
        format_size(value)
    } else {
        value.to_string()
    }
}
