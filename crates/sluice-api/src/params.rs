//! The one path extractor ([`PathParams`]) and the one query extractor ([`Query`]) of every
//! route. Both fail only with the API's own 422 (`{"detail": [{loc, msg, type}]}`), naming
//! the parameter (`["path", name]`, `["query", name]`) and a pydantic-style `type`.
//!
//! The query extractor never fails by itself: it keeps the raw query string, and a handler
//! parses it with [`Query::parse`] once authentication and permission are decided, so a
//! caller without the right key learns nothing from a malformed query. Percent-escapes are
//! decoded strictly: one that does not decode to UTF-8 is a 422 (`string_unicode`), never
//! a silent U+FFFD. A query parameter the route does not declare in the OpenAPI document is a
//! 422 (`extra_forbidden`) naming it: the names come from the document itself
//! ([`QueryNames`]), so what it declares and what the server takes cannot drift apart. A
//! repeated parameter takes its last value, except where a route documents a list.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use sluice_core::validation::{Loc, Violation, Violations};

use crate::error::ApiError;
use crate::state::AppState;

/// pydantic's message for text that is not UTF-8.
const UNICODE_MSG: &str =
    "Input should be a valid string, unable to parse raw data as a unicode string";

/// Decodes `%XX` escapes (and `+` as a space when `plus_is_space`); `None` when the result
/// is not UTF-8.
fn percent_decode(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match byte {
            b'%' => match (hex(index + 1), hex(index + 2)) {
                (Some(high), Some(low)) => {
                    out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                    index += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            _ => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8(out).ok()
}

fn path_loc(name: &str) -> Loc {
    Loc::default().at("path").at(name)
}

/// The decoded path parameters of the matched route.
#[derive(Debug, Clone)]
pub struct PathParams(Vec<(String, String)>);

impl FromRequestParts<AppState> for PathParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        let template = parts
            .extensions
            .get::<MatchedPath>()
            .map(|matched| matched.as_str().to_owned())
            .ok_or_else(|| ApiError::Internal("path parameters read outside a route".to_owned()))?;
        let mut params = Vec::new();
        let mut errors = Violations::default();
        for (pattern, raw) in template.split('/').zip(parts.uri.path().split('/')) {
            let Some(name) = pattern.strip_prefix('{').and_then(|p| p.strip_suffix('}')) else {
                continue;
            };
            match percent_decode(raw, false) {
                Some(value) if value.is_empty() => errors.push(Violation::new(
                    &path_loc(name),
                    "string_too_short",
                    "String should have at least 1 character",
                )),
                Some(value) => params.push((name.to_owned(), value)),
                None => errors.push(Violation::new(&path_loc(name), "string_unicode", UNICODE_MSG)),
            }
        }
        errors.finish(Self(params)).map_err(ApiError::Validation)
    }
}

impl PathParams {
    /// The value of path parameter `name` (routes only ask for the names they declare).
    pub fn get(&self, name: &str) -> &str {
        self.0.iter().find(|(key, _)| key == name).map_or("", |(_, value)| value.as_str())
    }
}

/// The query parameters each operation of the OpenAPI document declares, by method and path
/// template (`get /api/v1/beam/{config_id}/logs` → `limit`).
#[derive(Debug, Clone, Default)]
pub struct QueryNames(HashMap<(String, String), Arc<[String]>>);

impl QueryNames {
    /// The declared query parameters of every operation of `doc` (an OpenAPI document).
    pub fn from_openapi(doc: &serde_json::Value) -> Self {
        let mut names = HashMap::new();
        let paths = doc.get("paths").and_then(serde_json::Value::as_object);
        for (path, item) in paths.into_iter().flatten() {
            let Some(operations) = item.as_object() else { continue };
            for (method, operation) in operations {
                let declared: Vec<String> = operation
                    .get("parameters")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|param| param["in"] == "query")
                    .filter_map(|param| param["name"].as_str().map(str::to_owned))
                    .collect();
                names.insert((method.clone(), path.clone()), Arc::from(declared));
            }
        }
        Self(names)
    }

    /// The query parameters of `method path`; `None` for a route the document does not
    /// describe.
    fn of(&self, method: &axum::http::Method, path: &str) -> Option<Arc<[String]>> {
        // axum answers HEAD with the GET handler.
        let method = if method == axum::http::Method::HEAD {
            "get".to_owned()
        } else {
            method.as_str().to_ascii_lowercase()
        };
        self.0.get(&(method, path.to_owned())).cloned()
    }
}

