//! API keys: issuing them, and the [`Caller`] extractor that authenticates every request.
//!
//! A key is `slk_` followed by 40 hex digits (160 random bits). The store keeps only its
//! SHA-256 and its first [`PREFIX_LEN`] characters; a request's key finds candidates by
//! prefix and is accepted when its hash equals a candidate's, compared in constant time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use sluice_core::identity::Principal;
use sluice_core::permission::{Access, Permission};
use sluice_core::pipeline::Pipeline;
use sluice_store::{MetadataStore, NewApiKey, StoreError};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// The header that carries the key (matched case-insensitively, as HTTP headers are).
pub const API_KEY_HEADER: &str = "x-api-key";

/// Characters of a key stored in clear to find it.
pub const PREFIX_LEN: usize = 12;

/// Shortest key accepted, e.g. for `SLUICE_BOOTSTRAP_API_KEY`.
pub const MIN_KEY_LEN: usize = 24;

/// A new random key.
///
/// # Panics
/// When the operating system has no randomness to give, which leaves nothing safe to do.
pub fn generate_key() -> String {
    let mut secret = [0u8; 20];
    getrandom::fill(&mut secret).expect("the OS random source is available");
    format!("slk_{}", hex(&secret))
}

/// Hex SHA-256 of a key: the only form in which keys are stored.
pub fn hash_key(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

fn prefix(key: &str) -> &str {
    key.get(..PREFIX_LEN).unwrap_or(key)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// Stores `key` (or a new random key) for `user_id` and returns it.
///
/// # Errors
/// A key shorter than [`MIN_KEY_LEN`] (as `Ok(Err(..))`), or a store failure.
pub async fn issue_key(
    store: &dyn MetadataStore,
    user_id: &str,
    key: Option<String>,
) -> Result<Result<String, String>, StoreError> {
    let key = key.unwrap_or_else(generate_key);
    if key.len() < MIN_KEY_LEN || !key.is_ascii() {
        return Ok(Err(format!("API keys must be at least {MIN_KEY_LEN} ASCII characters")));
    }
    let hash = hash_key(&key);
    let id = sluice_core::ids::new_id();
    store.insert_api_key(NewApiKey { id: &id, user_id, prefix: prefix(&key), hash: &hash }).await?;
    Ok(Ok(key))
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authenticate(&parts.headers, state).await.map(Caller)
    }
}

/// The principal whose key the `X-API-Key` header carries.
///
/// # Errors
/// [`ApiError::Unauthorized`] for a missing or unknown key, or a store failure.
pub async fn authenticate(headers: &HeaderMap, state: &AppState) -> Result<Principal, ApiError> {
    let key = headers
        .get(API_KEY_HEADER)
        .ok_or(ApiError::Unauthorized("Missing API key: send it in the X-API-Key header"))?
        .to_str()
        .map_err(|_| ApiError::Unauthorized("Invalid API key"))?;
    let hash = hash_key(key);
    let candidates = match state.store.api_key_candidates(prefix(key)).await {
        Ok(candidates) => candidates,
        // The database cannot be reached: a key this node accepted a moment ago still is,
        // so calls that need nothing else from it (ingest, sink reads) go on.
        Err(error) if error.is_unavailable() => {
            return state.recent_keys.recall(&hash).ok_or(ApiError::Store(error));
        }
        Err(error) => return Err(error.into()),
    };
    let found = candidates
        .into_iter()
        .find(|candidate| bool::from(candidate.hash.as_bytes().ct_eq(hash.as_bytes())))
        .map(|candidate| candidate.principal);
    match found {
        Some(principal) => {
            state.recent_keys.remember(hash, &principal);
            Ok(principal)
        }
        None => {
            state.recent_keys.forget(&hash);
            Err(ApiError::Unauthorized("Invalid API key"))
        }
    }
}

/// How long a key that authenticated is still accepted while the database cannot be reached.
pub const RECENT_KEY_TTL: Duration = Duration::from_secs(300);

/// Keys remembered at most (a full map first drops what is older than [`RECENT_KEY_TTL`],
/// then remembers no more until then).
const RECENT_KEYS: usize = 10_000;

/// The keys (by hash) that authenticated on this node in the last [`RECENT_KEY_TTL`], with
/// their principals: what [`authenticate`] answers from while the database cannot be
/// reached. A key revoked in that window keeps working until the database is back.
#[derive(Debug, Default)]
pub struct RecentKeys {
    keys: Mutex<HashMap<String, (Principal, Instant)>>,
}

impl RecentKeys {
    fn remember(&self, hash: String, principal: &Principal) {
        let mut keys = self.keys.lock().expect("recent keys lock is never poisoned");
        if keys.len() >= RECENT_KEYS && !keys.contains_key(&hash) {
            keys.retain(|_, (_, at)| at.elapsed() < RECENT_KEY_TTL);
            if keys.len() >= RECENT_KEYS {
                return;
            }
        }
        keys.insert(hash, (principal.clone(), Instant::now()));
    }

    fn forget(&self, hash: &str) {
        self.keys.lock().expect("recent keys lock is never poisoned").remove(hash);
    }

    fn recall(&self, hash: &str) -> Option<Principal> {
        let keys = self.keys.lock().expect("recent keys lock is never poisoned");
        keys.get(hash)
            .filter(|(_, at)| at.elapsed() < RECENT_KEY_TTL)
            .map(|(principal, _)| principal.clone())
    }
}

/// Whether `headers` carry `Authorization: Bearer <token>` with exactly `token` (compared in
/// constant time).
pub fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
    else {
        return false;
    };
    bool::from(given.trim().as_bytes().ct_eq(token.as_bytes()))
}

