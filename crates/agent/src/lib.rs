//! The agent's modules as a library: `main.rs` runs the daemon or a tool built from them, and the
//! fuzz targets under `fuzz/` drive the same code (the `/files` upload parser, the Connect
//! request reader) without a sandbox.
//!
//! Who imports whom: the leaves (`config`, `auth`, `rpc`, `users` and `pid1`) import no service.
//! The services (`envd`'s, `interpreter`, `sudo`) import leaves, and the piece of another they
//! share (`envd::log`, `envd::filesystem`'s entries and watcher table), never back. Only `daemon`
//! knows them all, and nothing but `main` imports it.

// The module docs were written for the binary, whose docs include private items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod auth;
pub mod config;
pub mod daemon;
pub mod envd;
pub mod interpreter;
pub mod pid1;
pub mod rpc;
pub mod sudo;
pub mod tools;
pub mod users;
