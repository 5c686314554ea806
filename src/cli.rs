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
    Pull(Box<PullArgs>),
    /// Measure a pull: each stage alone (network, decompress, extract), then end to end, cold;
    /// optionally peers and sweeps.
    Bench(Box<BenchArgs>),
}

/// `rpull bench REF ...` or `rpull bench generate ...`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Image reference to measure, as docker parses it.
    #[arg(required = true)]
    pub reference: Option<String>,
    /// Directory the end-to-end pulls (and the peers) write to; replaced by every pull and left
    /// in place. Default: a temporary directory in /var/tmp (disk).
    #[arg(long, value_name = "DIR", conflicts_with = "tmpfs")]
    pub dest: Option<PathBuf>,
    /// Pull into a temporary directory on tmpfs (/dev/shm) instead of disk.
    #[arg(long)]
    pub tmpfs: bool,
    /// Runs per stage, peer and sweep point (median, min and max are reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Print the report as JSON (schema: docs/bench-json.md) instead of a table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print the report as CSV (one row per stage, peer and sweep point) instead of a table.
    #[arg(long)]
    pub csv: bool,
    /// Also draw stage throughput and whole-pull times (rpull and peers) into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Sweep layer downloads in flight: end-to-end pulls with --max-concurrent-downloads N.
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::value_parser!(usize))]
    pub concurrency: Vec<usize>,
    /// Span of the ranged network stage (default 8MiB); two or more values also sweep it.
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',', value_parser = rpull_bench::stages::parse_size)]
    pub chunk_size: Vec<u64>,
    /// Sweep simultaneous clients: N network-stage pulls at once (min, max, mean, p90 per client).
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::value_parser!(usize))]
    pub clients: Vec<usize>,
    /// Also run these peer tools on the same image: docker, podman, ctr, skopeo, crane,
    /// crane-export, or all.
    #[arg(long, value_name = "LIST|all")]
    pub compare: Option<String>,
    /// Do not drop the page cache between runs (by default it is dropped when root).
    #[arg(long)]
    pub warm: bool,
    /// Platform to choose from a multi-platform image, `os/arch[/variant]`; default: this host's.
    #[arg(long)]
    pub platform: Option<String>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Build benchmark images (the Spegel set of random-data images, or one image from a
    /// directory) and push them.
    Generate(GenerateArgs),
}

/// `rpull bench generate TARGET ...`
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Where to push, `REGISTRY/REPO` without a tag (e.g. `127.0.0.1:5000/benchmark`).
    pub target: String,
    /// Spegel set sizes: `10MB`, `100MB`, `1GB` (comma-separated) or `all`.
    #[arg(long, value_name = "LIST|all", conflicts_with = "from_dir")]
    pub sizes: Option<String>,
    /// Layer counts of the Spegel set (default 1,4).
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::value_parser!(usize), conflicts_with = "from_dir")]
    pub layer_counts: Vec<usize>,
    /// Versions of the Spegel set (v1, v2, ...).
    #[arg(long, default_value_t = 2, conflicts_with = "from_dir")]
    pub versions: u32,
    /// Build one image from this directory instead (one layer per top-level directory).
    #[arg(long, value_name = "DIR")]
    pub from_dir: Option<PathBuf>,
    /// With --from-dir: cut the tree into this many layers instead.
    #[arg(long, value_name = "N", requires = "from_dir")]
    pub layers: Option<usize>,
    /// With --from-dir: the tag (default `latest`).
    #[arg(long, requires = "from_dir")]
    pub tag: Option<String>,
    /// zstd layers instead of gzip.
    #[arg(long)]
    pub zstd: bool,
    /// Seed of the random data (the same seed gives the same digests).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where layer files are built (default: the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Mount blobs from these repositories of the same registry instead of uploading them.
    #[arg(long, value_name = "REPO,...", value_delimiter = ',')]
    pub mount_from: Vec<String>,
    /// Print what was pushed as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
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
    /// Layers extracted at once; the others wait, their downloads paused. Default: no limit.
    /// One per core measured 4-6% faster into ext4 right after a large delete
    /// (docs/performance.md).
    #[arg(long, value_name = "N")]
    pub max_concurrent_extractions: Option<usize>,
    /// Replace DIR if it exists and is not empty.
    #[arg(long)]
    pub force: bool,
    /// Do not set file owners from the layers (automatic when not running as root).
    #[arg(long)]
    pub no_chown: bool,
    /// How files are written: `std` (blocking writes of 256 KiB at most, the default: it measured
    /// faster here), `uring` (io_uring, error when unavailable) or `auto` (io_uring when the
    /// kernel allows it, std otherwise).
    #[arg(long = "io", value_enum, default_value_t = IoArg::Std)]
    pub io: IoArg,
    /// Threads per layer that create and write its small files (std backend), the extracting
    /// thread among them, which parses the layer's tar, applies everything else in order and
    /// writes a batch of small files itself whenever the other threads' queue is full; 1 writes
    /// them on the extracting thread (on ext4 without a journal: makes them there and writes them
    /// on one thread).
    /// Default: one per core (at most 4) on tmpfs and on ext4 with a journal, 1 on other file
    /// systems (measured: docs/performance.md).
    #[arg(long, value_name = "N")]
    pub write_threads: Option<usize>,
    /// When the tree is made durable: `auto` (one syncfs at the end on a disk, nothing on
    /// tmpfs), `end`, `layer` (also after each layer) or `none`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "none", "layer", "end"])]
    pub fsync: String,
    /// Download blobs larger than SIZE as byte ranges over several connections (e.g. 8MiB), for
    /// registries where one stream is slow; the digest is still checked over the whole blob.
    /// Default: one stream per blob.
    #[arg(long, value_name = "SIZE", value_parser = rpull_bench::stages::parse_size)]
    pub chunk_size: Option<u64>,
    /// Connections per blob for ranged downloads (--chunk-size).
    #[arg(long, default_value_t = rpull::DEFAULT_CONNECTIONS_PER_BLOB, requires = "chunk_size")]
    pub connections_per_blob: usize,
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

/// `--io`: the extraction I/O backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoArg {
    /// Blocking system calls with large buffers.
    Std,
    /// io_uring; an error when the kernel refuses it.
    Uring,
    /// io_uring when available, std otherwise.
    Auto,
}

impl From<IoArg> for rpull::IoBackendKind {
    fn from(arg: IoArg) -> Self {
        match arg {
            IoArg::Std => rpull::IoBackendKind::Std,
            IoArg::Uring => rpull::IoBackendKind::Uring,
            IoArg::Auto => rpull::IoBackendKind::Auto,
        }
    }
}
