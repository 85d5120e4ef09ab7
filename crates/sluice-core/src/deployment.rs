//! The deployment state of a pipeline (docs/contract.md §Pipeline deployment states).
//!
//! A pipeline without a stored deployment is *not deployed*. [`DeploymentRecord`] is what
//! the runtime persists so that a restarted server runs deployed pipelines again and leaves
//! paused ones paused.

use chrono::{DateTime, Utc};

use crate::pipeline::Pipeline;

/// Whether a deployment's workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentState {
    /// Workers run and process records.
    Deployed,
    /// Workers are stopped; offsets, sinks and topics are kept.
    Paused,
}

impl DeploymentState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Deployed => "deployed",
            Self::Paused => "paused",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "deployed" => Some(Self::Deployed),
            "paused" => Some(Self::Paused),
            _ => None,
        }
    }
}

/// A pipeline's deployment as the runtime persists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentRecord {
    pub pipeline_id: String,
    pub state: DeploymentState,
    /// The configuration the workers run: a snapshot taken at the last deploy (an update to
    /// the stored pipeline takes effect only at the next deploy).
    pub pipeline: Pipeline,
    /// When the pipeline was first deployed since it was last not deployed.
    pub deployed_at: DateTime<Utc>,
    /// When the state or the snapshot last changed.
    pub updated_at: DateTime<Utc>,
}
