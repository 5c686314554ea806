//! `Client` and its builder: options, credentials, the auth + retry loop around each request.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tracing::debug;

use crate::auth::{Challenge, TokenCache, fetch_token, parse_challenges};
use crate::credentials::{CredentialStore, Credentials, normalize_registry};
use crate::error::{Error, display_url, excerpt};
use crate::reference::Reference;
use crate::transport::{RequestSpec, Transport};

const DEFAULT_RETRIES: u32 = 3;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle time allowed between two reads of a response (not a cap on a whole download).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Configures a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    plain_http: bool,
    insecure: bool,
    ca_certs: Vec<PathBuf>,
    credentials: HashMap<String, Credentials>,
    credential_store: Option<CredentialStore>,
    user_agent: String,
    retries: u32,
    read_timeout: Duration,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            plain_http: false,
            insecure: false,
            ca_certs: Vec::new(),
            credentials: HashMap::new(),
            credential_store: None,
            user_agent: format!("rpull/{}", env!("CARGO_PKG_VERSION")),
            retries: DEFAULT_RETRIES,
            read_timeout: READ_TIMEOUT,
        }
    }
}

impl ClientBuilder {
    /// Use plain HTTP for every registry. The system's root certificates are then read only
    /// when a redirect leads to HTTPS (a blob store, a token realm), at its first certificate.
    pub fn plain_http(mut self, plain_http: bool) -> Self {
        self.plain_http = plain_http;
        self
    }

    /// Skip TLS certificate verification (and allow falling back to plain HTTP for any host,
    /// as docker does for "insecure registries").
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// Trust the PEM certificate(s) in `path` in addition to the system roots; repeatable.
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_certs.push(path.into());
        self
    }

    /// Explicit credentials for `registry` (`docker.io`, `localhost:5000`, ...); they win over the store.
    pub fn credentials(mut self, registry: &str, credentials: Credentials) -> Self {
        self.credentials
            .insert(normalize_registry(registry).to_owned(), credentials);
        self
    }

    /// Where to look up credentials (default: [`CredentialStore::from_env`]).
    pub fn credential_store(mut self, store: CredentialStore) -> Self {
        self.credential_store = Some(store);
        self
    }

    /// The User-Agent header.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// How many times a retryable failure is retried (default 3).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Longest silence allowed between two reads of a response (default 120 s).
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// Builds the client; reads the CA certificate files now.
    pub fn build(self) -> Result<Client, Error> {
        // Proxies: reqwest reads HTTP_PROXY / HTTPS_PROXY / NO_PROXY (and the system config) by default.
        // No automatic decompression: blobs must arrive byte for byte to be verified.
        let mut http = reqwest::Client::builder()
            .user_agent(self.user_agent.clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(self.read_timeout)
            .tls_danger_accept_invalid_certs(self.insecure);
        if no_proxy_is_wildcard() {
            // curl and Go treat NO_PROXY=* as "never proxy"; hyper-util's matcher honours `*`
            // for host names only, not for IP addresses such as 127.0.0.1.
            http = http.no_proxy();
        }
        let mut extra_roots = Vec::new();
        for path in &self.ca_certs {
            extra_roots.extend(read_ca_certs(path)?);
        }
        if !self.insecure {
            // The platform's verifier as reqwest would build it, its roots loaded on a thread
            // instead of before the first request, or at the first certificate when every
            // registry is spoken to in plain HTTP (crate::tls).
            let when = if self.plain_http {
                crate::tls::LoadRoots::AtFirstUse
            } else {
                crate::tls::LoadRoots::Ahead
            };
            let config = crate::tls::client_config(extra_roots, when).map_err(Error::TlsSetup)?;
            http = http.tls_backend_preconfigured(config);
        }
        let http = http.build().map_err(Error::ClientBuild)?;
        Ok(Client {
            inner: Arc::new(Inner {
                transport: Transport::new(http, self.plain_http, self.insecure),
                tokens: TokenCache::default(),
                explicit: self.credentials,
                store: self
                    .credential_store
                    .unwrap_or_else(CredentialStore::from_env),
                looked_up: Mutex::new(HashMap::new()),
                retries: self.retries,
            }),
        })
    }
}

