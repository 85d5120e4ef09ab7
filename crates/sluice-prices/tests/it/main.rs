//! Integration tests of `sluice-prices`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod consumer;
mod memory;
mod rollup;
