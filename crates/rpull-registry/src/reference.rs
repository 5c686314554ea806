//! Image references, parsed and normalised exactly as docker does (`distribution/reference`).

use std::fmt;
use std::str::FromStr;

use crate::digest::Digest;

/// Docker Hub's canonical registry name.
pub const DOCKER_HUB: &str = "docker.io";
/// The host that actually serves Docker Hub's registry API.
pub const DOCKER_HUB_API_HOST: &str = "registry-1.docker.io";
const DEFAULT_TAG: &str = "latest";
const NAME_TOTAL_LENGTH_MAX: usize = 255;
const TAG_LENGTH_MAX: usize = 128;

/// A normalised image reference: registry, repository, and a tag and/or a digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

/// A string that is not a valid image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid reference {input:?}: {reason}")]
pub struct ReferenceError {
    /// The rejected input (truncated to 300 characters).
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Reference {
    /// Parses `[registry/]repository[:tag][@digest]` the way `docker pull` does.
    ///
    /// `alpine` becomes `docker.io/library/alpine:latest`; the first path component is a registry
    /// only if it contains `.` or `:`, is `localhost`, or has uppercase letters (as in docker).
    pub fn parse(input: &str) -> Result<Reference, ReferenceError> {
        let error = |reason: &str| ReferenceError {
            input: input.chars().take(300).collect(),
            reason: reason.to_owned(),
        };
        if input.is_empty() {
            return Err(error("empty reference"));
        }
        if input.len() == 64
            && input
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(error(
                "cannot specify 64-byte hexadecimal strings (an image ID is not a reference)",
            ));
        }

        let (name_and_tag, digest) = match input.split_once('@') {
            Some((rest, digest)) => {
                let digest = Digest::parse(digest)
                    .map_err(|e| error(&format!("bad digest: {}", e.reason)))?;
                (rest, Some(digest))
            }
            None => (input, None),
        };

        let last_slash = name_and_tag.rfind('/');
        let (name, tag) = match name_and_tag.rfind(':') {
            Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
                (&name_and_tag[..colon], Some(&name_and_tag[colon + 1..]))
            }
            _ => (name_and_tag, None),
        };
        if let Some(tag) = tag
            && !is_valid_tag(tag)
        {
            return Err(error(
                "bad tag (must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127})",
            ));
        }
        if name.is_empty() {
            return Err(error("missing repository name"));
        }
        if name.len() > NAME_TOTAL_LENGTH_MAX {
            return Err(error(
                "repository name must not be longer than 255 characters",
            ));
        }

        let (registry, remainder) = split_registry(name);
        if let Some(registry) = registry
            && !is_valid_domain(registry)
        {
            return Err(error(&format!("bad registry host {registry:?}")));
        }
        if remainder.to_lowercase() != remainder {
            return Err(error("repository name must be lowercase"));
        }
        for component in remainder.split('/') {
            if component.is_empty() {
                return Err(error("empty path component"));
            }
            if !is_valid_path_component(component) {
                return Err(error(&format!(
                    "bad path component {component:?} (lowercase letters and digits, separated by '.', '_', '__' or dashes)"
                )));
            }
        }

        let registry = match registry {
            None | Some("index.docker.io") => DOCKER_HUB,
            Some(host) => host,
        };
        let repository = if registry == DOCKER_HUB && !remainder.contains('/') {
            format!("library/{remainder}")
        } else {
            remainder.to_owned()
        };
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_owned()),
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry: registry.to_owned(),
            repository,
            tag,
            digest,
        })
    }

    /// The normalised registry (`docker.io` for Docker Hub), with port if one was given.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository path (`library/alpine` for a Docker Hub single-component name).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, if any (`latest` is filled in only when there is no digest).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, if any; it wins over the tag when fetching.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// The host (and port) that serves the registry API: `registry-1.docker.io` for Docker Hub.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API_HOST
        } else {
            &self.registry
        }
    }

    /// What goes after `/manifests/`: the digest if there is one, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => DEFAULT_TAG.to_owned(),
        }
    }

    /// The same image pinned to `digest` (the tag is kept for display).
    pub fn with_digest(&self, digest: Digest) -> Reference {
        Reference {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// The same repository with `tag` and no digest.
    pub fn with_tag(&self, tag: &str) -> Result<Reference, ReferenceError> {
        if !is_valid_tag(tag) {
            return Err(ReferenceError {
                input: tag.to_owned(),
                reason: "bad tag (must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127})".to_owned(),
            });
        }
        Ok(Reference {
            tag: Some(tag.to_owned()),
            digest: None,
            ..self.clone()
        })
    }

    /// `registry/repository` without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reference::parse(s)
    }
}

