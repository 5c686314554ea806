//! Layer blobs: held in memory, or streamed to a compressed file with both digests computed on
//! the way ([`LayerWriter`], [`layer_from_dir`], [`layer_from_tar`]).

use std::collections::HashMap;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tar::{EntryType, Header};

use crate::compression::Encoder;
use crate::{Compression, ImageError, sha256_digest};

/// Where a layer's compressed bytes live.
#[derive(Debug, Clone)]
pub enum LayerData {
    Memory(Bytes),
    /// A file written by [`LayerWriter`] (too big to hold in memory).
    File(PathBuf),
}

/// A layer blob of an image.
#[derive(Debug, Clone)]
pub struct ImageLayer {
    /// Digest of the compressed blob.
    pub digest: String,
    /// Digest of the uncompressed tar (the config's `rootfs.diff_ids` entry).
    pub diff_id: String,
    pub size: u64,
    pub compression: Compression,
    /// Empty: filled in from the manifest format by `ImageBuilder::build`.
    pub media_type: String,
    pub data: LayerData,
}

impl ImageLayer {
    /// A layer from an uncompressed tar held in memory.
    pub fn from_tar(tar: &[u8], compression: Compression) -> Self {
        let compressed = Bytes::from(compression.compress(tar));
        ImageLayer {
            digest: sha256_digest(&compressed),
            diff_id: sha256_digest(tar),
            size: compressed.len() as u64,
            compression,
            media_type: String::new(),
            data: LayerData::Memory(compressed),
        }
    }

    pub fn descriptor(&self) -> Value {
        json!({ "mediaType": self.media_type, "digest": self.digest, "size": self.size })
    }

    /// The compressed bytes (reads the file for file-backed layers: only for small layers).
    pub fn bytes(&self) -> Result<Bytes, ImageError> {
        match &self.data {
            LayerData::Memory(bytes) => Ok(bytes.clone()),
            LayerData::File(path) => Ok(fs_err::read(path)?.into()),
        }
    }
}

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    fn digest(&self) -> String {
        format!("sha256:{}", hex::encode(self.hasher.clone().finalize()))
    }
}

type FileSink = HashingWriter<BufWriter<fs_err::File>>;
type TarSink = HashingWriter<Encoder<FileSink>>;

/// A layer written entry by entry into a compressed file: tar -> sha256 (diff_id) -> compressor
/// -> sha256 (digest) -> file. Memory stays bounded whatever the layer size.
pub struct LayerWriter {
    builder: tar::Builder<TarSink>,
    compression: Compression,
    out_file: PathBuf,
    /// First name of every multiply-linked file written, so later names become hardlinks.
    seen_inodes: HashMap<(u64, u64), PathBuf>,
    entries: u64,
}

/// Sizes of a finished layer besides the blob's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSizes {
    /// Bytes of the uncompressed tar.
    pub tar_bytes: u64,
    /// Tar entries written (not counting PAX headers).
    pub entries: u64,
}

impl std::fmt::Debug for LayerWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerWriter")
            .field("compression", &self.compression)
            .field("out_file", &self.out_file)
            .finish_non_exhaustive()
    }
}

impl LayerWriter {
    /// Creates (truncates) `out_file`; gzip and zstd at level 1.
    pub fn create(out_file: &Path, compression: Compression) -> Result<LayerWriter, ImageError> {
        Self::create_with_level(out_file, compression, None)
    }

    /// [`LayerWriter::create`] with a compression level (gzip 0-9, zstd 1-22). gzip level 0 writes
    /// stored blocks: what any gzip level ends up writing for incompressible data, much faster.
    pub fn create_with_level(
        out_file: &Path,
        compression: Compression,
        level: Option<u32>,
    ) -> Result<LayerWriter, ImageError> {
        let file = fs_err::File::create(out_file)?;
        let sink = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        let encoder = Encoder::new(compression, level, sink)?;
        Ok(LayerWriter {
            builder: tar::Builder::new(HashingWriter::new(encoder)),
            compression,
            out_file: out_file.to_owned(),
            seen_inodes: HashMap::new(),
            entries: 0,
        })
    }

    /// Appends the regular file `path` (mode, mtime, owner 0:0) with `size` bytes from `data`.
    pub fn append_file(
        &mut self,
        path: &str,
        mode: u32,
        mtime: u64,
        size: u64,
        data: impl Read,
    ) -> Result<(), ImageError> {
        let mut header = plain_header(EntryType::Regular, mode, mtime);
        header.set_size(size);
        self.builder.append_data(&mut header, path, data)?;
        self.entries += 1;
        Ok(())
    }

    /// Appends the directory `path` (owner 0:0).
    pub fn append_dir(&mut self, path: &str, mode: u32, mtime: u64) -> Result<(), ImageError> {
        let mut header = plain_header(EntryType::Directory, mode, mtime);
        self.builder.append_data(&mut header, path, io::empty())?;
        self.entries += 1;
        Ok(())
    }

