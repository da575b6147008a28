//! `GET /metrics` for the host's operator, in Prometheus' text format (OpenMetrics), on an
//! address of its own (`airlock serve --metrics-listen`): the numbers are the whole host's,
//! not one API key's, so they stay off the port that tenants reach. What they say is how full
//! the host is (sandboxes by phase and by key, frozen ones, each pool, memory and disk
//! headroom), what the API's sandbox verbs did and how long they took, and golden-image and
//! template builds.

use crate::http::verbs::Verbs;
use airlock_core::disk_usage::disk_space;
use airlock_core::lifecycle::{HostLoad, Lifecycle, PoolLoad};
use airlock_core::store::{BuildStatus, Store};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::path::PathBuf;
use std::sync::Arc;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the metrics are read from.
pub struct Sources {
    pub lifecycle: Arc<Lifecycle>,
    pub store: Arc<Store>,
    pub verbs: Arc<Verbs>,
    /// Directories whose disk headroom is shown, by the name the `dir` label gives them.
    pub dirs: Vec<(&'static str, PathBuf)>,
}

/// The metrics router, for its own listener.
pub fn router(sources: Sources) -> Router {
    let mut registry = Registry::default();
    sources.verbs.register(&mut registry);
    registry.register_collector(Box::new(LoadCollector(sources.lifecycle)));
    let builds = BuildCounts::default();
    registry.register_collector(Box::new(BuildsCollector(builds.clone())));
    registry.register_collector(Box::new(DiskCollector(sources.dirs)));
    let scraped = Scraped {
        registry,
        store: sources.store,
        builds,
    };
    Router::new()
        .route("/metrics", get(scrape))
        .fallback(|| async {
            crate::http::error::ApiError::not_found("no such route; try /metrics")
        })
        .with_state(Arc::new(scraped))
}

/// The metrics, and what a scrape reads before it writes them.
struct Scraped {
    registry: Registry,
    store: Arc<Store>,
    builds: BuildCounts,
}

async fn scrape(State(scraped): State<Arc<Scraped>>) -> Response {
    // A query, which the collector (writing synchronously) cannot await: read it first.
    let counts = scraped.store.templates().build_counts().await;
    if let Err(e) = &counts {
        tracing::warn!(error = %e, "counting template builds for /metrics failed");
    }
    *scraped.builds.0.lock().unwrap_or_else(|e| e.into_inner()) = counts.ok();
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &scraped.registry) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding the metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Reads the host's load afresh at each scrape.
struct LoadCollector(Arc<Lifecycle>);

impl Collector for LoadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_load(&self.0.host_load(), &mut encoder)
    }
}

/// Template builds on record by status (old finished ones are pruned), as this scrape read
/// them; `None` if it could not.
#[derive(Clone, Default)]
struct BuildCounts(Arc<std::sync::Mutex<Option<ByStatus>>>);

type ByStatus = Vec<(BuildStatus, u64)>;

struct BuildsCollector(BuildCounts);

impl Collector for BuildsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.0 .0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(counts) = counts else {
            return Ok(());
        };
        let samples: Vec<_> = counts
            .iter()
            .map(|(status, n)| ([("status", status.as_str())], *n as i64))
            .collect();
        family(
            &mut encoder,
            "airlock_template_builds",
            "Template builds on record by status: waiting and building are under way now",
            &samples,
        )
    }
}

/// Free and total space of the disks the data lives on.
struct DiskCollector(Vec<(&'static str, PathBuf)>);

impl Collector for DiskCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (mut free, mut total) = (Vec::new(), Vec::new());
        for (name, dir) in &self.0 {
            if let Some(space) = disk_space(dir) {
                free.push(([("dir", *name)], space.available as i64));
                total.push(([("dir", *name)], space.total as i64));
            }
        }
        family(
            &mut encoder,
            "airlock_disk_available_bytes",
            "Space left on the disk of each directory (data: sandboxes' disks and images; templates)",
            &free,
        )?;
        family(
            &mut encoder,
            "airlock_disk_total_bytes",
            "Size of the disk of each directory",
            &total,
        )
    }
}

macro_rules! debug_as_name {
    ($($t:ty),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($t))
            }
        }
    )*};
}
debug_as_name!(LoadCollector, BuildsCollector, DiskCollector);

