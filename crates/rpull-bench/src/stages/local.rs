//! The inputs of the decompress and extract stages: every layer blob downloaded once (verified)
//! and every layer decoded once to a tar file, outside any timing. They are meant to live on
//! tmpfs so that reading them costs no I/O during the measured runs.

use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};

use futures_util::StreamExt as _;
use rpull::Digest;
use rpull::registry::DigestVerifier;
use rpull_decompress::Codec;

use super::BenchImage;
use crate::error::BenchError;

/// Read buffer for blobs, and for walking a tar's headers (`count_entries`); the extract stage
/// reads its tars through [`rpull_extract::TAR_READ_BUFFER`], from which the extractor writes
/// big files' data, as a pull writes it from its decoded buffers.
pub(crate) const READ_BUFFER: usize = 1 << 20;

/// One layer held locally.
#[derive(Debug, Clone)]
pub struct LocalLayer {
    /// Position in the manifest.
    pub index: usize,
    /// The blob's digest.
    pub digest: Digest,
    /// The codec the media type declares.
    pub declared: Codec,
    /// The codec the bytes really use (magic bytes).
    pub codec: Codec,
    /// The verified blob.
    pub blob: PathBuf,
    /// The decoded layer tar.
    pub tar: PathBuf,
    /// Blob size.
    pub compressed_bytes: u64,
    /// Tar size.
    pub tar_bytes: u64,
    /// Tar entries (headers, including whiteouts, not counting PAX/GNU extension headers).
    pub entries: u64,
}

/// Every layer of an image held locally.
#[derive(Debug, Clone)]
pub struct LocalLayers {
    /// The directory holding `blobs/` and `tars/`.
    pub dir: PathBuf,
    /// The layers, in manifest order.
    pub layers: Vec<LocalLayer>,
}

impl LocalLayers {
    /// Sum of the blob sizes.
    pub fn compressed_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.compressed_bytes).sum()
    }

    /// Sum of the tar sizes.
    pub fn tar_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.tar_bytes).sum()
    }

    /// Tar entries over all layers.
    pub fn entries(&self) -> u64 {
        self.layers.iter().map(|l| l.entries).sum()
    }

    /// `gzip x3, zstd x1`: the codecs, as the bytes show them.
    pub fn codec_summary(&self) -> String {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for layer in &self.layers {
            match counts
                .iter_mut()
                .find(|(name, _)| *name == layer.codec.name())
            {
                Some((_, n)) => *n += 1,
                None => counts.push((layer.codec.name(), 1)),
            }
        }
        counts
            .iter()
            .map(|(name, n)| format!("{name} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Downloads every layer of `image` into `dir/blobs` (verified) and decodes each into
/// `dir/tars`, counting the tar entries. Nothing here is timed.
pub async fn prepare_local(image: &BenchImage, dir: &Path) -> Result<LocalLayers, BenchError> {
    let blobs_dir = dir.join("blobs");
    let tars_dir = dir.join("tars");
    for path in [&blobs_dir, &tars_dir] {
        fs_err::create_dir_all(path).map_err(|e| BenchError::io("creating", path, e))?;
    }
    let mut layers = Vec::new();
    for (index, descriptor) in image.resolved.layers.iter().enumerate() {
        let (declared, _) = Codec::from_media_type(&descriptor.media_type).unwrap_or((
            Codec::Identity,
            rpull_decompress::MediaTypeKind::Distributable,
        ));
        let blob = blobs_dir.join(format!("{index}-{}", descriptor.digest.hex()));
        download(image, descriptor, &blob).await?;
        let tar = tars_dir.join(format!("{index}.tar"));
        let layer = LocalLayer {
            index,
            digest: descriptor.digest.clone(),
            declared,
            codec: declared,
            blob,
            tar,
            compressed_bytes: descriptor.size,
            tar_bytes: 0,
            entries: 0,
        };
        let layer = tokio::task::spawn_blocking(move || decode_to_file(layer))
            .await
            .map_err(|_| BenchError::Panic("decode"))??;
        layers.push(layer);
    }
    Ok(LocalLayers {
        dir: dir.to_owned(),
        layers,
    })
}

async fn download(
    image: &BenchImage,
    descriptor: &rpull::registry::Descriptor,
    path: &Path,
) -> Result<(), BenchError> {
    let fetch_error = |source| BenchError::Fetch {
        reference: image.reference.to_string(),
        digest: descriptor.digest.clone(),
        range: None,
        source: Box::new(source),
    };
    let mut stream = image
        .client
        .get_blob(&image.reference, &descriptor.digest)
        .await
        .map_err(fetch_error)?;
    let mut file = io::BufWriter::with_capacity(
        READ_BUFFER,
        fs_err::File::create(path).map_err(|e| BenchError::io("creating", path, e))?,
    );
    let mut verifier = DigestVerifier::new(&descriptor.digest, Some(descriptor.size));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(fetch_error)?;
        verifier.update(&chunk);
        // Local tmpfs writes: short enough not to matter on the runtime's thread.
        file.write_all(&chunk)
            .map_err(|e| BenchError::io("writing", path, e))?;
    }
    file.flush()
        .map_err(|e| BenchError::io("writing", path, e))?;
    verifier.finish().map_err(|source| BenchError::Verify {
        digest: descriptor.digest.clone(),
        source,
    })
}

fn decode_to_file(mut layer: LocalLayer) -> Result<LocalLayer, BenchError> {
    let decode_error = |source| BenchError::Decompress {
        index: layer.index,
        digest: layer.digest.clone(),
        path: layer.blob.clone(),
        source,
    };
    let input = BufReader::with_capacity(
        READ_BUFFER,
        fs_err::File::open(&layer.blob).map_err(|e| BenchError::io("opening", &layer.blob, e))?,
    );
    let mut decoder = rpull_decompress::decoder(layer.declared, input)
        .map_err(|e| decode_error(io::Error::other(e)))?;
    layer.codec = decoder.codec();
    let mut output = io::BufWriter::with_capacity(
        READ_BUFFER,
        fs_err::File::create(&layer.tar).map_err(|e| BenchError::io("creating", &layer.tar, e))?,
    );
    let written = io::copy(&mut decoder, &mut output).map_err(decode_error)?;
    output
        .flush()
        .map_err(|e| BenchError::io("writing", &layer.tar, e))?;
    layer.tar_bytes = written;
    layer.entries = count_entries(&layer.tar)?;
    Ok(layer)
}

/// Entries of a tar file as `tar` lists them.
fn count_entries(path: &Path) -> Result<u64, BenchError> {
    let file = fs_err::File::open(path).map_err(|e| BenchError::io("opening", path, e))?;
    let mut archive = tar::Archive::new(BufReader::with_capacity(READ_BUFFER, file));
    let mut entries = 0;
    for entry in archive
        .entries()
        .map_err(|e| BenchError::io("reading tar", path, e))?
    {
        // The iterator skips each entry's data by itself.
        entry.map_err(|e| BenchError::io("reading tar", path, e))?;
        entries += 1;
    }
    Ok(entries)
}
