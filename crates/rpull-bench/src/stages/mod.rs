//! The stages of a pull, each measured alone, and the whole pull. Every stage runs `runs` times,
//! each run cold where the cache policy allows it, and returns a [`StageResult`].

pub(crate) mod decompress;
pub(crate) mod end_to_end;
pub(crate) mod extract;
pub(crate) mod local;
pub(crate) mod network;

use std::time::Instant;

use rpull::registry::{Client, Descriptor, ResolvedImage};
use rpull::{Platform, Reference};

use crate::error::BenchError;
use crate::resources::{MachineMeter, peak_rss_bytes, process_cpu_seconds, reset_peak_rss};
use crate::{Sample, StageResult, Summary};

pub use decompress::{DecompressMode, decompress};
pub use end_to_end::{ImageSize, PullCommand, end_to_end};
pub(crate) use extract::extract_runs;
pub use extract::{ExtractTarget, TarReference, apply_layers, extract, extract_beside_tar};
pub use local::{LocalLayer, LocalLayers, prepare_local};
pub use network::{FetchMode, RANGE_WINDOW, fetch_image, network};

/// The image under test and the client that reaches it.
#[derive(Debug, Clone)]
pub struct BenchImage {
    /// The registry client.
    pub client: Client,
    /// The reference, as resolved.
    pub reference: Reference,
    /// Its platform manifest.
    pub resolved: ResolvedImage,
}

impl BenchImage {
    /// Resolves `reference` for `platform`.
    pub async fn resolve(
        client: &Client,
        reference: &Reference,
        platform: &Platform,
    ) -> Result<BenchImage, BenchError> {
        let resolved = client
            .resolve(reference, platform)
            .await
            .map_err(|source| BenchError::Resolve {
                reference: reference.to_string(),
                source: Box::new(source),
            })?;
        Ok(BenchImage {
            client: client.clone(),
            reference: reference.clone(),
            resolved,
        })
    }

    /// Every blob a pull fetches: the layers, then the config.
    pub fn blobs(&self) -> Vec<Descriptor> {
        let mut blobs = self.resolved.layers.clone();
        blobs.push(self.resolved.config.clone());
        blobs
    }

    /// Sum of the layers' compressed sizes.
    pub fn compressed_bytes(&self) -> u64 {
        self.resolved.layers.iter().map(|layer| layer.size).sum()
    }
}

/// Whether runs start cold: page cache, dentries and inodes dropped before each run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CachePolicy {
    /// Drop caches before every run (needs root).
    Drop,
    /// Leave caches alone; the string says why (shown in notes).
    Keep(String),
}

impl CachePolicy {
    /// [`CachePolicy::Drop`] when running as root and `warm` is not asked for; otherwise
    /// [`CachePolicy::Keep`] with the reason.
    pub fn for_current_user(warm: bool) -> CachePolicy {
        if warm {
            CachePolicy::Keep("page cache not dropped between runs: --warm".to_owned())
        } else if rpull_is_root() {
            CachePolicy::Drop
        } else {
            CachePolicy::Keep(
                "page cache not dropped between runs: not root (drop_caches needs root)".to_owned(),
            )
        }
    }

    /// Whether caches are to be dropped.
    pub fn is_cold(&self) -> bool {
        matches!(self, CachePolicy::Drop)
    }

    /// What the report's `cache_note` says about this policy.
    pub fn note(&self) -> String {
        match self {
            CachePolicy::Drop => {
                let mut note = "sync + drop_caches (echo 3 > /proc/sys/vm/drop_caches) before every run; inputs held on \
                 tmpfs are not dropped (tmpfs pages are not cache)"
                    .to_owned();
                if crate::resources::free_page_reporting() {
                    note.push_str(&format!(
                        "; this machine's balloon reports free memory to its host, so {:.2} GiB of \
                         memory is touched and freed after each drop: every run starts with free \
                         memory the host backs",
                        crate::resources::prime_bytes() as f64 / (1u64 << 30) as f64
                    ));
                }
                note
            }
            CachePolicy::Keep(reason) => reason.clone(),
        }
    }

