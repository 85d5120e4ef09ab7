//! Identifiers the service generates.
//!
//! Pipeline, org, team and user ids are UUIDv4 strings. Transform and sink uids are short
//! (`tf-` / `sk-` plus 12 hex digits) because users type them into filter-value URLs.

use uuid::Uuid;

/// Longest uid a client may choose for a transform or sink.
pub const MAX_UID_LEN: usize = 128;

/// A new random id for a stored resource.
pub fn new_id() -> String {
    Uuid::new_v4().to_string()
}

/// A new transform uid.
pub fn new_transform_uid() -> String {
    short("tf")
}

/// A new sink uid.
pub fn new_sink_uid() -> String {
    short("sk")
}

fn short(prefix: &str) -> String {
    let hex = Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &hex[..12])
}
