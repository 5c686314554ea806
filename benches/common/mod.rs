//! Shared by every criterion bench: a seeded generator of layer-like content, tar builders,
//! scratch directories on tmpfs and on disk, and the quick/full settings.
//!
//! Every input is generated at setup from a fixed seed, so two runs measure the same bytes.

// Each bench binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkGroup, SamplingMode, measurement::WallTime};

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * 1024;

/// `RPULL_BENCH_FULL=1` turns on the big variants (1 GiB files and the like).
pub fn full() -> bool {
    std::env::var("RPULL_BENCH_FULL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Short defaults so `cargo bench` finishes in minutes on 2 cores: 10 samples of one iteration
/// each (`Flat`: every iteration here takes tens of milliseconds to seconds, so criterion's linear
/// sampling would ask for 55 of them), a 1 s warm-up and a few seconds of measurement.
pub fn quick(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(if full() { 20 } else { 4 }));
}

/// SplitMix64: tiny, fast and good enough for generating content; no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Skewed towards 0 (roughly 1/x): word frequencies, opcode frequencies.
    pub fn skewed(&mut self, n: u64) -> u64 {
        let m = self.below(n) + 1;
        self.below(m)
    }
}

/// Content that compresses like a real image layer (gzip -6 about 3.7x, zstd -3 3.3x; the
/// realistic image of BASELINE.md is 4.1x):
/// files are source-like text, machine-code-like binary, or already-compressed bytes.
#[derive(Debug)]
pub struct Content {
    rng: Rng,
    words: Vec<Vec<u8>>,
}

/// x86-64 code is dominated by a few opcode and ModRM bytes; this list gives the binary kind a
/// similar skew.
const OPCODES: &[u8] = &[
    0x48, 0x89, 0x8b, 0x0f, 0xe8, 0xff, 0x85, 0x74, 0x75, 0x83, 0xc3, 0x31, 0x45, 0x4c, 0x24, 0x44,
    0x41, 0xc7, 0x8d, 0x01, 0xeb, 0x39, 0x84, 0xc0, 0x5d, 0x55, 0x90, 0x66,
];

impl Content {
    pub fn new(seed: u64) -> Content {
        let mut rng = Rng::new(seed);
        // 300 made-up words of 2-11 letters; picked with a skew, so some are very common.
        let words = (0..300)
            .map(|_| {
                let len = 2 + rng.skewed(10) as usize;
                (0..len).map(|_| b'a' + rng.below(26) as u8).collect()
            })
            .collect();
        Content { rng, words }
    }

    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// One file's bytes: 60% text, 35% binary, 5% incompressible, as a distribution image
    /// with its libraries, scripts and a few compressed assets.
    pub fn file(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        match self.rng.below(100) {
            0..60 => self.text(&mut out, len),
            60..95 => self.binary(&mut out, len),
            _ => self.random(&mut out, len),
        }
        out
    }

