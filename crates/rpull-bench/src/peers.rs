//! The tools rpull is compared with, run on the same image: docker (through a private dockerd),
//! podman, ctr (through a private containerd), skopeo, crane and `crane export | tar`. Each runs
//! `runs` times, cold every run: its copy of the image (and its cache) is removed first, and the
//! page cache dropped when asked. A tool that is missing or fails is reported with the reason and
//! no number.
//!
//! All their data lives under `PeerContext::work_dir` (which should be on the same filesystem as
//! rpull's destination), daemons' sockets under short directories in /tmp; everything is stopped,
//! unmounted and removed before `run_peers` returns.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use crate::daemons::{self, Containerd, Dockerd};
use crate::resources::{self, run_measured};
use crate::{PeerResult, Sample, Summary};

/// A peer tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// `docker pull` against a private dockerd: download, verify, decompress, extract into overlay2.
    Docker,
    /// `podman pull` into its own storage root: download, verify, decompress, extract. Its layer
    /// downloads go to `TMPDIR`, set to a directory of its own beside the root.
    Podman,
    /// `ctr images pull` against a private containerd: fetch to the content store, then unpack.
    Ctr,
    /// `skopeo copy` to an OCI layout: download and verify only.
    Skopeo,
    /// `crane pull --format oci`: download and verify only.
    Crane,
    /// `crane export - | tar -x`: download, flatten and extract (no digest check).
    CraneExport,
}

impl Peer {
    /// Every peer, in the order reports list them.
    pub const ALL: [Peer; 6] = [
        Peer::Docker,
        Peer::Podman,
        Peer::Ctr,
        Peer::Skopeo,
        Peer::Crane,
        Peer::CraneExport,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Docker => "docker",
            Peer::Podman => "podman",
            Peer::Ctr => "ctr",
            Peer::Skopeo => "skopeo",
            Peer::Crane => "crane",
            Peer::CraneExport => "crane-export",
        }
    }

    /// What the tool does with the image, for the report's `does`.
    pub fn does(self) -> &'static str {
        match self {
            Peer::Docker => {
                "download and extract: dockerd downloads each layer to a temporary file, verifies it, then \
                 decompresses (unpigz) and untars it into its overlay2 store, layer after layer"
            }
            Peer::Podman => {
                "download and extract: downloads the layers to temporary files, verifies them, then decompresses \
                 and untars each into its overlay store in layer order"
            }
            Peer::Ctr => {
                "download and extract: ctr fetches every blob into containerd's content store, then containerd \
                 unpacks (unpigz + untar) each layer into overlayfs snapshots"
            }
            Peer::Skopeo => {
                "download only: copies the blobs to an OCI layout, digests verified, nothing decompressed"
            }
            Peer::Crane => {
                "download only: writes the blobs to an OCI layout, digests verified, nothing decompressed"
            }
            Peer::CraneExport => {
                "download and extract: crane streams the flattened filesystem (layers one after another, \
                 decompressed in crane, no digest check) into GNU tar -x"
            }
        }
    }

    /// The executables it needs.
    fn executables(self) -> &'static [&'static str] {
        match self {
            Peer::Docker => &["docker", "dockerd"],
            Peer::Podman => &["podman"],
            Peer::Ctr => &["ctr", "containerd"],
            Peer::Skopeo => &["skopeo"],
            Peer::Crane => &["crane"],
            Peer::CraneExport => &["crane", "tar", "bash"],
        }
    }

    /// How to install it.
    fn install_hint(self) -> &'static str {
        match self {
            Peer::Docker => "apt-get install docker.io",
            Peer::Podman => "apt-get install podman",
            Peer::Ctr => "apt-get install containerd",
            Peer::Skopeo => "apt-get install skopeo",
            Peer::Crane | Peer::CraneExport => {
                "go install github.com/google/go-containerregistry/cmd/crane@latest (scripts/install-peers)"
            }
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Peer {
    type Err = String;

    fn from_str(name: &str) -> Result<Peer, String> {
        Peer::ALL
            .into_iter()
            .find(|peer| peer.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Peer::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown peer {name:?}; known peers: {}, or all",
                    known.join(", ")
                )
            })
    }
}

