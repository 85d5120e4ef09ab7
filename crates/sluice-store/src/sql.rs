//! The SQL both backends run, written once.
//!
//! sqlx's query functions are generic over the database but their trait bounds are unwieldy
//! to spell out, so [`metadata_store_impl!`] expands the same method bodies for each concrete
//! pool type instead. Placeholders are `$N`, which SQLite accepts too. Rows are decoded into
//! plain column structs here and turned into domain types by ordinary functions.

use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_core::identity::{OrgFlags, Principal};
use sluice_core::pipeline::{DeliveryGuarantee, Pipeline, PipelineConfig, PodSize};
use sluice_core::time;

use crate::{Result, StoreError};

/// The values of one request, each once, sorted.
///
/// Requests may repeat a value. Sorted rows go into a dataset's `(dataset_seq, value)` key in
/// key order, which keeps a large load appending to the same index pages instead of touching
/// pages all over the tree; a new pipeline's initial filter values only need the repeats out.
pub(crate) fn sorted_unique(values: &[String]) -> Vec<&str> {
    let mut sorted: Vec<&str> = values.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
}

/// A `deployments` row as stored.
pub(crate) struct DeploymentRow {
    pub pipeline_id: String,
    pub state: String,
    pub pipeline: String,
    pub deployed_at: String,
    pub updated_at: String,
}

/// The text columns of a deployment, ready to bind.
pub(crate) struct DeploymentText {
    pub pipeline: String,
    pub deployed_at: String,
    pub updated_at: String,
}

pub(crate) fn deployment_text(record: &DeploymentRecord) -> Result<DeploymentText> {
    Ok(DeploymentText {
        pipeline: serde_json::to_string(&record.pipeline).map_err(|detail| {
            StoreError::Corrupt { what: "deployment", detail: detail.to_string() }
        })?,
        deployed_at: time::format(record.deployed_at),
        updated_at: time::format(record.updated_at),
    })
}

impl DeploymentRow {
    pub(crate) fn into_record(self) -> Result<DeploymentRecord> {
        let id = &self.pipeline_id;
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "deployment",
            detail: format!("{id}: {detail}"),
        };
        let timestamp =
            |text: &str| time::parse(text).map_err(|e| corrupt(format!("timestamp {text:?}: {e}")));
        Ok(DeploymentRecord {
            state: DeploymentState::from_name(&self.state)
                .ok_or_else(|| corrupt(format!("state {:?}", self.state)))?,
            pipeline: serde_json::from_str(&self.pipeline)
                .map_err(|e| corrupt(format!("pipeline: {e}")))?,
            deployed_at: timestamp(&self.deployed_at)?,
            updated_at: timestamp(&self.updated_at)?,
            pipeline_id: self.pipeline_id,
        })
    }
}

/// The id of the set of pipeline `$1`'s transform `$2`, as a scalar subquery (NULL, so no
/// rows, when the set was never written).
pub(crate) const SET_ID: &str =
    "(SELECT id FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2)";

pub(crate) const PIPELINE_COLUMNS: &str = "p.id, p.organization_id, p.owner_user_id, p.name, \
    p.description, p.tags, p.static_egress_ip, p.pod_size, p.delivery_guarantee, \
    p.pipeline_config, p.created_at, p.updated_at";

/// A `pipelines` row as stored.
pub(crate) struct PipelineRow {
    pub id: String,
    pub organization_id: String,
    pub owner_user_id: String,
    pub name: String,
    pub description: String,
    pub tags: Option<String>,
    pub static_egress_ip: bool,
    pub pod_size: String,
    pub delivery_guarantee: String,
    pub pipeline_config: String,
    pub created_at: String,
    pub updated_at: String,
}

/// The text columns of a pipeline, ready to bind.
pub(crate) struct PipelineText {
    pub tags: Option<String>,
    pub config: String,
    pub created_at: String,
    pub updated_at: String,
}

pub(crate) fn pipeline_text(pipeline: &Pipeline) -> Result<PipelineText> {
    let encode = |detail: serde_json::Error| StoreError::Corrupt {
        what: "pipeline",
        detail: detail.to_string(),
    };
    Ok(PipelineText {
        tags: pipeline.tags.as_ref().map(serde_json::to_string).transpose().map_err(encode)?,
        config: serde_json::to_string(&pipeline.pipeline_config).map_err(encode)?,
        created_at: time::format(pipeline.created_at),
        updated_at: time::format(pipeline.updated_at),
    })
}

impl PipelineRow {
    pub(crate) fn into_pipeline(self) -> Result<Pipeline> {
        let corrupt = |detail: String| StoreError::Corrupt { what: "pipeline", detail };
        let tags = self
            .tags
            .map(|tags| serde_json::from_str::<Vec<String>>(&tags))
            .transpose()
            .map_err(|e| corrupt(format!("{}: tags: {e}", self.id)))?;
        let pipeline_config: PipelineConfig = serde_json::from_str(&self.pipeline_config)
            .map_err(|e| corrupt(format!("{}: pipeline_config: {e}", self.id)))?;
        let timestamp = |text: &str| {
            time::parse(text).map_err(|e| corrupt(format!("{}: timestamp {text:?}: {e}", self.id)))
        };
        Ok(Pipeline {
            pod_size: PodSize::from_name(&self.pod_size)
                .ok_or_else(|| corrupt(format!("{}: pod_size {:?}", self.id, self.pod_size)))?,
            delivery_guarantee: DeliveryGuarantee::from_name(&self.delivery_guarantee)
                .ok_or_else(|| corrupt(format!("{}: delivery_guarantee", self.id)))?,
            created_at: timestamp(&self.created_at)?,
            updated_at: timestamp(&self.updated_at)?,
            id: self.id,
            name: self.name,
            description: self.description,
            tags,
            static_egress_ip: self.static_egress_ip,
            owner_org_team_user_id: self.owner_user_id,
            organization_id: self.organization_id,
            pipeline_config,
        })
    }
}

