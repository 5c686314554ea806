//! `rpull bench REF`: where each stage reads and writes, the stages in order, the sweeps, and
//! the floor.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rpull::registry::Client;
use rpull::{ExtractOptions, Platform, Reference};
use tempfile::TempDir;
use tracing::info;

use crate::error::BenchError;
use crate::peers::{Peer, PeerContext, merge_peer_rounds, run_peer};
use crate::resources::{cpus, filesystem_type, machine_info};
use crate::stages::{
    self, BenchImage, CachePolicy, DecompressMode, ExtractTarget, FetchMode, ImageSize,
    LocalLayers, PullCommand, TarReference, skipped_stage,
};
use crate::{BenchReport, FloorTerms, PeerResult, StageResult, SweepResult, sweep};

/// The version of the `--json` schema (docs/bench-json.md).
pub const SCHEMA_VERSION: u32 = 1;

/// Default span of the ranged network stage.
pub const DEFAULT_CHUNK_SIZE: u64 = 8 << 20;

/// The tmpfs every run can count on (BASELINE.md: inputs on tmpfs, because this kind of VM evicts
/// file pages within seconds).
pub const TMPFS_DIR: &str = "/dev/shm";

/// A disk directory for extraction when the destination is not on a disk.
pub const DISK_DIR: &str = "/var/tmp";

/// Where the end-to-end pulls (and the peers) write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// This directory (replaced by each pull, left in place at the end).
    Dir(PathBuf),
    /// A temporary directory on tmpfs (`/dev/shm`).
    Tmpfs,
    /// A temporary directory on disk (`/var/tmp`).
    Disk,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The image.
    pub reference: Reference,
    /// The platform to pick from an index.
    pub platform: Platform,
    /// Runs per stage and per sweep point.
    pub runs: usize,
    /// Where the pulls write.
    pub destination: Destination,
    /// Span of the `network-ranged` stage.
    pub chunk_size: u64,
    /// Whether runs start cold.
    pub cache: CachePolicy,
    /// How to run `rpull pull` for `end-to-end` and the concurrency sweep; `None` skips them
    /// (with a note).
    pub pull: Option<PullCommand>,
    /// How the extract stages write (the pipeline's default: chown when root).
    pub extract: ExtractOptions,
    /// `--concurrency` values.
    pub concurrency: Vec<usize>,
    /// `--chunk-size` sweep values.
    pub chunk_sizes: Vec<u64>,
    /// `--clients` values.
    pub clients: Vec<usize>,
    /// GNU tar, run beside each extract stage as its reference (`tar-tmpfs`, `tar-disk`);
    /// `None` reports those stages skipped. Default: `tar` from PATH.
    pub tar: Option<PathBuf>,
    /// Peer tools (`--compare`), each run once per round after the pull, cold like it, with
    /// their data on the destination's filesystem. Their PATH is this process's, plus
    /// `$HOME/go/bin`. Default: none.
    pub peers: Vec<Peer>,
}

impl BenchOptions {
    /// Defaults for `reference`: 3 runs to a disk directory, 8 MiB chunks, cold when root, no
    /// end-to-end command, no sweeps.
    pub fn new(reference: Reference) -> BenchOptions {
        BenchOptions {
            reference,
            platform: Platform::host(),
            runs: 3,
            destination: Destination::Disk,
            chunk_size: DEFAULT_CHUNK_SIZE,
            cache: CachePolicy::for_current_user(false),
            pull: None,
            extract: ExtractOptions::for_current_user(),
            concurrency: Vec::new(),
            chunk_sizes: Vec::new(),
            clients: Vec::new(),
            tar: std::env::var_os("PATH")
                .and_then(|path| crate::peers::find_executable("tar", &path)),
            peers: Vec::new(),
        }
    }
}

/// A prepared benchmark: the image resolved and the directories chosen. Temporary directories
/// are removed when it is dropped.
#[derive(Debug)]
pub struct Bench {
    image: BenchImage,
    options: BenchOptions,
    /// The end-to-end destination.
    pull_dir: PathBuf,
    /// Blobs and tars (tmpfs when there is one).
    inputs: TempDir,
    /// Fresh extraction targets on tmpfs, if there is one.
    tmpfs_extract: Option<TempDir>,
    /// Fresh extraction targets on disk.
    disk_extract: TempDir,
    /// Scratch space for peers, on the destination's filesystem.
    peer_dir: TempDir,
    _pull_parent: Option<TempDir>,
}

