//! Service events: what happens to pipelines, workers, sinks, backfills, chains and nodes,
//! as records a user can list, follow live and be notified of (`docs/events.md` lists every
//! kind with its fields and an example).
//!
//! An [`Event`] is made by one of the constructors of [`NewEvent`] (one per kind, so a
//! kind's `details` always has the same shape) and handed to an [`EventEmitter`], which must
//! never block its caller: the runtime's emitter puts it on a bounded channel to a writer
//! task and drops it (counted) when the channel is full.

mod destination;

pub use destination::{DESTINATION_SINK_TYPES, MAX_DESTINATIONS, NotificationDestination};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How much an event matters. Ordered: `Info < Warning < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    pub const ALL: [Severity; 3] = [Severity::Info, Severity::Warning, Severity::Error];

    pub fn name(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Error => "error",
        }
    }

    /// The stored rank (0, 1, 2).
    pub fn rank(self) -> i64 {
        self as i64
    }

    pub fn from_rank(rank: i64) -> Option<Self> {
        Self::ALL.get(usize::try_from(rank).ok()?).copied()
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == text)
    }
}

/// Who may see an event (`docs/events.md`, "Visibility").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Whoever can read the event's pipeline.
    Pipeline,
    /// Every member of the event's organization.
    Organization,
    /// Every caller (the chains every organization reads).
    Service,
    /// Operators only (nodes).
    Operators,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Self::Pipeline => "pipeline",
            Self::Organization => "organization",
            Self::Service => "service",
            Self::Operators => "operators",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Self::Pipeline, Self::Organization, Self::Service, Self::Operators]
            .into_iter()
            .find(|s| s.name() == text)
    }
}

/// Every event kind, by name.
pub const KINDS: &[&str] = &[
    "pipeline.created",
    "pipeline.updated",
    "pipeline.deployed",
    "pipeline.redeployed",
    "pipeline.paused",
    "pipeline.torn_down",
    "pipeline.deleted",
    "pipeline.deploy_failed",
    "worker.crash_looping",
    "worker.oom_killed",
    "worker.recovered",
    "dead_letters.recorded",
    "dead_letters.replayed",
    "lag.data_age_over",
    "lag.data_age_recovered",
    "sink.failing",
    "sink.recovered",
    "sink.secret_missing",
    "backfill.staging",
    "backfill.transporting",
    "backfill.completed",
    "backfill.failed",
    "backfill.cancelled",
    "chain.lagging",
    "chain.stalled",
    "chain.reorg",
    "chain.recovered",
    "node.joined",
    "node.lost",
    "filter_values.replaced",
];

/// An event not stored yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    pub time: DateTime<Utc>,
    /// `None` for service-wide events (chains, nodes).
    pub organization_id: Option<String>,
    pub kind: &'static str,
    pub severity: Severity,
    pub scope: Scope,
    pub pipeline_id: Option<String>,
    pub job_id: Option<String>,
    pub chain: Option<String>,
    pub node: Option<String>,
    pub message: String,
    pub details: Value,
    /// Events that several nodes may see at once (a node lost, a chain stalled) carry a key
    /// naming the fact; the store keeps the first event of a key only.
    pub dedupe_key: Option<String>,
}

/// A stored event, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Increasing in the order events were stored: the paging cursor and the SSE id.
    pub id: i64,
    #[serde(with = "crate::time::rfc3339")]
    pub time: DateTime<Utc>,
    pub organization_id: Option<String>,
    pub kind: String,
    pub severity: Severity,
    pub pipeline_id: Option<String>,
    pub job_id: Option<String>,
    pub chain: Option<String>,
    pub node: Option<String>,
    pub message: String,
    pub details: Value,
    #[serde(skip)]
    pub scope: Option<Scope>,
}

impl NewEvent {
    fn base(time: DateTime<Utc>, kind: &'static str, severity: Severity, scope: Scope) -> Self {
        debug_assert!(KINDS.contains(&kind), "{kind} is listed in KINDS");
        Self {
            time,
            organization_id: None,
            kind,
            severity,
            scope,
            pipeline_id: None,
            job_id: None,
            chain: None,
            node: None,
            message: String::new(),
            details: json!({}),
            dedupe_key: None,
        }
    }

    /// An event of pipeline `pipeline_id` of `org_id`.
    pub fn pipeline(
        time: DateTime<Utc>,
        kind: &'static str,
        severity: Severity,
        org_id: &str,
        pipeline_id: &str,
        message: String,
        details: Value,
    ) -> Self {
        Self {
            organization_id: Some(org_id.to_owned()),
            pipeline_id: Some(pipeline_id.to_owned()),
            message,
            details,
            ..Self::base(time, kind, severity, Scope::Pipeline)
        }
    }

    /// `backfill.<status>`: a backfill job moved to `status`.
    pub fn backfill(
        time: DateTime<Utc>,
        org_id: &str,
        job_id: &str,
        job_name: &str,
        status: &str,
        from: Option<&str>,
        error_message: Option<&str>,
    ) -> Option<Self> {
        let kind = KINDS.iter().copied().find(|k| k.strip_prefix("backfill.") == Some(status))?;
        let severity = match status {
            "failed" => Severity::Error,
            "cancelled" => Severity::Warning,
            _ => Severity::Info,
        };
        let message = match error_message {
            Some(error) => format!("backfill {job_name} {status}: {error}"),
            None => format!("backfill {job_name} {status}"),
        };
        Some(Self {
            organization_id: Some(org_id.to_owned()),
            job_id: Some(job_id.to_owned()),
            message,
            details: json!({
                "job_name": job_name, "from": from, "to": status, "error_message": error_message,
            }),
            ..Self::base(time, kind, severity, Scope::Organization)
        })
    }

    /// A chain event (`chain.*`), seen by every caller.
    pub fn chain(
        time: DateTime<Utc>,
        kind: &'static str,
        severity: Severity,
        chain: &str,
        message: String,
        details: Value,
        dedupe_key: String,
    ) -> Self {
        Self {
            chain: Some(chain.to_owned()),
            message,
            details,
            dedupe_key: Some(dedupe_key),
            ..Self::base(time, kind, severity, Scope::Service)
        }
    }

    /// A node event (`node.*`), seen by operators.
    pub fn node(
        time: DateTime<Utc>,
        kind: &'static str,
        severity: Severity,
        node: &str,
        message: String,
        details: Value,
        dedupe_key: String,
    ) -> Self {
        Self {
            node: Some(node.to_owned()),
            message,
            details,
            dedupe_key: Some(dedupe_key),
            ..Self::base(time, kind, severity, Scope::Operators)
        }
    }
}

/// Where events go. Implementations must return at once, whatever happens to the event.
pub trait EventEmitter: Send + Sync + 'static {
    fn emit(&self, event: NewEvent);
}

/// An emitter that keeps nothing (tests, tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl EventEmitter for NoEvents {
    fn emit(&self, _event: NewEvent) {}
}

/// What a list of events is filtered by.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    /// Only these kinds (any when empty). A name ending in `.` or `.*` is a prefix.
    pub kinds: Vec<String>,
    /// At least this severity.
    pub min_severity: Option<Severity>,
    pub pipeline_id: Option<String>,
    /// Stored at or after this time.
    pub since: Option<DateTime<Utc>>,
}

impl EventFilter {
    /// Whether `kind` passes the kinds filter.
    pub fn kind_matches(kinds: &[String], kind: &str) -> bool {
        kinds.is_empty()
            || kinds.iter().any(|k| match k.strip_suffix('*') {
                Some(prefix) => kind.starts_with(prefix),
                None => k == kind,
            })
    }

    /// Whether `event` passes every part of the filter.
    pub fn matches(&self, event: &Event) -> bool {
        Self::kind_matches(&self.kinds, &event.kind)
            && self.min_severity.is_none_or(|min| event.severity >= min)
            && self.pipeline_id.as_ref().is_none_or(|id| event.pipeline_id.as_ref() == Some(id))
            && self.since.is_none_or(|since| event.time >= since)
    }

    /// Whether `text` names a kind or a family of kinds (`chain.*`).
    pub fn valid_kind(text: &str) -> bool {
        match text.strip_suffix('*') {
            Some(prefix) => prefix.ends_with('.') && KINDS.iter().any(|k| k.starts_with(prefix)),
            None => KINDS.contains(&text),
        }
    }

    /// The families of kinds (`chain`, `pipeline`, …), in the order of [`KINDS`].
    pub fn families() -> Vec<&'static str> {
        let mut families: Vec<&'static str> =
            KINDS.iter().filter_map(|k| k.split_once('.').map(|(f, _)| f)).collect();
        families.dedup();
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_filters_take_names_and_prefixes() {
        let kinds = vec!["chain.*".to_owned(), "pipeline.deployed".to_owned()];
        assert!(EventFilter::kind_matches(&kinds, "chain.stalled"));
        assert!(EventFilter::kind_matches(&kinds, "pipeline.deployed"));
        assert!(!EventFilter::kind_matches(&kinds, "pipeline.deploy_failed"));
        assert!(EventFilter::kind_matches(&[], "node.lost"));
        assert!(EventFilter::valid_kind("chain.*"));
        assert!(!EventFilter::valid_kind("backfill."));
        assert!(!EventFilter::valid_kind("chains.*"));
        assert!(!EventFilter::valid_kind("pipeline.exploded"));
    }

    #[test]
    fn severities_order_and_round_trip() {
        assert!(Severity::Info < Severity::Warning && Severity::Warning < Severity::Error);
        for s in Severity::ALL {
            assert_eq!(Severity::from_rank(s.rank()), Some(s));
            assert_eq!(Severity::parse(s.name()), Some(s));
        }
        assert_eq!(Severity::parse("fatal"), None);
    }

    #[test]
    fn backfill_events_name_their_status() {
        let now = Utc::now();
        let event = NewEvent::backfill(now, "o", "j", "n", "failed", Some("staging"), Some("x"))
            .expect("failed is a status");
        assert_eq!((event.kind, event.severity), ("backfill.failed", Severity::Error));
        assert_eq!(event.details["from"], "staging");
        assert!(NewEvent::backfill(now, "o", "j", "n", "exploded", None, None).is_none());
    }
}
