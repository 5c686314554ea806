//! `rpull bench generate REGISTRY/REPO`: builds and pushes benchmark images.
//!
//! * The Spegel benchmark set (the default): random, incompressible data of 10 MB, 100 MB and 1 GB
//!   (MiB / GiB, as the baseline corpus), in 1 and in 4 layers, tagged `v1-10MB-1`, `v1-10MB-4`,
//!   ..., `v1-1GB-4`, and the same again as `v2-*` with different content (the rolling-update
//!   case: nothing of v1 can be reused by v2). Each layer holds a directory `data` and one file
//!   `data/random-<i>`. The bytes come from a seeded xoshiro256++ generator, streamed through the
//!   tar writer and the compressor into a file, never held in memory: the same seed gives the same
//!   digests.
//! * An image from a local directory (`from_dir`): each top-level directory of DIR is the root of
//!   one layer, in name order (top-level files are ignored: scripts/realistic-image leaves
//!   `*.done` markers there); or, with `layers: Some(N)`, DIR is one root filesystem whose entries,
//!   in walk order, are cut into N layers of similar size (each with the parent directories it
//!   needs).
//!
//! Layers are gzip or zstd (real trees at gzip 6 / zstd 3, as `docker push` and the baseline corpus; random data: gzip stored blocks, as gzip -6 makes of it), built into files under the work directory, pushed
//! (chunked uploads, cross-repository mounts from `mount_from`), and deleted after each tag. Build
//! and push times are reported per tag.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rpull::registry::Client;
use rpull_image::{
    Compression, ImageBuilder, ImageError, ImageLayer, LayerSizes, LayerWriter, PushOptions,
};
use serde::Serialize;

/// mtime of generated entries (2023-11-14), so the same seed gives the same digests.
const MTIME: u64 = 1_700_000_000;

/// One size of the Spegel set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SpegelSize {
    /// 10 MiB.
    Mb10,
    /// 100 MiB.
    Mb100,
    /// 1 GiB.
    Gb1,
}

impl SpegelSize {
    /// Every size, smallest first.
    pub const ALL: [SpegelSize; 3] = [SpegelSize::Mb10, SpegelSize::Mb100, SpegelSize::Gb1];

    /// `10MB`, `100MB`, `1GB`, as in the tags.
    pub fn name(self) -> &'static str {
        match self {
            SpegelSize::Mb10 => "10MB",
            SpegelSize::Mb100 => "100MB",
            SpegelSize::Gb1 => "1GB",
        }
    }

    /// Bytes of file data in the image.
    pub fn bytes(self) -> u64 {
        match self {
            SpegelSize::Mb10 => 10 << 20,
            SpegelSize::Mb100 => 100 << 20,
            SpegelSize::Gb1 => 1 << 30,
        }
    }
}

/// Parses `all` or a comma list of `10MB`, `100MB`, `1GB` (case-insensitive).
pub fn parse_sizes(list: &str) -> Result<Vec<SpegelSize>, String> {
    let mut sizes = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let more: Vec<SpegelSize> = if name.eq_ignore_ascii_case("all") {
            SpegelSize::ALL.to_vec()
        } else {
            let size = SpegelSize::ALL
                .into_iter()
                .find(|s| s.name().eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    format!("unknown size {name:?}; known sizes: 10MB, 100MB, 1GB, or all")
                })?;
            vec![size]
        };
        for size in more {
            if !sizes.contains(&size) {
                sizes.push(size);
            }
        }
    }
    if sizes.is_empty() {
        return Err("no sizes given; known sizes: 10MB, 100MB, 1GB, or all".to_owned());
    }
    Ok(sizes)
}

/// What to generate and where to push it.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// `REGISTRY/REPO` (no tag): `127.0.0.1:5000/benchmark`.
    pub target: String,
    /// Spegel set sizes to build; empty means all three. Ignored with `from_dir`.
    pub sizes: Vec<SpegelSize>,
    /// Layer counts of the Spegel set; empty means 1 and 4.
    pub layer_counts: Vec<usize>,
    /// Versions of the Spegel set (`v1`, `v2`, ...): 1..=versions. 0 means 2.
    pub versions: u32,
    /// Build the image from this directory instead of the Spegel set.
    pub from_dir: Option<PathBuf>,
    /// With `from_dir`: cut the tree into this many layers instead of one per top-level directory.
    pub layers: Option<usize>,
    /// With `from_dir`: the tag (default `latest`).
    pub tag: Option<String>,
    /// zstd instead of gzip.
    pub zstd: bool,
    /// Seed of the random data.
    pub seed: u64,
    /// Where layer files are built (default: the system's temporary directory). They are deleted
    /// once pushed.
    pub work_dir: Option<PathBuf>,
    /// Repositories of the same registry to mount blobs from instead of uploading them.
    pub mount_from: Vec<String>,
}

