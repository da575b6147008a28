//! netd's seccomp allow-list: the system calls an async network service needs to use the
//! sockets it has and to make outbound TCP and UDP ones, and nothing else. No files are opened,
//! no processes made, no privileges asked for. Any other call fails with `EPERM`.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// Calls allowed whatever their arguments.
const ALLOWED: &[i64] = &[
    // Sockets it has, and new outbound ones (the domain is checked below).
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_connect,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_shutdown,
    libc::SYS_close,
    libc::SYS_fcntl,
    // The runtime.
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_getrandom,
    // Memory.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    // Signals and ending.
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// The filter, compiled.
pub fn program() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    let domain = |family: i32| -> Result<SeccompRule, String> {
        let cond =
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, family as u64)
                .map_err(|e| e.to_string())?;
        SeccompRule::new(vec![cond]).map_err(|e| e.to_string())
    };
    // IPv4 and IPv6 sockets only: no netlink, no packet sockets, no Unix sockets to elsewhere.
    rules.insert(
        libc::SYS_socket,
        vec![domain(libc::AF_INET)?, domain(libc::AF_INET6)?],
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| format!("building the seccomp filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("compiling the seccomp filter: {e}"))
}

/// Puts the filter on every thread of this process, for good (and sets no-new-privileges).
pub fn install() -> Result<(), String> {
    seccompiler::apply_filter_all_threads(&program()?)
        .map_err(|e| format!("installing the seccomp filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `probe` in a forked child under the filter; returns its exit code.
    fn under_filter(probe: fn() -> i32) -> i32 {
        let program = program().unwrap();
        // SAFETY: the child makes only system calls (no allocation after the filter is built)
        // and leaves with `_exit`.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = match seccompiler::apply_filter(&program) {
                    Ok(()) => probe(),
                    Err(_) => 100,
                };
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                match nix::sys::wait::waitpid(child, None).unwrap() {
                    nix::sys::wait::WaitStatus::Exited(_, code) => code,
                    other => panic!("the probe ended as {other:?}"),
                }
            }
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn files_processes_and_other_sockets_are_refused() {
        // SAFETY (all probes): plain system calls on constant arguments.
        let opens = || unsafe {
            let fd = libc::open(c"/etc/hostname".as_ptr(), libc::O_RDONLY);
            if fd >= 0 {
                0
            } else {
                errno()
            }
        };
        assert_eq!(under_filter(opens), libc::EPERM, "no file is opened");
        let execs = || unsafe {
            let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
            libc::execv(c"/bin/true".as_ptr(), argv.as_ptr());
            errno()
        };
        assert_eq!(under_filter(execs), libc::EPERM, "nothing is run");
        let unix = || unsafe {
            if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) >= 0 {
                0
            } else {
                errno()
            }
        };
        assert_eq!(under_filter(unix), libc::EPERM, "no Unix socket");
        let netlink = || unsafe {
            if libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) >= 0 {
                0
            } else {
                errno()
            }
        };
        assert_eq!(under_filter(netlink), libc::EPERM, "no netlink");
        // The control: what netd does is allowed.
        let inet = || unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            if fd >= 0 && libc::close(fd) == 0 {
                0
            } else {
                errno()
            }
        };
        assert_eq!(under_filter(inet), 0, "an IPv4 socket is made");
    }
}
