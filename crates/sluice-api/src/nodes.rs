//! `GET /api/v1/nodes`: the `sluice serve` nodes sharing the work, and the workers each runs
//! (operators only). A node of its own lists itself.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::params::Query;
use crate::state::AppState;

/// One worker a node runs.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeWorkerBody {
    pub config_id: String,
    /// `<config_id>-worker-<index>`, as in the deployment's worker health.
    pub name: String,
}

/// One live node.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeBody {
    /// `--node-name` (default `<hostname>:<port>`).
    pub name: String,
    /// Where the node's API answers; null when unknown.
    pub address: Option<String>,
    /// When the node started (ISO 8601 UTC); null when unknown.
    pub started_at: Option<String>,
    /// Milliseconds since the node's last heartbeat.
    pub last_heartbeat_ms: u64,
    /// The node that answered this request.
    pub is_self: bool,
    pub workers: Vec<NodeWorkerBody>,
}

/// The list answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodesBody {
    pub items: Vec<NodeBody>,
}

/// The live nodes and their workers (operator keys). A node counts as live while its
/// heartbeat is younger than the node timeout.
#[utoipa::path(
    get, path = "/api/v1/nodes", tag = "operations",
    responses(
        (status = 200, description = "Every live node, the answering one first", body = NodesBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an operator", body = ErrorBody),
        (status = 503, description = "This process runs no pipelines", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_nodes(
    State(state): State<AppState>,
    Caller(principal): Caller,
    query: Query,
) -> Result<Json<NodesBody>, ApiError> {
    if !principal.is_operator {
        return Err(ApiError::Forbidden("only operators see the cluster's nodes".to_owned()));
    }
    query.expect_none()?;
    let runtime = state.runtime()?;
    let items = match runtime.nodes() {
        Some(nodes) => nodes
            .into_iter()
            .map(|node| NodeBody {
                name: node.name,
                address: Some(node.address).filter(|a| !a.is_empty()),
                started_at: node.started_at.map(sluice_core::time::format),
                last_heartbeat_ms: u64::try_from(node.last_seen.as_millis()).unwrap_or(u64::MAX),
                is_self: node.is_self,
                workers: node
                    .workers
                    .into_iter()
                    .map(|(config_id, name)| NodeWorkerBody { config_id, name })
                    .collect(),
            })
            .collect(),
        None => vec![NodeBody {
            name: state.node_name.to_string(),
            address: None,
            started_at: None,
            last_heartbeat_ms: 0,
            is_self: true,
            workers: runtime
                .all_worker_health()
                .await
                .into_iter()
                .flat_map(|(config_id, workers)| {
                    workers.into_iter().map(move |worker| NodeWorkerBody {
                        config_id: config_id.clone(),
                        name: worker.name,
                    })
                })
                .collect(),
        }],
    };
    Ok(Json(NodesBody { items }))
}
