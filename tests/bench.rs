//! `rpull bench` as users run it, against a real registry: the JSON has exactly the fields
//! docs/bench-json.md documents, the CSV has its documented header, `--plot` writes an SVG naming
//! every stage, the end-to-end stage produces the tree a plain pull produces, and peers that are
//! not installed are reported, not faked. Runs are kept to one or two on tiny images; no speed is
//! asserted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rpull_testing::{
    Compression, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry, TreeSnapshot,
};
use serde_json::Value;

const STAGES: [&str; 9] = [
    "network",
    "network-ranged",
    "decompress-1core",
    "decompress-all",
    "extract-tmpfs",
    "tar-tmpfs",
    "extract-disk",
    "tar-disk",
    "end-to-end",
];

/// A registry with a two-layer image (gzip, then zstd with a whiteout) pushed as `bench:1`.
fn registry_with_image() -> (TestRegistry, String) {
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let data: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i.wrapping_mul(2_654_435_761) >> 5).to_le_bytes())
        .collect();
    let image = ImageBuilder::new()
        .layer_tar(
            &LayerBuilder::new()
                .dir("usr", 0o755)
                .file("usr/data", &data, 0o644)
                .file("usr/old", "old", 0o644)
                .symlink("usr/link", "data")
                .build(),
            Compression::Gzip,
        )
        .layer_tar(
            &LayerBuilder::new()
                .whiteout("usr/old")
                .file("etc/motd", "hi\n", 0o644)
                .build(),
            Compression::Zstd,
        )
        .build();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(registry.push_image(&image, "bench:1"))
        .expect("pushing");
    let reference = registry.reference("bench:1");
    (registry, reference)
}

/// `rpull ARGS` with PATH limited to a directory with no peer tools in it.
fn rpull(args: &[&str], empty_path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rpull"))
        .args(args)
        .env("PATH", empty_path)
        .env("HOME", empty_path)
        .env_remove("RUST_LOG")
        .output()
        .expect("running rpull")
}

fn ok_stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "rpull failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8 stdout")
}

/// `field path -> allowed JSON types` from the docs' field table.
fn documented_fields() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench-json.md"))
        .expect("reading docs/bench-json.md");
    let rows: Vec<&str> = doc
        .lines()
        .skip_while(|line| !line.starts_with("| field | type | meaning |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .collect();
    assert!(
        rows.len() > 50,
        "the field table was not found in docs/bench-json.md"
    );
    rows.iter()
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let path = cells[0].trim_matches('`').to_owned();
            let types = cells[1]
                .split(" or ")
                .map(|t| t.trim().to_owned())
                .collect();
            (path, types)
        })
        .collect()
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every field path in `value` with the types seen, and the array paths that had elements.
fn walk(
    value: &Value,
    path: &str,
    seen: &mut BTreeMap<String, BTreeSet<&'static str>>,
    filled: &mut BTreeSet<String>,
) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                seen.entry(child_path.clone())
                    .or_default()
                    .insert(json_type(child));
                walk(child, &child_path, seen, filled);
            }
        }
        Value::Array(items) => {
            if !items.is_empty() {
                filled.insert(path.to_owned());
            }
            for item in items {
                // Arrays of strings (notes) have no fields of their own.
                if item.is_object() {
                    walk(item, &format!("{path}[]"), seen, filled);
                }
            }
        }
        _ => {}
    }
}

fn type_allowed(seen: &str, allowed: &BTreeSet<String>) -> bool {
    // A JSON number that happens to be whole (0.0 is printed as 0.0, but a reader may see 0) is
    // still a number; an integer is never documented as a string.
    allowed.contains(seen) || (seen == "integer" && allowed.contains("number"))
}

