//! [`TarWalk`]: a layer tar's headers read here, and a regular file's data handed to the backend
//! straight from the source's buffers.
//!
//! The walk reads what the tar crate's `Archive::entries` reads, with the same rules (a header's
//! checksum, GNU long names and link names, pax `path`, `linkpath`, `size`, `uid` and `gid`, GNU
//! sparse maps, the end at the first block of zeros), and the tar crate's own types read any field
//! not in the common form ([`tar::Header`], [`tar::PaxExtensions`], [`tar::GnuSparseHeader`]); the
//! tests walk the same archives, hostile ones among them, both ways. It is here for speed, on layers
//! of many small files, where reading a header through the tar crate took about half of the
//! extraction's user-space instructions; with the walk an entry takes 40% fewer, a saving that
//! `examples/extract_tar` shows in most sets of rounds and `rpull bench`'s own small-files stage
//! did not show within its swing (docs/performance.md, "What changed"). What it does differently:
//!
//! * **No work per header that the entry does not need.** The tar crate allocates an entry's
//!   reader list, formats a string when it makes its header buffer, and parses the checksum and
//!   the size through a `str` and `from_str_radix`; here the common octal form is read in place and
//!   the checksum is one vectorised sum.
//! * **File data past no one.** The tar crate finds each header by its own count of the bytes it
//!   has read, so data read past it had to be hidden from its next seek; here the walk owns the
//!   stream, and a file's data ([`TarWalk::file_data`]) is read from the source's own buffers (for
//!   the pipeline, the decoded buffers of the decompression thread), lent whole where it can be.
//! * **Skips without copies.** The padding after every entry, and any data left unread, is consumed
//!   from the source's buffer, not read into a buffer (the tar crate's skip zeroes 32 KiB of stack
//!   on every call, once per entry).

use std::borrow::Cow;
use std::io::{self, BufRead, Read};

use bytes::Bytes;
use tar::{EntryType, GnuExtSparseHeader, GnuSparseHeader, Header, PaxExtensions};

use crate::backend::FileSource;
use crate::metadata::plain_octal;
use crate::source::LayerSource;

const BLOCK: usize = 512;
const BLOCK_SIZE: u64 = BLOCK as u64;
/// The most data a GNU long name, long link name or pax extension header may hold: Go's
/// `archive/tar` (docker, containerd) refuses larger ones the same way (`maxSpecialFileSize`),
/// and the tar crate would read any size into memory.
pub(crate) const MAX_EXTENSION: u64 = 1 << 20;

/// The layer tar and how many of its bytes were consumed.
struct Stream<'a> {
    inner: &'a mut dyn LayerSource,
    position: u64,
}

impl Stream<'_> {
    /// Consumes `count` bytes without copying them; fewer in the stream is an `UnexpectedEof`
    /// error.
    fn skip(&mut self, mut count: u64) -> io::Result<()> {
        while count > 0 {
            let available = match self.inner.fill_buf() {
                Ok(buffer) => buffer.len(),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            };
            if available == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the layer tar ended inside an entry",
                ));
            }
            let step = count.min(available as u64) as usize;
            self.inner.consume(step);
            self.position += step as u64;
            count -= step as u64;
        }
        Ok(())
    }

    /// Reads one block into `block`: `false` when the stream ends before its first byte, an
    /// error when it ends inside it.
    fn read_block(&mut self, block: &mut [u8; BLOCK]) -> io::Result<bool> {
        match self.inner.fill_buf() {
            Ok(buffer) if buffer.len() >= BLOCK => block.copy_from_slice(&buffer[..BLOCK]),
            Ok(_) => return self.read_block_in_parts(block),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {
                return self.read_block_in_parts(block);
            }
            Err(error) => return Err(error),
        }
        self.inner.consume(BLOCK);
        self.position += BLOCK_SIZE;
        Ok(true)
    }

    fn read_block_in_parts(&mut self, block: &mut [u8; BLOCK]) -> io::Result<bool> {
        let mut filled = 0;
        while filled < BLOCK {
            let read = match self.inner.read(&mut block[filled..]) {
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            };
            if read == 0 {
                if filled == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the layer tar ended inside a header",
                ));
            }
            filled += read;
            self.position += read as u64;
        }
        Ok(true)
    }

    /// Reads exactly `count` bytes, appended to `into`.
    fn read_into(&mut self, into: &mut Vec<u8>, count: u64) -> io::Result<()> {
        let start = into.len();
        into.resize(start + count as usize, 0);
        let mut filled = start;
        while filled < into.len() {
            let read = match self.inner.read(&mut into[filled..]) {
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            };
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the layer tar ended inside an entry",
                ));
            }
            filled += read;
            self.position += read as u64;
        }
        Ok(())
    }
}

/// A buffer of an extension header's data (GNU long name or link name, pax records) that applies
/// to the next entry, reused from entry to entry.
#[derive(Default)]
struct Extension {
    data: Vec<u8>,
    present: bool,
}

impl Extension {
    fn get(&self) -> Option<&[u8]> {
        self.present.then_some(self.data.as_slice())
    }

    /// The name without the NUL that ends it (as the tar crate reads a GNU long name).
    fn name(&self) -> Option<&[u8]> {
        let data = self.get()?;
        Some(data.strip_suffix(&[0]).unwrap_or(data))
    }
}

