//! Running `sluice` as a child process.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn sluice() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    // Only what a test sets reaches the child.
    for (name, _) in std::env::vars() {
        if name.starts_with("SLUICE_") {
            command.env_remove(name);
        }
    }
    command.env("SLUICE_LOG", "info,sqlx=warn");
    command
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// How long a server may take to answer `/readyz` after its start.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running server; killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    /// Lines the server printed on stdout.
    pub stdout: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `command` (a `sluice serve …`) listening on `port` and waits until it is ready.
    pub fn start(command: Command, port: u16) -> Self {
        Self::spawn(command, port, Stdio::inherit(), READY_WITHIN)
    }

    /// As [`Server::start`], waiting up to `ready_within` (a restart that resumes hundreds of
    /// deployed pipelines on a loaded broker).
    pub fn start_within(command: Command, port: u16, ready_within: Duration) -> Self {
        Self::spawn(command, port, Stdio::inherit(), ready_within)
    }

    /// As [`Server::start`], and also returns the lines the server logs on stderr.
    pub fn start_logged(command: Command, port: u16) -> (Self, mpsc::Receiver<String>) {
        let mut server = Self::spawn(command, port, Stdio::piped(), READY_WITHIN);
        let stderr = server.child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Split on `\n` only, so a lone `\r` stays visible inside its line.
            for line in BufReader::new(stderr).split(b'\n').map_while(Result::ok) {
                if tx.send(String::from_utf8_lossy(&line).into_owned()).is_err() {
                    break;
                }
            }
        });
        (server, rx)
    }

    fn spawn(mut command: Command, port: u16, stderr: Stdio, ready_within: Duration) -> Self {
        let mut child = command.stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let server = Self { child, base: format!("http://127.0.0.1:{port}"), stdout: rx };
        server.wait_ready(ready_within);
        server
    }

    fn wait_ready(&self, ready_within: Duration) {
        let deadline = Instant::now() + ready_within;
        loop {
            if let Ok(true) = is_ready(&format!("{}/readyz", self.base)) {
                return;
            }
            assert!(Instant::now() < deadline, "server at {} did not become ready", self.base);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every stdout line printed so far. The server prints the first operator's key just
    /// before it serves, so the reading thread may still hold it when `/readyz` answers: lines
    /// are taken until none came for 200 ms.
    pub fn printed(&self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(line) = self.stdout.recv_timeout(Duration::from_millis(200)) {
            lines.push(line);
        }
        lines
    }

    /// Sends SIGTERM and waits for the exit; true when it exited successfully.
    pub fn terminate(mut self) -> bool {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(Instant::now() < deadline, "server did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs an admin command to completion.
pub fn admin(args: &[&str], store_args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = sluice();
    command.arg("admin").args(args).args(store_args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

pub fn data_dir_args(dir: &Path) -> Vec<String> {
    vec!["--data-dir".to_owned(), dir.display().to_string()]
}

/// Whether `GET url` answers 200, over a raw TCP connection so that waiting needs no runtime.
fn is_ready(url: &str) -> std::io::Result<bool> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').expect("URL with a path");
    let mut stream = std::net::TcpStream::connect(host)?;
    write!(stream, "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response.starts_with("HTTP/1.1 200"))
}

/// A fresh database named `<name>_<pid>` on the PostgreSQL `scripts/test` starts
/// (`SLUICE_TEST_POSTGRES_URL`; the test fails without it); answers its URL.
pub async fn fresh_postgres_database(name: &str) -> String {
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
    let database = format!("{name}_{}", std::process::id());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {database}")).execute(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {database}")).execute(&admin).await.unwrap();
    admin.close().await;
    let (prefix, _) = url.rsplit_once('/').unwrap();
    format!("{prefix}/{database}")
}
