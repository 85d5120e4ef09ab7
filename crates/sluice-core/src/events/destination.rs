//! Notification destinations (`PUT /api/v1/notifications`): a sink of the types pipelines
//! use, and which events it wants.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Event, EventFilter, Severity};
use crate::pipeline::SinkConfig;
use crate::validation::{Fields, Loc, Violation, Violations, as_array, as_str};

/// Most destinations of one organization.
pub const MAX_DESTINATIONS: usize = 10;

/// The sink types a destination may be: the external sinks that carry a message each. The
/// managed topic and the table, file and queue sinks (whose layout follows a stream's
/// records) take no notifications.
pub const DESTINATION_SINK_TYPES: [&str; 4] = ["webhook", "external_kafka", "nats", "sns"];

/// One destination of an organization's notifications.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationDestination {
    /// The sink's uid (generated when omitted).
    pub uid: String,
    /// Where events go: a webhook, the user's Kafka, NATS or SNS.
    pub sink: SinkConfig,
    /// Only these kinds (names, or prefixes ending in `*`); every kind when empty.
    pub kinds: Vec<String>,
    /// Only events of at least this severity.
    pub min_severity: Severity,
    /// Also node events (operators only): set when an operator set the destination.
    #[serde(default)]
    pub operator_events: bool,
}

impl NotificationDestination {
    /// Whether `event` goes to this destination.
    pub fn wants(&self, event: &Event) -> bool {
        event.severity >= self.min_severity && EventFilter::kind_matches(&self.kinds, &event.kind)
    }

    /// Checks a `PUT /api/v1/notifications` body: `{"destinations": [{"sink": {...},
    /// "kinds": [...], "min_severity": "warning"}]}`. Pure.
    ///
    /// # Errors
    /// Every violation found, at its place in the body.
    pub fn validate_body(body: &Value) -> Result<Vec<Self>, Vec<Violation>> {
        let mut errors = Violations::default();
        let Some(mut fields) = Fields::of(body, Loc::body(), &mut errors) else {
            return Err(errors.finish(()).expect_err("a violation was recorded"));
        };
        let mut out = Vec::new();
        if let Some(items) = fields.required_array("destinations", &mut errors) {
            let loc = fields.loc("destinations");
            if items.len() > MAX_DESTINATIONS {
                errors.push(Violation::value(
                    &loc,
                    format!("at most {MAX_DESTINATIONS} destinations; got {}", items.len()),
                ));
            }
            for (index, item) in items.iter().enumerate() {
                if let Some(one) = Self::validate(item, loc.at(index), &mut errors) {
                    out.push(one);
                }
            }
            let mut uids: Vec<&str> = out.iter().map(|d| d.uid.as_str()).collect();
            uids.sort_unstable();
            if uids.windows(2).any(|pair| pair[0] == pair[1]) {
                errors.push(Violation::value(&loc, "destination sink uids must be unique"));
            }
        }
        fields.finish(&mut errors, |_| None);
        errors.finish(out)
    }

    fn validate(item: &Value, loc: Loc, errors: &mut Violations) -> Option<Self> {
        let mut fields = Fields::of(item, loc.clone(), errors)?;
        let before = errors.len();
        let sink = match fields.get("sink") {
            None => {
                errors.push(Violation::missing(&loc.at("sink")));
                None
            }
            // Under `destinations`, so an omitted uid is generated as a sink's.
            Some(value) => SinkConfig::validate(value, loc.at("sink"), errors),
        };
        if sink.as_ref().is_some_and(|sink| !DESTINATION_SINK_TYPES.contains(&sink.type_name())) {
            errors.push(Violation::value(
                &loc.at("sink").at("type"),
                "a notification destination is an external sink: webhook, external_kafka, nats or sns",
            ));
        }
        let mut kinds = Vec::new();
        if let Some(value) = fields.get("kinds") {
            if let Some(items) = as_array(value, &loc.at("kinds"), errors) {
                for (index, kind) in items.iter().enumerate() {
                    let at = loc.at("kinds").at(index);
                    let Some(kind) = as_str(kind, &at, errors) else { continue };
                    if EventFilter::valid_kind(kind) {
                        kinds.push(kind.to_owned());
                    } else {
                        errors.push(Violation::value(
                            &at,
                            format!("unknown event kind '{kind}' (docs/events.md lists them)"),
                        ));
                    }
                }
            }
        }
        let names: Vec<&str> = Severity::ALL.iter().map(|s| s.name()).collect();
        let min_severity = fields
            .optional_enum("min_severity", &names, errors)
            .ok()
            .flatten()
            .and_then(Severity::parse)
            .unwrap_or(Severity::Info);
        fields.finish(errors, |_| None);
        let sink = sink?;
        (errors.len() == before).then(|| Self {
            uid: sink.uid().to_owned(),
            sink,
            kinds,
            min_severity,
            operator_events: false,
        })
    }
}
