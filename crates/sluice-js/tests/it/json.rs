//! Output records are serialized natively for plain data and by `JSON.stringify` otherwise;
//! either way the bytes are exactly what `JSON.stringify` writes.

use super::{load, text};

/// Runs a script that fans out `[{v: X}, {t: JSON.stringify({v: X})}]` for each expression X
/// and checks that the engine's bytes for the first equal the second.
fn assert_same_as_json_stringify(setup: &str, expressions: &[&str]) {
    for expression in expressions {
        let script = format!(
            "{setup}\nfunction transform(r) {{ const v = ({expression}); return [{{ v }}, {{ t: JSON.stringify({{ v }}) }}]; }}"
        );
        let mut engine = load(&script);
        let out = engine.run(b"{}").unwrap_or_else(|e| panic!("{expression}: {e}"));
        let out = text(&out);
        let reference: serde_json::Value = serde_json::from_str(&out[1]).expect("JSON");
        assert_eq!(out[0], reference["t"].as_str().expect("a string"), "{expression}");
    }
}

#[test]
fn plain_data_matches_json_stringify() {
    assert_same_as_json_stringify(
        "",
        &[
            "null",
            "true",
            "[false, null, 0, -0, 1, -1, 2147483647, 2147483648, -2147483649]",
            "[0.1, 0.1 + 0.2, 1e21, 1e20, 1.5e-7, 1e-6, 123456789.125, -5e-324, 1.7976931348623157e308]",
            "[NaN, Infinity, -Infinity]",
            "'quote \" backslash \\\\ newline \\n tab \\t cr \\r bs \\b ff \\f nul \\u0000 us \\u001f del \\u007f'",
            "'héllo ✓ 😀 \\u2028 \\u2029 \\ufeff'",
            "{ b: 1, 2: 'two', a: [1, { c: {} }], 1: 'one', '': 'empty', 'é': 'accent' }",
            "[1, , 3, undefined, () => 1, Symbol('s')]",
            "{ u: undefined, f() {}, s: Symbol('x'), k: 1 }",
            "Object.assign(Object.create(null), { x: 1, y: [2] })",
            "(() => { const a = [1, 2]; a.extra = 'ignored'; return a; })()",
            "(() => { const o = { a: 1, b: 2, c: 3 }; delete o.b; o.d = 4; return o; })()",
            "{ get g() { return 'got'; }, plain: 1 }",
            "JSON.parse('{\"z\":1,\"a\":{\"y\":[1,2,{\"x\":null}]},\"m\":\"\\\\u00e9\"}')",
            "Array.from({ length: 50 }, (_, i) => ({ i, s: String(i).repeat(i % 5) }))",
        ],
    );
}

#[test]
fn everything_else_goes_through_json_stringify() {
    assert_same_as_json_stringify(
        "class Point { constructor(x) { this.x = x; } }",
        &[
            "new Date(0)",
            "{ when: new Date(86400000) }",
            "new Point(3)",
            "{ toJSON() { return 'custom'; }, a: 1 }",
            "[{ toJSON() { return 5; } }]",
            "new Number(3)",
            "new String('boxed')",
            "new Map([[1, 2]])",
            "new Uint8Array([1, 2])",
            "new Error('e')",
            "new Proxy({ a: 1 }, {})",
            "'lone \\ud800 surrogate'",
            "{ s: 'end \\udfff' }",
            "(() => { let o = {}; const root = o; for (let i = 0; i < 200; i++) { o.n = {}; o = o.n; } return root; })()",
            "(() => { const a = []; a.length = 5; return a; })()",
        ],
    );
}

#[test]
fn a_to_json_added_to_object_prototype_is_honoured_at_once() {
    let mut engine = load(
        "function transform(r) { if (r.patch) Object.prototype.toJSON = function () { return { patched: true }; }; return { a: 1 }; }",
    );
    let records: Vec<&[u8]> = vec![b"{}", br#"{"patch":true}"#, b"{}"];
    let results = engine.run_batch(records);
    let texts: Vec<String> =
        results.iter().map(|r| text(r.as_ref().expect("ok"))[0].clone()).collect();
    assert_eq!(texts, vec![r#"{"a":1}"#, r#"{"patched":true}"#, r#"{"patched":true}"#]);
}

#[test]
fn many_numbers_match_json_stringify() {
    let mut engine = load(
        "let seed = 42;\nfunction rnd() { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; }\nfunction transform(r) { const xs = []; for (let i = 0; i < 5000; i++) { const x = (rnd() - 0.5) * Math.pow(10, Math.floor(rnd() * 60) - 30); xs.push(x, Math.round(x), x * 1.0001, 1 / (i + 1)); } return [{ xs }, { t: JSON.stringify({ xs }) }]; }",
    );
    let out = text(&engine.run(b"{}").expect("runs"));
    let reference: serde_json::Value = serde_json::from_str(&out[1]).expect("JSON");
    let reference = reference["t"].as_str().expect("a string");
    let differences: Vec<(&str, &str)> =
        out[0].split(',').zip(reference.split(',')).filter(|(a, b)| a != b).take(5).collect();
    assert_eq!(differences, vec![], "ours vs JSON.stringify");
    assert_eq!(out[0], reference);
}

#[test]
fn a_getter_that_throws_is_a_per_record_error() {
    let mut engine =
        load("function transform(r) { return { get bad() { throw new Error('nope'); } }; }");
    let error = engine.run(b"{}").expect_err("throws");
    assert!(
        matches!(&error, sluice_js::RunError::Threw { message, .. } if message == "Error: nope"),
        "{error:?}"
    );
}