/// The entries of a layer tar, one at a time ([`next_entry`](Self::next_entry)); the current one
/// read through the accessors. Extension headers (GNU long names, pax records) are applied to the
/// entry they describe and not returned, as the tar crate's `Archive::entries` does; pax global
/// headers are returned, as there.
pub(crate) struct TarWalk<'a> {
    stream: Stream<'a>,
    /// Where the next header starts.
    next: u64,
    done: bool,
    /// The current entry's header (its `uid` and `gid` set from pax records, as the tar crate sets
    /// them).
    header: Header,
    /// The current entry's size: its data's in the archive, or for a GNU sparse file its size
    /// with the holes.
    size: u64,
    /// Where the current entry's data starts.
    data_start: u64,
    long_name: Extension,
    long_link: Extension,
    pax: Extension,
    /// A GNU sparse file's data blocks, `(offset in the file, length)`, in the order of its data
    /// in the archive; empty for any other entry.
    sparse: Vec<(u64, u64)>,
}

impl<'a> TarWalk<'a> {
    pub(crate) fn new(source: &'a mut dyn LayerSource) -> Self {
        Self {
            stream: Stream {
                inner: source,
                position: 0,
            },
            next: 0,
            done: false,
            header: Header::new_old(),
            size: 0,
            data_start: 0,
            long_name: Extension::default(),
            long_link: Extension::default(),
            pax: Extension::default(),
            sparse: Vec::new(),
        }
    }

    /// Moves to the next entry: `false` at the end of the archive (a block of zeros, or the end of
    /// the stream where a header would start). After an error, or the end, it stays `false`.
    pub(crate) fn next_entry(&mut self) -> io::Result<bool> {
        if self.done {
            return Ok(false);
        }
        let next = self.advance();
        if !matches!(next, Ok(true)) {
            self.done = true;
        }
        next
    }

    fn advance(&mut self) -> io::Result<bool> {
        self.long_name.present = false;
        self.long_link.present = false;
        self.pax.present = false;
        self.sparse.clear();
        let mut first = true;
        loop {
            if !self.read_header()? {
                if first {
                    return Ok(false);
                }
                return Err(other(
                    "members found describing a future member but no future member found",
                ));
            }
            first = false;
            let kind = self.header.entry_type();
            let recognized = self.header.as_gnu().is_some() || self.header.as_ustar().is_some();
            let (extension, what) = match kind {
                EntryType::GNULongName if recognized => (&mut self.long_name, "long name"),
                EntryType::GNULongLink if recognized => (&mut self.long_link, "long name"),
                EntryType::XHeader if recognized => (&mut self.pax, "pax extensions"),
                EntryType::GNUSparse => {
                    self.read_sparse_map()?;
                    return Ok(true);
                }
                _ => return Ok(true),
            };
            if extension.present {
                return Err(other(&format!(
                    "two {what} entries describing the same member"
                )));
            }
            if self.size > MAX_EXTENSION {
                return Err(other(&format!(
                    "a {what} entry of {} bytes (at most {MAX_EXTENSION})",
                    self.size
                )));
            }
            extension.data.clear();
            self.stream.read_into(&mut extension.data, self.size)?;
            extension.present = true;
        }
    }

    /// Reads the header at `next` and moves `next` past its entry (`false` at the end of the
    /// archive), as the tar crate's `next_entry_raw`.
    fn read_header(&mut self) -> io::Result<bool> {
        let behind = self
            .next
            .checked_sub(self.stream.position)
            .ok_or_else(|| other("the layer tar was read past the next header"))?;
        self.stream.skip(behind)?;
        if !self.stream.read_block(self.header.as_mut_bytes())? {
            return Ok(false);
        }
        let bytes = self.header.as_bytes();
        if bytes.iter().all(|byte| *byte == 0) {
            return Ok(false);
        }
        self.next += BLOCK_SIZE;

        // The sum of the header's bytes with the checksum field as spaces.
        let field: u32 = bytes[148..156].iter().map(|byte| u32::from(*byte)).sum();
        let sum = bytes.iter().map(|byte| u32::from(*byte)).sum::<u32>() - field + 8 * 32;
        let recorded = match plain_octal(&bytes[148..156]) {
            Some(value) => value as u32,
            None => self.header.cksum()?,
        };
        if sum != recorded {
            return Err(other("archive header checksum mismatch"));
        }

        let kind = self.header.entry_type();
        let extension = matches!(
            kind,
            EntryType::GNULongName
                | EntryType::GNULongLink
                | EntryType::XHeader
                | EntryType::XGlobalHeader
        );
        let mut size = match plain_octal(&self.header.as_bytes()[124..136]) {
            Some(size) => size,
            None => self.header.entry_size()?,
        };
        if let Some(pax) = self.pax.get().filter(|_| !extension) {
            if let Some(uid) = pax_number(pax, b"uid") {
                self.header.set_uid(uid);
            }
            if let Some(gid) = pax_number(pax, b"gid") {
                self.header.set_gid(gid);
            }
            if let Some(pax_size) = pax_number(pax, b"size") {
                size = pax_size;
            }
        }
        self.size = size;
        self.data_start = self.next;
        let padded = size
            .checked_add(BLOCK_SIZE - 1)
            .ok_or_else(|| other("size overflow"))?;
        self.next = self
            .next
            .checked_add(padded & !(BLOCK_SIZE - 1))
            .ok_or_else(|| other("size overflow"))?;
        Ok(true)
    }

