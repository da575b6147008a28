//! The sandboxes' cgroups: `airlock/{id}` (`airlock-{instance}/{id}` for a named instance) under
//! each controller (cgroup v1) or under the unified root (v2). runsc creates them from the spec
//! and `runsc delete` removes them; this module only finds and removes what a crash left behind.

use airlock_core::driver::DriverError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long a freeze may take to stop every thread of a sandbox. It takes about a millisecond;
/// a thread in an uninterruptible wait (disk I/O on a loaded host) holds it up.
const FREEZE_WAIT: Duration = Duration::from_millis(500);

/// The cgroups of one instance's sandboxes, all under one parent.
pub(crate) struct Cgroups {
    parent: String,
}

impl Cgroups {
    pub(crate) fn new(parent: String) -> Self {
        Cgroups { parent }
    }

    /// The spec's `linux.cgroupsPath` for a sandbox.
    pub(crate) fn path_for(&self, id: &str) -> String {
        format!("/{}/{id}", self.parent)
    }

    /// Every parent directory of ours: one per v1 controller, or the v2 root's.
    fn parents(&self) -> Vec<PathBuf> {
        let root = Path::new(CGROUP_ROOT);
        let mut dirs = vec![root.join(&self.parent)];
        if let Ok(entries) = std::fs::read_dir(root) {
            dirs.extend(entries.flatten().map(|e| e.path().join(&self.parent)));
        }
        dirs.retain(|d| d.is_dir());
        dirs
    }

