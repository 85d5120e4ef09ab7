//! Topic names: chain streams `<chain>.<entity>[.zerolag]`, and the managed sink topic and
//! consumer group of a deployment.

use crate::BusError;

/// Longest topic name (Kafka's limit).
pub const MAX_TOPIC_LEN: usize = 249;

/// The topic of a chain stream.
pub fn chain_stream(chain: &str, entity: &str, zerolag: bool) -> String {
    if zerolag { format!("{chain}.{entity}.zerolag") } else { format!("{chain}.{entity}") }
}

/// The managed topic of a pipeline's `kafka` sink: unique per pipeline, readable by people.
pub fn sink_topic(pipeline_id: &str, sink_name: &str) -> String {
    format!("sink.{pipeline_id}.{sink_name}")
}

/// The topic where a pipeline's dead letters go: records a transform failed on.
pub fn dead_letter_topic(pipeline_id: &str) -> String {
    format!("deadletter.{pipeline_id}")
}

/// The topic of a pipeline's script log lines (`console.*`).
pub fn logs_topic(pipeline_id: &str) -> String {
    format!("logs.{pipeline_id}")
}

/// Whether `topic` (a Sluice name) belongs to one pipeline (its sink, dead-letter or log
/// topic) rather than being a chain stream many pipelines read.
pub fn is_pipeline_topic(topic: &str) -> bool {
    ["sink.", "deadletter.", "logs."].iter().any(|prefix| topic.starts_with(prefix))
}

/// The consumer group whose offset on the dead-letter topic marks what was replayed.
pub fn replay_group(pipeline_id: &str) -> String {
    format!("replay.{pipeline_id}")
}

/// The consumer group a deployment reads its source with.
pub fn deployment_group(pipeline_id: &str) -> String {
    format!("deploy.{pipeline_id}")
}

/// Checks a topic name: 1 to 249 characters of `[A-Za-z0-9._-]`, as Kafka requires.
///
/// # Errors
/// [`BusError::InvalidTopicName`].
pub fn check_name(name: &str) -> Result<(), BusError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.len() > MAX_TOPIC_LEN {
        Some("longer than 249 characters")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are not topic names")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        Some("only ASCII letters, digits, '.', '_' and '-' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(BusError::InvalidTopicName { name: name.to_owned(), reason }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(chain_stream("base", "log", false), "base.log");
        assert_eq!(chain_stream("base", "log", true), "base.log.zerolag");
        assert!(check_name(&sink_topic("6f1c-aa", "usdc-transfers")).is_ok());
        assert!(check_name("a b").is_err());
        assert!(check_name("").is_err());
        assert!(check_name(&"x".repeat(250)).is_err());
    }
}
