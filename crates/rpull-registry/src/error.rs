//! The crate's one error type. Every variant carries its evidence; none carries a secret.

use std::path::PathBuf;

use crate::credentials::CredentialError;
use crate::digest::{Digest, DigestError};
use crate::platform::Platform;
use crate::reference::ReferenceError;

/// Anything that can go wrong talking to a registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The reference string is invalid.
    #[error(transparent)]
    Reference(#[from] ReferenceError),

    /// A digest (from a header, a manifest, an argument) is invalid.
    #[error(transparent)]
    Digest(#[from] DigestError),

    /// The registry refused our (possibly absent) credentials.
    #[error(
        "unauthorized: registry {registry} refused access to repository {repository} (log in, or check the credentials for {registry}){}",
        excerpt_suffix(body)
    )]
    Unauthorized {
        /// Registry name.
        registry: String,
        /// Repository path.
        repository: String,
        /// Excerpt of the registry's answer.
        body: String,
    },

    /// The manifest or blob does not exist.
    #[error("not found: {reference}{}", excerpt_suffix(body))]
    NotFound {
        /// What was asked for (`registry/repo:tag`, `registry/repo@digest`).
        reference: String,
        /// Excerpt of the registry's answer.
        body: String,
    },

    /// TLS failed: certificate not trusted, wrong host name, handshake refused...
    #[error(
        "TLS error talking to {host}: {} (for a private CA pass --ca-cert; --insecure skips verification)",
        root_cause(error)
    )]
    Tls {
        /// Host and port.
        host: String,
        /// The underlying error (URL stripped). Not the error's `source()`: the message already
        /// ends with its root cause, and a printed cause chain would repeat it.
        error: reqwest::Error,
    },

    /// Connection, timeout or body transfer failure.
    #[error("request to {url} failed: {}", root_cause(error))]
    Transport {
        /// URL without its query string.
        url: String,
        /// The underlying error (URL stripped); not the `source()`, as for `Tls`.
        error: reqwest::Error,
    },

    /// An unexpected HTTP status.
    #[error("{method} {url} returned HTTP {status}{}", excerpt_suffix(body))]
    Http {
        /// Request method.
        method: String,
        /// URL without its query string.
        url: String,
        /// Status code.
        status: u16,
        /// Excerpt of the response body.
        body: String,
    },

    /// The token endpoint refused or answered nonsense.
    #[error("token request to {realm} failed{}: {message}", status.map(|s| format!(" with HTTP {s}")).unwrap_or_default())]
    Token {
        /// Realm URL without query.
        realm: String,
        /// HTTP status, when there was one.
        status: Option<u16>,
        /// What went wrong (body excerpt or parse error).
        message: String,
    },

    /// A `WWW-Authenticate` challenge we cannot answer.
    #[error("registry {registry} sent an unsupported authentication challenge: {challenge}")]
    UnsupportedChallenge {
        /// Registry host.
        registry: String,
        /// The challenge header (it holds no secret).
        challenge: String,
    },

    /// Looking up credentials (config file or helper) failed.
    #[error("credentials for {registry}: {source}")]
    Credentials {
        /// Registry whose credentials were looked up.
        registry: String,
        /// What failed.
        #[source]
        source: CredentialError,
    },

    /// The manifest's media type is neither an image manifest nor an index.
    #[error("{reference}: unsupported manifest media type {media_type:?}")]
    ManifestUnknownMediaType {
        /// The image reference.
        reference: String,
        /// The media type the registry returned.
        media_type: String,
    },

    /// Docker schema 1 manifest.
    #[error(
        "{reference}: schema 1 manifests are deprecated and not supported (re-push the image with a current client)"
    )]
    Schema1 {
        /// The image reference.
        reference: String,
    },

    /// The manifest body could not be parsed.
    #[error("{reference}: invalid manifest ({media_type}): {message}")]
    InvalidManifest {
        /// The image reference.
        reference: String,
        /// Media type it was parsed as.
        media_type: String,
        /// Parser message.
        message: String,
    },

    /// No index entry matches the wanted platform.
    #[error(
        "{reference}: no manifest for platform {wanted}; available: {}",
        list_platforms(available)
    )]
    NoMatchingPlatform {
        /// The image reference.
        reference: String,
        /// The platform asked for.
        wanted: Platform,
        /// Platforms the index offers.
        available: Vec<Platform>,
    },

    /// Content did not hash to the digest it was fetched or pushed by.
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was checked (a reference or URL).
        what: String,
        /// Digest we asked for.
        expected: Digest,
        /// Digest of what we got.
        actual: Digest,
    },

    /// The registry broke the protocol (missing Location, 200 instead of 206, ...).
    #[error("{url}: protocol error: {message}")]
    Protocol {
        /// URL without its query string.
        url: String,
        /// What was wrong.
        message: String,
    },

    /// Reading the caller's data (chunked push) failed.
    #[error("reading data to push for {digest}: {source}")]
    Read {
        /// Blob being pushed.
        digest: Digest,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A `--ca-cert` file could not be read or parsed.
    #[error("CA certificate {}: {message}", path.display())]
    CaCert {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },

    /// Building the HTTP client failed.
    #[error("building the HTTP client: {0}")]
    ClientBuild(#[source] reqwest::Error),

    /// Building the client's TLS configuration failed.
    #[error("setting up TLS for the HTTP client: {0}")]
    TlsSetup(#[source] rustls::Error),
}

impl Error {
    /// Whether retrying the same request may succeed: connect errors, timeouts, truncated bodies,
    /// HTTP 5xx and 429. Nothing else (not TLS, not 4xx, not digest mismatches).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport { error, .. } => {
                error.is_connect()
                    || error.is_timeout()
                    || error.is_body()
                    || error.is_request()
                    || broken_body(error)
            }
            Error::Http { status, .. } => *status == 429 || (500..600).contains(status),
            Error::Token {
                status: Some(status),
                ..
            } => *status == 429 || (500..600).contains(status),
            _ => false,
        }
    }
}

