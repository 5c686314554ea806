//! Registry credentials: docker / podman auth files and `docker-credential-*` helpers.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde::Deserialize;
use tracing::debug;

use crate::reference::DOCKER_HUB;

/// The key docker writes for Docker Hub, and what its helpers are asked for.
const DOCKER_HUB_LEGACY_KEY: &str = "https://index.docker.io/v1/";

/// Credentials for one registry. `Debug` redacts the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// User name and password (or personal access token), sent as Basic auth / to the token realm.
    Basic {
        /// User name.
        username: String,
        /// Password or access token.
        password: String,
    },
    /// An OAuth2 refresh token ("identity token"), exchanged at the realm with `grant_type=refresh_token`.
    IdentityToken(String),
}

impl Credentials {
    /// Username and password.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials::Basic {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The user name, if these are Basic credentials.
    pub fn username(&self) -> Option<&str> {
        match self {
            Credentials::Basic { username, .. } => Some(username),
            Credentials::IdentityToken(_) => None,
        }
    }

    /// `Basic base64(user:password)` for an Authorization header, if these are Basic credentials.
    pub(crate) fn basic_header(&self) -> Option<String> {
        match self {
            Credentials::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            Credentials::IdentityToken(_) => None,
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Credentials::IdentityToken(_) => {
                f.debug_tuple("IdentityToken").field(&"<redacted>").finish()
            }
        }
    }
}

/// Failure to read credentials. Never includes a secret.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The auth file exists but cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The auth file is not valid JSON of the expected shape.
    #[error("parsing {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Kind and position only: serde_json's own message may quote a secret value.
        message: String,
    },
    /// An `auth` entry is not base64 of `user:password`.
    #[error("{}: the \"auth\" entry for {key} is not base64 of user:password", path.display())]
    BadAuthEntry {
        /// The file.
        path: PathBuf,
        /// The entry's key.
        key: String,
    },
    /// The credential helper could not run or failed.
    #[error("credential helper {helper}: {message}")]
    Helper {
        /// Program name, `docker-credential-<name>`.
        helper: String,
        /// What failed (exit status and the helper's first line of output).
        message: String,
    },
}

/// Where credentials are looked up: auth files in priority order, each possibly naming helpers.
#[derive(Debug, Clone, Default)]
pub struct CredentialStore {
    files: Vec<PathBuf>,
    /// PATH for finding helpers; `None` inherits the process's.
    helper_path: Option<OsString>,
}

impl CredentialStore {
    /// No credentials at all (anonymous access only).
    pub fn empty() -> CredentialStore {
        CredentialStore::default()
    }

    /// Looks in the given auth files, first match wins.
    pub fn from_files(files: Vec<PathBuf>) -> CredentialStore {
        CredentialStore {
            files,
            helper_path: None,
        }
    }

    /// The files docker and podman use, in order: `$REGISTRY_AUTH_FILE`,
    /// `$XDG_RUNTIME_DIR/containers/auth.json`, `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`).
    pub fn from_env() -> CredentialStore {
        CredentialStore::from_files(default_files(|name| std::env::var_os(name)))
    }

    /// Uses `path` as PATH when looking for `docker-credential-*` helpers.
    pub fn with_helper_path(mut self, path: impl Into<OsString>) -> CredentialStore {
        self.helper_path = Some(path.into());
        self
    }

