//! `GET /api/v1/chains` and the chain series of `/metrics`: what each caller sees.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use sluice_api::chains::{ChainStatusBody, ChainStatusSource};

use crate::harness::Harness;

/// A fixed status, as the binary's ingesters would report it.
struct OneChain;

impl ChainStatusSource for OneChain {
    fn statuses(&self) -> Vec<ChainStatusBody> {
        vec![ChainStatusBody {
            chain: "base".to_owned(),
            rpc_url: Some("https://base-mainnet.g.alchemy.com/v2/***".to_owned()),
            head: Some(110),
            finalized: Some(100),
            ingested: Some(100),
            zerolag_ingested: Some(110),
            lag_blocks: Some(10),
            lag_seconds: Some(20),
            reorgs: 1,
            rpc_requests: 50,
            rpc_errors: 2,
            last_error: None,
            rejected: None,
            lag_bytes: None,
            source: None,
            entity: None,
            records: None,
            lag_messages: None,
        }]
    }

    fn metrics_text(&self) -> String {
        "# TYPE sluice_chain_ingested_block gauge\nsluice_chain_ingested_block{chain=\"base\"} 100\n"
            .to_owned()
    }
}

#[tokio::test]
async fn chains_show_progress_to_any_key_and_the_rpc_url_only_to_operators() {
    let h = Harness::with_chains(Arc::new(OneChain)).await;
    let (status, _) = h.call(Method::GET, "/api/v1/chains", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let user = h.user("acme", "data", "ann").await;
    let (status, body) = h.get("/api/v1/chains", &user).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["items"][0]["chain"], "base");
    assert_eq!(body["items"][0]["lag_blocks"], 10);
    assert_eq!(body["items"][0]["rpc_url"], serde_json::Value::Null);

    let identity = h.store.ensure_identity("ops", "ops", "root", true).await.unwrap();
    let key = sluice_api::auth::issue_key(h.store.as_ref(), &identity.user.id, None)
        .await
        .unwrap()
        .unwrap();
    let (_, body) = h.call(Method::GET, "/api/v1/chains", Some(&key), None).await;
    assert_eq!(body["items"][0]["rpc_url"], "https://base-mainnet.g.alchemy.com/v2/***");

    let (status, metrics) = h.call(Method::GET, "/metrics", Some(&user.key), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(metrics.as_str().unwrap().contains("sluice_chain_ingested_block{chain=\"base\"} 100"));
}

#[tokio::test]
async fn a_server_without_chains_lists_none() {
    let h = Harness::new().await;
    let user = h.user("acme", "data", "ann").await;
    let (status, body) = h.get("/api/v1/chains", &user).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["items"], serde_json::json!([]));
}
