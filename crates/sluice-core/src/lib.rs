//! `sluice-core` owns Sluice's domain: pipeline configurations and their parts, the source
//! catalog, the set-filter expression language, validation of request bodies into 422
//! `detail` entries (docs/contract.md §Validation error body), identities, permissions, ids,
//! the clock, and token-price trades and candles with their exact arithmetic ([`prices`]).
//!
//! It depends on no workspace crate and does no I/O; storage (`sluice-store`) and the HTTP API
//! (`sluice-api`) build on it. Start reading at [`pipeline`] (the record and its validation),
//! then [`catalog`] and [`permission`].

pub mod backfill;
pub mod base58;
pub mod catalog;
pub mod clock;
pub mod datasets;
pub mod deployment;
pub mod events;
pub mod filter_expr;
pub mod filter_values;
pub mod hash;
pub mod identity;
pub mod ids;
pub mod json;
pub mod permission;
pub mod pipeline;
pub mod prices;
pub mod redaction;
pub mod secret;
pub mod streams;
pub mod time;
pub mod validation;
