//! Turns a create/update body into a [`PipelineSpec`], reporting every broken rule at once.

use serde_json::{Map, Value};

use super::sink::SinkFields;
use super::{
    DeliveryGuarantee, ManagedSinkConfig, PipelineConfig, PipelineSpec, PodSize, SinkConfig,
    Source, Transform,
};
use crate::catalog::Catalog;
use crate::filter_expr::FilterExpr;
use crate::ids;
use crate::validation::{Fields, Loc, Recorded, Violation, Violations, one_of, str_array};

/// Fields a client may send but the service manages; they are accepted and ignored.
pub const SERVER_MANAGED_FIELDS: [&str; 5] =
    ["id", "owner_org_team_user_id", "organization_id", "created_at", "updated_at"];

/// Sink types this build can deliver to.
pub const SINK_TYPES: [&str; 9] = [
    "kafka",
    "webhook",
    "external_kafka",
    "nats",
    "sns",
    "postgres",
    "mysql",
    "object_storage",
    "rabbitmq",
];

/// Longest sink name; the managed topic name adds a prefix, and Kafka caps names at 249.
pub const MAX_SINK_NAME_LEN: usize = 180;

/// Whether the body creates a pipeline or replaces one (the older inline `set_values` is
/// accepted only on create).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    Create,
    Update,
}

/// A valid body: the spec, plus the initial filter values given inline by older clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPipeline {
    pub spec: PipelineSpec,
    /// `(transform uid, values)`; values lowercased and deduplicated.
    pub initial_filter_values: Vec<(String, Vec<String>)>,
}

/// A valid transform, with its inline `set_values` when the mode allows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedTransform {
    pub transform: Transform,
    pub set_values: Option<Vec<String>>,
}

/// Validates a pipeline create or update body.
///
/// Missing transform and sink uids are generated; given ones are kept.
///
/// # Errors
/// Every violation found, with `loc` rooted at `["body"]`.
pub fn validate_pipeline_body(
    body: &Map<String, Value>,
    catalog: &Catalog,
    mode: BodyMode,
) -> Result<ValidatedPipeline, Vec<Violation>> {
    let mut errors = Violations::default();
    let mut fields = Fields::new(body, Loc::body());
    fields.ignore(&SERVER_MANAGED_FIELDS);

    let name = fields.required_str("name", &mut errors);
    if name.is_some_and(|name| name.trim().is_empty()) {
        errors.push(Violation::value(&fields.loc("name"), "name must not be empty"));
    }
    let description = fields.required_str("description", &mut errors);
    let tags = fields.optional_str_array("tags", &mut errors);
    let static_egress_ip = fields.optional_bool("static_egress_ip", &mut errors);
    let pod_size = fields.optional_enum("pod_size", &PodSize::NAMES, &mut errors);
    let delivery_guarantee =
        fields.optional_enum("delivery_guarantee", &DeliveryGuarantee::NAMES, &mut errors);
    let config_loc = fields.loc("pipeline_config");
    let config = match fields.get("pipeline_config") {
        None => {
            errors.push(Violation::missing(&config_loc));
            None
        }
        Some(value) => validate_config(value, config_loc, catalog, mode, &mut errors),
    };
    fields.finish(&mut errors, |_| None);

    let (
        Some(name),
        Some(description),
        Ok(tags),
        Ok(static_egress_ip),
        Ok(pod_size),
        Ok(delivery_guarantee),
        Some((pipeline_config, initial_filter_values)),
    ) = (name, description, tags, static_egress_ip, pod_size, delivery_guarantee, config)
    else {
        return Err(errors.finish(()).err().unwrap_or_default());
    };
    let spec = PipelineSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        tags: tags.map(|tags| tags.into_iter().map(str::to_owned).collect()),
        static_egress_ip: static_egress_ip.unwrap_or(false),
        pod_size: pod_size.and_then(PodSize::from_name).unwrap_or_default(),
        delivery_guarantee: delivery_guarantee
            .and_then(DeliveryGuarantee::from_name)
            .unwrap_or_default(),
        pipeline_config,
    };
    errors.finish(ValidatedPipeline { spec, initial_filter_values })
}

