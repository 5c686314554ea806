//! The `rpull` command line.

mod allocator;
mod cli;
mod commands;
mod logging;
mod progress;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    allocator::tune();
    let cli = cli::Cli::parse();
    logging::init(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(runtime_workers())
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rpull: error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        tokio::select! {
            // A signal wins over a step that became ready at the same time, so no new step starts
            // after it.
            biased;
            (what, code) = stop_signal() => {
                eprintln!("rpull: {what}; nothing was committed");
                Ok(ExitCode::from(code))
            }
            result = commands::run(cli.command) => result.map(|()| ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rpull: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Worker threads of the async runtime: one per two cores. The runtime only receives bytes and
/// hands them on; hashing, decoding and extraction run on threads of their own. More workers
/// mostly woke each other to look for work to steal: on 2 cores, one worker instead of two pulled
/// the realistic image and 1 GB in one layer 1-4% faster, mostly with less CPU, in 8 of 9 alternating
/// sets (docs/performance.md, "What changed").
fn runtime_workers() -> usize {
    workers_for_cores(std::thread::available_parallelism().map_or(1, |cores| cores.get()))
}

/// [`runtime_workers`] on a machine of `cores` cores (as `available_parallelism` counts them: the
/// cores this process may run on).
fn workers_for_cores(cores: usize) -> usize {
    (cores / 2).max(1)
}

/// Waits for Ctrl-C (SIGINT) or SIGTERM, as `docker stop`, systemd and CI timeouts send. Either
/// ends the command's future, so what it made (a pull's staging directory, the bench's work
/// directories) is removed as on an error. Returns what to say and the exit status: 128 + the
/// signal's number, as a shell reports it.
async fn stop_signal() -> (&'static str, u8) {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => tokio::select! {
            () = ctrl_c() => ("interrupted", 130),
            _ = terminate.recv() => ("terminated", 143),
        },
        // No SIGTERM handler could be set up: Ctrl-C still works.
        Err(_) => {
            ctrl_c().await;
            ("interrupted", 130)
        }
    }
}

/// Completes on Ctrl-C; never, if its handler could not be set up (so that failure does not read
/// as an interruption).
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_gets_one_worker_per_two_cores_and_at_least_one() {
        let workers: Vec<usize> = [1, 2, 3, 4, 5, 8, 64]
            .into_iter()
            .map(workers_for_cores)
            .collect();
        assert_eq!(workers, [1, 1, 1, 2, 2, 4, 32]);
        // What this machine gets: never more than half of its cores, unless it has one.
        let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
        assert!(runtime_workers() == 1 || runtime_workers() * 2 <= cores);
    }
}