impl GenerateOptions {
    /// The whole Spegel set (gzip, seed 0) for `target`.
    pub fn spegel(target: impl Into<String>) -> GenerateOptions {
        GenerateOptions {
            target: target.into(),
            sizes: Vec::new(),
            layer_counts: Vec::new(),
            versions: 2,
            from_dir: None,
            layers: None,
            tag: None,
            zstd: false,
            seed: 0,
            work_dir: None,
            mount_from: Vec::new(),
        }
    }

    /// An image from `dir` for `target`, one layer per top-level directory, gzip, tag `latest`.
    pub fn from_dir(target: impl Into<String>, dir: impl Into<PathBuf>) -> GenerateOptions {
        GenerateOptions {
            from_dir: Some(dir.into()),
            ..GenerateOptions::spegel(target)
        }
    }

    fn compression(&self) -> Compression {
        if self.zstd {
            Compression::Zstd
        } else {
            Compression::Gzip
        }
    }
}

/// One pushed tag.
#[derive(Debug, Clone, Serialize)]
pub struct GeneratedImage {
    /// `REGISTRY/REPO:TAG`.
    pub reference: String,
    /// Manifest digest.
    pub digest: String,
    /// Layers.
    pub layers: usize,
    /// Sum of the compressed layer sizes.
    pub compressed_bytes: u64,
    /// Sum of the layer tar sizes.
    pub uncompressed_bytes: u64,
    /// Tar entries over all layers.
    pub entries: u64,
    /// `gzip` or `zstd`.
    pub compression: String,
    /// Seconds building (tarring, compressing, hashing) the layers.
    pub build_seconds: f64,
    /// Seconds pushing blobs and manifest.
    pub push_seconds: f64,
    /// Bytes uploaded (blobs the registry had or mounted are not counted).
    pub uploaded_bytes: u64,
    /// Blobs mounted from another repository.
    pub blobs_mounted: usize,
}

/// Every tag pushed, in order.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateReport {
    /// The pushed images.
    pub images: Vec<GeneratedImage>,
}

/// Why generating failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The options do not make sense (`--layers 0`, an empty directory...).
    #[error("{0}")]
    Options(String),
    /// Building or pushing an image failed.
    #[error("{what}")]
    Image {
        what: String,
        #[source]
        source: ImageError,
    },
    /// Reading the source directory or creating the work directory failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The building thread panicked.
    #[error("building layers: {0}")]
    Join(String),
}

