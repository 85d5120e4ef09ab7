//! The cross-tenant matrix: every route of the OpenAPI document, called by a user of another
//! organization and by a user of the same organization without a grant, with the ids of a
//! tenant that owns one resource of every kind. Per-resource routes must answer exactly as they
//! do for ids that do not exist (404, existence not revealed); the other routes must not
//! mention anything of the tenant's. Nothing the tenant owns may change.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::EmbeddedLog;
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_runtime::Runtime;
use sluice_runtime::datasets::DatasetIndex;
use sluice_store::{Identity, MetadataStore, SqliteStore};
use tower::ServiceExt;

use crate::pipeline_stack::{USDC, key_for, settings, settle, transfer};

/// Routes left out of the matrix, with the reason.
/// The name and value of Alice's organization's secret: nobody ever sees the value; only
/// members of her organization see the name.
const ALPHA_SECRET_NAME: &str = "ALPHA_ORG_SECRET";
const ALPHA_SECRET_VALUE: &str = "alpha-secret-value-9c1f";

const ORG_SCOPED: &str = "organization-scoped (a colleague reads it by design); another organization's 404 is covered by backfills::jobs_are_listed_per_organization_and_cancel_answers_409_once_ended";

const NOT_IN_MATRIX: [(&str, &str, &str); 5] = [
    (
        "get",
        "/metrics",
        "operator endpoint; its access and per-tenant labels are covered by the stats tests",
    ),
    ("get", "/api/v1/beam/backfills/{job_id}", ORG_SCOPED),
    ("post", "/api/v1/beam/backfills/{job_id}/cancel", ORG_SCOPED),
    ("get", "/api/v1/beam/backfills/{job_id}/sinks/{sink_uid}/records", ORG_SCOPED),
    (
        "get",
        "/api/v1/events/stream",
        "a live stream that never ends; it filters with the list's code (GET /api/v1/events, in the matrix), and sluice's events tests stream another organization's view end to end",
    ),
];

pub struct Tenant {
    pub key: String,
    pub identity: Identity,
}

pub struct World {
    _dir: tempfile::TempDir,
    pub log: Arc<EmbeddedLog>,
    _runtime: Arc<Runtime>,
    state: AppState,
    pub operator: String,
    pub alice: Tenant,
    /// Another organization.
    bob: Tenant,
    /// Alice's organization, another team, no grant on anything of hers.
    carol: Tenant,
}

/// What Alice owns, and ids of the same kinds that no longer exist.
pub struct Owned {
    pipeline: String,
    dataset: String,
    dataset_name: String,
    ghost_pipeline: String,
    ghost_dataset: String,
    ghost_dataset_name: String,
    /// Every id, name and value of Alice's that another tenant must never read.
    secrets: Vec<String>,
}

