//! `extract-tmpfs` and `extract-disk`: the decoded layer tars applied the way the pipeline does it;
//! beside each, `tar-tmpfs` and `tar-disk`: GNU tar extracting the same tars into the same
//! filesystem, run by run, as the reference for the many-small-files target.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rpull_extract::{
    CreateGate, ExtractOptions, LayerSummary, extract_layer_from, finalize_tree, merge_layer,
};

use super::{CachePolicy, LocalLayer, LocalLayers, Meter, check_runs, stage_result};
use crate::error::BenchError;
use crate::resources::{MachineMeter, filesystem_type, run_measured, syncfs};
use crate::{Sample, StageResult};

/// Where an extraction stage writes.
#[derive(Debug, Clone)]
pub struct ExtractTarget {
    /// `extract-tmpfs` or `extract-disk`.
    pub stage: String,
    /// An existing directory; each run extracts into a fresh `run-N` directory inside it and
    /// removes it afterwards.
    pub base: PathBuf,
}

/// The reference stage beside an extract stage: `tar` (GNU tar) extracting the same layer tars,
/// one after another into one directory (as BASELINE.md measured it), into a fresh `tar-N`
/// directory of the same base, right after each run of the extract stage.
#[derive(Debug, Clone)]
pub struct TarReference {
    /// `tar-tmpfs` or `tar-disk`.
    pub stage: String,
    /// The `tar` program, or why there is none (the stage is then reported skipped, with it).
    pub program: Result<PathBuf, String>,
}

/// `/dev/shm (tmpfs)`: a directory and its filesystem type, for descriptions.
pub(crate) fn describe_location(path: &Path) -> String {
    match filesystem_type(path) {
        Some(fs) => format!("{} ({fs})", path.display()),
        None => path.display().to_string(),
    }
}

/// Measures applying every layer tar into a fresh directory in `target.base`, `runs` times:
/// layer 0 into the root, the others into their own staging directories in parallel (at most
/// `rpull::DEFAULT_MAX_CONCURRENT_DOWNLOADS` at once, as the pipeline), merged in layer order as
/// soon as each is done, then directory metadata finalized. `syncfs` afterwards is timed apart
/// (`sync_seconds`); the tree is deleted after each run, outside the timing.
pub fn extract(
    layers: &LocalLayers,
    target: &ExtractTarget,
    options: &ExtractOptions,
    runs: usize,
    cache: &CachePolicy,
) -> Result<StageResult, BenchError> {
    extract_beside_tar(layers, target, options, runs, cache, None).map(|(stage, _)| stage)
}

/// [`extract`], and with `reference` GNU tar's run of the same tars after each of its runs, so
/// both see the same filesystem state (each run of either starts right after the previous run's
/// tree was deleted, but the extract stage's first). A failing `tar` ends its stage with the
/// reason in a note; it does not fail the bench.
pub fn extract_beside_tar(
    layers: &LocalLayers,
    target: &ExtractTarget,
    options: &ExtractOptions,
    runs: usize,
    cache: &CachePolicy,
    reference: Option<&TarReference>,
) -> Result<(StageResult, Option<StageResult>), BenchError> {
    check_runs(runs)?;
    extract_runs(layers, target, options, 0..runs, cache, reference)
}

