//! Random JSON documents with known literal text, rendered with random whitespace and
//! escapes, and the paths into them.

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_core::filter_expr::PathSegment;

/// A JSON document as generated: numbers keep their literal text, object keys are distinct.
#[derive(Debug, Clone)]
pub enum Doc {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Doc>),
    Obj(Vec<(String, Doc)>),
}

/// A JSON number literal of every shape the grammar allows (kept within `f64` range, which
/// `serde_json` insists on).
pub fn number() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop_oneof!["0", "[1-9][0-9]{0,15}"],
        proptest::option::of("[0-9]{1,6}"),
        proptest::option::of("[eE][+-]?[0-9]{1,2}"),
    )
        .prop_map(|(negative, int, frac, exp)| {
            let mut text = if negative { "-".to_owned() } else { String::new() };
            text.push_str(&int);
            if let Some(frac) = frac {
                text.push('.');
                text.push_str(&frac);
            }
            text.push_str(&exp.unwrap_or_default());
            text
        })
}

/// String contents: unicode, quotes, backslashes, control characters, addresses.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,8}",
        "[\"\\\\/\\x00-\\x1f a-zA-Z\u{e9}\u{1f600}]{0,8}",
        "0x[0-9a-fA-F]{40}",
        // Longer than a batch probe keeps.
        "[a-zA-Z0-9]{65,80}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c]{1,2}", Just("token_address".to_owned()), "\\PC{0,4}"]
}

pub fn doc() -> impl Strategy<Value = Doc> {
    docs(false)
}

/// Like [`doc`], but an object may repeat a key (rendered with or without escapes, so the
/// copies may be spelled differently).
pub fn doc_with_repeats() -> impl Strategy<Value = Doc> {
    docs(true)
}

fn docs(repeats: bool) -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        Just(Doc::Null),
        any::<bool>().prop_map(Doc::Bool),
        number().prop_map(Doc::Num),
        text().prop_map(Doc::Str),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Doc::Arr),
            (proptest::collection::vec((key(), inner), 0..6), any::<bool>()).prop_map(
                move |(mut fields, keep_repeats)| {
                    if !(repeats && keep_repeats) {
                        let mut seen = std::collections::HashSet::new();
                        fields.retain(|(key, _)| seen.insert(key.clone()));
                    }
                    Doc::Obj(fields)
                }
            ),
        ]
    })
}

/// Every path in `doc` (the root's too), and for every container one path just past it: a
/// missing key or the index one past the end.
pub fn paths(doc: &Doc) -> Vec<Vec<PathSegment>> {
    fn walk(doc: &Doc, prefix: &mut Vec<PathSegment>, out: &mut Vec<Vec<PathSegment>>) {
        out.push(prefix.clone());
        match doc {
            Doc::Arr(items) => {
                for (index, item) in items.iter().enumerate() {
                    prefix.push(PathSegment::Index(index));
                    walk(item, prefix, out);
                    prefix.pop();
                }
                out.push([prefix.as_slice(), &[PathSegment::Index(items.len())]].concat());
            }
            Doc::Obj(fields) => {
                for (key, value) in fields {
                    prefix.push(PathSegment::Field(key.clone()));
                    walk(value, prefix, out);
                    prefix.pop();
                }
                out.push([prefix.as_slice(), &[PathSegment::Field("missing".into())]].concat());
            }
            _ => out.push([prefix.as_slice(), &[PathSegment::Index(0)]].concat()),
        }
    }
    let mut out = Vec::new();
    walk(doc, &mut Vec::new(), &mut out);
    out
}

/// Whether an object anywhere in `doc` holds a key twice.
pub fn has_repeats(doc: &Doc) -> bool {
    match doc {
        Doc::Arr(items) => items.iter().any(has_repeats),
        Doc::Obj(fields) => {
            let mut seen = std::collections::HashSet::new();
            fields.iter().any(|(key, value)| !seen.insert(key) || has_repeats(value))
        }
        _ => false,
    }
}

/// The node at `path`, if any (the first copy of a repeated key).
pub fn at<'d>(doc: &'d Doc, path: &[PathSegment]) -> Option<&'d Doc> {
    path.iter().try_fold(doc, |node, segment| match (node, segment) {
        (Doc::Arr(items), PathSegment::Index(index)) => items.get(*index),
        (Doc::Obj(fields), PathSegment::Field(name)) => {
            fields.iter().find(|(key, _)| key == name).map(|(_, value)| value)
        }
        _ => None,
    })
}

/// Renders `doc` as JSON, choosing whitespace and escapes with a generator seeded by `seed`.
pub fn render(doc: &Doc, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = String::new();
    ws(&mut rng, &mut out);
    render_into(doc, &mut rng, &mut out);
    ws(&mut rng, &mut out);
    out.into_bytes()
}

fn render_into(doc: &Doc, rng: &mut SmallRng, out: &mut String) {
    match doc {
        Doc::Null => out.push_str("null"),
        Doc::Bool(value) => out.push_str(if *value { "true" } else { "false" }),
        Doc::Num(literal) => out.push_str(literal),
        Doc::Str(text) => render_str(text, rng, out),
        Doc::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                render_into(item, rng, out);
                ws(rng, out);
            }
            ws(rng, out);
            out.push(']');
        }
        Doc::Obj(fields) => {
            out.push('{');
            for (i, (key, value)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                render_str(key, rng, out);
                ws(rng, out);
                out.push(':');
                ws(rng, out);
                render_into(value, rng, out);
                ws(rng, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
}

fn ws(rng: &mut SmallRng, out: &mut String) {
    if rng.gen_bool(0.3) {
        for _ in 0..rng.gen_range(1..4) {
            out.push([' ', '\n', '\t', '\r'][rng.gen_range(0..4)]);
        }
    }
}

fn render_str(text: &str, rng: &mut SmallRng, out: &mut String) {
    out.push('"');
    for ch in text.chars() {
        let short = match ch {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        let must_escape = ch == '"' || ch == '\\' || ch < ' ';
        if must_escape || rng.gen_bool(0.15) {
            match short {
                Some(escape) if rng.gen_bool(0.5) => out.push_str(escape),
                _ => {
                    let mut units = [0; 2];
                    for unit in ch.encode_utf16(&mut units) {
                        let escape = format!("\\u{unit:04x}");
                        if rng.gen_bool(0.5) {
                            out.push_str(&escape.to_uppercase().replace("\\U", "\\u"));
                        } else {
                            out.push_str(&escape);
                        }
                    }
                }
            }
        } else {
            out.push(ch);
        }
    }
    out.push('"');
}
