//! Webhook deliveries: a signed `POST` of one event's JSON to a key's webhook, as E2B makes
//! them (`e2b-signature` is the unpadded URL-safe base64 of SHA-256 over the secret followed
//! by the body). Each webhook has a lane of its own: one task that sends its deliveries one
//! after another, in the order they were handed over, each with a timeout per attempt and a
//! few tries with back-off. So a receiver hears a sandbox's events in order, and a slow
//! webhook delays only its own. At most [`AT_ONCE`] deliveries are at work at once, and
//! whoever hands one over never waits for an endpoint.
//!
//! The request leaves from the server, so it must not reach what only the server reaches: a
//! name is resolved here and refused if any of its addresses is one no sandbox may reach
//! either (loopback, link-local, private, the host's own networks), unless the operator
//! allowed private targets. Redirects are not followed and no proxy is used.

use crate::build::pull_guard::Reach;
use crate::egress::Ipv4Net;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// Deliveries at work at once (retries' waits included); more wait for a slot.
pub const AT_ONCE: usize = 32;
/// Deliveries one webhook may have waiting; more are dropped (and logged) rather than kept.
const LANE_DEPTH: usize = 1024;
/// How long a webhook's lane outlives its last delivery before its task ends.
const LANE_IDLE: Duration = Duration::from_secs(60);
/// The longest one attempt may take, connection included.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The waits before each retry: three retries after the first attempt.
const BACKOFF: [Duration; 3] = [
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];
const MAX_URL_LEN: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{0}")]
    BadUrl(String),
    #[error("making the webhooks' HTTP client")]
    Client(#[source] reqwest::Error),
}

/// E2B's `e2b-signature` of `body` for a webhook whose secret is `secret`.
pub fn signature(secret: &str, body: &str) -> String {
    let digest = Sha256::new()
        .chain_update(secret)
        .chain_update(body)
        .finalize();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
}

/// One event for one webhook.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub webhook_id: String,
    pub url: String,
    pub secret: String,
    /// The event's JSON, sent as it is signed.
    pub body: String,
}

/// Where webhooks may be sent: public addresses, or private ones too if the operator says so.
struct Targets {
    reach: Reach,
    allow_private: bool,
}

impl Targets {
    fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        if self.allow_private || self.reach.is_public(ip) {
            return Ok(());
        }
        Err(format!(
            "{host} is at {ip}, an address only this server reaches (loopback, link-local or \
             private); the operator can allow such webhooks with --webhooks-allow-private"
        ))
    }
}

/// Resolves webhooks' names, and refuses those at addresses they may not reach.
struct GuardedResolver(Arc<Targets>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let targets = self.0.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                targets.check_ip(&host, a.ip())?;
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Sends deliveries, in order per webhook and a bounded number at a time.
pub struct Deliverer {
    shared: Arc<LaneShared>,
    /// Each webhook's lane, by webhook id. A lane is put in and taken out under this lock,
    /// and only sent to under it, so nothing is sent to a lane whose task has ended.
    lanes: Arc<Mutex<HashMap<String, mpsc::Sender<Delivery>>>>,
}

/// What every lane shares: the client, where it may send, and the slots.
struct LaneShared {
    http: reqwest::Client,
    targets: Arc<Targets>,
    slots: Semaphore,
}

impl Deliverer {
    /// Webhooks never reach the ranges no sandbox may ([`crate::egress::PLATFORM_DENY`]:
    /// loopback, private, link-local and cloud metadata) nor `unreachable` (the driver's own
    /// list, e.g. the host's addresses; empty on a gateway), unless `allow_private`
    /// (`--webhooks-allow-private`).
    pub fn new(mut unreachable: Vec<Ipv4Net>, allow_private: bool) -> Result<Self, WebhookError> {
        unreachable.extend(crate::egress::platform_deny());
        // TLS needs a crypto provider chosen for the process; an error means one is chosen.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let targets = Arc::new(Targets {
            reach: Reach {
                insecure: Vec::new(),
                unreachable,
            },
            allow_private,
        });
        let http = reqwest::Client::builder()
            .dns_resolver(GuardedResolver(targets.clone()))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(ATTEMPT_TIMEOUT)
            .user_agent(concat!("airlock-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(WebhookError::Client)?;
        Ok(Deliverer {
            shared: Arc::new(LaneShared {
                http,
                targets,
                slots: Semaphore::new(AT_ONCE),
            }),
            lanes: Arc::default(),
        })
    }

    /// Whether `url` may be a webhook: absolute `http` or `https`, with a host and no
    /// credentials, and not an address it may not reach. A name's addresses are checked at
    /// each delivery (they may change).
    pub fn check_url(&self, url: &str) -> Result<(), WebhookError> {
        let bad = |why: String| Err(WebhookError::BadUrl(format!("url '{url}': {why}")));
        if url.len() > MAX_URL_LEN {
            return Err(WebhookError::BadUrl(format!(
                "url is longer than {MAX_URL_LEN} characters"
            )));
        }
        let parsed = match reqwest::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return bad(e.to_string()),
        };
        if !matches!(parsed.scheme(), "http" | "https") {
            return bad("only http and https webhooks are sent".into());
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return bad("credentials in the URL are not allowed; use the signature".into());
        }
        let Some(host) = parsed.host_str() else {
            return bad("no host".into());
        };
        let name = host.trim_end_matches('.');
        let local = name == "localhost" || name.ends_with(".localhost");
        let ip = match address(&parsed) {
            Some(ip) => Some(ip),
            None => local.then_some(IpAddr::from([127, 0, 0, 1])),
        };
        match ip {
            Some(ip) => self.shared.targets.check_ip(host, ip).or_else(bad),
            None => Ok(()),
        }
    }

    /// Hands `delivery` over to its webhook's lane, which sends it after the ones handed over
    /// before it. Never waits: a lane that is full drops it.
    pub fn send(&self, delivery: Delivery) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let lane = lanes
            .entry(delivery.webhook_id.clone())
            .or_insert_with_key(|id| self.open_lane(id.clone()));
        if let Err(e) = lane.try_send(delivery) {
            tracing::warn!(webhook = %e.into_inner().webhook_id,
                "a webhook has {LANE_DEPTH} deliveries waiting: an event is not delivered");
        }
    }

    /// Starts the task that sends one webhook's deliveries, one after another. It ends when
    /// none came for [`LANE_IDLE`], taking its lane out first.
    fn open_lane(&self, webhook_id: String) -> mpsc::Sender<Delivery> {
        let (lane, mut waiting) = mpsc::channel::<Delivery>(LANE_DEPTH);
        let (shared, lanes) = (self.shared.clone(), self.lanes.clone());
        tokio::spawn(async move {
            loop {
                let delivery = match tokio::time::timeout(LANE_IDLE, waiting.recv()).await {
                    Ok(Some(delivery)) => delivery,
                    Ok(None) => return, // the deliverer is gone
                    Err(_idle) => {
                        let mut open = lanes.lock().unwrap_or_else(|e| e.into_inner());
                        match waiting.try_recv() {
                            Ok(delivery) => delivery, // came just now: the lane stays
                            Err(_) => {
                                open.remove(&webhook_id);
                                return;
                            }
                        }
                    }
                };
                let Ok(_slot) = shared.slots.acquire().await else {
                    return; // closed: never, the semaphore lives as long as `shared`
                };
                attempt_all(&shared.http, &shared.targets, &delivery).await;
            }
        });
        lane
    }
}

