//! Peers against a real registry: a missing tool is reported (never faked), and every installed
//! peer runs for real: skopeo and crane, and docker / podman / ctr through their private daemons
//! and storage (about 2 s each here). A daemon peer that is not installed, or a run without root,
//! is skipped with a message.

use std::path::Path;

use rpull_bench::daemons::mounts_under;
use rpull_bench::peers::{Peer, PeerContext, run_peers};
use rpull_testing::{Compression, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry};

async fn registry_with_image(compression: Compression) -> (TestRegistry, String) {
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/hello", "hello from a peer\n", 0o644),
            compression,
        )
        .layer(
            LayerBuilder::new().file("data.bin", vec![7u8; 256 << 10], 0o644),
            compression,
        )
        .build();
    registry
        .push_image(&image, "peers/small:1")
        .await
        .expect("pushing the image");
    let reference = registry.reference("peers/small:1");
    (registry, reference)
}

fn context(reference: &str, work: &Path, runs: usize) -> PeerContext {
    let mut ctx = PeerContext::new(reference, work);
    ctx.runs = runs;
    // Dropping caches is for the real benchmark; the tests stay quick.
    ctx.cold = false;
    ctx
}

/// Nothing left mounted or on disk under the work directory.
fn assert_clean(work: &Path) {
    let canonical = std::fs::canonicalize(work).unwrap();
    assert!(
        mounts_under(&canonical).is_empty(),
        "mounts left: {:?}",
        mounts_under(&canonical)
    );
    let left: Vec<_> = std::fs::read_dir(work)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_peer_is_reported_not_faked() {
    let work = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let mut ctx = context("127.0.0.1:1/none:1", work.path(), 3);
    ctx.path = Some(empty_path.path().as_os_str().to_owned());
    let results = run_peers(&Peer::ALL, &ctx).await;
    assert_eq!(results.len(), Peer::ALL.len());
    for (result, peer) in results.iter().zip(Peer::ALL) {
        assert_eq!(result.tool, peer.to_string());
        let reason = result
            .skipped
            .as_deref()
            .unwrap_or_else(|| panic!("{peer} not skipped: {result:?}"));
        assert!(reason.starts_with("not installed:"), "{reason}");
        assert!(
            reason.contains("apt-get install") || reason.contains("go install"),
            "{reason}"
        );
        assert!(
            result.samples.is_empty() && result.seconds.is_none(),
            "{result:?}"
        );
        assert!(result.version.is_none());
    }
    assert!(results[0].skipped.as_deref().unwrap().contains("`docker`"));
    assert_clean(work.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_peer_is_reported_with_its_error() {
    let work = tempfile::tempdir().unwrap();
    let registry = TestRegistry::start(RegistryOptions::plain()).unwrap();
    let ctx = context(&registry.reference("does/not:exist"), work.path(), 2);
    let result = run_peers(&[Peer::Skopeo], &ctx).await.remove(0);
    let reason = result.skipped.as_deref().expect("a failed pull is skipped");
    assert!(reason.starts_with("failed: run 1: exited with"), "{reason}");
    assert!(
        reason.contains("manifest unknown") || reason.contains("not found"),
        "{reason}"
    );
    assert!(result.samples.is_empty() && result.seconds.is_none());
    assert!(
        result.options.contains("--src-tls-verify=false"),
        "{}",
        result.options
    );
    assert_clean(work.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skopeo_copies_to_an_oci_layout() {
    let (_registry, reference) = registry_with_image(Compression::Gzip).await;
    let work = tempfile::tempdir().unwrap();
    // Look at the layout before the peer's cleanup removes it: run the peer by hand once more.
    let ctx = context(&reference, work.path(), 2);
    let result = run_peers(&[Peer::Skopeo], &ctx).await.remove(0);
    assert_eq!(result.skipped, None, "{result:?}");
    assert_eq!(result.samples.len(), 2);
    assert!(
        result
            .samples
            .iter()
            .all(|s| s.seconds > 0.0 && s.cpu_seconds > 0.0),
        "{:?}",
        result.samples
    );
    assert!(result.seconds.unwrap().median > 0.0);
    assert!(
        result
            .version
            .as_deref()
            .unwrap()
            .starts_with("skopeo version"),
        "{:?}",
        result.version
    );
    assert!(result.does.starts_with("download only"));
    assert!(
        result
            .options
            .starts_with("skopeo copy --src-tls-verify=false docker://"),
        "{}",
        result.options
    );
    assert_clean(work.path());

    // The exact command the peer ran leaves a valid OCI layout with both layers.
    let layout = work.path().join("layout");
    let status = std::process::Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .arg(format!("oci:{}:rpull-bench", layout.display()))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(layout.join("oci-layout").is_file() && layout.join("index.json").is_file());
    let blobs = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .count();
    assert_eq!(blobs, 4, "2 layers + config + manifest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crane_and_crane_export() {
    let (_registry, reference) = registry_with_image(Compression::Gzip).await;
    let work = tempfile::tempdir().unwrap();
    let ctx = context(&reference, work.path(), 1);
    let results = run_peers(&[Peer::Crane, Peer::CraneExport], &ctx).await;
    for result in &results {
        if let Some(reason) = &result.skipped {
            // crane comes from `go install`; a machine without Go has none.
            assert!(reason.starts_with("not installed: `crane`"), "{reason}");
            continue;
        }
        assert_eq!(result.samples.len(), 1, "{result:?}");
        assert!(result.seconds.unwrap().median > 0.0);
    }
    if results[1].skipped.is_none() {
        assert!(
            results[1].options.contains("| tar -x -C"),
            "{}",
            results[1].options
        );
        assert!(results[1].does.starts_with("download and extract"));
    }
    assert_clean(work.path());
}

/// Runs a daemon-backed peer twice; `None` (after checking the reason) when the tool is not
/// installed or this is not root (the daemons and overlay mounts need root).
async fn daemon_peer(peer: Peer, compression: Compression) -> Option<rpull_bench::PeerResult> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("{peer}: skipped, needs root");
        return None;
    }
    let (_registry, reference) = registry_with_image(compression).await;
    let work = tempfile::tempdir().unwrap();
    let ctx = context(&reference, work.path(), 2);
    let result = run_peers(&[peer], &ctx).await.remove(0);
    eprintln!("{result:#?}");
    assert_clean(work.path());
    if let Some(reason) = result.skipped.as_deref()
        && reason.starts_with("not installed:")
    {
        eprintln!("{peer}: {reason}");
        return None;
    }
    Some(result)
}

fn assert_ran(result: &rpull_bench::PeerResult) {
    assert_eq!(result.skipped, None, "{result:?}");
    assert_eq!(result.samples.len(), 2);
    assert!(
        result
            .samples
            .iter()
            .all(|s| s.seconds > 0.0 && s.sync_seconds.is_some()),
        "{:?}",
        result.samples
    );
    assert!(result.does.starts_with("download and extract"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_pulls_through_a_private_dockerd() {
    let Some(result) = daemon_peer(Peer::Docker, Compression::Gzip).await else {
        return;
    };
    assert_ran(&result);
    assert!(
        result
            .options
            .starts_with("docker -H unix:///tmp/rpb-docker-"),
        "{}",
        result.options
    );
    assert!(
        result.options.contains("--data-root="),
        "{}",
        result.options
    );
    // Client RSS plus dockerd's VmHWM: dockerd alone is tens of MB.
    assert!(
        result.samples[0].peak_rss_bytes.unwrap() > 20 << 20,
        "{:?}",
        result.samples[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_zstd_pulls_or_says_why() {
    let Some(result) = daemon_peer(Peer::Docker, Compression::Zstd).await else {
        return;
    };
    // dockerd 20.10 cannot pull zstd layers (newer ones can): then the failure is the reason.
    match result.skipped.as_deref() {
        Some(reason) => {
            assert!(reason.starts_with("failed: run 1:"), "{reason}");
            assert!(result.samples.is_empty() && result.seconds.is_none());
        }
        None => assert_ran(&result),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_pulls_into_its_own_root() {
    let Some(result) = daemon_peer(Peer::Podman, Compression::Gzip).await else {
        return;
    };
    assert_ran(&result);
    assert!(
        result
            .options
            .contains("--storage-driver overlay pull --tls-verify=false"),
        "{}",
        result.options
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctr_pulls_through_a_private_containerd() {
    let Some(result) = daemon_peer(Peer::Ctr, Compression::Gzip).await else {
        return;
    };
    assert_ran(&result);
    assert!(
        result.options.contains("images pull --plain-http"),
        "{}",
        result.options
    );
}
