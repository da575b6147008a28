//! Where creates and requests that touch a volume go. A volume's files are on one node's disk
//! (its record names it), so its content API, its delete and every sandbox that mounts it go
//! there, never to the least loaded node; a volume moved into object storage (off a drained
//! node) is on none, and goes to the least loaded node, which takes it in. Other creates go to
//! the least loaded node, or to one that holds the template's golden image if it is not much
//! busier.

use super::nodes::{NoNode, NodeAddress};
use super::GatewayState;
use crate::http::error::ApiError;
use airlock_core::ids::TemplateName;
use airlock_core::store::VolumeRecord;
use airlock_wire::api::NewSandbox;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use std::collections::BTreeSet;

/// The largest create body a gateway reads to place it (a node takes no larger one either).
const MAX_CREATE_BODY: usize = 2 << 20;

/// The node for a delete of `/volumes/{id}` or for `/volumecontent/{id}/...`: the volume's
/// own. A volume no one has goes to any node, which answers for it as for a missing one (404
/// or 401).
pub async fn node_of_volume(gw: &GatewayState, id: &str) -> Result<NodeAddress, ApiError> {
    match gw.store.volumes().by_id(id).await? {
        // Moved off a drained node: the least loaded one takes it in.
        Some(volume) if volume.node.is_empty() => gw.nodes.place().map_err(unavailable),
        Some(volume) => gw
            .nodes
            .healthy(&volume.node)
            .map_err(|e| node_unavailable(&volume, e)),
        None => gw.nodes.place().map_err(unavailable),
    }
}

/// The node that keeps `volumes` (their records), where a sandbox that mounts them runs: `None`
/// if they are all on no node (moved into object storage: any node takes them in), a 400 if
/// they are kept on two.
pub fn node_keeping(volumes: &[VolumeRecord]) -> Result<Option<&VolumeRecord>, ApiError> {
    let mut kept = volumes.iter().filter(|v| !v.node.is_empty());
    let Some(first) = kept.next() else {
        return Ok(None);
    };
    if let Some(other) = kept.find(|v| v.node != first.node) {
        return Err(ApiError::bad_request(format!(
            "volume '{}' is kept on node '{}' and volume '{}' on node '{}': a sandbox \
             mounts volumes of one node only",
            first.name, first.node, other.name, other.node
        )));
    }
    Ok(Some(first))
}

/// The node for a create by `owner`, and the request to send it, its body read here: the node
/// that keeps the volumes it mounts (named in `volumeMounts`, or those of the snapshot it
/// starts from), else the least loaded one.
pub async fn place_create(
    gw: &GatewayState,
    owner: &str,
    req: Request,
) -> Result<(NodeAddress, Request), ApiError> {
    let (parts, body) = req.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, MAX_CREATE_BODY)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a create's body may have at most {MAX_CREATE_BODY} bytes"),
            )
        })?;
    // A body that is not a create is the node's to refuse, with its own words.
    let create = serde_json::from_slice::<NewSandbox>(&bytes).ok();
    let mounted = match &create {
        Some(create) => mounted_volumes(gw, owner, create).await?,
        None => Vec::new(),
    };
    let node = match node_keeping(&mounted)? {
        None => {
            let template = match create {
                Some(create) => warm_name(gw, owner, &create.template_id).await,
                None => None,
            };
            gw.nodes
                .place_for(template.as_deref())
                .map_err(unavailable)?
        }
        Some(keeper) => gw
            .nodes
            .ready(&keeper.node)
            .map_err(|e| node_unavailable(keeper, e))?,
    };
    Ok((node, Request::from_parts(parts, Body::from(bytes))))
}

/// The name nodes know template `reference` by in their warm lists (its record's), if some
/// ready nodes hold golden images that others lack; a hint only, so a failed lookup is none.
async fn warm_name(gw: &GatewayState, owner: &str, reference: &str) -> Option<String> {
    if !gw.nodes.warmth_differs() {
        return None;
    }
    let found = gw
        .store
        .templates()
        .visible_template(Some(owner), reference)
        .await;
    Some(found.ok()??.0.name.to_string())
}

/// The volumes of `owner` that `create` would mount. Names it lacks are left to the node,
/// which answers 404 for them.
async fn mounted_volumes(
    gw: &GatewayState,
    owner: &str,
    create: &NewSandbox,
) -> Result<Vec<VolumeRecord>, ApiError> {
    // By name as the create says, or by id as the snapshot recorded them.
    let mut wanted: BTreeSet<String> = create
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.clone())
        .collect();
    let by_name = !wanted.is_empty();
    if !by_name {
        if let Ok(snapshot) = TemplateName::parse(&create.template_id) {
            if let Some(snapshot) = gw.store.snapshots().get(owner, &snapshot).await? {
                wanted.extend(snapshot.volume_mounts.into_iter().map(|m| m.volume_id));
            }
        }
    }
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let mut owned = gw.store.volumes().of(owner).await?;
    owned.retain(|v| wanted.contains(if by_name { &v.name } else { &v.id }));
    Ok(owned)
}

/// 503 for a volume whose node cannot take the request now.
fn node_unavailable(volume: &VolumeRecord, e: NoNode) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "volume '{}' is kept on node '{}', where its files are: {e}; try again when the \
             node is back",
            volume.name, volume.node
        ),
    )
}

fn unavailable(e: NoNode) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}
