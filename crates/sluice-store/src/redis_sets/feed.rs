//! The change feed: one Redis stream every node follows, with an entry per committed change
//! of a set ([`SetFeedEntry`], written in the same transaction as the change) or of a
//! dataset ([`DatasetFeedEntry`], put on once the metadata store committed it), and its
//! reader ([`SetFeed`]).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};

use super::{RESPONSE_TIMEOUT, RedisSets, SetRef};
use crate::{Result, StoreError};

/// A replace of at most this many values carries them in its feed entry; a larger one tells
/// the nodes to read the set again.
pub const FEED_VALUES: usize = 100_000;

/// About how many entries the feed keeps.
pub const FEED_LENGTH: usize = 256;

/// A change of one set, as the feed carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetFeedChange {
    Added(Vec<String>),
    Removed(Vec<String>),
    Replaced(Vec<String>),
    /// The set changed too much to carry: read it again.
    Reload,
    /// The set is gone (its pipeline, or its transform).
    Dropped,
}

/// A change of one dataset, as the feed carries it (the entries themselves stay in the
/// metadata store; the feed tells every node's dataset index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetFeedChange {
    Created,
    Added(Vec<String>),
    Removed(Vec<String>),
    /// Too many values to carry: read the dataset again.
    Reload,
    Dropped,
}

/// One dataset change on the feed: dataset `(owner_user_id, name)`, made as `seq`, is now at
/// `version` (0 for `Created` and `Dropped`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetFeedEntry {
    pub owner_user_id: String,
    pub name: String,
    pub seq: i64,
    pub version: u64,
    pub change: DatasetFeedChange,
}

/// One entry of the change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedEntry {
    Set(SetFeedEntry),
    Dataset(DatasetFeedEntry),
}

/// One set change on the feed: set `set_id` of `(pipeline_id, transform_uid)` is now at
/// `version`, after `change`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetFeedEntry {
    pub pipeline_id: String,
    pub transform_uid: String,
    pub set_id: i64,
    pub version: i64,
    pub change: SetFeedChange,
}

impl RedisSets {
    /// Appends a committed dataset change to the feed (its values when at most
    /// `FEED_VALUES`, else only that the dataset changed).
    ///
    /// # Errors
    /// When Redis does not answer; the change stays committed, and nodes find it by its
    /// version when they next refresh.
    pub async fn publish_dataset(&self, entry: &DatasetFeedEntry) -> Result<()> {
        let (kind, values) = match &entry.change {
            DatasetFeedChange::Created => ("dataset-create", None),
            DatasetFeedChange::Dropped => ("dataset-drop", None),
            DatasetFeedChange::Reload => ("dataset-reload", None),
            DatasetFeedChange::Added(values) if values.len() <= FEED_VALUES => {
                ("dataset-add", Some(values))
            }
            DatasetFeedChange::Removed(values) if values.len() <= FEED_VALUES => {
                ("dataset-remove", Some(values))
            }
            DatasetFeedChange::Added(_) | DatasetFeedChange::Removed(_) => ("dataset-reload", None),
        };
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.feed_key()).arg("MAXLEN").arg("~").arg(FEED_LENGTH).arg("*");
        cmd.arg("kind").arg(kind).arg("owner").arg(&entry.owner_user_id);
        cmd.arg("name").arg(&entry.name).arg("seq").arg(entry.seq);
        cmd.arg("version").arg(entry.version);
        if let Some(values) = values {
            cmd.arg("values").arg(json(values));
        }
        let _: String = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// A reader of the change feed from its current end, on a connection of its own (a
    /// blocking read would hold up every other command on a shared one).
    ///
    /// # Errors
    /// When Redis does not answer.
    pub async fn feed(&self) -> Result<SetFeed> {
        let mut feed = SetFeed {
            client: self.client.clone(),
            conn: None,
            key: self.feed_key(),
            last: "0-0".to_owned(),
        };
        let key = feed.key.clone();
        let conn = feed.connection().await?;
        let last: Vec<RawEntry> = redis::cmd("XREVRANGE")
            .arg(&key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(conn)
            .await?;
        if let Some((id, _)) = last.into_iter().next() {
            feed.last = id;
        }
        Ok(feed)
    }
}

/// Values as the feed carries them: a JSON array.
fn json(values: &[String]) -> String {
    serde_json::to_string(values).unwrap_or_else(|_| "[]".to_owned())
}

/// A stream entry as Redis answers it: its id and its fields.
type RawEntry = (String, Vec<(String, Value)>);

/// One stream's entries in an `XREAD` answer: the stream's key and its entries.
type StreamEntries = (String, Vec<RawEntry>);

/// Reads the change feed in order, from where the last read ended.
pub struct SetFeed {
    client: Client,
    conn: Option<MultiplexedConnection>,
    key: String,
    last: String,
}

impl std::fmt::Debug for SetFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetFeed").field("last", &self.last).finish_non_exhaustive()
    }
}

