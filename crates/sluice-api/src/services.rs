//! Application services: what a change does once its handler has parsed the request and
//! checked the caller's permission — commit it to the store, tell the in-memory copies that
//! follow the store (the runtime's set indexes, the dataset index behind `beam.contains`),
//! and redeploy a running pipeline when its transforms changed.
//!
//! Every change of a pipeline runs in its turn: the handler (or, for filter values, the
//! service) takes the pipeline's [`LifecycleGuard`] from the runtime before it reads what the
//! change depends on, and the service holds it until the change is stored and applied, so
//! two changes of one pipeline never interleave and a transform edit's redeploy never undoes
//! a pause or a deploy (`sluice_runtime` has the one owner per pipeline).
//!
//! Each service runs in a task of its own ([`detached`]): a client that hangs up drops its
//! handler, but never between a commit and the notification that must follow it, so the
//! in-memory copies can never miss a committed change. Handlers parse, call one service
//! function, and render its answer.

use chrono::{DateTime, Utc};
use sluice_core::datasets::{Dataset, DatasetChange, DatasetRef};
use sluice_core::deployment::DeploymentState;
use sluice_core::filter_values::FilterValuesChange;
use sluice_core::pipeline::{Pipeline, Source};
use sluice_core::validation::{Loc, Violation};
use sluice_runtime::LifecycleGuard;
use sluice_store::{ChangeStamp, SetChangeKind};

use crate::error::ApiError;
use crate::state::AppState;

/// Runs `change` (a commit and what must follow it) in a task of its own and waits for it:
/// dropping the caller does not stop it half way.
///
/// # Errors
/// The change's own error, or [`ApiError::Internal`] when its task panicked.
pub async fn detached<T: Send + 'static>(
    change: impl Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(change)
        .await
        .map_err(|error| ApiError::Internal(format!("a change task failed: {error}")))?
}

/// Stores a new pipeline with the initial values of its set filters, and tells the set
/// indexes about the values.
///
/// # Errors
/// A store failure; then nothing is stored.
pub async fn create_pipeline(
    state: &AppState,
    pipeline: Pipeline,
    team_id: String,
    initial_values: Vec<(String, Vec<String>)>,
) -> Result<Pipeline, ApiError> {
    let state = state.clone();
    detached(async move {
        state.store.insert_pipeline(&pipeline, &team_id, &initial_values).await?;
        for (uid, values) in &initial_values {
            state.filter_listener.changed(&pipeline.id, uid, FilterValuesChange::Added(values));
        }
        tracing::info!(config_id = %pipeline.id, "pipeline created");
        crate::events::pipeline_changed(&state, &pipeline, "pipeline.created");
        Ok(pipeline)
    })
    .await
}

/// Whether a stored change of a pipeline's configuration also reaches its running workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeploy {
    /// `PUT {base_url}/{id}`: the change applies at the next deploy.
    No,
    /// Transform edits: a deployed pipeline redeploys by itself.
    IfDeployed,
}

/// Stores `updated` in place of `previous` (the store deletes the filter values of set
/// filters the new configuration no longer has), drops their set indexes, and redeploys a
/// deployed pipeline when `redeploy` says so. `lifecycle` is the pipeline's turn, held
/// until all of it is done.
///
/// # Errors
/// 404 when the pipeline is gone; 422 when a deployed pipeline could not run `updated`
/// (nothing is stored then); a store or runtime failure.
pub async fn update_pipeline(
    state: &AppState,
    mut lifecycle: LifecycleGuard,
    previous: &Pipeline,
    updated: Pipeline,
    redeploy: Redeploy,
) -> Result<Pipeline, ApiError> {
    let state = state.clone();
    let dropped: Vec<String> = previous
        .set_filter_uids()
        .filter(|uid| !updated.set_filter_uids().any(|new| new == *uid))
        .map(str::to_owned)
        .collect();
    detached(async move {
        let config_id = updated.id.clone();
        let runtime = state.runtime.as_ref().filter(|_| redeploy == Redeploy::IfDeployed);
        if let Some(runtime) = runtime {
            if runtime.state(&config_id).await? == Some(DeploymentState::Deployed) {
                // Refuse before storing what the running pipeline could not switch to.
                runtime.check_deployable(&updated).await.map_err(|error| match error {
                    sluice_runtime::RuntimeError::Plan(error) => {
                        ApiError::Validation(vec![Violation::new(
                            &Loc::body(),
                            "not_deployable",
                            error.to_string(),
                        )])
                    }
                    other => other.into(),
                })?;
            }
        }
        // One transaction: the new configuration, `updated_at`, and the deletion of the
        // filter values of set filters the new configuration no longer has.
        if !state.store.update_pipeline(&updated).await? {
            return Err(ApiError::NotFound(format!("Pipeline {config_id} not found")));
        }
        // Running workers keep the index they hold until a redeploy swaps their plan, so
        // records processed before the swap are filtered exactly as before.
        for uid in &dropped {
            state.filter_listener.changed(&config_id, uid, FilterValuesChange::Dropped);
        }
        if let Some(runtime) = runtime {
            // Asked again after storing: a pause in between must not be undone by a deploy.
            if runtime.state(&config_id).await? == Some(DeploymentState::Deployed) {
                lifecycle.deploy(&updated).await?;
                tracing::info!(%config_id, "redeployed after a transform change");
            }
        }
        tracing::info!(%config_id, "pipeline updated");
        crate::events::pipeline_changed(&state, &updated, "pipeline.updated");
        Ok(updated)
    })
    .await
}

