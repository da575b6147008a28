//! Per-sandbox links: a named netns (`al-{id}`, see [`crate::instance::Instance::netns_name`])
//! holding `eth0`, the peer of the host's `alv{slot}`, with a /30 from [`SlotAddrs`].
//!
//! runsc joins the netns through the spec's `linux.namespaces` path and its netstack takes
//! `eth0`'s address over, so the host kernel only ever routes to the veth. We never use
//! `ip netns exec`: it remounts `/sys`, after which runsc cannot find its cgroups. Setup is two
//! `ip -batch` calls (host side, then inside the netns with `ip -n`) to keep spawns few.
//!
//! The "host" is the network namespace the server runs in, which need not be the host's own
//! (several servers on one host, see [`crate::instance`]): so links are looked up by asking the
//! kernel in this namespace, never in `/sys/class/net`, which shows the namespace of whoever
//! mounted `/sys`.
//!
//! What may cross these links is [`super::firewall`]'s business.

use super::slots::SlotAddrs;
use crate::host_cmd;
use airlock_core::driver::DriverError;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

const NETNS_DIR: &str = "/run/netns";
pub(crate) const LINK_PREFIX: &str = "alv";

pub(crate) fn netns_path(netns: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(netns)
}

/// The host end of the slot's veth; at most 8 characters (`alv16383`), well under IFNAMSIZ.
pub(crate) fn link_name(slot: u32) -> String {
    format!("{LINK_PREFIX}{slot}")
}

pub(crate) fn link_exists(slot: u32) -> bool {
    nix::net::if_::if_nametoindex(link_name(slot).as_str()).is_ok()
}

/// The `ip -batch` scripts for a slot: first the host side, then inside the netns.
fn scripts(ns: &str, slot: u32) -> (String, String) {
    let link = link_name(slot);
    let SlotAddrs { host, sandbox } = SlotAddrs::for_slot(slot);
    let host_side = format!(
        "netns add {ns}\n\
         link add {link} type veth peer name eth0 netns {ns}\n\
         addr add {host}/30 dev {link}\n\
         link set {link} up\n"
    );
    let inside = format!(
        "link set lo up\n\
         addr add {sandbox}/30 dev eth0\n\
         link set eth0 up\n\
         route add default via {host}\n"
    );
    (host_side, inside)
}

/// Creates the netns and veth pair and addresses both ends.
pub(crate) async fn setup(netns: &str, slot: u32) -> Result<(), DriverError> {
    let (host_side, inside) = scripts(netns, slot);
    ip_batch(None, &host_side).await?;
    ip_batch(Some(netns), &inside).await
}

/// Deletes the netns. The kernel then destroys its devices (and so the veth pair)
/// asynchronously, once no process holds the netns any more.
pub(crate) async fn delete_netns(netns: &str) -> Result<(), DriverError> {
    if !netns_path(netns).exists() {
        return Ok(());
    }
    ip(&["netns", "del", netns]).await
}

/// Deletes the host end of the slot's veth if it is still there.
pub(crate) async fn delete_link(slot: u32) -> Result<(), DriverError> {
    if !link_exists(slot) {
        return Ok(());
    }
    let result = ip(&["link", "del", &link_name(slot)]).await;
    // A dying netns may have taken it between our check and the call.
    if result.is_err() && !link_exists(slot) {
        return Ok(());
    }
    result
}