    /// Called before each run, outside the timing. A failure to drop is noted once in `notes`.
    pub(crate) fn before_run(&self, notes: &mut Vec<String>) {
        let note = match self {
            CachePolicy::Drop => match crate::resources::drop_caches() {
                Ok(()) => return,
                Err(reason) => reason,
            },
            CachePolicy::Keep(reason) => reason.clone(),
        };
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
}

fn rpull_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Measures in-process work: wall time, CPU time of this process and of the whole machine,
/// peak RSS since the start.
pub(crate) struct Meter {
    started: Instant,
    cpu: f64,
    machine: MachineMeter,
    rss_reset: bool,
}

impl Meter {
    pub(crate) fn start() -> Meter {
        let rss_reset = reset_peak_rss();
        Meter {
            started: Instant::now(),
            cpu: process_cpu_seconds(),
            machine: MachineMeter::start(),
            rss_reset,
        }
    }

    /// The sample so far; byte and file counts are the caller's.
    pub(crate) fn stop(self) -> Sample {
        let mut sample = Sample {
            seconds: self.started.elapsed().as_secs_f64(),
            cpu_seconds: (process_cpu_seconds() - self.cpu).max(0.0),
            // Without the reset the high-water mark would cover everything before this run.
            peak_rss_bytes: if self.rss_reset {
                peak_rss_bytes()
            } else {
                None
            },
            ..Sample::default()
        };
        self.machine.finish(&mut sample);
        sample
    }
}

/// MB/s (10^6 bytes per second), or `None` for a zero duration.
pub(crate) fn mb_per_s(bytes: u64, seconds: f64) -> Option<f64> {
    (seconds > 0.0).then(|| bytes as f64 / 1e6 / seconds)
}

/// Slowest run over fastest from which the runs of a stage or peer count as spread
/// (see [`spread_note`]).
const SPREAD_RATIO: f64 = 1.5;
/// ... and slowest minus fastest, in seconds, so that runs of a few milliseconds, where 1.5x is
/// scheduling noise, are not flagged.
const SPREAD_SECONDS: f64 = 0.25;

/// A note when the runs of a stage (or peer) are far apart: their median is then no steady
/// figure, and a floor it sets (or a ratio to it) moves with the run that happened to land in
/// the middle.
/// On the VMs here, writing the same gigabyte has taken 0.6 s in one run and 4.5 s in the next.
pub(crate) fn spread_note(seconds: &[f64]) -> Option<String> {
    let summary = Summary::of(seconds)?;
    (summary.min > 0.0
        && summary.max / summary.min >= SPREAD_RATIO
        && summary.max - summary.min >= SPREAD_SECONDS)
        .then(|| {
            format!(
                "runs spread from {:.2} to {:.2} s ({:.1}x): the median of {} runs is not a steady figure here",
                summary.min,
                summary.max,
                summary.max / summary.min,
                seconds.len()
            )
        })
}

/// Builds a stage's result: summaries over the runs and median rates (median over the runs of
/// each run's own rate), with a note when the runs are far apart ([`spread_note`]).
pub(crate) fn stage_result(
    stage: &str,
    description: String,
    samples: Vec<Sample>,
    mut notes: Vec<String>,
) -> StageResult {
    let seconds: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    notes.extend(spread_note(&seconds));
    let cpu: Vec<f64> = samples.iter().map(|s| s.cpu_seconds).collect();
    let machine_cpu: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.machine_cpu_seconds)
        .collect();
    let rate = |f: &dyn Fn(&Sample) -> Option<f64>| {
        let rates: Vec<f64> = samples.iter().filter_map(f).collect();
        Summary::of(&rates).map(|s| s.median)
    };
    let any_files = samples.iter().any(|s| s.files > 0);
    StageResult {
        stage: stage.to_owned(),
        description,
        seconds: Summary::of(&seconds),
        cpu_seconds: Summary::of(&cpu),
        // Only when every run has a reading: a median of some runs would not be comparable.
        machine_cpu_seconds: if machine_cpu.len() == samples.len() {
            Summary::of(&machine_cpu)
        } else {
            None
        },
        mb_per_s_in: rate(&|s| mb_per_s(s.bytes_in, s.seconds)),
        mb_per_s_out: rate(&|s| {
            if s.bytes_out > 0 {
                mb_per_s(s.bytes_out, s.seconds)
            } else {
                None
            }
        }),
        files_per_s: if any_files {
            rate(&|s| (s.seconds > 0.0).then(|| s.files as f64 / s.seconds))
        } else {
            None
        },
        critical_path_seconds: None,
        codecs: Vec::new(),
        samples,
        notes,
    }
}

/// Index of the median value (the lower middle for an even count).
pub(crate) fn median_index(values: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    order[(values.len() - 1) / 2]
}

