//! Backfill jobs (docs/contract.md §Backfill job): export a window of a warehouse table to
//! sinks. The job record, its states and the create body's checks.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::pipeline::validate::{BodyMode, check_filter_path, validate_transform_list};
use crate::pipeline::{SinkConfig, Transform};
use crate::validation::{Fields, Loc, Violation, Violations, as_array, str_array};

/// The one partition key (docs/contract.md §Backfill endpoints).
pub const PARTITION_KEY: &str = "block_timestamp";
/// Most destinations of one job.
pub const MAX_DESTINATIONS: usize = 10;
/// Most filter values of one job.
pub const MAX_FILTER_VALUES: usize = 100_000;
/// Longest job name, in characters.
pub const MAX_JOB_NAME_CHARS: usize = 255;
/// Most transforms of one job.
pub const MAX_TRANSFORMS: usize = 10;

/// A transform of a job, run on every staged row before delivery: a pipeline transform (a
/// set filter or a v8 script); a set filter carries its values, since a job has no
/// filter-values endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type")]
pub enum BackfillTransform {
    /// Passes only rows whose extracted value (lowercased) is one of `set_values`.
    #[serde(rename = "redis_set_filter")]
    SetFilter {
        uid: String,
        /// `root = this.<path>`: the value to test.
        filter_expr: String,
        /// Lowercased and deduplicated; 1 to 100,000.
        set_values: Vec<String>,
    },
    /// A JavaScript function `transform(record)` (needs the organization's
    /// `custom_transforms` feature).
    #[serde(rename = "v8")]
    Script { uid: String, script: String },
}

impl BackfillTransform {
    /// The pipeline transform it runs.
    pub fn transform(&self) -> Transform {
        match self {
            Self::SetFilter { uid, filter_expr, .. } => {
                Transform::SetFilter { uid: uid.clone(), filter_expr: filter_expr.clone() }
            }
            Self::Script { uid, script } => {
                Transform::Script { uid: uid.clone(), script: script.clone() }
            }
        }
    }

    /// A set filter's values; none for a script.
    pub fn set_values(&self) -> &[String] {
        match self {
            Self::SetFilter { set_values, .. } => set_values,
            Self::Script { .. } => &[],
        }
    }
}

/// Where a job is (docs/contract.md §Backfill job states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackfillStatus {
    Staging,
    Transporting,
    Completed,
    Failed,
    Cancelled,
}

impl BackfillStatus {
    pub fn name(self) -> &'static str {
        match self {
            Self::Staging => "staging",
            Self::Transporting => "transporting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Staging, Self::Transporting, Self::Completed, Self::Failed, Self::Cancelled]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// Whether the job still runs (staging or transporting).
    pub fn is_active(self) -> bool {
        matches!(self, Self::Staging | Self::Transporting)
    }
}

/// A backfill job as stored, with every contract field but `time_created` (the API adds it from
/// `created_at`, so jobs stored before it existed need no migration) and ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackfillJob {
    pub job_id: String,
    /// `beam-backfill-<organization_id>-<job_id>`.
    pub workflow_id: String,
    pub organization_id: String,
    pub status: BackfillStatus,
    pub job_name: String,
    pub table: String,
    /// Always `block_timestamp`.
    pub partition_key: String,
    /// Inclusive (RFC 3339).
    #[schema(value_type = String, format = DateTime)]
    #[serde(with = "crate::time::rfc3339")]
    pub backfill_start: DateTime<Utc>,
    /// Exclusive (RFC 3339).
    #[schema(value_type = String, format = DateTime)]
    #[serde(with = "crate::time::rfc3339")]
    pub backfill_end: DateTime<Utc>,
    pub filter_column: Option<String>,
    pub filter_values: Option<Vec<String>>,
    pub destinations: Vec<SinkConfig>,
    pub static_egress_ip: bool,
    /// (ours) Run on every row before delivery, in order; staged chunks hold their output.
    #[serde(default)]
    pub transforms: Vec<BackfillTransform>,
    /// (ours) Rows a script failed on (not delivered); the first error is in
    /// `transform_error`.
    #[serde(default)]
    pub rows_failed: u64,
    /// (ours) The first error of a script, with the transform's uid.
    #[serde(default)]
    pub transform_error: Option<String>,
    /// Chunks staged; null while staging.
    pub num_chunks: Option<u64>,
    /// Chunks still to deliver; counts down to 0.
    pub chunks_left: u64,
    /// Set when `failed`.
    pub error_message: Option<String>,
    /// (ours) Rows written to the staging chunks so far.
    pub rows_staged: u64,
    /// (ours) Rows every destination acknowledged so far.
    pub rows_delivered: u64,
    /// (ours) The user who created it.
    pub created_by: String,
    #[schema(value_type = String, format = DateTime)]
    #[serde(with = "crate::time::rfc3339")]
    pub created_at: DateTime<Utc>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(with = "crate::time::rfc3339")]
    pub updated_at: DateTime<Utc>,
    /// When it completed; null before.
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(with = "crate::time::rfc3339_option")]
    pub time_completed: Option<DateTime<Utc>>,
}

