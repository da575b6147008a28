//! `airlock serve`: recover state, then answer the REST API and route sandbox traffic on one port.
//! The one module that puts all the others together (and `airlock install`, which sets a host
//! up to run it); nothing else imports it.

mod args;
mod binaries;
mod builtins;
mod gateway;
pub mod install;
mod keys;
mod listen;

pub use args::{Globals, ServeArgs};
pub use gateway::{serve_gateway, GatewayOptions};

use crate::agent_client::HttpAgentClient;
use crate::cluster::{ClusterSecret, Role};
use crate::data_dir::DataDir;
use crate::{http, proxy, AppState, AppStateInner};
use airlock_core::build::{BuildLimits, BuildOptions, Builder};
use airlock_core::driver::Driver;
use airlock_core::lifecycle::{Lifecycle, Limits, OnExit};
use airlock_core::store::{Database, Store};
use anyhow::{bail, Context};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use binaries::{find_binary, is_static_executable};
use keys::{ensure_api_key, print_key};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Template builds that run at once; more wait their turn.
const BUILDS_AT_ONCE: usize = 1;

pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Where the operator's `/metrics` is served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    /// Where templates are kept when not in the data dir.
    pub templates_dir: Option<PathBuf>,
    pub agent_binary: Option<PathBuf>,
    /// The runsc binary, looked up in `PATH` unless it is a path.
    pub runsc: PathBuf,
    pub limits: Limits,
    /// Registries `from_image` may reach over HTTP and at private addresses.
    pub insecure_registries: Vec<String>,
    /// A build step is stopped when the templates disk has less than this free.
    pub build_min_free_mb: u64,
    /// How long one build step may run.
    pub build_step_timeout: std::time::Duration,
    /// What one build, and one key's builds, may take.
    pub build_limits: BuildLimits,
    /// What each new volume holds, and each key's volumes together.
    pub volumes: airlock_core::volumes::VolumeLimits,
    /// Debugging only: no host firewall (see `airlock serve --help`).
    pub insecure_open_network: bool,
    /// Build the built-in templates and their golden images, then stop instead of serving.
    pub prepare_only: bool,
    /// What sandboxes' ports are named under, for the SDK's `get_host`.
    pub domain: Option<String>,
    /// This machine as `GET /nodes` and sandboxes' `clientID` name it.
    pub node_name: String,
    /// Whose host-wide names the sandboxes get (several servers on one host).
    pub instance: airlock_gvisor::Instance,
    /// The PostgreSQL that keeps the state (`None`: the data dir's SQLite file).
    pub database: Option<Database>,
    /// What a stop does to running sandboxes.
    pub on_exit: OnExit,
    /// Webhooks may be sent to loopback, link-local and private addresses.
    pub webhooks_allow_private: bool,
    /// Where paused images are kept too (`--object-store`), if anywhere.
    pub object_store: Option<String>,
    /// The most templates' layers may take here when object storage holds them too.
    pub layer_cache_mb: u64,
    /// `Node`: serve only the cluster's gateways, which prove themselves with this secret.
    pub role: Role,
    pub cluster_secret: Option<ClusterSecret>,
}

pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "airlock serve must run as root: sandboxes need network namespaces, mounts and runsc"
        );
    }
    let node_secret = match (opts.role, &opts.cluster_secret, &opts.database) {
        (Role::Node, Some(secret), Some(_)) => Some(secret.clone()),
        (Role::Node, _, _) => bail!(
            "a node (--role node) needs --cluster-secret-file, which its gateways hold too, and \
             --database, the PostgreSQL they share"
        ),
        _ => None,
    };
    airlock_netd::raise_open_files_limit();
    let data = DataDir::open(&opts.data_dir, opts.templates_dir.as_deref())?;
    let store = Arc::new(data.store(opts.database.as_ref()).await?);
    let key = ensure_api_key(&store, &data).await?;
    let agent_binary = find_binary("airlock-agent", opts.agent_binary)?;
    let agent_is_static = is_static_executable(&agent_binary)
        .with_context(|| format!("reading {}", agent_binary.display()))?;
    if !agent_is_static {
        tracing::warn!(
            agent = %agent_binary.display(),
            "the agent is dynamically linked, so templates cannot be built from images; \
             scripts/prepare.sh builds it statically"
        );
    }
    let netd_binary = find_binary("airlock-netd", None)?;
    // The firewall starts with every sandbox that will be adopted already in it.
    let known = airlock_core::lifecycle::adoptable_policies(&store, &opts.node_name).await?;
    let driver: Arc<dyn Driver> = Arc::new(
        airlock_gvisor::GvisorDriver::new(
            airlock_gvisor::GvisorConfig {
                state_dir: data.gvisor(),
                agent_binary,
                runsc: opts.runsc,
                netd_binary,
                open_network: opts.insecure_open_network,
                instance: opts.instance,
            },
            &known,
        )
        .context("setting up the gVisor driver")?,
    );
    let http = crate::client::http_client();
    let agent = Arc::new(HttpAgentClient { http: http.clone() });
    let volumes = Arc::new(
        airlock_core::volumes::Volumes::new(
            &opts.node_name,
            store.clone(),
            driver.clone(),
            &data.volumes(),
            opts.volumes,
        )
        .context("opening the volumes directory")?,
    );
    let objects = match &opts.object_store {
        Some(url) => Some(
            airlock_core::objects::ImageObjects::open(url)
                .context("opening the object store (--object-store)")?,
        ),
        None => None,
    };
    if let Some(objects) = &objects {
        // Before they are opened: one this node was taking in when it stopped is fetched.
        volumes.use_object_store(objects.clone());
    }
    // Before sandboxes are adopted or resumed: they may mount them.
    volumes.open_all().await.context("mounting the volumes")?;
    let lifecycle = Lifecycle::new(
        opts.node_name.clone(),
        store.clone(),
        driver.clone(),
        agent.clone(),
        opts.limits,
        volumes.clone(),
    );
    let webhooks = Arc::new(
        airlock_core::webhook::Deliverer::new(driver.unreachable(), opts.webhooks_allow_private)
            .context("setting up webhook deliveries")?,
    );
    if let Some(feed) = lifecycle.webhook_feed() {
        tokio::spawn(http::webhooks::deliver(
            store.clone(),
            webhooks.clone(),
            feed,
        ));
    }
    if let Some(objects) = &objects {
        tracing::info!(store = %objects, "paused images, templates' layers and moving volumes are kept in object storage too");
        lifecycle.use_object_store(objects.clone());
    }
    tokio::spawn(lifecycle.run_events());
    tokio::spawn(http::idempotency::purge_expired(
        store.idempotency().clone(),
    ));
    let builder = Builder::new(
        store.clone(),
        driver,
        agent,
        lifecycle.clone(),
        data.templates(),
        BuildOptions {
            at_once: BUILDS_AT_ONCE,
            insecure_registries: opts.insecure_registries,
            min_free_bytes: opts.build_min_free_mb << 20,
            step_timeout: opts.build_step_timeout,
            agent_is_static,
            limits: opts.build_limits,
        },
    );
    lifecycle.use_rootfs_source(builder.shared_layers());
    if let Some(objects) = objects {
        builder.use_object_store(objects);
        // At once (not waited for: object storage may be down): a bucket that another
        // database uses too is never collected.
        let claiming = builder.clone();
        tokio::spawn(async move {
            if let Err(e) = claiming.claim_object_store().await {
                tracing::warn!(error = %e, "marking whose the object store is failed; it is not collected");
            }
        });
    }
    // Before sandboxes are adopted: theirs and paused ones' rootfs may be template mounts.
    builder
        .recover()
        .await
        .context("recovering template builds")?;
    let report = lifecycle.recover().await.context("recovering sandboxes")?;
    if !report.adopted.is_empty() || !report.removed.is_empty() || !report.paused.is_empty() {
        tracing::info!(
            adopted = report.adopted.len(),
            paused = report.paused.len(),
            removed = report.removed.len(),
            "recovered sandboxes from the last run"
        );
    }
    println!("Building the built-in templates (the first time takes minutes; cached after that)");
    let built = builtins::ensure(&builder, &store, lifecycle.limits().default_resources);
    let built = built.await;
    if built.is_ok() {
        collect_garbage(&builder, &data, opts.database.is_some()).await;
    }
    if built.is_err() || opts.prepare_only {
        // Nothing was served: stop as at a signal.
        stop_sandboxes(&lifecycle, &builder, &volumes, opts.on_exit).await;
        return built.map(|()| {
            println!("The built-in templates are ready; not serving (--prepare-only)");
        });
    }

    let stop = CancellationToken::new();
    let reaper = tokio::spawn(lifecycle.clone().run_reaper(stop.clone()));
    if opts.object_store.is_some() {
        start_layer_budget(
            &builder,
            &data,
            opts.database.is_some(),
            opts.layer_cache_mb,
            &stop,
        );
        tokio::spawn(builder.clone().run_object_collection(stop.clone()));
    }
    let pools = tokio::spawn(lifecycle.clone().run_pools(stop.clone()));
    tokio::spawn(lifecycle.clone().run_metrics(stop.clone()));
    tokio::spawn(lifecycle.clone().run_freezer(stop.clone()));
    let verbs = Arc::new(http::verbs::Verbs::default());
    let state: AppState = Arc::new(AppStateInner {
        verbs: verbs.clone(),
        data_dir: data.root().to_owned(),
        node_name: opts.node_name,
        webhooks,
        lifecycle: lifecycle.clone(),
        builder: builder.clone(),
        volumes: volumes.clone(),
        store: store.clone(),
        http,
        signers: proxy::Signers::default(),
        domain: opts.domain,
        role: opts.role,
    });
    let app = router(state, opts.listen, node_secret);

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("listening on {}", opts.listen))?;
    println!("Airlock is serving on http://{}", opts.listen);
    if let Some(addr) = opts.metrics_listen {
        let metrics = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} (--metrics-listen)"))?;
        let app = crate::operator_metrics::router(crate::operator_metrics::Sources {
            lifecycle: lifecycle.clone(),
            store: store.clone(),
            verbs,
            dirs: vec![
                ("data", data.root().to_owned()),
                ("templates", data.templates().to_owned()),
            ],
        });
        let served =
            axum::serve(metrics, app).with_graceful_shutdown(stop.clone().cancelled_owned());
        tokio::spawn(std::future::IntoFuture::into_future(served));
        println!("Operator metrics (Prometheus) on http://{addr}/metrics");
    }
    if opts.role == Role::Node {
        println!("This is a node: only gateways that hold the cluster secret reach it");
    } else {
        print_key(&key, &data);
        println!("Point the E2B SDK here with:");
        println!(
            "  export E2B_API_URL=http://{0} E2B_SANDBOX_URL=http://{0} E2B_VOLUME_API_URL=http://{0}",
            opts.listen
        );
    }

    // On a signal, cut every sandbox's open streams first (killing it does too), which
    // graceful shutdown would otherwise wait on forever. The pool filler stops first, so it
    // cannot add a sandbox behind the shutdown's back.
    let drain = async {
        stop.cancel();
        let drained = async {
            let _ = pools.await;
            stop_sandboxes(&lifecycle, &builder, &volumes, opts.on_exit).await;
        };
        if tokio::time::timeout(Duration::from_secs(60), drained)
            .await
            .is_err()
        {
            tracing::error!("sandboxes did not stop within 60s");
        }
    };
    listen::serve(listener, app, wait_for_signal(), drain).await;
    let _ = reaper.await;
    Ok(())
}