type ValidConfig = (PipelineConfig, Vec<(String, Vec<String>)>);

fn validate_config(
    value: &Value,
    loc: Loc,
    catalog: &Catalog,
    mode: BodyMode,
    errors: &mut Violations,
) -> Option<ValidConfig> {
    let mut fields = Fields::of(value, loc, errors)?;
    let source_loc = fields.loc("source");
    let source = match fields.get("source") {
        None => {
            errors.push(Violation::missing(&source_loc));
            None
        }
        Some(value) => validate_source(value, source_loc, catalog, errors),
    };
    let transforms_loc = fields.loc("transforms");
    let transforms = fields
        .required_array("transforms", errors)
        .and_then(|items| validate_transform_list(items, &transforms_loc, mode, errors));
    let sinks_loc = fields.loc("sinks");
    let sinks = fields.required_array("sinks", errors).and_then(|items| {
        if items.len() != 1 {
            errors.push(Violation::value(
                &sinks_loc,
                format!("exactly one sink is allowed per pipeline; got {}", items.len()),
            ));
        }
        let sinks: Vec<Option<SinkConfig>> = items
            .iter()
            .enumerate()
            .map(|(index, item)| SinkConfig::validate(item, sinks_loc.at(index), errors))
            .collect();
        sinks.into_iter().collect::<Option<Vec<SinkConfig>>>().filter(|sinks| sinks.len() == 1)
    });
    fields.finish(errors, |_| None);

    if let (Some(source), Some(transforms)) = (&source, &transforms) {
        for (index, validated) in transforms.iter().enumerate() {
            check_filter_path(
                &validated.transform,
                &source.entity,
                &transforms_loc.at(index),
                errors,
            );
        }
    }
    let (source, transforms, sinks) = (source?, transforms?, sinks?);
    let mut initial_values = Vec::new();
    let transforms = transforms
        .into_iter()
        .map(|validated| {
            if let Some(values) = validated.set_values {
                initial_values.push((validated.transform.uid().to_owned(), values));
            }
            validated.transform
        })
        .collect();
    Some((PipelineConfig { source, transforms, sinks }, initial_values))
}

fn validate_source(
    value: &Value,
    loc: Loc,
    catalog: &Catalog,
    errors: &mut Violations,
) -> Option<Source> {
    let mut fields = Fields::of(value, loc, errors)?;
    // The transport comes from the catalog whatever the client sent.
    fields.ignore(&["type"]);
    let chain = fields.required_str("chain", errors);
    let entity = fields.required_str("entity", errors);
    let is_zerolag = fields.optional_bool("is_zerolag", errors);
    let (chain_loc, entity_loc, zerolag_loc) =
        (fields.loc("chain"), fields.loc("entity"), fields.loc("is_zerolag"));
    fields.finish(errors, |_| None);

    let (chain, entity, is_zerolag) = (chain?, entity?, is_zerolag.ok()?.unwrap_or(false));
    let chains = catalog.chains();
    if !chains.contains(&chain) {
        errors.push(Violation::value(
            &chain_loc,
            format!("unknown chain '{chain}'; the catalog has {}", one_of(&chains)),
        ));
        return None;
    }
    let Some(entry) = catalog.find(chain, entity) else {
        errors.push(Violation::value(
            &entity_loc,
            format!(
                "entity '{entity}' is not available on chain '{chain}'; available: {}",
                one_of(&catalog.entities(chain))
            ),
        ));
        return None;
    };
    if is_zerolag && !entry.zerolag {
        errors.push(Violation::value(
            &zerolag_loc,
            format!("{chain}/{entity} has no zerolag stream; set is_zerolag to false"),
        ));
        return None;
    }
    Some(Source {
        source_type: entry.source_type,
        chain: chain.to_owned(),
        entity: entity.to_owned(),
        is_zerolag,
    })
}

