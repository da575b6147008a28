//! `airlock serve`'s flags, and what they make of the server: a gateway's options or a node's
//! (or one box's) [`ServeOptions`].

use super::{GatewayOptions, ServeOptions};
use crate::cluster::{ClusterArgs, Role};
use airlock_core::build::BuildLimits;
use airlock_core::driver::Resources;
use airlock_core::lifecycle::{KeyQuota, Limits, OnExit};
use airlock_core::store::Database;
use airlock_core::volumes::VolumeLimits;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Run the server: the E2B-compatible REST API and the sandbox proxy, on one port.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on. Keep it on loopback unless you put TLS and a firewall in front.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Also serve `GET /metrics` for the host's operator, in Prometheus' text format, on
    /// this address (e.g. 127.0.0.1:9464): sandboxes by phase, frozen ones, each pool, and
    /// memory headroom. The numbers are the whole host's, so they are not on --listen,
    /// where API keys' holders reach; keep this address where only you do. Off by default.
    #[arg(long, value_name = "ADDR", env = "AIRLOCK_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Path of the `airlock-agent` binary to run inside sandboxes [default: next to `airlock`].
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// The gVisor runtime to run sandboxes with, looked up in PATH unless it is a path.
    /// Checked at start: it must be release 2024-07-29 or newer.
    #[arg(long, env = "AIRLOCK_RUNSC", default_value = "runsc")]
    runsc: PathBuf,
    /// Most sandboxes on this host at once, for all API keys together [default: as many
    /// idle ones as its memory holds: (MemTotal - 1024 MiB) / 20 MiB, an idle sandbox's
    /// measured footprint]. Creates and resumes beyond it get 429. Pooled sandboxes fill
    /// only the room that running ones leave, and give way to a create at the cap.
    #[arg(long, env = "AIRLOCK_MAX_SANDBOXES")]
    max_sandboxes: Option<usize>,
    /// Most sandboxes being started at once (a restore or a boot, until its agent
    /// answers) [default: the host's cores]. A start is mostly CPU: past the cores, more at
    /// once only makes each slower. Creates and resumes beyond it wait their turn in
    /// arrival order, and pool refills wait for them.
    #[arg(long, env = "AIRLOCK_MAX_LAUNCHES")]
    max_launches: Option<usize>,
    /// Seconds a create or resume may expect to wait for its turn to start. One that would
    /// wait longer (the starts queued ahead of it, divided among --max-launches, times the
    /// mean time of a recent start) gets 429 at once, with a Retry-After header of that
    /// expected wait. 0 refuses every start that cannot begin at once.
    #[arg(long, default_value_t = 10, env = "AIRLOCK_MAX_LAUNCH_WAIT_SECS")]
    max_launch_wait_secs: u64,
    /// Most sandboxes one API key may run at once, unless the key has its own limit
    /// (`airlock key create --max-running`) [default: --max-sandboxes].
    #[arg(long)]
    key_max_running: Option<usize>,
    /// Most sandboxes one API key may keep paused, unless the key has its own limit.
    #[arg(long, default_value_t = 256)]
    key_max_paused: usize,
    /// Most disk, in MiB, one API key's snapshots may take, unless the key has its own
    /// limit.
    #[arg(long, default_value_t = 102_400)]
    key_max_snapshot_mb: u64,
    /// Seconds a sandbox lives when the create request names no timeout.
    #[arg(long, default_value_t = 300)]
    default_timeout: u64,
    /// Ready sandboxes kept per template, restored from the template's warmed-up golden
    /// image, so a create only hands one over. 0 turns pools and golden images off: every
    /// create then boots a sandbox.
    #[arg(long, default_value_t = 2, env = "AIRLOCK_POOL_SIZE")]
    pool_size: usize,
    /// The most ready sandboxes one template's pool grows to. Each create that finds the
    /// pool empty (it then restores the golden image itself, a few hundred ms slower) makes
    /// the pool keep one more, so the next burst of creates finds them ready. Pooled
    /// sandboxes wait frozen: they cost memory (about 20 MiB each, within
    /// --pool-memory-mb) and no CPU.
    #[arg(long, default_value_t = 32, env = "AIRLOCK_POOL_MAX")]
    pool_max: usize,
    /// Seconds after which a grown pool halves what it keeps beyond --pool-size, if no
    /// create has found it empty meanwhile.
    #[arg(long, default_value_t = 60, env = "AIRLOCK_POOL_SHRINK_SECS")]
    pool_shrink_secs: u64,
    /// Seconds a template's pool is kept with no create of it. Then it is emptied (the
    /// idle sandboxes cost memory and CPU); its next create restores the golden image
    /// itself, a few hundred ms slower, and the pool is filled again.
    #[arg(long, default_value_t = 1800, env = "AIRLOCK_POOL_IDLE_SECS")]
    pool_idle_secs: u64,
    /// The most memory, in MiB, that all pools' ready sandboxes may hold together (an idle
    /// one holds about 20). It goes to every pool's --pool-size first, then to growth, the
    /// templates wanted most lately first.
    #[arg(long, default_value_t = 2048, env = "AIRLOCK_POOL_MEMORY_MB")]
    pool_memory_mb: u64,
    /// Seconds a ready sandbox waits in its pool before it may be let go (its pool shrank,
    /// or a template wanted more lately needs the room), so no restore is thrown away
    /// before it could serve a create. An unused template's pool goes at once.
    #[arg(long, default_value_t = 60, env = "AIRLOCK_POOL_MIN_AGE_SECS")]
    pool_min_age_secs: u64,
    /// The pools' CPU budget: the most restores into pools per minute, half a minute's
    /// worth at once (default: 20 per core).
    #[arg(long, env = "AIRLOCK_POOL_RESTORES_PER_MIN")]
    pool_restores_per_min: Option<u32>,
    /// Milliseconds with no request, no open connection and no process of its own running
    /// after which a sandbox is frozen: it then costs no CPU (an idle awake one costs ~3 % of
    /// a core) until its next request thaws it, in about a millisecond. Pooled sandboxes
    /// wait frozen once they have been ready as long. 0 never freezes.
    #[arg(long, default_value_t = 1000, env = "AIRLOCK_FREEZE_AFTER_MS")]
    freeze_after_ms: u64,
    /// The most memory, in MiB, that paused sandboxes may keep on this host. A pause
    /// always writes the sandbox to disk; within this budget its runtime is also kept,
    /// frozen (no CPU), so that its resume takes about a millisecond instead of a restore
    /// from disk (about 200 ms). The oldest are let go first when the budget is spent or
    /// the host runs short of memory, and all at shutdown; they then resume from disk.
    /// 0 lets every paused sandbox's runtime go at once.
    #[arg(long, default_value_t = 1024, env = "AIRLOCK_PAUSED_MEMORY_MB")]
    paused_memory_mb: u64,
    /// Also keeps paused sandboxes' images in object storage, so that another node can
    /// resume them: `s3://BUCKET[/PREFIX]`, with its endpoint and credentials from the
    /// standard AWS_* variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) or the URL's
    /// query (`?endpoint=http://127.0.0.1:9000&allow_http=true`), or `file:///DIR`. A pause
    /// uploads the image before it is recorded paused; if the upload fails, the pause still
    /// succeeds and the image stays on this host only. The local copy is kept. Templates'
    /// layers and snapshots go there too. Once a day, what no record names any more and
    /// nobody wrote for a day is deleted from it, unless another Airlock database uses the
    /// same bucket and prefix (give each cluster one of its own).
    #[arg(long, value_name = "URL", env = "AIRLOCK_OBJECT_STORE")]
    object_store: Option<String>,
    /// The most disk, in MiB, that this host's copies of snapshot images may take when they
    /// are also in object storage (--object-store): a create from a snapshot taken on
    /// another node downloads its image and keeps it for the next. Past this budget, the
    /// copies started from least recently are deleted (checked every minute); their next
    /// create downloads them again. A snapshot whose upload failed exists here alone: it
    /// neither counts nor goes. 0 keeps no copy past the minute.
    #[arg(long, default_value_t = 10 * 1024, env = "AIRLOCK_SNAPSHOT_CACHE_MB")]
    snapshot_cache_mb: u64,
    /// The most disk, in MiB, that templates' layers may take on this host when they are also
    /// in object storage (--object-store): a node fetches the layers of every template it
    /// starts. Past this budget (checked every minute), the templates started least recently
    /// here are let go of, with the layers only they stand on; their next start here fetches
    /// them again. Nothing a sandbox here stands on, or that was started in the last ten
    /// minutes, goes, and neither does a layer that is on this host alone. Not used when other
    /// data dirs share the templates dir.
    #[arg(long, default_value_t = 20 * 1024, env = "AIRLOCK_LAYER_CACHE_MB")]
    layer_cache_mb: u64,
    /// Most CPUs one sandbox may ask for (`cpuCount` in the create body; default 2).
    #[arg(long, default_value_t = 8)]
    max_cpu_count: u32,
    /// Most memory, in MiB, one sandbox may ask for (`memoryMB`; default 1024).
    #[arg(long, default_value_t = 8192)]
    max_memory_mb: u32,
    /// Most disk, in MiB, one sandbox may ask for (`diskSizeMB`; default 5120).
    #[arg(long, default_value_t = 20480)]
    max_disk_mb: u32,
    /// Seconds a template's ready command (`set_start_cmd(..., wait_for_port(8080))`) may
    /// take to succeed after its sandbox boots, before the build fails.
    #[arg(long, default_value_t = 300, env = "AIRLOCK_READY_TIMEOUT")]
    ready_timeout: u64,
    /// A registry (`host:port`, as in the image's name) that `from_image` builds may pull
    /// from over plain HTTP and at a private or loopback address, such as your own
    /// registry on this host. Others must be HTTPS at public addresses, so that an image
    /// name cannot make the server reach what only it can reach. Repeat for several.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    insecure_registries: Vec<String>,
    /// The domain sandboxes' ports are reached under. Sandboxes report it, so the SDK's
    /// `sandbox.get_host(8080)` returns `8080-{id}.{DOMAIN}`, a name this server's proxy
    /// routes to port 8080 of that sandbox. `localhost:3000` (this server's own address)
    /// works with no DNS: browsers and curl send `*.localhost` to loopback. Otherwise use a
    /// wildcard DNS name for this host. Keep E2B_SANDBOX_URL pointed at the server: without
    /// it, the SDK would send its own traffic to https://49983-{id}.{DOMAIN}.
    #[arg(long, value_name = "DOMAIN", value_parser = parse_domain)]
    domain: Option<String>,
    /// This machine's name as a node: operators' `GET /nodes` lists it, and sandboxes
    /// report it as their `clientID` [default: the host's name].
    #[arg(long, value_name = "NAME", value_parser = parse_node_name, env = "AIRLOCK_NODE_NAME")]
    node_name: Option<String>,
    /// Only when several servers run on one host (each in a network namespace of its own,
    /// as scripts/cluster.sh starts nodes): NAME (1-32 lowercase letters, digits, hyphens)
    /// goes into every host-wide name this server uses, so that it neither finds nor sweeps
    /// another's sandboxes: network namespaces `al.NAME.*`, cgroups `airlock-NAME`, files
    /// in /run/airlock/NAME. Without it, the plain names of one server per host.
    #[arg(long, value_name = "NAME", value_parser = airlock_gvisor::Instance::named, env = "AIRLOCK_INSTANCE")]
    instance: Option<airlock_gvisor::Instance>,
    /// MiB each new volume may hold (E2B's `Volume.create`). Writes through the volume
    /// content API that would take a volume past it are refused with 507.
    #[arg(long, default_value_t = 1024, env = "AIRLOCK_VOLUME_SIZE_MB")]
    volume_size_mb: u64,
    /// Most volumes one API key may have. Creates beyond it get 429.
    #[arg(long, default_value_t = 100)]
    key_max_volumes: usize,
    /// Most MiB one API key's volumes may hold together (each holds the --volume-size-mb
    /// it was made with). Creates beyond it get 507, as does one that the data dir's disk
    /// has too little free space for.
    #[arg(long, default_value_t = 102_400)]
    key_max_volume_mb: u64,
    #[command(flatten)]
    builds: BuildArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// DEBUGGING ONLY, never in production: install no host firewall, so sandboxes can reach
    /// this host (the control API included), one another and private ranges, and network
    /// rules are ignored. The escape tests use it to prove their network probes can see a
    /// leak.
    #[arg(long)]
    insecure_open_network: bool,
    /// Let webhooks (`POST /events/webhooks`) be sent to loopback, link-local and private
    /// addresses, this host and its networks included. Off, a webhook may only reach
    /// addresses a sandbox could reach too: every API key can register one, and the
    /// request leaves from this server.
    #[arg(long, env = "AIRLOCK_WEBHOOKS_ALLOW_PRIVATE")]
    webhooks_allow_private: bool,
    /// Build the built-in templates (base, code-interpreter-v1) and their golden images,
    /// then exit instead of serving. `serve` does the same at every start, from the cache
    /// after the first; scripts/prepare.sh runs this so that the first `serve` starts at
    /// once.
    #[arg(long)]
    prepare_only: bool,
    /// Kill every running sandbox when the server stops (SIGTERM, Ctrl-C). By default they
    /// run on through a stop, a restart or an upgrade of the server: their processes, files,
    /// code interpreter state, timeouts and network rules are kept (the host firewall keeps
    /// enforcing the rules meanwhile), and the next `airlock serve` on the same data dir
    /// adopts them. While no server runs, nothing reaches them and their own new
    /// connections by domain name fail; a sandbox whose timeout passed meanwhile is killed
    /// at the next start.
    #[arg(long, env = "AIRLOCK_STOP_SANDBOXES_ON_EXIT")]
    stop_sandboxes_on_exit: bool,
}

