//! The figures `rpull bench` reports. Serialised as the `--json` output, whose schema is
//! documented in docs/bench-json.md and checked by a test.

use serde::Serialize;

use crate::Summary;

/// One measured run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// CPU seconds (user + system) of the work measured, all threads and child processes.
    pub cpu_seconds: f64,
    /// Peak resident set size in bytes, where it could be measured.
    pub peak_rss_bytes: Option<u64>,
    /// Bytes that entered the stage (compressed bytes for network and decompress, tar bytes for
    /// extract).
    pub bytes_in: u64,
    /// Bytes the stage produced (tar bytes for decompress, file bytes written for extract).
    pub bytes_out: u64,
    /// Files (tar entries) written, for extraction.
    pub files: u64,
    /// Seconds of the `syncfs` after an extraction to disk, timed separately.
    pub sync_seconds: Option<f64>,
    /// CPU seconds the whole machine was busy during the run (all processes, the kernel's
    /// threads and interrupts; `/proc/stat`, 10 ms resolution). Beyond `cpu_seconds`, it holds
    /// the work of anything else running meanwhile: a registry serving from this machine, the
    /// kernel's write-back, other load. `None` where it could not be read.
    pub machine_cpu_seconds: Option<f64>,
    /// CPU seconds, summed over the machine's CPUs, that the hypervisor gave to something else
    /// while they had work (`/proc/stat`'s steal, 10 ms resolution). Not in `cpu_seconds` or
    /// `machine_cpu_seconds`; a run with much of it was slowed by the host, not by its own work.
    /// `None` where it could not be read.
    pub steal_seconds: Option<f64>,
    /// Seconds in which at least one task of the machine waited for memory: reclaim, compaction,
    /// refaults (`/proc/pressure/memory`, `some`). `None` without pressure stall information.
    pub memory_stall_seconds: Option<f64>,
}

/// One stage (or the end-to-end pull) measured over several runs.
#[derive(Debug, Clone, Serialize)]
pub struct StageResult {
    /// Stable identifier: `network`, `network-ranged`, `decompress-1core`, `decompress-all`,
    /// `extract-tmpfs`, `tar-tmpfs`, `extract-disk`, `tar-disk`, `end-to-end`.
    pub stage: String,
    /// What was measured, in words.
    pub description: String,
    /// Every run.
    pub samples: Vec<Sample>,
    /// Seconds over the runs.
    pub seconds: Option<Summary>,
    /// CPU seconds over the runs.
    pub cpu_seconds: Option<Summary>,
    /// The whole machine's busy CPU seconds over the runs (see [`Sample::machine_cpu_seconds`]).
    pub machine_cpu_seconds: Option<Summary>,
    /// Median MB/s (10^6 bytes) of `bytes_in`.
    pub mb_per_s_in: Option<f64>,
    /// Median MB/s of `bytes_out`.
    pub mb_per_s_out: Option<f64>,
    /// Median files per second.
    pub files_per_s: Option<f64>,
    /// For `decompress-1core`: the slowest single layer's decode seconds over the runs. One
    /// layer's stream cannot be split, so no pipeline finishes before it; it is the decompress
    /// term of the critical path in `pipeline_floor_seconds`. `None` for the other stages.
    pub critical_path_seconds: Option<Summary>,
    /// For the decompress stages: throughput per codec (empty for the other stages).
    pub codecs: Vec<CodecThroughput>,
    /// Notes (e.g. "page cache not dropped: not root").
    pub notes: Vec<String>,
}

/// Decompression throughput of the layers of one codec, from the per-layer decode times of the
/// median run (by wall time).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodecThroughput {
    /// `gzip`, `zstd` or `identity` (what the magic bytes showed).
    pub codec: String,
    /// The implementation that decoded it: `isal` or `zlib-rs` for gzip (see
    /// `rpull_decompress::GzipBackend`), `libzstd` for zstd, `copy` for identity.
    pub implementation: String,
    /// Layers with this codec.
    pub layers: usize,
    /// Compressed bytes of these layers.
    pub bytes_in: u64,
    /// Tar bytes of these layers.
    pub bytes_out: u64,
    /// Compressed MB/s: `bytes_in` / the sum of these layers' decode seconds.
    pub mb_per_s_in: Option<f64>,
    /// Tar MB/s: `bytes_out` / the sum of these layers' decode seconds.
    pub mb_per_s_out: Option<f64>,
}

/// A peer tool run on the same image.
#[derive(Debug, Clone, Serialize)]
pub struct PeerResult {
    /// `docker`, `podman`, `ctr`, `skopeo`, `crane`, `crane-export`.
    pub tool: String,
    /// What it does: "download only" or "download and extract", with detail.
    pub does: String,
    /// `tool --version` output, first line.
    pub version: Option<String>,
    /// Options it was run with.
    pub options: String,
    /// Runs, when it ran.
    pub samples: Vec<Sample>,
    /// Seconds over the runs.
    pub seconds: Option<Summary>,
    /// Why there is no number: not installed, failed (with its error).
    pub skipped: Option<String>,
    /// `runs spread from ...` when its runs are far apart, as in `StageResult::notes`.
    pub notes: Vec<String>,
}