/// Validates a list of transforms and checks their uids are unique.
///
/// # Errors
/// Returns `None` after recording violations.
pub fn validate_transform_list(
    items: &[Value],
    loc: &Loc,
    mode: BodyMode,
    errors: &mut Violations,
) -> Option<Vec<ValidatedTransform>> {
    let validated: Vec<Option<ValidatedTransform>> = items
        .iter()
        .enumerate()
        .map(|(index, item)| validate_transform(item, loc.at(index), mode, errors))
        .collect();
    let mut seen: Vec<&str> = Vec::new();
    for (index, transform) in validated.iter().enumerate() {
        let Some(transform) = transform else { continue };
        let uid = transform.transform.uid();
        if seen.contains(&uid) {
            errors.push(Violation::value(
                &loc.at(index).at("uid"),
                format!("transform uid '{uid}' is used more than once"),
            ));
        }
        seen.push(uid);
    }
    validated.into_iter().collect::<Option<Vec<_>>>().filter(|_| errors.is_empty())
}

/// Validates one transform object; generates its uid when omitted.
pub fn validate_transform(
    value: &Value,
    loc: Loc,
    mode: BodyMode,
    errors: &mut Violations,
) -> Option<ValidatedTransform> {
    let mut fields = Fields::of(value, loc, errors)?;
    let kinds = ["redis_set_filter", "v8"];
    // A transform without `type` is a script (docs/contract.md §Transforms).
    let kind = match fields.optional_enum("type", &kinds, errors) {
        Ok(kind) => kind.unwrap_or("v8"),
        Err(Recorded) => {
            fields.ignore(&["uid", "filter_expr", "script", "set_values"]);
            fields.finish(errors, |_| None);
            return None;
        }
    };
    let uid = validate_uid(&mut fields, errors);
    let validated = if kind == "redis_set_filter" {
        let filter_expr = fields.required_str("filter_expr", errors);
        if let Some(Err(error)) = filter_expr.map(FilterExpr::parse) {
            errors.push(Violation::value(&fields.loc("filter_expr"), error.to_string()));
        }
        let set_values = match mode {
            BodyMode::Create => fields.get("set_values").map(|value| {
                str_array(value, &fields.loc("set_values"), errors).map(|values| normalise(&values))
            }),
            BodyMode::Update => None,
        };
        let filter_expr = filter_expr.filter(|expr| FilterExpr::parse(expr).is_ok());
        match (uid, filter_expr, set_values) {
            (Ok(uid), Some(filter_expr), None) => Some(ValidatedTransform {
                transform: Transform::SetFilter { uid, filter_expr: filter_expr.to_owned() },
                set_values: None,
            }),
            (Ok(uid), Some(filter_expr), Some(Some(values))) => Some(ValidatedTransform {
                transform: Transform::SetFilter { uid, filter_expr: filter_expr.to_owned() },
                set_values: Some(values),
            }),
            _ => None,
        }
    } else {
        let script = fields.required_str("script", errors);
        if script.is_some_and(|script| script.trim().is_empty()) {
            errors.push(Violation::value(&fields.loc("script"), "script must not be empty"));
        }
        match (uid, script.filter(|script| !script.trim().is_empty())) {
            (Ok(uid), Some(script)) => Some(ValidatedTransform {
                transform: Transform::Script { uid, script: script.to_owned() },
                set_values: None,
            }),
            _ => None,
        }
    };
    fields.finish(errors, |field| match (field, kind) {
        ("set_values", "redis_set_filter") => Some(
            "set_values is accepted only when a pipeline is created; change filter values through the filter-values endpoints"
                .to_owned(),
        ),
        _ => None,
    });
    validated
}

/// Records a `value_error` at `<loc>.filter_expr` when `transform` is a set filter whose path
/// can name no field of `entity`'s records (such a filter would silently pass nothing).
pub fn check_filter_path(transform: &Transform, entity: &str, loc: &Loc, errors: &mut Violations) {
    let Transform::SetFilter { filter_expr, .. } = transform else { return };
    let Ok(expr) = FilterExpr::parse(filter_expr) else { return };
    if let Some(msg) = crate::streams::unknown_filter_path(entity, expr.path()) {
        errors.push(Violation::value(&loc.at("filter_expr"), msg));
    }
}

