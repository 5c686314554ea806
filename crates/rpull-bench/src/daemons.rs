//! Private daemons for the peers that need one: a `dockerd` and a `containerd`, each with all its
//! data under the benchmark's work directory and its sockets under a short directory in /tmp (unix
//! socket paths are limited to 108 bytes). The machine's own daemons, sockets and configuration
//! are never touched. Also: unmounting what the daemons and podman leave mounted, and a daemon's
//! peak RSS and CPU time from /proc.

use std::ffi::OsStr;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::resources::proc_status_kib;

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A daemon that did not start, with the end of its log.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}; its log ends with:\n{log_tail}")]
pub struct DaemonError {
    /// `dockerd` or `containerd`.
    pub what: String,
    /// What went wrong.
    pub reason: String,
    /// The last lines of its log.
    pub log_tail: String,
}

/// A running daemon process with its log and the directories it owns. Stopped (SIGTERM, then
/// SIGKILL) and its short runtime directory unmounted and removed on drop.
#[derive(Debug)]
struct DaemonProcess {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
    runtime_dir: PathBuf,
}

impl DaemonProcess {
    fn spawn(
        name: &'static str,
        mut command: Command,
        log: PathBuf,
        runtime_dir: PathBuf,
        path_env: Option<&OsStr>,
    ) -> Result<DaemonProcess, DaemonError> {
        let fail = |reason: String| {
            let _ = std::fs::remove_dir_all(&runtime_dir);
            DaemonError {
                what: name.to_owned(),
                reason,
                log_tail: String::new(),
            }
        };
        let log_file = std::fs::File::create(&log)
            .map_err(|e| fail(format!("creating {}: {e}", log.display())))?;
        let log_err = log_file.try_clone().map_err(|e| fail(e.to_string()))?;
        command
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        if let Some(path) = path_env {
            command.env("PATH", path);
        }
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
        // (setsid, prctl); it allocates nothing. SIGTERM on our death lets the daemon clean up its
        // mounts if the benchmark dies without stopping it.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| fail(format!("could not run it: {e}")))?;
        Ok(DaemonProcess {
            name,
            child: Some(child),
            log,
            runtime_dir,
        })
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn error(&self, reason: impl Into<String>) -> DaemonError {
        DaemonError {
            what: self.name.to_owned(),
            reason: reason.into(),
            log_tail: log_tail(&self.log, 15),
        }
    }

    /// Waits until `ready()` is true; fails when the process exits or the timeout passes.
    fn wait_ready(&mut self, mut ready: impl FnMut() -> bool) -> Result<(), DaemonError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(self.error(format!("exited with {status} before it was ready")));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.error(format!("not ready within {READY_TIMEOUT:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as libc::pid_t;
            // SAFETY: plain kill(2) on our own child, which has not been reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        tracing::warn!(
                            daemon = self.name,
                            "did not stop within {STOP_TIMEOUT:?}; killing it"
                        );
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        unmount_under(&self.runtime_dir);
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A short directory in /tmp for sockets and runtime state.
fn short_runtime_dir(prefix: &str) -> std::io::Result<PathBuf> {
    Ok(tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")?
        .keep())
}

/// Whether an HTTP server on the unix socket answers `GET path` with 200.
fn http_ok_on_socket(socket: &Path, path: &str) -> bool {
    let Ok(mut stream) = UnixStream::connect(socket) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut response = [0u8; 12];
    stream.read_exact(&mut response).is_ok() && response.ends_with(b" 200")
}

/// A private `dockerd`: data root under the work directory, exec root, pidfile and socket in a
/// short /tmp directory, no iptables or bridge, its own (empty) config file. Loopback registries
/// are insecure by default for dockerd, so `docker pull 127.0.0.1:PORT/...` speaks plain HTTP
/// without any setting.
#[derive(Debug)]
pub struct Dockerd {
    process: DaemonProcess,
    socket: PathBuf,
    args: Vec<String>,
}

impl Dockerd {
    /// Starts `dockerd` (the binary at `dockerd`) with its data root at `data_root` and waits until
    /// its API answers `/_ping`. `path_env` is the PATH it gets (it runs containerd, unpigz).
    pub fn start(
        dockerd: &Path,
        data_root: &Path,
        path_env: Option<&OsStr>,
    ) -> Result<Dockerd, DaemonError> {
        let fail = |reason: String| DaemonError {
            what: "dockerd".to_owned(),
            reason,
            log_tail: String::new(),
        };
        std::fs::create_dir_all(data_root)
            .map_err(|e| fail(format!("creating {}: {e}", data_root.display())))?;
        let runtime = short_runtime_dir("rpb-docker-")
            .map_err(|e| fail(format!("creating a directory in /tmp: {e}")))?;
        let socket = runtime.join("docker.sock");
        let config = data_root.join("daemon.json");
        // Only one setting: dockerd 20.10 otherwise creates /etc/docker/key.json, outside its data
        // root (it has no command-line flag for this).
        let key = data_root.join("key.json");
        let json = format!(
            "{{\"deprecated-key-path\": {:?}}}\n",
            key.display().to_string()
        );
        std::fs::write(&config, json)
            .map_err(|e| fail(format!("writing {}: {e}", config.display())))?;
        let args: Vec<String> = vec![
            format!("--data-root={}", data_root.display()),
            format!("--exec-root={}", runtime.join("exec").display()),
            format!("--pidfile={}", runtime.join("docker.pid").display()),
            format!("--host=unix://{}", socket.display()),
            format!("--config-file={}", config.display()),
            "--iptables=false".to_owned(),
            "--ip-masq=false".to_owned(),
            "--bridge=none".to_owned(),
        ];
        let mut command = Command::new(dockerd);
        command.args(&args);
        let log = data_root.join("dockerd.log");
        let mut process = DaemonProcess::spawn("dockerd", command, log, runtime, path_env)?;
        process.wait_ready(|| http_ok_on_socket(&socket, "/_ping"))?;
        Ok(Dockerd {
            process,
            socket,
            args,
        })
    }

    /// `unix:///tmp/rpb-docker-XXXX/docker.sock`, for `docker -H`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The flags it was started with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.process.log, lines)
    }

    /// Stops it (SIGTERM, SIGKILL after 30 s) and removes its runtime directory. Its data root is
    /// left for the caller (unmount with [`unmount_under`] first).
    pub fn stop(mut self) {
        self.process.stop();
    }
}

/// A private `containerd` (CRI plugin and the snapshotters that cannot work here disabled), root
/// under the work directory, state and sockets in a short /tmp directory.
#[derive(Debug)]
pub struct Containerd {
    process: DaemonProcess,
    socket: PathBuf,
    config: PathBuf,
}

impl Containerd {
    /// Starts `containerd` with its root at `root` and waits until its gRPC socket accepts.
    pub fn start(
        containerd: &Path,
        root: &Path,
        path_env: Option<&OsStr>,
    ) -> Result<Containerd, DaemonError> {
        let fail = |reason: String| DaemonError {
            what: "containerd".to_owned(),
            reason,
            log_tail: String::new(),
        };
        std::fs::create_dir_all(root)
            .map_err(|e| fail(format!("creating {}: {e}", root.display())))?;
        let runtime = short_runtime_dir("rpb-containerd-")
            .map_err(|e| fail(format!("creating a directory in /tmp: {e}")))?;
        let socket = runtime.join("containerd.sock");
        let config = root.join("config.toml");
        let toml = format!(
            "version = 2\n\
             root = {root:?}\n\
             state = {state:?}\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.btrfs\", \
             \"io.containerd.snapshotter.v1.zfs\", \"io.containerd.snapshotter.v1.aufs\", \
             \"io.containerd.snapshotter.v1.devmapper\"]\n\
             [grpc]\n  address = {socket:?}\n\
             [ttrpc]\n  address = {ttrpc:?}\n\
             [debug]\n  address = {debug:?}\n\
             [metrics]\n  address = \"\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt:?}\n",
            root = root.join("root").display().to_string(),
            state = runtime.join("state").display().to_string(),
            socket = socket.display().to_string(),
            ttrpc = runtime.join("containerd.sock.ttrpc").display().to_string(),
            debug = runtime.join("debug.sock").display().to_string(),
            opt = root.join("opt").display().to_string(),
        );
        std::fs::write(&config, toml)
            .map_err(|e| fail(format!("writing {}: {e}", config.display())))?;
        let mut command = Command::new(containerd);
        command.arg("--config").arg(&config);
        let log = root.join("containerd.log");
        let mut process = DaemonProcess::spawn("containerd", command, log, runtime, path_env)?;
        process.wait_ready(|| UnixStream::connect(&socket).is_ok())?;
        Ok(Containerd {
            process,
            socket,
            config,
        })
    }

    /// The gRPC socket, for `ctr --address`.
    pub fn address(&self) -> &Path {
        &self.socket
    }

    /// The config file it was started with.
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.process.log, lines)
    }