/// Parses `all` or a comma-separated list of peer names (duplicates dropped, order kept).
pub fn parse_peers(list: &str) -> Result<Vec<Peer>, String> {
    let mut peers = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let more = if name == "all" {
            Peer::ALL.to_vec()
        } else {
            vec![name.parse()?]
        };
        for peer in more {
            if !peers.contains(&peer) {
                peers.push(peer);
            }
        }
    }
    if peers.is_empty() {
        return Err(
            "no peers given; known peers: docker, podman, ctr, skopeo, crane, crane-export, or all"
                .to_owned(),
        );
    }
    Ok(peers)
}

/// Where and how the peers run.
#[derive(Debug, Clone)]
pub struct PeerContext {
    /// The image, as `docker pull` takes it (`127.0.0.1:5000/repo:tag`). Plain HTTP registries on
    /// loopback are expected: docker treats them as insecure by default, the others get their
    /// insecure / plain-HTTP flags.
    pub reference: String,
    /// The peers' data roots and outputs go below this directory (one subdirectory per peer,
    /// removed afterwards). Put it on the same filesystem as rpull's destination.
    pub work_dir: PathBuf,
    /// Runs per peer.
    pub runs: usize,
    /// Drop the page cache before every run (needs root).
    pub cold: bool,
    /// The PATH the tools are looked up in and run with. `None`: this process's PATH, plus
    /// `$HOME/go/bin` (where `go install` puts crane).
    pub path: Option<OsString>,
}

impl PeerContext {
    /// 3 cold runs, tools from PATH.
    pub fn new(reference: impl Into<String>, work_dir: impl Into<PathBuf>) -> PeerContext {
        PeerContext {
            reference: reference.into(),
            work_dir: work_dir.into(),
            runs: 3,
            cold: true,
            path: None,
        }
    }

    fn search_path(&self) -> OsString {
        if let Some(path) = &self.path {
            return path.clone();
        }
        let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        if let Some(home) = std::env::var_os("HOME") {
            dirs.push(Path::new(&home).join("go/bin"));
        }
        std::env::join_paths(dirs).unwrap_or_default()
    }
}

