//! Request-body validation that reports every violation at once, in the 422 shape of
//! docs/contract.md §Validation error body:
//! `{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}`.
//!
//! Bodies are walked as `serde_json::Value` rather than deserialized straight into types,
//! because serde stops at the first error and cannot say *where* a rule (not a type) was
//! broken. [`Fields`] is the walker: it reads the fields of one JSON object, records a
//! [`Violation`] for each problem under a precise `loc`, and flags fields nobody asked for.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// One element of a `loc` path: a field name or an array index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum LocItem {
    Field(String),
    Index(usize),
}

impl From<&str> for LocItem {
    fn from(field: &str) -> Self {
        LocItem::Field(field.to_owned())
    }
}

impl From<usize> for LocItem {
    fn from(index: usize) -> Self {
        LocItem::Index(index)
    }
}

/// Where in the request a value sits, e.g. `["body", "pipeline_config", "sinks", 0, "name"]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Loc(Vec<LocItem>);

impl Loc {
    /// The request body itself.
    pub fn body() -> Self {
        Loc(vec![LocItem::Field("body".to_owned())])
    }

    /// A path parameter.
    pub fn path(name: &str) -> Self {
        Loc(vec!["path".into(), name.into()])
    }

    /// A query parameter.
    pub fn query(name: &str) -> Self {
        Loc(vec!["query".into(), name.into()])
    }

    /// A request header.
    pub fn header(name: &str) -> Self {
        Loc(vec!["header".into(), name.into()])
    }

    /// This location extended by one step.
    pub fn at(&self, item: impl Into<LocItem>) -> Self {
        let mut items = self.0.clone();
        items.push(item.into());
        Loc(items)
    }

    pub fn items(&self) -> &[LocItem] {
        &self.0
    }
}

/// One broken rule, rendered as one entry of the 422 `detail` array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Violation {
    pub loc: Vec<LocItem>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
}

impl Violation {
    pub fn new(loc: &Loc, kind: &str, msg: impl Into<String>) -> Self {
        Self { loc: loc.0.clone(), msg: msg.into(), kind: kind.to_owned() }
    }

    pub fn missing(loc: &Loc) -> Self {
        Self::new(loc, "missing", "Field required")
    }

    /// A value that has the right type but breaks a rule of the service.
    pub fn value(loc: &Loc, msg: impl Into<String>) -> Self {
        Self::new(loc, "value_error", msg)
    }
}

/// The error of a [`Fields`] read whose violation is already recorded in [`Violations`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded;

/// Collected violations; empty means the body is valid.
#[derive(Debug, Default)]
pub struct Violations(Vec<Violation>);

impl Violations {
    pub fn push(&mut self, violation: Violation) {
        self.0.push(violation);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many were recorded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `Ok(value)` when nothing was recorded, else every violation.
    ///
    /// # Errors
    /// The recorded violations, in the order they were found.
    pub fn finish<T>(self, value: T) -> Result<T, Vec<Violation>> {
        if self.0.is_empty() { Ok(value) } else { Err(self.0) }
    }
}

/// Parses a request body as one JSON value, refusing repeated keys at any depth
/// ([`crate::json`] says why).
///
/// # Errors
/// A `json_invalid` violation for malformed JSON, `json_duplicate_key` (at the repeated key's
/// path under `body`) for a key an object holds twice.
pub fn parse_value(bytes: &[u8]) -> Result<Value, Vec<Violation>> {
    crate::json::parse(bytes).map_err(|error| match error {
        crate::json::JsonError::DuplicateKey { path } => {
            let msg = format!("Duplicate key {}", crate::json::describe_path(&path));
            let mut loc = Loc::body();
            loc.0.extend(path);
            vec![Violation::new(&loc, "json_duplicate_key", msg)]
        }
        crate::json::JsonError::Syntax(error) => vec![Violation::new(
            &Loc::body(),
            "json_invalid",
            format!("JSON decode error: {error}"),
        )],
    })
}

/// Parses a request body as one JSON object, as [`parse_value`] does.
///
/// # Errors
/// [`parse_value`]'s, and `dict_type` when the body is not an object.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, Vec<Violation>> {
    match parse_value(bytes)? {
        Value::Object(map) => Ok(map),
        _ => Err(vec![Violation::new(
            &Loc::body(),
            "dict_type",
            "Input should be a valid dictionary",
        )]),
    }
}

