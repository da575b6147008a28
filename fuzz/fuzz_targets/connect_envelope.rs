//! The Connect streaming envelope decoder (`airlock_wire::connect::Decoder`) and the agent's
//! `rpc::MessageReader` built on it, fed arbitrary bytes split into arbitrary chunks.
//!
//! Input: byte 0 seeds the chunking, the rest is the request body as it comes off the wire.
//!
//! Checked against a whole-buffer model decoder written here from the framing rules
//! (`flags:u8 | len:u32be | payload`, at most `MAX_ENVELOPE_LEN`, no compression):
//! * the incremental decoder yields the same envelopes and the same error however the bytes are
//!   chunked, every payload is exactly as long as its header says, and re-framing the envelopes
//!   gives back the bytes they were read from;
//! * an error is sticky, and `finish` fails exactly when bytes of a partial envelope are left;
//! * `MessageReader` (what the agent's streaming RPCs read requests with) yields the messages,
//!   end of stream and errors the model predicts, and `read_stream_request` accepts exactly one
//!   message;
//! * what `encode_message` / `encode_end` write decodes back to the same payload.
#![no_main]

use airlock_agent::rpc::{self, MessageReader};
use airlock_wire::connect::{
    self, DecodeError, Decoder, EndOfStream, Envelope, FLAG_COMPRESSED, FLAG_END_STREAM,
    MAX_ENVELOPE_LEN,
};
use airlock_wire::envd::{StartRequest, StreamInputRequest};
use axum::body::Body;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::convert::Infallible;

/// What the model decoder makes of a whole body.
struct Model<'a> {
    /// `(flags, payload)` of each whole envelope, in order.
    frames: Vec<(u8, &'a [u8])>,
    /// The error the frame after the last one fails with, if any.
    error: Option<DecodeError>,
    /// Bytes taken up by `frames`.
    consumed: usize,
}

fn model(wire: &[u8]) -> Model<'_> {
    let mut frames = Vec::new();
    let mut pos = 0;
    let error = loop {
        let rest = &wire[pos..];
        if rest.len() < 5 {
            break None;
        }
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len > MAX_ENVELOPE_LEN {
            break Some(DecodeError::TooLarge(len));
        }
        if rest[0] & FLAG_COMPRESSED != 0 {
            break Some(DecodeError::Compressed);
        }
        if rest.len() - 5 < len {
            break None;
        }
        frames.push((rest[0], &rest[5..5 + len]));
        pos += 5 + len;
    };
    Model {
        frames,
        error,
        consumed: pos,
    }
}

/// Splits `wire` into chunks whose sizes (0 to 16 bytes, empty chunks included) come from a
/// small generator seeded by `seed`; seed 0 passes the body as one chunk.
fn chunks(seed: u8, wire: &[u8]) -> Vec<&[u8]> {
    if seed == 0 {
        return vec![wire];
    }
    let mut state = u32::from(seed) | 0x100;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < wire.len() {
        // xorshift32
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let size = (state % 17) as usize;
        let end = (pos + size).min(wire.len());
        out.push(&wire[pos..end]);
        pos = end;
    }
    out
}

fn check_decoder(seed: u8, wire: &[u8], expected: &Model<'_>) {
    let mut decoder = Decoder::default();
    let mut got: Vec<Envelope> = Vec::new();
    let mut error = None;
    'feed: for chunk in chunks(seed, wire) {
        decoder.push(chunk);
        loop {
            match decoder.next_envelope() {
                Ok(Some(env)) => got.push(env),
                Ok(None) => break,
                Err(e) => {
                    // Sticky: asking again gives the same error, not garbage.
                    let again = decoder.next_envelope().map_err(|e| e.to_string());
                    assert_eq!(again, Err(e.to_string()));
                    error = Some(e);
                    break 'feed;
                }
            }
        }
    }

    assert_eq!(got.len(), expected.frames.len(), "envelope count");
    let mut reframed = Vec::with_capacity(expected.consumed);
    for (env, (flags, payload)) in got.iter().zip(&expected.frames) {
        assert_eq!(env.flags, *flags);
        assert_eq!(&env.payload[..], *payload);
        assert_eq!(
            env.flags & FLAG_COMPRESSED,
            0,
            "compressed envelope let through"
        );
        assert!(env.payload.len() <= MAX_ENVELOPE_LEN);
        assert_eq!(env.is_end_stream(), env.flags & FLAG_END_STREAM != 0);
        reframed.push(env.flags);
        reframed.extend_from_slice(&(env.payload.len() as u32).to_be_bytes());
        reframed.extend_from_slice(&env.payload);
        if env.is_end_stream() {
            // The agent never parses these, but the CLI does: it must not panic.
            let _ = serde_json::from_slice::<EndOfStream>(&env.payload);
        }
    }
    assert_eq!(reframed, &wire[..expected.consumed], "re-framed envelopes");

    assert_eq!(error, expected.error, "decode error");
    if error.is_none() {
        let leftover = expected.consumed < wire.len();
        assert_eq!(
            decoder.finish(),
            if leftover {
                Err(DecodeError::Truncated)
            } else {
                Ok(())
            }
        );
    }
}