/// [`extract_beside_tar`] for the runs numbered `runs` (`rpull bench` makes one per round:
/// run N is its round N, and the runs before it were made in earlier rounds).
pub(crate) fn extract_runs(
    layers: &LocalLayers,
    target: &ExtractTarget,
    options: &ExtractOptions,
    runs: std::ops::Range<usize>,
    cache: &CachePolicy,
    reference: Option<&TarReference>,
) -> Result<(StageResult, Option<StageResult>), BenchError> {
    // What a pull would choose there (tmpfs, ramfs and ext4 with a journal: write threads and no
    // gate; elsewhere one thread and the gate), named in the description.
    let creation = if CreateGate::shared_for(options.create_gate.as_ref(), &target.base).is_some() {
        if options.creates_on_extracting_thread(&target.base) {
            "their inodes made one at a time, on the extracting thread"
        } else {
            "their inodes made one at a time"
        }
    } else {
        "their inodes made at once"
    };
    // The extracting thread counts among the write threads (`ExtractOptions::write_threads`).
    let threads = options.write_threads_for(&target.base);
    let writers = if options.creates_on_extracting_thread(&target.base) {
        "1 write thread per layer".to_owned()
    } else if threads <= 1 {
        "small files written on the extracting thread".to_owned()
    } else {
        format!(
            "{} write thread{} per layer sharing the small files with the extracting thread",
            threads - 1,
            if threads == 2 { "" } else { "s" }
        )
    };
    // As a pull with the default `--fsync auto`, which syncs on a disk: files of 8 MiB and more
    // written past the page cache where that is done (ext4).
    let options = &ExtractOptions {
        direct_writes: options.direct_writes
            || rpull::FsyncPolicy::Auto.resolve(&target.base) != rpull::FsyncPolicy::None,
        ..options.clone()
    };
    let direct = if options.direct_writes_into(&target.base) {
        ", files of 8 MiB and more written with O_DIRECT"
    } else {
        ""
    };
    let description = format!(
        "{} layer tars ({} bytes, {} entries) read from {} and applied into {}: layer 0 into the root, the others staged in \
         parallel ({creation}, {writers}{direct}, as a pull does there) and merged in order, then \
         finalized (chown {}); syncfs timed apart",
        layers.layers.len(),
        layers.tar_bytes(),
        layers.entries(),
        describe_location(&layers.dir),
        describe_location(&target.base),
        if options.chown { "on" } else { "off" },
    );
    let mut notes = Vec::new();
    let fs = filesystem_type(&target.base);
    // Also in a run alone after the first: the note is the same in each, and a report that
    // joins the runs shows it once.
    if runs.end > 1 && fs.as_deref() != Some("tmpfs") {
        notes.push(
            "runs after the first start after the previous run's tree was deleted; on ext4 BASELINE.md finds \
             extractions right after a delete much slower than into a fresh filesystem state (compare min and median)"
                .to_owned(),
        );
    }
    let mut samples = Vec::with_capacity(runs.len());
    let mut tar = reference.map(|reference| TarRuns::new(reference, layers, target));
    for run in runs {
        let dir = target.base.join(format!("run-{run}"));
        let (root, staging) = new_tree_dirs(&dir, run)?;
        for path in [&root, &staging] {
            fs_err::create_dir_all(path).map_err(|e| BenchError::io("creating", path, e))?;
        }
        cache.before_run(&mut notes);
        let meter = Meter::start();
        let summaries = apply_layers(&layers.layers, &root, &staging, options)?;
        let mut sample = meter.stop();
        sample.sync_seconds = Some(
            syncfs(&root)
                .map_err(|e| BenchError::io("syncfs of", &root, e))?
                .as_secs_f64(),
        );
        sample.bytes_in = layers.tar_bytes();
        sample.bytes_out = summaries.iter().map(|s| s.bytes_written).sum();
        sample.files = summaries.iter().map(|s| s.entries).sum();
        samples.push(sample);
        remove_tree(&dir)?;
        if let Some(tar) = &mut tar {
            tar.run(layers, &target.base.join(format!("tar-{run}")), cache)?;
        }
    }
    Ok((
        stage_result(&target.stage, description, samples, notes),
        tar.map(TarRuns::finish),
    ))
}

/// The runs of a [`TarReference`] so far.
struct TarRuns {
    stage: String,
    description: String,
    /// `None` when there is none; `stopped` then says why.
    program: Option<PathBuf>,
    samples: Vec<Sample>,
    notes: Vec<String>,
    /// Why the stage stopped (or never started), once it did.
    stopped: Option<String>,
}

