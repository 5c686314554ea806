//! Atomic results: DIR appears only when the whole pull succeeded. Corrupted, mis-sized and
//! undecodable layers, occupied destinations, `force`, and a pull future dropped mid-way.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::{
    Env, any_staging_left, assert_nothing_committed, chain, paths, snapshot, staging_left,
};
use rpull::{LayerState, PullError, PullEvent, PullOptions, Puller, Reference};
use rpull_registry::{DigestAlgorithm, Hasher, VerifyError};
use rpull_testing::{
    Compression, Image, ImageBuilder, ImageLayer, LayerBuilder, LayerData, TestRegistry,
    media_type, random_bytes, sha256_digest,
};

/// Where the registry keeps a blob's bytes: under the sha256 of its content, whatever digest
/// it was pushed by.
fn blob_data_path(registry: &TestRegistry, content: &[u8]) -> PathBuf {
    let digest = sha256_digest(content);
    let hex = digest.strip_prefix("sha256:").unwrap();
    registry
        .storage_dir()
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data")
}

/// Flips one byte at `offset` of the stored blob (same size); returns the corrupted bytes.
fn corrupt_blob(registry: &TestRegistry, content: &[u8], offset: usize) -> Vec<u8> {
    let path = blob_data_path(registry, content);
    let mut bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes, content, "the registry stores blobs verbatim");
    bytes[offset] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    bytes
}

fn two_layer_image(second: ImageLayer) -> Image {
    ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/base", "base\n", 0o644),
            Compression::Gzip,
        )
        .image_layer(second)
        .build()
}

fn payload_layer(compression: Compression) -> ImageLayer {
    ImageLayer::from_tar(
        &LayerBuilder::new()
            .file("payload", random_bytes(600 * 1024, 7), 0o644)
            .build(),
        compression,
    )
}

#[track_caller]
fn assert_digest_mismatch(error: &PullError, index: usize, expected: &str, actual: &str) {
    let message = chain(error);
    match error {
        PullError::Verify {
            index: i,
            digest,
            source:
                VerifyError::DigestMismatch {
                    expected: e,
                    actual: a,
                },
        } => {
            assert_eq!(*i, index, "{message}");
            assert_eq!(digest.as_str(), expected);
            assert_eq!(e.as_str(), expected);
            assert_eq!(a.as_str(), actual);
        }
        other => panic!("expected a digest mismatch of layer {index}, got {other:?}: {message}"),
    }
    assert!(
        message.contains(expected) && message.contains(actual),
        "{message}"
    );
    assert!(message.contains(&format!("layer {index}")), "{message}");
}

