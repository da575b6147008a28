//! The host firewall around sandboxes: one nftables table, `inet airlock`, made afresh when the
//! driver starts.
//!
//! - **Nothing gets in.** New connections from a sandbox link (`alv*`) to the host itself are
//!   dropped (the control API and every other host service, on every host address), except to
//!   the sandbox DNS forwarder's and domain proxy's ports. Nothing from outside, or from another sandbox, is
//!   forwarded into a sandbox; replies to its own connections are.
//! - **No spoofing.** A packet from a sandbox link must carry that link's address
//!   (reverse-path check), so a sandbox cannot pose as another one, to the DNS forwarder either.
//! - **The platform's deny list, whatever the policy says.** This host, private and
//!   shared-address ranges (which include every other sandbox), link-local (cloud metadata at
//!   169.254.169.254), multicast and reserved ranges, the host's own LANs, and all IPv6.
//! - **Internet by NAT.** Everything else leaves masqueraded as the host.
//! - **Per-sandbox policy.** A sandbox with rules gets a chain `slot{N}`, jumped to through the
//!   verdict map `slots` keyed by its link: `allowOut` networks and the addresses DNS answered
//!   for `allowOut` domains are accepted, then `denyOut` networks dropped.
//! - **DNS goes to the forwarder.** UDP port 53 from a sandbox, to any address, is redirected to
//!   [`DNS_PORT`] on the host, where [`crate::dns`] applies the policy to names.
//! - **Named connections go to the domain proxy.** In a sandbox whose `allowOut` has domains, a
//!   TCP connection its rules would drop is redirected to [`PROXY_PORT`] instead (per-slot chain
//!   `slot{N}_nat`), where [`crate::domain_proxy`] lets it through if it names an allowed domain.

use crate::host_cmd;
use crate::net::LINK_PREFIX;
use airlock_core::driver::{DriverError, SlotAddrs};
use airlock_core::egress::{Egress, Ipv4Net};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the host's DNS forwarder for sandboxes listens (all addresses; the firewall admits
/// only sandbox links to it).
pub(crate) const DNS_PORT: u16 = 10053;
/// Where [`crate::domain_proxy`] listens, admitted the same way.
pub(crate) const PROXY_PORT: u16 = 10054;

/// Ranges no sandbox may reach, whatever its policy: "this network", private (RFC 1918),
/// shared address space (RFC 6598), loopback, link-local (cloud metadata), benchmarking,
/// multicast and reserved.
const PLATFORM_DENY: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
];

/// Addresses learned from DNS stay allowed at least this long, so a client that caches an
/// answer beyond its TTL is not cut off mid-session.
const MIN_LEARNED: Duration = Duration::from_secs(3600);
/// ... and at most this long.
const MAX_LEARNED: Duration = Duration::from_secs(24 * 3600);

const TABLE: &str = "inet airlock";

pub(crate) struct Firewall {
    /// The policies of slots that have rules; a slot not listed is open.
    policies: Mutex<HashMap<u32, Arc<Egress>>>,
    /// What no policy can open: [`PLATFORM_DENY`] and the host's own LANs.
    deny: Vec<Ipv4Net>,
    /// No table at all: nothing is enforced (a debugging mode, never the default).
    disabled: bool,
}

impl Firewall {
    /// Replaces the table with a fresh one (no per-sandbox rules) and makes sure the host
    /// forwards. With `enforce` false there is no table at all: sandboxes reach the host, one
    /// another and private ranges, and policies are ignored (for proving that escape probes
    /// detect a leak).
    pub(crate) fn install(enforce: bool) -> Result<Self, DriverError> {
        let forwarding_was_on = crate::forwarding::enable()?;
        let deny = if enforce {
            let deny = deny_set(host_networks()?);
            run_nft_sync(&base_ruleset(&deny, forwarding_was_on))?;
            deny
        } else {
            tracing::warn!("the host firewall is OFF (--insecure-open-network): sandboxes can reach this host and each other");
            run_nft_sync(&format!("table {TABLE}\ndelete table {TABLE}\n"))?;
            Vec::new()
        };
        remove_legacy_guard();
        Ok(Firewall {
            policies: Mutex::new(HashMap::new()),
            deny,
            disabled: !enforce,
        })
    }

