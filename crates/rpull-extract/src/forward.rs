//! [`TarSource`]: the layer tar as the tar crate reads it, and as the extractor reads a regular
//! file's data past the tar crate, straight from the caller's buffers.
//!
//! Two copies are avoided this way:
//!
//! * **File data.** Read through the tar crate's entry reader, every byte of a file is copied out
//!   of the source's buffer into a buffer of the backend before it is written. Through
//!   [`TarSource::file_data`], a backend gets a [`BufRead`] and writes from the source's own buffer
//!   (for the pipeline, the decoded buffers of the decompression thread).
//! * **Skips.** Without a `Seek` reader, the tar crate skips the padding after every entry (and any
//!   data left unread) through a 32 KiB stack buffer that it zeroes on every call, even for a skip
//!   of 0 or of a few hundred bytes: once per entry, 4.9 GB of `memset` for a layer of 150,000
//!   small files (2-3% of that extraction's CPU). Here a skip consumes the source's buffer
//!   without copying it.
//!
//! The tar crate finds each header by its own count of the bytes it has read
//! ([`tar::Archive::entries_with_seek`]: before every header it seeks `Current(next - pos)`). The
//! bytes a backend consumes past it are counted here as *hidden*, and that seek is taken from the
//! position the tar crate believes it is at, so the next header is found where it is.

use std::cell::{RefCell, RefMut};
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::rc::Rc;

use bytes::Bytes;

use crate::backend::FileSource;
use crate::source::LayerSource;

/// The stream and its counts, shared by the tar crate's reader and [`FileData`].
struct Stream<'a> {
    inner: &'a mut dyn LayerSource,
    /// Bytes consumed from the start.
    position: u64,
    /// Of those, bytes consumed by [`FileData`] since the tar crate last sought: the tar crate's
    /// own count of its position is `position - hidden`.
    hidden: u64,
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
}

/// The layer tar for [`tar::Archive`]: `Read` passed through, `Seek` only forward (or to the
/// current position) by consuming the bytes in between. Clones share the stream.
#[derive(Clone)]
pub(crate) struct TarSource<'a>(Rc<RefCell<Stream<'a>>>);

impl<'a> TarSource<'a> {
    pub(crate) fn new(inner: &'a mut dyn LayerSource) -> Self {
        Self(Rc::new(RefCell::new(Stream {
            inner,
            position: 0,
            hidden: 0,
        })))
    }

    /// The data of the entry whose data starts at `start` (`tar::Entry::raw_file_position`) and is
    /// `size` bytes long, read past the tar crate; `None` unless the stream is at `start` with
    /// nothing consumed past the tar crate (the entry's data not yet read at all). The tar crate
    /// must not read the entry once this has been asked for: its next seek skips what was read
    /// here, and it must be the next thing it does.
    pub(crate) fn file_data(&self, start: u64, size: u64) -> Option<FileData<'_, 'a>> {
        let stream = self.0.try_borrow_mut().ok()?;
        (stream.position == start && stream.hidden == 0).then_some(FileData {
            stream,
            remaining: size,
        })
    }
}

impl Read for TarSource<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let mut stream = self.0.borrow_mut();
        let read = stream.inner.read(buffer)?;
        stream.position += read as u64;
        Ok(read)
    }
}

impl Seek for TarSource<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let mut stream = self.0.borrow_mut();
        let target = match to {
            SeekFrom::Start(target) => Some(target),
            // From where the tar crate believes it is.
            SeekFrom::Current(delta) => (stream.position - stream.hidden).checked_add_signed(delta),
            SeekFrom::End(_) => None,
        };
        match target {
            Some(target) if target >= stream.position => {
                let count = target - stream.position;
                stream.skip(count)?;
                stream.hidden = 0;
                Ok(stream.position)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "a layer tar stream only moves forward (at byte {}, asked {to:?})",
                    stream.position
                ),
            )),
        }
    }

    fn stream_position(&mut self) -> io::Result<u64> {
        let stream = self.0.borrow();
        Ok(stream.position - stream.hidden)
    }
}