    /// Stops it and removes its runtime directory.
    pub fn stop(mut self) {
        self.process.stop();
    }
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Lazily unmounts every mount at or below `dir`, deepest first (overlay mounts of docker, podman
/// and containerd must go before their directories can be removed). Returns the mount points it
/// could not unmount, with the error.
pub fn unmount_under(dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    let mut failures = Vec::new();
    for mount_point in mounts_under(&dir) {
        let Ok(c_path) = std::ffi::CString::new(mount_point.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2 takes a NUL-terminated path we own for the duration of the call.
        let rc = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            // EINVAL: already gone with a parent (lazy unmounts take children along).
            if err.raw_os_error() != Some(libc::EINVAL) && err.raw_os_error() != Some(libc::ENOENT)
            {
                failures.push(format!("{}: {err}", mount_point.display()));
            }
        }
    }
    failures
}

/// Mount points at or below `dir` (canonical), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .map(|escaped| PathBuf::from(unescape_mount_path(escaped)))
        .filter(|mount_point| mount_point.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// `/proc/self/mounts` writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape_mount_path(escaped: &str) -> String {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(digits) = std::str::from_utf8(&bytes[i + 1..i + 4])
            && let Ok(value) = u8::from_str_radix(digits, 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes `dir` after unmounting everything below it; the error names what stayed.
pub fn remove_work_dir(dir: &Path) -> Result<(), String> {
    let failures = unmount_under(dir);
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "removing {}: {e}; still mounted: {failures:?}",
            dir.display()
        )),
    }
}

/// Resets the peak RSS (`VmHWM`) of process `pid`, so the next [`daemon_peak_rss_bytes`] covers
/// only what follows. False when the kernel refuses.
pub fn reset_daemon_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Peak RSS (`VmHWM`) of process `pid` in bytes.
pub fn daemon_peak_rss_bytes(pid: u32) -> Option<u64> {
    proc_status_kib(&format!("/proc/{pid}/status"), "VmHWM:").map(|kib| kib * 1024)
}

/// CPU seconds of process `pid` so far: its own user + system time and that of its waited-for
/// children (dockerd's unpigz and docker-untar, containerd's unpigz), from `/proc/PID/stat`.
pub fn daemon_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it start past the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14-17 of the whole line (utime, stime, cutime, cstime) are 11-14 here (0-based).
    let ticks: f64 = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (hz > 0.0).then(|| ticks / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_unescape() {
        assert_eq!(unescape_mount_path("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/end\\"), "/end\\");
    }

    #[test]
    fn own_process_figures() {
        let pid = std::process::id();
        assert!(daemon_peak_rss_bytes(pid).unwrap() > 0);
        assert!(daemon_cpu_seconds(pid).is_some());
    }

    #[test]
    fn tmpfs_mount_under_a_work_dir_is_unmounted_before_removal() {
        // Needs root (mount). Skipped otherwise: the peers that mount need root anyway.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let work = tempfile::tempdir().unwrap();
        let inner = work.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&inner)
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::write(inner.join("file"), "x").unwrap();
        let canonical = std::fs::canonicalize(work.path()).unwrap();
        assert_eq!(mounts_under(&canonical).len(), 1);
        remove_work_dir(work.path()).unwrap();
        assert!(!work.path().exists());
        assert!(mounts_under(&canonical).is_empty());
    }

    #[test]
    fn containerd_missing_binary_is_an_error_not_a_panic() {
        let work = tempfile::tempdir().unwrap();
        let err =
            Containerd::start(Path::new("/nonexistent/containerd"), work.path(), None).unwrap_err();
        assert!(err.to_string().contains("could not run it"), "{err}");
    }
}