    fn policies(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Egress>>> {
        self.policies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy of the sandbox in `slot`, or `None` if it has no rules.
    pub(crate) fn policy(&self, slot: u32) -> Option<Arc<Egress>> {
        self.policies().get(&slot).cloned()
    }

    /// Puts `egress` in force for `slot`, replacing whatever it had (including learned
    /// addresses).
    pub(crate) async fn apply(&self, slot: u32, egress: &Egress) -> Result<(), DriverError> {
        if self.disabled {
            return Ok(());
        }
        if egress.is_open() {
            return self.clear(slot).await;
        }
        run_nft(&slot_ruleset(slot, egress)).await?;
        self.policies().insert(slot, Arc::new(egress.clone()));
        Ok(())
    }

    /// Removes the slot's rules, if it has any.
    pub(crate) async fn clear(&self, slot: u32) -> Result<(), DriverError> {
        if self.policies().remove(&slot).is_none() {
            return Ok(());
        }
        run_nft(&slot_removal(slot)).await
    }

    /// Allows `addrs` (that DNS answered for an allowed domain) for the sandbox in `slot`.
    pub(crate) async fn learn(
        &self,
        slot: u32,
        addrs: &[(Ipv4Addr, u32)],
    ) -> Result<(), DriverError> {
        let elements: Vec<String> = addrs
            .iter()
            .filter(|(ip, _)| !self.platform_denies(*ip))
            .map(|(ip, ttl)| {
                let ttl = Duration::from_secs(u64::from(*ttl)).clamp(MIN_LEARNED, MAX_LEARNED);
                format!("{ip} timeout {}s", ttl.as_secs())
            })
            .collect();
        if elements.is_empty() {
            return Ok(());
        }
        run_nft(&format!(
            "add element {TABLE} slot{slot}_learned {{ {} }}\n",
            elements.join(", ")
        ))
        .await
    }

    /// Whether no policy can allow `ip`.
    pub(crate) fn platform_denies(&self, ip: Ipv4Addr) -> bool {
        self.deny.iter().any(|n| n.contains(ip))
    }
}

/// The slot of the sandbox a connection or datagram came from, if it came from one.
pub(crate) fn slot_of_peer(peer: std::net::SocketAddr) -> Option<u32> {
    match peer.ip() {
        std::net::IpAddr::V4(ip) => slot_of(ip),
        std::net::IpAddr::V6(_) => None,
    }
}

/// The slot whose sandbox address `ip` is. The reverse-path check guarantees that a packet with
/// a sandbox's address came from that sandbox's link.
pub(crate) fn slot_of(ip: Ipv4Addr) -> Option<u32> {
    let base = u32::from(SlotAddrs::for_slot(0).sandbox) - 2;
    let slot = u32::from(ip).checked_sub(base)? / 4;
    (slot < SlotAddrs::MAX_SLOTS && SlotAddrs::for_slot(slot).sandbox == ip).then_some(slot)
}

/// [`PLATFORM_DENY`] and the host's own networks.
fn deny_set(host_nets: Vec<Ipv4Net>) -> Vec<Ipv4Net> {
    PLATFORM_DENY
        .iter()
        .map(|n| n.parse().expect("valid constant"))
        .chain(host_nets)
        .collect()
}

/// The whole table, with `deny` as the platform's deny set. When the host did not forward
/// before, it forwards only for sandboxes; when it did, traffic that is not a sandbox's is left
/// to the host's own rules (`return`: this table neither accepts nor drops it).
fn base_ruleset(deny: &[Ipv4Net], forwarding_was_on: bool) -> String {
    let deny: Vec<String> = deny.iter().map(Ipv4Net::to_string).collect();
    let others = if forwarding_was_on { "return" } else { "drop" };
    let links = format!("\"{LINK_PREFIX}*\"");
    format!(
        "table {TABLE}\n\
         delete table {TABLE}\n\
         table {TABLE} {{\n\
         \tset platform_deny {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {deny} }}; }}\n\
         \tmap slots {{ type ifname : verdict; }}\n\
         \tmap nat_slots {{ type ifname : verdict; }}\n\
         \tchain antispoof {{\n\
         \t\ttype filter hook prerouting priority filter; policy accept;\n\
         \t\tiifname {links} fib saddr . iif oif missing drop\n\
         \t}}\n\
         \tchain redirects {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tiifname {links} udp dport 53 redirect to :{DNS_PORT}\n\
         \t\tiifname vmap @nat_slots\n\
         \t}}\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname {links} ct state established,related accept\n\
         \t\tiifname {links} udp dport {DNS_PORT} accept\n\
         \t\tiifname {links} tcp dport {PROXY_PORT} accept\n\
         \t\tiifname {links} drop\n\
         \t\tudp dport {DNS_PORT} drop\n\
         \t\ttcp dport {PROXY_PORT} drop\n\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\toifname {links} ct state established,related accept\n\
         \t\toifname {links} drop\n\
         \t\tiifname != {links} {others}\n\
         \t\tct state established,related accept\n\
         \t\tmeta nfproto ipv6 drop\n\
         \t\tip daddr @platform_deny drop\n\
         \t\tiifname vmap @slots\n\
         \t}}\n\
         \tchain egress_nat {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tiifname {links} oifname != {links} masquerade\n\
         \t}}\n\
         }}\n",
        deny = deny.join(", "),
    )
}

/// Declarations of the slot's chain and sets; `add` is a no-op for ones that exist.
fn slot_objects(slot: u32) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "add chain {TABLE} slot{slot}");
    let _ = writeln!(s, "add chain {TABLE} slot{slot}_nat");
    for (set, flags) in [
        ("allow", "interval; auto-merge"),
        ("learned", "timeout"),
        ("deny", "interval; auto-merge"),
    ] {
        let _ = writeln!(
            s,
            "add set {TABLE} slot{slot}_{set} {{ type ipv4_addr; flags {flags}; }}"
        );
    }
    s
}

