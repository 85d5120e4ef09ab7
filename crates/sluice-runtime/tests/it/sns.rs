//! The SNS transport's decisions that need no server: what it refuses before sending, and an
//! endpoint that does not answer. Delivery itself is tested through the API against moto
//! (`crates/sluice-api/tests/it/external_sinks.rs`).

use serde_json::json;
use sluice_bus::NewRecord;
use sluice_core::pipeline::SnsSinkConfig;
use sluice_runtime::sinks::external::{Batch, Transport, TransportError};
use sluice_runtime::sinks::sns::sigv4::Credentials;
use sluice_runtime::sinks::sns::{MAX_MESSAGE_BYTES, SnsTransport};

fn transport_at(endpoint: &str) -> SnsTransport {
    let config = SnsSinkConfig {
        name: "s".to_owned(),
        topic_arn: "arn:aws:sns:us-east-1:123456789012:topic".to_owned(),
        region: None,
        endpoint: Some(endpoint.to_owned()),
        access_key_id_secret: "ID".to_owned(),
        secret_access_key_secret: "KEY".to_owned(),
        session_token_secret: None,
        uid: "sk-sns".to_owned(),
    };
    let credentials = Credentials {
        access_key_id: "AKIDTEST".to_owned(),
        secret_access_key: "secret-never-shown".to_owned(),
        session_token: None,
    };
    SnsTransport::new(&config, credentials, None).unwrap()
}

fn closed_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}/")
}

#[tokio::test]
async fn a_record_over_the_message_limit_is_rejected_without_being_sent() {
    // Nothing listens there: had the record been sent, the send would fail as retryable.
    let sns = transport_at(&closed_endpoint());
    let big = json!({"pad": "x".repeat(MAX_MESSAGE_BYTES)}).to_string().into_bytes();
    let records = [NewRecord::new(b"k".to_vec(), big)];
    let sent = sns.send(Batch { id: "b", records: &records }).await.unwrap();
    assert_eq!(sent.rejected.len(), 1);
    assert!(sent.rejected[0].1.contains("message limit"), "{:?}", sent.rejected);
}

#[tokio::test]
async fn an_endpoint_that_does_not_answer_holds_the_batch_and_names_no_credential() {
    let sns = transport_at(&closed_endpoint());
    let records = [NewRecord::new(b"k".to_vec(), b"{}".to_vec())];
    let error = sns.send(Batch { id: "b", records: &records }).await.unwrap_err();
    assert!(matches!(error, TransportError::Retryable { .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains("cannot connect"), "{text}");
    assert!(!text.contains("secret-never-shown") && !text.contains("AKIDTEST"), "{text}");
    assert_eq!(sns.connection()["region"], "us-east-1");
}
