//! How the server talks to a sandbox's agent itself (health and `/init`), over the sandbox's link.

use crate::proxy::HttpClient;
use airlock_core::lifecycle::AgentClient;
use airlock_wire::envd::InitRequest;
use airlock_wire::ENVD_PORT;
use axum::body::Body;
use http_body_util::BodyExt;
use std::net::Ipv4Addr;
use std::time::Duration;

pub struct HttpAgentClient {
    pub http: HttpClient,
}

impl HttpAgentClient {
    async fn call(&self, req: hyper::Request<Body>, within: Duration) -> Result<u16, String> {
        let resp = tokio::time::timeout(within, self.http.request(req))
            .await
            .map_err(|_| "no answer in time".to_string())?
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        // Drain so the connection can go back to the pool.
        let _ = resp.into_body().collect().await;
        Ok(status)
    }
}

#[async_trait::async_trait]
impl AgentClient for HttpAgentClient {
    async fn wait_ready(&self, addr: Ipv4Addr, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = String::from("never answered");
        while tokio::time::Instant::now() < deadline {
            let req = hyper::Request::get(format!("http://{addr}:{ENVD_PORT}/health"))
                .body(Body::empty())
                .map_err(|e| e.to_string())?;
            match self.call(req, Duration::from_millis(500)).await {
                Ok(s) if (200..300).contains(&s) => return Ok(()),
                Ok(s) => last = format!("health check answered {s}"),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(format!(
            "agent at {addr} not ready after {within:?}: {last}"
        ))
    }

    async fn init(&self, addr: Ipv4Addr, init: &InitRequest) -> Result<(), String> {
        let body = serde_json::to_vec(init).map_err(|e| e.to_string())?;
        let req = hyper::Request::post(format!("http://{addr}:{ENVD_PORT}/init"))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .map_err(|e| e.to_string())?;
        match self.call(req, Duration::from_secs(5)).await? {
            s if (200..300).contains(&s) => Ok(()),
            s => Err(format!("agent /init answered {s}")),
        }
    }
}
