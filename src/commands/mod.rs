mod bench;
mod pull;

use crate::cli::Command;

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Pull(args) => pull::run(*args).await,
        Command::Bench(args) => bench::run(*args).await,
    }
}
