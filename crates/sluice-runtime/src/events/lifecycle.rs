//! The events of lifecycle calls (`pipeline.deployed`, `pipeline.redeployed`,
//! `pipeline.deploy_failed`, `sink.secret_missing`, `pipeline.paused`, `pipeline.torn_down`,
//! `dead_letters.replayed`), called with one line from each lifecycle call.

use serde_json::json;
use sluice_core::events::{EventEmitter, NewEvent, Severity};
use sluice_core::pipeline::Pipeline;

use crate::delivery::Replayed;
use crate::node::Node;
use crate::plan::PlanError;
use crate::sinks::SinkBuildError;
use crate::{Deployed, RuntimeError};

fn emit(
    node: &Node,
    pipeline: &Pipeline,
    kind: &'static str,
    severity: Severity,
    message: String,
    details: serde_json::Value,
) {
    if let Some(recorder) = node.events.get() {
        recorder.emit(NewEvent::pipeline(
            recorder.now(),
            kind,
            severity,
            &pipeline.organization_id,
            &pipeline.id,
            message,
            details,
        ));
    }
}

/// After a deploy: deployed or redeployed, or why it failed.
pub(crate) fn deployed(node: &Node, pipeline: &Pipeline, result: &Result<Deployed, RuntimeError>) {
    let name = pipeline.name.as_str();
    match result {
        Ok(deployed) if deployed.was_running => emit(
            node,
            pipeline,
            "pipeline.redeployed",
            Severity::Info,
            format!("pipeline {name} redeployed"),
            json!({"name": name}),
        ),
        Ok(_) => emit(
            node,
            pipeline,
            "pipeline.deployed",
            Severity::Info,
            format!("pipeline {name} deployed"),
            json!({"name": name}),
        ),
        Err(error) => {
            if let RuntimeError::Plan(PlanError::Sink(SinkBuildError::MissingSecret {
                uid,
                field,
                name: secret,
            })) = error
            {
                emit(
                    node,
                    pipeline,
                    "sink.secret_missing",
                    Severity::Error,
                    format!(
                        "sink {uid} names organization secret '{secret}', which does not exist"
                    ),
                    json!({"sink_uid": uid, "field": field, "secret": secret}),
                );
            }
            let user_fault = matches!(error, RuntimeError::Plan(_));
            emit(
                node,
                pipeline,
                "pipeline.deploy_failed",
                Severity::Error,
                format!("deploy of pipeline {name} failed: {error}"),
                json!({"name": name, "error": error.to_string(), "user_fault": user_fault}),
            );
        }
    }
}

/// A pause or teardown that changed something (`kind`).
pub(crate) fn changed(node: &Node, pipeline: &Pipeline, kind: &'static str) {
    let name = pipeline.name.as_str();
    let what = if kind == "pipeline.paused" { "paused" } else { "torn down" };
    emit(
        node,
        pipeline,
        kind,
        Severity::Info,
        format!("pipeline {name} {what}"),
        json!({"name": name}),
    );
}

/// After a replay of dead letters.
pub(crate) fn replayed(node: &Node, pipeline: &Pipeline, report: &Replayed) {
    let severity = if report.dead_lettered > 0 { Severity::Warning } else { Severity::Info };
    emit(
        node,
        pipeline,
        "dead_letters.replayed",
        severity,
        format!(
            "{} dead letters replayed: {} delivered, {} failed again",
            report.replayed, report.delivered, report.dead_lettered
        ),
        json!({
            "replayed": report.replayed, "delivered": report.delivered,
            "dead_lettered": report.dead_lettered, "next_offset": report.next_offset,
        }),
    );
}
