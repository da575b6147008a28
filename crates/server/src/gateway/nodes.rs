//! The nodes a gateway knows: found from `--nodes` (each entry a node, or a DNS name whose
//! every address is one, as a Kubernetes headless Service gives), polled for health and load,
//! and picked for new sandboxes. No gossip and no consensus: every gateway polls every node
//! itself, so gateways agree within a poll or two and need not talk to each other.

use crate::cluster::{ClusterSecret, SECRET_HEADER};
use airlock_wire::nodes::{Node, NodeReport, NodeStatus, NODE_REPORT_PATH};
use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How often every node is asked how it is.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a node has to answer a poll; a slower answer counts as none.
const POLL_TIMEOUT: Duration = Duration::from_millis(1500);
/// Polls in a row a node may miss before it is unhealthy: a lost node stops getting sandboxes
/// within `POLL_INTERVAL * MISSES + POLL_TIMEOUT`, about 3.5 s.
const MISSES: u32 = 2;
/// The largest poll answer read; a node that sends more is not trusted. (Most of a report is
/// its warm templates' names.)
const MAX_REPORT: usize = 1 << 20;
/// How much busier, in sandboxes per core, a node holding a template's golden image may be
/// than the least loaded one and still get the template's creates: a restore there costs
/// less than a boot elsewhere.
const WARM_SLACK: f64 = 1.0;

/// The HTTP client for nodes. Unlike the one for sandboxes' agents, connections are kept: a
/// node's are many requests of many sandboxes.
pub type NodeClient = hyper_util::client::legacy::Client<HttpConnector, Body>;

pub fn node_client() -> NodeClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // A node that does not accept a connection in this time is down, as far as a request goes.
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// One node as this gateway sees it.
struct Known {
    /// `host:port` it is reached at.
    endpoint: String,
    /// Its last answer; `None` until it first answers.
    report: Option<NodeReport>,
    /// Polls missed in a row.
    misses: u32,
    /// Sandboxes placed there since its last answer, which that answer may not count yet.
    placed: AtomicU32,
}

impl Known {
    fn healthy(&self) -> bool {
        self.report.is_some() && self.misses < MISSES
    }

    fn name(&self) -> Option<&str> {
        self.report.as_ref().map(|r| r.node.node_id.as_str())
    }

    /// Healthy and taking sandboxes (not draining).
    fn ready(&self) -> bool {
        self.healthy()
            && self
                .report
                .as_ref()
                .is_some_and(|r| r.node.status == NodeStatus::Ready)
    }

    /// Whether it holds the golden image of `template` (a record's name).
    fn warm(&self, template: &str) -> bool {
        self.report
            .as_ref()
            .is_some_and(|r| r.warm_templates.iter().any(|t| t == template))
    }

    /// How busy it is for placement: its sandboxes and the starts queued there, per core, as
    /// it said last plus what was placed since.
    fn load(&self) -> f64 {
        let Some(report) = &self.report else {
            return f64::INFINITY;
        };
        let sandboxes = report.node.sandbox_count + report.launches_queued;
        let placed = self.placed.load(Ordering::Relaxed);
        f64::from(sandboxes + placed) / f64::from(report.cpus.max(1))
    }
}

fn least_loaded<'a>(nodes: impl Iterator<Item = &'a Known>) -> Option<&'a Known> {
    nodes.min_by(|a, b| a.load().total_cmp(&b.load()))
}

/// Where to send a request for a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    pub name: String,
    pub endpoint: String,
}

/// Why no node can take a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoNode {
    #[error("no node can take a sandbox now: {known} known, none healthy and ready (GET /nodes shows them)")]
    NoneReady { known: usize },
    #[error("node '{0}' does not answer its health checks")]
    Unhealthy(String),
    #[error("node '{0}' is draining")]
    Draining(String),
    #[error("node '{0}' is not one this gateway knows")]
    Unknown(String),
}

/// Every node this gateway knows, by endpoint.
pub struct NodeTable {
    /// `--nodes`: `host:port` entries, each resolved at every poll.
    seeds: Vec<String>,
    known: RwLock<BTreeMap<String, Known>>,
    secret: ClusterSecret,
    client: NodeClient,
}

