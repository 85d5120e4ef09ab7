//! Organization secrets: the stored role ([`SecretStore`], sealed values only) and
//! [`Secrets`], the service the API and the runtime use, which seals and opens values with
//! the server's [`Keyring`]. Nothing here logs or formats a value.

pub mod keyring;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::secret::{ResolvedSecret, ResolvedSecrets, SecretValue};
use sqlx::Row as _;

pub use keyring::{Keyring, Sealed, SecretsKey};

use crate::dialect::{Row, StoreBackend};
use crate::store::now;
use crate::{MetadataStore, Result, Store, StoreError};

/// What can go wrong with secrets besides the database.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("{0}")]
    BadKey(&'static str),
    #[error("cannot use the secrets key file {0}: {1}")]
    KeyFile(String, #[source] std::io::Error),
    #[error(
        "a secret is sealed with key {0}, which is neither the current secrets key nor a previous one; give it with --secrets-previous-keys"
    )]
    UnknownKey(String),
    #[error("secret '{0}' does not open with its key: altered or moved")]
    Tampered(String),
    #[error("organization secret '{0}' does not exist")]
    Missing(String),
    #[error("secret '{0}' is not valid UTF-8")]
    NotText(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretInfo {
    pub name: String,
    pub created_at: String,
    pub updated_at: String,
}

/// A stored secret row.
#[derive(Debug, Clone)]
pub struct StoredSecret {
    pub org_id: String,
    pub name: String,
    pub sealed: Sealed,
    pub revision: String,
    pub updated_at: String,
}

/// Sealed organization secrets. Every method is one statement.
#[async_trait]
pub trait SecretStore: Send + Sync + 'static {
    /// Creates or replaces a secret with a new revision; answers it as listed.
    async fn put_secret(
        &self,
        org_id: &str,
        name: &str,
        sealed: &Sealed,
        revision: &str,
    ) -> Result<SecretInfo>;

    /// The org's secrets by name.
    async fn list_secrets(&self, org_id: &str) -> Result<Vec<SecretInfo>>;

    async fn secret(&self, org_id: &str, name: &str) -> Result<Option<StoredSecret>>;

    /// False when there was no such secret.
    async fn delete_secret(&self, org_id: &str, name: &str) -> Result<bool>;

    /// Every secret not sealed with key `key_id` (what a rotation reseals).
    async fn secrets_not_sealed_with(&self, key_id: &str) -> Result<Vec<StoredSecret>>;

    /// Replaces the sealed value of a secret still at `revision` (same value, new key);
    /// false when it changed meanwhile.
    async fn reseal_secret(&self, secret: &StoredSecret, sealed: &Sealed) -> Result<bool>;

    /// Makes a user an org admin (or not): who manages the org's secrets.
    async fn set_org_admin(&self, user_id: &str, org_admin: bool) -> Result<()>;
}

fn stored<D: StoreBackend>(row: &Row<D>) -> Result<StoredSecret> {
    Ok(StoredSecret {
        org_id: row.try_get("org_id")?,
        name: row.try_get("name")?,
        sealed: Sealed { key_id: row.try_get("key_id")?, bytes: row.try_get("sealed")? },
        revision: row.try_get("revision")?,
        updated_at: row.try_get("updated_at")?,
    })
}

const COLUMNS: &str = "org_id, name, key_id, sealed, revision, updated_at";

