//! The NATS JetStream transport against the `nats-server -js` that `scripts/test` starts
//! (`SLUICE_TEST_NATS_URL`; these tests fail without it).

use base64::Engine as _;
use serde_json::{Value, json};
use sluice_bus::NewRecord;
use sluice_core::pipeline::NatsSinkConfig;
use sluice_runtime::sinks::external::{Batch, Transport, TransportError};
use sluice_runtime::sinks::nats::{Connection, NatsAuth, NatsTransport};

pub fn nats_url() -> String {
    std::env::var("SLUICE_TEST_NATS_URL")
        .expect("SLUICE_TEST_NATS_URL must name a nats-server -js (scripts/test starts one)")
}

/// A JetStream stream of its own, capturing `<name>.>`; answers the subject to publish to.
pub async fn stream(name: &str, max_msg_size: i64) -> String {
    let mut connection = Connection::open(&nats_url(), &NatsAuth::None, false).await.unwrap();
    let config = json!({
        "name": name, "subjects": [format!("{name}.>")], "storage": "memory",
        "max_msg_size": max_msg_size, "duplicate_window": 120_000_000_000u64,
    });
    let answer = connection
        .request(&format!("$JS.API.STREAM.CREATE.{name}"), config.to_string().as_bytes())
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert!(answer.get("error").is_none(), "{answer}");
    format!("{name}.records")
}

/// Every message of a stream: `(Nats-Msg-Id, data)`, in stream order.
pub async fn messages(name: &str) -> Vec<(String, Vec<u8>)> {
    let mut connection = Connection::open(&nats_url(), &NatsAuth::None, false).await.unwrap();
    let info = connection.request(&format!("$JS.API.STREAM.INFO.{name}"), b"").await.unwrap();
    let info: Value = serde_json::from_slice(&info).unwrap();
    let count = info["state"]["messages"].as_u64().unwrap();
    let first = info["state"]["first_seq"].as_u64().unwrap();
    let mut out = Vec::new();
    for seq in first..first + count {
        let request = json!({"seq": seq}).to_string();
        let answer = connection
            .request(&format!("$JS.API.STREAM.MSG.GET.{name}"), request.as_bytes())
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        let message = &answer["message"];
        let b64 = base64::engine::general_purpose::STANDARD;
        let headers =
            String::from_utf8(b64.decode(message["hdrs"].as_str().unwrap()).unwrap()).unwrap();
        let id =
            headers.lines().find_map(|line| line.strip_prefix("Nats-Msg-Id: ")).unwrap().to_owned();
        out.push((id, b64.decode(message["data"].as_str().unwrap_or_default()).unwrap()));
    }
    out
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

fn transport(subject: &str, url: String) -> NatsTransport {
    let config = NatsSinkConfig {
        name: "n".to_owned(),
        url,
        subject: subject.to_owned(),
        username: None,
        password_secret: None,
        token_secret: None,
        tls: false,
        uid: "sk-nats".to_owned(),
    };
    NatsTransport::new(&config, NatsAuth::None)
}

fn record(n: u64, size: usize) -> NewRecord {
    let value = json!({"n": n, "pad": "x".repeat(size)});
    NewRecord::new(format!("0x{n:064x}:0").into_bytes(), value.to_string().into_bytes())
}

#[tokio::test]
async fn every_record_is_acknowledged_in_order_and_a_batch_sent_twice_is_deduplicated() {
    let name = unique("ORDER");
    let subject = stream(&name, -1).await;
    let nats = transport(&subject, nats_url());
    let records: Vec<NewRecord> = (0..1500).map(|n| record(n, 100)).collect();
    let sent = nats.send(Batch { id: "b1", records: &records }).await.unwrap();
    assert!(sent.rejected.is_empty());
    // Sent again after a failure: JetStream drops the duplicates by Nats-Msg-Id.
    nats.send(Batch { id: "b1", records: &records[..700] }).await.unwrap();
    let stored = messages(&name).await;
    assert_eq!(stored.len(), 1500);
    for (n, (id, data)) in stored.iter().enumerate() {
        assert_eq!(id, &format!("0x{n:064x}:0"));
        assert_eq!(serde_json::from_slice::<Value>(data).unwrap()["n"], n as u64);
    }
    nats.close().await;
}

#[tokio::test]
async fn a_subject_no_stream_captures_is_retried_and_a_record_over_the_stream_limit_is_rejected() {
    let nowhere = transport(&unique("nowhere.records"), nats_url());
    let error = nowhere.send(Batch { id: "b", records: &[record(1, 10)] }).await.unwrap_err();
    assert!(
        matches!(&error, TransportError::Retryable { message, .. } if message.contains("no responders")),
        "{error}"
    );

    let name = unique("SMALL");
    let subject = stream(&name, 512).await;
    let nats = transport(&subject, nats_url());
    let records = [record(1, 10), record(2, 4000), record(3, 10)];
    let sent = nats.send(Batch { id: "b", records: &records }).await.unwrap();
    assert_eq!(sent.rejected.len(), 1);
    assert_eq!(sent.rejected[0].0, 1);
    assert!(sent.rejected[0].1.contains("JetStream refused"), "{:?}", sent.rejected);
    let stored: Vec<String> = messages(&name).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(stored, [format!("0x{:064x}:0", 1), format!("0x{:064x}:0", 3)]);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_retried_and_a_later_send_reconnects() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // The first URL refuses; the list goes on to the next one.
    let name = unique("FAILOVER");
    let subject = stream(&name, -1).await;
    let both = format!("nats://{closed},{}", nats_url());
    let nats = transport(&subject, both);
    nats.send(Batch { id: "b", records: &[record(1, 10)] }).await.unwrap();
    assert_eq!(messages(&name).await.len(), 1);

    let dead = transport(&subject, format!("nats://{closed}"));
    let error = dead.send(Batch { id: "b", records: &[record(2, 10)] }).await.unwrap_err();
    assert!(
        matches!(&error, TransportError::Retryable { message, .. } if message.contains("cannot connect")),
        "{error}"
    );
}

/// A private `nats-server` (the binary `scripts/test` found: `SLUICE_TEST_NATS_BIN`) started
/// with `args`, on a free port; killed when dropped.
struct PrivateServer {
    child: std::process::Child,
    url: String,
}

impl PrivateServer {
    fn start(args: &[&str]) -> Self {
        let bin = std::env::var("SLUICE_TEST_NATS_BIN")
            .expect("SLUICE_TEST_NATS_BIN must name nats-server (scripts/test finds it)");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Self { child, url: format!("nats://127.0.0.1:{port}") }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn logins_with_a_token_or_a_password_succeed_only_with_the_right_secret() {
    use sluice_core::secret::SecretValue;
    let secret = |text: &str| SecretValue::new(text.to_owned());
    let token_server = PrivateServer::start(&["--auth", "s3cret-token"]);
    Connection::open(&token_server.url, &NatsAuth::Token(secret("s3cret-token")), false)
        .await
        .unwrap();
    let error = Connection::open(&token_server.url, &NatsAuth::Token(secret("wrong-token")), false)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("Authorization Violation"), "{text}");
    assert!(!text.contains("wrong-token"), "{text}");

    let password_server = PrivateServer::start(&["--user", "app", "--pass", "pw-1234"]);
    let login = |password: &str| NatsAuth::UserPassword {
        user: "app".to_owned(),
        password: secret(password),
    };
    Connection::open(&password_server.url, &login("pw-1234"), false).await.unwrap();
    assert!(Connection::open(&password_server.url, &login("nope"), false).await.is_err());
    assert!(Connection::open(&password_server.url, &NatsAuth::None, false).await.is_err());
}
