//! The agent's modules as a library: `main.rs` runs the daemon or a tool built from them, and the
//! fuzz targets under `fuzz/` drive the same code (the `/files` upload parser, the Connect
//! request reader) without a sandbox.

// The module docs were written for the binary, whose docs include private items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod auth;
pub mod caps;
pub mod config;
pub mod daemon;
pub mod files;
pub mod fs;
pub mod idle;
pub mod init;
pub mod interpreter;
pub mod layer;
pub mod log;
pub mod metadata;
pub mod oom;
pub mod process;
pub mod provision;
pub mod reaper;
pub mod reboot;
pub mod rlimits;
pub mod rpc;
pub mod spawn;
pub mod sudo;
pub mod users;
pub mod volumes;
pub mod watch;