/// How long the children of an abandoned bench get to end on SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl Drop for Bench {
    /// Before the directories are removed: when the bench is dropped in the middle of
    /// [`run`](Bench::run) (its future dropped on Ctrl-C or SIGTERM), its child processes (a
    /// pull, GNU tar, a peer) are stopped and its stage threads waited for, so that nothing
    /// writes into them afterwards or is left behind. This stops the benchmark children of every
    /// bench in the process. Blocks; with nothing under way it returns at once.
    fn drop(&mut self) {
        crate::resources::stop_work(STOP_GRACE);
    }
}

fn temp_dir_in(parent: &Path, prefix: &str) -> Result<TempDir, BenchError> {
    fs_err::create_dir_all(parent).map_err(|e| BenchError::io("creating", parent, e))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(parent)
        .map_err(|e| BenchError::io("creating a directory in", parent, e))
}

fn is_tmpfs(path: &Path) -> bool {
    filesystem_type(path).as_deref() == Some("tmpfs")
}

impl Bench {
    /// Resolves the image and lays out the directories:
    ///
    /// * inputs (blobs, tars): a temporary directory in `/dev/shm` when it is tmpfs, else next to
    ///   the destination;
    /// * `extract-tmpfs`: a temporary directory in `/dev/shm`;
    /// * `extract-disk`: a temporary directory next to the destination when that is not tmpfs,
    ///   else in `/var/tmp`;
    /// * end-to-end: `--dest`, or `rootfs` in a temporary directory of `/dev/shm` (`--tmpfs`) or
    ///   `/var/tmp`.
    pub async fn prepare(client: &Client, options: BenchOptions) -> Result<Bench, BenchError> {
        if options.runs == 0 {
            return Err(BenchError::Invalid("--runs must be at least 1".to_owned()));
        }
        let image = BenchImage::resolve(client, &options.reference, &options.platform).await?;
        let tmpfs = Path::new(TMPFS_DIR);
        let have_tmpfs = is_tmpfs(tmpfs);
        let (pull_dir, pull_parent) = match &options.destination {
            Destination::Dir(dir) => {
                let dir =
                    std::path::absolute(dir).map_err(|e| BenchError::io("resolving", dir, e))?;
                let parent = dir.parent().ok_or_else(|| {
                    BenchError::Invalid(format!("--dest {} has no parent", dir.display()))
                })?;
                fs_err::create_dir_all(parent)
                    .map_err(|e| BenchError::io("creating", parent, e))?;
                (dir, None)
            }
            Destination::Tmpfs => {
                if !have_tmpfs {
                    return Err(BenchError::Invalid(format!(
                        "--tmpfs: {TMPFS_DIR} is not a tmpfs mount"
                    )));
                }
                let parent = temp_dir_in(tmpfs, "rpull-bench-pull-")?;
                (parent.path().join("rootfs"), Some(parent))
            }
            Destination::Disk => {
                let parent = temp_dir_in(Path::new(DISK_DIR), "rpull-bench-pull-")?;
                (parent.path().join("rootfs"), Some(parent))
            }
        };
        let dest_parent = pull_dir
            .parent()
            .expect("absolute path with a parent")
            .to_owned();
        let inputs = temp_dir_in(
            if have_tmpfs { tmpfs } else { &dest_parent },
            "rpull-bench-inputs-",
        )?;
        let tmpfs_extract = if have_tmpfs {
            Some(temp_dir_in(tmpfs, "rpull-bench-extract-")?)
        } else {
            None
        };
        let disk_base = if is_tmpfs(&dest_parent) {
            PathBuf::from(DISK_DIR)
        } else {
            dest_parent.clone()
        };
        let disk_extract = temp_dir_in(&disk_base, ".rpull-bench-extract-")?;
        // Same filesystem as the destination, on a short path: podman refuses a runroot longer
        // than 50 characters, and the peers put theirs below this directory.
        let peer_base = match &options.destination {
            Destination::Dir(_) => dest_parent.clone(),
            Destination::Tmpfs => tmpfs.to_owned(),
            Destination::Disk => PathBuf::from(DISK_DIR),
        };
        let peer_dir = temp_dir_in(&peer_base, "rpb-peers-")?;
        Ok(Bench {
            image,
            options,
            pull_dir,
            inputs,
            tmpfs_extract,
            disk_extract,
            peer_dir,
            _pull_parent: pull_parent,
        })
    }

