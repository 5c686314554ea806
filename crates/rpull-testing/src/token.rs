//! A token issuer for the registry's `auth.token` mode (the Docker token protocol): answers
//! `GET /token?service=..&scope=..` with a JWT signed by a key whose certificate chains to the
//! registry's `rootcertbundle` (carried in the `x5c` header, which distribution v2.8 verifies).

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::certs::TokenKeys;
use crate::http::{RequestHead, Server, read_request_head, write_response};

/// The `service` the registry expects in the token's audience.
pub const TOKEN_SERVICE: &str = "rpull-testing-registry";
/// The `issuer` the registry expects in the token.
pub const TOKEN_ISSUER: &str = "rpull-testing-issuer";

/// How the token issuer behaves.
#[derive(Debug, Clone)]
pub struct TokenOptions {
    pub user: String,
    pub password: String,
    /// `expires_in` announced to clients (and the JWT `exp`). The registry itself allows 60 s of
    /// leeway past `exp`, so a short lifetime tests the client's renewal, not the registry.
    pub lifetime: Duration,
    /// Grant `pull` to requests without credentials (otherwise they get 401).
    pub anonymous_pull: bool,
}

impl TokenOptions {
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        TokenOptions {
            user: user.into(),
            password: password.into(),
            lifetime: Duration::from_secs(300),
            anonymous_pull: false,
        }
    }
}

#[derive(Debug)]
struct IssuerState {
    options: TokenOptions,
    lifetime_secs: AtomicU64,
    requests: AtomicUsize,
    issued: AtomicUsize,
    scopes: Mutex<Vec<String>>,
    key: EncodingKey,
    x5c: Vec<String>,
}

/// The running token server. Started by `TestRegistry` for `RegistryAuth::Token`.
#[derive(Debug)]
pub struct TokenIssuer {
    state: Arc<IssuerState>,
    server: Server,
}

#[derive(Serialize)]
struct Access {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    actions: Vec<String>,
}

#[derive(Serialize)]
struct Claims {
    iss: &'static str,
    sub: String,
    aud: &'static str,
    exp: u64,
    nbf: u64,
    iat: u64,
    jti: String,
    access: Vec<Access>,
}

impl TokenIssuer {
    pub(crate) fn start(options: TokenOptions, keys: &TokenKeys) -> Result<TokenIssuer> {
        let state = Arc::new(IssuerState {
            lifetime_secs: AtomicU64::new(options.lifetime.as_secs().max(1)),
            options,
            requests: AtomicUsize::new(0),
            issued: AtomicUsize::new(0),
            scopes: Mutex::new(Vec::new()),
            key: EncodingKey::from_ec_der(&keys.signing_key_der),
            x5c: keys
                .x5c_chain_der
                .iter()
                .map(|der| STANDARD.encode(der))
                .collect(),
        });
        let handler_state = Arc::clone(&state);
        let server = Server::start("token-issuer", move |stream| {
            handle_connection(&handler_state, stream);
        })?;
        Ok(TokenIssuer { state, server })
    }

    /// The `realm` URL, e.g. `http://127.0.0.1:PORT/token`.
    pub fn realm(&self) -> String {
        format!("http://{}/token", self.server.addr())
    }

    /// Requests received on `/token`, successful or not.
    pub fn token_requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Tokens actually issued.
    pub fn tokens_issued(&self) -> usize {
        self.state.issued.load(Ordering::SeqCst)
    }

    /// Every `scope` parameter received, in order.
    pub fn scopes_requested(&self) -> Vec<String> {
        self.state
            .scopes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Changes the lifetime of tokens issued from now on (whole seconds, at least 1).
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.state
            .lifetime_secs
            .store(lifetime.as_secs().max(1), Ordering::SeqCst);
    }

