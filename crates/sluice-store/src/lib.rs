//! `sluice-store` owns Sluice's durable metadata: identities and API keys, pipeline records,
//! sharing, set-filter values, deployments and token price candles ([`prices`]), on SQLite (the embedded default, WAL) or
//! PostgreSQL.
//!
//! Start at [`MetadataStore`], the role every backend plays, and [`open`], which picks the
//! backend from a URL. Both backends run the same SQL (written once in [`sql`]) where they
//! can; what must differ (bulk filter-value statements, locking, a migration's DDL) lives in
//! the backend's own module. `tests/it/conformance.rs` runs one suite against each. This
//! crate must not depend on the runtime or the API.

mod datasets;
pub mod dialect;
mod filter_sets;
pub mod metrics;
mod migrations;
mod postgres;
pub mod prices;
mod sql;
mod sqlite;
mod store;

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::deployment::DeploymentRecord;
use sluice_core::identity::{Org, Principal, Team, User};
use sluice_core::permission::{Access, Grants};
use sluice_core::pipeline::Pipeline;

pub use datasets::{DatasetStore, EntriesChange, EntryPage};
pub use dialect::Dialect;
pub use metrics::{MetricSample, MetricsStore};
pub use postgres::{PgDialect, PgStore};
pub use prices::{PriceStore, open_prices};
pub use sqlite::{SqliteDialect, SqliteStore};
pub use store::Store;

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration {version} ({name}) failed: {source}")]
    Migration { version: i64, name: &'static str, source: sqlx::Error },
    #[error("stored {what} could not be read: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("unsupported database URL '{0}': use sqlite://<path> or postgres://…")]
    UnsupportedUrl(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A new API key, already hashed.
#[derive(Debug, Clone)]
pub struct NewApiKey<'a> {
    pub id: &'a str,
    pub user_id: &'a str,
    /// First characters of the key, to find candidates without the secret.
    pub prefix: &'a str,
    /// Hex SHA-256 of the whole key.
    pub hash: &'a str,
}

/// An active key whose prefix matched, with the principal it authenticates.
#[derive(Debug, Clone)]
pub struct KeyCandidate {
    pub hash: String,
    pub principal: Principal,
}

/// The org, team and user an admin command or the bootstrap made sure exist.
#[derive(Debug, Clone)]
pub struct Identity {
    pub org: Org,
    pub team: Team,
    pub user: User,
}

/// Ids given for sharing that are not users or teams of the organization.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnknownMembers {
    pub users: Vec<String>,
    pub teams: Vec<String>,
}

/// One page of a set filter's values, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterValuePage {
    pub values: Vec<String>,
    /// The cursor of the next page (pass it as `after`); `None` when no value follows.
    pub next: Option<i64>,
}

