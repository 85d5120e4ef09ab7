//! The `postgres` and `mysql` sinks through `sluice serve`, against the PostgreSQL and the
//! MariaDB `scripts/test` starts: exact rows, 422s at deploy, an outage held and then
//! delivered, `kill -9` five times under a steady feed with every acknowledged record in the
//! table exactly once, a reorg marker, and a backfill into the pipeline's table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::crash::{KEY, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Postgres,
    Mysql,
}

/// A database of the user's, fresh for one test, and a pool to read it.
struct UserDb {
    kind: Kind,
    url: String,
    pg: Option<sqlx::PgPool>,
    my: Option<sqlx::MySqlPool>,
}

impl UserDb {
    async fn new(kind: Kind, name: &str) -> Self {
        match kind {
            Kind::Postgres => {
                // Named `<name>_<pid>` there.
                let url = crate::process::fresh_postgres_database(name).await;
                let pg = Some(sqlx::PgPool::connect(&url).await.unwrap());
                Self { kind, url, pg, my: None }
            }
            Kind::Mysql => {
                let name = format!("{name}_{}", std::process::id());
                let server = std::env::var("SLUICE_TEST_MYSQL_URL").expect(
                    "SLUICE_TEST_MYSQL_URL must name a MySQL/MariaDB server; run scripts/test",
                );
                let admin = sqlx::MySqlPool::connect(&server).await.unwrap();
                sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"))
                    .execute(&admin)
                    .await
                    .unwrap();
                admin.close().await;
                let url = format!("{server}/{name}");
                let my = Some(sqlx::MySqlPool::connect(&url).await.unwrap());
                Self { kind, url, pg: None, my }
            }
        }
    }

    fn sink_type(&self) -> &'static str {
        match self.kind {
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
        }
    }

    /// The rows of `sql`, every column cast to text by the query.
    async fn texts(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        use sqlx::Row as _;
        match (&self.pg, &self.my) {
            (Some(pg), _) => {
                let rows = sqlx::query(sql).fetch_all(pg).await.unwrap();
                rows.iter()
                    .map(|row| (0..row.len()).map(|i| row.get::<Option<String>, _>(i)).collect())
                    .collect()
            }
            (_, Some(my)) => {
                let rows = sqlx::query(sql).fetch_all(my).await.unwrap();
                rows.iter()
                    .map(|row| (0..row.len()).map(|i| row.get::<Option<String>, _>(i)).collect())
                    .collect()
            }
            _ => unreachable!("a pool"),
        }
    }

    /// Every key in `table`, with how many rows have it (an error while the table is
    /// missing).
    async fn keys(&self, table: &str) -> Option<BTreeMap<String, usize>> {
        use sqlx::Row as _;
        let sql = match self.kind {
            Kind::Postgres => format!("SELECT \"key\" FROM {table}"),
            Kind::Mysql => format!("SELECT CAST(`key` AS CHAR) FROM {table}"),
        };
        let keys: Vec<String> = match (&self.pg, &self.my) {
            (Some(pg), _) => {
                sqlx::query(&sql).fetch_all(pg).await.ok()?.iter().map(|r| r.get(0)).collect()
            }
            (_, Some(my)) => {
                sqlx::query(&sql).fetch_all(my).await.ok()?.iter().map(|r| r.get(0)).collect()
            }
            _ => unreachable!("a pool"),
        };
        let mut counted = BTreeMap::new();
        for key in keys {
            *counted.entry(key).or_default() += 1;
        }
        Some(counted)
    }

    /// Waits until `table` has exactly `rows` rows.
    async fn wait_rows(&self, table: &str, rows: usize) -> BTreeMap<String, usize> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let keys = self.keys(table).await.unwrap_or_default();
            if keys.values().sum::<usize>() == rows {
                return keys;
            }
            assert!(Instant::now() < deadline, "{table}: {} rows, not {rows}", keys.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn start(dir: &std::path::Path, port: u16) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--warehouse-flush-secs", "1", "--backfill-chunk-rows", "40"])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    Server::start(command, port)
}

async fn call(client: &reqwest::Client, method: Method, url: &str, body: Value) -> (u16, Value) {
    send(client, method, url, Some(body.to_string())).await
}

