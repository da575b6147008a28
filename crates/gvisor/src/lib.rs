//! Airlock's gVisor driver: each sandbox is a `runsc` container with its own network namespace,
//! veth pair and writable layer over a shared, read-only template rootfs.
//!
//! Choices, measured on our hosts (Debian 12, kernel 6.18, runsc 0.0~20240729.0; see
//! `shared/reference/gvisor-field-notes.md`):
//!
//! - **Platform: systrap.** It needs nothing from the host; the KVM platform does not work here,
//!   because `/dev/kvm` on these machines runs only PVM guests.
//! - **Network: gVisor's netstack (`--network=sandbox`) in a per-sandbox netns** (`al-{id}`, with
//!   `eth0` peered to the host's `alv{slot}`; the [`network`] plan owns it, and what may cross
//!   that link). The sandbox's TCP/IP runs inside the
//!   sentry, not in the host kernel, and checkpoint/restore keeps working; `--network=host`
//!   refuses checkpoint ("not supported when using hostinet"). This runsc wrongly thinks every
//!   netns is the host's unless `/proc/sys/net` is hidden, so it is started in a private mount
//!   namespace with an empty tmpfs there (see [`runsc`]). The spec's netns path is enough for
//!   runsc to join the netns: no `setns` in our process.
//! - **Writable layer: `--overlay2=root:dir={bundle}/overlay`.** The template stays untouched;
//!   the overlay's upper layer is backed by an (unlinked) filestore file in the sandbox's bundle
//!   directory, so a sandbox writing 1 GB costs 1 GB of host disk, not host RAM (`root:memory`
//!   showed 1 GB of shared memory in the sandbox process for the same write). runsc bounds it by
//!   nothing, so that directory is a loop-mounted filesystem of the sandbox's disk size (see
//!   [`disk`]): a full disk is `ENOSPC` inside, and the file vanishes with the sandbox. gVisor
//!   mounts its own tmpfs at `/tmp` (the template's `/tmp` is empty), so `/tmp` is in sandbox
//!   memory, within the memory limit.
//! - **Limits: cgroups `airlock/{id}`** with a CPU quota of `cpu_count` CPUs, a task limit, and
//!   the memory limit (gVisor reports it as `MemTotal`), which the driver then raises by a
//!   quarter for gVisor's own memory: the agent's OOM guard keeps the sandbox's programs within
//!   the size. runsc creates and removes them.
//! - **Host-wide names** (netns, cgroups, `/run` files) are one server's per host by default;
//!   several servers on one host, each in a network namespace of its own, each take an
//!   [`Instance`] whose name every one of theirs carries.
//!
//! - **Checkpoints: `runsc checkpoint --leave-running`** into `images/{name}`, written under a
//!   temporary name and renamed, so an image is either whole or absent. A failed checkpoint
//!   (a full disk) leaves the sandbox running; without `--leave-running` it would stop it. Before
//!   checkpointing, the driver waits for the host's connections into the sandbox to close (see
//!   [`links::wait_until_drained`]). Images hold memory and the overlay's writes, not the
//!   template: a restore must use the same rootfs. A restore into another sandbox (new id, netns,
//!   address, `/etc/hosts`) works: netstack takes the new netns's address, and the agent listens
//!   on every address.
//!
//! The sandbox's first process is the agent, bind-mounted read-only at
//! `/opt/airlock/airlock-agent` and started as root with Docker's default capabilities minus
//! `NET_RAW`. Its stdin is `/dev/null` and its stdout/stderr are the bundle's `launch.log`
//! (runsc hands its own stdio to the container), so the agent should close them once it runs.

mod bundles;
mod cgroup;
mod disk;
mod host_cmd;
mod host_lock;
mod images;
mod instance;
mod loop_device;
mod network;
mod oci;
mod runsc;
mod runsc_version;
mod sweep;
mod teardowns;
mod volumes;