/// One byte flipped in the middle of the stored blob, for a plain tar layer (extraction alone
/// would succeed: only the digest can tell) and a gzip layer (the decoder fails too, but the
/// verification is what gets reported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_blob_fails_verification_and_commits_nothing() {
    let env = Env::start();
    for (i, compression) in [Compression::None, Compression::Gzip]
        .into_iter()
        .enumerate()
    {
        let layer = payload_layer(compression);
        let content = layer.bytes().unwrap();
        let image = two_layer_image(layer.clone());
        let reference = env.push(&image, &format!("atomic/corrupt:{i}")).await;
        let corrupted = corrupt_blob(&env.registry, &content, content.len() / 2);

        let dest = env.dest(&format!("rootfs{i}"));
        let error = env
            .pull(&reference, &dest)
            .await
            .expect_err("a corrupted layer");
        assert_digest_mismatch(&error, 1, &layer.digest, &sha256_digest(&corrupted));
        assert_nothing_committed(&dest);
    }
    assert!(any_staging_left(env.tmp.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_sha512_blob_fails_verification() {
    let env = Env::start();
    let tar = LayerBuilder::new()
        .file("payload", random_bytes(300 * 1024, 9), 0o644)
        .build();
    let content = Compression::Gzip.compress(&tar);
    let sha512 = |bytes: &[u8]| {
        let mut hasher = Hasher::new(DigestAlgorithm::Sha512);
        hasher.update(bytes);
        hasher.finish().to_string()
    };
    let layer = ImageLayer {
        digest: sha512(&content),
        diff_id: sha256_digest(&tar),
        size: content.len() as u64,
        compression: Compression::Gzip,
        media_type: String::new(),
        data: LayerData::Memory(content.clone().into()),
    };
    let image = ImageBuilder::new().image_layer(layer.clone()).build();
    let reference = env.push(&image, "atomic/sha512:v1").await;
    let corrupted = corrupt_blob(&env.registry, &content, content.len() / 3);
    let dest = env.dest("rootfs");
    let error = env
        .pull(&reference, &dest)
        .await
        .expect_err("a corrupted layer");
    assert_digest_mismatch(&error, 0, &layer.digest, &sha512(&corrupted));
    assert_nothing_committed(&dest);
}

/// A manifest whose layer descriptor has the wrong size, one byte short and one byte long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_mismatch_fails_verification() {
    let env = Env::start();
    let layer = payload_layer(Compression::Gzip);
    let image = two_layer_image(layer.clone());
    env.push(&image, "atomic/size:good").await;
    let client = env.registry.client().unwrap();
    let repository = env.reference("atomic/size:good");

    for (tag, declared) in [("short", layer.size - 1), ("long", layer.size + 1)] {
        let mut descriptor = image.layers[1].descriptor();
        descriptor["size"] = declared.into();
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","config":{},"layers":[{},{}]}}"#,
            media_type::OCI_MANIFEST,
            image.config.descriptor(),
            image.layers[0].descriptor(),
            descriptor,
        );
        client
            .push_manifest(
                &repository,
                tag,
                media_type::OCI_MANIFEST,
                Bytes::from(manifest),
            )
            .await
            .expect("the registry takes a manifest with a wrong size");

        let dest = env.dest(&format!("rootfs-{tag}"));
        let error = env
            .pull(&env.reference(&format!("atomic/size:{tag}")), &dest)
            .await
            .expect_err("wrong size");
        let message = chain(&error);
        match &error {
            PullError::Verify {
                index: 1,
                digest,
                source: VerifyError::SizeMismatch { expected, actual },
            } => {
                assert_eq!(digest.as_str(), layer.digest);
                assert_eq!(*expected, declared);
                assert!(*actual > declared || *actual == layer.size, "{message}");
            }
            other => panic!("{tag}: expected a size mismatch of layer 1, got {other:?}: {message}"),
        }
        assert!(
            message.contains(&format!("expected {declared} bytes")),
            "{message}"
        );
        assert!(message.contains(&layer.digest), "{message}");
        assert_nothing_committed(&dest);
    }
}

/// A layer declared gzip whose blob is `bytes` as they are (its digest matches them; whether they
/// decode is the test's business).
fn gzip_layer_of_bytes(bytes: Vec<u8>) -> ImageLayer {
    ImageLayer {
        digest: sha256_digest(&bytes),
        diff_id: sha256_digest(b"not checked by pulls"),
        size: bytes.len() as u64,
        compression: Compression::Gzip,
        media_type: String::new(),
        data: LayerData::Memory(bytes.into()),
    }
}

/// A layer whose bytes match its digest but do not decode: the pull fails with a decompress
/// error, or a tar error (the decoder failing under the tar reader), of that layer.
async fn assert_undecodable(env: &Env, name: &str, bytes: Vec<u8>) {
    let image = two_layer_image(gzip_layer_of_bytes(bytes));
    let reference = env.push(&image, &format!("atomic/gzip:{name}")).await;
    let dest = env.dest(&format!("rootfs-{name}"));
    let error = env.pull(&reference, &dest).await.expect_err(name);
    let message = chain(&error);
    let layer_one = match &error {
        PullError::Decompress { index, .. } => *index == 1,
        PullError::Extract {
            index,
            source: rpull_extract::ExtractError::Tar { .. },
            ..
        } => *index == 1,
        _ => false,
    };
    assert!(
        layer_one,
        "{name}: expected a decompress or tar error of layer 1, got {error:?}: {message}"
    );
    assert!(
        message.contains(&image.layers[1].digest),
        "{name}: {message}"
    );
    assert_nothing_committed(&dest);
}

