//! Measuring runs: wall and CPU time, peak RSS, cache dropping, syncfs, filesystem type, and a
//! description of the machine.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{MachineInfo, Sample};

pub use rpull_extract::filesystem_type;

/// CPU time (user + system) of this process so far, all threads.
pub fn process_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

fn ticks_to_seconds(ticks: u64) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / ticks_per_second.max(1) as f64
}

/// The numbers of `/proc/stat`'s `cpu` line: `user nice system idle iowait irq softirq steal ...`.
fn cpu_line(stat: &str) -> Option<Vec<u64>> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    line.split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect()
}

/// Busy ticks from the text of `/proc/stat`: `user nice system idle iowait irq softirq ...`.
fn busy_ticks(stat: &str) -> Option<u64> {
    let fields = cpu_line(stat)?;
    let field = |i: usize| fields.get(i).copied();
    Some(field(0)? + field(1)? + field(2)? + field(5)? + field(6)?)
}

/// Steal ticks from the text of `/proc/stat` (its eighth number): time this virtual machine's
/// CPUs wanted to run while the hypervisor ran something else.
fn steal_ticks(stat: &str) -> Option<u64> {
    cpu_line(stat)?.get(7).copied()
}

/// The `total` (microseconds) of the `some` line of a `/proc/pressure/*` file: time in which at
/// least one task waited for the resource.
fn pressure_some_total_us(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The machine's counters at the start of a run, to fill a [`Sample`]'s machine-wide figures
/// at its end. Each is `None` where the kernel does not offer it.
/// - `machine_cpu_seconds`: busy CPU of all CPUs, the user, nice, system, irq and softirq time
///   of `/proc/stat`'s `cpu` line (not idle, iowait or steal). It counts every process, the
///   kernel's threads and interrupt work, so a registry serving the bench from this machine is
///   in it.
/// - `steal_seconds`: the same line's steal, time the hypervisor ran something else while this
///   machine's CPUs had work.
/// - `memory_stall_seconds`: the `some` total of `/proc/pressure/memory`.
#[derive(Debug, Clone, Copy)]
pub struct MachineMeter {
    busy: Option<f64>,
    steal: Option<f64>,
    memory_stall: Option<f64>,
}

impl MachineMeter {
    /// Reads the counters now.
    pub fn start() -> MachineMeter {
        let (busy, steal, memory_stall) = machine_counters();
        MachineMeter {
            busy,
            steal,
            memory_stall,
        }
    }

    /// Sets `sample`'s machine-wide figures to the counters' growth since [`start`](Self::start).
    pub fn finish(&self, sample: &mut Sample) {
        let (busy, steal, memory_stall) = machine_counters();
        let since = |now: Option<f64>, then: Option<f64>| Some((now? - then?).max(0.0));
        sample.machine_cpu_seconds = since(busy, self.busy);
        sample.steal_seconds = since(steal, self.steal);
        sample.memory_stall_seconds = since(memory_stall, self.memory_stall);
    }
}

/// Busy and steal seconds of all CPUs since boot, and seconds of memory stalls.
fn machine_counters() -> (Option<f64>, Option<f64>, Option<f64>) {
    let stat = std::fs::read_to_string("/proc/stat").ok();
    let busy = stat.as_deref().and_then(busy_ticks).map(ticks_to_seconds);
    let steal = stat.as_deref().and_then(steal_ticks).map(ticks_to_seconds);
    let memory_stall = std::fs::read_to_string("/proc/pressure/memory")
        .ok()
        .as_deref()
        .and_then(pressure_some_total_us)
        .map(|us| us as f64 / 1e6);
    (busy, steal, memory_stall)
}

/// CPU time of the waited-for children of this process so far.
pub fn children_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_CHILDREN)
}

fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes a plain struct we own; `who` is a valid RUSAGE_* constant.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    timeval(usage.ru_utime) + timeval(usage.ru_stime)
}

fn timeval(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

/// Resets this process's peak RSS (`VmHWM`) so the next [`peak_rss_bytes`] covers only what
/// follows. Returns false where the kernel does not allow it.
///
/// The reset sets the peak to the RSS of the moment, so memory that earlier work freed and the
/// allocator kept would count in the next peak: `rpull bench` runs its in-process stages one
/// after another in one process (round after round), and a stage of 30 MB showed 120 MB after
/// the stages before it. So glibc is first asked to give its free pages back (`malloc_trim`).
pub fn reset_peak_rss() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's own, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak RSS since start or the last [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("/proc/self/status", "VmHWM:").map(|kib| kib * 1024)
}

