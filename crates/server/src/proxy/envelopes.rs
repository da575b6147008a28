//! Connect streams (a command's output, a directory watch) are forwarded whole envelopes at a
//! time, so that when their sandbox is killed or paused they can still end as Connect ends a
//! stream: with an end-of-stream message carrying the error. The SDKs map its `unavailable`
//! "was not found" to "the sandbox is not running"; a body cut mid-stream reads as a network
//! failure instead.

use airlock_wire::connect::{encode_end, Code, ConnectError, FLAG_END_STREAM, MAX_ENVELOPE_LEN};
use axum::http::{header, HeaderMap};
use bytes::{Bytes, BytesMut};

/// `flags:u8 | len:u32be`.
const HEADER_LEN: usize = 5;

/// Whether a response is a Connect stream, whatever its codec (`+json`, `+proto`): its
/// end-of-stream message is JSON either way.
pub fn is_connect_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/connect+"))
}

/// How a Connect stream ends when its sandbox goes away.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut {
    /// Send this end-of-stream message, then end the body.
    End(Bytes),
    /// The sandbox already ended the stream: end the body.
    Complete,
    /// The stream cannot end cleanly (it was not followed envelope by envelope): break it.
    Break,
}

/// A Connect stream split at envelope boundaries as it passes through.
#[derive(Default)]
pub struct Envelopes {
    /// Received and not yet forwarded: the start of an envelope still arriving.
    partial: BytesMut,
    /// The end-of-stream message was forwarded (the sandbox's, or ours): nothing may follow.
    ended: bool,
    /// An envelope too large to hold back came: the rest passes through as it arrives.
    unframed: bool,
}

impl Envelopes {
    /// Takes the next chunk of the stream; gives back the envelopes it completes (maybe none).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        if self.unframed {
            return chunk;
        }
        self.partial.extend_from_slice(&chunk);
        let mut whole = 0;
        while let Some(head) = self.partial.get(whole..whole + HEADER_LEN) {
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if len > MAX_ENVELOPE_LEN {
                self.unframed = true;
                return self.partial.split().freeze();
            }
            if self.partial.len() - whole - HEADER_LEN < len {
                break;
            }
            self.ended |= head[0] & FLAG_END_STREAM != 0;
            whole += HEADER_LEN + len;
        }
        self.partial.split_to(whole).freeze()
    }

    /// What is left when the sandbox's body ends: an envelope it never finished, passed on as
    /// it is for the client to reject.
    pub fn rest(&mut self) -> Bytes {
        self.partial.split().freeze()
    }

    /// Ends the stream now that sandbox `id` is killed or paused; the envelope still arriving
    /// is dropped.
    pub fn cut(&mut self, id: &str) -> Cut {
        self.partial.clear();
        if self.unframed {
            return Cut::Break;
        }
        if std::mem::replace(&mut self.ended, true) {
            return Cut::Complete;
        }
        // "was not found" is what both SDKs look for in an `unavailable` from E2B's proxy.
        let error = ConnectError::new(
            Code::Unavailable,
            format!("The sandbox {id} was not found: it was killed or paused while this stream was open"),
        );
        Cut::End(encode_end(Some(error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_wire::connect::{encode_message, Decoder};
    use serde_json::json;

    fn message(n: u32) -> Bytes {
        encode_message(&json!({ "n": n }))
    }

    fn concat(parts: &[Bytes]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn forwards_only_whole_envelopes_however_the_chunks_split() {
        let wire = concat(&[message(1), message(22), message(333)]);
        for split in 0..=wire.len() {
            let mut envelopes = Envelopes::default();
            let first = envelopes.push(Bytes::copy_from_slice(&wire[..split]));
            let second = envelopes.push(Bytes::copy_from_slice(&wire[split..]));
            assert_eq!(envelopes.rest(), Bytes::new());
            // Each forwarded piece parses into whole envelopes with nothing left over.
            for piece in [&first, &second] {
                let mut decoder = Decoder::default();
                decoder.push(piece);
                while decoder.next_envelope().unwrap().is_some() {}
                decoder.finish().unwrap();
            }
            assert_eq!(concat(&[first, second]), wire);
        }
    }

    #[test]
    fn several_envelopes_in_one_chunk_pass_together() {
        let mut envelopes = Envelopes::default();
        let chunk = Bytes::from(concat(&[message(1), message(2)]));
        assert_eq!(envelopes.push(chunk.clone()), chunk);
    }

    #[test]
    fn a_cut_drops_the_partial_envelope_and_ends_with_unavailable_once() {
        let mut envelopes = Envelopes::default();
        let two = message(2);
        let chunk = Bytes::from(concat(&[message(1), two.slice(..7)]));
        assert_eq!(envelopes.push(chunk), message(1));

        let Cut::End(end) = envelopes.cut("sbx1") else {
            panic!("expected an end-of-stream message");
        };
        let mut decoder = Decoder::default();
        decoder.push(&end);
        let last = decoder.next_envelope().unwrap().unwrap();
        decoder.finish().unwrap();
        assert!(last.is_end_stream());
        let body: serde_json::Value = serde_json::from_slice(&last.payload).unwrap();
        assert_eq!(body["error"]["code"], "unavailable");
        let text = body["error"]["message"].as_str().unwrap();
        assert!(text.contains("sbx1 was not found"), "{text}");

        assert_eq!(envelopes.cut("sbx1"), Cut::Complete);
        assert_eq!(envelopes.rest(), Bytes::new());
    }

    #[test]
    fn a_stream_the_sandbox_ended_gets_no_second_end() {
        let mut envelopes = Envelopes::default();
        let chunk = Bytes::from(concat(&[message(1), encode_end(None)]));
        assert_eq!(envelopes.push(chunk.clone()), chunk);
        assert_eq!(envelopes.cut("sbx1"), Cut::Complete);
    }

    #[test]
    fn an_envelope_too_large_to_hold_back_passes_through_and_breaks_on_a_cut() {
        let mut envelopes = Envelopes::default();
        let mut head = vec![0u8];
        head.extend_from_slice(&(MAX_ENVELOPE_LEN as u32 + 1).to_be_bytes());
        head.extend_from_slice(b"{\"a\"");
        let head = Bytes::from(head);
        assert_eq!(envelopes.push(head.clone()), head);
        assert_eq!(envelopes.push(Bytes::from_static(b":1")), &b":1"[..]);
        assert_eq!(envelopes.cut("sbx1"), Cut::Break);
    }

    #[test]
    fn an_unfinished_envelope_at_the_sandbox_end_is_passed_on() {
        let mut envelopes = Envelopes::default();
        let one = message(1);
        assert_eq!(envelopes.push(one.slice(..3)), Bytes::new());
        assert_eq!(envelopes.rest(), one.slice(..3));
    }

    #[test]
    fn only_connect_streams_are_framed() {
        let typed = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, t.parse().unwrap());
            h
        };
        assert!(is_connect_stream(&typed("application/connect+json")));
        assert!(is_connect_stream(&typed("application/connect+proto")));
        assert!(!is_connect_stream(&typed("application/json")));
        assert!(!is_connect_stream(&typed("application/octet-stream")));
        assert!(!is_connect_stream(&HeaderMap::new()));
    }
}
