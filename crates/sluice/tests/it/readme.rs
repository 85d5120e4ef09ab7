//! The README's walkthrough as a newcomer runs it: command by command, copying nothing but
//! the key the first start prints.

use std::collections::BTreeSet;

fn readme() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(path).unwrap()
}

/// The `sh` blocks of the walkthrough, in order, as lines.
fn walkthrough_lines() -> Vec<String> {
    let readme = readme();
    let start = readme.find("## Walkthrough").expect("a Walkthrough section");
    let end = start + readme[start..].find("\n## ").expect("a section after it");
    let mut lines = Vec::new();
    let mut in_sh = false;
    for line in readme[start..end].lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" if in_sh => in_sh = false,
            _ if in_sh => lines.push(line.to_owned()),
            _ => {}
        }
    }
    assert!(!lines.is_empty());
    lines
}

/// The names a line assigns (`NAME=…`, `export NAME=…`) with their values.
fn assignment(line: &str) -> Option<(String, String)> {
    let line = line.trim_start().strip_prefix("export ").unwrap_or(line.trim_start());
    let (name, value) = line.split_once('=')?;
    let valid = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    valid.then(|| (name.to_owned(), value.to_owned()))
}

/// The `$NAME` variables a line reads.
fn reads(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let rest_name = rest.strip_prefix('{').unwrap_or(rest);
        let name: String = rest_name
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

#[test]
fn the_walkthrough_captures_every_id_it_uses_and_only_the_key_is_copied_by_hand() {
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut by_hand = Vec::new();
    for line in walkthrough_lines() {
        for name in reads(&line) {
            assert!(known.contains(&name), "${name} is used before it is set: {line}");
        }
        if let Some((name, value)) = assignment(&line) {
            // A placeholder ("…") is something the reader must copy from an answer.
            if value.trim_start().starts_with("slk_")
                || (value.contains('…') && !value.contains("$("))
            {
                by_hand.push(name.clone());
            }
            known.insert(name);
        }
    }
    assert_eq!(by_hand, vec!["KEY".to_owned()], "only the printed key is copied by hand");
}

/// The JSON body (`-d '{…}'`) of the walkthrough command that starts with `command`.
fn body_of(command: &str) -> serde_json::Value {
    let lines = walkthrough_lines();
    let text = lines.join("\n");
    let start = text.find(command).unwrap_or_else(|| panic!("no {command:?} in the walkthrough"));
    let body = &text[start..];
    let body = &body[body.find("-d '").expect("a -d body") + 4..];
    let body = &body[..body.find("}'").expect("the end of the body") + 1];
    // The shell splices variables in with '"$NAME"'.
    let body = body.replace("'\"$SINK\"'", "sk-000000000000");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("{error}: {body}"))
}

#[test]
fn the_put_example_keeps_every_transform_the_create_example_made() {
    let created = body_of("curl -s -X POST \"$BEAM\" -H");
    let replaced = body_of("curl -s -X PUT \"$BEAM/$ID\"");
    let transforms = |body: &serde_json::Value| -> Vec<(String, String)> {
        body["pipeline_config"]["transforms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let what = t.get("script").or(t.get("filter_expr")).unwrap();
                (t["type"].as_str().unwrap().to_owned(), what.as_str().unwrap().to_owned())
            })
            .collect()
    };
    assert_eq!(transforms(&replaced), transforms(&created));
}
