//! Validated identifiers. Each is parsed once at the edge and is ASCII-safe from then on.

use rand::distributions::{Alphanumeric, DistString};
use rand::Rng;
use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("sandbox id must be 1-64 characters of [a-z0-9]")]
    SandboxId,
    #[error(
        "template name must be 1-64 characters of [a-z0-9._-], starting with a letter or digit"
    )]
    TemplateName,
}

/// A sandbox id: lowercase alphanumerics, so it fits a DNS label (`{port}-{id}.{domain}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

impl SandboxId {
    pub const LEN: usize = 20;

    pub fn generate() -> Self {
        let mut rng = rand::thread_rng();
        let id = (0..Self::LEN)
            .map(|_| {
                let n = rng.gen_range(0..36u8);
                (if n < 10 { b'0' + n } else { b'a' + n - 10 }) as char
            })
            .collect();
        SandboxId(id)
    }

    pub fn parse(s: &str) -> Result<Self, IdError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if ok {
            Ok(SandboxId(s.to_owned()))
        } else {
            Err(IdError::SandboxId)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A template name such as `base` or `code-interpreter-v1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateName(String);

impl TemplateName {
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let bytes = s.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= 64
            && bytes[0].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(b));
        if ok {
            Ok(TemplateName(s.to_owned()))
        } else {
            Err(IdError::TemplateName)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TemplateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A random secret of `len` alphanumerics (access tokens).
pub fn random_token(len: usize) -> String {
    Alphanumeric.sample_string(&mut rand::thread_rng(), len)
}

/// Compares secrets in time that does not depend on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_and_differ() {
        let a = SandboxId::generate();
        let b = SandboxId::generate();
        assert_eq!(SandboxId::parse(a.as_str()).unwrap(), a);
        assert_eq!(a.as_str().len(), SandboxId::LEN);
        assert_ne!(a, b);
    }

    #[test]
    fn rejects_what_would_break_hostnames_or_paths() {
        for bad in ["", "ABC", "a.b", "a_b", "../x", "a/b", &"a".repeat(65)] {
            assert!(SandboxId::parse(bad).is_err(), "{bad}");
        }
        for bad in ["", "-x", "../x", "a/b", "Base", "a b"] {
            assert!(TemplateName::parse(bad).is_err(), "{bad}");
        }
        assert!(TemplateName::parse("code-interpreter-v1").is_ok());
    }
}
