//! `CuttingRelay`: a TCP relay on loopback in front of a registry that breaks connections
//! mid-response, to test how a client resumes. It records the `Range` of every request it
//! forwards.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;

use crate::http::Server;

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    cut_after: u64,
    cuts_left: AtomicUsize,
    ranges: Mutex<Vec<(u64, u64)>>,
}

/// A running relay: connect to `addr()` instead of the registry. The first `cuts` connections are
/// closed (both ways) once `cut_after` bytes of responses have passed through them; later ones
/// relay whole.
#[derive(Debug)]
pub struct CuttingRelay {
    shared: Arc<Shared>,
    server: Server,
}

impl CuttingRelay {
    pub fn start(upstream: SocketAddr, cut_after: u64, cuts: usize) -> Result<CuttingRelay> {
        let shared = Arc::new(Shared {
            upstream,
            cut_after,
            cuts_left: AtomicUsize::new(cuts),
            ranges: Mutex::new(Vec::new()),
        });
        let handler_shared = Arc::clone(&shared);
        let server = Server::start("cutting-relay", move |client| {
            let _ = relay(&handler_shared, client);
        })?;
        Ok(CuttingRelay { shared, server })
    }

    /// `127.0.0.1:PORT`, for a reference (`127.0.0.1:PORT/repo:tag`).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The byte ranges asked for (`Range: bytes=FIRST-LAST` as `FIRST..LAST + 1`), in the order
    /// the requests arrived.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.shared
            .ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Connections still to be cut.
    pub fn cuts_left(&self) -> usize {
        self.shared.cuts_left.load(Ordering::SeqCst)
    }
}

fn relay(shared: &Shared, client: TcpStream) -> io::Result<()> {
    let upstream = TcpStream::connect(shared.upstream)?;
    let cut = shared
        .cuts_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok();
    let (mut client_reader, mut upstream_writer) = (client.try_clone()?, upstream.try_clone()?);
    std::thread::scope(|scope| {
        let requests = scope.spawn(move || {
            // Requests go up whole; their Range headers are noted on the way.
            let mut buffer = [0u8; 16 * 1024];
            let mut text = Vec::new();
            loop {
                let n = match client_reader.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                text.extend_from_slice(&buffer[..n]);
                while let Some(end) = text.windows(2).position(|w| w == b"\r\n") {
                    let line: Vec<u8> = text.drain(..end + 2).collect();
                    if let Some(range) = parse_range(&String::from_utf8_lossy(&line)) {
                        shared
                            .ranges
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(range);
                    }
                }
                if upstream_writer.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            let _ = upstream_writer.shutdown(Shutdown::Write);
        });
        let (mut upstream_reader, mut client_writer) = (upstream.try_clone()?, client.try_clone()?);
        let limit = if cut { shared.cut_after } else { u64::MAX };
        let _ = io::copy(&mut (&mut upstream_reader).take(limit), &mut client_writer);
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
        let _ = requests.join();
        Ok(())
    })
}

/// `Range: bytes=FIRST-LAST` (any case) as `(FIRST, LAST + 1)`.
fn parse_range(line: &str) -> Option<(u64, u64)> {
    let (name, value) = line.trim_end().split_once(':')?;
    if !name.trim().eq_ignore_ascii_case("range") {
        return None;
    }
    let (first, last) = value.trim().strip_prefix("bytes=")?.split_once('-')?;
    Some((first.parse().ok()?, last.parse::<u64>().ok()? + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_headers_parse() {
        assert_eq!(parse_range("Range: bytes=0-99\r\n"), Some((0, 100)));
        assert_eq!(parse_range("range: bytes=5-5\r\n"), Some((5, 6)));
        assert_eq!(parse_range("Accept: */*\r\n"), None);
        assert_eq!(parse_range("Range: bytes=5-\r\n"), None);
    }
}
