//! The `mysql` sink's database steps (MySQL and MariaDB, InnoDB): rows by multi-row
//! `INSERT` (`… ON DUPLICATE KEY UPDATE` in `upsert` mode), reorg deletes and the position,
//! in one transaction ([`super::sql`] has the exactly-once rule).
//!
//! The rows travel as SQL text over the text protocol, escaped here, in statements of up
//! to `STATEMENT_BYTES`: a prepared statement per batch would cost a round trip more and
//! a placeholder per value (at most 65,535 of them).

use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sluice_core::pipeline::{SqlSinkConfig, SqlWriteMode};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection as _, Executor as _, Row as _};

use super::sql::{
    BlockHash, Cell, ColumnType, Fault, Layout, OFFSETS_TABLE, Row, SqlBackend, SqlError, Write,
    Written, already_applied, describe_url, positions_of, probe, text,
};

const MAX_CONNECTIONS: u32 = 8;
/// The size an INSERT statement is cut at (MySQL's `max_allowed_packet` is 16 MiB or more
/// by default on MariaDB 10.11 and MySQL 8): small enough that a whole statement is in the
/// socket's buffers at once, so the database runs it while the next is made.
const STATEMENT_BYTES: usize = 1 << 18;
/// Longest key a row can have (the key column is `VARCHAR(255)`, indexable in `upsert` mode).
const MAX_KEY_CHARS: usize = 255;

#[derive(Debug)]
pub struct MySqlBackend {
    pool: MySqlPool,
    /// For the deploy's first connection, which fails at once (the pool would retry until
    /// its acquire timeout).
    options: MySqlConnectOptions,
    /// The URL's database, used when the sink names no `schema`.
    database: Option<String>,
    shown: Value,
}

impl MySqlBackend {
    /// A backend for the database at `url`; connects lazily.
    ///
    /// # Errors
    /// The URL is not a MySQL one (the message does not repeat it).
    pub fn new(url: &str, config: &SqlSinkConfig) -> Result<Self, String> {
        if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
            return Err("the connection secret must hold a mysql:// URL".to_owned());
        }
        let url = url.replacen("mariadb://", "mysql://", 1);
        let options = MySqlConnectOptions::from_str(&url)
            .map_err(|_| "the connection secret does not hold a valid mysql:// URL".to_owned())?
            .charset("utf8mb4");
        let database = url::Url::parse(&url)
            .ok()
            .map(|u| u.path().trim_start_matches('/').to_owned())
            .filter(|d| !d.is_empty());
        if config.schema.is_none() && database.is_none() {
            return Err("name the database in the URL (mysql://host/db) or in schema".to_owned());
        }
        let pool = MySqlPoolOptions::new()
            // The rows travel as literals escaped with backslashes.
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(
                        "SET SESSION sql_mode = REPLACE(@@sql_mode, 'NO_BACKSLASH_ESCAPES', '')",
                    )
                    .await?;
                    // No gap locks: two workers' first positions would deadlock on them.
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await
                        .map(|_| ())
                })
            })
            .max_connections(MAX_CONNECTIONS)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options.clone());
        Ok(Self { pool, options, database, shown: describe_url(&url, "mysql") })
    }

    fn schema<'a>(&'a self, layout: &'a Layout) -> &'a str {
        layout.schema.as_deref().or(self.database.as_deref()).unwrap_or_default()
    }

    fn qualified(&self, layout: &Layout, table: &str) -> String {
        format!("{}.{}", quote(self.schema(layout)), quote(table))
    }
}

fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

fn type_name(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Key => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        ColumnType::Text => "MEDIUMTEXT CHARACTER SET utf8mb4",
        ColumnType::BigInt => "BIGINT",
        ColumnType::Double => "DOUBLE",
        ColumnType::Bool => "BOOLEAN",
        ColumnType::Numeric => "VARCHAR(100) CHARACTER SET ascii",
        ColumnType::Timestamp => "DATETIME(6)",
        ColumnType::Json => "JSON",
    }
}

