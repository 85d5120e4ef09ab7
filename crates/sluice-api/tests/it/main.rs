//! Integration tests of the HTTP API, driving the real router without sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backfills;
mod bad_input;
mod boundary;
mod chains;
mod datasets;
mod deployments;
mod external_sinks;
mod filter_values;
mod harness;
mod object_storage_sink;
mod openapi;
mod permissions;
mod pipeline_stack;
mod pipelines;
mod poison;
mod prices;
mod rabbitmq_sink;
mod scripts;
mod services;
mod set_history;
mod sink_outage;
mod spec;
mod stats;
mod tcp_proxy;
mod tenancy;
mod transforms;
mod validation;
