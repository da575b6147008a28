//! A sandbox's outbound network policy: what E2B's `allow_internet_access` and
//! `network.allowOut` / `network.denyOut` ask for, checked and normalised.
//!
//! The rules, as E2B documents them: by default everything is allowed; `denyOut` blocks
//! addresses (`0.0.0.0/0` blocks all traffic, and `allow_internet_access: false` means just
//! that); `allowOut` entries win over `denyOut` and may be domains (`example.com`, or
//! `*.example.com` for its subdomains). A domain allows the TCP connections that name it (TLS
//! SNI, HTTP `Host`), and connections naming nothing to the addresses the sandbox's DNS
//! answered for it; it only matters where something is denied.
//!
//! What no policy can allow (the host, other sandboxes, [`PLATFORM_DENY`]: private and
//! link-local ranges, cloud metadata) is the driver's business and applies whatever this says.
//! The same ranges are what a template build's image pull may not reach.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Ranges no sandbox may reach, whatever its policy: "this network", private (RFC 1918),
/// shared address space (RFC 6598), loopback, link-local (cloud metadata), benchmarking,
/// multicast and reserved.
pub const PLATFORM_DENY: &[&str] = &[
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

/// [`PLATFORM_DENY`], parsed.
pub fn platform_deny() -> impl Iterator<Item = Ipv4Net> {
    PLATFORM_DENY
        .iter()
        .map(|n| n.parse().expect("valid constant"))
}

/// At most this many entries in each of `allowOut` and `denyOut`.
pub const MAX_RULES: usize = 256;

/// An IPv4 network, `addr/prefix`, with the host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    pub const ALL: Ipv4Net = Ipv4Net {
        addr: Ipv4Addr::UNSPECIFIED,
        prefix: 0,
    };

    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Self> {
        (prefix <= 32).then(|| Ipv4Net {
            addr: Ipv4Addr::from(u32::from(addr) & Self::mask(prefix)),
            prefix,
        })
    }

    fn mask(prefix: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Self::mask(self.prefix) == u32::from(self.addr)
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Ipv4Net {
    type Err = ();

    /// `1.2.3.4` (one address) or `1.2.3.0/24`.
    fn from_str(s: &str) -> Result<Self, ()> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => {
                // `u8::from_str` takes a leading `+`; a prefix is digits only.
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(());
                }
                (addr, prefix.parse().map_err(|_| ())?)
            }
            None => (s, 32),
        };
        Ipv4Net::new(addr.parse().map_err(|_| ())?, prefix).ok_or(())
    }
}

impl Serialize for Ipv4Net {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Net {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|()| serde::de::Error::custom(format!("not an IPv4 network: {s}")))
    }
}

/// A domain rule: `example.com` matches that name only, `*.example.com` any name below it.
/// Stored lower-case, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DomainPattern(String);

impl DomainPattern {
    pub fn matches(&self, name: &str) -> bool {
        // Bytes, not chars: a name from a sandbox may hold anything, and a byte slice cannot
        // split a character.
        let name = name.trim_end_matches('.').as_bytes();
        match self.0.strip_prefix("*.") {
            Some(parent) => {
                let parent = parent.as_bytes();
                name.len() > parent.len() + 1
                    && name[name.len() - parent.len()..].eq_ignore_ascii_case(parent)
                    && name[name.len() - parent.len() - 1] == b'.'
            }
            None => name.eq_ignore_ascii_case(self.0.as_bytes()),
        }
    }
}

impl TryFrom<String> for DomainPattern {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let lower = s.trim_end_matches('.').to_ascii_lowercase();
        let name = lower.strip_prefix("*.").unwrap_or(&lower);
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.len() > 253 || !name.contains('.') || !name.split('.').all(label_ok) {
            return Err(format!("'{s}' is not a domain name"));
        }
        Ok(DomainPattern(lower))
    }
}

