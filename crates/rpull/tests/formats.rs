//! Layer formats, manifest formats, indexes and references, each pulled from a real registry.

mod common;

use common::{Env, any_staging_left, assert_nothing_committed, chain, paths, snapshot};
use rpull::{Platform, PullError, PullOptions, Reference};
use rpull_registry::{DigestAlgorithm, Hasher};
use rpull_testing::{
    Compression, Image, ImageBuilder, ImageLayer, IndexBuilder, LayerBuilder, LayerData,
    ManifestFormat, media_type, sha256_digest,
};

fn read(dest: &std::path::Path, path: &str) -> String {
    std::fs::read_to_string(dest.join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// One file per layer, named after the layer, plus a file every layer overwrites.
fn layered(format: ManifestFormat, compressions: &[Compression]) -> Image {
    let mut image = ImageBuilder::new().format(format);
    for (i, compression) in compressions.iter().enumerate() {
        image = image.layer(
            LayerBuilder::new()
                .file(
                    &format!("layer{i}"),
                    format!("content of layer {i}\n"),
                    0o644,
                )
                .file("last", format!("{i}"), 0o644),
            *compression,
        );
    }
    image.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_zstd_and_plain_tar_layers_in_one_image() {
    let env = Env::start();
    let image = layered(
        ManifestFormat::Oci,
        &[Compression::Gzip, Compression::Zstd, Compression::None],
    );
    let reference = env.push(&image, "formats/mixed:v1").await;
    let dest = env.dest("rootfs");
    let report = env
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));

    assert_eq!(
        paths(&snapshot(&dest)),
        ["last", "layer0", "layer1", "layer2"]
    );
    for i in 0..3 {
        assert_eq!(
            read(&dest, &format!("layer{i}")),
            format!("content of layer {i}\n")
        );
    }
    assert_eq!(read(&dest, "last"), "2", "the last layer wins");
    let codecs: Vec<_> = report.layers.iter().map(|l| l.codec.as_str()).collect();
    assert_eq!(codecs, ["gzip", "zstd", "identity"]);
    let media_types: Vec<_> = report
        .layers
        .iter()
        .map(|l| l.media_type.as_str())
        .collect();
    assert_eq!(
        media_types,
        [
            media_type::OCI_LAYER_GZIP,
            media_type::OCI_LAYER_ZSTD,
            media_type::OCI_LAYER_TAR
        ]
    );
    assert_eq!(report.manifest_digest.as_str(), image.manifest.digest);
    assert_eq!(
        report.compressed_bytes,
        image.layers.iter().map(|l| l.size).sum::<u64>()
    );
    // Each tar is two entries of one header and one data block, then the two end-of-archive
    // blocks: 6 * 512 bytes, all of which go through the decoder.
    for layer in &report.layers {
        assert_eq!(
            (layer.uncompressed_bytes, layer.entries),
            (3072, 2),
            "{report:#?}"
        );
    }
    assert!(any_staging_left(env.tmp.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_schema2_manifest_with_docker_layer_types() {
    let env = Env::start();
    let image = layered(
        ManifestFormat::Docker,
        &[Compression::Gzip, Compression::None, Compression::Zstd],
    );
    let manifest = String::from_utf8(image.manifest.bytes.to_vec()).unwrap();
    assert!(manifest.contains(media_type::DOCKER_MANIFEST), "{manifest}");
    let reference = env.push(&image, "formats/docker:v1").await;
    let dest = env.dest("rootfs");
    let report = env
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));

    assert_eq!(read(&dest, "layer0"), "content of layer 0\n");
    assert_eq!(read(&dest, "layer1"), "content of layer 1\n");
    assert_eq!(read(&dest, "layer2"), "content of layer 2\n");
    assert_eq!(read(&dest, "last"), "2");
    let media_types: Vec<_> = report
        .layers
        .iter()
        .map(|l| l.media_type.as_str())
        .collect();
    assert_eq!(
        media_types,
        [
            media_type::DOCKER_LAYER_GZIP,
            media_type::DOCKER_LAYER_TAR,
            media_type::OCI_LAYER_ZSTD
        ]
    );
    let codecs: Vec<_> = report.layers.iter().map(|l| l.codec.as_str()).collect();
    assert_eq!(codecs, ["gzip", "identity", "zstd"]);
}

/// A layer whose media type says one codec while its bytes are another: the magic bytes win,
/// as with docker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_media_type_that_lies_still_pulls() {
    let env = Env::start();
    let cases = [
        (media_type::OCI_LAYER_GZIP, Compression::Zstd, "zstd"),
        (media_type::OCI_LAYER_GZIP, Compression::None, "identity"),
        (media_type::DOCKER_LAYER_GZIP, Compression::None, "identity"),
        (media_type::OCI_LAYER_TAR, Compression::Gzip, "gzip"),
        (media_type::OCI_LAYER_ZSTD, Compression::Gzip, "gzip"),
    ];
    for (i, (declared, actual, codec)) in cases.into_iter().enumerate() {
        let tar = LayerBuilder::new()
            .dir("etc", 0o755)
            .file("etc/case", format!("case {i}\n"), 0o600)
            .build();
        let mut layer = ImageLayer::from_tar(&tar, actual);
        layer.media_type = declared.to_owned();
        let image = ImageBuilder::new().image_layer(layer).build();
        let reference = env.push(&image, &format!("formats/lying:{i}")).await;
        let dest = env.dest(&format!("rootfs{i}"));
        let report = env
            .pull(&reference, &dest)
            .await
            .unwrap_or_else(|e| panic!("declared {declared}, bytes {actual:?}: {}", chain(&e)));
        assert_eq!(read(&dest, "etc/case"), format!("case {i}\n"));
        assert_eq!(report.layers[0].media_type, declared);
        assert_eq!(
            report.layers[0].codec, codec,
            "declared {declared}, bytes {actual:?}"
        );
    }
}

fn platform_image(
    format: ManifestFormat,
    platform: rpull_testing::Platform,
    marker: &str,
) -> Image {
    ImageBuilder::new()
        .format(format)
        .platform(platform)
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/arch", marker, 0o644),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new().file(&format!("only-on-{marker}"), marker, 0o755),
            Compression::Gzip,
        )
        .build()
}

