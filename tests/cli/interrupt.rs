//! Ctrl-C (or SIGTERM) in the middle of a pull: exit status 130 (143), DIR left as it was, no
//! staging directory.
//!
//! The registry is reached through a forwarder that trickles the bytes (about 1.3 MB/s), so the
//! pull is reliably still downloading (and extracting) when the signal arrives.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rpull_testing::{Compression, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry};

use crate::common::{Sandbox, block_on, staging_dirs};

const CHUNK: usize = 64 * 1024;
const TICK: Duration = Duration::from_millis(50);
const TIMEOUT: Duration = Duration::from_secs(60);

/// Forwards every connection on its port to `upstream`, sending responses `CHUNK` bytes per `TICK`.
/// Its threads end with their connections; the listener lives until the test process ends.
fn slow_forwarder(upstream: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the forwarder");
    let port = listener.local_addr().expect("forwarder address").port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut client_reader, mut server_writer) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client_reader, &mut server_writer);
                let _ = server_writer.shutdown(Shutdown::Write);
            });
            std::thread::spawn(move || trickle(server, client));
        }
    });
    port
}

fn trickle(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
        std::thread::sleep(TICK);
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// `len` bytes that do not compress (xorshift), so the blob is as big as the data.
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A line of stdout, or the end of it.
enum Line {
    Json(serde_json::Value),
    End,
}

fn read_lines(child: &mut Child) -> mpsc::Receiver<Line> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            if tx.send(Line::Json(value)).is_err() {
                return;
            }
        }
        let _ = tx.send(Line::End);
    });
    rx
}

/// All of the child's stderr, read on a thread of its own, when joined.
fn read_stderr(child: &mut Child) -> std::thread::JoinHandle<String> {
    let mut stderr = child.stderr.take().expect("piped stderr");
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    })
}

fn wait_with_timeout(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for rpull") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rpull did not exit within {TIMEOUT:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

enum Attempt {
    /// The pull finished before the signal could interrupt it: try with a bigger layer.
    TooFast,
    Interrupted,
}

/// How a pull is stopped: the signal, the exit status it must end with, and the word it must say.
#[derive(Clone, Copy)]
struct Stop {
    signal: rustix::process::Signal,
    code: i32,
    word: &'static str,
}

const CTRL_C: Stop = Stop {
    signal: rustix::process::Signal::INT,
    code: 130,
    word: "interrupted",
};
const SIGTERM: Stop = Stop {
    signal: rustix::process::Signal::TERM,
    code: 143,
    word: "terminated",
};

/// Pulls through the slow forwarder, sends `stop`'s signal at the first `layer_progress`, checks
/// cleanup.
fn interrupt_once(
    sandbox: &Sandbox,
    reference: &str,
    dest: &Path,
    force: bool,
    extra_args: &[&str],
    stop: Stop,
) -> Attempt {
    let Stop { signal, code, word } = stop;
    let mut rpull = sandbox
        .rpull()
        .args(["pull", "--json", "--plain-http"])
        .args(extra_args);
    if force {
        rpull = rpull.arg("--force");
    }
    let mut command = rpull.arg(reference).arg(dest).into_command();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning rpull");
    let stderr = read_stderr(&mut child);
    let lines = read_lines(&mut child);
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(TIMEOUT) {
            Ok(Line::Json(value)) => {
                let progress = value["event"] == "layer_progress";
                seen.push(value);
                if progress {
                    break;
                }
            }
            Ok(Line::End) => {
                let status = wait_with_timeout(&mut child);
                let stderr = stderr.join().unwrap_or_default();
                assert!(
                    status.success(),
                    "rpull failed before any progress: {status}\n{stderr}\n{seen:#?}"
                );
                return Attempt::TooFast;
            }
            Err(_) => {
                let _ = child.kill();
                panic!("no layer_progress within {TIMEOUT:?}; events so far: {seen:#?}");
            }
        }
    }
    // The pull is under way: its staging directory exists (so the check below can fail).
    let staging_during = staging_dirs(dest);
    assert_eq!(
        staging_during.len(),
        1,
        "a staging directory while pulling: {staging_during:?}"
    );

    rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal)
        .expect("sending the signal");
    let status = wait_with_timeout(&mut child);
    let stderr = stderr.join().unwrap_or_default();
    while let Ok(Line::Json(value)) = lines.recv_timeout(Duration::from_secs(5)) {
        seen.push(value);
    }
    if status.success() {
        return Attempt::TooFast;
    }
    assert_eq!(
        status.code(),
        Some(code),
        "exit status after {signal:?}: {status}\n{stderr}"
    );
    assert!(stderr.contains(word), "says it was {word}: {stderr:?}");
    assert!(
        seen.iter()
            .all(|e| e["event"] != "committed" && e["event"] != "summary"),
        "nothing committed: {seen:#?}"
    );
    assert_eq!(
        staging_dirs(dest),
        Vec::<String>::new(),
        "the staging directory is removed after {signal:?}"
    );
    Attempt::Interrupted
}

