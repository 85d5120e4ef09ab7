//! Operational hardening of the binary: who reads `/metrics`, what reaches the log, which
//! store the admin commands use, file modes of the data dir, and `sluice feed`'s reports.

use std::time::Duration;

use crate::process::{Server, free_port, sluice};

const BOOTSTRAP_KEY: &str = "slk_hardening_bootstrap_key_0123";

async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut request = client.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_need_a_key_or_the_token_and_the_metrics_address_serves_them_keyless() {
    let dir = tempfile::tempdir().unwrap();
    let (port, metrics_port) = (free_port(), free_port());
    let mut command = sluice();
    command
        .args(["serve", "--data-dir", &dir.path().display().to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .env("SLUICE_METRICS_TOKEN", "scrape-token-for-prometheus")
        .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
    let server = Server::start(command, port);
    let metrics = format!("{}/metrics", server.base);
    let (status, body) = get(&metrics, &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.starts_with("{\"detail\":"), "{body}");
    let (status, body) = get(&metrics, &[("authorization", "Bearer wrong-token-wrong")]).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) =
        get(&metrics, &[("authorization", "Bearer scrape-token-for-prometheus")]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE sluice_pipeline_messages_sent_total counter"), "{body}");
    assert_eq!(get(&metrics, &[("x-api-key", BOOTSTRAP_KEY)]).await.0, 200);
    // The operator-only address: /metrics without a key, and nothing else.
    let operator_only = format!("http://127.0.0.1:{metrics_port}");
    let (status, body) = get(&format!("{operator_only}/metrics"), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE sluice_pipeline_messages_sent_total counter"), "{body}");
    assert_eq!(get(&format!("{operator_only}/api/v1/beam"), &[]).await.0, 404);
    assert!(server.terminate());
}

/// Collects log lines until one contains `needle` (a generous deadline fails the test).
fn log_until(log: &std::sync::mpsc::Receiver<String>, lines: &mut Vec<String>, needle: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !lines.iter().any(|line| line.contains(needle)) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "no log line with {needle:?} in\n{}", lines.join("\n"));
        if let Ok(line) = log.recv_timeout(left.min(Duration::from_millis(200))) {
            lines.push(line);
        }
    }
}

/// A log line as the server writes it: `<RFC 3339 time> <LEVEL> <target>: …`.
fn is_a_log_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let time_ok = words.next().is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok());
    let level_ok = words
        .next()
        .is_some_and(|level| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level));
    time_ok && level_ok
}

