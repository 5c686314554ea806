//! Each stage against a real registry: its figures agree with the bytes and entries it moved, and
//! a corrupted blob fails it naming the digest. Never a speed.

use std::error::Error as _;
use std::path::Path;

use rpull::Reference;
use rpull_bench::stages::{
    BenchImage, CachePolicy, DecompressMode, ExtractTarget, FetchMode, LocalLayers, TarReference,
    decompress, extract, extract_beside_tar, network, prepare_local,
};
use rpull_bench::{BenchError, StageResult};
use rpull_testing::{
    Compression, Image, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry,
};

/// Caches stay warm in tests: dropping them would slow every other process on the machine.
fn warm() -> CachePolicy {
    CachePolicy::Keep("tests keep caches warm".to_owned())
}

/// Three layers, gzip, zstd and plain, with a whiteout and a hardlink; the tars are returned too.
fn layer_tars() -> Vec<(Vec<u8>, Compression)> {
    let big: Vec<u8> = (0..300_000u32)
        .flat_map(|i| (i.wrapping_mul(2_654_435_761) >> 7).to_le_bytes())
        .collect();
    vec![
        (
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/hostname", "bench\n", 0o644)
                .dir("usr", 0o755)
                .dir("usr/bin", 0o755)
                .file("usr/bin/tool", &big, 0o755)
                .symlink("usr/bin/alias", "tool")
                .file("gone", "x", 0o644)
                .build(),
            Compression::Gzip,
        ),
        (
            LayerBuilder::new()
                .whiteout("gone")
                .dir("data", 0o700)
                .file("data/a", vec![7u8; 100_000], 0o600)
                .hardlink("data/b", "data/a")
                .build(),
            Compression::Zstd,
        ),
        (
            LayerBuilder::new()
                .file("etc/motd", "hello\n", 0o644)
                .build(),
            Compression::None,
        ),
    ]
}

fn image_of(tars: &[(Vec<u8>, Compression)]) -> Image {
    tars.iter()
        .fold(ImageBuilder::new(), |builder, (tar, compression)| {
            builder.layer_tar(tar, *compression)
        })
        .build()
}

fn count_entries(tar: &[u8]) -> u64 {
    tar::Archive::new(tar)
        .entries()
        .unwrap()
        .map(Result::unwrap)
        .fold(0, |n, _| n + 1)
}

struct Fixture {
    registry: TestRegistry,
    image: Image,
    tars: Vec<(Vec<u8>, Compression)>,
    bench: BenchImage,
}

impl Fixture {
    /// The layers downloaded and decoded into `dir`, as the bench does before its local stages.
    async fn local(&self, dir: &Path) -> LocalLayers {
        prepare_local(&self.bench, dir)
            .await
            .expect("preparing local layers")
    }

    /// Sum of the layer tars' sizes.
    fn tar_bytes(&self) -> u64 {
        self.tars.iter().map(|(tar, _)| tar.len() as u64).sum()
    }
}

async fn fixture() -> Fixture {
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let tars = layer_tars();
    let image = image_of(&tars);
    registry
        .push_image(&image, "bench:1")
        .await
        .expect("pushing");
    let reference: Reference = registry.reference("bench:1").parse().unwrap();
    let bench = BenchImage::resolve(
        &registry.client().unwrap(),
        &reference,
        &rpull::Platform::host(),
    )
    .await
    .expect("resolving");
    Fixture {
        registry,
        image,
        tars,
        bench,
    }
}

fn blob_bytes(image: &Image) -> u64 {
    image.layers.iter().map(|l| l.size).sum::<u64>() + image.config.size()
}