/// The raw query string of a request and the parameters its route declares; see
/// [`Query::parse`].
#[derive(Debug, Clone, Default)]
pub struct Query {
    raw: Option<String>,
    /// `None`: any name is taken (a route outside the OpenAPI document).
    declared: Option<Arc<[String]>>,
}

impl FromRequestParts<AppState> for Query {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let declared = parts
            .extensions
            .get::<MatchedPath>()
            .and_then(|matched| state.query_names.of(&parts.method, matched.as_str()));
        Ok(Self { raw: parts.uri.query().map(str::to_owned), declared })
    }
}

impl Query {
    /// The query's parameters, decoded.
    ///
    /// # Errors
    /// A 422 `string_unicode` at `["query", name]` for each parameter whose name or value
    /// does not decode to UTF-8.
    pub fn parse(&self) -> Result<QueryParams, ApiError> {
        let mut pairs = Vec::new();
        let mut errors = Violations::default();
        for pair in self.raw.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(raw_name, true);
            let value = percent_decode(raw_value, true);
            match (name, value) {
                (Some(name), Some(value)) => pairs.push((name, value)),
                (name, _) => {
                    let name = name.unwrap_or_else(|| raw_name.to_owned());
                    errors.push(Violation::new(&Loc::query(&name), "string_unicode", UNICODE_MSG));
                }
            }
        }
        let params =
            QueryParams { pairs, errors: Violations::default(), declared: self.declared.clone() };
        errors.finish(params).map_err(Into::into)
    }

    /// For a route that reads no query parameter: `Ok` unless the query names one (or does
    /// not decode).
    ///
    /// # Errors
    /// A 422 `extra_forbidden` at `["query", name]` for each parameter given.
    pub fn expect_none(&self) -> Result<(), ApiError> {
        self.parse()?.finish()
    }
}

/// Decoded query parameters, read with typed getters that record a violation for each bad
/// value; [`QueryParams::finish`] reports them all at once.
#[derive(Debug, Default)]
pub struct QueryParams {
    pairs: Vec<(String, String)>,
    errors: Violations,
    declared: Option<Arc<[String]>>,
}