impl BackfillJob {
    /// The workflow id of a job (its shape: docs/contract.md §Backfill job).
    pub fn workflow_id_of(organization_id: &str, job_id: &str) -> String {
        format!("beam-backfill-{organization_id}-{job_id}")
    }
}

/// What the create body asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillRequest {
    pub job_name: String,
    pub table: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub filter: Option<(String, Vec<String>)>,
    pub destinations: Vec<SinkConfig>,
    pub static_egress_ip: bool,
    pub transforms: Vec<BackfillTransform>,
}

/// What validation needs to know of a warehouse table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableCheck {
    /// No such table.
    Unknown,
    /// A table backfills may not read (not a base-chain table).
    NotBackfillable,
    /// A backfillable table with these filterable columns, of records of this entity.
    Columns { columns: Vec<String>, entity: String },
}

/// Checks a create body; `table` answers what the warehouse knows of a table name.
///
/// # Errors
/// Every violation, with `loc` rooted at `["body"]`.
pub fn validate_backfill_body(
    body: &Map<String, Value>,
    table: &dyn Fn(&str) -> TableCheck,
) -> Result<BackfillRequest, Vec<Violation>> {
    let mut errors = Violations::default();
    let mut fields = Fields::new(body, Loc::body());
    let job_name = fields.required_str("job_name", &mut errors);
    if let Some(name) = job_name {
        if name.trim().is_empty() || name.chars().count() > MAX_JOB_NAME_CHARS {
            errors.push(Violation::value(
                &fields.loc("job_name"),
                format!("job_name must be 1 to {MAX_JOB_NAME_CHARS} characters, not blank"),
            ));
        }
    }
    let table_name = fields.required_str("table", &mut errors);
    let columns =
        table_name.and_then(|name| columns(name, table, &fields.loc("table"), &mut errors));
    let window = match fields.get("backfill_window") {
        None => {
            errors.push(Violation::missing(&fields.loc("backfill_window")));
            None
        }
        Some(value) => window(value, fields.loc("backfill_window"), &mut errors),
    };
    let filter = match fields.get("filter") {
        None => Ok(None),
        Some(value) => filter(
            value,
            fields.loc("filter"),
            columns.as_ref().map(|(columns, _)| columns.as_slice()),
            &mut errors,
        ),
    };
    let transforms = match fields.get("transforms") {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(value) => transforms(
            value,
            fields.loc("transforms"),
            columns.as_ref().map(|(_, entity)| entity.as_str()),
            &mut errors,
        ),
    };
    let destinations_loc = fields.loc("destinations");
    let destinations = fields
        .required_array("destinations", &mut errors)
        .and_then(|items| destinations(items, &destinations_loc, &mut errors));
    let static_egress_ip = fields.optional_bool("static_egress_ip", &mut errors);
    fields.finish(&mut errors, |_| None);
    let (
        Some(job_name),
        Some(table_name),
        Some(_),
        Some((start, end)),
        Ok(filter),
        Some(destinations),
        Ok(static_egress_ip),
        Some(transforms),
    ) = (job_name, table_name, columns, window, filter, destinations, static_egress_ip, transforms)
    else {
        return Err(errors.finish(()).err().unwrap_or_default());
    };
    errors.finish(BackfillRequest {
        job_name: job_name.to_owned(),
        table: table_name.to_owned(),
        start,
        end,
        filter,
        destinations,
        static_egress_ip: static_egress_ip.unwrap_or(false),
        transforms,
    })
}

/// The filterable columns and the entity of table `name`, as `table` knows it.
fn columns(
    name: &str,
    table: &dyn Fn(&str) -> TableCheck,
    loc: &Loc,
    errors: &mut Violations,
) -> Option<(Vec<String>, String)> {
    match table(name) {
        TableCheck::Unknown => {
            errors.push(Violation::value(
                loc,
                format!("unknown table '{name}'; GET /backfills/tables lists them"),
            ));
            None
        }
        TableCheck::NotBackfillable => {
            errors.push(Violation::value(loc, "only base-chain tables are supported"));
            None
        }
        TableCheck::Columns { columns, entity } => Some((columns, entity)),
    }
}