/// The first executable file called `name` in `path`.
pub fn find_executable(name: &str, path: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runs each peer in turn (never two at once) and reports each, in the order given.
pub async fn run_peers(peers: &[Peer], ctx: &PeerContext) -> Vec<PeerResult> {
    let peers = peers.to_vec();
    let ctx = ctx.clone();
    let names: Vec<Peer> = peers.clone();
    match resources::blocking_stage(move || {
        peers.iter().map(|peer| run_peer(*peer, &ctx)).collect()
    })
    .await
    {
        Ok(results) => results,
        Err(err) => names
            .into_iter()
            .map(|peer| {
                skipped(
                    peer,
                    None,
                    String::new(),
                    format!("failed: the benchmark thread died: {err}"),
                )
            })
            .collect(),
    }
}

/// Joins one peer's results of one run each (`rpull bench` runs each peer once per round) into
/// the result of all its runs: the samples in round order, the version and options of the first
/// round, each note once and the spread note over all the runs. A round without a number makes
/// the whole result one without a number, with that round's reason. An empty list is `None`.
pub fn merge_peer_rounds(parts: Vec<PeerResult>) -> Option<PeerResult> {
    let first = parts.first()?;
    if let Some(failed) = parts.iter().find(|part| part.skipped.is_some()) {
        return Some(PeerResult {
            samples: Vec::new(),
            seconds: None,
            ..failed.clone()
        });
    }
    let (tool, does) = (first.tool.clone(), first.does.clone());
    let (version, options) = (first.version.clone(), first.options.clone());
    let mut notes: Vec<String> = Vec::new();
    for note in parts.iter().flat_map(|part| &part.notes) {
        if !notes.contains(note) {
            notes.push(note.clone());
        }
    }
    let samples: Vec<Sample> = parts.into_iter().flat_map(|part| part.samples).collect();
    let seconds: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    notes.extend(crate::stages::spread_note(&seconds));
    Some(PeerResult {
        tool,
        does,
        version,
        options,
        seconds: Summary::of(&seconds),
        samples,
        skipped: None,
        notes,
    })
}

fn skipped(peer: Peer, version: Option<String>, options: String, reason: String) -> PeerResult {
    PeerResult {
        tool: peer.name().to_owned(),
        does: peer.does().to_owned(),
        version,
        options,
        samples: Vec::new(),
        seconds: None,
        skipped: Some(reason),
        notes: Vec::new(),
    }
}

/// A peer's figures from its runs, with a note when they are far apart (as for a stage).
fn ran(peer: Peer, version: Option<String>, options: String, samples: Vec<Sample>) -> PeerResult {
    let seconds: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    PeerResult {
        tool: peer.name().to_owned(),
        does: peer.does().to_owned(),
        version,
        options,
        seconds: Summary::of(&seconds),
        notes: crate::stages::spread_note(&seconds).into_iter().collect(),
        samples,
        skipped: None,
    }
}

/// The executables a peer runs, resolved.
struct Tools {
    paths: Vec<PathBuf>,
    path_env: OsString,
}

impl Tools {
    fn get(&self, index: usize) -> &Path {
        &self.paths[index]
    }

    fn command(&self, index: usize) -> Command {
        let mut command = Command::new(self.get(index));
        command.env("PATH", &self.path_env);
        command
    }
}

/// Runs one peer `ctx.runs` times (blocking). Never panics on a tool's failure: it is reported.
pub fn run_peer(peer: Peer, ctx: &PeerContext) -> PeerResult {
    let path_env = ctx.search_path();
    let mut paths = Vec::new();
    for name in peer.executables() {
        match find_executable(name, &path_env) {
            Some(path) => paths.push(path),
            None => {
                return skipped(
                    peer,
                    None,
                    String::new(),
                    format!(
                        "not installed: `{name}` is not in PATH ({})",
                        peer.install_hint()
                    ),
                );
            }
        }
    }
    let tools = Tools { paths, path_env };
    let version = version(peer, &tools);
    let dir = ctx.work_dir.join(format!("peer-{}", peer.name()));
    if let Err(reason) = daemons::remove_work_dir(&dir).and_then(|()| {
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))
    }) {
        return skipped(peer, version, String::new(), format!("failed: {reason}"));
    }
    let outcome = match peer {
        Peer::Docker => run_docker(ctx, &tools, &dir),
        Peer::Podman => run_podman(ctx, &tools, &dir),
        Peer::Ctr => run_ctr(ctx, &tools, &dir),
        Peer::Skopeo => run_skopeo(ctx, &tools, &dir),
        Peer::Crane => run_crane(ctx, &tools, &dir),
        Peer::CraneExport => run_crane_export(ctx, &tools, &dir),
    };
    let cleanup = daemons::remove_work_dir(&dir);
    let (options, samples) = match outcome {
        Ok(ran) => ran,
        Err(failed) => {
            return skipped(
                peer,
                version,
                failed.options,
                format!("failed: {}", failed.reason),
            );
        }
    };
    if let Err(reason) = cleanup {
        tracing::warn!(peer = peer.name(), "{reason}");
    }
    ran(peer, version, options, samples)
}

/// A peer that could not produce numbers: the options it was (to be) run with, and why.
struct Failed {
    options: String,
    reason: String,
}

type Outcome = Result<(String, Vec<Sample>), Failed>;

fn first_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
}

fn version_of(tools: &Tools, index: usize, args: &[&str]) -> Option<String> {
    let output = tools.command(index).args(args).output().ok()?;
    first_line(&String::from_utf8_lossy(&output.stdout))
        .or_else(|| first_line(&String::from_utf8_lossy(&output.stderr)))
}