use airlock_core::driver::{Driver, DriverError, LaunchSpec, Placement, RootfsWrites};
use airlock_core::egress::Egress;
use airlock_core::ids::SandboxId;
use cgroup::Cgroups;
use network::{links, Network};
use runsc::{RunArgs, Runsc};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use instance::{Instance, InstanceError};
pub use oci::AGENT_PATH;

/// Where the driver keeps its state, and what it runs.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// Holds runsc's `--root` (`runsc/`) and one bundle per sandbox (`bundles/{id}/`), e.g.
    /// `{data_dir}/gvisor`. Created if missing.
    pub state_dir: PathBuf,
    /// Host path of the agent binary; bind-mounted read-only at [`AGENT_PATH`] and run as the
    /// sandbox's first process.
    pub agent_binary: PathBuf,
    /// The runsc binary, looked up in `PATH` unless absolute.
    pub runsc: PathBuf,
    /// The network services binary (`airlock-netd`), run as its own user.
    pub netd_binary: PathBuf,
    /// Debugging only: install no host firewall (see [`network`]), so sandboxes reach the host,
    /// each other and private ranges. The escape suite uses it to show that its network probes
    /// detect a leak.
    pub open_network: bool,
    /// Whose host-wide names (netns, cgroups, run files) the driver uses and sweeps: the plain
    /// ones by default, one instance's when several servers share the host.
    pub instance: Instance,
}

impl GvisorConfig {
    pub fn new(
        state_dir: impl Into<PathBuf>,
        agent_binary: impl Into<PathBuf>,
        netd_binary: impl Into<PathBuf>,
    ) -> Self {
        GvisorConfig {
            state_dir: state_dir.into(),
            agent_binary: agent_binary.into(),
            runsc: PathBuf::from("runsc"),
            netd_binary: netd_binary.into(),
            open_network: false,
            instance: Instance::default(),
        }
    }
}

pub struct GvisorDriver {
    _host_locks: host_lock::HostLocks,
    instance: Instance,
    cgroups: Cgroups,
    runsc: Runsc,
    bundles: bundles::Bundles,
    images: images::Images,
    agent_binary: String,
    fingerprint: String,
    network: Network,
    teardowns: teardowns::Teardowns,
}

/// How long a launch waits for a teardown of the same id to end (see `teardowns.rs`).
const TEARDOWN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a checkpoint waits for the host's connections into the sandbox to close.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// The least memory the host allows a sandbox beyond its size, for gVisor itself.
const HOST_MEMORY_HEADROOM_MB: u64 = 64;
/// Free disk space a checkpoint leaves at least, beyond the image's estimated size.
const CHECKPOINT_HEADROOM: u64 = 64 << 20;

impl GvisorDriver {
    /// Checks the agent binary, creates the state directories (mode 0700) and sets up the
    /// network, with the policies of the sandboxes a restart will adopt (`known`: their slots
    /// and policies) in force from the first moment. Must run inside the async runtime.
    pub fn new(config: GvisorConfig, known: &[(u32, Egress)]) -> Result<Self, DriverError> {
        let agent = std::fs::canonicalize(&config.agent_binary).map_err(DriverError::io(
            format!("finding the agent binary {}", config.agent_binary.display()),
        ))?;
        if !agent.is_file() {
            return Err(invalid("agent binary", &agent, "is not a regular file"));
        }
        let mut dirs = std::fs::DirBuilder::new();
        dirs.recursive(true).mode(0o700);
        for sub in ["runsc", "bundles", "images"] {
            let dir = config.state_dir.join(sub);
            dirs.create(&dir)
                .map_err(DriverError::io(format!("creating {}", dir.display())))?;
        }
        // Absolute paths: runsc's overlay directory must be one, and bundles are referred to
        // from runsc's state.
        let state_dir = std::fs::canonicalize(&config.state_dir).map_err(DriverError::io(
            format!("resolving {}", config.state_dir.display()),
        ))?;
        utf8("state dir", &state_dir)?;
        let version = runsc_version::check(&config.runsc)?;
        tracing::info!(runsc = %config.runsc.display(), version, "runsc found");
        let fingerprint = fingerprint(&agent, &config.runsc)?;
        let host_locks = host_lock::take(&config.instance)?;
        let images = images::Images::new(state_dir.join("images"));
        // Checkpoints that died half-way with the last process; none of this one's is under way.
        images.remove_partial();
        let network = Network::new(network::Setup {
            state_dir: &state_dir,
            run_dir: config.instance.run_dir(),
            enforce: !config.open_network,
            netd_binary: config.netd_binary,
            known,
        })?;
        Ok(GvisorDriver {
            _host_locks: host_locks,
            cgroups: Cgroups::new(config.instance.cgroup_parent()),
            instance: config.instance,
            runsc: Runsc::new(config.runsc, state_dir.join("runsc")),
            bundles: bundles::Bundles::new(state_dir.join("bundles")),
            images,
            agent_binary: utf8("agent binary", &agent)?.to_owned(),
            fingerprint,
            network,
            teardowns: Default::default(),
        })
    }