    /// A GNU sparse file's map, from its header and the extension blocks after it, checked as the
    /// tar crate checks it (blocks in order, not overlapping, each but the first starting on a
    /// block boundary of the data, the data's size and the file's size both accounted for).
    fn read_sparse_map(&mut self) -> io::Result<()> {
        let gnu = self
            .header
            .as_gnu()
            .ok_or_else(|| other("sparse entry type listed but not GNU header"))?;
        let stored = self.size;
        let real_size = gnu.real_size();
        let mut map = SparseMap {
            blocks: &mut self.sparse,
            stored,
            remaining: stored,
            end: 0,
        };
        for block in &gnu.sparse {
            map.add(block)?;
        }
        if gnu.is_extended() {
            let mut extension = GnuExtSparseHeader::new();
            loop {
                if !self.stream.read_block(extension.as_mut_bytes())? {
                    return Err(other("failed to read extension"));
                }
                self.next += BLOCK_SIZE;
                self.data_start += BLOCK_SIZE;
                for block in &extension.sparse {
                    map.add(block)?;
                }
                if !extension.is_extended() {
                    break;
                }
            }
        }
        let (end, remaining) = (map.end, map.remaining);
        if end != real_size? {
            return Err(other("mismatch in sparse file chunks and size in header"));
        }
        if remaining > 0 {
            return Err(other(
                "mismatch in sparse file chunks and entry size in header",
            ));
        }
        self.size = end;
        Ok(())
    }

    /// The current entry's header.
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// The current entry's size: its data's, or a GNU sparse file's with its holes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The current entry's path as the archive gives it: a GNU long name, else a pax `path`,
    /// else the header's (a ustar header's prefix and name joined by `/`).
    pub(crate) fn path_bytes(&self) -> Cow<'_, [u8]> {
        if let Some(name) = self.long_name.name() {
            return Cow::Borrowed(name);
        }
        if let Some(path) = self.pax_value(b"path") {
            return Cow::Borrowed(path);
        }
        self.header.path_bytes()
    }

    /// The current entry's link target: a GNU long link name, else a pax `linkpath`, else the
    /// header's; `None` when there is none.
    pub(crate) fn link_name_bytes(&self) -> Option<Cow<'_, [u8]>> {
        if let Some(name) = self.long_link.name() {
            return Some(Cow::Borrowed(name));
        }
        if let Some(path) = self.pax_value(b"linkpath") {
            return Some(Cow::Borrowed(path));
        }
        self.header.link_name_bytes()
    }

    /// The pax records that describe the current entry, if a pax extension header came before it.
    pub(crate) fn pax_extensions(&self) -> Option<PaxExtensions<'_>> {
        self.pax.get().map(PaxExtensions::new)
    }

    fn pax_value(&self, key: &[u8]) -> Option<&[u8]> {
        self.pax_extensions()?
            .filter_map(Result::ok)
            .find(|record| record.key_bytes() == key)
            .map(|record| record.value_bytes())
    }

    /// Whether the current entry is a GNU sparse file, whose data is read through
    /// [`sparse_data`](Self::sparse_data).
    pub(crate) fn is_sparse(&self) -> bool {
        self.header.entry_type() == EntryType::GNUSparse
    }

    /// The current entry's data not yet read, straight from the source's buffers; not for a GNU
    /// sparse file, whose data is read through [`sparse_data`](Self::sparse_data).
    pub(crate) fn file_data(&mut self) -> FileData<'_, 'a> {
        debug_assert!(
            !self.is_sparse(),
            "a sparse file's data is read with its holes"
        );
        // Within the archive: `read_header` checked that the entry's padded end fits a u64.
        let end = self.data_start + self.size;
        FileData {
            remaining: end.saturating_sub(self.stream.position),
            stream: &mut self.stream,
        }
    }

    /// A GNU sparse file's content, its holes as zeros, from its start (call it once, before any
    /// other read of the entry's data).
    pub(crate) fn sparse_data(&mut self) -> SparseData<'_, 'a> {
        SparseData {
            stream: &mut self.stream,
            blocks: &self.sparse,
            next_block: 0,
            end: 0,
            zeros: 0,
            data: 0,
        }
    }
}

/// A GNU sparse map being read ([`TarWalk::read_sparse_map`]).
struct SparseMap<'m> {
    blocks: &'m mut Vec<(u64, u64)>,
    /// The entry's data in the archive.
    stored: u64,
    /// Of that, the bytes no block has claimed yet.
    remaining: u64,
    /// Where the last block ends in the file.
    end: u64,
}

