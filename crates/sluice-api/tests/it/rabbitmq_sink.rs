//! The `rabbitmq` sink through the API against the RabbitMQ `scripts/test` names
//! (`SLUICE_TEST_RABBITMQ_URL`, guest login): each test declares its own exchange and queue
//! (unique names), reads what was published with `basic.get`, and takes the broker away
//! through a proxy for an outage.

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_runtime::sinks::rabbitmq::amqp::{Connection, Got, Io, Login};

use crate::external_sinks::{Stack, odd};
use crate::pipeline_stack::settle;
use crate::tcp_proxy::TcpProxy;

/// `host:port` of the broker.
fn broker() -> String {
    let url = std::env::var("SLUICE_TEST_RABBITMQ_URL")
        .expect("SLUICE_TEST_RABBITMQ_URL must name the RabbitMQ broker (scripts/test sets it)");
    let rest = url.trim_start_matches("amqp://");
    let address = rest.split('/').next().unwrap();
    if address.contains(':') { address.to_owned() } else { format!("{address}:5672") }
}

async fn connect(address: &str) -> Connection {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let io: Box<dyn Io> = Box::new(tcp);
    let login = Login { user: "guest", password: "guest", vhost: "/" };
    Connection::open(io, &login).await.unwrap()
}

/// A unique topic exchange and a queue bound to it by `binding`, on a connection that
/// keeps them (the queue goes with it).
async fn exchange_and_queue(binding: &str) -> (Connection, String, String) {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (exchange, queue) = (format!("sluice-x-{unique}"), format!("sluice-q-{unique}"));
    let mut admin = connect(&broker()).await;
    admin.declare_exchange(&exchange, "topic").await.unwrap();
    admin.bound_queue(&queue, &exchange, binding).await.unwrap();
    (admin, exchange, queue)
}