    /// `len` bytes made of the three kinds in 64 KiB stretches (one huge file, a payload).
    pub fn mixed(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let piece = (len - out.len()).min(64 * KIB);
            let file = self.file(piece);
            out.extend_from_slice(&file);
        }
        out
    }

    fn text(&mut self, out: &mut Vec<u8>, len: usize) {
        const PUNCT: &[u8] = b"  ,.;:(){}=_-/\"'";
        let mut indent = 0usize;
        while out.len() < len {
            // a line like one just above (code and config repeat themselves)
            if out.len() > 256 && self.rng.below(5) < 2 {
                let back = 64 + self.rng.below((out.len() - 64).min(4 * KIB) as u64) as usize;
                let n = (16 + self.rng.below(64) as usize).min(back);
                let from = out.len() - back;
                out.extend_from_within(from..from + n);
                out.push(b'\n');
                continue;
            }
            out.extend(std::iter::repeat_n(b' ', indent));
            let words = 1 + self.rng.below(12);
            for _ in 0..words {
                let i = self.rng.skewed(self.words.len() as u64) as usize;
                out.extend_from_slice(&self.words[i]);
                out.push(PUNCT[self.rng.skewed(PUNCT.len() as u64) as usize]);
            }
            out.push(b'\n');
            indent = (self.rng.below(5) * 4) as usize;
        }
        out.truncate(len);
    }

    fn binary(&mut self, out: &mut Vec<u8>, len: usize) {
        while out.len() < len {
            match self.rng.below(16) {
                // a repeat of something in the last 8 KiB (code is locally repetitive; a
                // repeat from anywhere would be out of gzip's 32 KiB window)
                0..4 if out.len() > 64 => {
                    let n = 4 + self.rng.below(28) as usize;
                    let back = 32 + self.rng.below((out.len() - 32).min(8 * KIB) as u64) as usize;
                    let from = out.len() - back;
                    out.extend_from_within(from..from + n);
                }
                // padding and small immediates
                4..9 => out.extend(std::iter::repeat_n(0, 1 + self.rng.skewed(8) as usize)),
                9..15 => out.push(OPCODES[self.rng.skewed(OPCODES.len() as u64) as usize]),
                _ => out.push(self.rng.next_u64() as u8),
            }
        }
        out.truncate(len);
    }

    fn random(&mut self, out: &mut Vec<u8>, len: usize) {
        while out.len() < len {
            out.extend_from_slice(&self.rng.next_u64().to_le_bytes());
        }
        out.truncate(len);
    }
}

fn header(path: &str, size: u64, kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_path(path).expect("a short path");
    header.set_cksum();
    header
}

/// A tar of `files` regular files of 0..=`max_size` bytes (uniform) spread over directories of
/// 100 files each, like `/usr/share` or a `site-packages`.
pub fn small_files_tar(seed: u64, files: usize, max_size: usize) -> Vec<u8> {
    let mut content = Content::new(seed);
    let mut builder = tar::Builder::new(Vec::new());
    for i in 0..files {
        if i % 100 == 0 {
            let dir = format!("usr/share/pkg{:04}/", i / 100);
            let h = header(&dir, 0, tar::EntryType::Directory, 0o755);
            builder.append(&h, std::io::empty()).expect("tar in memory");
        }
        let size = content.rng().below(max_size as u64 + 1) as usize;
        let data = content.file(size);
        let path = format!("usr/share/pkg{:04}/file{i:06}", i / 100);
        let h = header(&path, size as u64, tar::EntryType::Regular, 0o644);
        builder.append(&h, &data[..]).expect("tar in memory");
    }
    builder.into_inner().expect("tar in memory")
}

/// A tar of one `size`-byte file. The content is a 16 MiB generated block repeated: for
/// extraction and writing only the byte count matters, and it keeps setup short.
pub fn one_file_tar(seed: u64, size: usize) -> Vec<u8> {
    let block = Content::new(seed).mixed(16 * MIB);
    let mut builder = tar::Builder::new(Vec::with_capacity(size + 4 * KIB));
    let h = header(
        "opt/model/weights.bin",
        size as u64,
        tar::EntryType::Regular,
        0o644,
    );
    let reader = std::io::Read::take(
        Cycle {
            block: &block,
            pos: 0,
        },
        size as u64,
    );
    builder.append(&h, reader).expect("tar in memory");
    builder.into_inner().expect("tar in memory")
}

/// A tar whose files have log-uniform sizes from 0 to 1 MiB, about `total` bytes in all; the
/// content is generated throughout (no repetition a compressor could exploit).
pub fn layer_tar(seed: u64, total: usize) -> Vec<u8> {
    let mut content = Content::new(seed);
    let mut builder = tar::Builder::new(Vec::with_capacity(total + total / 50));
    let mut written = 0usize;
    let mut i = 0usize;
    while written < total {
        let bits = content.rng().below(21) as u32; // up to 1 MiB
        let size = content.rng().below(1u64 << bits) as usize;
        let data = content.file(size);
        let path = format!("usr/lib/pkg{:03}/file{i:05}", i / 64);
        let h = header(&path, size as u64, tar::EntryType::Regular, 0o644);
        builder.append(&h, &data[..]).expect("tar in memory");
        written += 512 + size.div_ceil(512) * 512;
        i += 1;
    }
    builder.into_inner().expect("tar in memory")
}

