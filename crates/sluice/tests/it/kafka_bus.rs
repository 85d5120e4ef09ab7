//! `sluice serve --bus kafka://…` against a broker that is not there, or goes away.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::crash::{KEY, batch, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

/// A private tansu broker (`SLUICE_TEST_TANSU_BIN`, set by `scripts/test`; the test fails
/// without it) on a free port; killed when dropped.
struct Broker {
    child: Child,
    port: u16,
}

impl Broker {
    fn start() -> Self {
        let tansu = std::env::var("SLUICE_TEST_TANSU_BIN")
            .expect("SLUICE_TEST_TANSU_BIN must name a tansu binary; run scripts/test");
        let port = free_port();
        let listener = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(tansu)
            .args(["broker", "--listener-url", &listener, "--advertised-listener-url", &listener])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_broker_that_does_not_answer_at_start_is_an_error_naming_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port(); // nothing listens there
    let output = sluice()
        .arg("serve")
        .args(data_dir_args(dir.path()))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("SLUICE_BUS_URL", format!("kafka://127.0.0.1:{port}?sasl.password=hunter2"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("cannot reach the stream log at kafka://127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_broker_goes_away_readyz_and_ingest_answer_503() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir.path()))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--bus", &format!("kafka://127.0.0.1:{}", broker.port)])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    let server = Server::start(command, port);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let base = &server.base;
    let ingest = format!("{base}/api/v1/streams/base/erc20_token_transfer/records");
    let (status, body) = send(&client, reqwest::Method::POST, &ingest, Some(batch(0, 10))).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = send(&client, reqwest::Method::GET, &format!("{base}/readyz"), None).await;
    assert_eq!(status, 200);

    drop(broker);
    let (status, body) = send(&client, reqwest::Method::GET, &format!("{base}/readyz"), None).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("stream log"), "{body}");
    let (status, body) = send(&client, reqwest::Method::POST, &ingest, Some(batch(10, 10))).await;
    assert_eq!(status, 503, "{body}");
    // The process is still serving.
    let (status, _) = send(&client, reqwest::Method::GET, &format!("{base}/healthz"), None).await;
    assert_eq!(status, 200);
}
