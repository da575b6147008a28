//! The host firewall around sandboxes: one nftables table, `inet airlock`, made afresh in one
//! batch when the driver starts, with every sandbox the database knows already in it.
//!
//! - **Nothing gets in.** New connections from a sandbox link (`alv*`) to the host itself are
//!   dropped (the control API and every other host service, on every host address), except to
//!   the ports of the network services ([`DNS_PORT`], [`PROXY_PORT`]). Nothing from outside,
//!   or from another sandbox, is forwarded into a sandbox; replies to its own connections are.
//! - **No spoofing.** A packet from a sandbox link must carry that link's address
//!   (reverse-path check), so a sandbox cannot pose as another one, to netd either.
//! - **The platform's deny list, whatever the policy says.** This host, private and
//!   shared-address ranges (which include every other sandbox), link-local (cloud metadata at
//!   169.254.169.254), multicast and reserved ranges, the host's own LANs, and all IPv6.
//! - **Internet by NAT.** Everything else leaves masqueraded as the host.
//! - **Per-sandbox policy, on every packet.** Each sandbox's link jumps, through the verdict map
//!   `slots`, to its chain `slot{N}`: `allowOut` networks accepted, `denyOut` networks dropped,
//!   the rest accepted (an open policy accepts everything). A link the map does not name is
//!   dropped, so a sandbox the firewall was not told about reaches nothing. Packets of
//!   established flows are judged too, so a new policy cuts what it forbids at once.
//! - **DNS goes to netd.** UDP port 53 from a sandbox, to any address, is redirected to
//!   [`DNS_PORT`], where `airlock-netd` applies the policy to names.
//! - **Named connections go to netd's proxy.** In a sandbox whose `allowOut` has domains, a
//!   TCP connection its network rules would drop is redirected to [`PROXY_PORT`] instead
//!   (per-slot chain `slot{N}_nat`), where the proxy lets it through only if it names an
//!   allowed domain (or, naming nothing, goes to an address DNS answered for one). Learned
//!   addresses open nothing here.
//! - **netd itself is fenced in.** The uid it runs as may open connections only to public
//!   addresses and to the host's resolvers on port 53; never to this host, its LANs or a
//!   sandbox, so even a netd taken over reaches nothing private.

use super::links::LINK_PREFIX;
use crate::host_cmd;
use airlock_core::driver::DriverError;
use airlock_core::egress::{platform_deny, Egress, Ipv4Net};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::process::Stdio;

/// Where netd answers sandboxes' DNS (the firewall admits only sandbox links to it).
pub(crate) const DNS_PORT: u16 = 10053;
/// Where netd's domain proxy listens, admitted the same way.
pub(crate) const PROXY_PORT: u16 = 10054;

const TABLE: &str = "inet airlock";

/// What the table is made with.
pub(crate) struct Install<'a> {
    /// With `false` there is no table at all: sandboxes reach the host, one another and private
    /// ranges, and policies are ignored (a debugging mode for proving that escape probes see
    /// leaks; never the default).
    pub enforce: bool,
    /// Whether the host forwarded before Airlock turned forwarding on.
    pub forwarding_was_on: bool,
    /// [`deny_set`] of this host.
    pub deny: &'a [Ipv4Net],
    /// The host's resolvers, which netd may reach on port 53.
    pub resolvers: &'a [IpAddr],
    /// netd's uid.
    pub netd_uid: u32,
    /// Every sandbox already known (adopted after a restart): its slot and policy.
    pub known: &'a [(u32, Egress)],
}

pub(crate) struct Firewall {
    enforced: bool,
}

impl Firewall {
    /// Replaces the table, in one batch, with the base rules and every known sandbox's rules:
    /// there is no moment in which a known sandbox is unconfined.
    pub(crate) fn install(install: &Install<'_>) -> Result<Self, DriverError> {
        if install.enforce {
            let mut script = base_ruleset(install);
            for (slot, egress) in install.known {
                script.push_str(&slot_update(*slot, egress));
            }
            run_nft_sync(&script)?;
        } else {
            tracing::warn!("the host firewall is OFF (--insecure-open-network): sandboxes can reach this host and each other");
            run_nft_sync(&format!("table {TABLE}\ndelete table {TABLE}\n"))?;
        }
        remove_legacy_guard();
        Ok(Firewall {
            enforced: install.enforce,
        })
    }

