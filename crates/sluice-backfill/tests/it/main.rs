//! Integration tests of the warehouse and the archiver, on the embedded log, in a local
//! directory and in the S3-compatible server `scripts/test` starts (`SLUICE_TEST_S3_URL`; the
//! object storage tests fail without it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod archiver;
mod object_storage;
mod staging;

/// A new, empty bucket of the S3-compatible server `scripts/test` starts, as object storage
/// under `prefix`.
pub fn s3(prefix: &str) -> sluice_backfill::storage::ObjectStorage {
    sluice_backfill::storage::testing::new_bucket(prefix)
}
