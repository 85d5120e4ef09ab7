//! Integration tests of `sluice-store`: one conformance suite run on SQLite and PostgreSQL.

mod conformance;
