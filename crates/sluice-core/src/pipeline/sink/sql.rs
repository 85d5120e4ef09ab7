//! The `postgres` and `mysql` sinks' configuration: a table in the user's own database,
//! written exactly once (docs/sinks.md "PostgreSQL and MySQL").

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

use super::SinkFields;
use crate::validation::Violation;

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SqlWriteMode {
    /// Every record is a new row (append).
    #[default]
    Insert,
    /// One row per record key: a record with a key already in the table replaces its row.
    Upsert,
}

/// Which columns a row has besides the record key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SqlColumns {
    /// Typed columns from the stream's schema (docs/streams.md), the rest in one JSON column.
    #[default]
    Auto,
    /// Record field (a dotted path reads a nested field) → column name.
    Mapped(BTreeMap<String, String>),
}

impl Serialize for SqlColumns {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => serializer.serialize_str("auto"),
            Self::Mapped(map) => map.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for SqlColumns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Word(String),
            Map(BTreeMap<String, String>),
        }
        match Given::deserialize(deserializer)? {
            Given::Word(word) if word == "auto" => Ok(Self::Auto),
            Given::Word(word) => Err(serde::de::Error::custom(format!(
                "columns must be \"auto\" or an object, not {word:?}"
            ))),
            Given::Map(map) => Ok(Self::Mapped(map)),
        }
    }
}

/// `postgres` or `mysql`: rows in a table of the user's database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SqlSinkConfig {
    pub name: String,
    /// Organization secret holding the database URL (`postgres://…` or `mysql://…`).
    pub connection: String,
    /// PostgreSQL schema (default `public`) or MySQL database (default the URL's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    pub table: String,
    /// `insert` (default) or `upsert` (by the record key).
    #[serde(default)]
    pub mode: SqlWriteMode,
    /// Create the table (and the offsets table) when missing; default true.
    #[serde(default = "yes")]
    pub create_table: bool,
    /// `"auto"` (default) or `{"record field": "column"}`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub columns: SqlColumns,
    #[schema(required = false)]
    pub uid: String,
}

fn yes() -> bool {
    true
}

/// Longest table, schema or column name (PostgreSQL's limit; MySQL's is 64).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Column names a sink keeps for itself.
pub const RESERVED_COLUMNS: [&str; 2] = ["key", "extra"];

/// Whether `name` is a plain SQL identifier: a letter or `_`, then letters, digits or `_`.
///
/// # Errors
/// What is wrong with it.
pub fn check_identifier(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || name.len() > MAX_IDENTIFIER_LEN {
        return Err(format!(
            "must be 1 to {MAX_IDENTIFIER_LEN} characters starting with a letter or '_'"
        ));
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and '_' are allowed".to_owned());
    }
    Ok(())
}

const MODES: [&str; 2] = ["insert", "upsert"];

impl<'a> SinkFields<'_, 'a> {
    fn identifier(&mut self, field: &'a str, required: bool) -> Option<String> {
        let name = if required { Some(self.required(field)) } else { self.optional(field) };
        let name = name.filter(|name| !name.is_empty())?;
        match check_identifier(&name) {
            Ok(()) => Some(name),
            Err(msg) => {
                self.fail(field, msg);
                None
            }
        }
    }

    fn columns(&mut self) -> SqlColumns {
        let loc = self.loc("columns");
        let Some(value) = self.fields.get("columns") else { return SqlColumns::Auto };
        let map = match value {
            serde_json::Value::String(word) if word == "auto" => return SqlColumns::Auto,
            serde_json::Value::Object(map) if !map.is_empty() => map,
            _ => {
                self.fail(
                    "columns",
                    "must be \"auto\" or an object {\"record field\": \"column\"}",
                );
                return SqlColumns::Auto;
            }
        };
        let mut mapped = BTreeMap::new();
        let mut used = std::collections::HashSet::new();
        for (field, column) in map {
            let at = loc.at(field.as_str());
            let path_ok = !field.is_empty()
                && field.split('.').all(|part| {
                    !part.is_empty()
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                });
            let problem = match column.as_str() {
                None => Some("must be a column name (a string)".to_owned()),
                Some(_) if !path_ok => Some(
                    "the record field must be a name or a dotted path of names (letters, digits, '_', '-')"
                        .to_owned(),
                ),
                Some(name) => match check_identifier(name) {
                    Err(msg) => Some(format!("column name {msg}")),
                    Ok(()) if RESERVED_COLUMNS.contains(&name.to_ascii_lowercase().as_str()) => {
                        Some(format!("column name '{name}' is the sink's own; use another"))
                    }
                    Ok(()) if !used.insert(name.to_ascii_lowercase()) => {
                        Some(format!("column '{name}' is mapped twice"))
                    }
                    Ok(()) => None,
                },
            };
            match problem {
                Some(msg) => {
                    self.errors.push(Violation::value(&at, msg));
                    self.failed = true;
                }
                None => {
                    mapped.insert(field.clone(), column.as_str().unwrap_or_default().to_owned());
                }
            }
        }
        SqlColumns::Mapped(mapped)
    }

    /// The fields of a `postgres` or `mysql` sink.
    pub fn sql(&mut self, name: String, uid: String) -> SqlSinkConfig {
        let connection = self.secret("connection", true).unwrap_or_default();
        let schema = self.identifier("schema", false);
        let table = self.identifier("table", true).unwrap_or_default();
        let mode = match self.choice("mode", &MODES, "insert").as_str() {
            "upsert" => SqlWriteMode::Upsert,
            _ => SqlWriteMode::Insert,
        };
        let create_table = match self.fields.optional_bool("create_table", self.errors) {
            Ok(given) => given.unwrap_or(true),
            Err(_) => {
                self.failed = true;
                true
            }
        };
        let columns = self.columns();
        SqlSinkConfig { name, connection, schema, table, mode, create_table, columns, uid }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain_names() {
        assert!(check_identifier("transfers_2").is_ok());
        assert!(check_identifier("_x").is_ok());
        assert!(check_identifier("2x").is_err());
        assert!(check_identifier("a-b").is_err());
        assert!(check_identifier("a\"; drop table x; --").is_err());
        assert!(check_identifier(&"a".repeat(64)).is_err());
    }

    #[test]
    fn columns_round_trip_as_auto_or_a_mapping() {
        let auto: SqlColumns = serde_json::from_str("\"auto\"").unwrap();
        assert_eq!(auto, SqlColumns::Auto);
        assert_eq!(serde_json::to_string(&auto).unwrap(), "\"auto\"");
        let mapped: SqlColumns = serde_json::from_str(r#"{"amount_str": "amount"}"#).unwrap();
        assert_eq!(serde_json::to_string(&mapped).unwrap(), r#"{"amount_str":"amount"}"#);
        assert!(serde_json::from_str::<SqlColumns>("\"all\"").is_err());
    }
}
