//! For tests against the PostgreSQL server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`).

use std::str::FromStr as _;

use sqlx::postgres::PgConnectOptions;

/// Connection options of a new, empty schema of the PostgreSQL database named by
/// `SLUICE_TEST_POSTGRES_URL` (each caller gets its own schema, so tests never meet).
///
/// # Panics
/// Without `SLUICE_TEST_POSTGRES_URL`, or when the schema cannot be made.
#[doc(hidden)]
pub async fn fresh_postgres_schema() -> PgConnectOptions {
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
    let schema = format!("t_{}", sluice_core::ids::new_id().replace('-', ""));
    let admin = sqlx::PgPool::connect(&url).await.expect("the test database answers");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .expect("a schema is made");
    admin.close().await;
    PgConnectOptions::from_str(&url)
        .expect("SLUICE_TEST_POSTGRES_URL parses")
        .options([("search_path", &schema)])
}
