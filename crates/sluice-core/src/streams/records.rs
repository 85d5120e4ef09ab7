//! Records that passed a chain stream's checks: [`StreamRecord`], parsed from JSON text or a
//! map, and [`RecordWriter`], which writes one field by field for the chain ingesters. Both
//! check a record against its entity's schema in the parent module.

use serde_json::{Map, Value};

use super::{
    EntitySchema, RecordError, entity_schema, event_time, parse_time_text, push_key_part,
    record_key, time_value,
};

/// Why a record cannot enter a chain stream. The record's fault: sending it again as it is
/// cannot help.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRecord {
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    #[error("a record must be a JSON object")]
    NotObject,
    /// Readers disagree on which copy of a repeated key counts (see [`crate::json`]).
    #[error("duplicate key {}", crate::json::describe_path(path))]
    DuplicateKey { path: Vec<crate::validation::LocItem> },
    #[error(transparent)]
    Key(#[from] RecordError),
    #[error("{field} is missing or not a valid time")]
    Time { field: &'static str },
}

/// A record that may enter a chain stream: one JSON object without repeated keys, with the
/// key and time fields its entity defines. The only ways to build one are
/// [`StreamRecord::parse`], [`StreamRecord::from_object`] and [`RecordWriter`], so whatever
/// appends to a chain stream (`Runtime::ingest`) takes records that passed these checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    entity: &'static str,
    key: String,
    value: Vec<u8>,
}

impl StreamRecord {
    /// Checks the JSON text `value` as a record of `entity` and keys it; `value` is kept as
    /// sent, byte for byte.
    ///
    /// # Errors
    /// [`InvalidRecord`]: malformed JSON, not an object, a repeated key at any depth, a
    /// missing or invalid key field, a missing or invalid time.
    pub fn parse(entity: &str, value: &[u8]) -> Result<Self, InvalidRecord> {
        // Every byte is checked as `json::parse` checks it; only the fields the checks read
        // are built (a map of every field cost more than the rest of a Kafka source's work).
        let object = match crate::json::parse_picked(value, checked_paths(entity)) {
            Ok(Value::Object(object)) => object,
            Ok(_) => return Err(InvalidRecord::NotObject),
            Err(crate::json::JsonError::DuplicateKey { path }) => {
                return Err(InvalidRecord::DuplicateKey { path });
            }
            Err(crate::json::JsonError::Syntax(error)) => return Err(InvalidRecord::Json(error)),
        };
        Self::checked(entity, &object, value.to_vec())
    }

    /// A record built in memory (a generator's): a map holds each key once, so only the
    /// entity's fields are checked.
    ///
    /// # Errors
    /// A missing or invalid key field, a missing or invalid time.
    pub fn from_object(entity: &str, object: &Map<String, Value>) -> Result<Self, InvalidRecord> {
        let value = serde_json::to_vec(object).map_err(InvalidRecord::Json)?;
        Self::checked(entity, object, value)
    }

    /// A record whose JSON text the caller wrote itself (an ingester writing a wrapped
    /// record field by field). `fields` holds the entity's key fields and time field with the
    /// values the text holds (bare or under the envelope), and only they are checked: the
    /// caller answers for the text being one JSON object, its keys in ascending order and
    /// each written once, as [`StreamRecord::from_object`] writes them.
    ///
    /// # Errors
    /// A missing or invalid key field, a missing or invalid time.
    pub fn written(
        entity: &str,
        text: Vec<u8>,
        fields: &Map<String, Value>,
    ) -> Result<Self, InvalidRecord> {
        Self::checked(entity, fields, text)
    }

    fn checked(
        entity: &str,
        object: &Map<String, Value>,
        value: Vec<u8>,
    ) -> Result<Self, InvalidRecord> {
        let key = record_key(entity, object)?;
        let schema = entity_schema(entity)
            .ok_or_else(|| RecordError::UnknownEntity { entity: entity.into() })?;
        if event_time(entity, object).is_none() {
            return Err(InvalidRecord::Time { field: schema.time_field });
        }
        Ok(Self { entity: schema.entity, key, value })
    }

