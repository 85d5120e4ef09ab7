//! A SQL sink's table layout and the rows it makes of records (docs/sinks.md "Table
//! layout"): the record key, then typed columns (from the stream's schema with `columns:
//! "auto"`, or the user's mapping), then what else the record carries as JSON.

use std::borrow::Cow;
use std::collections::HashSet;

use chrono::{DateTime, TimeZone, Utc};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sluice_core::pipeline::{SqlColumns, SqlSinkConfig, SqlWriteMode};
use sluice_core::streams::{self, EntitySchema, TimeUnit};

/// The SQL type of a column, spelled by each database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// The record key (the primary key in `upsert` mode).
    Key,
    BigInt,
    Double,
    Bool,
    Text,
    /// An exact decimal (`numeric` in PostgreSQL; text in MySQL, whose DECIMAL cannot hold a
    /// uint256).
    Numeric,
    Timestamp,
    Json,
}

/// Where a column's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Key,
    /// A field of the record (a dotted path reads nested objects).
    Field(Vec<String>),
    /// The entity's event time.
    Time,
    /// The fields the layout has no column for, as one object (`None` when there are none).
    Extra,
    /// The whole record.
    Record,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
    source: Source,
}

/// One value of a row, already checked against its column's type. Text is borrowed from
/// the record's bytes where the record holds it as it is (a JSON string without escapes),
/// so a row costs no copy of its text before the database's format is written.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    Null,
    Int(i64),
    Float(f64),
    Bool(bool),
    /// Text, a key, or a decimal number's digits.
    Text(Cow<'a, str>),
    Time(DateTime<Utc>),
    /// A JSON document, serialized.
    Json(Cow<'a, str>),
}

/// The table a sink writes and how records become its rows.
#[derive(Debug, Clone)]
pub struct Layout {
    pub schema: Option<String>,
    pub table: String,
    pub mode: SqlWriteMode,
    pub columns: Vec<Column>,
    entity: String,
    time_unit: TimeUnit,
    envelope: Option<&'static str>,
    /// Top-level names of the fields that have a column of their own.
    covered: HashSet<String>,
    /// The column holding a record's block hash, which reorg markers delete by.
    pub block_hash: Option<BlockHash>,
    /// Every column reads the key, one top-level field, or the fields left over, of records
    /// without an envelope: [`Layout::convert`] can read the record's fields borrowed.
    flat: bool,
    /// Of a flat layout: each top-level field with a column, and that column's index, sorted
    /// by name (a record's fields are found by a binary search, not a scan per column).
    flat_fields: Vec<(String, usize)>,
}

/// How a reorg marker finds the rows of its block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockHash {
    /// A column of its own.
    Column(String),
    /// The `block_hash` field inside this JSON column.
    InJson(String),
}

/// What a record is for the sink.
#[derive(Debug, Clone, PartialEq)]
pub enum Converted<'a> {
    Row {
        key: &'a str,
        cells: Vec<Cell<'a>>,
    },
    /// A reorg marker: the rows of this block hash are void.
    Orphaned(String),
}

fn column_type(description: &str) -> ColumnType {
    let starts = |prefix: &str| description.starts_with(prefix);
    if starts("string, RFC 3339") || starts("integer, Unix milliseconds") {
        ColumnType::Timestamp
    } else if starts("integer") {
        ColumnType::BigInt
    } else if starts("number") {
        ColumnType::Double
    } else if starts("boolean") {
        ColumnType::Bool
    } else if starts("string, decimal") {
        ColumnType::Numeric
    } else if starts("object") || starts("array") {
        ColumnType::Json
    } else {
        ColumnType::Text
    }
}

fn column(name: &str, ty: ColumnType, source: Source) -> Column {
    Column { name: name.to_owned(), ty, source }
}

