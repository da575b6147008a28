//! The isolation driver: how a sandbox is started, found again and destroyed.
//!
//! The lifecycle code talks only to this trait, so a gVisor driver today and a Firecracker driver
//! later sit behind the same calls, with the same agent inside.

use crate::egress::Egress;
use crate::ids::SandboxId;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

pub use airlock_wire::AGENT_PATH;

/// Everything a driver needs to start one sandbox.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub id: SandboxId,
    /// Read-only template root filesystem; the sandbox gets its own writable layer over it.
    pub rootfs: PathBuf,
    pub resources: Resources,
    /// Outbound network policy, in force before the sandbox's first instruction.
    pub egress: Egress,
    pub writes: RootfsWrites,
    /// Volume directories (see [`Driver::create_volume`]) the sandbox sees at
    /// `VOLUMES_DIR/{i}`, in this order. Its agent binds them where the user asked; the binds
    /// are in its checkpoints, so a restore needs the same volumes in the same order.
    pub volumes: Vec<PathBuf>,
}

/// Where a sandbox's writes to its root filesystem go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RootfsWrites {
    /// Into a layer of its own that goes with it: the rootfs is shared and never written.
    #[default]
    Private,
    /// Into the rootfs directory itself. Only for a template build's step, whose rootfs is an
    /// overlay mount with the step's new layer as its upper directory. Such a sandbox has no
    /// disk limit of its own and cannot be checkpointed.
    Through,
}

/// What one sandbox may use. 0 means unlimited (tests only: the server always sets them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
}

/// A running sandbox's use of the host, read from its cgroup and its disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// CPU time used since it started, in nanoseconds.
    pub cpu_ns: u64,
    /// Memory charged for it, and the part of that which is page cache.
    pub memory_bytes: u64,
    pub memory_cache_bytes: u64,
    /// What its writable layer holds (0 without a disk of its own).
    pub disk_bytes: u64,
}

/// Where a started sandbox lives: the driver's handle for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The driver's name for the sandbox's place on the host network. Recorded, so that a
    /// restarted server can adopt the sandbox, and handed back to every call about it.
    pub slot: u32,
    /// Where its agent answers.
    pub agent: Ipv4Addr,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    /// The host's disk cannot hold what was to be written (a checkpoint image).
    #[error("not enough disk space: {0}")]
    NoSpace(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl DriverError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| DriverError::Io { what, source }
    }
}