/// Takes `count` messages from `queue` (a generous deadline fails the test).
async fn take(admin: &mut Connection, queue: &str, count: usize) -> Vec<Got> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < count {
        match admin.get(queue).await.unwrap() {
            Some(message) => got.push(message),
            None => {
                assert!(tokio::time::Instant::now() < deadline, "only {} of {count}", got.len());
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    got
}

fn sink(url: &str, exchange: &str) -> Value {
    json!({"type": "rabbitmq", "uid": "sk-amqp", "name": "rabbit", "url": url,
           "exchange": exchange, "routing_key_field": "token_address",
           "username": "guest", "password_secret": "AMQP_PASSWORD"})
}

async fn stack() -> Stack {
    let stack = Stack::new().await;
    stack.put_secret("AMQP_PASSWORD", "guest").await;
    stack
}

fn numbers(messages: &[Got]) -> Vec<u64> {
    let mut numbers: Vec<u64> = messages
        .iter()
        .map(|m| serde_json::from_slice::<Value>(&m.body).unwrap()["n"].as_u64().unwrap())
        .collect();
    numbers.sort_unstable();
    numbers
}

#[tokio::test(flavor = "multi_thread")]
async fn each_record_is_published_persistent_with_its_key_routed_by_a_record_field() {
    let (mut admin, exchange, queue) = exchange_and_queue(crate::pipeline_stack::USDC).await;
    let stack = stack().await;
    let url = format!("amqp://{}/", broker());
    let (id, deployed) = stack.deployed("at_least_once", sink(&url, &exchange)).await;
    let connection = &deployed["sinks"][0]["connection"];
    assert_eq!(connection["exchange"], exchange.as_str(), "{deployed}");
    assert_eq!(connection["routing_key"], "<record.token_address>");
    stack.ingest(1..=20).await;
    settle(stack.log.as_ref(), &id).await;
    let got = take(&mut admin, &queue, 10).await;
    assert!(admin.get(&queue).await.unwrap().is_none(), "exactly the ten");
    let mut by_n = BTreeMap::new();
    for message in &got {
        let record: Value = serde_json::from_slice(&message.body).unwrap();
        let n = record["n"].as_u64().unwrap();
        assert_eq!(message.routing_key, crate::pipeline_stack::USDC);
        assert_eq!(message.message_id.as_deref(), Some(format!("0x{n:064x}:{}", n % 10).as_str()));
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert_eq!(message.delivery_mode, Some(2));
        assert!(String::from_utf8_lossy(&message.headers).contains("sluice_batch_id"));
        assert_eq!(record, crate::pipeline_stack::transfer(n, crate::pipeline_stack::USDC));
        by_n.insert(n, ());
    }
    assert_eq!(by_n.into_keys().collect::<Vec<_>>(), odd(1..=20));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_of_the_broker_holds_the_source_and_then_delivers_every_record() {
    let (mut admin, exchange, queue) = exchange_and_queue("#").await;
    let proxy = TcpProxy::start(&broker()).await;
    let stack = stack().await;
    let url = format!("amqp://{}/", proxy.address());
    let (id, _) = stack.deployed("at_least_once", sink(&url, &exchange)).await;
    stack.ingest(1..=4).await;
    settle(stack.log.as_ref(), &id).await;
    proxy.down();
    stack.ingest(5..=20).await;
    let worker = stack.blocked_worker(&id).await;
    assert!(worker["last_error"].as_str().unwrap().contains("RabbitMQ"), "{worker}");
    proxy.up().await;
    settle(stack.log.as_ref(), &id).await;
    let got = take(&mut admin, &queue, 10).await;
    let mut distinct = numbers(&got);
    distinct.dedup();
    assert_eq!(distinct, odd(1..=20), "every record, at least once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_sink_is_a_422_at_its_field_and_a_missing_exchange_or_login_one_at_deploy() {
    let (_admin, exchange, _) = exchange_and_queue("#").await;
    let stack = stack().await;
    let create = |sink: Value| Stack::pipeline("at_least_once", sink);
    let mut bad = sink("amqp://guest:guest@localhost/", "bad exchange!");
    bad["routing_key"] = json!("fixed");
    let (status, body) =
        stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(create(bad))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> =
        body["detail"].as_array().unwrap().iter().map(|d| d["loc"][4].as_str().unwrap()).collect();
    assert_eq!(fields, ["url", "exchange", "routing_key_field"], "{body}");
    let mut missing = sink(&format!("amqp://{}/", broker()), &exchange);
    missing["password_secret"] = json!("NOPE");
    let (status, body) =
        stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(create(missing))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "pipeline_config", "sinks", 0, "password_secret"])
    );
    stack.put_secret("WRONG", "not-the-password").await;
    let mut wrong_login = sink(&format!("amqp://{}/", broker()), &exchange);
    wrong_login["password_secret"] = json!("WRONG");
    let url = format!("amqp://{}/", broker());
    for (sink, expected) in [(sink(&url, "sluice-no-such-exchange"), "404"), (wrong_login, "403")] {
        let (status, created) =
            stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(create(sink))).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        let id = created["id"].as_str().unwrap();
        let (status, body) = stack
            .call(Method::POST, &format!("/api/v1/beam/{id}/deploy"), &stack.owner, Some(json!({})))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let msg = body["detail"][0]["msg"].as_str().unwrap();
        assert!(msg.contains(expected), "{msg}");
        assert!(!msg.contains("not-the-password"), "{msg}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_without_its_routing_field_is_dead_lettered_and_the_rest_published() {
    let (mut admin, exchange, queue) = exchange_and_queue("#").await;
    let stack = stack().await;
    let mut sink = sink(&format!("amqp://{}/", broker()), &exchange);
    sink["routing_key_field"] = json!("memo");
    let mut body = Stack::pipeline("at_least_once", sink);
    // Records with an odd `n` get a memo; the others have none to route by.
    body["pipeline_config"]["transforms"] = json!([{"type": "v8",
        "script": "function transform(r) { if (r.n % 2 == 1) { r.memo = 'm' + r.n; } return r; }"}]);
    let (id, _) = stack.deployed_body(body).await;
    stack.ingest(1..=6).await;
    settle(stack.log.as_ref(), &id).await;
    let got = take(&mut admin, &queue, 3).await;
    assert_eq!(numbers(&got), vec![1, 3, 5]);
    assert!(got.iter().all(|m| {
        let n = serde_json::from_slice::<Value>(&m.body).unwrap()["n"].as_u64().unwrap();
        m.routing_key == format!("m{n}")
    }));
    let path = format!("/api/v1/beam/{id}/dead-letters?offset=0&limit=100");
    let (status, letters) = stack.call(Method::GET, &path, &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK, "{letters}");
    let letters = letters["dead_letters"].as_array().unwrap();
    let mut dead: Vec<u64> = letters.iter().map(|l| l["record"]["n"].as_u64().unwrap()).collect();
    dead.sort_unstable();
    assert_eq!(dead, vec![2, 4, 6], "{letters:?}");
    assert!(letters.iter().all(|l| l["sink_uid"] == "sk-amqp"
        && l["error"].as_str().unwrap().contains("no 'memo' to route by")));
}
