//! Time budget and memory limit: contained, classified, and what the engine can do after.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sluice_core::datasets::NoDatasets;
use sluice_core::pipeline::PodSize;
use sluice_js::{
    DEFAULT_CALL_BUDGET, Fault, Limits, NoLogs, RunError, ScriptEngine, ScriptErrorKind,
    memory_limit_for,
};

use super::{load, run};

#[test]
fn an_infinite_loop_is_cut_at_the_budget_and_the_engine_stays_usable() {
    let mut engine = load(
        "function transform(r) { if (r.spin) { while (true) {} } if (r.catchy) { for (;;) { try { while (true) {} } catch (e) {} } } return r; }",
    );
    let budget = Duration::from_millis(100);
    assert_eq!(run(&mut engine, r#"{"spin":true}"#), Err(RunError::TimedOut { budget }));
    // The interruption cannot be caught by the script.
    assert_eq!(run(&mut engine, r#"{"catchy":true}"#), Err(RunError::TimedOut { budget }));
    let error = RunError::TimedOut { budget };
    assert!(!error.is_fatal());
    assert_eq!(error.fault(), Fault::Record);
    assert_eq!(
        run(&mut engine, r#"{"ok":1}"#).expect("usable after a timeout"),
        vec![json!({"ok": 1})]
    );
    assert!(!engine.is_poisoned());
}

#[test]
fn each_record_of_a_batch_gets_its_own_budget() {
    let mut engine = load("function transform(r) { if (r.spin) { while (true) {} } return r; }");
    let records: Vec<&[u8]> =
        vec![br#"{"spin":true}"#, br#"{"a":1}"#, br#"{"spin":true}"#, br#"{"a":2}"#];
    let results = engine.run_batch(records);
    assert!(matches!(results[0], Err(RunError::TimedOut { .. })));
    assert!(results[1].is_ok());
    assert!(matches!(results[2], Err(RunError::TimedOut { .. })));
    assert!(results[3].is_ok());
}

#[test]
fn a_memory_bomb_is_a_fatal_out_of_memory_error_and_restart_recovers() {
    let limits = Limits {
        memory_bytes: 16 * 1024 * 1024,
        call_budget: Duration::from_secs(30),
        ..Limits::for_pod_size(sluice_core::pipeline::PodSize::S)
    };
    let mut engine = ScriptEngine::new(
        "function transform(r) { if (r.bomb) { const a = []; while (true) { a.push('x'.repeat(4096) + a.length); } } return r; }",
        limits,
        Arc::new(NoDatasets),
        "u",
        Arc::new(NoLogs),
    )
    .expect("loads");
    let error = run(&mut engine, r#"{"bomb":true}"#).expect_err("out of memory");
    assert_eq!(error, RunError::OutOfMemory { limit_bytes: 16 * 1024 * 1024 });
    assert!(error.is_fatal());
    assert_eq!(error.fault(), Fault::Worker);
    assert!(engine.is_poisoned());
    // A poisoned engine refuses work until it is restarted.
    assert_eq!(
        run(&mut engine, r#"{"ok":1}"#),
        Err(RunError::OutOfMemory { limit_bytes: 16 * 1024 * 1024 })
    );
    engine.restart().expect("restarts");
    assert!(!engine.is_poisoned());
    assert_eq!(
        run(&mut engine, r#"{"ok":1}"#).expect("runs after restart"),
        vec![json!({"ok": 1})]
    );
}

#[test]
fn a_memory_bomb_that_catches_the_error_is_still_out_of_memory() {
    let limits = Limits {
        memory_bytes: 16 * 1024 * 1024,
        call_budget: Duration::from_secs(30),
        ..Limits::for_pod_size(sluice_core::pipeline::PodSize::S)
    };
    let mut engine = ScriptEngine::new(
        "function transform(r) { const a = []; try { while (true) { a.push('y'.repeat(4096) + a.length); } } catch (e) { throw e; } }",
        limits,
        Arc::new(NoDatasets),
        "u",
        Arc::new(NoLogs),
    )
    .expect("loads");
    assert!(matches!(run(&mut engine, "{}"), Err(RunError::OutOfMemory { .. })));
}

#[test]
fn a_batch_stops_at_an_out_of_memory_error() {
    let limits = Limits {
        memory_bytes: 16 * 1024 * 1024,
        call_budget: Duration::from_secs(30),
        ..Limits::for_pod_size(sluice_core::pipeline::PodSize::S)
    };
    let mut engine = ScriptEngine::new(
        "function transform(r) { if (r.bomb) { const a = []; for (;;) { a.push({ n: a.length, s: 'z'.repeat(1024) + a.length }); } } return r; }",
        limits,
        Arc::new(NoDatasets),
        "u",
        Arc::new(NoLogs),
    )
    .expect("loads");
    let records: Vec<&[u8]> = vec![br#"{"a":1}"#, br#"{"bomb":true}"#, br#"{"a":2}"#];
    let results = engine.run_batch(records);
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(RunError::OutOfMemory { .. })), "{:?}", results[1]);
    assert!(matches!(results[2], Err(RunError::OutOfMemory { .. })), "no record runs after an OOM");
}

#[test]
fn top_level_code_is_held_to_the_load_budget_and_the_memory_limit() {
    let limits = Limits {
        memory_bytes: 16 * 1024 * 1024,
        call_budget: Duration::from_millis(50),
        ..Limits::for_pod_size(sluice_core::pipeline::PodSize::S)
    };
    assert_eq!(limits.load_budget(), Duration::from_secs(1));
    assert_eq!(
        Limits { call_budget: Duration::from_secs(3), ..limits }.load_budget(),
        Duration::from_secs(3)
    );
    let spin = ScriptEngine::new(
        "while (true) {}\nfunction transform(r) { return r; }",
        limits,
        Arc::new(NoDatasets),
        "u",
        Arc::new(NoLogs),
    )
    .expect_err("top-level loop");
    assert_eq!(spin.kind, ScriptErrorKind::TimedOut);
    assert_eq!(spin.message, "the script's top-level code ran over the time budget of 1000 ms");
    let limits = Limits { call_budget: Duration::from_secs(30), ..limits };
    let bomb = ScriptEngine::new("const a = []; for (;;) { a.push('z'.repeat(4096) + a.length); }\nfunction transform(r) { return r; }", limits, Arc::new(NoDatasets), "u", Arc::new(NoLogs))
        .expect_err("top-level bomb");
    assert_eq!(bomb.kind, ScriptErrorKind::OutOfMemory);
}

#[test]
fn pod_sizes_map_to_growing_memory_limits_and_a_100ms_budget() {
    let mib = 1024 * 1024;
    assert_eq!(memory_limit_for(PodSize::S), 64 * mib);
    assert_eq!(memory_limit_for(PodSize::M), 96 * mib);
    assert_eq!(memory_limit_for(PodSize::L), 128 * mib);
    assert_eq!(memory_limit_for(PodSize::XL), 256 * mib);
    assert_eq!(Limits::for_pod_size(PodSize::L).memory_bytes, 128 * mib);
    assert_eq!(Limits::for_pod_size(PodSize::S).call_budget, DEFAULT_CALL_BUDGET);
    assert_eq!(DEFAULT_CALL_BUDGET, Duration::from_millis(100));
}

#[test]
fn an_engine_can_move_to_another_thread() {
    fn assert_send<T: Send>(_: &T) {}
    let mut engine = load("function transform(r) { r.t = 1; return r; }");
    assert_send(&engine);
    let mut engine = std::thread::spawn(move || {
        run(&mut engine, "{}").expect("runs on another thread");
        engine
    })
    .join()
    .expect("thread");
    assert_eq!(run(&mut engine, "{}").expect("runs back here"), vec![json!({"t": 1})]);
}

#[test]
fn output_caps_refuse_a_huge_fan_out_a_huge_record_and_a_huge_total_and_are_not_retryable() {
    let mut engine = load(
        "function transform(r) {
           if (r.fan) { return new Array(r.fan).fill(r); }
           if (r.big) { return { s: 'x'.repeat(r.big) }; }
           if (r.refs) { const s = 'y'.repeat(1024); return { a: new Array(r.refs).fill(s) }; }
           if (r.total) { const s = 'z'.repeat(900 * 1024); return [{s}, {s}, {s}, {s}, {s}, {s}]; }
           if (r.date) { class C {} const c = new C(); c.pad = 'w'.repeat(2 * 1024 * 1024); return c; }
           return r;
         }",
    );
    let limits = Limits::for_pod_size(PodSize::S);
    assert_eq!((limits.max_fan_out, limits.max_record_bytes), (1_000, 1024 * 1024));
    assert_eq!(limits.max_output_bytes, 4 * 1024 * 1024);

    let fan = run(&mut engine, r#"{"fan":1000000}"#).unwrap_err();
    assert_eq!(fan, RunError::TooManyRecords { count: 1_000_000, limit: 1_000 });
    assert!(fan.to_string().contains("at most 1000"), "{fan}");
    assert_eq!(run(&mut engine, r#"{"fan":1000}"#).unwrap().len(), 1_000);

    let big = r#"{"big":2000000}"#;
    assert_eq!(
        run(&mut engine, big).unwrap_err(),
        RunError::RecordTooLarge { index: 0, limit: 1024 * 1024 }
    );
    // 1,024 references to one 1 KiB string: small in the runtime, 1 MiB+ as JSON.
    assert!(matches!(
        run(&mut engine, r#"{"refs":1100}"#),
        Err(RunError::RecordTooLarge { index: 0, .. })
    ));
    assert!(run(&mut engine, r#"{"refs":900}"#).is_ok());
    assert_eq!(
        run(&mut engine, r#"{"total":1}"#).unwrap_err(),
        RunError::OutputTooLarge { index: 4, limit: 4 * 1024 * 1024 }
    );
    // Through JSON.stringify (a class instance is not plain data) the cap holds too.
    assert!(matches!(
        run(&mut engine, r#"{"date":1}"#),
        Err(RunError::RecordTooLarge { index: 0, .. })
    ));
    for error in [
        RunError::TooManyRecords { count: 2, limit: 1 },
        RunError::RecordTooLarge { index: 0, limit: 1 },
        RunError::OutputTooLarge { index: 0, limit: 1 },
    ] {
        assert!(!error.is_retryable() && !error.is_fatal());
        assert_eq!(error.fault(), Fault::Record);
    }
    assert!(RunError::TimedOut { budget: DEFAULT_CALL_BUDGET }.is_retryable());
    assert_eq!(run(&mut engine, r#"{"ok":1}"#).unwrap(), vec![json!({"ok": 1})]);
}
