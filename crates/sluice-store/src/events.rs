//! The event role ([`EventStore`]): service events (docs/events.md) kept for 30 days, an
//! organization's notification destinations, and how far each destination's delivery got.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sluice_core::events::{Event, NewEvent, Scope, Severity};
use sqlx::Row as _;

use crate::dialect::{Row, StoreBackend};
use crate::{Result, Store, StoreError};

/// Which events a read returns. Visibility: service-wide events to everyone, operator
/// events to operators, the rest to the members of their organization (a pipeline's events
/// are narrowed to its readers by the caller, which knows who reads what).
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// The reader's organization (`None`: every organization, for a service-wide reader).
    pub org_id: Option<String>,
    /// Include operator events (`node.*`).
    pub operator: bool,
    /// Include service-wide events (`chain.*`).
    pub service: bool,
    /// Only these kinds; a name ending in `*` is a prefix (any when empty).
    pub kinds: Vec<String>,
    pub min_severity: Option<Severity>,
    pub pipeline_id: Option<String>,
    pub since: Option<DateTime<Utc>>,
    /// Newest first, below this id (`None`: from the newest).
    pub before_id: Option<i64>,
    /// Oldest first, above this id (takes precedence over `before_id`).
    pub after_id: Option<i64>,
    pub limit: i64,
}

/// How far the delivery of one notification destination got.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotificationProgress {
    pub org_id: String,
    /// The destination's uid.
    pub uid: String,
    /// The last event it acknowledged (events after it are sent next).
    pub delivered_id: i64,
    /// Events delivered since the destination was configured.
    pub delivered_count: i64,
    /// Failed attempts since the last success.
    pub failures: i64,
    pub last_error: Option<String>,
    pub last_attempt_at: Option<String>,
    pub last_delivered_at: Option<String>,
}

/// Stored events and notification settings.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Stores `events` in order and answers the ids of the stored ones, ascending; an event
    /// whose `dedupe_key` is stored already is left out.
    async fn insert_events(&self, events: &[NewEvent]) -> Result<Vec<i64>>;

    /// Events by `query`.
    async fn list_events(&self, query: &EventQuery) -> Result<Vec<Event>>;

    /// The largest event id stored (0 when none).
    async fn last_event_id(&self) -> Result<i64>;

    /// Deletes events stored before `before`; answers how many.
    async fn purge_events(&self, before: DateTime<Utc>) -> Result<u64>;

    /// The organization's destinations (a JSON array, as stored) and when they were set.
    async fn notification_destinations(&self, org_id: &str) -> Result<Option<(String, String)>>;

    /// Replaces the organization's destinations; progress of uids no longer present is
    /// removed, new uids start after event `start_after`.
    async fn put_notification_destinations(
        &self,
        org_id: &str,
        destinations: &str,
        uids: &[String],
        start_after: i64,
    ) -> Result<()>;

    /// Every organization with destinations: `(org_id, destinations)`.
    async fn all_notification_destinations(&self) -> Result<Vec<(String, String)>>;

    async fn notification_progress(&self, org_id: &str) -> Result<Vec<NotificationProgress>>;

    /// Stores `progress` unless its destination was removed meanwhile.
    async fn put_notification_progress(&self, progress: &NotificationProgress) -> Result<()>;

    /// The thresholds set for `subject` (a JSON object as stored), if any.
    async fn thresholds(&self, subject: &str) -> Result<Option<String>>;

    /// Every subject's thresholds: `(subject, settings)`.
    async fn all_thresholds(&self) -> Result<Vec<(String, String)>>;

    /// Sets the thresholds of `subject` (`None` removes them).
    async fn put_thresholds(&self, subject: &str, settings: Option<&str>) -> Result<()>;
}

const COLUMNS: &str =
    "id, time, org_id, scope, kind, severity, pipeline_id, job_id, chain, node, message, details";