/// The certificates of the PEM file at `path`, for `--ca-cert`.
fn read_ca_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let failed = |message: String| Error::CaCert {
        path: path.to_owned(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(format!("not a PEM certificate bundle: {e}")))?;
    if certs.is_empty() {
        return Err(failed("no PEM certificate in file".to_owned()));
    }
    Ok(certs)
}

/// A registry client. Cheap to clone (shared connection pool, token cache and scheme memory).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) transport: Transport,
    tokens: TokenCache,
    explicit: HashMap<String, Credentials>,
    store: CredentialStore,
    looked_up: Mutex<HashMap<String, Option<Credentials>>>,
    pub(crate) retries: u32,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut registries: Vec<&String> = self.inner.explicit.keys().collect();
        registries.sort();
        f.debug_struct("Client")
            .field("transport", &self.inner.transport)
            .field("explicit_credentials_for", &registries)
            .field("credential_store", &self.inner.store)
            .field("retries", &self.inner.retries)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client with default options.
    pub fn new() -> Result<Client, Error> {
        ClientBuilder::default().build()
    }

    /// Starts configuring a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Sends `spec` to `repo`'s registry with auth (anonymous first, then per challenge) and
    /// retries of transient failures. Returns the response whatever its status.
    pub(crate) async fn execute(
        &self,
        repo: &Reference,
        scopes: &[String],
        spec: &RequestSpec,
    ) -> Result<Response, Error> {
        let mut attempt = 0;
        loop {
            let result = self.execute_authenticated(repo, scopes, spec).await;
            let transient = match &result {
                Ok(response) => is_transient_status(response.status()),
                Err(error) => error.is_retryable(),
            };
            if !(transient && spec.retry && attempt < self.inner.retries) {
                return result;
            }
            let delay = match &result {
                Ok(response) => retry_after(response).unwrap_or_else(|| backoff(attempt)),
                Err(_) => backoff(attempt),
            };
            match &result {
                Ok(response) => {
                    debug!(status = %response.status(), ?delay, attempt, "transient HTTP status; retrying")
                }
                Err(error) => debug!(%error, ?delay, attempt, "transient error; retrying"),
            }
            drop(result);
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    async fn execute_authenticated(
        &self,
        repo: &Reference,
        scopes: &[String],
        spec: &RequestSpec,
    ) -> Result<Response, Error> {
        let host = repo.api_host();
        let transport = &self.inner.transport;
        let scope_key = scopes.join(" ");
        let sent = self.inner.tokens.header(host, &scope_key);
        let response = transport.send(host, spec, sent.as_deref()).await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenges: Vec<Challenge> = response
            .headers()
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(parse_challenges)
            .collect();
        if sent.is_some() {
            debug!(
                host,
                "registry rejected the cached authorization; renewing once"
            );
            self.inner.tokens.forget(host, &scope_key);
        }
        let bearer = challenges.iter().find_map(|c| match c {
            Challenge::Bearer { realm, service, .. } => Some((realm, service)),
            Challenge::Basic => None,
        });
        let authorization = if let Some((realm, service)) = bearer {
            let credentials = self.credentials_for(repo.registry()).await?;
            let token = fetch_token(
                &transport.http,
                realm,
                service.as_deref(),
                scopes,
                credentials.as_ref(),
            )
            .await?;
            self.inner
                .tokens
                .store_token(host, &scope_key, token.value.clone(), token.lifetime);
            format!("Bearer {}", token.value)
        } else if challenges.contains(&Challenge::Basic) {
            let credentials = self.credentials_for(repo.registry()).await?;
            match credentials.as_ref().and_then(Credentials::basic_header) {
                Some(header) if sent.as_deref() != Some(header.as_str()) => {
                    self.inner.tokens.store_basic(host, header.clone());
                    header
                }
                // No credentials, or these very credentials were just refused.
                _ => return Ok(response),
            }
        } else if let Some(challenge) = response.headers().get(WWW_AUTHENTICATE) {
            return Err(Error::UnsupportedChallenge {
                registry: host.to_owned(),
                challenge: String::from_utf8_lossy(challenge.as_bytes())
                    .chars()
                    .take(300)
                    .collect(),
            });
        } else {
            return Ok(response);
        };
        drop(response);
        transport.send(host, spec, Some(&authorization)).await
    }

    /// Explicit credentials, else the store's (looked up once per registry, off the executor).
    async fn credentials_for(&self, registry: &str) -> Result<Option<Credentials>, Error> {
        if let Some(credentials) = self.inner.explicit.get(registry) {
            return Ok(Some(credentials.clone()));
        }
        if let Some(found) = lock(&self.inner.looked_up).get(registry) {
            return Ok(found.clone());
        }
        let store = self.inner.store.clone();
        let key = registry.to_owned();
        let found = tokio::task::spawn_blocking(move || store.lookup(&key))
            .await
            .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))
            .map_err(|source| Error::Credentials {
                registry: registry.to_owned(),
                source,
            })?;
        lock(&self.inner.looked_up).insert(registry.to_owned(), found.clone());
        Ok(found)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn is_transient_status(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(250u64 << attempt.min(5)).min(Duration::from_secs(8))
}

fn retry_after(response: &Response) -> Option<Duration> {
    let seconds: u64 = response
        .headers()
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(30)))
}

