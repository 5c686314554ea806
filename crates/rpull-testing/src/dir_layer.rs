//! `layer_from_dir`: a layer made from a real directory tree, streamed to a file (compressed,
//! both digests computed on the way) so multi-GB trees never sit in memory.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};
use tar::{EntryType, Header};

use crate::image::{ImageLayer, LayerData};
use crate::layer::Compression;

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

enum Encoder {
    None(FileSink),
    Gzip(flate2::write::GzEncoder<FileSink>),
    Zstd(zstd::Encoder<'static, FileSink>),
}

impl Write for Encoder {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::None(w) => w.write(buf),
            Encoder::Gzip(w) => w.write(buf),
            Encoder::Zstd(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::None(w) => w.flush(),
            Encoder::Gzip(w) => w.flush(),
            Encoder::Zstd(w) => w.flush(),
        }
    }
}

impl Encoder {
    fn finish(self) -> io::Result<FileSink> {
        let mut sink = match self {
            Encoder::None(w) => w,
            Encoder::Gzip(w) => w.finish()?,
            Encoder::Zstd(w) => w.finish()?,
        };
        sink.flush()?;
        Ok(sink)
    }
}

/// Tars `src` (entries sorted by name, numeric owners, modes incl. setuid, mtimes, hardlinks as
/// link entries, devices, fifos, xattrs as PAX records; the root itself is not an entry) into
/// `out_file`, compressed, and returns the layer with both digests. Sockets are skipped.
pub fn layer_from_dir(src: &Path, compression: Compression, out_file: &Path) -> Result<ImageLayer> {
    let file = fs_err::File::create(out_file)?;
    let sink = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let encoder = match compression {
        Compression::None => Encoder::None(sink),
        // Fast levels: these layers exist to move many bytes, not to be small.
        Compression::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
            sink,
            flate2::Compression::fast(),
        )),
        Compression::Zstd => Encoder::Zstd(zstd::Encoder::new(sink, 1)?),
    };
    let mut builder = tar::Builder::new(HashingWriter::new(encoder));
    let mut seen_inodes = HashMap::new();
    append_tree(&mut builder, src, Path::new(""), &mut seen_inodes)
        .with_context(|| format!("tarring {}", src.display()))?;
    let tar_writer = builder.into_inner()?;
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

fn append_tree<W: Write>(
    builder: &mut tar::Builder<W>,
    root: &Path,
    relative: &Path,
    seen_inodes: &mut HashMap<(u64, u64), PathBuf>,
) -> Result<()> {
    let dir = root.join(relative);
    let mut names: Vec<_> = fs_err::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let rel = relative.join(&name);
        let path = root.join(&rel);
        let meta = fs_err::symlink_metadata(&path)?;
        let file_type = meta.file_type();
        if file_type.is_socket() {
            continue;
        }
        let mut header = Header::new_gnu();
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_uid(u64::from(meta.uid()));
        header.set_gid(u64::from(meta.gid()));
        header.set_mode(meta.mode() & 0o7777);
        header.set_size(0);
        append_xattrs(builder, &path, &rel)?;

        if file_type.is_file() && meta.nlink() > 1 {
            if let Some(first) = seen_inodes.get(&(meta.dev(), meta.ino())) {
                header.set_entry_type(EntryType::Link);
                builder.append_link(&mut header, &rel, first)?;
                continue;
            }
            seen_inodes.insert((meta.dev(), meta.ino()), rel.clone());
        }
        if file_type.is_dir() {
            header.set_entry_type(EntryType::Directory);
            builder.append_data(&mut header, &rel, io::empty())?;
            append_tree(builder, root, &rel, seen_inodes)?;
        } else if file_type.is_file() {
            header.set_entry_type(EntryType::Regular);
            header.set_size(meta.len());
            let file = fs_err::File::open(&path)?;
            builder.append_data(&mut header, &rel, file)?;
        } else if file_type.is_symlink() {
            header.set_entry_type(EntryType::Symlink);
            let target = fs_err::read_link(&path)?;
            builder.append_link(&mut header, &rel, target)?;
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
            builder.append_data(&mut header, &rel, io::empty())?;
        }
    }
    Ok(())
}

fn append_xattrs<W: Write>(builder: &mut tar::Builder<W>, path: &Path, rel: &Path) -> Result<()> {
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
    let data = crate::layer::pax_records(&records);
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
