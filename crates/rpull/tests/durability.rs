//! `PullOptions::fsync`: one syncfs at the end on a disk by default, nothing on tmpfs, and the
//! explicit policies as asked.

mod common;

use common::Env;
use rpull::{FsyncPolicy, PullOptions};
use rpull_testing::{Compression, ImageBuilder, LayerBuilder};

fn image() -> rpull_testing::Image {
    ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("a/one", "1", 0o644),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new().file("b/two", "2", 0o644),
            Compression::Gzip,
        )
        .build()
}

async fn pull_with(env: &Env, policy: FsyncPolicy, dest: &std::path::Path) -> rpull::PullReport {
    let reference = env.push(&image(), "durable:1").await;
    let options = PullOptions {
        fsync: policy,
        ..PullOptions::default()
    };
    let report = env
        .puller(options)
        .pull(&reference, dest)
        .await
        .expect("pull succeeds");
    assert_eq!(std::fs::read_to_string(dest.join("b/two")).unwrap(), "2");
    report
}

fn on_tmpfs(path: &std::path::Path) -> bool {
    rustix::fs::statfs(path)
        .map(|s| s.f_type as u64 == 0x0102_1994)
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_syncs_once_at_the_end_on_disk() {
    let env = Env::start();
    if on_tmpfs(env.tmp.path()) {
        eprintln!("skipped: the temporary directory is on tmpfs here");
        return;
    }
    let report = pull_with(&env, FsyncPolicy::Auto, &env.dest("rootfs")).await;
    assert_eq!(report.fsync, FsyncPolicy::End);
    assert!(report.sync_seconds > 0.0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_does_not_sync_on_tmpfs() {
    let env = Env::start();
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() || !on_tmpfs(shm) {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let report = pull_with(&env, FsyncPolicy::Auto, &dir.path().join("rootfs")).await;
    assert_eq!(report.fsync, FsyncPolicy::None);
    assert_eq!(report.sync_seconds, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn explicit_policies_are_applied() {
    let env = Env::start();
    let none = pull_with(&env, FsyncPolicy::None, &env.dest("none")).await;
    assert_eq!((none.fsync, none.sync_seconds), (FsyncPolicy::None, 0.0));
    let layer = pull_with(&env, FsyncPolicy::Layer, &env.dest("layer")).await;
    assert_eq!(layer.fsync, FsyncPolicy::Layer);
    assert!(layer.sync_seconds > 0.0);
    let end = pull_with(&env, FsyncPolicy::End, &env.dest("end")).await;
    assert_eq!(end.fsync, FsyncPolicy::End);
    assert!(end.sync_seconds > 0.0);
}
