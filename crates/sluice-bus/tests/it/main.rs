//! Behaviour of the embedded stream log through the `StreamLog` role.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log;
