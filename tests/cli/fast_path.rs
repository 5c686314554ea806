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
    assert!(!dest.exists());
}
