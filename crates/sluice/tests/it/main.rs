//! End-to-end tests of the `sluice` binary: real server processes on loopback ports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backfills;
mod chains;
mod cluster;
mod crash;
mod density;
mod events;
mod events_cluster;
mod hardening;
mod hyperliquid;
mod kafka_bus;
mod kafka_source;
mod kill_loop;
mod object_storage_kill;
mod postgres_runtime;
mod process;
mod readme;
mod scripts;
mod serve;
mod set_history;
mod solana;
mod sql_sinks;
mod start;
