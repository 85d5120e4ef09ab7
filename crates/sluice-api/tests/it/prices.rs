//! Token prices end to end: trades are posted to the ingest endpoint, the price consumer
//! counts them from the stream log, and the price endpoints answer under the rules of
//! docs/contract.md §Token price endpoints.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{DateTime, TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::{EmbeddedLog, StreamLog};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_core::prices::{Granularity, TokenRef};
use sluice_prices::{ConsumerSettings, PriceService, PriceSettings};
use sluice_runtime::{Runtime, RuntimeSettings};
use sluice_store::prices::PriceStore;
use sluice_store::{MetadataStore, SqliteStore};
use tower::ServiceExt;

const USDC: &str = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";
const WETH: &str = "0x4200000000000000000000000000000000000006";
const AERO: &str = "0x940181a94a35a4569e4529a3cdfb74e38fd98631";

pub(crate) struct Stack {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    log: Arc<EmbeddedLog>,
    _runtime: Arc<Runtime>,
    prices: Arc<PriceService>,
    price_store: Arc<dyn PriceStore>,
    consumer: tokio::task::JoinHandle<()>,
    state: AppState,
    operator: String,
    user: String,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.consumer.abort();
    }
}

/// 2026-11-21T12:00:00Z, when every test starts.
fn noon() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()
}

/// `noon() + seconds`, as a record's `block_timestamp`.
fn at(seconds: i64) -> String {
    (noon() + chrono::Duration::seconds(seconds)).to_rfc3339()
}

/// `noon() + seconds` as the API writes times.
fn api_time(seconds: i64) -> String {
    sluice_core::time::format(noon() + chrono::Duration::seconds(seconds))
}

async fn key_for(store: &dyn MetadataStore, user: &str, operator: bool) -> String {
    let identity = store.ensure_identity("acme", "data", user, operator).await.unwrap();
    sluice_api::auth::issue_key(store, &identity.user.id, None).await.unwrap().unwrap()
}

impl Stack {
    pub(crate) async fn new() -> Self {
        Self::with_page(PriceSettings::default().history_page_points).await
    }