/// Tries `delivery` until an attempt gets a 2xx answer or the retries are spent.
async fn attempt_all(http: &reqwest::Client, targets: &Targets, delivery: &Delivery) {
    let signature = signature(&delivery.secret, &delivery.body);
    for attempt in 0..=BACKOFF.len() {
        if attempt > 0 {
            tokio::time::sleep(BACKOFF[attempt - 1]).await;
        }
        let failure = match attempt_one(http, targets, delivery, &signature).await {
            Ok(()) => return,
            Err(why) => why,
        };
        tracing::info!(webhook = %delivery.webhook_id, attempt = attempt + 1, why = %failure,
            "a webhook delivery failed");
    }
    tracing::warn!(webhook = %delivery.webhook_id, "a webhook delivery was given up after its retries");
}

async fn attempt_one(
    http: &reqwest::Client,
    targets: &Targets,
    delivery: &Delivery,
    signature: &str,
) -> Result<(), String> {
    // An address in the URL is not resolved, so not seen by the resolver: check it here.
    let url = reqwest::Url::parse(&delivery.url).map_err(|e| e.to_string())?;
    if let Some(ip) = address(&url) {
        targets.check_ip(&ip.to_string(), ip)?;
    }
    let answer = http
        .post(url)
        .header("content-type", "application/json")
        .header("e2b-webhook-id", &delivery.webhook_id)
        .header("e2b-delivery-id", uuid::Uuid::new_v4().to_string())
        .header("e2b-signature-version", "v1")
        .header("e2b-signature", signature)
        .body(delivery.body.clone())
        .send()
        .await
        .map_err(|e| error_chain(&e))?;
    match answer.status() {
        s if s.is_success() => Ok(()),
        s => Err(format!("answered {s}")),
    }
}

