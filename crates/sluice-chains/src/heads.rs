//! New heads over WebSocket: `eth_subscribe("newHeads")` on the node's WebSocket endpoint
//! wakes the ingester as soon as a block arrives, instead of at its next head poll.
//!
//! The subscription only wakes; the ingester still reads every block over JSON-RPC, so a
//! dropped or slow WebSocket costs latency, never data. A lost connection is logged and
//! opened again with backoff (1 s doubling to 30 s); polling goes on meanwhile.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

use crate::rpc::redact_url;

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A WebSocket subscription that wakes an ingester: the request that opens it and the
/// method name of its notifications.
#[derive(Debug, Clone, Copy)]
pub struct Subscription {
    pub request: &'static str,
    pub notification: &'static str,
}

/// An EVM node's new heads.
pub const NEW_HEADS: Subscription = Subscription {
    request: r#"{"jsonrpc":"2.0","id":1,"method":"eth_subscribe","params":["newHeads"]}"#,
    notification: "eth_subscription",
};

/// A Solana node's slots (`slotSubscribe`: one notification per slot the node processes).
pub const SOLANA_SLOTS: Subscription = Subscription {
    request: r#"{"jsonrpc":"2.0","id":1,"method":"slotSubscribe"}"#,
    notification: "slotNotification",
};

/// Follows `ws_url`'s new heads until the task is dropped, notifying `wake` for each.
pub async fn follow(chain: String, ws_url: String, wake: Arc<Notify>) {
    follow_subscription(chain, ws_url, NEW_HEADS, wake).await;
}

/// Follows `subscription` on `ws_url` until the task is dropped, notifying `wake` for each
/// notification.
pub async fn follow_subscription(
    chain: String,
    ws_url: String,
    subscription: Subscription,
    wake: Arc<Notify>,
) {
    let shown = redact_url(&ws_url);
    let mut backoff = Duration::from_secs(1);
    loop {
        match subscribe(&ws_url, subscription, &wake).await {
            Ok(()) => {
                tracing::warn!(%chain, url = %shown, "head subscription closed by the node; reconnecting")
            }
            Err(error) => {
                tracing::warn!(%chain, url = %shown, %error, ?backoff, "head subscription failed; polling meanwhile")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection: subscribes, then notifies for every head until the connection ends.
async fn subscribe(ws_url: &str, subscription: Subscription, wake: &Notify) -> Result<(), String> {
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .map_err(|error| redact_error(&error.to_string(), ws_url))?;
    socket.send(Message::text(subscription.request)).await.map_err(|error| error.to_string())?;
    while let Some(message) = socket.next().await {
        let text = match message.map_err(|error| error.to_string())? {
            Message::Text(text) => text,
            Message::Close(_) => return Ok(()),
            _ => continue,
        };
        let Ok(body) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        if body.get("id").is_some() {
            // The answer to the subscribe call: an error ends this connection.
            if let Some(error) = body.get("error") {
                return Err(format!("the subscription was refused: {error}"));
            }
            continue;
        }
        if body.get("method").and_then(serde_json::Value::as_str) == Some(subscription.notification)
        {
            wake.notify_one();
        }
    }
    Ok(())
}

/// An error text with the URL (which may hold a key) replaced by its redacted form.
fn redact_error(text: &str, url: &str) -> String {
    text.replace(url, &redact_url(url))
}