/// Builds and pushes what `options` asks for. Blocks a thread for building; pushes on the runtime.
pub async fn generate(
    client: &Client,
    options: &GenerateOptions,
) -> Result<GenerateReport, GenerateError> {
    let target = options.target.trim_end_matches('/');
    match target.rsplit_once('/') {
        Some((_, repo)) if !repo.contains([':', '@']) => {}
        _ => {
            return Err(GenerateError::Options(format!(
                "{target}: give REGISTRY/REPO (e.g. 127.0.0.1:5000/benchmark) without a tag; generate chooses the tags"
            )));
        }
    }
    let base = options.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)?;
    let work = tempfile::Builder::new()
        .prefix("rpull-generate-")
        .tempdir_in(&base)?;
    let plans = plan(options)?;
    let push_options = PushOptions {
        mount_from: options.mount_from.clone(),
        ..PushOptions::default()
    };
    let mut images = Vec::with_capacity(plans.len());
    for plan in plans {
        let reference = format!("{target}:{}", plan.tag);
        let dir = work.path().join(&plan.tag);
        std::fs::create_dir_all(&dir)?;
        let started = Instant::now();
        let compression = options.compression();
        let build_dir = dir.clone();
        let built = tokio::task::spawn_blocking(move || plan.build(&build_dir, compression))
            .await
            .map_err(|e| GenerateError::Join(e.to_string()))?
            .map_err(|source| GenerateError::Image {
                what: format!("building {reference}"),
                source,
            })?;
        let build_seconds = started.elapsed().as_secs_f64();
        let mut builder = ImageBuilder::new();
        let mut sizes = LayerSizes {
            tar_bytes: 0,
            entries: 0,
        };
        for (layer, layer_sizes) in built {
            sizes.tar_bytes += layer_sizes.tar_bytes;
            sizes.entries += layer_sizes.entries;
            builder = builder.image_layer(layer);
        }
        let image = builder.build();
        let pushed = image
            .push_with(client, &reference, &push_options)
            .await
            .map_err(|source| GenerateError::Image {
                what: format!("pushing {reference}"),
                source,
            })?;
        tracing::info!(%reference, digest = %pushed.digest, push_seconds = pushed.seconds, "pushed");
        images.push(GeneratedImage {
            reference,
            digest: pushed.digest.to_string(),
            layers: image.layers.len(),
            compressed_bytes: image.layers.iter().map(|l| l.size).sum(),
            uncompressed_bytes: sizes.tar_bytes,
            entries: sizes.entries,
            compression: if options.zstd { "zstd" } else { "gzip" }.to_owned(),
            build_seconds,
            push_seconds: pushed.seconds,
            uploaded_bytes: pushed.uploaded_bytes,
            blobs_mounted: pushed.blobs_mounted,
        });
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(GenerateReport { images })
}

/// One tag to build.
struct Plan {
    tag: String,
    layers: Vec<LayerPlan>,
}

enum LayerPlan {
    /// `data/` + `data/random-<index>` of `bytes` random bytes from `seed`.
    Random { index: usize, bytes: u64, seed: u64 },
    /// The whole tree under this directory, as the layer's root.
    Tree(PathBuf),
    /// These entries of the tree under `root` (relative names, walk order, directories first).
    Entries {
        root: PathBuf,
        entries: Vec<PathBuf>,
    },
}

impl Plan {
    fn build(
        self,
        dir: &Path,
        compression: Compression,
    ) -> Result<Vec<(ImageLayer, LayerSizes)>, ImageError> {
        self.layers
            .into_iter()
            .enumerate()
            .map(|(i, layer)| {
                // Random data does not compress: gzip -6 (pigz, as the baseline corpus was made)
                // falls back to stored blocks for it, which level 0 writes directly; zstd level 1
                // writes raw blocks. Real trees get what `docker push` and the baseline corpus
                // use (gzip 6, zstd 3), so the images and the figures compare.
                let level = match (&layer, compression) {
                    (LayerPlan::Random { .. }, Compression::Gzip) => Some(0),
                    (LayerPlan::Random { .. }, _) => None,
                    (_, Compression::Gzip) => Some(6),
                    (_, _) => Some(3),
                };
                let mut writer = LayerWriter::create_with_level(
                    &dir.join(format!("layer-{i}")),
                    compression,
                    level,
                )?;
                match layer {
                    LayerPlan::Random { index, bytes, seed } => {
                        writer.append_dir("data", 0o755, MTIME)?;
                        let data = RandomReader::new(seed).take(bytes);
                        writer.append_file(
                            &format!("data/random-{index}"),
                            0o644,
                            MTIME,
                            bytes,
                            data,
                        )?;
                    }
                    LayerPlan::Tree(root) => writer.append_tree(&root, Path::new(""))?,
                    LayerPlan::Entries { root, entries } => {
                        for entry in entries {
                            writer.append_path(&root.join(&entry), &entry)?;
                        }
                    }
                }
                writer.finish_with_sizes()
            })
            .collect()
    }
}

fn plan(options: &GenerateOptions) -> Result<Vec<Plan>, GenerateError> {
    match &options.from_dir {
        Some(dir) => {
            let tag = options.tag.clone().unwrap_or_else(|| "latest".to_owned());
            let layers = match options.layers {
                None => top_level_layers(dir)?,
                Some(0) => {
                    return Err(GenerateError::Options(
                        "--layers must be at least 1".to_owned(),
                    ));
                }
                Some(n) => split_layers(dir, n)?,
            };
            Ok(vec![Plan { tag, layers }])
        }
        None => Ok(spegel_plans(options)),
    }
}

