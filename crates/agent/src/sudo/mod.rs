//! `sudo` inside the sandbox, through the agent.
//!
//! gVisor (as Debian ships it) ignores set-user-ID bits and reports `no_new_privs` for every
//! process, so the real sudo can never become root. Airlock's templates therefore have
//! `/usr/bin/sudo` linked to the agent binary (see [`crate::tools::provision`]; a real sudo is
//! moved aside to `/usr/bin/sudo.real`). Started as `sudo`, the agent binary is a client
//! ([`client`]): it hands its command, environment, working directory and its stdin, stdout
//! and stderr themselves over a Unix socket to the agent ([`server`]), which checks who is
//! asking (credentials the kernel vouches for) against the sandbox's sudoers files
//! ([`sudoers`]),
//! runs the command as the target user, and reports its exit.
//!
//! What the agent guarantees of every process it starts holds here too: none holds
//! `CAP_SYS_ADMIN` (the agent dropped it from the bounding set of everything it starts) and
//! none can trace the agent.

pub mod client;
pub mod server;
pub mod sudoers;

use serde::{Deserialize, Serialize};

/// The agent's socket, in the abstract namespace: nothing on the sandbox's filesystem, and
/// every process of the sandbox (any user) can connect; the server checks who did.
const SOCKET_NAME: &[u8] = b"airlock-sudo";

/// What a `sudo` call asks for (the first message, sent with the caller's stdio).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    /// Whom to run as (`-u`; root by default).
    pub user: String,
    /// What to run: a command and its arguments, or empty for a shell (`-s`, `-i`).
    pub command: Vec<String>,
    /// `-i`: the target's login shell, in its home.
    pub login: bool,
    /// `-s`: a shell (the caller's `$SHELL`, else the target's).
    pub shell: bool,
    /// `-E`: keep the caller's environment (PATH aside).
    pub preserve_env: bool,
    /// `--preserve-env=A,B`: keep these of the caller's variables.
    pub keep: Vec<String>,
    /// `NAME=value` arguments before the command.
    pub set: Vec<(String, String)>,
    /// The caller's environment and working directory.
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// The client's later messages, one JSON object a line.
#[derive(Debug, Serialize, Deserialize)]
pub enum ClientMessage {
    /// A signal the caller got, for the command.
    Signal(i32),
}

/// The server's answer, one JSON line: how the command ended, or why it did not start.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    Signaled(i32),
    Refused(String),
}

fn socket_addr() -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(SOCKET_NAME)
}
