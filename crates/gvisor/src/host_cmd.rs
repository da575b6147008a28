//! Running the host tools the driver drives as root (`ip`, `nft`, `ss`, `conntrack`,
//! `mkfs.ext4`, `mount`, `useradd`), each under a seccomp filter: a failure carries what was run
//! and the tool's own words.
//!
//! The tools' arguments are the driver's own, but some carry what a sandbox caused, so a tool
//! that misbehaved would do it as root on the host. The filter takes away what none of them
//! needs and an attacker would want: tracing and reading other processes, loading kernel code
//! (modules, kexec, BPF), keyrings, io_uring, performance counters, rebooting, swap and the
//! clock. Everything else is allowed (`ip netns` needs `unshare`, `setns` and `mount`; `mount`
//! needs loop devices), so this is a deny-list; the process that reads hostile bytes,
//! `airlock-netd`, has an allow-list of its own.

use airlock_core::driver::DriverError;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use std::process::{Output, Stdio};
use tokio::io::AsyncWriteExt;

/// Runs `cmd`, with `input` on its stdin if given; `what` names it in errors.
pub(crate) async fn run(
    what: &str,
    mut cmd: tokio::process::Command,
    input: Option<&str>,
) -> Result<(), DriverError> {
    let program = filter();
    // SAFETY: `apply_filter` makes only a prctl and a seccomp call, on a program built before
    // the fork.
    unsafe {
        cmd.pre_exec(move || apply(&program));
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
    let program = filter();
    // SAFETY: as in `run`.
    unsafe {
        cmd.pre_exec(move || apply(&program));
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

/// System calls the tools are denied (`EPERM`), by their x86_64 numbers.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_userfaultfd,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_personality,
    libc::SYS_acct,
    libc::SYS_adjtimex,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// x32-ABI calls carry this bit, and reach the same kernel code under other numbers: those of
/// the calls above are denied too, by both their x86_64 numbers and the x32 ABI's own ones
/// (`ptrace`, `kexec_load`, `process_vm_readv`, `process_vm_writev`).
const X32_SYSCALL_BIT: i64 = 0x4000_0000;
const X32_ONLY: &[i64] = &[521, 528, 539, 540];

/// The filter, compiled: the calls in [`DENIED`] fail with `EPERM`, everything else runs.
fn filter() -> BpfProgram {
    let rules = DENIED
        .iter()
        .flat_map(|&nr| [nr, nr | X32_SYSCALL_BIT])
        .chain(X32_ONLY.iter().map(|&nr| nr | X32_SYSCALL_BIT))
        .map(|nr| (nr, Vec::new()))
        .collect();
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .and_then(BpfProgram::try_from)
    .expect("a fixed list of calls compiles")
}

/// Installs `program` in the calling process, for good. Meant for a child between fork and
/// exec.
fn apply(program: &BpfProgram) -> std::io::Result<()> {
    seccompiler::apply_filter(program).map_err(|e| std::io::Error::other(e.to_string()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Runs python3 doing `syscall(nr, 0, 0, 0, 0)` under the filter; returns its output.
    fn syscall_under_filter(nr: i64) -> String {
        let program = filter();
        let mut cmd = std::process::Command::new("python3");
        cmd.args([
            "-c",
            &format!(
                "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
                 r = libc.syscall({nr}, 0, 0, 0, 0); print(r, os.strerror(ctypes.get_errno()) if r < 0 else '')"
            ),
        ]);
        // SAFETY: as in `run`.
        unsafe {
            cmd.pre_exec(move || apply(&program));
        }
        let out = cmd.output().expect("python3 runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    #[test]
    fn denied_calls_fail_and_the_rest_work() {
        // ptrace(PTRACE_TRACEME) succeeds unfiltered.
        assert_eq!(
            syscall_under_filter(libc::SYS_ptrace),
            "-1 Operation not permitted"
        );
        assert_eq!(
            syscall_under_filter(libc::SYS_ptrace | X32_SYSCALL_BIT),
            "-1 Operation not permitted"
        );
        assert!(!syscall_under_filter(libc::SYS_getpid).starts_with('-'));
    }
}