impl From<DomainPattern> for String {
    fn from(d: DomainPattern) -> String {
        d.0
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The policy itself. The default allows everything the platform allows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// Allowed even where `deny_nets` matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_nets: Vec<Ipv4Net>,
    /// Allowed by name (see the module doc), even where `deny_nets`
    /// matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_domains: Vec<DomainPattern>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_nets: Vec<Ipv4Net>,
}

impl Egress {
    /// Checks a create request's network settings. Errors are meant for the API's caller.
    pub fn from_request(
        allow_internet_access: Option<bool>,
        allow_out: &[String],
        deny_out: &[String],
    ) -> Result<Egress, String> {
        if allow_out.len() > MAX_RULES || deny_out.len() > MAX_RULES {
            return Err(format!(
                "network.allowOut and network.denyOut take at most {MAX_RULES} entries each"
            ));
        }
        let mut egress = Egress::default();
        for entry in allow_out {
            let entry = entry.trim();
            if let Ok(net) = entry.parse() {
                egress.allow_nets.push(net);
            } else if entry.contains(':') {
                return Err(ipv6_refused(entry));
            } else if looks_like_an_address(entry) {
                return Err(format!(
                    "network.allowOut: '{entry}' is not a valid IPv4 address or CIDR block"
                ));
            } else {
                egress.allow_domains.push(
                    DomainPattern::try_from(entry.to_owned())
                        .map_err(|e| format!("network.allowOut: {e}"))?,
                );
            }
        }
        for entry in deny_out {
            let entry = entry.trim();
            match entry.parse() {
                Ok(net) => egress.deny_nets.push(net),
                Err(()) if entry.contains(':') => return Err(ipv6_refused(entry)),
                Err(()) if looks_like_an_address(entry) => {
                    return Err(format!(
                        "network.denyOut: '{entry}' is not a valid IPv4 address or CIDR block"
                    ))
                }
                Err(()) => {
                    return Err(format!(
                        "network.denyOut: '{entry}' is not an IPv4 address or CIDR block \
                         (domains can only be allowed, in network.allowOut)"
                    ))
                }
            }
        }
        if allow_internet_access == Some(false) {
            egress.deny_nets.push(Ipv4Net::ALL);
        }
        for list in [&mut egress.allow_nets, &mut egress.deny_nets] {
            list.sort();
            list.dedup();
        }
        egress.allow_domains.dedup();
        Ok(egress)
    }

    /// No rules: everything the platform allows is allowed.
    pub fn is_open(&self) -> bool {
        self.deny_nets.is_empty()
    }

    /// Everything is denied but what `allow_*` names.
    pub fn denies_all(&self) -> bool {
        self.deny_nets.contains(&Ipv4Net::ALL)
    }

    pub fn allows_domain(&self, name: &str) -> bool {
        self.allow_domains.iter().any(|d| d.matches(name))
    }

    /// Whether the sandbox's DNS resolves `name`. With all traffic denied only allowed domains
    /// resolve, so DNS cannot carry data out of a sandbox that has no internet.
    pub fn resolves(&self, name: &str) -> bool {
        !self.denies_all() || self.allows_domain(name)
    }

    /// Whether a connection to `ip` is allowed by address alone (domains aside).
    pub fn allows_addr(&self, ip: Ipv4Addr) -> bool {
        self.allow_nets.iter().any(|n| n.contains(ip))
            || !self.deny_nets.iter().any(|n| n.contains(ip))
    }

    /// E2B's `allowOut`, normalised: the allowed networks, then the allowed domains.
    pub fn allow_out(&self) -> Vec<String> {
        let nets = self.allow_nets.iter().map(ToString::to_string);
        nets.chain(self.allow_domains.iter().map(ToString::to_string))
            .collect()
    }