/// With `extra_args`, e.g. a limit of one extraction, so the second layer waits for the big one.
fn interrupted_pull_leaves_nothing(force: bool, extra_args: &[&str], stop: Stop) {
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let forwarder = slow_forwarder(registry.port());
    for (attempt, megabytes) in [8usize, 32, 128].into_iter().enumerate() {
        let tag = format!("big:{megabytes}");
        let image = ImageBuilder::new()
            .layer(
                LayerBuilder::new().file("small", "first layer\n", 0o644),
                Compression::Gzip,
            )
            .layer(
                LayerBuilder::new().file(
                    "big",
                    noise(megabytes << 20, 0x9e37_79b9_7f4a_7c15 + attempt as u64),
                    0o644,
                ),
                Compression::Gzip,
            )
            .build();
        block_on(registry.push_image(&image, &tag)).expect("pushing the big image");

        let sandbox = Sandbox::new();
        let dest = sandbox.join("rootfs");
        if force {
            sandbox.write("rootfs/keep", "old tree\n");
        }
        let reference = format!("127.0.0.1:{forwarder}/{tag}");
        match interrupt_once(&sandbox, &reference, &dest, force, extra_args, stop) {
            Attempt::Interrupted => {
                if force {
                    let kept = std::fs::read_to_string(dest.join("keep"))
                        .expect("the old tree is still there");
                    assert_eq!(kept, "old tree\n");
                    let names: Vec<_> = std::fs::read_dir(&dest)
                        .unwrap()
                        .map(|e| e.unwrap().file_name())
                        .collect();
                    assert_eq!(names, ["keep"], "DIR is left as it was");
                } else {
                    assert!(!dest.exists(), "DIR must not appear after Ctrl-C");
                }
                return;
            }
            Attempt::TooFast => {
                eprintln!("the pull of {megabytes} MiB finished before the signal; retrying bigger")
            }
        }
    }
    panic!("every pull finished before the signal landed");
}

#[test]
fn ctrl_c_removes_staging_and_creates_nothing() {
    interrupted_pull_leaves_nothing(false, &[], CTRL_C);
}

#[test]
fn sigterm_removes_staging_and_creates_nothing() {
    interrupted_pull_leaves_nothing(false, &[], SIGTERM);
}

#[test]
fn ctrl_c_reaches_a_layer_waiting_for_an_extraction_slot() {
    // One extraction slot: the layer holding it and the one waiting for it both end on Ctrl-C
    // (a slot held by a cancelled layer is given back, so nothing waits for ever).
    interrupted_pull_leaves_nothing(false, &["--max-concurrent-extractions", "1"], CTRL_C);
}

#[test]
fn ctrl_c_with_force_leaves_the_old_tree() {
    interrupted_pull_leaves_nothing(true, &[], CTRL_C);
}

/// The pids of `parent`'s children whose command line has `word` as an argument (from every
/// thread's `children`: the bench starts its children on pool threads).
fn children_with_arg(parent: u32, word: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.split(|&b| b == 0).any(|arg| arg == word.as_bytes()) {
                found.push(pid);
            }
        }
    }
    found
}

/// SIGTERM to `rpull bench` while its end-to-end stage's `rpull pull` child is writing: the child
/// is stopped too (before, it went on and committed the tree after the bench said nothing was),
/// and the bench's directories beside `--dest` are removed.
#[test]
fn sigterm_to_bench_stops_its_pull_and_leaves_nothing() {
    let registry = TestRegistry::start(RegistryOptions::plain()).expect("starting docker-registry");
    let forwarder = slow_forwarder(registry.port());
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("big", noise(4 << 20, 0x2545_f491_4f6c_dd1d), 0o644),
            Compression::Gzip,
        )
        .build();
    block_on(registry.push_image(&image, "bench:slow")).expect("pushing the image");
    let sandbox = Sandbox::new();
    let dest = sandbox.join("out");
    let reference = format!("127.0.0.1:{forwarder}/bench:slow");
    let mut command = sandbox
        .rpull()
        .args(["bench", "--plain-http", "--warm", "--runs", "1", "--dest"])
        .arg(&dest)
        .arg(&reference)
        .into_command();
    let mut bench = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning rpull bench");
    let stderr = read_stderr(&mut bench);
    // Its end-to-end pull, once that has a staging directory (it is writing beside DIR).
    let deadline = Instant::now() + Duration::from_secs(120);
    let pull = loop {
        if let Some(status) = bench.try_wait().expect("waiting for rpull bench") {
            panic!(
                "the bench ended before its pull was seen: {status}\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no end-to-end pull within 120 s");
        if let [pid] = children_with_arg(bench.id(), "pull")[..]
            && !staging_dirs(&dest).is_empty()
        {
            break pid;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    rustix::process::kill_process(rustix::process::Pid::from_child(&bench), SIGTERM.signal)
        .expect("sending SIGTERM");
    let status = wait_with_timeout(&mut bench);
    let stderr = stderr.join().unwrap_or_default();
    assert_eq!(status.code(), Some(SIGTERM.code), "{status}\n{stderr}");
    assert!(
        stderr.contains(SIGTERM.word),
        "says it was terminated: {stderr:?}"
    );
    assert!(
        !Path::new(&format!("/proc/{pull}")).exists(),
        "the bench's pull (pid {pull}) is stopped with it"
    );
    assert!(!dest.exists(), "no tree is committed after the signal");
    let left: Vec<String> = std::fs::read_dir(sandbox.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("rpull") || name.starts_with("rpb-"))
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "the bench's directories are removed"
    );
}