/// What `MessageReader::next` returns, call after call, according to the model: each data
/// message parsed as a unary body, `None` at an end-stream envelope or a clean end of the body,
/// an error for an unparsable message, a bad envelope or a body ending inside an envelope.
fn expected_messages(
    wire: &[u8],
    expected: &Model<'_>,
) -> Vec<Result<Option<serde_json::Value>, ()>> {
    let mut out = Vec::new();
    for (flags, payload) in &expected.frames {
        if flags & FLAG_END_STREAM != 0 {
            out.push(Ok(None));
            return out;
        }
        match rpc::parse_unary::<serde_json::Value>(payload) {
            Ok(v) => out.push(Ok(Some(v))),
            Err(_) => {
                out.push(Err(()));
                return out;
            }
        }
    }
    let clean_end = expected.error.is_none() && expected.consumed == wire.len();
    out.push(if clean_end { Ok(None) } else { Err(()) });
    out
}

fn body(seed: u8, wire: &[u8]) -> Body {
    let parts: Vec<Result<Bytes, Infallible>> = chunks(seed, wire)
        .into_iter()
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    Body::from_stream(futures::stream::iter(parts))
}

fn check_message_reader(seed: u8, wire: &[u8], expected: &Model<'_>) {
    let want = expected_messages(wire, expected);
    futures::executor::block_on(async {
        let mut reader = MessageReader::new(body(seed, wire));
        for (i, want) in want.iter().enumerate() {
            let got = reader.next::<serde_json::Value>().await.map_err(|e| {
                assert!(!e.0.message.is_empty());
            });
            assert_eq!(&got, want, "message {i}");
        }

        // A server-streaming request (Start, Connect, WatchDir): exactly one message that
        // parses as the request type, then an end-stream envelope or the clean end of the body.
        let frames = &expected.frames;
        let data = |i: usize| frames.get(i).map(|(flags, _)| flags & FLAG_END_STREAM == 0);
        let then_end = match data(1) {
            Some(is_data) => !is_data,
            None => expected.error.is_none() && expected.consumed == wire.len(),
        };
        let single = |ok: fn(&[u8]) -> bool| data(0) == Some(true) && ok(frames[0].1) && then_end;
        let start = rpc::read_stream_request::<StartRequest>(body(seed, wire)).await;
        assert_eq!(
            start.is_ok(),
            single(|p| rpc::parse_unary::<StartRequest>(p).is_ok())
        );
        let input = rpc::read_stream_request::<StreamInputRequest>(body(seed, wire)).await;
        assert_eq!(
            input.is_ok(),
            single(|p| rpc::parse_unary::<StreamInputRequest>(p).is_ok())
        );
    });
}

/// Whatever the encoders write decodes back to it.
fn check_round_trip(expected: &Model<'_>) {
    for (flags, payload) in &expected.frames {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
            continue;
        };
        let wire = if flags & FLAG_END_STREAM != 0 {
            let Ok(end) = serde_json::from_value::<EndOfStream>(value) else {
                continue;
            };
            let error = end.error.clone();
            let wire = connect::encode_end(error.clone());
            let back: EndOfStream = serde_json::from_slice(&wire[5..]).unwrap();
            assert_eq!(back.error, error);
            wire
        } else {
            let wire = connect::encode_message(&value);
            assert_eq!(wire[5..], serde_json::to_vec(&value).unwrap());
            wire
        };
        let mut decoder = Decoder::default();
        decoder.push(&wire);
        let env = decoder.next_envelope().unwrap().unwrap();
        assert_eq!(env.is_end_stream(), flags & FLAG_END_STREAM != 0);
        assert_eq!(env.payload.len() + 5, wire.len());
        assert_eq!(decoder.next_envelope(), Ok(None));
        decoder.finish().unwrap();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, wire)) = data.split_first() else {
        return;
    };
    let expected = model(wire);
    check_decoder(seed, wire, &expected);
    check_message_reader(seed, wire, &expected);
    check_round_trip(&expected);
});
