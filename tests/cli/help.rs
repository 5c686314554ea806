//! `--help` documents what the README documents, and nothing else.

use std::collections::BTreeSet;

use crate::common::Sandbox;

/// The flags in the first column of the README's flag table (`-vv` counts as `-v`).
fn readme_flags() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("reading README.md");
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|line| !line.starts_with("| flag | meaning |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .collect();
    assert!(
        table.len() >= 10,
        "the README's flag table was not found: {table:?}"
    );
    let mut flags = BTreeSet::new();
    for row in table {
        let first_cell = row
            .trim_start_matches('|')
            .split('|')
            .next()
            .unwrap_or_default();
        for code in first_cell.split('`').skip(1).step_by(2) {
            for word in code.split_whitespace() {
                let word = word.trim_end_matches(',');
                if !word.starts_with('-') {
                    continue;
                }
                let short_repeated = !word.starts_with("--")
                    && word.len() > 2
                    && word[1..].chars().all(|c| Some(c) == word.chars().nth(1));
                flags.insert(if short_repeated {
                    word[..2].to_owned()
                } else {
                    word.to_owned()
                });
            }
        }
    }
    flags
}

fn help(args: &[&str]) -> String {
    let outcome = Sandbox::new().rpull().args(args).run();
    assert_eq!(outcome.code, Some(0), "{outcome}");
    assert_eq!(outcome.stderr, "", "{outcome}");
    outcome.stdout
}

/// Whether `flag` appears in `text` as a whole word (not as the prefix of a longer flag).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + flag.len()..].chars().next();
        !before.is_some_and(|c| c == '-' || c.is_alphanumeric())
            && !after.is_some_and(|c| c == '-' || c.is_alphanumeric())
    })
}

#[test]
fn pull_help_lists_every_readme_flag() {
    let flags = readme_flags();
    for expected in [
        "--platform",
        "--password-stdin",
        "-u",
        "--username",
        "-v",
        "--json",
    ] {
        assert!(flags.contains(expected), "parsed {flags:?}");
    }
    let text = help(&["pull", "--help"]);
    let missing: Vec<&String> = flags.iter().filter(|flag| !mentions(&text, flag)).collect();
    assert!(
        missing.is_empty(),
        "`rpull pull --help` does not mention {missing:?}:\n{text}"
    );
    assert!(
        text.contains("<REFERENCE>") && text.contains("<DIR>"),
        "{text}"
    );
    assert!(
        text.contains("[default: 8]"),
        "the default concurrency is shown\n{text}"
    );
}

#[test]
fn pull_help_has_no_undocumented_flags() {
    let flags = readme_flags();
    let text = help(&["pull", "--help"]);
    let undocumented: BTreeSet<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .filter(|word| {
            word[2..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '-')
        })
        .filter(|word| *word != "--help" && !flags.contains(*word))
        .collect();
    assert!(
        undocumented.is_empty(),
        "flags missing from the README's table: {undocumented:?}\n{text}"
    );
}

#[test]
fn top_level_help_and_version() {
    let text = help(&["--help"]);
    assert!(text.contains("pull"), "{text}");
    assert!(
        mentions(&text, "-v") && mentions(&text, "--verbose"),
        "{text}"
    );
    let version = help(&["--version"]);
    assert_eq!(
        version.trim(),
        format!("rpull {}", env!("CARGO_PKG_VERSION"))
    );
    // No subcommand: clap's usage error.
    let outcome = Sandbox::new().rpull().run();
    assert_eq!(outcome.code, Some(2), "{outcome}");
}