/// Joins the results of one stage measured a run at a time, in rounds (`rpull bench` measures
/// every stage once per round, so that a machine whose speed drifts meets the stages and the
/// pull alike), into the result of all its runs: the samples in round order, each note once,
/// the summaries and the spread note over all the runs, the critical path over the rounds', and
/// the per-codec figures of the median run. A stage skipped or stopped in any round has no
/// figures, as a stage that stops part-way through its runs (its notes say why). `parts` are
/// results of one run each (more would repeat their spread note); an empty list is `None`.
pub(crate) fn merge_rounds(parts: Vec<StageResult>) -> Option<StageResult> {
    let first = parts.first()?;
    let (stage, description) = (first.stage.clone(), first.description.clone());
    let mut notes: Vec<String> = Vec::new();
    for note in parts.iter().flat_map(|part| &part.notes) {
        if !notes.contains(note) {
            notes.push(note.clone());
        }
    }
    if parts.iter().any(|part| part.samples.is_empty()) {
        return Some(stage_result(&stage, description, Vec::new(), notes));
    }
    let seconds: Vec<f64> = parts
        .iter()
        .map(|part| part.seconds.map_or(0.0, |summary| summary.median))
        .collect();
    let median = median_index(&seconds);
    let critical: Vec<f64> = parts
        .iter()
        .filter_map(|part| part.critical_path_seconds.map(|summary| summary.median))
        .collect();
    let codecs = parts[median].codecs.clone();
    let samples = parts.into_iter().flat_map(|part| part.samples).collect();
    let mut merged = stage_result(&stage, description, samples, notes);
    merged.codecs = codecs;
    merged.critical_path_seconds = if critical.len() == seconds.len() {
        Summary::of(&critical)
    } else {
        None
    };
    Some(merged)
}

/// A stage that was not run, with the reason in its notes.
pub(crate) fn skipped_stage(stage: &str, description: String, reason: String) -> StageResult {
    stage_result(
        stage,
        description,
        Vec::new(),
        vec![format!("skipped: {reason}")],
    )
}

fn check_runs(runs: usize) -> Result<(), BenchError> {
    if runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".to_owned()));
    }
    Ok(())
}

/// Human size for descriptions: `8 MiB`, `512 KiB`, `123 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

