//! Delivery of events to each organization's notification destinations, at least once.
//!
//! One node of a cluster delivers (the `events-notifier` role; every node of its own is one).
//! Each destination has a stored cursor, the last event it acknowledged: the notifier reads
//! the organization's events after it that the destination wants, sends them through the
//! same transport a pipeline's sink of that type uses (a webhook is signed as a pipeline's
//! webhook is), and moves the cursor only once the receiver acknowledged them. A failure
//! leaves the cursor, records the error and the count of failures in a row (shown by
//! `GET /api/v1/notifications`), and is tried again after a backoff that doubles up to
//! [`EventSettings::notify_max_backoff`](super::EventSettings). A receiver that refuses the
//! events for good (a 4xx) has them skipped, with the error recorded. Storing events never
//! waits on any of this.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_bus::NewRecord;
use sluice_core::events::{Event, NotificationDestination};
use sluice_core::secret::ResolvedSecrets;
use sluice_store::{EventQuery, NotificationProgress};

use super::Recorder;
use crate::SinkEnv;
use crate::sinks::{self, Transport, external::Batch, external::TransportError};

/// Events sent to one destination per request at most.
const SEND_BATCH: i64 = 100;
/// How often the notifier looks without being woken (events other nodes stored).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The role one node of a cluster plays.
const ROLE: &str = "events-notifier";

struct Target {
    /// The destination as configured, to notice a change.
    config: NotificationDestination,
    transport: Arc<dyn Transport>,
}

/// The notifier's memory: built transports and when failing destinations are tried next.
#[derive(Default)]
struct State {
    targets: HashMap<(String, String), Target>,
    next_try: HashMap<(String, String), Instant>,
}

/// Starts delivering notifications from this process (when it holds the role).
pub fn spawn(recorder: Arc<Recorder>, sink_env: SinkEnv) {
    tokio::spawn(async move {
        let store = recorder.store().clone();
        loop {
            let mut role = match store.try_role(ROLE).await {
                Ok(Some(role)) => role,
                Ok(None) => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot take the notifier role");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    continue;
                }
            };
            let mut state = State::default();
            let mut woken = recorder.subscribe();
            while role.still_held().await {
                if let Err(error) = round(&recorder, &sink_env, &mut state).await {
                    tracing::warn!(%error, "notification round failed");
                }
                let _ = tokio::time::timeout(LOOK_EVERY, woken.changed()).await;
            }
        }
    });
}

/// One pass over every organization's destinations.
async fn round(
    recorder: &Recorder,
    sink_env: &SinkEnv,
    state: &mut State,
) -> Result<(), sluice_store::StoreError> {
    let store = recorder.store();
    for (org_id, text) in store.all_notification_destinations().await? {
        let Ok(destinations) = serde_json::from_str::<Vec<NotificationDestination>>(&text) else {
            tracing::warn!(org_id, "stored notification destinations do not parse");
            continue;
        };
        let progress = store.notification_progress(&org_id).await?;
        for destination in destinations {
            let key = (org_id.clone(), destination.uid.clone());
            if state.next_try.get(&key).is_some_and(|at| Instant::now() < *at) {
                continue;
            }
            let Some(mut progress) = progress.iter().find(|p| p.uid == destination.uid).cloned()
            else {
                continue;
            };
            let query = EventQuery {
                org_id: Some(org_id.clone()),
                service: true,
                operator: destination.operator_events,
                kinds: destination.kinds.clone(),
                min_severity: Some(destination.min_severity),
                after_id: Some(progress.delivered_id),
                limit: SEND_BATCH,
                ..EventQuery::default()
            };
            let events = store.list_events(&query).await?;
            if events.is_empty() {
                continue;
            }
            let outcome = deliver(state, sink_env, &org_id, &destination, &events).await;
            settle(recorder, state, key, &mut progress, &events, outcome);
            store.put_notification_progress(&progress).await?;
        }
    }
    Ok(())
}