fn version(peer: Peer, tools: &Tools) -> Option<String> {
    match peer {
        Peer::Docker => {
            let client = version_of(tools, 0, &["--version"])?;
            let daemon =
                version_of(tools, 1, &["--version"]).unwrap_or_else(|| "unknown".to_owned());
            Some(format!("{client} (client); {daemon} (dockerd)"))
        }
        Peer::Ctr => {
            let client = version_of(tools, 0, &["--version"])?;
            let daemon =
                version_of(tools, 1, &["--version"]).unwrap_or_else(|| "unknown".to_owned());
            Some(format!("{client}; {daemon}"))
        }
        Peer::Crane => version_of(tools, 0, &["version"]).map(|v| format!("crane {v}")),
        Peer::CraneExport => {
            let crane = version_of(tools, 0, &["version"])?;
            let tar =
                version_of(tools, 1, &["--version"]).unwrap_or_else(|| "tar unknown".to_owned());
            Some(format!("crane {crane}; {tar}"))
        }
        Peer::Podman | Peer::Skopeo => version_of(tools, 0, &["--version"]),
    }
}

/// Shell-like rendering of a command, for `options`.
fn render(command: &Command) -> String {
    let program = Path::new(command.get_program())
        .file_name()
        .unwrap_or(command.get_program());
    std::iter::once(program)
        .chain(command.get_args())
        .map(|arg| {
            let arg = arg.to_string_lossy();
            if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || "'\"|;&$".contains(c))
            {
                format!("'{}'", arg.replace('\'', r"'\''"))
            } else {
                arg.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a command to completion (not measured); an error carries its stderr.
fn run_quiet(command: &mut Command) -> Result<String, String> {
    let output = command
        .output()
        .map_err(|e| format!("{}: {e}", render(command)))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{} exited with {}: {}",
            render(command),
            output.status,
            tail(&String::from_utf8_lossy(&output.stderr))
        ))
    }
}

/// The last few lines of a tool's stderr, for a failure reason.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// How one peer is measured: what to do before every run (remove its copy of the image), the
/// command to time, and the daemon doing the work, if any.
struct Measure<'a> {
    ctx: &'a PeerContext,
    /// Removes the image (and cache) the previous run left. Errors end the peer.
    reset: &'a mut dyn FnMut() -> Result<(), String>,
    /// The measured command.
    command: &'a dyn Fn() -> Command,
    /// A daemon whose CPU time and peak RSS belong to the pull.
    daemon_pid: Option<u32>,
    /// Directory whose filesystem is `syncfs`ed after each run (time reported as `sync_seconds`).
    sync_dir: &'a Path,
}

impl Measure<'_> {
    fn run(self) -> Result<Vec<Sample>, String> {
        let mut samples = Vec::with_capacity(self.ctx.runs);
        for run in 1..=self.ctx.runs.max(1) {
            (self.reset)()?;
            if self.ctx.cold
                && let Err(reason) = resources::drop_caches()
            {
                tracing::debug!("{reason}");
            }
            let daemon_before = self.daemon_pid.map(|pid| {
                daemons::reset_daemon_peak_rss(pid);
                daemons::daemon_cpu_seconds(pid).unwrap_or(0.0)
            });
            let mut command = (self.command)();
            let measured = run_measured(&mut command)
                .map_err(|e| format!("could not run {}: {e}", render(&command)))?;
            if !measured.status.success() {
                let output = if measured.stderr_tail.trim().is_empty() {
                    &measured.stdout
                } else {
                    &measured.stderr_tail
                };
                return Err(format!(
                    "run {run}: exited with {}: {}",
                    measured.status,
                    tail(output)
                ));
            }
            let mut sample = measured.sample;
            if let (Some(pid), Some(cpu_before)) = (self.daemon_pid, daemon_before) {
                // The daemon does the work; the client only waits. Its CPU (and its waited-for
                // children's) counts, and its peak RSS is added to the client's.
                if let Some(cpu_after) = daemons::daemon_cpu_seconds(pid) {
                    sample.cpu_seconds += (cpu_after - cpu_before).max(0.0);
                }
                if let (Some(client), Some(daemon)) =
                    (sample.peak_rss_bytes, daemons::daemon_peak_rss_bytes(pid))
                {
                    sample.peak_rss_bytes = Some(client + daemon);
                }
            }
            sample.sync_seconds = resources::syncfs(self.sync_dir)
                .ok()
                .map(|d| d.as_secs_f64());
            samples.push(sample);
        }
        (self.reset)()?;
        Ok(samples)
    }
}