/// Classifies a driver error by SQLSTATE class.
fn classify(error: &sqlx::Error) -> SqlError {
    let fault = match error {
        sqlx::Error::Database(db) => match db.code().as_deref().and_then(|code| code.get(..2)) {
            Some("22" | "23" | "HY") if is_data_error(db.message()) => Fault::Data,
            Some("22" | "23") => Fault::Data,
            Some("42" | "28" | "3D") => Fault::Config,
            _ => Fault::Unavailable,
        },
        sqlx::Error::Configuration(_) => Fault::Config,
        _ => Fault::Unavailable,
    };
    SqlError { message: format!("MySQL: {error}"), fault }
}

/// MySQL reports some value errors with the general state `HY000`.
fn is_data_error(message: &str) -> bool {
    ["Incorrect", "Out of range", "Data too long", "Invalid JSON"]
        .iter()
        .any(|m| message.contains(m))
}

/// `value` as a quoted MySQL string literal.
fn literal(out: &mut String, value: &str) {
    out.push('\'');
    text::escaped(out, value, |byte| match byte {
        b'\'' => Some("''"),
        b'\\' => Some("\\\\"),
        b'\0' => Some("\\0"),
        b'\n' => Some("\\n"),
        b'\r' => Some("\\r"),
        0x1a => Some("\\Z"),
        _ => None,
    });
    out.push('\'');
}

fn value(out: &mut String, cell: &Cell) {
    match cell {
        Cell::Null => out.push_str("NULL"),
        Cell::Int(n) => text::integer(out, *n),
        Cell::Float(f) => {
            let _ = write!(out, "{f:?}");
        }
        Cell::Bool(b) => out.push_str(if *b { "TRUE" } else { "FALSE" }),
        Cell::Text(text) | Cell::Json(text) => literal(out, text),
        Cell::Time(at) => {
            out.push('\'');
            text::time(out, at);
            out.push('\'');
        }
    }
}