    /// Appends the tree under `src` (see [`layer_from_dir`]), its entries named relative to `src`
    /// with `prefix` in front (`""` for the tree's root).
    pub fn append_tree(&mut self, src: &Path, prefix: &Path) -> Result<(), ImageError> {
        self.walk(src, prefix).map_err(|source| ImageError::Tar {
            path: src.to_owned(),
            source,
        })
    }

    /// Appends the one entry at `src` (file, directory without its contents, symlink, device,
    /// fifo; metadata as [`layer_from_dir`] records it) named `name`. Returns whether it is a
    /// directory. Sockets are skipped.
    pub fn append_path(&mut self, src: &Path, name: &Path) -> Result<bool, ImageError> {
        self.entry(src, name).map_err(|source| ImageError::Tar {
            path: src.to_owned(),
            source,
        })
    }

    /// Appends the entries of the real directory `dir`, named `relative/NAME`, recursively.
    fn walk(&mut self, dir: &Path, relative: &Path) -> io::Result<()> {
        let mut names: Vec<_> = fs_err::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let rel = relative.join(&name);
            let path = dir.join(&name);
            if self.entry(&path, &rel)? {
                self.walk(&path, &rel)?;
            }
        }
        Ok(())
    }

    fn entry(&mut self, path: &Path, rel: &Path) -> io::Result<bool> {
        let is_dir = append_entry(&mut self.builder, path, rel, &mut self.seen_inodes)?;
        if let Some(is_dir) = is_dir {
            self.entries += 1;
            return Ok(is_dir);
        }
        Ok(false)
    }

    /// Ends the tar and the compressed stream and returns the layer.
    pub fn finish(self) -> Result<ImageLayer, ImageError> {
        Ok(self.finish_with_sizes()?.0)
    }

    /// [`LayerWriter::finish`], with the tar's size and entry count.
    pub fn finish_with_sizes(self) -> Result<(ImageLayer, LayerSizes), ImageError> {
        let entries = self.entries;
        let tar_writer = self.builder.into_inner()?;
        let diff_id = tar_writer.digest();
        let tar_bytes = tar_writer.written;
        let sink = tar_writer.inner.finish()?;
        let layer = ImageLayer {
            digest: sink.digest(),
            diff_id,
            size: sink.written,
            compression: self.compression,
            media_type: String::new(),
            data: LayerData::File(self.out_file),
        };
        Ok((layer, LayerSizes { tar_bytes, entries }))
    }
}

fn plain_header(entry_type: EntryType, mode: u32, mtime: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(entry_type);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_size(0);
    header
}

/// Tars `src` (entries sorted by name, numeric owners, modes incl. setuid, mtimes, hardlinks as
/// link entries, devices, fifos, xattrs as PAX records; the root itself is not an entry) into
/// `out_file`, compressed, and returns the layer with both digests. Sockets are skipped.
pub fn layer_from_dir(
    src: &Path,
    compression: Compression,
    out_file: &Path,
) -> Result<ImageLayer, ImageError> {
    let mut writer = LayerWriter::create(out_file, compression)?;
    writer.append_tree(src, Path::new(""))?;
    writer.finish()
}

/// Compresses the uncompressed tar read from `tar` into `out_file` and returns the layer with both
/// digests. The stream is copied as it is (not re-tarred).
pub fn layer_from_tar(
    mut tar: impl Read,
    compression: Compression,
    out_file: &Path,
) -> Result<ImageLayer, ImageError> {
    let file = fs_err::File::create(out_file)?;
    let sink = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let mut tar_writer = HashingWriter::new(Encoder::new(compression, None, sink)?);
    io::copy(&mut tar, &mut tar_writer)?;
    let diff_id = tar_writer.digest();
    let sink = tar_writer.inner.finish()?;
    Ok(ImageLayer {
        digest: sink.digest(),
        diff_id,
        size: sink.written,
        compression,
        media_type: String::new(),
        data: LayerData::File(out_file.to_owned()),
    })
}

