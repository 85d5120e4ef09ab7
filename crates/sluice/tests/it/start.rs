//! A first `sluice serve` that fails: it says what was tried, in one line and within
//! seconds, creates nothing, and so leaves the corrected start a first start that prints the
//! operator's key. A start after the key was made says how to make another.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{Server, free_port, sluice};

/// How long a failed start may take to say why: the bound for an error line.
const ERROR_WITHIN: Duration = Duration::from_secs(5);

/// `sluice serve` on a fresh data dir under `dir` with `args`, expected to fail: answers its
/// one stderr line after checking that it printed no key, created nothing and ended within
/// [`ERROR_WITHIN`].
fn failed_start(dir: &Path, args: &[&str]) -> String {
    let data = dir.join("data");
    let mut command = sluice();
    command.arg("serve").arg("--data-dir").arg(&data);
    if !args.contains(&"--listen") {
        command.args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    }
    command.args(args);
    let started = Instant::now();
    let output = command.output().unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} started: {stderr}");
    assert!(!stdout.contains("slk_"), "{args:?} printed a key: {stdout}");
    assert!(!data.exists(), "{args:?} created the data dir before failing: {stderr}");
    assert!(took < ERROR_WITHIN, "{args:?} took {took:?} to fail: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?} wrote more than the error line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}

fn serve_command(data: &Path, port: u16) -> Command {
    let mut command = sluice();
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    command
}

fn printed_key(server: &Server) -> Option<String> {
    server
        .printed()
        .iter()
        .find_map(|line| line.trim().strip_prefix("slk_").map(|k| format!("slk_{k}")))
}

#[test]
fn a_busy_listen_address_fails_before_anything_is_made_and_the_corrected_start_prints_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let line = failed_start(dir.path(), &["--listen", &format!("127.0.0.1:{port}")]);
    assert_eq!(
        line,
        format!("error: cannot listen on 127.0.0.1:{port} (listen): the address is in use")
    );
    let metrics = format!("127.0.0.1:{port}");
    let line = failed_start(dir.path(), &["--metrics-listen", &metrics]);
    assert!(line.contains(&format!("cannot listen on {metrics} (metrics_listen)")), "{line}");
    drop(busy);

    let port = free_port();
    let server = Server::start(serve_command(&dir.path().join("data"), port), port);
    assert!(printed_key(&server).is_some(), "the corrected first start prints the key");
}

#[test]
fn a_postgres_that_is_down_is_one_line_naming_the_url_within_five_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port(); // nothing listens there
    let url = format!("postgres://sluice:hunter2@127.0.0.1:{port}/sluice");
    let line = failed_start(dir.path(), &["--database-url", &url]);
    assert_eq!(
        line,
        format!(
            "error: cannot connect to postgres://sluice:***@127.0.0.1:{port}/sluice: connection refused"
        )
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_that_refuses_the_login_is_one_line_with_its_reason() {
    // The PostgreSQL scripts/test starts, asked for a database it does not have.
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
    let (server, _) = url.rsplit_once('/').unwrap();
    let missing = format!("{server}/no_such_database_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let line = failed_start(dir.path(), &["--database-url", &missing]);
    assert!(line.starts_with(&format!("error: cannot connect to {missing}: ")), "{line}");
    assert!(line.contains("does not exist"), "{line}");
}

#[test]
fn a_kafka_bus_that_refuses_is_one_line_without_librdkafkas_retries() {
    let dir = tempfile::tempdir().unwrap();
    let line = failed_start(dir.path(), &["--bus", "kafka://127.0.0.1:1"]);
    assert_eq!(
        line,
        "error: cannot reach the stream log at kafka://127.0.0.1:1: connection refused"
    );
}

#[test]
fn a_bus_address_that_is_not_kafka_keeps_librdkafka_out_of_the_default_log() {
    // Something listens, but it is no broker: it closes every connection at once. librdkafka
    // retries for the whole metadata timeout, logging each failure, until the start gives up.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let output = sluice()
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--bus", &format!("kafka://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(!String::from_utf8_lossy(&output.stdout).contains("slk_"));
    assert!(!dir.path().join("data").join("sluice.db").exists(), "no store before the bus answers");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warnings: Vec<&str> =
        stderr.lines().filter(|line| line.contains(" WARN ") || line.contains(" ERROR ")).collect();
    assert!(warnings.is_empty(), "librdkafka's lines reached the default log: {stderr}");
    let error = stderr.lines().last().unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "error: cannot reach the stream log at kafka://127.0.0.1:{port}: "
        )),
        "{stderr}"
    );
    assert!(error.contains("librdkafka: "), "the error carries librdkafka's last word: {stderr}");
}

