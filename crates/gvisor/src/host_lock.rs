//! The host lock: one driver per host, since its names are host-wide.

use airlock_core::driver::DriverError;

/// Network namespaces (`al-*`), links (`alv*`), cgroups (`airlock/*`) and 10.77.0.0/16 are
/// host-wide names, so only one driver may own them: a second one would sweep the first one's
/// sandboxes as orphans. This lock, held for the driver's life, makes that an error instead.
const HOST_LOCK: &str = "/run/airlock-gvisor.lock";
/// How long a start waits for the lock of a server that is gone (see `take_host_lock`).
const HOST_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) fn take_host_lock() -> Result<nix::fcntl::Flock<std::fs::File>, DriverError> {
    use std::io::{Read, Seek, Write};
    let deadline = std::time::Instant::now() + HOST_LOCK_WAIT;
    let mut lock = loop {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(HOST_LOCK)
            .map_err(DriverError::io(format!("opening {HOST_LOCK}")))?;
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => break lock,
            // A server killed with SIGKILL leaves its lock with any child it was starting
            // (between fork and exec the child shares the descriptor): that goes in a moment.
            Err(_) if !alive(&holder) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(_) => {
                return Err(DriverError::Command {
                    what: "taking the host lock".into(),
                    detail: format!(
                        "another airlock serve (pid {}) already runs sandboxes on this host; \
                         stop it first (only one server per host)",
                        holder.trim()
                    ),
                })
            }
        }
    };
    let record_pid = |f: &mut std::fs::File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.rewind()?;
        write!(f, "{}", std::process::id())
    };
    record_pid(&mut lock).map_err(DriverError::io(format!("writing {HOST_LOCK}")))?;
    Ok(lock)
}

/// Whether the process whose pid the lock file records still exists.
fn alive(recorded_pid: &str) -> bool {
    match recorded_pid.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => std::path::Path::new(&format!("/proc/{pid}")).exists(),
        _ => false,
    }
}
