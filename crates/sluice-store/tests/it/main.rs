//! Integration tests of `sluice-store`: one conformance suite run on SQLite and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod conformance;
mod datasets;
mod metrics;
mod prices;