impl Layout {
    /// The layout of `config`'s table for records of `entity`.
    pub fn new(config: &SqlSinkConfig, entity: &str) -> Self {
        let schema = streams::entity_schema(entity);
        let mut columns = vec![column("key", ColumnType::Key, Source::Key)];
        let mut covered = HashSet::new();
        match (&config.columns, schema) {
            (SqlColumns::Auto, Some(schema)) => {
                for (field, description) in schema.fields {
                    covered.insert((*field).to_owned());
                    let source = Source::Field(vec![(*field).to_owned()]);
                    columns.push(column(field, column_type(description), source));
                }
                columns.push(column("extra", ColumnType::Json, Source::Extra));
            }
            (SqlColumns::Auto, None) => {
                columns.push(column("time", ColumnType::Timestamp, Source::Time));
                columns.push(column("record", ColumnType::Json, Source::Record));
            }
            (SqlColumns::Mapped(mapped), schema) => {
                for (field, name) in mapped {
                    let path: Vec<String> = field.split('.').map(str::to_owned).collect();
                    let ty = schema
                        .and_then(|schema| schema.fields.iter().find(|(f, _)| *f == field.as_str()))
                        .map_or(ColumnType::Json, |(_, description)| column_type(description));
                    covered.insert(path[0].clone());
                    columns.push(column(name, ty, Source::Field(path)));
                }
            }
        }
        let block_hash = columns
            .iter()
            .find(|c| c.source == Source::Field(vec!["block_hash".to_owned()]))
            .map(|c| BlockHash::Column(c.name.clone()))
            .or_else(|| {
                columns
                    .iter()
                    .find(|c| c.source == Source::Record)
                    .map(|c| BlockHash::InJson(c.name.clone()))
            });
        let flat = schema.is_none_or(|s| s.envelope.is_none())
            && columns.iter().all(|c| match &c.source {
                Source::Key | Source::Extra => true,
                Source::Field(path) => path.len() == 1,
                Source::Time | Source::Record => false,
            });
        let mut flat_fields: Vec<(String, usize)> = columns
            .iter()
            .enumerate()
            .filter_map(|(index, c)| match &c.source {
                Source::Field(path) if path.len() == 1 => Some((path[0].clone(), index)),
                _ => None,
            })
            .collect();
        flat_fields.sort();
        Self {
            flat,
            flat_fields,
            schema: config.schema.clone(),
            table: config.table.clone(),
            mode: config.mode,
            columns,
            entity: entity.to_owned(),
            time_unit: schema.map_or(TimeUnit::Seconds, |s: &EntitySchema| s.time_unit),
            envelope: schema.and_then(|s| s.envelope),
            covered,
            block_hash,
        }
    }

