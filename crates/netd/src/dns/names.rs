//! Which names sandboxes may resolve: public ones only. The host's resolvers also know the
//! host's own world (its search domains, internal zones, reverse zones of private ranges), and
//! none of that is a sandbox's business: asking would map the host's network from inside.

/// Zones that are never public: special-use names (RFC 6761, 6762, 8375) and the usual private
/// ones.
const INTERNAL_ZONES: &[&str] = &[
    "localhost",
    "local",
    "localdomain",
    "internal",
    "intranet",
    "private",
    "corp",
    "home",
    "lan",
    "home.arpa",
    "invalid",
    "ip6.arpa",
];

/// Reverse zones of ranges no sandbox may reach (`in-addr.arpa` under these labels).
const PRIVATE_REVERSE: &[&str] = &["0", "10", "127", "254.169", "168.192"];

/// Whether a sandbox may resolve `name` (lower-case, no trailing dot), given the host's search
/// domains.
pub fn is_public(name: &str, search: &[String]) -> bool {
    let under = |zone: &str| name == zone || name.ends_with(&format!(".{zone}"));
    // A single label is one the host's resolver would complete with its search domains.
    name.contains('.')
        && !INTERNAL_ZONES.iter().any(|z| under(z))
        && !search.iter().any(|s| under(s.trim_end_matches('.')))
        && !private_reverse(name)
}

fn private_reverse(name: &str) -> bool {
    let Some(reversed) = name.strip_suffix(".in-addr.arpa") else {
        return false;
    };
    let ends_with = |zone: &str| reversed == zone || reversed.ends_with(&format!(".{zone}"));
    if PRIVATE_REVERSE.iter().any(|z| ends_with(z)) {
        return true;
    }
    // 172.16/12 and 100.64/10, by their second octet.
    let mut octets = reversed.rsplit('.');
    match (
        octets.next(),
        octets.next().and_then(|o| o.parse::<u8>().ok()),
    ) {
        (Some("172"), Some(second)) => (16..=31).contains(&second),
        (Some("100"), Some(second)) => (64..=127).contains(&second),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_names_resolve() {
        let search = vec!["corp.example.com".to_string()];
        for ok in [
            "pypi.org",
            "deb.debian.org",
            "8.8.8.8.in-addr.arpa",
            "local.example",
        ] {
            assert!(is_public(ok, &search), "{ok}");
        }
        for no in [
            "intranet",
            "db.local",
            "localhost",
            "host.internal",
            "printer.home.arpa",
            "build.corp.example.com",
            "corp.example.com",
            "1.0.0.10.in-addr.arpa",
            "10.in-addr.arpa",
            "1.0.20.172.in-addr.arpa",
            "1.1.254.169.in-addr.arpa",
            "1.0.64.100.in-addr.arpa",
            "x.ip6.arpa",
        ] {
            assert!(!is_public(no, &search), "{no}");
        }
        assert!(
            is_public("1.0.15.172.in-addr.arpa", &search),
            "172.15 is public"
        );
    }
}
