//! The monitor: every [`EventSettings::interval`] it reads the snapshots this process keeps
//! anyway (each running deployment's worker health and counters, the data age the workers
//! measured, the cluster's live nodes) and emits an event for each change that matters. It
//! never touches a worker: the workers' cost is the counters they already keep.
//!
//! - `dead_letters.recorded`: the dead-letter counter grew; at most one event per pipeline
//!   per [`EventSettings::dead_letter_window`], carrying the count since the last one.
//! - `worker.crash_looping`, `worker.oom_killed`, `worker.recovered`.
//! - `sink.failing` (a worker held on its sink for [`EventSettings::sink_failing_after`]) and
//!   `sink.recovered`.
//! - `lag.data_age_over` and `lag.data_age_recovered`, against the pipeline's threshold.
//! - `node.joined` and `node.lost` (every node sees them; the store keeps each once).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sluice_core::events::{EventEmitter, NewEvent, Severity};

use super::{EventSettings, Recorder};
use crate::health::WorkerStatus;
use crate::node::Node;
use crate::placement::Placement;

/// How often stored thresholds are read again.
const THRESHOLDS_EVERY: Duration = Duration::from_secs(5);

/// The thresholds a pipeline may set (`PUT /api/v1/beam/{id}/thresholds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PipelineThresholds {
    pub data_age_warning_seconds: u64,
}

/// The subject under which a pipeline's thresholds are stored.
pub fn pipeline_subject(pipeline_id: &str) -> String {
    format!("pipeline:{pipeline_id}")
}

#[derive(Debug, Default)]
struct WorkerSeen {
    restarts: u64,
    ooms: u64,
    /// Crash-looping or OOM-killed, not recovered yet.
    bad: bool,
    crash_looping: bool,
    last_restart: Option<DateTime<Utc>>,
}

/// What the monitor remembers of one deployment running here.
struct Watched {
    org_id: String,
    version: String,
    sink_uid: String,
    sink_type: String,
    dead_seen: u64,
    dead_pending: u64,
    dead_last: Option<DateTime<Utc>>,
    workers: HashMap<String, WorkerSeen>,
    /// Since when its sink fails, once reported.
    sink_failing: Option<DateTime<Utc>>,
    data_age_over: bool,
}

/// The live nodes as seen: name → (start time, `(pipeline id, worker)` of its workers).
type NodesSeen = HashMap<String, (Option<DateTime<Utc>>, Vec<(String, String)>)>;

pub(crate) struct Monitor {
    node: Weak<Node>,
    placement: Weak<dyn Placement>,
    recorder: Arc<Recorder>,
    watched: HashMap<String, Watched>,
    /// The live nodes as last seen, with their start time (`None` before the first look).
    nodes: Option<NodesSeen>,
    data_age: HashMap<String, Duration>,
    thresholds_read: Option<std::time::Instant>,
}