/// Reads the fields of one JSON object, recording violations as it goes.
///
/// Call [`Fields::finish`] after reading: every field that was neither read nor declared
/// ignorable is reported as `extra_forbidden`.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    loc: Loc,
    seen: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    /// Starts reading `value` at `loc`; records `dict_type` and returns `None` when it is not
    /// an object.
    pub fn of(value: &'a Value, loc: Loc, errors: &mut Violations) -> Option<Self> {
        match value {
            Value::Object(map) => Some(Self::new(map, loc)),
            _ => {
                errors.push(Violation::new(
                    &loc,
                    "dict_type",
                    "Input should be a valid dictionary",
                ));
                None
            }
        }
    }

    pub fn new(map: &'a Map<String, Value>, loc: Loc) -> Self {
        Self { map, loc, seen: Vec::new() }
    }

    pub fn loc(&self, field: &str) -> Loc {
        self.loc.at(field)
    }

    /// The raw value of `field`, marking it as read. JSON `null` counts as absent.
    pub fn get(&mut self, field: &'a str) -> Option<&'a Value> {
        self.seen.push(field);
        self.map.get(field).filter(|value| !value.is_null())
    }

    /// Every field name of the object.
    pub fn keys(&self) -> Vec<&'a str> {
        self.map.keys().map(String::as_str).collect()
    }

    /// Marks fields the service accepts and ignores (server-managed fields).
    pub fn ignore(&mut self, fields: &[&'a str]) {
        self.seen.extend_from_slice(fields);
    }

    /// A required string.
    pub fn required_str(&mut self, field: &'a str, errors: &mut Violations) -> Option<&'a str> {
        match self.get(field) {
            None => {
                errors.push(Violation::missing(&self.loc(field)));
                None
            }
            Some(value) => as_str(value, &self.loc(field), errors),
        }
    }

    /// An optional string.
    pub fn optional_str(&mut self, field: &'a str, errors: &mut Violations) -> Option<&'a str> {
        let value = self.get(field)?;
        as_str(value, &self.loc(field), errors)
    }

    /// An optional boolean; `Err(Recorded)` when present but not a boolean .
    pub fn optional_bool(
        &mut self,
        field: &'a str,
        errors: &mut Violations,
    ) -> Result<Option<bool>, Recorded> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(_) => {
                errors.push(Violation::new(
                    &self.loc(field),
                    "bool_type",
                    "Input should be a valid boolean",
                ));
                Err(Recorded)
            }
        }
    }

    /// A required array.
    pub fn required_array(
        &mut self,
        field: &'a str,
        errors: &mut Violations,
    ) -> Option<&'a Vec<Value>> {
        match self.get(field) {
            None => {
                errors.push(Violation::missing(&self.loc(field)));
                None
            }
            Some(value) => as_array(value, &self.loc(field), errors),
        }
    }

    /// An optional array of strings; `Err(Recorded)` when present but malformed .
    pub fn optional_str_array(
        &mut self,
        field: &'a str,
        errors: &mut Violations,
    ) -> Result<Option<Vec<&'a str>>, Recorded> {
        match self.get(field) {
            None => Ok(None),
            Some(value) => str_array(value, &self.loc(field), errors).map(Some).ok_or(Recorded),
        }
    }

    /// One of `allowed`, written as a JSON string.
    pub fn optional_enum(
        &mut self,
        field: &'a str,
        allowed: &[&str],
        errors: &mut Violations,
    ) -> Result<Option<&'a str>, Recorded> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(text)) if allowed.contains(&text.as_str()) => Ok(Some(text)),
            Some(_) => {
                errors.push(Violation::new(
                    &self.loc(field),
                    "enum",
                    format!("Input should be {}", one_of(allowed)),
                ));
                Err(Recorded)
            }
        }
    }

    /// Reports every field that was not read; `hint` may explain a particular extra field.
    pub fn finish(self, errors: &mut Violations, hint: impl Fn(&str) -> Option<String>) {
        for field in self.map.keys() {
            if !self.seen.contains(&field.as_str()) {
                let msg = hint(field).unwrap_or_else(|| "Extra inputs are not permitted".into());
                errors.push(Violation::new(&self.loc.at(field.as_str()), "extra_forbidden", msg));
            }
        }
    }
}

/// `value` as a string, or a recorded `string_type` violation.
pub fn as_str<'a>(value: &'a Value, loc: &Loc, errors: &mut Violations) -> Option<&'a str> {
    match value {
        Value::String(text) => Some(text),
        _ => {
            errors.push(Violation::new(loc, "string_type", "Input should be a valid string"));
            None
        }
    }
}