fn failed(options: &str) -> impl Fn(String) -> Failed + '_ {
    move |reason| Failed {
        options: options.to_owned(),
        reason,
    }
}

fn run_docker(ctx: &PeerContext, tools: &Tools, dir: &Path) -> Outcome {
    let data_root = dir.join("docker-root");
    let dockerd =
        Dockerd::start(tools.get(1), &data_root, Some(&tools.path_env)).map_err(|e| Failed {
            options: String::new(),
            reason: e.to_string(),
        })?;
    let config_dir = dir.join("docker-config");
    let _ = std::fs::create_dir_all(&config_dir);
    let docker = |args: &[&str]| {
        let mut command = tools.command(0);
        command
            .env("DOCKER_CONFIG", &config_dir)
            .arg("-H")
            .arg(dockerd.host())
            .args(args);
        command
    };
    let driver =
        run_quiet(&mut docker(&["info", "--format", "{{.Driver}}"])).map(|s| s.trim().to_owned());
    let options = format!(
        "{} (dockerd {}, storage driver {})",
        render(&docker(&["pull", &ctx.reference])),
        dockerd.args().join(" "),
        driver.as_deref().unwrap_or("unknown"),
    );
    let mut reset = || {
        // rmi fails when the image is not there (the first run): that is fine; prune catches the rest.
        let _ = run_quiet(&mut docker(&["rmi", "-f", &ctx.reference]));
        run_quiet(&mut docker(&["image", "prune", "-af"])).map(drop)
    };
    let command = || docker(&["pull", &ctx.reference]);
    let result = Measure {
        ctx,
        reset: &mut reset,
        command: &command,
        daemon_pid: Some(dockerd.pid()),
        sync_dir: dir,
    }
    .run();
    let log = dockerd.log_tail(2);
    dockerd.stop();
    match result {
        Ok(samples) => Ok((options, samples)),
        Err(reason) => Err(failed(&options)(format!("{reason}\ndockerd log:\n{log}"))),
    }
}

fn run_podman(ctx: &PeerContext, tools: &Tools, dir: &Path) -> Outcome {
    let root = dir.join("podman-root");
    let runroot = dir.join("podman-run");
    let tmpdir = dir.join("podman-tmp");
    // Its layer downloads go to TMPDIR (containers/image's default is /var/tmp, whatever --tmpdir
    // says): on the destination's filesystem with the rest of its data, and inside the bench's
    // directory, so a podman stopped in the middle leaves nothing behind.
    let podman = |args: &[&str]| {
        let mut command = tools.command(0);
        command
            .env("TMPDIR", &tmpdir)
            .arg("--root")
            .arg(&root)
            .arg("--runroot")
            .arg(&runroot)
            .arg("--tmpdir")
            .arg(&tmpdir)
            .args(["--storage-driver", "overlay"])
            .args(args);
        command
    };
    let options = format!(
        "TMPDIR={} {}",
        tmpdir.display(),
        render(&podman(&["pull", "--tls-verify=false", &ctx.reference]))
    );
    fs_err::create_dir_all(&tmpdir).map_err(|e| failed(&options)(e.to_string()))?;
    // Initialise the store before the first run, so no run pays for it.
    run_quiet(&mut podman(&["images"])).map_err(failed(&options))?;
    let mut reset = || run_quiet(&mut podman(&["rmi", "-af"])).map(drop);
    let command = || podman(&["pull", "--tls-verify=false", &ctx.reference]);
    let samples = Measure {
        ctx,
        reset: &mut reset,
        command: &command,
        daemon_pid: None,
        sync_dir: dir,
    }
    .run()
    .map_err(failed(&options))?;
    Ok((options, samples))
}