/// Reads a `kB` field of a `/proc/PID/status` file.
pub fn proc_status_kib(path: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// A child process's outcome and its measured sample (wall time, CPU time and peak RSS of the
/// child and its own waited-for descendants, from `wait4`).
#[derive(Debug)]
pub struct MeasuredRun {
    /// How it exited.
    pub status: ExitStatus,
    /// Wall, CPU and peak RSS; byte counts are left for the caller.
    pub sample: Sample,
    /// Its stderr (last 4 KiB), for error reports.
    pub stderr_tail: String,
    /// Its stdout.
    pub stdout: String,
}

/// What this process's benchmark work is doing: the children of [`run_measured`] not yet reaped,
/// and the stage threads of [`blocking_stage`] still running. A bench that is abandoned (its
/// future dropped on Ctrl-C or SIGTERM) stops them with [`stop_work`] before its directories are
/// removed, so nothing writes into a directory after it is removed.
struct Work {
    children: Vec<libc::pid_t>,
    stages: usize,
    /// Set by [`stop_work`]: no new child is started.
    stopping: bool,
}

static WORK: Mutex<Work> = Mutex::new(Work {
    children: Vec::new(),
    stages: 0,
    stopping: false,
});
/// Notified when a child is reaped or a stage thread ends.
static WORK_ENDED: Condvar = Condvar::new();

fn work() -> MutexGuard<'static, Work> {
    WORK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `work` on the runtime's blocking pool, counted for [`stop_work`].
pub(crate) async fn blocking_stage<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            self::work().stages -= 1;
            WORK_ENDED.notify_all();
        }
    }
    self::work().stages += 1;
    let counted = Counted;
    tokio::task::spawn_blocking(move || {
        let _counted = counted;
        work()
    })
    .await
}

/// Stops this process's benchmark work: no new child of [`run_measured`] starts, the running
/// ones get SIGTERM (SIGKILL after `grace`; `rpull pull` removes its staging directory on
/// SIGTERM), and this waits until they are reaped and every [`blocking_stage`] thread has ended.
/// In-process stages are not interrupted: they end their current run (seconds at most). Then
/// new children are allowed again. Every bench of the process is stopped, not one.
pub(crate) fn stop_work(grace: Duration) {
    let mut state = work();
    state.stopping = true;
    let signal = |state: &Work, signal| {
        for &pid in &state.children {
            // SAFETY: kill has no memory preconditions. A registered pid is a child not yet
            // reaped (it leaves the list before `wait4`), so it is not some other process.
            unsafe { libc::kill(pid, signal) };
        }
    };
    signal(&state, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    let mut killed = false;
    while !state.children.is_empty() || state.stages > 0 {
        let now = Instant::now();
        if now >= deadline && !killed {
            signal(&state, libc::SIGKILL);
            killed = true;
        }
        let wait = if killed {
            Duration::from_secs(1)
        } else {
            deadline - now
        };
        state = WORK_ENDED
            .wait_timeout(state, wait)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0;
        if killed {
            // No child starts once the stop has begun (new ones are refused), so the list only
            // shrinks; any still listed gets SIGKILL again.
            signal(&state, libc::SIGKILL);
        }
    }
    state.stopping = false;
}

/// Runs `command` to completion, measuring it with `wait4`. Stdout and stderr are captured.
/// Refused (`Interrupted`) while an abandoned [`Bench`](crate::Bench) is being stopped.
pub fn run_measured(command: &mut Command) -> io::Result<MeasuredRun> {
    run_measured_with_input(command, None)
}

/// [`run_measured`], with `input` written to the child's stdin (then closed); no input means
/// stdin is `/dev/null`.
pub fn run_measured_with_input(
    command: &mut Command,
    input: Option<Vec<u8>>,
) -> io::Result<MeasuredRun> {
    let started = Instant::now();
    let machine = MachineMeter::start();
    let stdin = if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    // Started and listed under the lock, so that a stop either refuses it or signals it.
    let mut state = work();
    if state.stopping {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "the benchmark is stopping",
        ));
    }
    let mut child = command
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id() as libc::pid_t;
    state.children.push(pid);
    drop(state);
    if let (Some(input), Some(mut pipe)) = (input, child.stdin.take()) {
        std::thread::spawn(move || {
            // A child that exits without reading gets EPIPE here; its exit status says why.
            let _ = io::Write::write_all(&mut pipe, &input);
        });
    }
    let mut stdout = child.stdout.expect("piped");
    let mut stderr = child.stderr.expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let poller = PeakPoller::start(pid);
    // Waits for the exit without reaping, unlists the child, then reaps it: a stop never signals
    // a reaped pid, which another process could have taken.
    let exited = wait_exited(pid);
    // The child's time ends here, not after the bookkeeping and the poller's last reading.
    let seconds = started.elapsed().as_secs_f64();
    let mut state = work();
    state.children.retain(|&listed| listed != pid);
    drop(state);
    WORK_ENDED.notify_all();
    let waited = exited.and_then(|()| wait4(pid));
    let (polled_peak, _) = poller.stop();
    let (raw_status, usage) = waited?;
    let mut sample = Sample {
        seconds,
        cpu_seconds: timeval(usage.ru_utime) + timeval(usage.ru_stime),
        // Not ru_maxrss: on Linux a child's ru_maxrss includes the RSS its parent had when it
        // forked (the mm it replaced at exec), so a big benchmark process would show up as
        // the child's peak. The VmHWM of the child's own (post-exec) memory is what counts.
        peak_rss_bytes: polled_peak,
        ..Sample::default()
    };
    machine.finish(&mut sample);
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = err_reader.join().unwrap_or_default();
    let tail = &stderr[stderr.len().saturating_sub(4096)..];
    Ok(MeasuredRun {
        status: ExitStatus::from_raw(raw_status),
        sample,
        stderr_tail: String::from_utf8_lossy(tail).into_owned(),
        stdout,
    })
}

