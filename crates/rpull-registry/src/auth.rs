//! Authentication: `WWW-Authenticate` challenges, the bearer token dance, and the token cache.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tracing::debug;

use crate::credentials::Credentials;
use crate::error::{Error, display_url, excerpt};

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// `Bearer realm="...",service="...",scope="..."`
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    /// `Basic realm="..."`
    Basic,
}

/// Parses every challenge in one header value and returns the first we can answer (Bearer
/// preferred over Basic). Handles quoted values with commas and escaped quotes.
pub(crate) fn parse_challenges(header: &str) -> Vec<Challenge> {
    let mut challenges = Vec::new();
    let mut rest = header.trim();
    while !rest.is_empty() {
        let scheme_end = rest
            .find(|c: char| c.is_whitespace() || c == ',')
            .unwrap_or(rest.len());
        let scheme = &rest[..scheme_end];
        rest = rest[scheme_end..].trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        let (params, remaining) = parse_params(rest);
        rest = remaining;
        match scheme.to_ascii_lowercase().as_str() {
            "bearer" => {
                if let Some(realm) = params.get("realm").filter(|r| !r.is_empty()) {
                    challenges.push(Challenge::Bearer {
                        realm: realm.clone(),
                        service: params.get("service").cloned(),
                        scope: params.get("scope").cloned(),
                    });
                }
            }
            "basic" => challenges.push(Challenge::Basic),
            _ => {}
        }
    }
    challenges
}

/// Reads `key=value` / `key="quoted, value"` pairs until the next scheme token (a word not
/// followed by `=`). Returns the params (keys lowercased) and the unparsed rest.
fn parse_params(mut input: &str) -> (HashMap<String, String>, &str) {
    let mut params = HashMap::new();
    loop {
        input = input.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        let key_end = input
            .find(|c: char| c == '=' || c.is_whitespace() || c == ',')
            .unwrap_or(input.len());
        let key = &input[..key_end];
        let after_key = input[key_end..].trim_start();
        if key.is_empty() || !after_key.starts_with('=') {
            // Not a parameter: the next challenge's scheme, or the end.
            return (params, input);
        }
        let value_start = after_key[1..].trim_start();
        let (value, rest) = if let Some(quoted) = value_start.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end.min(quoted.len())..])
        } else {
            let end = value_start
                .find(|c: char| c == ',' || c.is_whitespace())
                .unwrap_or(value_start.len());
            (value_start[..end].to_owned(), &value_start[end..])
        };
        params.insert(key.to_ascii_lowercase(), value);
        input = rest;
    }
}

/// A bearer token and when to stop using it.
struct CachedToken {
    token: String,
    expires: Instant,
}

/// Bearer tokens per (registry host, scopes), and which hosts asked for Basic auth.
#[derive(Default)]
pub(crate) struct TokenCache {
    tokens: Mutex<HashMap<(String, String), CachedToken>>,
    basic_hosts: Mutex<HashMap<String, String>>,
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.tokens.lock().map(|t| t.len()).unwrap_or(0);
        f.debug_struct("TokenCache")
            .field("tokens", &count)
            .finish_non_exhaustive()
    }
}

impl TokenCache {
    /// The Authorization header value to send proactively, if we have one.
    pub(crate) fn header(&self, host: &str, scopes: &str) -> Option<String> {
        if let Some(basic) = lock(&self.basic_hosts).get(host) {
            return Some(basic.clone());
        }
        let tokens = lock(&self.tokens);
        let cached = tokens.get(&(host.to_owned(), scopes.to_owned()))?;
        (cached.expires > Instant::now()).then(|| format!("Bearer {}", cached.token))
    }

    /// Forgets whatever we sent for (host, scopes) after the registry rejected it.
    pub(crate) fn forget(&self, host: &str, scopes: &str) {
        lock(&self.tokens).remove(&(host.to_owned(), scopes.to_owned()));
        lock(&self.basic_hosts).remove(host);
    }

    pub(crate) fn store_token(&self, host: &str, scopes: &str, token: String, lifetime: Duration) {
        lock(&self.tokens).insert(
            (host.to_owned(), scopes.to_owned()),
            CachedToken {
                token,
                expires: Instant::now() + lifetime,
            },
        );
    }

