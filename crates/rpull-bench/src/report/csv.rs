//! `--csv`: one row per stage, peer and sweep point, under [`CSV_HEADER`] (docs/bench-json.md
//! describes the columns).

use super::{cpu_median, peak_rss_mb, sync_median};
use crate::{BenchReport, Summary};

/// The first line of `--csv`.
pub const CSV_HEADER: &str = "kind,name,value,count,median_s,min_s,max_s,mean_s,p90_s,mb_per_s_in,mb_per_s_out,files_per_s,cpu_s,peak_rss_mb,sync_s,note";

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

impl Row {
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
            field(&self.note),
        ]
        .join(",")
    }
}

/// The report as CSV: [`CSV_HEADER`], then stages, peers and sweep points.
pub fn render_csv(report: &BenchReport) -> String {
    let mut rows = Vec::new();
    for stage in &report.stages {
        rows.push(Row {
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
        });
    }
    for peer in &report.peers {
        rows.push(Row {
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
        });
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
}