/// docker's `splitDockerDomain`: returns (registry, rest).
fn split_registry(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

/// `[\w][\w.-]{0,127}`
fn is_valid_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= TAG_LENGTH_MAX
        && word(bytes[0])
        && bytes[1..]
            .iter()
            .all(|&b| word(b) || b == b'.' || b == b'-')
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn is_valid_path_component(component: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = component.as_bytes();
    let mut i = 0;
    loop {
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        let separator_start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        debug_assert!(i > separator_start);
    }
}

/// docker's domain grammar: `host[:port]` where host is DNS labels or a bracketed IPv6 address.
fn is_valid_domain(domain: &str) -> bool {
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        let Some((ipv6, after)) = rest.split_once(']') else {
            return false;
        };
        if ipv6.is_empty() || !ipv6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return false;
        }
        match after {
            "" => return true,
            _ => match after.strip_prefix(':') {
                Some(port) => ("[ok]", Some(port)),
                None => return false,
            },
        }
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (domain, None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    if host == "[ok]" {
        return true;
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! d256 {
        () => {
            "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"
        };
    }
    const D256: &str = d256!();

    fn d512() -> String {
        format!("sha512:{}", "f".repeat(128))
    }

    /// (input, Some((registry, repository, tag, digest present))) or None for an error.
    #[test]
    fn parse_table() {
        let d512 = d512();
        let xn_input = format!("xn--7o8h.com/myimage:xn--7o8h.com@{d512}");
        let long_tag = format!("repo:{}", "a".repeat(128));
        let too_long_tag = format!("repo:{}", "a".repeat(129));
        let too_long_name = "a/".repeat(128);
        type Expected<'a> = Option<(&'a str, &'a str, Option<&'a str>, bool)>;
        let cases: Vec<(&str, Expected)> = vec![
            (
                "alpine",
                Some(("docker.io", "library/alpine", Some("latest"), false)),
            ),
            (
                "alpine:3.20",
                Some(("docker.io", "library/alpine", Some("3.20"), false)),
            ),
            (
                "test_com",
                Some(("docker.io", "library/test_com", Some("latest"), false)),
            ),
            (
                "test.com:tag",
                Some(("docker.io", "library/test.com", Some("tag"), false)),
            ),
            (
                "test.com:5000",
                Some(("docker.io", "library/test.com", Some("5000"), false)),
            ),
            (
                "test.com/repo:tag",
                Some(("test.com", "repo", Some("tag"), false)),
            ),
            (
                "test:5000/repo",
                Some(("test:5000", "repo", Some("latest"), false)),
            ),
            (
                "test:5000/repo:tag",
                Some(("test:5000", "repo", Some("tag"), false)),
            ),
            (
                concat!("test:5000/repo@", d256!()),
                Some(("test:5000", "repo", None, true)),
            ),
            (
                concat!("test:5000/repo:tag@", d256!()),
                Some(("test:5000", "repo", Some("tag"), true)),
            ),
            (
                "test:5000/repo",
                Some(("test:5000", "repo", Some("latest"), false)),
            ),
            ("", None),
            (":justtag", None),
            (concat!("@", d256!()), None),
            (
                "repo@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                None,
            ),
            (
                "validname@invaliddigest:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                None,
            ),
            ("Uppercase:tag", None),
            ("test:5000/Uppercase/lowercase:tag", None),
            (
                "lowercase:Uppercase",
                Some(("docker.io", "library/lowercase", Some("Uppercase"), false)),
            ),
            (&too_long_name[..], None),
            ("aa/asdf$$^/aa", None),
            (
                "sub-dom1.foo.com/bar/baz/quux",
                Some(("sub-dom1.foo.com", "bar/baz/quux", Some("latest"), false)),
            ),
            (
                "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
                Some((
                    "sub-dom1.foo.com",
                    "bar/baz/quux",
                    Some("some-long-tag"),
                    false,
                )),
            ),
            (
                "b.gcr.io/test.example.com/my-app:test.example.com",
                Some((
                    "b.gcr.io",
                    "test.example.com/my-app",
                    Some("test.example.com"),
                    false,
                )),
            ),
            (
                "xn--n3h.com/myimage:xn--n3h.com",
                Some(("xn--n3h.com", "myimage", Some("xn--n3h.com"), false)),
            ),
            (
                &xn_input[..],
                Some(("xn--7o8h.com", "myimage", Some("xn--7o8h.com"), true)),
            ),
            (
                "foo_bar.com:8080",
                Some(("docker.io", "library/foo_bar.com", Some("8080"), false)),
            ),
            (
                "foo/foo_bar.com:8080",
                Some(("docker.io", "foo/foo_bar.com", Some("8080"), false)),
            ),
            (
                "192.168.1.1/repo",
                Some(("192.168.1.1", "repo", Some("latest"), false)),
            ),
            (
                "192.168.1.1:5000/repo",
                Some(("192.168.1.1:5000", "repo", Some("latest"), false)),
            ),
            (
                "[2001:db8::1]/repo",
                Some(("[2001:db8::1]", "repo", Some("latest"), false)),
            ),
            (
                "[2001:db8::1]:5000/repo:tag",
                Some(("[2001:db8::1]:5000", "repo", Some("tag"), false)),
            ),
            (
                "[::1]:5000/a/b",
                Some(("[::1]:5000", "a/b", Some("latest"), false)),
            ),
            ("[fe80::1%eth0]:5000/repo", None),
            (
                "docker.io/library/ubuntu",
                Some(("docker.io", "library/ubuntu", Some("latest"), false)),
            ),
            (
                "index.docker.io/library/ubuntu",
                Some(("docker.io", "library/ubuntu", Some("latest"), false)),
            ),
            (
                "docker.io/ubuntu",
                Some(("docker.io", "library/ubuntu", Some("latest"), false)),
            ),
            (
                "index.docker.io/ubuntu:22.04",
                Some(("docker.io", "library/ubuntu", Some("22.04"), false)),
            ),
            (
                "localhost/ubuntu",
                Some(("localhost", "ubuntu", Some("latest"), false)),
            ),
            (
                "localhost:5000/ubuntu",
                Some(("localhost:5000", "ubuntu", Some("latest"), false)),
            ),
            (
                "localhost:5000",
                Some(("docker.io", "library/localhost", Some("5000"), false)),
            ),
            (
                "localhost",
                Some(("docker.io", "library/localhost", Some("latest"), false)),
            ),
            (
                "127.0.0.1:5000/a/b:tag",
                Some(("127.0.0.1:5000", "a/b", Some("tag"), false)),
            ),
            (
                "foo/bar",
                Some(("docker.io", "foo/bar", Some("latest"), false)),
            ),
            (
                "registry.io/foo/bar:tag",
                Some(("registry.io", "foo/bar", Some("tag"), false)),
            ),
            ("Foo/bar", Some(("Foo", "bar", Some("latest"), false))),
            (
                "dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
                None,
            ),
            (
                "docker.io/library/dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
                Some((
                    "docker.io",
                    "library/dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
                    Some("latest"),
                    false,
                )),
            ),
            (
                concat!("ubuntu@", d256!()),
                Some(("docker.io", "library/ubuntu", None, true)),
            ),
            (
                concat!("ubuntu:latest@", d256!()),
                Some(("docker.io", "library/ubuntu", Some("latest"), true)),
            ),
            ("-foo", None),
            ("foo-", None),
            (
                "foo--bar",
                Some(("docker.io", "library/foo--bar", Some("latest"), false)),
            ),
            (
                "foo__bar",
                Some(("docker.io", "library/foo__bar", Some("latest"), false)),
            ),
            ("foo___bar", None),
            ("foo..bar", None),
            ("foo/", None),
            ("/foo", None),
            ("foo//bar", None),
            ("repo:tag:extra", None),
            ("repo:", None),
            ("repo:-tag", None),
            ("repo:.tag", None),
            (
                "repo:_tag",
                Some(("docker.io", "library/repo", Some("_tag"), false)),
            ),
            (
                &long_tag[..],
                Some(("docker.io", "library/repo", Some(&long_tag[5..]), false)),
            ),
            (&too_long_tag[..], None),
            ("repo@", None),
            ("-host.com/repo", None),
            ("host.com:/repo", None),
            ("host.com:abc/repo", None),
            ("a.b/c d", None),
        ];
        assert!(cases.len() >= 30);
        for (input, expected) in cases {
            let got = Reference::parse(input);
            match (got, expected) {
                (Ok(r), Some((registry, repository, tag, has_digest))) => {
                    assert_eq!(r.registry(), registry, "{input}");
                    assert_eq!(r.repository(), repository, "{input}");
                    assert_eq!(r.tag(), tag, "{input}");
                    assert_eq!(r.digest().is_some(), has_digest, "{input}");
                }
                (Err(e), None) => {
                    let shown: String = input.chars().take(300).collect();
                    assert!(
                        e.to_string().contains(&format!("{shown:?}")),
                        "{input}: {e}"
                    );
                }
                (got, expected) => panic!("{input}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn display_is_normalised() {
        let cases = [
            ("alpine", "docker.io/library/alpine:latest"),
            ("index.docker.io/foo/bar:1", "docker.io/foo/bar:1"),
            (
                concat!("localhost:5000/a/b:tag@", d256!()),
                concat!("localhost:5000/a/b:tag@", d256!()),
            ),
            (
                concat!("alpine@", d256!()),
                concat!("docker.io/library/alpine@", d256!()),
            ),
        ];
        for (input, display) in cases {
            let r = Reference::parse(input).unwrap();
            assert_eq!(r.to_string(), display);
            assert_eq!(
                Reference::parse(&r.to_string()).unwrap(),
                r,
                "roundtrip {input}"
            );
        }
    }

    #[test]
    fn api_host_and_manifest_reference() {
        let hub = Reference::parse("alpine").unwrap();
        assert_eq!(hub.api_host(), "registry-1.docker.io");
        assert_eq!(hub.manifest_reference(), "latest");
        let local: Reference = format!("localhost:5000/a:t@{D256}").parse().unwrap();
        assert_eq!(local.api_host(), "localhost:5000");
        assert_eq!(local.manifest_reference(), D256);
        let pinned = hub.with_digest(D256.parse().unwrap());
        assert_eq!(pinned.tag(), Some("latest"));
        assert_eq!(pinned.manifest_reference(), D256);
        let retagged = pinned.with_tag("v2").unwrap();
        assert_eq!(retagged.to_string(), "docker.io/library/alpine:v2");
        assert!(hub.with_tag("bad tag").is_err());
        assert_eq!(hub.name(), "docker.io/library/alpine");
    }
}