    /// The names of the columns, in order.
    pub fn column_names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }

    /// What `value` (a record with stream key `key`) becomes.
    ///
    /// # Errors
    /// Why the record cannot be a row (a value its column's type cannot hold); the record is
    /// dead-lettered with it.
    pub fn convert<'a>(&self, key: &'a [u8], value: &'a [u8]) -> Result<Converted<'a>, String> {
        let key = std::str::from_utf8(key).map_err(|_| "the record key is not UTF-8")?;
        if self.flat {
            // The fields borrowed from the record's bytes, each parsed only as far as its
            // column needs; anything else (not an object, a key with escapes, a reorg
            // marker) takes the full parse below, which says what is wrong.
            if let Ok(Flat(fields)) = serde_json::from_slice::<Flat<'_>>(value) {
                let is_marker = field(&fields, "reorg").is_some_and(|raw| raw.get() == "true");
                if !is_marker || self.block_hash.is_none() {
                    return self.flat_row(key, &fields);
                }
            }
        }
        let record: Value =
            serde_json::from_slice(value).map_err(|e| format!("the record is not JSON: {e}"))?;
        if let Some(hash) = reorg_marker(&record).filter(|_| self.block_hash.is_some()) {
            return Ok(Converted::Orphaned(hash));
        }
        let top = record.as_object();
        let fields = match (self.envelope, top) {
            (Some(envelope), Some(top)) => {
                top.get(envelope).and_then(Value::as_object).or(Some(top))
            }
            (_, top) => top,
        };
        let needs_object = self.columns.iter().any(|c| matches!(c.source, Source::Field(_)));
        if needs_object && fields.is_none() {
            return Err("the record is not a JSON object".to_owned());
        }
        let mut cells = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            let cell = match &column.source {
                Source::Key => Cell::Text(Cow::Borrowed(key)),
                Source::Field(path) => {
                    let found = fields.and_then(|fields| lookup(fields, path));
                    self.cell(column, found.unwrap_or(&Value::Null))?
                }
                Source::Time => top
                    .and_then(|top| streams::event_time(&self.entity, top))
                    .map_or(Cell::Null, Cell::Time),
                Source::Extra => self.extra(top, fields),
                Source::Record => Cell::Json(Cow::Owned(json_text(&record)?)),
            };
            cells.push(cell);
        }
        Ok(Converted::Row { key, cells })
    }

    /// The block hash `value` voids, when it is a reorg marker of a layout whose rows know
    /// their block. Only a record whose bytes can spell a `reorg` field (as such, or behind a
    /// `\u` escape, the only JSON escape that makes letters) is parsed.
    pub fn marker(&self, key: &[u8], value: &[u8]) -> Option<String> {
        let spelled = |needle: &[u8]| memchr::memmem::find(value, needle).is_some();
        if self.block_hash.is_none() || !(spelled(b"reorg") || spelled(b"\\u")) {
            return None;
        }
        match self.convert(key, value) {
            Ok(Converted::Orphaned(hash)) => Some(hash),
            _ => None,
        }
    }

    /// The row of a record whose top-level fields are `fields` ([`Layout::flat`]).
    fn flat_row<'a>(
        &self,
        key: &'a str,
        fields: &[(&'a str, &'a RawValue)],
    ) -> Result<Converted<'a>, String> {
        // Each column's field, the last of its name winning (as a parse into a map keeps).
        let mut found: Vec<Option<&'a RawValue>> = vec![None; self.columns.len()];
        let mut uncovered = false;
        for (name, raw) in fields {
            match self.flat_column(name) {
                Some(index) => found[index] = Some(raw),
                None => uncovered = true,
            }
        }
        let mut cells = Vec::with_capacity(self.columns.len());
        for (column, found) in self.columns.iter().zip(found) {
            let cell = match &column.source {
                Source::Key => Cell::Text(Cow::Borrowed(key)),
                Source::Field(_) => match found {
                    Some(raw) => self.raw_cell(column, raw)?,
                    None => Cell::Null,
                },
                Source::Extra if !uncovered => Cell::Null,
                Source::Extra => {
                    let mut extra = Map::new();
                    for (name, raw) in
                        fields.iter().filter(|(name, _)| self.flat_column(name).is_none())
                    {
                        extra.insert((*name).to_owned(), parse(raw)?);
                    }
                    extra_cell(extra)
                }
                Source::Time | Source::Record => unreachable!("not a flat layout"),
            };
            cells.push(cell);
        }
        Ok(Converted::Row { key, cells })
    }

    /// The index of the column of top-level field `name`, in a flat layout.
    fn flat_column(&self, name: &str) -> Option<usize> {
        self.flat_fields
            .binary_search_by(|(field, _)| field.as_str().cmp(name))
            .ok()
            .map(|at| self.flat_fields[at].1)
    }

    /// [`Layout::cell`] of a value still in its JSON text: strings, integers, floats and
    /// booleans read straight from it, the rest parsed first.
    fn raw_cell<'a>(&self, column: &Column, raw: &'a RawValue) -> Result<Cell<'a>, String> {
        let text = raw.get();
        let quoted = text.starts_with('"');
        let fast = match column.ty {
            ColumnType::Key | ColumnType::Text if quoted => borrowed_str(text)
                .map(|s| plain_text(s, &column.name).map(|s| Cell::Text(Cow::Borrowed(s)))),
            ColumnType::Numeric if quoted => borrowed_str(text).map(|s| {
                if is_decimal(s) {
                    Ok(Cell::Text(Cow::Borrowed(s)))
                } else {
                    self.cell(column, &Value::String(s.to_owned()))
                }
            }),
            ColumnType::Double if !quoted => {
                serde_json::from_str::<f64>(text).ok().map(|n| Ok(Cell::Float(n)))
            }
            // A JSON integer is what `i64`'s parser reads (no sign `+`, no leading zeros).
            ColumnType::BigInt if !quoted => text.parse::<i64>().ok().map(|n| Ok(Cell::Int(n))),
            ColumnType::Timestamp if quoted => borrowed_str(text)
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|at| Ok(Cell::Time(at.to_utc()))),
            ColumnType::Bool if text == "true" || text == "false" => {
                Some(Ok(Cell::Bool(text == "true")))
            }
            _ => None,
        };
        match fast {
            Some(cell) => cell,
            None => self.cell(column, &parse(raw)?),
        }
    }

    /// The fields without a column of their own, as one object (NULL when there are none).
    fn extra(
        &self,
        top: Option<&Map<String, Value>>,
        fields: Option<&Map<String, Value>>,
    ) -> Cell<'static> {
        let mut extra = Map::new();
        if let Some(fields) = fields {
            for (name, value) in fields {
                if !self.covered.contains(name) {
                    extra.insert(name.clone(), value.clone());
                }
            }
        }
        // Beside an envelope: the record's other top-level fields.
        if let (Some(envelope), Some(top)) = (self.envelope, top) {
            if top.get(envelope).is_some_and(Value::is_object) {
                for (name, value) in top {
                    if name != envelope {
                        extra.insert(name.clone(), value.clone());
                    }
                }
            }
        }
        extra_cell(extra)
    }

    fn cell(&self, column: &Column, value: &Value) -> Result<Cell<'static>, String> {
        let wrong = |what: &str| {
            Err(format!("field for column '{}' is {}, expected {what}", column.name, kind(value)))
        };
        if value.is_null() {
            return Ok(Cell::Null);
        }
        match column.ty {
            ColumnType::Key | ColumnType::Text => match value {
                Value::String(text) => {
                    plain_text(text, &column.name).map(|s| Cell::Text(Cow::Owned(s.to_owned())))
                }
                other => json_text(other).map(|s| Cell::Text(Cow::Owned(s))),
            },
            ColumnType::BigInt => match value {
                Value::Number(n) if n.is_i64() => Ok(Cell::Int(n.as_i64().unwrap_or_default())),
                Value::String(text) => match text.parse::<i64>() {
                    Ok(n) => Ok(Cell::Int(n)),
                    Err(_) => wrong("an integer"),
                },
                _ => wrong("an integer"),
            },
            ColumnType::Double => match value {
                Value::Number(n) => Ok(Cell::Float(n.as_f64().unwrap_or_default())),
                Value::String(text) => match text.parse::<f64>() {
                    Ok(n) if n.is_finite() => Ok(Cell::Float(n)),
                    _ => wrong("a number"),
                },
                _ => wrong("a number"),
            },
            ColumnType::Bool => match value {
                Value::Bool(b) => Ok(Cell::Bool(*b)),
                _ => wrong("a boolean"),
            },
            ColumnType::Numeric => {
                let text = match value {
                    Value::String(text) => text.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => return wrong("a decimal number"),
                };
                if is_decimal(&text) {
                    Ok(Cell::Text(Cow::Owned(text)))
                } else {
                    wrong("a decimal number")
                }
            }
            ColumnType::Timestamp => match streams_time(value, self.time_unit) {
                Some(at) => Ok(Cell::Time(at)),
                None => wrong("an RFC 3339 time or a Unix time"),
            },
            ColumnType::Json => json_text(value).map(|s| Cell::Json(Cow::Owned(s))),
        }
    }
}

