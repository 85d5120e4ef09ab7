//! `sluice serve` and `sluice admin` as a newcomer and an operator use them.

use std::time::Duration;

use serde_json::{Value, json};

use crate::process::{Server, admin, data_dir_args, free_port, sluice};

fn pipeline(name: &str) -> Value {
    json!({
        "name": name,
        "description": "e2e",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "v8", "script": "function transform(r) { return r; }"}],
            "sinks": [{"type": "kafka", "name": "out"}]
        }
    })
}

async fn call(method: reqwest::Method, url: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut request = client.request(method, url).header("x-api-key", key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Posts one Base USDC trade (2 USDC for 3 USD, 90 s ago) to a running server and polls
/// the latest-price endpoint until the price consumer has counted it.
async fn trade_shows_up_in_prices(base: &str, key: &str) {
    let usdc = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";
    let trade = json!({
        "chain": "base", "token_address": usdc, "token_decimals": 6, "token_amount": "2",
        "usd_amount": "3", "pool_address": "0x0000000000000000000000000000000000000abc",
        "token_reserve": "1000", "block_number": 1, "log_index": 0,
        "block_timestamp": (chrono::Utc::now() - chrono::Duration::seconds(90)).to_rfc3339(),
        "transaction_hash": format!("0x{:064x}", 42),
    });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let response = client
        .post(format!("{base}/api/v1/streams/base/dex_trade/records"))
        .header("x-api-key", key)
        .body(trade.to_string() + "\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let prices = format!("{base}/api/v1/developer/prices?with_liquidity_info=true");
    let body = json!([{"chain": "base", "token_address": usdc}]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = call(reqwest::Method::POST, &prices, key, Some(body.clone())).await;
        assert_eq!(status, 200, "{answer}");
        if let Some(item) = answer["items"].get(0) {
            assert_eq!(item["price"], 1.5);
            assert_eq!(item["decimals"], 6);
            assert_eq!(item["total_liquidity_usd"], 1500.0);
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the trade never reached the prices");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn key_from(lines: &[String]) -> Option<String> {
    lines.iter().find_map(|line| line.trim().strip_prefix("slk_").map(|rest| format!("slk_{rest}")))
}

fn stdout_key(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout.clone()).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 1, "create-key prints only the key: {printed:?}");
    assert!(lines[0].starts_with("slk_"));
    lines[0].to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn first_start_prints_one_key_and_admin_commands_work_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let store = data_dir_args(dir.path());
    let store: Vec<&str> = store.iter().map(String::as_str).collect();
    let mut command = sluice();
    command.arg("serve").args(&store).args(["--listen", &format!("127.0.0.1:{port}")]);
    let server = Server::start(command, port);
    let operator_key =
        key_from(&server.printed()).expect("the first start prints the operator key");
    let beam = format!("{}/api/v1/beam", server.base);

    let (status, created) =
        call(reqwest::Method::POST, &beam, &operator_key, Some(pipeline("ops"))).await;
    assert_eq!(status, 200, "{created}");

    // A key for a new org/team/user, created while the server runs.
    let ann = stdout_key(&admin(
        &["create-key", "--org", "acme", "--team", "data", "--user", "ann"],
        &store,
        &[],
    ));
    let (status, list) = call(reqwest::Method::GET, &beam, &ann, None).await;
    assert_eq!((status, list), (200, json!([])), "another org sees nothing");
    assert_eq!(call(reqwest::Method::POST, &beam, &ann, Some(pipeline("ann"))).await.0, 200);

    let flags =
        admin(&["set-org-flags", "--org", "acme", "--custom-transforms", "off"], &store, &[]);
    assert!(flags.status.success());
    assert_eq!(call(reqwest::Method::POST, &beam, &ann, Some(pipeline("ann"))).await.0, 403);
    let flags = admin(&["set-org-flags", "--org", "acme", "--pipelines", "off"], &store, &[]);
    assert!(flags.status.success());
    assert_eq!(call(reqwest::Method::GET, &format!("{beam}/sources"), &ann, None).await.0, 403);
    assert!(
        !admin(&["set-org-flags", "--org", "nope", "--pipelines", "on"], &store, &[])
            .status
            .success()
    );

    assert!(admin(&["revoke-key", &ann], &store, &[]).status.success());
    assert_eq!(call(reqwest::Method::GET, &beam, &ann, None).await.0, 401);
    assert!(!admin(&["revoke-key", &ann], &store, &[]).status.success(), "already revoked");

    trade_shows_up_in_prices(&server.base, &operator_key).await;

    assert!(server.terminate(), "SIGTERM stops the server cleanly");

    // A second start on the same store prints no key; the first key still works.
    let mut command = sluice();
    command.arg("serve").args(&store).args(["--listen", &format!("127.0.0.1:{port}")]);
    let server = Server::start(command, port);
    assert_eq!(key_from(&server.printed()), None);
    let (status, list) = call(reqwest::Method::GET, &beam, &operator_key, None).await;
    assert_eq!(status, 200);
    assert_eq!(list[0]["id"], created["id"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_is_one_setting_away() {
    let database_url = crate::process::fresh_postgres_database("e2e").await;

    let port = free_port();
    let bootstrap = "slk_e2e_bootstrap_key_0123456789";
    let mut command = sluice();
    command
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_DATABASE_URL", &database_url)
        .env("SLUICE_BOOTSTRAP_API_KEY", bootstrap);
    let server = Server::start(command, port);
    assert_eq!(key_from(&server.printed()), None, "a given bootstrap key is not printed");
    let beam = format!("{}/api/v1/beam", server.base);
    let (status, created) =
        call(reqwest::Method::POST, &beam, bootstrap, Some(pipeline("pg"))).await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap();
    let (status, read) = call(reqwest::Method::GET, &format!("{beam}/{id}"), bootstrap, None).await;
    assert_eq!((status, &read), (200, &created));

    let ann = stdout_key(&admin(
        &["create-key", "--org", "acme", "--team", "data", "--user", "ann"],
        &[],
        &[("SLUICE_DATABASE_URL", &database_url)],
    ));
    assert_eq!(call(reqwest::Method::GET, &format!("{beam}/{id}"), &ann, None).await.0, 404);
    trade_shows_up_in_prices(&server.base, bootstrap).await;
    assert!(server.terminate());
}

#[tokio::test(flavor = "multi_thread")]
async fn flags_override_env_which_overrides_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let (file_port, env_port, flag_port) = (free_port(), free_port(), free_port());
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{file_port}\"\ndata_dir = \"{}\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let key = "slk_precedence_key_0123456789ab";

    let start = |env: Option<u16>, flag: Option<u16>, expect: u16| {
        let mut command = sluice();
        command.args(["serve", "--config", &config]).env("SLUICE_BOOTSTRAP_API_KEY", key);
        if let Some(port) = env {
            command.env("SLUICE_LISTEN", format!("127.0.0.1:{port}"));
        }
        if let Some(port) = flag {
            command.args(["--listen", &format!("127.0.0.1:{port}")]);
        }
        Server::start(command, expect)
    };
    assert!(start(Some(env_port), Some(flag_port), flag_port).terminate());
    assert!(start(Some(env_port), None, env_port).terminate());
    let server = start(None, None, file_port);
    // The data dir came from the file.
    assert!(dir.path().join("data").join("sluice.db").exists());
    let (status, _) =
        call(reqwest::Method::GET, &format!("{}/api/v1/beam", server.base), key, None).await;
    assert_eq!(status, 200);
    assert!(server.terminate());
}
