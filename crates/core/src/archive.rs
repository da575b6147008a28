//! GNU tar, run for what the host moves through object storage as whole archives: templates'
//! layers (which keep overlayfs's whiteouts and xattrs) and volumes' sparse filesystem images.

use tokio::process::Command;

/// Runs `cmd` (a `tar` command line); the error says what failed, with tar's own words.
pub(crate) async fn tar(mut cmd: Command, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{what}: running tar: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}
