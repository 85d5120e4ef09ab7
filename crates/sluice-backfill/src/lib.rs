//! `sluice-backfill` owns history: the warehouse of parquet tables, one per chain stream
//! ([`tables`], [`warehouse`]), the archiver that fills it from the finalized chain streams
//! ([`archiver`]), and backfill jobs that export a window of a table to sinks.
//!
//! Start at [`warehouse::Warehouse`]: its manifest per table is the commit point of every
//! append, which is what makes the archiver's restart exact.

pub mod archiver;
pub mod import;
pub mod jobs;
pub mod staging;
pub mod tables;
pub mod warehouse;
