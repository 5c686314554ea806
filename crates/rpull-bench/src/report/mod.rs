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

/// Median sync seconds of the samples that timed one.
pub(crate) fn sync_median(samples: &[Sample]) -> Option<f64> {
    let syncs: Vec<f64> = samples.iter().filter_map(|s| s.sync_seconds).collect();
    Summary::of(&syncs).map(|s| s.median)
}

/// Median CPU seconds of the samples.
pub(crate) fn cpu_median(samples: &[Sample]) -> Option<f64> {
    Summary::of(&samples.iter().map(|s| s.cpu_seconds).collect::<Vec<_>>()).map(|s| s.median)
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
