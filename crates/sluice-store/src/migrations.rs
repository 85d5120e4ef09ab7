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

use crate::dialect::{Conn, Dialect, Row};
use crate::{Result, Store, StoreError};

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

impl<D: Dialect> Store<D>
where
    for<'c> &'c mut Conn<D>: sqlx::Executor<'c, Database = D::Db>,
    for<'q> <D::Db as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, D::Db>,
    for<'q> i64: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> bool: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> String: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> &'q str: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> &'q [u8]: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Vec<u8>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> f64: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Option<i64>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Option<bool>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Option<String>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Option<Vec<u8>>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    &'static str: sqlx::ColumnIndex<Row<D>>,
{
    /// Applies every migration not applied yet.
    ///
    /// # Errors
    /// The first migration that fails, by version and name.
    pub async fn migrate(&self) -> Result<()> {
        sqlx::query(crate::migrations::CREATE_TABLE).execute(&self.pool).await?;
        for migration in crate::migrations::MIGRATIONS {
            let (version, name) = (migration.version, migration.name);
            let sql = migration.sql.for_backend(D::BACKEND);
            let fail = |source| StoreError::Migration { version, name, source };
            let mut tx = self.pool.begin().await.map_err(fail)?;
            let claimed = sqlx::query(
                "INSERT INTO sluice_schema_migrations (version, name, applied_at) \
                 VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING",
            )
            .bind(version)
            .bind(name)
            .bind(crate::store::now())
            .execute(&mut *tx)
            .await
            .map_err(fail)
            .map(|done| D::rows_affected(&done))?;
            if claimed == 1 {
                sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(fail)?;
                tracing::info!(version, name, "applied migration");
            }
            tx.commit().await.map_err(fail)?;
        }
        Ok(())
    }
}