/// Columns of the key-lookup join.
pub(crate) struct KeyRow {
    pub hash: String,
    pub user_id: String,
    pub team_id: String,
    pub org_id: String,
    pub is_operator: bool,
    pub pipelines_enabled: bool,
    pub custom_transforms_enabled: bool,
}

impl KeyRow {
    pub(crate) fn into_candidate(self) -> crate::KeyCandidate {
        crate::KeyCandidate {
            hash: self.hash,
            principal: Principal {
                user_id: self.user_id,
                team_id: self.team_id,
                org_id: self.org_id,
                is_operator: self.is_operator,
                flags: OrgFlags {
                    pipelines: self.pipelines_enabled,
                    custom_transforms: self.custom_transforms_enabled,
                },
            },
        }
    }
}

/// Implements [`crate::MetadataStore`] for a store type with a `pool: sqlx::Pool<$db>` field,
/// and an inherent `migrate` method.
///
/// What differs between the databases the store type supplies itself, in its own module:
/// `const BACKEND: Backend`, `const LOCK_PIPELINE: &str` (a statement that selects
/// `pipeline_config` of pipeline `$1` and holds off other writers of that row until commit),
/// `async fn begin_write(&self)` (a transaction that will write), `async fn
/// begin_snapshot(&self)` (a read-only transaction whose reads all see one committed state,
/// without blocking writers), and the bulk filter-value
/// statements, run while the pipeline lock is held: `insert_values(tx, set_id, values)`
/// appends values known to be absent (each once) to a set, and `delete_values(tx, set_id,
/// list, listed)` deletes the rows whose value is in `list` (`listed`) or not in it, in one
/// statement (the table has no index on values, so a statement per chunk would read the set
/// once per chunk); each returns the rows changed. `const JSON_AGG: &str` names the aggregate that gathers
/// text values into one JSON array, and `const INDEX_ORDER: &[&str]` holds statements that
/// make the rest of a transaction read a set's rows along its key instead of sorting them
/// (see [`crate::postgres`]). The store type also has a
/// `sets: Arc<crate::filter_sets::SetCache>` field.
macro_rules! metadata_store_impl {
    ($store:ty, $db:ty, $d:ty) => {
        use sluice_core::deployment::DeploymentRecord;
        use sluice_core::identity::{Org, OrgFlags, Principal, Team, User};
        use sluice_core::permission::{Access, Grants, UserRole};
        use sluice_core::pipeline::Pipeline;
        use sqlx::Row as _;

        use sluice_filter::ValueSet;

        use crate::filter_sets::Slot;
        use crate::sql::{
            DeploymentRow, KeyRow, PIPELINE_COLUMNS, PipelineRow, SET_ID, deployment_text,
            pipeline_text, sorted_unique,
        };
        use crate::{
            FilterValuePage, Identity, KeyCandidate, MetadataStore, NewApiKey, Result, StoreError,
            UnknownMembers,
        };

        type DbRow = <$db as sqlx::Database>::Row;

        fn pipeline_row(row: &DbRow) -> Result<Pipeline> {
            PipelineRow {
                id: row.try_get("id")?,
                organization_id: row.try_get("organization_id")?,
                owner_user_id: row.try_get("owner_user_id")?,
                name: row.try_get("name")?,
                description: row.try_get("description")?,
                tags: row.try_get("tags")?,
                static_egress_ip: row.try_get("static_egress_ip")?,
                pod_size: row.try_get("pod_size")?,
                delivery_guarantee: row.try_get("delivery_guarantee")?,
                pipeline_config: row.try_get("pipeline_config")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
            }
            .into_pipeline()
        }

        fn org_row(row: &DbRow) -> Result<Org> {
            Ok(Org {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                flags: OrgFlags {
                    pipelines: row.try_get("pipelines_enabled")?,
                    custom_transforms: row.try_get("custom_transforms_enabled")?,
                },
            })
        }

        type Query<'q> = sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>;

        /// Binds the editable columns in the order `name, description, tags, static_egress_ip,
        /// pod_size, delivery_guarantee, pipeline_config, updated_at`, after whatever the
        /// statement bound before them.
        fn bind_editable<'q>(
            query: Query<'q>,
            pipeline: &'q Pipeline,
            text: &'q crate::sql::PipelineText,
        ) -> Query<'q> {
            query
                .bind(&pipeline.name)
                .bind(&pipeline.description)
                .bind(&text.tags)
                .bind(pipeline.static_egress_ip)
                .bind(pipeline.pod_size.name())
                .bind(pipeline.delivery_guarantee.name())
                .bind(&text.config)
                .bind(&text.updated_at)
        }

        fn deployment_row(row: &DbRow) -> Result<DeploymentRecord> {
            DeploymentRow {
                pipeline_id: row.try_get("pipeline_id")?,
                state: row.try_get("state")?,
                pipeline: row.try_get("pipeline")?,
                deployed_at: row.try_get("deployed_at")?,
                updated_at: row.try_get("updated_at")?,
            }
            .into_record()
        }

        /// Rows per read when a replace scans the set it replaces.
        const SCAN_PAGE: i64 = 100_000;

        fn now() -> String {
            sluice_core::time::format(chrono::Utc::now())
        }

        impl $store {
            /// Applies every migration not applied yet.
            ///
            /// # Errors
            /// The first migration that fails, by version and name.
            pub async fn migrate(&self) -> Result<()> {
                sqlx::query(crate::migrations::CREATE_TABLE).execute(&self.pool).await?;
                for migration in crate::migrations::MIGRATIONS {
                    let (version, name) = (migration.version, migration.name);
                    let sql = migration.sql.for_backend(<$d as crate::Dialect>::BACKEND);
                    let fail = |source| StoreError::Migration { version, name, source };
                    let mut tx = self.pool.begin().await.map_err(fail)?;
                    let claimed = sqlx::query(
                        "INSERT INTO sluice_schema_migrations (version, name, applied_at) \
                         VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING",
                    )
                    .bind(version)
                    .bind(name)
                    .bind(now())
                    .execute(&mut *tx)
                    .await
                    .map_err(fail)?
                    .rows_affected();
                    if claimed == 1 {
                        sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(fail)?;
                        tracing::info!(version, name, "applied migration");
                    }
                    tx.commit().await.map_err(fail)?;
                }
                Ok(())
            }

            async fn org_by_name(
                tx: &mut sqlx::Transaction<'_, $db>,
                name: &str,
            ) -> Result<Option<Org>> {
                let row = sqlx::query(
                    "SELECT id, name, pipelines_enabled, custom_transforms_enabled FROM orgs WHERE name = $1",
                )
                .bind(name)
                .fetch_optional(&mut **tx)
                .await?;
                row.as_ref().map(org_row).transpose()
            }

            /// Locks pipeline `id` against other filter-value writers, updates and deletion
            /// until `tx` ends, and tells whether `uid` is one of its set filters. Writers that
            /// get false change nothing.
            ///
            /// This is what stands in for a foreign key on `filter_values`: values are only
            /// written for a set filter of a pipeline that exists while the row is locked.
            /// Serialising the writers of a pipeline also makes `seq` order commit order, which
            /// keeps the listing cursor from skipping a value committed late.
            async fn lock_set_filter(
                tx: &mut sqlx::Transaction<'_, $db>,
                id: &str,
                uid: &str,
            ) -> Result<bool> {
                let Some(row) =
                    sqlx::query(<$d as crate::Dialect>::LOCK_PIPELINE).bind(id).fetch_optional(&mut **tx).await?
                else {
                    return Ok(false);
                };
                let config: sluice_core::pipeline::PipelineConfig =
                    serde_json::from_str(row.try_get("pipeline_config")?).map_err(|e| {
                        StoreError::Corrupt { what: "pipeline", detail: format!("{id}: pipeline_config: {e}") }
                    })?;
                Ok(config.transforms.iter().any(|t| t.is_set_filter() && t.uid() == uid))
            }

            /// The stored `(id, version)` of the set of pipeline `id`'s transform `uid`;
            /// `create` makes it when missing, else `None` means the set was never written.
            /// Call with the pipeline locked.
            async fn set_row(
                tx: &mut sqlx::Transaction<'_, $db>,
                id: &str,
                uid: &str,
                create: bool,
            ) -> Result<Option<(i64, i64)>> {
                if create {
                    sqlx::query(
                        "INSERT INTO filter_sets (pipeline_id, transform_uid, value_count) \
                         VALUES ($1, $2, 0) ON CONFLICT (pipeline_id, transform_uid) DO NOTHING",
                    )
                    .bind(id)
                    .bind(uid)
                    .execute(&mut **tx)
                    .await?;
                }
                let row = sqlx::query(
                    "SELECT id, version FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
                )
                .bind(id)
                .bind(uid)
                .fetch_optional(&mut **tx)
                .await?;
                Ok(row.map(|row| Ok::<_, sqlx::Error>((row.try_get("id")?, row.try_get("version")?))).transpose()?)
            }

            /// The values of stored set `set_id` at `version`: the slot's when they are
            /// current, else read from the table (in seq order, a page at a time). The slot is
            /// left empty either way; the caller puts the values back after its commit. Call
            /// with the pipeline locked.
            async fn current_values(
                tx: &mut sqlx::Transaction<'_, $db>,
                slot: &mut Slot,
                set_id: i64,
                version: i64,
            ) -> Result<ValueSet> {
                match slot.take_current(set_id, version) {
                    Some(values) => Ok(values),
                    None => Self::read_set(tx, set_id).await,
                }
            }

            /// Every value of stored set `set_id`, read a page of [`SCAN_PAGE`] at a time.
            async fn read_set(tx: &mut sqlx::Transaction<'_, $db>, set_id: i64) -> Result<ValueSet> {
                let count: i64 = sqlx::query("SELECT value_count FROM filter_sets WHERE id = $1")
                    .bind(set_id)
                    .fetch_one(&mut **tx)
                    .await?
                    .try_get("value_count")?;
                let mut values = ValueSet::with_capacity(usize::try_from(count).unwrap_or(0));
                // A page arrives as one row holding a JSON array: a row per value costs
                // several times more in the drivers than the set's own work.
                let sql = format!(
                    "SELECT COUNT(*) AS n, MAX(seq) AS last, {} AS page FROM \
                     (SELECT seq, value FROM filter_values WHERE set_id = $1 AND seq > $2 \
                      ORDER BY seq LIMIT $3) AS p",
                    <$d as crate::Dialect>::JSON_AGG
                );
                for statement in <$d as crate::Dialect>::INDEX_ORDER {
                    sqlx::query(statement).execute(&mut **tx).await?;
                }
                let mut after = 0_i64;
                loop {
                    let row = sqlx::query(&sql)
                        .bind(set_id)
                        .bind(after)
                        .bind(SCAN_PAGE)
                        .fetch_one(&mut **tx)
                        .await?;
                    let n: i64 = row.try_get("n")?;
                    if n == 0 {
                        break;
                    }
                    let page: Vec<String> = serde_json::from_str(row.try_get::<&str, _>("page")?)
                        .map_err(|e| StoreError::Corrupt {
                            what: "filter values",
                            detail: format!("set {set_id}: page after seq {after}: {e}"),
                        })?;
                    for value in &page {
                        values.insert(value);
                    }
                    if n < SCAN_PAGE {
                        break;
                    }
                    after = row.try_get("last")?;
                }
                tracing::debug!(set_id, values = values.len(), "filter set read");
                Ok(values)
            }

            /// Records a write of set `set_id` that changed its size by `change`, and
            /// returns the set's new version.
            async fn mark_written(
                tx: &mut sqlx::Transaction<'_, $db>,
                set_id: i64,
                change: i64,
            ) -> Result<i64> {
                Ok(sqlx::query(
                    "UPDATE filter_sets SET value_count = value_count + $2, version = version + 1 \
                     WHERE id = $1 RETURNING version",
                )
                .bind(set_id)
                .bind(change)
                .fetch_one(&mut **tx)
                .await?
                .try_get("version")?)
            }

            /// Deletes one set and its values.
            async fn drop_set(tx: &mut sqlx::Transaction<'_, $db>, set_id: i64) -> Result<()> {
                sqlx::query("DELETE FROM filter_values WHERE set_id = $1")
                    .bind(set_id)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query("DELETE FROM filter_sets WHERE id = $1")
                    .bind(set_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }
        }

        #[async_trait::async_trait]
        impl MetadataStore for $store {
            async fn ping(&self) -> Result<()> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            async fn has_users(&self) -> Result<bool> {
                let row = sqlx::query("SELECT COUNT(*) AS n FROM users").fetch_one(&self.pool).await?;
                Ok(row.try_get::<i64, _>("n")? > 0)
            }

            async fn ensure_identity(
                &self,
                org: &str,
                team: &str,
                user: &str,
                operator: bool,
            ) -> Result<Identity> {
                let mut tx = self.pool.begin().await?;
                let flags = OrgFlags::default();
                sqlx::query(
                    "INSERT INTO orgs (id, name, pipelines_enabled, custom_transforms_enabled, created_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
                )
                .bind(sluice_core::ids::new_id())
                .bind(org)
                .bind(flags.pipelines)
                .bind(flags.custom_transforms)
                .bind(now())
                .execute(&mut *tx)
                .await?;
                let org = Self::org_by_name(&mut tx, org).await?.ok_or(sqlx::Error::RowNotFound)?;

                sqlx::query(
                    "INSERT INTO teams (id, org_id, name, created_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (org_id, name) DO NOTHING",
                )
                .bind(sluice_core::ids::new_id())
                .bind(&org.id)
                .bind(team)
                .bind(now())
                .execute(&mut *tx)
                .await?;
                let team_id: String = sqlx::query("SELECT id FROM teams WHERE org_id = $1 AND name = $2")
                    .bind(&org.id)
                    .bind(team)
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get("id")?;

                sqlx::query(
                    "INSERT INTO users (id, org_id, team_id, name, is_operator, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (team_id, name) DO NOTHING",
                )
                .bind(sluice_core::ids::new_id())
                .bind(&org.id)
                .bind(&team_id)
                .bind(user)
                .bind(operator)
                .bind(now())
                .execute(&mut *tx)
                .await?;
                if operator {
                    sqlx::query("UPDATE users SET is_operator = $1 WHERE team_id = $2 AND name = $3")
                        .bind(true)
                        .bind(&team_id)
                        .bind(user)
                        .execute(&mut *tx)
                        .await?;
                }
                let user_row = sqlx::query("SELECT id, is_operator FROM users WHERE team_id = $1 AND name = $2")
                    .bind(&team_id)
                    .bind(user)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(Identity {
                    user: User {
                        id: user_row.try_get("id")?,
                        org_id: org.id.clone(),
                        team_id: team_id.clone(),
                        name: user.to_owned(),
                        is_operator: user_row.try_get("is_operator")?,
                    },
                    team: Team { id: team_id, org_id: org.id.clone(), name: team.to_owned() },
                    org,
                })
            }

            async fn insert_api_key(&self, key: NewApiKey<'_>) -> Result<()> {
                sqlx::query(
                    "INSERT INTO api_keys (id, user_id, prefix, hash, created_at) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(key.id)
                .bind(key.user_id)
                .bind(key.prefix)
                .bind(key.hash)
                .bind(now())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn api_key_candidates(&self, prefix: &str) -> Result<Vec<KeyCandidate>> {
                let rows = sqlx::query(
                    "SELECT k.hash, u.id AS user_id, u.team_id, u.org_id, u.is_operator, \
                     o.pipelines_enabled, o.custom_transforms_enabled \
                     FROM api_keys k JOIN users u ON u.id = k.user_id JOIN orgs o ON o.id = u.org_id \
                     WHERE k.prefix = $1 AND k.revoked_at IS NULL",
                )
                .bind(prefix)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| {
                        Ok(KeyRow {
                            hash: row.try_get("hash")?,
                            user_id: row.try_get("user_id")?,
                            team_id: row.try_get("team_id")?,
                            org_id: row.try_get("org_id")?,
                            is_operator: row.try_get("is_operator")?,
                            pipelines_enabled: row.try_get("pipelines_enabled")?,
                            custom_transforms_enabled: row.try_get("custom_transforms_enabled")?,
                        }
                        .into_candidate())
                    })
                    .collect()
            }

            async fn revoke_api_key(&self, hash: &str) -> Result<bool> {
                let done = sqlx::query(
                    "UPDATE api_keys SET revoked_at = $1 WHERE hash = $2 AND revoked_at IS NULL",
                )
                .bind(now())
                .bind(hash)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn set_org_flags(
                &self,
                org: &str,
                pipelines: Option<bool>,
                custom_transforms: Option<bool>,
            ) -> Result<Option<Org>> {
                let mut tx = self.pool.begin().await?;
                sqlx::query(
                    "UPDATE orgs SET pipelines_enabled = COALESCE($1, pipelines_enabled), \
                     custom_transforms_enabled = COALESCE($2, custom_transforms_enabled) WHERE name = $3",
                )
                .bind(pipelines)
                .bind(custom_transforms)
                .bind(org)
                .execute(&mut *tx)
                .await?;
                let found = Self::org_by_name(&mut tx, org).await?;
                tx.commit().await?;
                Ok(found)
            }

            async fn insert_pipeline(
                &self,
                pipeline: &Pipeline,
                viewer_team: &str,
                filter_values: &[(String, Vec<String>)],
            ) -> Result<()> {
                let text = pipeline_text(pipeline)?;
                let mut tx = self.pool.begin().await?;
                let insert = sqlx::query(
                    "INSERT INTO pipelines (id, organization_id, owner_user_id, created_at, name, \
                     description, tags, static_egress_ip, pod_size, delivery_guarantee, pipeline_config, \
                     updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                )
                .bind(&pipeline.id)
                .bind(&pipeline.organization_id)
                .bind(&pipeline.owner_org_team_user_id)
                .bind(&text.created_at);
                bind_editable(insert, pipeline, &text).execute(&mut *tx).await?;
                sqlx::query("INSERT INTO pipeline_viewer_teams (pipeline_id, team_id) VALUES ($1, $2)")
                    .bind(&pipeline.id)
                    .bind(viewer_team)
                    .execute(&mut *tx)
                    .await?;
                for (uid, values) in filter_values {
                    let (set, _) = Self::set_row(&mut tx, &pipeline.id, uid, true)
                        .await?
                        .ok_or(sqlx::Error::RowNotFound)?;
                    let added =
                        <$d as crate::Dialect>::insert_values(&mut tx, set, &mut sorted_unique(values).into_iter()).await?;
                    Self::mark_written(&mut tx, set, added as i64).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn pipeline_with_access(
                &self,
                id: &str,
                caller: &Principal,
            ) -> Result<Option<(Pipeline, Access)>> {
                let sql = format!(
                    "SELECT {PIPELINE_COLUMNS}, \
                     (SELECT r.role FROM pipeline_user_roles r WHERE r.pipeline_id = p.id AND r.user_id = $2) AS role, \
                     (SELECT COUNT(*) FROM pipeline_viewer_teams t WHERE t.pipeline_id = p.id AND t.team_id = $3) AS viewer \
                     FROM pipelines p WHERE p.id = $1 AND p.organization_id = $4"
                );
                let Some(row) = sqlx::query(&sql)
                    .bind(id)
                    .bind(&caller.user_id)
                    .bind(&caller.team_id)
                    .bind(&caller.org_id)
                    .fetch_optional(&self.pool)
                    .await?
                else {
                    return Ok(None);
                };
                let pipeline = pipeline_row(&row)?;
                let role = if pipeline.owner_org_team_user_id == caller.user_id {
                    Some(UserRole::Owner)
                } else {
                    row.try_get::<Option<String>, _>("role")?.as_deref().and_then(UserRole::from_name)
                };
                let viewer_team = row.try_get::<i64, _>("viewer")? > 0;
                Ok(Some((pipeline, Access { role, viewer_team })))
            }

            async fn list_readable_pipelines(&self, caller: &Principal) -> Result<Vec<Pipeline>> {
                let sql = format!(
                    "SELECT {PIPELINE_COLUMNS} FROM pipelines p WHERE p.organization_id = $1 AND (\
                     p.owner_user_id = $2 \
                     OR EXISTS (SELECT 1 FROM pipeline_user_roles r WHERE r.pipeline_id = p.id AND r.user_id = $2) \
                     OR EXISTS (SELECT 1 FROM pipeline_viewer_teams t WHERE t.pipeline_id = p.id AND t.team_id = $3)) \
                     ORDER BY p.created_at, p.id"
                );
                let rows = sqlx::query(&sql)
                    .bind(&caller.org_id)
                    .bind(&caller.user_id)
                    .bind(&caller.team_id)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(pipeline_row).collect()
            }

            async fn update_pipeline(&self, pipeline: &Pipeline) -> Result<bool> {
                let text = pipeline_text(pipeline)?;
                let mut tx = self.pool.begin().await?;
                let update = sqlx::query(
                    "UPDATE pipelines SET name = $2, description = $3, tags = $4, static_egress_ip = $5, \
                     pod_size = $6, delivery_guarantee = $7, pipeline_config = $8, updated_at = $9 \
                     WHERE id = $1",
                )
                .bind(&pipeline.id);
                let updated =
                    bind_editable(update, pipeline, &text).execute(&mut *tx).await?.rows_affected();
                if updated == 0 {
                    return Ok(false);
                }
                let sets = sqlx::query("SELECT id, transform_uid FROM filter_sets WHERE pipeline_id = $1")
                    .bind(&pipeline.id)
                    .fetch_all(&mut *tx)
                    .await?;
                let kept: Vec<&str> = pipeline.set_filter_uids().collect();
                let mut dropped = Vec::new();
                for row in &sets {
                    let uid: String = row.try_get("transform_uid")?;
                    if !kept.contains(&uid.as_str()) {
                        Self::drop_set(&mut tx, row.try_get("id")?).await?;
                        dropped.push(uid);
                    }
                }
                tx.commit().await?;
                for uid in &dropped {
                    self.sets.forget(&pipeline.id, Some(uid));
                }
                Ok(true)
            }

            async fn delete_pipeline(&self, id: &str) -> Result<bool> {
                let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                // Lock the pipeline row first: that waits for filter-value writers holding it,
                // so the values deleted next include everything they committed. Deleting the
                // pipeline then deletes its sets, grants and deployment by cascade.
                if sqlx::query(<$d as crate::Dialect>::LOCK_PIPELINE).bind(id).fetch_optional(&mut *tx).await?.is_none() {
                    return Ok(false);
                }
                sqlx::query(
                    "DELETE FROM filter_values WHERE set_id IN \
                     (SELECT id FROM filter_sets WHERE pipeline_id = $1)",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
                let done = sqlx::query("DELETE FROM pipelines WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                self.sets.forget(id, None);
                Ok(done.rows_affected() == 1)
            }

            async fn pipeline_grants(&self, id: &str) -> Result<Grants> {
                let mut grants = Grants::default();
                let roles = sqlx::query(
                    "SELECT user_id, role FROM pipeline_user_roles WHERE pipeline_id = $1 ORDER BY user_id",
                )
                .bind(id)
                .fetch_all(&self.pool)
                .await?;
                for row in &roles {
                    let user: String = row.try_get("user_id")?;
                    match UserRole::from_name(&row.try_get::<String, _>("role")?) {
                        Some(UserRole::Editor) => grants.editors.push(user),
                        Some(UserRole::Reader) => grants.readers.push(user),
                        _ => {
                            return Err(StoreError::Corrupt {
                                what: "pipeline role",
                                detail: format!("pipeline {id}, user {user}"),
                            });
                        }
                    }
                }
                let teams = sqlx::query(
                    "SELECT team_id FROM pipeline_viewer_teams WHERE pipeline_id = $1 ORDER BY team_id",
                )
                .bind(id)
                .fetch_all(&self.pool)
                .await?;
                grants.viewer_teams =
                    teams.iter().map(|row| row.try_get("team_id")).collect::<Result<_, _>>()?;
                Ok(grants)
            }

            async fn replace_pipeline_grants(&self, id: &str, grants: &Grants) -> Result<()> {
                let mut tx = self.pool.begin().await?;
                sqlx::query("DELETE FROM pipeline_user_roles WHERE pipeline_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM pipeline_viewer_teams WHERE pipeline_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                let roles = grants
                    .editors
                    .iter()
                    .map(|user| (user, UserRole::Editor))
                    .chain(grants.readers.iter().map(|user| (user, UserRole::Reader)));
                for (user, role) in roles {
                    sqlx::query(
                        "INSERT INTO pipeline_user_roles (pipeline_id, user_id, role) VALUES ($1, $2, $3)",
                    )
                    .bind(id)
                    .bind(user)
                    .bind(role.name())
                    .execute(&mut *tx)
                    .await?;
                }
                for team in &grants.viewer_teams {
                    sqlx::query("INSERT INTO pipeline_viewer_teams (pipeline_id, team_id) VALUES ($1, $2)")
                        .bind(id)
                        .bind(team)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn unknown_members(
                &self,
                org_id: &str,
                users: &[String],
                teams: &[String],
            ) -> Result<UnknownMembers> {
                let mut unknown = UnknownMembers::default();
                for user in users {
                    let found = sqlx::query("SELECT 1 FROM users WHERE id = $1 AND org_id = $2")
                        .bind(user)
                        .bind(org_id)
                        .fetch_optional(&self.pool)
                        .await?;
                    if found.is_none() {
                        unknown.users.push(user.clone());
                    }
                }
                for team in teams {
                    let found = sqlx::query("SELECT 1 FROM teams WHERE id = $1 AND org_id = $2")
                        .bind(team)
                        .bind(org_id)
                        .fetch_optional(&self.pool)
                        .await?;
                    if found.is_none() {
                        unknown.teams.push(team.clone());
                    }
                }
                Ok(unknown)
            }

            async fn filter_value_count(&self, pipeline_id: &str, transform_uid: &str) -> Result<u64> {
                let row = sqlx::query(
                    "SELECT value_count FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
                )
                .bind(pipeline_id)
                .bind(transform_uid)
                .fetch_optional(&self.pool)
                .await?;
                let count = row.map(|row| row.try_get::<i64, _>("value_count")).transpose()?;
                Ok(count.map_or(0, |count| u64::try_from(count).unwrap_or(0)))
            }

            async fn add_filter_values(
                &self,
                pipeline_id: &str,
                transform_uid: &str,
                values: &[String],
            ) -> Result<u64> {
                let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
                let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                if values.is_empty() || !Self::lock_set_filter(&mut tx, pipeline_id, transform_uid).await? {
                    return Ok(0);
                }
                let (set, version) = Self::set_row(&mut tx, pipeline_id, transform_uid, true)
                    .await?
                    .ok_or(sqlx::Error::RowNotFound)?;
                let mut members = Self::current_values(&mut tx, &mut slot, set, version).await?;
                // The set decides what is new, repeats within the request included, as the
                // backend draws the values; the rows are appended in request order.
                let mut new = values.iter().map(String::as_str).filter(|value| members.insert(value));
                let added = <$d as crate::Dialect>::insert_values(&mut tx, set, &mut new).await?;
                let version = if added == 0 {
                    version
                } else {
                    Self::mark_written(&mut tx, set, added as i64).await?
                };
                tx.commit().await?;
                self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, members);
                Ok(added)
            }

            async fn remove_filter_values(
                &self,
                pipeline_id: &str,
                transform_uid: &str,
                values: &[String],
            ) -> Result<u64> {
                let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
                let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                if !Self::lock_set_filter(&mut tx, pipeline_id, transform_uid).await? {
                    return Ok(0);
                }
                let Some((set, version)) =
                    Self::set_row(&mut tx, pipeline_id, transform_uid, false).await?
                else {
                    return Ok(0);
                };
                let mut members = Self::current_values(&mut tx, &mut slot, set, version).await?;
                let present: Vec<&str> =
                    values.iter().map(String::as_str).filter(|value| members.remove(value)).collect();
                let version = if present.is_empty() {
                    version
                } else {
                    let removed = <$d as crate::Dialect>::delete_values(&mut tx, set, &present, true).await?;
                    if removed != present.len() as u64 {
                        return Err(StoreError::Corrupt {
                            what: "filter values",
                            detail: format!(
                                "set {set}: {} values to remove were in memory, {removed} rows in the table",
                                present.len()
                            ),
                        });
                    }
                    Self::mark_written(&mut tx, set, -(removed as i64)).await?
                };
                tx.commit().await?;
                self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, members);
                Ok(present.len() as u64)
            }

            async fn replace_filter_values(
                &self,
                pipeline_id: &str,
                transform_uid: &str,
                values: &[String],
            ) -> Result<u64> {
                let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
                slot.loaded = None;
                let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                if !Self::lock_set_filter(&mut tx, pipeline_id, transform_uid).await? {
                    return Ok(0);
                }
                if values.is_empty() {
                    if let Some((set, _)) = Self::set_row(&mut tx, pipeline_id, transform_uid, false).await? {
                        Self::drop_set(&mut tx, set).await?;
                    }
                    tx.commit().await?;
                    return Ok(0);
                }
                let (set, version) = Self::set_row(&mut tx, pipeline_id, transform_uid, true)
                    .await?
                    .ok_or(sqlx::Error::RowNotFound)?;
                let members = Self::current_values(&mut tx, &mut slot, set, version).await?;
                // Only the difference is written: values in both sets keep their rows (and so
                // their cursor position), and re-sending a mostly unchanged list writes little.
                let mut wanted = ValueSet::with_capacity(values.len());
                let kept: Vec<&str> =
                    values.iter().map(String::as_str).filter(|value| wanted.insert(value)).collect();
                let new: Vec<&str> = kept.iter().copied().filter(|value| !members.contains(value)).collect();
                let stale = members.len() - (kept.len() - new.len());
                let mut removed = 0;
                if stale > 0 {
                    removed = <$d as crate::Dialect>::delete_values(&mut tx, set, &kept, false).await?;
                }
                if removed != stale as u64 {
                    return Err(StoreError::Corrupt {
                        what: "filter values",
                        detail: format!("set {set}: {stale} stale values in memory, {removed} rows deleted"),
                    });
                }
                <$d as crate::Dialect>::insert_values(&mut tx, set, &mut new.iter().copied()).await?;
                let version =
                    Self::mark_written(&mut tx, set, new.len() as i64 - removed as i64).await?;
                tx.commit().await?;
                let count = wanted.len() as u64;
                self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, wanted);
                Ok(count)
            }

            async fn list_filter_values(
                &self,
                pipeline_id: &str,
                transform_uid: &str,
                after: Option<i64>,
                limit: u32,
            ) -> Result<FilterValuePage> {
                let limit = limit.max(1);
                let mut tx = self.pool.begin().await?;
                for statement in <$d as crate::Dialect>::INDEX_ORDER {
                    sqlx::query(statement).execute(&mut *tx).await?;
                }
                // One row more than asked tells whether another page follows.
                let rows = sqlx::query(&format!(
                    "SELECT seq, value FROM filter_values \
                     WHERE set_id = {SET_ID} AND seq > $3 ORDER BY seq LIMIT $4"
                ))
                .bind(pipeline_id)
                .bind(transform_uid)
                .bind(after.unwrap_or(0))
                .bind(i64::from(limit) + 1)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                let more = rows.len() > limit as usize;
                let page = &rows[..rows.len().min(limit as usize)];
                let next = match page.last() {
                    Some(last) if more => Some(last.try_get::<i64, _>("seq")?),
                    _ => None,
                };
                let values = page.iter().map(|row| row.try_get("value")).collect::<Result<_, _>>()?;
                Ok(FilterValuePage { values, next })
            }

            async fn has_filter_value(
                &self,
                pipeline_id: &str,
                transform_uid: &str,
                value: &str,
            ) -> Result<bool> {
                let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
                let row = sqlx::query(
                    "SELECT id, version FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
                )
                .bind(pipeline_id)
                .bind(transform_uid)
                .fetch_optional(&self.pool)
                .await?;
                let Some(row) = row else { return Ok(false) };
                let (set, version): (i64, i64) = (row.try_get("id")?, row.try_get("version")?);
                if let Some(loaded) = slot.loaded.as_ref().filter(|_| slot.is_current(set, version)) {
                    return Ok(loaded.values.contains(value));
                }
                // Not loaded (or behind): read it from one snapshot, which is one version.
                let mut tx = <$d as crate::Dialect>::begin_snapshot(&self.pool).await?;
                let Some((set, version)) =
                    Self::set_row(&mut tx, pipeline_id, transform_uid, false).await?
                else {
                    return Ok(false);
                };
                let members = Self::current_values(&mut tx, &mut slot, set, version).await?;
                tx.commit().await?;
                let hit = members.contains(value);
                self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, members);
                Ok(hit)
            }

            async fn filter_value_set(
                &self,
                pipeline_id: &str,
                transform_uid: &str,
            ) -> Result<ValueSet> {
                // Slot first, connection second, as every user of a slot does.
                {
                    let slot = self.sets.lock(pipeline_id, transform_uid).await;
                    if let Some(loaded) = &slot.loaded {
                        let row = sqlx::query("SELECT version FROM filter_sets WHERE id = $1")
                            .bind(loaded.set_id)
                            .fetch_optional(&self.pool)
                            .await?;
                        if let Some(row) = row {
                            if slot.is_current(loaded.set_id, row.try_get("version")?) {
                                return Ok(loaded.values.clone());
                            }
                        }
                    }
                }
                // Read without taking the slot: the store keeps no copy of a set nobody writes.
                let mut tx = <$d as crate::Dialect>::begin_snapshot(&self.pool).await?;
                let Some((set, _)) = Self::set_row(&mut tx, pipeline_id, transform_uid, false).await?
                else {
                    return Ok(ValueSet::new());
                };
                let values = Self::read_set(&mut tx, set).await?;
                tx.commit().await?;
                Ok(values)
            }

            async fn put_deployment(&self, record: &DeploymentRecord) -> Result<()> {
                let text = deployment_text(record)?;
                sqlx::query(
                    "INSERT INTO deployments (pipeline_id, state, pipeline, deployed_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (pipeline_id) DO UPDATE SET \
                     state = excluded.state, pipeline = excluded.pipeline, \
                     deployed_at = excluded.deployed_at, updated_at = excluded.updated_at",
                )
                .bind(&record.pipeline_id)
                .bind(record.state.name())
                .bind(&text.pipeline)
                .bind(&text.deployed_at)
                .bind(&text.updated_at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn deployment(&self, pipeline_id: &str) -> Result<Option<DeploymentRecord>> {
                let row = sqlx::query(
                    "SELECT pipeline_id, state, pipeline, deployed_at, updated_at FROM deployments \
                     WHERE pipeline_id = $1",
                )
                .bind(pipeline_id)
                .fetch_optional(&self.pool)
                .await?;
                row.as_ref().map(deployment_row).transpose()
            }

            async fn list_deployments(&self) -> Result<Vec<DeploymentRecord>> {
                let rows = sqlx::query(
                    "SELECT pipeline_id, state, pipeline, deployed_at, updated_at FROM deployments \
                     ORDER BY deployed_at, pipeline_id",
                )
                .fetch_all(&self.pool)
                .await?;
                rows.iter().map(deployment_row).collect()
            }

            async fn delete_deployment(&self, pipeline_id: &str) -> Result<bool> {
                let done = sqlx::query("DELETE FROM deployments WHERE pipeline_id = $1")
                    .bind(pipeline_id)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    };
}

pub(crate) use metadata_store_impl;
