//! `sluice admin …`: keys and organization flags, written straight to the store, so they work
//! while a server runs (SQLite in WAL mode allows it; PostgreSQL naturally does).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use sluice_store::MetadataStore;

use crate::serve::redact;
use crate::settings::{Settings, StoreArgs};

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create an API key, creating whatever of org, team and user is missing. Prints only the
    /// key on stdout.
    CreateKey {
        /// The user's organization, by name (created when missing, with every feature on).
        #[arg(long)]
        org: String,
        /// The user's team in that organization, by name (created when missing).
        #[arg(long)]
        team: String,
        /// The user, by name within the team (created when missing; the same name in another
        /// team is another user).
        #[arg(long)]
        user: String,
        /// Make the user an operator (service-wide endpoints such as stream ingest).
        #[arg(long)]
        operator: bool,
        /// Make the user an admin of the organization (manages its secrets).
        #[arg(long)]
        org_admin: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke an API key; requests with it get 401 from then on.
    RevokeKey {
        /// The key to revoke (`slk_…`).
        key: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Turn an organization's features on or off.
    SetOrgFlags {
        /// The organization, by name.
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
        AdminCommand::CreateKey { org, team, user, operator, org_admin, store } => {
            for (what, name) in [("org", &org), ("team", &team), ("user", &user)] {
                if name.trim().is_empty() {
                    bail!("--{what} must not be empty");
                }
            }
            let store = open_existing_store(&store).await?;
            let identity = store.ensure_identity(&org, &team, &user, operator).await?;
            if org_admin {
                store.set_org_admin(&identity.user.id, true).await?;
            }
            let key = sluice_api::auth::issue_key(store.as_ref(), &identity.user.id, None)
                .await?
                .map_err(anyhow::Error::msg)?;
            tracing::info!(org, team, user, user_id = %identity.user.id, "created API key");
            println!("{key}");
        }
        AdminCommand::RevokeKey { key, store } => {
            let store = open_existing_store(&store).await?;
            if !store.revoke_api_key(&sluice_api::auth::hash_key(&key)).await? {
                bail!("no active API key matches");
            }
            eprintln!("revoked");
        }
        AdminCommand::SetOrgFlags { org, pipelines, custom_transforms, store } => {
            if pipelines.is_none() && custom_transforms.is_none() {
                bail!("give --pipelines on|off and/or --custom-transforms on|off");
            }
            let store = open_existing_store(&store).await?;
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

/// Where the admin commands look when told nothing else.
const HINT: &str = "admin commands never create a store: give the server's --data-dir or \
    --database-url (or SLUICE_DATA_DIR, SLUICE_DATABASE_URL, or --config with the server's file)";

/// Opens the store a server already created, and says on stderr which one it is. Never
/// creates one: a missing SQLite file, or a store without users (no server has started on
/// it), is an error naming the store looked at.
///
/// # Errors
/// As above, or when the store cannot be opened.
async fn open_existing_store(args: &StoreArgs) -> anyhow::Result<Arc<dyn MetadataStore>> {
    let settings = Settings::resolve_store(args)?;
    let shown = redact(&settings.database_url);
    if let Some(path) = sqlite_path(&settings.database_url)
        && !path.is_file()
    {
        bail!("no Sluice store at {shown} ({} does not exist); {HINT}", path.display());
    }
    let store = sluice_store::open(&settings.database_url)
        .await
        .with_context(|| format!("opening the store at {shown}"))?;
    if !store.has_users().await? {
        bail!("the store at {shown} has no users: no server has started on it; {HINT}");
    }
    eprintln!("using the store at {shown}");
    Ok(store)
}

/// The file of a `sqlite:` URL; `None` for other databases. An in-memory database has a
/// file name that never exists, so it is refused too.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or(rest);
    Some(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::sqlite_path;
    use std::path::PathBuf;

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(sqlite_path("sqlite://./d/sluice.db"), Some(PathBuf::from("./d/sluice.db")));
        assert_eq!(sqlite_path("sqlite:///abs/s.db?mode=rwc"), Some(PathBuf::from("/abs/s.db")));
        assert_eq!(sqlite_path("sqlite:rel.db"), Some(PathBuf::from("rel.db")));
        assert_eq!(sqlite_path("postgres://u@h/db"), None);
    }
}
