//! `end-to-end`: `rpull pull` as users run it, in a child process measured with `wait4`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{CachePolicy, check_runs, stage_result};
use crate::StageResult;
use crate::error::BenchError;
use crate::resources::{run_measured_with_input, syncfs};

/// How to run `rpull pull`.
#[derive(Debug, Clone)]
pub struct PullCommand {
    /// The `rpull` binary (`std::env::current_exe()` for `rpull bench`).
    pub program: PathBuf,
    /// Arguments after `pull --force --quiet REF DIR`: registry flags, `--platform`.
    pub extra_args: Vec<OsString>,
    /// What the child reads on stdin (the password for `--password-stdin`).
    pub stdin: Option<Vec<u8>>,
}

impl PullCommand {
    /// The command for one pull of `reference` into `dir`, with `--max-concurrent-downloads`
    /// when given.
    pub fn command(&self, reference: &str, dir: &Path, concurrency: Option<usize>) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg("pull")
            .arg("--force")
            .arg("--quiet")
            .arg(reference)
            .arg(dir);
        if let Some(n) = concurrency {
            command.arg("--max-concurrent-downloads").arg(n.to_string());
        }
        command.args(&self.extra_args);
        command
    }

    /// Runs one pull, measured.
    pub(crate) fn run_once(
        &self,
        reference: &str,
        dir: &Path,
        concurrency: Option<usize>,
    ) -> Result<crate::Sample, BenchError> {
        let mut command = self.command(reference, dir, concurrency);
        let shown = format!("{command:?}").replace('"', "");
        let run = run_measured_with_input(&mut command, self.stdin.clone()).map_err(|e| {
            BenchError::Command {
                command: shown.clone(),
                outcome: format!("could not be started: {e}"),
                stderr: String::new(),
            }
        })?;
        if !run.status.success() {
            return Err(BenchError::Command {
                command: shown,
                outcome: format!("exited with {}", run.status),
                stderr: run.stderr_tail,
            });
        }
        Ok(run.sample)
    }
}

/// The figures of the image that a pull moves, for the sample's byte and file counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImageSize {
    /// Compressed layer bytes.
    pub compressed_bytes: u64,
    /// Tar bytes.
    pub tar_bytes: u64,
    /// Tar entries.
    pub entries: u64,
}

/// Measures `rpull pull --force --quiet REF DIR` `runs` times: wall, CPU and peak RSS of the
/// child (from `wait4`), then `syncfs` of DIR's filesystem timed apart. `bytes_in` is the
/// compressed size, `bytes_out` the tar size, `files` the tar entries.
pub fn end_to_end(
    pull: &PullCommand,
    reference: &str,
    dir: &Path,
    size: ImageSize,
    runs: usize,
    cache: &CachePolicy,
) -> Result<StageResult, BenchError> {
    check_runs(runs)?;
    let description = format!(
        "`rpull pull --force --quiet` into {} in a child process (wall, CPU and peak RSS of the child), the previous tree \
         removed before each run; syncfs timed apart",
        super::extract::describe_location(dir.parent().unwrap_or(dir)),
    );
    let mut notes = Vec::new();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut sample = pull_sample(pull, reference, dir, None, cache, &mut notes)?;
        sample.bytes_in = size.compressed_bytes;
        sample.bytes_out = size.tar_bytes;
        sample.files = size.entries;
        samples.push(sample);
    }
    Ok(stage_result("end-to-end", description, samples, notes))
}

/// One cold pull, with its sync timed.
pub(crate) fn pull_sample(
    pull: &PullCommand,
    reference: &str,
    dir: &Path,
    concurrency: Option<usize>,
    cache: &CachePolicy,
    notes: &mut Vec<String>,
) -> Result<crate::Sample, BenchError> {
    // Every pull writes a new tree, as a first pull does, instead of replacing one: the removal
    // is outside the timing.
    super::extract::remove_tree(dir)?;
    cache.before_run(notes);
    let mut sample = pull.run_once(reference, dir, concurrency)?;
    let parent = dir.parent().unwrap_or(dir);
    sample.sync_seconds = Some(
        syncfs(parent)
            .map_err(|e| BenchError::io("syncfs of", parent, e))?
            .as_secs_f64(),
    );
    Ok(sample)
}