/// Durable metadata. Every method is one transaction.
#[async_trait]
pub trait MetadataStore: DatasetStore + MetricsStore + Send + Sync + 'static {
    /// Checks the database answers.
    async fn ping(&self) -> Result<()>;

    /// Whether any user exists (the first start creates the operator).
    async fn has_users(&self) -> Result<bool>;

    /// Creates whatever of org, team and user is missing (new orgs get default flags);
    /// `operator` set makes the user an operator, unset leaves an existing user as it is.
    async fn ensure_identity(
        &self,
        org: &str,
        team: &str,
        user: &str,
        operator: bool,
    ) -> Result<Identity>;

    async fn insert_api_key(&self, key: NewApiKey<'_>) -> Result<()>;

    /// Active (not revoked) keys with this prefix.
    async fn api_key_candidates(&self, prefix: &str) -> Result<Vec<KeyCandidate>>;

    /// Revokes the key with this hash; false when no active key has it.
    async fn revoke_api_key(&self, hash: &str) -> Result<bool>;

    /// Changes the flags given; `None` when the org does not exist.
    async fn set_org_flags(
        &self,
        org: &str,
        pipelines: Option<bool>,
        custom_transforms: Option<bool>,
    ) -> Result<Option<Org>>;

    /// Stores a new pipeline, makes `viewer_team` its viewer team and stores initial filter
    /// values `(transform uid, values)`.
    async fn insert_pipeline(
        &self,
        pipeline: &Pipeline,
        viewer_team: &str,
        filter_values: &[(String, Vec<String>)],
    ) -> Result<()>;

    /// The pipeline and what `caller` may do to it; `None` when it does not exist or belongs
    /// to another organization.
    async fn pipeline_with_access(
        &self,
        id: &str,
        caller: &Principal,
    ) -> Result<Option<(Pipeline, Access)>>;

    /// Every pipeline `caller` can read, oldest first.
    async fn list_readable_pipelines(&self, caller: &Principal) -> Result<Vec<Pipeline>>;

    /// Replaces the editable fields and `updated_at`; filter values of transforms that are no
    /// longer set filters are deleted. False when the pipeline does not exist.
    async fn update_pipeline(&self, pipeline: &Pipeline) -> Result<bool>;

    /// Deletes the pipeline with its grants, filter values and deployment. False when it did
    /// not exist.
    async fn delete_pipeline(&self, id: &str) -> Result<bool>;

    async fn pipeline_grants(&self, id: &str) -> Result<Grants>;

    async fn replace_pipeline_grants(&self, id: &str, grants: &Grants) -> Result<()>;

    /// Which of `users` and `teams` are not members of `org_id`.
    async fn unknown_members(
        &self,
        org_id: &str,
        users: &[String],
        teams: &[String],
    ) -> Result<UnknownMembers>;

    /// Number of filter values of one transform.
    async fn filter_value_count(&self, pipeline_id: &str, transform_uid: &str) -> Result<u64>;

    /// Adds `values` (normalised by the caller; repeats within `values` count once) to the
    /// set of one transform. Returns how many were not in the set before.
    ///
    /// Values are stored only for a set filter of the stored pipeline configuration: when
    /// the pipeline does not exist or `transform_uid` is not one of its set filters (say a
    /// concurrent update removed it), nothing changes and the answer is 0. Writers of one
    /// pipeline are serialised, so values committed later always list after values
    /// committed earlier.
    ///
    /// # Errors
    /// A database failure; nothing is added then.
    async fn add_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64>;

    /// Removes `values` from the set of one transform; values not in it are ignored. Returns
    /// how many were removed (0 when `transform_uid` is not a set filter of a stored
    /// pipeline).
    ///
    /// # Errors
    /// A database failure; nothing is removed then.
    async fn remove_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64>;

    /// Makes the set of one transform exactly `values` (empty clears it), atomically: readers
    /// see the old set or the new one. Returns the number of values in the set after (0, and
    /// nothing changes, when `transform_uid` is not a set filter of a stored pipeline, as for
    /// [`MetadataStore::add_filter_values`]). Values in both the old and the new set keep their
    /// cursor position; new ones list after every value already there.
    ///
    /// # Errors
    /// A database failure; the old set stays then.
    async fn replace_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64>;

    /// Up to `limit` (at least 1) values of one transform that were added after cursor
    /// `after` (`None`: from the start), oldest first. Paging with [`FilterValuePage::next`]
    /// while others add values neither skips nor repeats a value; values added meanwhile
    /// appear on a later page.
    ///
    /// # Errors
    /// A database failure.
    async fn list_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<FilterValuePage>;

    /// Every value of one transform's set as of one committed write (empty when the set was
    /// never written): what a set filter's index starts from. Copied from the store's own
    /// copy when that is current, else read without blocking writers.
    ///
    /// # Errors
    /// A database failure.
    async fn filter_value_set(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<sluice_filter::ValueSet>;

    /// Whether `value` (normalised by the caller) is in the set of one transform.
    ///
    /// # Errors
    /// A database failure.
    async fn has_filter_value(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        value: &str,
    ) -> Result<bool>;

    /// Stores a pipeline's deployment, replacing the one stored for that pipeline.
    ///
    /// # Errors
    /// A database failure, including when `record.pipeline_id` names no stored pipeline.
    async fn put_deployment(&self, record: &DeploymentRecord) -> Result<()>;

    /// The stored deployment of a pipeline; `None` when it is not deployed.
    ///
    /// # Errors
    /// A database failure, or a stored record that cannot be read.
    async fn deployment(&self, pipeline_id: &str) -> Result<Option<DeploymentRecord>>;

    /// Every stored deployment, oldest `deployed_at` first (what a starting runtime resumes).
    ///
    /// # Errors
    /// A database failure, or a stored record that cannot be read.
    async fn list_deployments(&self) -> Result<Vec<DeploymentRecord>>;

    /// Forgets a pipeline's deployment (teardown); false when none was stored. Deleting the
    /// pipeline deletes its deployment too.
    ///
    /// # Errors
    /// A database failure.
    async fn delete_deployment(&self, pipeline_id: &str) -> Result<bool>;
}

/// Opens the store a URL names, creating and migrating the database as needed:
/// `sqlite://<path>` (file created when missing) or `postgres://…`.
///
/// # Errors
/// An unsupported URL, a connection failure or a failed migration.
pub async fn open(url: &str) -> Result<Arc<dyn MetadataStore>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }
}
