//! Content digests (`sha256:<hex>`, `sha512:<hex>`), incremental hashing and stream verification.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Digest as _;

/// The hash algorithm of a [`Digest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DigestAlgorithm {
    /// SHA-256, 64 hex characters.
    Sha256,
    /// SHA-512, 128 hex characters.
    Sha512,
}

impl DigestAlgorithm {
    /// The name used in digest strings (`sha256`, `sha512`).
    pub fn name(self) -> &'static str {
        match self {
            DigestAlgorithm::Sha256 => "sha256",
            DigestAlgorithm::Sha512 => "sha512",
        }
    }

    /// Number of hex characters in an encoded digest of this algorithm.
    pub fn hex_len(self) -> usize {
        match self {
            DigestAlgorithm::Sha256 => 64,
            DigestAlgorithm::Sha512 => 128,
        }
    }
}

impl fmt::Display for DigestAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated content digest such as `sha256:e3b0c442...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    algorithm: DigestAlgorithm,
    /// The full `algorithm:hex` string, kept so `as_str` is free.
    full: String,
}

/// A string that is not a supported, well-formed digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid digest {input:?}: {reason}")]
pub struct DigestError {
    /// The rejected input (truncated to 200 characters).
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex>` or `sha512:<128 lowercase hex>`.
    pub fn parse(input: &str) -> Result<Digest, DigestError> {
        let error = |reason| DigestError {
            input: input.chars().take(200).collect(),
            reason,
        };
        let (algorithm, hex) = input
            .split_once(':')
            .ok_or_else(|| error("expected <algorithm>:<hex>"))?;
        let algorithm = match algorithm {
            "sha256" => DigestAlgorithm::Sha256,
            "sha512" => DigestAlgorithm::Sha512,
            _ => return Err(error("unsupported algorithm (expected sha256 or sha512)")),
        };
        if hex.len() != algorithm.hex_len() {
            return Err(error("wrong length of the hex part for the algorithm"));
        }
        if !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(error("the hex part must be lowercase hexadecimal"));
        }
        Ok(Digest {
            algorithm,
            full: input.to_owned(),
        })
    }

    /// The SHA-256 digest of `data`.
    pub fn sha256_of(data: &[u8]) -> Digest {
        let mut hasher = Hasher::new(DigestAlgorithm::Sha256);
        hasher.update(data);
        hasher.finish()
    }

    /// The hash algorithm.
    pub fn algorithm(&self) -> DigestAlgorithm {
        self.algorithm
    }

    /// The lowercase hex part, without `algorithm:`.
    pub fn hex(&self) -> &str {
        &self.full[self.algorithm.name().len() + 1..]
    }

    /// The full `algorithm:hex` form.
    pub fn as_str(&self) -> &str {
        &self.full
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Digest::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.full)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Computes a [`Digest`] incrementally.
#[derive(Clone)]
pub struct Hasher {
    state: HasherState,
}

#[derive(Clone)]
enum HasherState {
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hasher")
            .field("algorithm", &self.algorithm())
            .finish()
    }
}

impl Hasher {
    /// A fresh hasher for `algorithm`.
    pub fn new(algorithm: DigestAlgorithm) -> Hasher {
        let state = match algorithm {
            DigestAlgorithm::Sha256 => HasherState::Sha256(sha2::Sha256::new()),
            DigestAlgorithm::Sha512 => HasherState::Sha512(sha2::Sha512::new()),
        };
        Hasher { state }
    }

    /// The algorithm this hasher computes.
    pub fn algorithm(&self) -> DigestAlgorithm {
        match self.state {
            HasherState::Sha256(_) => DigestAlgorithm::Sha256,
            HasherState::Sha512(_) => DigestAlgorithm::Sha512,
        }
    }

    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            HasherState::Sha256(h) => h.update(data),
            HasherState::Sha512(h) => h.update(data),
        }
    }

    /// The digest of everything fed so far.
    pub fn finish(self) -> Digest {
        let (algorithm, hex) = match self.state {
            HasherState::Sha256(h) => (DigestAlgorithm::Sha256, hex::encode(h.finalize())),
            HasherState::Sha512(h) => (DigestAlgorithm::Sha512, hex::encode(h.finalize())),
        };
        Digest {
            algorithm,
            full: format!("{}:{hex}", algorithm.name()),
        }
    }
}

/// Content that did not match its descriptor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The byte count differs from the expected size.
    #[error("size mismatch: expected {expected} bytes, got {actual} bytes")]
    SizeMismatch {
        /// Size from the descriptor.
        expected: u64,
        /// Bytes actually received.
        actual: u64,
    },
    /// The content hashes to another digest.
    #[error("digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Digest from the descriptor.
        expected: Digest,
        /// Digest of the bytes actually received.
        actual: Digest,
    },
}