/// How often the child's VmHWM is read: every [`PEAK_POLL_FIRST`] while the child is young, so
/// that a short run gets readings too, then every [`PEAK_POLL_LATER`]. VmHWM is a high-water
/// mark, so a late read loses only growth in the last interval before the child exits. Each
/// reading wakes this thread, and on a machine the run keeps busy that time is taken from the
/// run (a copy of this poller beside a 1 GB pull into /dev/shm on 2 cores: 0.027 CPU-s of
/// readings at 5 ms, 0.006 at 50 ms; docs/performance.md).
const PEAK_POLL_FIRST: Duration = Duration::from_millis(5);
const PEAK_POLL_LATER: Duration = Duration::from_millis(50);
/// How long the child is read every [`PEAK_POLL_FIRST`].
const PEAK_POLL_YOUNG: Duration = Duration::from_millis(100);

/// The pause before the next reading of a child started `age` ago.
fn peak_poll_interval(age: Duration) -> Duration {
    if age < PEAK_POLL_YOUNG {
        PEAK_POLL_FIRST
    } else {
        PEAK_POLL_LATER
    }
}

/// Reads the VmHWM of a child and all its descendants until stopped; keeps the largest.
struct PeakPoller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Option<u64>, u32)>,
}

impl PeakPoller {
    fn start(pid: libc::pid_t) -> PeakPoller {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            let mut peak: Option<u64> = None;
            let mut readings = 0;
            loop {
                // Read once more after the stop request: a child that exits within the first
                // interval still gets one reading while it is alive, when there was time for one.
                let stopping = flag.load(Ordering::Acquire);
                if let Some(now) = tree_peak_rss(pid) {
                    peak = Some(peak.map_or(now, |p| p.max(now)));
                    readings += 1;
                }
                if stopping {
                    return (peak, readings);
                }
                std::thread::park_timeout(peak_poll_interval(started.elapsed()));
            }
        });
        PeakPoller { stop, thread }
    }

    /// The largest VmHWM read, and how many readings found the child.
    fn stop(self) -> (Option<u64>, u32) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        // Not left to sleep out a long interval: the reading after the stop is at once.
        self.thread.thread().unpark();
        self.thread.join().unwrap_or((None, 0))
    }
}