fn run_ctr(ctx: &PeerContext, tools: &Tools, dir: &Path) -> Outcome {
    let containerd =
        Containerd::start(tools.get(1), &dir.join("containerd"), Some(&tools.path_env)).map_err(
            |e| Failed {
                options: String::new(),
                reason: e.to_string(),
            },
        )?;
    let ctr = |args: &[&str]| {
        let mut command = tools.command(0);
        command
            .arg("--address")
            .arg(containerd.address())
            .args(["--namespace", "rpull-bench"])
            .args(args);
        command
    };
    let options = format!(
        "{} (containerd --config {}, overlayfs snapshotter)",
        render(&ctr(&["images", "pull", "--plain-http", &ctx.reference])),
        containerd.config().display()
    );
    let mut reset = || {
        let listed = run_quiet(&mut ctr(&["images", "ls", "--quiet"]))?;
        for image in listed.lines().filter(|l| !l.trim().is_empty()) {
            run_quiet(&mut ctr(&["images", "rm", "--sync", image.trim()]))?;
        }
        // With the image gone, garbage collection removed its content and snapshots; a leftover
        // would make the next run warm.
        let content = run_quiet(&mut ctr(&["content", "ls", "--quiet"]))?;
        let snapshots = run_quiet(&mut ctr(&["snapshots", "ls"]))?;
        if content.lines().any(|l| !l.trim().is_empty()) || snapshots.lines().count() > 1 {
            return Err(format!(
                "containerd kept content or snapshots after `images rm --sync`:\n{content}{snapshots}"
            ));
        }
        Ok(())
    };
    let command = || ctr(&["images", "pull", "--plain-http", &ctx.reference]);
    let result = Measure {
        ctx,
        reset: &mut reset,
        command: &command,
        daemon_pid: Some(containerd.pid()),
        sync_dir: dir,
    }
    .run();
    let log = containerd.log_tail(2);
    containerd.stop();
    match result {
        Ok(samples) => Ok((options, samples)),
        Err(reason) => Err(failed(&options)(format!(
            "{reason}\ncontainerd log:\n{log}"
        ))),
    }
}

fn run_skopeo(ctx: &PeerContext, tools: &Tools, dir: &Path) -> Outcome {
    let layout = dir.join("skopeo-oci");
    let skopeo = || {
        let mut command = tools.command(0);
        // Without the system policy (a bare install), skopeo refuses to copy at all.
        if !Path::new("/etc/containers/policy.json").exists() {
            command.arg("--insecure-policy");
        }
        command
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{}", ctx.reference))
            .arg(format!("oci:{}:rpull-bench", layout.display()));
        command
    };
    let options = render(&skopeo());
    let mut reset = || remove(&layout);
    let samples = Measure {
        ctx,
        reset: &mut reset,
        command: &skopeo,
        daemon_pid: None,
        sync_dir: dir,
    }
    .run()
    .map_err(failed(&options))?;
    Ok((options, samples))
}

fn run_crane(ctx: &PeerContext, tools: &Tools, dir: &Path) -> Outcome {
    let layout = dir.join("crane-oci");
    let crane = || {
        let mut command = tools.command(0);
        command
            .args(["pull", "--insecure", "--format", "oci", &ctx.reference])
            .arg(&layout);
        command
    };
    let options = render(&crane());
    let mut reset = || remove(&layout);
    let samples = Measure {
        ctx,
        reset: &mut reset,
        command: &crane,
        daemon_pid: None,
        sync_dir: dir,
    }
    .run()
    .map_err(failed(&options))?;
    Ok((options, samples))
}

fn run_crane_export(ctx: &PeerContext, tools: &Tools, dir: &Path) -> Outcome {
    let target = dir.join("crane-export");
    // The pipeline is measured as a whole: bash waits for both, so wait4 on bash covers crane and
    // tar. pipefail makes a crane failure fail the run.
    let pipeline = || {
        let mut command = tools.command(2);
        command
            .args([
                "-c",
                r#"set -o pipefail; "$0" export --insecure "$1" - | "$2" -x -C "$3""#,
            ])
            .arg(tools.get(0))
            .arg(&ctx.reference)
            .arg(tools.get(1))
            .arg(&target);
        command
    };
    let options = format!(
        "crane export --insecure {} - | tar -x -C {}",
        ctx.reference,
        target.display()
    );
    let mut reset = || {
        remove(&target)?;
        std::fs::create_dir_all(&target).map_err(|e| format!("creating {}: {e}", target.display()))
    };
    let samples = Measure {
        ctx,
        reset: &mut reset,
        command: &pipeline,
        daemon_pid: None,
        sync_dir: dir,
    }
    .run()
    .map_err(failed(&options))?;
    Ok((options, samples))
}

fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_whose_runs_are_far_apart_says_so() {
        let runs = |seconds: &[f64]| {
            seconds
                .iter()
                .map(|&seconds| Sample {
                    seconds,
                    ..Sample::default()
                })
                .collect::<Vec<_>>()
        };
        // ctr in run M's realistic gzip disk report.
        let spread = ran(Peer::Ctr, None, String::new(), runs(&[33.66, 45.75, 82.65]));
        assert_eq!(spread.seconds.unwrap().median, 45.75);
        assert_eq!(spread.notes.len(), 1);
        assert!(spread.notes[0].starts_with("runs spread from 33.66 to 82.65 s (2.5x)"));
        assert!(
            ran(
                Peer::Crane,
                None,
                String::new(),
                runs(&[17.97, 18.06, 18.10])
            )
            .notes
            .is_empty()
        );
        assert!(
            skipped(Peer::Docker, None, String::new(), "not installed".into())
                .notes
                .is_empty()
        );
    }

    #[test]
    fn rounds_join_into_the_result_of_all_their_runs() {
        let round = |seconds: f64| {
            ran(
                Peer::Skopeo,
                Some("skopeo version 1.9.3".into()),
                "skopeo copy".into(),
                vec![Sample {
                    seconds,
                    ..Sample::default()
                }],
            )
        };
        assert!(merge_peer_rounds(Vec::new()).is_none());
        let merged = merge_peer_rounds(vec![round(2.0), round(1.0), round(4.0)]).unwrap();
        let seconds: Vec<f64> = merged.samples.iter().map(|s| s.seconds).collect();
        assert_eq!(seconds, [2.0, 1.0, 4.0], "round order");
        let summary = merged.seconds.unwrap();
        assert_eq!((summary.median, summary.min, summary.max), (2.0, 1.0, 4.0));
        assert_eq!(merged.version.as_deref(), Some("skopeo version 1.9.3"));
        assert_eq!(merged.options, "skopeo copy");
        assert!(merged.skipped.is_none());
        // One run per round has no spread of its own; over the rounds, 1 to 4 s is spread.
        assert_eq!(merged.notes.len(), 1, "{:?}", merged.notes);
        assert!(merged.notes[0].starts_with("runs spread from 1.00 to 4.00 s"));

        // A round without a number: the peer has none, with that round's reason.
        let failed = skipped(
            Peer::Skopeo,
            None,
            "skopeo copy".into(),
            "failed: boom".into(),
        );
        let merged = merge_peer_rounds(vec![round(1.0), failed]).unwrap();
        assert_eq!(merged.skipped.as_deref(), Some("failed: boom"));
        assert!(merged.samples.is_empty() && merged.seconds.is_none());
    }

    #[test]
    fn names_round_trip() {
        for peer in Peer::ALL {
            assert_eq!(peer.to_string().parse::<Peer>(), Ok(peer));
        }
    }

    #[test]
    fn peer_lists() {
        assert_eq!(parse_peers("all").unwrap(), Peer::ALL);
        assert_eq!(
            parse_peers("skopeo, docker,skopeo").unwrap(),
            [Peer::Skopeo, Peer::Docker]
        );
        assert_eq!(parse_peers("crane-export").unwrap(), [Peer::CraneExport]);
        let err = parse_peers("docker,nerdctl").unwrap_err();
        assert!(
            err.contains("\"nerdctl\"") && err.contains("crane-export") && err.contains("all"),
            "{err}"
        );
        assert!(parse_peers("").is_err());
    }

    #[test]
    fn executables_are_found_only_in_the_given_path() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        assert_eq!(
            find_executable("tool", dir.path().as_os_str()),
            None,
            "not executable yet"
        );
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_executable("tool", dir.path().as_os_str()), Some(tool));
        assert_eq!(find_executable("sh", dir.path().as_os_str()), None);
    }

    #[test]
    fn commands_render_with_quotes_where_needed() {
        let mut command = Command::new("/usr/bin/tool");
        command.args(["pull", "a b", "x"]);
        assert_eq!(render(&command), "tool pull 'a b' x");
    }
}
