//! The duties of the sandbox's first process, and how it starts the others: it reaps orphans
//! (`reaper`), kills the largest process before the sandbox runs out of memory (`oom`), keeps
//! `CAP_SYS_ADMIN` from everything it starts (`caps`), caps their number (`rlimits`), starts
//! commands without a fork (`spawn`), binds the sandbox's volumes (`volumes`) and tells whether
//! anything may still be running (`idle`). Leaves: nothing here imports a service.

pub mod caps;
pub mod idle;
pub mod oom;
pub mod reaper;
pub mod rlimits;
pub mod spawn;
pub mod volumes;
