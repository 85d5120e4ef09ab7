//! The `StreamLog` conformance suite, run on the embedded log and on a Kafka-API broker
//! (`log.rs`), and what only one of them does (`embedded_only` in `log.rs`, `kafka.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Runs each named `async fn(Fixture)` of the calling module once on the embedded log and
/// once on the Kafka-API broker `scripts/test` starts.
macro_rules! on_both_logs {
    ($($name:ident),* $(,)?) => {
        mod on_embedded {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Fixture::embedded()).await;
            })*
        }
        mod on_kafka {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::Fixture::kafka().await).await;
            })*
        }
    };
}

mod kafka;
mod log;