impl QueryParams {
    /// The last value of `name`, as given.
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// Every value of a repeatable parameter, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.pairs.iter().filter(|(key, _)| key == name).map(|(_, value)| value.as_str()).collect()
    }

    /// Records a violation of `name` (for rules the getters do not know).
    pub fn reject(&mut self, name: &str, kind: &str, msg: impl Into<String>) {
        self.errors.push(Violation::new(&Loc::query(name), kind, msg));
    }

    /// An optional integer within `min..=max`.
    pub fn int(&mut self, name: &str, min: i64, max: i64) -> Option<i64> {
        let text = self.raw(name)?;
        let Ok(number) = text.trim().parse::<i128>() else {
            self.reject(
                name,
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            );
            return None;
        };
        if number < i128::from(min) {
            self.reject(
                name,
                "greater_than_equal",
                format!("Input should be greater than or equal to {min}"),
            );
            None
        } else if number > i128::from(max) {
            self.reject(
                name,
                "less_than_equal",
                format!("Input should be less than or equal to {max}"),
            );
            None
        } else {
            i64::try_from(number).ok()
        }
    }

    /// An optional non-negative integer up to `max`.
    pub fn uint(&mut self, name: &str, max: u64) -> Option<u64> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.int(name, 0, max).and_then(|n| u64::try_from(n).ok())
    }

    /// An optional boolean: exactly `true` or `false`, as the OpenAPI document's `boolean`
    /// is written in a query string.
    pub fn bool(&mut self, name: &str) -> Option<bool> {
        let text = self.raw(name)?;
        match text {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                self.reject(
                    name,
                    "bool_parsing",
                    "Input should be a valid boolean, unable to interpret input",
                );
                None
            }
        }
    }

    /// An optional value that must be one of `allowed`.
    pub fn one_of(&mut self, name: &str, allowed: &[&'static str]) -> Option<&'static str> {
        let text = self.raw(name)?;
        if let Some(found) = allowed.iter().find(|a| **a == text) {
            return Some(found);
        }
        self.reject(name, "enum", format!("Input should be {}", enum_words(allowed)));
        None
    }

    /// An optional string of at least `min_chars` characters.
    pub fn string(&mut self, name: &str, min_chars: usize) -> Option<String> {
        let text = self.raw(name)?.to_owned();
        if text.chars().count() < min_chars {
            let s = if min_chars == 1 { "" } else { "s" };
            self.reject(
                name,
                "string_too_short",
                format!("String should have at least {min_chars} character{s}"),
            );
            return None;
        }
        Some(text)
    }

    /// A required string of at least `min_chars` characters.
    pub fn required_string(&mut self, name: &str, min_chars: usize) -> Option<String> {
        if self.raw(name).is_none() {
            self.errors.push(Violation::missing(&Loc::query(name)));
            return None;
        }
        self.string(name, min_chars)
    }

    /// `Ok` when every value read was valid and every parameter given is one the route
    /// declares.
    ///
    /// # Errors
    /// Every recorded violation, and an `extra_forbidden` at `["query", name]` for each
    /// parameter the route does not declare, as one 422.
    pub fn finish(&mut self) -> Result<(), ApiError> {
        if let Some(declared) = &self.declared {
            let mut unknown: Vec<&str> = Vec::new();
            for (name, _) in &self.pairs {
                if !declared.iter().any(|known| known == name) && !unknown.contains(&name.as_str())
                {
                    unknown.push(name);
                }
            }
            let msg = unknown_msg(declared);
            for name in unknown {
                self.errors.push(Violation::new(&Loc::query(name), "extra_forbidden", &msg));
            }
        }
        std::mem::take(&mut self.errors).finish(()).map_err(ApiError::Validation)
    }
}

/// pydantic's message for a field it does not know, with the names the route does take.
fn unknown_msg(declared: &[String]) -> String {
    let quoted: Vec<String> = declared.iter().map(|name| format!("'{name}'")).collect();
    match quoted.split_last() {
        None => {
            "Extra inputs are not permitted: this endpoint takes no query parameters".to_owned()
        }
        Some((last, [])) => {
            format!(
                "Extra inputs are not permitted: this endpoint's only query parameter is {last}"
            )
        }
        Some((last, rest)) => format!(
            "Extra inputs are not permitted: this endpoint's query parameters are {} and {last}",
            rest.join(", ")
        ),
    }
}

/// `'a', 'b' or 'c'`, as pydantic lists an enum's members.
pub fn enum_words(allowed: &[&str]) -> String {
    let quoted: Vec<String> = allowed.iter().map(|a| format!("'{a}'")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The `loc` of a path parameter, for handlers' own path rules.
pub fn path_param_loc(name: &str) -> Loc {
    path_loc(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_is_strict_about_utf8() {
        assert_eq!(percent_decode("a%20b+c", true).as_deref(), Some("a b c"));
        assert_eq!(percent_decode("a+b", false).as_deref(), Some("a+b"));
        assert_eq!(percent_decode("%C3%A9", false).as_deref(), Some("é"));
        assert_eq!(percent_decode("100%", false).as_deref(), Some("100%"));
        assert_eq!(percent_decode("%FF%FE", true), None);
    }

    #[test]
    fn the_unknown_parameter_message_names_what_the_route_takes() {
        let declared = ["cursor".to_owned(), "count".to_owned()];
        assert_eq!(
            unknown_msg(&declared),
            "Extra inputs are not permitted: this endpoint's query parameters are 'cursor' and 'count'"
        );
        assert!(unknown_msg(&declared[..1]).ends_with("only query parameter is 'cursor'"));
        assert!(unknown_msg(&[]).ends_with("takes no query parameters"));
    }

    #[test]
    fn declared_names_come_from_the_document_by_method_and_path() {
        let doc = serde_json::json!({"paths": {"/a/{id}": {
            "get": {"parameters": [{"name": "id", "in": "path"}, {"name": "limit", "in": "query"}]},
            "delete": {}
        }}});
        let names = QueryNames::from_openapi(&doc);
        let get = names.of(&axum::http::Method::GET, "/a/{id}").unwrap();
        assert_eq!(&*get, ["limit".to_owned()]);
        assert_eq!(&*names.of(&axum::http::Method::HEAD, "/a/{id}").unwrap(), &*get);
        assert!(names.of(&axum::http::Method::DELETE, "/a/{id}").unwrap().is_empty());
        assert!(names.of(&axum::http::Method::GET, "/b").is_none());
    }

    #[test]
    fn enums_are_listed_as_pydantic_does() {
        assert_eq!(enum_words(&["1h", "1d", "1w"]), "'1h', '1d' or '1w'");
        assert_eq!(enum_words(&["x"]), "'x'");
    }
}