    /// The entity this record was checked as.
    pub fn entity(&self) -> &'static str {
        self.entity
    }

    /// The record's stable key ([`record_key`]).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The record's JSON text.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The key and the JSON text, for appending.
    pub fn into_parts(self) -> (String, Vec<u8>) {
        (self.key, self.value)
    }
}

/// The fields [`StreamRecord::checked`] reads of an `entity` record: its key fields and time
/// field, at the top and under the envelope (nothing for an entity without a schema).
fn checked_paths(entity: &str) -> &'static crate::json::Paths {
    static PATHS: std::sync::OnceLock<Vec<crate::json::Paths>> = std::sync::OnceLock::new();
    static NONE: crate::json::Paths = crate::json::Paths::new();
    let all = PATHS.get_or_init(|| {
        super::entity_schemas()
            .iter()
            .map(|schema| {
                let mut paths = crate::json::Paths::default();
                for field in schema.key_fields.iter().chain([&schema.time_field]) {
                    paths.add(field);
                    if let Some(envelope) = schema.envelope {
                        paths.add(&format!("{envelope}.{field}"));
                    }
                }
                paths
            })
            .collect()
    });
    match super::entity_schemas().iter().position(|schema| schema.entity == entity) {
        Some(index) => &all[index],
        None => &NONE,
    }
}

/// Writes one record's JSON object field by field, for producers that know their fields (the
/// chain ingesters): no `Map` per record. Fields go in ascending name order, as serde_json
/// writes a [`Map`], so the text is byte for byte what [`StreamRecord::from_object`] makes of
/// the same fields, and each key is written once. [`RecordWriter::finish`] applies the same
/// checks: the entity's key fields (a non-empty string or an integer) and its time.
#[derive(Debug)]
pub struct RecordWriter {
    schema: &'static EntitySchema,
    text: Vec<u8>,
    last: Option<&'static str>,
    order_error: Option<&'static str>,
    /// Each key field's part of the key, once written.
    key_parts: Vec<Option<String>>,
    time_ok: Option<bool>,
}

impl RecordWriter {
    /// # Errors
    /// [`RecordError::UnknownEntity`], and for entities whose records are wrapped in an
    /// envelope (their fields are not all at the top level).
    pub fn new(entity: &str) -> Result<Self, InvalidRecord> {
        Self::with_capacity(entity, 640)
    }

    /// [`RecordWriter::new`] with room for a record of about `bytes` (large records grow
    /// their text once, not by doubling).
    ///
    /// # Errors
    /// As [`RecordWriter::new`].
    pub fn with_capacity(entity: &str, bytes: usize) -> Result<Self, InvalidRecord> {
        let schema = entity_schema(entity)
            .filter(|schema| schema.envelope.is_none())
            .ok_or_else(|| RecordError::UnknownEntity { entity: entity.into() })?;
        let mut text = Vec::with_capacity(bytes);
        text.push(b'{');
        Ok(Self {
            schema,
            text,
            last: None,
            order_error: None,
            key_parts: vec![None; schema.key_fields.len()],
            time_ok: None,
        })
    }

    fn name(&mut self, name: &'static str) {
        if self.last.is_some_and(|last| last >= name) {
            self.order_error.get_or_insert(name);
        }
        if self.last.is_some() {
            self.text.push(b',');
        }
        self.last = Some(name);
        write_json(&mut self.text, name);
        self.text.push(b':');
    }

    fn key_part(&mut self, name: &str, part: impl FnOnce() -> Option<String>) {
        if let Some(index) = self.schema.key_fields.iter().position(|field| *field == name) {
            self.key_parts[index] = Some(part().unwrap_or_default());
        }
    }

    /// A string field.
    pub fn str(&mut self, name: &'static str, value: &str) {
        self.name(name);
        write_json(&mut self.text, value);
        self.key_part(name, || {
            let mut key = String::new();
            push_key_part(&mut key, value);
            Some(key)
        });
        if name == self.schema.time_field {
            self.time_ok = Some(parse_time_text(value).is_some());
        }
    }