/// The `destinations` of a create body: 1 to [`MAX_DESTINATIONS`] sinks, uids unique.
fn destinations(items: &[Value], loc: &Loc, errors: &mut Violations) -> Option<Vec<SinkConfig>> {
    if items.is_empty() || items.len() > MAX_DESTINATIONS {
        errors.push(Violation::value(loc, format!("give 1 to {MAX_DESTINATIONS} destinations")));
    }
    let sinks: Vec<Option<SinkConfig>> = items
        .iter()
        .enumerate()
        .map(|(index, item)| SinkConfig::validate(item, loc.at(index), errors))
        .collect();
    let sinks: Option<Vec<SinkConfig>> = sinks.into_iter().collect();
    if let Some(sinks) = &sinks {
        for (index, sink) in sinks.iter().enumerate() {
            if sinks[..index].iter().any(|other| other.uid() == sink.uid()) {
                errors.push(Violation::value(
                    &loc.at(index).at("uid"),
                    "destination uids must be unique",
                ));
            }
        }
    }
    sinks.filter(|sinks| !sinks.is_empty() && sinks.len() <= MAX_DESTINATIONS)
}

/// The `transforms` of a create body: pipeline transform objects, a set filter with its
/// values inline (`set_values`, required here).
fn transforms(
    value: &Value,
    loc: Loc,
    entity: Option<&str>,
    errors: &mut Violations,
) -> Option<Vec<BackfillTransform>> {
    let items = as_array(value, &loc, errors)?;
    if items.len() > MAX_TRANSFORMS {
        errors.push(Violation::value(&loc, format!("give at most {MAX_TRANSFORMS} transforms")));
        return None;
    }
    let before = errors.len();
    let validated = validate_transform_list(items, &loc, BodyMode::Create, errors)?;
    let mut out = Vec::with_capacity(validated.len());
    for (index, item) in validated.into_iter().enumerate() {
        let at = loc.at(index);
        if let Some(entity) = entity {
            check_filter_path(&item.transform, entity, &at, errors);
        }
        match (item.transform, item.set_values) {
            (Transform::SetFilter { .. }, None) => errors.push(Violation::new(
                &at.at("set_values"),
                "missing",
                "Field required: a backfill's set filter takes its values inline in set_values",
            )),
            (Transform::SetFilter { .. }, Some(values))
                if values.is_empty() || values.len() > MAX_FILTER_VALUES =>
            {
                errors.push(Violation::value(
                    &at.at("set_values"),
                    format!("give 1 to {MAX_FILTER_VALUES} values"),
                ));
            }
            (Transform::SetFilter { uid, filter_expr }, Some(set_values)) => {
                out.push(BackfillTransform::SetFilter { uid, filter_expr, set_values });
            }
            (Transform::Script { uid, script }, _) => {
                out.push(BackfillTransform::Script { uid, script });
            }
        }
    }
    (errors.len() == before).then_some(out)
}

fn window(
    value: &Value,
    loc: Loc,
    errors: &mut Violations,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let mut fields = Fields::of(value, loc, errors)?;
    let key = fields.required_str("partition_key", errors);
    if let Some(key) = key.filter(|key| *key != PARTITION_KEY) {
        errors.push(Violation::value(
            &fields.loc("partition_key"),
            format!("partition_key must be '{PARTITION_KEY}', not '{key}'"),
        ));
    }
    let mut time = |name: &'static str, errors: &mut Violations| {
        let text = fields.required_str(name, errors)?;
        match crate::time::parse(text) {
            Ok(at) => Some(at),
            Err(_) => {
                errors.push(Violation::new(
                    &fields.loc(name),
                    "datetime_from_date_parsing",
                    "Input should be a valid datetime (ISO 8601 with a time zone, e.g. 2026-03-01T00:00:00Z)",
                ));
                None
            }
        }
    };
    let start = time("start", errors);
    let end = time("end", errors);
    let loc_end = fields.loc("end");
    fields.finish(errors, |_| None);
    let (start, end) = (start?, end?);
    if start >= end {
        errors.push(Violation::value(&loc_end, "start must be before end"));
        return None;
    }
    key.filter(|key| *key == PARTITION_KEY)?;
    Some((start, end))
}

