//! A yardstick, not an extractor: the least a Rust program does to extract a `generate-small`
//! layer (directories and regular files only, GNU or ustar headers, names under 100 bytes), with
//! nothing of rpull and none of its checks: no confinement, no whiteouts, no checksums, no
//! owners. It reads the tar through recycled 256 KiB buffers as rpull's bench does, and makes each
//! file with `openat(O_CREAT|O_EXCL)`, `write`, `futimens` and `close`. It tells how much of
//! rpull's CPU per file is its own and how much two threads cost on a machine (docs/performance.md,
//! "What bounds each case", small files on tmpfs; session 55):
//!
//! ```text
//! cargo run --release -p rpull-extract --example minimal_extract -- LAYER.tar DIR MODE
//! ```
//!
//! DIR must exist and be empty. MODE:
//! - `one`: everything on one thread;
//! - `batch`: batches of 64 files to one write thread over a queue of 8, the reading thread
//!   writing a batch itself when the queue is full (rpull's split of the small files on 2 cores);
//! - `batch-by-dir`: the same with a batch per directory, so that the two threads seldom create
//!   files in the same directory at once;
//! - `fd`: the write thread creates each batch's files and later sets their times and closes
//!   them, while the reading thread writes their data (the data never crosses to the other core).
//!
//! Any other entry type, or a header it cannot read, stops it with a message.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Read;
use std::sync::mpsc::{TrySendError, channel, sync_channel};
use std::sync::{Arc, Mutex};

const CHUNK: usize = 256 * 1024;
const BATCH: usize = 64;

/// A read buffer, back to its pool when the last file lying in it is written.
struct Buffer {
    bytes: Vec<u8>,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        self.pool.lock().expect("pool").push(bytes);
    }
}

struct File {
    dir: i32,
    name: CString,
    mode: u32,
    mtime: i64,
    buffer: Arc<Buffer>,
    offset: usize,
    len: usize,
}

impl File {
    fn data(&self) -> &[u8] {
        &self.buffer.bytes[self.offset..self.offset + self.len]
    }

    fn create(&self) -> i32 {
        // SAFETY: a valid C string and a directory descriptor that lives to the end.
        let fd = unsafe {
            libc::openat(
                self.dir,
                self.name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                self.mode,
            )
        };
        assert!(fd >= 0, "creating {:?}", self.name);
        fd
    }

    fn write_data(&self, fd: i32) {
        let data = self.data();
        if !data.is_empty() {
            // SAFETY: a buffer that outlives the call.
            let written = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
            assert_eq!(written, data.len() as isize, "writing {:?}", self.name);
        }
    }

    fn write_whole(&self) {
        let fd = self.create();
        self.write_data(fd);
        finish(fd, self.mtime);
    }
}

fn finish(fd: i32, mtime: i64) {
    let time = libc::timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    // SAFETY: an open descriptor and two timespecs that outlive the call.
    unsafe {
        libc::futimens(fd, [time, time].as_ptr());
        libc::close(fd);
    }
}

fn octal(field: &[u8]) -> u64 {
    let end = field
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(field.len());
    let digits = field[..end].trim_ascii();
    digits.iter().fold(0, |value, digit| {
        assert!((b'0'..=b'7').contains(digit), "a numeric field {field:?}");
        value << 3 | u64::from(digit - b'0')
    })
}

/// The tar's buffers: `take(n)` gives `n` contiguous bytes, in the current buffer or, carrying
/// the rest over, in the next.
struct Reader {
    input: std::fs::File,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
    current: Arc<Buffer>,
    position: usize,
    end: usize,
}

impl Reader {
    fn take(&mut self, count: usize) -> Option<(Arc<Buffer>, usize)> {
        if self.end - self.position < count {
            let mut bytes = self.pool.lock().expect("pool").pop().unwrap_or_default();
            bytes.resize(CHUNK.max(count), 0);
            let rest = self.end - self.position;
            bytes[..rest].copy_from_slice(&self.current.bytes[self.position..self.end]);
            let mut filled = rest;
            while filled < count {
                match self
                    .input
                    .read(&mut bytes[filled..])
                    .expect("reading the tar")
                {
                    0 => return None,
                    read => filled += read,
                }
            }
            self.current = Arc::new(Buffer {
                bytes,
                pool: Arc::clone(&self.pool),
            });
            self.position = 0;
            self.end = filled;
        }
        self.position += count;
        Some((Arc::clone(&self.current), self.position - count))
    }
}

