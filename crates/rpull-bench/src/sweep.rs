//! Sweeps: the same measurement at several values of one parameter.
//!
//! * `concurrency`: end-to-end pulls with `--max-concurrent-downloads N`;
//! * `chunk-size`: the `network-ranged` stage with ranged GETs of N bytes;
//! * `clients`: N simultaneous `network` pulls (every blob fetched and verified, one stream per
//!   blob), all started together; every client's own seconds are the sample, as the registry's
//!   pull reports tabulate them (min, max, mean, 90th percentile).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Barrier;

use crate::error::BenchError;
use crate::stages::end_to_end::pull_sample;
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

/// The loop every sweep runs. Every value must be at least 1; all are checked before anything
/// runs. Each value is measured `runs` times by `measure`, which returns the run's seconds: one
/// per measurement that ran at once (one, or one per client), so that the point's aggregate rate
/// counts `bytes` that many times. `measure` adds its notes (caches not dropped, ...) to the list
/// it is given; the sweep keeps each note once.
async fn sweep(
    parameter: &str,
    description: String,
    values: &[u64],
    runs: usize,
    bytes: u64,
    mut measure: impl AsyncFnMut(u64, &mut Vec<String>) -> Result<Vec<f64>, BenchError>,
) -> Result<SweepResult, BenchError> {
    if values.contains(&0) {
        let unit = if parameter == "chunk-size" {
            " byte"
        } else {
            ""
        };
        return Err(BenchError::Invalid(format!(
            "--{parameter} values must be at least 1{unit}"
        )));
    }
    let mut notes = Vec::new();
    let mut points = Vec::with_capacity(values.len());
    for &value in values {
        let (mut seconds, mut parallel) = (Vec::with_capacity(runs), 1);
        for _ in 0..runs {
            let run = measure(value, &mut notes).await?;
            parallel = run.len();
            seconds.extend(run);
        }
        points.push(point(value, &seconds, bytes, parallel));
    }
    dedup_notes(&mut notes);
    Ok(SweepResult {
        parameter: parameter.to_owned(),
        description,
        points,
        notes,
    })
}

/// Keeps the first of equal notes, in order.
fn dedup_notes(notes: &mut Vec<String>) {
    let mut seen = HashSet::new();
    notes.retain(|note| seen.insert(note.clone()));
}

/// End-to-end pulls into `dir` at each `--max-concurrent-downloads` value. Each run waits for a
/// child process, so this is called on a blocking thread of the tokio runtime (`spawn_blocking`),
/// where it drives the async sweep with `Handle::block_on`.
pub fn concurrency_sweep(
    pull: &PullCommand,
    reference: &str,
    dir: &Path,
    compressed_bytes: u64,
    values: &[usize],
    runs: usize,
    cache: &CachePolicy,
) -> Result<SweepResult, BenchError> {
    let description = format!(
        "end-to-end `rpull pull --max-concurrent-downloads N` into {}; seconds over {runs} run(s); MB/s of compressed bytes at the median",
        dir.display()
    );
    let values: Vec<u64> = values.iter().map(|&value| value as u64).collect();
    tokio::runtime::Handle::current().block_on(sweep(
        "concurrency",
        description,
        &values,
        runs,
        compressed_bytes,
        async |value, notes| {
            let concurrency = Some(value as usize);
            let sample = pull_sample(pull, reference, dir, concurrency, cache, notes)?;
            Ok(vec![sample.seconds])
        },
    ))
}

/// The ranged network stage at each chunk size.
pub async fn chunk_size_sweep(
    image: &BenchImage,
    values: &[u64],
    runs: usize,
    cache: &CachePolicy,
) -> Result<SweepResult, BenchError> {
    let description = format!(
        "network-ranged: every blob fetched at once in ranged GETs of N bytes ({RANGE_WINDOW} in flight per blob, \
         {} ahead in all), verified; \
         seconds over {runs} run(s); MB/s of blob bytes at the median",
        format_size(rpull::DEFAULT_RANGE_BUDGET)
    );
    let bytes = image.blobs().iter().map(|b| b.size).sum();
    sweep(
        "chunk-size",
        description,
        values,
        runs,
        bytes,
        async |value, notes| {
            cache.before_run(notes);
            let started = Instant::now();
            fetch_image(image, FetchMode::Ranged(value)).await?;
            Ok(vec![started.elapsed().as_secs_f64()])
        },
    )
    .await
}

/// N clients each fetching and verifying every blob, all started together, at each N.
pub async fn clients_sweep(
    image: &BenchImage,
    values: &[usize],
    runs: usize,
    cache: &CachePolicy,
) -> Result<SweepResult, BenchError> {
    let description = format!(
        "N simultaneous pulls of every blob (one GET per blob, verified, discarded), started together on one connection \
         pool (each GET in flight has its own connection); seconds = each client's own time over {runs} run(s) x N; \
         MB/s = N x image bytes / median client seconds"
    );
    let bytes = image.blobs().iter().map(|b| b.size).sum();
    let values: Vec<u64> = values.iter().map(|&value| value as u64).collect();
    sweep(
        "clients",
        description,
        &values,
        runs,
        bytes,
        async |clients, notes| {
            cache.before_run(notes);
            run_clients(image, clients as usize).await
        },
    )
    .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_notes_keeps_the_first_of_each_in_order() {
        let mut notes: Vec<String> = ["b", "a", "b", "c", "a"].map(str::to_owned).into();
        dedup_notes(&mut notes);
        assert_eq!(notes, ["b", "a", "c"]);
    }

    #[tokio::test]
    async fn the_sweep_loop_measures_every_value_and_keeps_each_note_once() {
        let mut calls = Vec::new();
        let result = (sweep(
            "clients",
            "described".to_owned(),
            &[1, 3],
            2,
            1_000_000,
            async |value, notes| {
                calls.push(value);
                // A note every run, and one that `before_run` would not have deduplicated.
                notes.push("every run".to_owned());
                notes.push(format!("value {value}"));
                Ok(vec![0.5; value as usize])
            },
        ))
        .await
        .expect("sweep");
        assert_eq!(calls, [1, 1, 3, 3]);
        assert_eq!(result.parameter, "clients");
        assert_eq!(result.description, "described");
        assert_eq!(result.notes, ["every run", "value 1", "value 3"]);
        let counts: Vec<usize> = result.points.iter().map(|p| p.count).collect();
        assert_eq!(counts, [2, 6], "runs x measurements per run");
        // 3 clients at once move 3 x the bytes in the median 0.5 s.
        assert_eq!(result.points[1].mb_per_s, Some(6.0));
    }

    #[tokio::test]
    async fn a_zero_value_is_refused_before_anything_runs() {
        for (parameter, message) in [
            ("chunk-size", "--chunk-size values must be at least 1 byte"),
            ("clients", "--clients values must be at least 1"),
        ] {
            let mut ran = false;
            let error = (sweep(parameter, String::new(), &[2, 0], 1, 1, async |_, _| {
                ran = true;
                Ok(vec![1.0])
            }))
            .await
            .expect_err("0 is refused");
            assert!(!ran, "{parameter}: nothing runs");
            assert!(
                matches!(&error, BenchError::Invalid(m) if m == message),
                "{error}"
            );
        }
    }
}
