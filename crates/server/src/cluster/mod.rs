//! What gateways and nodes share: the cluster secret that makes a request a gateway's, and the
//! headers in which a gateway tells a node whose request it forwards. A node believes those
//! headers only beside the secret (see [`node_api`]); a gateway removes any that a client sent
//! (see `crate::gateway`).

pub mod args;
pub mod node_api;

pub use args::ClusterArgs;

use airlock_core::ids::constant_time_eq;
use std::path::Path;

/// Carries the cluster secret on every request from a gateway to a node.
pub const SECRET_HEADER: &str = "x-airlock-cluster-secret";
/// The public id of the API key a gateway checked for the forwarded request.
pub const CALLER_HEADER: &str = "x-airlock-caller";
/// Present (`1`) when that key is an operator's.
pub const OPERATOR_HEADER: &str = "x-airlock-operator";
/// Every header of ours that only a gateway may set.
pub const GATEWAY_HEADERS: &[&str] = &[SECRET_HEADER, CALLER_HEADER, OPERATOR_HEADER];

/// What one `airlock serve` does (`--role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Everything on one machine: the API, and the sandboxes behind it.
    All,
    /// The API only: sandboxes run on the nodes it forwards to.
    Gateway,
    /// Sandboxes only, for the cluster's gateways.
    Node,
}

/// The fewest bytes a cluster secret may have: it is the only thing between a tenant who
/// reaches a node's address and every sandbox on that node.
const MIN_SECRET_LEN: usize = 32;

/// The secret every gateway and node of one cluster holds (`--cluster-secret-file`).
#[derive(Clone)]
pub struct ClusterSecret(String);

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("reading the cluster secret from {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the cluster secret in {path} is too short: it needs at least {MIN_SECRET_LEN} \
         characters (e.g. `openssl rand -hex 32 > {path}`)"
    )]
    TooShort { path: String },
}

impl ClusterSecret {
    /// The secret in `path` (surrounding white space aside).
    pub fn read(path: &Path) -> Result<Self, SecretError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
            path: shown.clone(),
            source,
        })?;
        let secret = text.trim();
        if secret.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort { path: shown });
        }
        Ok(ClusterSecret(secret.to_owned()))
    }

    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(given, self.0.as_bytes())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_secret_is_refused_and_a_long_one_matches_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "short\n").unwrap();
        assert!(matches!(
            ClusterSecret::read(&path),
            Err(SecretError::TooShort { .. })
        ));
        let long = "0123456789abcdef0123456789abcdef";
        std::fs::write(&path, format!("{long}\n")).unwrap();
        let secret = ClusterSecret::read(&path).unwrap();
        assert!(secret.matches(long.as_bytes()));
        assert!(!secret.matches(b"0123456789abcdef0123456789abcdeX"));
        assert!(!secret.matches(b""));
        assert_eq!(format!("{secret:?}"), "ClusterSecret(..)");
    }
}