/// What `serve` takes from the command line's global flags.
pub struct Globals {
    pub data_dir: PathBuf,
    pub templates_dir: Option<PathBuf>,
    pub database: Option<Database>,
}

impl ServeArgs {
    /// Serves as these flags say, until a signal.
    pub async fn serve(self, globals: Globals) -> anyhow::Result<()> {
        let Globals {
            data_dir,
            templates_dir,
            database,
        } = globals;
        let ServeArgs {
            listen,
            metrics_listen,
            agent_bin,
            runsc,
            max_sandboxes,
            max_launches,
            max_launch_wait_secs,
            key_max_running,
            key_max_paused,
            key_max_snapshot_mb,
            default_timeout,
            pool_size,
            pool_max,
            pool_shrink_secs,
            pool_idle_secs,
            pool_memory_mb,
            pool_min_age_secs,
            pool_restores_per_min,
            freeze_after_ms,
            paused_memory_mb,
            object_store,
            snapshot_cache_mb,
            layer_cache_mb,
            max_cpu_count,
            max_memory_mb,
            max_disk_mb,
            ready_timeout,
            insecure_registries,
            domain,
            node_name,
            instance,
            volume_size_mb,
            key_max_volumes,
            key_max_volume_mb,
            builds,
            cluster,
            insecure_open_network,
            webhooks_allow_private,
            prepare_only,
            stop_sandboxes_on_exit,
        } = self;
        let cluster_secret = cluster.secret()?;
        if cluster.role == Role::Gateway {
            let (Some(database), Some(secret)) = (database.clone(), cluster_secret) else {
                anyhow::bail!(
                    "a gateway needs --database (the PostgreSQL its nodes share) and \
                     --cluster-secret-file (the secret they hold)"
                );
            };
            let nodes = cluster.node_endpoints();
            if nodes.is_empty() {
                anyhow::bail!("a gateway needs --nodes: where its nodes are");
            }
            return super::serve_gateway(GatewayOptions {
                listen,
                database,
                nodes,
                secret,
                webhooks_allow_private,
            })
            .await;
        }
        let max_sandboxes =
            max_sandboxes.unwrap_or_else(airlock_core::lifecycle::memory_sized_max_sandboxes);
        super::serve(ServeOptions {
            listen,
            metrics_listen,
            data_dir,
            templates_dir,
            agent_binary: agent_bin,
            runsc,
            insecure_registries,
            build_min_free_mb: builds.build_min_free_mb,
            build_step_timeout: Duration::from_secs(builds.build_step_timeout),
            build_limits: builds.limits(),
            volumes: VolumeLimits {
                size_mb: volume_size_mb,
                per_key: key_max_volumes,
                per_key_mb: key_max_volume_mb,
            },
            insecure_open_network,
            webhooks_allow_private,
            prepare_only,
            domain,
            node_name: node_name.unwrap_or_else(host_node_name),
            instance: instance.unwrap_or_default(),
            database: database.clone(),
            object_store,
            layer_cache_mb,
            role: cluster.role,
            cluster_secret,
            on_exit: if stop_sandboxes_on_exit {
                OnExit::StopSandboxes
            } else {
                OnExit::KeepRunning
            },
            limits: Limits {
                max_sandboxes,
                per_key: KeyQuota {
                    running: key_max_running.unwrap_or(max_sandboxes),
                    paused: key_max_paused,
                    snapshot_mb: key_max_snapshot_mb,
                },
                default_timeout: Duration::from_secs(default_timeout),
                max_launches: max_launches.unwrap_or_else(airlock_core::lifecycle::host_cores),
                max_launch_wait: Duration::from_secs(max_launch_wait_secs),
                pool_size,
                pool_max: pool_max.max(pool_size),
                pool_shrink_after: Duration::from_secs(pool_shrink_secs),
                pool_idle: Duration::from_secs(pool_idle_secs),
                pool_memory_mb,
                pool_min_age: Duration::from_secs(pool_min_age_secs),
                pool_restores_per_min: pool_restores_per_min
                    .unwrap_or_else(airlock_core::lifecycle::default_pool_restores_per_min),
                freeze_after: (freeze_after_ms > 0).then(|| Duration::from_millis(freeze_after_ms)),
                paused_memory_mb,
                snapshot_cache_mb,
                ready_timeout: Duration::from_secs(ready_timeout),
                max_resources: Resources {
                    cpu_count: max_cpu_count,
                    memory_mb: max_memory_mb,
                    disk_mb: max_disk_mb,
                },
                ..Limits::default()
            },
        })
        .await
    }
}

