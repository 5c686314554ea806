//! What a pull prints (`--json`, `--quiet`, plain lines, `-v`), its errors, and the flags that
//! change what is pulled or where (`--force`, `--platform`, `--no-chown`,
//! `--max-concurrent-downloads`).

use rpull_testing::{
    Compression, ImageBuilder, IndexBuilder, LayerBuilder, ManifestFormat, Platform,
    RegistryOptions, TestRegistry,
};
use serde_json::Value;

use crate::common::{Sandbox, assert_small_image, block_on, registry_with_small_image};

fn plain_registry() -> TestRegistry {
    TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry")
}

/// Three layers in three codecs; returns the image with each layer's tar size and entry count.
fn three_layer_image() -> (rpull_testing::Image, Vec<(u64, u64)>) {
    let layers = [
        (
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/a", "a\n", 0o644)
                .file("etc/b", vec![7u8; 300_000], 0o644),
            Compression::Gzip,
            3,
        ),
        (
            LayerBuilder::new()
                .file("etc/c", "c\n", 0o644)
                .whiteout("etc/a"),
            Compression::Zstd,
            2,
        ),
        (
            LayerBuilder::new().symlink("link", "etc/c"),
            Compression::None,
            1,
        ),
    ];
    let mut builder = ImageBuilder::new();
    let mut expected = Vec::new();
    for (layer, compression, entries) in layers {
        let tar = layer.build();
        expected.push((tar.len() as u64, entries));
        builder = builder.layer_tar(&tar, compression);
    }
    (builder.build(), expected)
}

fn parse_json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| {
            let value: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            assert!(value.is_object(), "not an object: {line}");
            assert!(value["event"].is_string(), "no \"event\" field: {line}");
            value
        })
        .collect()
}

const STATES: [&str; 5] = ["waiting", "downloading", "verified", "extracted", "merged"];

