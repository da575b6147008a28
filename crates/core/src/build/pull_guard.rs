//! Where an image pull may connect. The server fetches from registries itself, so a name must
//! not make it reach what only it can reach: the registry, but also every address the registry
//! sends the client on to (a token `realm`, a blob redirect), goes through [`Guard`], a
//! CONNECT proxy on loopback that the pull's HTTP client is pointed at. It resolves each name
//! itself and connects only to addresses a sandbox could reach too ([`Reach`]), so neither a
//! redirect nor a name that resolves differently the second time gets past it.

use crate::egress::Ipv4Net;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";
const FORBIDDEN: &[u8] =
    b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
/// A request head longer than this is refused.
const MAX_HEAD: usize = 16 * 1024;

/// What a pull may reach: public addresses over TLS, and the registries the operator named
/// with `--insecure-registry` (which may be private and plain HTTP).
pub struct Reach {
    /// `host[:port]`s allowed over plain HTTP and at private addresses.
    pub insecure: Vec<String>,
    /// What no sandbox may reach: the platform's ranges and the host's own networks.
    pub unreachable: Vec<Ipv4Net>,
}

impl Reach {
    fn is_insecure(&self, host: &str, port: u16) -> bool {
        self.insecure
            .iter()
            .any(|entry| *entry == format!("{host}:{port}") || entry == host)
    }

    /// The addresses to connect to for `host:port`, or why not. `plain_http` is a request
    /// that is not tunnelled (so not TLS): only the operator's insecure registries get those.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        plain_http: bool,
    ) -> Result<Vec<SocketAddr>, String> {
        let insecure = self.is_insecure(host, port);
        if plain_http && !insecure {
            return Err(format!(
                "{host}:{port} over plain HTTP: only a registry named with --insecure-registry \
                 is reached without TLS"
            ));
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .collect();
        if !insecure {
            if let Some(private) = addrs.iter().find(|a| !self.is_public(a.ip())) {
                return Err(format!(
                    "{host} is at {}, a private address: the server's operator can allow it \
                     with --insecure-registry {host}:{port}",
                    private.ip()
                ));
            }
        }
        Ok(addrs)
    }

    /// Whether a sandbox could reach the address too: outside [`Reach::unreachable`], and
    /// for IPv6, not loopback, unspecified, multicast, unique-local or link-local.
    pub fn is_public(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => !self.unreachable.iter().any(|net| net.contains(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => self.is_public(IpAddr::V4(v4)),
                None => {
                    let first = v6.segments()[0];
                    !(v6.is_loopback()
                        || v6.is_unspecified()
                        || v6.is_multicast()
                        || (first & 0xfe00) == 0xfc00
                        || (first & 0xffc0) == 0xfe80)
                }
            },
        }
    }
}

