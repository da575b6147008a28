//! The Connect protocol's streaming envelope (`flags:u8 | len:u32be | payload`) and its error codes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Content type of Connect streaming requests and responses; the SDK requires it exactly.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// Envelope flag: this message ends the stream.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Envelope flag: compressed payload (never sent or accepted).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Largest envelope payload we accept from a client.
pub const MAX_ENVELOPE_LEN: usize = 16 * 1024 * 1024;

/// Connect error codes (the subset the agent produces), with their HTTP status mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    /// HTTP status for a unary error response (Connect spec).
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal => 500,
            Code::InvalidArgument | Code::FailedPrecondition => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }
}

/// A Connect error as it appears in a unary body or an end-of-stream message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Payload of the final envelope of a stream.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct EndOfStream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
}

/// One envelope read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Bytes,
}

impl Envelope {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Frames a data message.
pub fn encode_message<T: Serialize>(msg: &T) -> Bytes {
    let payload = serde_json::to_vec(msg).expect("wire types always serialize");
    frame(0, &payload)
}

/// Frames the end-of-stream message, with the error if the stream failed.
pub fn encode_end(error: Option<ConnectError>) -> Bytes {
    let payload = serde_json::to_vec(&EndOfStream { error }).expect("serializable");
    frame(FLAG_END_STREAM, &payload)
}

fn frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + payload.len());
    buf.put_u8(flags);
    buf.put_u32(payload.len() as u32);
    buf.put_slice(payload);
    buf.freeze()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("envelope of {0} bytes exceeds the {MAX_ENVELOPE_LEN} byte limit")]
    TooLarge(usize),
    #[error("compressed envelopes are not supported")]
    Compressed,
    #[error("stream ended inside an envelope")]
    Truncated,
}

/// Incremental envelope decoder: feed it body chunks as they arrive, take whole envelopes out.
#[derive(Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete envelope, `Ok(None)` if more bytes are needed.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, DecodeError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_ENVELOPE_LEN {
            return Err(DecodeError::TooLarge(len));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(DecodeError::Compressed);
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Envelope { flags, payload }))
    }

    /// Call when the body has ended: leftover bytes mean a truncated envelope.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_split_at_every_byte() {
        let mut wire = BytesMut::new();
        wire.extend_from_slice(&encode_message(&serde_json::json!({"a": 1})));
        wire.extend_from_slice(&encode_end(None));
        for split in 0..wire.len() {
            let mut dec = Decoder::default();
            let mut got = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                dec.push(part);
                while let Some(env) = dec.next_envelope().unwrap() {
                    got.push(env);
                }
            }
            dec.finish().unwrap();
            assert_eq!(got.len(), 2);
            assert_eq!(&got[0].payload[..], br#"{"a":1}"#);
            assert!(got[1].is_end_stream());
            assert_eq!(&got[1].payload[..], b"{}");
        }
    }

    #[test]
    fn rejects_oversized_and_compressed_and_truncated() {
        let mut dec = Decoder::default();
        dec.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            dec.next_envelope(),
            Err(DecodeError::TooLarge(u32::MAX as usize))
        );

        let mut dec = Decoder::default();
        dec.push(&[FLAG_COMPRESSED, 0, 0, 0, 0]);
        assert_eq!(dec.next_envelope(), Err(DecodeError::Compressed));

        let mut dec = Decoder::default();
        dec.push(&[0, 0, 0, 0, 9, b'{']);
        assert_eq!(dec.next_envelope(), Ok(None));
        assert_eq!(dec.finish(), Err(DecodeError::Truncated));
    }

    #[test]
    fn end_stream_carries_error() {
        let end = encode_end(Some(ConnectError::new(Code::DeadlineExceeded, "too slow")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let body: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(body["error"]["code"], "deadline_exceeded");
    }
}