impl World {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let runtime = Runtime::builder(
            store.clone(),
            log.clone(),
            Arc::new(Catalog::default()),
            clock.clone(),
        )
        .settings(settings())
        .events(sluice_runtime::events::Recorder::start(
            store.clone(),
            clock.clone(),
            sluice_runtime::events::EventSettings::default(),
        ))
        .start()
        .await
        .unwrap();
        let datasets = Arc::new(DatasetIndex::load(store.as_ref()).await.unwrap());
        runtime.use_datasets(datasets.clone());
        let price_store = sluice_store::open_prices(&url).await.unwrap();
        let prices = sluice_prices::PriceService::start(
            price_store,
            clock.clone(),
            sluice_prices::PriceSettings::default(),
        )
        .await
        .unwrap();
        let keyring = sluice_store::secrets::Keyring::new(
            sluice_store::secrets::SecretsKey::generate().unwrap(),
            Vec::new(),
        );
        let secrets = sluice_store::Secrets::new(store.clone(), keyring);
        let catalog = Arc::new(Catalog::default());
        let warehouse =
            sluice_backfill::warehouse::Warehouse::open(&dir.path().join("warehouse")).unwrap();
        let backfills = sluice_backfill::jobs::Backfills::new(
            store.clone(),
            warehouse,
            log.clone(),
            catalog,
            clock.clone(),
            Arc::new(
                sluice_backfill::storage::LocalStorage::new(&dir.path().join("staging")).unwrap(),
            ),
            sluice_runtime::SinkEnv { secrets: Some(secrets.clone()), egress: None },
            sluice_backfill::jobs::BackfillSettings::default(),
        );
        let state =
            AppState::new(store.clone(), Catalog::default(), clock.clone(), Limits::default())
                .with_runtime(runtime.clone())
                .with_dataset_listener(datasets)
                .with_prices(prices)
                .with_sinks(secrets.clone(), None)
                .with_backfills(backfills);
        let operator = key_for(store.as_ref(), "sluice", "ops", "admin", true).await;
        let tenant = |org: &'static str, team: &'static str, user: &'static str| {
            let store = store.clone();
            async move {
                let identity = store.ensure_identity(org, team, user, false).await.unwrap();
                let key = sluice_api::auth::issue_key(store.as_ref(), &identity.user.id, None)
                    .await
                    .unwrap()
                    .unwrap();
                Tenant { key, identity }
            }
        };
        let alice = tenant("tenant-alpha", "alpha-team", "alice").await;
        let bob = tenant("tenant-bravo", "bravo-team", "bob").await;
        let carol = tenant("tenant-alpha", "carol-team", "carol").await;
        // An organization secret of Alice's organization (set by its admins).
        let value = sluice_core::secret::SecretValue::new(ALPHA_SECRET_VALUE.to_owned());
        secrets.put(&alice.identity.org.id, ALPHA_SECRET_NAME, &value).await.unwrap();
        Self { _dir: dir, log, _runtime: runtime, state, operator, alice, bob, carol }
    }

    /// Sends a request; returns the status and the raw body text.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, String) {
        let mut request = Request::builder().method(method).uri(path).header("X-API-Key", key);
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(body.map_or_else(Body::empty, Body::from)).unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A call of Alice's that must succeed; its JSON answer.
    async fn alice(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, text) = self
            .call(method.clone(), path, &self.alice.key, body.map(|b| b.to_string().into_bytes()))
            .await;
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Alice's pipeline with a set filter, a script that logs, marks and dead-letters, and a
    /// managed sink; filter values; a dataset with entries; the pipeline deployed with records
    /// in its sink, a dead letter and log lines. Plus a pipeline and a dataset made and deleted
    /// again, whose ids are the "does not exist" reference.
    #[allow(
        clippy::too_many_lines,
        reason = "one resource of every kind, made in the order they depend on each other; the probes name them all"
    )]
    pub async fn alice_owns_one_of_everything(&self) -> Owned {
        let script = "function transform(r) {\n  console.log('alpha-log-marker ' + r.n);\n  if (r.n === 13) throw new Error('alpha-deadletter-marker');\n  r.marker = 'alpha-sink-marker';\n  return r;\n}";
        let body = json!({
            "name": "alpha-secret-pipeline",
            "description": "alpha-secret-description",
            "tags": ["alpha-secret-tag"],
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": [
                    {"type": "redis_set_filter", "uid": "tf-alpha-set",
                     "filter_expr": "root = this.token_address", "set_values": [USDC]},
                    {"type": "v8", "uid": "tf-alpha-script", "script": script}
                ],
                "sinks": [{"type": "kafka", "uid": "sk-alpha", "name": "alpha-sink-name"}]
            }
        });
        let created = self.alice(Method::POST, "/api/v1/beam", Some(body.clone())).await;
        let pipeline = created["id"].as_str().unwrap().to_owned();
        let values = format!("/api/v1/beam/{pipeline}/transforms/tf-alpha-set/filter-values");
        let values_body = json!({"values": ["alpha-filter-value-1", "alpha-filter-value-2"]});
        self.alice(Method::POST, &values, Some(values_body)).await;
        let dataset = self
            .alice(
                Method::POST,
                "/api/v1/beam/datasets",
                Some(json!({"name": "alpha-secret-dataset"})),
            )
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let entries = format!("/api/v1/beam/datasets/{dataset}/entries");
        self.alice(
            Method::POST,
            &entries,
            Some(json!({"values": ["alpha-entry-1", "alpha-entry-2"]})),
        )
        .await;
        self.alice(Method::POST, &format!("/api/v1/beam/{pipeline}/deploy"), Some(json!({}))).await;

        let ndjson: String = (1..=15).map(|n| transfer(n, USDC).to_string() + "\n").collect();
        let (status, text) = self
            .call(
                Method::POST,
                "/api/v1/streams/base/erc20_token_transfer/records",
                &self.operator,
                Some(ndjson.into_bytes()),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        settle(self.log.as_ref(), &pipeline).await;
        let records = self
            .alice(
                Method::GET,
                &format!("/api/v1/beam/{pipeline}/sinks/sk-alpha/records?limit=100"),
                None,
            )
            .await;
        assert_eq!(records["records"].as_array().unwrap().len(), 14, "{records}");
        let letters =
            self.alice(Method::GET, &format!("/api/v1/beam/{pipeline}/dead-letters"), None).await;
        assert_eq!(letters["dead_letters"].as_array().unwrap().len(), 1, "{letters}");
        let logs = self.alice(Method::GET, &format!("/api/v1/beam/{pipeline}/logs"), None).await;
        assert!(!logs["logs"].as_array().unwrap().is_empty(), "{logs}");

        let ghost = self.alice(Method::POST, "/api/v1/beam", Some(body)).await;
        let ghost_pipeline = ghost["id"].as_str().unwrap().to_owned();
        self.alice(Method::DELETE, &format!("/api/v1/beam/{ghost_pipeline}"), None).await;
        let ghost_dataset_name = "alpha-deleted-dataset".to_owned();
        let ghost_dataset = self
            .alice(Method::POST, "/api/v1/beam/datasets", Some(json!({"name": ghost_dataset_name})))
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        self.alice(Method::DELETE, &format!("/api/v1/beam/datasets/{ghost_dataset}"), None).await;

        let mut secrets: Vec<String> = [
            "alpha-secret-pipeline",
            "alpha-secret-description",
            "alpha-secret-tag",
            "tf-alpha-set",
            "tf-alpha-script",
            "sk-alpha",
            "alpha-sink-name",
            "alpha-filter-value",
            "alpha-secret-dataset",
            "alpha-entry",
            "alpha-log-marker",
            "alpha-deadletter-marker",
            "alpha-sink-marker",
            "alpha-team",
            "alice",
            ALPHA_SECRET_VALUE,
        ]
        .map(str::to_owned)
        .to_vec();
        secrets.extend([
            pipeline.clone(),
            dataset.clone(),
            self.alice.key.clone(),
            self.alice.identity.user.id.clone(),
            self.alice.identity.team.id.clone(),
        ]);
        Owned {
            pipeline,
            dataset,
            dataset_name: "alpha-secret-dataset".to_owned(),
            ghost_pipeline,
            ghost_dataset,
            ghost_dataset_name,
            secrets,
        }
    }

    /// Everything Alice can read about what she owns, to compare before and after.
    pub async fn alice_view(&self, owned: &Owned) -> BTreeMap<String, Value> {
        let id = &owned.pipeline;
        let dataset = &owned.dataset;
        let mut view = BTreeMap::new();
        for path in [
            "/api/v1/beam".to_owned(),
            format!("/api/v1/beam/{id}"),
            format!("/api/v1/beam/{id}/permissions"),
            format!("/api/v1/beam/{id}/transforms/tf-alpha-set/filter-values?count=100"),
            format!("/api/v1/beam/{id}/sinks/sk-alpha/records?offset=0&limit=100"),
            format!("/api/v1/beam/{id}/dead-letters?offset=0"),
            format!("/api/v1/beam/{id}/deploy/stats"),
            "/api/v1/beam/datasets".to_owned(),
            format!("/api/v1/beam/datasets/{dataset}/entries"),
        ] {
            let value = self.alice(Method::GET, &path, None).await;
            view.insert(path, value);
        }
        view
    }
}