fn spegel_plans(options: &GenerateOptions) -> Vec<Plan> {
    let sizes = if options.sizes.is_empty() {
        SpegelSize::ALL.to_vec()
    } else {
        options.sizes.clone()
    };
    let counts = if options.layer_counts.is_empty() {
        vec![1, 4]
    } else {
        options.layer_counts.clone()
    };
    let versions = if options.versions == 0 {
        2
    } else {
        options.versions
    };
    let mut plans = Vec::new();
    for version in 1..=versions {
        for size in &sizes {
            for &count in &counts {
                let count = count.max(1);
                let tag = format!("v{version}-{}-{count}", size.name());
                let per_layer = size.bytes() / count as u64;
                let layers = (0..count)
                    .map(|index| LayerPlan::Random {
                        index,
                        bytes: per_layer,
                        // Every (version, size, count, layer) gets its own stream.
                        seed: mix(options.seed
                            ^ mix(u64::from(version) << 48
                                ^ size.bytes()
                                ^ (count as u64) << 40
                                ^ index as u64)),
                    })
                    .collect();
                plans.push(Plan { tag, layers });
            }
        }
    }
    plans
}

/// Every top-level directory of `dir` (name order) as one layer's root.
fn top_level_layers(dir: &Path) -> Result<Vec<LayerPlan>, GenerateError> {
    let mut roots: Vec<PathBuf> = fs_read_dir(dir)?
        .into_iter()
        .filter(|path| std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()))
        .collect();
    roots.sort();
    if roots.is_empty() {
        return Err(GenerateError::Options(format!(
            "{}: no top-level directories (each is one layer's root; use --layers N to cut one tree into layers)",
            dir.display()
        )));
    }
    Ok(roots.into_iter().map(LayerPlan::Tree).collect())
}

fn fs_read_dir(dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::read_dir(dir)
        .and_then(|entries| entries.map(|e| e.map(|e| e.path())).collect())
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", dir.display())))
}

/// Walks `root` (name order) and cuts its entries into `count` runs of similar file bytes. Each
/// layer gets the directories above its first entry, so it stands on its own.
fn split_layers(root: &Path, count: usize) -> Result<Vec<LayerPlan>, GenerateError> {
    let mut walked = Vec::new();
    walk_sizes(root, Path::new(""), &mut walked)?;
    if walked.is_empty() {
        return Err(GenerateError::Options(format!(
            "{}: empty directory",
            root.display()
        )));
    }
    let total: u64 = walked.iter().map(|(_, size, _)| size).sum();
    let mut layers: Vec<Vec<PathBuf>> = vec![Vec::new()];
    let mut done = 0u64;
    for (name, size, _) in &walked {
        let layer_index = layers.len();
        // Start the next layer once this one has its share (by bytes), keeping the last for the rest.
        if layer_index < count
            && !layers[layer_index - 1].is_empty()
            && done >= total * layer_index as u64 / count as u64
        {
            let parents: Vec<PathBuf> = name
                .ancestors()
                .skip(1)
                .filter(|p| !p.as_os_str().is_empty())
                .map(Path::to_owned)
                .collect();
            layers.push(parents.into_iter().rev().collect());
        }
        layers
            .last_mut()
            .expect("one layer at least")
            .push(name.clone());
        done += size;
    }
    Ok(layers
        .into_iter()
        .map(|entries| LayerPlan::Entries {
            root: root.to_owned(),
            entries,
        })
        .collect())
}

/// (relative name, bytes, is_dir) of every entry under `dir`, parents before children.
fn walk_sizes(root: &Path, relative: &Path, out: &mut Vec<(PathBuf, u64, bool)>) -> io::Result<()> {
    let mut paths = fs_read_dir(&root.join(relative))?;
    paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    for path in paths {
        let name = relative.join(path.file_name().expect("read_dir names have a file name"));
        let meta = std::fs::symlink_metadata(&path)?;
        out.push((
            name.clone(),
            if meta.is_file() { meta.len() } else { 0 },
            meta.is_dir(),
        ));
        if meta.is_dir() {
            walk_sizes(root, &name, out)?;
        }
    }
    Ok(())
}

/// splitmix64: spreads a seed over all bits.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// An endless stream of xoshiro256++ output: fast (GB/s), reproducible from the seed, and not
/// compressible, like the random files of the Spegel benchmark.
#[derive(Debug, Clone)]
pub struct RandomReader {
    state: [u64; 4],
}