    /// Refuses a checkpoint the disk cannot hold: the image is about the size of the memory the
    /// sandbox is charged for plus its overlay's writes.
    fn check_space_for(&self, id: &str) -> Result<(), DriverError> {
        let overlay = self.bundles.of(id).join("overlay");
        // Without a disk of its own (size 0) the layer's filestore is an unlinked file in the
        // overlay directory, which nothing can measure.
        let writes = disk::used(&overlay).unwrap_or(0);
        let needed = self.cgroups.memory_usage(id).unwrap_or(0) + writes + CHECKPOINT_HEADROOM;
        let stat = nix::sys::statvfs::statvfs(self.images.root())
            .map_err(|e| DriverError::io("checking free disk space")(e.into()))?;
        let free = stat.blocks_available() * stat.fragment_size();
        if free < needed {
            return Err(DriverError::NoSpace(format!(
                "saving sandbox {id} needs about {} MiB on the server's disk, and {} MiB are free",
                needed >> 20,
                free >> 20
            )));
        }
        Ok(())
    }

    async fn try_launch(
        &self,
        spec: &LaunchSpec,
        slot: u32,
        rootfs: &str,
        image: Option<&Path>,
    ) -> Result<(), DriverError> {
        let id = spec.id.as_str();
        let netns = self.instance.netns_name(id);
        self.network.attach(&netns, slot, &spec.egress).await?;

        let bundle = self.bundles.of(id);
        let overlay_dir = bundle.join("overlay");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&overlay_dir)
            .map_err(DriverError::io(format!(
                "creating {}",
                overlay_dir.display()
            )))?;
        let private_layer = spec.writes == RootfsWrites::Private;
        if private_layer && spec.resources.disk_mb > 0 {
            disk::mount_limited(
                &bundle.join("disk.img"),
                &overlay_dir,
                spec.resources.disk_mb.into(),
                disk::Lifetime::Sandbox,
            )
            .await?;
        }
        // Every sandbox that can be checkpointed has the hub, even with no volumes.
        let hub = bundle.join("airlock");
        if private_layer {
            volumes::attach(&hub, &spec.volumes)?;
        }

        let hosts = bundle.join("hosts");
        write(&hosts, oci::hosts_file(id, Network::addrs(slot).sandbox))?;
        let netns_path = links::netns_path(&netns);
        let build_tmp = if private_layer {
            None
        } else {
            build_step_tmp(rootfs)
        };
        let config = oci::spec(&oci::SpecParams {
            id,
            rootfs,
            agent_binary: &self.agent_binary,
            netns: utf8("netns path", &netns_path)?,
            hosts_file: utf8("hosts file", &hosts)?,
            cgroups_path: &self.cgroups.path_for(id),
            cpu_count: spec.resources.cpu_count,
            memory_mb: spec.resources.memory_mb,
            tmp_dir: build_tmp.as_deref(),
            volumes_hub: match private_layer {
                true => Some(utf8("volumes hub", &hub)?),
                false => None,
            },
        });
        write(&bundle.join("config.json"), config.to_string())?;

