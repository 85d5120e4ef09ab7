//! Integration tests of the HTTP API, driving the real router without sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod boundary;
mod datasets;
mod deployments;
mod filter_values;
mod harness;
mod openapi;
mod permissions;
mod pipeline_stack;
mod pipelines;
mod prices;
mod scripts;
mod services;
mod stats;
mod transforms;
mod validation;