#[test]
fn json_events_and_summary() {
    let registry = plain_registry();
    let (image, expected) = three_layer_image();
    let manifest_digest = block_on(registry.push_image(&image, "app:1")).expect("push");
    let reference = registry.reference("app:1");
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .arg("pull")
        .arg("--json")
        .arg(&reference)
        .arg(&dest)
        .run();
    outcome.success();
    assert_eq!(
        outcome.stderr, "",
        "--json prints nothing on stderr on success\n{outcome}"
    );
    let events = parse_json_lines(&outcome.stdout);
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();

    // resolved first, with the manifest and every layer.
    let resolved = &events[0];
    assert_eq!(names[0], "resolved", "{outcome}");
    assert_eq!(resolved["reference"], reference.as_str());
    assert_eq!(
        resolved["manifest_digest"],
        manifest_digest.to_string().as_str()
    );
    let layers: Vec<Value> = image
        .layers
        .iter()
        .map(|l| serde_json::json!([l.digest, l.size]))
        .collect();
    assert_eq!(resolved["layers"], Value::Array(layers), "{outcome}");
    assert_eq!(names.iter().filter(|n| **n == "resolved").count(), 1);

    // Per layer: states in pipeline order, ending merged; progress up to the full size.
    let committed = names
        .iter()
        .position(|n| *n == "committed")
        .expect("a committed event");
    for (index, layer) in image.layers.iter().enumerate() {
        let states: Vec<&str> = events
            .iter()
            .filter(|e| e["event"] == "layer_state" && e["index"] == index)
            .inspect(|e| assert_eq!(e["digest"], layer.digest.as_str()))
            .map(|e| e["state"].as_str().expect("state is a string"))
            .collect();
        let ranks: Vec<usize> = states
            .iter()
            .map(|s| {
                STATES
                    .iter()
                    .position(|k| k == s)
                    .unwrap_or_else(|| panic!("unknown state {s}"))
            })
            .collect();
        assert!(
            ranks.is_sorted(),
            "layer {index} states out of order: {states:?}"
        );
        for required in ["downloading", "verified", "merged"] {
            assert!(
                states.contains(&required),
                "layer {index}: no {required} in {states:?}"
            );
        }
        assert_eq!(states.last(), Some(&"merged"), "layer {index}");
        let progress: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "layer_progress" && e["index"] == index)
            .collect();
        assert!(!progress.is_empty(), "layer {index}: no layer_progress");
        for p in &progress {
            assert_eq!(p["total"], layer.size, "{p}");
            assert!(p["downloaded"].as_u64().unwrap() <= layer.size, "{p}");
        }
        assert_eq!(progress.last().unwrap()["downloaded"], layer.size);
    }
    // Merges happen in layer order, all before the commit.
    let merged: Vec<(usize, u64)> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| events[*i]["event"] == "layer_state" && events[*i]["state"] == "merged")
        .map(|(i, _)| (i, events[i]["index"].as_u64().unwrap()))
        .collect();
    assert_eq!(merged.iter().map(|m| m.1).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(merged.iter().all(|(i, _)| *i < committed));
    assert_eq!(
        events[committed]["path"],
        dest.display().to_string().as_str()
    );

    // The summary is the last line and says what was pulled.
    assert_eq!(names.last(), Some(&"summary"), "{outcome}");
    assert_eq!(
        committed,
        names.len() - 2,
        "committed comes right before the summary"
    );
    let summary = events.last().unwrap();
    assert_eq!(summary["reference"], reference.as_str());
    assert_eq!(
        summary["manifest_digest"],
        manifest_digest.to_string().as_str()
    );
    let pushed: u64 = image.layers.iter().map(|l| l.size).sum();
    assert_eq!(summary["compressed_bytes"], pushed);
    let tar_total: u64 = expected.iter().map(|(size, _)| size).sum();
    assert_eq!(summary["uncompressed_bytes"], tar_total);
    let reported = summary["layers"].as_array().expect("layers is an array");
    assert_eq!(reported.len(), 3);
    for ((report, layer), (tar_size, entries)) in reported.iter().zip(&image.layers).zip(&expected)
    {
        assert_eq!(report["digest"], layer.digest.as_str(), "{report}");
        assert_eq!(report["compressed_bytes"], layer.size, "{report}");
        assert_eq!(report["uncompressed_bytes"], *tar_size, "{report}");
        assert_eq!(report["entries"], *entries, "{report}");
    }
    let codecs: Vec<&str> = reported
        .iter()
        .map(|r| r["codec"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(codecs.len(), 3, "{codecs:?}");

    // And the tree is right: whiteout applied, symlink in place.
    assert!(!dest.join("etc/a").exists());
    assert_eq!(std::fs::read_to_string(dest.join("etc/c")).unwrap(), "c\n");
    assert_eq!(
        std::fs::read_link(dest.join("link")).unwrap(),
        std::path::Path::new("etc/c")
    );
}

#[test]
fn quiet_prints_nothing_on_success() {
    let (_registry, reference) = registry_with_small_image(plain_registry());
    for flag in ["--quiet", "-q"] {
        let sandbox = Sandbox::new();
        let dest = sandbox.join("rootfs");
        let outcome = sandbox
            .rpull()
            .arg("pull")
            .arg(flag)
            .arg(&reference)
            .arg(&dest)
            .run();
        outcome.success();
        assert_eq!(outcome.stdout, "", "{outcome}");
        assert_eq!(outcome.stderr, "", "{outcome}");
        assert_small_image(&dest);
    }
}

#[test]
fn quiet_and_json_conflict() {
    let sandbox = Sandbox::new();
    let outcome = sandbox
        .rpull()
        .args(["pull", "--quiet", "--json", "r/x:1", "d"])
        .run();
    assert_eq!(outcome.code, Some(2), "{outcome}");
}

#[test]
fn plain_output_progress_on_stderr_summary_on_stdout() {
    let (_registry, reference) = registry_with_small_image(plain_registry());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox.rpull().pull(&reference, &dest);
    outcome.success();
    let stdout: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(stdout.len(), 1, "one summary line\n{outcome}");
    assert!(
        stdout[0].starts_with(&format!("Pulled {reference} (sha256:")),
        "{outcome}"
    );
    assert!(stdout[0].contains(&dest.display().to_string()), "{outcome}");
    assert!(stdout[0].contains("2 layers"), "{outcome}");
    let stderr = &outcome.stderr;
    assert!(
        stderr
            .lines()
            .next()
            .is_some_and(|l| l.starts_with(&format!("{reference}: resolved sha256:"))),
        "{outcome}"
    );
    for layer in 1..=2 {
        assert!(
            stderr.contains(&format!("layer {layer}/2 sha256:")),
            "{outcome}"
        );
    }
    assert!(stderr.contains(": done"), "{outcome}");
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("committed ")),
        "{outcome}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no terminal escapes when not a terminal\n{outcome}"
    );
}

