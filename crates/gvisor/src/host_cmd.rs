//! Running the host tools the driver drives (`ip`, `nft`, `mkfs.ext4`, `mount`), each under
//! [`crate::seccomp`]'s filter: a failure carries what was run and the tool's own words.

use crate::seccomp;
use airlock_core::driver::DriverError;
use std::process::{Output, Stdio};
use tokio::io::AsyncWriteExt;

/// Runs `cmd`, with `input` on its stdin if given; `what` names it in errors.
pub(crate) async fn run(
    what: &str,
    mut cmd: tokio::process::Command,
    input: Option<&str>,
) -> Result<(), DriverError> {
    let program = seccomp::program();
    // SAFETY: `install` makes only prctl calls, on a program built before the fork.
    unsafe {
        cmd.pre_exec(move || seccomp::install(&program));
    }
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(DriverError::io(format!("starting {what}")))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .await
            .map_err(DriverError::io(format!("writing to {what}")))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(DriverError::io(format!("waiting for {what}")))?;
    check(what, &out)
}

/// [`run`] for start-up, before there is anything to await.
pub(crate) fn run_sync(
    what: &str,
    mut cmd: std::process::Command,
    input: &str,
) -> Result<(), DriverError> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let program = seccomp::program();
    // SAFETY: as in `run`.
    unsafe {
        cmd.pre_exec(move || seccomp::install(&program));
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(DriverError::io(format!("starting {what}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(DriverError::io(format!("writing to {what}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(DriverError::io(format!("waiting for {what}")))?;
    check(what, &out)
}

fn check(what: &str, out: &Output) -> Result<(), DriverError> {
    if out.status.success() {
        return Ok(());
    }
    Err(DriverError::Command {
        what: what.to_owned(),
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}