#[test]
fn an_unreachable_set_store_or_chain_node_is_one_line_with_keys_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let line = failed_start(dir.path(), &["--sets", &format!("redis://:hunter2@127.0.0.1:{port}")]);
    assert_eq!(
        line,
        format!("error: cannot connect to redis://:***@127.0.0.1:{port}: connection refused")
    );

    let key = "0123456789abcdef0123456789abcdef";
    let node = format!("http://127.0.0.1:{port}/v2/{key}");
    let line = failed_start(dir.path(), &["--chain", &format!("base={node}")]);
    assert_eq!(
        line,
        format!(
            "error: chain base: cannot connect to http://127.0.0.1:{port}/v2/***: connection refused"
        )
    );
}

#[test]
fn mistyped_urls_are_shown_as_given_with_key_looking_parts_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let line = failed_start(dir.path(), &["--chain", "base=not-a-url"]);
    assert!(line.contains("rpc_url not-a-url must be http:// or https://"), "{line}");

    let key = "0123456789abcdef0123456789abcdef";
    let line = failed_start(dir.path(), &["--chain", &format!("base=node.example/v2/{key}")]);
    assert!(line.contains("rpc_url node.example/v2/*** must be"), "{line}");
    assert!(!line.contains(key), "{line}");

    let line = failed_start(dir.path(), &["--sets", "redis:/u:hunter2@127.0.0.1:6379"]);
    assert!(line.contains("sets 'redis:/u:***@127.0.0.1:6379' must be a redis:// URL"), "{line}");

    let line = failed_start(dir.path(), &["--warehouse-url", "not-a-url"]);
    assert!(line.contains("warehouse_url 'not-a-url' must be s3://bucket[/prefix]"), "{line}");

    let line = failed_start(dir.path(), &["--database-url", "mysql://u:hunter2@h/db"]);
    assert!(line.contains("unsupported URL 'mysql://u:***@h/db'"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_after_the_key_was_made_says_how_to_make_another() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let mut server = Server::start(serve_command(&data, port), port);
    assert!(printed_key(&server).is_some());
    // Killed before anyone copied the key.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);

    let (server, log) = Server::start_logged(serve_command(&data, port), port);
    assert_eq!(printed_key(&server), None, "a second start prints no key");
    let deadline = Instant::now() + Duration::from_secs(10);
    let hint = loop {
        let line = log.recv_timeout(Duration::from_secs(10)).expect("the server logs");
        if let Some(at) = line.find("sluice admin create-key") {
            break line[at..].trim_end_matches('"').to_owned();
        }
        assert!(Instant::now() < deadline, "no hint on how to make a key");
    };
    assert_eq!(
        hint,
        format!(
            "sluice admin create-key --org sluice --team operators --user admin --operator \
             --data-dir {}",
            data.display()
        )
    );
    // The hint, run as given, makes a key the running server takes.
    let words: Vec<&str> = hint.split(' ').skip(1).collect();
    let output = sluice().args(&words).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let key = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let client = reqwest::Client::new();
    let me = client
        .get(format!("{}/api/v1/me", server.base))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(me.status().as_u16(), 200);
}

/// A loopback proxy to `upstream` that passes its first connection (the preflight's), then
/// cuts every connection that comes in the next `outage` (a database restarting just after
/// the preflight), then passes again; answers its port and how many it cut.
fn proxy_cutting_after_the_first(
    upstream: std::net::SocketAddr,
    outage: Duration,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = cut.clone();
    std::thread::spawn(move || {
        let mut outage_ends = None;
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { continue };
            if n > 0 {
                let ends = *outage_ends.get_or_insert_with(|| Instant::now() + outage);
                if Instant::now() < ends {
                    counted.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
            }
            let Ok(server) = std::net::TcpStream::connect(upstream) else { continue };
            let (client_read, server_read) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pipe(client_read, server));
            std::thread::spawn(move || pipe(server_read, client));
        }
    });
    (port, cut)
}

fn pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_cuts_connections_just_after_the_preflight_is_waited_out() {
    let url = crate::process::fresh_postgres_database("start_outage").await;
    let parsed = url::Url::parse(&url).unwrap();
    let upstream = format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap_or(5432));
    let (proxy, cut) = proxy_cutting_after_the_first(
        upstream.parse().expect("the test database is on an IP address"),
        Duration::from_secs(3),
    );
    let mut through_proxy = parsed.clone();
    through_proxy.set_host(Some("127.0.0.1")).unwrap();
    through_proxy.set_port(Some(proxy)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = serve_command(&dir.path().join("data"), port);
    command.args(["--database-url", through_proxy.as_str()]);
    // Without waiting out the outage the start ends at its first step on the database.
    let (server, log) = Server::start_logged(command, port);
    assert!(cut.load(std::sync::atomic::Ordering::SeqCst) > 0, "the proxy cut nothing");
    assert!(printed_key(&server).is_some(), "the start went on to the first operator's key");
    let retried: Vec<String> =
        log.try_iter().filter(|line| line.contains("a step of the start failed")).collect();
    assert!(!retried.is_empty(), "the waits are not in the log");
    assert!(retried[0].contains("opening the store at postgres://"), "{}", retried[0]);
}
