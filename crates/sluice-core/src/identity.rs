//! Who is calling: organizations, teams, users and the principal an API key resolves to.

use serde::Serialize;

/// Feature flags of an organization. New organizations have both enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OrgFlags {
    /// The pipeline service (every `{base_url}` pipeline endpoint and `/sources`).
    pub pipelines: bool,
    /// Creating or updating pipelines with `v8` script transforms.
    pub custom_transforms: bool,
}

impl Default for OrgFlags {
    fn default() -> Self {
        Self { pipelines: true, custom_transforms: true }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Org {
    pub id: String,
    pub name: String,
    pub flags: OrgFlags,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Team {
    pub id: String,
    pub org_id: String,
    pub name: String,
}

/// A user: one membership of one team in one organization. Its id is what a pipeline
/// record calls `owner_org_team_user_id` (docs/contract.md §Pipeline record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    pub id: String,
    pub org_id: String,
    pub team_id: String,
    pub name: String,
    /// Operators may use service-wide endpoints (stream ingest); it grants nothing on
    /// other users' pipelines.
    pub is_operator: bool,
}

/// The caller behind an API key, with what the API needs to authorize a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: String,
    pub team_id: String,
    pub org_id: String,
    pub is_operator: bool,
    /// Org admins manage the organization's secrets.
    pub is_org_admin: bool,
    pub flags: OrgFlags,
}