    /// The auth files consulted, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Credentials for `registry` (a normalised registry name such as `docker.io` or
    /// `localhost:5000`), or `None` for anonymous access. Runs a helper process if configured,
    /// so call it off the async executor.
    pub fn lookup(&self, registry: &str) -> Result<Option<Credentials>, CredentialError> {
        for path in &self.files {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(CredentialError::Read {
                        path: path.clone(),
                        source,
                    });
                }
            };
            let file: AuthFile =
                serde_json::from_str(&text).map_err(|e| CredentialError::Parse {
                    path: path.clone(),
                    message: json_error_position(&e),
                })?;
            if let Some(credentials) = self.lookup_in(path, &file, registry)? {
                debug!(registry, file = %path.display(), "using stored credentials");
                return Ok(Some(credentials));
            }
        }
        Ok(None)
    }

    fn lookup_in(
        &self,
        path: &Path,
        file: &AuthFile,
        registry: &str,
    ) -> Result<Option<Credentials>, CredentialError> {
        if let Some(helper) = find_key(&file.cred_helpers, registry) {
            return self.run_helper(helper, registry);
        }
        if let Some(store) = file.creds_store.as_deref().filter(|s| !s.is_empty())
            && let Some(credentials) = self.run_helper(store, registry)?
        {
            return Ok(Some(credentials));
        }
        let Some((key, entry)) = find_entry(&file.auths, registry) else {
            return Ok(None);
        };
        entry.credentials(path, key)
    }

    fn run_helper(
        &self,
        name: &str,
        registry: &str,
    ) -> Result<Option<Credentials>, CredentialError> {
        let helper = format!("docker-credential-{name}");
        let server = if registry == DOCKER_HUB {
            DOCKER_HUB_LEGACY_KEY
        } else {
            registry
        };
        let error = |message: String| CredentialError::Helper {
            helper: helper.clone(),
            message,
        };
        let mut command = Command::new(&helper);
        command
            .arg("get")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(path) = &self.helper_path {
            command.env("PATH", path);
        }
        let mut child = command
            .spawn()
            .map_err(|e| error(format!("cannot run it: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A helper that exits without reading stdin gives EPIPE here; its exit status tells more.
            let _ = stdin.write_all(server.as_bytes());
        }
        let output = child
            .wait_with_output()
            .map_err(|e| error(format!("waiting for it: {e}")))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            let first_line = stdout.lines().next().unwrap_or("").trim();
            if first_line.contains("credentials not found") {
                debug!(helper, registry, "credential helper has no entry");
                return Ok(None);
            }
            // Helpers print their error message on stdout; they never print the secret there.
            let first_line: String = first_line.chars().take(200).collect();
            return Err(error(format!("{} ({first_line})", output.status)));
        }
        let reply: HelperReply = serde_json::from_str(&stdout)
            .map_err(|e| error(format!("unparsable reply: {}", json_error_position(&e))))?;
        if reply.secret.is_empty() {
            return Ok(None);
        }
        Ok(Some(if reply.username == "<token>" {
            Credentials::IdentityToken(reply.secret)
        } else {
            Credentials::basic(reply.username, reply.secret)
        }))
    }
}

/// serde_json's Display can quote the offending value (a password); keep only kind and position.
fn json_error_position(error: &serde_json::Error) -> String {
    let kind = match error.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "invalid JSON",
        serde_json::error::Category::Data => "unexpected structure",
        serde_json::error::Category::Eof => "truncated JSON",
    };
    format!("{kind} at line {} column {}", error.line(), error.column())
}

fn default_files(var: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let non_empty = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut files = Vec::new();
    if let Some(file) = non_empty("REGISTRY_AUTH_FILE") {
        files.push(file);
    }
    if let Some(dir) = non_empty("XDG_RUNTIME_DIR") {
        files.push(dir.join("containers/auth.json"));
    }
    if let Some(dir) = non_empty("DOCKER_CONFIG") {
        files.push(dir.join("config.json"));
    } else if let Some(home) = non_empty("HOME") {
        files.push(home.join(".docker/config.json"));
    }
    files
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthFile {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: HashMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

impl fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthEntry")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl AuthEntry {
    fn credentials(&self, path: &Path, key: &str) -> Result<Option<Credentials>, CredentialError> {
        if let Some(token) = self.identitytoken.as_deref().filter(|t| !t.is_empty()) {
            return Ok(Some(Credentials::IdentityToken(token.to_owned())));
        }
        if let Some(auth) = self.auth.as_deref().filter(|a| !a.is_empty()) {
            let bad = || CredentialError::BadAuthEntry {
                path: path.to_owned(),
                key: key.to_owned(),
            };
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| bad())?;
            let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
            let (username, password) = decoded.split_once(':').ok_or_else(bad)?;
            return Ok(Some(Credentials::basic(username, password)));
        }
        match (&self.username, &self.password) {
            (Some(username), Some(password)) if !username.is_empty() => {
                Ok(Some(Credentials::basic(username.clone(), password.clone())))
            }
            _ => Ok(None),
        }
    }
}

