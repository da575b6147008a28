//! Asking the host's resolvers, for sandboxes' queries and for the proxy's own lookups.
//!
//! Every query goes upstream under a fresh random id, from a fresh socket, and only a reply with
//! that id and the very same question is taken: a sandbox cannot choose the id an upstream
//! sees, and a forged reply has to guess both. The sandbox's own id is put back before the
//! reply goes to it.

use super::message;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

/// How long one upstream gets before the next is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Larger than any UDP DNS message (EDNS allows up to 65535 bytes).
pub const MAX_MESSAGE: usize = 65535;
/// How long the proxy trusts a lookup of its own.
const CACHE_FOR: Duration = Duration::from_secs(30);
const MAX_CACHED: usize = 4096;

pub struct Resolver {
    upstreams: Vec<SocketAddr>,
    cache: Mutex<HashMap<String, (Vec<Ipv4Addr>, Instant)>>,
}

impl Resolver {
    pub fn new(upstreams: Vec<SocketAddr>) -> Self {
        if upstreams.is_empty() {
            tracing::warn!("no upstream resolver: sandboxes' DNS queries will fail");
        }
        Resolver {
            upstreams,
            cache: Mutex::default(),
        }
    }

    /// Asks each upstream in turn; returns the first reply to `msg` (whose question section is
    /// `question`), carrying `msg`'s own id.
    pub async fn exchange(&self, msg: &[u8], question: &[u8]) -> Option<Vec<u8>> {
        let (theirs, ours) = (msg.get(..2)?, rand::random::<u16>());
        let mut sent = msg.to_vec();
        sent[..2].copy_from_slice(&ours.to_be_bytes());
        for upstream in &self.upstreams {
            if let Some(mut reply) = ask(*upstream, &sent, ours, question).await {
                reply[..2].copy_from_slice(theirs);
                return Some(reply);
            }
        }
        None
    }

    /// The IPv4 addresses of `name`, as the host's resolvers answer (briefly cached).
    pub async fn lookup(&self, name: &str) -> Vec<Ipv4Addr> {
        if let Some((addrs, until)) = self.cache().get(name) {
            if *until > Instant::now() {
                return addrs.clone();
            }
        }
        let Some(query) = message::a_query(name) else {
            return Vec::new();
        };
        let Some(parsed) = message::parse_query(&query) else {
            return Vec::new();
        };
        let addrs: Vec<Ipv4Addr> = match self.exchange(&query, parsed.question(&query)).await {
            Some(reply) => message::answer_addrs(&reply, 0)
                .unwrap_or_default()
                .into_iter()
                .map(|(ip, _)| ip)
                .collect(),
            None => Vec::new(),
        };
        let mut cache = self.cache();
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(name.to_owned(), (addrs.clone(), Instant::now() + CACHE_FOR));
        addrs
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Vec<Ipv4Addr>, Instant)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn ask(upstream: SocketAddr, msg: &[u8], id: u16, question: &[u8]) -> Option<Vec<u8>> {
    let bind: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(bind).await.ok()?;
    // `connect` makes the kernel drop datagrams from anyone but the upstream.
    socket.connect(upstream).await.ok()?;
    socket.send(msg).await.ok()?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    tokio::time::timeout(UPSTREAM_TIMEOUT, async {
        loop {
            let len = socket.recv(&mut buf).await.ok()?;
            if message::answers(&buf[..len], id, question) {
                buf.truncate(len);
                return Some(buf);
            }
        }
    })
    .await
    .ok()
    .flatten()
}
