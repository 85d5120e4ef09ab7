//! The `postgres` sink's database steps: rows by `COPY` (into a staging table first in
//! `upsert` mode), reorg deletes and the position, in one transaction
//! ([`super::sql`] has the exactly-once rule).

use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sluice_core::pipeline::{SqlSinkConfig, SqlWriteMode};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection as _, Row as _};

use super::sql::{
    BlockHash, Cell, ColumnType, Fault, Layout, OFFSETS_TABLE, Row, SqlBackend, SqlError, Write,
    Written, already_applied, describe_url, positions_of, probe, text,
};

/// Connections a sink keeps: one per worker of the largest pod size.
const MAX_CONNECTIONS: u32 = 8;
/// Rows sent to `COPY` per message.
const COPY_CHUNK_BYTES: usize = 1 << 18;

#[derive(Debug)]
pub struct PgBackend {
    pool: PgPool,
    /// For the deploy's first connection, which fails at once (the pool would retry until
    /// its acquire timeout).
    options: PgConnectOptions,
    shown: Value,
}

impl PgBackend {
    /// A backend for the database at `url`; connects lazily.
    ///
    /// # Errors
    /// The URL is not a PostgreSQL one (the message does not repeat it).
    pub fn new(url: &str, _config: &SqlSinkConfig) -> Result<Self, String> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err("the connection secret must hold a postgres:// URL".to_owned());
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| "the connection secret does not hold a valid postgres:// URL".to_owned())?
            .application_name("sluice-sink");
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options.clone());
        Ok(Self { pool, options, shown: describe_url(url, "postgresql") })
    }
}

/// `"name"`, with quotes doubled (names are checked identifiers already).
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn qualified(layout: &Layout, table: &str) -> String {
    format!("{}.{}", quote(layout.schema.as_deref().unwrap_or("public")), quote(table))
}

fn type_name(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Key | ColumnType::Text => "text",
        ColumnType::BigInt => "bigint",
        ColumnType::Double => "double precision",
        ColumnType::Bool => "boolean",
        ColumnType::Numeric => "numeric",
        ColumnType::Timestamp => "timestamptz",
        ColumnType::Json => "jsonb",
    }
}

/// Classifies a driver error by SQLSTATE class.
pub(super) fn classify(error: &sqlx::Error) -> SqlError {
    let fault = match error {
        sqlx::Error::Database(db) => match db.code().as_deref().and_then(|code| code.get(..2)) {
            Some("22" | "23") => Fault::Data,
            Some("42" | "28" | "3D" | "3F" | "0A") => Fault::Config,
            _ => Fault::Unavailable,
        },
        sqlx::Error::Configuration(_) => Fault::Config,
        _ => Fault::Unavailable,
    };
    SqlError { message: format!("PostgreSQL: {error}"), fault }
}

/// The escape of a byte COPY's text format reads specially.
fn copy_escape(byte: u8) -> Option<&'static str> {
    match byte {
        b'\\' => Some("\\\\"),
        b'\t' => Some("\\t"),
        b'\n' => Some("\\n"),
        b'\r' => Some("\\r"),
        _ => None,
    }
}

/// `value` in COPY's text format.
fn copy_text(out: &mut String, cell: &Cell) {
    match cell {
        Cell::Null => out.push_str("\\N"),
        Cell::Int(n) => text::integer(out, *n),
        Cell::Float(f) => {
            let _ = write!(out, "{f:?}");
        }
        Cell::Bool(b) => out.push(if *b { 't' } else { 'f' }),
        Cell::Text(value) | Cell::Json(value) => text::escaped(out, value, copy_escape),
        Cell::Time(at) => {
            text::time(out, at);
            out.push_str("+00");
        }
    }
}