/// Sends `events` to `destination`, building its transport when needed.
async fn deliver(
    state: &mut State,
    sink_env: &SinkEnv,
    org_id: &str,
    destination: &NotificationDestination,
    events: &[Event],
) -> Result<(), TransportError> {
    let key = (org_id.to_owned(), destination.uid.clone());
    if state.targets.get(&key).is_none_or(|t| t.config != *destination) {
        let transport = build(sink_env, org_id, destination).await?;
        state.targets.insert(key.clone(), Target { config: destination.clone(), transport });
    }
    let transport = state.targets.get(&key).map(|t| t.transport.clone()).expect("built above");
    let records: Vec<NewRecord> = events
        .iter()
        .map(|event| {
            let value = serde_json::to_vec(event).expect("an event serializes");
            NewRecord::new(event.id.to_string(), value)
        })
        .collect();
    let (first, last) = (events[0].id, events[events.len() - 1].id);
    let id = format!("events-{}-{first}-{last}", destination.uid);
    let sent = transport.send(Batch { id: &id, records: &records }).await?;
    if let Some((_, reason)) = sent.rejected.first() {
        return Err(TransportError::rejected(reason.clone()));
    }
    Ok(())
}

/// The transport of `destination`, with the organization secrets it names.
async fn build(
    sink_env: &SinkEnv,
    org_id: &str,
    destination: &NotificationDestination,
) -> Result<Arc<dyn Transport>, TransportError> {
    let mut resolved = ResolvedSecrets::new();
    let names: Vec<&str> = destination.sink.secrets().into_iter().map(|(_, name)| name).collect();
    if let (Some(secrets), false) = (&sink_env.secrets, names.is_empty()) {
        match secrets.resolve(org_id, &names).await {
            Ok(found) => resolved.extend(found),
            // The build below names what is missing.
            Err(sluice_store::SecretsError::Missing(_)) => {}
            Err(error) => return Err(TransportError::retryable(error.to_string())),
        }
    }
    let context = sinks::SinkContext {
        pipeline_id: "notifications",
        secrets: &resolved,
        static_egress: false,
        egress: sink_env.egress,
        // Events are no chain stream; only the message sinks take them (the destination's
        // check refuses the others).
        stream: ("", "service_event"),
        guarantee: sluice_core::pipeline::DeliveryGuarantee::AtLeastOnce,
    };
    match sinks::transport(&destination.sink, context) {
        Ok(Some(transport)) => Ok(transport),
        Ok(None) => Err(TransportError::rejected("a managed sink cannot take notifications")),
        // A missing secret may be created later: tried again after the backoff.
        Err(error) => Err(TransportError::retryable(error.to_string())),
    }
}

/// Moves the destination's cursor after a success (or a refusal for good), or counts the
/// failure and sets when to try again.
fn settle(
    recorder: &Recorder,
    state: &mut State,
    key: (String, String),
    progress: &mut NotificationProgress,
    events: &[Event],
    outcome: Result<(), TransportError>,
) {
    let now = sluice_core::time::format(recorder.now());
    progress.last_attempt_at = Some(now.clone());
    let last = events.last().map_or(progress.delivered_id, |e| e.id);
    match outcome {
        Ok(()) => {
            progress.delivered_id = last;
            progress.delivered_count += events.len() as i64;
            progress.failures = 0;
            progress.last_error = None;
            progress.last_delivered_at = Some(now);
            state.next_try.remove(&key);
        }
        Err(TransportError::Rejected { message }) => {
            tracing::warn!(org_id = key.0, uid = key.1, %message, "notifications refused");
            progress.delivered_id = last;
            progress.failures = 0;
            progress.last_error = Some(format!("refused (events skipped): {message}"));
            state.next_try.remove(&key);
        }
        Err(TransportError::Retryable { message, retry_after }) => {
            progress.failures += 1;
            progress.last_error = Some(message);
            let max = recorder.settings().notify_max_backoff;
            let exponent = u32::try_from(progress.failures.clamp(1, 16) - 1).unwrap_or(0);
            let backoff = Duration::from_millis(500).saturating_mul(1 << exponent).min(max);
            let wait = retry_after.map_or(backoff, |asked| asked.max(backoff));
            state.next_try.insert(key, Instant::now() + wait);
        }
    }
}
