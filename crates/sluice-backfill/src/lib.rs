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
pub mod storage;
pub mod transform;
pub mod warehouse;

/// The tables of the warehouse: their typed columns (shared with the object-storage sink).
pub use sluice_columnar::tables;

use std::path::Path;
use std::sync::Arc;

/// The warehouse and the staging storage of a server: in object storage under `url`
/// (staging under its `_staging/`), or `<data_dir>/warehouse` (held exclusively) and
/// `<data_dir>/staging`.
///
/// # Errors
/// A storage that cannot be opened, or a warehouse another process holds.
pub fn open_warehouse(
    url: Option<&str>,
    data_dir: &Path,
) -> Result<(warehouse::Warehouse, Arc<dyn storage::Storage>), warehouse::WarehouseError> {
    let failed = |path: &str| {
        let path = path.to_owned();
        move |source| warehouse::WarehouseError::Io { path, source }
    };
    match url {
        Some(url) => {
            let objects = storage::ObjectStorage::from_url(url).map_err(failed(url))?;
            let staging = objects.child("_staging").map_err(failed(url))?;
            let warehouse = warehouse::Warehouse::open_storage(Arc::new(objects))?;
            Ok((warehouse, Arc::new(staging)))
        }
        None => {
            let warehouse = warehouse::Warehouse::open_exclusive(&data_dir.join("warehouse"))?;
            let dir = data_dir.join("staging");
            let staging =
                storage::LocalStorage::new(&dir).map_err(failed(&dir.display().to_string()))?;
            Ok((warehouse, Arc::new(staging)))
        }
    }
}
