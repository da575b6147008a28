//! What the REST API checks of a request's fields and query strings before anything acts on
//! them: the size of the maps a create attaches, the list filter's quoting, and query strings.

use crate::Rejection;
use std::collections::BTreeMap;

/// Caps on what a create may attach, so one client cannot bloat the store.
const MAX_MAP_ENTRIES: usize = 256;
const MAX_MAP_BYTES: usize = 64 * 1024;

pub fn check_map(what: &str, map: &BTreeMap<String, String>) -> Result<(), Rejection> {
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if map.len() > MAX_MAP_ENTRIES || bytes > MAX_MAP_BYTES {
        return Err(Rejection::bad_request(format!(
            "{what} is too large (at most {MAX_MAP_ENTRIES} entries and {MAX_MAP_BYTES} bytes)"
        )));
    }
    if what == "envVars" {
        if let Some(bad) = map.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
            return Err(Rejection::bad_request(format!(
                "invalid env var name {bad:?}"
            )));
        }
    }
    Ok(())
}

/// `metadata` as the SDK sends it: quoted three times (protocol doc §2.2).
pub fn parse_metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, Rejection> {
    let once = decoded(raw)?;
    let mut out = BTreeMap::new();
    for pair in once.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            Rejection::bad_request(format!("metadata filter {pair:?} is not key=value"))
        })?;
        out.insert(decoded(k)?, decoded(v)?);
    }
    Ok(out)
}

fn decoded(s: &str) -> Result<String, Rejection> {
    percent_decode(s)
        .ok_or_else(|| Rejection::bad_request(format!("malformed percent-encoding in {s:?}")))
}

/// Decodes `%XX` escapes and `+` (query-string form); `None` if malformed or not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                // Two hex digits: `from_str_radix` alone also takes a sign (`%+a`).
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A query string's `key=value` pairs, decoded; a pair that does not decode is left out.
pub fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_is_decoded_three_times() {
        // What the SDK sends for {"user": "a b"} after the HTTP layer's own decoding.
        let parsed = parse_metadata_filter("user=a%2520b").unwrap();
        assert_eq!(parsed.get("user").map(String::as_str), Some("a b"));
        let two = parse_metadata_filter("a%3D1%26b%3D2").unwrap();
        assert_eq!(two.len(), 2);
        assert!(parse_metadata_filter("novalue").is_err());
        assert!(parse_metadata_filter("a=%zz").is_err());
    }

    #[test]
    fn env_var_names_are_checked() {
        let ok = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert!(check_map("envVars", &ok).is_ok());
        let bad = BTreeMap::from([("A=B".to_string(), "1".to_string())]);
        assert!(check_map("envVars", &bad).is_err());
    }

    #[test]
    fn percent_escapes_decode() {
        assert_eq!(percent_decode("%2Fhome+a"), Some("/home a".to_string()));
        // Found by fuzzing (fuzz/corpus/rest_request/regress_percent_sign): a signed escape.
        assert_eq!(percent_decode("%+a"), None);
        assert_eq!(percent_decode("%2B%2b"), Some("++".to_string()));
    }

    #[test]
    fn query_strings_decode() {
        assert_eq!(
            url_pairs("path=%2Fhome%2Fuser&x=a+b"),
            vec![
                ("path".to_string(), "/home/user".to_string()),
                ("x".to_string(), "a b".to_string())
            ]
        );
    }
}
