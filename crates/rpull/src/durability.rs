//! When pulled data is made durable: `--fsync none|layer|end|auto`.
//!
//! Never per file: a `syncfs` of the destination's filesystem after the tree is complete
//! (`end`) writes back everything the pull left dirty in one call, which is what a pull needs
//! before it reports success on a disk; on tmpfs there is nothing to write back.
//!
//! While the layers are extracted, [`Writeback`] starts that write-back early: a thread of its
//! own calls `syncfs` each time another [`WRITEBACK_STEP`] bytes have been extracted, so the
//! disk writes while the pipeline decodes and extracts, and the final `syncfs` only has the
//! remainder left. (The kernel would start on its own only past `dirty_background_ratio`, 10%
//! of memory: a 2 GB image can be extracted entirely before its first byte goes to disk.)

use std::fmt;
use std::io;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};

use serde::Serialize;

/// The durability policy of a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// `end` on a disk filesystem, `none` on tmpfs/ramfs.
    #[default]
    Auto,
    /// Leave write-back to the kernel (what docker and podman do).
    None,
    /// `syncfs` after each layer is extracted, and at the end.
    Layer,
    /// One `syncfs` of the destination filesystem before the tree is renamed into place, and an
    /// fsync of the destination's parent directory after the rename. (With `Layer` and `End` the
    /// write-back starts during extraction: a `syncfs` every 64 MiB extracted.)
    End,
}

impl FsyncPolicy {
    /// The policy actually applied to a tree at `path`: `Auto` becomes `End` or `None`.
    pub fn resolve(self, path: &Path) -> FsyncPolicy {
        match self {
            FsyncPolicy::Auto if is_memory_filesystem(path) => FsyncPolicy::None,
            FsyncPolicy::Auto => FsyncPolicy::End,
            other => other,
        }
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsyncPolicy::Auto => "auto",
            FsyncPolicy::None => "none",
            FsyncPolicy::Layer => "layer",
            FsyncPolicy::End => "end",
        })
    }
}

impl FromStr for FsyncPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(FsyncPolicy::Auto),
            "none" => Ok(FsyncPolicy::None),
            "layer" => Ok(FsyncPolicy::Layer),
            "end" => Ok(FsyncPolicy::End),
            other => Err(format!(
                "unknown fsync policy {other:?} (expected none, layer, end or auto)"
            )),
        }
    }
}

/// tmpfs and ramfs keep everything in memory: there is nothing to write back.
fn is_memory_filesystem(path: &Path) -> bool {
    rpull_extract::in_memory_filesystem(path) == Some(true)
}

/// `syncfs` of the filesystem holding `path`.
pub(crate) fn syncfs(path: &Path) -> std::io::Result<()> {
    rustix::fs::syncfs(&open_dir(path)?)?;
    Ok(())
}

/// Bytes extracted between two early `syncfs` calls of a [`Writeback`].
pub(crate) const WRITEBACK_STEP: u64 = 64 * 1024 * 1024;

/// Early write-back of a pull's destination filesystem (see the module's documentation).
///
/// Extraction reports its bytes through a [`WritebackCounter`]; the write-back thread sleeps
/// until another step of them is in, then runs one `syncfs`. Its errors are kept: the same
/// descriptor's `syncfs` reports a write-back error only once, so the first one is returned by
/// [`Writeback::finish`] rather than lost.
pub(crate) struct Writeback {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    dir: Arc<rustix::fd::OwnedFd>,
}

/// Counts the bytes extracted, for a [`Writeback`]. Cheap to clone; one atomic add per call.
#[derive(Clone)]
pub(crate) struct WritebackCounter {
    shared: Arc<Shared>,
}

struct Shared {
    extracted: AtomicU64,
    step: u64,
    stop: AtomicBool,
    thread: Mutex<Option<Thread>>,
    error: Mutex<Option<io::Error>>,
    /// `syncfs` calls made so far (for tests and the debug line).
    syncs: AtomicU64,
}

impl Shared {
    fn wake(&self) {
        if let Some(thread) = &*self.thread.lock().unwrap_or_else(|p| p.into_inner()) {
            thread.unpark();
        }
    }
}

impl Writeback {
    /// Starts the write-back thread for the filesystem holding `path`, with a `syncfs` after
    /// every `step` bytes.
    pub(crate) fn start(path: &Path, step: u64) -> io::Result<Writeback> {
        let dir = Arc::new(open_dir(path)?);
        let shared = Arc::new(Shared {
            extracted: AtomicU64::new(0),
            step: step.max(1),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            error: Mutex::new(None),
            syncs: AtomicU64::new(0),
        });
        let thread = {
            let (shared, dir) = (shared.clone(), dir.clone());
            std::thread::Builder::new()
                .name("rpull-writeback".into())
                .spawn(move || writeback_loop(&shared, &dir))?
        };
        Ok(Writeback {
            shared,
            thread: Some(thread),
            dir,
        })
    }

    pub(crate) fn counter(&self) -> WritebackCounter {
        WritebackCounter {
            shared: self.shared.clone(),
        }
    }

    /// The `syncfs` calls the thread has made so far.
    #[cfg(test)]
    fn syncs(&self) -> u64 {
        self.shared.syncs.load(Ordering::Relaxed)
    }

