//! The sandboxes' cgroups: `airlock/{id}` (`airlock-{instance}/{id}` for a named instance) under
//! each controller (cgroup v1) or under the unified root (v2). runsc creates them from the spec
//! and `runsc delete` removes them; this module only finds and removes what a crash left behind.

use airlock_core::driver::DriverError;
use std::path::{Path, PathBuf};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

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
    /// where it stands: v1 `freezer.state`, v2 `cgroup.freeze`. Both return at once and may be
    /// repeated. A sandbox with no freezer cgroup (it is being torn down) is left as it is.
    pub(crate) fn set_frozen(&self, id: &str, frozen: bool) -> Result<(), DriverError> {
        let root = Path::new(CGROUP_ROOT);
        let v1 = root
            .join("freezer")
            .join(&self.parent)
            .join(id)
            .join("freezer.state");
        let (file, value) = if v1.exists() {
            (v1, if frozen { "FROZEN" } else { "THAWED" })
        } else {
            let v2 = root.join(&self.parent).join(id).join("cgroup.freeze");
            if !v2.exists() {
                return Ok(());
            }
            (v2, if frozen { "1" } else { "0" })
        };
        std::fs::write(&file, value).map_err(DriverError::io(format!("writing {}", file.display())))
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