/// The `extra` column of the fields left over: NULL when there are none.
fn extra_cell(extra: Map<String, Value>) -> Cell<'static> {
    if extra.is_empty() {
        return Cell::Null;
    }
    json_text(&Value::Object(extra)).map_or(Cell::Null, |s| Cell::Json(Cow::Owned(s)))
}

/// A record's top-level fields, borrowed from its bytes, in the order they came.
struct Flat<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for Flat<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Flat<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Flat<'de>, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(entry) = map.next_entry::<&'de str, &'de RawValue>()? {
                    fields.push(entry);
                }
                Ok(Flat(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// The value of field `name` (the last of that name, as a parse into a map keeps).
fn field<'a>(fields: &[(&str, &'a RawValue)], name: &str) -> Option<&'a RawValue> {
    fields.iter().rev().find(|(field, _)| *field == name).map(|(_, raw)| *raw)
}

/// A JSON string without escapes, borrowed; `None` for any other text. `text` is a value
/// the record's parse cut out, checked already: between its quotes, without a backslash
/// (and without a control character, which the parse refuses too), is the string itself.
fn borrowed_str(text: &str) -> Option<&str> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    inner.bytes().all(|b| b != b'\\' && b >= 0x20).then_some(inner)
}

fn parse(raw: &RawValue) -> Result<Value, String> {
    serde_json::from_str(raw.get()).map_err(|e| format!("the record is not JSON: {e}"))
}

