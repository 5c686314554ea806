//! The fast-path flags change how a pull runs, not what it produces: `--io`, `--fsync`,
//! `--chunk-size`, `--connections-per-blob`.

use rpull_testing::{RegistryOptions, TestRegistry, TreeSnapshot, assert_trees_equal};

use crate::common::{Sandbox, assert_small_image, registry_with_small_image};

#[test]
fn every_io_fsync_and_chunk_combination_gives_the_same_tree() {
    let (_registry, reference) =
        registry_with_small_image(TestRegistry::start(RegistryOptions::plain()).unwrap());
    let sandbox = Sandbox::new();
    let baseline = sandbox.join("baseline");
    sandbox.rpull().pull(&reference, &baseline).success();
    let expected = TreeSnapshot::capture(&baseline).unwrap();

    let variants: &[&[&str]] = &[
        &["--io", "std", "--fsync", "none"],
        &["--io", "auto", "--fsync", "layer"],
        &["--io", "uring", "--fsync", "end"],
        &["--chunk-size", "64", "--connections-per-blob", "2"],
        &["--chunk-size", "1KiB"],
        &["--max-concurrent-extractions", "1"],
        &[
            "--max-concurrent-extractions",
            "1",
            "--max-concurrent-downloads",
            "1",
        ],
    ];
    for (i, flags) in variants.iter().enumerate() {
        let dest = sandbox.join(&format!("variant-{i}"));
        let outcome = sandbox
            .rpull()
            .args(*flags)
            .arg("-v")
            .pull(&reference, &dest);
        if flags.contains(&"uring")
            && outcome.code == Some(1)
            && outcome.stderr.contains("io_uring")
        {
            eprintln!("io_uring is not available here: {}", outcome.stderr.trim());
            continue;
        }
        outcome.success();
        assert_small_image(&dest);
        assert_trees_equal(
            &expected,
            &TreeSnapshot::capture(&dest).unwrap(),
            &Default::default(),
        );
    }
}

#[test]
fn bad_fast_path_values_are_refused() {
    let sandbox = Sandbox::new();
    let dest = sandbox.join("d");
    for flags in [
        &["--io", "mmap"][..],
        &["--fsync", "always"],
        &["--chunk-size", "8XB"],
        &["--connections-per-blob", "3"], // needs --chunk-size
        &["--max-concurrent-extractions", "two"],
    ] {
        let outcome = sandbox.rpull().args(flags).pull("127.0.0.1:1/x:y", &dest);
        assert_eq!(outcome.code, Some(2), "clap refuses {flags:?}\n{outcome}");
    }
    let outcome = sandbox
        .rpull()
        .args(["--chunk-size", "1MiB", "--connections-per-blob", "0"])
        .pull("127.0.0.1:1/x:y", &dest);
    assert!(
        outcome.error_line().contains("--connections-per-blob"),
        "{outcome}"
    );
    let outcome = sandbox
        .rpull()
        .args(["--max-concurrent-extractions", "0"])
        .pull("127.0.0.1:1/x:y", &dest);
    assert!(
        outcome
            .error_line()
            .contains("--max-concurrent-extractions"),
        "{outcome}"
    );
    assert!(!dest.exists());
}

/// A durable pull writes back while it extracts: a `syncfs` after each 64 MiB extracted, before
/// the final one. `--fsync none` leaves all of it to the kernel.
#[test]
fn a_durable_pull_writes_back_while_it_extracts() {
    use rpull_testing::{Compression, ImageBuilder, LayerBuilder, random_bytes};

    let registry = TestRegistry::start(RegistryOptions::plain()).unwrap();
    // 160 MiB of tar in two layers: two complete steps at least.
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("a/big", random_bytes(96 << 20, 3), 0o644),
            Compression::None,
        )
        .layer(
            LayerBuilder::new().file("b/big", random_bytes(64 << 20, 4), 0o644),
            Compression::None,
        )
        .build();
    crate::common::block_on(registry.push_image(&image, "wb:1")).expect("push");
    drop(image);
    let reference = registry.reference("wb:1");

    let sandbox = Sandbox::new();
    let durable = sandbox.join("durable");
    let outcome = sandbox
        .rpull()
        .args(["--fsync", "end", "-v"])
        .pull(&reference, &durable);
    outcome.success();
    let line = outcome
        .stderr
        .lines()
        .find(|l| l.contains("write-back finished"))
        .unwrap_or_else(|| panic!("no write-back line\n{outcome}"));
    let syncs: u64 = line
        .split("early_syncs=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    // Two complete steps; steps that complete while a sync runs are written back by the next
    // one, so a slow disk may see one sync. Never more than one per step.
    assert!(
        (1..=2).contains(&syncs),
        "160 MiB extracted: 1 or 2 early syncs expected, got {syncs}"
    );
    assert_eq!(
        std::fs::metadata(durable.join("b/big")).unwrap().len(),
        64 << 20
    );

    let loose = sandbox.join("loose");
    let outcome = sandbox
        .rpull()
        .args(["--fsync", "none", "-v"])
        .pull(&reference, &loose);
    outcome.success();
    assert!(
        !outcome.stderr.contains("write-back finished"),
        "--fsync none has no write-back\n{outcome}"
    );
}
