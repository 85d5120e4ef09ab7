//! Snapshots of large filter-value sets beside the store, so a set is ready soon after a
//! restart instead of after reading every value from the database again.
//!
//! A snapshot is the set's values as of one stored version, in a file of the server's data
//! directory (`sets/set-<id>.snap`): a header naming the pipeline, the transform, the set id
//! and the version, then [`ValueSet::write_snapshot`]'s bytes (checksummed). A snapshot is
//! used only when all four match what the database says now, so a stale, foreign or damaged
//! file is never a wrong answer: it is ignored and the set is read from the database as
//! before. Files are written to a temporary name and renamed into place.
//!
//! When: after a set of at least [`MIN_VALUES`] values was read from the database, and for
//! every loaded set whose snapshot is behind when the server asks ([`SetSnapshots::due`]),
//! which it does every minute and at shutdown. After a crash the newest snapshot may be
//! behind; the set is then read from the database once.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sluice_filter::ValueSet;

/// Sets smaller than this are read from the database faster than a snapshot is worth.
pub const MIN_VALUES: usize = 100_000;

const MAGIC: &[u8; 12] = b"SLUICESNAP1\n";

/// Which set, at which version, a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotKey {
    pub pipeline_id: String,
    pub transform_uid: String,
    pub set_id: i64,
    pub version: i64,
}

/// Where snapshots go, and which version of each set was last written.
#[derive(Debug, Default)]
pub(crate) struct SetSnapshots {
    dir: Mutex<Option<PathBuf>>,
    written: Mutex<HashMap<i64, i64>>,
}

impl SetSnapshots {
    /// Keeps snapshots in `dir` from now on (made when missing, owner-only).
    pub(crate) fn keep_in(&self, dir: PathBuf) {
        *self.dir.lock().expect("snapshot dir mutex") = Some(dir);
    }

    fn dir(&self) -> Option<PathBuf> {
        self.dir.lock().expect("snapshot dir mutex").clone()
    }

    /// Whether a set of `values` values at `key` should be written now.
    pub(crate) fn due(&self, key: &SnapshotKey, values: usize) -> bool {
        values >= MIN_VALUES
            && self.dir().is_some()
            && self.written.lock().expect("written mutex").get(&key.set_id) != Some(&key.version)
    }

    /// The set `key` names, from its snapshot, when there is one that matches.
    pub(crate) async fn load(&self, key: &SnapshotKey) -> Option<ValueSet> {
        let path = self.dir()?.join(file_name(key.set_id));
        let wanted = key.clone();
        let loaded = tokio::task::spawn_blocking(move || read(&path, &wanted)).await.ok()?;
        match loaded {
            Ok(Some(values)) => {
                self.written.lock().expect("written mutex").insert(key.set_id, key.version);
                tracing::info!(
                    set_id = key.set_id,
                    version = key.version,
                    values = values.len(),
                    "filter-value set loaded from its snapshot"
                );
                Some(values)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::warn!(%error, set_id = key.set_id, "filter-value set snapshot unreadable; reading the set from the database");
                None
            }
        }
    }

    /// Writes `values` as the snapshot of `key`, and hands them back (`None` only when the
    /// writing thread panicked with them). A failed write is logged: the set is still
    /// served, and the next start reads it from the database.
    pub(crate) async fn save(&self, key: SnapshotKey, values: ValueSet) -> Option<ValueSet> {
        let Some(dir) = self.dir() else { return Some(values) };
        let set_id = key.set_id;
        let version = key.version;
        let joined = tokio::task::spawn_blocking(move || {
            let written = write(&dir, &key, &values);
            (written, values)
        })
        .await;
        match joined {
            Ok((Ok(()), values)) => {
                self.written.lock().expect("written mutex").insert(set_id, version);
                Some(values)
            }
            Ok((Err(error), values)) => {
                tracing::warn!(%error, set_id, "cannot write a filter-value set snapshot");
                Some(values)
            }
            Err(_) => None,
        }
    }
}

fn file_name(set_id: i64) -> String {
    format!("set-{set_id}.snap")
}

fn write(dir: &Path, key: &SnapshotKey, values: &ValueSet) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    let path = dir.join(file_name(key.set_id));
    let partial = dir.join(format!("{}.partial", file_name(key.set_id)));
    {
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(MAGIC)?;
        for text in [&key.pipeline_id, &key.transform_uid] {
            file.write_all(&(text.len() as u32).to_le_bytes())?;
            file.write_all(text.as_bytes())?;
        }
        file.write_all(&key.set_id.to_le_bytes())?;
        file.write_all(&key.version.to_le_bytes())?;
        values.write_snapshot(&mut file)?;
    }
    std::fs::rename(&partial, &path)
}

/// The set in `path` when its header is `wanted`'s; `None` when there is no such file or it
/// holds another set or version.
fn read(path: &Path, wanted: &SnapshotKey) -> std::io::Result<Option<ValueSet>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut magic = [0; MAGIC.len()];
    file.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Ok(None);
    }
    for expected in [&wanted.pipeline_id, &wanted.transform_uid] {
        let mut len = [0; 4];
        file.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len != expected.len() {
            return Ok(None);
        }
        let mut text = vec![0; len];
        file.read_exact(&mut text)?;
        if text != expected.as_bytes() {
            return Ok(None);
        }
    }
    let mut numbers = [0; 16];
    file.read_exact(&mut numbers)?;
    let set_id = i64::from_le_bytes(numbers[..8].try_into().expect("8 bytes"));
    let version = i64::from_le_bytes(numbers[8..].try_into().expect("8 bytes"));
    if (set_id, version) != (wanted.set_id, wanted.version) {
        return Ok(None);
    }
    ValueSet::read_snapshot(file).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(version: i64) -> SnapshotKey {
        SnapshotKey {
            pipeline_id: "p-1".to_owned(),
            transform_uid: "tf-1".to_owned(),
            set_id: 7,
            version,
        }
    }

    #[tokio::test]
    async fn a_snapshot_is_used_only_for_its_set_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = SetSnapshots::default();
        snapshots.keep_in(dir.path().join("sets"));
        let mut values = ValueSet::new();
        values.insert("0xabc");
        let values = snapshots.save(key(3), values).await.unwrap();
        assert_eq!(values.len(), 1, "the values come back");
        let loaded = snapshots.load(&key(3)).await.unwrap();
        assert!(loaded.contains("0xabc"));
        assert!(snapshots.load(&key(4)).await.is_none(), "another version");
        let other = SnapshotKey { transform_uid: "tf-2".to_owned(), ..key(3) };
        assert!(snapshots.load(&other).await.is_none(), "another transform");
        // A damaged file is ignored, never a wrong set.
        let path = dir.path().join("sets").join(file_name(7));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 20;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        assert!(snapshots.load(&key(3)).await.is_none());
    }
}
