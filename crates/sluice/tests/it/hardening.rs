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