fn event_of<D: StoreBackend>(row: &Row<D>) -> Result<Event> {
    let corrupt = |detail: String| StoreError::Corrupt { what: "event", detail };
    let time: String = row.try_get("time")?;
    let details: String = row.try_get("details")?;
    let severity: i64 = row.try_get("severity")?;
    let scope: String = row.try_get("scope")?;
    Ok(Event {
        id: row.try_get("id")?,
        time: sluice_core::time::parse(&time).map_err(|e| corrupt(e.to_string()))?,
        organization_id: row.try_get("org_id")?,
        kind: row.try_get("kind")?,
        severity: Severity::from_rank(severity)
            .ok_or_else(|| corrupt(format!("severity {severity}")))?,
        pipeline_id: row.try_get("pipeline_id")?,
        job_id: row.try_get("job_id")?,
        chain: row.try_get("chain")?,
        node: row.try_get("node")?,
        message: row.try_get("message")?,
        details: serde_json::from_str(&details).map_err(|e| corrupt(e.to_string()))?,
        scope: Scope::parse(&scope),
    })
}

/// A bound value of a statement built at run time.
enum Arg {
    Text(String),
    Int(i64),
}

/// The `WHERE` clause of `query` and its values, numbered from `$1`.
fn where_clause(query: &EventQuery) -> (String, Vec<Arg>) {
    let mut args = Vec::new();
    let next = |arg: Arg, args: &mut Vec<Arg>| {
        args.push(arg);
        format!("${}", args.len())
    };
    let mut seen = Vec::new();
    if let Some(org) = &query.org_id {
        seen.push(format!(
            "(org_id = {} AND scope IN ('pipeline', 'organization'))",
            next(Arg::Text(org.clone()), &mut args)
        ));
    } else {
        seen.push("scope IN ('pipeline', 'organization')".to_owned());
    }
    if query.service {
        seen.push("scope = 'service'".to_owned());
    }
    if query.operator {
        seen.push("scope = 'operators'".to_owned());
    }
    let mut parts = vec![format!("({})", seen.join(" OR "))];
    if !query.kinds.is_empty() {
        let kinds: Vec<String> = query
            .kinds
            .iter()
            .map(|kind| match kind.strip_suffix('*') {
                Some(prefix) => {
                    format!(
                        "kind LIKE {}",
                        next(Arg::Text(format!("{}%", prefix.replace('_', "\\_"))), &mut args)
                    ) + " ESCAPE '\\'"
                }
                None => format!("kind = {}", next(Arg::Text(kind.clone()), &mut args)),
            })
            .collect();
        parts.push(format!("({})", kinds.join(" OR ")));
    }
    if let Some(min) = query.min_severity {
        parts.push(format!("severity >= {}", next(Arg::Int(min.rank()), &mut args)));
    }
    if let Some(id) = &query.pipeline_id {
        parts.push(format!("pipeline_id = {}", next(Arg::Text(id.clone()), &mut args)));
    }
    if let Some(since) = query.since {
        let since = sluice_core::time::format(since);
        parts.push(format!("time >= {}", next(Arg::Text(since), &mut args)));
    }
    if let Some(after) = query.after_id {
        parts.push(format!("id > {}", next(Arg::Int(after), &mut args)));
    } else if let Some(before) = query.before_id {
        parts.push(format!("id < {}", next(Arg::Int(before), &mut args)));
    }
    (parts.join(" AND "), args)
}

