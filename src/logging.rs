use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// rpull's own crates. Without `-v` only their warnings are shown: a dependency's log line
/// (rustls logs "failed to verify TLS certificate" at error level) would only repeat, in other
/// words, the one error line rpull prints.
const CRATES: [&str; 4] = [
    "rpull",
    "rpull_registry",
    "rpull_extract",
    "rpull_decompress",
];

/// Logs go to stderr; stdout is for data (`--json`). `RUST_LOG` wins over `-v`.
pub fn init(verbose: u8) {
    let (others, ours) = match verbose {
        0 => (None, "warn"),
        1 => (Some("warn"), "debug"),
        _ => (Some("debug"), "trace"),
    };
    let default = others
        .into_iter()
        .map(str::to_owned)
        .chain(CRATES.iter().map(|name| format!("{name}={ours}")))
        .collect::<Vec<_>>()
        .join(",");
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: logs redirected to a file or a pipe stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
