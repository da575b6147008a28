//! The host's IPv4 forwarding switch, which sandboxes' NAT needs on.
//!
//! If the host did not forward before, the driver turns forwarding on and the firewall forwards
//! only sandbox traffic. What the host had is recorded in [`RECORD`] before the switch is
//! touched, so that every later start knows it (not "on", which is what it finds), and a clean
//! shutdown puts it back. The record lives in `/run`, which is emptied at boot, exactly when
//! the kernel resets the switch itself.

use airlock_core::driver::DriverError;
use std::path::Path;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const RECORD_DIR: &str = "/run/airlock";
const RECORD: &str = "/run/airlock/ip_forward.before";

/// Turns forwarding on; returns whether the host forwarded before Airlock first turned it on.
pub(crate) fn enable() -> Result<bool, DriverError> {
    let now_on = read(Path::new(IP_FORWARD))?;
    let before = match std::fs::read_to_string(RECORD) {
        Ok(recorded) => recorded.trim() == "1",
        Err(_) => now_on,
    };
    if !now_on {
        if before == now_on {
            std::fs::create_dir_all(RECORD_DIR)
                .and_then(|()| std::fs::write(RECORD, "0\n"))
                .map_err(DriverError::io(format!("writing {RECORD}")))?;
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
pub(crate) fn restore() {
    let Ok(recorded) = std::fs::read_to_string(RECORD) else {
        return;
    };
    match std::fs::write(IP_FORWARD, recorded.trim()) {
        Ok(()) => {
            let _ = std::fs::remove_file(RECORD);
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
