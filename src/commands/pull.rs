use std::io::Read;

use anyhow::{Context, bail};
use rpull::registry::{Client, Credentials};
use rpull::{PullOptions, Puller, Reference};

use crate::cli::{PullArgs, RegistryArgs};
use crate::progress::Progress;

pub async fn run(args: PullArgs) -> anyhow::Result<()> {
    let reference: Reference = args.reference.parse()?;
    let client = registry_client(&args.registry, &reference)?;
    let mut options = PullOptions::default();
    if let Some(platform) = &args.platform {
        options.platform = platform
            .parse()
            .with_context(|| format!("--platform {platform:?}"))?;
    }
    if args.max_concurrent_downloads == 0 {
        bail!("--max-concurrent-downloads must be at least 1");
    }
    options.max_concurrent_downloads = args.max_concurrent_downloads;
    if args.max_concurrent_extractions == Some(0) {
        bail!("--max-concurrent-extractions must be at least 1");
    }
    options.max_concurrent_extractions = args.max_concurrent_extractions;
    options.force = args.force;
    if args.no_chown {
        options.extract.chown = false;
    }
    options.extract.backend = args.io.into();
    if let Some(threads) = args.write_threads {
        if threads == 0 {
            bail!("--write-threads must be at least 1");
        }
        options.extract.write_threads = threads;
    }
    options.fsync = args.fsync.parse().map_err(anyhow::Error::msg)?;
    if args.connections_per_blob == 0 {
        bail!("--connections-per-blob must be at least 1");
    }
    options.chunk_size = args.chunk_size;
    options.connections_per_blob = args.connections_per_blob;

    let progress = Progress::new(&args.output);
    let sink = progress.clone();
    let puller = Puller::builder()
        .client(client)
        .options(options)
        .on_event(move |event| sink.event(event))
        .build()?;
    let result = puller.pull(&reference, &args.dir).await;
    progress.finish(result.as_ref().ok());
    result.with_context(|| format!("pulling {reference} into {}", args.dir.display()))?;
    Ok(())
}

/// The registry client the flags describe. The password of `--username` comes from stdin.
pub fn registry_client(args: &RegistryArgs, reference: &Reference) -> anyhow::Result<Client> {
    Ok(registry_client_and_password(args, reference)?.0)
}

/// [`registry_client`], also returning the password read from stdin (for `rpull bench`, whose
/// child pulls need it again).
pub fn registry_client_and_password(
    args: &RegistryArgs,
    reference: &Reference,
) -> anyhow::Result<(Client, Option<String>)> {
    let mut builder = Client::builder()
        .plain_http(args.plain_http)
        .insecure(args.insecure);
    for ca in &args.ca_certs {
        builder = builder.ca_cert(ca.clone());
    }
    let mut read_password = None;
    if let Some(username) = &args.username {
        let mut password = String::new();
        std::io::stdin()
            .read_to_string(&mut password)
            .context("reading the password from stdin")?;
        let password = password.trim_end_matches(['\n', '\r']).to_owned();
        if password.is_empty() {
            bail!("--password-stdin: stdin was empty");
        }
        builder = builder.credentials(
            reference.registry(),
            Credentials::basic(username.clone(), password.clone()),
        );
        read_password = Some(password);
    }
    Ok((builder.build()?, read_password))
}