        self.runsc
            .run_detached(&RunArgs {
                id,
                bundle: &bundle,
                overlay_dir: private_layer.then_some(overlay_dir.as_path()),
                log: &bundle.join("launch.log"),
                image,
            })
            .await?;
        // The sandbox's size is what its programs get (gVisor reports it as `MemTotal`, and the
        // agent's OOM guard keeps them within it); the host adds room for gVisor's own memory, so
        // that it is the guard, not the host's OOM killer, that acts.
        let memory_mb = u64::from(spec.resources.memory_mb);
        if memory_mb > 0 {
            let headroom = (memory_mb / 4).max(HOST_MEMORY_HEADROOM_MB);
            self.cgroups
                .set_memory_limit(id, (memory_mb + headroom) << 20)?;
        }
        Ok(())
    }

    /// Removes everything that belongs to `id`: the container (processes, gofer mounts,
    /// cgroups), its network (when the slot is known: see [`Network::detach`]), the netns and
    /// the bundle. Keeps going after an error so that as much as possible is gone, and returns
    /// the first.
    ///
    /// No `runsc kill` first: `delete --force` SIGKILLs the sandbox process itself.
    async fn teardown(&self, id: &str, slot: Option<u32>) -> Result<(), DriverError> {
        // runsc's kill reaches a frozen sandbox only once it is thawed.
        let mut result = self.cgroups.set_frozen(id, false);
        result = result.and(self.runsc.delete(id).await);
        let bundle = self.bundles.of(id);
        result = result.and(disk::unmount(&bundle.join("overlay")));
        let volumes = volumes::detach(&bundle.join("airlock"));
        let netns = self.instance.netns_name(id);
        result = result.and(self.network.detach(&netns, slot).await);
        result = result.and(self.cgroups.remove(id));
        if let Err(e) = volumes {
            // A volume may still be bound in the bundle: deleting it would delete its files.
            return result.and(Err(e));
        }
        match std::fs::remove_dir_all(&bundle) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                result = result.and(Err(DriverError::io(format!(
                    "removing {}",
                    bundle.display()
                ))(e)));
            }
            _ => {}
        }
        result
    }
}

impl GvisorDriver {
    /// Boots (`image: None`) or restores a sandbox in a free slot, and cleans up after itself
    /// on failure.
    async fn start(
        &self,
        spec: &LaunchSpec,
        image: Option<&Path>,
    ) -> Result<Placement, DriverError> {
        let id = spec.id.as_str();
        if !spec.rootfs.is_dir() {
            return Err(invalid("rootfs", &spec.rootfs, "is not a directory"));
        }
        let rootfs = utf8("rootfs", &spec.rootfs)?;
        self.teardowns.wait_for(id, TEARDOWN_PATIENCE).await;
        // Cleaning up after a failed launch must never hit another sandbox's resources, so
        // refuse to start over anything that already exists.
        if links::netns_path(&self.instance.netns_name(id)).exists() || self.bundles.of(id).exists()
        {
            return Err(DriverError::Command {
                what: format!("launching {id}"),
                detail: "the id is still in use".into(),
            });
        }
        let slot = self.network.allocate()?;
        if links::link_exists(slot) {
            // A leftover the orphan sweep could not remove: skip the slot, do not touch it.
            return Err(DriverError::Command {
                what: format!("launching {id}"),
                detail: format!("network slot {slot} is still in use"),
            });
        }
        let started = Instant::now();
        let result = self.try_launch(spec, slot, rootfs, image).await;
        match &result {
            Ok(()) => {
                tracing::debug!(%id, slot, restored = image.is_some(), elapsed = ?started.elapsed(), "sandbox started")
            }
            Err(err) => {
                tracing::warn!(%id, slot, error = %err, "launch failed; cleaning up");
                if let Err(cleanup) = self.destroy(&spec.id, slot).await {
                    tracing::warn!(%id, error = %cleanup, "cleanup after failed launch failed");
                }
            }
        }
        result.map(|()| Placement {
            slot,
            agent: Network::addrs(slot).sandbox,
        })
    }
}

