//! The sandboxes' DNS: the firewall sends every sandbox's UDP port 53 traffic here.
//!
//! It is where domain rules meet names. A sandbox resolves public names only (see [`names`]).
//! One whose policy denies all traffic gets answers only for names its `allowOut` domains match,
//! so DNS cannot carry data out of a sandbox without internet. An answer pointing into a range
//! no sandbox may reach is refused. The addresses an answer gives for an allowed domain are
//! remembered for that sandbox: the domain proxy lets protocols that name nothing reach them.

pub mod message;
pub mod names;
pub mod resolver;

use crate::State;
use message::{RCODE_FORMERR, RCODE_REFUSED, RCODE_SERVFAIL};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// Queries answered at once for all sandboxes; beyond that (or beyond a sandbox's own share,
/// [`crate::sandboxes::DNS_PER_SANDBOX`]) new ones are dropped, and clients retry.
const MAX_IN_FLIGHT: usize = 512;

/// Answers sandboxes' queries for as long as netd runs.
pub async fn serve(socket: UdpSocket, state: Arc<State>) {
    let socket = Arc::new(socket);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut buf = vec![0u8; resolver::MAX_MESSAGE];
    loop {
        let (len, from) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!(error = %e, "sandbox DNS socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let IpAddr::V4(peer) = from.ip() else {
            continue;
        };
        let query = buf[..len].to_vec();
        let Some(sandbox) = state.sandboxes.get(peer) else {
            // Not a sandbox netd knows (yet, or any more): nothing resolves for it.
            let _ = socket.send_to(&refusal(&query, RCODE_REFUSED), from).await;
            continue;
        };
        let (Ok(global), Some(own)) = (in_flight.clone().try_acquire_owned(), sandbox.dns_permit())
        else {
            continue;
        };
        let (socket, state) = (socket.clone(), state.clone());
        tokio::spawn(async move {
            let reply = answer(&query, &sandbox, &state).await;
            let _ = socket.send_to(&reply, from).await;
            drop((global, own));
        });
    }
}

fn refusal(msg: &[u8], rcode: u8) -> Vec<u8> {
    message::error_reply(msg, message::parse_query(msg).as_ref(), rcode)
}

async fn answer(msg: &[u8], sandbox: &crate::sandboxes::Sandbox, state: &State) -> Vec<u8> {
    let Some(query) = message::parse_query(msg) else {
        return message::error_reply(msg, None, RCODE_FORMERR);
    };
    let policy = sandbox.egress();
    if !names::is_public(&query.name, &state.search) || !policy.resolves(&query.name) {
        return message::error_reply(msg, Some(&query), RCODE_REFUSED);
    }
    let Some(reply) = state.resolver.exchange(msg, query.question(msg)).await else {
        return message::error_reply(msg, Some(&query), RCODE_SERVFAIL);
    };
    let addrs = message::answer_addrs(&reply, query.id).unwrap_or_default();
    if addrs.iter().any(|(ip, _)| state.denied(*ip)) {
        // A public name that points inside (the host's LAN, a private range): refused, so that
        // no sandbox learns the host's network through DNS.
        return message::error_reply(msg, Some(&query), RCODE_REFUSED);
    }
    if policy.allows_domain(&query.name) {
        sandbox.learn(&addrs);
    }
    reply
}

/// Upstream resolvers named in a resolv.conf, as port-53 socket addresses, and its search
/// domains (`search` and `domain` lines).
pub fn read_resolv_conf(text: &str) -> (Vec<SocketAddr>, Vec<String>) {
    let (mut upstreams, mut search) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                let ip = words
                    .next()
                    .and_then(|w| w.split('%').next())
                    .and_then(|w| w.parse::<IpAddr>().ok());
                upstreams.extend(ip.map(|ip| SocketAddr::new(ip, 53)));
            }
            Some("search" | "domain") => {
                search.extend(words.map(|w| w.trim_end_matches('.').to_ascii_lowercase()))
            }
            _ => {}
        }
    }
    (upstreams, search)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nameservers_and_search_domains() {
        let conf = "# comment\nnameserver 10.255.255.53\nsearch Corp.Example. lab\n\
                    nameserver fe80::1%eth0\nnameserver bogus\ndomain x.example\n";
        let (upstreams, search) = read_resolv_conf(conf);
        assert_eq!(
            upstreams,
            [
                "10.255.255.53:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(search, ["corp.example", "lab", "x.example"]);
    }
}
