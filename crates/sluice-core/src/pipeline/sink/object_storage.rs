//! `object_storage`: files of records in an S3-compatible bucket (docs/sinks.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SinkFields;

/// File formats of an `object_storage` sink.
pub const OBJECT_FORMATS: [&str; 2] = ["parquet", "jsonl_gzip"];
/// Defaults and bounds of the cut of a file.
pub const DEFAULT_MAX_ROWS: u64 = 100_000;
pub const MAX_MAX_ROWS: u64 = 10_000_000;
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
pub const MIN_MAX_BYTES: u64 = 1024;
pub const MAX_MAX_BYTES: u64 = 1024 * 1024 * 1024;
pub const DEFAULT_MAX_SECONDS: u64 = 300;
pub const MAX_MAX_SECONDS: u64 = 86_400;

/// `object_storage`: files of records, cut by rows, bytes and age, named by the source
/// offsets they cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectStorageSinkConfig {
    pub name: String,
    /// The bucket (3 to 63 of lowercase letters, digits, `.` and `-`).
    pub bucket: String,
    /// Where under the bucket the files go (no leading or trailing `/`); default none.
    #[serde(default)]
    pub prefix: String,
    /// Default `us-east-1`.
    #[serde(default = "default_region")]
    pub region: String,
    /// An S3-compatible server (`http(s)://host[:port]`); default AWS's endpoint of `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Address the bucket in the path (`endpoint/bucket/key`) rather than the host name;
    /// default true with an `endpoint`, false without.
    #[serde(default)]
    pub path_style: bool,
    /// Organization secret holding the access key id.
    pub access_key_id_secret: String,
    /// Organization secret holding the secret access key.
    pub secret_access_key_secret: String,
    /// Organization secret holding a session token (temporary credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_secret: Option<String>,
    /// `parquet` (default) or `jsonl_gzip`.
    #[serde(default = "default_format")]
    pub format: String,
    /// Most records in one file.
    #[serde(default = "default_max_rows")]
    pub max_rows: u64,
    /// Most bytes of records (their JSON) in one file.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Most seconds a file stays open.
    #[serde(default = "default_max_seconds")]
    pub max_seconds: u64,
    #[schema(required = false)]
    pub uid: String,
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

fn default_max_rows() -> u64 {
    DEFAULT_MAX_ROWS
}

fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}

fn default_max_seconds() -> u64 {
    DEFAULT_MAX_SECONDS
}

fn default_format() -> String {
    "parquet".to_owned()
}

/// Whether `bucket` is a valid S3 bucket name.
fn valid_bucket(bucket: &str) -> bool {
    (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric())
}

impl<'a> SinkFields<'_, 'a> {
    /// An optional whole number in `min..=max`, `default` when absent.
    pub(super) fn number(&mut self, field: &'a str, min: u64, max: u64, default: u64) -> u64 {
        match self.fields.get(field) {
            None => default,
            Some(value) => {
                match crate::validation::whole_u64(value).filter(|n| (min..=max).contains(n)) {
                    Some(n) => n,
                    None => {
                        self.fail(field, format!("must be a whole number from {min} to {max}"));
                        default
                    }
                }
            }
        }
    }

    pub fn object_storage(&mut self, name: String, uid: String) -> ObjectStorageSinkConfig {
        let bucket = self.required("bucket");
        if !bucket.is_empty() && !valid_bucket(&bucket) {
            self.fail(
                "bucket",
                "bucket names are 3 to 63 of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit",
            );
        }
        let prefix = self.optional("prefix").unwrap_or_default();
        let prefix_ok = !prefix.starts_with('/')
            && !prefix.ends_with('/')
            && !prefix.contains("//")
            && prefix.split('/').all(|part| part != "." && part != "..")
            && !prefix.chars().any(char::is_control);
        if !prefix_ok {
            self.fail("prefix", "must be a relative key prefix: no leading or trailing '/', no empty, '.' or '..' segments");
        }
        let region = self.optional("region").unwrap_or_else(default_region);
        let region_ok = !region.is_empty()
            && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !region_ok {
            self.fail("region", "must be a region name such as us-east-1");
        }
        let endpoint = self.http_url("endpoint", false);
        if endpoint.as_deref().is_some_and(|e| e.contains('@') || e.contains('?')) {
            self.fail("endpoint", "give the server's address only: no credentials or query");
        }
        let path_style = match self.fields.optional_bool("path_style", self.errors) {
            Ok(flag) => flag.unwrap_or(endpoint.is_some()),
            Err(_) => {
                self.failed = true;
                false
            }
        };
        let access_key_id_secret = self.secret("access_key_id_secret", true).unwrap_or_default();
        let secret_access_key_secret =
            self.secret("secret_access_key_secret", true).unwrap_or_default();
        let session_token_secret = self.secret("session_token_secret", false);
        let format = self.choice("format", &OBJECT_FORMATS, "parquet");
        let max_rows = self.number("max_rows", 1, MAX_MAX_ROWS, DEFAULT_MAX_ROWS);
        let max_bytes = self.number("max_bytes", MIN_MAX_BYTES, MAX_MAX_BYTES, DEFAULT_MAX_BYTES);
        let max_seconds = self.number("max_seconds", 1, MAX_MAX_SECONDS, DEFAULT_MAX_SECONDS);
        ObjectStorageSinkConfig {
            name,
            bucket,
            prefix,
            region,
            endpoint,
            path_style,
            access_key_id_secret,
            secret_access_key_secret,
            session_token_secret,
            format,
            max_rows,
            max_bytes,
            max_seconds,
            uid,
        }
    }
}
