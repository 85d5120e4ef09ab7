//! Integration tests of the runtime, against a real SQLite store and the embedded log.

mod lifecycle;