/// The largest VmHWM (bytes) among `pid` and its live descendants, as `wait4` would report for a
/// process tree (the maximum, not the sum).
fn tree_peak_rss(pid: libc::pid_t) -> Option<u64> {
    let mut pending = vec![pid];
    let mut peak = None;
    let mut visited = 0;
    while let Some(pid) = pending.pop() {
        visited += 1;
        if visited > 4096 {
            break;
        }
        if let Some(kib) = proc_status_kib(&format!("/proc/{pid}/status"), "VmHWM:") {
            peak = Some(peak.map_or(kib * 1024, |p: u64| p.max(kib * 1024)));
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                pending.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<libc::pid_t>().ok()),
                );
            }
        }
    }
    peak
}

/// Waits until the child `pid` has exited, leaving it to be reaped (`WNOWAIT`).
fn wait_exited(pid: libc::pid_t) -> io::Result<()> {
    loop {
        // SAFETY: waitid writes into the zeroed siginfo; pid is our own child, not yet reaped.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn wait4(pid: libc::pid_t) -> io::Result<(i32, libc::rusage)> {
    loop {
        let mut status = 0;
        // SAFETY: wait4 writes into the two locals; pid is our own child, not yet reaped.
        let (rc, usage) = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            let rc = libc::wait4(pid, &mut status, 0, &mut usage);
            (rc, usage)
        };
        if rc == pid {
            return Ok((status, usage));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Writes back dirty data and drops the page cache, dentries and inodes, so the next run is
/// cold; then, on a machine that gives freed memory back to its host ([`free_page_reporting`]),
/// touches and frees [`prime_bytes`] of memory ([`prime_free_memory`]), so that every run starts
/// with free memory its host backs. Needs root; the error says why it could not.
pub fn drop_caches() -> Result<(), String> {
    // SAFETY: sync() takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("could not drop caches ({e}); runs are not cold"))?;
    if free_page_reporting() {
        prime_free_memory(prime_bytes())?;
    }
    Ok(())
}

/// Whether a virtio balloon of this machine reports free memory to its host
/// (`VIRTIO_BALLOON_F_REPORTING`, feature bit 5 of device 5): the host then unmaps each block the
/// guest has left free for a few seconds, and faults it in again, zeroed, when the guest next
/// uses it. That cost lands on whichever run next allocates that memory (page cache, tmpfs
/// pages), and not on another, so runs that should be alike are not (docs/performance.md).
pub fn free_page_reporting() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/bus/virtio/devices") else {
        return false;
    };
    devices.flatten().any(|device| {
        let read = |name: &str| std::fs::read_to_string(device.path().join(name));
        match (read("device"), read("features")) {
            (Ok(id), Ok(features)) => balloon_reports(&id, &features),
            _ => false,
        }
    })
}

/// From a virtio device's sysfs `device` and `features` (one character per feature bit, bit 0
/// first): whether it is a balloon (device 5) with free page reporting (bit 5).
fn balloon_reports(device: &str, features: &str) -> bool {
    device.trim() == "0x0005" && features.as_bytes().get(5) == Some(&b'1')
}

/// What the next runs will allocate at most, as [`set_run_memory`] gave it.
static RUN_MEMORY: AtomicU64 = AtomicU64::new(0);

/// Tells [`drop_caches`] how much memory a run allocates at most (page cache or tmpfs pages of
/// the tree it writes, buffers): what it primes on a machine with [`free_page_reporting`].
/// `rpull bench` sets it from the image's tar bytes.
pub fn set_run_memory(bytes: u64) {
    RUN_MEMORY.store(bytes, Ordering::Relaxed);
}

/// How much memory [`drop_caches`] primes: the run's memory ([`set_run_memory`]) and half as
/// much again (a peer keeps the compressed blobs too) plus 256 MiB, at most half of the memory
/// available.
pub fn prime_bytes() -> u64 {
    let available = proc_status_kib("/proc/meminfo", "MemAvailable:").unwrap_or(0) * 1024;
    prime_size(RUN_MEMORY.load(Ordering::Relaxed), available)
}

/// [`prime_bytes`] for a run of `run` bytes with `available` bytes of memory available.
fn prime_size(run: u64, available: u64) -> u64 {
    (run + run / 2 + (256 << 20)).min(available / 2)
}

/// Maps `bytes` of anonymous memory with every page faulted in, then unmaps it: the freed pages
/// are host-backed again, and the next run's allocations take them before they are reported
/// to the host again (measured here: 1 GiB written into tmpfs took 2.2-2.5 s after the host had
/// taken its memory back, 0.7-0.9 s right after priming 2 GiB; docs/performance.md).
pub fn prime_free_memory(bytes: u64) -> Result<(), String> {
    let Ok(bytes) = usize::try_from(bytes) else {
        return Err(format!("cannot prime {bytes} bytes of memory here"));
    };
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: a new private anonymous mapping, touching no existing memory; it is unmapped
    // below with the same address and length, and never read or written in between.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if map == libc::MAP_FAILED {
            return Err(format!(
                "could not prime {bytes} bytes of free memory: {}",
                io::Error::last_os_error()
            ));
        }
        libc::munmap(map, bytes);
    }
    Ok(())
}

