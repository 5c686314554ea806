//! One HTTP exchange with a registry host: scheme choice (HTTPS, plain HTTP, loopback fallback),
//! attaching Authorization only to the registry's own host, and classifying failures.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;

use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use reqwest::{Method, Response};
use tracing::debug;
use url::Url;

use crate::error::{Error, display_url};

/// What to send. Bodies are `Bytes` so a request can be re-sent (auth retry, transient errors).
#[derive(Debug, Clone)]
pub(crate) struct RequestSpec {
    pub(crate) method: Method,
    pub(crate) target: Target,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Bytes>,
    /// Whether a transient failure may be retried by re-sending (false for PATCH: the registry
    /// may have taken part of the chunk).
    pub(crate) retry: bool,
}

impl RequestSpec {
    /// A request to `path` (starting with `/v2/`) on the registry host.
    pub(crate) fn new(method: Method, path: String) -> RequestSpec {
        RequestSpec {
            method,
            target: Target::Path(path),
            headers: HeaderMap::new(),
            body: None,
            retry: true,
        }
    }

    /// A request to an absolute URL the registry gave us (an upload Location).
    pub(crate) fn to_url(method: Method, url: Url) -> RequestSpec {
        RequestSpec {
            target: Target::Url(url),
            ..RequestSpec::new(method, String::new())
        }
    }

    pub(crate) fn header(mut self, name: reqwest::header::HeaderName, value: &str) -> RequestSpec {
        if let Ok(value) = value.parse() {
            self.headers.insert(name, value);
        }
        self
    }

    pub(crate) fn body(mut self, body: Bytes) -> RequestSpec {
        self.body = Some(body);
        self
    }
}

/// Where a request goes.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// Path and query on the registry host; the scheme is chosen by the transport.
    Path(String),
    /// A full URL.
    Url(Url),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// The reqwest client plus what we learned about each host's scheme.
#[derive(Debug)]
pub(crate) struct Transport {
    pub(crate) http: reqwest::Client,
    plain_http: bool,
    insecure: bool,
    schemes: Mutex<HashMap<String, Scheme>>,
}

impl Transport {
    pub(crate) fn new(http: reqwest::Client, plain_http: bool, insecure: bool) -> Transport {
        Transport {
            http,
            plain_http,
            insecure,
            schemes: Mutex::new(HashMap::new()),
        }
    }

    /// The scheme to try first, and whether a "this is not TLS" failure may fall back to HTTP.
    fn scheme_for(&self, host: &str) -> (Scheme, bool) {
        if self.plain_http {
            return (Scheme::Http, false);
        }
        if let Some(scheme) = self
            .schemes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
        {
            return (*scheme, false);
        }
        (Scheme::Https, self.insecure || is_loopback(host))
    }

    fn remember(&self, host: &str, scheme: Scheme) {
        self.schemes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(host.to_owned(), scheme);
    }

    /// Sends once. `authorization` is attached only when the URL is on `host`.
    pub(crate) async fn send(
        &self,
        host: &str,
        spec: &RequestSpec,
        authorization: Option<&str>,
    ) -> Result<Response, Error> {
        let (url, may_fall_back) = match &spec.target {
            Target::Url(url) => (url.clone(), false),
            Target::Path(path) => {
                let (scheme, may_fall_back) = self.scheme_for(host);
                (
                    parse_url(&format!("{}://{host}{path}", scheme.as_str()))?,
                    may_fall_back,
                )
            }
        };
        match self.send_to(&url, host, spec, authorization).await {
            Ok(response) => {
                if may_fall_back {
                    self.remember(host, Scheme::Https);
                }
                Ok(response)
            }
            Err(error) if may_fall_back && speaks_no_tls(&error) => {
                debug!(
                    host,
                    "server does not speak TLS; falling back to plain HTTP for this host"
                );
                self.remember(host, Scheme::Http);
                let mut url = url;
                let _ = url.set_scheme("http");
                self.send_to(&url, host, spec, authorization)
                    .await
                    .map_err(|e| classify(e, &url, host))
            }
            Err(error) => Err(classify(error, &url, host)),
        }
    }

