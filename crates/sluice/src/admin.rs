//! `sluice admin …`: keys and organization flags, written straight to the store, so they work
//! while a server runs (SQLite in WAL mode allows it; PostgreSQL naturally does).

use anyhow::bail;
use clap::{Subcommand, ValueEnum};

use crate::serve::open_store;
use crate::settings::{Settings, StoreArgs};

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create an API key, creating whatever of org, team and user is missing. Prints only the
    /// key on stdout.
    CreateKey {
        #[arg(long)]
        org: String,
        #[arg(long)]
        team: String,
        #[arg(long)]
        user: String,
        /// Make the user an operator (service-wide endpoints such as stream ingest).
        #[arg(long)]
        operator: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke an API key; requests with it get 401 from then on.
    RevokeKey {
        key: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Turn an organization's features on or off.
    SetOrgFlags {
        #[arg(long)]
        org: String,
        /// The pipeline service (every pipeline endpoint and the source catalog).
        #[arg(long)]
        pipelines: Option<Switch>,
        /// Script (`v8`) transforms.
        #[arg(long)]
        custom_transforms: Option<Switch>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    fn enabled(self) -> bool {
        matches!(self, Self::On)
    }
}

pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::CreateKey { org, team, user, operator, store } => {
            for (what, name) in [("org", &org), ("team", &team), ("user", &user)] {
                if name.trim().is_empty() {
                    bail!("--{what} must not be empty");
                }
            }
            let store = open_store(&Settings::resolve_store(&store)?).await?;
            let identity = store.ensure_identity(&org, &team, &user, operator).await?;
            let key = sluice_api::auth::issue_key(store.as_ref(), &identity.user.id, None)
                .await?
                .map_err(anyhow::Error::msg)?;
            tracing::info!(org, team, user, user_id = %identity.user.id, "created API key");
            println!("{key}");
        }
        AdminCommand::RevokeKey { key, store } => {
            let store = open_store(&Settings::resolve_store(&store)?).await?;
            if !store.revoke_api_key(&sluice_api::auth::hash_key(&key)).await? {
                bail!("no active API key matches");
            }
            eprintln!("revoked");
        }
        AdminCommand::SetOrgFlags { org, pipelines, custom_transforms, store } => {
            if pipelines.is_none() && custom_transforms.is_none() {
                bail!("give --pipelines on|off and/or --custom-transforms on|off");
            }
            let store = open_store(&Settings::resolve_store(&store)?).await?;
            let updated = store
                .set_org_flags(
                    &org,
                    pipelines.map(Switch::enabled),
                    custom_transforms.map(Switch::enabled),
                )
                .await?;
            let Some(updated) = updated else { bail!("no organization named '{org}'") };
            let word = |on: bool| if on { "on" } else { "off" };
            eprintln!(
                "org {}: pipelines {}, custom_transforms {}",
                updated.name,
                word(updated.flags.pipelines),
                word(updated.flags.custom_transforms)
            );
        }
    }
    Ok(())
}
