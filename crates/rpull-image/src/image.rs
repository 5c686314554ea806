//! `ImageBuilder` / `IndexBuilder`: images assembled from layers into a config, a manifest (OCI or
//! Docker schema 2) and optionally an index / manifest list, written as an OCI layout or pushed.

use std::path::Path;

use serde_json::{Value, json};

use crate::layout::OciLayout;
use crate::{Blob, Compression, ImageError, ImageLayer, LayerData};

/// Media types used by the builders.
pub mod media_type {
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_MANIFEST_LIST: &str =
        "application/vnd.docker.distribution.manifest.list.v2+json";
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
}

/// Which family of media types the manifest, config, layers and index use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ManifestFormat {
    #[default]
    Oci,
    /// Docker image manifest v2 schema 2 and manifest list. (zstd layers keep the OCI type,
    /// as docker itself does.)
    Docker,
}

impl ManifestFormat {
    pub fn manifest_media_type(self) -> &'static str {
        match self {
            ManifestFormat::Oci => media_type::OCI_MANIFEST,
            ManifestFormat::Docker => media_type::DOCKER_MANIFEST,
        }
    }

    pub fn index_media_type(self) -> &'static str {
        match self {
            ManifestFormat::Oci => media_type::OCI_INDEX,
            ManifestFormat::Docker => media_type::DOCKER_MANIFEST_LIST,
        }
    }

    pub fn config_media_type(self) -> &'static str {
        match self {
            ManifestFormat::Oci => media_type::OCI_CONFIG,
            ManifestFormat::Docker => media_type::DOCKER_CONFIG,
        }
    }

    pub fn layer_media_type(self, compression: Compression) -> &'static str {
        match (self, compression) {
            (ManifestFormat::Oci, Compression::None) => media_type::OCI_LAYER_TAR,
            (ManifestFormat::Oci, Compression::Gzip) => media_type::OCI_LAYER_GZIP,
            (_, Compression::Zstd) => media_type::OCI_LAYER_ZSTD,
            (ManifestFormat::Docker, Compression::None) => media_type::DOCKER_LAYER_TAR,
            (ManifestFormat::Docker, Compression::Gzip) => media_type::DOCKER_LAYER_GZIP,
        }
    }
}

/// `os/architecture[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    pub fn new(os: &str, architecture: &str, variant: Option<&str>) -> Self {
        Platform {
            os: os.to_owned(),
            architecture: architecture.to_owned(),
            variant: variant.map(str::to_owned),
        }
    }

    pub fn linux_amd64() -> Self {
        Self::new("linux", "amd64", None)
    }

    pub fn linux_arm64() -> Self {
        Self::new("linux", "arm64", Some("v8"))
    }

    /// The platform of the machine running the test (what a pull selects by default).
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Self::new("linux", architecture, None)
    }

    fn to_json(&self) -> Value {
        let mut value = json!({ "os": self.os, "architecture": self.architecture });
        if let Some(variant) = &self.variant {
            value["variant"] = json!(variant);
        }
        value
    }
}

/// An uncompressed layer tar built elsewhere (e.g. a fixture builder), for
/// [`ImageBuilder::layer`].
pub trait IntoLayerTar {
    fn into_layer_tar(self) -> Vec<u8>;
}

impl IntoLayerTar for Vec<u8> {
    fn into_layer_tar(self) -> Vec<u8> {
        self
    }
}

/// Builds one image (config + manifest) from layers.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    format: ManifestFormat,
    platform: Platform,
    layers: Vec<ImageLayer>,
    env: Vec<String>,
    cmd: Option<Vec<String>>,
    labels: serde_json::Map<String, Value>,
    config_overrides: serde_json::Map<String, Value>,
}

