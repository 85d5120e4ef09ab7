//! Worker health (docs/contract.md §Deployment worker health): what each worker of a running
//! deployment is doing, kept by its supervisor and by the worker itself.
//!
//! A worker is *restarted* when its task panics or ends while its deployment still runs (its
//! supervisor starts it again after a backoff) and when its script engine runs out of memory
//! (the engine is killed and replaced, counted as an OOM kill). A worker that restarted
//! [`CRASH_LOOP_RESTARTS`] times within [`CRASH_LOOP_WINDOW`] is crash-looping; one whose
//! latest restart was an OOM kill within that window is OOM-killed.

use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};

/// Restarts within [`CRASH_LOOP_WINDOW`] that make a worker crash-looping.
pub const CRASH_LOOP_RESTARTS: usize = 3;
/// The window of [`CRASH_LOOP_RESTARTS`]; an OOM kill older than this no longer marks a
/// worker as OOM-killed.
pub const CRASH_LOOP_WINDOW: Duration = Duration::minutes(5);

/// Why a worker restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Crash,
    OutOfMemory,
}

#[derive(Debug)]
struct State {
    start_time: DateTime<Utc>,
    /// False while the supervisor waits out a backoff before starting the worker again.
    running: bool,
    restart_count: u64,
    oom_kills: u64,
    /// Restarts within the crash-loop window (older ones are dropped as they age).
    recent: Vec<(DateTime<Utc>, Reason)>,
    last_error: Option<String>,
    /// Since when the worker's sink has refused or failed its batch (the source is held,
    /// `at_least_once`), and the sink's latest error.
    sink_blocked: Option<(DateTime<Utc>, String)>,
}

/// The health of one worker.
#[derive(Debug)]
pub(crate) struct WorkerHealth {
    name: String,
    state: Mutex<State>,
}

/// A worker's health as the stats endpoint reports it (and as a node reports its workers to
/// the others).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerStatus {
    /// `<config_id>-worker-<index>`.
    pub name: String,
    /// `Running`, `Restarting` (waiting to start again after a crash) or `CrashLoopBackOff`
    /// (waiting, and crash-looping).
    pub status: String,
    /// Running and reading its partitions.
    pub is_ready: bool,
    pub is_crash_looping: bool,
    pub is_oom_killed: bool,
    /// Restarts since the deployment started its workers (crashes and OOM kills).
    pub restart_count: u64,
    /// Script engines of this worker killed for memory since the deployment started.
    pub oom_kill_count: u64,
    /// When the worker (or its latest restart) started.
    pub start_time: DateTime<Utc>,
    pub last_restart_time: Option<DateTime<Utc>>,
    /// The error of the latest restart, or the sink's error while blocked on the sink.
    pub last_error: Option<String>,
    /// Its sink keeps failing the current batch: the worker retries and reads nothing new.
    pub is_blocked_on_sink: bool,
    /// Since when it is blocked on its sink.
    pub blocked_since: Option<DateTime<Utc>>,
    /// The node it runs on, on a cluster (`None` on a node of its own).
    pub node: Option<String>,
}