    /// The resolved image.
    pub fn image(&self) -> &BenchImage {
        &self.image
    }

    /// Where the end-to-end pulls write.
    pub fn pull_dir(&self) -> &Path {
        &self.pull_dir
    }

    /// A scratch directory on the destination's filesystem, for peers: next to `--dest`, or
    /// directly in `/dev/shm` or `/var/tmp`.
    pub fn peer_work_dir(&self) -> &Path {
        self.peer_dir.path()
    }

    /// The options.
    pub fn options(&self) -> &BenchOptions {
        &self.options
    }

    /// Runs every stage, the pull and the peers in rounds (each once per round, in the order of
    /// the report), then the sweeps, and computes the floor.
    pub async fn run(&self) -> Result<BenchReport, BenchError> {
        let options = &self.options;
        let (runs, cache) = (options.runs, &options.cache);
        let image = &self.image;
        info!(dir = %self.inputs.path().display(), "downloading and decoding the layers once (not timed)");
        let local = stages::prepare_local(image, self.inputs.path()).await?;
        let size = ImageSize {
            compressed_bytes: local.compressed_bytes(),
            tar_bytes: local.tar_bytes(),
            entries: local.entries(),
        };
        let reference = options.reference.to_string();
        // What each run allocates at most, for priming free memory (resources::drop_caches).
        crate::resources::set_run_memory(size.tar_bytes);

        // Round by round, every stage once and then the pull, so that stages and pull meet the
        // same machine: on these VMs its speed drifts over minutes, which one stage's runs after
        // another's would turn into a bias of the floor against the pull.
        // The runs of each stage so far, in the report's order of stages.
        let mut by_stage: Vec<Vec<StageResult>> = Vec::new();
        // The peers' runs so far, in the order of `options.peers`.
        let mut by_peer: Vec<Vec<PeerResult>> = vec![Vec::new(); options.peers.len()];
        for round in 0..runs {
            info!(round = round + 1, of = runs, "round");
            let results = self.round(&local, size, &reference, round).await?;
            by_stage.resize_with(results.len(), Vec::new);
            for (stage_runs, result) in by_stage.iter_mut().zip(results) {
                stage_runs.push(result);
            }
            self.peer_round(&reference, &mut by_peer).await?;
        }
        let results: Vec<StageResult> = by_stage
            .into_iter()
            .filter_map(stages::merge_rounds)
            .collect();
        let peers: Vec<PeerResult> = by_peer.into_iter().filter_map(merge_peer_rounds).collect();

        let sweeps = self.sweeps(size).await?;
        let destination_fs = filesystem_type(self.pull_dir.parent().unwrap_or(&self.pull_dir));
        let extract_stage = if destination_fs.as_deref() == Some("tmpfs") {
            "extract-tmpfs"
        } else {
            "extract-disk"
        };
        let machine_cpus = cpus();
        let floor = floor_terms(&results, extract_stage, machine_cpus);
        let (pipeline_floor_seconds, bounding_stage) = match &floor {
            Some(terms) => {
                let (seconds, bound) = terms.floor();
                (Some(seconds), Some(bound))
            }
            None => (None, None),
        };
        let machine_floor_seconds = floor.as_ref().and_then(FloorTerms::machine_floor);
        Ok(BenchReport {
            schema_version: SCHEMA_VERSION,
            reference: image.reference.to_string(),
            manifest_digest: image.resolved.manifest_digest.to_string(),
            layers: image.resolved.layers.len(),
            compressed_bytes: size.compressed_bytes,
            uncompressed_bytes: size.tar_bytes,
            entries: size.entries,
            runs,
            destination: self.pull_dir.display().to_string(),
            machine: machine_info(self.pull_dir.parent().unwrap_or(&self.pull_dir)),
            stages: results,
            bounding_stage,
            pipeline_floor_seconds,
            machine_floor_seconds,
            floor,
            peers,
            sweeps,
            cache_note: cache.note(),
        })
    }

