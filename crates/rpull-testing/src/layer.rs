//! `LayerBuilder`: layer tars built in memory, entry by entry, including the odd and hostile
//! entries an extractor must handle (whiteouts, devices, xattrs, long names, `../` names).

use std::collections::BTreeMap;

use rpull_image::{IntoLayerTar, pax_records};
use tar::{EntryType, Header};

/// The mtime every entry gets unless told otherwise (2023-11-14), so fixtures are reproducible.
pub const DEFAULT_MTIME: u64 = 1_700_000_000;

/// Builds an uncompressed layer tar in memory. Entry methods panic on entries the `tar` crate
/// refuses (e.g. `..` in a name): fixtures are code, and a panic names the entry. Use `raw` and
/// friends for hostile names.
pub struct LayerBuilder {
    builder: tar::Builder<Vec<u8>>,
    mtime: u64,
    pending_xattrs: BTreeMap<String, Vec<(String, Vec<u8>)>>,
}

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBuilder")
            .field("bytes_so_far", &self.builder.get_ref().len())
            .field("mtime", &self.mtime)
            .finish_non_exhaustive()
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        LayerBuilder {
            builder: tar::Builder::new(Vec::new()),
            mtime: DEFAULT_MTIME,
            pending_xattrs: BTreeMap::new(),
        }
    }

    /// mtime for the entries added after this call.
    pub fn mtime(mut self, mtime: u64) -> Self {
        self.mtime = mtime;
        self
    }

    fn header(&self, entry_type: EntryType, mode: u32) -> Header {
        let mut header = Header::new_gnu();
        header.set_entry_type(entry_type);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(self.mtime);
        header.set_size(0);
        header
    }

    fn append(mut self, path: &str, mut header: Header, data: &[u8]) -> Self {
        self.write_pending_xattrs(path);
        header.set_size(data.len() as u64);
        self.builder
            .append_data(&mut header, path, data)
            .unwrap_or_else(|err| panic!("layer entry {path:?}: {err}"));
        self
    }

    fn append_link(mut self, path: &str, mut header: Header, target: &str) -> Self {
        self.write_pending_xattrs(path);
        self.builder
            .append_link(&mut header, path, target)
            .unwrap_or_else(|err| panic!("layer entry {path:?} -> {target:?}: {err}"));
        self
    }

    fn write_pending_xattrs(&mut self, path: &str) {
        if let Some(xattrs) = self.pending_xattrs.remove(path) {
            let records: Vec<(String, Vec<u8>)> = xattrs
                .into_iter()
                .map(|(name, value)| (format!("SCHILY.xattr.{name}"), value))
                .collect();
            self.write_pax(path, &records);
        }
    }

    fn write_pax(&mut self, path: &str, records: &[(String, Vec<u8>)]) {
        let data = pax_records(records);
        let mut header = Header::new_ustar();
        header.set_entry_type(EntryType::XHeader);
        header.set_mode(0o644);
        header.set_mtime(self.mtime);
        header.set_size(data.len() as u64);
        let name = format!(
            "PaxHeaders/{}",
            path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("entry")
        );
        let name_bytes = &name.as_bytes()[..name.len().min(99)];
        header.as_old_mut().name[..name_bytes.len()].copy_from_slice(name_bytes);
        header.set_cksum();
        self.builder
            .append(&header, data.as_slice())
            .expect("writing into memory");
    }

    pub fn dir(self, path: &str, mode: u32) -> Self {
        let header = self.header(EntryType::Directory, mode);
        self.append(path, header, &[])
    }

    pub fn file(self, path: &str, data: impl AsRef<[u8]>, mode: u32) -> Self {
        let header = self.header(EntryType::Regular, mode);
        self.append(path, header, data.as_ref())
    }

    /// A regular file (mode 0644) whose header the closure adjusts: owner, mtime, mode, names...
    pub fn file_with(
        self,
        path: &str,
        data: impl AsRef<[u8]>,
        edit: impl FnOnce(&mut Header),
    ) -> Self {
        let mut header = self.header(EntryType::Regular, 0o644);
        edit(&mut header);
        self.append(path, header, data.as_ref())
    }

    /// Any entry type, with the header adjusted by the closure (e.g. a directory owned by 1000).
    pub fn entry_with(
        self,
        path: &str,
        entry_type: EntryType,
        data: impl AsRef<[u8]>,
        edit: impl FnOnce(&mut Header),
    ) -> Self {
        let mut header = self.header(entry_type, 0o644);
        edit(&mut header);
        self.append(path, header, data.as_ref())
    }

    pub fn symlink(self, path: &str, target: &str) -> Self {
        let header = self.header(EntryType::Symlink, 0o777);
        self.append_link(path, header, target)
    }

    /// A hardlink: `path` is another name for the earlier entry `target` (a path in the layer
    /// tree, or in an earlier layer).
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        let header = self.header(EntryType::Link, 0o644);
        self.append_link(path, header, target)
    }

    /// Deletes `path` from lower layers: writes `DIR/.wh.NAME`.
    pub fn whiteout(self, path: &str) -> Self {
        let path = path.trim_end_matches('/');
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (format!("{parent}/"), name),
            None => (String::new(), path),
        };
        self.file(&format!("{parent}.wh.{name}"), [], 0o644)
    }

    /// Hides everything lower layers had in `dir`: writes `DIR/.wh..wh..opq`.
    pub fn opaque(self, dir: &str) -> Self {
        self.file(
            &format!("{}/.wh..wh..opq", dir.trim_end_matches('/')),
            [],
            0o644,
        )
    }

    pub fn fifo(self, path: &str, mode: u32) -> Self {
        let header = self.header(EntryType::Fifo, mode);
        self.append(path, header, &[])
    }

    pub fn char_device(self, path: &str, mode: u32, major: u32, minor: u32) -> Self {
        self.device(path, EntryType::Char, mode, major, minor)
    }

    pub fn block_device(self, path: &str, mode: u32, major: u32, minor: u32) -> Self {
        self.device(path, EntryType::Block, mode, major, minor)
    }

    fn device(self, path: &str, entry_type: EntryType, mode: u32, major: u32, minor: u32) -> Self {
        let mut header = self.header(entry_type, mode);
        header
            .set_device_major(major)
            .expect("gnu header has device fields");
        header
            .set_device_minor(minor)
            .expect("gnu header has device fields");
        self.append(path, header, &[])
    }

    /// Attaches an xattr (PAX `SCHILY.xattr.NAME`) to the entry `path` added *after* this call,
    /// e.g. `.xattr("bin/ping", "security.capability", caps).file("bin/ping", ..)`.
    pub fn xattr(mut self, path: &str, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.pending_xattrs
            .entry(path.to_owned())
            .or_default()
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// A file whose name is carried in a PAX `path` record (long names the PAX way; plain `file`
    /// already writes GNU long-name entries for names over 100 bytes).
    pub fn file_pax_path(mut self, path: &str, data: impl AsRef<[u8]>, mode: u32) -> Self {
        self.write_pending_xattrs(path);
        self.write_pax(path, &[("path".to_owned(), path.as_bytes().to_vec())]);
        let data = data.as_ref();
        let mut header = self.header(EntryType::Regular, mode);
        header.set_size(data.len() as u64);
        let short: String = path
            .chars()
            .rev()
            .take(90)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let short = short.trim_start_matches('/');
        header.as_old_mut().name[..short.len()].copy_from_slice(short.as_bytes());
        header.set_cksum();
        self.builder
            .append(&header, data)
            .expect("writing into memory");
        self
    }

    /// Appends `header` and `data` exactly as given (checksum recomputed). For hostile entries.
    pub fn raw(mut self, mut header: Header, data: impl AsRef<[u8]>) -> Self {
        header.set_cksum();
        self.builder
            .append(&header, data.as_ref())
            .expect("writing into memory");
        self
    }

    /// A header whose name is exactly `name` (at most 100 bytes, no normalisation: `../x`,
    /// `/etc/x`, non-UTF-8 all allowed), mode 0644, owner 0:0, size 0.
    pub fn raw_header(&self, name: &[u8], entry_type: EntryType) -> Header {
        assert!(name.len() <= 100, "raw names are at most 100 bytes");
        let mut header = self.header(entry_type, 0o644);
        header.as_old_mut().name = [0; 100];
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header
    }

    /// A regular file with an arbitrary (hostile) name.
    pub fn raw_file(self, name: &[u8], data: impl AsRef<[u8]>) -> Self {
        let data = data.as_ref();
        let mut header = self.raw_header(name, EntryType::Regular);
        header.set_size(data.len() as u64);
        self.raw(header, data)
    }

    /// A symlink or hardlink with arbitrary name and target bytes (each at most 100 bytes).
    pub fn raw_link(self, name: &[u8], entry_type: EntryType, target: &[u8]) -> Self {
        assert!(
            target.len() <= 100,
            "raw link targets are at most 100 bytes"
        );
        let mut header = self.raw_header(name, entry_type);
        if entry_type == EntryType::Symlink {
            header.set_mode(0o777);
        }
        header.as_old_mut().linkname = [0; 100];
        header.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        self.raw(header, [])
    }

    /// The finished, uncompressed tar.
    pub fn build(self) -> Vec<u8> {
        assert!(
            self.pending_xattrs.is_empty(),
            "xattrs set for entries never added: {:?}",
            self.pending_xattrs.keys().collect::<Vec<_>>()
        );
        self.builder
            .into_inner()
            .expect("finishing a tar in memory")
    }
}

