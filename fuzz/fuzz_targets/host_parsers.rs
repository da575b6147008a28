//! The parsers the server runs on bytes a sandbox chose, on the host: the DNS forwarder's query
//! and answer readers (`airlock_gvisor::parsers::{parse_query, error_reply, answer_addrs}`), the
//! domain proxy's SNI / HTTP `Host` reader (`server_name`), and domain-rule matching.
//!
//! Input: byte 0 picks a split point, the rest is one message (or a connection's first bytes).
//!
//! Checked:
//! * no parser panics;
//! * a refusal keeps the query's id, sets QR, and echoes the query's question;
//! * a name the proxy reads is non-empty, lower-case and made of DNS name characters only;
//! * the proxy's decision is final: once a prefix of the bytes gives a name (or "no name"), the
//!   whole input gives the same answer, so reading more can never change what was allowed;
//! * domain rules match any string without panicking, and a matching name ends with the rule.
#![no_main]

use airlock_core::egress::DomainPattern;
use airlock_gvisor::parsers::{answer_addrs, error_reply, parse_query, server_name, Peek};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, msg)) = data.split_first() else {
        return;
    };

    // DNS.
    match parse_query(msg) {
        Some(query) => {
            let reply = error_reply(msg, Some(&query), 5);
            assert_eq!(&reply[..2], &query.id.to_be_bytes());
            assert_eq!(reply[2] & 0x80, 0x80, "a reply");
            assert_eq!(reply[3] & 0x0f, 5);
            assert_eq!(&reply[12..], &msg[12..reply.len()], "the question, echoed");
            assert!(!query.name.contains(|c: char| c.is_ascii_uppercase()));
            let _ = answer_addrs(msg, query.id);
        }
        None => assert_eq!(error_reply(msg, None, 1).len(), 12),
    }
    if msg.len() >= 2 {
        let _ = answer_addrs(msg, u16::from_be_bytes([msg[0], msg[1]]));
    }

    // The domain proxy's reader.
    let whole = server_name(msg);
    if let Peek::Name(name) = &whole {
        assert!(!name.is_empty());
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)));
    }
    let cut = usize::from(split) * msg.len() / 255;
    match server_name(&msg[..cut]) {
        Peek::NeedMore => {}
        early => assert_eq!(early, whole, "a decision made on {cut} bytes changed"),
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