/// `airlock serve`'s flags for template builds: how long, how many, how much disk.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// MiB that template builds leave free on the disk of the templates dir: a build step that
    /// takes it below this is stopped and its build fails, and an upload is refused, so that
    /// no build fills the host's disk.
    #[arg(long, default_value_t = 2048, env = "AIRLOCK_BUILD_MIN_FREE_MB")]
    build_min_free_mb: u64,
    /// Seconds one template build step (a RUN, a COPY, a layer of an image) may run before it
    /// is stopped and its build fails.
    #[arg(long, default_value_t = 1800, env = "AIRLOCK_BUILD_STEP_TIMEOUT")]
    build_step_timeout: u64,
    /// Seconds a whole template build (image pulls, every step and the golden image) may run,
    /// from when its turn comes, before it is stopped and fails.
    #[arg(long, default_value_t = 3600, env = "AIRLOCK_BUILD_TIMEOUT_SECS")]
    build_timeout_secs: u64,
    /// Template builds one API key may have waiting or running at once; more get 429. Builds
    /// take turns fairly between keys whatever this is.
    #[arg(long, default_value_t = 4)]
    key_max_builds: usize,
    /// MiB of disk one API key's templates may take: the layers its builds made that a
    /// template still uses, and its COPY uploads. A build or upload past it fails with 507.
    #[arg(long, default_value_t = 20_480)]
    key_max_template_storage_mb: u64,
    /// Templates one API key may have; a build of a new name past it gets 429.
    #[arg(long, default_value_t = 100)]
    key_max_templates: usize,
}

