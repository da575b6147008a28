//! Where a gateway sends each request. It checks the API key itself, then: a create goes to
//! the least loaded node, or to the one that keeps the volumes it mounts; anything about one
//! sandbox (its REST verbs and its traffic) goes to the node the catalog says it is on, and
//! anything that touches one volume's files to the node that keeps them; the nodes' admin
//! routes are answered here; everything else (lists, templates, snapshots, events), whose state is all in
//! the shared database, goes to any ready node.

use super::dashboard::overview;
use super::forward::{CheckedCaller, Kind};
use super::nodes::{NoNode, NodeAddress};
use super::placement::{node_keeping, node_of_volume, place_create};
use super::signed_files::signed_files;
use super::GatewayState;
use crate::cluster::GATEWAY_HEADERS;
use crate::http::error::ApiError;
use crate::proxy::target::{bad_gateway, sandbox_not_found};
use airlock_core::ids::SandboxId;
use airlock_core::lifecycle::LifecycleError;
use airlock_core::store::{SandboxRecord, SandboxState};
use airlock_request::{classify, Target};
use airlock_wire::nodes::NodeDetail;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// What a request is, by its method and path.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Health,
    /// To any node without a key: `/uploads/...`, where the link is the authority, and the
    /// dashboard's page, which holds nothing.
    Open,
    /// `/volumecontent/{id}/...`: the volume's token is the authority, no key.
    VolumeContent(String),
    Create,
    /// A route under `/sandboxes/{id}` or `/v2/sandboxes/{id}`; `kill` for E2B's kill,
    /// `DELETE /sandboxes/{id}`.
    Sandbox {
        id: String,
        kill: bool,
    },
    /// `/volumes/{id}`.
    Volume(String),
    Nodes,
    Node(String),
    /// The dashboard's overview, from every node. (MCP is the gateway's own route.)
    DashboardOverview,
    /// Anything else behind the API key.
    AnyNode,
}

impl Route {
    fn of(method: &Method, path: &str) -> Route {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let sandboxes = match segments.as_slice() {
            ["v2", "sandboxes", rest @ ..] | ["sandboxes", rest @ ..] => Some(rest),
            _ => None,
        };
        match (sandboxes, segments.as_slice()) {
            (Some([]), _) if method == Method::POST => Route::Create,
            // `/sandboxes/metrics` is every sandbox's, not one named `metrics`.
            (Some([] | ["metrics"]), _) => Route::AnyNode,
            (Some([id, rest @ ..]), all) => Route::Sandbox {
                id: (*id).to_owned(),
                kill: method == Method::DELETE && rest.is_empty() && all[0] == "sandboxes",
            },
            (None, ["health"]) => Route::Health,
            (None, ["uploads", ..] | ["dashboard"] | ["dashboard", ""]) => Route::Open,
            (None, ["dashboard", "api", "state"]) => Route::DashboardOverview,
            // A sandbox's kill, pause or resume, on its node.
            (None, ["dashboard", "api", "sandboxes", id, _]) => Route::Sandbox {
                id: (*id).to_owned(),
                kill: false,
            },
            (None, ["volumecontent", id, ..]) => Route::VolumeContent((*id).to_owned()),
            (None, ["volumes", id]) => Route::Volume((*id).to_owned()),
            (None, ["nodes"]) => Route::Nodes,
            (None, ["nodes", node]) => Route::Node((*node).to_owned()),
            _ => Route::AnyNode,
        }
    }
}

/// The gateway's one handler: every request comes here.
pub async fn handle(State(gw): State<GatewayState>, mut req: Request) -> Response {
    // Only a gateway speaks for a caller to a node.
    for name in GATEWAY_HEADERS {
        req.headers_mut().remove(*name);
    }
    match classify(req.headers(), req.uri()) {
        Some(Target::Sandbox { id, .. }) => return sandbox_traffic(&gw, &id, req).await,
        Some(Target::SignedFiles) => return signed_files(&gw, req).await,
        None => {}
    }
    let route = Route::of(req.method(), req.uri().path());
    match route {
        Route::Health => (StatusCode::OK, "ok").into_response(),
        Route::Open => match gw.nodes.pick() {
            Ok(node) => gw.forward.send(&node, req, None, Kind::Api).await,
            Err(e) => no_node(e),
        },
        Route::VolumeContent(id) => match node_of_volume(&gw, &id).await {
            Ok(node) => gw.forward.send(&node, req, None, Kind::Api).await,
            Err(e) => e.into_response(),
        },
        route => match checked_caller(&gw, req.headers()).await {
            Ok(caller) => with_caller(&gw, route, caller, req).await,
            Err(e) => e.into_response(),
        },
    }
}