impl RandomReader {
    /// The stream for `seed`.
    pub fn new(seed: u64) -> RandomReader {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix(s)
        };
        RandomReader {
            state: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = &mut self.state;
        let result = s0.wrapping_add(*s3).rotate_left(23).wrapping_add(*s0);
        let t = *s1 << 17;
        *s2 ^= *s0;
        *s3 ^= *s1;
        *s1 ^= *s2;
        *s0 ^= *s3;
        *s2 ^= t;
        *s3 = s3.rotate_left(45);
        result
    }
}

impl Read for RandomReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut chunks = buf.chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let bytes = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&bytes[..n]);
        }
        Ok(buf.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_sizes("10mb").unwrap(), [SpegelSize::Mb10]);
        assert_eq!(parse_sizes("all").unwrap(), SpegelSize::ALL);
        assert_eq!(
            parse_sizes("1GB,10MB,1gb").unwrap(),
            [SpegelSize::Gb1, SpegelSize::Mb10]
        );
        assert!(parse_sizes("2GB").unwrap_err().contains("known sizes"));
    }

    #[test]
    fn spegel_tags_and_distinct_seeds() {
        let plans = spegel_plans(&GenerateOptions::spegel("r/x"));
        let tags: Vec<&str> = plans.iter().map(|p| p.tag.as_str()).collect();
        assert_eq!(
            tags,
            [
                "v1-10MB-1",
                "v1-10MB-4",
                "v1-100MB-1",
                "v1-100MB-4",
                "v1-1GB-1",
                "v1-1GB-4",
                "v2-10MB-1",
                "v2-10MB-4",
                "v2-100MB-1",
                "v2-100MB-4",
                "v2-1GB-1",
                "v2-1GB-4"
            ]
        );
        let mut seeds: Vec<u64> = plans
            .iter()
            .flat_map(|p| &p.layers)
            .map(|l| match l {
                LayerPlan::Random { seed, .. } => *seed,
                _ => unreachable!(),
            })
            .collect();
        let n = seeds.len();
        assert_eq!(n, 2 * 3 * 5);
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), n, "every layer has its own content");
    }

    #[test]
    fn random_stream_is_reproducible_and_incompressible() {
        let mut a = vec![0u8; 1 << 20];
        let mut b = vec![0u8; 1 << 20];
        RandomReader::new(7).read_exact(&mut a).unwrap();
        RandomReader::new(7).read_exact(&mut b).unwrap();
        assert_eq!(a, b);
        RandomReader::new(8).read_exact(&mut b).unwrap();
        assert_ne!(a, b);
        let compressed = Compression::Zstd.compress(&a);
        assert!(
            compressed.len() as f64 > a.len() as f64 * 0.99,
            "{} of {}",
            compressed.len(),
            a.len()
        );
        // Odd read sizes continue the same stream.
        let mut reader = RandomReader::new(7);
        let mut pieces = vec![0u8; 13];
        reader.read_exact(&mut pieces).unwrap();
        assert_eq!(&pieces[..8], &a[..8]);
    }

    #[test]
    fn split_layers_keep_parents_and_balance_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for (name, size) in [("a/1", 100), ("a/2", 100), ("b/c/3", 100), ("b/c/4", 100)] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, vec![0u8; size]).unwrap();
        }
        let layers = split_layers(dir.path(), 2).unwrap();
        let names: Vec<Vec<String>> = layers
            .iter()
            .map(|l| match l {
                LayerPlan::Entries { entries, .. } => {
                    entries.iter().map(|e| e.display().to_string()).collect()
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            names,
            [vec!["a", "a/1", "a/2"], vec!["b", "b/c", "b/c/3", "b/c/4"]]
        );
        // A cut inside a directory repeats its parents in the next layer.
        let layers = split_layers(dir.path(), 4).unwrap();
        let last = match &layers[3] {
            LayerPlan::Entries { entries, .. } => entries
                .iter()
                .map(|e| e.display().to_string())
                .collect::<Vec<_>>(),
            _ => unreachable!(),
        };
        assert_eq!(last, ["b", "b/c", "b/c/4"]);
        assert_eq!(split_layers(dir.path(), 1).unwrap().len(), 1);
    }
}
