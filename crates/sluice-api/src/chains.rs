//! `GET /api/v1/chains`: the chain ingesters' status (head, finalized, ingested block, lag,
//! RPC errors). The ingesters live in `sluice-chains`; this crate sees them only through
//! [`ChainStatusSource`], which the binary implements, so the API does not build the
//! chain-reading code.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::params::Query;
use crate::state::AppState;

/// Status of the chain ingesters of this process.
pub trait ChainStatusSource: Send + Sync + 'static {
    /// One entry per configured chain.
    fn statuses(&self) -> Vec<ChainStatusBody>;
    /// Prometheus text of the chain series (`sluice_chain_*`).
    fn metrics_text(&self) -> String;
}

/// One chain ingester's status.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
pub struct ChainStatusBody {
    pub chain: String,
    /// The RPC URL with credentials, query and key-like path segments hidden; null for
    /// callers without an operator key.
    pub rpc_url: Option<String>,
    /// The node's head block.
    pub head: Option<u64>,
    /// The highest block the finality rule makes final.
    pub finalized: Option<u64>,
    /// The last block in the finalized streams.
    pub ingested: Option<u64>,
    /// The last block in the zerolag streams.
    pub zerolag_ingested: Option<u64>,
    /// Blocks between the head and the last finalized-stream block.
    pub lag_blocks: Option<u64>,
    /// Seconds between the head block's time and the last finalized-stream block's time.
    pub lag_seconds: Option<i64>,
    /// Reorgs seen since start.
    pub reorgs: u64,
    /// JSON-RPC HTTP requests since start.
    pub rpc_requests: u64,
    /// Failed JSON-RPC requests since start (each retry counts).
    pub rpc_errors: u64,
    /// The last error of the ingester, null once a later step succeeded.
    pub last_error: Option<String>,
    /// Lines of a node's output files (Hyperliquid), or messages of a Kafka source
    /// (dead-lettered), that made no record since start; absent for JSON-RPC chains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<u64>,
    /// Bytes of a node's output files not read yet (Hyperliquid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
    /// A Kafka source's name (`[[sources]]`); absent for ingesters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The stream a Kafka source feeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    /// Records a Kafka source appended since start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Messages between a Kafka source's position and its topic's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_messages: Option<u64>,
}

/// The list answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChainsBody {
    pub items: Vec<ChainStatusBody>,
}

/// Chain ingesters of this server and how far each has read (any API key; the RPC URL,
/// redacted, only for operator keys).
#[utoipa::path(
    get, path = "/api/v1/chains", tag = "operations",
    responses(
        (status = 200, description = "Every configured chain", body = ChainsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_chains(
    State(state): State<AppState>,
    Caller(principal): Caller,
    query: Query,
) -> Result<Json<ChainsBody>, ApiError> {
    query.expect_none()?;
    let mut items = state.chains.as_ref().map(|c| c.statuses()).unwrap_or_default();
    if !principal.is_operator {
        for item in &mut items {
            item.rpc_url = None;
        }
    }
    Ok(Json(ChainsBody { items }))
}