/// A body that broke off, as reqwest reports it when it can decode content encodings: a `Decode`
/// error around the `Body` error (a connection closed mid-response says `IncompleteBody`).
fn broken_body(error: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(current) = source {
        if current
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_body)
        {
            return true;
        }
        source = current.source();
    }
    false
}

/// The innermost message of an error chain (reqwest's own messages are generic: "error sending
/// request"). io::Error hides what it wraps from `source()`, so step into it explicitly.
pub(crate) fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    loop {
        let next = match current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
        match next {
            Some(next) => current = next,
            None => return current.to_string(),
        }
    }
}

fn excerpt_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

fn list_platforms(platforms: &[Platform]) -> String {
    if platforms.is_empty() {
        return "none".to_owned();
    }
    platforms
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A URL for messages: no userinfo, no query (upload state, presigned signatures), no fragment.
pub(crate) fn display_url(url: &url::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// At most ~500 characters of a response body, on one line.
pub(crate) fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 500;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX * 4)]);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > MAX {
        let cut: String = one_line.chars().take(MAX).collect();
        format!("{cut}...")
    } else {
        one_line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_url_strips_secrets() {
        let url =
            url::Url::parse("https://user:pw@host:5000/v2/x?X-Amz-Signature=abc#frag").unwrap();
        assert_eq!(display_url(&url), "https://host:5000/v2/x");
    }

    #[test]
    fn retryable_is_narrow() {
        let http = |status| Error::Http {
            method: "GET".into(),
            url: "u".into(),
            status,
            body: String::new(),
        };
        assert!(http(500).is_retryable());
        assert!(http(503).is_retryable());
        assert!(http(429).is_retryable());
        assert!(!http(404).is_retryable());
        assert!(!http(400).is_retryable());
        assert!(
            !Error::Schema1 {
                reference: "r".into()
            }
            .is_retryable()
        );
    }

    #[test]
    fn excerpt_is_short() {
        let long = "x".repeat(10_000);
        assert!(excerpt(long.as_bytes()).len() < 600);
        assert_eq!(excerpt(b"a\n  b"), "a b");
    }

    #[test]
    fn no_platform_lists_available() {
        let e = Error::NoMatchingPlatform {
            reference: "docker.io/library/x:latest".into(),
            wanted: Platform::new("linux", "riscv64", None),
            available: vec![
                Platform::new("linux", "amd64", None),
                Platform::new("linux", "arm64", Some("v8")),
            ],
        };
        let text = e.to_string();
        assert!(text.contains("linux/riscv64"));
        assert!(text.contains("linux/amd64, linux/arm64/v8"), "{text}");
    }
}