/// `repository:<name>:<actions>`
pub(crate) fn scope(repository: &str, actions: &str) -> String {
    format!("repository:{repository}:{actions}")
}

/// Turns a non-success response into an error: 401 -> `Unauthorized`, 404 -> `NotFound`
/// (when `not_found` names what was asked for), else `Http`. Reads at most a few KiB of body.
pub(crate) async fn status_error(
    repo: &Reference,
    method: &str,
    mut response: Response,
    not_found: Option<String>,
) -> Error {
    let status = response.status();
    let url = display_url(response.url());
    let mut body = Vec::new();
    while body.len() < 4096 {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let body = excerpt(&body);
    match (status, not_found) {
        (StatusCode::UNAUTHORIZED, _) => Error::Unauthorized {
            registry: repo.registry().to_owned(),
            repository: repo.repository().to_owned(),
            body,
        },
        (StatusCode::NOT_FOUND, Some(reference)) => Error::NotFound { reference, body },
        _ => Error::Http {
            method: method.to_owned(),
            url,
            status: status.as_u16(),
            body,
        },
    }
}

/// Whether `NO_PROXY` (or `no_proxy`) is `*`.
fn no_proxy_is_wildcard() -> bool {
    ["NO_PROXY", "no_proxy"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|value| !value.is_empty())
        .is_some_and(|value| value.trim() == "*")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_send_sync_clone() {
        fn assert_traits<T: Send + Sync + Clone + 'static>() {}
        assert_traits::<Client>();
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(10), Duration::from_secs(8));
    }

    #[tokio::test]
    async fn debug_does_not_show_explicit_secret() {
        let client = Client::builder()
            .credential_store(CredentialStore::empty())
            .credentials(
                "https://index.docker.io/v1/",
                Credentials::basic("u", "sekrit-pass"),
            )
            .build()
            .unwrap();
        let text = format!("{client:?}");
        assert!(text.contains("docker.io"), "{text}");
        assert!(!text.contains("sekrit-pass"), "{text}");
        assert_eq!(
            client.credentials_for("docker.io").await.unwrap(),
            Some(Credentials::basic("u", "sekrit-pass"))
        );
        assert_eq!(client.credentials_for("other.io").await.unwrap(), None);
    }

    #[test]
    fn bad_ca_cert_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").unwrap();
        let err = Client::builder().ca_cert(&path).build().unwrap_err();
        assert!(err.to_string().contains("ca.pem"), "{err}");
        let err = Client::builder()
            .ca_cert(dir.path().join("missing.pem"))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");
    }
}