/// One entry's data, read past the tar crate ([`TarSource::file_data`]): at most its size, then
/// end of stream. As a [`BufRead`], its buffer is the source's own.
pub(crate) struct FileData<'s, 'a> {
    stream: RefMut<'s, Stream<'a>>,
    remaining: u64,
}

impl FileData<'_, '_> {
    /// The entry's bytes still to come, as a length.
    fn limit(&self) -> usize {
        self.remaining.min(usize::MAX as u64) as usize
    }

    fn advance(&mut self, count: usize) {
        self.stream.position += count as u64;
        self.stream.hidden += count as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| i as u8).collect()
    }

    #[test]
    fn reads_and_forward_seeks_keep_the_position() {
        let data = bytes(100_000);
        let mut inner = crate::source::NoLending(&data[..]);
        let mut reader = TarSource::new(&mut inner);
        let mut buffer = [0u8; 10];
        reader.read_exact(&mut buffer).unwrap();
        assert_eq!(reader.stream_position().unwrap(), 10);
        // The tar crate skips 0 bytes this way after an entry that ends on a block boundary.
        #[allow(clippy::seek_from_current)]
        let unmoved = reader.seek(SeekFrom::Current(0)).unwrap();
        assert_eq!(unmoved, 10);
        assert_eq!(reader.seek(SeekFrom::Current(70_000)).unwrap(), 70_010);
        reader.read_exact(&mut buffer[..1]).unwrap();
        assert_eq!(buffer[0], (70_010 % 256) as u8);
        assert_eq!(reader.seek(SeekFrom::Start(80_000)).unwrap(), 80_000);
        reader.read_exact(&mut buffer[..1]).unwrap();
        assert_eq!(buffer[0], (80_000 % 256) as u8);
    }

    #[test]
    fn backward_and_end_relative_seeks_are_refused() {
        let data = bytes(1000);
        let mut inner = crate::source::NoLending(&data[..]);
        let mut reader = TarSource::new(&mut inner);
        reader.seek(SeekFrom::Start(500)).unwrap();
        for to in [
            SeekFrom::Start(499),
            SeekFrom::Current(-1),
            SeekFrom::End(0),
        ] {
            let error = reader.seek(to).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::Unsupported, "{to:?}");
        }
        assert_eq!(reader.stream_position().unwrap(), 500);
    }

    #[test]
    fn a_skip_past_the_end_is_an_unexpected_eof() {
        let data = bytes(1000);
        let mut inner = crate::source::NoLending(&data[..]);
        let mut reader = TarSource::new(&mut inner);
        let error = reader.seek(SeekFrom::Current(1001)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn file_data_is_hidden_from_the_next_relative_seek() {
        let data = bytes(10_000);
        let mut inner = crate::source::NoLending(&data[..]);
        let mut reader = TarSource::new(&mut inner);
        reader.seek(SeekFrom::Start(512)).unwrap();
        assert!(
            reader.file_data(511, 10).is_none(),
            "not at the data's start"
        );
        {
            let mut file = reader.file_data(512, 1000).unwrap();
            // Only one reader past the tar crate at a time.
            assert!(reader.file_data(512 + 1000, 1).is_none());
            assert_eq!(file.fill_buf().unwrap().len(), 1000, "limited to the size");
            assert_eq!(file.fill_buf().unwrap()[0], (512 % 256) as u8);
            file.consume(600);
            let mut rest = Vec::new();
            file.read_to_end(&mut rest).unwrap();
            assert_eq!(rest, &data[1112..1512]);
            assert!(file.fill_buf().unwrap().is_empty());
        }
        // The tar crate still counts itself at 512: padding to 1536 is `Current(1024)`.
        assert_eq!(reader.stream_position().unwrap(), 512);
        assert!(
            reader.file_data(512, 1).is_none(),
            "data was consumed past the tar crate since its last seek"
        );
        assert_eq!(reader.seek(SeekFrom::Current(1024)).unwrap(), 1536);
        let mut byte = [0u8];
        reader.read_exact(&mut byte).unwrap();
        assert_eq!(byte[0], (1536 % 256) as u8);
    }

    #[test]
    fn a_tar_walk_finds_every_header_after_file_data_read_past_it() {
        let mut builder = tar::Builder::new(Vec::new());
        let files: [(&str, usize); 4] = [("a", 3), ("b", 5000), ("c", 1), ("d", 70_000)];
        for (name, size) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(size as u64);
            header.set_mode(0o644);
            header.set_cksum();
            let content: Vec<u8> = (0..size)
                .map(|i| (i % 251) as u8 ^ name.as_bytes()[0])
                .collect();
            builder
                .append_data(&mut header, name, &content[..])
                .unwrap();
        }
        let bytes = builder.into_inner().unwrap();
        // A small buffer, so that data spans many `fill_buf`s.
        let mut inner = crate::source::NoLending(io::BufReader::with_capacity(700, &bytes[..]));
        let source = TarSource::new(&mut inner);
        let mut archive = tar::Archive::new(source.clone());
        let mut seen = Vec::new();
        for entry in archive.entries_with_seek().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut content = Vec::new();
            match name.as_str() {
                // Skipped: the tar crate seeks past it.
                "a" => {}
                // Read through the tar crate.
                "c" => {
                    entry.read_to_end(&mut content).unwrap();
                }
                // Read past it.
                _ => {
                    let mut data = source
                        .file_data(entry.raw_file_position(), entry.size())
                        .unwrap();
                    data.read_to_end(&mut content).unwrap();
                }
            }
            if name != "a" {
                let size = files.iter().find(|(n, _)| *n == name).unwrap().1;
                let expected: Vec<u8> = (0..size)
                    .map(|i| (i % 251) as u8 ^ name.as_bytes()[0])
                    .collect();
                assert_eq!(content, expected, "{name}");
            }
            seen.push(name);
        }
        assert_eq!(seen, ["a", "b", "c", "d"]);
    }

    /// Files lent whole as views ([`FileSource::lend_rest`]) are consumed past the tar crate as
    /// a read would be: the walk finds every header after them, and the views hold the right
    /// bytes after the source has moved on. A file not within one buffer is not lent.
    #[test]
    fn lent_files_keep_the_walk_in_step_and_their_bytes() {
        let mut builder = tar::Builder::new(Vec::new());
        let sizes = [3usize, 5000, 1, 900, 70_000, 2000, 0, 4096];
        for (index, size) in sizes.iter().enumerate() {
            let mut header = tar::Header::new_gnu();
            header.set_size(*size as u64);
            header.set_mode(0o644);
            header.set_cksum();
            let content: Vec<u8> = (0..*size).map(|i| (i % 251) as u8 ^ index as u8).collect();
            builder
                .append_data(&mut header, format!("f{index}"), &content[..])
                .unwrap();
        }
        let bytes = builder.into_inner().unwrap();
        let mut inner = crate::source::SharedReader::with_lender(
            &bytes[..],
            8192,
            crate::source::Lender::new(1 << 20),
        );
        let source = TarSource::new(&mut inner);
        let mut archive = tar::Archive::new(source.clone());
        let mut lent = Vec::new();
        let mut walked = 0;
        for (index, entry) in archive.entries_with_seek().unwrap().enumerate() {
            let entry = entry.unwrap();
            let mut data = source
                .file_data(entry.raw_file_position(), entry.size())
                .unwrap();
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
            let expected: Vec<u8> = (0..sizes[index])
                .map(|i| (i % 251) as u8 ^ index as u8)
                .collect();
            assert_eq!(&view[..], &expected[..], "file {index}");
        }
    }
}