async fn with_caller(
    gw: &GatewayState,
    route: Route,
    caller: CheckedCaller,
    req: Request,
) -> Response {
    let node = match route {
        Route::Create => match place_create(gw, &caller.id, req).await {
            Ok((node, req)) => return gw.forward.send(&node, req, Some(&caller), Kind::Api).await,
            Err(e) => return e.into_response(),
        },
        Route::AnyNode => gw.nodes.pick(),
        // A volume's record is in the shared database: any node answers for it, so it reads
        // while the node that keeps its files is down. Its delete needs that node.
        Route::Volume(_) if req.method() == Method::GET => gw.nodes.pick(),
        Route::Volume(id) => match node_of_volume(gw, &id).await {
            Ok(node) => Ok(node),
            Err(e) => return e.into_response(),
        },
        Route::Sandbox { id, kill } => match owned_sandbox(gw, &caller, &id).await {
            Ok(record) => match node_of(gw, &record).await {
                Err(_) if record.state == SandboxState::Running && kill => {
                    return kill_lost(gw, &record).await
                }
                Err(e) if record.state == SandboxState::Running => {
                    return ApiError::new(StatusCode::BAD_GATEWAY, lost(&record, &e))
                        .into_response()
                }
                found => found,
            },
            Err(e) => return e.into_response(),
        },
        Route::Nodes if caller.operator => return Json(gw.nodes.list()).into_response(),
        Route::Node(name) if caller.operator => match gw.nodes.healthy(&name) {
            Ok(node) => Ok(node),
            Err(NoNode::Unhealthy(_)) if req.method() == Method::GET => {
                return unhealthy_node(gw, &name).await
            }
            Err(e @ NoNode::Unhealthy(_)) => Err(e),
            Err(e) => return ApiError::not_found(e.to_string()).into_response(),
        },
        Route::Nodes | Route::Node(_) => return not_operator(),
        Route::DashboardOverview => return overview(gw, &caller).await,
        Route::Health | Route::Open | Route::VolumeContent(_) => {
            unreachable!("answered without a key")
        }
    };
    match node {
        Ok(node) => gw.forward.send(&node, req, Some(&caller), Kind::Api).await,
        Err(e) => no_node(e),
    }
}

/// The API key's holder; 401 as a node would give it.
async fn checked_caller(gw: &GatewayState, headers: &HeaderMap) -> Result<CheckedCaller, ApiError> {
    let live = crate::http::auth::live_key_of(&gw.store, headers).await?;
    Ok(CheckedCaller {
        id: live.id,
        operator: live.operator,
    })
}

/// The catalog's record of sandbox `id` if `caller` owns it; 404 as for no sandbox otherwise,
/// so that another key's sandbox is not confirmed to exist.
async fn owned_sandbox(
    gw: &GatewayState,
    caller: &CheckedCaller,
    id: &str,
) -> Result<SandboxRecord, ApiError> {
    let not_found = || ApiError::from(LifecycleError::SandboxNotFound(id.to_owned()));
    let Ok(parsed) = SandboxId::parse(id) else {
        return Err(not_found());
    };
    match gw.store.sandboxes().alive(&parsed).await? {
        Some(record) if record.owner.as_deref() == Some(caller.id.as_str()) => Ok(record),
        _ => Err(not_found()),
    }
}

/// Where requests for a sandbox go: its node; for a paused one whose node is gone or
/// draining, the node placement picks, which takes it over and resumes it from object storage.
/// A paused one that mounts volumes goes where they are kept (their files are there), or, if
/// they moved into object storage (its node was drained), as one without.
async fn node_of(gw: &GatewayState, record: &SandboxRecord) -> Result<NodeAddress, NoNode> {
    if record.state != SandboxState::Paused {
        return gw.nodes.healthy(&record.node);
    }
    match volumes_node(gw, record).await {
        // Where it is and its volumes too: as for any sandbox, its node answers for it.
        Some(node) if node == record.node => gw.nodes.healthy(&node),
        Some(node) => gw.nodes.ready(&node),
        None => gw.nodes.ready(&record.node).or_else(|_| gw.nodes.place()),
    }
}

/// The node that keeps the volumes `record` mounts; `None` if it mounts none, or they are on
/// no node (moved into object storage). Its own node if they cannot be looked up.
async fn volumes_node(gw: &GatewayState, record: &SandboxRecord) -> Option<String> {
    if record.volume_mounts.is_empty() {
        return None;
    }
    let owner = record.owner.as_deref().unwrap_or_default();
    let mut volumes = match gw.store.volumes().of(owner).await {
        Ok(volumes) => volumes,
        Err(_) => return Some(record.node.clone()),
    };
    volumes.retain(|v| record.volume_mounts.iter().any(|m| m.volume_id == v.id));
    match node_keeping(&volumes) {
        Ok(keeper) => keeper.map(|v| v.node.clone()),
        Err(_) => Some(record.node.clone()),
    }
}