async fn index_selects_each_platform(format: ManifestFormat) {
    let env = Env::start();
    let amd64 = platform_image(format, rpull_testing::Platform::linux_amd64(), "amd64");
    let arm64 = platform_image(format, rpull_testing::Platform::linux_arm64(), "arm64");
    let index = IndexBuilder::new(format)
        .image(amd64.clone())
        .image(arm64.clone())
        .build();
    env.registry
        .push_index(&index, "formats/multi:v1")
        .await
        .expect("pushing the index");
    let reference = env.reference("formats/multi:v1");

    for (platform, marker, image) in [
        (Platform::new("linux", "amd64", None), "amd64", &amd64),
        (Platform::new("linux", "arm64", Some("v8")), "arm64", &arm64),
        // containerd's normalisation: linux/arm64 is linux/arm64/v8.
        (Platform::new("linux", "arm64", None), "arm64", &arm64),
    ] {
        let dest = env.dest(&format!("rootfs-{platform}").replace('/', "-"));
        let options = PullOptions {
            platform: platform.clone(),
            ..PullOptions::default()
        };
        let report = env
            .puller(options)
            .pull(&reference, &dest)
            .await
            .unwrap_or_else(|e| panic!("{platform}: {}", chain(&e)));
        assert_eq!(
            paths(&snapshot(&dest)),
            ["etc", "etc/arch", &format!("only-on-{marker}")]
        );
        assert_eq!(read(&dest, "etc/arch"), marker);
        assert_eq!(
            report.manifest_digest.as_str(),
            image.manifest.digest,
            "{platform}"
        );
        assert!(
            report.platform.starts_with(&format!("linux/{marker}")),
            "{}",
            report.platform
        );
    }

    let dest = env.dest("rootfs-s390x");
    let options = PullOptions {
        platform: Platform::new("linux", "s390x", None),
        ..PullOptions::default()
    };
    let error = env
        .puller(options)
        .pull(&reference, &dest)
        .await
        .expect_err("no linux/s390x image");
    let message = chain(&error);
    assert!(matches!(error, PullError::Registry(_)), "{error:?}");
    for expected in ["linux/s390x", "linux/amd64", "linux/arm64/v8"] {
        assert!(
            message.contains(expected),
            "{expected:?} missing from: {message}"
        );
    }
    assert_nothing_committed(&dest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_index_selects_platform() {
    index_selects_each_platform(ManifestFormat::Oci).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_manifest_list_selects_platform() {
    index_selects_each_platform(ManifestFormat::Docker).await;
}

fn marker_image(marker: &str) -> Image {
    ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("marker", marker, 0o644),
            Compression::Gzip,
        )
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_tag_by_digest_and_by_tag_with_digest() {
    let env = Env::start();
    let first = marker_image("first");
    let second = marker_image("second");
    let first_digest = env
        .registry
        .push_image(&first, "formats/refs:v1")
        .await
        .unwrap();
    // The tag moves to the second image; the first stays reachable by digest.
    env.registry
        .push_image(&second, "formats/refs:v1")
        .await
        .unwrap();
    let host = env.registry.host();

    let cases = [
        (format!("{host}/formats/refs:v1"), "second", &second),
        (
            format!("{host}/formats/refs@{first_digest}"),
            "first",
            &first,
        ),
        // The digest wins over the tag, which now names the second image.
        (
            format!("{host}/formats/refs:v1@{first_digest}"),
            "first",
            &first,
        ),
    ];
    for (i, (text, marker, image)) in cases.iter().enumerate() {
        let reference: Reference = text.parse().unwrap();
        let dest = env.dest(&format!("rootfs{i}"));
        let report = env
            .pull(&reference, &dest)
            .await
            .unwrap_or_else(|e| panic!("{text}: {}", chain(&e)));
        assert_eq!(read(&dest, "marker"), *marker, "{text}");
        assert_eq!(
            report.manifest_digest.as_str(),
            image.manifest.digest,
            "{text}"
        );
    }

    // A digest that the repository does not have fails even though the tag exists.
    let missing = sha256_digest(b"no such manifest");
    let reference: Reference = format!("{host}/formats/refs:v1@{missing}").parse().unwrap();
    let dest = env.dest("missing");
    let error = env
        .pull(&reference, &dest)
        .await
        .expect_err("unknown digest");
    assert!(matches!(error, PullError::Registry(_)), "{error:?}");
    assert!(chain(&error).contains(&missing), "{}", chain(&error));
    assert_nothing_committed(&dest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_layer_media_type_is_refused_before_writing() {
    let env = Env::start();
    const UNKNOWN: &str = "application/vnd.example.layer.v1.tar+lz4";
    let mut layer = ImageLayer::from_tar(
        &LayerBuilder::new().file("b", "b", 0o644).build(),
        Compression::Gzip,
    );
    layer.media_type = UNKNOWN.to_owned();
    let image = ImageBuilder::new()
        .layer(LayerBuilder::new().file("a", "a", 0o644), Compression::Gzip)
        .image_layer(layer)
        .build();
    let reference = env.push(&image, "formats/unknown:v1").await;
    let dest = env.dest("rootfs");
    let error = env
        .pull(&reference, &dest)
        .await
        .expect_err("unknown media type");
    let message = chain(&error);
    match &error {
        PullError::UnsupportedLayer { index, digest, .. } => {
            assert_eq!(*index, 1);
            assert_eq!(digest.as_str(), image.layers[1].digest);
        }
        other => panic!("expected UnsupportedLayer, got {other:?}"),
    }
    assert!(message.contains(UNKNOWN), "{message}");
    assert!(message.contains(&image.layers[1].digest), "{message}");
    assert_nothing_committed(&dest);
    assert!(any_staging_left(env.tmp.path()).is_empty());
    assert_eq!(
        std::fs::read_dir(env.tmp.path()).unwrap().count(),
        0,
        "nothing written at all"
    );
}

fn sha512_layer(tar: &[u8], compression: Compression) -> ImageLayer {
    let bytes = compression.compress(tar);
    let mut hasher = Hasher::new(DigestAlgorithm::Sha512);
    hasher.update(&bytes);
    ImageLayer {
        digest: hasher.finish().to_string(),
        diff_id: sha256_digest(tar),
        size: bytes.len() as u64,
        compression,
        media_type: String::new(),
        data: LayerData::Memory(bytes.into()),
    }
}

/// docker-registry 2.8 accepts sha512 blobs (it stores them under their canonical sha256 and
/// links the sha512 name), so the sha512 path is tested end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha512_layer_digest() {
    let env = Env::start();
    let layer = sha512_layer(
        &LayerBuilder::new()
            .file("hashed", "with sha512\n", 0o644)
            .build(),
        Compression::Gzip,
    );
    assert!(layer.digest.starts_with("sha512:"));
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("plain", "with sha256\n", 0o644),
            Compression::Gzip,
        )
        .image_layer(layer.clone())
        .build();
    let reference = env.push(&image, "formats/sha512:v1").await;
    let dest = env.dest("rootfs");
    let report = env
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(read(&dest, "hashed"), "with sha512\n");
    assert_eq!(read(&dest, "plain"), "with sha256\n");
    assert_eq!(report.layers[1].digest.as_str(), layer.digest);
    assert_eq!(report.layers[1].digest.algorithm(), DigestAlgorithm::Sha512);
}

/// Layers with no entries at all (only the end-of-archive blocks), in every codec, between
/// layers that do have entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_layers() {
    let env = Env::start();
    let empty = LayerBuilder::new().build();
    assert!(
        empty.iter().all(|&b| b == 0),
        "an empty tar is only zero blocks"
    );
    let image = ImageBuilder::new()
        .layer_tar(&empty, Compression::Gzip)
        .layer(LayerBuilder::new().file("a", "a", 0o644), Compression::Gzip)
        .layer_tar(&empty, Compression::Zstd)
        .layer_tar(&empty, Compression::None)
        .layer(LayerBuilder::new().file("b", "b", 0o644), Compression::None)
        .layer_tar(&empty, Compression::Gzip)
        .build();
    let dest = env
        .push_and_pull(&image, "formats/empty:v1", "rootfs")
        .await;
    assert_eq!(paths(&snapshot(&dest)), ["a", "b"]);
    assert_eq!(read(&dest, "a"), "a");
}

/// An image with no layers at all (docker accepts it, e.g. `FROM scratch` with only metadata):
/// the root filesystem is an empty directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_layers_give_an_empty_root() {
    let env = Env::start();
    let image = ImageBuilder::new().build();
    assert!(image.layers.is_empty());
    let reference = env.push(&image, "formats/scratch:v1").await;
    let dest = env.dest("rootfs");
    let report = env
        .pull(&reference, &dest)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert!(dest.is_dir(), "an empty root is still committed");
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);
    assert!(report.layers.is_empty());
    assert_eq!(report.compressed_bytes, 0);
    assert!(any_staging_left(env.tmp.path()).is_empty());
}
