//! `sluice serve`: open the store, bootstrap the first operator, serve HTTP until SIGTERM or
//! SIGINT, then finish in-flight requests and stop.

use std::sync::Arc;

use anyhow::Context;
use sluice_api::{AppState, Limits};
use sluice_core::catalog::Catalog;
use sluice_core::clock::SystemClock;
use sluice_store::MetadataStore;

use crate::settings::{ServeArgs, Settings};

/// Names of the identity created on first start.
const BOOTSTRAP_ORG: &str = "sluice";
const BOOTSTRAP_TEAM: &str = "operators";
const BOOTSTRAP_USER: &str = "admin";

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let catalog = match &settings.catalog_file {
        None => Catalog::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading catalog file {}", path.display()))?;
            Catalog::from_file_text(&text)
                .with_context(|| format!("catalog file {}", path.display()))?
        }
    };
    let store = open_store(&settings).await?;
    bootstrap(store.as_ref()).await?;

    let state = AppState::new(
        store,
        catalog,
        Arc::new(SystemClock),
        Limits { max_body_bytes: settings.max_body_bytes },
    );
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    tracing::info!(address = %listener.local_addr()?, database = %redact(&settings.database_url), "sluice is serving");
    let service =
        axum::ServiceExt::<axum::extract::Request>::into_make_service(sluice_api::app(state));
    axum::serve(listener, service).with_graceful_shutdown(shutdown_signal()).await?;
    tracing::info!("sluice stopped");
    Ok(())
}

/// Opens the store the settings name, creating the data directory for the SQLite default.
///
/// # Errors
/// When the directory or the database cannot be opened.
pub async fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn MetadataStore>> {
    if settings.database_url.starts_with("sqlite:") {
        settings.prepare_data_dir()?;
    }
    sluice_store::open(&settings.database_url)
        .await
        .with_context(|| format!("opening the store at {}", redact(&settings.database_url)))
}

/// On first start with an empty store: create the operator and print its key, once.
async fn bootstrap(store: &dyn MetadataStore) -> anyhow::Result<()> {
    if store.has_users().await? {
        return Ok(());
    }
    let identity =
        store.ensure_identity(BOOTSTRAP_ORG, BOOTSTRAP_TEAM, BOOTSTRAP_USER, true).await?;
    let given = std::env::var("SLUICE_BOOTSTRAP_API_KEY").ok().filter(|key| !key.is_empty());
    let from_env = given.is_some();
    let key = sluice_api::auth::issue_key(store, &identity.user.id, given)
        .await?
        .map_err(|reason| anyhow::anyhow!("SLUICE_BOOTSTRAP_API_KEY: {reason}"))?;
    if from_env {
        tracing::info!(
            org = BOOTSTRAP_ORG,
            user = BOOTSTRAP_USER,
            "created the operator with the key from SLUICE_BOOTSTRAP_API_KEY"
        );
    } else {
        println!(
            "\nCreated operator {BOOTSTRAP_USER} (org {BOOTSTRAP_ORG}, team {BOOTSTRAP_TEAM}). \
             Its API key is shown only this once:\n\n    {key}\n\n\
             Use it as the X-API-Key header. More keys: sluice admin create-key --help\n"
        );
    }
    Ok(())
}

/// Hides a password in a database URL before it is logged.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted_from_database_urls() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://./sluice-data/sluice.db"), "sqlite://./sluice-data/sluice.db");
    }
}