impl TarRuns {
    fn new(reference: &TarReference, layers: &LocalLayers, target: &ExtractTarget) -> TarRuns {
        let version = reference.program.as_ref().ok().and_then(|program| {
            let output = Command::new(program).arg("--version").output().ok()?;
            let text = String::from_utf8_lossy(&output.stdout);
            text.lines().next().map(|line| line.trim().to_owned())
        });
        let description = format!(
            "reference: {} `tar -xf` of the same {} layer tars ({} bytes, {} entries), one after another into one \
             directory of {}, each run right after the matching run of {}; the rpull-specific work (whiteouts, \
             staging, merge) is not done; syncfs timed apart",
            version.as_deref().unwrap_or("tar"),
            layers.layers.len(),
            layers.tar_bytes(),
            layers.entries(),
            describe_location(&target.base),
            target.stage,
        );
        TarRuns {
            stage: reference.stage.clone(),
            description,
            stopped: reference.program.as_ref().err().cloned(),
            program: reference.program.clone().ok(),
            samples: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// One run into `dir` (created, then removed after the run, outside the timing).
    fn run(
        &mut self,
        layers: &LocalLayers,
        dir: &Path,
        cache: &CachePolicy,
    ) -> Result<(), BenchError> {
        let (Some(program), None) = (&self.program, &self.stopped) else {
            return Ok(());
        };
        let root = dir.join("rootfs");
        fs_err::create_dir_all(&root).map_err(|e| BenchError::io("creating", &root, e))?;
        cache.before_run(&mut self.notes);
        let started = Instant::now();
        let machine = MachineMeter::start();
        let mut sample = Sample::default();
        for layer in &layers.layers {
            let mut command = Command::new(program);
            command.arg("-xf").arg(&layer.tar).arg("-C").arg(&root);
            match run_measured(&mut command) {
                Ok(run) if run.status.success() => {
                    sample.cpu_seconds += run.sample.cpu_seconds;
                    sample.peak_rss_bytes = sample.peak_rss_bytes.max(run.sample.peak_rss_bytes);
                }
                Ok(run) => {
                    self.stopped = Some(format!(
                        "`{} -xf {}` failed ({}): {}",
                        program.display(),
                        layer.tar.display(),
                        run.status,
                        run.stderr_tail.trim()
                    ));
                    break;
                }
                Err(error) => {
                    self.stopped = Some(format!("running {}: {error}", program.display()));
                    break;
                }
            }
        }
        sample.seconds = started.elapsed().as_secs_f64();
        machine.finish(&mut sample);
        if self.stopped.is_none() {
            sample.sync_seconds = Some(
                syncfs(&root)
                    .map_err(|e| BenchError::io("syncfs of", &root, e))?
                    .as_secs_f64(),
            );
            sample.bytes_in = layers.tar_bytes();
            sample.files = layers.entries();
            self.samples.push(sample);
        }
        remove_tree(dir)
    }

    fn finish(self) -> StageResult {
        match self.stopped {
            // A stage that stopped part-way reports no figures: its runs are not comparable.
            Some(reason) => super::skipped_stage(&self.stage, self.description, reason),
            None => stage_result(&self.stage, self.description, self.samples, self.notes),
        }
    }
}

/// Creates `dir` and names the root and the layers' directory in it apart from those of other
/// runs and reports (`rootfs-PID-RUN`, `layers-PID-RUN`), in a directory marked as a pull marks
/// its staging directory ([`rpull_extract::spread_new_trees`]), so that ext4 does not start the
/// new tree among the inodes of the one deleted just before. The two are created by the caller.
fn new_tree_dirs(dir: &Path, run: usize) -> Result<(PathBuf, PathBuf), BenchError> {
    fs_err::create_dir_all(dir).map_err(|e| BenchError::io("creating", dir, e))?;
    // As a pull: a directory that cannot be marked is used as it is.
    let _ = rpull_extract::spread_new_trees(dir);
    let id = format!("{}-{run}", std::process::id());
    Ok((
        dir.join(format!("rootfs-{id}")),
        dir.join(format!("layers-{id}")),
    ))
}

/// Applies the layers like `rpull::Puller` does, without the network and the decoder.
pub fn apply_layers(
    layers: &[LocalLayer],
    root: &Path,
    staging: &Path,
    options: &ExtractOptions,
) -> Result<Vec<LayerSummary>, BenchError> {
    let window = rpull::DEFAULT_MAX_CONCURRENT_DOWNLOADS.max(1);
    // As the pipeline does: one gate on inode creation for all layers, except where creating from
    // several threads was measured faster (tmpfs, ramfs, ext4 with a journal).
    let options = &ExtractOptions {
        create_gate: CreateGate::shared_for(options.create_gate.as_ref(), root),
        ..options.clone()
    };
    std::thread::scope(|scope| {
        let mut running = VecDeque::new();
        let mut next = 0;
        let mut summaries = Vec::with_capacity(layers.len());
        let spawn = |layer: &LocalLayer| -> Result<_, BenchError> {
            let target = if layer.index == 0 {
                root.to_owned()
            } else {
                staging.join(layer.index.to_string())
            };
            if layer.index != 0 {
                fs_err::create_dir(&target).map_err(|e| BenchError::io("creating", &target, e))?;
            }
            let layer = layer.clone();
            Ok(scope.spawn(move || {
                let file = fs_err::File::open(&layer.tar)
                    .map_err(|e| BenchError::io("opening", &layer.tar, e))?;
                // Lending its buffers to the write threads, as a pull's decoded buffers are.
                let summary = extract_layer_from(
                    &mut rpull_extract::SharedReader::new(file, rpull_extract::TAR_READ_BUFFER),
                    &target,
                    options,
                )
                .map_err(|source| BenchError::Extract {
                    index: layer.index,
                    tar: layer.tar.clone(),
                    target: target.clone(),
                    source: Box::new(source),
                })?;
                Ok::<_, BenchError>((target, summary))
            }))
        };
        while next < layers.len() || !running.is_empty() {
            while next < layers.len() && running.len() < window {
                running.push_back(spawn(&layers[next])?);
                next += 1;
            }
            let handle = running.pop_front().expect("a running layer");
            let (staged, summary) = handle.join().map_err(|_| BenchError::Panic("extract"))??;
            if summaries.is_empty() {
                // Layer 0 went straight into the root.
            } else {
                let index = summaries.len();
                merge_layer(root, &staged, &summary, options).map_err(|source| {
                    BenchError::Extract {
                        index,
                        tar: layers[index].tar.clone(),
                        target: root.to_owned(),
                        source: Box::new(source),
                    }
                })?;
            }
            summaries.push(summary);
        }
        finalize_tree(root, &summaries, options).map_err(|source| BenchError::Extract {
            index: summaries.len().saturating_sub(1),
            tar: PathBuf::from("(finalize)"),
            target: root.to_owned(),
            source: Box::new(source),
        })?;
        Ok(summaries)
    })
}

/// Removes a tree that may contain read-only directories (as a non-root extraction leaves them).
pub(crate) fn remove_tree(path: &Path) -> Result<(), BenchError> {
    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
        return Ok(());
    }
    make_writable(path);
    fs_err::remove_dir_all(path).map_err(|e| BenchError::io("removing", path, e))
}

fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return;
    };
    if !metadata.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            make_writable(&entry.path());
        }
    }
}
