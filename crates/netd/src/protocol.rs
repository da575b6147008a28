//! The channel between the server (root) and `airlock-netd` (unprivileged): one JSON object per
//! line over a Unix socket pair the server hands over as fd [`CHANNEL_FD`].
//!
//! It is narrow on purpose. The server tells netd what it needs to apply policies: the platform's
//! deny set and upstream resolvers once ([`Command::Init`]), then each sandbox's policy by its
//! address ([`Command::Set`], [`Command::Clear`]). netd answers each numbered command with an
//! [`Ack`] once it is in force, and sends nothing else: it asks the privileged side for nothing,
//! so a netd taken over by hostile bytes has nothing to ask for. Addresses learned from DNS
//! answers stay inside netd and open nothing in the host firewall.

use airlock_wire::egress::{Egress, Ipv4Net};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};

/// The UDP socket sandboxes' DNS queries arrive on (the firewall redirects them there).
pub const DNS_FD: i32 = 3;
/// The TCP listener connections the firewall redirects to the domain proxy arrive on.
pub const PROXY_FD: i32 = 4;
/// The channel to the server.
pub const CHANNEL_FD: i32 = 5;

/// The longest line either side reads; a longer one ends the channel.
pub const MAX_LINE: usize = 1 << 20;

/// Server → netd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// The first command: what no policy can open, and where names are resolved.
    Init {
        seq: u64,
        /// The platform's deny set: no answer pointing there is passed on, and no connection
        /// goes there.
        deny: Vec<Ipv4Net>,
        /// The host's resolvers.
        upstreams: Vec<SocketAddr>,
        /// The host's search domains: names under them are the host's, not the internet's.
        search: Vec<String>,
    },
    /// Puts `egress` in force for the sandbox at `addr`, replacing its policy and forgetting
    /// what its DNS taught; its proxied connections that `egress` forbids are cut.
    Set {
        seq: u64,
        addr: Ipv4Addr,
        egress: Egress,
    },
    /// The sandbox at `addr` is gone: its policy is forgotten and its connections cut.
    Clear { seq: u64, addr: Ipv4Addr },
}

impl Command {
    pub fn seq(&self) -> u64 {
        match self {
            Command::Init { seq, .. } | Command::Set { seq, .. } | Command::Clear { seq, .. } => {
                *seq
            }
        }
    }
}

/// netd → server: the command numbered `seq` is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub seq: u64,
}

/// One line of JSON, newline-terminated.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(msg).expect("protocol messages serialize");
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_as_lines() {
        let egress = Egress::from_request(Some(false), &["pypi.org".into()], &[]).unwrap();
        let set = Command::Set {
            seq: 7,
            addr: Ipv4Addr::new(10, 77, 0, 2),
            egress,
        };
        let line = encode(&set);
        assert_eq!(line.last(), Some(&b'\n'));
        assert!(!line[..line.len() - 1].contains(&b'\n'));
        let back: Command = serde_json::from_slice(&line).unwrap();
        assert_eq!((back.seq(), back), (7, set));
        let ack: Ack = serde_json::from_slice(&encode(&Ack { seq: 7 })).unwrap();
        assert_eq!(ack.seq, 7);
    }
}