    /// E2B's `denyOut`, normalised.
    pub fn deny_out(&self) -> Vec<String> {
        self.deny_nets.iter().map(ToString::to_string).collect()
    }
}

fn ipv6_refused(entry: &str) -> String {
    format!("'{entry}': IPv6 rules are not supported (sandboxes have no IPv6 egress)")
}

/// Digits, dots and a slash only: meant as an address, not a domain.
fn looks_like_an_address(entry: &str) -> bool {
    entry
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn networks_parse_and_normalise() {
        let net: Ipv4Net = "10.1.2.3/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains("10.255.0.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert_eq!(
            "1.1.1.1".parse::<Ipv4Net>().unwrap().to_string(),
            "1.1.1.1/32"
        );
        assert!(Ipv4Net::ALL.contains("203.0.113.9".parse().unwrap()));
        for bad in ["1.2.3.4/33", "1.2.3/24", "1.2.3.4/", "1.2.3.4/+8", "x", ""] {
            assert!(bad.parse::<Ipv4Net>().is_err(), "{bad}");
        }
    }

    #[test]
    fn domains_match_exactly_or_below_a_wildcard() {
        let exact = DomainPattern::try_from("Example.COM.".to_string()).unwrap();
        assert!(exact.matches("example.com") && exact.matches("EXAMPLE.com."));
        assert!(!exact.matches("www.example.com") && !exact.matches("badexample.com"));
        let wild = DomainPattern::try_from("*.example.com".to_string()).unwrap();
        assert!(wild.matches("a.example.com") && wild.matches("a.b.Example.com"));
        assert!(!wild.matches("example.com") && !wild.matches("aexample.com"));
        assert!(!wild.matches("ééééé.com") && !exact.matches("éxample.com"));
        for bad in [
            "localhost",
            "-a.com",
            "a..com",
            "a b.com",
            "*.",
            "*.*.com",
            "é.com",
        ] {
            assert!(DomainPattern::try_from(bad.to_string()).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_become_policies() {
        assert!(Egress::from_request(None, &[], &[]).unwrap().is_open());
        let off = Egress::from_request(Some(false), &[], &[]).unwrap();
        assert!(off.denies_all() && !off.allows_addr("8.8.8.8".parse().unwrap()));
        assert!(!off.resolves("pypi.org"));

        let p = Egress::from_request(
            Some(true),
            &strings(&["1.1.1.1", "pypi.org", "*.debian.org"]),
            &strings(&["0.0.0.0/0"]),
        )
        .unwrap();
        assert!(p.allows_addr("1.1.1.1".parse().unwrap()));
        assert!(!p.allows_addr("1.1.1.2".parse().unwrap()));
        assert!(p.resolves("pypi.org") && p.resolves("deb.debian.org"));
        assert!(!p.resolves("example.com"));

        let some = Egress::from_request(None, &[], &strings(&["9.9.9.0/24"])).unwrap();
        assert!(!some.allows_addr("9.9.9.9".parse().unwrap()));
        assert!(some.allows_addr("8.8.8.8".parse().unwrap()) && some.resolves("example.com"));
    }

    #[test]
    fn bad_rules_are_explained() {
        let err = |allow: &[&str], deny: &[&str]| {
            Egress::from_request(None, &strings(allow), &strings(deny)).unwrap_err()
        };
        assert!(err(&[], &["example.com"]).contains("domains can only be allowed"));
        assert!(err(&["::1"], &[]).contains("IPv6"));
        assert!(err(&[], &["1.2.3.4/40"]).contains("not a valid IPv4"));
        assert!(err(&["not a domain"], &[]).contains("not a domain name"));
        let many = vec!["1.1.1.1".to_string(); MAX_RULES + 1];
        assert!(Egress::from_request(None, &many, &[]).is_err());
    }

    #[test]
    fn round_trips_through_json() {
        let p = Egress::from_request(Some(false), &strings(&["a.example.com"]), &[]).unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"{"allow_domains":["a.example.com"],"deny_nets":["0.0.0.0/0"]}"#
        );
        assert_eq!(serde_json::from_str::<Egress>(&json).unwrap(), p);
        assert_eq!(
            serde_json::from_str::<Egress>("{}").unwrap(),
            Egress::default()
        );
    }
}