fn only_sample(result: &StageResult) -> &rpull_bench::Sample {
    assert_eq!(result.samples.len(), 1, "{result:?}");
    &result.samples[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_stages_move_every_blob_byte() {
    let f = fixture().await;
    let expected = blob_bytes(&f.image);
    let stream = network(&f.bench, FetchMode::Stream, 2, &warm())
        .await
        .expect("network stage");
    assert_eq!(stream.stage, "network");
    assert_eq!(stream.samples.len(), 2);
    for sample in &stream.samples {
        assert_eq!(sample.bytes_in, expected);
        assert!(sample.seconds > 0.0);
    }
    // Chunks much smaller than the blobs: many ranged GETs per blob, in order.
    let ranged = network(&f.bench, FetchMode::Ranged(10_000), 1, &warm())
        .await
        .expect("ranged network stage");
    assert_eq!(ranged.stage, "network-ranged");
    assert_eq!(only_sample(&ranged).bytes_in, expected);
    assert!(
        ranged.description.contains("9 KiB") || ranged.description.contains("10000 B"),
        "{}",
        ranged.description
    );
    assert_eq!(stream.notes, vec!["tests keep caches warm".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_blob_fails_both_network_stages_naming_its_digest() {
    let f = fixture().await;
    // The largest layer, one byte changed, same size: only the digest can tell.
    let layer = f.image.layers.iter().max_by_key(|l| l.size).unwrap();
    let hex = layer.digest.strip_prefix("sha256:").unwrap();
    let data = f.registry.storage_dir().join(format!(
        "docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let mut bytes =
        std::fs::read(&data).unwrap_or_else(|e| panic!("reading {}: {e}", data.display()));
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    for mode in [FetchMode::Stream, FetchMode::Ranged(64 << 10)] {
        let error = network(&f.bench, mode, 1, &warm())
            .await
            .expect_err("a corrupted blob must fail the stage");
        let chain = error_chain(&error);
        assert!(
            matches!(error, BenchError::Verify { .. }),
            "{mode:?}: {chain}"
        );
        assert!(
            chain.contains(&layer.digest),
            "{mode:?}: the error names the digest: {chain}"
        );
        assert!(chain.contains("digest mismatch"), "{chain}");
    }
}

fn error_chain(error: &BenchError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decompress_stages_produce_every_tar_byte() {
    let f = fixture().await;
    let work = tempfile::tempdir().unwrap();
    let local = f.local(work.path()).await;
    let tar_bytes = f.tar_bytes();
    let compressed: u64 = f.image.layers.iter().map(|l| l.size).sum();
    assert_eq!(local.tar_bytes(), tar_bytes);
    assert_eq!(local.compressed_bytes(), compressed);
    for (layer, (tar, _)) in local.layers.iter().zip(&f.tars) {
        assert_eq!(
            std::fs::read(&layer.tar).unwrap(),
            *tar,
            "layer {} decoded to the tar that was pushed",
            layer.index
        );
    }
    assert_eq!(local.codec_summary(), "gzip x1, zstd x1, identity x1");

    for mode in [DecompressMode::OneCore, DecompressMode::AllCores] {
        let result = decompress(&local, mode, 2, &warm()).expect("decompress stage");
        assert_eq!(result.stage, mode.stage());
        for sample in &result.samples {
            assert_eq!(sample.bytes_in, compressed);
            assert_eq!(sample.bytes_out, tar_bytes);
        }
        assert!(
            result.description.contains("gzip x1, zstd x1, identity x1"),
            "{}",
            result.description
        );
        let codecs: Vec<(&str, usize, u64)> = result
            .codecs
            .iter()
            .map(|c| (c.codec.as_str(), c.layers, c.bytes_out))
            .collect();
        assert_eq!(
            codecs,
            vec![
                ("gzip", 1, f.tars[0].0.len() as u64),
                ("zstd", 1, f.tars[1].0.len() as u64),
                ("identity", 1, f.tars[2].0.len() as u64)
            ]
        );
        // Only the one-core stage has an undisturbed per-layer time.
        assert_eq!(
            result.critical_path_seconds.is_some(),
            mode == DecompressMode::OneCore
        );
        if let (Some(critical), Some(seconds)) = (result.critical_path_seconds, result.seconds) {
            assert!(
                critical.max <= seconds.max,
                "a layer takes no longer than all layers"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extract_stages_write_every_entry_and_leave_nothing() {
    let f = fixture().await;
    let work = tempfile::tempdir().unwrap();
    let local = f.local(&work.path().join("inputs")).await;
    let entries: u64 = f.tars.iter().map(|(tar, _)| count_entries(tar)).sum();
    assert_eq!(local.entries(), entries);
    let tar_bytes = f.tar_bytes();

    let tmpfs = tempfile::tempdir_in("/dev/shm").unwrap();
    for (stage, base) in [
        ("extract-disk", work.path().join("out")),
        ("extract-tmpfs", tmpfs.path().to_owned()),
    ] {
        std::fs::create_dir_all(&base).unwrap();
        let target = ExtractTarget {
            stage: stage.to_owned(),
            base: base.clone(),
        };
        let result = extract(
            &local,
            &target,
            &rpull::ExtractOptions::for_current_user(),
            2,
            &warm(),
        )
        .expect("extract stage");
        assert_eq!(result.stage, stage);
        for sample in &result.samples {
            assert_eq!(sample.files, entries, "every tar entry is counted once");
            assert_eq!(sample.bytes_in, tar_bytes);
            // File content: 1.2 MB tool, 100 kB data/a (data/b is a link), small files.
            assert_eq!(
                sample.bytes_out,
                1_200_000 + 100_000 + "bench\n".len() as u64 + 1 + "hello\n".len() as u64
            );
            assert!(sample.sync_seconds.is_some());
        }
        assert!(result.files_per_s.is_some());
        assert_eq!(
            std::fs::read_dir(&base).unwrap().count(),
            0,
            "the trees are deleted after each run: {}",
            base.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gnu_tar_runs_beside_the_extract_stage_or_says_why_not() {
    let f = fixture().await;
    let work = tempfile::tempdir().unwrap();
    let local = f.local(&work.path().join("inputs")).await;
    let tar_bytes = f.tar_bytes();
    let base = work.path().join("out");
    std::fs::create_dir_all(&base).unwrap();
    let target = ExtractTarget {
        stage: "extract-disk".to_owned(),
        base: base.clone(),
    };
    let gnu_tar = rpull_bench::peers::find_executable("tar", &std::env::var_os("PATH").unwrap())
        .expect("GNU tar is installed");
    let cases = [
        (Ok(gnu_tar), None),
        // A tar that fails on the first layer: no figures, the command and its status instead.
        (Ok("/bin/false".into()), Some("`/bin/false -xf ")),
        (
            Err("no `tar` in PATH".to_owned()),
            Some("skipped: no `tar` in PATH"),
        ),
    ];
    for (program, failure) in cases {
        let reference = TarReference {
            stage: "tar-disk".to_owned(),
            program,
        };
        let (extracted, tar) = extract_beside_tar(
            &local,
            &target,
            &rpull::ExtractOptions::for_current_user(),
            2,
            &warm(),
            Some(&reference),
        )
        .expect("extract stage");
        let tar = tar.expect("the reference stage");
        assert_eq!(
            extracted.samples.len(),
            2,
            "the extract stage runs whatever tar does"
        );
        assert_eq!(tar.stage, "tar-disk");
        match failure {
            None => {
                assert_eq!(tar.samples.len(), 2);
                assert!(tar.description.contains("GNU tar"), "{}", tar.description);
                for sample in &tar.samples {
                    assert_eq!(sample.files, local.entries());
                    assert_eq!(sample.bytes_in, tar_bytes);
                    assert!(sample.sync_seconds.is_some());
                }
                assert!(tar.files_per_s.is_some());
            }
            Some(reason) => {
                assert!(tar.samples.is_empty() && tar.seconds.is_none(), "{tar:?}");
                assert!(
                    tar.notes.iter().any(|note| note.contains(reason)),
                    "{reason}: {:?}",
                    tar.notes
                );
            }
        }
        assert_eq!(
            std::fs::read_dir(&base).unwrap().count(),
            0,
            "both trees are deleted after each run"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extraction_applies_whiteouts_and_links_like_a_pull() {
    // The stage applies layers the way the pipeline does; compare one run's tree with a pull.
    let f = fixture().await;
    let work = tempfile::tempdir().unwrap();
    let local = f.local(&work.path().join("inputs")).await;
    let root = work.path().join("applied/rootfs");
    let staging = work.path().join("applied/layers");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&staging).unwrap();
    rpull_bench::stages::apply_layers(
        &local.layers,
        &root,
        &staging,
        &rpull::ExtractOptions::for_current_user(),
    )
    .unwrap();

    let pulled = work.path().join("pulled");
    let puller = rpull::Puller::builder()
        .client(f.registry.client().unwrap())
        .build()
        .unwrap();
    puller
        .pull(&f.bench.reference, &pulled)
        .await
        .expect("pulling");
    let a = rpull_testing::TreeSnapshot::capture(&root).unwrap();
    let b = rpull_testing::TreeSnapshot::capture(&pulled).unwrap();
    rpull_testing::assert_trees_equal(&a, &b, &rpull_testing::DiffOptions::default());
    assert!(!Path::new(&root.join("gone")).exists());
}

/// The real sweeps against a registry: one note, the cache policy's, however many runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_sweeps_carry_the_cache_note_once() {
    let f = fixture().await;
    let chunks = rpull_bench::sweep::chunk_size_sweep(&f.bench, &[10_000, 100_000], 2, &warm())
        .await
        .expect("chunk-size sweep");
    assert_eq!(chunks.notes, ["tests keep caches warm"]);
    assert_eq!(chunks.points.len(), 2);
    let clients = rpull_bench::sweep::clients_sweep(&f.bench, &[1, 2], 2, &warm())
        .await
        .expect("clients sweep");
    assert_eq!(clients.notes, ["tests keep caches warm"]);
    assert_eq!(clients.points[1].count, 4);
}
