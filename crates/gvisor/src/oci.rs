//! The OCI runtime spec (`config.json`) for one sandbox.

use serde_json::{json, Value};

/// The agent's directory: the volumes hub is mounted there.
const AGENT_DIR: &str = "/opt/airlock";
/// Where the agent binary appears inside every sandbox (bind-mounted read-only from the host).
pub use airlock_core::driver::AGENT_PATH;

/// Docker's default capability set minus `CAP_NET_RAW` (no raw sockets: no packet crafting or
/// ARP games on the sandbox's link). Root inside keeps what package installs and sudo need.
/// Plus `CAP_SYS_ADMIN` for the agent alone: it renames a sandbox restored from a checkpoint
/// (`sethostname`), and drops it from the bounding set at start, so no process it starts, root
/// or not, ever holds it.
const CAPABILITIES: &[&str] = &[
    "CAP_AUDIT_WRITE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_MKNOD",
    "CAP_NET_BIND_SERVICE",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_ADMIN",
    "CAP_SYS_CHROOT",
];

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Enough open files for Jupyter kernels and their ZeroMQ sockets.
const NOFILE: u64 = 65536;

/// The most host tasks (threads) one sandbox may have. Under systrap each sandbox process costs
/// about two (measured: 300 `sleep`s took 637), and the sentry a few dozen. The agent caps
/// processes per user well below this (see [`airlock_wire::MAX_PROCESSES`]), so a fork bomb
/// fails inside the sandbox; this only keeps a sandbox that got past that from exhausting the
/// host's process table, at the price of that sandbox.
const HOST_TASKS: u64 = 5 * airlock_wire::MAX_PROCESSES + 256;

/// Paths are `&str` because JSON needs UTF-8; the driver checks that once, up front.
pub(crate) struct SpecParams<'a> {
    pub id: &'a str,
    pub rootfs: &'a str,
    pub agent_binary: &'a str,
    pub netns: &'a str,
    /// A per-sandbox `/etc/hosts` naming the sandbox's hostname, so lookups of it never go to DNS.
    pub hosts_file: &'a str,
    /// Under each cgroup controller's root; runsc creates it and `runsc delete` removes it.
    pub cgroups_path: &'a str,
    /// 0 means no limit.
    pub cpu_count: u32,
    /// 0 means no limit. gVisor also reports this as the sandbox's `MemTotal`.
    pub memory_mb: u32,
    /// A host directory to bind at `/tmp`. runsc covers an empty `/tmp` with a tmpfs, which a
    /// template build's step must not get: what it leaves in `/tmp` belongs in its layer.
    pub tmp_dir: Option<&'a str>,
    /// The host directory bound (recursively) at [`AGENT_DIR`], the agent's mount and the
    /// volumes in it: see [`crate::volumes`].
    pub volumes_hub: Option<&'a str>,
}