    /// Puts `egress` in force for `slot`, replacing whatever it had, in one batch.
    pub(crate) async fn apply(&self, slot: u32, egress: &Egress) -> Result<(), DriverError> {
        if !self.enforced {
            return Ok(());
        }
        run_nft(&slot_update(slot, egress)).await
    }

    /// Removes the slot's rules: its link reaches nothing any more.
    pub(crate) async fn clear(&self, slot: u32) -> Result<(), DriverError> {
        if !self.enforced {
            return Ok(());
        }
        run_nft(&slot_removal(slot)).await
    }
}

/// [`platform_deny`] and the host's own networks.
pub(crate) fn deny_set(host_nets: Vec<Ipv4Net>) -> Vec<Ipv4Net> {
    platform_deny().chain(host_nets).collect()
}

/// The whole table, without sandboxes. When the host did not forward before, it forwards only
/// for sandboxes; when it did, traffic that is not a sandbox's is left to the host's own rules
/// (`return`: this table neither accepts nor drops it).
fn base_ruleset(install: &Install<'_>) -> String {
    let deny: Vec<String> = install.deny.iter().map(Ipv4Net::to_string).collect();
    let others = if install.forwarding_was_on {
        "return"
    } else {
        "drop"
    };
    let links = format!("\"{LINK_PREFIX}*\"");
    let uid = install.netd_uid;
    let mut resolvers = String::new();
    for (family, v4) in [("ip", true), ("ip6", false)] {
        let addrs: Vec<String> = install
            .resolvers
            .iter()
            .filter(|a| a.is_ipv4() == v4)
            .map(IpAddr::to_string)
            .collect();
        if !addrs.is_empty() {
            let _ = writeln!(
                resolvers,
                "\t\tmeta skuid {uid} {family} daddr {{ {} }} meta l4proto {{ tcp, udp }} th dport 53 accept",
                addrs.join(", ")
            );
        }
    }
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
         \t\tmeta nfproto ipv6 drop\n\
         \t\tip daddr @platform_deny drop\n\
         \t\tiifname vmap @slots\n\
         \t\tdrop\n\
         \t}}\n\
         \tchain netd_out {{\n\
         \t\ttype filter hook output priority filter; policy accept;\n\
         \t\tmeta skuid {uid} ct state established,related accept\n\
         {resolvers}\
         \t\tmeta skuid {uid} meta nfproto ipv6 drop\n\
         \t\tmeta skuid {uid} ip daddr @platform_deny drop\n\
         \t}}\n\
         \tchain egress_nat {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tiifname {links} oifname != {links} masquerade\n\
         \t}}\n\
         }}\n",
        deny = deny.join(", "),
    )
}

/// The slot's chains, sets and map entries (the link jumps to its own chains), declared: `add`
/// is a no-op for what exists, so what follows can flush or delete them whatever is left.
fn slot_objects(slot: u32) -> String {
    let mut s = String::new();
    for chain in ["", "_nat"] {
        let _ = writeln!(s, "add chain {TABLE} slot{slot}{chain}");
    }
    for set in ["allow", "deny"] {
        let _ = writeln!(
            s,
            "add set {TABLE} slot{slot}_{set} {{ type ipv4_addr; flags interval; auto-merge; }}"
        );
    }
    let link = format!("\"{LINK_PREFIX}{slot}\"");
    for (map, chain) in [("slots", ""), ("nat_slots", "_nat")] {
        let _ = writeln!(
            s,
            "add element {TABLE} {map} {{ {link} : jump slot{slot}{chain} }}"
        );
    }
    s
}

/// Removes the slot's map entries, chains and sets.
fn slot_removal(slot: u32) -> String {
    let mut s = slot_objects(slot);
    let link = format!("\"{LINK_PREFIX}{slot}\"");
    for map in ["slots", "nat_slots"] {
        let _ = writeln!(s, "delete element {TABLE} {map} {{ {link} }}");
    }
    for chain in ["", "_nat"] {
        let _ = writeln!(s, "delete chain {TABLE} slot{slot}{chain}");
    }
    for set in ["allow", "deny"] {
        let _ = writeln!(s, "delete set {TABLE} slot{slot}_{set}");
    }
    s
}

