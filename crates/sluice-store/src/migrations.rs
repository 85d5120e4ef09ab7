//! Schema migrations, shared by both backends (the DDL is portable SQL).
//!
//! Each migration runs in its own transaction that first claims its version row, so two
//! processes starting together (a server and an admin command) apply it once.

/// `(version, name, sql)`, in order. Never edit an applied migration; add a new one.
pub(crate) const MIGRATIONS: &[(i64, &str, &str)] =
    &[(1, "identity_and_pipelines", include_str!("migrations/0001_identity_and_pipelines.sql"))];

pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS sluice_schema_migrations (\
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)";