impl SparseMap<'_> {
    fn add(&mut self, block: &GnuSparseHeader) -> io::Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let offset = block.offset()?;
        let length = block.length()?;
        if length != 0 && !(self.stored - self.remaining).is_multiple_of(BLOCK_SIZE) {
            return Err(other(
                "previous block in sparse file was not aligned to 512-byte boundary",
            ));
        }
        if offset < self.end {
            return Err(other("out of order or overlapping sparse blocks"));
        }
        self.end = offset
            .checked_add(length)
            .ok_or_else(|| other("more bytes listed in sparse file than u64 can hold"))?;
        self.remaining = self
            .remaining
            .checked_sub(length)
            .ok_or_else(|| other("sparse file consumed more data than the header listed"))?;
        self.blocks.push((offset, length));
        Ok(())
    }
}

/// The first value of the pax record `key`, read as the tar crate reads `size`, `uid` and `gid`:
/// `None` when it is missing or not a number, or when a record before it is malformed.
fn pax_number(pax: &[u8], key: &[u8]) -> Option<u64> {
    for record in PaxExtensions::new(pax) {
        let record = record.ok()?;
        if record.key_bytes() != key {
            continue;
        }
        return std::str::from_utf8(record.value_bytes()).ok()?.parse().ok();
    }
    None
}

fn other(message: &str) -> io::Error {
    io::Error::other(message.to_owned())
}

/// One entry's data ([`TarWalk::file_data`]): at most its size, then end of stream. As a
/// [`BufRead`], its buffer is the source's own.
pub(crate) struct FileData<'s, 'a> {
    stream: &'s mut Stream<'a>,
    remaining: u64,
}

impl FileData<'_, '_> {
    /// The entry's bytes still to come, as a length.
    fn limit(&self) -> usize {
        self.remaining.min(usize::MAX as u64) as usize
    }

    fn advance(&mut self, count: usize) {
        self.stream.position += count as u64;
        self.remaining -= count as u64;
    }
}

impl Read for FileData<'_, '_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let limit = buffer.len().min(self.limit());
        if limit == 0 {
            return Ok(0);
        }
        let read = self.stream.inner.read(&mut buffer[..limit])?;
        self.advance(read);
        Ok(read)
    }
}

impl BufRead for FileData<'_, '_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.remaining == 0 {
            return Ok(&[]);
        }
        let limit = self.limit();
        let buffer = self.stream.inner.fill_buf()?;
        Ok(&buffer[..buffer.len().min(limit)])
    }

    fn consume(&mut self, count: usize) {
        let count = count.min(self.limit());
        self.stream.inner.consume(count);
        self.advance(count);
    }
}

impl FileSource for FileData<'_, '_> {
    fn lend_rest(&mut self) -> Option<Bytes> {
        let len = self.limit();
        if len == 0 || len as u64 != self.remaining {
            return None;
        }
        let view = self.stream.inner.lend(len)?;
        self.advance(len);
        Some(view)
    }
}

/// A GNU sparse file's content ([`TarWalk::sparse_data`]): each block's data after the zeros of
/// the hole before it. Where the stream ends inside a block, the rest of that block is left out,
/// without an error, as the tar crate's reader of such an entry does: the walk's next header then
/// fails, and the layer with it.
pub(crate) struct SparseData<'s, 'a> {
    stream: &'s mut Stream<'a>,
    blocks: &'s [(u64, u64)],
    next_block: usize,
    /// Where the last block taken ends in the file.
    end: u64,
    /// Zeros still to give before the current block's data.
    zeros: u64,
    /// The current block's data still to give.
    data: u64,
}