    /// One run of every stage, in the order of the report, then one pull (`round` numbers the
    /// extract stages' run directories).
    async fn round(
        &self,
        local: &LocalLayers,
        size: ImageSize,
        reference: &str,
        round: usize,
    ) -> Result<Vec<StageResult>, BenchError> {
        let options = &self.options;
        let cache = &options.cache;
        let image = &self.image;
        let mut results = Vec::new();
        info!("stage network");
        results.push(stages::network(image, FetchMode::Stream, 1, cache).await?);
        info!("stage network-ranged");
        results
            .push(stages::network(image, FetchMode::Ranged(options.chunk_size), 1, cache).await?);
        for mode in [DecompressMode::OneCore, DecompressMode::AllCores] {
            info!(stage = mode.stage(), "stage");
            let (local, cache) = (local.clone(), cache.clone());
            results.push(blocking(move || stages::decompress(&local, mode, 1, &cache)).await?);
        }

        let tmpfs_target = self.tmpfs_extract.as_ref().map(|dir| ExtractTarget {
            stage: "extract-tmpfs".to_owned(),
            base: dir.path().to_owned(),
        });
        match tmpfs_target {
            Some(target) => {
                results.extend(
                    self.extract_stage(local, target, "tar-tmpfs", round)
                        .await?,
                );
            }
            None => {
                for stage in ["extract-tmpfs", "tar-tmpfs"] {
                    results.push(skipped_stage(
                        stage,
                        String::new(),
                        format!("{TMPFS_DIR} is not a tmpfs mount"),
                    ));
                }
            }
        }
        let disk_target = ExtractTarget {
            stage: "extract-disk".to_owned(),
            base: self.disk_extract.path().to_owned(),
        };
        results.extend(
            self.extract_stage(local, disk_target, "tar-disk", round)
                .await?,
        );

        match &options.pull {
            Some(pull) => {
                info!("stage end-to-end");
                let (pull, dir, cache) = (pull.clone(), self.pull_dir.clone(), cache.clone());
                let reference = reference.to_owned();
                results.push(
                    blocking(move || stages::end_to_end(&pull, &reference, &dir, size, 1, &cache))
                        .await?,
                );
            }
            None => results.push(skipped_stage(
                "end-to-end",
                String::new(),
                "no rpull binary to run".to_owned(),
            )),
        }
        Ok(results)
    }

    /// One run of each peer, in the order given, after the round's pull: the ratios of the pull
    /// to the peers are then of runs minutes apart at most, as the stages' are. A peer without a
    /// number in an earlier round (not installed, failed) is not run again.
    async fn peer_round(
        &self,
        reference: &str,
        by_peer: &mut [Vec<PeerResult>],
    ) -> Result<(), BenchError> {
        for (&peer, rounds) in self.options.peers.iter().zip(by_peer.iter_mut()) {
            if rounds.iter().any(|result| result.skipped.is_some()) {
                continue;
            }
            info!("peer {}", peer.name());
            let mut context = PeerContext::new(reference, self.peer_dir.path());
            context.runs = 1;
            context.cold = self.options.cache.is_cold();
            rounds.push(blocking(move || Ok(run_peer(peer, &context))).await?);
        }
        Ok(())
    }

    /// Run `round` of an extract stage and of its GNU tar reference (`tar_stage`), one after the
    /// other.
    async fn extract_stage(
        &self,
        local: &LocalLayers,
        target: ExtractTarget,
        tar_stage: &str,
        round: usize,
    ) -> Result<[StageResult; 2], BenchError> {
        info!(stage = %target.stage, reference = tar_stage, dir = %target.base.display(), "stage");
        let reference = TarReference {
            stage: tar_stage.to_owned(),
            program: self
                .options
                .tar
                .clone()
                .ok_or_else(|| "no `tar` in PATH".to_owned()),
        };
        let (local, cache, extract) = (
            local.clone(),
            self.options.cache.clone(),
            self.options.extract.clone(),
        );
        let (stage, tar) = blocking(move || {
            stages::extract_runs(
                &local,
                &target,
                &extract,
                round..round + 1,
                &cache,
                Some(&reference),
            )
        })
        .await?;
        Ok([stage, tar.expect("a reference was given")])
    }

