//! What a pull shows: per-layer bars on a terminal, plain lines otherwise, JSON lines with
//! `--json`, nothing with `--quiet`. Human progress goes to stderr; the JSON events and the final
//! summary are the command's data and go to stdout.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rpull::{LayerState, PullEvent, PullReport};

use crate::cli::OutputArgs;

#[derive(Clone)]
pub struct Progress {
    inner: Arc<Inner>,
}

enum Inner {
    Quiet,
    Json,
    Lines {
        layers: Mutex<usize>,
    },
    Bars {
        multi: MultiProgress,
        bars: Mutex<Vec<ProgressBar>>,
    },
}

impl Progress {
    pub fn new(output: &OutputArgs) -> Progress {
        let inner = if output.quiet {
            Inner::Quiet
        } else if output.json {
            Inner::Json
        } else if std::io::stderr().is_terminal() {
            Inner::Bars {
                multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
                bars: Mutex::new(Vec::new()),
            }
        } else {
            Inner::Lines {
                layers: Mutex::new(0),
            }
        };
        Progress {
            inner: Arc::new(inner),
        }
    }

    pub fn event(&self, event: &PullEvent) {
        match &*self.inner {
            Inner::Quiet => {}
            Inner::Json => print_json(event),
            Inner::Lines { layers } => lines(event, layers),
            Inner::Bars { multi, bars } => self::bars(event, multi, bars),
        }
    }

    /// The end of a pull: the summary for a success; bars are cleared either way.
    pub fn finish(&self, report: Option<&PullReport>) {
        if let Inner::Bars { bars, .. } = &*self.inner {
            for bar in bars.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if !bar.is_finished() {
                    bar.abandon();
                }
            }
        }
        let Some(report) = report else { return };
        match &*self.inner {
            Inner::Quiet => {}
            Inner::Json => {
                let mut value = serde_json::to_value(report).unwrap_or_default();
                if let Some(object) = value.as_object_mut() {
                    object.insert("event".into(), "summary".into());
                }
                println!("{value}");
            }
            Inner::Lines { .. } | Inner::Bars { .. } => {
                let mb = |b: u64| b as f64 / 1e6;
                println!(
                    "Pulled {} ({}) into {}: {} layers, {:.1} MB compressed, {:.1} MB unpacked, {:.2} s ({:.0} MB/s)",
                    report.reference,
                    report.manifest_digest,
                    report.destination.display(),
                    report.layers.len(),
                    mb(report.compressed_bytes),
                    mb(report.uncompressed_bytes),
                    report.seconds,
                    mb(report.compressed_bytes) / report.seconds.max(1e-9),
                );
            }
        }
    }
}

fn print_json(event: &PullEvent) {
    if let Ok(line) = serde_json::to_string(event) {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
    }
}

fn short(digest: &rpull::Digest) -> String {
    let text = digest.to_string();
    let (algorithm, hex) = text.split_once(':').unwrap_or(("", &text));
    format!("{algorithm}:{}", &hex[..hex.len().min(12)])
}

fn state_name(state: LayerState) -> &'static str {
    match state {
        LayerState::Waiting => "waiting",
        LayerState::Downloading => "downloading",
        LayerState::Verified => "verified",
        LayerState::Extracted => "extracted",
        LayerState::Merged => "done",
    }
}

fn lines(event: &PullEvent, layers: &Mutex<usize>) {
    match event {
        PullEvent::Resolved {
            reference,
            manifest_digest,
            platform,
            layers: list,
        } => {
            *layers.lock().unwrap_or_else(|p| p.into_inner()) = list.len();
            let total: u64 = list.iter().map(|(_, size)| size).sum();
            eprintln!(
                "{reference}: resolved {manifest_digest} ({platform}), {} layers, {:.1} MB",
                list.len(),
                total as f64 / 1e6
            );
        }
        PullEvent::LayerState {
            index,
            digest,
            state,
        } if *state != LayerState::Waiting => {
            let count = *layers.lock().unwrap_or_else(|p| p.into_inner());
            eprintln!(
                "layer {}/{count} {}: {}",
                index + 1,
                short(digest),
                state_name(*state)
            );
        }
        PullEvent::Committed { path } => eprintln!("committed {path}"),
        _ => {}
    }
}

fn bars(event: &PullEvent, multi: &MultiProgress, bars: &Mutex<Vec<ProgressBar>>) {
    let mut bars = bars.lock().unwrap_or_else(|p| p.into_inner());
    match event {
        PullEvent::Resolved { layers, .. } => {
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30.cyan/blue}] {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            for (index, (digest, size)) in layers.iter().enumerate() {
                let bar = multi.add(ProgressBar::new(*size));
                bar.set_style(style.clone());
                bar.set_prefix(format!(
                    "{:>2}/{} {}",
                    index + 1,
                    layers.len(),
                    short(digest)
                ));
                bar.set_message("waiting");
                bar.enable_steady_tick(Duration::from_millis(200));
                bars.push(bar);
            }
        }
        PullEvent::LayerProgress {
            index, downloaded, ..
        } => {
            if let Some(bar) = bars.get(*index) {
                bar.set_position(*downloaded);
            }
        }
        PullEvent::LayerState { index, state, .. } => {
            if let Some(bar) = bars.get(*index) {
                match state {
                    LayerState::Merged => bar.finish_with_message("done"),
                    LayerState::Downloading => bar.set_message("downloading + extracting"),
                    LayerState::Verified => bar.set_message("verified, extracting"),
                    other => bar.set_message(state_name(*other)),
                }
            }
        }
        PullEvent::Committed { .. } => {}
    }
}