fn gzip_payload() -> Vec<u8> {
    let tar = LayerBuilder::new()
        .file("payload", random_bytes(200 * 1024, 3), 0o644)
        .build();
    Compression::Gzip.compress(&tar)
}

/// gzip magic followed by garbage, and a whole gzip stream with a wrong CRC in its trailer
/// (the tar is complete; only the codec's trailer check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_gzip_fails_and_commits_nothing() {
    let env = Env::start();
    let mut garbage = vec![0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0xff];
    garbage.extend_from_slice(&random_bytes(4096, 11));
    assert_undecodable(&env, "garbage", garbage).await;

    let mut bad_crc = gzip_payload();
    let crc_at = bad_crc.len() - 8; // trailer: CRC32, then ISIZE
    bad_crc[crc_at] ^= 0xff;
    assert_undecodable(&env, "bad-crc", bad_crc).await;
}

/// A gzip stream cut in the middle of a file's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_gzip_fails_and_commits_nothing() {
    let env = Env::start();
    let gzip = gzip_payload();
    assert_undecodable(&env, "truncated", gzip[..gzip.len() / 2].to_vec()).await;
}

/// The number of requests the registry answered so far (it logs each one).
fn requests_answered(registry: &TestRegistry) -> usize {
    registry.log().matches("response completed").count()
}