#[derive(Deserialize)]
struct HelperReply {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// `https://host/v2/` -> `host`; Docker Hub aliases -> `docker.io`.
pub(crate) fn normalize_registry(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => DOCKER_HUB,
        other => other,
    }
}

/// Exact key first, then keys that normalise to the registry.
fn find_key<'a, V>(map: &'a HashMap<String, V>, registry: &str) -> Option<&'a V> {
    find_entry(map, registry).map(|(_, v)| v)
}

fn find_entry<'a, V>(map: &'a HashMap<String, V>, registry: &str) -> Option<(&'a str, &'a V)> {
    if let Some((key, value)) = map.get_key_value(registry) {
        return Some((key, value));
    }
    let wanted = normalize_registry(registry);
    // Sorted so the choice between two aliases is deterministic.
    let mut keys: Vec<&String> = map
        .keys()
        .filter(|k| normalize_registry(k) == wanted)
        .collect();
    keys.sort();
    keys.first().map(|k| (k.as_str(), &map[*k]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn store_with(files: &[(&str, String)]) -> (tempfile::TempDir, CredentialStore) {
        let dir = tempfile::tempdir().unwrap();
        let paths = files
            .iter()
            .map(|(name, content)| {
                let path = dir.path().join(name);
                std::fs::write(&path, content).unwrap();
                path
            })
            .collect();
        (dir, CredentialStore::from_files(paths))
    }

    #[test]
    fn default_file_order() {
        let env = |name: &str| -> Option<OsString> {
            match name {
                "REGISTRY_AUTH_FILE" => Some("/a/auth.json".into()),
                "XDG_RUNTIME_DIR" => Some("/run/user/1".into()),
                "DOCKER_CONFIG" => Some("/d".into()),
                "HOME" => Some("/home/u".into()),
                _ => None,
            }
        };
        assert_eq!(
            default_files(env),
            vec![
                PathBuf::from("/a/auth.json"),
                PathBuf::from("/run/user/1/containers/auth.json"),
                PathBuf::from("/d/config.json"),
            ]
        );
        let home_only = |name: &str| (name == "HOME").then(|| OsString::from("/home/u"));
        assert_eq!(
            default_files(home_only),
            vec![PathBuf::from("/home/u/.docker/config.json")]
        );
    }

    #[test]
    fn auth_entry_forms() {
        let config = serde_json::json!({
            "auths": {
                "https://index.docker.io/v1/": {"auth": b64("hubuser:hubpass")},
                "https://quay.io/v2/": {"username": "q", "password": "qpass"},
                "ghcr.io": {"identitytoken": "refresh-me"},
                "localhost:5000": {"auth": b64("user:pa:ss")},
                "broken.io": {"auth": "%%%"},
                "empty.io": {}
            }
        });
        let (_dir, store) = store_with(&[("config.json", config.to_string())]);
        assert_eq!(
            store.lookup("docker.io").unwrap(),
            Some(Credentials::basic("hubuser", "hubpass"))
        );
        assert_eq!(
            store.lookup("quay.io").unwrap(),
            Some(Credentials::basic("q", "qpass"))
        );
        assert_eq!(
            store.lookup("ghcr.io").unwrap(),
            Some(Credentials::IdentityToken("refresh-me".into()))
        );
        // Password may contain ':'; only the first one splits.
        assert_eq!(
            store.lookup("localhost:5000").unwrap(),
            Some(Credentials::basic("user", "pa:ss"))
        );
        assert_eq!(store.lookup("other.io").unwrap(), None);
        assert_eq!(store.lookup("empty.io").unwrap(), None);
        let err = store.lookup("broken.io").unwrap_err();
        assert!(err.to_string().contains("broken.io"), "{err}");
    }

    #[test]
    fn docker_hub_aliases() {
        for key in [
            "https://index.docker.io/v1/",
            "index.docker.io",
            "docker.io",
            "registry-1.docker.io",
        ] {
            let config = serde_json::json!({"auths": {key: {"auth": b64("u:p")}}});
            let (_dir, store) = store_with(&[("config.json", config.to_string())]);
            assert_eq!(
                store.lookup("docker.io").unwrap(),
                Some(Credentials::basic("u", "p")),
                "{key}"
            );
        }
    }

    #[test]
    fn first_file_wins_and_missing_files_are_skipped() {
        let first = serde_json::json!({"auths": {"r.io": {"auth": b64("first:1")}}});
        let second = serde_json::json!({"auths": {"r.io": {"auth": b64("second:2")}, "s.io": {"auth": b64("s:2")}}});
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        let b = dir.path().join("b.json");
        std::fs::write(&a, first.to_string()).unwrap();
        std::fs::write(&b, second.to_string()).unwrap();
        let store = CredentialStore::from_files(vec![dir.path().join("missing.json"), a, b]);
        assert_eq!(
            store.lookup("r.io").unwrap(),
            Some(Credentials::basic("first", "1"))
        );
        assert_eq!(
            store.lookup("s.io").unwrap(),
            Some(Credentials::basic("s", "2"))
        );
    }

    #[test]
    fn unparsable_file_is_an_error_without_content() {
        for content in [
            "{\"auths\": {\"x\": \"s3cr3t-value\"}}",
            "{\"auths\": {\"x\": {\"auth\": \"s3cr3t-value",
        ] {
            let (_dir, store) = store_with(&[("config.json", content.to_owned())]);
            let err = store.lookup("x").unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(text.contains("config.json"), "{text}");
            assert!(!text.contains("s3cr3t-value"), "{text}");
        }
    }

    #[test]
    fn credentials_debug_redacts() {
        let basic = Credentials::basic("alice", "hunter2-secret");
        let text = format!("{basic:?}");
        assert!(text.contains("alice"));
        assert!(!text.contains("hunter2-secret"), "{text}");
        let token = Credentials::IdentityToken("tok-secret".into());
        assert!(!format!("{token:?}").contains("tok-secret"));
        let entry = AuthEntry {
            password: Some("pw-secret".into()),
            ..AuthEntry::default()
        };
        assert!(!format!("{entry:?}").contains("pw-secret"));
    }

    /// Writes a real `docker-credential-test` program that answers like docker's helpers.
    fn write_helper(dir: &Path) {
        let script = r#"#!/bin/sh
[ "$1" = get ] || exit 2
read -r server
case "$server" in
  "https://index.docker.io/v1/") echo '{"ServerURL":"hub","Username":"hubby","Secret":"hub-secret"}' ;;
  "helper.io") echo '{"ServerURL":"helper.io","Username":"<token>","Secret":"refresh-secret"}' ;;
  "store.io") echo '{"ServerURL":"store.io","Username":"su","Secret":"store-secret"}' ;;
  "fail.io") echo "backend exploded"; exit 1 ;;
  *) echo "credentials not found in native keychain"; exit 1 ;;
