//! umoci, the reference unpacker the differential tests compare rpull against.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

/// The `umoci` binary on `PATH`, if installed.
pub fn umoci_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("umoci"))
        .find(|candidate| candidate.is_file())
}

/// `umoci unpack --image LAYOUT:TAG BUNDLE` (with `--rootless` when not root). Returns the
/// bundle's `rootfs`, or `None` when umoci is not installed: the caller prints a skip line, e.g.
/// `eprintln!("skipped: umoci not installed (apt-get install -y umoci)")`.
/// `bundle` must not exist yet (umoci creates it). Debian's umoci 0.4.7 refuses zstd layers
/// ("blob is not correct mediatype"): build umoci fixtures with gzip or no compression.
pub fn umoci_unpack(layout: &Path, tag: &str, bundle: &Path) -> Result<Option<PathBuf>> {
    let Some(umoci) = umoci_binary() else {
        return Ok(None);
    };
    let mut command = Command::new(&umoci);
    command.arg("--log=error").arg("unpack");
    if !rustix::process::geteuid().is_root() {
        command.arg("--rootless");
    }
    let image = format!("{}:{tag}", layout.display());
    let output = command.arg("--image").arg(&image).arg(bundle).output()?;
    if !output.status.success() {
        bail!(
            "{} unpack --image {image} {} failed with {}: {}",
            umoci.display(),
            bundle.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(Some(bundle.join("rootfs")))
}
