//! `TestRegistry`: a real `docker-registry` (CNCF distribution v2.8) process on an ephemeral
//! loopback port with its own storage, killed and removed on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::certs::{self, TlsFiles};
use crate::token::{TOKEN_ISSUER, TOKEN_SERVICE, TokenIssuer, TokenOptions};

/// Where Debian's `docker-registry` package installs the server.
pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const PORT_ATTEMPTS: usize = 5;

/// How clients must authenticate.
#[derive(Debug, Clone)]
pub enum RegistryAuth {
    None,
    /// HTTP Basic against an htpasswd file (bcrypt).
    Htpasswd {
        user: String,
        password: String,
    },
    /// Bearer tokens from a `TokenIssuer` started alongside the registry.
    Token(TokenOptions),
}

/// What kind of registry to start. Combine freely: `RegistryOptions::token("u", "p").with_tls()`.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub auth: RegistryAuth,
    /// Serve HTTPS with a certificate for 127.0.0.1 and localhost from a CA made at start.
    pub tls: bool,
}

impl RegistryOptions {
    /// Plain HTTP, no authentication.
    pub fn plain() -> Self {
        RegistryOptions {
            auth: RegistryAuth::None,
            tls: false,
        }
    }

    /// Plain HTTP with Basic authentication.
    pub fn htpasswd(user: impl Into<String>, password: impl Into<String>) -> Self {
        RegistryOptions {
            auth: RegistryAuth::Htpasswd {
                user: user.into(),
                password: password.into(),
            },
            tls: false,
        }
    }

    /// HTTPS, no authentication; the client needs `ca_cert_path()`.
    pub fn tls() -> Self {
        RegistryOptions {
            auth: RegistryAuth::None,
            tls: true,
        }
    }

    /// Plain HTTP with token authentication (default token lifetime 300 s).
    pub fn token(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self::token_with(TokenOptions::new(user, password))
    }

    pub fn token_with(options: TokenOptions) -> Self {
        RegistryOptions {
            auth: RegistryAuth::Token(options),
            tls: false,
        }
    }

    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self::plain()
    }
}

/// A running registry. Dropping it kills the process and removes its storage.
#[derive(Debug)]
pub struct TestRegistry {
    child: Child,
    port: u16,
    tls: Option<TlsFiles>,
    token: Option<TokenIssuer>,
    credentials: Option<(String, String)>,
    dir: TempDir,
}