/// Deletes a pipeline: tears its deployment down first (docs/contract.md §Pipeline deployment
/// states), then deletes the configuration with its filter values and sharing, drops its set
/// indexes and its metrics.
/// `lifecycle` is the pipeline's turn, held until all of it is done.
///
/// # Errors
/// 404 when the pipeline is gone; a store or runtime failure.
pub async fn delete_pipeline(
    state: &AppState,
    mut lifecycle: LifecycleGuard,
    pipeline: Pipeline,
) -> Result<(), ApiError> {
    let state = state.clone();
    detached(async move {
        let config_id = pipeline.id.as_str();
        lifecycle.teardown().await?;
        if !state.store.delete_pipeline(config_id).await? {
            return Err(ApiError::NotFound(format!("Pipeline {config_id} not found")));
        }
        for uid in pipeline.set_filter_uids() {
            state.filter_listener.changed(config_id, uid, FilterValuesChange::Dropped);
        }
        // Its metrics go with it (the retention job would remove them within 8 days anyway).
        if let Some(runtime) = &state.runtime {
            if let Err(error) = runtime.metrics().forget(config_id).await {
                tracing::warn!(%error, config_id, "cannot delete the metrics of a deleted pipeline");
            }
        }
        tracing::info!(config_id, "pipeline deleted");
        crate::events::pipeline_changed(&state, &pipeline, "pipeline.deleted");
        Ok(())
    })
    .await
}

/// A change of a set filter's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValuesChange {
    /// `POST`: add; answers how many were new.
    Add,
    /// `PUT`: replace every value; answers the new count.
    Replace,
    /// `DELETE`: remove; answers how many were there.
    Remove,
}

/// Applies `change` with `values` (normalised) to the set of transform `uid` of pipeline
/// `pipeline_id` in the pipeline's turn, then tells the set indexes, so running workers
/// filter with it at their next batch. The change is recorded in the set's history at the
/// time of the turn and the head of `source`'s stream ([`stream_head`]).
///
/// On several nodes the change does not keep other nodes' changes out with the database
/// lock: the store's row lock on the pipeline, taken in the transaction that writes the
/// values and their set's version, already orders every node's writers of the set
/// (docs/runtime.md, "The control side").
///
/// # Errors
/// A store failure; then nothing changed and nothing is told.
pub async fn change_filter_values(
    state: &AppState,
    org_id: String,
    pipeline_id: String,
    uid: String,
    values: Vec<String>,
    change: ValuesChange,
    source: Source,
) -> Result<u64, ApiError> {
    let state = state.clone();
    detached(async move {
        let _turn = state.lifecycle_here(&pipeline_id).await?;
        // Stamped once the pipeline's changes are ours: stamps grow with the changes.
        let stamp = ChangeStamp { at: state.clock.now(), position: stream_head(&state, &source) };
        let (id, uid) = (pipeline_id.as_str(), uid.as_str());
        let store = &state.store;
        let (count, heard) = match change {
            ValuesChange::Add => (
                store.change_filter_values(id, uid, &values, SetChangeKind::Add, stamp).await?,
                FilterValuesChange::Added(&values),
            ),
            ValuesChange::Replace => {
                let before = store.filter_value_count(id, uid).await?;
                let kind = SetChangeKind::Replace;
                let after = store.change_filter_values(id, uid, &values, kind, stamp).await?;
                crate::events::values_replaced(&state, &org_id, id, uid, before, after);
                (after, FilterValuesChange::Replaced(&values))
            }
            ValuesChange::Remove => (
                store.change_filter_values(id, uid, &values, SetChangeKind::Remove, stamp).await?,
                FilterValuesChange::Removed(&values),
            ),
        };
        state.filter_listener.changed(id, uid, heard);
        if state.filter_listener.follows_feed() {
            wait_for_feed(&state, id, uid).await?;
        }
        Ok(count)
    })
    .await
}

