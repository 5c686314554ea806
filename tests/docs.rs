//! The documentation's own links: every relative link or image in README.md, the crates'
//! READMEs and the markdown under docs/ names a file that is in the checkout. (docs/benchmarks.md
//! is a copy of a compare's benchmarks.md, whose plot links are relative to the run's directory;
//! copied as it was, its plots pointed at files docs/ does not hold.)

use std::path::{Path, PathBuf};

/// The targets of the inline links `[text](target)` and images `![alt](target)` of a markdown
/// text, with their line numbers.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let end = after
                .find(|c: char| c == ')' || c.is_whitespace())
                .unwrap_or(after.len());
            targets.push((number + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    targets
}

fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

#[test]
fn link_targets_are_read_from_links_and_images() {
    let text = "See [the design](docs/design.md#layout) and\n![plot](run-bm/a.svg) [web](https://x.y/z) [c](#top)";
    assert_eq!(
        link_targets(text),
        vec![
            (1, "docs/design.md#layout".to_string()),
            (2, "run-bm/a.svg".to_string()),
            (2, "https://x.y/z".to_string()),
            (2, "#top".to_string()),
        ]
    );
}

#[test]
fn relative_links_in_the_documentation_name_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let readme = entry.unwrap().path().join("README.md");
        if readme.exists() {
            files.push(readme);
        }
    }
    markdown_files(&root.join("docs"), &mut files);
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, target) in link_targets(&text) {
            let path = target.split('#').next().unwrap();
            // Web addresses, mail and anchors in the same page are not files.
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            if !file.parent().unwrap().join(path).exists() {
                broken.push(format!(
                    "{}:{line}: {target}",
                    file.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} relative links found in {} files",
        files.len()
    );
    assert!(
        broken.is_empty(),
        "links to files that are not there:\n{}",
        broken.join("\n")
    );
}