impl SetFeed {
    async fn connection(&mut self) -> Result<&mut MultiplexedConnection> {
        if self.conn.is_none() {
            // The read blocks up to a second; the reply may carry many values.
            let config = AsyncConnectionConfig::new()
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_connection_timeout(Some(Duration::from_secs(5)));
            self.conn =
                Some(self.client.get_multiplexed_async_connection_with_config(&config).await?);
        }
        Ok(self.conn.as_mut().expect("the connection was just made"))
    }

    /// Drops the feed's entries older than `age` (the stream is otherwise trimmed only by
    /// the next write, so a bulk load's large entries would stay until then). A node that
    /// had not read them sees a version gap and reads its sets again.
    ///
    /// # Errors
    /// When Redis does not answer.
    pub async fn trim(&mut self, age: Duration) -> Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(age);
        let key = self.key.clone();
        let conn = self.connection().await?;
        let _: u64 = redis::cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg(format!("{}-0", now.as_millis()))
            .query_async(conn)
            .await?;
        Ok(())
    }

    /// The entries after the last read, waiting up to `wait` for one (empty when none came).
    /// After an error the next call connects again and goes on from the same place.
    ///
    /// # Errors
    /// When Redis does not answer, or an entry is malformed.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<FeedEntry>> {
        let (key, last) = (self.key.clone(), self.last.clone());
        let conn = self.connection().await?;
        let reply: redis::RedisResult<Option<Vec<StreamEntries>>> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(64)
            .arg("BLOCK")
            .arg(wait.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&key)
            .arg(&last)
            .query_async(conn)
            .await;
        let streams = match reply {
            Ok(streams) => streams.unwrap_or_default(),
            Err(error) => {
                self.conn = None;
                return Err(error.into());
            }
        };
        let mut entries = Vec::new();
        for (_, stream) in streams {
            for (id, fields) in stream {
                entries.push(parse_entry(&fields).map_err(|detail| StoreError::Corrupt {
                    what: "set feed entry",
                    detail: format!("{id}: {detail}"),
                })?);
                self.last = id;
            }
        }
        Ok(entries)
    }
}

fn parse_entry(fields: &[(String, Value)]) -> Result<FeedEntry, String> {
    let field = |name: &str| -> Result<String, String> {
        let value = fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value)
            .ok_or_else(|| format!("no {name}"))?;
        redis::from_redis_value_ref::<String>(value).map_err(|e| format!("{name}: {e}"))
    };
    let number = |name: &str| -> Result<i64, String> {
        field(name)?.parse().map_err(|e| format!("{name}: {e}"))
    };
    let values = || -> Result<Vec<String>, String> {
        serde_json::from_str(&field("values")?).map_err(|e| format!("values: {e}"))
    };
    let kind = field("kind")?;
    if let Some(kind) = kind.strip_prefix("dataset-") {
        let change = match kind {
            "create" => DatasetFeedChange::Created,
            "add" => DatasetFeedChange::Added(values()?),
            "remove" => DatasetFeedChange::Removed(values()?),
            "reload" => DatasetFeedChange::Reload,
            "drop" => DatasetFeedChange::Dropped,
            other => return Err(format!("unknown kind dataset-{other}")),
        };
        return Ok(FeedEntry::Dataset(DatasetFeedEntry {
            owner_user_id: field("owner")?,
            name: field("name")?,
            seq: number("seq")?,
            version: u64::try_from(number("version")?).map_err(|e| format!("version: {e}"))?,
            change,
        }));
    }
    let change = match kind.as_str() {
        "add" => SetFeedChange::Added(values()?),
        "remove" => SetFeedChange::Removed(values()?),
        "replace" => SetFeedChange::Replaced(values()?),
        "reload" => SetFeedChange::Reload,
        "drop" => SetFeedChange::Dropped,
        other => return Err(format!("unknown kind {other}")),
    };
    Ok(FeedEntry::Set(SetFeedEntry {
        pipeline_id: field("pipeline")?,
        transform_uid: field("uid")?,
        set_id: number("set")?,
        version: number("version")?,
        change,
    }))
}

/// Appends a set's feed entry: its new `version`, the change's `kind` and its values.
pub(super) fn feed_entry(
    pipe: &mut redis::Pipeline,
    feed: &str,
    version: i64,
    set: SetRef<'_>,
    kind: &str,
    values: Option<&[String]>,
) {
    let cmd = pipe.cmd("XADD").arg(feed).arg("MAXLEN").arg("~").arg(FEED_LENGTH).arg("*");
    cmd.arg("pipeline").arg(set.pipeline_id).arg("uid").arg(set.transform_uid);
    cmd.arg("set").arg(set.id).arg("version").arg(version).arg("kind").arg(kind);
    if let Some(values) = values {
        cmd.arg("values").arg(json(values));
    }
    cmd.ignore();
}