impl Monitor {
    pub(crate) fn spawn(node: &Arc<Node>, placement: &Arc<dyn Placement>, recorder: Arc<Recorder>) {
        let mut monitor = Self {
            node: Arc::downgrade(node),
            placement: Arc::downgrade(placement),
            recorder,
            watched: HashMap::new(),
            nodes: None,
            data_age: HashMap::new(),
            thresholds_read: None,
        };
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(monitor.settings().interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(node) = monitor.node.upgrade() else { return };
                monitor.sample(&node).await;
                if let Some(placement) = monitor.placement.upgrade() {
                    monitor.sample_nodes(placement.as_ref());
                }
            }
        });
    }

    fn settings(&self) -> EventSettings {
        *self.recorder.settings()
    }

    async fn sample(&mut self, node: &Arc<Node>) {
        self.read_thresholds(node).await;
        let views: Vec<(String, String, Vec<WorkerStatus>, u64)> = node
            .views()
            .iter()
            .map(|(id, view)| {
                let dead = crate::deployment::Counters::get(&view.counters().dead_lettered);
                (id.clone(), view.version().to_owned(), view.health(), dead)
            })
            .collect();
        self.watched.retain(|id, _| views.iter().any(|(v, ..)| v == id));
        let ages: HashMap<String, Option<i64>> =
            node.metrics.totals().into_iter().map(|(id, t)| (id, t.data_age_ms)).collect();
        let now = self.recorder.now();
        for (id, version, health, dead) in views {
            let stale = self.watched.get(&id).is_none_or(|w| w.version != version);
            if stale && !self.watch(node, &id, &version).await {
                continue;
            }
            let threshold = self.data_age.get(&id).copied();
            let settings = self.settings();
            let Some(watched) = self.watched.get_mut(&id) else { continue };
            let mut events = Vec::new();
            watched.dead_letters(&id, dead, now, &settings, &mut events);
            watched.workers(&id, &health, now, &settings, &mut events);
            watched.sink(&id, &health, now, &settings, &mut events);
            let age = ages.get(&id).copied().flatten();
            let threshold = threshold.unwrap_or(settings.data_age_warning);
            watched.data_age(&id, age, threshold, now, &mut events);
            for event in events {
                self.recorder.emit(event);
            }
        }
    }

    /// Starts watching deployment `id` (or its new version); false when it is not stored.
    async fn watch(&mut self, node: &Node, id: &str, version: &str) -> bool {
        let Ok(Some(record)) = node.store.deployment(id).await else { return false };
        let sink = record.pipeline.pipeline_config.sinks.first();
        let entry = self.watched.entry(id.to_owned()).or_insert_with(|| Watched {
            org_id: String::new(),
            version: String::new(),
            sink_uid: String::new(),
            sink_type: String::new(),
            dead_seen: 0,
            dead_pending: 0,
            dead_last: None,
            workers: HashMap::new(),
            sink_failing: None,
            data_age_over: false,
        });
        entry.org_id = record.pipeline.organization_id.clone();
        entry.version = version.to_owned();
        entry.sink_uid = sink.map(|s| s.uid().to_owned()).unwrap_or_default();
        entry.sink_type = sink.map(|s| s.type_name().to_owned()).unwrap_or_default();
        // New workers count from zero.
        entry.dead_seen = 0;
        entry.workers.clear();
        true
    }

    async fn read_thresholds(&mut self, node: &Node) {
        if self.thresholds_read.is_some_and(|at| at.elapsed() < THRESHOLDS_EVERY) {
            return;
        }
        self.thresholds_read = Some(std::time::Instant::now());
        let Ok(all) = node.store.all_thresholds().await else { return };
        self.data_age = all
            .into_iter()
            .filter_map(|(subject, settings)| {
                let id = subject.strip_prefix("pipeline:")?.to_owned();
                let t: PipelineThresholds = serde_json::from_str(&settings).ok()?;
                Some((id, Duration::from_secs(t.data_age_warning_seconds)))
            })
            .collect();
    }

    /// Emits `node.joined` / `node.lost` for changes in the live nodes (a cluster only).
    fn sample_nodes(&mut self, placement: &dyn Placement) {
        let Some(nodes) = placement.nodes() else { return };
        let now = self.recorder.now();
        let current: NodesSeen =
            nodes.iter().map(|n| (n.name.clone(), (n.started_at, n.workers.clone()))).collect();
        let key = |kind: &str, name: &str, started: Option<DateTime<Utc>>| {
            let started = started.map(sluice_core::time::format).unwrap_or_default();
            format!("{kind}:{name}:{started}")
        };
        let Some(before) = self.nodes.replace(current.clone()) else {
            // First look: only this node's own arrival is news.
            if let Some(me) = nodes.iter().find(|n| n.is_self) {
                let details = json!({"node": me.name, "address": me.address});
                self.recorder.emit(NewEvent::node(
                    now,
                    "node.joined",
                    Severity::Info,
                    &me.name,
                    format!("node {} joined the cluster", me.name),
                    details,
                    key("node.joined", &me.name, me.started_at),
                ));
            }
            return;
        };
        for (name, (started, _)) in current.iter().filter(|(n, _)| !before.contains_key(*n)) {
            self.recorder.emit(NewEvent::node(
                now,
                "node.joined",
                Severity::Info,
                name,
                format!("node {name} joined the cluster"),
                json!({"node": name}),
                key("node.joined", name, *started),
            ));
        }
        for (name, (started, workers)) in before.iter().filter(|(n, _)| !current.contains_key(*n)) {
            let moved: Vec<&str> = workers.iter().map(|(_, worker)| worker.as_str()).collect();
            self.recorder.emit(NewEvent::node(
                now,
                "node.lost",
                Severity::Error,
                name,
                format!("node {name} stopped answering; its {} workers moved", moved.len()),
                json!({"node": name, "workers_moved": moved}),
                key("node.lost", name, *started),
            ));
        }
    }
}

impl Watched {
    fn event(
        &self,
        id: &str,
        kind: &'static str,
        severity: Severity,
        message: String,
        details: serde_json::Value,
        now: DateTime<Utc>,
    ) -> NewEvent {
        NewEvent::pipeline(now, kind, severity, &self.org_id, id, message, details)
    }

    fn dead_letters(
        &mut self,
        id: &str,
        dead: u64,
        now: DateTime<Utc>,
        settings: &EventSettings,
        events: &mut Vec<NewEvent>,
    ) {
        // Counters restart with new workers.
        let grown = if dead < self.dead_seen { dead } else { dead - self.dead_seen };
        self.dead_seen = dead;
        self.dead_pending += grown;
        let window = chrono::Duration::from_std(settings.dead_letter_window).unwrap_or_default();
        let due = self.dead_last.is_none_or(|last| now - last >= window);
        if self.dead_pending > 0 && due {
            let count = self.dead_pending;
            events.push(self.event(
                id,
                "dead_letters.recorded",
                Severity::Warning,
                format!("{count} records dead-lettered"),
                json!({"count": count, "window_seconds": settings.dead_letter_window.as_secs()}),
                now,
            ));
            self.dead_pending = 0;
            self.dead_last = Some(now);
        }
    }