/// An endless reader cycling through `block`.
struct Cycle<'a> {
    block: &'a [u8],
    pos: usize,
}

impl std::io::Read for Cycle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.block.len() - self.pos);
        buf[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos = (self.pos + n) % self.block.len();
        Ok(n)
    }
}

/// Where the outputs go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    /// `/dev/shm`
    Tmpfs,
    /// `/var/tmp` (the root filesystem: ext4 on virtio-blk on the project VM)
    Disk,
}

impl Fs {
    pub const ALL: [Fs; 2] = [Fs::Tmpfs, Fs::Disk];

    pub fn name(self) -> &'static str {
        match self {
            Fs::Tmpfs => "tmpfs",
            Fs::Disk => "disk",
        }
    }

    fn parent(self) -> &'static Path {
        Path::new(match self {
            Fs::Tmpfs => "/dev/shm",
            Fs::Disk => "/var/tmp",
        })
    }
}

/// A directory on `fs`, removed on drop; hands out fresh, not yet existing paths.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    fs: Fs,
    next: usize,
}

const TMPFS_MAGIC: u64 = 0x0102_1994;

impl Scratch {
    /// `None` (with a note on stderr) when the place is missing or is not what its name says.
    pub fn new(fs: Fs) -> Option<Scratch> {
        let parent = fs.parent();
        let dir = match tempfile::Builder::new()
            .prefix("rpull-criterion-")
            .tempdir_in(parent)
        {
            Ok(dir) => dir,
            Err(e) => {
                eprintln!("note: skipping {}: {}: {e}", fs.name(), parent.display());
                return None;
            }
        };
        let magic = rustix::fs::statfs(dir.path()).map(|s| s.f_type as u64).ok();
        let is_tmpfs = magic == Some(TMPFS_MAGIC);
        if is_tmpfs != (fs == Fs::Tmpfs) {
            eprintln!(
                "note: skipping {}: {} is {}a tmpfs",
                fs.name(),
                parent.display(),
                if is_tmpfs { "" } else { "not " }
            );
            return None;
        }
        Some(Scratch { dir, fs, next: 0 })
    }

    /// A path inside the scratch directory that does not exist yet.
    pub fn fresh(&mut self) -> PathBuf {
        self.next += 1;
        self.dir.path().join(format!("run-{}", self.next))
    }

    /// Called outside timing after each iteration: removes `path` (a file or a tree) and, on disk,
    /// writes everything back (`sync`), so that the next iteration does not pay for this one's
    /// writeback.
    pub fn discard(&self, path: &Path) {
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
        removed.unwrap_or_else(|e| panic!("removing {}: {e}", path.display()));
        if self.fs == Fs::Disk {
            rustix::fs::sync();
        }
    }

    /// As [`discard`](Self::discard) on tmpfs; on disk the tree is written back (`sync`) but left
    /// until the scratch directory is dropped. On the project VM (ext4 mounted `discard`),
    /// extracting many files right after a big delete is 5-20x slower (BASELINE.md): deleting
    /// between iterations measured the delete's aftermath, not the extraction (11-19 s instead of
    /// ~1 s for 20k files).
    pub fn discard_later(&self, path: &Path) {
        if self.fs == Fs::Disk {
            rustix::fs::sync();
        } else {
            self.discard(path);
        }
    }
}

/// Prints, once per bench binary, the load the machine is under (it is shared with builds).
pub fn print_load(bench: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!(
        "{bench}: load average {load} on {} cores{}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if full() { ", RPULL_BENCH_FULL" } else { "" },
    );
}
