//! What `rpull bench` prints or writes: an aligned table (the default), JSON (`--json`, the
//! [`BenchReport`] as documented in docs/bench-json.md), CSV (`--csv`) and an SVG chart
//! (`--plot`).

mod csv;
mod plot;
mod table;

pub use csv::{CSV_HEADER, render_csv};
pub use plot::{render_svg, write_svg};
pub use table::render_table;

use crate::{BenchReport, Sample, Summary};

/// The report as pretty-printed JSON (schema: docs/bench-json.md).
pub fn render_json(report: &BenchReport) -> String {
    serde_json::to_string_pretty(report).expect("a BenchReport always serialises") + "\n"
}

/// Largest peak RSS of the samples, in MB.
pub(crate) fn peak_rss_mb(samples: &[Sample]) -> Option<f64> {
    samples
        .iter()
        .filter_map(|s| s.peak_rss_bytes)
        .max()
        .map(|b| b as f64 / 1e6)
}

/// Median of an optional figure over the samples that have it.
pub(crate) fn median_of(
    samples: &[Sample],
    figure: impl Fn(&Sample) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = samples.iter().filter_map(figure).collect();
    Summary::of(&values).map(|s| s.median)
}

/// Median sync seconds of the samples that timed one.
pub(crate) fn sync_median(samples: &[Sample]) -> Option<f64> {
    median_of(samples, |s| s.sync_seconds)
}

/// Median CPU seconds of the samples.
pub(crate) fn cpu_median(samples: &[Sample]) -> Option<f64> {
    Summary::of(&samples.iter().map(|s| s.cpu_seconds).collect::<Vec<_>>()).map(|s| s.median)
}

/// Steal or memory stalls from which a run is named in [`host_note`], in seconds.
const HOST_NOTE_SECONDS: f64 = 0.1;

/// A note naming the runs during which the machine lost time to the hypervisor (steal) or to
/// waiting for memory, from the samples' machine-wide figures: on these VMs the same run has
/// taken twice as long from one minute to the next, and this says whether the host had a part
/// in it. `None` when no run reached [`HOST_NOTE_SECONDS`] of either.
pub(crate) fn host_note(samples: &[Sample]) -> Option<String> {
    let runs: Vec<String> = samples
        .iter()
        .enumerate()
        .filter_map(|(index, sample)| {
            let mut parts = Vec::new();
            if let Some(steal) = sample.steal_seconds.filter(|&s| s >= HOST_NOTE_SECONDS) {
                parts.push(format!("the hypervisor took {steal:.2} CPU-s (steal)"));
            }
            if let Some(stall) = sample
                .memory_stall_seconds
                .filter(|&s| s >= HOST_NOTE_SECONDS)
            {
                parts.push(format!("tasks waited {stall:.2} s for memory"));
            }
            (!parts.is_empty()).then(|| {
                format!(
                    "run {} of {} ({:.2} s): {}",
                    index + 1,
                    samples.len(),
                    sample.seconds,
                    parts.join(", ")
                )
            })
        })
        .collect();
    (!runs.is_empty()).then(|| format!("machine-wide, during {}", runs.join("; ")))
}

/// Seconds with a precision that suits their size: `0.0123`, `0.123`, `1.23`, `12.3`.
pub(crate) fn seconds(value: f64) -> String {
    if value < 0.1 {
        format!("{value:.4}")
    } else if value < 10.0 {
        format!("{value:.3}")
    } else {
        format!("{value:.2}")
    }
}

/// Rates and sizes: `0.12`, `12.3`, `1234`.
pub(crate) fn rate(value: f64) -> String {
    if value < 1.0 {
        format!("{value:.2}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// `value` formatted, or `-` when absent.
pub(crate) fn or_dash(value: Option<f64>, format: fn(f64) -> String) -> String {
    value.map(format).unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_note_names_the_runs_the_machine_lost_time_in() {
        let sample = |seconds: f64, steal: Option<f64>, stall: Option<f64>| Sample {
            seconds,
            steal_seconds: steal,
            memory_stall_seconds: stall,
            ..Sample::default()
        };
        // Nothing read, or little of either: no note.
        assert_eq!(host_note(&[sample(1.0, None, None)]), None);
        assert_eq!(
            host_note(&[
                sample(1.0, Some(0.09), Some(0.0)),
                sample(1.0, Some(0.0), None)
            ]),
            None
        );
        assert_eq!(
            host_note(&[
                sample(1.0, Some(0.0), Some(0.0)),
                sample(4.07, Some(1.2), Some(0.02)),
                sample(2.5, Some(0.0), Some(0.35)),
            ])
            .as_deref(),
            Some(
                "machine-wide, during run 2 of 3 (4.07 s): the hypervisor took 1.20 CPU-s (steal); \
                 run 3 of 3 (2.50 s): tasks waited 0.35 s for memory"
            )
        );
    }
}