/// The block hash of a reorg marker (docs/chains.md "Reorg marker").
fn reorg_marker(record: &Value) -> Option<String> {
    if record.get("reorg") != Some(&Value::Bool(true)) {
        return None;
    }
    record.get("block_hash")?.as_str().map(str::to_owned)
}

fn lookup<'v>(fields: &'v Map<String, Value>, path: &[String]) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(fields.get(first)?, |value, part| value.get(part))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn streams_time(value: &Value, unit: TimeUnit) -> Option<DateTime<Utc>> {
    match value {
        Value::String(text) => DateTime::parse_from_rfc3339(text).ok().map(|at| at.to_utc()),
        Value::Number(n) => {
            let n = n.as_i64()?;
            match unit {
                TimeUnit::Seconds => Utc.timestamp_opt(n, 0).single(),
                TimeUnit::Millis => Utc.timestamp_millis_opt(n).single(),
            }
        }
        _ => None,
    }
}

/// Text no database refuses: without NUL (neither PostgreSQL's text nor its jsonb holds one).
fn plain_text<'t>(text: &'t str, column: &str) -> Result<&'t str, String> {
    if text.contains('\0') {
        return Err(format!("field for column '{column}' holds a NUL character"));
    }
    Ok(text)
}

fn json_text(value: &Value) -> Result<String, String> {
    let text = serde_json::to_string(value).map_err(|e| e.to_string())?;
    if text.contains("\\u0000") {
        return Err("the record holds a NUL character (\\u0000), which jsonb cannot".to_owned());
    }
    Ok(text)
}