#[tokio::test(flavor = "multi_thread")]
async fn user_text_with_control_characters_cannot_forge_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = sluice();
    command
        .args(["serve", "--data-dir", &dir.path().display().to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
    let (server, log) = Server::start_logged(command, port);
    let forged = "2026-01-01T00:00:00.000000Z  WARN sluice: FORGED admin logged in";
    let name = format!("x\n{forged}\r\n{forged}\u{1b}[2K\u{7}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let response = client
        .post(format!("{}/api/v1/beam/datasets", server.base))
        .header("x-api-key", BOOTSTRAP_KEY)
        .json(&serde_json::json!({"name": name}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "{}", response.text().await.unwrap());
    let mut lines = Vec::new();
    log_until(&log, &mut lines, "dataset created");
    assert!(server.terminate());
    lines.extend(log.try_iter());
    let text = lines.join("\n");
    for line in &lines {
        assert!(is_a_log_line(line), "a line that is not an event:\n{line}\nin\n{text}");
        assert!(!line.contains(['\r', '\u{1b}', '\u{7}']), "raw control character in {line:?}");
    }
    let with_forged: Vec<&String> = lines.iter().filter(|line| line.contains("FORGED")).collect();
    assert_eq!(with_forged.len(), 1, "{text}");
    // The one genuine event, with the name escaped inside it.
    assert!(with_forged[0].contains("dataset created"), "{text}");
    assert!(with_forged[0].contains(&format!("x\\n{forged}\\r\\n{forged}")), "{text}");
}

#[test]
fn admin_commands_never_create_a_store_and_name_the_store_they_use() {
    let cwd = tempfile::tempdir().unwrap();
    let create_key = ["admin", "create-key", "--org", "acme", "--team", "data", "--user", "ann"];
    // Nothing given, nothing at ./sluice-data: an error naming where it looked.
    let output = sluice().args(create_key).current_dir(cwd.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(output.stdout.is_empty(), "no key is printed");
    assert!(stderr.contains("sluice-data/sluice.db"), "{stderr}");
    assert!(stderr.contains("--data-dir"), "{stderr}");
    assert!(!cwd.path().join("sluice-data").exists(), "no store was created");
    // A data dir that holds no store: the same, and it stays empty.
    let empty = tempfile::tempdir().unwrap();
    let empty_dir = empty.path().display().to_string();
    for command in [
        &create_key[..],
        &["admin", "set-org-flags", "--org", "acme", "--pipelines", "on"],
        &["admin", "revoke-key", "slk_0000000000000000000000000000000000000000"],
    ] {
        let output = sluice().args(command).args(["--data-dir", &empty_dir]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command:?}: {stderr}");
        assert!(stderr.contains(&empty_dir), "{stderr}");
    }
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0, "the dir stays empty");

    // On the store a server made: works, and says which store it used on stderr.
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().display().to_string();
    let port = free_port();
    let mut command = sluice();
    command
        .args(["serve", "--data-dir", &data_dir, "--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
    assert!(Server::start(command, port).terminate());
    let output = sluice().args(create_key).args(["--data-dir", &data_dir]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).trim().starts_with("slk_"));
    let db = data.path().join("sluice.db").display().to_string();
    assert!(stderr.contains(&format!("using the store at sqlite://{db}")), "{stderr}");
}

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[cfg(unix)]
#[test]
fn the_data_dir_and_its_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let parent = tempfile::tempdir().unwrap();
    let fresh = parent.path().join("fresh");
    // An existing data dir others may enter, with a store file others may read.
    let loose = parent.path().join("loose");
    for (dir, port) in [(&fresh, free_port()), (&loose, free_port())] {
        if dir == &loose {
            std::fs::create_dir(dir).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::write(dir.join("sluice.db"), b"").unwrap();
            std::fs::set_permissions(dir.join("sluice.db"), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        let mut command = sluice();
        command
            .args(["serve", "--data-dir", &dir.display().to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
        let server = Server::start(command, port);
        assert_eq!(mode(dir), 0o700, "{}", dir.display());
        for name in ["sluice.db", "sluice.db-wal", "sluice.db-shm", "log.redb"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name} in {}", dir.display());
        }
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(mode(&path) & 0o077, 0, "{} is open to others", path.display());
        }
        assert!(server.terminate());
    }
}

#[test]
fn a_feed_that_stops_on_an_error_exits_nonzero_with_the_accepted_count() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = sluice();
    command
        .args(["serve", "--data-dir", &dir.path().display().to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
    let server = Server::start(command, port);
    let feed = |key: &str| {
        sluice()
            .args(["feed", "--url", &server.base, "--api-key", key, "--rate", "0"])
            .args(["--chain", "base", "--entity", "erc20_token_transfer", "--count", "30"])
            .output()
            .unwrap()
    };
    let output = feed(BOOTSTRAP_KEY);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["accepted"], 30, "{report}");
    assert!(report["seed"].is_u64(), "{report}");
    let output = feed("slk_not_a_key_of_this_server_0000");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("0 records sent, 0 accepted"), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    assert!(server.terminate());
}

/// Starts `serve --demo` on a fresh data dir, deploys a pipeline on Base transfers and
/// returns the keys of the first records it delivers.
async fn demo_keys() -> std::collections::BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = sluice();
    command
        .args(["serve", "--demo", "--data-dir", &dir.path().display().to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
    let server = Server::start(command, port);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(40)).build().unwrap();
    let beam = format!("{}/api/v1/beam", server.base);
    let body = serde_json::json!({
        "name": "all", "description": "",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [],
            "sinks": [{"type": "kafka", "uid": "sk-all", "name": "all"}]
        }
    });
    let created: serde_json::Value = client
        .post(&beam)
        .header("x-api-key", BOOTSTRAP_KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap_or_else(|| panic!("{created}")).to_owned();
    let deployed =
        client.post(format!("{beam}/{id}/deploy")).header("x-api-key", BOOTSTRAP_KEY).send();
    assert_eq!(deployed.await.unwrap().status().as_u16(), 200);
    let mut keys = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while keys.len() < 5 {
        assert!(std::time::Instant::now() < deadline, "the demo delivered only {keys:?}");
        let page: serde_json::Value = client
            .get(format!("{beam}/{id}/sinks/sk-all/records?offset=0&limit=5&wait_ms=5000"))
            .header("x-api-key", BOOTSTRAP_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for record in page["records"].as_array().unwrap_or_else(|| panic!("{page}")) {
            keys.insert(record["key"].as_str().unwrap().to_owned());
        }
    }
    assert!(server.terminate());
    keys
}

#[tokio::test(flavor = "multi_thread")]
async fn each_demo_start_sends_new_keys() {
    let (first, second) = (demo_keys().await, demo_keys().await);
    assert!(first.is_disjoint(&second), "{first:?} and {second:?}");
}

/// Sends `body` to `url` with `method` and the bootstrap key; answers the status and text.
async fn call(method: reqwest::Method, url: &str, body: serde_json::Value) -> (u16, String) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let response = client
        .request(method, url)
        .header("x-api-key", BOOTSTRAP_KEY)
        .body(body.to_string())
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: secrets stored, every response and log line searched, a restart, the sealed rows checked"
)]
async fn secret_values_reach_no_response_and_no_log_line_and_survive_a_restart_sealed() {
    const VALUE: &str = "never-shown-3f9a1c77d2";
    const ROTATED: &str = "never-shown-rotated-88b2";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = |port: u16| {
        let mut command = sluice();
        command
            .args(["serve", "--data-dir", &dir.path().display().to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("SLUICE_LOG", "debug,sqlx=warn,hyper=info,reqwest=info")
            .env("SLUICE_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY);
        command
    };
    let (server, log) = Server::start_logged(serve(port), port);
    let base = server.base.clone();
    let mut answers = Vec::new();
    let (status, text) = call(
        reqwest::Method::PUT,
        &format!("{base}/api/v1/beam/secrets/HOOK"),
        serde_json::json!({"value": VALUE}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    answers.push(text);
    // A webhook nobody listens on: its sink fails, and the failures are logged.
    let closed = free_port();
    let pipeline = serde_json::json!({
        "name": "hook", "description": "signed",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [],
            "sinks": [{"type": "webhook", "uid": "sk-hook", "name": "hook",
                       "url": format!("http://127.0.0.1:{closed}/in"), "hash_key": "HOOK"}]
        }
    });
    let (status, text) =
        call(reqwest::Method::POST, &format!("{base}/api/v1/beam"), pipeline).await;
    assert_eq!(status, 200, "{text}");
    let id = serde_json::from_str::<serde_json::Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    answers.push(text);
    let (status, text) = call(
        reqwest::Method::POST,
        &format!("{base}/api/v1/beam/{id}/deploy"),
        serde_json::json!({}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    answers.push(text);
    let transfer = serde_json::json!({
        "block_number": 1, "block_timestamp": "2026-11-21T12:00:00Z",
        "transaction_hash": format!("0x{:064x}", 1), "log_index": 0,
        "token_address": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "from_address": "0x1111111111111111111111111111111111111111",
        "to_address": "0x1111111111111111111111111111111111111111", "amount_str": "1"
    });
    let client = reqwest::Client::new();
    let response = client
        .post(format!("{base}/api/v1/streams/base/erc20_token_transfer/records"))
        .header("x-api-key", BOOTSTRAP_KEY)
        .body(format!("{transfer}\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut lines = Vec::new();
    log_until(&log, &mut lines, "sink write failed");
    let (status, text) = call(
        reqwest::Method::PUT,
        &format!("{base}/api/v1/beam/secrets/HOOK"),
        serde_json::json!({"value": ROTATED}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    answers.push(text);
    for path in [
        "/api/v1/beam/secrets".to_owned(),
        format!("/api/v1/beam/{id}/deploy/stats"),
        format!("/api/v1/beam/{id}"),
    ] {
        let (status, text) = get(&format!("{base}{path}"), &[("x-api-key", BOOTSTRAP_KEY)]).await;
        assert_eq!(status, 200, "{path}: {text}");
        answers.push(text);
    }
    assert!(answers.iter().any(|text| text.contains("sk-hook")), "the stats name the stale sink");
    lines.extend(server.printed());
    assert!(server.terminate());
    lines.extend(log.try_iter());
    let key_file = dir.path().join("secrets.key");
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // The store and the log hold it sealed only.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            for value in [VALUE, ROTATED] {
                assert!(
                    !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                    "{} holds a value",
                    path.display()
                );
            }
        }
    }

    // Restarted on the same data dir: the key file opens what was sealed, the deployment
    // resumes with the current value.
    let port = free_port();
    let (server, log) = Server::start_logged(serve(port), port);
    let mut more = Vec::new();
    log_until(&log, &mut more, "resumed deployed pipeline");
    more.extend(server.printed());
    assert!(server.terminate());
    more.extend(log.try_iter());
    lines.extend(more);
    for value in [VALUE, ROTATED] {
        for text in lines.iter().chain(&answers) {
            assert!(!text.contains(value), "a secret value in {text:?}");
        }
    }
}