    /// Resets `token_requests`, `tokens_issued` and `scopes_requested`.
    pub fn reset_counters(&self) {
        self.state.requests.store(0, Ordering::SeqCst);
        self.state.issued.store(0, Ordering::SeqCst);
        self.state
            .scopes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

fn handle_connection(state: &IssuerState, stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let Ok(Some(head)) = read_request_head(&mut reader) else {
        return;
    };
    let (status, body, challenge) = respond(state, &head);
    let headers: &[(&str, &str)] = if challenge {
        &[("WWW-Authenticate", "Basic realm=\"rpull-testing\"")]
    } else {
        &[]
    };
    let _ = write_response(
        &mut writer,
        status,
        headers,
        "application/json",
        body.as_bytes(),
    );
}

fn respond(state: &IssuerState, head: &RequestHead) -> (&'static str, String, bool) {
    let Ok(url) = url::Url::parse(&format!("http://issuer{}", head.target)) else {
        return (
            "400 Bad Request",
            r#"{"error":"bad target"}"#.to_owned(),
            false,
        );
    };
    if url.path() != "/token" || head.method != "GET" {
        return (
            "404 Not Found",
            r#"{"error":"not found"}"#.to_owned(),
            false,
        );
    }
    state.requests.fetch_add(1, Ordering::SeqCst);
    let scopes: Vec<String> = url
        .query_pairs()
        .filter(|(key, _)| key == "scope")
        .map(|(_, v)| v.into_owned())
        .collect();
    state
        .scopes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(scopes.iter().cloned());

    let subject = match basic_credentials(head) {
        Some((user, password))
            if user == state.options.user && password == state.options.password =>
        {
            Some(user)
        }
        Some(_) => {
            return (
                "401 Unauthorized",
                r#"{"error":"bad credentials"}"#.to_owned(),
                true,
            );
        }
        None if state.options.anonymous_pull => None,
        None => {
            return (
                "401 Unauthorized",
                r#"{"error":"credentials required"}"#.to_owned(),
                true,
            );
        }
    };
    let access = scopes
        .iter()
        .filter_map(|scope| grant(scope, subject.is_some()))
        .collect();

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let lifetime = state.lifetime_secs.load(Ordering::SeqCst);
    let serial = state.issued.fetch_add(1, Ordering::SeqCst);
    let claims = Claims {
        iss: TOKEN_ISSUER,
        sub: subject.unwrap_or_default(),
        aud: TOKEN_SERVICE,
        exp: now + lifetime,
        nbf: now.saturating_sub(1),
        iat: now,
        jti: format!("rpull-testing-{now}-{serial}"),
        access,
    };
    let mut header = Header::new(Algorithm::ES256);
    header.x5c = Some(state.x5c.clone());
    match jsonwebtoken::encode(&header, &claims, &state.key) {
        Ok(token) => {
            let body = serde_json::json!({
                "token": token,
                "access_token": token,
                "expires_in": lifetime,
            });
            ("200 OK", body.to_string(), false)
        }
        Err(err) => (
            "500 Internal Server Error",
            serde_json::json!({ "error": err.to_string() }).to_string(),
            false,
        ),
    }
}

/// `repository:NAME:pull,push` -> an access entry; anonymous requests only get `pull`.
fn grant(scope: &str, authenticated: bool) -> Option<Access> {
    let (kind, rest) = scope.split_once(':')?;
    let (name, actions) = rest.rsplit_once(':')?;
    let actions = actions
        .split(',')
        .filter(|action| authenticated || *action == "pull")
        .map(str::to_owned)
        .collect();
    Some(Access {
        kind: kind.to_owned(),
        name: name.to_owned(),
        actions,
    })
}

fn basic_credentials(head: &RequestHead) -> Option<(String, String)> {
    let value = head.header("authorization")?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_table() {
        let cases = [
            (
                "repository:a/b:pull,push",
                true,
                Some(("repository", "a/b", "pull,push")),
            ),
            (
                "repository:a/b:pull,push",
                false,
                Some(("repository", "a/b", "pull")),
            ),
            (
                "registry:catalog:*",
                true,
                Some(("registry", "catalog", "*")),
            ),
            ("nonsense", true, None),
        ];
        for (scope, authenticated, expected) in cases {
            let got = grant(scope, authenticated).map(|a| (a.kind, a.name, a.actions.join(",")));
            let expected = expected.map(|(k, n, a)| (k.to_owned(), n.to_owned(), a.to_owned()));
            assert_eq!(got, expected, "{scope} authenticated={authenticated}");
        }
    }
}