/// `[-]digits[.digits][e[±]digits]`.
fn is_decimal(text: &str) -> bool {
    let body = text.strip_prefix('-').unwrap_or(text);
    let (mantissa, exponent) = match body.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (body, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(whole) && digits(fraction) && exponent.is_none_or(digits)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use sluice_core::pipeline::SqlColumns;

    /// A SQL sink of the table `transfers`, inserting, with `columns`.
    pub(crate) fn config(columns: SqlColumns) -> SqlSinkConfig {
        SqlSinkConfig {
            name: "out".to_owned(),
            connection: "DB".to_owned(),
            schema: None,
            table: "transfers".to_owned(),
            mode: SqlWriteMode::Insert,
            create_table: true,
            columns,
            uid: "sk-1".to_owned(),
        }
    }

    #[test]
    fn auto_columns_type_the_schema_fields_and_keep_extras_as_json() {
        let layout = Layout::new(&config(SqlColumns::Auto), "erc20_token_transfer");
        let names: Vec<&str> = layout.column_names().collect();
        assert_eq!(names[0], "key");
        assert_eq!(*names.last().unwrap(), "extra");
        let ty = |name: &str| layout.columns.iter().find(|c| c.name == name).unwrap().ty;
        assert_eq!(ty("block_number"), ColumnType::BigInt);
        assert_eq!(ty("block_timestamp"), ColumnType::Timestamp);
        assert_eq!(ty("raw_amount_str"), ColumnType::Numeric);
        assert_eq!(ty("amount"), ColumnType::Double);
        assert_eq!(ty("token_address"), ColumnType::Text);
        let record = json!({"block_number": 7, "block_timestamp": "2026-11-21T12:00:00Z",
            "raw_amount_str": "1000000", "seen_by": "sluice"});
        let record = record.to_string();
        let Converted::Row { key, cells } = layout.convert(b"0xab:1", record.as_bytes()).unwrap()
        else {
            panic!("a row")
        };
        assert_eq!(key, "0xab:1");
        let cell = |name: &str| &cells[names.iter().position(|n| *n == name).unwrap()];
        assert_eq!(cell("block_number"), &Cell::Int(7));
        assert_eq!(cell("raw_amount_str"), &Cell::Text("1000000".into()));
        assert_eq!(cell("token_name"), &Cell::Null);
        assert_eq!(cell("extra"), &Cell::Json(r#"{"seen_by":"sluice"}"#.into()));
        let bad = json!({"block_number": "seven"});
        let error = layout.convert(b"k", bad.to_string().as_bytes()).unwrap_err();
        assert!(error.contains("block_number"), "{error}");
    }

    #[test]
    fn reorg_markers_name_their_block_and_unknown_entities_keep_the_record() {
        let layout = Layout::new(&config(SqlColumns::Auto), "log");
        let marker = json!({"reorg": true, "block_hash": "0xdead", "block_number": 3});
        let marker = marker.to_string();
        let converted = layout.convert(b"k", marker.as_bytes()).unwrap();
        assert_eq!(converted, Converted::Orphaned("0xdead".to_owned()));
        let layout = Layout::new(&config(SqlColumns::Auto), "not_an_entity");
        assert_eq!(layout.column_names().collect::<Vec<_>>(), ["key", "time", "record"]);
        assert_eq!(layout.block_hash, Some(BlockHash::InJson("record".to_owned())));
    }

    #[test]
    fn the_borrowed_read_makes_the_rows_the_full_parse_makes() {
        let records = [
            r#"{"token_address":"0xA","from_address":"a\tb","raw_amount_str":"12","amount":1.5,"block_number":7,"block_timestamp":"2026-11-21T12:00:00Z","block_hash":"0xh","more":{"b":1,"a":[1, 2]}}"#,
            r#"{"block_number":"8","amount":"2.5","raw_amount_str":12,"block_number":9,"log_index":null}"#,
            r#"{"block_number":1.0}"#,
            r#"{"amount_str":"1e5","raw_amount_str":"x1"}"#,
            r#"{"block_timestamp":1700000000,"transaction_index":true}"#,
            r#"{"token_name":"nul\u0000"}"#,
            r#"{"reorg":true,"block_hash":"0xdead"}"#,
            r#"{"reorg":true}"#,
            r#"{"t\u0065xt":"escaped key","token_symbol":"é"}"#,
            r#"[1,2]"#,
            r#"not json"#,
        ];
        for columns in [
            SqlColumns::Auto,
            SqlColumns::Mapped(
                [("block_number".to_owned(), "n".to_owned()), ("more".to_owned(), "m".to_owned())]
                    .into(),
            ),
        ] {
            let layout = Layout::new(&config(columns), "erc20_token_transfer");
            assert!(layout.flat);
            let full = Layout { flat: false, ..layout.clone() };
            for record in records {
                assert_eq!(
                    layout.convert(b"k", record.as_bytes()),
                    full.convert(b"k", record.as_bytes()),
                    "{record}"
                );
            }
        }
    }

    #[test]
    fn decimals_are_checked_before_the_database_sees_them() {
        for good in ["0", "-12.5", "1e18", "3.0E-2"] {
            assert!(is_decimal(good), "{good}");
        }
        for bad in ["", "1.", ".5", "0x10", "1e", "NaN", "1 2"] {
            assert!(!is_decimal(bad), "{bad}");
        }
    }
}