pub(crate) fn spec(p: &SpecParams<'_>) -> Value {
    let mut mounts = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc" }),
        json!({
            "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        }),
        json!({
            "destination": "/dev/pts", "type": "devpts", "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        }),
        json!({
            "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        }),
        json!({
            "destination": "/sys", "type": "sysfs", "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        }),
    ];
    // Before the agent's mount, which is made inside it (mounts are made in order).
    if let Some(hub) = p.volumes_hub {
        mounts.push(json!({
            "destination": AGENT_DIR, "type": "bind", "source": hub, "options": ["rbind", "rw"],
        }));
    }
    mounts.push(json!({
        "destination": AGENT_PATH, "type": "bind", "source": p.agent_binary,
        "options": ["bind", "ro"],
    }));
    mounts.push(json!({
        "destination": "/etc/hosts", "type": "bind", "source": p.hosts_file,
        "options": ["bind", "ro"],
    }));
    if let Some(tmp) = p.tmp_dir {
        mounts.push(json!({
            "destination": "/tmp", "type": "bind", "source": tmp, "options": ["bind", "rw"],
        }));
    }
    let mut resources = serde_json::Map::new();
    if p.memory_mb > 0 {
        resources.insert(
            "memory".into(),
            json!({ "limit": u64::from(p.memory_mb) * 1024 * 1024 }),
        );
    }
    resources.insert("pids".into(), json!({ "limit": HOST_TASKS }));
    if p.cpu_count > 0 {
        let period: u64 = 100_000;
        resources.insert(
            "cpu".into(),
            json!({ "quota": u64::from(p.cpu_count) * period, "period": period }),
        );
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": [AGENT_PATH],
            "env": [PATH_ENV, "HOME=/root"],
            "cwd": "/",
            "capabilities": {
                "bounding": CAPABILITIES,
                "effective": CAPABILITIES,
                "permitted": CAPABILITIES,
            },
            "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE }],
        },
        // Writable only through runsc's overlay: the template directory itself is never written.
        "root": { "path": p.rootfs, "readonly": false },
        "hostname": p.id,
        "mounts": mounts,
        "linux": {
            "namespaces": [
                { "type": "pid" },
                { "type": "ipc" },
                { "type": "uts" },
                { "type": "mount" },
                { "type": "network", "path": p.netns },
            ],
            "cgroupsPath": p.cgroups_path,
            "resources": resources,
        },
    })
}

/// `/etc/hosts` for a sandbox: its hostname resolves to its own address, as under Docker.
pub(crate) fn hosts_file(id: &str, addr: std::net::Ipv4Addr) -> String {
    format!(
        "127.0.0.1\tlocalhost\n\
         {addr}\t{id}\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         ff02::1\tip6-allnodes\n\
         ff02::2\tip6-allrouters\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SpecParams<'static> {
        SpecParams {
            id: "abc",
            rootfs: "/t/rootfs",
            agent_binary: "/usr/lib/airlock/airlock-agent",
            netns: "/run/netns/al-abc",
            hosts_file: "/s/bundles/abc/hosts",
            cgroups_path: "/airlock/abc",
            cpu_count: 2,
            memory_mb: 512,
            tmp_dir: None,
            volumes_hub: Some("/s/bundles/abc/airlock"),
        }
    }

    #[test]
    fn spec_is_deliberate() {
        let s = spec(&params());
        let caps = &s["process"]["capabilities"];
        for set in ["bounding", "effective", "permitted"] {
            let set: Vec<&str> = caps[set]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            assert!(set.contains(&"CAP_SETUID"));
            assert!(!set.contains(&"CAP_NET_RAW"));
            // The agent's, to set a restored sandbox's hostname; it keeps it from its children.
            assert!(set.contains(&"CAP_SYS_ADMIN"));
        }
        assert_eq!(s["root"]["path"], "/t/rootfs");
        assert_eq!(s["hostname"], "abc");
        let netns = s["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["type"] == "network")
            .unwrap();
        assert_eq!(netns["path"], "/run/netns/al-abc");
        let agent = s["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == AGENT_PATH)
            .unwrap();
        assert_eq!(agent["source"], "/usr/lib/airlock/airlock-agent");
        assert!(agent["options"].as_array().unwrap().contains(&json!("ro")));
        assert_eq!(s["process"]["args"], json!([AGENT_PATH]));
        let order: Vec<&str> = s["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        let at = |d: &str| order.iter().position(|m| *m == d).unwrap();
        assert!(
            at(AGENT_DIR) < at(AGENT_PATH),
            "the agent's mount is made in the hub"
        );
        assert_eq!(s["linux"]["resources"]["memory"]["limit"], 512u64 << 20);
        assert_eq!(s["linux"]["resources"]["cpu"]["quota"], 200_000);
        assert_eq!(s["linux"]["resources"]["pids"]["limit"], HOST_TASKS);
    }

    #[test]
    fn tmp_is_bound_only_when_asked() {
        let tmp_mounts = |s: &Value| {
            s["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["destination"] == "/tmp")
                .cloned()
                .collect::<Vec<_>>()
        };
        assert!(tmp_mounts(&spec(&params())).is_empty());
        let bound = tmp_mounts(&spec(&SpecParams {
            tmp_dir: Some("/t/rootfs/tmp"),
            ..params()
        }));
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0]["source"], "/t/rootfs/tmp");
    }

    #[test]
    fn zero_means_unlimited() {
        let s = spec(&SpecParams {
            cpu_count: 0,
            memory_mb: 0,
            ..params()
        });
        assert_eq!(
            s["linux"]["resources"],
            json!({ "pids": { "limit": HOST_TASKS } })
        );
    }

    #[test]
    fn hostname_resolves_locally() {
        let hosts = hosts_file("abc", "10.77.0.2".parse().unwrap());
        assert!(hosts.contains("10.77.0.2\tabc\n"));
    }
}