impl MySqlBackend {
    async fn table_columns(&self, layout: &Layout, table: &str) -> Result<Vec<String>, SqlError> {
        sqlx::query_scalar::<_, String>(
            "SELECT CAST(column_name AS CHAR) FROM information_schema.columns WHERE table_schema = ? AND table_name = ?",
        )
        .bind(self.schema(layout))
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| classify(&e))
    }

    async fn create(&self, layout: &Layout) -> Result<(), SqlError> {
        let run = |sql: String| async move {
            (&self.pool).execute(sql.as_str()).await.map(|_| ()).map_err(|e| classify(&e))
        };
        if self.table_columns(layout, &layout.table).await?.is_empty() {
            let mut columns: Vec<String> = layout
                .columns
                .iter()
                .map(|c| format!("{} {}", quote(&c.name), type_name(c.ty)))
                .collect();
            columns[0].push_str(" NOT NULL");
            if layout.mode == SqlWriteMode::Upsert {
                columns.push("PRIMARY KEY (`key`)".to_owned());
            }
            run(format!(
                "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                self.qualified(layout, &layout.table),
                columns.join(", ")
            ))
            .await?;
        }
        if self.table_columns(layout, OFFSETS_TABLE).await?.is_empty() {
            run(format!(
                "CREATE TABLE IF NOT EXISTS {} (consumer VARCHAR(255) CHARACTER SET ascii NOT NULL, \
                 source VARCHAR(255) CHARACTER SET ascii NOT NULL, part INT NOT NULL, \
                 next_offset BIGINT NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                 PRIMARY KEY (consumer, source, part)) ENGINE=InnoDB",
                self.qualified(layout, OFFSETS_TABLE)
            ))
            .await?;
        }
        Ok(())
    }

    async fn check(&self, layout: &Layout) -> Result<(), SqlError> {
        let schema = self.schema(layout);
        let found = self.table_columns(layout, &layout.table).await?;
        if found.is_empty() {
            return Err(SqlError::config(format!(
                "table {schema}.{} does not exist (or the user cannot see it)",
                layout.table
            )));
        }
        let missing: Vec<&str> = layout
            .column_names()
            .filter(|c| !found.iter().any(|f| f.eq_ignore_ascii_case(c)))
            .collect();
        if !missing.is_empty() {
            return Err(SqlError::config(format!(
                "table {schema}.{} has no column {}",
                layout.table,
                missing.join(", ")
            )));
        }
        if self.table_columns(layout, OFFSETS_TABLE).await?.is_empty() {
            return Err(SqlError::config(format!(
                "table {schema}.{OFFSETS_TABLE} does not exist (create_table is false)"
            )));
        }
        // Privileges: each statement a batch runs, on no rows, in a transaction rolled back
        // (MySQL checks a statement's privileges whatever rows it touches).
        let (table, offsets) =
            (self.qualified(layout, &layout.table), self.qualified(layout, OFFSETS_TABLE));
        let mut probes = vec![
            format!("SELECT part FROM {offsets} WHERE consumer = '' FOR UPDATE"),
            format!(
                "INSERT INTO {offsets} (consumer, source, part, next_offset) SELECT '', '', 0, 0 \
                 FROM DUAL WHERE 1 = 0 ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset)"
            ),
        ];
        let upsert = if layout.mode == SqlWriteMode::Upsert {
            " ON DUPLICATE KEY UPDATE `key` = VALUES(`key`)"
        } else {
            ""
        };
        probes.push(format!("INSERT INTO {table} (`key`) SELECT '' FROM DUAL WHERE 1 = 0{upsert}"));
        if layout.block_hash.is_some() {
            probes.push(format!("DELETE FROM {table} WHERE 1 = 0"));
        }
        let mut conn = self.pool.acquire().await.map_err(|e| classify(&e))?;
        let mut tx = conn.begin().await.map_err(|e| classify(&e))?;
        for probe in &probes {
            (&mut *tx)
                .execute(probe.as_str())
                .await
                .map_err(|e| SqlError::config(classify(&e).message))?;
        }
        tx.rollback().await.map_err(|e| classify(&e))?;
        Ok(())
    }

    /// The INSERT statements of `rows`, each of about [`STATEMENT_BYTES`], made one at a
    /// time as they are taken (the next one while the database runs the last).
    fn inserts<'r>(
        &self,
        layout: &Layout,
        mut rows: impl Iterator<Item = Row<'r>>,
    ) -> impl Iterator<Item = Result<String, SqlError>> {
        let columns: Vec<String> = layout.column_names().map(quote).collect();
        let head = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.qualified(layout, &layout.table),
            columns.join(", ")
        );
        let tail = if layout.mode == SqlWriteMode::Upsert {
            let updates: Vec<String> =
                columns.iter().skip(1).map(|c| format!("{c} = VALUES({c})")).collect();
            if updates.is_empty() {
                " ON DUPLICATE KEY UPDATE `key` = `key`".to_owned()
            } else {
                format!(" ON DUPLICATE KEY UPDATE {}", updates.join(", "))
            }
        } else {
            String::new()
        };
        std::iter::from_fn(move || {
            let mut sql = String::new();
            for (key, cells) in rows.by_ref() {
                if key.chars().count() > MAX_KEY_CHARS {
                    return Some(Err(SqlError {
                        message: format!("record key longer than {MAX_KEY_CHARS} characters"),
                        fault: Fault::Data,
                    }));
                }
                if sql.is_empty() {
                    sql.reserve(STATEMENT_BYTES + 4096);
                    sql.push_str(&head);
                } else {
                    sql.push(',');
                }
                sql.push('(');
                text::row(&mut sql, &cells, ',', value);
                sql.push(')');
                if sql.len() >= STATEMENT_BYTES {
                    break;
                }
            }
            (!sql.is_empty()).then(|| {
                sql.push_str(&tail);
                Ok(sql)
            })
        })
    }
}

#[async_trait::async_trait]
impl SqlBackend for MySqlBackend {
    async fn prepare(&self, layout: &Layout, create: bool) -> Result<(), SqlError> {
        probe::<MySqlConnection>(&self.options, "MySQL", classify).await?;
        if create {
            self.create(layout).await?;
        }
        self.check(layout).await
    }