#[async_trait::async_trait]
pub trait Driver: Send + Sync + 'static {
    /// Starts the sandbox with the agent as its first process, in a place on the network the
    /// driver chooses. Returns once the sandbox runs; the caller waits for the agent to answer.
    async fn launch(&self, spec: &LaunchSpec) -> Result<Placement, DriverError>;

    /// Replaces the outbound network policy of the sandbox in `slot` (launches and restores
    /// apply [`LaunchSpec::egress`] themselves; this is for one already running).
    async fn set_egress(&self, slot: u32, egress: &Egress) -> Result<(), DriverError>;

    /// Stops the sandbox and removes everything it held on the host (processes, mounts, network
    /// devices, files). Succeeds if the sandbox is already gone.
    async fn destroy(&self, id: &SandboxId, slot: u32) -> Result<(), DriverError>;

    /// After a restart: takes back the sandbox recorded in `slot` if its runtime still runs
    /// (its policy was put in force when the driver started), and says where it is.
    async fn adopt(&self, id: &SandboxId, slot: u32) -> Option<Placement>;

    /// Removes every host resource that looks like this driver's but belongs to no id in `keep`
    /// (left over by a crashed server). Images are not touched.
    async fn sweep_orphans(&self, keep: &[(SandboxId, u32)]) -> Result<(), DriverError>;

    /// Saves the running sandbox (memory, processes, filesystem writes) as the image named
    /// `image`, replacing any image of that name, and leaves the sandbox running. On failure the
    /// sandbox still runs untouched and the old image, if any, is kept.
    ///
    /// Image names are `[a-z0-9._-]`, 1..=128 characters, not starting with a dot.
    async fn checkpoint(&self, id: &SandboxId, slot: u32, image: &str) -> Result<(), DriverError>;

    /// Starts a sandbox from an image instead of booting it: its processes carry on where the
    /// checkpoint left them. `spec.rootfs` must be the rootfs the image was taken over.
    async fn restore(&self, spec: &LaunchSpec, image: &str) -> Result<Placement, DriverError>;

    /// The directory an image's files are in (whether it exists or not): plain files, which a
    /// copy elsewhere restores as they are. Work in progress is written as `.{image}.partial`
    /// beside it; the driver deletes what is left of such at its start.
    fn image_path(&self, image: &str) -> Result<PathBuf, DriverError>;

    /// Whether the image exists.
    fn has_image(&self, image: &str) -> bool;

    /// Deletes the image; succeeds if it does not exist.
    async fn delete_image(&self, image: &str) -> Result<(), DriverError>;

    /// The root filesystems ([`LaunchSpec::rootfs`]) that sandboxes on this host stand on,
    /// from their launch until their destroy is done, whatever the lifecycle makes of them
    /// (running, frozen, pooled, a golden image's boot, a build's step).
    fn rootfs_in_use(&self) -> Vec<PathBuf>;

    /// Names of all images (not those still being written). No side effects: it runs while
    /// checkpoints and downloads are under way.
    fn images(&self) -> Result<Vec<String>, DriverError>;

    /// The disk the image takes, in bytes (0 if it does not exist).
    fn image_size(&self, image: &str) -> u64;

    /// A short `[a-z0-9]` tag that changes whenever images taken before stop being restorable
    /// (a new agent binary or runtime), so cached images are keyed by it.
    fn fingerprint(&self) -> String;

    /// Stops every process of a running sandbox where it stands (`true`), so that an idle one
    /// costs no CPU, or lets them go on (`false`). A freeze returns once every process has
    /// stopped (about a millisecond); one that cannot finish leaves the sandbox running and is
    /// an error. May be repeated. Destroying and checkpointing a frozen sandbox thaw it first.
    fn set_frozen(&self, id: &SandboxId, frozen: bool) -> Result<(), DriverError>;

    /// The memory the host charges the sandbox's processes for, in bytes; `None` if unknown.
    fn memory_used(&self, id: &SandboxId) -> Option<u64>;

    /// What the running sandbox has used so far and holds now; `None` if it does not run here.
    fn usage(&self, id: &SandboxId) -> Option<Usage>;

    /// The networks no sandbox may reach, whatever its policy: the platform's ranges and the
    /// host's own. A template build's image pull may not reach them either.
    fn unreachable(&self) -> Vec<crate::egress::Ipv4Net>;

    /// Makes the empty directory `dir` a volume's storage, holding at most `size_mb`: writes
    /// past that fail with `ENOSPC`, from a sandbox as from the host.
    async fn create_volume(&self, dir: &Path, size_mb: u64) -> Result<(), DriverError>;

    /// Makes the volume at `dir` usable again after a restart; does nothing if it is.
    async fn open_volume(&self, dir: &Path) -> Result<(), DriverError>;

    /// Gives back what [`Driver::open_volume`] took from the host (at a clean shutdown); the
    /// files stay. No sandbox may be using it.
    async fn close_volume(&self, dir: &Path) -> Result<(), DriverError>;

    /// Closes the volume at `dir` to move it to another host, and returns the one path (a
    /// file or directory beside `dir`) that then holds all of it, whole and still. Unlike
    /// [`Driver::close_volume`], refused while anything on the host still uses its
    /// filesystem: then it stays open as it was. [`Driver::open_volume`] opens it again from
    /// that path, here or on the host it moved to.
    async fn seal_volume(&self, dir: &Path) -> Result<PathBuf, DriverError>;

    /// Removes the volume at `dir` and every file in it. No sandbox may be using it.
    async fn delete_volume(&self, dir: &Path) -> Result<(), DriverError>;

    /// Gives back to the host what the driver changed for sandboxes, once none runs any more
    /// (a clean shutdown).
    async fn shutdown(&self);
}

/// Whether `name` is a valid image name (see [`Driver::checkpoint`]).
pub fn valid_image_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}