#[async_trait]
impl<D: StoreBackend> EventStore for Store<D> {
    async fn insert_events(&self, events: &[NewEvent]) -> Result<Vec<i64>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = D::begin_write(&self.pool).await?;
        if let Some(lock) = D::LOCK_EVENTS {
            sqlx::query(lock).execute(&mut *tx).await?;
        }
        let mut stored = Vec::with_capacity(events.len());
        for chunk in events.chunks(D::EVENTS_PER_INSERT) {
            let mut statement = String::from(
                "INSERT INTO events (dedupe_key, time, org_id, scope, kind, severity, \
                 pipeline_id, job_id, chain, node, message, details) VALUES ",
            );
            for n in 0..chunk.len() {
                let b = n * 12;
                if n > 0 {
                    statement.push_str(", ");
                }
                let row: Vec<String> = (1..=12).map(|i| format!("${}", b + i)).collect();
                statement.push('(');
                statement.push_str(&row.join(", "));
                statement.push(')');
            }
            statement.push_str(" ON CONFLICT (dedupe_key) DO NOTHING RETURNING id");
            let mut query = sqlx::query(&statement);
            for event in chunk {
                query = query
                    .bind(event.dedupe_key.clone())
                    .bind(sluice_core::time::format(event.time))
                    .bind(event.organization_id.clone())
                    .bind(event.scope.name())
                    .bind(event.kind)
                    .bind(event.severity.rank())
                    .bind(event.pipeline_id.clone())
                    .bind(event.job_id.clone())
                    .bind(event.chain.clone())
                    .bind(event.node.clone())
                    .bind(event.message.clone())
                    .bind(event.details.to_string());
            }
            for row in query.fetch_all(&mut *tx).await? {
                stored.push(row.try_get::<i64, _>("id")?);
            }
        }
        tx.commit().await?;
        stored.sort_unstable();
        Ok(stored)
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<Event>> {
        let (clause, args) = where_clause(query);
        let order = if query.after_id.is_some() { "ASC" } else { "DESC" };
        let statement =
            format!("SELECT {COLUMNS} FROM events WHERE {clause} ORDER BY id {order} LIMIT {}", {
                query.limit.max(0)
            });
        let mut sql = sqlx::query(&statement);
        for arg in args {
            sql = match arg {
                Arg::Text(text) => sql.bind(text),
                Arg::Int(n) => sql.bind(n),
            };
        }
        let rows = sql.fetch_all(&self.pool).await?;
        rows.iter().map(event_of::<D>).collect()
    }