    async fn with_page(history_page_points: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(noon()));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let catalog = Catalog::default();
        let runtime =
            Runtime::builder(store.clone(), log.clone(), Arc::new(catalog.clone()), clock.clone())
                .settings(RuntimeSettings::default())
                .start()
                .await
                .unwrap();
        let price_store = sluice_store::open_prices(&url).await.unwrap();
        let prices = PriceService::start(
            price_store.clone(),
            clock.clone(),
            PriceSettings { history_page_points },
        )
        .await
        .unwrap();
        let consumer = sluice_prices::spawn_consumer(
            prices.clone(),
            log.clone(),
            sluice_prices::trade_topics(&catalog),
            ConsumerSettings {
                idle_wait: Duration::from_millis(5),
                idle_wait_max: Duration::from_millis(20),
                ..ConsumerSettings::default()
            },
        );
        let state = AppState::new(store.clone(), catalog, clock.clone(), Limits::default())
            .with_runtime(runtime.clone())
            .with_prices(prices.clone());
        let operator = key_for(store.as_ref(), "ops", true).await;
        let user = key_for(store.as_ref(), "ann", false).await;
        Self {
            _dir: dir,
            clock,
            log,
            _runtime: runtime,
            prices,
            price_store,
            consumer,
            state,
            operator,
            user,
        }
    }

    async fn call(&self, path: &str, key: Option<&str>, body: Body) -> (StatusCode, Value) {
        let mut request = Request::builder().method(Method::POST).uri(path);
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        let response =
            sluice_api::app(self.state.clone()).oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Posts `records` to `<chain>.<entity>` and waits until the price consumer counted them.
    async fn ingest_to(&self, chain: &str, entity: &str, records: &[Value]) {
        let ndjson: String = records.iter().map(|r| r.to_string() + "\n").collect();
        let path = format!("/api/v1/streams/{chain}/{entity}/records");
        let (status, body) = self.call(&path, Some(&self.operator), Body::from(ndjson)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        self.settle(&format!("{chain}.{entity}")).await;
    }

    pub(crate) async fn ingest(&self, records: &[Value]) {
        self.ingest_to("base", "dex_trade", records).await;
    }

    /// Polls until the price consumer has committed everything written to `topic`.
    async fn settle(&self, topic: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ends = self.log.offsets(topic).await.unwrap();
            let committed = self.log.committed(sluice_prices::GROUP, topic).await.unwrap();
            let caught_up = ends
                .iter()
                .enumerate()
                .all(|(p, r)| committed.get(&(p as u32)).copied().unwrap_or(0) >= r.end);
            if caught_up {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "price consumer did not catch up");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) async fn latest(&self, tokens: &[(&str, &str)], query: &str) -> (StatusCode, Value) {
        let body: Vec<Value> =
            tokens.iter().map(|(c, t)| json!({"chain": c, "token_address": t})).collect();
        let path = format!("/api/v1/developer/prices{query}");
        self.call(&path, Some(&self.user), Body::from(Value::from(body).to_string())).await
    }

    pub(crate) async fn history(&self, body: Value, cursor: Option<&str>) -> (StatusCode, Value) {
        let path = match cursor {
            None => "/api/v1/developer/prices/history".to_owned(),
            Some(cursor) => format!("/api/v1/developer/prices/history?cursor={cursor}"),
        };
        self.call(&path, Some(&self.user), Body::from(body.to_string())).await
    }

    /// The `prices` of the only item of a history answer, as `(timestamp, [price, open, high,
    /// close, low])`.
    async fn series(
        &self,
        token: &str,
        granularity: &str,
        from: i64,
        to: i64,
    ) -> Vec<(String, [f64; 5])> {
        let (status, body) =
            self.history(history_body(&[token], granularity, from, to), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["cursor"].is_null());
        let items = body["items"].as_array().unwrap();
        if items.is_empty() {
            return Vec::new();
        }
        assert_eq!(items.len(), 1, "{body}");
        points(&items[0])
    }
}

fn points(item: &Value) -> Vec<(String, [f64; 5])> {
    item["prices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let f = |k: &str| p[k].as_f64().unwrap();
            (
                p["timestamp"].as_str().unwrap().to_owned(),
                [f("price"), f("open"), f("high"), f("close"), f("low")],
            )
        })
        .collect()
}

pub(crate) fn history_body(tokens: &[&str], granularity: &str, from: i64, to: i64) -> Value {
    let addresses: Vec<Value> =
        tokens.iter().map(|t| json!({"chain": "base", "token_address": t})).collect();
    json!({
        "addresses": addresses,
        "time_granularity": granularity,
        "start_timestamp": at(from),
        "end_timestamp": at(to),
    })
}

/// A Base DEX trade of `token` at `noon() + second`: `amount` tokens for `usd` dollars.
/// `n` makes the transaction hash; the log index is 1.
pub(crate) fn trade(token: &str, second: i64, amount: &str, usd: &str, n: u64) -> Value {
    json!({
        "chain": "base",
        "token_address": token,
        "token_decimals": 6,
        "token_amount": amount,
        "usd_amount": usd,
        "pool_address": "0x0000000000000000000000000000000000000abc",
        "token_reserve": "1000",
        "block_number": 40_000_000 + n,
        "block_timestamp": at(second),
        "transaction_hash": format!("0x{n:064x}"),
        "log_index": 1,
    })
}

#[tokio::test]
async fn latest_price_is_the_vwap_and_ohlc_of_the_most_recent_completed_minute() {
    let stack = Stack::new().await;
    stack.clock.advance(chrono::Duration::seconds(30)); // 12:00:30, minute 12:00 is open
    stack
        .ingest(&[
            trade(USDC, -110, "50", "100", 1), // 11:58:10, price 2
            trade(USDC, -80, "100", "300", 2), // 11:58:40, price 3
            trade(USDC, -60, "2", "10", 3),    // 11:59:00 exactly, price 5
            trade(USDC, -30, "2", "8", 4),     // 11:59:30, price 4
            trade(USDC, 10, "10", "100", 5),   // 12:00:10 (open minute), price 10
        ])
        .await;
    let (status, body) = stack.latest(&[("base", USDC)], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["cursor"], Value::Null);
    assert_eq!(
        body["items"],
        json!([{
            "timestamp": api_time(-30), "chain": "base", "address": USDC, "decimals": 6,
            "price": 4.5, "open": 5.0, "high": 5.0, "close": 4.0, "low": 4.0,
        }])
    );

    // Once 12:00 completes, it is the latest minute.
    stack.clock.advance(chrono::Duration::seconds(30));
    let (_, body) = stack.latest(&[("base", USDC)], "").await;
    assert_eq!(body["items"][0]["price"], 10.0);
    assert_eq!(body["items"][0]["timestamp"], api_time(10));
}