    /// Stops the thread and runs the final `syncfs` on the same descriptor; the first error of
    /// either is returned.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.stop();
        let early = self
            .shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let last = rustix::fs::syncfs(&*self.dir).map_err(io::Error::from);
        tracing::debug!(
            early_syncs = self.shared.syncs.load(Ordering::Relaxed),
            "write-back finished"
        );
        match early {
            Some(error) => Err(error),
            None => last,
        }
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.stop();
    }
}

impl WritebackCounter {
    /// Records `bytes` more extracted; wakes the write-back thread when a step is complete.
    pub(crate) fn add(&self, bytes: u64) {
        let before = self.shared.extracted.fetch_add(bytes, Ordering::Relaxed);
        if before / self.shared.step != (before + bytes) / self.shared.step {
            self.shared.wake();
        }
    }
}

fn writeback_loop(shared: &Shared, dir: &rustix::fd::OwnedFd) {
    // Registered before the first check, so no wake-up can fall between the two.
    *shared.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current());
    let mut synced = 0;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let extracted = shared.extracted.load(Ordering::Relaxed);
        // A sync for each step boundary crossed since the last one (the counter wakes the
        // thread on the same condition); boundaries crossed during a sync make one more.
        if extracted / shared.step == synced / shared.step {
            // Spurious wake-ups and unparks that came before the park are both fine: the
            // condition is checked again.
            std::thread::park();
            continue;
        }
        synced = extracted;
        shared.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(errno) = rustix::fs::syncfs(dir) {
            let mut error = shared.error.lock().unwrap_or_else(|p| p.into_inner());
            error.get_or_insert_with(|| io::Error::from(errno));
        }
    }
}

fn open_dir(path: &Path) -> io::Result<rustix::fd::OwnedFd> {
    Ok(rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )?)
}

/// `fsync` of a directory, so a rename inside it is durable.
pub(crate) fn fsync_dir(path: &Path) -> std::io::Result<()> {
    rustix::fs::fsync(&open_dir(path)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for policy in [
            FsyncPolicy::Auto,
            FsyncPolicy::None,
            FsyncPolicy::Layer,
            FsyncPolicy::End,
        ] {
            assert_eq!(policy.to_string().parse::<FsyncPolicy>(), Ok(policy));
        }
        assert!(
            "always"
                .parse::<FsyncPolicy>()
                .unwrap_err()
                .contains("always")
        );
    }

    /// Waits up to 10 s for the write-back thread to have made `count` syncs.
    fn wait_for_syncs(writeback: &Writeback, count: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while writeback.syncs() < count && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        writeback.syncs()
    }

    #[test]
    fn writeback_syncs_once_per_completed_step_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let writeback = Writeback::start(dir.path(), 1000).unwrap();
        let counter = writeback.counter();
        counter.add(999);
        counter.add(0);
        // Below one step: the thread has nothing to do.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(writeback.syncs(), 0);
        counter.add(1);
        assert_eq!(wait_for_syncs(&writeback, 1), 1);
        // Several steps at once are one sync: it writes back everything dirty so far.
        counter.add(5000);
        assert_eq!(wait_for_syncs(&writeback, 2), 2);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(writeback.syncs(), 2, "no sync without a new step");
        writeback.finish().unwrap();
    }

    #[test]
    fn writeback_counts_from_several_threads() {
        let dir = tempfile::tempdir().unwrap();
        let writeback = Writeback::start(dir.path(), 100_000).unwrap();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let counter = writeback.counter();
                scope.spawn(move || {
                    for _ in 0..25_000 {
                        counter.add(1);
                    }
                });
            }
        });
        assert_eq!(writeback.shared.extracted.load(Ordering::Relaxed), 100_000);
        assert_eq!(wait_for_syncs(&writeback, 1), 1);
        writeback.finish().unwrap();
    }

    #[test]
    fn writeback_finish_returns_the_error_an_early_sync_saw() {
        let dir = tempfile::tempdir().unwrap();
        let writeback = Writeback::start(dir.path(), 1 << 40).unwrap();
        // What the thread stores when a `syncfs` fails (an I/O error is not reproducible here).
        *writeback.shared.error.lock().unwrap() = Some(io::Error::from_raw_os_error(5));
        let error = writeback.finish().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(5));
    }

    #[test]
    fn writeback_of_a_missing_directory_names_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let error = Writeback::start(&dir.path().join("missing"), 1)
            .err()
            .expect("no directory to open");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn dropping_a_writeback_stops_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let writeback = Writeback::start(dir.path(), 1).unwrap();
        let shared = writeback.shared.clone();
        drop(writeback);
        assert!(shared.stop.load(Ordering::Acquire));
        // The thread held the other references to `shared`; it has been joined.
        assert_eq!(Arc::strong_count(&shared), 1);
    }

    #[test]
    fn auto_is_none_on_tmpfs_and_end_on_disk() {
        if Path::new("/dev/shm").is_dir() && is_memory_filesystem(Path::new("/dev/shm")) {
            assert_eq!(
                FsyncPolicy::Auto.resolve(Path::new("/dev/shm")),
                FsyncPolicy::None
            );
        }
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        if !is_memory_filesystem(disk.path()) {
            assert_eq!(FsyncPolicy::Auto.resolve(disk.path()), FsyncPolicy::End);
        }
        assert_eq!(
            FsyncPolicy::Layer.resolve(Path::new("/dev/shm")),
            FsyncPolicy::Layer
        );
    }
}
