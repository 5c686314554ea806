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
            result = commands::run(cli.command) => result.map(|()| ExitCode::SUCCESS),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("rpull: interrupted; nothing was committed");
                Ok(ExitCode::from(130))
            }
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