impl PgBackend {
    async fn create(&self, layout: &Layout) -> Result<(), sqlx::Error> {
        let schema = layout.schema.as_deref().unwrap_or("public");
        let exists = |name: String| {
            sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL").bind(name)
        };
        let has_schema: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema)
                .fetch_one(&self.pool)
                .await?;
        if !has_schema {
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", quote(schema)))
                .execute(&self.pool)
                .await?;
        }
        let table = qualified(layout, &layout.table);
        if !exists(table.clone()).fetch_one(&self.pool).await? {
            let mut columns: Vec<String> = layout
                .columns
                .iter()
                .map(|c| format!("{} {}", quote(&c.name), type_name(c.ty)))
                .collect();
            columns[0].push_str(" NOT NULL");
            if layout.mode == SqlWriteMode::Upsert {
                columns.push(format!("PRIMARY KEY ({})", quote("key")));
            }
            let sql = format!("CREATE TABLE IF NOT EXISTS {table} ({})", columns.join(", "));
            sqlx::query(&sql).execute(&self.pool).await?;
        }
        let offsets = qualified(layout, OFFSETS_TABLE);
        if !exists(offsets.clone()).fetch_one(&self.pool).await? {
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {offsets} (consumer text NOT NULL, source text NOT NULL, \
                 part integer NOT NULL, next_offset bigint NOT NULL, \
                 updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, source, part))"
            );
            sqlx::query(&sql).execute(&self.pool).await?;
        }
        Ok(())
    }

    /// What the sink needs of the tables: every column, and the privileges.
    async fn check(&self, layout: &Layout) -> Result<(), SqlError> {
        let schema = layout.schema.as_deref().unwrap_or("public");
        let table = qualified(layout, &layout.table);
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2",
        )
        .bind(schema)
        .bind(&layout.table)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| classify(&e))?;
        if found.is_empty() {
            return Err(SqlError::config(format!(
                "table {schema}.{} does not exist (create_table is false)",
                layout.table
            )));
        }
        let missing: Vec<&str> =
            layout.column_names().filter(|c| !found.iter().any(|f| f == c)).collect();
        if !missing.is_empty() {
            return Err(SqlError::config(format!(
                "table {schema}.{} has no column {}",
                layout.table,
                missing.join(", ")
            )));
        }
        let mut needs = vec![(table.clone(), "INSERT")];
        if layout.mode == SqlWriteMode::Upsert {
            needs.push((table.clone(), "UPDATE"));
        }
        if layout.block_hash.is_some() {
            needs.push((table, "DELETE"));
        }
        let offsets = qualified(layout, OFFSETS_TABLE);
        for privilege in ["SELECT", "INSERT", "UPDATE"] {
            needs.push((offsets.clone(), privilege));
        }
        for (table, privilege) in needs {
            let granted: bool = sqlx::query_scalar("SELECT has_table_privilege($1, $2)")
                .bind(&table)
                .bind(privilege)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| classify(&e))?;
            if !granted {
                return Err(SqlError::config(format!(
                    "the database user lacks {privilege} on {table} (docs/sinks.md lists the grants)"
                )));
            }
        }
        Ok(())
    }

    /// The rows in COPY's text format, a chunk of about [`COPY_CHUNK_BYTES`] at a time: the
    /// next chunk's rows are made (converted from their records, then written) while the
    /// database reads the last one.
    fn copy_chunks<'r>(
        mut rows: impl Iterator<Item = Row<'r>> + 'r,
    ) -> impl Iterator<Item = String> + 'r {
        std::iter::from_fn(move || {
            let mut out = String::new();
            for (_, cells) in rows.by_ref() {
                if out.is_empty() {
                    out.reserve(COPY_CHUNK_BYTES + 4096);
                }
                text::row(&mut out, &cells, '\t', copy_text);
                out.push('\n');
                if out.len() >= COPY_CHUNK_BYTES {
                    break;
                }
            }
            (!out.is_empty()).then_some(out)
        })
    }

    /// Locks the rows of `parts` of `(consumer, source)` in `offsets` and answers their
    /// positions. `FOR UPDATE` locks no row that is not there, so a partition's first write
    /// makes its row (position 0) first: a second writer of the pipeline then waits for the
    /// first and sees its position (rows made in partition order: no deadlock).
    async fn lock_positions(
        tx: &mut PgConnection,
        offsets: &str,
        consumer: &str,
        source: &str,
        parts: &[i32],
    ) -> Result<Vec<(u32, u64)>, sqlx::Error> {
        let lock = format!(
            "SELECT part, next_offset FROM {offsets} WHERE consumer = $1 AND source = $2 AND part = ANY($3) FOR UPDATE"
        );
        let mut stored =
            sqlx::query(&lock).bind(consumer).bind(source).bind(parts).fetch_all(&mut *tx).await?;
        if stored.len() < parts.len() {
            sqlx::query(&format!(
                "INSERT INTO {offsets} (consumer, source, part, next_offset, updated_at) \
                 SELECT $1, $2, p, 0, now() FROM unnest($3::int[]) AS t(p) ORDER BY p \
                 ON CONFLICT (consumer, source, part) DO NOTHING"
            ))
            .bind(consumer)
            .bind(source)
            .bind(parts)
            .execute(&mut *tx)
            .await?;
            stored =
                sqlx::query(&lock).bind(consumer).bind(source).bind(parts).fetch_all(tx).await?;
        }
        Ok(stored
            .iter()
            .map(|row| (row.get::<i32, _>(0) as u32, row.get::<i64, _>(1) as u64))
            .collect())
    }

    /// Deletes the rows of the blocks `orphaned` names (reorg markers' block hashes).
    async fn delete_orphaned(
        tx: &mut PgConnection,
        layout: &Layout,
        table: &str,
        orphaned: &[String],
    ) -> Result<(), sqlx::Error> {
        let by = match &layout.block_hash {
            Some(BlockHash::Column(column)) => quote(column),
            Some(BlockHash::InJson(column)) => format!("({} ->> 'block_hash')", quote(column)),
            None => return Ok(()),
        };
        if !orphaned.is_empty() {
            sqlx::query(&format!("DELETE FROM {table} WHERE {by} = ANY($1)"))
                .bind(orphaned)
                .execute(tx)
                .await?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl SqlBackend for PgBackend {
    async fn prepare(&self, layout: &Layout, create: bool) -> Result<(), SqlError> {
        probe::<PgConnection>(&self.options, "PostgreSQL", classify).await?;
        if create {
            self.create(layout).await.map_err(|e| classify(&e))?;
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
            "SELECT part, next_offset FROM {} WHERE consumer = $1 AND source = $2",
            qualified(layout, OFFSETS_TABLE)
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
        let mut conn = self.pool.acquire().await.map_err(fail)?;
        let mut tx = conn.begin().await.map_err(fail)?;
        let offsets = qualified(layout, OFFSETS_TABLE);
        let position = write.position;
        let parts: Vec<i32> = position.offsets.iter().map(|(p, _)| *p as i32).collect();
        let nexts: Vec<i64> = position.offsets.iter().map(|(_, n)| *n as i64).collect();
        let stored =
            Self::lock_positions(&mut tx, &offsets, position.group, position.source, &parts)
                .await
                .map_err(fail)?;
        if already_applied(&stored, position.offsets) {
            return Ok(Written::AlreadyApplied);
        }
        write.rows.skip_written(&stored);
        let table = qualified(layout, &layout.table);
        let columns: Vec<String> = layout.column_names().map(quote).collect();
        let columns = columns.join(", ");
        if write.rows.may_have_rows() {
            let upsert = layout.mode == SqlWriteMode::Upsert;
            let target = if upsert {
                // Rows of one key: the last one wins (ON CONFLICT cannot touch a row twice).
                let stage = quote(&format!("sluice_stage_{}", layout.table));
                // No "already exists, skipping" notice for every batch.
                sqlx::query("SET LOCAL client_min_messages = warning")
                    .execute(&mut *tx)
                    .await
                    .map_err(fail)?;
                sqlx::query(&format!(
                    "CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {columns} FROM {table} WITH NO DATA"
                ))
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
                stage
            } else {
                table.clone()
            };
            let mut copy = tx
                .copy_in_raw(&format!("COPY {target} ({columns}) FROM STDIN"))
                .await
                .map_err(fail)?;
            for chunk in Self::copy_chunks(write.rows.rows()) {
                copy.send(chunk.into_bytes()).await.map_err(fail)?;
            }
            copy.finish().await.map_err(fail)?;
            if upsert {
                let updates: Vec<String> = layout
                    .column_names()
                    .skip(1)
                    .map(|c| format!("{0} = EXCLUDED.{0}", quote(c)))
                    .collect();
                let action = if updates.is_empty() {
                    "DO NOTHING".to_owned()
                } else {
                    format!("DO UPDATE SET {}", updates.join(", "))
                };
                sqlx::query(&format!(
                    "INSERT INTO {table} ({columns}) SELECT DISTINCT ON (\"key\") {columns} FROM {target} \
                     ORDER BY \"key\", ctid DESC ON CONFLICT (\"key\") {action}"
                ))
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
            }
        }
        Self::delete_orphaned(&mut tx, layout, &table, write.rows.orphaned())
            .await
            .map_err(fail)?;
        sqlx::query(&format!(
            "INSERT INTO {offsets} AS stored (consumer, source, part, next_offset, updated_at) \
             SELECT $1, $2, p, n, now() FROM unnest($3::int[], $4::bigint[]) AS t(p, n) \
             ON CONFLICT (consumer, source, part) DO UPDATE \
             SET next_offset = GREATEST(stored.next_offset, EXCLUDED.next_offset), updated_at = now()"
        ))
        .bind(position.group)
        .bind(position.source)
        .bind(&parts)
        .bind(&nexts)
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
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
    fn copy_text_escapes_what_copy_reads_specially() {
        let mut out = String::new();
        for cell in [
            Cell::Text("a\tb\\c\nd".into()),
            Cell::Null,
            Cell::Int(-3),
            Cell::Bool(true),
            Cell::Float(0.5),
        ] {
            copy_text(&mut out, &cell);
            out.push('|');
        }
        assert_eq!(out, "a\\tb\\\\c\\nd|\\N|-3|t|0.5|");
    }

    #[test]
    fn copy_rows_of_a_record_are_the_exact_bytes_copy_reads() {
        let config =
            super::super::sql::layout::tests::config(sluice_core::pipeline::SqlColumns::Auto);
        let layout = Layout::new(&config, "erc20_token_transfer");
        let record = br#"{"token_address":"0xA","token_name":"tab\there","token_symbol":"a\\b","from_address":"0x1","raw_amount_str":"1000003","raw_amount":1000003.0,"amount_str":"1.000003","amount":1.25,"transaction_hash":"0xt","transaction_index":-4,"log_index":9223372036854775807,"block_number":30000000,"block_timestamp":"2026-11-21T12:00:00.5+01:00","block_hash":"0xh","note":{"a":null,"b":[1,"x\ny"]}}"#;
        let super::super::sql::Converted::Row { key, cells } =
            layout.convert(b"0xt:1", record).unwrap()
        else {
            panic!("a row")
        };
        let rows = [(key, cells)];
        let text: String = PgBackend::copy_chunks(rows.iter().cloned()).collect();
        let names: Vec<&str> = layout.column_names().collect();
        let got: Vec<(&str, &str)> =
            names.iter().copied().zip(text.trim_end_matches('\n').split('\t')).collect();
        let want = [
            ("key", "0xt:1"),
            ("token_address", "0xA"),
            ("token_name", "tab\\there"),
            ("token_symbol", "a\\\\b"),
            ("from_address", "0x1"),
            ("to_address", "\\N"),
            ("raw_amount_str", "1000003"),
            ("raw_amount", "1000003.0"),
            ("amount_str", "1.000003"),
            ("amount", "1.25"),
            ("transaction_hash", "0xt"),
            ("transaction_index", "-4"),
            ("log_index", "9223372036854775807"),
            ("block_number", "30000000"),
            ("block_timestamp", "2026-11-21 11:00:00.500000+00"),
            ("block_hash", "0xh"),
            ("extra", r#"{"note":{"a":null,"b":[1,"x\\ny"]}}"#),
        ];
        let mut want: Vec<(&str, &str)> = want.to_vec();
        want.sort_unstable();
        let mut got = got;
        got.sort_unstable();
        assert_eq!(got, want);
        assert!(text.ends_with('\n') && text.lines().count() == 1, "{text:?}");
    }

    #[test]
    fn copy_chunks_are_whole_rows_of_about_a_chunk_each_and_miss_none() {
        // Rows of 1,003 bytes ("000…0\t7\n"): a chunk is cut at the row that reaches
        // COPY_CHUNK_BYTES, so three chunks hold exactly `3 * per_chunk` rows.
        let row = |n: usize| ("k", vec![Cell::Text(format!("{n:0>1000}").into()), Cell::Int(7)]);
        let per_chunk = COPY_CHUNK_BYTES.div_ceil(1003);
        let rows: Vec<Row<'_>> = (0..3 * per_chunk + 1).map(row).collect();
        let chunks: Vec<String> = PgBackend::copy_chunks(rows.iter().cloned()).collect();
        assert_eq!(chunks.len(), 4, "three full chunks and one row");
        assert!(chunks.iter().all(|c| c.ends_with('\n') && c.len() < COPY_CHUNK_BYTES + 2048));
        assert_eq!(chunks[3].len(), 1003);
        let lines: Vec<&str> = chunks.iter().flat_map(|c| c.lines()).collect();
        assert_eq!(lines.len(), rows.len());
        assert_eq!(lines[3 * per_chunk], format!("{:0>1000}\t7", 3 * per_chunk));
        assert_eq!(PgBackend::copy_chunks(std::iter::empty()).count(), 0);
    }
}