/// So `ImageBuilder::layer(LayerBuilder::new()..., compression)` works as before the image
/// builders moved to `rpull-image`.
impl IntoLayerTar for LayerBuilder {
    fn into_layer_tar(self) -> Vec<u8> {
        self.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpull_image::Compression;
    use std::io::Read;

    /// (path, type, data, link target) per entry.
    type Listed = (Vec<u8>, EntryType, Vec<u8>, Option<Vec<u8>>);

    fn entries(tar: &[u8]) -> Vec<Listed> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let path = entry.path_bytes().into_owned();
                let kind = entry.header().entry_type();
                let link = entry.link_name_bytes().map(|l| l.into_owned());
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                (path, kind, data, link)
            })
            .collect()
    }

    #[test]
    fn pax_record_lengths_count_themselves() {
        for value_len in [0, 1, 5, 94, 95, 96, 994, 995, 996] {
            let record = pax_records(&[("k".to_owned(), vec![b'x'; value_len])]);
            let (length, _) = std::str::from_utf8(&record)
                .unwrap()
                .split_once(' ')
                .unwrap();
            assert_eq!(
                length.parse::<usize>().unwrap(),
                record.len(),
                "value_len {value_len}"
            );
        }
    }

    #[test]
    fn entries_round_trip_through_the_tar_crate() {
        let long = format!("{}/file", "d".repeat(150));
        let pax_long = format!("{}/paxfile", "p".repeat(120));
        let tar = LayerBuilder::new()
            .dir("etc", 0o755)
            .file("etc/hosts", "127.0.0.1 localhost\n", 0o644)
            .symlink("etc/link", "../usr/x")
            .hardlink("etc/hard", "etc/hosts")
            .whiteout("etc/gone")
            .whiteout("top")
            .opaque("var/")
            .fifo("fifo", 0o600)
            .char_device("null", 0o666, 1, 3)
            .xattr("cap", "security.capability", [1u8, 2, 3])
            .file("cap", "x", 0o755)
            .file(&long, "long", 0o644)
            .file_pax_path(&pax_long, "pax", 0o644)
            .raw_file(b"../escape", "evil")
            .raw_file(b"/etc/abs", "evil")
            .raw_link(b"up", EntryType::Symlink, b"../../..")
            .build();
        let got: Vec<_> = entries(&tar)
            .into_iter()
            .map(|(p, k, d, l)| (String::from_utf8(p).unwrap(), k, d, l))
            .collect();
        let names: Vec<&str> = got.iter().map(|(p, ..)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "etc",
                "etc/hosts",
                "etc/link",
                "etc/hard",
                "etc/.wh.gone",
                ".wh.top",
                "var/.wh..wh..opq",
                "fifo",
                "null",
                "cap",
                long.as_str(),
                pax_long.as_str(),
                "../escape",
                "/etc/abs",
                "up"
            ]
        );
        assert_eq!(got[2].3.as_deref(), Some(&b"../usr/x"[..]));
        assert_eq!(got[3].1, EntryType::Link);
        assert_eq!(got[8].1, EntryType::Char);
        assert_eq!(got[12].2, b"evil");

        let mut archive = tar::Archive::new(tar.as_slice());
        let mut cap = archive
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| &*e.path_bytes() == b"cap")
            .unwrap();
        let xattrs: Vec<_> = cap
            .pax_extensions()
            .unwrap()
            .unwrap()
            .map(|ext| {
                let ext = ext.unwrap();
                (ext.key().unwrap().to_owned(), ext.value_bytes().to_vec())
            })
            .collect();
        assert_eq!(
            xattrs,
            [("SCHILY.xattr.security.capability".to_owned(), vec![1, 2, 3])]
        );
    }

    #[test]
    fn compression_round_trips() {
        let tar = LayerBuilder::new().file("a", "hello", 0o644).build();
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let compressed = compression.compress(&tar);
            let back = match compression {
                Compression::None => compressed.clone(),
                Compression::Gzip => {
                    let mut out = Vec::new();
                    flate2::read::GzDecoder::new(compressed.as_slice())
                        .read_to_end(&mut out)
                        .unwrap();
                    out
                }
                Compression::Zstd => zstd::decode_all(compressed.as_slice()).unwrap(),
            };
            assert_eq!(back, tar, "{compression:?}");
        }
    }

    #[test]
    #[should_panic(expected = "never added")]
    fn unused_xattr_is_a_bug_in_the_fixture() {
        LayerBuilder::new().xattr("nope", "user.x", "1").build();
    }
}
