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
            "[2 ** 53, 2 ** 53 - 1, -(2 ** 53), 2 ** 53 + 2, 2 ** 60, -(2 ** 70), 1e15 + 0.5, 4294967296, -0 * 1, 0.5 - 0.5]",
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

/// Feeds `{"raw": "<text>", "value": <text>}` and checks that the record the script received
/// (`value`, parsed by the engine) is indistinguishable from `JSON.parse(raw)`: same JSON,
/// same own keys in the same order, same `-0`s, same prototype.
fn assert_parsed_like_json_parse(texts: &[&str]) {
    let mut engine = load(
        "const probe = (x) => JSON.stringify(x, (k, v) => Object.is(v, -0) ? 'NEG_ZERO' : v) + ' ' + JSON.stringify(Object.keys(x)) + ' ' + (Object.getPrototypeOf(x) === Object.prototype) + ' ' + Object.getOwnPropertyNames(x).map((k) => JSON.stringify(Object.getOwnPropertyDescriptor(x, k))).join();\nfunction transform(r) { return { ours: probe(r.value), js: probe(JSON.parse(r.raw)) }; }",
    );
    for text in texts {
        let record =
            format!(r#"{{"raw":{},"value":{text}}}"#, serde_json::to_string(text).expect("JSON"));
        let out = engine.run(record.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
        let out: serde_json::Value = serde_json::from_slice(&out[0]).expect("JSON");
        assert_eq!(out["ours"], out["js"], "{text}");
    }
}

#[test]
fn input_records_are_parsed_like_json_parse() {
    assert_parsed_like_json_parse(&[
        r#"{}"#,
        r#"{"a":1,"b":[1,2,{"c":null}],"d":"x","e":true,"f":false,"g":{},"h":[]}"#,
        r#"{"n":[0,-0,1,-1,2147483647,2147483648,-2147483648,-2147483649,1.5,1e3,1E-3,2.5e+2,12345678901234567890,1e400,-1e400,0.1,5e-324,-0.0,0e5]}"#,
        r#"{"s":"a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u2028\ud83d\ude00 raw é 😀"}"#,
        r#"{"__proto__":{"x":1},"y":2}"#,
        r#"{"a":1,"b":2,"a":3}"#,
        r#"{"b":1,"2":2,"1":3,"-1":4,"4294967295":5}"#,
        " \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \n",
        r#"{"lone":"\ud800","low":"\udc00x","pair?":"\ud800\u0041"}"#,
        r#"{"\u0041b":1,"a\"b":2,"é":3,"\u00e9x":4,"":5,"\ud83d\ude00":6,"x\ty":"\u0000"}"#,
        r#"{"n":[1.0,5.0e0,1e2,-0.0e1,2147483647.0,123456789012,0.000,-2147483648.5,1E+2]}"#,
        r#"{"e":"","a":[ ],"o":{ },"s":[""," ",[[]],[{}]]}"#,
    ]);
    let deep = format!(r#"{{"deep":{}1{}}}"#, "[".repeat(90), "]".repeat(90));
    let deep_objects = format!(r#"{{"a":{}1{}}}"#, r#"{"a":"#.repeat(70), "}".repeat(70));
    assert_parsed_like_json_parse(&[&deep, &deep_objects]);
}

#[test]
fn invalid_json_is_still_rejected() {
    let mut engine = load("function transform(r) { return r; }");
    for bad in [
        r#"{"a":01}"#,
        r#"{"a":1,}"#,
        r#"{"a":"\x"}"#,
        r#"{"a":.5}"#,
        r#"{"a":1.}"#,
        r#"{"a":1e}"#,
        r#"{"a":-}"#,
        r#"{"a":tru}"#,
        "{\"a\":\"raw\ncontrol\"}",
        r#"{} x"#,
        r#"{"a" 1}"#,
        r#"{'a':1}"#,
        r#"{"a":"\u12"}"#,
        "{\"a\":\"\u{0}\"}",
    ] {
        let error = engine.run(bad.as_bytes()).expect_err(bad);
        assert!(matches!(error, sluice_js::RunError::BadInput { .. }), "{bad}: {error:?}");
    }
    assert!(matches!(engine.run(&[b'{', 0xff, b'}']), Err(sluice_js::RunError::BadInput { .. })));
}

#[test]
fn parsing_defines_properties_without_calling_prototype_setters() {
    let mut engine = load(
        "Object.defineProperty(Object.prototype, 'trap', { set(v) { globalThis.trapped = v; }, configurable: true });\nfunction transform(r) { return { own: Object.hasOwn(r, 'trap'), value: r.trap, trapped: globalThis.trapped === undefined ? null : globalThis.trapped }; }",
    );
    let out = text(&engine.run(br#"{"trap":7}"#).expect("runs"));
    assert_eq!(out, vec![r#"{"own":true,"value":7,"trapped":null}"#]);
}

/// Keys are cached as engine atoms across records, up to a limit; keys past it, long keys
/// and keys seen once are parsed and written the same way.
#[test]
fn keys_beyond_the_atom_cache_parse_and_write_the_same() {
    let mut engine = load("function transform(r) { return r; }");
    let long = "k".repeat(300);
    for i in 0..5_000 {
        let record =
            format!(r#"{{"key{i}":{i},"{long}":"long","shared":[{i},"x"],"esc\u00e9{i}":true}}"#);
        let out = text(&engine.run(record.as_bytes()).expect("runs"));
        assert_eq!(
            out,
            vec![format!(r#"{{"key{i}":{i},"{long}":"long","shared":[{i},"x"],"escé{i}":true}}"#)]
        );
    }
}

/// Random JSON, each character written as itself or as a `\u` escape (pairs for astral
/// characters), with random spaces before structural characters.
fn json_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let text = || {
        proptest::string::string_regex("[a-zA-Z0-9 _\"\\\\/\\n\\t\u{1}\u{7f}é€😀\u{2028}-]{0,12}")
            .expect("regex")
    };
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_filter("finite", |x| x.is_finite()).prop_map(serde_json::Value::from),
        text().prop_map(serde_json::Value::String),
    ];
    let value = leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            proptest::collection::vec((text(), inner), 0..6)
                .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
        ]
    });
    let object = proptest::collection::vec(("[a-z_]{1,6}", value), 0..8)
        .prop_map(|members| serde_json::Value::Object(members.into_iter().collect()));
    (object, any::<u64>()).prop_map(|(object, seed)| {
        let mut out = String::new();
        write_json(&object, &mut seed.clone(), &mut out);
        out
    })
}

fn next(bits: &mut u64) -> u64 {
    *bits = bits.rotate_left(7) ^ 0x9e37_79b9_7f4a_7c15;
    *bits
}

/// Writes `value` as JSON, picking by `bits` which characters of strings to write as `\u`
/// escapes and where to put spaces.
fn write_json(value: &serde_json::Value, bits: &mut u64, out: &mut String) {
    match value {
        serde_json::Value::String(text) => {
            out.push('"');
            for character in text.chars() {
                if matches!(character, '"' | '\\')
                    || u32::from(character) < 0x20
                    || next(bits) % 3 == 0
                {
                    let mut units = [0u16; 2];
                    for unit in character.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                } else {
                    out.push(character);
                }
            }
            out.push('"');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                if next(bits) % 4 == 0 {
                    out.push_str(" \n\t");
                }
                write_json(item, bits, out);
            }
            out.push(']');
        }
        serde_json::Value::Object(members) => {
            out.push('{');
            for (index, (key, item)) in members.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_json(&serde_json::Value::String(key.clone()), bits, out);
                out.push_str(if next(bits) % 4 == 0 { " : " } else { ":" });
                write_json(item, bits, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// Whatever the record, the script sees what `JSON.parse` would give it.
    #[test]
    fn random_records_are_parsed_like_json_parse(text in json_text()) {
        assert_parsed_like_json_parse(&[&text]);
    }
}