fn small_image(marker: &str) -> Image {
    ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/marker", marker, 0o644)
                .file(marker, marker, 0o644),
            Compression::Gzip,
        )
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occupied_destination_is_refused_before_any_request() {
    let env = Env::start();
    let reference = env.push(&small_image("new"), "atomic/dest:v1").await;

    let dest = env.dest("occupied");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("old"), "old\n").unwrap();
    let before = snapshot(&dest);
    let requests = requests_answered(&env.registry);
    let error = env
        .pull(&reference, &dest)
        .await
        .expect_err("occupied destination");
    assert!(
        matches!(&error, PullError::DestinationNotEmpty { path } if path == &dest),
        "{error:?}"
    );
    assert!(
        chain(&error).contains(dest.to_str().unwrap()),
        "{}",
        chain(&error)
    );
    assert_eq!(
        requests_answered(&env.registry),
        requests,
        "the registry was contacted"
    );
    assert!(rpull_testing::diff(&before, &snapshot(&dest), &Default::default()).is_empty());
    assert!(staging_left(&dest).is_empty());

    // A file in the way is occupied too; a registry that does not exist is never contacted.
    let file = env.dest("a-file");
    std::fs::write(&file, "file\n").unwrap();
    let nowhere: Reference = "127.0.0.1:1/nothing:here".parse().unwrap();
    let error = env
        .pull(&nowhere, &file)
        .await
        .expect_err("a file in the way");
    assert!(
        matches!(error, PullError::DestinationNotEmpty { .. }),
        "{error:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "file\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_destination_is_used() {
    let env = Env::start();
    let reference = env.push(&small_image("new"), "atomic/dest:v1").await;
    let dest = env.dest("empty");
    std::fs::create_dir(&dest).unwrap();
    env.pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(paths(&snapshot(&dest)), ["etc", "etc/marker", "new"]);
    assert!(any_staging_left(env.tmp.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_replaces_an_occupied_destination_only_on_success() {
    let env = Env::start();
    let reference = env.push(&small_image("new"), "atomic/force:v1").await;
    let force = PullOptions {
        force: true,
        ..PullOptions::default()
    };

    let dest = env.dest("occupied");
    std::fs::create_dir_all(dest.join("old-dir")).unwrap();
    std::fs::write(dest.join("old-dir/old"), "old\n").unwrap();
    std::fs::write(dest.join("etc"), "a file where the image has a directory\n").unwrap();

    // A failing pull with force leaves the old tree exactly as it was.
    let layer = payload_layer(Compression::None);
    let content = layer.bytes().unwrap();
    let broken = env
        .push(&two_layer_image(layer), "atomic/force:broken")
        .await;
    corrupt_blob(&env.registry, &content, 1000);
    let before = snapshot(&dest);
    let error = env
        .puller(force.clone())
        .pull(&broken, &dest)
        .await
        .expect_err("corrupted");
    assert!(matches!(error, PullError::Verify { .. }), "{error:?}");
    let options = rpull_testing::DiffOptions {
        dir_mtimes: true,
        mtime_nanos: true,
        ..Default::default()
    };
    assert_eq!(
        rpull_testing::diff(&before, &snapshot(&dest), &options),
        Vec::<String>::new()
    );
    assert!(staging_left(&dest).is_empty());

    env.puller(force)
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(paths(&snapshot(&dest)), ["etc", "etc/marker", "new"]);
    assert!(
        any_staging_left(env.tmp.path()).is_empty(),
        "the replaced tree is removed with the staging directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_parents_are_created() {
    let env = Env::start();
    let reference = env.push(&small_image("new"), "atomic/parents:v1").await;
    let dest = env.dest("a/b/c/rootfs");
    env.pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(
        std::fs::read_to_string(dest.join("etc/marker")).unwrap(),
        "new"
    );
    assert_eq!(
        paths(&snapshot(&env.dest("a"))),
        [
            "b",
            "b/c",
            "b/c/rootfs",
            "b/c/rootfs/etc",
            "b/c/rootfs/etc/marker",
            "b/c/rootfs/new"
        ]
    );
}

/// What to wait for before dropping the pull future.
#[derive(Debug, Clone, Copy)]
enum DropPoint {
    Resolved,
    FirstProgressOfBigLayer,
    FirstLayerMerged,
}

impl DropPoint {
    fn reached(self, event: &PullEvent) -> bool {
        match (self, event) {
            (DropPoint::Resolved, PullEvent::Resolved { .. }) => true,
            (
                DropPoint::FirstProgressOfBigLayer,
                PullEvent::LayerProgress {
                    index: 1,
                    downloaded,
                    ..
                },
            ) => *downloaded > 0,
            (
                DropPoint::FirstLayerMerged,
                PullEvent::LayerState {
                    index: 0,
                    state: LayerState::Merged,
                    ..
                },
            ) => true,
            _ => false,
        }
    }
}

/// The pull future dropped at several points of a pull whose second layer is 64 MiB of random
/// bytes stored uncompressed: nothing at DIR, no staging directory, then or a moment later,
/// and a second pull to the same DIR succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_pull_future_removes_everything() {
    let env = Env::start();
    let big = random_bytes(64 << 20, 42);
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("first", "first\n", 0o644),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new().file("big", &big, 0o644),
            Compression::None,
        )
        .layer(
            LayerBuilder::new().file("last", "last\n", 0o644),
            Compression::Gzip,
        )
        .build();
    drop(big);
    let reference = env.push(&image, "atomic/big:v1").await;

    for point in [
        DropPoint::Resolved,
        DropPoint::FirstProgressOfBigLayer,
        DropPoint::FirstLayerMerged,
    ] {
        let dest = env.dest("rootfs");
        let (reached_tx, mut reached_rx) = tokio::sync::mpsc::unbounded_channel();
        let committed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let committed_flag = committed.clone();
        let puller = Puller::builder()
            .client(env.registry.client().unwrap())
            .on_event(move |event| {
                if point.reached(event) {
                    let _ = reached_tx.send(());
                }
                if matches!(event, PullEvent::Committed { .. }) {
                    committed_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })
            .build()
            .unwrap();
        let pull = puller.pull(&reference, &dest);
        tokio::select! {
            result = pull => panic!("{point:?}: the pull ended before it was dropped: {:?}", result.map(|_| ())),
            _ = reached_rx.recv() => {}
        }
        // The future is dropped here, at the end of the select.
        assert!(
            !committed.load(std::sync::atomic::Ordering::SeqCst),
            "{point:?}: committed before the drop"
        );
        assert_nothing_left(&dest, point);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_nothing_left(&dest, point);
    }

    let dest = env.dest("rootfs");
    env.pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(paths(&snapshot(&dest)), ["big", "first", "last"]);
    assert_eq!(std::fs::metadata(dest.join("big")).unwrap().len(), 64 << 20);
}

#[track_caller]
fn assert_nothing_left(dest: &Path, point: DropPoint) {
    assert!(
        std::fs::symlink_metadata(dest).is_err(),
        "{point:?}: {} exists after the drop",
        dest.display()
    );
    let left = any_staging_left(dest.parent().unwrap());
    assert!(
        left.is_empty(),
        "{point:?}: staging left after the drop: {left:?}"
    );
}

/// Options with write threads on whatever file system the test directory is on (the default
/// turns them on for tmpfs only).
fn with_write_threads() -> PullOptions {
    let mut options = PullOptions::default();
    options.extract.write_threads = 3;
    options
}

/// A layer of `files` small files in 20 directories.
fn many_files_layer(files: usize) -> LayerBuilder {
    let mut layer = LayerBuilder::new();
    for index in 0..files {
        layer = layer.file(
            &format!("d{:02}/f{index:05}", index % 20),
            random_bytes(512 + index % 3000, index as u64),
            0o644,
        );
    }
    layer
}

/// With write threads holding queued files: a gzip stream cut in the middle fails the pull, a
/// tar or decompress error of that layer, and nothing is committed or left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_layer_with_write_threads_commits_nothing() {
    let env = Env::start();
    let gzip = Compression::Gzip.compress(&many_files_layer(3000).build());
    let image = two_layer_image(gzip_layer_of_bytes(gzip[..gzip.len() * 2 / 3].to_vec()));
    let reference = env.push(&image, "atomic/threads:cut").await;
    let dest = env.dest("rootfs-threads-cut");
    let error = env
        .puller(with_write_threads())
        .pull(&reference, &dest)
        .await
        .expect_err("a truncated layer");
    assert!(
        matches!(
            &error,
            PullError::Decompress { index: 1, .. } | PullError::Extract { index: 1, .. }
        ),
        "{error:?}: {}",
        chain(&error)
    );
    assert_nothing_committed(&dest);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_nothing_committed(&dest);
}

/// The pull future dropped while write threads have files queued: nothing at DIR, no staging
/// directory, then or a moment later (no write thread still creating files); the same pull to
/// the same DIR then succeeds with every file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_pull_with_write_threads_removes_everything() {
    let env = Env::start();
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("first", "first\n", 0o644),
            Compression::Gzip,
        )
        .layer(many_files_layer(6000), Compression::None)
        .build();
    let reference = env.push(&image, "atomic/threads:v1").await;
    let dest = env.dest("rootfs-threads");
    let point = DropPoint::FirstProgressOfBigLayer;
    let (reached_tx, mut reached_rx) = tokio::sync::mpsc::unbounded_channel();
    let puller = Puller::builder()
        .client(env.registry.client().unwrap())
        .options(with_write_threads())
        .on_event(move |event| {
            if point.reached(event) {
                let _ = reached_tx.send(());
            }
        })
        .build()
        .unwrap();
    let pull = puller.pull(&reference, &dest);
    tokio::select! {
        result = pull => panic!("the pull ended before it was dropped: {:?}", result.map(|_| ())),
        _ = reached_rx.recv() => {}
    }
    assert_nothing_left(&dest, point);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_nothing_left(&dest, point);

    env.puller(with_write_threads())
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let tree = paths(&snapshot(&dest));
    assert_eq!(tree.iter().filter(|path| path.contains("/f")).count(), 6000);
    assert!(tree.iter().any(|path| path == "first"));
}
