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

/// A Redis server of a test's own (`redis-server` from `PATH`, which `scripts/test` makes
/// sure of) on a free loopback port, without persistence: for tests that stop it. Killed when
/// dropped.
#[doc(hidden)]
#[derive(Debug)]
pub struct PrivateRedis {
    pub url: String,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    /// Starts the server and waits (up to 5 s) until it takes connections.
    ///
    /// # Panics
    /// When `redis-server` cannot be run or does not listen.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no"])
            .current_dir(std::env::temp_dir())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        // Owned from here on: dropped (killed and waited for) on every path.
        let server = Self { url: format!("redis://127.0.0.1:{port}"), child: Some(child) };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("redis-server did not listen on port {port} within 5 s");
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}
