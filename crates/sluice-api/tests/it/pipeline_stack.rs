//! What the tests of deployed pipelines share: the token addresses, runtime settings that
//! react fast, API keys, transfer records, waiting for a deployment to catch up, and a stream
//! log with injectable faults.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_bus::StreamLog;
use sluice_bus::forwarding::{Forwarding, Hooks};
use sluice_runtime::RuntimeSettings;
use sluice_store::MetadataStore;

pub const USDC: &str = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";
pub const WETH: &str = "0x4200000000000000000000000000000000000006";
pub const OTHER: &str = "0x1111111111111111111111111111111111111111";
/// The stream the tests' pipelines read.
pub const SOURCE: &str = "base.erc20_token_transfer";

/// Default settings, but idle workers look again every 20 ms and retry after 10 ms.
pub fn settings() -> RuntimeSettings {
    RuntimeSettings {
        idle_wait: Duration::from_millis(20),
        initial_backoff: Duration::from_millis(10),
        ..RuntimeSettings::default()
    }
}

/// A new API key of `user` in `org`/`team`, made if missing.
pub async fn key_for(
    store: &dyn MetadataStore,
    org: &str,
    team: &str,
    user: &str,
    operator: bool,
) -> String {
    let identity = store.ensure_identity(org, team, user, operator).await.unwrap();
    sluice_api::auth::issue_key(store, &identity.user.id, None).await.unwrap().unwrap()
}

/// A transfer record numbered `n` (its key is unique per `n`).
pub fn transfer(n: u64, token: &str) -> Value {
    json!({
        "n": n,
        "block_number": 1000 + n / 10,
        "block_timestamp": "2026-11-21T12:00:00Z",
        "transaction_hash": format!("0x{n:064x}"),
        "log_index": n % 10,
        "token_address": token,
        "from_address": OTHER,
        "to_address": OTHER,
        "amount_str": "1.5",
    })
}

/// Waits until deployment `id` has committed everything in [`SOURCE`] so far (a generous
/// deadline fails the test; it measures nothing).
pub async fn settle(log: &dyn StreamLog, id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let group = sluice_bus::topics::deployment_group(id);
    loop {
        let ends = log.offsets(SOURCE).await.unwrap();
        let committed = log.committed(&group, SOURCE).await.unwrap();
        let caught_up = ends
            .iter()
            .enumerate()
            .all(|(p, r)| committed.get(&(p as u32)).copied().unwrap_or(0) >= r.end);
        if caught_up {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "deployment did not catch up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The embedded log with the faults a test injects: reads of the source panic while `panics`
/// is above zero (each panic takes one): a worker that crashes; sink writes (the workers'
/// append-and-commit) fail while `failures` is above zero (each takes one) or while `down`:
/// a sink that is down.
pub type FaultyLog = Forwarding<Faults>;

/// The faults a [`FaultyLog`] injects (see above).
#[derive(Default)]
pub struct Faults {
    pub panics: AtomicU32,
    pub failures: AtomicU32,
    pub down: AtomicBool,
}

impl Hooks for Faults {
    fn before_read(&self, topic: &str, _partition: u32, _from: u64) {
        if topic == SOURCE
            && self
                .panics
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("injected read failure");
        }
    }

    fn before_append_and_commit(&self) -> sluice_bus::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(sluice_bus::BusError::CommitFailed("injected sink outage".to_owned()));
        }
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(sluice_bus::BusError::CommitFailed("injected sink failure".to_owned()));
        }
        Ok(())
    }
}
