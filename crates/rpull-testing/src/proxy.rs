//! `TestProxy`: a forward HTTP proxy on loopback that counts what passes through it: absolute-URI
//! requests (`GET http://host/path`) are forwarded, `CONNECT host:port` is tunnelled.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};

use anyhow::Result;

use crate::http::{RequestHead, Server, read_request_head, write_response};

#[derive(Debug, Default)]
struct ProxyLog {
    requests: Vec<String>,
}

/// A running proxy. Point `HTTP_PROXY` / `HTTPS_PROXY` (or a client's proxy setting) at `url()`.
#[derive(Debug)]
pub struct TestProxy {
    log: Arc<Mutex<ProxyLog>>,
    server: Server,
}

impl TestProxy {
    pub fn start() -> Result<TestProxy> {
        let log = Arc::new(Mutex::new(ProxyLog::default()));
        let handler_log = Arc::clone(&log);
        let server = Server::start("test-proxy", move |stream| {
            let _ = handle(&handler_log, stream);
        })?;
        Ok(TestProxy { log, server })
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// Requests seen (each forwarded request and each CONNECT counts once).
    pub fn requests(&self) -> usize {
        self.lock().requests.len()
    }

    /// `"METHOD target"` for each request, in arrival order, e.g.
    /// `"GET http://127.0.0.1:5000/v2/"` or `"CONNECT 127.0.0.1:5001"`.
    pub fn request_log(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    pub fn reset(&self) {
        self.lock().requests.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProxyLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn handle(log: &Mutex<ProxyLog>, client: TcpStream) -> io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let Some(head) = read_request_head(&mut reader)? else {
        return Ok(());
    };
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .requests
        .push(format!("{} {}", head.method, head.target));
    let mut client_writer = client.try_clone()?;
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let Ok(upstream) = TcpStream::connect(head.target.as_str()) else {
            return write_response(
                &mut client_writer,
                "502 Bad Gateway",
                &[],
                "text/plain",
                b"connect failed",
            );
        };
        client_writer.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")?;
        return relay(reader, client, upstream, Vec::new());
    }
    let Some((authority, origin_form)) = split_absolute(&head.target) else {
        return write_response(
            &mut client_writer,
            "400 Bad Request",
            &[],
            "text/plain",
            b"absolute URI required",
        );
    };
    let Ok(upstream) = TcpStream::connect(authority.as_str()) else {
        return write_response(
            &mut client_writer,
            "502 Bad Gateway",
            &[],
            "text/plain",
            b"connect failed",
        );
    };
    relay(
        reader,
        client,
        upstream,
        forwarded_head(&head, &origin_form),
    )
}

/// `http://host:port/path?q` -> (`host:port`, `/path?q`); port 80 when absent.
fn split_absolute(target: &str) -> Option<(String, String)> {
    let url = url::Url::parse(target).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let mut origin = url.path().to_owned();
    if let Some(query) = url.query() {
        origin.push('?');
        origin.push_str(query);
    }
    Some((format!("{host}:{port}"), origin))
}

/// The request head for the origin server: origin-form target, hop-by-hop headers dropped, and
/// `Connection: close` so one upstream connection carries exactly this exchange.
fn forwarded_head(head: &RequestHead, origin_form: &str) -> Vec<u8> {
    let mut out = format!("{} {origin_form} HTTP/1.1\r\n", head.method);
    for (key, value) in &head.headers {
        let hop_by_hop = [
            "connection",
            "proxy-connection",
            "keep-alive",
            "proxy-authorization",
        ]
        .iter()
        .any(|h| key.eq_ignore_ascii_case(h));
        if !hop_by_hop {
            out.push_str(&format!("{key}: {value}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

/// Sends `prefix` upstream, then copies both ways until the upstream side finishes.
fn relay(
    mut client_reader: BufReader<TcpStream>,
    client: TcpStream,
    upstream: TcpStream,
    prefix: Vec<u8>,
) -> io::Result<()> {
    let mut upstream_writer = upstream.try_clone()?;
    upstream_writer.write_all(&prefix)?;
    let to_upstream = std::thread::spawn(move || {
        // Anything the client already sent that sits in the buffer goes first.
        let buffered = client_reader.buffer().to_vec();
        let consumed = buffered.len();
        let _ = upstream_writer.write_all(&buffered);
        client_reader.consume(consumed);
        let _ = io::copy(&mut client_reader, &mut upstream_writer);
        let _ = upstream_writer.shutdown(Shutdown::Write);
    });
    let mut upstream_reader = upstream.try_clone()?;
    let mut client_writer = client.try_clone()?;
    let _ = io::copy(&mut upstream_reader, &mut client_writer);
    let _ = client.shutdown(Shutdown::Both);
    let _ = upstream.shutdown(Shutdown::Both);
    let _ = to_upstream.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_targets_split() {
        let cases = [
            (
                "http://127.0.0.1:5000/v2/",
                Some(("127.0.0.1:5000", "/v2/")),
            ),
            (
                "http://example.invalid/a?b=c",
                Some(("example.invalid:80", "/a?b=c")),
            ),
            ("/v2/", None),
        ];
        for (target, expected) in cases {
            let expected = expected.map(|(a, o)| (a.to_owned(), o.to_owned()));
            assert_eq!(split_absolute(target), expected, "{target}");
        }
    }
}