fn filter(
    value: &Value,
    loc: Loc,
    columns: Option<&[String]>,
    errors: &mut Violations,
) -> Result<Option<(String, Vec<String>)>, ()> {
    let Some(mut fields) = Fields::of(value, loc, errors) else { return Err(()) };
    let column = fields.required_str("column", errors);
    if let (Some(column), Some(columns)) = (column, columns) {
        if !columns.iter().any(|c| c == column) {
            errors.push(Violation::value(
                &fields.loc("column"),
                format!("the table has no column '{column}'"),
            ));
        }
    }
    let values_loc = fields.loc("values");
    let values = match fields.get("values") {
        None => {
            errors.push(Violation::missing(&values_loc));
            None
        }
        Some(value) => {
            as_array(value, &values_loc, errors).and_then(|_| str_array(value, &values_loc, errors))
        }
    };
    if let Some(values) = &values {
        if values.is_empty() || values.len() > MAX_FILTER_VALUES {
            errors.push(Violation::value(
                &values_loc,
                format!("give 1 to {MAX_FILTER_VALUES} values"),
            ));
        }
    }
    fields.finish(errors, |_| None);
    let valid_column = column.filter(|c| columns.is_some_and(|cs| cs.iter().any(|x| x == c)));
    match (valid_column, values) {
        (Some(column), Some(values)) if !values.is_empty() && values.len() <= MAX_FILTER_VALUES => {
            Ok(Some((column.to_owned(), values.into_iter().map(str::to_lowercase).collect())))
        }
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tables(name: &str) -> TableCheck {
        match name {
            "base.assets.erc20_token_transfers" => TableCheck::Columns {
                columns: vec!["token_address".to_owned(), "block_number".to_owned()],
                entity: "erc20_token_transfer".to_owned(),
            },
            "ethereum.assets.erc20_token_transfers" => TableCheck::NotBackfillable,
            _ => TableCheck::Unknown,
        }
    }

    fn body() -> Value {
        json!({
            "job_name": "usdc march",
            "table": "base.assets.erc20_token_transfers",
            "backfill_window": {"partition_key": "block_timestamp",
                                "start": "2026-03-01T00:00:00Z", "end": "2026-03-08T00:00:00Z"},
            "filter": {"column": "token_address", "values": ["0xABC"]},
            "destinations": [{"type": "kafka", "name": "usdc-history"}],
        })
    }

    fn locs(body: &Value) -> Vec<Value> {
        let errors = validate_backfill_body(body.as_object().unwrap(), &tables).unwrap_err();
        errors.iter().map(|e| serde_json::to_value(&e.loc).unwrap()).collect()
    }

    #[test]
    fn a_good_body_is_typed_with_lowercased_filter_values_and_generated_uids() {
        let request = validate_backfill_body(body().as_object().unwrap(), &tables).unwrap();
        assert_eq!(request.table, "base.assets.erc20_token_transfers");
        assert_eq!(request.filter, Some(("token_address".to_owned(), vec!["0xabc".to_owned()])));
        assert!(request.start < request.end);
        assert!(request.destinations[0].uid().starts_with("sk-"));
    }

    #[test]
    fn each_rule_is_a_422_at_its_field() {
        type Change = fn(&mut Value);
        let cases: Vec<(Change, Value)> = vec![
            (
                |b| b["backfill_window"]["partition_key"] = json!("block_number"),
                json!(["body", "backfill_window", "partition_key"]),
            ),
            (
                |b| b["backfill_window"]["end"] = json!("2026-03-01T00:00:00Z"),
                json!(["body", "backfill_window", "end"]),
            ),
            (
                |b| b["backfill_window"]["start"] = json!("March 1st"),
                json!(["body", "backfill_window", "start"]),
            ),
            (|b| b["table"] = json!("base.nope"), json!(["body", "table"])),
            (
                |b| b["table"] = json!("ethereum.assets.erc20_token_transfers"),
                json!(["body", "table"]),
            ),
            (|b| b["filter"]["column"] = json!("amount_usd"), json!(["body", "filter", "column"])),
            (|b| b["filter"]["values"] = json!([]), json!(["body", "filter", "values"])),
            (|b| b["destinations"] = json!([]), json!(["body", "destinations"])),
            (
                |b| b["destinations"][0]["type"] = json!("pigeon"),
                json!(["body", "destinations", 0, "type"]),
            ),
            (|b| b["job_name"] = json!("  "), json!(["body", "job_name"])),
            (
                |b| b["transforms"] = json!([{"type": "redis_set_filter", "filter_expr": "root = this.token_address"}]),
                json!(["body", "transforms", 0, "set_values"]),
            ),
            (
                |b| b["transforms"] = json!([{"type": "redis_set_filter", "filter_expr": "root = this.nope", "set_values": ["a"]}]),
                json!(["body", "transforms", 0, "filter_expr"]),
            ),
            (
                |b| b["transforms"] = json!([{"type": "v8", "script": ""}]),
                json!(["body", "transforms", 0, "script"]),
            ),
            (|b| b["transforms"] = json!({}), json!(["body", "transforms"])),
        ];
        for (change, loc) in cases {
            let mut b = body();
            change(&mut b);
            assert_eq!(locs(&b), vec![loc.clone()], "{loc}");
        }
    }
}