#[async_trait::async_trait]
impl Driver for GvisorDriver {
    async fn launch(&self, spec: &LaunchSpec) -> Result<Placement, DriverError> {
        self.start(spec, None).await
    }

    async fn restore(&self, spec: &LaunchSpec, image: &str) -> Result<Placement, DriverError> {
        let dir = self.images.dir_of(image)?;
        if !dir.is_dir() {
            return Err(DriverError::Command {
                what: format!("restoring {}", spec.id),
                detail: format!("image '{image}' does not exist"),
            });
        }
        self.start(spec, Some(&dir)).await
    }

    async fn set_egress(&self, slot: u32, egress: &Egress) -> Result<(), DriverError> {
        self.network.set_egress(slot, egress).await
    }

    async fn checkpoint(&self, id: &SandboxId, slot: u32, image: &str) -> Result<(), DriverError> {
        let dir = self.images.dir_of(image)?;
        self.check_space_for(id.as_str())?;
        let addr = Network::addrs(slot).sandbox;
        if !links::wait_until_drained(addr, DRAIN_TIMEOUT).await {
            return Err(DriverError::Command {
                what: format!("checkpointing {id}"),
                detail: "connections into the sandbox did not close; try again".into(),
            });
        }
        self.cgroups.set_frozen(id.as_str(), false)?;
        let partial = self.images.partial(image);
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&partial)
            .map_err(DriverError::io(format!("creating {}", partial.display())))?;
        let started = Instant::now();
        let result = match self.runsc.checkpoint(id.as_str(), &partial).await {
            Ok(()) => std::fs::remove_dir_all(&dir)
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .and_then(|()| std::fs::rename(&partial, &dir))
                .map_err(DriverError::io(format!("storing image {}", dir.display()))),
            Err(e) => Err(e),
        };
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&partial);
            // What looks like any other failure is often the disk filling up mid-write.
            self.check_space_for(id.as_str())?;
        }
        tracing::debug!(%id, image, elapsed = ?started.elapsed(), ok = result.is_ok(), "checkpoint");
        result
    }

    fn image_path(&self, image: &str) -> Result<PathBuf, DriverError> {
        self.images.dir_of(image)
    }

    fn has_image(&self, image: &str) -> bool {
        self.images.dir_of(image).is_ok_and(|d| d.is_dir())
    }

    async fn delete_image(&self, image: &str) -> Result<(), DriverError> {
        self.images.delete(image)
    }

    fn images(&self) -> Result<Vec<String>, DriverError> {
        self.images.names()
    }

    fn image_size(&self, image: &str) -> u64 {
        self.images.size(image)
    }

    fn rootfs_in_use(&self) -> Vec<PathBuf> {
        self.bundles.rootfs_in_use()
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    fn set_frozen(&self, id: &SandboxId, frozen: bool) -> Result<(), DriverError> {
        self.cgroups.set_frozen(id.as_str(), frozen)
    }

    fn memory_used(&self, id: &SandboxId) -> Option<u64> {
        self.cgroups.memory_usage(id.as_str())
    }

    fn usage(&self, id: &SandboxId) -> Option<airlock_core::driver::Usage> {
        let id = id.as_str();
        Some(airlock_core::driver::Usage {
            cpu_ns: self.cgroups.cpu_usage_ns(id)?,
            memory_bytes: self.cgroups.memory_usage(id)?,
            memory_cache_bytes: self.cgroups.memory_cache(id).unwrap_or(0),
            disk_bytes: disk::used(&self.bundles.of(id).join("overlay")).unwrap_or(0),
        })
    }

    fn unreachable(&self) -> Vec<airlock_core::egress::Ipv4Net> {
        self.network.unreachable().to_vec()
    }

    async fn create_volume(&self, dir: &Path, size_mb: u64) -> Result<(), DriverError> {
        volumes::create(dir, size_mb).await
    }

    async fn open_volume(&self, dir: &Path) -> Result<(), DriverError> {
        volumes::open(dir).await
    }

    async fn close_volume(&self, dir: &Path) -> Result<(), DriverError> {
        disk::unmount(dir)
    }

    async fn seal_volume(&self, dir: &Path) -> Result<PathBuf, DriverError> {
        volumes::seal(dir)
    }

    async fn delete_volume(&self, dir: &Path) -> Result<(), DriverError> {
        volumes::delete(dir)
    }

    async fn shutdown(&self) {
        self.network.restore_forwarding();
    }

    async fn destroy(&self, id: &SandboxId, slot: u32) -> Result<(), DriverError> {
        let started = Instant::now();
        let _ending = self.teardowns.begin(id.as_str());
        let result = self.teardown(id.as_str(), Some(slot)).await;
        tracing::debug!(%id, slot, elapsed = ?started.elapsed(), ok = result.is_ok(), "sandbox destroyed");
        result
    }

    async fn adopt(&self, id: &SandboxId, slot: u32) -> Option<Placement> {
        // Frozen when the last server stopped; this one starts out with it awake. First: a
        // frozen sandbox cannot answer runsc's state query, which would wait for its timeout.
        if let Err(e) = self.cgroups.set_frozen(id.as_str(), false) {
            tracing::warn!(%id, error = %e, "could not thaw an adopted sandbox");
            return None;
        }
        if self.runsc.state(id.as_str()).await.as_deref() != Some("running") {
            return None;
        }
        self.network.adopt(slot);
        Some(Placement {
            slot,
            agent: Network::addrs(slot).sandbox,
        })
    }

    async fn sweep_orphans(&self, keep: &[(SandboxId, u32)]) -> Result<(), DriverError> {
        self.sweep(keep).await
    }
}

