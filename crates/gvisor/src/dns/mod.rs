//! The sandboxes' DNS: a forwarder on the host that the firewall sends every sandbox's UDP port
//! 53 traffic to (see [`crate::firewall`]).
//!
//! It is where domain rules take effect. A sandbox whose policy denies all traffic gets answers
//! only for names its `allowOut` domains match (everything else is refused, so DNS cannot carry
//! data out of a sandbox without internet), and the A records of every answer for an allowed
//! domain are added to the sandbox's allowed addresses, on any port, before the answer is passed
//! on. Queries go to the host's own resolvers (`/etc/resolv.conf`), which the sandboxes could
//! not reach themselves: private ranges are closed to them.

pub(crate) mod message;

use crate::firewall::{slot_of_peer, Firewall};
use message::{RCODE_FORMERR, RCODE_REFUSED, RCODE_SERVFAIL};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// Queries answered at once; beyond that new ones are dropped (clients retry), so a flood from
/// one sandbox costs bounded memory.
const MAX_IN_FLIGHT: usize = 256;
/// How long one upstream resolver gets before the next is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Larger than any UDP DNS message (EDNS allows up to 65535 bytes).
const MAX_MESSAGE: usize = 65535;
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Answers sandboxes' queries (arriving on [`crate::firewall::DNS_PORT`]) for the server's life.
pub(crate) async fn serve(socket: UdpSocket, firewall: Arc<Firewall>) {
    let socket = Arc::new(socket);
    let upstreams: Arc<[SocketAddr]> =
        upstreams(&std::fs::read_to_string(RESOLV_CONF).unwrap_or_default()).into();
    if upstreams.is_empty() {
        tracing::warn!("{RESOLV_CONF} names no nameserver: sandboxes' DNS queries will fail");
    }
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (len, from) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!(error = %e, "sandbox DNS socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slot_of_peer(from) else {
            continue;
        };
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            continue;
        };
        let query = buf[..len].to_vec();
        let (socket, firewall, upstreams) = (socket.clone(), firewall.clone(), upstreams.clone());
        tokio::spawn(async move {
            let reply = answer(&query, slot, &firewall, &upstreams).await;
            let _ = socket.send_to(&reply, from).await;
            drop(permit);
        });
    }
}

async fn answer(msg: &[u8], slot: u32, firewall: &Firewall, upstreams: &[SocketAddr]) -> Vec<u8> {
    let Some(query) = message::parse_query(msg) else {
        return message::error_reply(msg, None, RCODE_FORMERR);
    };
    let policy = firewall.policy(slot);
    if let Some(policy) = &policy {
        if !policy.resolves(&query.name) {
            return message::error_reply(msg, Some(&query), RCODE_REFUSED);
        }
    }
    let Some(reply) = forward(msg, query.id, upstreams).await else {
        return message::error_reply(msg, Some(&query), RCODE_SERVFAIL);
    };
    if let Some(policy) = &policy {
        if policy.allows_domain(&query.name) {
            let addrs = message::answer_addrs(&reply, query.id).unwrap_or_default();
            // The addresses must be open before the sandbox connects to them.
            if let Err(e) = firewall.learn(slot, &addrs).await {
                tracing::warn!(slot, name = %query.name, error = %e, "allowing a domain's addresses failed");
                return message::error_reply(msg, Some(&query), RCODE_SERVFAIL);
            }
        }
    }
    reply
}

/// Asks each upstream in turn; returns the first answer to this query's id.
async fn forward(msg: &[u8], id: u16, upstreams: &[SocketAddr]) -> Option<Vec<u8>> {
    for upstream in upstreams {
        let bind: SocketAddr = match upstream {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let Ok(socket) = UdpSocket::bind(bind).await else {
            continue;
        };
        // `connect` makes the kernel drop datagrams from anyone but the upstream.
        if socket.connect(upstream).await.is_err() || socket.send(msg).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; MAX_MESSAGE];
        let received = tokio::time::timeout(UPSTREAM_TIMEOUT, async {
            loop {
                let len = socket.recv(&mut buf).await.ok()?;
                if len >= 2 && buf[..2] == id.to_be_bytes() {
                    return Some(len);
                }
            }
        })
        .await;
        if let Ok(Some(len)) = received {
            buf.truncate(len);
            return Some(buf);
        }
    }
    None
}

/// The `nameserver` lines of a resolv.conf, as port-53 socket addresses.
fn upstreams(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            let ip: IpAddr = words.next()?.split('%').next()?.parse().ok()?;
            Some(SocketAddr::new(ip, 53))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nameservers() {
        let conf = "# comment\nnameserver 10.255.255.53\nsearch x\nnameserver fe80::1%eth0\nnameserver bogus\n";
        assert_eq!(
            upstreams(conf),
            [
                "10.255.255.53:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }
}
