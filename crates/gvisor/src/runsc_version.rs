//! Which runsc the server runs, checked once at start: a missing or too old one is an error
//! that says what to install, rather than sandboxes that fail one by one.

use airlock_core::driver::DriverError;
use std::path::Path;

/// The oldest runsc release Airlock has run on (Debian bookworm-backports' `0.0~20240729.0`).
/// Releases are named by their date.
pub const OLDEST_RELEASE: u32 = 20240729;

const INSTALL_HINT: &str = "install it (Debian 12: `apt-get install -t bookworm-backports runsc`; \
     Ubuntu: gVisor's apt repository, https://gvisor.dev/docs/user_guide/install/), \
     or pass its path with --runsc";

/// Runs `runsc --version` and checks the release date it reports; returns its first line.
/// A version with no date in it (a build from source) is let through with a warning.
pub fn check(runsc: &Path) -> Result<String, DriverError> {
    let out = std::process::Command::new(runsc)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| DriverError::Command {
            what: format!("running {} --version", runsc.display()),
            detail: format!("{e}; {INSTALL_HINT}"),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").trim().to_owned();
    if !out.status.success() || !line.starts_with("runsc version") {
        return Err(DriverError::Command {
            what: format!("running {} --version", runsc.display()),
            detail: format!("it does not look like runsc (it said {line:?}); {INSTALL_HINT}"),
        });
    }
    match release_date(&line) {
        Some(date) if date < OLDEST_RELEASE => Err(DriverError::Command {
            what: "checking the runsc version".into(),
            detail: format!(
                "{} is {line:?}, older than the oldest release Airlock runs on \
                 ({OLDEST_RELEASE}); {INSTALL_HINT}",
                runsc.display()
            ),
        }),
        Some(_) => Ok(line),
        None => {
            tracing::warn!(runsc = %runsc.display(), version = line,
                "cannot tell this runsc's release date; it may be too old for Airlock");
            Ok(line)
        }
    }
}

/// The `YYYYMMDD` release date in a `runsc --version` line: Debian's `0.0~20240729.0`, gVisor's
/// own `release-20240729.0`.
fn release_date(line: &str) -> Option<u32> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|digits| digits.len() == 8)
        .filter_map(|digits| digits.parse::<u32>().ok())
        .find(|date| (20180101..21000101).contains(date))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_dates_are_read_from_every_known_spelling() {
        assert_eq!(release_date("runsc version 0.0~20240729.0"), Some(20240729));
        assert_eq!(
            release_date("runsc version release-20250512.0"),
            Some(20250512)
        );
        assert_eq!(release_date("runsc version 0.0.0"), None);
        assert_eq!(release_date("runsc version 12345678"), None);
    }

    #[test]
    fn a_missing_binary_says_what_to_install() {
        let err = check(Path::new("/nonexistent/runsc"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/runsc"), "{err}");
        assert!(err.contains("bookworm-backports"), "{err}");
    }
}