    /// A string field, or `null`.
    pub fn opt_str(&mut self, name: &'static str, value: Option<&str>) {
        match value {
            Some(value) => self.str(name, value),
            None => {
                self.name(name);
                self.text.extend_from_slice(b"null");
                self.key_part(name, || None);
                if name == self.schema.time_field {
                    self.time_ok = Some(false);
                }
            }
        }
    }

    /// An integer field.
    pub fn u64(&mut self, name: &'static str, value: u64) {
        self.name(name);
        write_json(&mut self.text, &value);
        self.key_part(name, || Some(value.to_string()));
        if name == self.schema.time_field {
            self.time_ok = Some(time_value(self.schema.entity, &Value::from(value)).is_some());
        }
    }

    /// A number field (JSON has no NaN or infinity: those are written `null`, as serde_json
    /// writes them).
    pub fn f64(&mut self, name: &'static str, value: f64) {
        self.name(name);
        write_json(&mut self.text, &value);
        self.key_part(name, || None);
        if name == self.schema.time_field {
            self.time_ok = Some(false);
        }
    }

    /// A field of any JSON value (an object or an array, say); not a key or time field.
    pub fn json(&mut self, name: &'static str, value: &Value) {
        self.name(name);
        write_json(&mut self.text, value);
        self.key_part(name, || None);
        if name == self.schema.time_field {
            self.time_ok = Some(time_value(self.schema.entity, value).is_some());
        }
    }

    /// A field of any serializable value (a derived struct, a list of them); not a key or
    /// time field. `T` must write each object key once, as derived `Serialize` impls and maps
    /// do: the ingest rule against repeated keys is not checked again here.
    pub fn serialize<T: serde::Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        self.name(name);
        write_json(&mut self.text, value);
        self.key_part(name, || None);
        if name == self.schema.time_field {
            self.time_ok = Some(false);
        }
    }

    /// A field whose value `write` appends to the record's text itself, for a producer with
    /// its own writer for a large nested value (the Solana ingester's instructions, say);
    /// not a key or time field. `write` must append exactly one JSON value in serde_json's
    /// compact form, each object key once and in ascending order (so the text stays what
    /// [`RecordWriter::serialize`] would write): it is not parsed again here.
    pub fn raw(&mut self, name: &'static str, write: impl FnOnce(&mut Vec<u8>)) {
        self.name(name);
        write(&mut self.text);
        self.key_part(name, || None);
        if name == self.schema.time_field {
            self.time_ok = Some(false);
        }
    }

    /// The record, checked.
    ///
    /// # Errors
    /// A missing or invalid key field, a missing or invalid time; a field written out of
    /// order or twice ([`InvalidRecord::DuplicateKey`]).
    pub fn finish(mut self) -> Result<StreamRecord, InvalidRecord> {
        let entity = self.schema.entity;
        if let Some(name) = self.order_error {
            return Err(InvalidRecord::DuplicateKey {
                path: vec![crate::validation::LocItem::Field(name.to_owned())],
            });
        }
        let mut key = String::with_capacity(80);
        for (index, (&field, part)) in
            self.schema.key_fields.iter().zip(&self.key_parts).enumerate()
        {
            let part = part
                .as_ref()
                .ok_or(RecordError::MissingKeyField { entity: entity.into(), field })?;
            if part.is_empty() {
                return Err(RecordError::InvalidKeyField {
                    entity: entity.into(),
                    field,
                    value: Value::String(String::new()),
                }
                .into());
            }
            if index > 0 {
                key.push(':');
            }
            key.push_str(part);
        }
        if self.time_ok != Some(true) {
            return Err(InvalidRecord::Time { field: self.schema.time_field });
        }
        self.text.push(b'}');
        Ok(StreamRecord { entity, key, value: self.text })
    }
}

fn write_json<T: serde::Serialize + ?Sized>(text: &mut Vec<u8>, value: &T) {
    serde_json::to_writer(text, value).expect("strings and numbers always serialize");
}