impl NodeTable {
    pub fn new(seeds: Vec<String>, secret: ClusterSecret, client: NodeClient) -> Arc<Self> {
        Arc::new(NodeTable {
            seeds,
            known: RwLock::new(BTreeMap::new()),
            secret,
            client,
        })
    }

    /// Polls every node forever (the first round is [`NodeTable::poll`], awaited at start).
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.poll().await;
        }
    }

    /// One round: finds the nodes (a name that no longer resolves loses its nodes) and asks
    /// each how it is, all at once.
    pub async fn poll(&self) {
        let endpoints = self.resolve().await;
        {
            let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
            known.retain(|endpoint, _| endpoints.contains(endpoint));
            for endpoint in &endpoints {
                known.entry(endpoint.clone()).or_insert_with(|| Known {
                    endpoint: endpoint.clone(),
                    report: None,
                    misses: 0,
                    placed: AtomicU32::new(0),
                });
            }
        }
        let answers =
            futures::future::join_all(endpoints.iter().map(|endpoint| self.ask(endpoint))).await;
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        for (endpoint, answer) in endpoints.iter().zip(answers) {
            let Some(node) = known.get_mut(endpoint) else {
                continue;
            };
            match answer {
                Ok(report) => {
                    node.report = Some(report);
                    node.misses = 0;
                    node.placed.store(0, Ordering::Relaxed);
                }
                Err(why) => {
                    if node.misses + 1 == MISSES {
                        tracing::warn!(node = node.name().unwrap_or(endpoint), %endpoint, %why,
                            "a node stopped answering its health checks; no sandbox goes there now");
                    }
                    node.misses = node.misses.saturating_add(1);
                }
            }
        }
    }

    /// Every `host:port` the seeds name now; a seed that does not resolve names none.
    async fn resolve(&self) -> Vec<String> {
        let mut endpoints = Vec::new();
        for seed in &self.seeds {
            match tokio::net::lookup_host(seed.as_str()).await {
                Ok(addrs) => endpoints.extend(addrs.map(|a| a.to_string())),
                Err(e) => {
                    tracing::debug!(%seed, error = %e, "a --nodes entry does not resolve now")
                }
            }
        }
        endpoints.sort();
        endpoints.dedup();
        endpoints
    }

    /// A node's answer to a poll, if it gave a whole, sensible one in time.
    async fn ask(&self, endpoint: &str) -> Result<NodeReport, String> {
        let req = hyper::Request::get(format!("http://{endpoint}{NODE_REPORT_PATH}"))
            .header(SECRET_HEADER, self.secret.as_str())
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        let answer = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("it answered {}", resp.status()));
            }
            let body = http_body_util::Limited::new(resp.into_body(), MAX_REPORT)
                .collect()
                .await
                .map_err(|e| format!("reading its answer: {e}"))?
                .to_bytes();
            serde_json::from_slice::<NodeReport>(&body)
                .map_err(|e| format!("its answer is not a node report: {e}"))
        };
        tokio::time::timeout(POLL_TIMEOUT, answer)
            .await
            .map_err(|_| format!("no answer in {POLL_TIMEOUT:?}"))?
    }

    /// The node for a new sandbox: the least loaded of the healthy, ready ones.
    pub fn place(&self) -> Result<NodeAddress, NoNode> {
        self.place_for(None)
    }

    /// The node for a new sandbox of `template` (its record's name): the least loaded of the
    /// healthy, ready ones that hold its golden image, unless that one is busier than the
    /// least loaded of all by more than [`WARM_SLACK`]; else the least loaded of all. The
    /// choice counts as load on that node until its next report.
    pub fn place_for(&self, template: Option<&str>) -> Result<NodeAddress, NoNode> {
        self.choose(template, true)
    }

    /// A node for a request that starts no sandbox (a list, a template's or a key's API): the
    /// least loaded of the healthy, ready ones, as `place` picks, but not counted as load.
    pub fn pick(&self) -> Result<NodeAddress, NoNode> {
        self.choose(None, false)
    }

    fn choose(&self, template: Option<&str>, counted: bool) -> Result<NodeAddress, NoNode> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let ready: Vec<&Known> = known.values().filter(|n| n.ready()).collect();
        let coolest =
            least_loaded(ready.iter().copied()).ok_or(NoNode::NoneReady { known: known.len() })?;
        let warm = template.and_then(|t| least_loaded(ready.iter().copied().filter(|n| n.warm(t))));
        let best = match warm {
            Some(warm) if warm.load() <= coolest.load() + WARM_SLACK => warm,
            _ => coolest,
        };
        if counted {
            best.placed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(NodeAddress {
            name: best.name().unwrap_or_default().to_owned(),
            endpoint: best.endpoint.clone(),
        })
    }

    /// Where the node named `name` (a sandbox's `clientID`) is, if it is healthy.
    pub fn healthy(&self, name: &str) -> Result<NodeAddress, NoNode> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let node = known
            .values()
            .find(|n| n.name() == Some(name))
            .ok_or_else(|| NoNode::Unknown(name.to_owned()))?;
        if !node.healthy() {
            return Err(NoNode::Unhealthy(name.to_owned()));
        }
        Ok(NodeAddress {
            name: name.to_owned(),
            endpoint: node.endpoint.clone(),
        })
    }

    /// Whether the ready nodes hold golden images of different templates: only then does a
    /// create's template matter to placement.
    pub fn warmth_differs(&self) -> bool {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let mut lists = known
            .values()
            .filter(|n| n.ready())
            .filter_map(|n| n.report.as_ref().map(|r| &r.warm_templates));
        let first = lists.next();
        lists.any(|other| Some(other) != first)
    }

    /// Every healthy node, draining ones too: those that answer for their sandboxes.
    pub fn all_healthy(&self) -> Vec<NodeAddress> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        known
            .values()
            .filter(|n| n.healthy())
            .filter_map(|n| {
                Some(NodeAddress {
                    name: n.name()?.to_owned(),
                    endpoint: n.endpoint.clone(),
                })
            })
            .collect()
    }

    /// Where the node named `name` is, if it is healthy and takes sandboxes (not draining).
    pub fn ready(&self, name: &str) -> Result<NodeAddress, NoNode> {
        let node = self.healthy(name)?;
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        if known.get(&node.endpoint).is_some_and(Known::ready) {
            Ok(node)
        } else {
            Err(NoNode::Draining(name.to_owned()))
        }
    }

    /// Every node as `GET /nodes` shows it: as it last said, or unhealthy. A node that never
    /// answered is shown by its address.
    pub fn list(&self) -> Vec<Node> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        known
            .values()
            .map(|n| {
                let mut node = match &n.report {
                    Some(report) => report.node.clone(),
                    None => Node {
                        node_id: n.endpoint.clone(),
                        status: NodeStatus::Unhealthy,
                        sandbox_count: 0,
                        allocated_cpu: 0,
                        allocated_memory_mib: 0,
                    },
                };
                if !n.healthy() {
                    node.status = NodeStatus::Unhealthy;
                }
                node
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(nodes: &[(&str, u32, NodeStatus, u32)]) -> Arc<NodeTable> {
        warm_table(nodes, &[])
    }

    /// Nodes `(name, sandboxes, status, polls missed)`; those in `warm` hold golden image `t`.
    fn warm_table(nodes: &[(&str, u32, NodeStatus, u32)], warm: &[&str]) -> Arc<NodeTable> {
        let secret_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(secret_file.path(), "s".repeat(32)).unwrap();
        let secret = ClusterSecret::read(secret_file.path()).unwrap();
        let table = NodeTable::new(Vec::new(), secret, node_client());
        let mut known = table.known.write().unwrap();
        for (i, (name, sandboxes, status, misses)) in nodes.iter().enumerate() {
            let endpoint = format!("10.0.0.{i}:3000");
            let report = NodeReport {
                node: Node {
                    node_id: (*name).into(),
                    status: *status,
                    sandbox_count: *sandboxes,
                    allocated_cpu: 0,
                    allocated_memory_mib: 0,
                },
                cpus: 2,
                memory_available_mib: 1024,
                max_sandboxes: 100,
                launches_queued: 0,
                warm_templates: if warm.contains(name) {
                    vec!["t".into()]
                } else {
                    Vec::new()
                },
            };
            known.insert(
                endpoint.clone(),
                Known {
                    endpoint,
                    report: Some(report),
                    misses: *misses,
                    placed: AtomicU32::new(0),
                },
            );
        }
        drop(known);
        table
    }

    #[tokio::test]
    async fn places_on_the_least_loaded_healthy_ready_node_and_spreads_a_burst() {
        use NodeStatus::*;
        let nodes = table(&[
            ("busy", 10, Ready, 0),
            ("idle", 0, Ready, 0),
            ("gone", 0, Ready, MISSES),
            ("drained", 0, Draining, 0),
            ("quiet", 2, Ready, 0),
        ]);
        // A request that starts no sandbox goes to the least loaded, and adds no load.
        for _ in 0..5 {
            assert_eq!(nodes.pick().unwrap().name, "idle");
        }
        let picks: Vec<String> = (0..6).map(|_| nodes.place().unwrap().name).collect();
        // What was placed since the last poll counts: idle takes two, then they alternate.
        assert_eq!(picks, ["idle", "idle", "idle", "quiet", "idle", "quiet"]);
        assert_eq!(nodes.healthy("gone"), Err(NoNode::Unhealthy("gone".into())));
        assert_eq!(
            nodes.ready("drained"),
            Err(NoNode::Draining("drained".into()))
        );
        assert!(nodes.healthy("drained").is_ok());
        assert_eq!(nodes.healthy("nope"), Err(NoNode::Unknown("nope".into())));
        let shown: Vec<_> = nodes
            .list()
            .into_iter()
            .map(|n| (n.node_id, n.status))
            .collect();
        assert!(shown.contains(&("gone".into(), Unhealthy)), "{shown:?}");
        assert!(shown.contains(&("drained".into(), Draining)), "{shown:?}");
        let none = table(&[("gone", 0, Ready, MISSES), ("drained", 0, Draining, 0)]);
        assert_eq!(none.place(), Err(NoNode::NoneReady { known: 2 }));
    }

    #[tokio::test]
    async fn a_template_s_creates_go_where_its_golden_image_is_unless_that_node_is_much_busier() {
        use NodeStatus::*;
        // Two cores each: WARM_SLACK (1 per core) is two sandboxes.
        let nodes = warm_table(
            &[
                ("cold", 1, Ready, 0),
                ("warm", 2, Ready, 0),
                ("warm-but-gone", 0, Ready, MISSES),
                ("warm-but-drained", 0, Draining, 0),
            ],
            &["warm", "warm-but-gone", "warm-but-drained"],
        );
        assert!(nodes.warmth_differs());
        let picks: Vec<String> = (0..6)
            .map(|_| nodes.place_for(Some("t")).unwrap().name)
            .collect();
        // warm takes them while it is at most 2 sandboxes busier than cold, then they
        // alternate within that distance.
        assert_eq!(picks, ["warm", "warm", "cold", "warm", "cold", "warm"]);
        // Another template, or none, goes to the least loaded.
        assert_eq!(nodes.place_for(Some("other")).unwrap().name, "cold");
        assert_eq!(nodes.place().unwrap().name, "cold");
        let alike = warm_table(&[("a", 0, Ready, 0), ("b", 0, Ready, 0)], &["a", "b"]);
        assert!(!alike.warmth_differs());
    }

    /// `cargo test --release -p airlock placement_at_scale -- --ignored --nocapture`: placement
    /// decisions per second with 100 nodes holding 100,000 sandboxes (docs/benchmarks.md).
    #[tokio::test]
    #[ignore]
    async fn placement_at_scale() {
        let names: Vec<String> = (0..100).map(|i| format!("node-{i}")).collect();
        let specs: Vec<(&str, u32, NodeStatus, u32)> = names
            .iter()
            .map(|n| (n.as_str(), 1000, NodeStatus::Ready, 0))
            .collect();
        let nodes = table(&specs);
        let decisions = 1_000_000;
        let started = std::time::Instant::now();
        for _ in 0..decisions {
            nodes.place().unwrap();
        }
        let elapsed = started.elapsed();
        let spread: Vec<u32> = nodes
            .known
            .read()
            .unwrap()
            .values()
            .map(|n| n.placed.load(Ordering::Relaxed))
            .collect();
        println!(
            "100 nodes, 100000 sandboxes: {:.0} placements/s ({:.2} us each); placed per node \
             min {} max {}; node table {} bytes",
            decisions as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64() * 1e6 / decisions as f64,
            spread.iter().min().unwrap(),
            spread.iter().max().unwrap(),
            std::mem::size_of::<Known>() * 100
        );
    }
}