    async fn last_event_id(&self) -> Result<i64> {
        let row = sqlx::query("SELECT COALESCE(MAX(id), 0) AS last FROM events")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("last")?)
    }

    async fn purge_events(&self, before: DateTime<Utc>) -> Result<u64> {
        let done = sqlx::query("DELETE FROM events WHERE time < $1")
            .bind(sluice_core::time::format(before))
            .execute(&self.pool)
            .await?;
        Ok(D::rows_affected(&done))
    }

    async fn notification_destinations(&self, org_id: &str) -> Result<Option<(String, String)>> {
        let row = sqlx::query(
            "SELECT destinations, updated_at FROM notification_destinations WHERE org_id = $1",
        )
        .bind(org_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok((row.try_get("destinations")?, row.try_get("updated_at")?))).transpose()
    }

    async fn put_notification_destinations(
        &self,
        org_id: &str,
        destinations: &str,
        uids: &[String],
        start_after: i64,
    ) -> Result<()> {
        let mut tx = D::begin_write(&self.pool).await?;
        sqlx::query(
            "INSERT INTO notification_destinations (org_id, destinations, updated_at) \
             VALUES ($1, $2, $3) ON CONFLICT (org_id) DO UPDATE \
             SET destinations = excluded.destinations, updated_at = excluded.updated_at",
        )
        .bind(org_id)
        .bind(destinations)
        .bind(crate::store::now())
        .execute(&mut *tx)
        .await?;
        let kept: Vec<String> =
            sqlx::query("SELECT uid FROM notification_progress WHERE org_id = $1")
                .bind(org_id)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|row| row.try_get("uid"))
                .collect::<Result<_, _>>()?;
        for uid in kept.iter().filter(|uid| !uids.contains(uid)) {
            sqlx::query("DELETE FROM notification_progress WHERE org_id = $1 AND uid = $2")
                .bind(org_id)
                .bind(uid.as_str())
                .execute(&mut *tx)
                .await?;
        }
        for uid in uids.iter().filter(|uid| !kept.contains(uid)) {
            sqlx::query(
                "INSERT INTO notification_progress (org_id, uid, delivered_id, delivered_count, \
                 failures) VALUES ($1, $2, $3, 0, 0)",
            )
            .bind(org_id)
            .bind(uid.as_str())
            .bind(start_after)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn all_notification_destinations(&self) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT org_id, destinations FROM notification_destinations ORDER BY org_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok((row.try_get("org_id")?, row.try_get("destinations")?))).collect()
    }

    async fn notification_progress(&self, org_id: &str) -> Result<Vec<NotificationProgress>> {
        let rows = sqlx::query(
            "SELECT org_id, uid, delivered_id, delivered_count, failures, last_error, \
             last_attempt_at, last_delivered_at FROM notification_progress WHERE org_id = $1 \
             ORDER BY uid",
        )
        .bind(org_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(NotificationProgress {
                    org_id: row.try_get("org_id")?,
                    uid: row.try_get("uid")?,
                    delivered_id: row.try_get("delivered_id")?,
                    delivered_count: row.try_get("delivered_count")?,
                    failures: row.try_get("failures")?,
                    last_error: row.try_get("last_error")?,
                    last_attempt_at: row.try_get("last_attempt_at")?,
                    last_delivered_at: row.try_get("last_delivered_at")?,
                })
            })
            .collect()
    }

    async fn put_notification_progress(&self, progress: &NotificationProgress) -> Result<()> {
        sqlx::query(
            "UPDATE notification_progress SET delivered_id = $3, delivered_count = $4, \
             failures = $5, last_error = $6, last_attempt_at = $7, last_delivered_at = $8 \
             WHERE org_id = $1 AND uid = $2",
        )
        .bind(progress.org_id.as_str())
        .bind(progress.uid.as_str())
        .bind(progress.delivered_id)
        .bind(progress.delivered_count)
        .bind(progress.failures)
        .bind(progress.last_error.clone())
        .bind(progress.last_attempt_at.clone())
        .bind(progress.last_delivered_at.clone())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn thresholds(&self, subject: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT settings FROM event_thresholds WHERE subject = $1")
            .bind(subject)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| Ok(row.try_get("settings")?)).transpose()
    }

    async fn all_thresholds(&self) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query("SELECT subject, settings FROM event_thresholds ORDER BY subject")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| Ok((row.try_get("subject")?, row.try_get("settings")?))).collect()
    }

    async fn put_thresholds(&self, subject: &str, settings: Option<&str>) -> Result<()> {
        match settings {
            None => {
                sqlx::query("DELETE FROM event_thresholds WHERE subject = $1")
                    .bind(subject)
                    .execute(&self.pool)
                    .await?;
            }
            Some(settings) => {
                sqlx::query(
                    "INSERT INTO event_thresholds (subject, settings, updated_at) \
                     VALUES ($1, $2, $3) ON CONFLICT (subject) DO UPDATE \
                     SET settings = excluded.settings, updated_at = excluded.updated_at",
                )
                .bind(subject)
                .bind(settings)
                .bind(crate::store::now())
                .execute(&self.pool)
                .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_clause_numbers_its_values_in_order() {
        let query = EventQuery {
            org_id: Some("o".into()),
            service: true,
            kinds: vec!["chain.*".into(), "pipeline.deployed".into()],
            min_severity: Some(Severity::Warning),
            after_id: Some(7),
            before_id: Some(9),
            ..EventQuery::default()
        };
        let (clause, args) = where_clause(&query);
        assert_eq!(args.len(), 5);
        assert!(clause.contains("org_id = $1"), "{clause}");
        assert!(clause.contains("kind LIKE $2"), "{clause}");
        assert!(clause.contains("kind = $3"), "{clause}");
        assert!(clause.contains("severity >= $4"), "{clause}");
        assert!(clause.contains("id > $5") && !clause.contains("id <"), "{clause}");
    }
}
