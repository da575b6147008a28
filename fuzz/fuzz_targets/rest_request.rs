//! The server's REST request parsing: JSON bodies through the same `JsonBody` extractor the
//! handlers use, create's map checks, the list query and its triple-encoded `metadata` filter,
//! percent-decoding, and the proxy's routing of a request to a sandbox.
//!
//! Input: byte 0 picks what the rest is (taken modulo 6; the seeds use the ASCII digits):
//! * `0`: a create body (`NewSandbox`), then `check_map` on its metadata and env vars and
//!   `Egress::from_request` on its network settings;
//! * `1`: a timeout / connect / resume body, a fork body and a snapshot body;
//! * `2`: the query string of `GET /v2/sandboxes` (as the HTTP layer decodes it), then the
//!   `metadata` filter, and the proxy's `url_pairs` on the same string;
//! * `3`: a `metadata` filter as the handler receives it;
//! * `4`: a string for `percent_decode`;
//! * `5`: lines `Host`, `E2b-Sandbox-Id`, `E2b-Sandbox-Port`, path and query: proxy routing.
//!
//! Beyond "no panic", each result is checked against the rules it implements (see each
//! function).
#![no_main]

use airlock_request::{
    check_map, classify, parse_metadata_filter, percent_decode, url_pairs, JsonBody, Target,
};
use airlock_wire::egress::{DomainPattern, Egress, Ipv4Net, MAX_RULES};
use airlock_wire::api::{ForkRequest, NetworkConfig, NewSandbox, SnapshotRequest, TimeoutBody};
use airlock_wire::{ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};
use axum::extract::{FromRequest, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};

/// Create's limits on `metadata` and `envVars` (crates/request/src/fields.rs).
const MAX_MAP_ENTRIES: usize = 256;
const MAX_MAP_BYTES: usize = 64 * 1024;

/// Runs `JsonBody<T>` on `body` and checks it agrees with serde_json on the same bytes (a blank
/// body meaning `{}`), and that a rejection is a 400 with a message.
fn json_body<T: DeserializeOwned + std::fmt::Debug>(body: &[u8]) -> Option<T> {
    let req = axum::http::Request::post("/")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
        .unwrap();
    let got = futures::executor::block_on(JsonBody::<T>::from_request(req, &()));
    let blank = body.iter().all(u8::is_ascii_whitespace);
    let direct = serde_json::from_slice::<T>(if blank { b"{}" } else { body });
    assert_eq!(
        got.is_ok(),
        direct.is_ok(),
        "JsonBody and serde_json disagree"
    );
    match got {
        Ok(JsonBody(v)) => Some(v),
        Err(e) => {
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(!e.message.is_empty());
            None
        }
    }
}