/// Checks digest and size of bytes as they pass; the verdict comes at [`DigestVerifier::finish`].
#[derive(Debug, Clone)]
pub struct DigestVerifier {
    expected: Digest,
    expected_size: Option<u64>,
    hasher: Hasher,
    seen: u64,
}

impl DigestVerifier {
    /// Verifies against `expected`, and against `expected_size` when given.
    pub fn new(expected: &Digest, expected_size: Option<u64>) -> DigestVerifier {
        DigestVerifier {
            expected: expected.clone(),
            expected_size,
            hasher: Hasher::new(expected.algorithm()),
            seen: 0,
        }
    }

    /// Feeds the next bytes of the content.
    pub fn update(&mut self, data: &[u8]) {
        self.seen += data.len() as u64;
        self.hasher.update(data);
    }

    /// Bytes fed so far.
    pub fn bytes_seen(&self) -> u64 {
        self.seen
    }

    /// Whether more bytes were fed than the expected size (lets a caller stop early).
    pub fn overran(&self) -> bool {
        self.expected_size.is_some_and(|size| self.seen > size)
    }

    /// Checks the size first (cheaper to explain), then the digest.
    pub fn finish(self) -> Result<(), VerifyError> {
        if let Some(expected) = self.expected_size
            && expected != self.seen
        {
            return Err(VerifyError::SizeMismatch {
                expected,
                actual: self.seen,
            });
        }
        let actual = self.hasher.finish();
        if actual != self.expected {
            return Err(VerifyError::DigestMismatch {
                expected: self.expected,
                actual,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA256: &str =
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parse_table() {
        let sha512_empty = "sha512:cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e";
        let cases: &[(&str, bool)] = &[
            (EMPTY_SHA256, true),
            (sha512_empty, true),
            (
                "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
                false,
            ),
            ("sha256:e3b0", false),
            (
                "sha384:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                false,
            ),
            (
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                false,
            ),
            (
                "sha256:g3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                false,
            ),
            ("sha256:", false),
            ("", false),
            (":abc", false),
        ];
        for (input, ok) in cases {
            assert_eq!(Digest::parse(input).is_ok(), *ok, "{input}");
        }
        let d = Digest::parse(sha512_empty).unwrap();
        assert_eq!(d.algorithm(), DigestAlgorithm::Sha512);
        assert_eq!(d.hex().len(), 128);
        assert_eq!(d.to_string(), sha512_empty);
    }

    #[test]
    fn error_names_input() {
        let err = Digest::parse("sha256:nothex").unwrap_err();
        assert!(err.to_string().contains("sha256:nothex"), "{err}");
    }

    #[test]
    fn sha256_of_empty() {
        assert_eq!(Digest::sha256_of(b"").as_str(), EMPTY_SHA256);
        let d = Digest::sha256_of(b"");
        assert_eq!(d.hex(), &EMPTY_SHA256[7..]);
    }

    #[test]
    fn serde_roundtrip() {
        let d: Digest = EMPTY_SHA256.parse().unwrap();
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{EMPTY_SHA256}\""));
        let back: Digest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
        assert!(serde_json::from_str::<Digest>("\"sha256:bad\"").is_err());
    }

    #[test]
    fn verifier_accepts_split_input() {
        let d = Digest::sha256_of(b"hello world");
        let mut v = DigestVerifier::new(&d, Some(11));
        v.update(b"hello ");
        v.update(b"world");
        assert_eq!(v.bytes_seen(), 11);
        v.finish().unwrap();
    }

    #[test]
    fn verifier_sha512() {
        let mut h = Hasher::new(DigestAlgorithm::Sha512);
        h.update(b"abc");
        let d = h.finish();
        let mut v = DigestVerifier::new(&d, None);
        v.update(b"abc");
        v.finish().unwrap();
    }

    #[test]
    fn verifier_size_mismatch() {
        let d = Digest::sha256_of(b"hello");
        let mut v = DigestVerifier::new(&d, Some(6));
        v.update(b"hello");
        let err = v.finish().unwrap_err();
        assert_eq!(
            err,
            VerifyError::SizeMismatch {
                expected: 6,
                actual: 5
            }
        );
        assert!(err.to_string().contains("expected 6"), "{err}");
        assert!(err.to_string().contains("got 5"), "{err}");
    }

    #[test]
    fn verifier_digest_mismatch() {
        let d = Digest::sha256_of(b"hello");
        let mut v = DigestVerifier::new(&d, Some(5));
        v.update(b"jello");
        assert!(!v.overran());
        let err = v.finish().unwrap_err();
        let text = err.to_string();
        assert!(text.contains(d.as_str()), "{text}");
        assert!(
            text.contains(Digest::sha256_of(b"jello").as_str()),
            "{text}"
        );
    }
}