#[tokio::test]
async fn without_a_trade_last_minute_the_most_recent_minute_is_returned() {
    let stack = Stack::new().await;
    stack.clock.advance(chrono::Duration::seconds(20));
    stack
        .ingest(&[
            trade(USDC, -600, "1", "1", 1), // 11:50:00
            trade(USDC, -590, "1", "3", 2), // 11:50:10
            trade(WETH, 5, "1", "3000", 3), // only in the open minute
        ])
        .await;
    let (_, body) = stack.latest(&[("base", USDC), ("base", WETH), ("base", AERO)], "").await;
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "a never-seen token has no item: {body}");
    assert_eq!(items[0]["address"], USDC);
    assert_eq!(items[0]["price"], 2.0);
    assert_eq!(items[0]["open"], 1.0);
    assert_eq!(items[0]["close"], 3.0);
    assert_eq!(items[0]["timestamp"], api_time(-590));
    assert_eq!(items[1]["address"], WETH);
    assert_eq!(items[1]["price"], 3000.0);
}

#[tokio::test]
async fn tokens_without_a_trade_in_seven_days_get_no_latest_price() {
    let stack = Stack::new().await;
    let week = 7 * 86_400;
    stack
        .ingest(&[
            trade(USDC, -week + 1, "1", "1", 1),    // just inside
            trade(WETH, -week - 1, "1", "3000", 2), // just outside
        ])
        .await;
    let (_, body) = stack.latest(&[("base", USDC), ("base", WETH)], "").await;
    let addresses: Vec<&str> =
        body["items"].as_array().unwrap().iter().map(|i| i["address"].as_str().unwrap()).collect();
    assert_eq!(addresses, vec![USDC]);
    stack.clock.advance(chrono::Duration::seconds(2));
    let (_, body) = stack.latest(&[("base", USDC)], "").await;
    assert_eq!(body["items"], json!([]));
}

#[tokio::test]
async fn decimals_come_from_the_trades_and_liquidity_sums_pool_reserves() {
    let stack = Stack::new().await;
    let mut first = trade(AERO, -90, "10", "12", 1);
    first["token_decimals"] = json!(18);
    first["token_reserve"] = json!("1000");
    let mut second = trade(AERO, -80, "10", "12", 2);
    second["token_decimals"] = json!(18);
    second["pool_address"] = json!("0x0000000000000000000000000000000000000def");
    second["token_reserve"] = json!("500.5");
    let mut no_pool = trade(WETH, -70, "1", "3000", 3);
    no_pool.as_object_mut().unwrap().remove("pool_address");
    no_pool.as_object_mut().unwrap().remove("token_reserve");
    stack.ingest(&[first, second, no_pool]).await;

    let (_, plain) = stack.latest(&[("base", AERO), ("base", WETH)], "").await;
    assert_eq!(plain["items"][0]["decimals"], 18);
    assert!(plain["items"][0].get("total_liquidity_usd").is_none(), "{plain}");
    let (status, body) =
        stack.latest(&[("base", AERO), ("base", WETH)], "?with_liquidity_info=true").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["items"][0]["price"], 1.2);
    assert_eq!(body["items"][0]["total_liquidity_usd"], (1000.0 + 500.5) * 1.2);
    assert_eq!(body["items"][1]["total_liquidity_usd"], Value::Null);
    let (status, bad) = stack.latest(&[("base", AERO)], "?with_liquidity_info=maybe").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad["detail"][0]["loc"], json!(["query", "with_liquidity_info"]));
}

