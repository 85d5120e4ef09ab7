//! A router over a fresh SQLite store, users with keys, and a request helper.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_core::filter_values::FilterValuesListener;
use sluice_store::{Identity, MetadataStore, SqliteStore};
use tower::ServiceExt;

pub struct Harness {
    pub store: Arc<dyn MetadataStore>,
    pub clock: Arc<ManualClock>,
    state: AppState,
    _dir: tempfile::TempDir,
}

/// A user and its key.
#[derive(Clone)]
pub struct User {
    pub key: String,
    pub identity: Identity,
}

impl User {
    pub fn id(&self) -> &str {
        &self.identity.user.id
    }

    pub fn team(&self) -> &str {
        &self.identity.team.id
    }
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_limits(Limits::default()).await
    }

    pub async fn with_limits(limits: Limits) -> Self {
        Self::with_sets(false, limits).await
    }

    /// A harness whose set-filter values live in the Redis server `scripts/test` starts
    /// (`SLUICE_TEST_REDIS_URL`, a key prefix of its own) when `redis`, else in the store.
    pub async fn with_sets(redis: bool, limits: Limits) -> Self {
        let url = redis.then(|| {
            let url = std::env::var("SLUICE_TEST_REDIS_URL")
                .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
            format!("{url}?prefix=t{}", sluice_core::ids::new_id().replace('-', ""))
        });
        Self::with_set_store(url.as_deref(), limits).await
    }

    /// A harness whose set-filter values live in the Redis `sets` names (`None`: the store).
    pub async fn with_set_store(sets: Option<&str>, limits: Limits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let mut sqlite = SqliteStore::open(&url).await.unwrap();
        if let Some(sets) = sets {
            let sets = sluice_store::RedisSets::connect(sets).await.unwrap();
            sqlite = sqlite.with_redis_sets(Arc::new(sets));
        }
        let store: Arc<dyn MetadataStore> = Arc::new(sqlite);
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()));
        let keyring = sluice_store::secrets::Keyring::new(
            sluice_store::secrets::SecretsKey::generate().unwrap(),
            Vec::new(),
        );
        let secrets = sluice_store::Secrets::new(store.clone(), keyring);
        // Every change of a pipeline takes its turn from the runtime's lifecycle owner.
        let log = Arc::new(
            sluice_bus::EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap(),
        );
        let sink_env = sluice_runtime::SinkEnv { secrets: Some(secrets.clone()), egress: None };
        let runtime = sluice_runtime::Runtime::builder(
            store.clone(),
            log,
            Arc::new(Catalog::default()),
            clock.clone(),
        )
        .sinks(sink_env)
        .start()
        .await
        .unwrap();
        let state = AppState::new(store.clone(), Catalog::default(), clock.clone(), limits)
            .with_sinks(secrets, None)
            .with_runtime(runtime);
        Self { store, clock, state, _dir: dir }
    }

    /// A harness whose filter-value changes go to `listener`.
    pub async fn with_listener(listener: Arc<dyn FilterValuesListener>) -> Self {
        let mut harness = Self::new().await;
        harness.state = harness.state.with_filter_listener(listener);
        harness
    }

    /// A harness whose price endpoints serve what arrives in `slot`.
    pub async fn with_price_slot(slot: sluice_api::PriceSlot) -> Self {
        let mut harness = Self::new().await;
        harness.state = harness.state.with_price_slot(slot);
        harness
    }

    /// A harness whose `GET /api/v1/chains` and `/metrics` show `chains`.
    pub async fn with_chains(chains: Arc<dyn sluice_api::chains::ChainStatusSource>) -> Self {
        let mut harness = Self::new().await;
        harness.state = harness.state.with_chains(chains);
        harness
    }

    /// This harness, with `chains` as its chain ingesters (whose heads filter-value changes
    /// are recorded at).
    #[must_use]
    pub fn showing_chains(
        mut self,
        chains: Arc<dyn sluice_api::chains::ChainStatusSource>,
    ) -> Self {
        self.state = self.state.with_chains(chains);
        self
    }

    /// A harness whose dataset changes go to `listener`.
    pub async fn with_dataset_listener(
        listener: Arc<dyn sluice_core::datasets::DatasetListener>,
    ) -> Self {
        let mut harness = Self::new().await;
        harness.state = harness.state.with_dataset_listener(listener);
        harness
    }

    /// The runtime whose lifecycle owners every change of a pipeline goes through.
    pub fn runtime(&self) -> Arc<sluice_runtime::Runtime> {
        self.state.runtime.clone().expect("a harness runs a runtime")
    }

    pub async fn user(&self, org: &str, team: &str, name: &str) -> User {
        let identity = self.store.ensure_identity(org, team, name, false).await.unwrap();
        let key = sluice_api::auth::issue_key(self.store.as_ref(), &identity.user.id, None)
            .await
            .unwrap()
            .unwrap();
        User { key, identity }
    }

    /// Sends a request; `body` is JSON unless it is a `Value::String`, sent raw.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(key) = key {
            request = request.header("X-API-Key", key);
        }
        let body = match body {
            None => Body::empty(),
            Some(Value::String(raw)) => Body::from(raw),
            Some(value) => {
                request = request.header("content-type", "application/json");
                Body::from(value.to_string())
            }
        };
        let response =
            sluice_api::app(self.state.clone()).oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    /// `GET path` as `user`: the status and the value of response header `header`.
    pub async fn get_header(
        &self,
        path: &str,
        user: &User,
        header: &str,
    ) -> (StatusCode, Option<String>) {
        let request = Request::builder()
            .uri(path)
            .header("X-API-Key", &user.key)
            .body(Body::empty())
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let value = response.headers().get(header).map(|v| v.to_str().unwrap().to_owned());
        (response.status(), value)
    }

    pub async fn get(&self, path: &str, user: &User) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(&user.key), None).await
    }

    pub async fn post(&self, path: &str, user: &User, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(&user.key), Some(body)).await
    }

    pub async fn put(&self, path: &str, user: &User, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(&user.key), Some(body)).await
    }

    pub async fn delete(&self, path: &str, user: &User) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, Some(&user.key), None).await
    }

    /// Creates `body` as `user`, asserting success; returns the record.
    pub async fn create(&self, user: &User, body: Value) -> Value {
        let (status, created) = self.post("/api/v1/beam", user, body).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        created
    }
}

/// A valid create body.
pub fn pipeline_body(name: &str) -> Value {
    json!({
        "name": name,
        "description": "USDC transfers on Base",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "filter_expr": "root = this.token_address"}],
            "sinks": [{"type": "kafka", "name": "usdc-transfers"}]
        }
    })
}