/// How a route is expected to answer another tenant.
pub enum Expect {
    /// Addresses one of Alice's resources: exactly the answer for an id that does not exist.
    NotFound,
    /// Not about one resource: this status, and nothing of Alice's in the answer.
    Status(StatusCode),
}

/// One matrix entry: the request (path with Alice's ids filled in, query, body) and what
/// another tenant must get.
pub struct Probe {
    pub path: String,
    pub body: Option<String>,
    expect: Expect,
}

/// The probe of `(method, template)` for caller `who`, or `None` when the matrix lacks it.
#[allow(
    clippy::too_many_lines,
    reason = "one match over every route of the API: the matrix reads best as one table"
)]
pub fn probe(method: &str, template: &str, owned: &Owned, who: &str) -> Option<Probe> {
    use Expect::{NotFound, Status};
    let pipeline_body = json!({
        "name": format!("{who}-pipeline"), "description": "the caller's own",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-own",
                            "filter_expr": "root = this.token_address"}],
            "sinks": [{"type": "kafka", "uid": "sk-own", "name": "own"}]
        }
    })
    .to_string();
    let values = json!({"values": [format!("{who}-value")]}).to_string();
    let (query, body, expect): (&str, Option<String>, Expect) = match (method, template) {
        ("post", "/api/v1/beam") => ("", Some(pipeline_body), Status(StatusCode::OK)),
        ("get", "/api/v1/beam") => ("", None, Status(StatusCode::OK)),
        ("get", "/api/v1/beam/sources") => ("", None, Status(StatusCode::OK)),
        ("get", "/api/v1/beam/{config_id}") => ("", None, NotFound),
        ("put", "/api/v1/beam/{config_id}") => ("", Some(pipeline_body), NotFound),
        ("delete", "/api/v1/beam/{config_id}") => ("", None, NotFound),
        ("get", "/api/v1/beam/{config_id}/permissions") => ("", None, NotFound),
        ("put", "/api/v1/beam/{config_id}/permissions") => {
            let grants = json!({"editors": [], "readers": [], "viewer_teams": []});
            ("", Some(grants.to_string()), NotFound)
        }
        ("put", "/api/v1/beam/{config_id}/transforms") => {
            let list = json!([{"type": "redis_set_filter", "uid": "tf-own",
                               "filter_expr": "root = this.from_address"}]);
            ("", Some(list.to_string()), NotFound)
        }
        ("patch", "/api/v1/beam/{config_id}/transforms/{transform_uid}") => {
            let one =
                json!({"type": "redis_set_filter", "filter_expr": "root = this.from_address"});
            ("", Some(one.to_string()), NotFound)
        }
        ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values") => {
            ("?count=100", None, NotFound)
        }
        (
            "post" | "put" | "delete",
            "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values",
        ) => ("", Some(values), NotFound),
        ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/check") => {
            ("?value=alpha-filter-value-1", None, NotFound)
        }
        ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/count") => {
            ("", None, NotFound)
        }
        ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/changes") => {
            ("?count=10&values=true", None, NotFound)
        }
        (
            "post",
            "/api/v1/beam/{config_id}/deploy"
            | "/api/v1/beam/{config_id}/pause"
            | "/api/v1/beam/{config_id}/teardown",
        ) => ("", Some("{}".to_owned()), NotFound),
        ("get", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records") => {
            ("?offset=0&limit=100", None, NotFound)
        }
        ("get", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream") => ("", None, NotFound),
        ("get", "/api/v1/beam/{config_id}/dead-letters") => ("?offset=0", None, NotFound),
        ("post", "/api/v1/beam/{config_id}/dead-letters/replay") => {
            ("", Some("{}".to_owned()), NotFound)
        }
        ("get", "/api/v1/beam/{config_id}/logs") => ("?limit=100", None, NotFound),
        ("get", "/api/v1/beam/{config_id}/deploy/stats") => ("", None, NotFound),
        ("get", "/api/v1/beam/{config_id}/deploy/metrics") => ("", None, NotFound),
        ("post", "/api/v1/streams/{chain}/{entity}/records") => {
            // Only operators ingest; chain streams belong to no tenant.
            let record = transfer(99, USDC).to_string() + "\n";
            ("", Some(record), Status(StatusCode::FORBIDDEN))
        }
        ("post", "/api/v1/beam/datasets") => {
            let named = json!({"name": format!("{who}-dataset")});
            ("", Some(named.to_string()), Status(StatusCode::OK))
        }
        ("get", "/api/v1/beam/datasets") => ("", None, Status(StatusCode::OK)),
        ("delete", "/api/v1/beam/datasets/{dataset_id}") => ("", None, NotFound),
        ("get", "/api/v1/beam/datasets/{dataset_id}/entries") => ("?limit=100", None, NotFound),
        ("post" | "delete", "/api/v1/beam/datasets/{dataset_id}/entries") => {
            ("", Some(values), NotFound)
        }
        ("post", "/api/v1/beam/datasets/entries") => {
            // Names are per user: Alice's dataset name names nothing of the caller's.
            let named = json!({"name": owned.dataset_name, "values": [format!("{who}-value")]});
            ("", Some(named.to_string()), NotFound)
        }
        ("get", "/api/v1/beam/datasets/{dataset_id}/entries/check") => {
            ("?value=alpha-entry-1", None, NotFound)
        }
        ("get", "/api/v1/me") => ("", None, Status(StatusCode::OK)),
        // Backfills: the caller's own organization's jobs and the (shared) warehouse tables.
        ("post", "/api/v1/beam/backfills") => {
            let job = json!({
                "job_name": format!("{who}-job"),
                "table": "base.assets.erc20_token_transfers",
                "backfill_window": {"partition_key": "block_timestamp",
                                    "start": "2026-11-21T00:00:00Z", "end": "2026-11-21T01:00:00Z"},
                "destinations": [{"type": "kafka", "name": format!("{who}-out")}],
            });
            ("", Some(job.to_string()), Status(StatusCode::OK))
        }
        ("get", "/api/v1/beam/backfills" | "/api/v1/beam/backfills/tables") => {
            ("", None, Status(StatusCode::OK))
        }
        // Only operators import into the (shared) warehouse.
        ("post", "/api/v1/warehouse/tables/{table}/rows") => {
            let record = transfer(77, USDC).to_string() + "\n";
            ("", Some(record), Status(StatusCode::FORBIDDEN))
        }
        // The caller's own organization's secrets; ordinary members never write them.
        ("get", "/api/v1/beam/secrets") => ("", None, Status(StatusCode::OK)),
        ("put", "/api/v1/beam/secrets/{name}") => {
            let value = json!({"value": format!("{who}-value")});
            ("", Some(value.to_string()), Status(StatusCode::FORBIDDEN))
        }
        ("delete", "/api/v1/beam/secrets/{name}") => ("", None, Status(StatusCode::FORBIDDEN)),
        // The server's chain ingesters (none here) belong to no tenant.
        ("get", "/api/v1/chains") => ("", None, Status(StatusCode::OK)),
        // The cluster's nodes list every tenant's workers: operators only.
        ("get", "/api/v1/nodes") => ("", None, Status(StatusCode::FORBIDDEN)),
        // Events: what the caller may see (nothing of Alice's pipelines); notification
        // destinations are org admins'; chain thresholds anyone reads, operators set.
        ("get", "/api/v1/events" | "/api/v1/events/pipelines") => {
            ("", None, Status(StatusCode::OK))
        }
        ("get", "/api/v1/notifications") => ("", None, Status(StatusCode::FORBIDDEN)),
        ("put", "/api/v1/notifications") => {
            ("", Some(r#"{"destinations": []}"#.to_owned()), Status(StatusCode::FORBIDDEN))
        }
        ("get", "/api/v1/beam/{config_id}/thresholds") => ("", None, NotFound),
        ("put", "/api/v1/beam/{config_id}/thresholds") => {
            ("", Some(r#"{"data_age_warning_seconds": 100}"#.to_owned()), NotFound)
        }
        ("get", "/api/v1/chains/{chain}/thresholds") => ("", None, Status(StatusCode::OK)),
        ("put", "/api/v1/chains/{chain}/thresholds") => {
            ("", Some(r#"{"stall_seconds": 10}"#.to_owned()), Status(StatusCode::FORBIDDEN))
        }
        ("post", "/api/v1/developer/prices") => {
            let tokens = json!([{"chain": "base", "token_address": USDC}]);
            ("", Some(tokens.to_string()), Status(StatusCode::OK))
        }
        ("post", "/api/v1/developer/prices/history") => {
            let history = json!({
                "addresses": [{"chain": "base", "token_address": USDC}],
                "time_granularity": "1h",
                "start_timestamp": "2026-11-21T10:00:00Z",
                "end_timestamp": "2026-11-21T12:00:00Z",
            });
            ("", Some(history.to_string()), Status(StatusCode::OK))
        }
        ("get", "/healthz" | "/readyz" | "/api/v1/openapi.json" | "/docs") => {
            ("", None, Status(StatusCode::OK))
        }
        _ => return None,
    };
    let path = template
        .replace("{config_id}", &owned.pipeline)
        .replace("{transform_uid}", "tf-alpha-set")
        .replace("{sink_uid}", "sk-alpha")
        .replace("{dataset_id}", &owned.dataset)
        .replace("{chain}", "base")
        .replace("{entity}", "erc20_token_transfer")
        .replace("{name}", ALPHA_SECRET_NAME)
        .replace("{table}", "base.assets.erc20_token_transfers");
    Some(Probe { path: path + query, body, expect })
}

/// The same request about things that do not exist: Alice's ids swapped for the ghosts'.
fn ghostly(text: &str, owned: &Owned) -> String {
    text.replace(&owned.pipeline, &owned.ghost_pipeline)
        .replace(&owned.dataset, &owned.ghost_dataset)
        .replace(&owned.dataset_name, &owned.ghost_dataset_name)
}

/// Secrets of Alice's in `answer` that the caller did not send itself in `request`.
fn leaked<'a>(answer: &str, request: &str, secrets: &'a [String]) -> Vec<&'a str> {
    let (answer, request) = (answer.to_lowercase(), request.to_lowercase());
    secrets
        .iter()
        .map(String::as_str)
        .filter(|s| answer.contains(&s.to_lowercase()) && !request.contains(&s.to_lowercase()))
        .collect()
}

/// Every documented `(method, path)`.
pub fn documented_routes() -> Vec<(String, String)> {
    let doc = serde_json::to_value(sluice_api::openapi()).unwrap();
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                routes.push((method.clone(), path.clone()));
            }
        }
    }
    // Deletions last, so that a delete that wrongly succeeded cannot hide what the other
    // routes would have shown.
    routes.sort_by(|a, b| (a.0 == "delete", a).cmp(&(b.0 == "delete", b)));
    routes
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: every route probed as another tenant, then everything checked unchanged"
)]
async fn no_route_reveals_or_changes_another_tenants_resources() {
    let world = World::new().await;
    let owned = world.alice_owns_one_of_everything().await;
    let before = world.alice_view(&owned).await;

    let routes = documented_routes();
    let unmatched: Vec<&(String, String)> = routes
        .iter()
        .filter(|(m, p)| {
            probe(m, p, &owned, "x").is_none()
                && !NOT_IN_MATRIX.iter().any(|(nm, np, _)| nm == m && np == p)
        })
        .collect();
    assert!(unmatched.is_empty(), "routes without a cross-tenant matrix entry: {unmatched:?}");
    for (method, path, _) in NOT_IN_MATRIX {
        assert!(
            routes.iter().any(|(m, p)| m == method && p == path),
            "{method} {path} is excluded from the matrix but is no longer a route"
        );
    }

    let mut requests = 0usize;
    let mut probed = 0usize;
    let mut failures = Vec::new();
    // The other organization first, then the colleague without a grant, who shares the
    // organization (its id is no secret to them).
    let org_id = world.alice.identity.org.id.clone();
    let colleague_secrets: Vec<String> =
        owned.secrets.iter().filter(|s| **s != org_id).cloned().collect();
    let mut outsider_secrets = owned.secrets.clone();
    outsider_secrets.push(org_id);
    outsider_secrets.push(ALPHA_SECRET_NAME.to_owned());
    let callers =
        [("bob", &world.bob, &outsider_secrets), ("carol", &world.carol, &colleague_secrets)];
    for (who, caller, secrets) in callers {
        for (method, template) in &routes {
            let Some(probe) = probe(method, template, &owned, who) else { continue };
            let http_method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let sent = format!("{} {}", probe.path, probe.body.clone().unwrap_or_default());
            let (status, answer) = world
                .call(
                    http_method.clone(),
                    &probe.path,
                    &caller.key,
                    probe.body.clone().map(String::into_bytes),
                )
                .await;
            requests += 1;
            probed += 1;
            let route = format!("{who}: {method} {template}");
            let leaks = leaked(&answer, &sent, secrets);
            if !leaks.is_empty() {
                failures.push(format!("{route}: answer mentions {leaks:?}: {status} {answer}"));
            }
            match probe.expect {
                Expect::NotFound => {
                    let (ghost_status, ghost_answer) = world
                        .call(
                            http_method,
                            &ghostly(&probe.path, &owned),
                            &caller.key,
                            probe.body.as_deref().map(|b| ghostly(b, &owned).into_bytes()),
                        )
                        .await;
                    requests += 1;
                    if status != StatusCode::NOT_FOUND {
                        failures.push(format!("{route}: {status} {answer}, want 404"));
                    } else if (status, ghostly(&answer, &owned))
                        != (ghost_status, ghost_answer.clone())
                    {
                        failures.push(format!(
                            "{route}: answers {status} {answer} for an existing resource but \
                             {ghost_status} {ghost_answer} for a missing one"
                        ));
                    }
                }
                Expect::Status(want) => {
                    if status != want {
                        failures.push(format!("{route}: {status} {answer}, want {want}"));
                    }
                }
            }
        }
        // Listing by name: Alice's dataset name finds nothing of the caller's.
        let path = format!("/api/v1/beam/datasets?names={}", owned.dataset_name);
        let (status, answer) = world.call(Method::GET, &path, &caller.key, None).await;
        requests += 1;
        if (status, answer.as_str()) != (StatusCode::OK, "[]") {
            failures.push(format!("{who}: GET {path}: {status} {answer}, want 200 []"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} cross-tenant failures:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let after = world.alice_view(&owned).await;
    for (path, value) in &before {
        assert_eq!(&after[path], value, "{path} changed after the other tenants' calls");
    }
    eprintln!(
        "cross-tenant matrix: {} routes ({} excluded), {probed} probes by 2 callers, {requests} \
         requests, 0 leaks, 0 changes",
        routes.len() - NOT_IN_MATRIX.len(),
        NOT_IN_MATRIX.len(),
    );
}