/// The address a URL names in place of a host name, if it does.
fn address(url: &reqwest::Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_refused_with_no_list_of_the_drivers() {
        // A gateway's deliverer: it runs no sandboxes, so it has no driver's list.
        let gateway = Deliverer::new(Vec::new(), false).unwrap();
        for url in [
            "http://127.0.0.1/x",
            "http://169.254.169.254/latest",
            "http://10.1.2.3/",
        ] {
            assert!(gateway.check_url(url).is_err(), "{url}");
        }
        assert!(gateway.check_url("http://93.184.215.14/hook").is_ok());
        let allowed = Deliverer::new(Vec::new(), true).unwrap();
        assert!(allowed.check_url("http://127.0.0.1/x").is_ok());
    }

    fn deliverer(allow_private: bool) -> Deliverer {
        let unreachable = ["127.0.0.0/8", "10.0.0.0/8", "169.254.0.0/16"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        Deliverer::new(unreachable, allow_private).unwrap()
    }

    #[test]
    fn signatures_are_e2b_s() {
        // As E2B's docs verify it: base64(sha256(secret + body)), URL-safe, unpadded.
        assert_eq!(
            signature("secret", "{\"a\":1}"),
            "N7005LKS7534v-cOP1BSYTkklJDDwllM8gF1unZl4B0"
        );
    }

    #[tokio::test]
    async fn webhooks_reach_public_http_and_https_only() {
        let d = deliverer(false);
        assert!(d.check_url("https://hooks.example.com/x").is_ok());
        assert!(d.check_url("http://93.184.216.34:8080/x").is_ok());
        for bad in [
            "ftp://example.com/x",
            "file:///etc/passwd",
            "example.com/x",
            "https://user:pw@example.com/",
            "http://127.0.0.1:9000/x",
            "http://[::1]/x",
            "http://[::ffff:10.0.0.1]/x",
            "http://169.254.169.254/latest/meta-data",
            "http://localhost:8080/x",
            "http://a.localhost/x",
        ] {
            assert!(d.check_url(bad).is_err(), "{bad}");
        }
        // The operator's flag lets private targets through, not other schemes.
        let d = deliverer(true);
        assert!(d.check_url("http://127.0.0.1:9000/x").is_ok());
        assert!(d.check_url("http://localhost:8080/x").is_ok());
        assert!(d.check_url("ftp://127.0.0.1/x").is_err());
    }

    #[tokio::test]
    async fn a_name_at_a_private_address_is_refused_when_sent() {
        let d = deliverer(false);
        let refused = attempt_one(
            &d.shared.http,
            &d.shared.targets,
            &Delivery {
                webhook_id: "w".into(),
                url: "http://localhost:9/x".into(),
                secret: "s".into(),
                body: "{}".into(),
            },
            "sig",
        )
        .await
        .unwrap_err();
        assert!(refused.contains("--webhooks-allow-private"), "{refused}");
    }

    /// A receiver on loopback that records each request's body in arrival order and answers
    /// 200, after `delay` for requests to `/slow`.
    async fn receiver(delay: Duration) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let heard = Arc::new(Mutex::new(Vec::new()));
        let log = heard.clone();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut conn = BufReader::new(conn);
                    loop {
                        let (mut path, mut length, mut line) = (String::new(), 0, String::new());
                        while conn.read_line(&mut line).await.unwrap_or(0) > 0 {
                            let l = line.trim_end().to_ascii_lowercase();
                            if l.is_empty() {
                                break;
                            }
                            if let Some(p) = l.strip_prefix("post ") {
                                path = p.split(' ').next().unwrap_or("").to_owned();
                            }
                            if let Some(n) = l.strip_prefix("content-length: ") {
                                length = n.parse().unwrap();
                            }
                            line.clear();
                        }
                        if path.is_empty() {
                            return; // the client closed the connection
                        }
                        let mut body = vec![0; length];
                        conn.read_exact(&mut body).await.unwrap();
                        if path == "/slow" {
                            tokio::time::sleep(delay).await;
                        }
                        log.lock().unwrap().push(String::from_utf8(body).unwrap());
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        conn.get_mut().write_all(ok).await.unwrap();
                    }
                });
            }
        });
        (url, heard)
    }

    fn delivery(webhook_id: &str, url: &str, body: String) -> Delivery {
        Delivery {
            webhook_id: webhook_id.into(),
            url: url.into(),
            secret: "s".into(),
            body,
        }
    }

    async fn until(heard: &Mutex<Vec<String>>, count: usize) -> Vec<String> {
        for _ in 0..200 {
            if heard.lock().unwrap().len() >= count {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        heard.lock().unwrap().clone()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_webhook_hears_its_events_in_order_and_a_slow_one_delays_only_itself() {
        let d = deliverer(true);
        let (url, heard) = receiver(Duration::from_millis(40)).await;
        // Events handed over back to back, as a create, pause, resume and kill are: the first
        // ones' answers are slow, so deliveries sent side by side would overtake them.
        let sent: Vec<String> = (0..12).map(|i| format!("{{\"n\":{i}}}")).collect();
        for body in &sent {
            d.send(delivery("in-order", &format!("{url}/slow"), body.clone()));
        }
        // Another webhook, handed over last, is heard before the slow one is through.
        d.send(delivery("other", &format!("{url}/fast"), "\"fast\"".into()));
        let got = until(&heard, sent.len() + 1).await;
        assert_eq!(got.len(), sent.len() + 1, "{got:?}");
        let fast = got.iter().position(|b| b == "\"fast\"").unwrap();
        assert!(
            fast < sent.len(),
            "the fast webhook waited for the slow one: {got:?}"
        );
        let in_order: Vec<String> = got.into_iter().filter(|b| b != "\"fast\"").collect();
        assert_eq!(in_order, sent);
    }
}
