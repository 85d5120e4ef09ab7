//! `compile_check`: what the API runs when a script is created or changed.

use sluice_js::{ScriptErrorKind, compile_check};

#[test]
fn a_valid_script_passes() {
    compile_check("function transform(record) { return record; }").expect("valid");
    compile_check("const transform = (r) => ({ ...r, x: 1 });").expect("arrow function");
    compile_check(
        "var helper = 1;\nfunction transform(r) { return r; }\nconsole.log('top-level');",
    )
    .expect("top-level code and console");
    compile_check("const hit = beam.contains('d', 'v');\nfunction transform(r) { return r; }")
        .expect("beam at top level");
}

#[test]
fn a_syntax_error_carries_the_engine_message_and_line() {
    let error =
        compile_check("function transform(r) {\n  return r +;\n}").expect_err("syntax error");
    assert_eq!(error.kind, ScriptErrorKind::Syntax);
    assert_eq!(error.line, Some(2));
    assert!(error.message.starts_with("SyntaxError: "), "{}", error.message);
    assert!(error.message.contains("unexpected token"), "{}", error.message);
    let shown = error.to_string();
    assert!(shown.contains("line 2"), "{shown}");

    let error =
        compile_check("function transform(r) {\n\n\n  return { a: 1 \n}").expect_err("unclosed");
    assert_eq!(error.kind, ScriptErrorKind::Syntax);
    assert!(error.line.is_some_and(|line| line >= 4), "{error:?}");
}

#[test]
fn a_script_without_a_transform_function_is_rejected() {
    for source in ["function transfrom(r) { return r; }", "const transform = 5;", "// nothing here"]
    {
        let error = compile_check(source).expect_err("no transform");
        assert_eq!(error.kind, ScriptErrorKind::MissingTransform, "{source}");
        assert!(error.message.contains("transform"), "{}", error.message);
    }
}

#[test]
fn top_level_code_that_throws_is_rejected_with_its_line() {
    let error = compile_check("function transform(r) { return r; }\nnull.x;").expect_err("throws");
    assert_eq!(error.kind, ScriptErrorKind::Threw);
    assert_eq!(error.line, Some(2));
    assert!(error.message.starts_with("TypeError"), "{}", error.message);
}

#[test]
fn a_script_cannot_load_modules() {
    let error = compile_check("import x from 'fs';\nfunction transform(r) { return r; }")
        .expect_err("no modules");
    assert_eq!(error.kind, ScriptErrorKind::Syntax);
}