async fn put_secret(client: &reqwest::Client, base: &str, name: &str, value: &str) {
    let url = format!("{base}/api/v1/beam/secrets/{name}");
    let (status, answer) = call(client, Method::PUT, &url, json!({"value": value})).await;
    assert_eq!(status, 200, "{answer}");
}

/// Creates a pipeline of `sink` (its `type` and `connection` filled in) on base ERC-20
/// transfers and answers its id and the deploy's answer.
async fn deploy(client: &reqwest::Client, base: &str, body: Value) -> (String, u16, Value) {
    let (status, created) = call(client, Method::POST, &format!("{base}/api/v1/beam"), body).await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, deployed) =
        send(client, Method::POST, &format!("{base}/api/v1/beam/{id}/deploy"), None).await;
    (id, status, deployed)
}

fn pipeline(db: &UserDb, sink: Value, zerolag: bool, transforms: Value, pod_size: &str) -> Value {
    let mut sink = sink;
    sink["type"] = json!(db.sink_type());
    json!({
        "name": "sql", "description": "into the user's database", "pod_size": pod_size,
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer", "is_zerolag": zerolag},
            "transforms": transforms,
            "sinks": [sink]
        }
    })
}

fn transfer(n: u64, block_hash: &str) -> Value {
    json!({
        "block_number": 100 + n / 10,
        "block_timestamp": "2026-11-21T12:00:00Z",
        "block_hash": block_hash,
        "transaction_hash": format!("0x{n:064x}"),
        "transaction_index": 0,
        "log_index": n % 10,
        "token_address": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "token_symbol": "USDC",
        "from_address": "0x2222222222222222222222222222222222222222",
        "to_address": "0x3333333333333333333333333333333333333333",
        "raw_amount_str": format!("{}000000000000000000000000", n),
        "amount": n as f64 + 0.5,
    })
}

fn key_of(n: u64) -> String {
    format!("0x{n:064x}:{}", n % 10)
}

