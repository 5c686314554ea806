//! The aligned table `rpull bench` prints by default.

use std::fmt::Write as _;

use super::{cpu_median, host_note, or_dash, peak_rss_mb, rate, seconds, sync_median};
use crate::sweep::format_value;
use crate::{BenchReport, Summary};

/// Columns: (header, right-aligned).
struct Table {
    headers: Vec<(&'static str, bool)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[(&'static str, bool)]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self, out: &mut String) {
        let mut widths: Vec<usize> = self
            .headers
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut line = |cells: Vec<&str>| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let (width, right) = (widths[i], self.headers[i].1);
                if i > 0 {
                    text.push_str("  ");
                }
                if right {
                    let _ = write!(text, "{cell:>width$}");
                } else {
                    let _ = write!(text, "{cell:<width$}");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(self.headers.iter().map(|(h, _)| *h).collect());
        for row in &self.rows {
            line(row.iter().map(String::as_str).collect());
        }
    }
}

fn summary_cells(summary: Option<Summary>) -> [String; 3] {
    match summary {
        Some(s) => [seconds(s.median), seconds(s.min), seconds(s.max)],
        None => ["-".to_owned(), "-".to_owned(), "-".to_owned()],
    }
}

/// The whole report as aligned text: header, stages, codecs, peers, sweeps, floor, machine,
/// caches and notes.
pub fn render_table(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rpull bench {} ({})\n{} layers, {:.1} MB compressed, {:.1} MB tar, {} entries; {} run(s) per stage; pulls into {}\n",
        report.reference,
        report.manifest_digest,
        report.layers,
        report.compressed_bytes as f64 / 1e6,
        report.uncompressed_bytes as f64 / 1e6,
        report.entries,
        report.runs,
        report.destination,
    );

    let mut stages = Table::new(&[
        ("stage", false),
        ("median s", true),
        ("min s", true),
        ("max s", true),
        ("MB/s in", true),
        ("MB/s out", true),
        ("files/s", true),
        ("CPU s", true),
        ("peak RSS MB", true),
        ("sync s", true),
    ]);
    for stage in &report.stages {
        let [median, min, max] = summary_cells(stage.seconds);
        stages.row(vec![
            stage.stage.clone(),
            median,
            min,
            max,
            or_dash(stage.mb_per_s_in, rate),
            or_dash(stage.mb_per_s_out, rate),
            or_dash(stage.files_per_s, rate),
            or_dash(cpu_median(&stage.samples), seconds),
            or_dash(peak_rss_mb(&stage.samples), rate),
            or_dash(sync_median(&stage.samples), seconds),
        ]);
    }
    stages.render(&mut out);

    let mut codecs = Table::new(&[
        ("stage", false),
        ("codec", false),
        ("layers", true),
        ("MB/s in", true),
        ("MB/s out", true),
    ]);
    for stage in &report.stages {
        for codec in &stage.codecs {
            codecs.row(vec![
                stage.stage.clone(),
                format!("{} ({})", codec.codec, codec.implementation),
                codec.layers.to_string(),
                or_dash(codec.mb_per_s_in, rate),
                or_dash(codec.mb_per_s_out, rate),
            ]);
        }
    }
    if !codecs.rows.is_empty() {
        out.push_str("\nper codec (sum of each layer's own decode time)\n");
        codecs.render(&mut out);
    }

    out.push_str("\nwhat each stage measures\n");
    for stage in &report.stages {
        if !stage.description.is_empty() {
            let _ = writeln!(out, "  {}: {}", stage.stage, stage.description);
        }
        // The cache note is printed once at the end.
        for note in stage
            .notes
            .iter()
            .filter(|note| **note != report.cache_note)
        {
            let _ = writeln!(out, "  {}: note: {note}", stage.stage);
        }
        if let Some(note) = host_note(&stage.samples) {
            let _ = writeln!(out, "  {}: note: {note}", stage.stage);
        }
    }

    if !report.peers.is_empty() {
        out.push_str("\npeers\n");
        let mut peers = Table::new(&[
            ("tool", false),
            ("median s", true),
            ("min s", true),
            ("max s", true),
            ("CPU s", true),
            ("peak RSS MB", true),
            ("sync s", true),
            ("version", false),
            ("options", false),
            ("does / why no number", false),
        ]);
        for peer in &report.peers {
            let [median, min, max] = summary_cells(peer.seconds);
            let does = match &peer.skipped {
                Some(reason) => format!("no number: {reason}"),
                None => peer.does.clone(),
            };
            peers.row(vec![
                peer.tool.clone(),
                median,
                min,
                max,
                or_dash(cpu_median(&peer.samples), seconds),
                or_dash(peak_rss_mb(&peer.samples), rate),
                or_dash(sync_median(&peer.samples), seconds),
                peer.version.clone().unwrap_or_else(|| "-".to_owned()),
                peer.options.clone(),
                does,
            ]);
        }
        peers.render(&mut out);
        for peer in &report.peers {
            for note in peer.notes.iter().chain(&host_note(&peer.samples)) {
                let _ = writeln!(out, "  {}: note: {note}", peer.tool);
            }
        }
    }

    for sweep in &report.sweeps {
        let _ = writeln!(out, "\nsweep {}: {}", sweep.parameter, sweep.description);
        let mut table = Table::new(&[
            (
                if sweep.parameter == "chunk-size" {
                    "chunk"
                } else {
                    "N"
                },
                true,
            ),
            ("count", true),
            ("median s", true),
            ("min s", true),
            ("max s", true),
            ("mean s", true),
            ("p90 s", true),
            ("MB/s", true),
        ]);
        for point in &sweep.points {
            let [median, min, max] = summary_cells(point.seconds);
            table.row(vec![
                format_value(&sweep.parameter, point.value),
                point.count.to_string(),
                median,
                min,
                max,
                or_dash(point.mean_seconds, seconds),
                or_dash(point.p90_seconds, seconds),
                or_dash(point.mb_per_s, rate),
            ]);
        }
        table.render(&mut out);
        // As for the stages: the cache note is printed once at the end.
        for note in sweep
            .notes
            .iter()
            .filter(|note| **note != report.cache_note)
        {
            let _ = writeln!(out, "  {}: note: {note}", sweep.parameter);
        }
    }

    out.push('\n');
    match (
        &report.floor,
        report.pipeline_floor_seconds,
        &report.bounding_stage,
    ) {
        (Some(terms), Some(floor), Some(bound)) => {
            let _ = writeln!(
                out,
                "bounding stage: {bound}\npipeline floor: {} s = max(critical path: network {} s, decompress-1core slowest layer {} s, \
                 {} {} s; CPU work {} s / {} cores = {} s)",
                seconds(floor),
                seconds(terms.network_seconds),
                seconds(terms.decompress_critical_seconds),
                terms.extract_stage,
                seconds(terms.extract_seconds),
                seconds(terms.cpu_seconds),
                terms.cpus,
                seconds(terms.cpu_seconds / terms.cpus.max(1) as f64),
            );
            let e2e = report
                .stages
                .iter()
                .find(|s| s.stage == "end-to-end")
                .and_then(|s| s.seconds);
            if let Some(e2e) = e2e {
                let _ = writeln!(
                    out,
                    "end-to-end median {} s = {:.2} x the floor",
                    seconds(e2e.median),
                    e2e.median / floor
                );
            }
            if let (Some(machine_cpu), Some(machine_floor)) =
                (terms.machine_cpu_seconds, report.machine_floor_seconds)
            {
                let _ = write!(
                    out,
                    "counting the whole machine's CPU during those stages ({} s{}): floor {} s",
                    seconds(machine_cpu),
                    network_beyond_own(report)
                        .map(|beyond| format!(
                            ", of which {} s in network outside rpull: a registry on this machine, if any",
                            seconds(beyond)
                        ))
                        .unwrap_or_default(),
                    seconds(machine_floor),
                );
                match e2e {
                    Some(e2e) => {
                        let _ = writeln!(
                            out,
                            ", end-to-end = {:.2} x that",
                            e2e.median / machine_floor
                        );
                    }
                    None => out.push('\n'),
                }
            }
        }
        _ => out.push_str("pipeline floor: not computed (a stage it needs is missing)\n"),
    }
    let machine = &report.machine;
    let _ = writeln!(
        out,
        "machine: {} cpus, {}, {} memory, Linux {}, destination filesystem {}",
        machine.cpus,
        machine.cpu_model.as_deref().unwrap_or("unknown CPU"),
        machine
            .memory_bytes
            .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "unknown".to_owned()),
        machine.kernel.as_deref().unwrap_or("unknown"),
        machine.destination_fs.as_deref().unwrap_or("unknown"),
    );
    let _ = writeln!(out, "caches: {}", report.cache_note);
    out
}

/// The machine's CPU seconds during `network` beyond rpull's own (medians): the registry's work
/// when it serves from this machine.
fn network_beyond_own(report: &BenchReport) -> Option<f64> {
    let network = report.stages.iter().find(|s| s.stage == "network")?;
    Some((network.machine_cpu_seconds?.median - network.cpu_seconds?.median).max(0.0))
}