    /// Ids that have a cgroup of ours under any controller.
    pub(crate) fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .parents()
            .iter()
            .filter_map(|p| std::fs::read_dir(p).ok())
            .flat_map(|entries| entries.flatten())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The memory the sandbox's cgroup is charged for, in bytes (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`); `None` if the sandbox has no memory cgroup.
    pub(crate) fn memory_usage(&self, id: &str) -> Option<u64> {
        let root = Path::new(CGROUP_ROOT);
        [
            root.join("memory")
                .join(&self.parent)
                .join(id)
                .join("memory.usage_in_bytes"),
            root.join(&self.parent).join(id).join("memory.current"),
        ]
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| s.trim().parse().ok())
    }

    /// The CPU time the sandbox's cgroup has used, in nanoseconds (v1 `cpuacct.usage`, v2
    /// `usage_usec` of `cpu.stat`).
    pub(crate) fn cpu_usage_ns(&self, id: &str) -> Option<u64> {
        let root = Path::new(CGROUP_ROOT);
        let v1 = ["cpuacct", "cpu,cpuacct"]
            .iter()
            .map(|c| {
                root.join(c)
                    .join(&self.parent)
                    .join(id)
                    .join("cpuacct.usage")
            })
            .find_map(|f| std::fs::read_to_string(f).ok());
        if let Some(ns) = v1 {
            return ns.trim().parse().ok();
        }
        let stat =
            std::fs::read_to_string(root.join(&self.parent).join(id).join("cpu.stat")).ok()?;
        stat_field(&stat, "usage_usec").map(|us| us * 1000)
    }

    /// The page cache the sandbox's cgroup is charged for, in bytes (v1 `total_cache`, v2 `file`
    /// of `memory.stat`).
    pub(crate) fn memory_cache(&self, id: &str) -> Option<u64> {
        let root = Path::new(CGROUP_ROOT);
        let v1 = root
            .join("memory")
            .join(&self.parent)
            .join(id)
            .join("memory.stat");
        if let Ok(stat) = std::fs::read_to_string(v1) {
            return stat_field(&stat, "total_cache");
        }
        let stat =
            std::fs::read_to_string(root.join(&self.parent).join(id).join("memory.stat")).ok()?;
        stat_field(&stat, "file")
    }

    /// Stops (`true`) or lets go on (`false`) every process of the sandbox, sentry and gofer alike,
    /// where it stands: v1 `freezer.state`, v2 `cgroup.freeze`. May be repeated. A sandbox with no
    /// freezer cgroup (it is being torn down) is left as it is.
    ///
    /// The kernel freezes a thread only once it reaches a point where it can stop, so a freeze
    /// returns when every thread has stopped (v1 `FROZEN`, v2 `frozen 1` in `cgroup.events`),
    /// writing the request again meanwhile as runc does, which wakes threads that slept through
    /// it. One that has not stopped within `FREEZE_WAIT` is thawed again and reported: a
    /// sandbox is either frozen or running, never half of each.
    pub(crate) fn set_frozen(&self, id: &str, frozen: bool) -> Result<(), DriverError> {
        let Some(freezer) = Freezer::of(&self.parent, id) else {
            return Ok(());
        };
        freezer.request(frozen)?;
        if !frozen {
            return Ok(());
        }
        let deadline = Instant::now() + FREEZE_WAIT;
        while !freezer.is_frozen() {
            if Instant::now() >= deadline {
                let thawed = freezer.request(false);
                return Err(DriverError::Command {
                    what: format!("freezing sandbox {id}"),
                    detail: format!(
                        "some of its threads had not stopped after {} ms{}",
                        FREEZE_WAIT.as_millis(),
                        match thawed {
                            Ok(()) => "; it runs on".to_string(),
                            Err(e) => format!(", and thawing it again failed: {e}"),
                        }
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
            freezer.request(true)?;
        }
        Ok(())
    }

    /// Sets the most memory the host lets the sandbox's processes (sentry, gofer) hold, in bytes
    /// (v1 `memory.limit_in_bytes`, v2 `memory.max`).
    pub(crate) fn set_memory_limit(&self, id: &str, bytes: u64) -> Result<(), DriverError> {
        let root = Path::new(CGROUP_ROOT);
        let file = [
            root.join("memory")
                .join(&self.parent)
                .join(id)
                .join("memory.limit_in_bytes"),
            root.join(&self.parent).join(id).join("memory.max"),
        ]
        .into_iter()
        .find(|f| f.exists())
        .ok_or_else(|| DriverError::Command {
            what: format!("limiting the memory of {id}"),
            detail: "the sandbox has no memory cgroup".into(),
        })?;
        std::fs::write(&file, bytes.to_string())
            .map_err(DriverError::io(format!("writing {}", file.display())))
    }

    /// Removes the sandbox's cgroup directories, which the caller has thawed. Processes still in
    /// them are killed first: a runsc killed half-way through `run` or `restore` leaves its sandbox
    /// and gofer running, unknown to `runsc delete`, and the cgroup is the one place that still
    /// names them.
    pub(crate) fn remove(&self, id: &str) -> Result<(), DriverError> {
        let parents = self.parents();
        let mut killed = false;
        for parent in &parents {
            let procs =
                std::fs::read_to_string(parent.join(id).join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                killed = true;
            }
        }
        if killed {
            // The kernel empties the cgroup once the killed processes are reaped.
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        for parent in parents {
            let dir = parent.join(id);
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(DriverError::io(format!(
                        "removing cgroup {}",
                        dir.display()
                    ))(e));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The value of `name` in a `name value` per line file (`memory.stat`, `cpu.stat`).
fn stat_field(stat: &str, name: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok()).flatten()
    })
}

/// One sandbox's freezer: cgroup v1's `freezer.state` or v2's `cgroup.freeze`.
enum Freezer {
    V1(PathBuf),
    V2(PathBuf),
}

impl Freezer {
    /// The freezer of cgroup `parent/id`: v1's under the freezer controller, else v2's under
    /// the unified root; `None` if it has neither.
    fn of(parent: &str, id: &str) -> Option<Freezer> {
        let root = Path::new(CGROUP_ROOT);
        let v1 = root
            .join("freezer")
            .join(parent)
            .join(id)
            .join("freezer.state");
        let v2 = root.join(parent).join(id);
        if v1.exists() {
            Some(Freezer::V1(v1))
        } else if v2.join("cgroup.freeze").exists() {
            Some(Freezer::V2(v2))
        } else {
            None
        }
    }

    fn request(&self, frozen: bool) -> Result<(), DriverError> {
        let (file, value) = match self {
            Freezer::V1(state) => (state.clone(), if frozen { "FROZEN" } else { "THAWED" }),
            Freezer::V2(dir) => (dir.join("cgroup.freeze"), if frozen { "1" } else { "0" }),
        };
        std::fs::write(&file, value).map_err(DriverError::io(format!("writing {}", file.display())))
    }

    /// Whether every thread has stopped. A cgroup that vanished (torn down meanwhile) counts as
    /// frozen: nothing of it runs.
    fn is_frozen(&self) -> bool {
        match self {
            Freezer::V1(state) => std::fs::read_to_string(state)
                .map(|s| s.trim() == "FROZEN")
                .unwrap_or(true),
            Freezer::V2(dir) => std::fs::read_to_string(dir.join("cgroup.events"))
                .map(|s| s.lines().any(|l| l == "frozen 1"))
                .unwrap_or(true),
        }
    }
}