/// Every named netns on the host, whoever made it. A missing dir is empty.
pub(crate) fn netns_names() -> Result<Vec<String>, DriverError> {
    let dir = Path::new(NETNS_DIR);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DriverError::io(format!("listing {}", dir.display()))(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(DriverError::io(format!("listing {}", dir.display())))?;
        if let Some(name) = entry.file_name().to_str() {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Slots that have a link of ours in this network namespace.
pub(crate) fn link_slots() -> Result<Vec<u32>, DriverError> {
    let links = nix::net::if_::if_nameindex()
        .map_err(|e| DriverError::io("listing network links")(e.into()))?;
    Ok(links
        .iter()
        .filter_map(|link| {
            link.name()
                .to_str()
                .ok()?
                .strip_prefix(LINK_PREFIX)?
                .parse()
                .ok()
        })
        .collect())
}

/// Host-side TCP states in which the sandbox's end of the connection is closed too: after
/// `TIME_WAIT` (the host closed first and the sandbox acknowledged) or `CLOSE`, netstack holds
/// nothing. Any other state means the sandbox still has a connected endpoint.
const DRAINED_STATES: &[&str] = &["06", "07"];
/// How long the host's side must stay drained before a checkpoint (see [`wait_until_drained`]).
const DRAIN_SETTLE: Duration = Duration::from_millis(50);

/// Waits until the host holds no TCP connection to `sandbox` whose other end is still open
/// inside it, or `within` passes; returns whether it drained.
///
/// Why: a checkpoint resets connected endpoints (`--net-disconnect-ok`), and with this runsc a
/// listening socket whose accepted connection was reset that way accepts no connection after a
/// restore (the handshake completes, the application is never woken). The agent's own listener
/// is one, so the lifecycle closes its connections and this waits for the sandbox side to let go.
///
/// The host reaches `TIME_WAIT` when it sends its last ACK; netstack leaves `LAST_ACK` only
/// when that ACK has been processed, a moment later. So "drained" must hold twice,
/// [`DRAIN_SETTLE`] apart: a single look let a fresh-clone CI run save a golden image whose
/// agent then never answered.
pub(crate) async fn wait_until_drained(sandbox: Ipv4Addr, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut clear_since: Option<tokio::time::Instant> = None;
    loop {
        let open = match std::fs::read_to_string("/proc/net/tcp") {
            Ok(table) => open_connections(&table, sandbox),
            Err(_) => 0,
        };
        let now = tokio::time::Instant::now();
        if open == 0 {
            match clear_since {
                Some(since) if now - since >= DRAIN_SETTLE => return true,
                Some(_) => {}
                None => clear_since = Some(now),
            }
        } else {
            clear_since = None;
        }
        if now >= deadline {
            tracing::warn!(%sandbox, open, "connections to the sandbox did not close in time");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many rows of a `/proc/net/tcp` table connect to `peer` in a state other than
/// [`DRAINED_STATES`] (listeners have no peer, so they never match).
fn open_connections(table: &str, peer: Ipv4Addr) -> usize {
    // Addresses are the raw 32-bit value in host byte order, printed as hex: `0200A8C0:1F90`.
    let peer_hex = format!("{:08X}", u32::from_ne_bytes(peer.octets()));
    table
        .lines()
        .skip(1)
        .filter(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let (Some(remote), Some(state)) = (cols.get(2), cols.get(3)) else {
                return false;
            };
            remote.split(':').next() == Some(peer_hex.as_str()) && !DRAINED_STATES.contains(state)
        })
        .count()
}

/// Destroys every host socket and conntrack entry that still involves `addr`, once the sandbox
/// that had it is gone. Left alone, the host's connections to a dead sandbox linger for
/// minutes, retransmitting into the void, and would still be there when a new sandbox gets the
/// address (and hold up its checkpoints, which wait for connections into it to close).
pub(crate) async fn forget_address(addr: Ipv4Addr) -> Result<(), DriverError> {
    let addr = addr.to_string();
    let mut ss = Command::new("ss");
    ss.args(["--kill", "--tcp", "--udp", "--all", "dst", &addr]);
    let killed = host_cmd::run(&format!("ss --kill dst {addr}"), ss, None).await;
    for direction in ["--orig-src", "--orig-dst"] {
        // conntrack lists, then deletes one by one, and gives up at the first flow that went
        // away meanwhile (the sockets just destroyed end theirs). Even a run that succeeds can
        // leave flows behind (seen in CI: the proxy's flows of a dead sandbox): so again, until
        // it finds nothing left, which it reports as a failure.
        for _ in 0..10 {
            let mut conntrack = Command::new("conntrack");
            conntrack.args(["--delete", direction, &addr]);
            let what = format!("conntrack --delete {direction} {addr}");
            match host_cmd::run(&what, conntrack, None).await {
                Ok(()) => continue,
                Err(e) if e.to_string().contains("0 flow entries") => break,
                Err(e) if e.to_string().contains("such conntrack doesn't exist") => continue,
                Err(e) => return Err(e),
            }
        }
    }
    killed
}

async fn ip(args: &[&str]) -> Result<(), DriverError> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    host_cmd::run(&format!("ip ({})", args.join(" ")), cmd, None).await
}

async fn ip_batch(netns: Option<&str>, script: &str) -> Result<(), DriverError> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"]);
    let what = format!("ip -batch ({})", script.trim().replace('\n', "; "));
    host_cmd::run(&what, cmd, Some(script)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_address_both_ends_of_the_slot() {
        let (host, inside) = scripts("al-abc", 1);
        assert_eq!(
            host,
            "netns add al-abc\n\
             link add alv1 type veth peer name eth0 netns al-abc\n\
             addr add 10.77.0.5/30 dev alv1\n\
             link set alv1 up\n"
        );
        assert!(inside.contains("addr add 10.77.0.6/30 dev eth0\n"));
        assert!(inside.contains("route add default via 10.77.0.5\n"));
        assert_eq!(link_name(SlotAddrs::MAX_SLOTS - 1).len(), 8);
    }

    #[test]
    fn counts_only_connections_still_open_inside_the_sandbox() {
        // 10.77.0.2 is 0x0A4D0002, printed little-endian as 02004D0A.
        let table = "  sl  local_address rem_address   st\n\
            0: 01004D0A:9C40 02004D0A:C33F 01 0:0\n\
            1: 01004D0A:9C41 02004D0A:C33F 06 0:0\n\
            2: 01004D0A:9C42 02004D0A:C33F 05 0:0\n\
            3: 01004D0A:9C43 06004D0A:C33F 01 0:0\n\
            4: 00000000:0BB8 00000000:0000 0A 0:0\n";
        assert_eq!(open_connections(table, Ipv4Addr::new(10, 77, 0, 2)), 2);
        assert_eq!(open_connections(table, Ipv4Addr::new(10, 77, 0, 6)), 1);
        assert_eq!(open_connections(table, Ipv4Addr::new(10, 77, 0, 10)), 0);
    }
}