#[test]
fn bench_json_matches_the_documented_schema() {
    let (_registry, reference) = registry_with_image();
    let work = tempfile::tempdir().unwrap();
    let empty_path = work.path().join("no-tools");
    std::fs::create_dir(&empty_path).unwrap();
    // No peer tools, but GNU tar for the extract stages' reference.
    let tar = rpull_bench::peers::find_executable("tar", &std::env::var_os("PATH").unwrap())
        .expect("GNU tar is installed");
    std::os::unix::fs::symlink(&tar, empty_path.join("tar")).unwrap();
    let dest = work.path().join("dest/rootfs");
    let svg = work.path().join("chart.svg");
    let output = rpull(
        &[
            "bench",
            &reference,
            "--runs",
            "2",
            "--warm",
            "--json",
            "--plain-http",
            "--dest",
            dest.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
            "--chunk-size",
            "64KiB,256KiB",
            "--concurrency",
            "1,2",
            "--clients",
            "1,3",
            "--compare",
            "skopeo,crane",
        ],
        &empty_path,
    );
    let report: Value =
        serde_json::from_str(&ok_stdout(&output)).expect("--json prints one JSON object");

    // Exactly the documented fields, with the documented types.
    let documented = documented_fields();
    let mut seen = BTreeMap::new();
    let mut filled = BTreeSet::new();
    walk(&report, "", &mut seen, &mut filled);
    for (path, types) in &seen {
        let allowed = documented
            .get(path)
            .unwrap_or_else(|| panic!("`{path}` is in the JSON but not in docs/bench-json.md"));
        for seen_type in types {
            assert!(
                type_allowed(seen_type, allowed),
                "`{path}` is {seen_type}, documented as {allowed:?}"
            );
        }
    }
    for path in documented.keys() {
        // A field of the elements of an array that is empty in this run cannot be seen.
        let in_empty_array = path
            .match_indices("[]")
            .any(|(at, _)| !filled.contains(&path[..at]));
        // Nor a field of an object that is null everywhere in this run.
        let in_null_object = path.rsplit_once('.').is_some_and(|(parent, _)| {
            !seen
                .get(parent)
                .is_some_and(|types| types.contains("object"))
        });
        if !in_empty_array && !in_null_object {
            assert!(
                seen.contains_key(path),
                "`{path}` is documented but not in the JSON"
            );
        }
    }

    // Figures consistent with what the image holds.
    assert_eq!(report["schema_version"], 1);
    assert_eq!(report["layers"], 2);
    let stages: Vec<&str> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, STAGES);
    let compressed = report["compressed_bytes"].as_u64().unwrap();
    let tar = report["uncompressed_bytes"].as_u64().unwrap();
    let entries = report["entries"].as_u64().unwrap();
    for stage in report["stages"].as_array().unwrap() {
        let samples = stage["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 2, "{stage}");
        for sample in samples {
            match stage["stage"].as_str().unwrap() {
                "decompress-1core" | "decompress-all" => {
                    assert_eq!(sample["bytes_in"].as_u64(), Some(compressed));
                    assert_eq!(sample["bytes_out"].as_u64(), Some(tar));
                }
                "extract-tmpfs" | "extract-disk" | "tar-tmpfs" | "tar-disk" => {
                    assert_eq!(sample["bytes_in"].as_u64(), Some(tar));
                    assert_eq!(sample["files"].as_u64(), Some(entries));
                    assert!(sample["sync_seconds"].is_number(), "{stage}");
                }
                "end-to-end" => {
                    assert_eq!(sample["bytes_in"].as_u64(), Some(compressed));
                    assert!(
                        sample["cpu_seconds"].as_f64().unwrap() > 0.0,
                        "the child's CPU is measured"
                    );
                    assert!(
                        sample["peak_rss_bytes"].as_u64().unwrap() > 1 << 20,
                        "the child's peak RSS is measured"
                    );
                }
                _ => assert!(
                    sample["bytes_in"].as_u64().unwrap() > compressed,
                    "network stages also fetch the config"
                ),
            }
        }
    }
    let floor = report["pipeline_floor_seconds"].as_f64().unwrap();
    assert!(floor > 0.0);
    // /proc/stat counts whole 10 ms ticks per CPU, the process's own CPU time is exact: a run's
    // machine reading can fall short of the process's by up to a tick per CPU at each end.
    let cpus = report["machine"]["cpus"].as_f64().unwrap();
    let tick_slack = 2.0 * 0.01 * cpus + 0.01;
    // The machine's CPU includes rpull's own; so its floor is never below the floor, but for
    // the ticks of the three stages it sums, divided by the cores.
    assert!(
        report["machine_floor_seconds"].as_f64().unwrap() >= floor - 3.0 * tick_slack / cpus,
        "machine floor {} against the floor {floor}",
        report["machine_floor_seconds"]
    );
    for stage in report["stages"].as_array().unwrap() {
        for sample in stage["samples"].as_array().unwrap() {
            let (own, machine) = (&sample["cpu_seconds"], &sample["machine_cpu_seconds"]);
            assert!(
                machine.as_f64().unwrap() >= own.as_f64().unwrap() - tick_slack,
                "{}: machine {machine} against own {own}",
                stage["stage"]
            );
        }
    }
    assert!(report["bounding_stage"].is_string());
    let sweeps: Vec<&str> = report["sweeps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["parameter"].as_str().unwrap())
        .collect();
    assert_eq!(sweeps, ["concurrency", "chunk-size", "clients"]);
    let clients = &report["sweeps"][2]["points"];
    assert_eq!(clients[1]["value"], 3);
    assert_eq!(clients[1]["count"], 6, "2 runs x 3 clients");

    // Peers that are not installed are reported with the reason, never with a number.
    let peers = report["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2);
    for peer in peers {
        assert!(
            peer["seconds"].is_null() && peer["samples"].as_array().unwrap().is_empty(),
            "{peer}"
        );
        assert!(
            peer["skipped"]
                .as_str()
                .is_some_and(|reason| !reason.is_empty()),
            "{peer}"
        );
    }

    // The chart: a whole SVG document naming every stage and peer.
    let chart = std::fs::read_to_string(&svg).expect("--plot wrote the file");
    assert!(
        chart.trim_start().starts_with("<svg") || chart.trim_start().starts_with("<?xml"),
        "{}",
        &chart[..100]
    );
    assert!(chart.trim_end().ends_with("</svg>"));
    assert_eq!(
        chart.matches("<text").count(),
        chart.matches("</text>").count()
    );
    for name in STAGES.iter().chain(&["skopeo", "crane", "rpull pull"]) {
        assert!(chart.contains(name), "{name} is in the chart");
    }

    // The end-to-end stage left the last pull in --dest: the same tree as a plain pull.
    let plain = work.path().join("plain");
    ok_stdout(&rpull(
        &[
            "pull",
            "--quiet",
            "--plain-http",
            &reference,
            plain.to_str().unwrap(),
        ],
        &empty_path,
    ));
    let options = rpull_testing::DiffOptions::default();
    rpull_testing::assert_trees_equal(
        &TreeSnapshot::capture(&dest).unwrap(),
        &TreeSnapshot::capture(&plain).unwrap(),
        &options,
    );
}

#[test]
fn bench_runs_every_stage_the_pull_and_the_peers_once_per_round() {
    let (_registry, reference) = registry_with_image();
    let work = tempfile::tempdir().unwrap();
    // No tools but skopeo (installed by scripts/test), the one peer that needs no daemon.
    let tools = work.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    let skopeo = rpull_bench::peers::find_executable("skopeo", &std::env::var_os("PATH").unwrap())
        .expect("skopeo is installed (scripts/test installs it)");
    std::os::unix::fs::symlink(&skopeo, tools.join("skopeo")).unwrap();
    let output = rpull(
        &[
            "bench",
            &reference,
            "-v",
            "--runs",
            "2",
            "--warm",
            "--json",
            "--plain-http",
            "--tmpfs",
            "--compare",
            "skopeo,crane",
        ],
        &tools,
    );
    let report: Value = serde_json::from_str(&ok_stdout(&output)).unwrap();
    // The progress lines, in the order the work was done.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let order: Vec<&str> = stderr
        .lines()
        .filter_map(|line| {
            [
                "round round=1",
                "round round=2",
                "stage network",
                "stage end-to-end",
                "peer skopeo",
                "peer crane",
            ]
            .into_iter()
            .find(|step| line.ends_with(step) || line.contains(&format!("{step} ")))
        })
        .collect();
    // crane is not installed: tried in the first round only.
    assert_eq!(
        order,
        [
            "round round=1",
            "stage network",
            "stage end-to-end",
            "peer skopeo",
            "peer crane",
            "round round=2",
            "stage network",
            "stage end-to-end",
            "peer skopeo",
        ],
        "{stderr}"
    );
    // Every stage has a run of each round; PATH has no tar here, so its stages have none.
    for stage in report["stages"].as_array().unwrap() {
        let runs = if stage["stage"].as_str().unwrap().starts_with("tar-") {
            0
        } else {
            2
        };
        assert_eq!(stage["samples"].as_array().unwrap().len(), runs, "{stage}");
    }
    // skopeo has a run of each round; crane has the reason it has no number.
    let peers = report["peers"].as_array().unwrap();
    assert_eq!(peers[0]["tool"], "skopeo");
    assert_eq!(
        peers[0]["samples"].as_array().unwrap().len(),
        2,
        "{}",
        peers[0]
    );
    assert!(peers[0]["skipped"].is_null());
    assert!(
        peers[0]["version"]
            .as_str()
            .unwrap()
            .starts_with("skopeo version")
    );
    assert_eq!(peers[1]["tool"], "crane");
    assert!(peers[1]["samples"].as_array().unwrap().is_empty());
    assert!(
        peers[1]["skipped"]
            .as_str()
            .unwrap()
            .starts_with("not installed: `crane`"),
        "{}",
        peers[1]
    );
}

#[test]
fn bench_csv_has_the_documented_header_and_a_row_per_stage_and_point() {
    let (_registry, reference) = registry_with_image();
    let work = tempfile::tempdir().unwrap();
    let output = rpull(
        &[
            "bench",
            &reference,
            "--runs",
            "1",
            "--warm",
            "--csv",
            "--plain-http",
            "--tmpfs",
            "--clients",
            "1,2",
        ],
        work.path(),
    );
    let csv = ok_stdout(&output);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], rpull_bench::report::CSV_HEADER);
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench-json.md"))
        .unwrap();
    assert!(
        doc.lines().any(|line| line == lines[0]),
        "the header is documented verbatim"
    );
    let columns = lines[0].split(',').count();
    let rows: Vec<Vec<String>> = lines[1..].iter().map(|line| split_csv(line)).collect();
    for row in &rows {
        assert_eq!(row.len(), columns, "{row:?}");
    }
    let names: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str()))
        .collect();
    let mut expected: Vec<(&str, &str, &str)> = STAGES.iter().map(|s| ("stage", *s, "")).collect();
    expected.extend([("sweep", "clients", "1"), ("sweep", "clients", "2")]);
    assert_eq!(names, expected);
}