fn slot_ruleset(slot: u32, egress: &Egress) -> String {
    let mut s = slot_objects(slot);
    for chain in ["", "_nat"] {
        let _ = writeln!(s, "flush chain {TABLE} slot{slot}{chain}");
    }
    for set in ["allow", "learned", "deny"] {
        let _ = writeln!(s, "flush set {TABLE} slot{slot}_{set}");
    }
    for (set, nets) in [("allow", &egress.allow_nets), ("deny", &egress.deny_nets)] {
        if !nets.is_empty() {
            let list: Vec<String> = nets.iter().map(Ipv4Net::to_string).collect();
            let _ = writeln!(
                s,
                "add element {TABLE} slot{slot}_{set} {{ {} }}",
                list.join(", ")
            );
        }
    }
    for (set, verdict) in [("allow", "accept"), ("learned", "accept"), ("deny", "drop")] {
        let _ = writeln!(
            s,
            "add rule {TABLE} slot{slot} ip daddr @slot{slot}_{set} {verdict}"
        );
    }
    if !egress.allow_domains.is_empty() {
        let _ = writeln!(
            s,
            "add rule {TABLE} slot{slot}_nat meta l4proto tcp ip daddr != @platform_deny \
             ip daddr != @slot{slot}_allow ip daddr != @slot{slot}_learned \
             ip daddr @slot{slot}_deny redirect to :{PROXY_PORT}"
        );
    }
    for (map, chain) in [("slots", ""), ("nat_slots", "_nat")] {
        let _ = writeln!(
            s,
            "add element {TABLE} {map} {{ \"{LINK_PREFIX}{slot}\" : jump slot{slot}{chain} }}"
        );
    }
    s
}

/// Deletes the slot's map entry, chain and sets. Everything is declared first, so the batch
/// works whatever is left of them.
fn slot_removal(slot: u32) -> String {
    let mut s = slot_objects(slot);
    let link = format!("\"{LINK_PREFIX}{slot}\"");
    for (map, chain) in [("slots", ""), ("nat_slots", "_nat")] {
        let _ = writeln!(
            s,
            "add element {TABLE} {map} {{ {link} : jump slot{slot}{chain} }}"
        );
        let _ = writeln!(s, "delete element {TABLE} {map} {{ {link} }}");
    }
    for chain in ["", "_nat"] {
        let _ = writeln!(s, "flush chain {TABLE} slot{slot}{chain}");
        let _ = writeln!(s, "delete chain {TABLE} slot{slot}{chain}");
    }
    for set in ["allow", "learned", "deny"] {
        let _ = writeln!(s, "delete set {TABLE} slot{slot}_{set}");
    }
    s
}

/// The IPv4 networks of the host's own interfaces, but loopback and sandbox links.
fn host_networks() -> Result<Vec<Ipv4Net>, DriverError> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map_err(DriverError::io("starting ip"))?;
    Ok(parse_host_networks(&String::from_utf8_lossy(&out.stdout)))
}