    fn workers(
        &mut self,
        id: &str,
        health: &[WorkerStatus],
        now: DateTime<Utc>,
        settings: &EventSettings,
        events: &mut Vec<NewEvent>,
    ) {
        let stable = chrono::Duration::from_std(settings.worker_stable_after).unwrap_or_default();
        for worker in health {
            let seen = self.workers.entry(worker.name.clone()).or_default();
            if worker.oom_kill_count > seen.ooms {
                let details = json!({
                    "worker": worker.name, "oom_kill_count": worker.oom_kill_count,
                    "restart_count": worker.restart_count, "error": worker.last_error,
                });
                let message = format!("worker {} ran out of memory and was restarted", worker.name);
                seen.bad = true;
                events.push(NewEvent::pipeline(
                    now,
                    "worker.oom_killed",
                    Severity::Error,
                    &self.org_id,
                    id,
                    message,
                    details,
                ));
            }
            if worker.is_crash_looping && !seen.crash_looping {
                let details = json!({
                    "worker": worker.name, "restart_count": worker.restart_count,
                    "error": worker.last_error,
                });
                let message = format!("worker {} is crash-looping", worker.name);
                seen.bad = true;
                events.push(NewEvent::pipeline(
                    now,
                    "worker.crash_looping",
                    Severity::Error,
                    &self.org_id,
                    id,
                    message,
                    details,
                ));
            }
            if worker.restart_count != seen.restarts || worker.oom_kill_count != seen.ooms {
                seen.last_restart = Some(worker.last_restart_time.unwrap_or(now));
            }
            seen.restarts = worker.restart_count;
            seen.ooms = worker.oom_kill_count;
            seen.crash_looping = worker.is_crash_looping;
            let quiet = seen.last_restart.is_none_or(|at| now - at >= stable);
            if seen.bad && worker.is_ready && !worker.is_crash_looping && quiet {
                seen.bad = false;
                let details = json!({"worker": worker.name, "restart_count": worker.restart_count});
                let message = format!("worker {} runs normally again", worker.name);
                events.push(NewEvent::pipeline(
                    now,
                    "worker.recovered",
                    Severity::Info,
                    &self.org_id,
                    id,
                    message,
                    details,
                ));
            }
        }
    }

    fn sink(
        &mut self,
        id: &str,
        health: &[WorkerStatus],
        now: DateTime<Utc>,
        settings: &EventSettings,
        events: &mut Vec<NewEvent>,
    ) {
        let after = chrono::Duration::from_std(settings.sink_failing_after).unwrap_or_default();
        let blocked = health
            .iter()
            .filter_map(|w| w.blocked_since.map(|since| (since, w.last_error.clone())))
            .min_by_key(|(since, _)| *since);
        match (blocked, self.sink_failing) {
            (Some((since, error)), None) if now - since >= after => {
                self.sink_failing = Some(since);
                let details = json!({
                    "sink_uid": self.sink_uid, "sink_type": self.sink_type,
                    "failing_since": sluice_core::time::format(since), "error": error,
                });
                let message = format!("sink {} keeps failing; the source is held", self.sink_uid);
                events.push(self.event(id, "sink.failing", Severity::Error, message, details, now));
            }
            (None, Some(since)) => {
                self.sink_failing = None;
                let details = json!({
                    "sink_uid": self.sink_uid, "sink_type": self.sink_type,
                    "failed_for_seconds": (now - since).num_seconds(),
                });
                let message = format!("sink {} takes records again", self.sink_uid);
                events.push(self.event(
                    id,
                    "sink.recovered",
                    Severity::Info,
                    message,
                    details,
                    now,
                ));
            }
            _ => {}
        }
    }

    fn data_age(
        &mut self,
        id: &str,
        age_ms: Option<i64>,
        threshold: Duration,
        now: DateTime<Utc>,
        events: &mut Vec<NewEvent>,
    ) {
        let Some(age_ms) = age_ms else { return };
        let limit_ms = i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX);
        let details = json!({
            "data_age_seconds": age_ms / 1000, "threshold_seconds": threshold.as_secs(),
        });
        if age_ms > limit_ms && !self.data_age_over {
            self.data_age_over = true;
            let message = format!(
                "data age {} s is over the {} s threshold",
                age_ms / 1000,
                threshold.as_secs()
            );
            events.push(self.event(
                id,
                "lag.data_age_over",
                Severity::Warning,
                message,
                details,
                now,
            ));
        } else if age_ms <= limit_ms && self.data_age_over {
            self.data_age_over = false;
            let message = format!("data age {} s is back under the threshold", age_ms / 1000);
            events.push(self.event(
                id,
                "lag.data_age_recovered",
                Severity::Info,
                message,
                details,
                now,
            ));
        }
    }
}