/// Replaces the slot's rules with `egress`'s; an open policy is a chain that accepts.
fn slot_update(slot: u32, egress: &Egress) -> String {
    let mut s = slot_objects(slot);
    for chain in ["", "_nat"] {
        let _ = writeln!(s, "flush chain {TABLE} slot{slot}{chain}");
    }
    for set in ["allow", "deny"] {
        let _ = writeln!(s, "flush set {TABLE} slot{slot}_{set}");
    }
    if egress.is_open() {
        let _ = writeln!(s, "add rule {TABLE} slot{slot} accept");
        return s;
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
    for (set, verdict) in [("allow", "accept"), ("deny", "drop")] {
        let _ = writeln!(
            s,
            "add rule {TABLE} slot{slot} ip daddr @slot{slot}_{set} {verdict}"
        );
    }
    let _ = writeln!(s, "add rule {TABLE} slot{slot} accept");
    if !egress.allow_domains.is_empty() {
        let _ = writeln!(
            s,
            "add rule {TABLE} slot{slot}_nat meta l4proto tcp ip daddr != @platform_deny \
             ip daddr != @slot{slot}_allow ip daddr @slot{slot}_deny redirect to :{PROXY_PORT}"
        );
    }
    s
}

/// The IPv4 networks of the host's own interfaces, but loopback and sandbox links.
pub(crate) fn host_networks() -> Result<Vec<Ipv4Net>, DriverError> {
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

/// Until an earlier release the host guard was an iptables rule dropping every new connection
/// from sandbox links, which would now also drop DNS queries to netd.
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
    fn host_networks_skip_loopback_and_sandbox_links() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\n\
                    2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n\
                    9: alv3    inet 10.77.0.13/30 scope global alv3\n";
        assert_eq!(
            parse_host_networks(text),
            ["192.0.2.0/24".parse::<Ipv4Net>().unwrap()]
        );
    }

    fn install(forwarding_was_on: bool) -> String {
        let deny = deny_set(vec!["192.0.2.0/24".parse().unwrap()]);
        base_ruleset(&Install {
            enforce: true,
            forwarding_was_on,
            deny: &deny,
            resolvers: &["10.255.255.53".parse().unwrap(), "fe80::1".parse().unwrap()],
            netd_uid: 999,
            known: &[],
        })
    }

    #[test]
    fn base_ruleset_blocks_what_no_policy_may_open() {
        let rules = install(false);
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
            "meta skuid 999 ip daddr { 10.255.255.53 } meta l4proto { tcp, udp } th dport 53 accept",
            "meta skuid 999 ip6 daddr { fe80::1 }",
            "meta skuid 999 ip daddr @platform_deny drop",
        ] {
            assert!(rules.contains(must), "missing {must}");
        }
        // Every packet from a sandbox is judged by its policy, and an unknown link is dropped.
        let forward =
            &rules[rules.find("chain forward").unwrap()..rules.find("chain netd_out").unwrap()];
        assert!(
            !forward.contains("\t\tct state established,related accept"),
            "{forward}"
        );
        assert!(forward.contains("iifname vmap @slots\n\t\tdrop\n"));
        assert!(install(true).contains("iifname != \"alv*\" return"));
    }

    #[test]
    fn slot_rules_allow_before_they_deny() {
        let egress = Egress::from_request(
            Some(false),
            &["1.1.1.1".into(), "pypi.org".into()],
            &["8.8.8.0/24".into()],
        )
        .unwrap();
        let rules = slot_update(7, &egress);
        let allow = rules.find("@slot7_allow accept").unwrap();
        let deny = rules.find("@slot7_deny drop").unwrap();
        assert!(allow < deny);
        assert!(
            !rules.contains("learned"),
            "DNS answers open nothing in the firewall"
        );
        assert!(rules.contains("add element inet airlock slot7_deny { 0.0.0.0/0, 8.8.8.0/24 }"));
        assert!(rules.contains("add element inet airlock slots { \"alv7\" : jump slot7 }"));
        assert!(
            rules.contains("@slot7_deny redirect to :10054"),
            "domains go to the proxy"
        );
        let no_domains = Egress::from_request(Some(false), &[], &[]).unwrap();
        assert!(!slot_update(7, &no_domains).contains("redirect"));
        let open = slot_update(7, &Egress::default());
        assert!(open.ends_with("add rule inet airlock slot7 accept\n"));
        assert!(slot_removal(7).contains("delete chain inet airlock slot7"));
    }
}