/// `check_map` accepts exactly the maps within the limits, and for env vars only names a
/// process environment can hold (non-empty, no `=`, no NUL).
fn check_map_agrees(what: &str, map: &BTreeMap<String, String>) {
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut ok = map.len() <= MAX_MAP_ENTRIES && bytes <= MAX_MAP_BYTES;
    if what == "envVars" {
        ok &= map
            .keys()
            .all(|k| !k.is_empty() && !k.contains('=') && !k.contains('\0'));
    }
    let got = check_map(what, map);
    assert_eq!(got.is_ok(), ok, "check_map({what}) on {map:?}");
    if let Err(e) = got {
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}

fn create_body(data: &[u8]) {
    let Some(body) = json_body::<NewSandbox>(data) else {
        return;
    };
    check_map_agrees("metadata", &body.metadata.unwrap_or_default());
    check_map_agrees("envVars", &body.env_vars.unwrap_or_default());
    egress(
        body.allow_internet_access,
        &body.network.unwrap_or_default(),
    );
}

/// Create's network settings, as the create handler checks them: a policy in normal form that
/// means what was asked.
fn egress(allow_internet_access: Option<bool>, network: &NetworkConfig) {
    let allow_out = network.allow_out.as_deref().unwrap_or_default();
    let deny_out = network.deny_out.as_deref().unwrap_or_default();
    let policy = match Egress::from_request(allow_internet_access, allow_out, deny_out) {
        Ok(policy) => policy,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    assert!(allow_out.len() <= MAX_RULES && deny_out.len() <= MAX_RULES);
    for nets in [&policy.allow_nets, &policy.deny_nets] {
        assert!(
            nets.windows(2).all(|w| w[0] < w[1]),
            "not sorted and deduplicated"
        );
        for net in nets {
            assert_eq!(net.to_string().parse::<Ipv4Net>(), Ok(*net));
        }
    }
    assert_eq!(
        policy.denies_all(),
        allow_internet_access == Some(false) || policy.deny_nets.contains(&Ipv4Net::ALL)
    );
    assert_eq!(policy.is_open(), policy.deny_nets.is_empty());
    if deny_out.is_empty() && allow_internet_access != Some(false) {
        assert!(policy.is_open());
    }
    for domain in &policy.allow_domains {
        let text = domain.to_string();
        assert_eq!(DomainPattern::try_from(text.clone()).as_ref(), Ok(domain));
        // Validated names are ASCII; a wildcard matches below its parent, not the parent.
        let example = match text.strip_prefix("*.") {
            Some(parent) => {
                assert!(!domain.matches(parent));
                format!("x.{}", parent.to_ascii_uppercase())
            }
            None => format!("{text}."),
        };
        assert!(domain.matches(&example), "{text} does not match {example}");
        assert!(policy.allows_domain(&example) && policy.resolves(&example));
    }
}

fn other_bodies(data: &[u8]) {
    let blank = data.iter().all(u8::is_ascii_whitespace);
    let timeout = json_body::<TimeoutBody>(data);
    let fork = json_body::<ForkRequest>(data);
    let snapshot = json_body::<SnapshotRequest>(data);
    if blank {
        // An empty body is `{}`: every field optional.
        assert!(timeout.is_some_and(|t| t.timeout.is_none()));
        assert!(fork.is_some_and(|f| f.count.is_none() && f.timeout.is_none()));
        assert!(snapshot.is_some_and(|s| s.name.is_none()));
    }
}

/// `%XX` for every byte but the unreserved ones: what a client's URL quoting produces.
fn quote(s: &str) -> String {
    s.bytes()
        .map(
            |b| match b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                true => char::from(b).to_string(),
                false => format!("%{b:02X}"),
            },
        )
        .collect()
}

/// The decoding `percent_decode` documents: `%` and two hex digits, `+` for a space, and the
/// result must be UTF-8.
fn reference_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                let digit = |b: u8| (b as char).to_digit(16).unwrap() as u8;
                out.push(digit(hex[0]) << 4 | digit(hex[1]));
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

fn decode(s: &str) {
    assert_eq!(
        percent_decode(s),
        reference_decode(s),
        "percent_decode({s:?})"
    );
    assert_eq!(
        percent_decode(&quote(s)).as_deref(),
        Some(s),
        "quoted round trip"
    );
    assert_eq!(
        percent_decode(&quote(s).replace("%20", "+")).as_deref(),
        Some(s),
        "form round trip"
    );
}

/// A filter the handler accepts means the same after the SDK's triple quoting of it.
fn metadata_filter(raw: &str) {
    let Ok(filter) = parse_metadata_filter(raw) else {
        return;
    };
    // The SDK: urlencode(metadata), sent as one query parameter (quoted again); the HTTP layer
    // takes off one level before the handler sees it.
    let inner: Vec<String> = filter
        .iter()
        .map(|(k, v)| format!("{}={}", quote(k), quote(v)))
        .collect();
    let again = parse_metadata_filter(&quote(&inner.join("&")));
    assert_eq!(
        again.ok().as_ref(),
        Some(&filter),
        "filter round trip of {raw:?}"
    );
}

fn list_query(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let pairs = url_pairs(query);
    assert!(pairs.len() <= query.split('&').count());
    let Ok(uri) = format!("/v2/sandboxes?{query}").parse::<Uri>() else {
        return;
    };
    let Ok(Query(params)) = Query::<HashMap<String, String>>::try_from_uri(&uri) else {
        return;
    };
    if let Some(raw) = params.get("metadata") {
        metadata_filter(raw);
    }
}

/// Routing: the sandbox headers win, then a `{port}-{id}.` Host, then a signed `/files` URL.
fn routing(data: &[u8]) {
    let mut lines = data.split(|&b| b == b'\n');
    let mut headers = HeaderMap::new();
    for name in ["host", SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER] {
        let line = lines.next().unwrap_or_default();
        if line.is_empty() {
            continue;
        }
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.insert(name, value);
        }
    }
    let rest = lines.next().unwrap_or_default();
    let Ok(uri) = Uri::try_from(rest) else {
        return;
    };
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());

    let target = classify(&headers, &uri);
    if let Some(id) = text(SANDBOX_ID_HEADER) {
        let port = text(SANDBOX_PORT_HEADER)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(ENVD_PORT);
        assert_eq!(
            target,
            Some(Target::Sandbox {
                id: id.trim().to_owned(),
                port
            })
        );
        return;
    }
    match target {
        Some(Target::Sandbox { id, port }) => {
            let host = text("host").expect("routed by a Host it has not got");
            let label = host.split('.').next().unwrap();
            assert!(label.len() < host.len(), "bare host {host:?} routed");
            let (p, rest) = label.split_once('-').unwrap();
            assert_eq!(rest, id);
            assert_eq!(p.parse::<u16>().ok(), Some(port));
            assert!(!id.is_empty());
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        }
        Some(Target::SignedFiles) => {
            assert_eq!(uri.path(), "/files");
            assert!(uri
                .query()
                .unwrap()
                .split('&')
                .any(|kv| kv.starts_with("signature=")));
        }
        None => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => create_body(rest),
        1 => other_bodies(rest),
        2 => list_query(rest),
        3 => {
            if let Ok(raw) = std::str::from_utf8(rest) {
                metadata_filter(raw);
            }
        }
        4 => {
            if let Ok(s) = std::str::from_utf8(rest) {
                decode(s);
            }
        }
        _ => routing(rest),
    }
});
