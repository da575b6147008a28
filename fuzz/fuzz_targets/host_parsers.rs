//! The parsers that read bytes a sandbox chose, in `airlock-netd`: the DNS forwarder's query and
//! answer readers and its public-name rule, the domain proxy's first-bytes classifier and its
//! HTTP/1 request follower, and domain-rule matching.
//!
//! Input: byte 0 picks a split point, the rest is one message (or a connection's first bytes).
//!
//! Checked:
//! * no parser panics;
//! * a refusal keeps the query's id, sets QR, and echoes the query's question;
//! * a query's question is what a reply must echo, and a refusal echoes exactly that;
//! * the classifier's decision is final: once a prefix of the bytes gives an answer, the whole
//!   input gives the same one, so reading more can never change what was allowed;
//! * a TLS server name is non-empty, lower-case and made of DNS name characters only;
//! * the HTTP follower lets through the same bytes and names whether the input comes whole or
//!   in two pieces, and nothing after a refusal; every name it lets through was allowed;
//! * domain rules match any string without panicking, and a matching name ends with the rule.
#![no_main]

use airlock_netd::dns::message::{answer_addrs, answers, error_reply, parse_query};
use airlock_netd::dns::names::is_public;
use airlock_netd::proxy::http1::Requests;
use airlock_netd::proxy::peek::{classify, First};
use airlock_wire::egress::DomainPattern;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, msg)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split) * msg.len() / 255;

    // DNS.
    match parse_query(msg) {
        Some(query) => {
            let reply = error_reply(msg, Some(&query), 5);
            assert_eq!(&reply[..2], &query.id.to_be_bytes());
            assert_eq!(reply[2] & 0x80, 0x80, "a reply");
            assert_eq!(reply[3] & 0x0f, 5);
            assert_eq!(&reply[12..], query.question(msg), "the question, echoed");
            assert!(answers(&reply, query.id, query.question(msg)));
            assert!(!query.name.contains(|c: char| c.is_ascii_uppercase()));
            let _ = answer_addrs(msg, query.id);
            let _ = is_public(&query.name, &["corp.example".to_string()]);
        }
        None => assert_eq!(error_reply(msg, None, 1).len(), 12),
    }
    if msg.len() >= 2 {
        let _ = answer_addrs(msg, u16::from_be_bytes([msg[0], msg[1]]));
    }

    // The proxy's first look.
    let whole = classify(msg);
    if let First::Tls(name) = &whole {
        assert!(!name.is_empty());
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)));
    }
    match classify(&msg[..cut]) {
        First::NeedMore => {}
        early => assert_eq!(early, whole, "a decision made on {cut} bytes changed"),
    }

    // The proxy's HTTP follower, whole and in two pieces.
    let allowed = |name: &str| name == "allowed.example" || name.ends_with(".example");
    let at_once = Requests::default().feed(msg, &allowed);
    let mut pieces = Requests::default();
    let in_two = pieces.feed(&msg[..cut], &allowed).and_then(|mut first| {
        let second = pieces.feed(&msg[cut..], &allowed)?;
        first.bytes.extend(second.bytes);
        first.names.extend(second.names);
        Ok(first)
    });
    match (&at_once, &in_two) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the reads' boundaries changed what passed"),
        (Err(_), Err(_)) => {}
        _ => panic!("whole {at_once:?}, in two {in_two:?}"),
    }
    if let Ok(passed) = &at_once {
        assert!(passed.names.iter().all(|n| allowed(n)));
        assert!(msg.starts_with(&passed.bytes), "only a prefix passes, unchanged");
    }

    // Domain rules against whatever name a sandbox may send.
    let name = String::from_utf8_lossy(msg);
    for rule in ["*.example.com", "example.com", "*.a.b"] {
        let pattern = DomainPattern::try_from(rule.to_string()).expect("valid rule");
        if pattern.matches(&name) {
            let bare = rule.trim_start_matches("*.");
            assert!(name
                .trim_end_matches('.')
                .to_ascii_lowercase()
                .ends_with(bare));
        }
    }
});