/// The head of `source`'s stream as this process knows it: the highest block (slot) its
/// ingester of that chain has appended to the finalized streams, or to the zerolag ones for
/// a zerolag source; `None` when this process runs no ingester of the chain (the push
/// endpoint, the demo feed, a Kafka source, another node's ingester). The position a
/// filter-value change is recorded at (docs/set-filter.md, "Set history").
pub fn stream_head(state: &AppState, source: &Source) -> Option<i64> {
    let chains = state.chains.as_ref()?;
    let status = chains
        .statuses()
        .into_iter()
        .find(|status| status.chain == source.chain && status.source.is_none())?;
    let block = if source.is_zerolag { status.zerolag_ingested } else { status.ingested };
    block.and_then(|block| i64::try_from(block).ok())
}

/// The longest a filter-value change waits for this node's index to hold it.
const FEED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// On a shared set store, waits (up to [`FEED_WAIT`]) until this node's index of the set,
/// if it has one, holds the set's stored version: the change came back through the feed.
/// Past the wait the answer goes anyway; the index follows.
async fn wait_for_feed(state: &AppState, id: &str, uid: &str) -> Result<(), ApiError> {
    let stored = state.store.filter_set_version(id, uid).await?;
    let started = std::time::Instant::now();
    while !state.filter_listener.caught_up(id, uid, stored) {
        if started.elapsed() >= FEED_WAIT {
            tracing::warn!(
                config_id = id,
                transform_uid = uid,
                ?stored,
                "the set index did not take the change within the wait; answering anyway"
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Creates the dataset `name` of `owner` and tells the dataset index.
///
/// # Errors
/// 409 when the owner has a dataset of that name; a store failure.
pub async fn create_dataset(
    state: &AppState,
    owner: String,
    name: String,
    at: DateTime<Utc>,
) -> Result<Dataset, ApiError> {
    let state = state.clone();
    detached(async move {
        let created = state.store.create_dataset(&owner, &name, at).await?;
        let dataset =
            created.ok_or_else(|| ApiError::Conflict(format!("Dataset {name} already exists")))?;
        state.dataset_listener.changed(DatasetRef::of(&dataset), DatasetChange::Created);
        Ok(dataset)
    })
    .await
}

/// Deletes `owner`'s dataset `id` with every entry and tells the dataset index.
///
/// # Errors
/// 404 when the owner has no such dataset; a store failure.
pub async fn delete_dataset(
    state: &AppState,
    owner: String,
    id: String,
) -> Result<Dataset, ApiError> {
    let state = state.clone();
    detached(async move {
        let deleted = state.store.delete_dataset(&owner, &id).await?;
        let dataset = deleted.ok_or_else(|| dataset_not_found(&id))?;
        state.dataset_listener.changed(DatasetRef::of(&dataset), DatasetChange::Dropped);
        Ok(dataset)
    })
    .await
}

/// Whether a change adds or removes dataset entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntriesOp {
    Add,
    Remove,
}

/// Adds `values` to (or removes them from) `dataset` and tells the dataset index; answers
/// how many entries changed.
///
/// # Errors
/// 404 when the dataset is gone; a store failure.
pub async fn change_dataset_entries(
    state: &AppState,
    dataset: Dataset,
    values: Vec<String>,
    op: EntriesOp,
    at: DateTime<Utc>,
) -> Result<u64, ApiError> {
    let state = state.clone();
    detached(async move {
        let (owner, id) = (&dataset.owner_user_id, &dataset.id);
        let stored = match op {
            EntriesOp::Add => state.store.add_dataset_entries(owner, id, &values, at).await?,
            EntriesOp::Remove => state.store.remove_dataset_entries(owner, id, &values, at).await?,
        };
        let stored = stored.ok_or_else(|| dataset_not_found(id))?;
        let (version, values) = (stored.version, values.as_slice());
        let heard = match op {
            EntriesOp::Add => DatasetChange::Added { version, values },
            EntriesOp::Remove => DatasetChange::Removed { version, values },
        };
        state.dataset_listener.changed(DatasetRef::of(&dataset), heard);
        Ok(stored.count)
    })
    .await
}

/// The 404 of a dataset the caller does not have.
pub fn dataset_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("Dataset {id} not found"))
}