esac
"#;
        let path = dir.join("docker-credential-test");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn credential_helpers() {
        let bin = tempfile::tempdir().unwrap();
        write_helper(bin.path());
        let config = serde_json::json!({
            "auths": {"fallback.io": {"auth": b64("fb:fbpass")}, "helper.io": {"auth": b64("not:used")}},
            "credHelpers": {"helper.io": "test", "docker.io": "test", "fail.io": "test", "gone.io": "absent"},
            "credsStore": "test"
        });
        let (_dir, store) = store_with(&[("config.json", config.to_string())]);
        let path = format!("{}:/usr/bin:/bin", bin.path().display());
        let store = store.with_helper_path(path);
        assert_eq!(
            store.lookup("docker.io").unwrap(),
            Some(Credentials::basic("hubby", "hub-secret"))
        );
        assert_eq!(
            store.lookup("helper.io").unwrap(),
            Some(Credentials::IdentityToken("refresh-secret".into()))
        );
        // credsStore answers for hosts without a credHelpers entry...
        assert_eq!(
            store.lookup("store.io").unwrap(),
            Some(Credentials::basic("su", "store-secret"))
        );
        // ...and when it has nothing, the auths entry of the same file is used.
        assert_eq!(
            store.lookup("fallback.io").unwrap(),
            Some(Credentials::basic("fb", "fbpass"))
        );
        assert_eq!(store.lookup("nothing.io").unwrap(), None);
        let err = store.lookup("fail.io").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("docker-credential-test") && text.contains("backend exploded"),
            "{text}"
        );
        let err = store.lookup("gone.io").unwrap_err();
        assert!(
            err.to_string().contains("docker-credential-absent"),
            "{err}"
        );
    }
}
