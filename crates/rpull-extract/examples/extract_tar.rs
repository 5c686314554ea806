//! Extracts an uncompressed layer tar into an empty directory and reports the time taken:
//! `cargo run --release -p rpull-extract --example extract_tar -- LAYER.tar TARGET_DIR`.
//! A quick way to compare with `tar -xf LAYER.tar -C TARGET_DIR` on the same machine.

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut arguments = std::env::args_os().skip(1);
    let (Some(layer), Some(target)) = (arguments.next(), arguments.next()) else {
        return Err("usage: extract_tar LAYER.tar TARGET_DIR".into());
    };
    let options = rpull_extract::ExtractOptions::for_current_user();
    let started = Instant::now();
    let file = std::fs::File::open(&layer)?;
    let summary = rpull_extract::extract_layer(
        std::io::BufReader::with_capacity(1 << 20, file),
        target.as_ref(),
        &options,
    )?;
    rpull_extract::finalize_tree(target.as_ref(), std::slice::from_ref(&summary), &options)?;
    eprintln!(
        "{} entries, {} files, {} bytes in {:.3}s",
        summary.entries,
        summary.files,
        summary.bytes_written,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
