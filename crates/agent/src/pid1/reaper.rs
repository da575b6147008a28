//! The agent is the sandbox's first process, so every orphan in the sandbox (a daemon's parent
//! exited, a fork bomb was killed) becomes its child. Their exit must be collected, or they stay
//! zombies for the sandbox's life and count against the user's process limit: a killed fork bomb
//! would leave its user unable to start anything.
//!
//! Processes the agent started itself are reaped by whoever awaits them (tokio); this reaper must
//! not take their exit status, so those are [`track`]ed and it only reaps zombies that no one
//! tracks and that stayed zombies over two scans.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::Duration;

static SPAWNED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Marks `pid`, a process the agent started and waits for itself, as not the reaper's to reap.
pub fn track(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        spawned().insert(pid);
    }
}

fn spawned() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    SPAWNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reaps orphans for good; meant for a thread of its own, in the sandbox's first process only
/// (anywhere else the orphans are not its children).
pub fn reap() {
    let mut seen_before = HashSet::new();
    loop {
        std::thread::sleep(SCAN_EVERY);
        let (alive, zombies) = scan();
        spawned().retain(|pid| alive.contains(pid));
        let tracked = spawned().clone();
        for &pid in zombies
            .iter()
            .filter(|p| seen_before.contains(*p) && !tracked.contains(*p))
        {
            let _ = nix::sys::wait::waitpid(
                nix::unistd::Pid::from_raw(pid),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
        seen_before = zombies;
    }
}

/// Every pid in the sandbox.
pub fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

/// Every pid in the sandbox, and those of them that are zombie children of the agent.
fn scan() -> (HashSet<i32>, HashSet<i32>) {
    let mut alive = HashSet::new();
    let mut zombies = HashSet::new();
    for pid in pids() {
        alive.insert(pid);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if zombie_child_of_init(&stat) {
            zombies.insert(pid);
        }
    }
    (alive, zombies)
}

/// Whether `pid` has ended and waits to be reaped (or is gone already).
pub fn has_ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => state_and_parent(&stat).is_some_and(|(state, _)| state == "Z"),
        Err(_) => true,
    }
}

fn zombie_child_of_init(stat: &str) -> bool {
    state_and_parent(stat) == Some(("Z", "1"))
}

/// Reads `/proc/{pid}/stat`: `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
pub fn state_and_parent(stat: &str) -> Option<(&str, &str)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    Some((fields.next()?, fields.next()?))
}

/// The command name in a `/proc/{pid}/stat` line.
pub fn command_name(stat: &str) -> &str {
    let start = stat.find('(').map_or(0, |i| i + 1);
    let end = stat.rfind(')').unwrap_or(stat.len()).max(start);
    &stat[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_zombie_state_and_parent() {
        assert!(zombie_child_of_init("42 (b) Z 1 42 42 0 -1"));
        assert!(zombie_child_of_init("42 (a (b) c) Z 1 42"));
        assert!(!zombie_child_of_init("42 (b) S 1 42"));
        assert!(!zombie_child_of_init("42 (b) Z 7 42"));
        assert!(!zombie_child_of_init("garbage"));
    }
}
