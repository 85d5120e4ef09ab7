//! The script contract: reshape, drop, fan out, `beam.contains`, `console`, JSON fidelity.

use std::sync::Arc;

use serde_json::json;
use sluice_js::{LogLevel, RunError, ScriptEngine};

use super::{CapturedLogs, TestDatasets, limits, load, run, text};

#[test]
fn a_returned_object_replaces_the_record() {
    let mut engine = load(
        "function transform(r) { return { from: r.from, value: Number(r.value) * 2, tag: 'x' }; }",
    );
    let out = run(&mut engine, r#"{"from":"0xab","value":"21","other":true}"#).expect("runs");
    assert_eq!(out, vec![json!({"from": "0xab", "value": 42, "tag": "x"})]);
}

#[test]
fn the_benchmark_script_mutates_the_record_in_place() {
    let mut engine = load(
        "function transform(r){ r.amount_usd = Number(r.amount) * 1.0001; r.is_large = r.amount_usd > 5000; delete r.token_name; return r; }",
    );
    let out = engine.run(br#"{"amount":"10000","token_name":"USDC","x":1}"#).expect("runs");
    assert_eq!(text(&out), vec![r#"{"amount":"10000","x":1,"amount_usd":10001,"is_large":true}"#]);
}

#[test]
fn null_and_undefined_drop_the_record() {
    let mut engine = load(
        "function transform(r) { if (r.kind === 'a') return null; if (r.kind === 'b') return undefined; if (r.kind === 'c') return; return r; }",
    );
    for kind in ["a", "b", "c"] {
        let record = format!(r#"{{"kind":"{kind}"}}"#);
        assert_eq!(run(&mut engine, &record).expect("runs"), Vec::<serde_json::Value>::new());
    }
    assert_eq!(run(&mut engine, r#"{"kind":"d"}"#).expect("runs"), vec![json!({"kind": "d"})]);
}

#[test]
fn an_array_emits_each_element_in_order() {
    let mut engine =
        load("function transform(r) { return r.items.map((item, i) => ({ id: r.id, i, item })); }");
    let out = run(&mut engine, r#"{"id":7,"items":["a","b","c"]}"#).expect("runs");
    assert_eq!(
        out,
        vec![
            json!({"id": 7, "i": 0, "item": "a"}),
            json!({"id": 7, "i": 1, "item": "b"}),
            json!({"id": 7, "i": 2, "item": "c"}),
        ]
    );
    let out = run(&mut engine, r#"{"id":8,"items":[]}"#).expect("runs");
    assert!(out.is_empty(), "an empty array emits nothing");
}

#[test]
fn non_object_returns_are_per_record_errors() {
    let mut engine = load(
        "function transform(r) { switch (r.k) { case 1: return 5; case 2: return 'text'; case 3: return true; case 4: return [r, 3]; case 5: return [[r]]; case 6: return () => 1; case 7: return Promise.resolve(r); default: return r; } }",
    );
    let cases = [
        (1, "a number"),
        (2, "a string"),
        (3, "a boolean"),
        (4, "an array whose element 1 is a number"),
        (5, "an array whose element 0 is an array"),
        (6, "a function"),
        (7, "a Promise (transform must be synchronous)"),
    ];
    for (k, found) in cases {
        let error = run(&mut engine, &format!(r#"{{"k":{k}}}"#)).expect_err("not an object");
        assert_eq!(error, RunError::NotAnObject { found: found.to_owned() }, "k = {k}");
        assert!(!error.is_fatal());
    }
    assert_eq!(run(&mut engine, r#"{"k":0}"#).expect("still usable"), vec![json!({"k": 0})]);
}

#[test]
fn input_that_is_not_a_json_object_is_a_bad_input_error() {
    let mut engine = load("function transform(r) { return r; }");
    for bad in ["[1,2]", "3", "not json", "{\"a\":", "null"] {
        let error = run(&mut engine, bad).expect_err("bad input");
        assert!(matches!(error, RunError::BadInput { .. }), "{bad}: {error:?}");
    }
}

#[test]
fn a_throwing_script_reports_message_and_line_and_the_next_record_runs() {
    let mut engine = load(
        "function transform(r) {\n  if (r.bad) {\n    throw new Error('bad record ' + r.id);\n  }\n  return r;\n}",
    );
    let error = run(&mut engine, r#"{"id":1,"bad":true}"#).expect_err("throws");
    let RunError::Threw { message, line, column } = &error else {
        panic!("expected Threw: {error:?}")
    };
    assert_eq!((message.as_str(), *line), ("Error: bad record 1", Some(3)));
    assert!(column.is_some());
    assert!(error.to_string().contains("line 3"), "{error}");
    assert_eq!(run(&mut engine, r#"{"id":2}"#).expect("runs"), vec![json!({"id": 2})]);

    let mut engine = load("function transform(r) {\n  return r.a.b.c;\n}");
    let error = run(&mut engine, "{}").expect_err("TypeError");
    let RunError::Threw { message, line, .. } = error else { panic!("expected Threw") };
    assert!(message.starts_with("TypeError: "), "{message}");
    assert_eq!(line, Some(2));

    let mut engine = load("function transform(r) { throw 'plain string'; }");
    let error = run(&mut engine, "{}").expect_err("throws a string");
    assert_eq!(
        error,
        RunError::Threw { message: "plain string".to_owned(), line: None, column: None }
    );
}

#[test]
fn unserializable_output_is_a_per_record_error() {
    let mut engine = load("function transform(r) { r.self = r; return r; }");
    let error = run(&mut engine, "{}").expect_err("cycle");
    assert!(
        matches!(&error, RunError::Threw { message, .. } if message.starts_with("TypeError")),
        "{error:?}"
    );
    let mut engine = load("function transform(r) { r.big = 10n; return r; }");
    assert!(matches!(run(&mut engine, "{}"), Err(RunError::Threw { .. })));
}

#[test]
fn beam_contains_asks_the_owners_datasets() {
    let datasets = TestDatasets(vec![
        ("owner-a", "whales", "0xabc"),
        ("owner-a", "ids", "42"),
        ("owner-b", "whales", "0xdef"),
    ]);
    let script = "function transform(r) { return { hit: beam.contains(r.set, r.values) }; }";
    let mut engine = ScriptEngine::new(
        script,
        limits(),
        Arc::new(datasets),
        "owner-a",
        Arc::new(sluice_js::NoLogs),
    )
    .expect("loads");
    let cases = [
        (r#"{"set":"whales","values":"0xABC"}"#, true),
        (r#"{"set":"whales","values":["0x1","0xabc"]}"#, true),
        (r#"{"set":"whales","values":["0x1","0x2"]}"#, false),
        (r#"{"set":"whales","values":"0xdef"}"#, false),
        (r#"{"set":"whales","values":[]}"#, false),
        (r#"{"set":"ids","values":42}"#, true),
        (r#"{"set":"ids","values":[41, 42]}"#, true),
        (r#"{"set":"unknown","values":"0xabc"}"#, false),
    ];
    for (record, hit) in cases {
        assert_eq!(run(&mut engine, record).expect("runs"), vec![json!({"hit": hit})], "{record}");
    }
    let error = run(&mut engine, r#"{"set":"whales","values":[{"a":1}]}"#).expect_err("bad value");
    assert!(
        matches!(&error, RunError::Threw { message, .. } if message.starts_with("TypeError: beam.contains")),
        "{error:?}"
    );
    let error = run(&mut engine, r#"{"set":5,"values":"x"}"#).expect_err("bad name");
    assert!(
        matches!(&error, RunError::Threw { message, .. } if message.contains("datasetName")),
        "{error:?}"
    );
}

#[test]
fn beam_contains_is_false_without_datasets() {
    let mut engine =
        load("function transform(r) { return { hit: beam.contains('whales', '0xabc') }; }");
    assert_eq!(run(&mut engine, "{}").expect("runs"), vec![json!({"hit": false})]);
}

#[test]
fn beam_and_console_cannot_be_replaced() {
    let mut engine = load(
        "beam = null; try { beam.contains = () => true } catch (e) {}\nfunction transform(r) { console = null; return { hit: beam.contains('x', 'y'), log: typeof console.log }; }",
    );
    assert_eq!(
        run(&mut engine, "{}").expect("runs"),
        vec![json!({"hit": false, "log": "function"})]
    );
}

#[test]
fn no_host_access_beyond_beam_and_console() {
    let mut engine = load(
        "function transform(r) { return { req: typeof require, proc: typeof process, timer: typeof setTimeout, fetch: typeof fetch, std: typeof std, os: typeof os }; }",
    );
    assert_eq!(
        run(&mut engine, "{}").expect("runs"),
        vec![
            json!({"req": "undefined", "proc": "undefined", "timer": "undefined", "fetch": "undefined", "std": "undefined", "os": "undefined"})
        ]
    );
}

#[test]
fn console_lines_reach_the_log_sink_with_their_level() {
    let logs = Arc::new(CapturedLogs::default());
    let script = "console.log('loaded');\nfunction transform(r) { console.log('got', r.id, {a: [1]}, null, undefined); console.info('i'); console.warn('careful'); console.error('bad', 1.5); return r; }";
    let mut engine = ScriptEngine::new(
        script,
        limits(),
        Arc::new(sluice_core::datasets::NoDatasets),
        "u",
        Arc::clone(&logs) as Arc<dyn sluice_js::LogSink>,
    )
    .expect("loads");
    run(&mut engine, r#"{"id":"x1"}"#).expect("runs");
    let lines = logs.0.lock().expect("lock").clone();
    assert_eq!(
        lines,
        vec![
            (LogLevel::Info, "loaded".to_owned()),
            (LogLevel::Info, r#"got x1 {"a":[1]} null undefined"#.to_owned()),
            (LogLevel::Info, "i".to_owned()),
            (LogLevel::Warn, "careful".to_owned()),
            (LogLevel::Error, "bad 1.5".to_owned()),
        ]
    );
}

#[test]
fn long_console_lines_are_cut() {
    let logs = Arc::new(CapturedLogs::default());
    let mut engine = ScriptEngine::new(
        "function transform(r) { console.log('x'.repeat(10000)); return r; }",
        limits(),
        Arc::new(sluice_core::datasets::NoDatasets),
        "u",
        Arc::clone(&logs) as Arc<dyn sluice_js::LogSink>,
    )
    .expect("loads");
    run(&mut engine, "{}").expect("runs");
    let lines = logs.0.lock().expect("lock").clone();
    assert_eq!(lines[0].1, format!("{}…", "x".repeat(sluice_js::MAX_LOG_MESSAGE_BYTES)));
}

#[test]
fn json_output_is_deterministic_for_numbers_unicode_and_nesting() {
    let mut engine = load("function transform(r) { return r; }");
    let input = r#"{"int":42,"neg":-7,"float":0.1,"exp":1e21,"small":1.5e-7,"big":12345678901234567890,"zero":-0,"s":"héllo ✓ 😀 \u2028 \"q\" \\ \n","nested":{"a":[1,{"b":[true,false,null]}],"e":{}},"arr":[]}"#;
    let expected = r#"{"int":42,"neg":-7,"float":0.1,"exp":1e+21,"small":1.5e-7,"big":12345678901234567000,"zero":0,"s":"héllo ✓ 😀 <LS> \"q\" \\ \n","nested":{"a":[1,{"b":[true,false,null]}],"e":{}},"arr":[]}"#
        .replace("<LS>", "\u{2028}");
    for _ in 0..3 {
        let out = engine.run(input.as_bytes()).expect("runs");
        assert_eq!(text(&out), vec![expected.to_owned()]);
    }
}

#[test]
fn state_persists_between_calls_and_run_batch_answers_in_order() {
    let mut engine = load(
        "let seen = 0;\nfunction transform(r) { seen += 1; if (r.drop) return null; if (r.boom) throw new Error('boom'); r.seen = seen; return r; }",
    );
    let records: Vec<&[u8]> =
        vec![br#"{"a":1}"#, br#"{"drop":true}"#, br#"{"boom":true}"#, b"nope", br#"{"a":2}"#];
    let results = engine.run_batch(records);
    assert_eq!(results.len(), 5);
    assert_eq!(text(results[0].as_ref().expect("ok")), vec![r#"{"a":1,"seen":1}"#]);
    assert!(results[1].as_ref().expect("ok").is_empty());
    assert!(
        matches!(&results[2], Err(RunError::Threw { message, .. }) if message == "Error: boom")
    );
    assert!(matches!(&results[3], Err(RunError::BadInput { .. })));
    assert_eq!(text(results[4].as_ref().expect("ok")), vec![r#"{"a":2,"seen":4}"#]);
}

#[test]
fn promise_callbacks_run_after_the_call_and_cannot_change_the_output() {
    let logs = Arc::new(CapturedLogs::default());
    let mut engine = ScriptEngine::new(
        "let n = 0;\nfunction transform(r) { Promise.resolve().then(() => { n += 1; console.log('tick', n); r.late = true; }); queueMicrotask(() => { throw new Error('ignored'); }); r.n = n; return r; }",
        limits(),
        Arc::new(sluice_core::datasets::NoDatasets),
        "u",
        Arc::clone(&logs) as Arc<dyn sluice_js::LogSink>,
    )
    .expect("loads");
    assert_eq!(run(&mut engine, "{}").expect("runs"), vec![json!({"n": 0})]);
    assert_eq!(run(&mut engine, "{}").expect("runs"), vec![json!({"n": 1})]);
    let lines = logs.0.lock().expect("lock").clone();
    assert_eq!(
        lines,
        vec![(LogLevel::Info, "tick 1".to_owned()), (LogLevel::Info, "tick 2".to_owned())]
    );
}

#[test]
fn endless_microtasks_stop_at_the_budget_without_failing_the_record() {
    let mut engine = load(
        "function spin() { queueMicrotask(spin); }\nfunction transform(r) { spin(); return r; }",
    );
    assert_eq!(
        run(&mut engine, r#"{"a":1}"#).expect("the record still goes on"),
        vec![json!({"a": 1})]
    );
    assert_eq!(run(&mut engine, r#"{"a":2}"#).expect("usable"), vec![json!({"a": 2})]);
}

#[test]
fn deep_recursion_is_a_per_record_error() {
    let mut engine = load(
        "function f(n) { return f(n + 1) + 1; }\nfunction transform(r) { return { v: f(0) }; }",
    );
    let error = run(&mut engine, "{}").expect_err("stack overflow");
    assert!(
        matches!(&error, RunError::Threw { message, .. } if message == "RangeError: Maximum call stack size exceeded"),
        "{error:?}"
    );
    assert!(!error.is_fatal());
}

#[test]
fn atomics_wait_cannot_block_the_worker() {
    let mut engine = load(
        "function transform(r) { const ia = new Int32Array(new SharedArrayBuffer(16)); Atomics.wait(ia, 0, 0); return r; }",
    );
    let error = run(&mut engine, "{}").expect_err("cannot block");
    assert!(
        matches!(&error, RunError::Threw { message, .. } if message.starts_with("TypeError")),
        "{error:?}"
    );
}
