//! `--csv`: one row per stage, peer and sweep point, under [`CSV_HEADER`] (docs/bench-json.md
//! describes the columns).

use super::{cpu_median, median_of, peak_rss_mb, sync_median};
use crate::{BenchReport, Sample, Summary};

/// The first line of `--csv`.
pub const CSV_HEADER: &str = "kind,name,value,count,median_s,min_s,max_s,mean_s,p90_s,mb_per_s_in,mb_per_s_out,files_per_s,cpu_s,peak_rss_mb,sync_s,machine_cpu_s,steal_max_s,memory_stall_max_s,note";

/// One row's cells, in [`CSV_HEADER`] order.
#[derive(Default)]
struct Row {
    kind: &'static str,
    name: String,
    value: Option<u64>,
    count: usize,
    seconds: Option<Summary>,
    mean: Option<f64>,
    p90: Option<f64>,
    mb_in: Option<f64>,
    mb_out: Option<f64>,
    files_per_s: Option<f64>,
    cpu: Option<f64>,
    rss_mb: Option<f64>,
    sync: Option<f64>,
    machine_cpu: Option<f64>,
    steal_max: Option<f64>,
    stall_max: Option<f64>,
    note: String,
}

fn number(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.6}")).unwrap_or_default()
}

/// RFC 4180 quoting where needed.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// The largest value of a machine-wide figure over the samples that read it: the run the host
/// disturbed most.
fn max_of(samples: &[Sample], figure: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    samples.iter().filter_map(figure).reduce(f64::max)
}

impl Row {
    /// The machine-wide cells of a stage or peer row.
    fn with_machine(mut self, samples: &[Sample]) -> Row {
        self.machine_cpu = median_of(samples, |s| s.machine_cpu_seconds);
        self.steal_max = max_of(samples, |s| s.steal_seconds);
        self.stall_max = max_of(samples, |s| s.memory_stall_seconds);
        self
    }

    fn render(&self) -> String {
        [
            self.kind.to_owned(),
            field(&self.name),
            self.value.map(|v| v.to_string()).unwrap_or_default(),
            self.count.to_string(),
            number(self.seconds.map(|s| s.median)),
            number(self.seconds.map(|s| s.min)),
            number(self.seconds.map(|s| s.max)),
            number(self.mean),
            number(self.p90),
            number(self.mb_in),
            number(self.mb_out),
            number(self.files_per_s),
            number(self.cpu),
            number(self.rss_mb),
            number(self.sync),
            number(self.machine_cpu),
            number(self.steal_max),
            number(self.stall_max),
            field(&self.note),
        ]
        .join(",")
    }
}

/// The report as CSV: [`CSV_HEADER`], then stages, peers and sweep points.
pub fn render_csv(report: &BenchReport) -> String {
    let mut rows = Vec::new();
    for stage in &report.stages {
        rows.push(
            Row {
                kind: "stage",
                name: stage.stage.clone(),
                count: stage.samples.len(),
                seconds: stage.seconds,
                mb_in: stage.mb_per_s_in,
                mb_out: stage.mb_per_s_out,
                files_per_s: stage.files_per_s,
                cpu: cpu_median(&stage.samples),
                rss_mb: peak_rss_mb(&stage.samples),
                sync: sync_median(&stage.samples),
                note: stage.notes.join("; "),
                ..Row::default()
            }
            .with_machine(&stage.samples),
        );
    }
    for peer in &report.peers {
        rows.push(
            Row {
                kind: "peer",
                name: peer.tool.clone(),
                count: peer.samples.len(),
                seconds: peer.seconds,
                mb_in: peer
                    .seconds
                    .and_then(|s| crate::stages::mb_per_s(report.compressed_bytes, s.median)),
                cpu: cpu_median(&peer.samples),
                rss_mb: peak_rss_mb(&peer.samples),
                sync: sync_median(&peer.samples),
                note: match &peer.skipped {
                    Some(reason) => format!("no number: {reason}"),
                    None => std::iter::once(&peer.does)
                        .chain(&peer.notes)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; "),
                },
                ..Row::default()
            }
            .with_machine(&peer.samples),
        );
    }
    for sweep in &report.sweeps {
        for point in &sweep.points {
            rows.push(Row {
                kind: "sweep",
                name: sweep.parameter.clone(),
                value: Some(point.value),
                count: point.count,
                seconds: point.seconds,
                mean: point.mean_seconds,
                p90: point.p90_seconds,
                mb_in: point.mb_per_s,
                ..Row::default()
            });
        }
    }
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for row in rows {
        out.push_str(&row.render());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_only_when_needed() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a, b"), "\"a, b\"");
        assert_eq!(field("say \"x\""), "\"say \"\"x\"\"\"");
    }

    #[test]
    fn every_row_has_every_column() {
        let columns = CSV_HEADER.split(',').count();
        let row = Row {
            kind: "stage",
            name: "x,y".to_owned(),
            note: "a, \"b\"".to_owned(),
            ..Row::default()
        }
        .render();
        // Quoted commas do not count.
        let unquoted: String = row.split('"').step_by(2).collect();
        assert_eq!(unquoted.matches(',').count() + 1, columns, "{row}");
    }

    #[test]
    fn machine_cells_are_the_median_and_the_worst_run() {
        let sample = |machine: f64, steal: Option<f64>, stall: Option<f64>| Sample {
            machine_cpu_seconds: Some(machine),
            steal_seconds: steal,
            memory_stall_seconds: stall,
            ..Sample::default()
        };
        let samples = [
            sample(1.0, Some(0.02), None),
            sample(3.0, Some(0.31), None),
            sample(2.0, Some(0.0), None),
        ];
        let row = Row {
            kind: "stage",
            ..Row::default()
        }
        .with_machine(&samples)
        .render();
        let header: Vec<&str> = CSV_HEADER.split(',').collect();
        let cells: Vec<&str> = row.split(',').collect();
        let cell = |name: &str| cells[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(cell("machine_cpu_s"), "2.000000");
        assert_eq!(cell("steal_max_s"), "0.310000");
        // No run read the pressure file: the cell is empty, not zero.
        assert_eq!(cell("memory_stall_max_s"), "");
    }
}