impl Default for ImageBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ImageBuilder {
    /// An OCI image for the host platform with no layers.
    pub fn new() -> Self {
        ImageBuilder {
            format: ManifestFormat::Oci,
            platform: Platform::host(),
            layers: Vec::new(),
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            ],
            cmd: None,
            labels: serde_json::Map::new(),
            config_overrides: serde_json::Map::new(),
        }
    }

    pub fn format(mut self, format: ManifestFormat) -> Self {
        self.format = format;
        self
    }

    pub fn platform(mut self, platform: Platform) -> Self {
        self.platform = platform;
        self
    }

    pub fn layer(self, layer: impl IntoLayerTar, compression: Compression) -> Self {
        self.layer_tar(&layer.into_layer_tar(), compression)
    }

    pub fn layer_tar(mut self, tar: &[u8], compression: Compression) -> Self {
        self.layers.push(ImageLayer::from_tar(tar, compression));
        self
    }

    /// A layer prepared elsewhere: `layer_from_dir`, or a hand-made `ImageLayer` with a wrong
    /// `diff_id` or media type for negative tests (a non-empty `media_type` is kept as is).
    pub fn image_layer(mut self, layer: ImageLayer) -> Self {
        self.layers.push(layer);
        self
    }

    pub fn env(mut self, entry: &str) -> Self {
        self.env.push(entry.to_owned());
        self
    }

    pub fn cmd(mut self, cmd: &[&str]) -> Self {
        self.cmd = Some(cmd.iter().map(|s| (*s).to_owned()).collect());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), json!(value));
        self
    }

    /// Overrides a top-level key of the config JSON (after everything else is filled in).
    pub fn config_value(mut self, key: &str, value: Value) -> Self {
        self.config_overrides.insert(key.to_owned(), value);
        self
    }

    pub fn build(self) -> Image {
        let format = self.format;
        let layers: Vec<ImageLayer> = self
            .layers
            .into_iter()
            .map(|mut layer| {
                if layer.media_type.is_empty() {
                    layer.media_type = format.layer_media_type(layer.compression).to_owned();
                }
                layer
            })
            .collect();

        let mut container_config = json!({ "Env": self.env });
        if let Some(cmd) = self.cmd {
            container_config["Cmd"] = json!(cmd);
        }
        if !self.labels.is_empty() {
            container_config["Labels"] = Value::Object(self.labels);
        }
        let created = "2023-11-14T22:13:20Z";
        let mut config = self.platform.to_json();
        config["created"] = json!(created);
        config["config"] = container_config;
        config["rootfs"] = json!({
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        });
        config["history"] = Value::Array(
            (0..layers.len())
                .map(|i| json!({ "created": created, "created_by": format!("rpull-image layer {i}") }))
                .collect(),
        );
        for (key, value) in self.config_overrides {
            config[key] = value;
        }
        let config = Blob::new(to_json_bytes(&config), format.config_media_type());

        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": format.manifest_media_type(),
            "config": config.descriptor(),
            "layers": layers.iter().map(ImageLayer::descriptor).collect::<Vec<_>>(),
        });
        let manifest = Blob::new(to_json_bytes(&manifest), format.manifest_media_type());
        Image {
            format,
            platform: self.platform,
            config,
            layers,
            manifest,
        }
    }
}

pub(crate) fn to_json_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("serializing JSON")
}

/// A built image: every blob with its digest.
#[derive(Debug, Clone)]
pub struct Image {
    pub format: ManifestFormat,
    pub platform: Platform,
    pub config: Blob,
    pub layers: Vec<ImageLayer>,
    pub manifest: Blob,
}

impl Image {
    pub fn diff_ids(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|layer| layer.diff_id.clone())
            .collect()
    }

    /// The manifest descriptor as an index lists it (with platform).
    pub fn index_descriptor(&self) -> Value {
        let mut descriptor = self.manifest.descriptor();
        descriptor["platform"] = self.platform.to_json();
        descriptor
    }

    /// Writes an OCI image layout (`oci-layout`, `index.json` with the
    /// `org.opencontainers.image.ref.name` annotation, `blobs/sha256/...`), e.g. for
    /// `umoci unpack --image DIR:TAG`. Adds to an existing layout.
    pub fn write_oci_layout(&self, dir: &Path, tag: &str) -> Result<(), ImageError> {
        let layout = OciLayout::open(dir)?;
        self.write_blobs(&layout)?;
        layout.add_ref(self.manifest.descriptor(), tag)
    }

    fn write_blobs(&self, layout: &OciLayout) -> Result<(), ImageError> {
        for layer in &self.layers {
            let target = layout.blob_path(&layer.digest);
            match &layer.data {
                LayerData::Memory(bytes) => fs_err::write(&target, bytes)?,
                LayerData::File(path) => {
                    fs_err::copy(path, &target)?;
                }
            }
        }
        fs_err::write(layout.blob_path(&self.config.digest), &self.config.bytes)?;
        fs_err::write(
            layout.blob_path(&self.manifest.digest),
            &self.manifest.bytes,
        )?;
        Ok(())
    }
}

/// Builds an OCI image index or Docker manifest list over several images.
#[derive(Debug, Clone, Default)]
pub struct IndexBuilder {
    format: ManifestFormat,
    images: Vec<Image>,
}

impl IndexBuilder {
    pub fn new(format: ManifestFormat) -> Self {
        IndexBuilder {
            format,
            images: Vec::new(),
        }
    }

    /// Adds an image; its platform goes into the index entry.
    pub fn image(mut self, image: Image) -> Self {
        self.images.push(image);
        self
    }

    pub fn build(self) -> ImageIndex {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": self.format.index_media_type(),
            "manifests": self.images.iter().map(Image::index_descriptor).collect::<Vec<_>>(),
        });
        let index = Blob::new(to_json_bytes(&index), self.format.index_media_type());
        ImageIndex {
            format: self.format,
            images: self.images,
            index,
        }
    }
}

/// A built index and its images.
#[derive(Debug, Clone)]
pub struct ImageIndex {
    pub format: ManifestFormat,
    pub images: Vec<Image>,
    pub index: Blob,
}

impl ImageIndex {
    /// The image for `platform`, if the index has one.
    pub fn image_for(&self, platform: &Platform) -> Option<&Image> {
        self.images.iter().find(|image| &image.platform == platform)
    }

    /// Writes an OCI layout whose `index.json` points at this index blob under `tag`.
    pub fn write_oci_layout(&self, dir: &Path, tag: &str) -> Result<(), ImageError> {
        let layout = OciLayout::open(dir)?;
        for image in &self.images {
            image.write_blobs(&layout)?;
        }
        fs_err::write(layout.blob_path(&self.index.digest), &self.index.bytes)?;
        layout.add_ref(self.index.descriptor(), tag)
    }
}
