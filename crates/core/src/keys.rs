//! API keys: how a new one is made, and the hash the store knows it by (the key itself is
//! never kept). The server checks requests' keys with it, and `airlock key create` and the
//! server's first start make them.

use sha2::{Digest, Sha256};

/// A new API key in E2B's format (`e2b_` and 40 hex digits), which the SDK checks.
pub fn new_api_key() -> String {
    format!("e2b_{}", hex::encode(rand::random::<[u8; 20]>()))
}

/// What the store keeps of a key, and finds a request's key by: its SHA-256, in hex.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}
