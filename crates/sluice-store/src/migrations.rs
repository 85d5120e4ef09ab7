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

use crate::dialect::StoreBackend;
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
    /// A change to rows already stored that SQL cannot compute, written in Rust: run before
    /// its version is recorded, in transactions of its own, and safe to run again (by a
    /// process that stopped half-way, or by two processes starting together).
    Data(DataStep),
}

/// The migrations written in Rust ([`Sql::Data`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum DataStep {
    /// Packs the history point of every candle row written before migration 8
    /// ([`Store::fill_history_points`]).
    FillHistoryPoints,
    /// Moves trade ids stored a row per trade (before migration 9) into blocks and drops
    /// the old table ([`Store::move_trade_ids`]).
    MoveTradeIds,
}

impl Sql {
    /// The script `backend` runs; `None` for a data step.
    pub(crate) fn for_backend(self, backend: Backend) -> Option<&'static str> {
        match (self, backend) {
            (Self::Portable(sql), _) => Some(sql),
            (Self::PerBackend { sqlite, .. }, Backend::Sqlite) => Some(sqlite),
            (Self::PerBackend { postgres, .. }, Backend::Postgres) => Some(postgres),
            (Self::Data(_), _) => None,
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
    Migration {
        version: 10,
        name: "price_history_points_filled",
        sql: Sql::Data(DataStep::FillHistoryPoints),
    },
    Migration {
        version: 11,
        name: "price_trade_ids_moved",
        sql: Sql::Data(DataStep::MoveTradeIds),
    },
    Migration {
        version: 12,
        name: "org_secrets",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0012_org_secrets.sqlite.sql"),
            postgres: include_str!("migrations/0012_org_secrets.postgres.sql"),
        },
    },
    Migration {
        version: 13,
        name: "backfill_jobs",
        sql: Sql::Portable(include_str!("migrations/0013_backfill_jobs.sql")),
    },
    Migration {
        version: 14,
        name: "nodes",
        sql: Sql::Portable(include_str!("migrations/0014_nodes.sql")),
    },
    Migration {
        version: 15,
        name: "node_report_seq",
        sql: Sql::Portable(include_str!("migrations/0015_node_report_seq.sql")),
    },
    Migration {
        version: 16,
        name: "deployments_seq",
        sql: Sql::Portable(include_str!("migrations/0016_deployments_seq.sql")),
    },
    Migration {
        version: 17,
        name: "datasets_seq",
        sql: Sql::Portable(include_str!("migrations/0017_datasets_seq.sql")),
    },
    Migration {
        version: 18,
        name: "events",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0018_events.sqlite.sql"),
            postgres: include_str!("migrations/0018_events.postgres.sql"),
        },
    },
    Migration {
        version: 19,
        name: "filter_set_history",
        sql: Sql::PerBackend {
            sqlite: include_str!("migrations/0019_filter_set_history.sqlite.sql"),
            postgres: include_str!("migrations/0019_filter_set_history.postgres.sql"),
        },
    },
];

pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS sluice_schema_migrations (\
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)";

impl<D: StoreBackend> Store<D> {
    /// Applies every migration not applied yet.
    ///
    /// # Errors
    /// The first migration that fails, by version and name.
    pub async fn migrate(&self) -> Result<()> {
        sqlx::query(crate::migrations::CREATE_TABLE).execute(&self.pool).await?;
        for migration in crate::migrations::MIGRATIONS {
            let (version, name) = (migration.version, migration.name);
            let fail = |source| StoreError::Migration { version, name, source };
            let Some(sql) = migration.sql.for_backend(D::BACKEND) else {
                self.run_data_step(migration).await?;
                continue;
            };
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

    /// Runs data migration `migration` unless its version is recorded, then records it.
    async fn run_data_step(&self, migration: &Migration) -> Result<()> {
        let (version, name) = (migration.version, migration.name);
        let fail = |source| StoreError::Migration { version, name, source };
        let done = sqlx::query("SELECT 1 AS done FROM sluice_schema_migrations WHERE version = $1")
            .bind(version)
            .fetch_optional(&self.pool)
            .await
            .map_err(fail)?;
        if done.is_some() {
            return Ok(());
        }
        let rows = match migration.sql {
            Sql::Data(DataStep::FillHistoryPoints) => self.fill_history_points().await,
            Sql::Data(DataStep::MoveTradeIds) => self.move_trade_ids().await,
            Sql::Portable(_) | Sql::PerBackend { .. } => Ok(0),
        }
        .map_err(|error| match error {
            StoreError::Database(source) => fail(source),
            other => other,
        })?;
        sqlx::query(
            "INSERT INTO sluice_schema_migrations (version, name, applied_at) \
             VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING",
        )
        .bind(version)
        .bind(name)
        .bind(crate::store::now())
        .execute(&self.pool)
        .await
        .map_err(fail)?;
        tracing::info!(version, name, rows, "applied data migration");
        Ok(())
    }
}
