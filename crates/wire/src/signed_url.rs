//! The signature of envd's signed `/files` URLs, which the SDK computes locally from the
//! sandbox's access token (protocol doc §3.6): the agent checks it, and the server uses it to
//! find the sandbox a URL without routing headers is for.

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

/// What a signed URL allows: `read` for `GET /files`, `write` for `POST /files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOperation {
    Read,
    Write,
}

impl FileOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            FileOperation::Read => "read",
            FileOperation::Write => "write",
        }
    }
}

/// `"v1_" + base64_nopad(sha256("{path}:{operation}:{username}:{token}[:{expiration}]"))`,
/// with each part exactly as it appears (decoded) in the URL's query.
pub fn signature(
    path: &str,
    operation: FileOperation,
    username: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let mut hasher = Sha256::new();
    for part in [path, ":", operation.as_str(), ":", username, ":", token] {
        hasher.update(part.as_bytes());
    }
    if let Some(expiration) = expiration {
        hasher.update(b":");
        hasher.update(expiration.as_bytes());
    }
    format!("v1_{}", STANDARD_NO_PAD.encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdk() {
        // Expected values computed independently (Python: hashlib + base64, '=' stripped).
        let read = FileOperation::Read;
        assert_eq!(
            signature("/home/user/x", read, "user", "tok", Some("1795323844")),
            "v1_jXhkbR1uFuZ6Ww5vXKur3P8N2lXYLwi4kOR5G0vfPsY"
        );
        assert_eq!(
            signature("a.txt", FileOperation::Write, "", "tok", None),
            "v1_/GA+OwObMH6etEE0CJuj8oBdczYFCpvdP4xFwJ/WIH8"
        );
        assert_eq!(
            signature("/a", read, "user", "tok", None),
            "v1_Fh5abAPjRBN6FHQ5HTJwGAHjHfzJmhV0f2EtHLgLVa0"
        );
    }
}
