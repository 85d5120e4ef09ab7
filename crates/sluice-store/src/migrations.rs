//! Schema migrations, shared by both backends.
//!
//! Most DDL is portable SQL and is written once ([`Sql::Portable`]). When the backends need
//! different statements for the same change (SQLite cannot add a key column in place, and
//! the two spell auto-numbered columns differently) a migration carries one script per
//! backend ([`Sql::PerBackend`]); the schemas they leave behind must behave the same, which
//! the conformance suite checks.
//!
//! Each migration runs in its own transaction that first claims its version row, so two
//! processes starting together (a server and an admin command) apply it once.

/// The database a store runs on, to pick a migration's script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The statements of one migration.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sql {
    /// One script both backends run.
    Portable(&'static str),
    /// A script per backend.
    PerBackend { sqlite: &'static str, postgres: &'static str },
}

impl Sql {
    /// The script `backend` runs.
    pub(crate) fn for_backend(self, backend: Backend) -> &'static str {
        match (self, backend) {
            (Self::Portable(sql), _) => sql,
            (Self::PerBackend { sqlite, .. }, Backend::Sqlite) => sqlite,
            (Self::PerBackend { postgres, .. }, Backend::Postgres) => postgres,
        }
    }
}

/// One schema change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: Sql,
}

/// Every migration, in order. Never edit an applied migration; add a new one.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "identity_and_pipelines",
        sql: Sql::Portable(include_str!("migrations/0001_identity_and_pipelines.sql")),
    },
    Migration {
        version: 2,
        name: "filter_value_seq_and_deployments",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0002_filter_value_seq_and_deployments.sqlite.sql"),
            postgres: include_str!("migrations/0002_filter_value_seq_and_deployments.postgres.sql"),
        },
    },
    Migration {
        version: 3,
        name: "datasets",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0003_datasets.sqlite.sql"),
            postgres: include_str!("migrations/0003_datasets.postgres.sql"),
        },
    },
    Migration {
        version: 4,
        name: "prices",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0004_prices.sqlite.sql"),
            postgres: include_str!("migrations/0004_prices.postgres.sql"),
        },
    },
    Migration {
        version: 5,
        name: "metrics",
        sql: Sql::Portable(include_str!("migrations/0005_metrics.sql")),
    },
    Migration {
        version: 6,
        name: "filter_values_append_only",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0006_filter_values_append_only.sqlite.sql"),
            postgres: include_str!("migrations/0006_filter_values_append_only.postgres.sql"),
        },
    },
    Migration {
        version: 7,
        name: "prices_trade_ids_and_writes",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0007_prices_trade_ids_and_writes.sqlite.sql"),
            postgres: include_str!("migrations/0007_prices_trade_ids_and_writes.postgres.sql"),
        },
    },
    Migration {
        version: 8,
        name: "price_history_columns",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0008_price_history_columns.sqlite.sql"),
            postgres: include_str!("migrations/0008_price_history_columns.postgres.sql"),
        },
    },
    Migration {
        version: 9,
        name: "price_trade_id_blocks",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0009_price_trade_id_blocks.sqlite.sql"),
            postgres: include_str!("migrations/0009_price_trade_id_blocks.postgres.sql"),
        },
    },
];

pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS sluice_schema_migrations (\
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)";
