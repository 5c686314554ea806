//! Shared helpers of the pull integration tests: a real registry per test, a puller for it,
//! error chains, and checks that a failed pull left nothing behind.

#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rpull::{PullError, PullEvent, PullOptions, PullReport, Puller, Reference};
use rpull_testing::{Image, RegistryOptions, TestRegistry, TreeSnapshot};

/// A registry, a temporary directory for destinations, and the host platform.
pub struct Env {
    pub registry: TestRegistry,
    pub tmp: tempfile::TempDir,
}

impl Env {
    pub fn start() -> Env {
        Env {
            registry: TestRegistry::start(RegistryOptions::plain())
                .expect("starting docker-registry"),
            tmp: tempfile::Builder::new()
                .prefix("rpull-pull-")
                .tempdir()
                .expect("temporary directory"),
        }
    }

    /// `DEST` inside the temporary directory (not created).
    pub fn dest(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Pushes `image` as `repo_tag` and returns the reference to pull it by tag.
    pub async fn push(&self, image: &Image, repo_tag: &str) -> Reference {
        self.registry
            .push_image(image, repo_tag)
            .await
            .expect("pushing the fixture image");
        self.reference(repo_tag)
    }

    pub fn reference(&self, repo_tag: &str) -> Reference {
        self.registry
            .reference(repo_tag)
            .parse()
            .expect("a valid reference")
    }

    pub fn puller(&self, options: PullOptions) -> Puller {
        Puller::builder()
            .client(self.registry.client().expect("registry client"))
            .options(options)
            .build()
            .expect("building the puller")
    }

    /// A puller that records every event.
    pub fn recording_puller(&self, options: PullOptions) -> (Puller, Arc<Mutex<Vec<PullEvent>>>) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let puller = Puller::builder()
            .client(self.registry.client().expect("registry client"))
            .options(options)
            .on_event(move |event| sink.lock().unwrap().push(event.clone()))
            .build()
            .expect("building the puller");
        (puller, events)
    }

    pub async fn pull(&self, reference: &Reference, dest: &Path) -> Result<PullReport, PullError> {
        self.puller(PullOptions::default())
            .pull(reference, dest)
            .await
    }

    /// Pushes and pulls `image` into `DEST/name`, panicking on failure; returns the destination.
    pub async fn push_and_pull(&self, image: &Image, repo_tag: &str, name: &str) -> PathBuf {
        let reference = self.push(image, repo_tag).await;
        let dest = self.dest(name);
        self.pull(&reference, &dest)
            .await
            .unwrap_or_else(|e| panic!("pulling {reference}: {}", chain(&e)));
        dest
    }
}

/// `error: cause: cause`, as the CLI prints it.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// Names of staging directories (`.NAME.rpull-staging-*`) left in `dest`'s parent.
pub fn staging_left(dest: &Path) -> Vec<String> {
    let parent = dest.parent().expect("destination has a parent");
    let name = dest
        .file_name()
        .expect("destination has a name")
        .to_string_lossy();
    let prefix = format!(".{name}.rpull-staging-");
    match std::fs::read_dir(parent) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Every staging directory of any destination (`*.rpull-staging-*`) under `dir`.
pub fn any_staging_left(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(".rpull-staging-"))
                .collect()
        })
        .unwrap_or_default()
}

/// After a failed pull: `dest` does not exist and no staging directory is left beside it.
#[track_caller]
pub fn assert_nothing_committed(dest: &Path) {
    assert!(
        std::fs::symlink_metadata(dest).is_err(),
        "{} exists after a failed pull",
        dest.display()
    );
    let left = staging_left(dest);
    assert!(left.is_empty(), "staging directories left behind: {left:?}");
}

/// A snapshot of `root`, panicking on failure.
pub fn snapshot(root: &Path) -> TreeSnapshot {
    TreeSnapshot::capture(root).unwrap_or_else(|e| panic!("snapshot of {}: {e:#}", root.display()))
}

/// Sorted relative paths of a snapshot, shown lossily, for exact listing assertions.
pub fn paths(snapshot: &TreeSnapshot) -> Vec<String> {
    snapshot
        .paths()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// `(layer, state)` of every state event, in order, for event-order assertions.
pub fn layer_states(events: &[PullEvent]) -> Vec<(usize, rpull::LayerState)> {
    events
        .iter()
        .filter_map(|e| match e {
            PullEvent::LayerState { index, state, .. } => Some((*index, *state)),
            _ => None,
        })
        .collect()
}

/// True when running as root (owners, devices, `security.*` xattrs).
pub fn is_root() -> bool {
    // The effective uid from /proc keeps libc out of the dev-dependencies.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}
