//! The settings every service reads: what `/init` configured, and the sandbox's identity and
//! reboots as they change. Services import it; it imports none of them.

use crate::rpc::RpcError;
use crate::users::{self, User};
use airlock_wire::envd::InitRequest;
use axum::http::HeaderMap;
use std::collections::BTreeMap;
use std::sync::RwLock;

/// Settings the server pushes with `POST /init`.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub env_vars: BTreeMap<String, String>,
    pub access_token: Option<String>,
    /// Proves a caller on the code interpreter's context routes (see `auth.rs`).
    pub traffic_access_token: Option<String>,
    pub default_user: String,
    pub default_workdir: Option<String>,
    /// The paths its volumes are bound at.
    pub volume_mounts: Vec<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            env_vars: BTreeMap::new(),
            access_token: None,
            traffic_access_token: None,
            default_user: "user".into(),
            default_workdir: None,
            volume_mounts: Vec::new(),
        }
    }
}

/// What every service shares: the settings, and the channels that announce a new identity and
/// a reboot.
pub struct Config {
    settings: RwLock<SandboxConfig>,
    /// Bumped each time `/init` renames the sandbox: a restored checkpoint becoming a sandbox of
    /// its own. State copied from the checkpoint (kernels' random generators) is renewed when it
    /// lags behind.
    /// The identity generation: bumped by each hostname change (a restored copy becoming
    /// itself). Watched by the interpreter, which reseeds its kernels at once.
    identity: tokio::sync::watch::Sender<u64>,
    /// Bumped by each reboot: the interpreter then drops its contexts.
    reboots: tokio::sync::watch::Sender<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            settings: RwLock::new(SandboxConfig::default()),
            identity: tokio::sync::watch::Sender::new(0),
            reboots: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Config {
    /// The current identity generation.
    pub fn identity(&self) -> u64 {
        *self.identity.borrow()
    }

    /// Changes of [`Config::identity`].
    pub fn watch_identity(&self) -> tokio::sync::watch::Receiver<u64> {
        self.identity.subscribe()
    }

    /// Reboots (see `envd::control`), as they happen.
    pub fn watch_reboots(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reboots.subscribe()
    }

    /// Tells the reboots' watchers that every process of the sandbox has ended.
    pub fn rebooted(&self) {
        self.reboots.send_modify(|count| *count += 1);
    }

    /// The settings as they are now.
    pub fn current(&self) -> SandboxConfig {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Applies `/init`; an invalid hostname rejects the whole request, before anything changes.
    /// Returns the sandbox's new name when it took one (a new identity).
    pub fn apply_init(&self, init: InitRequest) -> Result<Option<String>, RpcError> {
        if let Some(name) = &init.hostname {
            check_hostname(name)?;
        }
        // Held across the rename so concurrent inits cannot both count one change.
        let mut cfg = self.settings.write().unwrap_or_else(|e| e.into_inner());
        let bound = crate::pid1::volumes::bind_all(&init.volume_mounts, &cfg.volume_mounts)?;
        cfg.volume_mounts.extend(bound);
        let mut renamed = None;
        if let Some(name) = init.hostname {
            let current = nix::unistd::gethostname()
                .map_err(|e| RpcError::internal(format!("reading the hostname: {e}")))?;
            if current != name.as_str() {
                nix::unistd::sethostname(&name)
                    .map_err(|e| RpcError::internal(format!("setting the hostname: {e}")))?;
                self.identity.send_modify(|generation| *generation += 1);
                renamed = Some(name);
            }
        }
        cfg.env_vars = init.env_vars;
        if init.access_token.is_some() {
            cfg.access_token = init.access_token;
        }
        if init.traffic_access_token.is_some() {
            cfg.traffic_access_token = init.traffic_access_token;
        }
        if let Some(user) = init.default_user.filter(|u| !u.is_empty()) {
            cfg.default_user = user;
        }
        if init.default_workdir.is_some() {
            cfg.default_workdir = init.default_workdir;
        }
        Ok(renamed)
    }

    /// The user an RPC runs as: from Basic auth, else the sandbox default.
    pub fn rpc_user(&self, headers: &HeaderMap) -> Result<User, RpcError> {
        match users::from_basic_auth(headers)? {
            Some(name) => User::lookup(&name),
            None => User::lookup(&self.current().default_user),
        }
    }

    /// The user a `/files` request runs as: from `?username=`, else the sandbox default.
    pub fn named_user(&self, name: Option<&str>) -> Result<User, RpcError> {
        match name.filter(|n| !n.is_empty()) {
            Some(name) => User::lookup(name),
            None => User::lookup(&self.current().default_user),
        }
    }
}

/// A hostname the agent accepts: one DNS label of lowercase letters, digits and `-`, as sandbox
/// ids are.
fn check_hostname(name: &str) -> Result<(), RpcError> {
    let valid = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(RpcError::invalid(format!(
            "invalid hostname {name:?}: use 1 to 63 characters a-z, 0-9 and '-'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_hostnames() {
        assert!(check_hostname("isb5x0k2m9q1").is_ok());
        assert!(check_hostname("a-1").is_ok());
        assert!(check_hostname(&"a".repeat(63)).is_ok());
        for bad in ["", "Upper", "a.b", "a_b", "a b", "é", &"a".repeat(64)] {
            assert!(check_hostname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_invalid_hostname_changes_nothing() {
        let config = Config::default();
        let err = config
            .apply_init(InitRequest {
                access_token: Some("tok".into()),
                hostname: Some("Not_Valid".into()),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(err.0.code, airlock_wire::connect::Code::InvalidArgument);
        assert_eq!(config.current().access_token, None);
        assert_eq!(config.identity(), 0);
    }

    #[test]
    fn the_current_hostname_is_no_new_identity() {
        // Only the host's own name, so the test never renames the machine it runs on.
        let current = nix::unistd::gethostname().unwrap();
        let Some(current) = current.to_str().filter(|n| check_hostname(n).is_ok()) else {
            return;
        };
        let config = Config::default();
        let renamed = config
            .apply_init(InitRequest {
                hostname: Some(current.to_owned()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!((renamed, config.identity()), (None, 0));
    }
}
