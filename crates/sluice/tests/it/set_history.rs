//! `sluice serve` with a chain from a real Anvil node: changes of a set filter's values are
//! recorded at the block the stream had reached, and `check?at=` answers membership at past
//! blocks and times (docs/set-filter.md, "Set history"), on SQLite and on PostgreSQL.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::chains::{Anvil, wait_ingested};
use crate::crash::{KEY, send};
use crate::process::{Server, data_dir_args, free_port, fresh_postgres_database, sluice};

#[tokio::test(flavor = "multi_thread")]
async fn past_membership_by_block_and_time_on_sqlite() {
    past_membership_by_block_and_time(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_membership_by_block_and_time_on_postgres() {
    let url = fresh_postgres_database("set_history").await;
    past_membership_by_block_and_time(Some(&url)).await;
}

/// `sluice serve` ingesting `base` from `anvil` (two confirmations), its store at `database`
/// (`None`: SQLite in the data directory).
fn serve(dir: &std::path::Path, port: u16, anvil: &str, database: Option<&str>) -> Server {
    let config = dir.join("sluice.toml");
    let database = database.map(|url| format!("database_url = \"{url}\"\n")).unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "{database}[[chains]]\nname = \"base\"\nrpc_url = \"{anvil}\"\nstart_block = \"latest\"\n\
             chain_id = 31337\nconfirmations = 2\nmax_block_range = 3\npoll_interval_ms = 20\n"
        ),
    )
    .unwrap();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(&dir.join("data")))
        .args(["--config", config.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    Server::start(command, port)
}

/// Mines three blocks and waits until the server has ingested up to two below the head;
/// answers the block ingested.
async fn advance(anvil: &Anvil, client: &reqwest::Client, base: &str) -> u64 {
    anvil.call("anvil_mine", json!(["0x3"])).await;
    let status = wait_ingested(client, base, anvil.head().await - 2).await;
    status["ingested"].as_u64().unwrap()
}

async fn past_membership_by_block_and_time(database: Option<&str>) {
    let anvil = Anvil::start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let _server = serve(dir.path(), port, &anvil.url, database);
    let body = json!({
        "name": "history", "description": "set history",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1", "filter_expr": "root = this.token_address"}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
        }
    });
    let (status, created) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam"), Some(body.to_string())).await;
    assert_eq!(status, 200, "{created}");
    let values = format!(
        "{base}/api/v1/beam/{}/transforms/tf-1/filter-values",
        created["id"].as_str().unwrap()
    );

    // Three changes, each after the stream moved on: add, remove, replace.
    let steps = [
        (Method::POST, json!(["0xAA", "0xbb", "cc"])),
        (Method::DELETE, json!(["0xbb"])),
        (Method::PUT, json!(["0xaa", "dd"])),
    ];
    let mut blocks = Vec::new();
    for (method, list) in steps {
        blocks.push(advance(&anvil, &client, &base).await);
        let body = json!({ "values": list }).to_string();
        let (status, answer) = send(&client, method, &values, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
    }
    assert!(blocks.windows(2).all(|pair| pair[0] < pair[1]), "{blocks:?}");

    let (status, page) =
        send(&client, Method::GET, &format!("{values}/changes?values=true"), None).await;
    assert_eq!(status, 200, "{page}");
    let changes = page["changes"].as_array().unwrap();
    let recorded: Vec<(Value, Value)> =
        changes.iter().map(|c| (c["kind"].clone(), c["block"].clone())).collect();
    assert_eq!(
        recorded,
        [
            (json!("replace"), json!(blocks[2])),
            (json!("remove"), json!(blocks[1])),
            (json!("add"), json!(blocks[0])),
        ]
    );
    assert_eq!(changes[0]["added_values"], json!(["dd"]));
    assert_eq!(changes[0]["removed_values"], json!(["cc"]));
    let times: Vec<String> = changes
        .iter()
        .rev()
        .map(|c| c["changed_at"].as_str().unwrap().replace('+', "%2B"))
        .collect();

    let member = |value: &'static str, at: String| {
        let (client, values) = (client.clone(), values.clone());
        async move {
            let url = format!("{values}/check?value={value}&at={at}");
            let (status, body) = send(&client, Method::GET, &url, None).await;
            assert_eq!(status, 200, "{value} at {at}: {body}");
            body["is_member"].as_bool().unwrap()
        }
    };
    // (value, before the add, after the add, after the remove, after the replace)
    let expected = [
        ("0xaa", false, true, true, true),
        ("0xbb", false, true, false, false),
        ("cc", false, true, true, false),
        ("dd", false, false, false, true),
    ];
    for (value, none, added, removed, replaced) in expected {
        let after = |block: u64| (block + 1).to_string();
        assert_eq!(member(value, blocks[0].to_string()).await, none, "{value} at the add's block");
        assert_eq!(member(value, after(blocks[0])).await, added, "{value} after the add");
        assert_eq!(member(value, after(blocks[1])).await, removed, "{value} after the remove");
        assert_eq!(member(value, after(blocks[2])).await, replaced, "{value} after the replace");
        assert_eq!(member(value, times[0].clone()).await, added, "{value} at the add's time");
        assert_eq!(member(value, times[1].clone()).await, removed, "{value} at the remove's time");
        assert_eq!(
            member(value, times[2].clone()).await,
            replaced,
            "{value} at the replace's time"
        );
        assert_eq!(member(value, "2020-01-01T00:00:00Z".to_owned()).await, none, "{value} in 2020");
    }
    let (status, body) =
        send(&client, Method::GET, &format!("{values}/check?value=0xaa&at=soon"), None).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["query", "at"]));
}
