//! The host locks: one driver per set of names, and one per network namespace.

use crate::instance::{Instance, RUN_DIR};
use airlock_core::driver::DriverError;
use nix::fcntl::Flock;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How long a start waits for the lock of a server that is gone (see [`take_one`]).
const HOST_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Held for the driver's life.
pub(crate) struct HostLocks {
    _names: Flock<File>,
    _netns: Flock<File>,
}

/// Network namespaces (`al-*`), cgroups (`airlock/*`) and run files are host-wide names, so only
/// one driver may own an instance's (a second one would sweep the first one's sandboxes as
/// orphans). Links (`alv*`), 10.77.0.0/16, the firewall table and netd's ports belong to the
/// network namespace, so only one driver may run in each, whatever its instance (a second one
/// would replace the first one's firewall). These locks make both an error instead.
pub(crate) fn take(instance: &Instance) -> Result<HostLocks, DriverError> {
    let conflict = match instance.is_named() {
        false => "already runs sandboxes on this host; stop it first (only one server per host, \
                  unless each has its own --instance and network namespace)"
            .to_owned(),
        true => format!("already runs sandboxes as instance {instance}; stop it first"),
    };
    let names = take_one(&instance.lock_file(), &conflict)?;
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map_err(DriverError::io("finding this server's network namespace"))?;
    let netns = take_one(
        &Path::new(RUN_DIR).join(format!("netns-{}.lock", netns.ino())),
        "already runs sandboxes in this network namespace; give each server (each --instance) \
         a network namespace of its own",
    )?;
    Ok(HostLocks {
        _names: names,
        _netns: netns,
    })
}

/// Takes the lock `path` and records our pid in it; `conflict` says what the holder does.
fn take_one(path: &Path, conflict: &str) -> Result<Flock<File>, DriverError> {
    use std::io::{Read, Seek, Write};
    let shown = path.display();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(DriverError::io(format!("creating {}", dir.display())))?;
    }
    let deadline = std::time::Instant::now() + HOST_LOCK_WAIT;
    let mut lock = loop {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(DriverError::io(format!("opening {shown}")))?;
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        match Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => break lock,
            // A server killed with SIGKILL leaves its lock with any child it was starting
            // (between fork and exec the child shares the descriptor): that goes in a moment.
            Err(_) if !alive(&holder) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(_) => {
                return Err(DriverError::Command {
                    what: format!("taking the host lock {shown}"),
                    detail: format!("another airlock serve (pid {}) {conflict}", holder.trim()),
                })
            }
        }
    };
    let record_pid = |f: &mut File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.rewind()?;
        write!(f, "{}", std::process::id())
    };
    record_pid(&mut lock).map_err(DriverError::io(format!("writing {shown}")))?;
    Ok(lock)
}

/// Whether the process whose pid the lock file records still exists.
fn alive(recorded_pid: &str) -> bool {
    match recorded_pid.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Path::new(&format!("/proc/{pid}")).exists(),
        _ => false,
    }
}
