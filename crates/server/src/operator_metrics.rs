//! `GET /metrics` for the host's operator, in Prometheus' text format (OpenMetrics), on an
//! address of its own (`airlock serve --metrics-listen`): the numbers are the whole host's,
//! not one API key's, so they stay off the port that tenants reach. What they say is how full
//! the host is: sandboxes by phase, how many are frozen, each pool, and memory headroom.

use airlock_core::lifecycle::{HostLoad, Lifecycle, PoolLoad};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::Arc;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics router, for its own listener.
pub fn router(lifecycle: Arc<Lifecycle>) -> Router {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(LoadCollector(lifecycle)));
    Router::new()
        .route("/metrics", get(scrape))
        .fallback(|| async { crate::error::ApiError::not_found("no such route; try /metrics") })
        .with_state(Arc::new(registry))
}

async fn scrape(State(registry): State<Arc<Registry>>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding the metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Reads the host's load afresh at each scrape.
struct LoadCollector(Arc<Lifecycle>);

impl std::fmt::Debug for LoadCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadCollector")
    }
}

impl Collector for LoadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_load(&self.0.host_load(), &mut encoder)
    }
}

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
            "airlock_paused_in_memory 1",
            "airlock_paused_in_memory_bytes 20971520",
            "airlock_paused_in_memory_budget_bytes 1073741824",
            "airlock_pool_ready{template=\"base\"} 2",
            "airlock_pool_filling{template=\"base\"} 1",
            "airlock_pool_keep{template=\"base\"} 3",
            "airlock_pool_memory_bytes 41943040",
            "airlock_pool_memory_budget_bytes 2147483648",
            "airlock_host_memory_available_bytes 21474836480",
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