/// `syncfs` of the filesystem holding `path`, timed.
pub fn syncfs(path: &Path) -> io::Result<Duration> {
    let started = Instant::now();
    let dir = std::fs::File::open(path)?;
    // SAFETY: the descriptor is open for the duration of the call.
    let rc = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(started.elapsed())
}

/// Logical CPUs available to this process.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The machine the figures come from.
pub fn machine_info(destination: &Path) -> MachineInfo {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        });
    MachineInfo {
        cpus: cpus(),
        cpu_model,
        memory_bytes: proc_status_kib("/proc/meminfo", "MemTotal:").map(|kib| kib * 1024),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_owned()),
        destination_fs: filesystem_type(destination),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_balloon_with_feature_bit_5_reports_free_pages() {
        // This VM's balloon: bits 1, 2, 5 and 7, then 32 (VERSION_1).
        let features = "01100101000000000000000000000000100000000000000000000000";
        assert!(balloon_reports("0x0005\n", features));
        assert!(!balloon_reports("0x0005\n", "0110000100000000"));
        // A block device with bit 5 set is no balloon.
        assert!(!balloon_reports("0x0002\n", features));
        assert!(!balloon_reports("0x0005\n", ""));
    }

    #[test]
    fn priming_covers_the_run_and_half_again_within_half_of_the_available_memory() {
        assert_eq!(prime_size(1 << 30, 24 << 30), (3 << 29) + (256 << 20));
        assert_eq!(prime_size(0, 24 << 30), 256 << 20);
        // Never more than half of what is available.
        assert_eq!(prime_size(4 << 30, 4 << 30), 2 << 30);
        // The memory is mapped, touched and given back.
        prime_free_memory(16 << 20).unwrap();
        prime_free_memory(0).unwrap();
    }

    /// Memory freed before a reset does not count in the peak after it, even where the
    /// allocator kept it (freed between live allocations, as the stages leave their heaps).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn memory_freed_before_a_reset_is_not_in_the_next_peak() {
        let rss = || proc_status_kib("/proc/self/status", "VmRSS:").unwrap() * 1024;
        // On a thread of its own, so its heap is an arena no other test allocates from.
        std::thread::spawn(move || {
            // As the `rpull` binary sets them (src/allocator.rs).
            // SAFETY: mallopt only changes allocator parameters, under the allocator's own lock.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
            }
            let mut freed = Vec::new();
            let mut kept = Vec::new();
            for i in 0..64u8 {
                freed.push(vec![i | 1; 1 << 20]);
                kept.push(vec![i | 1; 4096]);
            }
            drop(freed);
            let before = rss();
            assert!(reset_peak_rss(), "clear_refs is writable here");
            let after = rss();
            assert!(
                before - after >= 48 << 20,
                "RSS {before} bytes with 64 MiB freed, {after} after the reset"
            );
            assert!(peak_rss_bytes().unwrap() < before - (48 << 20));
            drop(kept);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn measured_child_reports_cpu_and_rss() {
        // A child that burns some CPU and touches 64 MiB.
        let run = run_measured(
            Command::new("python3")
                .args(["-c", "b = bytearray(64 << 20)\nx = sum(range(3_000_000))"]),
        )
        .expect("python3 runs");
        assert!(run.status.success(), "{}", run.stderr_tail);
        assert!(run.sample.cpu_seconds > 0.0);
        assert!(
            run.sample.peak_rss_bytes.unwrap() >= 64 << 20,
            "{:?}",
            run.sample.peak_rss_bytes
        );
        assert!(run.sample.seconds >= run.sample.cpu_seconds * 0.5);
    }

    #[test]
    fn busy_ticks_are_user_nice_system_irq_and_softirq() {
        let stat = "cpu  3113678 70880 2969927 5073388 426945 7 140966 5326 0 0\n\
                    cpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2 3\n";
        assert_eq!(
            busy_ticks(stat),
            Some(3113678 + 70880 + 2969927 + 7 + 140966)
        );
        // Per-CPU lines alone, a short line or a non-number: no reading.
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7\n"), None);
        assert_eq!(busy_ticks("cpu  1 2 3 4 5\n"), None);
        assert_eq!(busy_ticks("cpu  1 2 x 4 5 6 7\n"), None);
    }

    #[test]
    fn steal_is_the_eighth_number_and_memory_stalls_the_some_total() {
        let stat = "cpu  3113678 70880 2969927 5073388 426945 7 140966 5326 0 0\n";
        assert_eq!(steal_ticks(stat), Some(5326));
        // Kernels before 2.6.11 had no steal column.
        assert_eq!(steal_ticks("cpu  1 2 3 4 5 6 7\n"), None);
        let pressure = "some avg10=0.00 avg60=0.12 avg300=0.40 total=1234567\n\
                        full avg10=0.00 avg60=0.00 avg300=0.00 total=99\n";
        assert_eq!(pressure_some_total_us(pressure), Some(1_234_567));
        assert_eq!(pressure_some_total_us("full avg10=0.00 total=99\n"), None);
        assert_eq!(pressure_some_total_us("some avg10=0.00 total=x\n"), None);
    }

    /// All the machine's CPUs (the `cpuN` lines of `/proc/stat`), which may be more than this
    /// process may use.
    fn stat_cpus() -> usize {
        std::fs::read_to_string("/proc/stat")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count()
    }

    /// The machine-wide figures of a real run: the counters are read, and they grow by no more
    /// than the run's wall time (memory stalls) or its wall time on every CPU (steal).
    #[test]
    fn a_run_reads_the_machines_steal_and_memory_stalls() {
        let run = run_measured(Command::new("sh").args(["-c", "sleep 0.05"])).unwrap();
        let sample = run.sample;
        let steal = sample.steal_seconds.expect("/proc/stat has a steal column");
        assert!(
            steal <= sample.seconds * stat_cpus() as f64 + 0.04,
            "steal {steal} s in {} s",
            sample.seconds
        );
        if std::path::Path::new("/proc/pressure/memory").exists() {
            let stall = sample
                .memory_stall_seconds
                .expect("pressure stall information");
            assert!(
                stall <= sample.seconds + 0.001,
                "stall {stall} s in {} s",
                sample.seconds
            );
        } else {
            assert_eq!(sample.memory_stall_seconds, None);
        }
    }

    #[test]
    fn the_machine_cpu_of_a_child_includes_its_own() {
        let run = run_measured(Command::new("python3").args(["-c", "x = sum(range(20_000_000))"]))
            .expect("python3 runs");
        assert!(run.status.success(), "{}", run.stderr_tail);
        let machine = run
            .sample
            .machine_cpu_seconds
            .expect("/proc/stat is readable");
        // /proc/stat counts in ticks of 10 ms: allow two at each end.
        assert!(
            machine >= run.sample.cpu_seconds - 0.04,
            "machine {machine} s against the child's own {} s",
            run.sample.cpu_seconds
        );
        assert!(
            machine <= run.sample.seconds * stat_cpus() as f64 + 0.04,
            "machine {machine} s in {} s of wall time",
            run.sample.seconds
        );
    }

    /// Readings of a child's peak, and its wall time, over a child that runs for `seconds`.
    fn readings_over(seconds: &str) -> (u32, Duration) {
        let mut child = Command::new("sleep").arg(seconds).spawn().unwrap();
        let started = Instant::now();
        let poller = PeakPoller::start(child.id() as libc::pid_t);
        child.wait().unwrap();
        let lived = started.elapsed();
        let (peak, readings) = poller.stop();
        assert!(peak.is_some_and(|p| p > 0));
        (readings, lived)
    }

    #[test]
    fn the_peak_is_read_often_while_the_child_is_young_and_seldom_after() {
        // Young: every 5 ms, so a run of 90 ms gets many readings (every 50 ms would make 2 or
        // 3). A busy machine makes them late, never early: the bounds leave room below.
        let (readings, lived) = readings_over("0.09");
        assert!(readings >= 6, "{readings} readings in {lived:?}");
        assert!(readings <= 25, "{readings} readings in {lived:?}");
        // Then every 50 ms: about 20 + 18 over a second, where 5 ms all along made 200. That
        // the later readings still come is `growth_after_the_young_phase_is_read`.
        let (readings, lived) = readings_over("1");
        assert!(readings <= 45, "{readings} readings in {lived:?}");
    }

    #[test]
    fn growth_after_the_young_phase_is_read() {
        // 64 MiB touched at about 0.3 s, the child alive 0.15 s more: readings every 50 ms
        // see it.
        let run = run_measured(Command::new("python3").args([
            "-c",
            "import time\ntime.sleep(0.3)\nb = bytearray(64 << 20)\ntime.sleep(0.15)",
        ]))
        .expect("python3 runs");
        assert!(run.status.success(), "{}", run.stderr_tail);
        assert!(
            run.sample.peak_rss_bytes.unwrap() >= 64 << 20,
            "{:?}",
            run.sample.peak_rss_bytes
        );
    }

    #[test]
    fn the_wall_time_ends_at_the_exit_not_after_the_last_reading() {
        // Neither the measured time nor the call waits for the poller's next reading (whether
        // the child's exit falls in a pause depends on when the readings come; the stop's own
        // wake-up is `a_stop_does_not_wait_out_the_pause`).
        let called = Instant::now();
        let run = run_measured(Command::new("sleep").arg("0.2")).unwrap();
        let returned = called.elapsed();
        assert!(run.status.success());
        assert!(
            run.sample.seconds < 0.24,
            "{} s for a sleep of 0.2 s",
            run.sample.seconds
        );
        assert!(
            returned < Duration::from_millis(240),
            "{returned:?} for a sleep of 0.2 s"
        );
    }

    #[test]
    fn a_stop_does_not_wait_out_the_pause() {
        // 125 ms after the start the poller is in a 50 ms pause (its readings come at about 100
        // and 150 ms, later on a busy machine): the stop wakes it for its last reading at once.
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let poller = PeakPoller::start(child.id() as libc::pid_t);
        std::thread::sleep(Duration::from_millis(125));
        let stopping = Instant::now();
        let (peak, _) = poller.stop();
        let stopped = stopping.elapsed();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(peak.is_some());
        assert!(
            stopped < Duration::from_millis(15),
            "the stop took {stopped:?}"
        );
    }

    #[test]
    fn a_small_child_of_a_big_parent_is_measured_small() {
        // ru_maxrss would report at least this process's RSS at fork time.
        let ballast = vec![1u8; 256 << 20];
        std::hint::black_box(&ballast);
        let run = run_measured(Command::new("sh").args(["-c", "sleep 0.05"])).unwrap();
        assert!(run.status.success());
        let peak = run.sample.peak_rss_bytes.expect("measured");
        assert!(peak < 64 << 20, "peak {peak} includes the parent's memory");
        drop(ballast);
    }

    #[test]
    fn failing_child_keeps_its_stderr() {
        let run = run_measured(Command::new("sh").args(["-c", "echo boom >&2; exit 3"])).unwrap();
        assert_eq!(run.status.code(), Some(3));
        assert_eq!(run.stderr_tail.trim(), "boom");
    }

    #[test]
    fn input_reaches_the_child_stdin() {
        let run = run_measured_with_input(
            Command::new("sh").args(["-c", "read line; echo \"got $line\""]),
            Some(b"secret\n".to_vec()),
        )
        .unwrap();
        assert!(run.status.success(), "{}", run.stderr_tail);
        assert_eq!(run.stdout, "got secret\n");
    }

    #[test]
    fn peak_rss_is_readable() {
        assert!(peak_rss_bytes().unwrap() > 0);
    }
}