/// One point of a sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    /// The swept value (concurrency, chunk size in bytes, clients).
    pub value: u64,
    /// How many times were measured: runs, or runs x clients for the clients sweep.
    pub count: usize,
    /// Seconds over the runs (for clients: over every client's time).
    pub seconds: Option<Summary>,
    /// Mean seconds (clients sweep).
    pub mean_seconds: Option<f64>,
    /// 90th percentile seconds (clients sweep).
    pub p90_seconds: Option<f64>,
    /// Aggregate MB/s at the median.
    pub mb_per_s: Option<f64>,
}

/// A sweep over one parameter.
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// `concurrency`, `chunk-size` or `clients`.
    pub parameter: String,
    /// What each point runs.
    pub description: String,
    /// The points, in the order given.
    pub points: Vec<SweepPoint>,
    /// Notes, each once (e.g. "page cache not dropped: not root").
    pub notes: Vec<String>,
}

/// Where the figures were measured.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// Logical CPUs.
    pub cpus: usize,
    /// CPU model name.
    pub cpu_model: Option<String>,
    /// Total memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Kernel release.
    pub kernel: Option<String>,
    /// Filesystem type of the destination (`ext4`, `tmpfs`, ...).
    pub destination_fs: Option<String>,
}

/// The terms `pipeline_floor_seconds` is computed from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FloorTerms {
    /// Median seconds of `network`.
    pub network_seconds: f64,
    /// Median seconds of the slowest layer in `decompress-1core`.
    pub decompress_critical_seconds: f64,
    /// Median seconds of the extract stage matching the destination.
    pub extract_seconds: f64,
    /// Which extract stage that is.
    pub extract_stage: String,
    /// Sum of the three stages' median CPU seconds.
    pub cpu_seconds: f64,
    /// Sum of the three stages' median machine CPU seconds (every process on the machine, a
    /// registry serving from it included); `None` when one is missing.
    pub machine_cpu_seconds: Option<f64>,
    /// Cores it is divided by.
    pub cpus: usize,
}

/// Everything `rpull bench REF` measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Schema version of this JSON, bumped on incompatible changes.
    pub schema_version: u32,
    /// Normalised reference.
    pub reference: String,
    /// Platform manifest digest.
    pub manifest_digest: String,
    /// Layers in the image.
    pub layers: usize,
    /// Sum of compressed layer sizes.
    pub compressed_bytes: u64,
    /// Sum of tar sizes.
    pub uncompressed_bytes: u64,
    /// Tar entries over all layers.
    pub entries: u64,
    /// Runs per stage.
    pub runs: usize,
    /// Destination directory the extraction and pulls wrote to.
    pub destination: String,
    /// The machine.
    pub machine: MachineInfo,
    /// Stage figures, then `end-to-end`.
    pub stages: Vec<StageResult>,
    /// The term that sets `pipeline_floor_seconds`: `network`, `decompress-1core` (its slowest
    /// layer), `extract-tmpfs` or `extract-disk` (whichever matches the end-to-end destination's
    /// filesystem), or `cpu` when the total CPU work divided by the cores is larger.
    pub bounding_stage: Option<String>,
    /// The fastest a pipelined pull could be on this machine, as BASELINE.md defines it:
    /// `max(critical path, total CPU work / cpus)`, where the critical path is the largest of the
    /// `network` median, the `decompress-1core` slowest-layer median (`critical_path_seconds`)
    /// and the matching extract stage's median, and the total CPU work is the sum of those three
    /// stages' median CPU seconds. `None` when one of them is missing.
    pub pipeline_floor_seconds: Option<f64>,
    /// The same floor with the whole machine's CPU work in its CPU term: `max(critical path,
    /// machine CPU work / cpus)`, the machine CPU work being the sum of the three stages' median
    /// `machine_cpu_seconds`. It is larger than `pipeline_floor_seconds` when something else on
    /// the machine works during the stages, chiefly a registry serving from this machine during
    /// `network`: the pull shares the cores with it. Reported beside the floor, which stays as
    /// BASELINE.md defines it. `None` when the floor is, or a machine reading is missing.
    pub machine_floor_seconds: Option<f64>,
    /// The terms of the floor, in seconds.
    pub floor: Option<FloorTerms>,
    /// Peers, in the order asked.
    pub peers: Vec<PeerResult>,
    /// Sweeps asked for.
    pub sweeps: Vec<SweepResult>,
    /// Whether caches were dropped between runs, and how.
    pub cache_note: String,
}
