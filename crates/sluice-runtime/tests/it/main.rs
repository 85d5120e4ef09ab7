//! Integration tests of the runtime, against a real SQLite store and the embedded log, and
//! of the external sinks' transports against the real servers `scripts/test` starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod heartbeat;
mod lifecycle;
mod nats;
mod set_feed;
mod shared_reads;
mod sns;
