//! Integration tests of the HTTP API, driving the real router without sockets.

mod harness;
mod openapi;
mod permissions;
mod pipelines;
mod validation;