#[async_trait]
impl<D: StoreBackend> SecretStore for Store<D> {
    async fn put_secret(
        &self,
        org_id: &str,
        name: &str,
        sealed: &Sealed,
        revision: &str,
    ) -> Result<SecretInfo> {
        let at = now();
        let row = sqlx::query(
            "INSERT INTO org_secrets (org_id, name, key_id, sealed, revision, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) \
             ON CONFLICT (org_id, name) DO UPDATE SET key_id = excluded.key_id, \
             sealed = excluded.sealed, revision = excluded.revision, updated_at = excluded.updated_at \
             RETURNING name, created_at, updated_at",
        )
        .bind(org_id)
        .bind(name)
        .bind(sealed.key_id.as_str())
        .bind(sealed.bytes.as_slice())
        .bind(revision)
        .bind(at.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok(SecretInfo {
            name: row.try_get("name")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }

    async fn list_secrets(&self, org_id: &str) -> Result<Vec<SecretInfo>> {
        let rows = sqlx::query(
            "SELECT name, created_at, updated_at FROM org_secrets WHERE org_id = $1 ORDER BY name",
        )
        .bind(org_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SecretInfo {
                    name: row.try_get("name")?,
                    created_at: row.try_get("created_at")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    async fn secret(&self, org_id: &str, name: &str) -> Result<Option<StoredSecret>> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM org_secrets WHERE org_id = $1 AND name = $2"
        ))
        .bind(org_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(stored::<D>).transpose()
    }

    async fn delete_secret(&self, org_id: &str, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM org_secrets WHERE org_id = $1 AND name = $2")
            .bind(org_id)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(D::rows_affected(&done) == 1)
    }

    async fn secrets_not_sealed_with(&self, key_id: &str) -> Result<Vec<StoredSecret>> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM org_secrets WHERE key_id <> $1"))
            .bind(key_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(stored::<D>).collect()
    }

    async fn reseal_secret(&self, secret: &StoredSecret, sealed: &Sealed) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE org_secrets SET key_id = $1, sealed = $2 \
             WHERE org_id = $3 AND name = $4 AND revision = $5",
        )
        .bind(sealed.key_id.as_str())
        .bind(sealed.bytes.as_slice())
        .bind(secret.org_id.as_str())
        .bind(secret.name.as_str())
        .bind(secret.revision.as_str())
        .execute(&self.pool)
        .await?;
        Ok(D::rows_affected(&done) == 1)
    }

    async fn set_org_admin(&self, user_id: &str, org_admin: bool) -> Result<()> {
        sqlx::query("UPDATE users SET is_org_admin = $1 WHERE id = $2")
            .bind(org_admin)
            .bind(user_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Organization secrets in plain text for their users, sealed in the store.
#[derive(Clone)]
pub struct Secrets {
    store: Arc<dyn MetadataStore>,
    keyring: Keyring,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").field("key", &self.keyring.current_id()).finish_non_exhaustive()
    }
}

impl Secrets {
    pub fn new(store: Arc<dyn MetadataStore>, keyring: Keyring) -> Self {
        Self { store, keyring }
    }

    /// Creates or replaces a secret.
    ///
    /// # Errors
    /// A database failure.
    pub async fn put(
        &self,
        org_id: &str,
        name: &str,
        value: &SecretValue,
    ) -> Result<SecretInfo, SecretsError> {
        let sealed = self.keyring.seal(org_id, name, value.expose().as_bytes())?;
        let revision = sluice_core::ids::new_id();
        Ok(self.store.put_secret(org_id, name, &sealed, &revision).await?)
    }

    /// The org's secrets (names and times).
    ///
    /// # Errors
    /// A database failure.
    pub async fn list(&self, org_id: &str) -> Result<Vec<SecretInfo>, SecretsError> {
        Ok(self.store.list_secrets(org_id).await?)
    }

    /// Whether the org has a secret of this name.
    ///
    /// # Errors
    /// A database failure.
    pub async fn exists(&self, org_id: &str, name: &str) -> Result<bool, SecretsError> {
        Ok(self.store.secret(org_id, name).await?.is_some())
    }

    /// False when there was no such secret.
    ///
    /// # Errors
    /// A database failure.
    pub async fn delete(&self, org_id: &str, name: &str) -> Result<bool, SecretsError> {
        Ok(self.store.delete_secret(org_id, name).await?)
    }

    /// The values and revisions of `names` in `org_id`.
    ///
    /// # Errors
    /// [`SecretsError::Missing`] for the first name with no secret; a value that does not
    /// open; a database failure.
    pub async fn resolve(
        &self,
        org_id: &str,
        names: &[&str],
    ) -> Result<ResolvedSecrets, SecretsError> {
        let mut resolved = ResolvedSecrets::new();
        for &name in names {
            if resolved.contains_key(name) {
                continue;
            }
            let stored = self
                .store
                .secret(org_id, name)
                .await?
                .ok_or_else(|| SecretsError::Missing(name.to_owned()))?;
            let value = self.keyring.open(org_id, name, &stored.sealed)?;
            let value =
                String::from_utf8(value).map_err(|_| SecretsError::NotText(name.to_owned()))?;
            resolved.insert(
                name.to_owned(),
                ResolvedSecret { value: SecretValue::new(value), revision: stored.revision },
            );
        }
        Ok(resolved)
    }

    /// The current revision of each of `names` that exists (no value is opened).
    ///
    /// # Errors
    /// A database failure.
    pub async fn revisions(
        &self,
        org_id: &str,
        names: &[&str],
    ) -> Result<BTreeMap<String, String>, SecretsError> {
        let mut revisions = BTreeMap::new();
        for &name in names {
            if let Some(stored) = self.store.secret(org_id, name).await? {
                revisions.insert(name.to_owned(), stored.revision);
            }
        }
        Ok(revisions)
    }

    /// Reseals every secret not sealed with the current key (after a key rotation); answers
    /// how many. A secret written meanwhile is already under the current key.
    ///
    /// # Errors
    /// A value sealed with a key that is not configured; a database failure.
    pub async fn reseal(&self) -> Result<usize, SecretsError> {
        let mut resealed = 0;
        for secret in self.store.secrets_not_sealed_with(self.keyring.current_id()).await? {
            let value = self.keyring.open(&secret.org_id, &secret.name, &secret.sealed)?;
            let sealed = self.keyring.seal(&secret.org_id, &secret.name, &value)?;
            if self.store.reseal_secret(&secret, &sealed).await? {
                resealed += 1;
            }
        }
        Ok(resealed)
    }
}
