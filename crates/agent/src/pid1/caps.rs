//! The one capability the agent keeps from its children.
//!
//! The sandbox grants the agent `CAP_SYS_ADMIN` so that it can rename a sandbox restored from a
//! checkpoint (`sethostname`). Nothing it starts may have it, not even processes run as root or
//! through sudo: it is dropped from the bounding set, which caps what any `execve` can grant,
//! while the agent's own effective set keeps it.
//!
//! This cannot be a `pre_exec` hook: std runs those after `setuid`, when a non-root child no
//! longer holds the `CAP_SETPCAP` that dropping needs.

/// `CAP_SYS_ADMIN` from `<linux/capability.h>` (libc does not define the capability numbers).
const CAP_SYS_ADMIN: libc::c_ulong = 21;

/// Drops `CAP_SYS_ADMIN` from the calling thread's bounding set. The set is per thread and
/// inherited by threads and processes created afterwards, so the agent calls this first thing,
/// while it has a single thread.
pub fn keep_sys_admin_from_children() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; it touches no memory of ours.
    let in_set = unsafe { libc::prctl(libc::PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) };
    // SAFETY: as above.
    if in_set == 1 && unsafe { libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the agent non-dumpable, so that processes it starts, root ones included (they lack
/// `CAP_SYS_PTRACE`), can neither ptrace it nor read its memory to borrow the capability above.
pub fn refuse_tracing() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Bit `cap` of a `Cap*:` line of a `/proc/.../status` file.
    fn has_cap(status: &str, field: &str, cap: u64) -> bool {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        let bits = u64::from_str_radix(line.trim_start_matches(':').trim(), 16).unwrap();
        bits & (1 << cap) != 0
    }

    #[test]
    fn children_never_get_sys_admin() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // A thread of its own: the drop must not leak into the other tests' threads.
        std::thread::spawn(|| {
            let own = || std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let had_it = has_cap(&own(), "CapEff", 21);
            keep_sys_admin_from_children().unwrap();
            assert!(!has_cap(&own(), "CapBnd", 21));
            // The agent itself can still rename the sandbox.
            assert_eq!(has_cap(&own(), "CapEff", 21), had_it);
            // Root and a user alike: nothing started afterwards can have it.
            for uid in [0, 65534] {
                let out = std::process::Command::new("cat")
                    .arg("/proc/self/status")
                    .uid(uid)
                    .gid(uid)
                    .output()
                    .unwrap();
                let status = String::from_utf8(out.stdout).unwrap();
                assert!(!has_cap(&status, "CapBnd", 21), "uid {uid}");
                assert!(!has_cap(&status, "CapEff", 21), "uid {uid}");
            }
            // Dropping it again is harmless.
            keep_sys_admin_from_children().unwrap();
        })
        .join()
        .unwrap();
    }
}