/// Reads `ip -4 -o addr show`: `2: eth0    inet 192.0.2.2/24 brd ... scope global eth0`.
fn parse_host_networks(text: &str) -> Vec<Ipv4Net> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let link = words.nth(1)?;
            if link == "lo" || link.starts_with(LINK_PREFIX) {
                return None;
            }
            let mut words = words.skip_while(|w| *w != "inet");
            words.next()?;
            words.next()?.parse().ok()
        })
        .collect()
}

/// Until this release the host guard was an iptables rule dropping every new connection from
/// sandbox links, which would now also drop DNS queries to the forwarder.
fn remove_legacy_guard() {
    for tool in ["iptables", "ip6tables"] {
        let _ = std::process::Command::new(tool)
            .args([
                "-D",
                "INPUT",
                "-i",
                "alv+",
                "-m",
                "conntrack",
                "--ctstate",
                "NEW",
                "-j",
                "DROP",
            ])
            .stderr(Stdio::null())
            .status();
    }
}

fn run_nft_sync(script: &str) -> Result<(), DriverError> {
    let mut cmd = std::process::Command::new("nft");
    cmd.args(["-f", "-"]);
    host_cmd::run_sync(&nft_what(script), cmd, script)
}

async fn run_nft(script: &str) -> Result<(), DriverError> {
    let mut cmd = tokio::process::Command::new("nft");
    cmd.args(["-f", "-"]);
    host_cmd::run(&nft_what(script), cmd, Some(script)).await
}

/// Names a batch in errors by its first line.
fn nft_what(script: &str) -> String {
    format!("nft ({})", script.lines().next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sandbox_addresses_have_slots() {
        let at = |ip: &str| slot_of(ip.parse().unwrap());
        assert_eq!(at("10.77.0.2"), Some(0));
        assert_eq!(at("10.77.0.6"), Some(1));
        assert_eq!(at("10.77.0.5"), None, "a host end");
        assert_eq!(at("10.76.255.254"), None);
        assert_eq!(at("192.0.2.2"), None);
    }

    #[test]
    fn host_networks_skip_loopback_and_sandbox_links() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\n\
                    2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n\
                    9: alv3    inet 10.77.0.13/30 scope global alv3\n";
        assert_eq!(
            parse_host_networks(text),
            ["192.0.2.0/24".parse::<Ipv4Net>().unwrap()]
        );
    }

    #[test]
    fn base_ruleset_blocks_what_no_policy_may_open() {
        let rules = base_ruleset(&deny_set(vec!["192.0.2.0/24".parse().unwrap()]), false);
        for must in [
            "169.254.0.0/16",
            "10.0.0.0/8",
            "192.0.2.0/24",
            "iifname \"alv*\" drop",
            "oifname \"alv*\" drop",
            "iifname != \"alv*\" drop",
            "meta nfproto ipv6 drop",
            "redirect to :10053",
            "tcp dport 10054 accept",
            "vmap @nat_slots",
            "masquerade",
        ] {
            assert!(rules.contains(must), "missing {must}");
        }
        assert!(base_ruleset(&deny_set(vec![]), true).contains("iifname != \"alv*\" return"));
    }

    #[test]
    fn slot_rules_allow_before_they_deny() {
        let egress = Egress::from_request(
            Some(false),
            &["1.1.1.1".into(), "pypi.org".into()],
            &["8.8.8.0/24".into()],
        )
        .unwrap();
        let rules = slot_ruleset(7, &egress);
        let allow = rules.find("@slot7_allow accept").unwrap();
        let learned = rules.find("@slot7_learned accept").unwrap();
        let deny = rules.find("@slot7_deny drop").unwrap();
        assert!(allow < learned && learned < deny);
        assert!(rules.contains("add element inet airlock slot7_deny { 0.0.0.0/0, 8.8.8.0/24 }"));
        assert!(rules.contains("\"alv7\" : jump slot7"));
        assert!(
            rules.contains("@slot7_deny redirect to :10054"),
            "domains go to the proxy"
        );
        let no_domains = Egress::from_request(Some(false), &[], &[]).unwrap();
        assert!(!slot_ruleset(7, &no_domains).contains("redirect"));
        assert!(slot_removal(7).contains("delete chain inet airlock slot7"));
    }
}