    pub(crate) fn store_basic(&self, host: &str, header: String) {
        lock(&self.basic_hosts).insert(host.to_owned(), header);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a map half-updated; keep going.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// A token and how long it may be cached.
pub(crate) struct Token {
    pub(crate) value: String,
    pub(crate) lifetime: Duration,
}

/// The minimum lifetime the token spec promises when `expires_in` is absent or smaller.
const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// Renew this long before expiry so a token does not die in flight.
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// Fetches a bearer token from `realm` as docker does: GET with Basic credentials (or none), or
/// POST `grant_type=refresh_token` for an identity token.
pub(crate) async fn fetch_token(
    http: &reqwest::Client,
    realm: &str,
    service: Option<&str>,
    scopes: &[String],
    credentials: Option<&Credentials>,
) -> Result<Token, Error> {
    let realm_url = url::Url::parse(realm).map_err(|e| Error::Token {
        realm: realm.chars().take(200).collect(),
        status: None,
        message: format!("invalid realm URL: {e}"),
    })?;
    let realm_display = display_url(&realm_url);
    let token_error = |status: Option<u16>, message: String| Error::Token {
        realm: realm_display.clone(),
        status,
        message,
    };
    let request = match credentials {
        Some(Credentials::IdentityToken(refresh_token)) => {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "refresh_token");
            if let Some(service) = service {
                form.append_pair("service", service);
            }
            form.append_pair("client_id", "rpull");
            if !scopes.is_empty() {
                form.append_pair("scope", &scopes.join(" "));
            }
            form.append_pair("refresh_token", refresh_token);
            http.post(realm_url.clone())
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(form.finish())
        }
        _ => {
            let mut url = realm_url.clone();
            {
                let mut query = url.query_pairs_mut();
                if let Some(service) = service {
                    query.append_pair("service", service);
                }
                for scope in scopes {
                    query.append_pair("scope", scope);
                }
                if let Some(username) = credentials.and_then(Credentials::username) {
                    query.append_pair("account", username);
                }
            }
            let mut request = http.get(url);
            if let Some(header) = credentials.and_then(Credentials::basic_header) {
                request = request.header(reqwest::header::AUTHORIZATION, header);
            }
            request
        }
    };
    debug!(realm = %realm_display, ?scopes, authenticated = credentials.is_some(), "fetching token");
    let response = request
        .send()
        .await
        .map_err(|e| token_error(None, e.without_url().to_string()))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| token_error(Some(status.as_u16()), e.without_url().to_string()))?;
    if !status.is_success() {
        let message = if status.as_u16() == 401 {
            format!("credentials rejected: {}", excerpt(&body))
        } else {
            excerpt(&body)
        };
        return Err(token_error(Some(status.as_u16()), message));
    }
    let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
        token_error(
            Some(status.as_u16()),
            format!("unparsable token response: {e}"),
        )
    })?;
    let value = parsed
        .token
        .filter(|t| !t.is_empty())
        .or(parsed.access_token.filter(|t| !t.is_empty()))
        .ok_or_else(|| token_error(Some(status.as_u16()), "response has no token".to_owned()))?;
    let lifetime =
        Duration::from_secs(parsed.expires_in.unwrap_or(0)).max(MIN_TOKEN_LIFETIME) - EXPIRY_MARGIN;
    Ok(Token { value, lifetime })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(realm: &str, service: Option<&str>, scope: Option<&str>) -> Challenge {
        Challenge::Bearer {
            realm: realm.into(),
            service: service.map(Into::into),
            scope: scope.map(Into::into),
        }
    }

    #[test]
    fn challenge_table() {
        let cases: Vec<(&str, Vec<Challenge>)> = vec![
            (
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
                vec![bearer(
                    "https://auth.docker.io/token",
                    Some("registry.docker.io"),
                    Some("repository:library/alpine:pull"),
                )],
            ),
            (
                r#"Bearer realm="https://r.io/token",scope="repository:a:pull,push",service="r.io""#,
                vec![bearer(
                    "https://r.io/token",
                    Some("r.io"),
                    Some("repository:a:pull,push"),
                )],
            ),
            (
                r#"bearer   realm = "https://r.io/t" , service="s""#,
                vec![bearer("https://r.io/t", Some("s"), None)],
            ),
            (
                r#"Bearer realm=https://r.io/t,service=s"#,
                vec![bearer("https://r.io/t", Some("s"), None)],
            ),
            (r#"Basic realm="Registry Realm""#, vec![Challenge::Basic]),
            ("Basic", vec![Challenge::Basic]),
            (
                r#"Basic realm="x, y", Bearer realm="https://t/x",error="insufficient_scope""#,
                vec![Challenge::Basic, bearer("https://t/x", None, None)],
            ),
            (
                r#"Bearer realm="https://t/\"q\"",service="a\\b""#,
                vec![bearer(r#"https://t/"q""#, Some(r"a\b"), None)],
            ),
            (r#"Bearer service="no-realm""#, vec![]),
            ("Negotiate abc==", vec![]),
            ("", vec![]),
            (
                r#"Bearer realm="unterminated"#,
                vec![bearer("unterminated", None, None)],
            ),
        ];
        for (header, expected) in cases {
            assert_eq!(parse_challenges(header), expected, "{header}");
        }
    }

    #[test]
    fn cache_expiry_and_forget() {
        let cache = TokenCache::default();
        assert_eq!(cache.header("h", "s"), None);
        cache.store_token("h", "s", "tok-s3cret".into(), Duration::from_secs(60));
        assert_eq!(cache.header("h", "s").as_deref(), Some("Bearer tok-s3cret"));
        assert!(!format!("{cache:?}").contains("s3cret"));
        assert_eq!(cache.header("h", "other"), None);
        assert_eq!(cache.header("other", "s"), None);
        cache.store_token("h", "expired", "old".into(), Duration::ZERO);
        assert_eq!(cache.header("h", "expired"), None);
        cache.forget("h", "s");
        assert_eq!(cache.header("h", "s"), None);
        cache.store_basic("b", "Basic xyz".into());
        assert_eq!(cache.header("b", "any").as_deref(), Some("Basic xyz"));
    }

    /// Serves one HTTP exchange on 127.0.0.1 with `reply` as JSON and returns the raw request,
    /// so the exact wire format of the token request can be checked.
    async fn one_shot_server(
        status: &'static str,
        reply: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let realm = format!("http://{}/token", listener.local_addr().unwrap());
        let handle = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = socket.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some(head_end) = text.find("\r\n\r\n") {
                    let length = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if request.len() >= head_end + 4 + length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
            socket.write_all(response.as_bytes()).await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (realm, handle)
    }

    #[tokio::test]
    async fn token_get_with_basic_credentials() {
        let (realm, server) =
            one_shot_server("200 OK", r#"{"token":"t-123","expires_in":300}"#).await;
        let http = reqwest::Client::new();
        let credentials = Credentials::basic("bob", "b0b-secret");
        let scopes = vec![
            "repository:a/b:pull,push".to_owned(),
            "repository:c:pull".to_owned(),
        ];
        let token = fetch_token(&http, &realm, Some("reg.io"), &scopes, Some(&credentials))
            .await
            .unwrap();
        assert_eq!(token.value, "t-123");
        assert_eq!(token.lifetime, Duration::from_secs(290));
        let request = server.await.unwrap();
        let first_line = request.lines().next().unwrap();
        assert_eq!(
            first_line,
            "GET /token?service=reg.io&scope=repository%3Aa%2Fb%3Apull%2Cpush&scope=repository%3Ac%3Apull&account=bob HTTP/1.1"
        );
        let expected_auth = credentials.basic_header().unwrap().to_ascii_lowercase();
        assert!(
            request
                .to_ascii_lowercase()
                .contains(&format!("authorization: {expected_auth}")),
            "{request}"
        );
    }

    #[tokio::test]
    async fn token_post_for_identity_token() {
        let (realm, server) =
            one_shot_server("200 OK", r#"{"access_token":"acc","expires_in":10}"#).await;
        let http = reqwest::Client::new();
        let credentials = Credentials::IdentityToken("refresh-xyz".into());
        let scopes = vec!["repository:a:pull".to_owned()];
        let token = fetch_token(&http, &realm, Some("reg.io"), &scopes, Some(&credentials))
            .await
            .unwrap();
        assert_eq!(token.value, "acc");
        // expires_in below the spec's 60 s minimum is raised to it.
        assert_eq!(token.lifetime, MIN_TOKEN_LIFETIME - EXPIRY_MARGIN);
        let request = server.await.unwrap();
        assert!(request.starts_with("POST /token HTTP/1.1"), "{request}");
        assert!(
            !request.to_ascii_lowercase().contains("authorization:"),
            "{request}"
        );
        let body = request.split("\r\n\r\n").nth(1).unwrap();
        assert_eq!(
            body,
            "grant_type=refresh_token&service=reg.io&client_id=rpull&scope=repository%3Aa%3Apull&refresh_token=refresh-xyz"
        );
    }

    #[tokio::test]
    async fn token_rejection_does_not_echo_secret() {
        let (realm, server) = one_shot_server(
            "401 Unauthorized",
            r#"{"details":"incorrect username or password"}"#,
        )
        .await;
        let http = reqwest::Client::new();
        let credentials = Credentials::basic("bob", "b0b-secret");
        let err = fetch_token(&http, &realm, None, &[], Some(&credentials))
            .await
            .err()
            .unwrap();
        server.await.unwrap();
        let text = format!("{err} {err:?}");
        assert!(
            text.contains("401") && text.contains("incorrect username"),
            "{text}"
        );
        assert!(!text.contains("b0b-secret"), "{text}");
        assert!(!err.is_retryable());
    }
}