    async fn send_to(
        &self,
        url: &Url,
        host: &str,
        spec: &RequestSpec,
        authorization: Option<&str>,
    ) -> Result<Response, reqwest::Error> {
        let mut request = self
            .http
            .request(spec.method.clone(), url.clone())
            .headers(spec.headers.clone());
        if let Some(authorization) = authorization
            && same_authority(url, host)
        {
            request = request.header(AUTHORIZATION, authorization);
        }
        if let Some(body) = &spec.body {
            request = request.body(body.clone());
        }
        debug!(method = %spec.method, url = %display_url(url), "request");
        request.send().await
    }
}

fn parse_url(text: &str) -> Result<Url, Error> {
    Url::parse(text).map_err(|e| Error::Protocol {
        url: text.chars().take(200).collect(),
        message: format!("invalid URL: {e}"),
    })
}

/// Whether `url` points at `host` (host and port, default ports filled in).
pub(crate) fn same_authority(url: &Url, host: &str) -> bool {
    let Ok(registry) = Url::parse(&format!("{}://{host}/", url.scheme())) else {
        return false;
    };
    registry.host_str() == url.host_str()
        && registry.port_or_known_default() == url.port_or_known_default()
}

/// `localhost`, `127.0.0.0/8`, `[::1]`, with or without a port.
pub(crate) fn is_loopback(host: &str) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        return rest
            .split_once(']')
            .and_then(|(ip, _)| ip.parse::<Ipv6Addr>().ok())
            .is_some_and(|ip| ip.is_loopback());
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Turns a reqwest failure into `Tls` (anything rustls complained about) or `Transport`.
pub(crate) fn classify(error: reqwest::Error, url: &Url, host: &str) -> Error {
    if rustls_error(&error).is_some() {
        Error::Tls {
            host: host.to_owned(),
            error: error.without_url(),
        }
    } else {
        Error::Transport {
            url: display_url(url),
            error: error.without_url(),
        }
    }
}

/// The server answered the TLS ClientHello with something that is not TLS (a plain HTTP
/// server's "400 Bad Request"). Certificate problems are *not* this.
fn speaks_no_tls(error: &reqwest::Error) -> bool {
    matches!(
        rustls_error(error),
        Some(rustls::Error::InvalidMessage(_) | rustls::Error::PeerSentOversizedRecord)
    )
}

fn rustls_error(error: &reqwest::Error) -> Option<&rustls::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        // io::Error::source() skips the wrapped error itself (and io errors nest), so step into it.
        current = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        let cases = [
            ("localhost", true),
            ("localhost:5000", true),
            ("LOCALHOST:5000", true),
            ("127.0.0.1", true),
            ("127.0.0.1:5000", true),
            ("127.1.2.3:443", true),
            ("[::1]", true),
            ("[::1]:5000", true),
            ("[2001:db8::1]:5000", false),
            ("128.0.0.1:5000", false),
            ("localhost.example.com", false),
            ("registry-1.docker.io", false),
            ("10.0.0.1:5000", false),
        ];
        for (host, expected) in cases {
            assert_eq!(is_loopback(host), expected, "{host}");
        }
    }

    #[test]
    fn authority_comparison() {
        let url = Url::parse("https://r.io/v2/x").unwrap();
        assert!(same_authority(&url, "r.io"));
        assert!(same_authority(&url, "r.io:443"));
        assert!(!same_authority(&url, "r.io:5000"));
        assert!(!same_authority(&url, "s3.amazonaws.com"));
        let url = Url::parse("http://[::1]:5000/v2/").unwrap();
        assert!(same_authority(&url, "[::1]:5000"));
    }

    #[test]
    fn plain_http_and_fallback_policy() {
        let http = reqwest::Client::new();
        let t = Transport::new(http.clone(), false, false);
        assert_eq!(t.scheme_for("r.io"), (Scheme::Https, false));
        assert_eq!(t.scheme_for("localhost:5000"), (Scheme::Https, true));
        t.remember("localhost:5000", Scheme::Http);
        assert_eq!(t.scheme_for("localhost:5000"), (Scheme::Http, false));
        let forced = Transport::new(http.clone(), true, false);
        assert_eq!(forced.scheme_for("r.io"), (Scheme::Http, false));
        let insecure = Transport::new(http, false, true);
        assert_eq!(insecure.scheme_for("r.io"), (Scheme::Https, true));
    }
}