/// Tags images with the agent binary (size and modification time) and the runsc binary they
/// were taken with: a restore needs the very same agent file and the same runtime.
fn fingerprint(agent: &Path, runsc: &Path) -> Result<String, DriverError> {
    use std::hash::{Hash, Hasher};
    let runsc = which(runsc);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in [agent, runsc.as_path()] {
        let md = std::fs::metadata(path)
            .map_err(DriverError::io(format!("reading {}", path.display())))?;
        (path, md.len(), md.modified().ok()).hash(&mut hasher);
    }
    Ok(format!("{:016x}", hasher.finish()))
}

/// `bin` itself if it has a slash, else its first match in `PATH`.
fn which(bin: &Path) -> PathBuf {
    if bin.components().count() > 1 {
        return bin.to_owned();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| bin.to_owned())
}

/// The `/tmp` of a template build step's root, to bind over runsc's tmpfs, so that what the step
/// leaves there (a file a COPY put there for a later RUN) lands in its layer. Only a real
/// directory: the layers below are the tenant's, and a `tmp` symlink would point the bind at
/// the host's own files. Nothing runs on that root while the sandbox is being set up, so the
/// check holds until runsc opens it. Without one, the step gets runsc's tmpfs.
fn build_step_tmp(rootfs: &str) -> Option<String> {
    let tmp = format!("{rootfs}/tmp");
    std::fs::symlink_metadata(&tmp)
        .is_ok_and(|md| md.is_dir())
        .then_some(tmp)
}

fn write(path: &Path, contents: String) -> Result<(), DriverError> {
    std::fs::write(path, contents).map_err(DriverError::io(format!("writing {}", path.display())))
}

fn utf8<'a>(what: &str, path: &'a Path) -> Result<&'a str, DriverError> {
    path.to_str()
        .ok_or_else(|| invalid(what, path, "is not valid UTF-8"))
}

fn invalid(what: &str, path: &Path, problem: &str) -> DriverError {
    DriverError::Command {
        what: format!("using {what} {}", path.display()),
        detail: problem.into(),
    }
}