impl TestRegistry {
    /// Starts a registry and waits until `/v2/` answers. Blocks for well under a second normally;
    /// it is fine to call from an async test.
    pub fn start(options: RegistryOptions) -> Result<TestRegistry> {
        ensure_binary()?;
        let mut dir = tempfile::Builder::new()
            .prefix("rpull-registry-")
            .tempdir()?;
        let storage = dir.path().join("storage");
        fs_err::create_dir_all(&storage)?;
        let tls = if options.tls {
            Some(certs::write_tls_files(dir.path())?)
        } else {
            None
        };

        let mut auth_yaml = String::new();
        let mut token = None;
        let mut credentials = None;
        match &options.auth {
            RegistryAuth::None => {}
            RegistryAuth::Htpasswd { user, password } => {
                let path = dir.path().join("htpasswd");
                let hash = bcrypt::hash(password, 4).context("bcrypt")?;
                fs_err::write(&path, format!("{user}:{hash}\n"))?;
                auth_yaml = format!(
                    "auth:\n  htpasswd:\n    realm: rpull-testing\n    path: {}\n",
                    path.display()
                );
                credentials = Some((user.clone(), password.clone()));
            }
            RegistryAuth::Token(token_options) => {
                let keys = certs::write_token_keys(dir.path())?;
                let issuer = TokenIssuer::start(token_options.clone(), &keys)?;
                auth_yaml = format!(
                    "auth:\n  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                    issuer.realm(),
                    keys.root_bundle.display()
                );
                credentials = Some((token_options.user.clone(), token_options.password.clone()));
                token = Some(issuer);
            }
        }

        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let config = config_yaml(port, &storage, tls.as_ref(), &auth_yaml);
            let config_path = dir.path().join("config.yml");
            fs_err::write(&config_path, config)?;
            let log_path = dir.path().join("registry.log");
            let child = spawn_registry(&config_path, &log_path)?;
            let mut registry = TestRegistry {
                child,
                port,
                tls: tls.clone(),
                token: None,
                credentials: None,
                dir,
            };
            match registry.wait_ready(&log_path) {
                Ok(()) => {
                    registry.token = token;
                    registry.credentials = credentials;
                    return Ok(registry);
                }
                Err(ReadyError::PortTaken(log)) => {
                    last_error = Some(anyhow::anyhow!("port {port} taken: {log}"));
                    dir = registry.take_dir();
                }
                Err(ReadyError::Other(err)) => return Err(err),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no free port")))
            .context("starting docker-registry")
    }

    /// `127.0.0.1:PORT`
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.host())
    }

    /// `reference("app:1.0")` -> `127.0.0.1:PORT/app:1.0`
    pub fn reference(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.host())
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The CA certificate (PEM) a client must trust; `None` for plain HTTP registries.
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.tls.as_ref().map(|tls| tls.ca_cert.as_path())
    }

    /// The user and password for htpasswd or token registries.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.as_str()))
    }

    pub fn token_issuer(&self) -> Option<&TokenIssuer> {
        self.token.as_ref()
    }

    /// Requests the token issuer received (0 without token auth).
    pub fn token_requests(&self) -> usize {
        self.token.as_ref().map_or(0, TokenIssuer::token_requests)
    }

    /// The registry's storage directory (`docker/registry/v2/...` inside).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// What the registry wrote to stderr so far (its log), for failure messages.
    pub fn log(&self) -> String {
        fs_err::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    fn take_dir(mut self) -> TempDir {
        self.kill();
        let placeholder = tempfile::tempdir().expect("creating a temporary directory");
        std::mem::replace(&mut self.dir, placeholder)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn wait_ready(&mut self, log_path: &Path) -> Result<(), ReadyError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let read_log = || fs_err::read_to_string(log_path).unwrap_or_default();
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(|e| ReadyError::Other(e.into()))?
            {
                let log = read_log();
                if log.contains("address already in use") {
                    return Err(ReadyError::PortTaken(log));
                }
                return Err(ReadyError::Other(anyhow::anyhow!(
                    "docker-registry exited with {status} before answering; its log:\n{log}"
                )));
            }
            // The registry logs "listening on ADDR" after binding; only then is a connection
            // surely ours and not some other process that grabbed the port in the race.
            if read_log().contains("listening on") && self.answers() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ReadyError::Other(anyhow::anyhow!(
                    "docker-registry did not answer /v2/ on {} within {READY_TIMEOUT:?}; its log:\n{}",
                    self.host(),
                    read_log()
                )));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Plain HTTP: `GET /v2/` returns 200 or 401. TLS: the port accepts connections (the
    /// handshake and `/v2/` are checked by the self-tests with a real client).
    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!(
            "GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.host()
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut response = [0u8; 12];
        if stream.read_exact(&mut response).is_err() {
            return false;
        }
        response.starts_with(b"HTTP/1.1 200") || response.starts_with(b"HTTP/1.1 401")
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

enum ReadyError {
    PortTaken(String),
    Other(anyhow::Error),
}

fn ensure_binary() -> Result<()> {
    if Path::new(REGISTRY_BINARY).exists() {
        return Ok(());
    }
    bail!(
        "{REGISTRY_BINARY} not found: the integration tests need the CNCF distribution registry. \
         Run `scripts/test` (it installs it) or `apt-get install -y docker-registry`."
    )
}

/// A port the kernel just handed out. Another process may take it before the registry binds;
/// `TestRegistry::start` retries on "address already in use".
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The configuration of a plain-HTTP registry without auth, for running one by hand.
pub fn plain_config_yaml(port: u16, storage: &Path) -> String {
    config_yaml(port, storage, None, "")
}

fn config_yaml(port: u16, storage: &Path, tls: Option<&TlsFiles>, auth_yaml: &str) -> String {
    let mut yaml = format!(
        "version: 0.1\n\
         log:\n  level: info\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: rpull-testing-secret\n",
        storage.display()
    );
    if let Some(tls) = tls {
        yaml.push_str(&format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            tls.server_cert.display(),
            tls.server_key.display()
        ));
    }
    yaml.push_str(auth_yaml);
    yaml
}

fn spawn_registry(config: &Path, log: &Path) -> Result<Child> {
    let log_file = fs_err::File::create(log)?.into_parts().0;
    let mut command = Command::new(REGISTRY_BINARY);
    command
        .arg("serve")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        // Settings from the environment would override the config file.
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    spawn_tied_to_process(command).with_context(|| format!("spawning {REGISTRY_BINARY}"))
}

/// Spawns `command` from a thread that lives as long as the test process, with
/// `PR_SET_PDEATHSIG = SIGKILL`: a registry never outlives a test run that was killed or that
/// leaked its `TestRegistry` (a static). The death signal fires when the *spawning thread* ends,
/// which is why the spawn happens on this long-lived thread rather than the test's own.
fn spawn_tied_to_process(command: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("rpull-testing-spawner".to_owned())
            .spawn(move || {
                for (mut command, reply) in receiver {
                    use std::os::unix::process::CommandExt as _;
                    // SAFETY: the closure runs between fork and exec and only makes one
                    // async-signal-safe system call (prctl); it allocates nothing.
                    unsafe {
                        command.pre_exec(|| {
                            rustix::process::set_parent_process_death_signal(Some(
                                rustix::process::Signal::KILL,
                            ))
                            .map_err(std::io::Error::from)
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawning the rpull-testing spawner thread");
        sender
    });
    let (reply, result) = mpsc::channel();
    sender
        .send((command, reply))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?
}
