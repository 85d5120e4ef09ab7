//! Dataset statements particular to PostgreSQL.

use std::collections::HashSet;

use sqlx::Row as _;

use crate::datasets::{DatasetSql, SCAN_PAGE};
use crate::{PgDialect, Result};

/// Values per bulk statement, bound as one `text[]`.
const VALUES_PER_STATEMENT: usize = 50_000;

impl DatasetSql for PgDialect {
    /// Locks the dataset row against its other writers and its deletion until commit.
    const LOCK_DATASET: &str = "SELECT seq, id, owner_user_id, name, entry_count, \
        version, created_at, updated_at FROM datasets WHERE id = $1 AND owner_user_id = $2 FOR UPDATE";

    /// One `INSERT … SELECT … FROM UNNEST($2::text[])` per chunk, without `ON CONFLICT` (a
    /// speculative insertion costs about two and a half times a plain one). Entries already
    /// present are left out instead, which is safe because the caller holds the dataset lock and
    /// `values` holds each value once; as for filter values:
    /// - when the dataset holds at most as many entries as the request, they are read (a read
    ///   costs less than a probe) and only the missing values are inserted;
    /// - otherwise each value is probed in the primary key by a `LIMIT`ed lateral subquery.
    async fn insert_entries(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        seq: i64,
        values: &[&str],
        size: u64,
    ) -> Result<u64> {
        if values.is_empty() {
            return Ok(0);
        }
        let missing: Vec<&str>;
        let (values, sql) = if size <= values.len() as u64 {
            let present = if size == 0 { HashSet::new() } else { read_entries(tx, seq).await? };
            missing = values.iter().copied().filter(|v| !present.contains(*v)).collect();
            (
                missing.as_slice(),
                "INSERT INTO dataset_entries (dataset_seq, value) \
                 SELECT $1, v FROM UNNEST($2::text[]) AS v",
            )
        } else {
            (
                values,
                "INSERT INTO dataset_entries (dataset_seq, value) \
                 SELECT $1, v FROM UNNEST($2::text[]) AS v \
                 LEFT JOIN LATERAL (SELECT 1 AS hit FROM dataset_entries e \
                     WHERE e.dataset_seq = $1 AND e.value = v LIMIT 1) AS present \
                 ON true WHERE present.hit IS NULL",
            )
        };
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            added +=
                sqlx::query(sql).bind(seq).bind(chunk).execute(&mut **tx).await?.rows_affected();
        }
        Ok(added)
    }

    /// Finds each value's row by a probe of the primary key and deletes the rows found by their
    /// row ids, so the planner cannot choose to read the whole table for a chunk.
    async fn delete_entries(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        seq: i64,
        values: &[&str],
    ) -> Result<u64> {
        let mut removed = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            removed += sqlx::query(
                "DELETE FROM dataset_entries WHERE ctid = ANY(ARRAY(\
                 SELECT hit.ctid FROM UNNEST($2::text[]) AS v CROSS JOIN LATERAL \
                 (SELECT e.ctid FROM dataset_entries e WHERE e.dataset_seq = $1 AND e.value = v LIMIT 1) AS hit))",
            )
            .bind(seq)
            .bind(chunk)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(removed)
    }
}

/// Every entry of a dataset, read in pages along the primary key.
async fn read_entries(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    seq: i64,
) -> Result<HashSet<String>> {
    let mut present = HashSet::new();
    let mut after: Option<String> = None;
    loop {
        let sql = if after.is_some() {
            "SELECT value FROM dataset_entries WHERE dataset_seq = $1 AND value > $3 \
             ORDER BY value LIMIT $2"
        } else {
            "SELECT value FROM dataset_entries WHERE dataset_seq = $1 ORDER BY value LIMIT $2"
        };
        let mut query = sqlx::query(sql).bind(seq).bind(SCAN_PAGE);
        if let Some(last) = &after {
            query = query.bind(last.as_str());
        }
        let rows = query.fetch_all(&mut **tx).await?;
        let full = rows.len() as i64 == SCAN_PAGE;
        for row in &rows {
            present.insert(row.try_get::<String, _>("value")?);
        }
        after = match rows.last() {
            Some(row) if full => Some(row.try_get("value")?),
            _ => return Ok(present),
        };
    }
}