async fn push(client: &reqwest::Client, base: &str, records: &[Value], zerolag: bool) {
    let url = format!("{base}/api/v1/streams/base/erc20_token_transfer/records?zerolag={zerolag}");
    let body: String = records.iter().map(|r| format!("{r}\n")).collect();
    let (status, answer) = send(client, Method::POST, &url, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
}

const HASH_A: &str = "0xaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const HASH_B: &str = "0xbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

async fn exact_rows_and_a_reorg(kind: Kind) {
    let db = UserDb::new(kind, "sql_rows").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &db.url).await;
    // Record 7 leaves the script with a block number no BIGINT column holds.
    let script = "function transform(record) { if (!record.reorg) { record.seen_by = 'sluice'; } \
                  if (record.log_index === 7) { record.block_number = 'seven'; } return record; }";
    let body = pipeline(
        &db,
        json!({"uid": "sk-sql", "name": "rows", "connection": "DB", "table": "transfers"}),
        true,
        json!([{"type": "v8", "script": script}]),
        "S",
    );
    let (id, status, deployed) = deploy(&client, &base, body).await;
    assert_eq!(status, 200, "{deployed}");
    let connection = &deployed["sinks"][0]["connection"];
    assert_eq!(connection["table"], "transfers", "{deployed}");
    assert_eq!(connection["offsets_table"], "sluice_sink_offsets", "{deployed}");
    let records: Vec<Value> =
        (1..=4).map(|n| transfer(n, if n <= 2 { HASH_A } else { HASH_B })).collect();
    push(&client, &base, &records, true).await;
    db.wait_rows("transfers", 4).await;
    let sql = match kind {
        Kind::Postgres => {
            "SELECT \"key\", block_number::text, block_hash, token_symbol, raw_amount_str::text, \
             to_char(block_timestamp AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS'), amount::text, \
             token_name, extra::text FROM transfers ORDER BY \"key\""
        }
        Kind::Mysql => {
            "SELECT CAST(`key` AS CHAR), CAST(block_number AS CHAR), block_hash, token_symbol, raw_amount_str, \
             DATE_FORMAT(block_timestamp, '%Y-%m-%dT%H:%i:%s'), CAST(amount AS CHAR), token_name, \
             CAST(extra AS CHAR) FROM transfers ORDER BY `key`"
        }
    };
    let rows = db.texts(sql).await;
    let expected: Vec<Vec<Option<String>>> = (1..=4u64)
        .map(|n| {
            vec![
                Some(key_of(n)),
                Some("100".to_owned()),
                Some((if n <= 2 { HASH_A } else { HASH_B }).to_owned()),
                Some("USDC".to_owned()),
                Some(format!("{n}000000000000000000000000")),
                Some("2026-11-21T12:00:00".to_owned()),
                Some(format!("{n}.5")),
                None,
                Some("extra".to_owned()),
            ]
        })
        .collect();
    for (row, want) in rows.iter().zip(&expected) {
        assert_eq!(row[..8], want[..8], "{rows:?}");
        let extra: Value = serde_json::from_str(row[8].as_deref().unwrap()).unwrap();
        assert_eq!(extra, json!({"seen_by": "sluice"}));
    }
    assert_eq!(rows.len(), 4);
    // Block A is reorged away: its marker deletes its rows and is no row itself.
    let marker = json!({"reorg": true, "chain": "base", "block_number": 100, "block_hash": HASH_A,
        "block_timestamp": "2026-11-21T12:00:00Z", "transaction_hash": HASH_A, "log_index": -1});
    push(&client, &base, &[marker], true).await;
    let keys = db.wait_rows("transfers", 2).await;
    assert_eq!(keys.keys().cloned().collect::<Vec<_>>(), vec![key_of(3), key_of(4)]);
    // A record of the orphaned block that arrives after its marker is not written either.
    push(&client, &base, &[transfer(5, HASH_A), transfer(6, HASH_B)], true).await;
    let keys = db.wait_rows("transfers", 3).await;
    assert!(keys.contains_key(&key_of(6)) && !keys.contains_key(&key_of(5)), "{keys:?}");
    // A record that cannot be a row is a dead letter of the sink; the batch's other rows land.
    push(&client, &base, &[transfer(7, HASH_B), transfer(8, HASH_B)], true).await;
    let keys = db.wait_rows("transfers", 4).await;
    assert!(keys.contains_key(&key_of(8)) && !keys.contains_key(&key_of(7)), "{keys:?}");
    let url = format!("{base}/api/v1/beam/{id}/dead-letters");
    let (status, page) = send(&client, Method::GET, &url, None).await;
    assert_eq!(status, 200, "{page}");
    let dead = page["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 1, "{page}");
    assert_eq!(dead[0]["key"], key_of(7), "{page}");
    assert_eq!(dead[0]["sink_uid"], "sk-sql", "{page}");
    assert!(dead[0]["error"].as_str().unwrap().contains("block_number"), "{page}");
    assert!(server.terminate());
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_sink_writes_typed_rows_and_a_reorg_marker_deletes_its_block() {
    exact_rows_and_a_reorg(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_sink_writes_typed_rows_and_a_reorg_marker_deletes_its_block() {
    exact_rows_and_a_reorg(Kind::Mysql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_secret_or_a_database_that_cannot_be_reached_is_a_422_at_the_connection() {
    let db = UserDb::new(Kind::Postgres, "sql_422").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    let at_connection = json!(["body", "pipeline_config", "sinks", 0, "connection"]);
    let sink = json!({"name": "rows", "connection": "NOPE", "table": "transfers"});
    let (status, error) = call(
        &client,
        Method::POST,
        &format!("{base}/api/v1/beam"),
        pipeline(&db, sink, false, json!([]), "S"),
    )
    .await;
    assert_eq!(status, 422, "{error}");
    assert_eq!(error["detail"][0]["loc"], at_connection, "{error}");
    let closed = free_port();
    for (kind, value, says) in [
        (Kind::Postgres, format!("postgres://postgres@127.0.0.1:{closed}/x"), "PostgreSQL"),
        (Kind::Mysql, format!("mysql://root@127.0.0.1:{closed}/x"), "MySQL"),
        (Kind::Postgres, "mysql://root@127.0.0.1/x".to_owned(), "postgres://"),
        (Kind::Mysql, "not a url".to_owned(), "mysql://"),
    ] {
        put_secret(&client, &base, "BAD", &value).await;
        let mut body = pipeline(
            &db,
            json!({"name": "rows", "connection": "BAD", "table": "t"}),
            false,
            json!([]),
            "S",
        );
        body["pipeline_config"]["sinks"][0]["type"] =
            json!(if kind == Kind::Postgres { "postgres" } else { "mysql" });
        let (_, status, error) = deploy(&client, &base, body).await;
        assert_eq!(status, 422, "{value}: {error}");
        assert_eq!(error["detail"][0]["loc"], at_connection, "{error}");
        assert!(error["detail"][0]["msg"].as_str().unwrap().contains(says), "{error}");
    }
    // Bad fields are 422s at create, each at its field.
    let sink = json!({"name": "rows", "connection": "DB", "table": "bad-name", "mode": "merge",
                      "columns": {"amount": "key"}});
    let (status, error) = call(
        &client,
        Method::POST,
        &format!("{base}/api/v1/beam"),
        pipeline(&db, sink, false, json!([]), "S"),
    )
    .await;
    assert_eq!(status, 422, "{error}");
    let locs: Vec<Value> =
        error["detail"].as_array().unwrap().iter().map(|d| d["loc"][4].clone()).collect();
    for field in ["table", "mode", "columns"] {
        assert!(locs.contains(&json!(field)), "{field}: {error}");
    }
    // The deploy answer shows where rows go, never the credentials.
    let with_password = db.url.replacen("postgres@", "postgres:s3cret-pw@", 1);
    put_secret(&client, &base, "DB", &with_password).await;
    let sink = json!({"name": "rows", "connection": "DB", "table": "transfers", "mode": "upsert"});
    let (_, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
    assert_eq!(status, 200, "{deployed}");
    assert!(!deployed.to_string().contains("s3cret-pw"), "{deployed}");
    assert_eq!(deployed["sinks"][0]["connection"]["mode"], "upsert", "{deployed}");
    assert!(server.terminate());
}

/// A TCP forwarder in front of a database, which the test can take down and bring back.
struct Outage {
    port: u16,
    up: Arc<AtomicBool>,
    /// Connections forwarded now.
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl Outage {
    async fn new(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (flag, count) = (up.clone(), open.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let (flag, count) = (flag.clone(), count.clone());
                tokio::spawn(async move {
                    if !flag.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    let watch = async {
                        while flag.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    };
                    tokio::select! { _ = copy => {}, () = watch => {} }
                    count.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self { port, up, open }
    }

    /// Up or down; down returns once every forwarded connection is cut.
    async fn set(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        while !up && self.open.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn outage_is_held_then_delivered(kind: Kind) {
    let db = UserDb::new(kind, "sql_outage").await;
    let target = url::Url::parse(&db.url).unwrap().port().unwrap();
    let outage = Outage::new(target).await;
    let through = db.url.replacen(&format!(":{target}/"), &format!(":{}/", outage.port), 1);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &through).await;
    let sink = json!({"name": "rows", "connection": "DB", "table": "held"});
    let (id, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
    assert_eq!(status, 200, "{deployed}");
    let first: Vec<Value> = (0..10).map(|n| transfer(n, HASH_B)).collect();
    push(&client, &base, &first, false).await;
    db.wait_rows("held", 10).await;
    outage.set(false).await;
    let second: Vec<Value> = (10..20).map(|n| transfer(n, HASH_B)).collect();
    push(&client, &base, &second, false).await;
    // The worker says it is held on its sink, and nothing more reached the table.
    let stats = format!("{base}/api/v1/beam/{id}/deploy/stats");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, stats) = send(&client, Method::GET, &stats, None).await;
        if stats["workers_health"]["workers"][0]["is_blocked_on_sink"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "never held: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(db.keys("held").await.unwrap().len(), 10);
    outage.set(true).await;
    let keys = db.wait_rows("held", 20).await;
    assert!(keys.values().all(|n| *n == 1), "{keys:?}");
    assert!(server.terminate());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_outage_holds_the_source_and_then_delivers_once() {
    outage_is_held_then_delivered(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mysql_outage_holds_the_source_and_then_delivers_once() {
    outage_is_held_then_delivered(Kind::Mysql).await;
}

/// Records per ingest request, requests between two kills, kills.
const BATCH: u64 = 200;
const BATCHES_PER_ROUND: usize = 8;
const KILLS: usize = 5;

/// Feeds numbered transfers until `stop`; answers the numbers whose request was acknowledged.
/// A request cut by a kill is not sent again: its numbers may or may not be in the stream,
/// and a second copy would be a duplicate of the source, not of the sink.
fn feeder(
    client: reqwest::Client,
    port: u16,
    acked: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let url =
            format!("http://127.0.0.1:{port}/api/v1/streams/base/erc20_token_transfer/records");
        let mut next = 0;
        while !stop.load(Ordering::SeqCst) {
            let body: String =
                (next..next + BATCH).map(|n| format!("{}\n", transfer(n, HASH_B))).collect();
            let answer = client.post(&url).header("x-api-key", KEY).body(body).send().await;
            let ok = match answer {
                Ok(response) if response.status() == 200 => response.text().await.is_ok(),
                _ => false,
            };
            if ok {
                acked.lock().unwrap().push(next);
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            next += BATCH;
        }
    })
}

async fn five_kills_exactly_once(kind: Kind) {
    let db = UserDb::new(kind, "sql_kill").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &db.url).await;
    let sink = json!({"name": "rows", "connection": "DB", "table": "killed", "mode": "insert"});
    let (_, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink, false, json!([]), "M")).await;
    assert_eq!(status, 200, "{deployed}");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let feed = feeder(client.clone(), port, acked.clone(), stop.clone());
    let deadline = Instant::now() + Duration::from_secs(240);
    for kill in 1..=KILLS {
        while acked.lock().unwrap().len() < kill * BATCHES_PER_ROUND {
            assert!(Instant::now() < deadline, "ingest made no progress before kill {kill}");
            assert!(!feed.is_finished(), "the feeder stopped");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.child.kill().unwrap(); // SIGKILL
        server.child.wait().unwrap();
        drop(server);
        server = start(dir.path(), port);
    }
    while acked.lock().unwrap().len() < (KILLS + 1) * BATCHES_PER_ROUND {
        assert!(Instant::now() < deadline, "ingest made no progress after the last kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    feed.await.unwrap();
    let expected: BTreeSet<String> =
        acked.lock().unwrap().iter().flat_map(|from| (*from..from + BATCH).map(key_of)).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let keys = loop {
        let keys = db.keys("killed").await.unwrap_or_default();
        if expected.iter().all(|key| keys.contains_key(key)) || Instant::now() > deadline {
            break keys;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lost = expected.iter().filter(|key| !keys.contains_key(*key)).count();
    let duplicates: usize = keys.values().map(|n| n - 1).sum();
    let rows: usize = keys.values().sum();
    eprintln!(
        "{kind:?} sink, {KILLS} kill -9s: {} records acknowledged, {rows} rows ({} distinct keys), \
         {lost} lost, {duplicates} duplicates",
        expected.len(),
        keys.len()
    );
    assert_eq!((lost, duplicates), (0, 0), "every acknowledged record exactly once");
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn five_sigkills_under_a_steady_feed_leave_every_acknowledged_record_once_in_postgres() {
    five_kills_exactly_once(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn five_sigkills_under_a_steady_feed_leave_every_acknowledged_record_once_in_mysql() {
    five_kills_exactly_once(Kind::Mysql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backfill_into_postgres_lands_the_window_in_the_pipelines_table() {
    let db = UserDb::new(Kind::Postgres, "sql_backfill").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &db.url).await;
    // History: 120 transfers on 2026-11-21, archived into the warehouse.
    let history: Vec<Value> = (0..120).map(|n| transfer(n, HASH_B)).collect();
    push(&client, &base, &history, false).await;
    let tables = format!("{base}/api/v1/beam/backfills/tables");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, listed) = send(&client, Method::GET, &tables, None).await;
        let rows = listed.as_array().and_then(|t| {
            t.iter()
                .find(|t| t["name"] == "base.assets.erc20_token_transfers")
                .map(|t| t["row_count"].clone())
        });
        if rows == Some(json!(120)) {
            break;
        }
        assert!(Instant::now() < deadline, "never archived: {listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The pipeline starts at the stream's end: it gets only what comes next (a day later).
    let sink = json!({"uid": "sk-h", "name": "history", "connection": "DB", "table": "history"});
    let (_, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink.clone(), false, json!([]), "S")).await;
    assert_eq!(status, 200, "{deployed}");
    let later: Vec<Value> = (1000..1030)
        .map(|n| {
            let mut record = transfer(n, HASH_B);
            record["block_timestamp"] = json!("2026-11-22T12:00:00Z");
            record
        })
        .collect();
    push(&client, &base, &later, false).await;
    db.wait_rows("history", 30).await;
    let mut destination = sink;
    destination["type"] = json!("postgres");
    destination.as_object_mut().unwrap().remove("uid");
    let body = json!({
        "job_name": "history", "table": "base.assets.erc20_token_transfers",
        "backfill_window": {"partition_key": "block_timestamp",
                            "start": "2026-11-21T00:00:00Z", "end": "2026-11-22T00:00:00Z"},
        "destinations": [destination],
    });
    let (status, created) =
        call(&client, Method::POST, &format!("{base}/api/v1/beam/backfills"), body).await;
    assert_eq!(status, 200, "{created}");
    let job_url = format!("{base}/api/v1/beam/backfills/{}", created["job_id"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, job) = send(&client, Method::GET, &job_url, None).await;
        if job["status"] == "completed" {
            assert_eq!(job["num_chunks"], 3, "{job}");
            break;
        }
        assert!(Instant::now() < deadline && job["status"] != "failed", "{job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys = db.wait_rows("history", 150).await;
    let expected: BTreeSet<String> = (0..120).chain(1000..1030).map(key_of).collect();
    assert_eq!(keys.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(keys.values().all(|n| *n == 1), "{keys:?}");
    // Each chunk's id is kept beside the rows: a chunk sent again is skipped.
    let chunks = db
        .texts("SELECT count(*)::text FROM sluice_sink_offsets WHERE source = 'backfill:history'")
        .await;
    assert_eq!(chunks, vec![vec![Some("3".to_owned())]]);
    assert!(server.terminate());
}

/// Records `numbers` by partition (of 8), in order: in a fresh stream, each one's offset is
/// the count of those before it in its partition.
fn by_partition(numbers: std::ops::Range<u64>) -> BTreeMap<u32, Vec<u64>> {
    let mut by_partition: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for n in numbers {
        let partition = sluice_bus::partition_for_key(key_of(n).as_bytes(), 8);
        by_partition.entry(partition).or_default().push(n);
    }
    by_partition
}

/// The row of record `n` as another writer wrote it: its key, `token_symbol` MANUAL.
fn manual_row(kind: Kind, table: &str, n: u64) -> String {
    let key = if kind == Kind::Postgres { "\"key\"" } else { "`key`" };
    format!("INSERT INTO {table} ({key}, token_symbol) VALUES ('{}', 'MANUAL')", key_of(n))
}

/// `table` holds `rows` keys, each once, and `manual` rows of the other writer (which the
/// sink must not have written again).
async fn assert_once(db: &UserDb, table: &str, rows: usize, manual: usize) {
    let keys = db.keys(table).await.unwrap_or_default();
    assert_eq!(keys.len(), rows, "{keys:?}");
    assert!(keys.values().all(|n| *n == 1), "written twice: {keys:?}");
    let sql = format!("SELECT token_symbol FROM {table} WHERE token_symbol = 'MANUAL'");
    assert_eq!(db.texts(&sql).await.len(), manual, "the other writer's rows were written again");
}

/// The crash window itself, made on purpose: the database holds rows and positions the
/// stream log never heard of (a sink that committed, then died before the log's commit).
/// The deploy that resumes must start from the database's positions, not write them again.
async fn resumes_from_the_databases_positions(kind: Kind) {
    let db = UserDb::new(kind, "sql_resume").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &db.url).await;
    let sink = json!({"name": "rows", "connection": "DB", "table": "resumed"});
    let (id, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
    assert_eq!(status, 200, "{deployed}");
    let (status, paused) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam/{id}/pause"), None).await;
    assert_eq!(status, 200, "{paused}");
    // A fresh stream: every partition starts at offset 0, so each record's offset is the
    // count of the records of its partition before it.
    let records: Vec<Value> = (0..40).map(|n| transfer(n, HASH_B)).collect();
    push(&client, &base, &records, false).await;
    let by_partition = by_partition(0..40);
    // The even partitions' records "were written" by a sink that died before the log's
    // commit: rows marked MANUAL, positions at their partitions' ends.
    let (mut statements, mut manual) = (Vec::new(), BTreeSet::new());
    for (partition, numbers) in by_partition.iter().filter(|(p, _)| *p % 2 == 0) {
        for n in numbers {
            manual.insert(key_of(*n));
            statements.push(manual_row(kind, "resumed", *n));
        }
        statements.push(format!(
            "INSERT INTO sluice_sink_offsets (consumer, source, part, next_offset) \
             VALUES ('deploy.{id}', 'base.erc20_token_transfer', {partition}, {})",
            numbers.len()
        ));
    }
    assert!(!manual.is_empty() && manual.len() < 40, "both kinds of partition: {by_partition:?}");
    for statement in &statements {
        db.texts(statement).await;
    }
    let (status, deployed) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam/{id}/deploy"), None).await;
    assert_eq!(status, 200, "{deployed}");
    db.wait_rows("resumed", 40).await;
    assert_once(&db, "resumed", 40, manual.len()).await;
    assert!(server.terminate());
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_sink_resumes_from_the_position_its_transaction_committed() {
    resumes_from_the_databases_positions(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_sink_resumes_from_the_position_its_transaction_committed() {
    resumes_from_the_databases_positions(Kind::Mysql).await;
}

/// Two writers of one batch's range: while a worker runs, another writer of the same
/// pipeline (a worker whose node was stopped or cut off long enough for its work to move,
/// then came back) commits rows and positions inside the range the worker reads next. The
/// worker's transaction finds the database's position inside its batch and must write only
/// what lies after it (found by the chaos run, scripts/chaos: rows written twice after a
/// node was stopped). On one partition the other writer is past the whole batch: the batch
/// must leave that position where it is, not move it back to its own (a start from the
/// database's positions would then write that stretch again).
async fn a_batch_overlapping_anothers_writes_only_its_rest(kind: Kind) {
    let db = UserDb::new(kind, "sql_overlap").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &db.url).await;
    let sink = json!({"name": "rows", "connection": "DB", "table": "overlap"});
    let (id, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
    assert_eq!(status, 200, "{deployed}");
    // A first record, written: the worker runs and has read the database's positions (it
    // does so once, when it starts). It is offset 0 of its partition in a fresh stream.
    let first = 1000;
    push(&client, &base, &[transfer(first, HASH_B)], false).await;
    db.wait_rows("overlap", 1).await;
    let first_partition = sluice_bus::partition_for_key(key_of(first).as_bytes(), 8);
    // Each next record's offset: the count of the records of its partition before it.
    let by_partition = by_partition(0..40);
    // The other writer: the first half of each partition's next records, and the positions;
    // on partition `ahead`, all of them and a position past them.
    let ahead = *by_partition.keys().find(|p| **p != first_partition).unwrap();
    let ahead_at = by_partition[&ahead].len() + 5;
    let (mut statements, mut manual) = (Vec::new(), BTreeSet::new());
    for (partition, numbers) in &by_partition {
        let (written, position) = if *partition == ahead {
            (numbers.len(), ahead_at)
        } else {
            let half = numbers.len().div_ceil(2);
            (half, half + usize::from(*partition == first_partition))
        };
        for n in &numbers[..written] {
            manual.insert(key_of(*n));
            statements.push(manual_row(kind, "overlap", *n));
        }
        statements.push(if *partition == first_partition {
            format!(
                "UPDATE sluice_sink_offsets SET next_offset = {position} WHERE consumer = 'deploy.{id}' \
                 AND source = 'base.erc20_token_transfer' AND part = {partition}"
            )
        } else {
            format!(
                "INSERT INTO sluice_sink_offsets (consumer, source, part, next_offset) \
                 VALUES ('deploy.{id}', 'base.erc20_token_transfer', {partition}, {position})"
            )
        });
    }
    for statement in &statements {
        db.texts(statement).await;
    }
    let records: Vec<Value> = (0..40).map(|n| transfer(n, HASH_B)).collect();
    push(&client, &base, &records, false).await;
    // 41 rows; had the first halves been written again, 61 (and no wait would see 41).
    db.wait_rows("overlap", 41).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_once(&db, "overlap", 41, manual.len()).await;
    let text =
        if kind == Kind::Postgres { "next_offset::text" } else { "CAST(next_offset AS CHAR)" };
    let sql = format!("SELECT {text} FROM sluice_sink_offsets WHERE part = {ahead}");
    let stored = db.texts(&sql).await;
    assert_eq!(stored, vec![vec![Some(ahead_at.to_string())]], "the position ahead moved back");
    assert!(server.terminate());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_batch_overlapping_another_writers_commit_writes_only_its_rest() {
    a_batch_overlapping_anothers_writes_only_its_rest(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mysql_batch_overlapping_another_writers_commit_writes_only_its_rest() {
    a_batch_overlapping_anothers_writes_only_its_rest(Kind::Mysql).await;
}

/// Two writers of a partition's first rows: the other writer's transaction has made the
/// partition's row of `sluice_sink_offsets` (with its rows) but not committed when the worker
/// writes the same range. `FOR UPDATE` alone locks no row that is not there yet, so the
/// worker must make the row itself, wait for the other writer, and then write only what lies
/// after its position (found by the chaos run: rows written twice with every other guard in
/// place). InnoDB's locking read already waits for another transaction's uncommitted row, so
/// this is PostgreSQL's test.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_partitions_first_write_waits_for_another_writers_uncommitted_one() {
    let db = UserDb::new(Kind::Postgres, "sql_first_write").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    put_secret(&client, &base, "DB", &db.url).await;
    let sink = json!({"name": "rows", "connection": "DB", "table": "first_write"});
    let (id, status, deployed) =
        deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
    assert_eq!(status, 200, "{deployed}");
    // The other writer, open: the first half of each partition's records and the positions
    // (no row of the offsets table exists yet).
    let mut other = db.pg.as_ref().unwrap().begin().await.unwrap();
    let mut manual = 0;
    for (partition, numbers) in &by_partition(0..40) {
        let half = numbers.len().div_ceil(2);
        for n in &numbers[..half] {
            sqlx::query(&manual_row(Kind::Postgres, "first_write", *n))
                .execute(&mut *other)
                .await
                .unwrap();
            manual += 1;
        }
        sqlx::query(&format!(
            "INSERT INTO sluice_sink_offsets (consumer, source, part, next_offset) \
             VALUES ('deploy.{id}', 'base.erc20_token_transfer', {partition}, {half})"
        ))
        .execute(&mut *other)
        .await
        .unwrap();
    }
    let records: Vec<Value> = (0..40).map(|n| transfer(n, HASH_B)).collect();
    push(&client, &base, &records, false).await;
    // The worker reads the records and reaches the offsets table in milliseconds; then the
    // other writer commits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    other.commit().await.unwrap();
    // 40 rows; written whole behind the other writer, 60 (and no wait would see 40).
    db.wait_rows("first_write", 40).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_once(&db, "first_write", 40, manual).await;
    assert!(server.terminate());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_user_without_the_privileges_is_a_422_saying_which() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let (base, client) = (server.base.clone(), client());
    for kind in [Kind::Postgres, Kind::Mysql] {
        let db = UserDb::new(kind, "sql_grants").await;
        // The owner's deploy makes the tables.
        put_secret(&client, &base, "OWNER", &db.url).await;
        let sink = json!({"name": "rows", "connection": "OWNER", "table": "granted"});
        let (_, status, deployed) =
            deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
        assert_eq!(status, 200, "{deployed}");
        // A user who may only read them.
        let reader = format!("reader_{}", std::process::id());
        let reader_url = match kind {
            Kind::Postgres => {
                for sql in [
                    format!("DROP ROLE IF EXISTS {reader}"),
                    format!("CREATE ROLE {reader} LOGIN"),
                    format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}"),
                ] {
                    db.texts(&sql).await;
                }
                db.url.replacen("postgres@", &format!("{reader}@"), 1)
            }
            Kind::Mysql => {
                let database = db.url.rsplit_once('/').unwrap().1.to_owned();
                for sql in [
                    format!("DROP USER IF EXISTS '{reader}'@'%'"),
                    format!("CREATE USER '{reader}'@'%'"),
                    format!("GRANT SELECT ON {database}.* TO '{reader}'@'%'"),
                ] {
                    db.texts(&sql).await;
                }
                db.url.replacen("root@", &format!("{reader}@"), 1)
            }
        };
        put_secret(&client, &base, "READER", &reader_url).await;
        let sink = json!({"name": "rows", "connection": "READER", "table": "granted"});
        let (_, status, error) =
            deploy(&client, &base, pipeline(&db, sink, false, json!([]), "S")).await;
        assert_eq!(status, 422, "{kind:?}: {error}");
        let msg = error["detail"][0]["msg"].as_str().unwrap().to_owned();
        let says = match kind {
            Kind::Postgres => msg.contains("lacks INSERT") || msg.contains("lacks UPDATE"),
            Kind::Mysql => msg.contains("denied"),
        };
        assert!(says, "{kind:?}: {msg}");
    }
    assert!(server.terminate());
}