impl WorkerHealth {
    pub(crate) fn new(name: String, now: DateTime<Utc>) -> Self {
        Self {
            name,
            state: Mutex::new(State {
                start_time: now,
                running: true,
                restart_count: 0,
                oom_kills: 0,
                recent: Vec::new(),
                last_error: None,
                sink_blocked: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The worker's task failed with `error` at `now`; returns the restarts within the
    /// crash-loop window (this one included), for the backoff.
    pub(crate) fn crashed(&self, now: DateTime<Utc>, error: String) -> usize {
        let mut state = self.lock();
        state.running = false;
        state.restart_count += 1;
        state.last_error = Some(error);
        state.recent.retain(|(at, _)| now - *at < CRASH_LOOP_WINDOW);
        state.recent.push((now, Reason::Crash));
        state.recent.len()
    }

    /// The supervisor started the worker again at `now`.
    pub(crate) fn restarted(&self, now: DateTime<Utc>) {
        let mut state = self.lock();
        state.running = true;
        state.start_time = now;
    }

    /// The worker's script engine was killed for memory `kills` times and replaced at `now`
    /// (the worker goes on with the new engine).
    pub(crate) fn oom_killed(&self, now: DateTime<Utc>, kills: u64, error: String) {
        if kills == 0 {
            return;
        }
        let mut state = self.lock();
        state.restart_count += kills;
        state.oom_kills += kills;
        state.start_time = now;
        state.last_error = Some(error);
        state.recent.retain(|(at, _)| now - *at < CRASH_LOOP_WINDOW);
        for _ in 0..kills {
            state.recent.push((now, Reason::OutOfMemory));
        }
    }

    pub(crate) fn status(&self, now: DateTime<Utc>) -> WorkerStatus {
        let state = self.lock();
        let recent: Vec<&(DateTime<Utc>, Reason)> =
            state.recent.iter().filter(|(at, _)| now - *at < CRASH_LOOP_WINDOW).collect();
        let is_crash_looping = recent.len() >= CRASH_LOOP_RESTARTS;
        let is_oom_killed = recent.last().is_some_and(|(_, reason)| *reason == Reason::OutOfMemory);
        let status = match (state.running, is_crash_looping) {
            (true, _) if state.sink_blocked.is_some() => "BlockedOnSink",
            (true, _) => "Running",
            (false, true) => "CrashLoopBackOff",
            (false, false) => "Restarting",
        };
        WorkerStatus {
            name: self.name.clone(),
            status: status.to_owned(),
            node: None,
            is_ready: state.running,
            is_crash_looping,
            is_oom_killed,
            restart_count: state.restart_count,
            oom_kill_count: state.oom_kills,
            start_time: state.start_time,
            last_restart_time: state.recent.last().map(|(at, _)| *at),
            last_error: match &state.sink_blocked {
                Some((_, error)) => Some(error.clone()),
                None => state.last_error.clone(),
            },
            is_blocked_on_sink: state.sink_blocked.is_some(),
            blocked_since: state.sink_blocked.as_ref().map(|(since, _)| *since),
        }
    }

    /// The sink failed the worker's batch with `error`; it is retried.
    pub(crate) fn sink_failed(&self, now: DateTime<Utc>, error: String) {
        let mut state = self.lock();
        let since = state.sink_blocked.as_ref().map_or(now, |(since, _)| *since);
        state.sink_blocked = Some((since, error));
    }

    /// The sink took a batch.
    pub(crate) fn sink_delivered(&self) {
        let mut state = self.lock();
        if state.sink_blocked.is_some() {
            state.sink_blocked = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Duration::seconds(seconds)
    }

    #[test]
    fn three_restarts_within_the_window_are_a_crash_loop_that_ages_out() {
        let health = WorkerHealth::new("p-worker-0".into(), at(0));
        assert_eq!(health.status(at(0)).status, "Running");
        assert_eq!(health.crashed(at(10), "boom".into()), 1);
        let status = health.status(at(10));
        assert_eq!(
            (status.status.as_str(), status.is_ready, status.is_crash_looping),
            ("Restarting", false, false)
        );
        health.restarted(at(11));
        health.crashed(at(20), "boom".into());
        assert_eq!(health.crashed(at(30), "boom again".into()), 3);
        let status = health.status(at(30));
        assert_eq!(status.status, "CrashLoopBackOff");
        assert!(status.is_crash_looping);
        assert_eq!(status.restart_count, 3);
        assert_eq!(status.last_error.as_deref(), Some("boom again"));
        health.restarted(at(40));
        let status = health.status(at(40));
        assert_eq!(
            (status.status.as_str(), status.is_ready, status.start_time),
            ("Running", true, at(40))
        );
        assert!(status.is_crash_looping);
        // Five minutes after the first two, only one restart is recent.
        assert!(!health.status(at(325)).is_crash_looping);
        assert_eq!(health.status(at(325)).restart_count, 3);
    }

    #[test]
    fn an_oom_kill_counts_as_a_restart_and_marks_the_worker_for_the_window() {
        let health = WorkerHealth::new("p-worker-0".into(), at(0));
        health.oom_killed(at(5), 0, String::new());
        assert_eq!(health.status(at(5)).restart_count, 0);
        health.oom_killed(at(10), 1, "out of memory".into());
        let status = health.status(at(10));
        assert!(status.is_oom_killed && status.is_ready);
        assert_eq!((status.restart_count, status.oom_kill_count), (1, 1));
        assert_eq!(status.start_time, at(10));
        assert!(!health.status(at(400)).is_oom_killed);
        health.oom_killed(at(500), 3, "out of memory".into());
        assert!(health.status(at(500)).is_crash_looping);
    }
}