impl Caller {
    /// 403 unless the caller's organization has the pipeline service.
    ///
    /// # Errors
    /// [`ApiError::Forbidden`].
    pub fn require_pipelines(&self) -> Result<(), ApiError> {
        if self.0.flags.pipelines {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "the pipeline service is not enabled for this organization".to_owned(),
            ))
        }
    }

    /// 403 when the pipeline has script transforms and the organization lacks
    /// `custom_transforms`.
    ///
    /// # Errors
    /// [`ApiError::Forbidden`].
    pub fn require_custom_transforms_for(
        &self,
        config: &sluice_core::pipeline::PipelineConfig,
    ) -> Result<(), ApiError> {
        self.require_custom_transforms(config.transforms.iter().any(|t| !t.is_set_filter()))
    }

    /// 403 when `has_script` and the organization lacks `custom_transforms`.
    pub fn require_custom_transforms(&self, has_script: bool) -> Result<(), ApiError> {
        if has_script && !self.0.flags.custom_transforms {
            return Err(ApiError::Forbidden(
                "v8 script transforms need the custom_transforms feature, which is not enabled for this organization"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Loads a pipeline the caller holds `needed` on: 404 when the caller cannot read it (its
    /// existence is not revealed), 403 when it can read but lacks `needed`.
    ///
    /// # Errors
    /// [`ApiError::NotFound`], [`ApiError::Forbidden`], or a store failure.
    pub async fn pipeline(
        &self,
        state: &AppState,
        id: &str,
        needed: Permission,
    ) -> Result<(Pipeline, Access), ApiError> {
        self.require_pipelines()?;
        let found = state.store.pipeline_with_access(id, &self.0).await?;
        match found {
            Some((pipeline, access)) if access.allows(needed) => Ok((pipeline, access)),
            Some((_, access)) if access.allows(Permission::Read) => {
                let word = match needed {
                    Permission::Read => "read",
                    Permission::Edit => "edit",
                    Permission::Manage => "manage",
                };
                Err(ApiError::Forbidden(format!("you need {word} permission on pipeline {id}")))
            }
            _ => Err(ApiError::NotFound(format!("Pipeline {id} not found"))),
        }
    }

    /// Takes pipeline `id`'s turn, then loads it as [`Self::pipeline`] does and refuses a
    /// query: how every route that changes a pipeline or its deployment starts. The guard
    /// keeps any other change of the pipeline (an edit's redeploy, a pause) from
    /// interleaving until it is dropped.
    ///
    /// # Errors
    /// As [`Self::pipeline`], a 422 for a query, or no runtime to take the turn from.
    pub async fn pipeline_in_turn(
        &self,
        state: &AppState,
        id: &str,
        needed: Permission,
        query: crate::params::Query,
    ) -> Result<(sluice_runtime::LifecycleGuard, Pipeline), ApiError> {
        let lifecycle = state.lifecycle(id).await?;
        let (pipeline, _) = self.pipeline(state, id, needed).await?;
        query.expect_none()?;
        Ok((lifecycle, pipeline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_random_long_and_hash_to_hex() {
        let (a, b) = (generate_key(), generate_key());
        assert_ne!(a, b);
        assert_eq!(a.len(), 44);
        assert!(a.starts_with("slk_"));
        let hash = hash_key(&a);
        assert_eq!(hash.len(), 64);
        assert_ne!(hash, hash_key(&b));
        assert_eq!(prefix(&a).len(), PREFIX_LEN);
    }

    #[test]
    fn a_key_that_authenticated_is_recalled_until_it_is_refused_or_too_old() {
        let principal = Principal {
            user_id: "u".into(),
            team_id: "t".into(),
            org_id: "o".into(),
            is_operator: false,
            is_org_admin: false,
            flags: sluice_core::identity::OrgFlags::default(),
        };
        let recent = RecentKeys::default();
        assert_eq!(recent.recall("h1"), None, "never seen");
        recent.remember("h1".into(), &principal);
        assert_eq!(recent.recall("h1"), Some(principal.clone()));
        assert_eq!(recent.recall("h2"), None);
        recent.forget("h1");
        assert_eq!(recent.recall("h1"), None, "a key the store refused is not recalled");
        // One seen longer ago than the TTL is not recalled.
        let old = Instant::now().checked_sub(RECENT_KEY_TTL + Duration::from_secs(1));
        if let Some(old) = old {
            recent.keys.lock().unwrap().insert("h3".into(), (principal.clone(), old));
            assert_eq!(recent.recall("h3"), None);
        }
    }
}
