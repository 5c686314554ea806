//! Extracts an uncompressed layer tar into an empty directory and reports the time taken, or
//! generates the benchmark layers of `docs/io-uring.md`:
//!
//! ```text
//! cargo run --release -p rpull-extract --example extract_tar -- LAYER.tar TARGET_DIR [std|uring|auto [WRITE_THREADS [direct]]]
//! cargo run --release -p rpull-extract --example extract_tar -- generate-small OUT.tar [FILES]
//! cargo run --release -p rpull-extract --example extract_tar -- generate-big OUT.tar [MIB]
//! ```
//!
//! A quick way to compare with `tar -xf LAYER.tar -C TARGET_DIR` on the same machine. The tar is
//! read through a `SharedReader` of [`rpull_extract::TAR_READ_BUFFER`] buffers, from which big
//! files' data is written and small files' data is lent to the write threads (as `rpull bench`'s
//! extract stage reads it; with `EXTRACT_TAR_COPY` set, a `BufReader`, whose small files are
//! copied into the write threads' batches); the time includes `finalize_tree`
//! (directory metadata). `direct` sets `ExtractOptions::direct_writes`, as a pull that syncs does
//! (big files on ext4 written with `O_DIRECT`).
//!
//! Without a backend argument the library's default is used (`Std`, as a pull): `auto` is
//! `IoBackendKind::Auto`, which takes io_uring wherever the kernel has it, and is not what a pull
//! chooses for a destination (a 150k-file layer into /dev/shm took 2.88 s with `auto` against
//! 0.80 s with `std 2`, one run each, session 54).

use std::io::Write;
use std::time::Instant;

use rpull_extract::IoBackendKind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    match arguments.first().map(String::as_str) {
        Some("generate-small") => {
            let files = arguments
                .get(2)
                .map_or(Ok(100_000), |count| count.parse())?;
            generate_small(arguments.get(1).ok_or("missing OUT.tar")?, files)
        }
        Some("generate-big") => {
            let mib = arguments.get(2).map_or(Ok(1024), |count| count.parse())?;
            generate_big(arguments.get(1).ok_or("missing OUT.tar")?, mib)
        }
        _ => extract(&arguments),
    }
}

fn extract(arguments: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let (Some(layer), Some(target)) = (arguments.first(), arguments.get(1)) else {
        return Err(
            "usage: extract_tar LAYER.tar TARGET_DIR [std|uring|auto [WRITE_THREADS [direct]]]"
                .into(),
        );
    };
    let backend = match arguments.get(2).map(String::as_str) {
        None => rpull_extract::ExtractOptions::for_current_user().backend,
        Some("std") => IoBackendKind::Std,
        Some("uring") => IoBackendKind::Uring,
        Some("auto") => IoBackendKind::Auto,
        Some(other) => return Err(format!("unknown backend {other}").into()),
    };
    let write_threads = match arguments.get(3) {
        Some(threads) => threads.parse()?,
        None => 0, // chosen per destination
    };
    let direct_writes = match arguments.get(4).map(String::as_str) {
        None => false,
        Some("direct") => true,
        Some(other) => return Err(format!("unknown option {other} (direct?)").into()),
    };
    let options = rpull_extract::ExtractOptions {
        backend,
        write_threads,
        direct_writes,
        ..rpull_extract::ExtractOptions::for_current_user()
    };
    let started = Instant::now();
    let file = std::fs::File::open(layer)?;
    let summary = if std::env::var_os("EXTRACT_TAR_COPY").is_some() {
        rpull_extract::extract_layer(
            std::io::BufReader::with_capacity(rpull_extract::TAR_READ_BUFFER, file),
            target.as_ref(),
            &options,
        )?
    } else {
        rpull_extract::extract_layer_from(
            &mut rpull_extract::SharedReader::new(file, rpull_extract::TAR_READ_BUFFER),
            target.as_ref(),
            &options,
        )?
    };
    rpull_extract::finalize_tree(target.as_ref(), std::slice::from_ref(&summary), &options)?;
    eprintln!(
        "{:?} x{}: {} entries, {} files, {} bytes in {:.3}s",
        backend.resolve().0,
        options.write_threads_for(target.as_ref()),
        summary.entries,
        summary.files,
        summary.bytes_written,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `files` files of 0-8 KiB (sizes spread evenly), 100 per directory, incompressible content,
/// mode 0644, owner 0:0, a fixed mtime: the shape of a Python or node_modules layer.
fn generate_small(out: &str, files: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(out)?));
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut data = vec![0u8; 8192];
    for index in 0..files {
        if index % 100 == 0 {
            let mut header = header(tar::EntryType::Directory, 0o755, 0);
            builder.append_data(
                &mut header,
                format!("d{:05}/", index / 100),
                std::io::empty(),
            )?;
        }
        let size = (index * 8193 / files.max(1)) % 8193;
        for byte in &mut data[..size] {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        let mut header = header(tar::EntryType::Regular, 0o644, size as u64);
        let name = format!("d{:05}/f{index:06}", index / 100);
        builder.append_data(&mut header, name, &data[..size])?;
    }
    builder.into_inner()?.flush()?;
    Ok(())
}

/// One file of `mib` MiB of incompressible content.
fn generate_big(out: &str, mib: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(out)?));
    let mut header = header(tar::EntryType::Regular, 0o644, mib << 20);
    let reader = Random {
        state: 0x2545_f491_4f6c_dd1d,
        remaining: mib << 20,
    };
    builder.append_data(&mut header, "big.bin", reader)?;
    builder.into_inner()?.flush()?;
    Ok(())
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(1_600_000_000);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// `remaining` pseudo-random bytes (xorshift), 8 at a time.
struct Random {
    state: u64,
    remaining: u64,
}

impl std::io::Read for Random {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let count = buffer.len().min(self.remaining as usize) & !7;
        for chunk in buffer[..count].chunks_exact_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            chunk.copy_from_slice(&self.state.to_le_bytes());
        }
        self.remaining -= count as u64;
        Ok(count)
    }
}
