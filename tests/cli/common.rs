//! What every CLI test needs: the `rpull` binary run as a user runs it (a clean environment with
//! its own HOME), a place for destinations, small fixture images, and a runtime for pushing.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use rpull_testing::{Compression, Image, ImageBuilder, LayerBuilder, TestRegistry};
use tempfile::TempDir;

/// The PATH every run gets unless a test adds to it.
pub const SYSTEM_PATH: &str = "/usr/bin:/bin";

/// Runs `future` to completion on a runtime of its own (the harness's push is async).
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a tokio runtime")
        .block_on(future)
}

/// A temporary directory with an empty HOME in it, and room for destinations and config files.
#[derive(Debug)]
pub struct Sandbox {
    dir: TempDir,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("rpull-cli-test-")
            .tempdir()
            .expect("creating a temporary directory");
        fs_create_dir(&dir.path().join("home"));
        Sandbox { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn home(&self) -> PathBuf {
        self.path().join("home")
    }

    /// A path in the sandbox (not created).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    /// `rpull` with a clean environment: only PATH and HOME (this sandbox's) are set.
    pub fn rpull(&self) -> Rpull {
        Rpull {
            cwd: self.path().to_owned(),
            env: vec![
                ("PATH".to_owned(), SYSTEM_PATH.into()),
                ("HOME".to_owned(), self.home().into()),
            ],
            args: Vec::new(),
            stdin: Vec::new(),
            user: None,
        }
    }

    /// Writes `contents` to `name` in the sandbox (parents created) and returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
        }
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Hidden staging directories (`.NAME.rpull-staging-*`) left next to `dest`.
    pub fn staging_dirs(&self, dest: &Path) -> Vec<String> {
        staging_dirs(dest)
    }
}

/// Names of `.NAME.rpull-staging-*` entries in the parent of `dest`.
pub fn staging_dirs(dest: &Path) -> Vec<String> {
    let parent = dest.parent().expect("destination has a parent");
    let prefix = format!(
        ".{}.rpull-staging-",
        dest.file_name()
            .expect("destination has a name")
            .to_string_lossy()
    );
    std::fs::read_dir(parent)
        .unwrap_or_else(|e| panic!("reading {}: {e}", parent.display()))
        .map(|entry| entry.expect("reading a directory entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

fn fs_create_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
}

/// One run of the binary being set up.
#[derive(Debug)]
pub struct Rpull {
    cwd: PathBuf,
    env: Vec<(String, OsString)>,
    args: Vec<OsString>,
    stdin: Vec<u8>,
    user: Option<(u32, u32)>,
}

impl Rpull {
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Rpull {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Rpull
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets (or replaces) an environment variable.
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Rpull {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.as_ref().to_owned()));
        self
    }

    /// What the process reads on stdin (nothing, an immediate EOF, by default).
    pub fn stdin(mut self, bytes: impl AsRef<[u8]>) -> Rpull {
        self.stdin = bytes.as_ref().to_vec();
        self
    }

    /// Runs the process as this uid and gid (the test runs as root).
    pub fn run_as(mut self, uid: u32, gid: u32) -> Rpull {
        self.user = Some((uid, gid));
        self
    }

    /// The command as configured, for tests that drive the child themselves.
    pub fn into_command(self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rpull"));
        command
            .env_clear()
            .envs(self.env)
            .args(self.args)
            .current_dir(self.cwd);
        if let Some((uid, gid)) = self.user {
            use std::os::unix::process::CommandExt as _;
            command.uid(uid).gid(gid);
        }
        command
    }

    /// `rpull pull ARGS... REFERENCE DEST`, with the arguments given so far as ARGS (global
    /// flags such as `-v` are accepted after the subcommand).
    pub fn pull(mut self, reference: &str, dest: &Path) -> Outcome {
        self.args.insert(0, "pull".into());
        self.arg(reference).arg(dest).run()
    }

    pub fn run(mut self) -> Outcome {
        let input = std::mem::take(&mut self.stdin);
        let mut command = self.into_command();
        let shown = format!("{command:?}");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {shown}: {e}"));
        let mut stdin = child.stdin.take().expect("piped stdin");
        // A process that does not read stdin closes it: EPIPE is fine.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let output = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {shown}: {e}"));
        let _ = writer.join();
        Outcome {
            command: shown,
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub command: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Panics with everything the process printed unless it exited 0.
    pub fn success(&self) -> &Outcome {
        assert_eq!(self.code, Some(0), "rpull failed\n{self}");
        self
    }

    /// Asserts exit status 1 and the one-line error format; returns that line.
    pub fn error_line(&self) -> &str {
        assert_eq!(self.code, Some(1), "expected exit status 1\n{self}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "expected exactly one line on stderr\n{self}"
        );
        assert!(
            lines[0].starts_with("rpull: error: "),
            "the error line must start with `rpull: error: `\n{self}"
        );
        assert_eq!(self.stdout, "", "nothing on stdout after an error\n{self}");
        lines[0]
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "command: {}\nexit: {:?}\n--- stdout ---\n{}--- stderr ---\n{}--------------",
            self.command, self.code, self.stdout, self.stderr
        )
    }
}

/// `base64(user:password)`, the `auth` field of docker's config.json.
pub fn basic_auth(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// `{"auths": {HOST: {"auth": base64(user:password)}}}`
pub fn auth_file(host: &str, user: &str, password: &str) -> String {
    serde_json::json!({ "auths": { host: { "auth": basic_auth(user, password) } } }).to_string()
}

/// Two layers: a directory and a file, then a second file and a replaced file.
pub fn small_image() -> Image {
    ImageBuilder::new()
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/hostname", "rpull-base\n", 0o644)
                .file("etc/motd", "first\n", 0o644),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new()
                .file("hello", "hello world\n", 0o755)
                .file("etc/motd", "second\n", 0o644),
            Compression::Zstd,
        )
        .build()
}

/// Checks that `dir` holds what `small_image` describes.
pub fn assert_small_image(dir: &Path) {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.join(name).display()))
    };
    assert_eq!(read("etc/hostname"), "rpull-base\n");
    assert_eq!(read("etc/motd"), "second\n", "the later layer wins");
    assert_eq!(read("hello"), "hello world\n");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.join("hello"))
        .expect("stat hello")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
}

/// A registry with `small_image` pushed as `app:1`; returns the registry and the reference.
pub fn registry_with_small_image(registry: TestRegistry) -> (TestRegistry, String) {
    block_on(registry.push_image(&small_image(), "app:1"))
        .unwrap_or_else(|e| panic!("pushing app:1: {e:#}\nregistry log:\n{}", registry.log()));
    let reference = registry.reference("app:1");
    (registry, reference)
}
