//! A seccomp filter for the host tools the driver runs as root (`ip`, `nft`, `mkfs.ext4`,
//! `mount`). Their arguments are the driver's own, but some carry what a sandbox caused (the
//! addresses its DNS answers held), so a tool that misbehaved would do it as root on the host.
//! The filter takes away what none of them needs and an attacker would want: tracing and
//! reading other processes, loading kernel code (modules, kexec, BPF), keyrings, io_uring,
//! performance counters, rebooting, swap and the clock. Everything else is allowed (`ip netns`
//! needs `unshare`, `setns` and `mount`; `mount` needs loop devices).
//!
//! Only x86_64 has the list; elsewhere the tools run unfiltered.

/// Installs the filter in the calling process, for good. Meant for a child between fork and exec:
/// it only makes two `prctl` calls on a program built beforehand.
#[cfg(target_arch = "x86_64")]
pub(crate) fn install(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain prctl calls; `prog` points at `program`, which outlives them.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn install(_program: &[libc::sock_filter]) -> std::io::Result<()> {
    Ok(())
}

/// x86_64 system call numbers the tools are denied (`EPERM`).
const DENIED: &[u32] = &[
    101, // ptrace
    310, // process_vm_readv
    311, // process_vm_writev
    246, // kexec_load
    320, // kexec_file_load
    175, // init_module
    313, // finit_module
    176, // delete_module
    321, // bpf
    298, // perf_event_open
    248, // add_key
    249, // request_key
    250, // keyctl
    169, // reboot
    167, // swapon
    168, // swapoff
    323, // userfaultfd
    172, // iopl
    173, // ioperm
    303, // name_to_handle_at
    304, // open_by_handle_at
    135, // personality
    163, // acct
    159, // adjtimex
    164, // settimeofday
    227, // clock_settime
    305, // clock_adjtime
    425, // io_uring_setup
    426, // io_uring_enter
    427, // io_uring_register
];

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// System call numbers at or above this are the x32 ABI, which could reach the same calls by
/// other numbers.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

/// The filter as a classic BPF program.
pub(crate) fn program() -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let jge = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let deny = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

    let mut p = vec![
        stmt(load, OFFSET_ARCH),
        // Another architecture's numbers mean other calls: refuse them all.
        jump(jeq, AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(load, OFFSET_NR),
        jump(jge, X32_SYSCALL_BIT, DENIED.len() as u8 + 1, 0),
    ];
    // Each denied number jumps to the final "deny"; falling through all of them allows.
    for (i, nr) in DENIED.iter().enumerate() {
        let to_deny = (DENIED.len() - i) as u8;
        p.push(jump(jeq, *nr, to_deny, 0));
    }
    p.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    p.push(stmt(ret, deny));
    p
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Runs python3 doing `syscall(nr, 0, 0, 0, 0)` under the filter; returns its output.
    fn syscall_under_filter(nr: u32) -> String {
        let program = program();
        let mut cmd = std::process::Command::new("python3");
        cmd.args([
            "-c",
            &format!(
                "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
                 r = libc.syscall({nr}, 0, 0, 0, 0); print(r, os.strerror(ctypes.get_errno()) if r < 0 else '')"
            ),
        ]);
        // SAFETY: `install` makes only prctl calls, on a program built before the fork.
        unsafe {
            cmd.pre_exec(move || install(&program));
        }
        let out = cmd.output().expect("python3 runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    #[test]
    fn denied_calls_fail_and_the_rest_work() {
        // ptrace(PTRACE_TRACEME) succeeds unfiltered.
        assert_eq!(syscall_under_filter(101), "-1 Operation not permitted");
        // getpid works.
        assert!(!syscall_under_filter(39).starts_with('-'));
        assert!(program().len() < 64, "a short program");
    }
}
