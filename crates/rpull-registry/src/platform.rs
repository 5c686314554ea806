//! Target platforms (`os/arch[/variant]`) and containerd-style matching.

use std::fmt;
use std::str::FromStr;

/// An OS / CPU architecture / variant triple, in Go's `GOOS`/`GOARCH` vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Platform {
    /// `linux`, `windows`, ...
    pub os: String,
    /// `amd64`, `arm64`, `arm`, `386`, ...
    pub architecture: String,
    /// `v8`, `v7`, ... when relevant.
    pub variant: Option<String>,
}

/// A string that is not `os/arch[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid platform {input:?}: expected os/arch[/variant], e.g. linux/amd64 or linux/arm64/v8"
)]
pub struct PlatformError {
    /// The rejected input.
    pub input: String,
}

impl Platform {
    /// A platform from its parts.
    pub fn new(os: &str, architecture: &str, variant: Option<&str>) -> Platform {
        Platform {
            os: os.to_owned(),
            architecture: architecture.to_owned(),
            variant: variant.map(str::to_owned),
        }
    }

    /// The platform this program runs on, mapped to Go's names (x86_64 -> amd64, aarch64 -> arm64/v8).
    pub fn host() -> Platform {
        let os = match std::env::consts::OS {
            "macos" => "darwin",
            other => other,
        };
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "x86" => ("386", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
            "powerpc64" => ("ppc64", None),
            "powerpc" => ("ppc", None),
            "s390x" => ("s390x", None),
            "riscv64" => ("riscv64", None),
            "mips64" if cfg!(target_endian = "little") => ("mips64le", None),
            "mips64" => ("mips64", None),
            "mips" if cfg!(target_endian = "little") => ("mipsle", None),
            "mips" => ("mips", None),
            "loongarch64" => ("loong64", None),
            "wasm32" => ("wasm", None),
            other => (other, None),
        };
        Platform::new(os, architecture, variant)
    }

    /// This platform normalised as containerd does (`x86_64` -> `amd64`, `arm64/v8` -> `arm64`,
    /// `arm` -> `arm/v7`, ...), so equal platforms compare equal.
    pub fn normalized(&self) -> Platform {
        let os = self.os.to_lowercase();
        let arch = self.architecture.to_lowercase();
        let variant = self
            .variant
            .as_deref()
            .map(str::to_lowercase)
            .filter(|v| !v.is_empty());
        let (architecture, variant) = match (arch.as_str(), variant.as_deref()) {
            ("i386", _) => ("386".to_owned(), None),
            ("x86_64" | "x86-64" | "amd64", Some("v1") | None) => ("amd64".to_owned(), None),
            ("x86_64" | "x86-64" | "amd64", Some(v)) => ("amd64".to_owned(), Some(v.to_owned())),
            ("aarch64" | "arm64", Some("8" | "v8") | None) => ("arm64".to_owned(), None),
            ("aarch64" | "arm64", Some(v)) => ("arm64".to_owned(), Some(v.to_owned())),
            ("armhf", _) => ("arm".to_owned(), Some("v7".to_owned())),
            ("armel", _) => ("arm".to_owned(), Some("v6".to_owned())),
            ("arm", None | Some("7")) => ("arm".to_owned(), Some("v7".to_owned())),
            ("arm", Some(v @ ("5" | "6" | "8"))) => ("arm".to_owned(), Some(format!("v{v}"))),
            (arch, variant) => (arch.to_owned(), variant.map(str::to_owned)),
        };
        Platform {
            os,
            architecture,
            variant,
        }
    }

    /// Whether `candidate` (e.g. an index entry) is this platform, with containerd's
    /// normalisation: `linux/arm64` matches `linux/arm64/v8`, `linux/arm` matches `linux/arm/v7`.
    pub fn matches(&self, candidate: &Platform) -> bool {
        self.normalized() == candidate.normalized()
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

impl FromStr for Platform {
    type Err = PlatformError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || PlatformError {
            input: s.to_owned(),
        };
        let parts: Vec<&str> = s.split('/').collect();
        let valid = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        };
        if !(2..=3).contains(&parts.len()) || !parts.iter().all(|p| valid(p)) {
            return Err(error());
        }
        Ok(Platform::new(parts[0], parts[1], parts.get(2).copied()))
    }
}

impl From<&oci_spec::image::Platform> for Platform {
    fn from(p: &oci_spec::image::Platform) -> Platform {
        Platform {
            os: p.os().to_string(),
            architecture: p.architecture().to_string(),
            variant: p.variant().clone().filter(|v| !v.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        let cases = [
            ("linux/amd64", Some(("linux", "amd64", None))),
            ("linux/arm64/v8", Some(("linux", "arm64", Some("v8")))),
            ("windows/amd64", Some(("windows", "amd64", None))),
            ("linux", None),
            ("linux/", None),
            ("/amd64", None),
            ("linux/arm/v7/extra", None),
            ("linux/amd 64", None),
            ("", None),
        ];
        for (input, expected) in cases {
            match (input.parse::<Platform>(), expected) {
                (Ok(p), Some((os, arch, variant))) => {
                    assert_eq!(p, Platform::new(os, arch, variant), "{input}");
                    assert_eq!(p.to_string(), input);
                }
                (Err(e), None) => assert!(e.to_string().contains(&format!("{input:?}")), "{e}"),
                (got, _) => panic!("{input}: {got:?}"),
            }
        }
    }

    #[test]
    fn matching_table() {
        // (wanted, candidate, matches)
        let cases = [
            ("linux/amd64", "linux/amd64", true),
            ("linux/amd64", "linux/arm64", false),
            ("linux/amd64", "windows/amd64", false),
            ("linux/arm64", "linux/arm64/v8", true),
            ("linux/arm64/v8", "linux/arm64", true),
            ("linux/arm64/v8", "linux/aarch64", true),
            ("linux/arm64", "linux/arm64/v9", false),
            ("linux/arm", "linux/arm/v7", true),
            ("linux/arm/v6", "linux/arm/v7", false),
            ("linux/arm/v7", "linux/armhf", true),
            ("linux/x86_64", "linux/amd64", true),
            ("linux/amd64", "linux/amd64/v3", false),
            ("linux/386", "linux/i386", true),
            ("Linux/AMD64", "linux/amd64", true),
        ];
        for (wanted, candidate, expected) in cases {
            let wanted: Platform = wanted.parse().unwrap();
            let candidate: Platform = candidate.parse().unwrap();
            assert_eq!(
                wanted.matches(&candidate),
                expected,
                "{wanted} vs {candidate}"
            );
        }
    }

    #[test]
    fn host_is_go_vocabulary() {
        let host = Platform::host();
        assert!(!host.os.is_empty());
        assert_ne!(host.architecture, "x86_64");
        assert_ne!(host.architecture, "aarch64");
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        assert_eq!(host, Platform::new("linux", "amd64", None));
        #[cfg(all(target_os = "linux", target_arch = "aarch64"))]
        assert_eq!(host, Platform::new("linux", "arm64", Some("v8")));
        assert!(host.matches(&host));
    }
}