#[test]
fn verbose_logs_go_to_stderr_and_rust_log_overrides() {
    let (_registry, reference) = registry_with_small_image(plain_registry());
    let sandbox = Sandbox::new();
    let debug_lines = |text: &str| text.lines().filter(|l| l.contains("DEBUG")).count();

    let quiet = sandbox
        .rpull()
        .arg("--json")
        .pull(&reference, &sandbox.join("a"));
    quiet.success();
    assert_eq!(debug_lines(&quiet.stderr), 0, "{quiet}");

    let verbose = sandbox
        .rpull()
        .args(["pull", "-v", "--json"])
        .arg(&reference)
        .arg(sandbox.join("b"))
        .run();
    verbose.success();
    assert!(
        debug_lines(&verbose.stderr) > 0,
        "-v logs debug lines\n{verbose}"
    );
    assert!(
        !verbose.stderr.contains('\u{1b}'),
        "no colours when stderr is not a terminal\n{verbose}"
    );
    parse_json_lines(&verbose.stdout); // logs never reach stdout

    let very = sandbox
        .rpull()
        .args(["-vv", "pull", "--json"])
        .arg(&reference)
        .arg(sandbox.join("c"))
        .run();
    very.success();
    assert!(debug_lines(&very.stderr) > 0, "{very}");
    parse_json_lines(&very.stdout);

    let overridden = sandbox
        .rpull()
        .env("RUST_LOG", "off")
        .args(["-vv", "pull", "--json"])
        .arg(&reference)
        .arg(sandbox.join("d"))
        .run();
    overridden.success();
    assert_eq!(
        overridden.stderr, "",
        "RUST_LOG=off wins over -vv\n{overridden}"
    );
    // -vv adds the HTTP stack's debug logs (rpull itself has no trace-level events yet).
    assert!(
        very.stderr.lines().count() > verbose.stderr.lines().count(),
        "-vv logs more than -v\n{very}\n{verbose}"
    );

    // RUST_LOG can also turn logs on without -v.
    let by_env = sandbox
        .rpull()
        .env("RUST_LOG", "rpull_registry=debug")
        .args(["pull", "--json"])
        .arg(&reference)
        .arg(sandbox.join("e"))
        .run();
    by_env.success();
    assert!(debug_lines(&by_env.stderr) > 0, "{by_env}");
}

#[test]
fn invalid_reference_is_one_error_line() {
    let sandbox = Sandbox::new();
    let dest = sandbox.join("d");
    let outcome = sandbox.rpull().pull("UPPER/Case:bad tag!", &dest);
    let line = outcome.error_line();
    assert!(
        line.contains("UPPER/Case:bad tag!"),
        "names the reference\n{outcome}"
    );
    assert!(!dest.exists());
}

#[test]
fn missing_tag_is_one_error_line() {
    let (registry, _) = registry_with_small_image(plain_registry());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("d");
    let reference = registry.reference("app:nope");
    let outcome = sandbox.rpull().pull(&reference, &dest);
    let line = outcome.error_line();
    assert!(line.contains(&reference), "names the reference\n{outcome}");
    assert!(line.contains("not found"), "{outcome}");
    assert!(!dest.exists());
    assert!(sandbox.staging_dirs(&dest).is_empty());
}

#[test]
fn unreachable_registry_is_one_error_line() {
    let port = rpull_testing::free_port().expect("a free port");
    let sandbox = Sandbox::new();
    let reference = format!("127.0.0.1:{port}/app:1");
    let outcome = sandbox
        .rpull()
        .args(["pull", "--plain-http"])
        .arg(&reference)
        .arg(sandbox.join("d"))
        .run();
    let line = outcome.error_line();
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{outcome}");
}