impl BuildArgs {
    fn limits(&self) -> BuildLimits {
        BuildLimits {
            timeout: Duration::from_secs(self.build_timeout_secs),
            per_key: self.key_max_builds,
            storage_bytes_per_key: self.key_max_template_storage_mb << 20,
            templates_per_key: self.key_max_templates,
        }
    }
}

/// A node's name: what a DNS label may be (it may name the node in URLs and logs).
fn parse_node_name(text: &str) -> Result<String, String> {
    let label = text.len() <= 63
        && !text.is_empty()
        && !text.starts_with('-')
        && !text.ends_with('-')
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if label {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!(
            "'{text}' is not a node name: 1-63 letters, digits and inner hyphens"
        ))
    }
}

/// The host's name (its first label, if it is a full domain name) as a node name, or `local`
/// if it is not one.
fn host_node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| {
            let name = name.to_string_lossy();
            parse_node_name(name.split('.').next().unwrap_or_default()).ok()
        })
        .unwrap_or_else(|| "local".into())
}

/// A host name, with a port if need be (`localhost:3000`, `sandbox.example.com`).
fn parse_domain(text: &str) -> Result<String, String> {
    let (host, port) = text.split_once(':').unwrap_or((text, "0"));
    let valid_host = !host.is_empty()
        && host.len() <= 200
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !valid_host || port.parse::<u16>().is_err() {
        return Err(format!(
            "'{text}' is not a domain (e.g. localhost:3000 or sandboxes.example.com)"
        ));
    }
    Ok(text.to_ascii_lowercase())
}