impl Read for SparseData<'_, '_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if buffer.is_empty() {
            return Ok(0);
        }
        loop {
            if self.zeros > 0 {
                let count = (buffer.len() as u64).min(self.zeros) as usize;
                buffer[..count].fill(0);
                self.zeros -= count as u64;
                return Ok(count);
            }
            if self.data > 0 {
                let count = (buffer.len() as u64).min(self.data) as usize;
                let read = self.stream.inner.read(&mut buffer[..count])?;
                if read == 0 {
                    // The stream ended inside the block: on to the next hole, as the tar crate's
                    // reader goes on.
                    self.data = 0;
                    continue;
                }
                self.stream.position += read as u64;
                self.data -= read as u64;
                return Ok(read);
            }
            let Some(&(offset, length)) = self.blocks.get(self.next_block) else {
                return Ok(0);
            };
            self.next_block += 1;
            // The map was checked in order and not overlapping when it was read.
            self.zeros = offset - self.end;
            self.data = length;
            self.end = offset + length;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Lender, NoLending, SharedReader};
    use rpull_image::pax_records;

    /// What one walk saw of an entry.
    #[derive(Debug, PartialEq, Eq)]
    struct Seen {
        header: Vec<u8>,
        path: Vec<u8>,
        link: Option<Vec<u8>>,
        size: u64,
        pax: Option<Vec<(Vec<u8>, Vec<u8>)>>,
        data: Vec<u8>,
    }

    /// The well-formed pax records, as (key, value).
    fn records(extensions: PaxExtensions<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
        extensions
            .filter_map(Result::ok)
            .map(|record| (record.key_bytes().to_vec(), record.value_bytes().to_vec()))
            .collect()
    }

    /// The entries of `layer` through the walk, read from buffers of `buffer` bytes; `Err` after
    /// the last entry when the walk ended in an error.
    fn walked(layer: &[u8], buffer: usize) -> (Vec<Seen>, Result<(), String>) {
        let mut source = NoLending(io::BufReader::with_capacity(buffer, layer));
        let mut walk = TarWalk::new(&mut source);
        let mut seen = Vec::new();
        loop {
            match walk.next_entry() {
                Ok(true) => {}
                Ok(false) => return (seen, Ok(())),
                Err(error) => return (seen, Err(error.to_string())),
            }
            let header = walk.header().as_bytes().to_vec();
            let path = walk.path_bytes().into_owned();
            let link = walk.link_name_bytes().map(Cow::into_owned);
            let size = walk.size();
            let kind = walk.header().entry_type();
            let pax = walk
                .pax_extensions()
                .filter(|_| !matches!(kind, EntryType::XHeader | EntryType::XGlobalHeader))
                .map(records);
            let mut data = Vec::new();
            let read = if walk.is_sparse() {
                walk.sparse_data().read_to_end(&mut data)
            } else {
                walk.file_data().read_to_end(&mut data)
            };
            if let Err(error) = read {
                return (seen, Err(error.to_string()));
            }
            seen.push(Seen {
                header,
                path,
                link,
                size,
                pax,
                data,
            });
        }
    }

    /// The entries of `layer` through the tar crate, as [`walked`].
    fn tar_crate(layer: &[u8]) -> (Vec<Seen>, Result<(), String>) {
        let mut archive = tar::Archive::new(layer);
        let mut seen = Vec::new();
        let entries = match archive.entries() {
            Ok(entries) => entries,
            Err(error) => return (seen, Err(error.to_string())),
        };
        for entry in entries {
            let mut entry = match entry {
                Ok(entry) => entry,
                Err(error) => return (seen, Err(error.to_string())),
            };
            let header = entry.header().as_bytes().to_vec();
            let path = entry.path_bytes().into_owned();
            let link = entry.link_name_bytes().map(Cow::into_owned);
            let size = entry.size();
            let kind = entry.header().entry_type();
            // The tar crate reads a pax header's own records as its extensions; the walk gives the
            // records that came before an entry.
            let pax = if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
                None
            } else {
                match entry.pax_extensions() {
                    Ok(extensions) => extensions.map(records),
                    Err(error) => return (seen, Err(error.to_string())),
                }
            };
            let mut data = Vec::new();
            if let Err(error) = entry.read_to_end(&mut data) {
                return (seen, Err(error.to_string()));
            }
            seen.push(Seen {
                header,
                path,
                link,
                size,
                pax,
                data,
            });
        }
        (seen, Ok(()))
    }

    /// The walk and the tar crate see the same entries of `layer`, and both end well or both fail
    /// (their messages may differ).
    fn assert_same(layer: &[u8], what: &str) {
        let (expected, expected_end) = tar_crate(layer);
        for buffer in [512 * 3 + 7, 64 * 1024] {
            let (seen, end) = walked(layer, buffer);
            assert_eq!(seen, expected, "{what}, buffers of {buffer}");
            assert_eq!(
                end.is_ok(),
                expected_end.is_ok(),
                "{what}, buffers of {buffer}: the walk {end:?}, the tar crate {expected_end:?}"
            );
        }
    }

    fn gnu_header(kind: EntryType, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(size);
        header.set_mode(0o644);
        header.set_uid(1000);
        header.set_gid(100);
        header.set_mtime(1_700_000_000);
        header
    }

    fn content(size: usize, seed: u8) -> Vec<u8> {
        (0..size).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// A raw block: a header with `set_cksum` already called, or any 512 bytes.
    fn push_block(layer: &mut Vec<u8>, block: &[u8]) {
        assert_eq!(block.len(), BLOCK);
        layer.extend_from_slice(block);
    }

    fn push_data(layer: &mut Vec<u8>, data: &[u8]) {
        layer.extend_from_slice(data);
        let padding = (BLOCK - data.len() % BLOCK) % BLOCK;
        layer.extend(std::iter::repeat_n(0, padding));
    }

    /// A layer with every kind of entry the walk reads, in both header formats, with pax and GNU
    /// extensions, a ustar prefix and a GNU sparse file with an extension block.
    fn rich_layer() -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = gnu_header(EntryType::Directory, 0);
        builder
            .append_data(&mut header, "dir/", io::empty())
            .unwrap();
        for (index, size) in [0usize, 1, 511, 512, 513, 5000, 9000]
            .into_iter()
            .enumerate()
        {
            let mut header = if index % 2 == 0 {
                gnu_header(EntryType::Regular, size as u64)
            } else {
                let mut header = tar::Header::new_ustar();
                header.set_size(size as u64);
                header.set_mode(0o755);
                header
            };
            let data = content(size, index as u8);
            builder
                .append_data(&mut header, format!("dir/f{index}"), &data[..])
                .unwrap();
        }
        // Long names and link names the GNU way (the builder writes `L` and `K` entries).
        let long = format!("dir/{}/{}", "a".repeat(120), "b".repeat(60));
        let mut header = gnu_header(EntryType::Regular, 3);
        builder
            .append_data(&mut header, &long, &b"abc"[..])
            .unwrap();
        let mut header = gnu_header(EntryType::Symlink, 0);
        builder
            .append_link(&mut header, "dir/link", format!("/{}", "t".repeat(150)))
            .unwrap();
        let mut header = gnu_header(EntryType::Link, 0);
        builder.append_link(&mut header, "dir/hard", &long).unwrap();
        let mut layer = builder.into_inner().unwrap();
        // Drop the builder's end-of-archive blocks and go on by hand.
        layer.truncate(layer.len() - 1024);

        // A ustar header whose path is in its prefix and name.
        let mut header = tar::Header::new_ustar();
        header
            .set_path(format!("{}/{}", "p".repeat(130), "n".repeat(40)))
            .unwrap();
        header.set_size(2);
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());
        push_data(&mut layer, b"pn");

        // Pax records for the next entry: path, uid, gid, mtime, an xattr, and a size
        // that overrides the header's.
        let records = pax_records(&[
            ("path", b"dir/pax-named".to_vec()),
            ("uid", b"5000000".to_vec()),
            ("gid", b"42".to_vec()),
            ("mtime", b"1700000000.5".to_vec()),
            ("SCHILY.xattr.user.key", b"value".to_vec()),
            ("size", b"700".to_vec()),
        ]);
        let mut header = tar::Header::new_ustar();
        header.set_path("PaxHeaders/x").unwrap();
        header.set_entry_type(EntryType::XHeader);
        header.set_size(records.len() as u64);
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());
        push_data(&mut layer, &records);
        let mut header = tar::Header::new_ustar();
        header.set_path("dir/short").unwrap();
        header.set_size(1); // overridden by the pax size
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());
        push_data(&mut layer, &content(700, 9));

        // A pax global header: returned as an entry, its records not applied.
        let records = pax_records(&[("comment", b"global".to_vec())]);
        let mut header = tar::Header::new_ustar();
        header.set_path("pax_global_header").unwrap();
        header.set_entry_type(EntryType::XGlobalHeader);
        header.set_size(records.len() as u64);
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());
        push_data(&mut layer, &records);

        // A GNU sparse file: 4 blocks in the header, 2 in an extension block, holes between them
        // and after them (the last block, of no data, at the file's size).
        let blocks: [(u64, u64); 6] = [
            (0, 512),
            (4096, 1024),
            (10_000, 512),
            (20_480, 100),
            (30_000, 0),
            (40_000, 0),
        ];
        let stored: u64 = 512 + 1024 + 512 + 100;
        let mut header = gnu_header(EntryType::GNUSparse, stored);
        header.set_path("dir/sparse").unwrap();
        let gnu = header.as_gnu_mut().unwrap();
        for (slot, (offset, length)) in gnu.sparse.iter_mut().zip(&blocks[..4]) {
            slot.set_offset(*offset);
            slot.set_length(*length);
        }
        gnu.set_real_size(40_000);
        gnu.set_is_extended(true);
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());
        let mut extension = GnuExtSparseHeader::new();
        for (slot, (offset, length)) in extension.sparse.iter_mut().zip(&blocks[4..]) {
            slot.set_offset(*offset);
            slot.set_length(*length);
        }
        push_block(&mut layer, extension.as_bytes());
        push_data(&mut layer, &content(stored as usize, 3));

        // A character device and a fifo.
        let mut header = tar::Header::new_ustar();
        header.set_path("dir/null").unwrap();
        header.set_entry_type(EntryType::Char);
        header.set_device_major(1).unwrap();
        header.set_device_minor(3).unwrap();
        header.set_size(0);
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());
        let mut header = gnu_header(EntryType::Fifo, 0);
        header.set_path("dir/fifo").unwrap();
        header.set_cksum();
        push_block(&mut layer, header.as_bytes());

        layer.extend_from_slice(&[0; 1024]);
        layer
    }

    #[test]
    fn the_walk_reads_what_the_tar_crate_reads() {
        let layer = rich_layer();
        let (seen, end) = walked(&layer, 4096);
        end.unwrap();
        assert_eq!(
            seen.len(),
            17,
            "{:?}",
            seen.iter()
                .map(|s| String::from_utf8_lossy(&s.path))
                .collect::<Vec<_>>()
        );
        let by_path = |path: &[u8]| seen.iter().find(|s| s.path == path).unwrap();
        // The pax records applied: path, size, uid (past what octal holds in 8 bytes), gid.
        let pax = by_path(b"dir/pax-named");
        assert_eq!(pax.size, 700);
        assert_eq!(pax.data, content(700, 9));
        let header = tar::Header::from_byte_slice(&pax.header);
        assert_eq!(header.uid().unwrap(), 5_000_000);
        assert_eq!(header.gid().unwrap(), 42);
        // The sparse file with its holes.
        let sparse = by_path(b"dir/sparse");
        assert_eq!(sparse.size, 40_000);
        let stored = content(2148, 3);
        let mut expected = vec![0u8; 40_000];
        expected[..512].copy_from_slice(&stored[..512]);
        expected[4096..5120].copy_from_slice(&stored[512..1536]);
        expected[10_000..10_512].copy_from_slice(&stored[1536..2048]);
        expected[20_480..20_580].copy_from_slice(&stored[2048..]);
        assert_eq!(sparse.data, expected);
        let prefixed = format!("{}/{}", "p".repeat(130), "n".repeat(40));
        assert_eq!(by_path(prefixed.as_bytes()).data, b"pn");
        assert_same(&layer, "the rich layer");
    }

    #[test]
    fn the_end_of_a_layer_is_read_as_the_tar_crate_reads_it() {
        let layer = rich_layer();
        let end = layer.len() - 1024;
        // No end-of-archive blocks; one block of zeros; data after the end.
        assert_same(&layer[..end], "no end blocks");
        assert_same(&layer[..end + 512], "one end block");
        let mut after = layer.clone();
        after.extend_from_slice(b"garbage after the end");
        assert_same(&after, "data after the end");
        // Cut anywhere: inside a header, inside data, inside an extension's records.
        for cut in (0..end).step_by(97) {
            assert_same(&layer[..cut], &format!("cut at {cut}"));
        }
        assert!(walked(&layer[..end - 1], 4096).1.is_err());
    }

    /// The bytes of a header the hostile test sets: the first and last of the name, every numeric
    /// field but the checksum, the type, the link name's first, the magic and version, the device
    /// numbers, the ustar prefix's first, and the GNU sparse map, real size and extension flag.
    const MUTATED: [std::ops::Range<usize>; 8] = [
        0..2,
        99..148,
        156..158,
        257..265,
        329..346,
        386..390,
        470..472,
        482..495,
    ];

    /// Hostile headers: the bytes of every header block of the rich layer that [`MUTATED`] names set
    /// to values that break its fields (NUL, space, a non-digit, the base-256 mark, a digit), one at a time, with
    /// the checksum made right again, so that the field itself is what is read.
    #[test]
    fn hostile_headers_are_read_as_the_tar_crate_reads_them() {
        let layer = rich_layer();
        let (seen, _) = walked(&layer, 4096);
        // The start of every header block (the entries' and the extension headers').
        let mut starts = Vec::new();
        let mut position = 0;
        while position + BLOCK <= layer.len() {
            let block = &layer[position..position + BLOCK];
            if block.iter().all(|byte| *byte == 0) {
                break;
            }
            starts.push(position);
            let header = tar::Header::from_byte_slice(block);
            let mut size = header.entry_size().unwrap();
            if header.entry_type() == EntryType::GNUSparse {
                size += BLOCK_SIZE; // its extension block
            }
            let pax_size = seen
                .iter()
                .find(|s| s.header[..100] == block[..100] && s.header[156] == block[156])
                .filter(|_| header.entry_type() != EntryType::GNUSparse)
                .map_or(size, |s| s.size.max(size));
            position += BLOCK + (pax_size as usize).div_ceil(BLOCK) * BLOCK;
        }
        assert!(starts.len() >= 18, "{}", starts.len());
        let mut cases = 0;
        for start in starts {
            for offset in MUTATED.iter().flat_map(|range| range.clone()) {
                let values: &[u8] = if offset == 156 {
                    b"LKxgS5120"
                } else {
                    &[0, b' ', b'9', 0x80, b'7']
                };
                for &value in values {
                    let mut mutated = layer.clone();
                    if mutated[start + offset] == value {
                        continue;
                    }
                    mutated[start + offset] = value;
                    let block: &mut [u8; BLOCK] =
                        (&mut mutated[start..start + BLOCK]).try_into().unwrap();
                    let mut header = Header::new_old();
                    header.as_mut_bytes().copy_from_slice(block);
                    header.set_cksum();
                    block.copy_from_slice(header.as_bytes());
                    assert_same(
                        &mutated,
                        &format!("byte {offset} of the header at {start} set to {value}"),
                    );
                    cases += 1;
                }
            }
        }
        assert!(cases > 5_000, "{cases}");
    }

    #[test]
    fn a_bad_checksum_and_repeated_extensions_are_errors() {
        let layer = rich_layer();
        let mut bad = layer.clone();
        bad[0] ^= 1;
        let (seen, end) = walked(&bad, 4096);
        assert!(seen.is_empty());
        assert_eq!(end.unwrap_err(), "archive header checksum mismatch");
        assert_same(&bad, "bad checksum");

        // Two pax headers, two long names, before one entry; extensions and then the end.
        let records = pax_records(&[("path", b"x".to_vec())]);
        let mut pax = tar::Header::new_ustar();
        pax.set_path("PaxHeaders/x").unwrap();
        pax.set_entry_type(EntryType::XHeader);
        pax.set_size(records.len() as u64);
        pax.set_cksum();
        let mut long = tar::Header::new_gnu();
        long.set_path("././@LongLink").unwrap();
        long.set_entry_type(EntryType::GNULongName);
        long.set_size(4);
        long.set_cksum();
        let mut file = tar::Header::new_ustar();
        file.set_path("file").unwrap();
        file.set_size(0);
        file.set_cksum();
        for (what, headers) in [
            (
                "two pax headers",
                vec![
                    (&pax, &records[..]),
                    (&pax, &records[..]),
                    (&file, &b""[..]),
                ],
            ),
            (
                "two long names",
                vec![
                    (&long, &b"abc\0"[..]),
                    (&long, &b"abc\0"[..]),
                    (&file, &b""[..]),
                ],
            ),
            ("a pax header at the end", vec![(&pax, &records[..])]),
            ("a long name at the end", vec![(&long, &b"abc\0"[..])]),
            (
                "a long name and a pax path",
                vec![
                    (&long, &b"abc\0"[..]),
                    (&pax, &records[..]),
                    (&file, &b""[..]),
                ],
            ),
        ] {
            let mut layer = Vec::new();
            for (header, data) in headers {
                push_block(&mut layer, header.as_bytes());
                push_data(&mut layer, data);
            }
            layer.extend_from_slice(&[0; 1024]);
            assert_same(&layer, what);
            let ok = what == "a long name and a pax path";
            assert_eq!(walked(&layer, 4096).1.is_ok(), ok, "{what}");
        }
    }

    #[test]
    fn an_extension_larger_than_the_limit_is_refused_before_it_is_read() {
        let mut long = tar::Header::new_gnu();
        long.set_path("././@LongLink").unwrap();
        long.set_entry_type(EntryType::GNULongName);
        long.set_size(MAX_EXTENSION + 1);
        long.set_cksum();
        let mut layer = Vec::new();
        push_block(&mut layer, long.as_bytes());
        // Less data than it claims: the refusal must not depend on reading it.
        layer.extend_from_slice(&[b'a'; 4096]);
        let (seen, end) = walked(&layer, 4096);
        assert!(seen.is_empty());
        let error = end.unwrap_err();
        assert!(
            error.contains("long name entry of 1048577 bytes"),
            "{error}"
        );
    }

    #[test]
    fn a_tar_walk_finds_every_header_after_file_data_read_or_skipped() {
        let mut builder = tar::Builder::new(Vec::new());
        let files: [(&str, usize); 4] = [("a", 3), ("b", 5000), ("c", 1), ("d", 70_000)];
        for (name, size) in files {
            let mut header = gnu_header(EntryType::Regular, size as u64);
            header.set_cksum();
            builder
                .append_data(&mut header, name, &content(size, name.as_bytes()[0])[..])
                .unwrap();
        }
        let bytes = builder.into_inner().unwrap();
        // A small buffer, so that data spans many `fill_buf`s.
        let mut inner = NoLending(io::BufReader::with_capacity(700, &bytes[..]));
        let mut walk = TarWalk::new(&mut inner);
        let mut seen = Vec::new();
        while walk.next_entry().unwrap() {
            let name = String::from_utf8(walk.path_bytes().into_owned()).unwrap();
            let size = files.iter().find(|(n, _)| *n == name).unwrap().1;
            match name.as_str() {
                // Not read: the walk skips it.
                "a" => {}
                // Read in part: the walk skips the rest.
                "d" => {
                    let mut data = walk.file_data();
                    let mut part = vec![0; 1000];
                    data.read_exact(&mut part).unwrap();
                    assert_eq!(part, content(size, b'd')[..1000]);
                }
                _ => {
                    let mut data = Vec::new();
                    walk.file_data().read_to_end(&mut data).unwrap();
                    assert_eq!(data, content(size, name.as_bytes()[0]), "{name}");
                }
            }
            seen.push(name);
        }
        assert_eq!(seen, ["a", "b", "c", "d"]);
        assert!(!walk.next_entry().unwrap(), "the end stays the end");
    }

    /// Files lent whole as views ([`FileSource::lend_rest`]) are consumed as a read would be: the
    /// walk finds every header after them, and the views hold the right bytes after the source has
    /// moved on. A file not within one buffer is not lent.
    #[test]
    fn lent_files_keep_the_walk_in_step_and_their_bytes() {
        let mut builder = tar::Builder::new(Vec::new());
        let sizes = [3usize, 5000, 1, 900, 70_000, 2000, 0, 4096];
        for (index, size) in sizes.iter().enumerate() {
            let mut header = gnu_header(EntryType::Regular, *size as u64);
            header.set_cksum();
            builder
                .append_data(
                    &mut header,
                    format!("f{index}"),
                    &content(*size, index as u8)[..],
                )
                .unwrap();
        }
        let bytes = builder.into_inner().unwrap();
        let mut inner = SharedReader::with_lender(&bytes[..], 8192, Lender::new(1 << 20));
        let mut walk = TarWalk::new(&mut inner);
        let mut lent = Vec::new();
        let mut walked = 0;
        while walk.next_entry().unwrap() {
            let index = walked;
            let mut data = walk.file_data();
            match data.lend_rest() {
                Some(view) => lent.push((index, view)),
                None => {
                    let mut content = Vec::new();
                    data.read_to_end(&mut content).unwrap();
                    assert_eq!(content.len(), sizes[index]);
                }
            }
            walked += 1;
        }
        assert_eq!(walked, sizes.len());
        // The 70,000-byte file spans buffers of 8 KiB, and the empty one has nothing to lend.
        assert!(
            lent.iter()
                .all(|(index, _)| sizes[*index] != 70_000 && sizes[*index] != 0)
        );
        assert!(
            lent.len() >= 4,
            "lent: {:?}",
            lent.iter().map(|l| l.0).collect::<Vec<_>>()
        );
        for (index, view) in lent {
            assert_eq!(
                &view[..],
                &content(sizes[index], index as u8)[..],
                "file {index}"
            );
        }
    }
}
