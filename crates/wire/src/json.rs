//! Proto3-JSON helpers: 64-bit integers travel as strings, bytes as padded base64.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Deserializer, Serializer};

/// `bytes` fields: standard base64 with padding.
pub mod b64 {
    use super::*;

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// `int64` fields: written as strings, read from strings or numbers.
pub mod i64_string {
    use super::*;

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum NumOrText {
            Num(i64),
            Text(String),
        }
        match NumOrText::deserialize(d)? {
            NumOrText::Num(n) => Ok(n),
            NumOrText::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Proto3 omits default values; serde's `skip_serializing_if` needs a predicate for each type.
pub fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