    async fn sweeps(&self, size: ImageSize) -> Result<Vec<SweepResult>, BenchError> {
        let options = &self.options;
        let mut sweeps = Vec::new();
        if !options.concurrency.is_empty() {
            match &options.pull {
                Some(pull) => {
                    info!(values = ?options.concurrency, "sweep concurrency");
                    let (pull, dir, cache, values) = (
                        pull.clone(),
                        self.pull_dir.clone(),
                        options.cache.clone(),
                        options.concurrency.clone(),
                    );
                    let (reference, runs) = (options.reference.to_string(), options.runs);
                    sweeps.push(
                        blocking(move || {
                            sweep::concurrency_sweep(
                                &pull,
                                &reference,
                                &dir,
                                size.compressed_bytes,
                                &values,
                                runs,
                                &cache,
                            )
                        })
                        .await?,
                    );
                }
                None => {
                    return Err(BenchError::Invalid(
                        "--concurrency needs an rpull binary to run".to_owned(),
                    ));
                }
            }
        }
        if !options.chunk_sizes.is_empty() {
            info!(values = ?options.chunk_sizes, "sweep chunk-size");
            sweeps.push(
                sweep::chunk_size_sweep(
                    &self.image,
                    &options.chunk_sizes,
                    options.runs,
                    &options.cache,
                )
                .await?,
            );
        }
        if !options.clients.is_empty() {
            info!(values = ?options.clients, "sweep clients");
            sweeps.push(
                sweep::clients_sweep(&self.image, &options.clients, options.runs, &options.cache)
                    .await?,
            );
        }
        Ok(sweeps)
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BenchError> + Send + 'static,
) -> Result<T, BenchError> {
    crate::resources::blocking_stage(work)
        .await
        .map_err(|_| BenchError::Panic("stage"))?
}

impl FloorTerms {
    /// `(floor seconds, bounding term)`. The floor, as in BASELINE.md, is
    /// `max(critical path, total CPU work / cpus)`:
    ///
    /// * critical path = the largest of the `network` median, the `decompress-1core`
    ///   slowest-layer median and the extract stage's median. Each of these is a stream a
    ///   pipeline cannot shorten: the downloads already run all at once, one layer's codec stream
    ///   cannot be split, and the extract stage already runs its layers in parallel;
    /// * total CPU work = the sum of the three stages' median CPU seconds (`decompress-1core`,
    ///   not `decompress-all`, so that decoding is counted once and without contention).
    ///
    /// The bounding term is the stage with the largest critical-path time, or `cpu` when the
    /// CPU term is larger.
    pub fn floor(&self) -> (f64, String) {
        let (critical, stage) = self.critical_path();
        let cpu = self.cpu_seconds / self.cpus.max(1) as f64;
        if cpu > critical {
            (cpu, "cpu".to_owned())
        } else {
            (critical, stage.to_owned())
        }
    }

    /// The critical path of [`floor`](Self::floor) against the machine's CPU work (every
    /// process, a local registry included) per core; `None` without machine readings.
    pub fn machine_floor(&self) -> Option<f64> {
        let (critical, _) = self.critical_path();
        Some(critical.max(self.machine_cpu_seconds? / self.cpus.max(1) as f64))
    }

