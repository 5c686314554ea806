//! `generate` against a real registry: a from-dir image and the 10MB Spegel set are pushed, then
//! pulled back with rpull and compared with what went in.

use std::path::Path;

use rpull::{Puller, Reference};
use rpull_bench::generate::{GenerateOptions, SpegelSize, generate};
use rpull_testing::{RegistryOptions, TestRegistry};

async fn pull(registry: &TestRegistry, reference: &str, dest: &Path) {
    let puller = Puller::builder()
        .client(registry.client().unwrap())
        .build()
        .unwrap();
    let reference: Reference = reference.parse().unwrap();
    puller
        .pull(&reference, dest)
        .await
        .unwrap_or_else(|e| panic!("pulling {reference}: {e:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_dir_one_layer_per_top_level_directory_and_split() {
    let registry = TestRegistry::start(RegistryOptions::plain()).unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("1-base/etc")).unwrap();
    std::fs::write(src.path().join("1-base/etc/os-release"), "base\n").unwrap();
    std::fs::write(src.path().join("1-base/etc/motd"), "old\n").unwrap();
    std::fs::create_dir_all(src.path().join("2-app/etc")).unwrap();
    std::fs::write(src.path().join("2-app/etc/motd"), "new\n").unwrap();
    std::fs::write(src.path().join("1-base.done"), "").unwrap();
    let work = tempfile::tempdir().unwrap();

    for zstd in [false, true] {
        let mut options =
            GenerateOptions::from_dir(format!("{}/fromdir", registry.host()), src.path());
        options.tag = Some(if zstd { "zstd" } else { "gzip" }.to_owned());
        options.zstd = zstd;
        options.work_dir = Some(work.path().to_owned());
        let report = generate(&registry.client().unwrap(), &options)
            .await
            .unwrap();
        assert_eq!(report.images.len(), 1);
        let image = &report.images[0];
        assert_eq!(image.layers, 2, "{image:?}");
        assert_eq!(image.compression, if zstd { "zstd" } else { "gzip" });
        assert!(
            image.push_seconds > 0.0 && image.uploaded_bytes > 0,
            "{image:?}"
        );
        assert_eq!(image.entries, 5, "etc, os-release, motd | etc, motd");

        let dest = work.path().join(format!("rootfs-{zstd}"));
        pull(&registry, &image.reference, &dest).await;
        assert_eq!(
            std::fs::read_to_string(dest.join("etc/os-release")).unwrap(),
            "base\n"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("etc/motd")).unwrap(),
            "new\n",
            "the later layer wins"
        );
        assert!(!dest.join("1-base.done").exists() && !dest.join("1-base").exists());
    }
    // Layer files are gone once pushed.
    let left: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("rpull-generate-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // The same tree cut into 2 layers by size: one tree, same files.
    let mut options = GenerateOptions::from_dir(
        format!("{}/split", registry.host()),
        src.path().join("1-base"),
    );
    options.layers = Some(2);
    options.work_dir = Some(work.path().to_owned());
    let report = generate(&registry.client().unwrap(), &options)
        .await
        .unwrap();
    assert_eq!(report.images[0].layers, 2);
    assert!(report.images[0].reference.ends_with("/split:latest"));
    let dest = work.path().join("rootfs-split");
    pull(&registry, &report.images[0].reference, &dest).await;
    assert_eq!(
        std::fs::read_to_string(dest.join("etc/motd")).unwrap(),
        "old\n"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("etc/os-release")).unwrap(),
        "base\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spegel_10mb_set() {
    let registry = TestRegistry::start(RegistryOptions::plain()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut options = GenerateOptions::spegel(format!("{}/benchmark", registry.host()));
    options.sizes = vec![SpegelSize::Mb10];
    options.work_dir = Some(work.path().to_owned());
    let report = generate(&registry.client().unwrap(), &options)
        .await
        .unwrap();
    let tags: Vec<&str> = report
        .images
        .iter()
        .map(|i| i.reference.rsplit(':').next().unwrap())
        .collect();
    assert_eq!(tags, ["v1-10MB-1", "v1-10MB-4", "v2-10MB-1", "v2-10MB-4"]);
    for image in &report.images {
        // Random data does not compress: the blobs are about as big as the data.
        assert!(image.compressed_bytes >= 10 << 20, "{image:?}");
        assert!(image.uncompressed_bytes > 10 << 20, "{image:?}");
        assert_eq!(image.entries, 2 * image.layers as u64);
        assert!(image.push_seconds > 0.0);
    }
    // Same options, same digests (seeded); v1 and v2 differ.
    assert_ne!(report.images[0].digest, report.images[2].digest);
    let again = generate(&registry.client().unwrap(), &options)
        .await
        .unwrap();
    assert_eq!(again.images[1].digest, report.images[1].digest);
    assert_eq!(
        again.images[1].uploaded_bytes, 0,
        "every blob was already there: {:?}",
        again.images[1]
    );

    let v1 = work.path().join("v1");
    let v2 = work.path().join("v2");
    pull(&registry, &report.images[1].reference, &v1).await;
    pull(&registry, &report.images[3].reference, &v2).await;
    for i in 0..4 {
        let a = std::fs::read(v1.join(format!("data/random-{i}"))).unwrap();
        let b = std::fs::read(v2.join(format!("data/random-{i}"))).unwrap();
        assert_eq!(a.len(), (10 << 20) / 4);
        assert_ne!(a, b, "v2 has other content");
        assert_ne!(a[..4096], vec![0u8; 4096][..]);
    }
}

#[tokio::test]
async fn a_tag_in_the_target_is_refused() {
    let registry = TestRegistry::start(RegistryOptions::plain()).unwrap();
    let options = GenerateOptions::spegel(format!("{}/benchmark:v1", registry.host()));
    let err = generate(&registry.client().unwrap(), &options)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("without a tag"), "{err}");
}
