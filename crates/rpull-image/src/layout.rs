//! Writing OCI image layouts (`oci-layout`, `index.json`, `blobs/sha256/...`).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::ImageError;
use crate::image::{media_type, to_json_bytes};

pub(crate) struct OciLayout {
    dir: PathBuf,
}

impl OciLayout {
    pub(crate) fn open(dir: &Path) -> Result<OciLayout, ImageError> {
        fs_err::create_dir_all(dir.join("blobs/sha256"))?;
        fs_err::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        Ok(OciLayout {
            dir: dir.to_owned(),
        })
    }

    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.join("blobs/sha256").join(hex)
    }

    /// Adds `descriptor` to `index.json` under the tag, replacing an entry with the same tag.
    pub(crate) fn add_ref(&self, mut descriptor: Value, tag: &str) -> Result<(), ImageError> {
        let index_path = self.dir.join("index.json");
        let layout_error = |reason: String| ImageError::Layout {
            path: index_path.clone(),
            reason,
        };
        let mut index: Value = match fs_err::read(&index_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| layout_error(e.to_string()))?,
            Err(_) => {
                json!({ "schemaVersion": 2, "mediaType": media_type::OCI_INDEX, "manifests": [] })
            }
        };
        descriptor["annotations"] = json!({ "org.opencontainers.image.ref.name": tag });
        let manifests = index["manifests"]
            .as_array_mut()
            .ok_or_else(|| layout_error("index.json without manifests".to_owned()))?;
        manifests.retain(|m| m["annotations"]["org.opencontainers.image.ref.name"] != json!(tag));
        manifests.push(descriptor);
        fs_err::write(&index_path, to_json_bytes(&index))?;
        Ok(())
    }
}
