//! The pipeline role ([`PipelineStore`]): pipeline records and who may read or edit them.

use async_trait::async_trait;
use sluice_core::identity::Principal;
use sluice_core::permission::{Access, Grants, UserRole};
use sluice_core::pipeline::{DeliveryGuarantee, Pipeline, PipelineConfig, PodSize};
use sluice_core::time;
use sqlx::Row as _;

use crate::dialect::Query;
use crate::dialect::{Row, StoreBackend};
use crate::filter_values::sorted_unique;
use crate::redis_sets::{LogState, SetRef};
use crate::set_history::{ChangeLists, ChangeStamp, SetChangeKind};
use crate::{Result, Store, StoreError};

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

/// Pipelines and their sharing. Every method is one transaction.
#[async_trait]
pub trait PipelineStore: Send + Sync + 'static {
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
}

impl<D: StoreBackend> Store<D> {
    /// Redis mode: deletes the values of set `set`, whose row a committed transaction
    /// deleted. A failure leaves values under an id nothing names any more; it is logged,
    /// not answered, as the deletion itself is done.
    async fn drop_redis_set(&self, pipeline_id: &str, transform_uid: &str, set: i64) {
        let Some(redis) = &self.redis else { return };
        let set_ref = SetRef { pipeline_id, transform_uid, id: set };
        if let Err(error) = redis.drop_set(set_ref, false).await {
            tracing::warn!(%error, pipeline_id, transform_uid, set, "the values of a deleted set stay in Redis");
        }
    }

    fn pipeline_row(row: &Row<D>) -> Result<Pipeline> {
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

    /// Binds the editable columns in the order `name, description, tags, static_egress_ip,
    /// pod_size, delivery_guarantee, pipeline_config, updated_at`, after whatever the
    /// statement bound before them.
    fn bind_editable<'q>(
        query: Query<'q, D>,
        pipeline: &'q Pipeline,
        text: &'q PipelineText,
    ) -> Query<'q, D> {
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
}

#[async_trait]
impl<D: StoreBackend> PipelineStore for Store<D> {
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
        Self::bind_editable(insert, pipeline, &text).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO pipeline_viewer_teams (pipeline_id, team_id) VALUES ($1, $2)")
            .bind(&pipeline.id)
            .bind(viewer_team)
            .execute(&mut *tx)
            .await?;
        // Inline values are the set's first change, made when the pipeline was.
        let stamp = ChangeStamp { at: pipeline.created_at, position: None };
        let kind = SetChangeKind::Add;
        for (uid, values) in filter_values {
            let given = || values.len();
            let (set, _) = Self::set_row(&mut tx, &pipeline.id, uid, true)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            if let Some(redis) = &self.redis {
                // Written before the commit: should the commit fail, the values stay under
                // a set id nothing names (and that a rolled-back id's next user clears).
                let values: Vec<String> =
                    sorted_unique(values).into_iter().map(str::to_owned).collect();
                redis.clear(set).await?;
                let set = SetRef { pipeline_id: &pipeline.id, transform_uid: uid, id: set };
                let mut members = sluice_filter::ValueSet::with_capacity(values.len());
                redis.add(set, &mut members, LogState::default(), &values).await?;
                let count = values.len();
                Self::record_set_change(
                    &mut tx,
                    &pipeline.id,
                    uid,
                    &stamp,
                    kind,
                    given(),
                    ChangeLists::added(&values),
                    count,
                )
                .await?;
                Self::record_count(&mut tx, set.id, count).await?;
                continue;
            }
            let unique = sorted_unique(values);
            let added = D::insert_values(&mut tx, set, &mut unique.iter().copied()).await?;
            Self::mark_written(&mut tx, set, added as i64).await?;
            Self::record_set_change(
                &mut tx,
                &pipeline.id,
                uid,
                &stamp,
                kind,
                given(),
                ChangeLists::added(&unique),
                unique.len(),
            )
            .await?;
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
        let pipeline = Self::pipeline_row(&row)?;
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
        rows.iter().map(Self::pipeline_row).collect()
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
        let updated = Self::bind_editable(update, pipeline, &text)
            .execute(&mut *tx)
            .await
            .map(|done| D::rows_affected(&done))?;
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
                let set: i64 = row.try_get("id")?;
                Self::drop_set(&mut tx, set).await?;
                Self::forget_set_history(&mut tx, &pipeline.id, &uid, pipeline.updated_at).await?;
                dropped.push((uid, set));
            }
        }
        tx.commit().await?;
        for (uid, set) in &dropped {
            self.sets.forget(&pipeline.id, Some(uid));
            self.drop_redis_set(&pipeline.id, uid, *set).await;
        }
        Ok(true)
    }

    async fn delete_pipeline(&self, id: &str) -> Result<bool> {
        let mut tx = D::begin_write(&self.pool).await?;
        // Lock the pipeline row first: that waits for filter-value writers holding it,
        // so the values deleted next include everything they committed. Deleting the
        // pipeline then deletes its sets, grants and deployment by cascade.
        if sqlx::query(D::LOCK_PIPELINE).bind(id).fetch_optional(&mut *tx).await?.is_none() {
            return Ok(false);
        }
        let sets = sqlx::query("SELECT id, transform_uid FROM filter_sets WHERE pipeline_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        sqlx::query(
            "DELETE FROM filter_values WHERE set_id IN \
             (SELECT id FROM filter_sets WHERE pipeline_id = $1)",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let done =
            sqlx::query("DELETE FROM pipelines WHERE id = $1").bind(id).execute(&mut *tx).await?;
        // Its deployment went by cascade.
        sqlx::query(crate::deployments::BUMP_DEPLOYMENTS_SEQ).execute(&mut *tx).await?;
        tx.commit().await?;
        self.sets.forget(id, None);
        for row in &sets {
            let uid: String = row.try_get("transform_uid")?;
            self.drop_redis_set(id, &uid, row.try_get("id")?).await;
        }
        Ok(D::rows_affected(&done) == 1)
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
}
