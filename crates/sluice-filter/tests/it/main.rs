//! Integration tests of `sluice-filter`, one module per area; `json_doc` generates the JSON
//! documents the property tests walk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod extract;
mod json_doc;
mod set_filter;
mod value_set;