/// One pull's proxy: listening on loopback until dropped, and remembering what it refused so
/// that the pull's error can say why.
pub struct Guard {
    addr: SocketAddr,
    refused: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Guard {
    pub async fn start(reach: Arc<Reach>) -> std::io::Result<Guard> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let refused = Arc::new(Mutex::new(Vec::new()));
        let seen = refused.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (reach, seen) = (reach.clone(), seen.clone());
                tokio::spawn(async move { relay(client, &reach, &seen).await });
            }
        });
        Ok(Guard {
            addr,
            refused,
            task,
        })
    }

    /// The proxy URL for the pull's HTTP client, for both `http` and `https` URLs.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it refused so far, oldest first.
    pub fn refused(&self) -> Vec<String> {
        self.refused.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one client connection: a `CONNECT host:port` tunnel, or one plain-HTTP request in
/// absolute form (`GET http://host:port/path`), which is forwarded with `Connection: close` so
/// that the next request, perhaps for another host, comes on a new connection.
async fn relay(mut client: TcpStream, reach: &Reach, refused: &Mutex<Vec<String>>) {
    let head = match read_head(&mut client).await {
        Ok(head) => head,
        Err(why) => {
            tracing::warn!(error = %why, "image pull proxy");
            return;
        }
    };
    let mut upstream = match connect_as_asked(&head, reach).await {
        Ok(upstream) => upstream,
        Err(why) => {
            // On record before the client hears: its pull's error names it.
            tracing::warn!(refused = %why, "image pull");
            if let Ok(mut seen) = refused.lock() {
                seen.push(why);
            }
            let _ = client.write_all(FORBIDDEN).await;
            return;
        }
    };
    let started = match upstream.forwarded {
        None => client.write_all(CONNECTED).await,
        Some(head) => upstream.stream.write_all(head.as_bytes()).await,
    };
    if started.is_ok() {
        // The far end closing mid-transfer is the pull's error to report, not a refusal.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream.stream).await;
    }
}

/// Where a request goes: the connection, and for a plain-HTTP request the head to send first.
struct Upstream {
    stream: TcpStream,
    forwarded: Option<String>,
}

/// Connects where the request asks, if [`Reach`] allows it.
async fn connect_as_asked(head: &str, reach: &Reach) -> Result<Upstream, String> {
    let request_line = head.lines().next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let tunnel = method == "CONNECT";
    let (authority, forwarded) = if tunnel {
        (target, None)
    } else {
        let rest = target
            .strip_prefix("http://")
            .ok_or_else(|| format!("not a proxy request: {request_line}"))?;
        let authority = rest.split('/').next().unwrap_or(rest);
        (authority, Some(close_after(head)))
    };
    let (host, port) = split_authority(authority, if tunnel { 443 } else { 80 })
        .ok_or_else(|| format!("not a host and port: {authority}"))?;
    let addrs = reach.resolve(&host, port, !tunnel).await?;
    Ok(Upstream {
        stream: connect(&addrs).await?,
        forwarded,
    })
}

/// The request head, through the blank line. Nothing past it is read: a tunnel's first bytes
/// come only after our answer, and a forwarded request's body follows in the relay.
async fn read_head(client: &mut TcpStream) -> Result<String, String> {
    let mut head = Vec::with_capacity(512);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err("a proxy request head over 16 KiB".into());
        }
        match client.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return Err("the client left before its request was complete".into()),
        }
    }
    String::from_utf8(head).map_err(|_| "a proxy request head that is not UTF-8".into())
}

/// The head with `Connection: close` in place of the client's own hop-by-hop headers.
fn close_after(head: &str) -> String {
    let mut out = String::with_capacity(head.len() + 20);
    for line in head.trim_end_matches("\r\n").split("\r\n") {
        let name = line.split(':').next().unwrap_or("").to_ascii_lowercase();
        if name != "connection" && name != "proxy-connection" && name != "keep-alive" {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// `host:port`, `[v6]:port` or a bare host (with `default_port`).
pub(super) fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None if !authority.is_empty() => Some((authority.to_owned(), default_port)),
        None => None,
    }
}

async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
            Err(_) => last = format!("connecting to {addr}: timed out"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(insecure: &[&str]) -> Reach {
        Reach {
            insecure: insecure.iter().map(|s| s.to_string()).collect(),
            unreachable: crate::egress::platform_deny()
                .chain(["203.0.113.0/24".parse().unwrap()])
                .collect(),
        }
    }

    #[test]
    fn only_public_addresses_are_public() {
        let reach = reach(&[]);
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            // The host's own network.
            "203.0.113.7",
        ] {
            assert!(!reach.is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "151.101.0.223", "2606:4700::1111"] {
            assert!(reach.is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn private_and_plain_http_need_the_operator() {
        let err = reach(&[])
            .resolve("127.0.0.1", 5000, false)
            .await
            .unwrap_err();
        assert!(err.contains("--insecure-registry 127.0.0.1:5000"), "{err}");
        let err = reach(&[]).resolve("1.1.1.1", 80, true).await.unwrap_err();
        assert!(err.contains("plain HTTP"), "{err}");
        let allowed = reach(&["127.0.0.1:5000"]);
        allowed.resolve("127.0.0.1", 5000, true).await.unwrap();
        // Another port of the same host is not the registry the operator named.
        assert!(allowed.resolve("127.0.0.1", 5001, false).await.is_err());
    }

    #[test]
    fn authorities_and_heads_are_read_as_proxies_send_them() {
        assert_eq!(split_authority("a.b:5000", 443), Some(("a.b".into(), 5000)));
        assert_eq!(split_authority("a.b", 80), Some(("a.b".into(), 80)));
        assert_eq!(split_authority("[::1]:8", 443), Some(("::1".into(), 8)));
        assert_eq!(split_authority("a.b:x", 443), None);
        assert_eq!(
            close_after("GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n"),
            "GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        );
    }
}