/// Parses `8MiB`, `16 MiB`, `512KiB`, `1GiB`, `4M`, `1048576`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 8MiB, 512KiB, 1048576)"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KiB, MiB or GiB)"
            ));
        }
    };
    let size = number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if size == 0 {
        return Err(format!("{text:?}: a size must be at least 1 byte"));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_format() {
        for (text, bytes) in [
            ("8MiB", 8 << 20),
            ("16 MiB", 16 << 20),
            ("512KiB", 512 << 10),
            ("1GiB", 1 << 30),
            ("4m", 4 << 20),
            ("1000", 1000),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for bad in ["", "MiB", "0", "8XB", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(format_size(8 << 20), "8 MiB");
        assert_eq!(format_size(1536), "1536 B");
        assert_eq!(format_size(2 << 10), "2 KiB");
    }

    #[test]
    fn rates_are_medians_of_each_run() {
        let sample = |seconds: f64| Sample {
            seconds,
            bytes_in: 10_000_000,
            files: 10,
            ..Sample::default()
        };
        let result = stage_result(
            "x",
            String::new(),
            vec![sample(1.0), sample(2.0), sample(4.0)],
            Vec::new(),
        );
        assert_eq!(result.mb_per_s_in, Some(5.0));
        assert_eq!(result.mb_per_s_out, None);
        assert_eq!(result.files_per_s, Some(5.0));
        assert_eq!(result.seconds.unwrap().median, 2.0);
        assert_eq!(
            result.notes,
            vec![
                "runs spread from 1.00 to 4.00 s (4.0x): the median of 3 runs is not a steady figure here"
                    .to_owned()
            ]
        );
    }

    /// One run of a decompress stage, as a round makes it: `seconds`, its slowest layer and the
    /// codec figures of that run (told apart by their layer count).
    fn decompress_round(seconds: f64, slowest: f64, layers: usize) -> StageResult {
        let mut result = stage_result(
            "decompress-1core",
            "described".to_owned(),
            vec![Sample {
                seconds,
                cpu_seconds: seconds * 0.9,
                bytes_in: 1_000_000,
                machine_cpu_seconds: Some(seconds),
                ..Sample::default()
            }],
            vec!["caches kept".to_owned()],
        );
        result.critical_path_seconds = Summary::of(&[slowest]);
        result.codecs = vec![crate::CodecThroughput {
            codec: "gzip".to_owned(),
            implementation: "isal".to_owned(),
            layers,
            bytes_in: 1,
            bytes_out: 2,
            mb_per_s_in: None,
            mb_per_s_out: None,
        }];
        result
    }

    #[test]
    fn rounds_join_into_the_stage_of_all_their_runs() {
        let merged = merge_rounds(vec![
            decompress_round(2.0, 1.5, 1),
            decompress_round(2.8, 3.0, 2),
            decompress_round(2.4, 2.0, 3),
        ])
        .unwrap();
        assert_eq!(merged.stage, "decompress-1core");
        assert_eq!(merged.description, "described");
        let seconds: Vec<f64> = merged.samples.iter().map(|s| s.seconds).collect();
        assert_eq!(seconds, [2.0, 2.8, 2.4], "samples in round order");
        assert_eq!(
            merged.seconds,
            Some(Summary {
                median: 2.4,
                min: 2.0,
                max: 2.8
            })
        );
        assert_eq!(merged.cpu_seconds.unwrap().median, 2.4 * 0.9);
        assert_eq!(merged.machine_cpu_seconds.unwrap().max, 2.8);
        assert_eq!(merged.mb_per_s_in, Some(1_000_000.0 / 1e6 / 2.4));
        assert_eq!(
            merged.critical_path_seconds,
            Some(Summary {
                median: 2.0,
                min: 1.5,
                max: 3.0
            })
        );
        assert_eq!(merged.codecs[0].layers, 3, "the codecs of the median run");
        assert_eq!(merged.notes, ["caches kept"], "each note once");

        // Far apart over the rounds: the spread note of all the runs.
        let spread = merge_rounds(vec![
            decompress_round(1.0, 1.0, 1),
            decompress_round(2.5, 1.0, 1),
        ])
        .unwrap();
        assert_eq!(spread.notes.len(), 2);
        assert!(spread.notes[1].starts_with("runs spread from 1.00 to 2.50 s (2.5x)"));

        // A stage without a critical path in some round has none.
        let mut without = decompress_round(1.0, 1.0, 1);
        without.critical_path_seconds = None;
        let merged = merge_rounds(vec![decompress_round(1.0, 1.0, 1), without]).unwrap();
        assert_eq!(merged.critical_path_seconds, None);

        assert!(merge_rounds(Vec::new()).is_none());
    }

    #[test]
    fn a_stage_skipped_in_any_round_has_no_figures() {
        let stopped = skipped_stage(
            "decompress-1core",
            "described".to_owned(),
            "`tar -xf layer.tar` failed".to_owned(),
        );
        let merged = merge_rounds(vec![decompress_round(2.0, 1.5, 1), stopped]).unwrap();
        assert!(merged.samples.is_empty());
        assert_eq!(merged.seconds, None);
        assert_eq!(merged.critical_path_seconds, None);
        assert!(merged.codecs.is_empty());
        assert_eq!(
            merged.notes,
            ["caches kept", "skipped: `tar -xf layer.tar` failed"]
        );
    }

    #[test]
    fn only_runs_far_apart_in_ratio_and_seconds_get_a_spread_note() {
        // Far apart: 0.63 to 4.55 s, as extract-tmpfs of the 1 GB layer in run M.
        assert!(spread_note(&[4.55, 0.63, 0.71]).is_some());
        // Steady: within 1.5x.
        assert_eq!(spread_note(&[3.69, 4.22, 4.39]), None);
        // 3x apart, but by 20 ms: scheduling noise of a tiny stage, not a figure to doubt.
        assert_eq!(spread_note(&[0.01, 0.03, 0.02]), None);
        // One run, a zero time, or none: nothing to compare.
        assert_eq!(spread_note(&[2.0]), None);
        assert_eq!(spread_note(&[0.0, 1.0]), None);
        assert_eq!(spread_note(&[]), None);
        // Kept beside the notes the stage already had.
        let result = stage_result(
            "x",
            String::new(),
            [1.0, 2.5]
                .map(|seconds| Sample {
                    seconds,
                    ..Sample::default()
                })
                .into(),
            vec!["caches kept".to_owned()],
        );
        assert_eq!(result.notes.len(), 2);
        assert_eq!(result.notes[0], "caches kept");
        assert!(result.notes[1].starts_with("runs spread from 1.00 to 2.50 s (2.5x)"));
    }
}
