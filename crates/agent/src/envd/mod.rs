//! E2B's envd protocol, one service a module, each with the state it owns: `init` (the server's
//! handshake), `files` (plain-HTTP transfers), `process` and `filesystem` (Connect services),
//! `log` (the sandbox's log) and `control` (the server's reboot and idle checks). `daemon` merges
//! their routes into the one table on port 49983.

pub mod control;
pub mod files;
pub mod filesystem;
pub mod init;
pub mod log;
pub mod process;