#[test]
fn non_empty_destination_is_refused_before_fetching() {
    let sandbox = Sandbox::new();
    let dest = sandbox.join("occupied");
    sandbox.write("occupied/keep", "mine\n");
    // Nothing listens on this port: a pull that fetched first would fail differently.
    let port = rpull_testing::free_port().expect("a free port");
    let outcome = sandbox
        .rpull()
        .pull(&format!("127.0.0.1:{port}/app:1"), &dest);
    let line = outcome.error_line();
    assert!(line.contains("--force"), "{outcome}");
    assert!(line.contains(&dest.display().to_string()), "{outcome}");
    assert_eq!(
        std::fs::read_to_string(dest.join("keep")).unwrap(),
        "mine\n"
    );
    assert!(sandbox.staging_dirs(&dest).is_empty());
    // A file in the way is refused the same way.
    let file = sandbox.write("a-file", "x");
    let outcome = sandbox
        .rpull()
        .pull(&format!("127.0.0.1:{port}/app:1"), &file);
    assert!(outcome.error_line().contains("--force"), "{outcome}");
}

#[test]
fn force_replaces_and_empty_destination_is_fine() {
    let (_registry, reference) = registry_with_small_image(plain_registry());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("occupied");
    sandbox.write("occupied/old/file", "old\n");
    sandbox
        .rpull()
        .args(["pull", "--force"])
        .arg(&reference)
        .arg(&dest)
        .run()
        .success();
    assert_small_image(&dest);
    assert!(!dest.join("old").exists(), "the old content is gone");
    assert!(sandbox.staging_dirs(&dest).is_empty());

    let empty = sandbox.join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    sandbox.rpull().pull(&reference, &empty).success();
    assert_small_image(&empty);
}

fn arch_image(format: ManifestFormat, platform: Platform, arch: &str) -> rpull_testing::Image {
    ImageBuilder::new()
        .format(format)
        .platform(platform)
        .layer(
            LayerBuilder::new().file("arch", arch, 0o644),
            Compression::Gzip,
        )
        .build()
}

#[test]
fn platform_selects_from_an_index() {
    let registry = plain_registry();
    for format in [ManifestFormat::Oci, ManifestFormat::Docker] {
        let index = IndexBuilder::new(format)
            .image(arch_image(format, Platform::linux_amd64(), "amd64"))
            .image(arch_image(format, Platform::linux_arm64(), "arm64"))
            .build();
        block_on(registry.push_index(&index, "multi:1")).expect("push index");
        let reference = registry.reference("multi:1");
        let sandbox = Sandbox::new();
        for (platform, arch) in [
            ("linux/arm64", "arm64"),
            ("linux/arm64/v8", "arm64"),
            ("linux/amd64", "amd64"),
        ] {
            let dest = sandbox.join(&format!("rootfs-{}", platform.replace('/', "-")));
            let outcome = sandbox
                .rpull()
                .args(["pull", "--json", "--platform", platform])
                .arg(&reference)
                .arg(&dest)
                .run();
            outcome.success();
            assert_eq!(
                std::fs::read_to_string(dest.join("arch")).unwrap(),
                arch,
                "{format:?} {platform}"
            );
            let summary: Value =
                serde_json::from_str(outcome.stdout.lines().last().unwrap()).unwrap();
            assert!(
                summary["platform"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("linux/{arch}")),
                "{summary}"
            );
        }
        // Not in the index: an error naming the platform.
        let outcome = sandbox
            .rpull()
            .args(["pull", "--platform", "linux/s390x"])
            .arg(&reference)
            .arg(sandbox.join("none"))
            .run();
        assert!(outcome.error_line().contains("linux/s390x"), "{outcome}");
    }
}

#[test]
fn garbage_platform_is_a_clear_error() {
    let sandbox = Sandbox::new();
    let dest = sandbox.join("d");
    let outcome = sandbox
        .rpull()
        .args(["pull", "--platform", "garbage", "127.0.0.1:1/app:1"])
        .arg(&dest)
        .run();
    let line = outcome.error_line();
    assert!(line.contains("--platform"), "{outcome}");
    assert!(line.contains("garbage"), "{outcome}");
    assert!(line.contains("os/arch"), "says what is expected\n{outcome}");
}

