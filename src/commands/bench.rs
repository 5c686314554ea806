use std::ffi::OsString;
use std::io::Write as _;

use anyhow::{Context, bail};
use rpull::Reference;
use rpull_bench::generate::{GenerateOptions, parse_sizes};
use rpull_bench::peers::parse_peers;
use rpull_bench::stages::{CachePolicy, PullCommand};
use rpull_bench::{Bench, BenchOptions, Destination, report};

use crate::cli::{BenchArgs, BenchCommand, GenerateArgs, RegistryArgs};
use crate::commands::pull::registry_client_and_password;

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(BenchCommand::Generate(generate_args)) = args.command {
        return generate(generate_args).await;
    }
    let Some(reference_text) = args.reference.as_deref() else {
        bail!("a reference to measure is required");
    };
    let reference: Reference = reference_text.parse()?;
    // Parsed before anything is measured, so a typo fails fast.
    let peers = match &args.compare {
        Some(list) => parse_peers(list).map_err(|e| anyhow::anyhow!("--compare: {e}"))?,
        None => Vec::new(),
    };
    let (client, password) = registry_client_and_password(&args.registry, &reference)?;

    let mut options = BenchOptions::new(reference.clone());
    let mut extra_args = registry_flags(&args.registry);
    if let Some(platform) = &args.platform {
        options.platform = platform
            .parse()
            .with_context(|| format!("--platform {platform:?}"))?;
        extra_args.extend(["--platform".into(), platform.into()]);
    }
    options.runs = args.runs as usize;
    options.destination = match (&args.dest, args.tmpfs) {
        (Some(dir), _) => Destination::Dir(dir.clone()),
        (None, true) => Destination::Tmpfs,
        (None, false) => Destination::Disk,
    };
    if let Some(&first) = args.chunk_size.first() {
        options.chunk_size = first;
    }
    if args.chunk_size.len() > 1 {
        options.chunk_sizes = args.chunk_size.clone();
    }
    options.concurrency = args.concurrency.clone();
    options.clients = args.clients.clone();
    options.peers = peers;
    options.cache = CachePolicy::for_current_user(args.warm);
    options.pull = Some(PullCommand {
        program: std::env::current_exe()
            .context("finding the rpull binary for the end-to-end pulls")?,
        extra_args,
        stdin: password.map(|p| format!("{p}\n").into_bytes()),
    });

    let bench = Bench::prepare(&client, options)
        .await
        .with_context(|| format!("preparing the benchmark of {reference}"))?;
    let report = bench
        .run()
        .await
        .with_context(|| format!("measuring {reference}"))?;
    drop(bench);

    if let Some(path) = &args.plot {
        report::write_svg(&report, path)?;
    }
    let text = if args.json {
        report::render_json(&report)
    } else if args.csv {
        report::render_csv(&report)
    } else {
        report::render_table(&report)
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the report to stdout")?;
    Ok(())
}

/// The registry flags to repeat for each child `rpull pull` (`--password-stdin` gets the
/// password on the child's stdin).
fn registry_flags(args: &RegistryArgs) -> Vec<OsString> {
    let mut flags: Vec<OsString> = Vec::new();
    if args.plain_http {
        flags.push("--plain-http".into());
    }
    if args.insecure {
        flags.push("--insecure".into());
    }
    for ca in &args.ca_certs {
        flags.push("--ca-cert".into());
        flags.push(ca.into());
    }
    if let Some(username) = &args.username {
        flags.extend([
            "--username".into(),
            username.into(),
            "--password-stdin".into(),
        ]);
    }
    flags
}

/// `rpull bench generate`: builds and pushes benchmark images.
async fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    // The registry part of TARGET decides which credentials and transport apply.
    let registry_reference: Reference = format!("{}:generate", args.target)
        .parse()
        .with_context(|| format!("target {:?} (expected REGISTRY/REPO)", args.target))?;
    let client = crate::commands::pull::registry_client(&args.registry, &registry_reference)?;
    let mut options = match &args.from_dir {
        Some(dir) => GenerateOptions::from_dir(&args.target, dir),
        None => GenerateOptions::spegel(&args.target),
    };
    if let Some(sizes) = &args.sizes {
        options.sizes = parse_sizes(sizes).map_err(|e| anyhow::anyhow!("--sizes: {e}"))?;
    }
    options.layer_counts = args.layer_counts.clone();
    options.versions = args.versions;
    options.layers = args.layers;
    options.tag = args.tag.clone();
    options.zstd = args.zstd;
    options.seed = args.seed;
    options.work_dir = args.work_dir.clone();
    options.mount_from = args.mount_from.clone();
    let report = rpull_bench::generate::generate(&client, &options)
        .await
        .with_context(|| format!("generating images for {}", args.target))?;
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        report
            .images
            .iter()
            .map(|image| {
                format!(
                    "{}@{}  {} layers, {:.1} MB {} ({:.1} MB tar, {} entries), built in {:.2} s, pushed in {:.2} s\n",
                    image.reference,
                    image.digest,
                    image.layers,
                    image.compressed_bytes as f64 / 1e6,
                    image.compression,
                    image.uncompressed_bytes as f64 / 1e6,
                    image.entries,
                    image.build_seconds,
                    image.push_seconds,
                )
            })
            .collect()
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the report to stdout")?;
    Ok(())
}