fn encode_load(load: &HostLoad, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let phases: Vec<_> = load
        .phases
        .iter()
        .map(|(phase, n)| ([("phase", phase.as_str())], *n as i64))
        .collect();
    let pools = |value: fn(&PoolLoad) -> usize| -> Vec<_> {
        load.pools
            .iter()
            .map(|p| ([("template", p.template.as_str())], value(p) as i64))
            .collect()
    };
    let families = [
        (
            "airlock_sandboxes",
            "Sandboxes by phase (pooled ones are not counted here)",
            phases,
        ),
        (
            "airlock_pool_ready",
            "Ready sandboxes waiting (frozen) in each template's pool",
            pools(|p| p.ready),
        ),
        (
            "airlock_pool_filling",
            "Restores under way into each template's pool",
            pools(|p| p.filling),
        ),
        (
            "airlock_pool_keep",
            "Ready sandboxes each pool keeps now (--pool-size, grown by demand)",
            pools(|p| p.keep),
        ),
    ];
    for (name, help, samples) in &families {
        family(encoder, name, help, samples)?;
    }
    // Unknown figures are left out rather than written as 0.
    let gauges = [
        (
            "airlock_sandboxes_frozen",
            "Running sandboxes frozen now: idle, costing no CPU",
            Some(load.frozen as u64),
        ),
        (
            "airlock_sandboxes_max",
            "The most sandboxes that may run at once (--max-sandboxes)",
            Some(load.max_sandboxes as u64),
        ),
        (
            "airlock_launches",
            "Sandboxes being launched now: restored or booted, until their agent answers",
            Some(load.launches as u64),
        ),
        (
            "airlock_launches_queued",
            "Creates and resumes waiting for their turn to launch",
            Some(load.launches_queued as u64),
        ),
        (
            "airlock_launches_max",
            "The most sandboxes launched at once (--max-launches)",
            Some(load.max_launches as u64),
        ),
        (
            "airlock_paused_in_memory",
            "Paused sandboxes whose runtime is kept, frozen, so that their resume is a thaw",
            Some(load.parked as u64),
        ),
        (
            "airlock_paused_in_memory_bytes",
            "Memory the runtimes of paused sandboxes hold",
            Some(load.parked_memory_bytes),
        ),
        (
            "airlock_paused_in_memory_budget_bytes",
            "The most memory paused sandboxes may keep (--paused-memory-mb)",
            Some(load.parked_memory_budget_bytes),
        ),
        (
            "airlock_pool_memory_bytes",
            "Memory all pools' ready sandboxes hold",
            Some(load.pooled_memory_bytes),
        ),
        (
            "airlock_pool_memory_budget_bytes",
            "The most memory the pools may hold together (--pool-memory-mb)",
            Some(load.pool_memory_budget_bytes),
        ),
        (
            "airlock_host_memory_available_bytes",
            "The host's MemAvailable",
            load.memory_available_bytes,
        ),
        (
            "airlock_host_memory_total_bytes",
            "The host's MemTotal",
            load.memory_total_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        if let Some(value) = value {
            gauge(encoder, name, help, value as i64)?;
        }
    }
    let mut goldens = encoder.encode_descriptor(
        "airlock_golden_image_builds",
        "Golden images made (a template's warmed-up sandbox, checkpointed) since the server started",
        None,
        MetricType::Counter,
    )?;
    for (outcome, n) in [
        ("ok", load.golden_images_made),
        ("failed", load.golden_images_failed),
    ] {
        ConstCounter::new(n).encode(goldens.encode_family(&[("outcome", outcome)])?)?;
    }
    let churn = [
        (
            "airlock_pool_restores",
            "Restores into pools since the server started (each costs a launch's CPU)",
            load.pool_churn.restores,
        ),
        (
            "airlock_pool_evictions",
            "Ready pooled sandboxes destroyed to make room for another template's pool or a create",
            load.pool_churn.evictions,
        ),
        (
            "airlock_pool_wasted_restores",
            "Ready pooled sandboxes destroyed unused within a minute of their restore",
            load.pool_churn.wasted,
        ),
    ];
    for (name, help, n) in churn {
        let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        ConstCounter::new(n).encode(metric)?;
    }
    let transfers = load.image_transfers;
    for (name, help, ok, failed) in [
        (
            "airlock_paused_image_uploads",
            "Paused images uploaded to object storage (--object-store) since the server started; a failed one stays on this host only",
            transfers.uploads,
            transfers.upload_failures,
        ),
        (
            "airlock_paused_image_downloads",
            "Paused images downloaded from object storage for a resume since the server started",
            transfers.downloads,
            transfers.download_failures,
        ),
    ] {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (outcome, n) in [("ok", ok), ("failed", failed)] {
            ConstCounter::new(n).encode(family.encode_family(&[("outcome", outcome)])?)?;
        }
    }
    let mut by_key = encoder.encode_descriptor(
        "airlock_key_sandboxes",
        "Sandboxes of each API key (by the id `airlock key ls` shows), by state",
        None,
        MetricType::Gauge,
    )?;
    for (key, running, paused) in &load.per_key {
        for (state, n) in [("running", running), ("paused", paused)] {
            let labels = [("key", key.as_str()), ("state", state)];
            ConstGauge::new(*n as i64).encode(by_key.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

/// A gauge with one label, one sample per label value.
fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[([(&str, &str); 1], i64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::lifecycle::Phase;

    #[derive(Debug)]
    struct Fixed(HostLoad);

    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_load(&self.0, &mut encoder)
        }
    }

    #[test]
    fn the_load_is_written_as_openmetrics_gauges() {
        let load = HostLoad {
            phases: vec![(Phase::Paused, 1), (Phase::Running, 3)],
            frozen: 2,
            parked: 1,
            parked_memory_bytes: 20 << 20,
            parked_memory_budget_bytes: 1024 << 20,
            max_sandboxes: 256,
            launches: 2,
            launches_queued: 5,
            max_launches: 2,
            pools: vec![PoolLoad {
                template: airlock_core::ids::TemplateName::parse("base").unwrap(),
                ready: 2,
                filling: 1,
                keep: 3,
            }],
            pooled_memory_bytes: 40 << 20,
            pool_memory_budget_bytes: 2048 << 20,
            memory_available_bytes: Some(20 << 30),
            memory_total_bytes: None,
            golden_images_made: 3,
            golden_images_failed: 1,
            pool_churn: airlock_core::lifecycle::PoolChurn {
                restores: 7,
                evictions: 2,
                wasted: 1,
            },
            image_transfers: airlock_core::lifecycle::ImageTransfers {
                uploads: 4,
                upload_failures: 1,
                downloads: 2,
                download_failures: 0,
            },
            per_key: vec![("0123456789ab".into(), 2, 1)],
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(load)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE airlock_sandboxes gauge",
            "airlock_sandboxes{phase=\"paused\"} 1",
            "airlock_sandboxes{phase=\"running\"} 3",
            "airlock_sandboxes_frozen 2",
            "airlock_sandboxes_max 256",
            "airlock_launches 2",
            "airlock_launches_queued 5",
            "airlock_launches_max 2",
            "airlock_paused_in_memory 1",
            "airlock_paused_in_memory_bytes 20971520",
            "airlock_paused_in_memory_budget_bytes 1073741824",
            "airlock_pool_ready{template=\"base\"} 2",
            "airlock_pool_filling{template=\"base\"} 1",
            "airlock_pool_keep{template=\"base\"} 3",
            "airlock_pool_memory_bytes 41943040",
            "airlock_pool_memory_budget_bytes 2147483648",
            "airlock_host_memory_available_bytes 21474836480",
            "# TYPE airlock_golden_image_builds counter",
            "airlock_golden_image_builds_total{outcome=\"ok\"} 3",
            "airlock_golden_image_builds_total{outcome=\"failed\"} 1",
            "# TYPE airlock_pool_restores counter",
            "airlock_pool_restores_total 7",
            "airlock_pool_evictions_total 2",
            "airlock_pool_wasted_restores_total 1",
            "airlock_paused_image_uploads_total{outcome=\"failed\"} 1",
            "airlock_paused_image_downloads_total{outcome=\"ok\"} 2",
            "airlock_key_sandboxes{key=\"0123456789ab\",state=\"running\"} 2",
            "airlock_key_sandboxes{key=\"0123456789ab\",state=\"paused\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
        // Unknown is left out, not written as 0.
        assert!(!text.contains("airlock_host_memory_total_bytes"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