#[test]
fn max_concurrent_downloads_bounds_downloads_in_flight() {
    let registry = plain_registry();
    let (image, _) = three_layer_image();
    block_on(registry.push_image(&image, "app:1")).expect("push");
    let reference = registry.reference("app:1");
    let sandbox = Sandbox::new();
    let dest = sandbox.join("one");
    let outcome = sandbox
        .rpull()
        .args(["pull", "--json", "--max-concurrent-downloads", "1"])
        .arg(&reference)
        .arg(&dest)
        .run();
    outcome.success();
    // With one slot, a layer starts downloading only after the previous download was verified.
    let mut in_flight = 0i32;
    for event in parse_json_lines(&outcome.stdout) {
        match event["state"].as_str() {
            Some("downloading") => in_flight += 1,
            Some("verified") => in_flight -= 1,
            _ => {}
        }
        assert!(
            in_flight <= 1,
            "two downloads at once with --max-concurrent-downloads 1: {event}"
        );
    }

    let outcome = sandbox
        .rpull()
        .args(["pull", "--max-concurrent-downloads", "0"])
        .arg(&reference)
        .arg(sandbox.join("zero"))
        .run();
    assert!(
        outcome.error_line().contains("--max-concurrent-downloads"),
        "{outcome}"
    );
}

#[test]
fn digest_references_and_digest_wins_over_tag() {
    let registry = plain_registry();
    let digest =
        block_on(registry.push_image(&crate::common::small_image(), "app:1")).expect("push");
    let sandbox = Sandbox::new();
    for reference in [
        format!("{}/app@{digest}", registry.host()),
        format!("{}/app:no-such-tag@{digest}", registry.host()),
    ] {
        let dest = sandbox.join(&format!("rootfs-{}", reference.len()));
        let outcome = sandbox.rpull().arg("--json").pull(&reference, &dest);
        outcome.success();
        assert_small_image(&dest);
        let summary: Value =
            serde_json::from_str(outcome.stdout.lines().last().expect("a summary")).expect("JSON");
        assert_eq!(
            summary["manifest_digest"],
            digest.to_string().as_str(),
            "{outcome}"
        );
    }
}

#[test]
fn write_threads_give_the_same_tree_and_zero_is_refused() {
    let registry = plain_registry();
    let mut layer = LayerBuilder::new().dir("many", 0o755);
    for index in 0..500 {
        let dir = format!("many/d{}", index % 7);
        layer = layer.file(
            &format!("{dir}/f{index}"),
            format!("{index}\n").repeat(index % 50 + 1),
            0o644,
        );
    }
    let layer = layer
        .file("many/d3/f10", "replaced later in the layer\n", 0o600)
        .hardlink("many/link", "many/d0/f7");
    let image = ImageBuilder::new()
        .layer_tar(&layer.build(), Compression::Gzip)
        .build();
    block_on(registry.push_image(&image, "many:1")).expect("push");
    let reference = registry.reference("many:1");
    let sandbox = Sandbox::new();
    let mut trees = Vec::new();
    for threads in ["1", "4"] {
        let dest = sandbox.join(&format!("threads-{threads}"));
        sandbox
            .rpull()
            .args(["pull", "--quiet", "--write-threads", threads])
            .arg(&reference)
            .arg(&dest)
            .run()
            .success();
        trees.push(rpull_testing::TreeSnapshot::capture(&dest).expect("snapshot"));
    }
    assert!(
        trees[0].entries.len() > 500,
        "{} entries",
        trees[0].entries.len()
    );
    rpull_testing::assert_trees_equal(&trees[0], &trees[1], &rpull_testing::DiffOptions::default());

    let outcome = sandbox
        .rpull()
        .args(["pull", "--write-threads", "0"])
        .arg(&reference)
        .arg(sandbox.join("zero"))
        .run();
    assert!(
        outcome.error_line().contains("--write-threads"),
        "{outcome}"
    );
}