#[test]
fn bench_table_lists_every_stage_and_the_floor() {
    let (_registry, reference) = registry_with_image();
    let work = tempfile::tempdir().unwrap();
    let table = ok_stdout(&rpull(
        &["bench", &reference, "--runs", "1", "--warm", "--plain-http"],
        work.path(),
    ));
    for stage in STAGES {
        assert!(
            table.lines().any(|line| line.starts_with(stage)),
            "{stage} has a row:\n{table}"
        );
    }
    // PATH has no tar here: its reference stages say so instead of showing a number.
    for stage in ["tar-tmpfs", "tar-disk"] {
        assert!(
            table.contains(&format!("{stage}: note: skipped: no `tar` in PATH")),
            "{stage}:\n{table}"
        );
    }
    for expected in [
        "median s",
        "MB/s in",
        "peak RSS MB",
        "bounding stage:",
        "pipeline floor:",
        "counting the whole machine's CPU during those stages (",
        "in network outside rpull: a registry on this machine, if any): floor ",
        "machine:",
        "caches:",
    ] {
        assert!(table.contains(expected), "{expected}:\n{table}");
    }
}

#[test]
fn bench_needs_a_reference_and_refuses_bad_values() {
    let work = tempfile::tempdir().unwrap();
    let output = rpull(&["bench"], work.path());
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    for bad in [
        &["bench", "x", "--runs", "0"][..],
        &["bench", "x", "--chunk-size", "8XB"],
        &["bench", "x", "--dest", "d", "--tmpfs"],
    ] {
        let output = rpull(bad, work.path());
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {output:?}");
    }
    let output = rpull(&["bench", "x", "--compare", "nosuchtool"], work.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--compare"),
        "{output:?}"
    );
    let help = ok_stdout(&rpull(&["bench", "generate", "--help"], work.path()));
    assert!(
        help.contains("--from-dir") && help.contains("--sizes"),
        "{help}"
    );
}