/// Appends the entry at `path` named `rel`: `Some(is_dir)`, or `None` for a skipped socket.
fn append_entry<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    rel: &Path,
    seen_inodes: &mut HashMap<(u64, u64), PathBuf>,
) -> io::Result<Option<bool>> {
    let meta = fs_err::symlink_metadata(path)?;
    let file_type = meta.file_type();
    if file_type.is_socket() {
        return Ok(None);
    }
    let mut header = Header::new_gnu();
    header.set_mtime(meta.mtime().max(0) as u64);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mode(meta.mode() & 0o7777);
    header.set_size(0);
    append_xattrs(builder, path, rel)?;

    if file_type.is_file() && meta.nlink() > 1 {
        if let Some(first) = seen_inodes.get(&(meta.dev(), meta.ino())) {
            header.set_entry_type(EntryType::Link);
            builder.append_link(&mut header, rel, first)?;
            return Ok(Some(false));
        }
        seen_inodes.insert((meta.dev(), meta.ino()), rel.to_owned());
    }
    if file_type.is_dir() {
        header.set_entry_type(EntryType::Directory);
        builder.append_data(&mut header, rel, io::empty())?;
        return Ok(Some(true));
    }
    if file_type.is_file() {
        header.set_entry_type(EntryType::Regular);
        header.set_size(meta.len());
        let file = fs_err::File::open(path)?;
        builder.append_data(&mut header, rel, file)?;
    } else if file_type.is_symlink() {
        header.set_entry_type(EntryType::Symlink);
        let target = fs_err::read_link(path)?;
        builder.append_link(&mut header, rel, target)?;
    } else {
        let entry_type = if file_type.is_char_device() {
            EntryType::Char
        } else if file_type.is_block_device() {
            EntryType::Block
        } else {
            EntryType::Fifo
        };
        header.set_entry_type(entry_type);
        if entry_type != EntryType::Fifo {
            let rdev = meta.rdev();
            header.set_device_major(rustix::fs::major(rdev))?;
            header.set_device_minor(rustix::fs::minor(rdev))?;
        }
        builder.append_data(&mut header, rel, io::empty())?;
    }
    Ok(Some(false))
}

fn append_xattrs<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    rel: &Path,
) -> io::Result<()> {
    let Ok(names) = xattr::list(path) else {
        return Ok(());
    };
    let mut records = Vec::new();
    for name in names {
        let Some(value) = xattr::get(path, &name)? else {
            continue;
        };
        records.push((
            [b"SCHILY.xattr.".as_slice(), name.as_bytes()].concat(),
            value,
        ));
    }
    if records.is_empty() {
        return Ok(());
    }
    let data = pax_records(&records);
    let mut header = Header::new_ustar();
    header.set_entry_type(EntryType::XHeader);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    let name = rel.file_name().map(|n| n.as_bytes()).unwrap_or(b"entry");
    let name = [b"PaxHeaders/".as_slice(), &name[..name.len().min(80)]].concat();
    header.as_old_mut().name[..name.len()].copy_from_slice(&name);
    header.set_cksum();
    builder.append(&header, data.as_slice())?;
    Ok(())
}

/// The body of a PAX extended header: `"<len> <key>=<value>\n"` records, where `<len>` counts
/// the whole record including its own digits.
pub fn pax_records<K: AsRef<[u8]>>(records: &[(K, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in records {
        let key = key.as_ref();
        let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        out.extend_from_slice(len.to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(key);
        out.push(b'=');
        out.extend_from_slice(value);
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_lengths_count_themselves() {
        for value_len in [0, 1, 5, 6, 7, 95, 96, 97, 994, 995, 996] {
            let record = pax_records(&[("k".to_owned(), vec![b'x'; value_len])]);
            let (len, _) = std::str::from_utf8(&record)
                .unwrap()
                .split_once(' ')
                .unwrap();
            assert_eq!(
                len.parse::<usize>().unwrap(),
                record.len(),
                "value of {value_len} bytes"
            );
        }
    }

    #[test]
    fn streamed_layer_digests_match_the_file_and_the_tar() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/file"), b"hello").unwrap();
        std::os::unix::fs::symlink("b/file", src.join("a/link")).unwrap();
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let out = dir.path().join(format!("{compression:?}"));
            let layer = layer_from_dir(&src, compression, &out).unwrap();
            let blob = std::fs::read(&out).unwrap();
            assert_eq!(layer.size, blob.len() as u64);
            assert_eq!(layer.digest, sha256_digest(&blob));
            let tar = match compression {
                Compression::None => blob.clone(),
                Compression::Gzip => {
                    let mut tar = Vec::new();
                    flate2::read::GzDecoder::new(blob.as_slice())
                        .read_to_end(&mut tar)
                        .unwrap();
                    tar
                }
                Compression::Zstd => zstd::decode_all(blob.as_slice()).unwrap(),
            };
            assert_eq!(layer.diff_id, sha256_digest(&tar));
            let names: Vec<String> = tar::Archive::new(tar.as_slice())
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().display().to_string())
                .collect();
            assert_eq!(names, ["a", "a/b", "a/b/file", "a/link"]);

            // The same tar, streamed in, gives the same diff_id.
            let again =
                layer_from_tar(tar.as_slice(), compression, &dir.path().join("again")).unwrap();
            assert_eq!(again.diff_id, layer.diff_id);
        }
    }

    #[test]
    fn tree_under_a_prefix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src/x")).unwrap();
        std::fs::write(dir.path().join("src/x/f"), b"1").unwrap();
        let out = dir.path().join("layer");
        let mut writer = LayerWriter::create(&out, Compression::None).unwrap();
        writer.append_dir("opt", 0o755, 0).unwrap();
        writer
            .append_tree(&dir.path().join("src/x"), Path::new("opt/x"))
            .unwrap();
        writer.finish().unwrap();
        let tar = std::fs::read(&out).unwrap();
        let names: Vec<String> = tar::Archive::new(tar.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["opt", "opt/x/f"]);
    }
}
