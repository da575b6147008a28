//! Whether the sandbox may be frozen: the server freezes a sandbox that has no request in flight
//! when this says nothing in it may be running or waiting for a time of its own.
//!
//! The rule is by process, and errs on the side of awake: every process but the agent and the
//! code interpreter's kernels keeps the sandbox awake while it lives, whatever it does (a
//! `sleep 30; date`, a background server, a shell). The agent's own timers and the kernels wait
//! for requests, and a request thaws the sandbox before it is served. A kernel's own threads and
//! timers that outlive the cell that started them are frozen with it, and go on at the next
//! request.

use crate::pid1::reaper;
use std::collections::BTreeSet;
use std::sync::Mutex;

/// Processes of the agent's own that wait only for requests (the kernels).
static QUIET: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Marks `pid`, a process the agent started that waits only for requests, as not keeping the
/// sandbox awake.
pub fn quiet(pid: i32) {
    quiet_pids().insert(pid);
}

fn quiet_pids() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    QUIET.lock().unwrap_or_else(|e| e.into_inner())
}

/// A live process that keeps the sandbox awake, as `"pid name"`.
pub fn busy_process() -> Option<String> {
    let pids = reaper::pids();
    let mut quiet = quiet_pids();
    quiet.retain(|pid| pids.contains(pid));
    first_busy(&pids, std::process::id() as i32, &quiet, |pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
    })
}

/// The first of `pids` that is neither `me`, quiet, gone nor a zombie, by its `stat`.
fn first_busy(
    pids: &[i32],
    me: i32,
    quiet: &BTreeSet<i32>,
    stat_of: impl Fn(i32) -> Option<String>,
) -> Option<String> {
    pids.iter()
        .filter(|pid| **pid != me && !quiet.contains(pid))
        .find_map(|&pid| {
            let stat = stat_of(pid)?;
            let (state, _) = reaper::state_and_parent(&stat)?;
            (state != "Z").then(|| format!("{pid} {}", reaper::command_name(&stat)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agent_quiet_processes_and_zombies_leave_it_idle() {
        let stats = |pid: i32| match pid {
            1 => Some("1 (airlock-agent) S 0 1".to_owned()),
            7 => Some("7 (python3) S 1 7".to_owned()),
            9 => Some("9 (sh) Z 1 9".to_owned()),
            12 => Some("12 (sleep (x)) S 7 12".to_owned()),
            _ => None,
        };
        let kernels = BTreeSet::from([7]);
        assert_eq!(first_busy(&[1, 7, 9], 1, &kernels, stats), None);
        assert_eq!(
            first_busy(&[1, 7, 9, 44], 1, &kernels, stats),
            None,
            "gone meanwhile"
        );
        assert_eq!(
            first_busy(&[1, 7, 9, 12], 1, &kernels, stats).as_deref(),
            Some("12 sleep (x)"),
            "a kernel's child keeps it awake"
        );
        assert_eq!(
            first_busy(&[1, 7], 1, &BTreeSet::new(), stats).as_deref(),
            Some("7 python3")
        );
    }
}