/// Splits one CSV line (RFC 4180 quotes).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// The Targets section scripts/benchmarks-md writes at the top of docs/benchmarks.md, over the JSON
/// of committed compares: the verdicts docs/performance.md gives those runs, the "not counted" rule
/// included (a floor raised by a stage that ran slow).
#[test]
fn benchmarks_md_judges_the_targets_as_the_committed_compares_were_judged() {
    let root = env!("CARGO_MANIFEST_DIR");
    let render = |reports: &[PathBuf]| -> String {
        let output = Command::new("python3")
            .arg(Path::new(root).join("scripts/benchmarks-md"))
            .args(reports)
            .output()
            .expect("running python3 scripts/benchmarks-md (scripts/test installs python3)");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let judged = |run: &str| -> String {
        let dir = Path::new(root).join("docs/benchmarks").join(run);
        let mut reports: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.extension().is_some_and(|e| e == "json")
                    && !path
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("generate-")
            })
            .collect();
        reports.sort();
        render(&reports)
    };
    // (run, the target's row starts with, the row holds)
    let cases = [
        (
            "run-as",
            "| realistic gzip into tmpfs: at least 4x",
            "| 4.65x (crane-export 11.90 s, rpull 2.56 s) | met |",
        ),
        (
            "run-as",
            "| realistic gzip into tmpfs: within 1.2x",
            "| 1.10x (2.56 s against 2.32 s, cpu) | met |",
        ),
        (
            "run-as",
            "| many small files into tmpfs",
            "| 2.05x (tmpfs report), 2.08x (disk report), 2.14x (journal report) | met |",
        ),
        (
            "run-as",
            "| 1 GB in one layer into disk",
            "| 1.24x (1.04 s against 0.84 s, network) | **missed** |",
        ),
        (
            "run-as",
            "| 1 GB in one layer into tmpfs",
            "| 1.12x (1.11 s against 0.99 s, cpu) | not counted: 1.25x with the other report's median of a stage that ran slow (`extract-tmpfs` 0.75 s against 0.54 s) |",
        ),
        ("run-as", "Every target met", "**no** (6 of 8)"),
        (
            "run-at",
            "| realistic gzip into disk: at least 2x",
            "| 2.99x (crane-export 12.79 s, rpull 4.28 s) | met |",
        ),
        (
            "run-at",
            "| many small files into tmpfs",
            "1.96x (disk report), 2.20x (journal report) | **missed** |",
        ),
        (
            "run-at",
            "| many small files into ext4 with a journal",
            "| 2.07x (journal report) | met |",
        ),
        (
            "run-at",
            "| many small files into this machine's disk",
            "| 2.45x (tmpfs report), 2.08x (disk report) | met |",
        ),
        (
            "run-at",
            "| 1 GB in one layer into tmpfs",
            "| 1.24x (1.25 s against 1.01 s, cpu) | **missed** |",
        ),
        (
            "run-an",
            "| 1 GB in one layer into tmpfs",
            "| 1.16x (1.20 s against 1.03 s, cpu) | not counted: 1.38x with the other report's median of a stage that ran slow (`decompress-1core` 0.54 s against 0.22 s) |",
        ),
        (
            "run-an",
            "| many small files into this machine's disk",
            "| 1.57x (tmpfs report), 2.31x (disk report) | **missed** |",
        ),
        (
            "run-ao",
            "| realistic gzip into tmpfs: within 1.2x",
            "| 1.21x (2.77 s against 2.29 s, cpu) | **missed** |",
        ),
        (
            "run-ab",
            "| 1 GB in one layer into disk",
            "| 1.16x (1.02 s against 0.88 s, network) | met |",
        ),
        (
            "run-ab",
            "| 1 GB in one layer into tmpfs",
            "| 1.14x (1.11 s against 0.98 s, cpu) | met |",
        ),
        ("run-ab", "Every target met", "**no** (7 of 8)"),
        // A stage that ran slow (`network` 1.59x its disk report's) whose usual time still meets.
        (
            "run-ak",
            "| realistic gzip into tmpfs: within 1.2x",
            "| 1.08x (2.51 s against 2.32 s, cpu) | met |",
        ),
        // Met by hand in its time, not counted by the rule.
        (
            "run-ad",
            "| 1 GB in one layer into tmpfs",
            "| not counted: 1.27x with the other report's median of a stage that ran slow (`decompress-1core` 0.33 s against 0.18 s) |",
        ),
    ];
    let mut outputs = BTreeMap::new();
    for (run, row, holds) in cases {
        let markdown = outputs.entry(run).or_insert_with(|| judged(run));
        let targets = markdown
            .split("## Targets (issue 4, item 8)")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .unwrap_or_else(|| panic!("{run}: no Targets section in\n{markdown}"));
        let line = targets
            .lines()
            .find(|line| line.starts_with(row))
            .unwrap_or_else(|| panic!("{run}: no row {row:?} in\n{targets}"));
        assert!(line.contains(holds), "{run}: {line:?} lacks {holds:?}");
    }
    // A --quick compare (10MB and 100MB images only) has none of the images the targets are about.
    let quick = Path::new(root).join("docs/benchmarks/run-at/benchmark-v1-10MB-1-disk.json");
    let markdown = render(&[quick]);
    assert!(
        markdown.contains("benchmark:v1-10MB-1` to ext4"),
        "{markdown}"
    );
    assert!(!markdown.contains("## Targets"), "{markdown}");
}
