//! The identity role ([`IdentityStore`]): organizations, teams, users and API keys.

use async_trait::async_trait;
use sluice_core::identity::{Org, OrgFlags, Principal, Team, User};
use sqlx::Row as _;

use crate::dialect::{Row, StoreBackend};
use crate::store::now;
use crate::{Result, Store};

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

/// Columns of the key-lookup join.
pub(crate) struct KeyRow {
    pub hash: String,
    pub user_id: String,
    pub team_id: String,
    pub org_id: String,
    pub is_operator: bool,
    pub is_org_admin: bool,
    pub pipelines_enabled: bool,
    pub custom_transforms_enabled: bool,
}

impl KeyRow {
    pub(crate) fn into_candidate(self) -> KeyCandidate {
        KeyCandidate {
            hash: self.hash,
            principal: Principal {
                user_id: self.user_id,
                team_id: self.team_id,
                org_id: self.org_id,
                is_operator: self.is_operator,
                is_org_admin: self.is_org_admin,
                flags: OrgFlags {
                    pipelines: self.pipelines_enabled,
                    custom_transforms: self.custom_transforms_enabled,
                },
            },
        }
    }
}

/// Identities and API keys. Every method is one transaction.
#[async_trait]
pub trait IdentityStore: Send + Sync + 'static {
    /// Checks the database answers (and the set store, when the values live apart).
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

    /// Which of `users` and `teams` are not members of `org_id`.
    async fn unknown_members(
        &self,
        org_id: &str,
        users: &[String],
        teams: &[String],
    ) -> Result<UnknownMembers>;
}

impl<D: StoreBackend> Store<D> {
    /// Those of `ids` (in order) that name no row of `table` (`users` or `teams`) in org
    /// `org_id`.
    async fn not_in_org(&self, table: &str, ids: &[String], org_id: &str) -> Result<Vec<String>> {
        let query = format!("SELECT 1 FROM {table} WHERE id = $1 AND org_id = $2");
        let mut unknown = Vec::new();
        for id in ids {
            let found =
                sqlx::query(&query).bind(id).bind(org_id).fetch_optional(&self.pool).await?;
            if found.is_none() {
                unknown.push(id.clone());
            }
        }
        Ok(unknown)
    }

    async fn org_by_name(tx: &mut sqlx::Transaction<'_, D::Db>, name: &str) -> Result<Option<Org>> {
        let row = sqlx::query(
            "SELECT id, name, pipelines_enabled, custom_transforms_enabled FROM orgs WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
        row.as_ref().map(Self::org_row).transpose()
    }

    fn org_row(row: &Row<D>) -> Result<Org> {
        Ok(Org {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            flags: OrgFlags {
                pipelines: row.try_get("pipelines_enabled")?,
                custom_transforms: row.try_get("custom_transforms_enabled")?,
            },
        })
    }
}

#[async_trait]
impl<D: StoreBackend> IdentityStore for Store<D> {
    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        if let Some(redis) = &self.redis {
            redis.ping().await?;
        }
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
        let user_row =
            sqlx::query("SELECT id, is_operator FROM users WHERE team_id = $1 AND name = $2")
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
            "SELECT k.hash, u.id AS user_id, u.team_id, u.org_id, u.is_operator, u.is_org_admin, \
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
                    is_org_admin: row.try_get("is_org_admin")?,
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
        Ok(D::rows_affected(&done) == 1)
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

    async fn unknown_members(
        &self,
        org_id: &str,
        users: &[String],
        teams: &[String],
    ) -> Result<UnknownMembers> {
        Ok(UnknownMembers {
            users: self.not_in_org("users", users, org_id).await?,
            teams: self.not_in_org("teams", teams, org_id).await?,
        })
    }
}