/// `value` as an array, or a recorded `list_type` violation.
pub fn as_array<'a>(
    value: &'a Value,
    loc: &Loc,
    errors: &mut Violations,
) -> Option<&'a Vec<Value>> {
    match value {
        Value::Array(items) => Some(items),
        _ => {
            errors.push(Violation::new(loc, "list_type", "Input should be a valid list"));
            None
        }
    }
}

/// `value` as an array of strings; each non-string element is its own violation.
pub fn str_array<'a>(value: &'a Value, loc: &Loc, errors: &mut Violations) -> Option<Vec<&'a str>> {
    let items = as_array(value, loc, errors)?;
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (index, item) in items.iter().enumerate() {
        match as_str(item, &loc.at(index), errors) {
            Some(text) => out.push(text),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// `value` as a whole number that fits a `u64`: `426`, and also `426.0`, which JSON Schema's
/// `integer` (and so the OpenAPI document) counts as the same number.
pub fn whole_u64(value: &Value) -> Option<u64> {
    // Every whole number up to 2^53 has an exact `f64`; past that a float is not a count.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    value.as_u64().or_else(|| {
        let number = value.as_f64()?;
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked whole and in range"
        )]
        (number.fract() == 0.0 && (0.0..=EXACT).contains(&number)).then_some(number as u64)
    })
}

/// `'a', 'b' or 'c'`, the way pydantic words an enum.
pub fn one_of(allowed: &[&str]) -> String {
    let quoted: Vec<String> = allowed.iter().map(|item| format!("'{item}'")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn whole_u64_takes_integral_floats_and_refuses_the_rest() {
        use serde_json::json;
        assert_eq!(whole_u64(&json!(426)), Some(426));
        assert_eq!(whole_u64(&json!(426.0)), Some(426));
        assert_eq!(whole_u64(&json!(0.0)), Some(0));
        assert_eq!(whole_u64(&json!(426.5)), None);
        assert_eq!(whole_u64(&json!(-1)), None);
        assert_eq!(whole_u64(&json!(-1.0)), None);
        assert_eq!(whole_u64(&json!(1e300)), None);
        assert_eq!(whole_u64(&json!("426")), None);
        assert_eq!(whole_u64(&json!(null)), None);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn one_of_words_lists_like_pydantic() {
        assert_eq!(one_of(&["S"]), "'S'");
        assert_eq!(one_of(&["S", "M", "L", "XL"]), "'S', 'M', 'L' or 'XL'");
    }

    #[test]
    fn loc_serializes_fields_and_indexes() {
        let loc = Loc::body().at("sinks").at(0usize).at("name");
        let violation = Violation::missing(&loc);
        assert_eq!(
            serde_json::to_value(violation).unwrap(),
            json!({"loc": ["body", "sinks", 0, "name"], "msg": "Field required", "type": "missing"})
        );
    }

    #[test]
    fn unread_fields_are_extra_and_null_counts_as_absent() {
        let value = json!({"a": "x", "b": null, "c": 1});
        let mut errors = Violations::default();
        let mut fields = Fields::of(&value, Loc::body(), &mut errors).unwrap();
        assert_eq!(fields.required_str("a", &mut errors), Some("x"));
        assert_eq!(fields.required_str("b", &mut errors), None);
        fields.finish(&mut errors, |_| None);
        let found = errors.finish(()).unwrap_err();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].kind, "missing");
        assert_eq!(found[1].kind, "extra_forbidden");
        assert_eq!(found[1].loc, vec![LocItem::from("body"), LocItem::from("c")]);
    }

    #[test]
    fn parse_object_rejects_non_objects_and_bad_json() {
        assert_eq!(parse_object(b"[1]").unwrap_err()[0].kind, "dict_type");
        assert_eq!(parse_object(b"{").unwrap_err()[0].kind, "json_invalid");
        assert!(parse_object(b"{}").unwrap().is_empty());
    }

    #[test]
    fn parse_object_rejects_a_repeated_key_at_its_path() {
        let found = parse_object(br#"{"a":{"b":[{"c":1,"c":2}]}}"#).unwrap_err();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, "json_duplicate_key");
        assert_eq!(serde_json::to_value(&found[0].loc).unwrap(), json!(["body", "a", "b", 0, "c"]));
        assert_eq!(found[0].msg, r#"Duplicate key "a"."b"[0]."c""#);
    }
}
