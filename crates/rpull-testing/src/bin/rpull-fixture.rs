//! `rpull-fixture`: the harness from the command line, for scripts and demos.
//!
//! ```text
//! rpull-fixture registry --port 5000 --storage /var/tmp/registry   # plain registry, foreground
//! rpull-fixture push-dir --registry 127.0.0.1:5000 --repo big --tag 1 [--zstd] DIR...
//! rpull-fixture demo-image --registry 127.0.0.1:5000 [--repo demo] [--tag latest]
//! rpull-fixture diff-trees A B [--dir-mtimes]   # exit 1 and list differences when they differ
//! ```

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rpull_testing::rpull_registry::{Client, CredentialStore};
use rpull_testing::{
    Compression, DiffOptions, ImageBuilder, LayerBuilder, REGISTRY_BINARY, TreeSnapshot, diff,
    layer_from_dir, plain_config_yaml,
};

#[derive(Parser, Debug)]
#[command(about = "Fixture registries and images for rpull tests and scripts")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a plain-HTTP registry on 127.0.0.1:PORT in the foreground (this process becomes it).
    Registry {
        #[arg(long)]
        port: u16,
        /// Storage directory (created; the config is written into it).
        #[arg(long)]
        storage: PathBuf,
    },
    /// Push one layer per directory as REPO:TAG to a plain-HTTP loopback registry.
    PushDir {
        /// `127.0.0.1:PORT`
        #[arg(long)]
        registry: String,
        #[arg(long)]
        repo: String,
        #[arg(long, default_value = "latest")]
        tag: String,
        /// zstd layers instead of gzip.
        #[arg(long)]
        zstd: bool,
        /// Also write the image as an OCI layout (tag TAG) here, e.g. for `umoci unpack`.
        #[arg(long)]
        oci_layout: Option<PathBuf>,
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// Compare two trees entry by entry (types, modes, sizes, content hashes, link targets,
    /// hardlink groups, owners, xattrs, file mtimes); exit 1 listing the differences.
    DiffTrees {
        a: PathBuf,
        b: PathBuf,
        /// Compare directory mtimes too.
        #[arg(long)]
        dir_mtimes: bool,
    },
    /// Push a small multi-layer image built from code.
    DemoImage {
        #[arg(long)]
        registry: String,
        #[arg(long, default_value = "demo")]
        repo: String,
        #[arg(long, default_value = "latest")]
        tag: String,
    },
}

fn plain_client() -> Result<Client> {
    Ok(Client::builder()
        .plain_http(true)
        .credential_store(CredentialStore::empty())
        .build()?)
}

fn demo_image() -> rpull_testing::Image {
    ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/os-release", "NAME=rpull-demo\nID=rpull-demo\n", 0o644)
                .dir("usr/bin", 0o755)
                .file("usr/bin/hello", "#!/bin/sh\necho hello from rpull\n", 0o755)
                .symlink("bin", "usr/bin"),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new()
                .dir("var/lib/demo", 0o750)
                .file_with("var/lib/demo/data", vec![b'x'; 64 << 10], |h| {
                    h.set_uid(1000);
                    h.set_gid(1000);
                })
                .hardlink("var/lib/demo/data-link", "var/lib/demo/data"),
            Compression::Zstd,
        )
        .layer(
            LayerBuilder::new()
                .whiteout("etc/os-release")
                .file("etc/motd", "layered\n", 0o644),
            Compression::Gzip,
        )
        .cmd(&["/usr/bin/hello"])
        .build()
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Registry { port, storage } => {
            fs_err::create_dir_all(&storage)?;
            let storage = fs_err::canonicalize(&storage)?;
            let config = storage.join("rpull-fixture-config.yml");
            fs_err::write(&config, plain_config_yaml(port, &storage))?;
            eprintln!(
                "registry on http://127.0.0.1:{port}, storage {}",
                storage.display()
            );
            let err = std::process::Command::new(REGISTRY_BINARY)
                .arg("serve")
                .arg(&config)
                .exec();
            Err(err).with_context(|| {
                format!("running {REGISTRY_BINARY} (apt-get install -y docker-registry)")
            })
        }
        Command::PushDir {
            registry,
            repo,
            tag,
            zstd,
            oci_layout,
            dirs,
        } => {
            let compression = if zstd {
                Compression::Zstd
            } else {
                Compression::Gzip
            };
            let work = tempfile::tempdir()?;
            let mut image = ImageBuilder::new();
            for (i, dir) in dirs.iter().enumerate() {
                let layer =
                    layer_from_dir(dir, compression, &work.path().join(format!("layer-{i}")))?;
                eprintln!(
                    "layer {i}: {} ({} bytes) from {}",
                    layer.digest,
                    layer.size,
                    dir.display()
                );
                image = image.image_layer(layer);
            }
            let image = image.build();
            if let Some(layout) = &oci_layout {
                image.write_oci_layout(layout, &tag)?;
            }
            let reference = format!("{registry}/{repo}:{tag}");
            let digest = image.push(&plain_client()?, &reference).await?;
            println!("{reference}@{digest}");
            Ok(())
        }
        Command::DiffTrees { a, b, dir_mtimes } => {
            let options = DiffOptions {
                dir_mtimes,
                ..DiffOptions::default()
            };
            let (left, right) = (TreeSnapshot::capture(&a)?, TreeSnapshot::capture(&b)?);
            let differences = diff(&left, &right, &options);
            for line in &differences {
                println!("{line}");
            }
            eprintln!(
                "{} entries vs {} entries, {} differences",
                left.entries.len(),
                right.entries.len(),
                differences.len()
            );
            if differences.is_empty() {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::DemoImage {
            registry,
            repo,
            tag,
        } => {
            let reference = format!("{registry}/{repo}:{tag}");
            let digest = demo_image().push(&plain_client()?, &reference).await?;
            println!("{reference}@{digest}");
            Ok(())
        }
    }
}
