use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Streaming OCI image pull client and extractor.
#[derive(Debug, Parser)]
#[command(name = "rpull", version, about)]
pub struct Cli {
    /// More logging on stderr (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pull an image and unpack its root filesystem into DIR.
    Pull(PullArgs),
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// Image reference, as docker parses it: `alpine`, `host:port/name:tag`, `name@sha256:…`.
    pub reference: String,
    /// Directory to create with the image's root filesystem. It appears only when the pull
    /// succeeded.
    pub dir: PathBuf,
    /// Platform to choose from a multi-platform image, `os/arch[/variant]`; default: this host's.
    #[arg(long)]
    pub platform: Option<String>,
    /// Layer downloads in flight at once (each also extracts while it downloads).
    #[arg(long, default_value_t = rpull::DEFAULT_MAX_CONCURRENT_DOWNLOADS, value_parser = clap::value_parser!(usize))]
    pub max_concurrent_downloads: usize,
    /// Replace DIR if it exists and is not empty.
    #[arg(long)]
    pub force: bool,
    /// Do not set file owners from the layers (automatic when not running as root).
    #[arg(long)]
    pub no_chown: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How to reach and authenticate to the registry.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Talk plain HTTP to the registry (loopback registries fall back to HTTP without it).
    #[arg(long)]
    pub plain_http: bool,
    /// Do not verify the registry's TLS certificate.
    #[arg(long)]
    pub insecure: bool,
    /// Trust this PEM CA certificate for the registry (repeatable).
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_certs: Vec<PathBuf>,
    /// User name for the registry; the password is read from stdin (--password-stdin).
    #[arg(short = 'u', long, requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the password (or token) for --username from stdin.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
}

/// What is printed.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Print nothing but errors.
    #[arg(short, long, conflicts_with = "json")]
    pub quiet: bool,
    /// One JSON event per line on stdout, then a summary object.
    #[arg(long)]
    pub json: bool,
}