    async fn positions(
        &self,
        layout: &Layout,
        consumer: &str,
        source: &str,
    ) -> Result<Vec<(u32, u64)>, SqlError> {
        let sql = format!(
            "SELECT part, next_offset FROM {} WHERE consumer = ? AND source = ?",
            self.qualified(layout, OFFSETS_TABLE)
        );
        let rows = sqlx::query(&sql)
            .bind(consumer)
            .bind(source)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(&e))?;
        Ok(positions_of(&rows))
    }

    async fn write(&self, layout: &Layout, write: Write<'_>) -> Result<Written, SqlError> {
        let fail = |e: sqlx::Error| classify(&e);
        let position = write.position;
        let offsets = self.qualified(layout, OFFSETS_TABLE);
        let mut text = String::new();
        literal(&mut text, position.group);
        let consumer = std::mem::take(&mut text);
        literal(&mut text, position.source);
        let source = text;
        let parts: Vec<String> = position.offsets.iter().map(|(p, _)| p.to_string()).collect();
        let mut conn = self.pool.acquire().await.map_err(fail)?;
        let mut tx = conn.begin().await.map_err(fail)?;
        let select = format!(
            "SELECT part, next_offset FROM {offsets} WHERE consumer = {consumer} AND source = {source} AND part IN ({}) FOR UPDATE",
            if parts.is_empty() { "-1".to_owned() } else { parts.join(",") }
        );
        let mut stored = (&mut *tx).fetch_all(select.as_str()).await.map_err(fail)?;
        if stored.len() < parts.len() {
            // `FOR UPDATE` locks no row that is not there: a partition's first write makes its
            // row (position 0) and locks it, so that a second writer of the pipeline waits
            // for the first and then sees its position.
            let mut sorted: Vec<&(u32, u64)> = position.offsets.iter().collect();
            sorted.sort_unstable();
            let rows: Vec<String> = sorted
                .iter()
                .map(|(part, _)| format!("({consumer}, {source}, {part}, 0)"))
                .collect();
            let make = format!(
                "INSERT IGNORE INTO {offsets} (consumer, source, part, next_offset) VALUES {}",
                rows.join(",")
            );
            (&mut *tx).execute(make.as_str()).await.map_err(fail)?;
            stored = (&mut *tx).fetch_all(select.as_str()).await.map_err(fail)?;
        }
        let stored: Vec<(u32, u64)> = stored
            .iter()
            .map(|row| (row.get::<i32, _>(0) as u32, row.get::<i64, _>(1) as u64))
            .collect();
        if already_applied(&stored, position.offsets) {
            return Ok(Written::AlreadyApplied);
        }
        write.rows.skip_written(&stored);
        let mut statements = self.inserts(layout, write.rows.rows());
        let mut next = statements.next().transpose()?;
        while let Some(statement) = next {
            // The next statement is made while the database runs this one.
            let (done, made) = tokio::join!((&mut *tx).execute(statement.as_str()), async {
                statements.next().transpose()
            });
            done.map_err(fail)?;
            next = made?;
        }
        let orphaned = write.rows.orphaned();
        if !orphaned.is_empty() {
            let table = self.qualified(layout, &layout.table);
            let by = match &layout.block_hash {
                Some(BlockHash::Column(column)) => quote(column),
                Some(BlockHash::InJson(column)) => {
                    format!("JSON_UNQUOTE(JSON_EXTRACT({}, '$.block_hash'))", quote(column))
                }
                None => String::new(),
            };
            if !by.is_empty() {
                let mut hashes = String::new();
                for (index, hash) in orphaned.iter().enumerate() {
                    if index > 0 {
                        hashes.push(',');
                    }
                    literal(&mut hashes, hash);
                }
                let delete = format!("DELETE FROM {table} WHERE {by} IN ({hashes})");
                (&mut *tx).execute(delete.as_str()).await.map_err(fail)?;
            }
        }
        if !position.offsets.is_empty() {
            let values: Vec<String> = position
                .offsets
                .iter()
                .map(|(part, next)| format!("({consumer},{source},{part},{next})"))
                .collect();
            let upsert = format!(
                "INSERT INTO {offsets} (consumer, source, part, next_offset) VALUES {} \
                 ON DUPLICATE KEY UPDATE next_offset = GREATEST(next_offset, VALUES(next_offset)), \
                 updated_at = CURRENT_TIMESTAMP(6)",
                values.join(",")
            );
            (&mut *tx).execute(upsert.as_str()).await.map_err(fail)?;
        }
        tx.commit().await.map_err(fail)?;
        Ok(Written::Applied)
    }

    fn connection(&self) -> Value {
        self.shown.clone()
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_quotes_backslashes_and_control_characters() {
        let mut out = String::new();
        literal(&mut out, "it's a \\ \n\0 test");
        assert_eq!(out, "'it''s a \\\\ \\n\\0 test'");
    }
}