#[tokio::test]
async fn duplicate_trades_count_once_and_late_trades_update_their_window() {
    let stack = Stack::new().await;
    stack.ingest(&[trade(USDC, -50, "1", "4", 1)]).await; // 11:59:10
    // The same chain, transaction and log index again, even with other amounts: ignored.
    stack.ingest(&[trade(USDC, -50, "1", "400", 1), trade(USDC, -50, "1", "400", 1)]).await;
    let series = stack.series(USDC, "1m", -120, 0).await;
    assert_eq!(series, vec![(api_time(-60), [4.0; 5])]);
    // A late trade earlier in the same minute becomes its open.
    stack.ingest(&[trade(USDC, -59, "3", "6", 2)]).await; // 11:59:01
    let series = stack.series(USDC, "1m", -120, 0).await;
    assert_eq!(series, vec![(api_time(-60), [10.0 / 4.0, 2.0, 4.0, 4.0, 2.0])]);
    let (_, latest) = stack.latest(&[("base", USDC)], "").await;
    assert_eq!(latest["items"][0]["open"], 2.0);
    assert_eq!(latest["items"][0]["price"], 2.5);
}

#[tokio::test]
async fn history_gives_exact_vwap_and_ohlc_at_every_granularity_with_boundaries() {
    let stack = Stack::new().await;
    stack.clock.advance(chrono::Duration::hours(2));
    // Trades around 11:00 (an hour, 5-minute, minute and 15-second boundary).
    stack
        .ingest(&[
            trade(USDC, -3601, "1", "1", 1), // 10:59:59
            trade(USDC, -3600, "2", "4", 2), // 11:00:00 exactly: opens the 11:00 windows
            trade(USDC, -3586, "1", "3", 3), // 11:00:14
            trade(USDC, -3585, "1", "5", 4), // 11:00:15 exactly: the next 15s window
            trade(USDC, -3540, "4", "4", 5), // 11:01:00
            trade(USDC, -3300, "1", "6", 6), // 11:05:00
        ])
        .await;
    let from = -4 * 3600;
    let to = 7200;
    assert_eq!(
        stack.series(USDC, "15s", from, to).await,
        vec![
            (api_time(-3615), [1.0; 5]),
            (api_time(-3600), [7.0 / 3.0, 2.0, 3.0, 3.0, 2.0]),
            (api_time(-3585), [5.0; 5]),
            (api_time(-3540), [1.0; 5]),
            (api_time(-3300), [6.0; 5]),
        ]
    );
    assert_eq!(
        stack.series(USDC, "1m", from, to).await,
        vec![
            (api_time(-3660), [1.0; 5]),
            (api_time(-3600), [3.0, 2.0, 5.0, 5.0, 2.0]),
            (api_time(-3540), [1.0; 5]),
            (api_time(-3300), [6.0; 5]),
        ]
    );
    assert_eq!(
        stack.series(USDC, "5m", from, to).await,
        vec![
            (api_time(-3900), [1.0; 5]),
            (api_time(-3600), [16.0 / 8.0, 2.0, 5.0, 1.0, 1.0]),
            (api_time(-3300), [6.0; 5]),
        ]
    );
    assert_eq!(
        stack.series(USDC, "1h", from, to).await,
        vec![(api_time(-7200), [1.0; 5]), (api_time(-3600), [22.0 / 9.0, 2.0, 6.0, 6.0, 1.0])]
    );
    assert_eq!(
        stack.series(USDC, "1d", -86_400, to).await,
        vec![(api_time(-12 * 3600), [23.0 / 10.0, 1.0, 6.0, 6.0, 1.0])]
    );
    // Windows whose start lies in [start, end): the 11:00 minute starts exactly at `start`,
    // the 11:05 minute exactly at `end`.
    let edges = stack.series(USDC, "1m", -3600, -3300).await;
    assert_eq!(
        edges.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(),
        vec![api_time(-3600), api_time(-3540)]
    );
    // A start inside a window leaves that window out.
    let inside = stack.series(USDC, "1m", -3599, -3300).await;
    assert_eq!(inside.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(), vec![api_time(-3540)]);
}

