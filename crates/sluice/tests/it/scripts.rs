//! `scripts/test` and `scripts/reliability` start the same servers, with the same code, and
//! the reliability script's `kill` group runs every test of this crate that kills a server
//! (a test whose name says `kill`, and `kill_loop.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The `SLUICE_TEST_*` variables the workspace's code reads.
fn variables_read() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices("\"SLUICE_TEST_") {
            let name: String = text[at + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.len() > "SLUICE_TEST_".len() {
                names.insert(name);
            }
        }
    }
    names
}

/// Lines of a shell script without comments.
fn code_lines(script: &str) -> Vec<String> {
    script
        .lines()
        .map(|line| line.split(" #").next().unwrap_or(line).trim().to_owned())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

#[test]
fn both_scripts_start_every_server_the_tests_read_with_the_shared_code() {
    let servers = read("scripts/lib/servers.sh");
    // Knobs a developer may set, not servers.
    let knobs = ["SLUICE_TEST_DENSITY_PIPELINES"];
    let read_names = variables_read();
    assert!(read_names.contains("SLUICE_TEST_KAFKA_URL"), "{read_names:?}");
    for name in read_names.iter().filter(|name| !knobs.contains(&name.as_str())) {
        assert!(
            servers.contains(&format!("export {name}=")),
            "scripts/lib/servers.sh does not export {name}, which a test reads"
        );
    }
    for script in ["scripts/test", "scripts/reliability"] {
        let lines = code_lines(&read(script));
        assert!(
            lines.iter().any(|line| line == ". scripts/lib/servers.sh"),
            "{script} does not source scripts/lib/servers.sh"
        );
        assert!(
            lines.iter().any(|line| line.starts_with("start_test_servers")),
            "{script} does not start the servers with start_test_servers"
        );
    }
}

#[test]
fn the_reliability_script_runs_every_crash_test_of_this_crate() {
    let script = read("scripts/reliability");
    let filter = script
        .lines()
        .find_map(|line| line.strip_prefix("filter[kill]="))
        .expect("scripts/reliability has a kill group");
    let mut files = Vec::new();
    rust_files(&root().join("crates/sluice/tests/it"), &mut files);
    let mut kill_tests = Vec::new();
    for file in files {
        let module = file.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let mut after_attribute = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
                after_attribute = true;
                continue;
            }
            if after_attribute && let Some(rest) = line.split("fn ").nth(1) {
                let name: String = rest.chars().take_while(|c| *c != '(').collect();
                if module == "kill_loop" || name.contains("kill") {
                    kill_tests.push((module.clone(), name));
                }
                after_attribute = false;
            }
        }
    }
    assert!(kill_tests.len() >= 5, "{kill_tests:?}");
    for (module, name) in kill_tests {
        assert!(
            filter.contains(&format!("test(={module}::{name})"))
                || filter.contains(&format!("test(/^{module}::/)")),
            "the kill group of scripts/reliability leaves out {module}::{name}"
        );
    }
}