impl SinkConfig {
    /// Checks one sink object of a request and gives the typed sink, generating its uid when
    /// omitted; every problem found is pushed on `errors` (then `None`). Pure: no I/O.
    pub fn validate(value: &Value, loc: Loc, errors: &mut Violations) -> Option<Self> {
        let mut fields = Fields::of(value, loc, errors)?;
        let sink_type = fields.required_str("type", errors);
        if let Some(sink_type) = sink_type.filter(|t| !SINK_TYPES.contains(t)) {
            errors.push(Violation::value(
                &fields.loc("type"),
                format!("unsupported sink type '{sink_type}'; supported: {}", one_of(&SINK_TYPES)),
            ));
        }
        let name = fields.required_str("name", errors);
        if let Some(Err(msg)) = name.map(check_topic_name) {
            errors.push(Violation::value(&fields.loc("name"), msg));
        }
        let uid = validate_uid(&mut fields, errors);
        let mut sink = SinkFields { fields: &mut fields, errors, failed: false };
        let name = name.unwrap_or_default().to_owned();
        let uid_text = uid.clone().unwrap_or_default();
        let config = match sink_type {
            Some("kafka") => Some(Self::Kafka(ManagedSinkConfig { name, uid: uid_text })),
            Some("webhook") => Some(Self::Webhook(sink.webhook(name, uid_text))),
            Some("external_kafka") => {
                Some(Self::ExternalKafka(sink.external_kafka(name, uid_text)))
            }
            Some("nats") => Some(Self::Nats(sink.nats(name, uid_text))),
            Some("sns") => Some(Self::Sns(sink.sns(name, uid_text))),
            Some("postgres") => Some(Self::Postgres(sink.sql(name, uid_text))),
            Some("mysql") => Some(Self::Mysql(sink.sql(name, uid_text))),
            Some("object_storage") => {
                Some(Self::ObjectStorage(sink.object_storage(name, uid_text)))
            }
            Some("rabbitmq") => Some(Self::RabbitMq(sink.rabbitmq(name, uid_text))),
            // Unknown type (reported above): its other fields are not checked.
            _ => {
                let all: Vec<&str> = sink.fields.keys();
                sink.fields.ignore(&all);
                None
            }
        };
        let failed = sink.failed;
        fields.finish(errors, |_| None);
        let name_ok = config.as_ref().is_some_and(|c| check_topic_name(c.name()).is_ok());
        if failed || uid.is_err() || !name_ok {
            return None;
        }
        config
    }
}

fn validate_uid(fields: &mut Fields<'_>, errors: &mut Violations) -> Result<String, Recorded> {
    let loc = fields.loc("uid");
    let Some(value) = fields.get("uid") else {
        return Ok(generated_uid(&loc));
    };
    let uid = crate::validation::as_str(value, &loc, errors).ok_or(Recorded)?;
    if uid.is_empty() || uid.chars().count() > ids::MAX_UID_LEN {
        errors.push(Violation::value(
            &loc,
            format!("uid must be 1 to {} characters", ids::MAX_UID_LEN),
        ));
        return Err(Recorded);
    }
    Ok(uid.to_owned())
}

fn generated_uid(loc: &Loc) -> String {
    // Sinks sit under `sinks` (a backfill's under `destinations`), transforms under
    // `transforms`.
    let is_sink = loc.items().iter().any(|item| {
        matches!(item, crate::validation::LocItem::Field(f) if f == "sinks" || f == "destinations")
    });
    if is_sink { ids::new_sink_uid() } else { ids::new_transform_uid() }
}

/// Whether `name` can be used as a (managed) topic name.
///
/// # Errors
/// A message naming the rule that `name` breaks.
pub fn check_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SINK_NAME_LEN {
        return Err(format!("sink name must be 1 to {MAX_SINK_NAME_LEN} characters"));
    }
    if name == "." || name == ".." {
        return Err("sink name cannot be '.' or '..'".to_owned());
    }
    if let Some(bad) =
        name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "sink name must be usable as a topic name: only ASCII letters, digits, '.', '_' and '-' are allowed, found {bad:?}"
        ));
    }
    Ok(())
}

/// Lowercases and deduplicates filter values, keeping first-seen order.
pub fn normalise(values: &[&str]) -> Vec<String> {
    let mut seen = std::collections::HashSet::with_capacity(values.len());
    values
        .iter()
        .map(|value| crate::filter_values::normalize(value))
        .filter(|value| seen.insert(value.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
