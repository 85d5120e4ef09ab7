//! Integration tests of the EVM ingester against a real Anvil node (`SLUICE_TEST_ANVIL_BIN`,
//! which `scripts/test` sets; the tests fail without it) with the contracts of
//! `tests/contracts`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod anvil;
mod faults;
mod ingest;
mod reorg;