#[tokio::test]
async fn the_current_window_is_partial_and_empty_windows_have_no_entry() {
    let stack = Stack::new().await;
    stack.clock.advance(chrono::Duration::seconds(40));
    stack.ingest(&[trade(USDC, -170, "1", "2", 1), trade(USDC, 5, "1", "3", 2)]).await;
    let series = stack.series(USDC, "1m", -600, 60).await;
    assert_eq!(series, vec![(api_time(-180), [2.0; 5]), (api_time(0), [3.0; 5])]);
    stack.ingest(&[trade(USDC, 30, "1", "5", 3)]).await;
    let series = stack.series(USDC, "1m", -600, 60).await;
    assert_eq!(series[1], (api_time(0), [4.0, 3.0, 5.0, 5.0, 3.0]));
}

#[tokio::test]
async fn history_limits_are_422_with_messages_that_name_them() {
    let stack = Stack::new().await;
    let fifty_one: Vec<String> = (0..51).map(|i| format!("0x{i:040x}")).collect();
    let refs: Vec<&str> = fifty_one.iter().map(String::as_str).collect();
    let (status, body) = stack.history(history_body(&refs, "1m", -60, 0), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["loc"], json!(["body", "addresses"]));
    assert!(body["detail"][0]["msg"].as_str().unwrap().contains("at most 50 tokens"), "{body}");
    let (status, _) = stack.history(history_body(&refs[..50], "1m", -60, 0), None).await;
    assert_eq!(status, StatusCode::OK);

    let (status, body) = stack.history(history_body(&[USDC], "2m", -60, 0), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let msg = body["detail"][0]["msg"].as_str().unwrap();
    assert!(msg.contains("'15s', '1m', '5m', '1h' or '1d'"), "{msg}");

    for (from, to) in [(0, 0), (60, 0)] {
        let (status, body) = stack.history(history_body(&[USDC], "1m", from, to), None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(body["detail"][0]["msg"], "start_timestamp must be before end_timestamp");
    }

    let day = 86_400;
    for (granularity, days, words) in
        [("15s", 5, "5 days"), ("1m", 30, "30 days"), ("5m", 30, "30 days")]
    {
        let (status, body) =
            stack.history(history_body(&[USDC], granularity, -days * day - 1, 0), None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{granularity}");
        let msg = body["detail"][0]["msg"].as_str().unwrap();
        assert!(msg.contains(words), "{msg}");
        let (status, _) =
            stack.history(history_body(&[USDC], granularity, -days * day, 0), None).await;
        assert_eq!(status, StatusCode::OK, "{granularity} at the edge of retention");
    }
    for granularity in ["1h", "1d"] {
        let (status, _) =
            stack.history(history_body(&[USDC], granularity, -3650 * day, 0), None).await;
        assert_eq!(status, StatusCode::OK, "{granularity} keeps all history");
    }

    let (status, body) = stack
        .history(json!({"addresses": [{"chain": "base"}], "time_granularity": "1m"}), None)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let locs: Vec<&Value> = body["detail"].as_array().unwrap().iter().map(|d| &d["loc"]).collect();
    assert!(locs.contains(&&json!(["body", "addresses", 0, "token_address"])), "{body}");
    assert!(locs.contains(&&json!(["body", "start_timestamp"])), "{body}");
    assert!(locs.contains(&&json!(["body", "end_timestamp"])), "{body}");
}

#[tokio::test]
async fn latest_prices_take_at_most_200_tokens_and_need_a_key() {
    let stack = Stack::new().await;
    let tokens: Vec<String> = (0..201).map(|i| format!("0x{i:040x}")).collect();
    let pairs: Vec<(&str, &str)> = tokens.iter().map(|t| ("base", t.as_str())).collect();
    let (status, body) = stack.latest(&pairs, "").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body["detail"][0]["msg"].as_str().unwrap().contains("at most 200 tokens"), "{body}");
    let (status, body) = stack.latest(&pairs[..200], "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"items": [], "cursor": null}));
    let (status, _) = stack.call("/api/v1/developer/prices", None, Body::from("[]")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) =
        stack.call("/api/v1/developer/prices/history", Some("slk_nope"), Body::from("{}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = stack
        .call("/api/v1/developer/prices", Some(&stack.user), Body::from("{\"chain\": 1}"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn paging_neither_skips_nor_repeats_a_point() {
    let stack = Stack::with_page(3).await;
    stack.clock.advance(chrono::Duration::hours(1));
    let mut trades = Vec::new();
    for minute in 0..4 {
        trades.push(trade(USDC, minute * 60, "1", &format!("{}", minute + 1), minute as u64 + 1));
        trades.push(trade(
            WETH,
            minute * 60 + 5,
            "1",
            &format!("{}", 3000 + minute),
            minute as u64 + 100,
        ));
    }
    trades.push(trade(AERO, 30, "1", "1.2", 200));
    stack.ingest(&trades).await;
    let body = history_body(&[USDC, AERO, WETH], "1m", -60, 600);
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let (status, page) = stack.history(body.clone(), cursor.as_deref()).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        pages += 1;
        let mut on_page = 0;
        for item in page["items"].as_array().unwrap() {
            for (timestamp, _) in points(item) {
                seen.push((item["mint"].as_str().unwrap().to_owned(), timestamp));
                on_page += 1;
            }
        }
        assert!(on_page <= 3);
        match page["cursor"].as_str() {
            None => break,
            Some(next) => cursor = Some(next.to_owned()),
        }
    }
    let mut expected = Vec::new();
    for token in [USDC, AERO, WETH] {
        let minutes: &[i64] = if token == AERO { &[0] } else { &[0, 60, 120, 180] };
        for m in minutes {
            expected.push((token.to_owned(), api_time(*m)));
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(pages, 3);

    // A cursor only works with the request it came from.
    let (_, first) = stack.history(body.clone(), None).await;
    let cursor = first["cursor"].as_str().unwrap();
    let (status, error) = stack.history(history_body(&[USDC], "1m", -60, 600), Some(cursor)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(error["detail"][0]["loc"], json!(["query", "cursor"]));
    let (status, _) = stack.history(body, Some("garbage")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn the_legacy_single_token_body_is_answered_with_flat_rows() {
    let stack = Stack::new().await;
    stack.clock.advance(chrono::Duration::minutes(5));
    stack.ingest(&[trade(USDC, 10, "2", "2", 1), trade(USDC, 70, "1", "3", 2)]).await;
    let (status, body) = stack
        .history(
            json!({"chain": "base", "token_address": USDC.to_uppercase().replace("0X", "0x"),
                   "start_timestamp": at(0), "end_timestamp": at(300), "time_granularity": "1m"}),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"items": [
            {"mint": USDC, "chain": "base", "decimals": 6, "timestamp": api_time(0),
             "price": 1.0, "open": 1.0, "high": 1.0, "close": 1.0, "low": 1.0},
            {"mint": USDC, "chain": "base", "decimals": 6, "timestamp": api_time(60),
             "price": 3.0, "open": 3.0, "high": 3.0, "close": 3.0, "low": 3.0},
        ], "cursor": null})
    );
    let (status, body) = stack
        .history(
            json!({"chain": "base", "start_timestamp": at(0), "end_timestamp": at(60),
                        "time_granularity": "1m"}),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["loc"], json!(["body", "token_address"]));
}

#[tokio::test]
async fn retention_removes_old_fine_windows_and_keeps_hours() {
    let stack = Stack::new().await;
    stack.ingest(&[trade(USDC, -3600, "1", "2", 1)]).await;
    let token = TokenRef::new("base", USDC);
    let stored = |g| {
        let store = stack.price_store.clone();
        let token = token.clone();
        async move { store.history(&token, g, 0, i64::MAX, 100).await.unwrap().len() }
    };
    assert_eq!(stored(Granularity::S15).await, 1);
    stack.clock.advance(chrono::Duration::days(5));
    stack.prices.enforce_retention().await.unwrap();
    assert_eq!(stored(Granularity::S15).await, 0);
    assert_eq!(stored(Granularity::M1).await, 1);
    stack.clock.advance(chrono::Duration::days(25));
    stack.prices.enforce_retention().await.unwrap();
    assert_eq!(stored(Granularity::M1).await, 0);
    assert_eq!(stored(Granularity::M5).await, 0);
    assert_eq!(stored(Granularity::H1).await, 1);
    assert_eq!(stored(Granularity::D1).await, 1);
    // A trade older than the 30-day dedup horizon is not counted at all.
    stack.ingest(&[trade(USDC, -3000, "1", "2", 2)]).await;
    assert_eq!(stored(Granularity::H1).await, 1);
    let hours = stack.series(USDC, "1h", -7200, 0).await;
    assert_eq!(hours, vec![(api_time(-3600), [2.0; 5])]);
}

#[tokio::test]
async fn hyperliquid_trades_price_the_coin_and_solana_trades_keep_the_mint_case() {
    let stack = Stack::new().await;
    let time = (noon() - chrono::Duration::seconds(30)).timestamp_millis();
    stack
        .ingest_to(
            "hyperliquid",
            "trade",
            &[json!({"payload": {"coin": "BTC", "side": "B", "px": "97000.5", "sz": "2",
                                  "hash": format!("0x{:064x}", 9), "time": time, "tid": 1,
                                  "users": ["0x1", "0x2"]}})],
        )
        .await;
    let mint = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v";
    let mut solana = trade(mint, -30, "5", "5", 1);
    solana["chain"] = json!("solana");
    solana["transaction_hash"] = json!(
        "5VERv8NMvzbJMEkV8xnrLkEaWRtSz9CosKDYjCJjBRnbJLgp8uirBgmQpjKhoR4tjF3ZpRzrFmBV6UjKdiSZkQUW"
    );
    stack.ingest_to("solana", "dex_trade", &[solana]).await;
    let (_, body) = stack.latest(&[("hyperliquid", "BTC"), ("solana", mint)], "").await;
    assert_eq!(body["items"][0]["price"], 97000.5);
    assert_eq!(body["items"][0]["chain"], "hyperliquid");
    assert_eq!(body["items"][1]["address"], mint);
    assert_eq!(body["items"][1]["price"], 1.0);
}

#[tokio::test]
async fn a_restarted_service_loads_the_latest_minutes_from_the_store() {
    let stack = Stack::new().await;
    stack.ingest(&[trade(USDC, -30, "1", "2", 1)]).await;
    let restarted = PriceService::start(
        stack.price_store.clone(),
        stack.clock.clone(),
        PriceSettings::default(),
    )
    .await
    .unwrap();
    let latest = restarted.latest(&[TokenRef::new("base", USDC)], true);
    assert_eq!(latest.len(), 1);
    assert_eq!(latest[0].price, 2.0);
    assert_eq!(latest[0].total_liquidity_usd, Some(2000.0));
}

/// `sluice serve` answers while its price service loads: until then, and when it failed to
/// start, the price endpoints answer 503 saying which.
#[tokio::test]
async fn price_endpoints_answer_503_until_the_service_has_loaded() {
    let slot = sluice_api::PriceSlot::default();
    let harness = crate::harness::Harness::with_price_slot(slot.clone()).await;
    let user = harness.user("acme", "data", "ann").await;
    let latest = json!([{"chain": "base", "token_address": USDC}]);
    let history = json!({
        "addresses": [{"chain": "base", "token_address": USDC}],
        "time_granularity": "1m",
        "start_timestamp": "2026-11-21T11:00:00Z",
        "end_timestamp": "2026-11-21T12:00:00Z",
    });
    for (path, body) in
        [("/api/v1/developer/prices", &latest), ("/api/v1/developer/prices/history", &history)]
    {
        let (status, answer) = harness.post(path, &user, body.clone()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {answer}");
        assert_eq!(answer["detail"], "token prices are still loading; retry in a few seconds");
    }
    slot.set(Err("the price store is unreachable".to_owned())).unwrap();
    let (status, answer) = harness.post("/api/v1/developer/prices", &user, latest).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer["detail"], "token prices are unavailable: the price store is unreachable");
}
