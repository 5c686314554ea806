//! The image builders live in `rpull-image` (re-exported by this crate); these tests check them
//! with `LayerBuilder` fixtures.

#[cfg(test)]
mod tests {
    use rpull_image::{
        Compression, ImageBuilder, ManifestFormat, media_type, sha256_digest, sha256_file,
    };
    use serde_json::Value;

    use crate::LayerBuilder;

    #[test]
    fn manifest_config_and_diff_ids_agree() {
        let tar = LayerBuilder::new().file("a", "1", 0o644).build();
        for format in [ManifestFormat::Oci, ManifestFormat::Docker] {
            let image = ImageBuilder::new()
                .format(format)
                .layer_tar(&tar, Compression::Gzip)
                .layer(LayerBuilder::new().file("b", "2", 0o644), Compression::Zstd)
                .build();
            let manifest: Value = serde_json::from_slice(&image.manifest.bytes).unwrap();
            assert_eq!(manifest["mediaType"], format.manifest_media_type());
            assert_eq!(manifest["config"]["digest"], image.config.digest.as_str());
            assert_eq!(manifest["config"]["mediaType"], format.config_media_type());
            assert_eq!(
                manifest["layers"][0]["mediaType"],
                format.layer_media_type(Compression::Gzip)
            );
            assert_eq!(
                manifest["layers"][1]["mediaType"],
                media_type::OCI_LAYER_ZSTD
            );
            let config: Value = serde_json::from_slice(&image.config.bytes).unwrap();
            assert_eq!(
                config["rootfs"]["diff_ids"][0],
                sha256_digest(&tar).as_str()
            );
            assert_eq!(config["os"], "linux");
            for layer in &image.layers {
                assert_eq!(sha256_digest(&layer.bytes().unwrap()), layer.digest);
            }
        }
    }

    #[test]
    fn oci_layout_lists_tags() {
        let dir = tempfile::tempdir().unwrap();
        let a = ImageBuilder::new()
            .layer(LayerBuilder::new().file("a", "1", 0o644), Compression::Gzip)
            .build();
        let b = ImageBuilder::new()
            .layer(LayerBuilder::new().file("b", "2", 0o644), Compression::None)
            .build();
        a.write_oci_layout(dir.path(), "a").unwrap();
        b.write_oci_layout(dir.path(), "b").unwrap();
        a.write_oci_layout(dir.path(), "a").unwrap();
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
        let refs: Vec<_> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["annotations"]["org.opencontainers.image.ref.name"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(refs, ["b", "a"]);
        for digest in [&a.manifest.digest, &a.config.digest, &a.layers[0].digest] {
            let path = dir
                .path()
                .join("blobs/sha256")
                .join(digest.strip_prefix("sha256:").unwrap());
            assert_eq!(&sha256_file(&path).unwrap(), digest);
        }
    }
}