/// A sandbox's own traffic (commands, files, its ports): to its node, whose proxy checks the
/// sandbox's tokens as on one machine.
async fn sandbox_traffic(gw: &GatewayState, id: &str, req: Request) -> Response {
    let record = match SandboxId::parse(id) {
        Ok(parsed) => gw.store.sandboxes().alive(&parsed).await,
        Err(_) => return sandbox_not_found(id),
    };
    let record = match record {
        Ok(Some(record)) => record,
        Ok(None) => return sandbox_not_found(id),
        Err(e) => return ApiError::from(e).into_response(),
    };
    match node_of(gw, &record).await {
        Ok(node) => {
            gw.forward
                .send(&node, req, None, Kind::SandboxTraffic)
                .await
        }
        Err(e) if record.state == SandboxState::Running => bad_gateway(id, &lost(&record, &e)),
        Err(e) => no_node(e),
    }
}

/// What a running sandbox whose node is gone is: lost with it (its memory was there).
pub(super) fn lost(record: &SandboxRecord, why: &NoNode) -> String {
    format!(
        "sandbox {} was lost with its node: {why}; a paused sandbox would have moved, a \
         running one cannot",
        record.id
    )
}

/// A kill of a running sandbox whose node is gone: there is nothing left to stop, so its row
/// is marked killed here, and its key's quota frees at once (the node, if it comes back,
/// forgets the row and destroys what is left at its start).
async fn kill_lost(gw: &GatewayState, record: &SandboxRecord) -> Response {
    match gw
        .store
        .sandboxes()
        .stop_lost(&record.id, &record.node)
        .await
    {
        Ok(true) => {
            tracing::info!(sandbox = %record.id, node = %record.node, "killed a sandbox lost with its node");
            super::lost::record_killed(gw, record).await;
            StatusCode::NO_CONTENT.into_response()
        }
        // Another verb took it meanwhile (a kill through another gateway).
        Ok(false) => {
            ApiError::from(LifecycleError::SandboxNotFound(record.id.to_string())).into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `GET /nodes/{name}` of a node that does not answer: what the catalog puts there.
async fn unhealthy_node(gw: &GatewayState, name: &str) -> Response {
    let Some(node) = gw.nodes.list().into_iter().find(|n| n.node_id == name) else {
        return ApiError::not_found(format!("no node '{name}' (GET /nodes lists them)"))
            .into_response();
    };
    match gw.store.sandboxes().of_node(name).await {
        Ok(records) => Json(NodeDetail {
            node,
            sandboxes: records.iter().map(|r| r.id.to_string()).collect(),
        })
        .into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

fn no_node(e: NoNode) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
}

fn not_operator() -> Response {
    crate::http::auth::not_operator().into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_method_and_path() {
        let of = |m: &str, p: &str| Route::of(&m.parse().unwrap(), p);
        assert_eq!(of("POST", "/sandboxes"), Route::Create);
        assert_eq!(of("POST", "/v2/sandboxes"), Route::Create);
        assert_eq!(of("GET", "/v2/sandboxes"), Route::AnyNode);
        assert_eq!(of("GET", "/sandboxes/metrics"), Route::AnyNode);
        let sandbox = |id: &str, kill| Route::Sandbox {
            id: id.into(),
            kill,
        };
        assert_eq!(of("GET", "/sandboxes/abc"), sandbox("abc", false));
        assert_eq!(of("DELETE", "/sandboxes/abc"), sandbox("abc", true));
        assert_eq!(of("DELETE", "/v2/sandboxes/abc"), sandbox("abc", false));
        assert_eq!(of("DELETE", "/sandboxes/abc/x"), sandbox("abc", false));
        assert_eq!(
            of("POST", "/v2/sandboxes/abc/connect"),
            sandbox("abc", false)
        );
        assert_eq!(of("GET", "/nodes"), Route::Nodes);
        assert_eq!(of("GET", "/nodes/n1"), Route::Node("n1".into()));
        assert_eq!(of("PUT", "/uploads/t"), Route::Open);
        assert_eq!(
            of("GET", "/volumecontent/v/file"),
            Route::VolumeContent("v".into())
        );
        assert_eq!(of("DELETE", "/volumes/v"), Route::Volume("v".into()));
        assert_eq!(of("POST", "/volumes"), Route::AnyNode);
        assert_eq!(of("GET", "/health"), Route::Health);
        assert_eq!(of("GET", "/templates"), Route::AnyNode);
        assert_eq!(of("GET", "/snapshots"), Route::AnyNode);
        assert_eq!(of("GET", "/dashboard/"), Route::Open);
        assert_eq!(of("GET", "/dashboard"), Route::Open);
        assert_eq!(of("GET", "/dashboard/api/state"), Route::DashboardOverview);
        assert_eq!(
            of("POST", "/dashboard/api/sandboxes/abc/kill"),
            sandbox("abc", false)
        );
        assert_eq!(
            of("GET", "/dashboard/api/templates/t/builds/b/logs"),
            Route::AnyNode
        );
    }
}
