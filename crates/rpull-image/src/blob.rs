use std::path::Path;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::ImageError;

/// A blob with its digest (`sha256:<hex>`) and media type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub bytes: Bytes,
    pub digest: String,
    pub media_type: String,
}

impl Blob {
    pub fn new(bytes: impl Into<Bytes>, media_type: impl Into<String>) -> Blob {
        let bytes = bytes.into();
        Blob {
            digest: sha256_digest(&bytes),
            bytes,
            media_type: media_type.into(),
        }
    }

    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The OCI descriptor `{mediaType, digest, size}`.
    pub fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({ "mediaType": self.media_type, "digest": self.digest, "size": self.size() })
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha256:<hex>` of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let mut file = fs_err::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}