/// Reads the tar, makes its directories, and hands its files on in batches.
fn parse(tar: &str, root: &str, by_dir: bool, mut on_batch: impl FnMut(Vec<File>)) {
    let pool = Arc::new(Mutex::new(Vec::new()));
    let mut reader = Reader {
        input: std::fs::File::open(tar).expect("opening the tar"),
        current: Arc::new(Buffer {
            bytes: Vec::new(),
            pool: Arc::clone(&pool),
        }),
        pool,
        position: 0,
        end: 0,
    };
    let root_path = CString::new(root).expect("no NUL");
    // SAFETY: a valid C string.
    let root = unsafe {
        libc::open(
            root_path.as_ptr(),
            libc::O_DIRECTORY | libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    assert!(root >= 0, "opening {root_path:?}");
    let mut dirs: HashMap<Vec<u8>, i32> = HashMap::new();
    let mut batch: Vec<File> = Vec::with_capacity(BATCH);
    while let Some((block, at)) = reader.take(512) {
        let header = &block.bytes[at..at + 512];
        if header[0] == 0 {
            break;
        }
        let name_len = header[..100]
            .iter()
            .position(|byte| *byte == 0)
            .unwrap_or(100);
        let name = header[..name_len].to_vec();
        let size = octal(&header[124..136]) as usize;
        let mode = octal(&header[100..108]) as u32;
        let mtime = octal(&header[136..148]) as i64;
        let kind = header[156];
        drop(block);
        let padded = size.div_ceil(512) * 512;
        if kind == b'5' {
            let name = name.strip_suffix(b"/").unwrap_or(&name).to_vec();
            let path = CString::new(name.clone()).expect("no NUL");
            // SAFETY: a valid C string and the root's descriptor.
            let dir = unsafe {
                libc::mkdirat(root, path.as_ptr(), mode);
                libc::openat(
                    root,
                    path.as_ptr(),
                    libc::O_DIRECTORY | libc::O_PATH | libc::O_CLOEXEC,
                )
            };
            assert!(dir >= 0, "making {path:?}");
            dirs.insert(name, dir);
            if padded > 0 {
                reader.take(padded).expect("a directory's data");
            }
            continue;
        }
        assert!(
            kind == b'0' || kind == 0,
            "entry type {kind} of {:?}",
            String::from_utf8_lossy(&name)
        );
        let (buffer, offset) = if padded > 0 {
            reader.take(padded).expect("a file's data")
        } else {
            (Arc::clone(&reader.current), reader.position)
        };
        let (dir, base) = match name.iter().rposition(|byte| *byte == b'/') {
            Some(slash) => (dirs[&name[..slash]], &name[slash + 1..]),
            None => (root, &name[..]),
        };
        if by_dir && batch.first().is_some_and(|first| first.dir != dir) {
            on_batch(std::mem::take(&mut batch));
        }
        batch.push(File {
            dir,
            name: CString::new(base).expect("no NUL"),
            mode,
            mtime,
            buffer,
            offset,
            len: size,
        });
        if !by_dir && batch.len() == BATCH {
            on_batch(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)));
        }
    }
    if !batch.is_empty() {
        on_batch(batch);
    }
}

enum Work {
    Create(Vec<File>),
    Finish(Vec<(i32, i64)>),
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, tar, root, mode] = &args[..] else {
        panic!("usage: minimal_extract LAYER.tar DIR one|batch|batch-by-dir|fd");
    };
    match mode.as_str() {
        "one" => parse(tar, root, false, |batch| {
            batch.iter().for_each(File::write_whole)
        }),
        "batch" | "batch-by-dir" => {
            let (queue, batches) = sync_channel::<Vec<File>>(8);
            let writer = std::thread::spawn(move || {
                for batch in batches {
                    batch.iter().for_each(File::write_whole);
                }
            });
            parse(tar, root, mode == "batch-by-dir", |batch| {
                if let Err(TrySendError::Full(batch)) = queue.try_send(batch) {
                    batch.iter().for_each(File::write_whole);
                }
            });
            drop(queue);
            writer.join().expect("the write thread");
        }
        "fd" => {
            let (work, works) = channel::<Work>();
            let (created_tx, created) = channel::<(Vec<File>, Vec<i32>)>();
            let writer = std::thread::spawn(move || {
                for job in works {
                    match job {
                        Work::Create(batch) => {
                            let fds = batch.iter().map(File::create).collect();
                            created_tx.send((batch, fds)).expect("the reading thread");
                        }
                        Work::Finish(files) => {
                            files.into_iter().for_each(|(fd, mtime)| finish(fd, mtime))
                        }
                    }
                }
            });
            // One batch created ahead while the one before it is written.
            let write = |(batch, fds): (Vec<File>, Vec<i32>)| {
                let mut times = Vec::with_capacity(batch.len());
                for (file, fd) in batch.iter().zip(fds) {
                    file.write_data(fd);
                    times.push((fd, file.mtime));
                }
                work.send(Work::Finish(times)).expect("the write thread");
            };
            let mut ahead = 0;
            parse(tar, root, false, |batch| {
                work.send(Work::Create(batch)).expect("the write thread");
                ahead += 1;
                if ahead > 1 {
                    write(created.recv().expect("the write thread"));
                    ahead -= 1;
                }
            });
            for _ in 0..ahead {
                write(created.recv().expect("the write thread"));
            }
            drop(work);
            writer.join().expect("the write thread");
        }
        other => panic!("unknown mode {other}: one, batch, batch-by-dir or fd"),
    }
}