/// Everything the one port answers: health, the REST API, the dashboard and MCP, with sandbox
/// traffic taken aside in front of them all; on a node, its report for gateways, and in front
/// of everything the check that a request is a gateway's.
fn router(state: AppState, listen: SocketAddr, node_secret: Option<ClusterSecret>) -> Router {
    let mut app = Router::new().route("/health", get(|| async { (StatusCode::OK, "ok") }));
    if node_secret.is_some() {
        app = app.route(
            airlock_wire::nodes::NODE_REPORT_PATH,
            get(crate::cluster::node_api::report),
        );
    }
    let app = app
        .merge(http::routes(state.clone()))
        .merge(crate::dashboard::routes(state.clone()))
        .merge(crate::mcp::routes(
            state.store.clone(),
            loopback_url(listen),
        ))
        .fallback(|| async { http::error::ApiError::not_found("no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(
            airlock_request::MAX_API_BODY,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            proxy::route_sandbox_traffic,
        ))
        .with_state(state);
    match node_secret {
        Some(secret) => app.layer(axum::middleware::from_fn_with_state(
            secret,
            crate::cluster::node_api::require_gateway,
        )),
        None => app,
    }
}

/// Stops serving sandboxes as `on_exit` says. Template and volume mounts stay while sandboxes
/// run on them (the next start takes them over); with none left, they are undone.
async fn stop_sandboxes(
    lifecycle: &Lifecycle,
    builder: &Builder,
    volumes: &airlock_core::volumes::Volumes,
    on_exit: OnExit,
) {
    if on_exit == OnExit::StopSandboxes {
        println!("Shutting down: killing all running sandboxes (paused ones stay on disk)");
    }
    let left_running = lifecycle.shutdown(on_exit).await;
    if left_running > 0 {
        println!(
            "Stopped. Sandboxes left running: {left_running}; the next `airlock serve` on this \
             data dir adopts them (--stop-sandboxes-on-exit kills them instead)"
        );
        return;
    }
    builder.unmount_templates().await;
    volumes.close_all().await;
}

/// Removes the layers, mounts and uploads that nothing uses any more (see
/// `airlock_core::build::collect`), heeding every data dir that shares the templates dir. A
/// failure is only logged: nothing is lost by keeping them.
async fn collect_garbage(builder: &Builder, data: &DataDir, on_postgres: bool) {
    let databases = match data.databases_sharing_templates(on_postgres) {
        Ok(dbs) => dbs,
        Err(e) => return tracing::warn!(error = %e, "not collecting unused template files"),
    };
    let mut others = Vec::new();
    for db in &databases[1..] {
        match Store::open(db) {
            Ok(store) => others.push(store),
            // A store that cannot be read may use anything.
            Err(e) => {
                return tracing::warn!(db = %db.display(), error = %e,
                    "another data dir's database cannot be read: not collecting unused template files")
            }
        }
    }
    let collected = builder.collect_garbage(&others).await;
    match collected {
        Ok(done) if done.bytes > 0 => tracing::info!(
            layers = done.layers,
            mounts = done.mounts,
            blobs = done.blobs,
            freed_mb = done.bytes >> 20,
            "collected what no template, sandbox or snapshot uses, and image blobs no pull used lately"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "collecting unused template files failed"),
    }
}

/// Keeps this node's templates' layers within `budget_mb` (see
/// `airlock_core::build::layer_budget`), unless other data dirs share the templates dir: their
/// sandboxes and templates stand on layers this server does not see.
fn start_layer_budget(
    builder: &Arc<Builder>,
    data: &DataDir,
    on_postgres: bool,
    budget_mb: u64,
    stop: &CancellationToken,
) {
    match data.databases_sharing_templates(on_postgres) {
        Ok(databases) if databases.len() == 1 => {
            tokio::spawn(
                builder
                    .clone()
                    .run_layer_budget(budget_mb << 20, stop.clone()),
            );
        }
        Ok(_) => tracing::info!(
            "other data dirs share the templates dir: its layers are kept whole here \
             (--layer-cache-mb is not used)"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "not keeping the templates' layers within --layer-cache-mb")
        }
    }
}

pub(super) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// How the server reaches itself (the MCP tools call its API): `listen`, with loopback for an
/// address that means all of them.
pub(super) fn loopback_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}
