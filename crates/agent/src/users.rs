//! Sandbox users: who an operation runs as, and how paths resolve for them.

use crate::rpc::RpcError;
use airlock_wire::connect::Code;
use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use std::path::{Component, Path, PathBuf};

/// PATH for everything the agent starts inside the sandbox.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A user from the sandbox's `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// Its login shell.
    pub shell: PathBuf,
}

impl User {
    /// Looks `name` up in `/etc/passwd` (read fresh: users may be added at runtime).
    /// `root` is uid 0 even without an entry: an image being unpacked has no `/etc/passwd` yet.
    pub fn lookup(name: &str) -> Result<User, RpcError> {
        let passwd = match std::fs::read_to_string("/etc/passwd") {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            other => other.map_err(|e| RpcError::internal(format!("reading /etc/passwd: {e}")))?,
        };
        find_in_passwd(&passwd, name)
            .or_else(|| (name == "root").then(User::root))
            .ok_or_else(|| {
                RpcError::new(Code::Unauthenticated, format!("invalid username: '{name}'"))
            })
    }

    fn root() -> User {
        User {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: PathBuf::from("/root"),
            shell: PathBuf::from("/bin/sh"),
        }
    }

    /// The user whose uid is `uid` (the first entry, as libc's `getpwuid` finds it).
    pub fn with_uid(uid: u32) -> Option<User> {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let found = passwd_entries(&passwd).find(|u| u.uid == uid);
        found.or_else(|| (uid == 0).then(User::root))
    }

    /// The environment every process of this user starts from (sandbox env vars come on top).
    pub fn base_env(&self) -> [(&'static str, String); 4] {
        [
            ("PATH", DEFAULT_PATH.to_owned()),
            ("HOME", self.home.to_string_lossy().into_owned()),
            ("USER", self.name.clone()),
            ("LOGNAME", self.name.clone()),
        ]
    }

    /// Resolves a request path for this user: `~` and relative paths are taken from the home
    /// directory; `.` and `..` are folded lexically so errors name the path the user meant.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, RpcError> {
        if path.is_empty() {
            return Err(RpcError::invalid("path is empty"));
        }
        if path.contains('\0') {
            return Err(RpcError::invalid("path contains a NUL byte"));
        }
        let expanded = if path == "~" {
            self.home.clone()
        } else if let Some(rest) = path.strip_prefix("~/") {
            self.home.join(rest)
        } else if path.starts_with('/') {
            PathBuf::from(path)
        } else {
            self.home.join(path)
        };
        Ok(normalize(&expanded))
    }
}

/// Folds `.` and `..` without touching the filesystem (`/a/../..` is `/`).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

pub(crate) fn find_in_passwd(passwd: &str, name: &str) -> Option<User> {
    passwd_entries(passwd).find(|u| u.name == name)
}

fn passwd_entries(passwd: &str) -> impl Iterator<Item = User> + '_ {
    passwd.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || fields[0].is_empty() {
            return None;
        }
        Some(User {
            name: fields[0].to_owned(),
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home: PathBuf::from(fields[5]),
            shell: PathBuf::from(if fields[6].is_empty() {
                "/bin/sh"
            } else {
                fields[6]
            }),
        })
    })
}

/// The user named by `Authorization: Basic base64("<user>:")`, if present.
pub fn from_basic_auth(headers: &HeaderMap) -> Result<Option<String>, RpcError> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || RpcError::new(Code::Unauthenticated, "malformed Authorization header");
    let text = value.to_str().map_err(|_| bad())?;
    let Some(encoded) = text.strip_prefix("Basic ") else {
        return Ok(None);
    };
    let decoded = STANDARD.decode(encoded.trim()).map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let user = decoded.split(':').next().unwrap_or_default();
    Ok((!user.is_empty()).then(|| user.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";

    #[test]
    fn finds_users() {
        let u = find_in_passwd(PASSWD, "user").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.home, PathBuf::from("/home/user"));
        assert!(find_in_passwd(PASSWD, "nobody").is_none());
        assert!(find_in_passwd(PASSWD, "").is_none());
    }

    #[test]
    fn resolves_paths_against_home() {
        let u = find_in_passwd(PASSWD, "user").unwrap();
        assert_eq!(
            u.resolve("a.txt").unwrap(),
            PathBuf::from("/home/user/a.txt")
        );
        assert_eq!(
            u.resolve("~/x/../y").unwrap(),
            PathBuf::from("/home/user/y")
        );
        assert_eq!(u.resolve("/../../etc").unwrap(), PathBuf::from("/etc"));
        assert_eq!(u.resolve("~").unwrap(), PathBuf::from("/home/user"));
        assert!(u.resolve("").is_err());
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(from_basic_auth(&h).unwrap(), None);
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(from_basic_auth(&h).unwrap(), Some("root".into()));
    }
}