    /// The longest of the three streams, and its stage.
    fn critical_path(&self) -> (f64, &str) {
        let terms = [
            (self.network_seconds, "network"),
            (self.decompress_critical_seconds, "decompress-1core"),
            (self.extract_seconds, self.extract_stage.as_str()),
        ];
        terms.into_iter().fold(
            (f64::MIN, ""),
            |best, term| if term.0 > best.0 { term } else { best },
        )
    }
}

/// The terms of the floor from the stages' medians; `None` when a stage is missing.
pub fn floor_terms(stages: &[StageResult], extract_stage: &str, cpus: usize) -> Option<FloorTerms> {
    let find = |name: &str| stages.iter().find(|s| s.stage == name);
    let network = find("network")?;
    let decompress = find("decompress-1core")?;
    let extract = find(extract_stage)?;
    Some(FloorTerms {
        network_seconds: network.seconds?.median,
        decompress_critical_seconds: decompress.critical_path_seconds?.median,
        extract_seconds: extract.seconds?.median,
        extract_stage: extract_stage.to_owned(),
        cpu_seconds: network.cpu_seconds?.median
            + decompress.cpu_seconds?.median
            + extract.cpu_seconds?.median,
        machine_cpu_seconds: [network, decompress, extract]
            .iter()
            .map(|stage| stage.machine_cpu_seconds.map(|s| s.median))
            .sum(),
        cpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Summary;

    fn stage(name: &str, seconds: f64, cpu: f64, critical: Option<f64>) -> StageResult {
        let mut result = crate::stages::stage_result(name, String::new(), Vec::new(), Vec::new());
        result.seconds = Summary::of(&[seconds]);
        result.cpu_seconds = Summary::of(&[cpu]);
        result.critical_path_seconds = critical.and_then(|c| Summary::of(&[c]));
        result
    }

    #[test]
    fn floor_is_the_critical_path_or_the_cpu_work_per_core() {
        let stages = vec![
            stage("network", 0.2, 0.4, None),
            stage("decompress-1core", 5.0, 4.9, Some(3.6)),
            stage("extract-tmpfs", 2.1, 2.0, None),
            stage("extract-disk", 6.0, 2.5, None),
        ];
        let terms = floor_terms(&stages, "extract-tmpfs", 2).unwrap();
        assert_eq!(terms.cpu_seconds, 0.4 + 4.9 + 2.0);
        // CPU work 7.3 s / 2 cores = 3.65 s > the slowest layer's 3.6 s.
        let (floor, bound) = terms.floor();
        assert!((floor - 3.65).abs() < 1e-9);
        assert_eq!(bound, "cpu");
        let (floor, bound) = floor_terms(&stages, "extract-disk", 2).unwrap().floor();
        assert_eq!((floor, bound.as_str()), (6.0, "extract-disk"));
        let (floor, bound) = floor_terms(&stages, "extract-tmpfs", 4).unwrap().floor();
        assert_eq!((floor, bound.as_str()), (3.6, "decompress-1core"));
        assert!(floor_terms(&stages[..2], "extract-tmpfs", 2).is_none());
        // No machine readings: no machine floor.
        assert_eq!(terms.machine_cpu_seconds, None);
        assert_eq!(terms.machine_floor(), None);
    }

    #[test]
    fn machine_floor_counts_the_cpu_of_everything_on_the_machine() {
        let with_machine = |name: &str, seconds: f64, cpu: f64, machine: f64, critical| {
            let mut result = stage(name, seconds, cpu, critical);
            result.machine_cpu_seconds = Summary::of(&[machine]);
            result
        };
        // A network stage whose registry, on the same machine, used 0.35 CPU-s of its own.
        let stages = vec![
            with_machine("network", 0.74, 0.86, 1.21, None),
            with_machine("decompress-1core", 0.13, 0.13, 0.13, Some(0.13)),
            with_machine("extract-tmpfs", 0.41, 0.41, 0.42, None),
        ];
        let terms = floor_terms(&stages, "extract-tmpfs", 2).unwrap();
        // The floor: the network stage (0.74 s) beats 1.40 CPU-s / 2.
        assert_eq!(terms.floor(), (0.74, "network".to_owned()));
        // With the registry's work: 1.76 CPU-s / 2 = 0.88 s.
        assert!((terms.machine_cpu_seconds.unwrap() - 1.76).abs() < 1e-9);
        assert!((terms.machine_floor().unwrap() - 0.88).abs() < 1e-9);
        // Four cores: the critical path again.
        let four = floor_terms(&stages, "extract-tmpfs", 4).unwrap();
        assert_eq!(four.machine_floor(), Some(0.74));
        // One stage without a reading: none.
        let mut partial = stages.clone();
        partial[1].machine_cpu_seconds = None;
        let terms = floor_terms(&partial, "extract-tmpfs", 2).unwrap();
        assert_eq!(terms.machine_floor(), None);
        assert_eq!(terms.floor(), (0.74, "network".to_owned()));
    }
}
