use crate::DecompressError;

/// How a layer's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// A plain tar stream.
    Identity,
    /// gzip (RFC 1952), possibly several members.
    Gzip,
    /// zstd (RFC 8878), possibly several frames.
    Zstd,
}

/// Whether a layer media type says the layer may be fetched from the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaTypeKind {
    /// An ordinary layer.
    Distributable,
    /// A "non-distributable" / "foreign" layer (Windows base layers): fetched like any other
    /// layer when the registry has it.
    NonDistributable,
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Every layer media type rpull accepts, with its codec (OCI image-spec and Docker image
/// manifest v2 schema 2).
const LAYER_MEDIA_TYPES: &[(&str, Codec, MediaTypeKind)] = &[
    (
        "application/vnd.oci.image.layer.v1.tar",
        Codec::Identity,
        MediaTypeKind::Distributable,
    ),
    (
        "application/vnd.oci.image.layer.v1.tar+gzip",
        Codec::Gzip,
        MediaTypeKind::Distributable,
    ),
    (
        "application/vnd.oci.image.layer.v1.tar+zstd",
        Codec::Zstd,
        MediaTypeKind::Distributable,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        Codec::Identity,
        MediaTypeKind::NonDistributable,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        Codec::Gzip,
        MediaTypeKind::NonDistributable,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
        Codec::Zstd,
        MediaTypeKind::NonDistributable,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar",
        Codec::Identity,
        MediaTypeKind::Distributable,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        Codec::Gzip,
        MediaTypeKind::Distributable,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar.zstd",
        Codec::Zstd,
        MediaTypeKind::Distributable,
    ),
    (
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
        Codec::Gzip,
        MediaTypeKind::NonDistributable,
    ),
];

impl Codec {
    /// The codec a layer media type declares, or an error naming the media type.
    pub fn from_media_type(media_type: &str) -> Result<(Codec, MediaTypeKind), DecompressError> {
        // Parameters such as `; charset=...` are not part of the type.
        let essence = media_type.split(';').next().unwrap_or("").trim();
        LAYER_MEDIA_TYPES
            .iter()
            .find(|(known, _, _)| known.eq_ignore_ascii_case(essence))
            .map(|&(_, codec, kind)| (codec, kind))
            .ok_or_else(|| DecompressError::UnsupportedMediaType {
                media_type: media_type.to_owned(),
            })
    }

    /// The codec the first bytes of a stream show, if they show one. Anything that is neither
    /// gzip nor zstd is taken to be a plain tar by the caller.
    pub fn sniff(prefix: &[u8]) -> Option<Codec> {
        if prefix.starts_with(&ZSTD_MAGIC) {
            Some(Codec::Zstd)
        } else if prefix.starts_with(&GZIP_MAGIC) {
            Some(Codec::Gzip)
        } else {
            None
        }
    }

    /// Short lowercase name: `gzip`, `zstd`, `identity`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Identity => "identity",
            Codec::Gzip => "gzip",
            Codec::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_map_to_codecs() {
        let cases = [
            ("application/vnd.oci.image.layer.v1.tar", Codec::Identity),
            ("application/vnd.oci.image.layer.v1.tar+gzip", Codec::Gzip),
            ("application/vnd.oci.image.layer.v1.tar+zstd", Codec::Zstd),
            (
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                Codec::Gzip,
            ),
            (
                "application/vnd.docker.image.rootfs.diff.tar",
                Codec::Identity,
            ),
            (
                "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
                Codec::Gzip,
            ),
            (
                "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
                Codec::Zstd,
            ),
            (
                "Application/VND.OCI.image.layer.v1.tar+gzip; foo=bar",
                Codec::Gzip,
            ),
        ];
        for (media_type, want) in cases {
            assert_eq!(
                Codec::from_media_type(media_type).unwrap().0,
                want,
                "{media_type}"
            );
        }
    }

    #[test]
    fn unknown_media_type_is_named_in_the_error() {
        let err = Codec::from_media_type("application/vnd.example.layer+lz4").unwrap_err();
        assert!(
            err.to_string()
                .contains("application/vnd.example.layer+lz4"),
            "{err}"
        );
        assert!(Codec::from_media_type("application/vnd.oci.image.config.v1+json").is_err());
    }

    #[test]
    fn sniffing_magic_bytes() {
        assert_eq!(Codec::sniff(&[0x1f, 0x8b, 8, 0]), Some(Codec::Gzip));
        assert_eq!(
            Codec::sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]),
            Some(Codec::Zstd)
        );
        assert_eq!(Codec::sniff(b"etc/\0\0\0"), None);
        assert_eq!(Codec::sniff(&[0x1f]), None);
        assert_eq!(Codec::sniff(&[]), None);
    }
}
