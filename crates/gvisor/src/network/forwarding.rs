//! The host's IPv4 forwarding switch, which sandboxes' NAT needs on.
//!
//! If the host did not forward before, the driver turns forwarding on and the firewall forwards
//! only sandbox traffic. What the host had is recorded in a file (`ip_forward.before` in the
//! instance's run dir) before the switch is touched, so that every later start knows it (not "on", which is what it finds), and a clean
//! shutdown puts it back. The record lives in `/run`, which is emptied at boot, exactly when
//! the kernel resets the switch itself. The switch is the network namespace's: a server in a
//! namespace of its own (see [`crate::instance`]) turns on only its own.

use airlock_core::driver::DriverError;
use std::path::Path;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const RECORD: &str = "ip_forward.before";

/// Turns forwarding on; returns whether the host forwarded before Airlock first turned it on.
/// `run_dir` holds the record.
pub(crate) fn enable(run_dir: &Path) -> Result<bool, DriverError> {
    let record = run_dir.join(RECORD);
    let now_on = read(Path::new(IP_FORWARD))?;
    let before = match std::fs::read_to_string(&record) {
        Ok(recorded) => recorded.trim() == "1",
        Err(_) => now_on,
    };
    if !now_on {
        if before == now_on {
            std::fs::create_dir_all(run_dir)
                .and_then(|()| std::fs::write(&record, "0\n"))
                .map_err(DriverError::io(format!("writing {}", record.display())))?;
        }
        std::fs::write(IP_FORWARD, "1")
            .map_err(DriverError::io(format!("writing {IP_FORWARD}")))?;
        tracing::info!(
            "turned IPv4 forwarding on for sandboxes (it is turned off again at a clean shutdown)"
        );
    }
    Ok(before)
}

/// Puts back what the host had before Airlock turned forwarding on, if it did.
pub(crate) fn restore(run_dir: &Path) {
    let record = run_dir.join(RECORD);
    let Ok(recorded) = std::fs::read_to_string(&record) else {
        return;
    };
    match std::fs::write(IP_FORWARD, recorded.trim()) {
        Ok(()) => {
            let _ = std::fs::remove_file(&record);
            tracing::info!("IPv4 forwarding is back to what the host had");
        }
        Err(e) => tracing::warn!(error = %e, "restoring IPv4 forwarding failed"),
    }
}

fn read(path: &Path) -> Result<bool, DriverError> {
    std::fs::read_to_string(path)
        .map(|v| v.trim() == "1")
        .map_err(DriverError::io(format!("reading {}", path.display())))
}
