//! Integration tests of the warehouse and the archiver, on the embedded log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod archiver;
mod staging;
