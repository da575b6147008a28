//! Airlock's core: sandbox lifecycle, the isolation driver trait, templates and the SQLite store.
//!
//! Nothing here speaks HTTP; the server binary wraps it.

mod archive;
pub mod build;
pub mod disk_usage;
pub mod driver;
/// Outbound network policies (a wire type: the network services process reads them too).
pub use airlock_wire::egress;
pub mod ids;
pub mod keys;
pub mod lifecycle;
pub mod objects;
mod ordered;
pub mod store;
pub mod template;
pub mod volumes;
mod walk;
pub mod webhook;
