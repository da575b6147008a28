//! Resource limits on every process the agent starts (commands and kernels), inherited by all
//! their descendants.

use std::os::unix::process::CommandExt;

/// The cap on processes per user, as `RLIMIT_NPROC` (see [`cap_processes`]).
pub const PROCESS_CAP: libc::rlimit = libc::rlimit {
    rlim_cur: airlock_wire::MAX_PROCESSES,
    rlim_max: airlock_wire::MAX_PROCESSES,
};

/// Caps the number of processes per user in the sandbox at
/// [`airlock_wire::MAX_PROCESSES`] (gVisor enforces `RLIMIT_NPROC`, for root too: no
/// process in a sandbox holds `CAP_SYS_RESOURCE` or `CAP_SYS_ADMIN`). A fork bomb then gets
/// `EAGAIN` inside the sandbox, well before the host's own per-sandbox task limit, which would
/// take the whole sandbox down.
pub fn cap_processes(cmd: &mut std::process::Command) {
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setrlimit(libc::RLIMIT_NPROC, &PROCESS_CAP) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
