//! Set-filter values in Redis (`--sets redis://…`): one sorted set per stored set, and one
//! change feed every node follows.
//!
//! The metadata store keeps what it always kept about a set: its `filter_sets` row (the
//! set's id, made when the set is first written and never reused) and the pipeline row whose
//! lock serialises the set's writers across every node. Redis keeps the values:
//!
//! - `{prefix}:set:{id}`: a sorted set, member = value, score = the value's cursor (`seq`).
//!   Seqs come from `{prefix}:set:{id}:seq`, so values added later list after values added
//!   earlier, and a value keeps its seq while it stays in the set (a replace included).
//! - `{prefix}:set:{id}:version`: incremented by every write of the set, in the same
//!   transaction (`MULTI`/`EXEC`, or a Lua script, which Redis runs atomically) as the change
//!   and its feed entry.
//! - `{prefix}:feed`: a stream with one entry per change: the set, its new version, and the
//!   values added, removed or now held (a replace of more than [`FEED_VALUES`] values says
//!   only that the set changed). Trimmed to about [`FEED_LENGTH`] entries, and of entries
//!   older than ten minutes ([`SetFeed::trim`]); a node that falls further behind sees a
//!   version gap and reads the set again. Dataset changes go on the
//!   same feed once the metadata store committed them ([`RedisSets::publish_dataset`]): the
//!   entries stay in the store, the feed only tells every node's index.
//!
//! A value is stored under its seq as a double: exact below 2^53 values written per set.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Value};
use sluice_filter::ValueSet;

use crate::filter_values::FilterValuePage;
use crate::{Result, StoreError};

/// Values per script call: an add or remove of more is applied in steps of this many, each
/// atomic (and each one feed entry).
pub const WRITE_CHUNK: usize = 100_000;

/// A replace of at most this many values carries them in its feed entry; a larger one tells
/// the nodes to read the set again.
pub const FEED_VALUES: usize = 100_000;

/// About how many entries the feed keeps.
pub const FEED_LENGTH: usize = 256;

/// Values per read when a set is loaded.
const LOAD_PAGE: usize = 100_000;

/// Members per `ZADD`/`ZREM` command.
const BATCH: usize = 10_000;

/// The longest a command may take: loading a page, or a script over a chunk.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes the set exactly the staged values (`KEYS[5]`, scored with fresh seqs): values also
/// in the old set keep their old seq (the smaller), new ones keep the fresh one. Then bumps
/// the version and appends the feed entry (`ARGV[5]` = `replace` with the values as JSON in
/// `ARGV[6]`, or `reload`). Answers `{count, version}`.
const REPLACE: &str = r"
redis.call('ZINTERSTORE', KEYS[6], 2, KEYS[1], KEYS[5], 'AGGREGATE', 'MIN')
redis.call('ZUNIONSTORE', KEYS[1], 2, KEYS[5], KEYS[6], 'AGGREGATE', 'MIN')
redis.call('DEL', KEYS[5], KEYS[6])
local count = redis.call('ZCARD', KEYS[1])
local version = redis.call('INCR', KEYS[3])
if ARGV[5] == 'replace' then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'pipeline', ARGV[1], 'uid', ARGV[2],
    'set', ARGV[3], 'version', version, 'kind', 'replace', 'values', ARGV[6])
else
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'pipeline', ARGV[1], 'uid', ARGV[2],
    'set', ARGV[3], 'version', version, 'kind', 'reload')
end
return {count, version}
";

/// Deletes the set's keys and appends a feed entry of kind `ARGV[5]` (`drop`: the set is
/// gone; `replace` with no values: it was emptied) one version past the last.
const DROP: &str = r"
local version = tonumber(redis.call('GET', KEYS[3]) or '0') + 1
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'pipeline', ARGV[1], 'uid', ARGV[2],
  'set', ARGV[3], 'version', version, 'kind', ARGV[5], 'values', '[]')
return version
";

/// One stored set, as the feed names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetRef<'a> {
    pub pipeline_id: &'a str,
    pub transform_uid: &'a str,
    pub id: i64,
}

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

/// The values of every set filter, in one Redis.
pub struct RedisSets {
    client: Client,
    conn: ConnectionManager,
    prefix: String,
}

impl std::fmt::Debug for RedisSets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSets").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

/// `url` without its `prefix=` query parameter, and that prefix (`sluice` when absent).
fn split_prefix(url: &str) -> (String, String) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), "sluice".to_owned());
    };
    let mut prefix = "sluice".to_owned();
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("prefix=") {
            Some(value) => {
                value.clone_into(&mut prefix);
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    let url = if rest.is_empty() { base.to_owned() } else { format!("{base}?{}", rest.join("&")) };
    (url, prefix)
}

impl RedisSets {
    /// Connects to the Redis `url` names (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://` for TLS when built with it), keys under the `prefix=` query parameter
    /// (default `sluice`).
    ///
    /// # Errors
    /// A malformed URL or a server that does not answer.
    pub async fn connect(url: &str) -> Result<Self> {
        let (url, prefix) = split_prefix(url);
        let client = Client::open(url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(3);
        let conn = client.get_connection_manager_with_config(config).await?;
        Ok(Self { client, conn, prefix })
    }

    fn key(&self, set: i64, part: &str) -> String {
        if part.is_empty() {
            format!("{}:set:{set}", self.prefix)
        } else {
            format!("{}:set:{set}:{part}", self.prefix)
        }
    }

    fn feed_key(&self) -> String {
        format!("{}:feed", self.prefix)
    }

    /// `KEYS` of every script: values, seq, version, feed, staging, kept.
    fn keys(&self, set: i64) -> [String; 6] {
        [
            self.key(set, ""),
            self.key(set, "seq"),
            self.key(set, "version"),
            self.feed_key(),
            self.key(set, "staging"),
            self.key(set, "kept"),
        ]
    }

    fn script(&self, body: &str, keys: &[String], set: SetRef<'_>) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(body).arg(keys.len()).arg(keys);
        cmd.arg(set.pipeline_id).arg(set.transform_uid).arg(set.id).arg(FEED_LENGTH);
        cmd
    }

    /// Answers when Redis does.
    ///
    /// # Errors
    /// When it does not.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Adds `values` to `set` in request order; answers how many were new.
    pub(crate) async fn add(&self, set: SetRef<'_>, values: &[String]) -> Result<u64> {
        self.write(set, values, true).await
    }

    /// Removes `values` from `set`; answers how many were there.
    pub(crate) async fn remove(&self, set: SetRef<'_>, values: &[String]) -> Result<u64> {
        self.write(set, values, false).await
    }

    /// Adds (`add`) or removes `values`, [`WRITE_CHUNK`] at a time. Each step is one
    /// `MULTI`/`EXEC` transaction: the change, the set's next version, and its feed entry.
    /// The caller holds the pipeline's row lock, so no other writer of the set runs
    /// meanwhile: the version read first is the one the steps follow, and seqs taken before
    /// a step are larger than every seq already in the set.
    async fn write(&self, set: SetRef<'_>, values: &[String], add: bool) -> Result<u64> {
        let [members, seq, version_key, feed, ..] = self.keys(set.id);
        let mut conn = self.conn.clone();
        let mut version = self.version(set.id).await?;
        let mut changed = 0;
        for chunk in values.chunks(WRITE_CHUNK) {
            let mut next = 0_i64;
            if add {
                let n = chunk.len() as i64;
                let last: i64 =
                    redis::cmd("INCRBY").arg(&seq).arg(n).query_async(&mut conn).await?;
                next = last - n;
            }
            version += 1;
            let mut pipe = redis::pipe();
            pipe.atomic();
            for batch in chunk.chunks(BATCH) {
                if add {
                    let cmd = pipe.cmd("ZADD").arg(&members).arg("NX");
                    for value in batch {
                        next += 1;
                        cmd.arg(next).arg(value);
                    }
                } else {
                    pipe.cmd("ZREM").arg(&members).arg(batch);
                }
            }
            pipe.cmd("SET").arg(&version_key).arg(version).ignore();
            pipe.cmd("XADD")
                .arg(&feed)
                .arg("MAXLEN")
                .arg("~")
                .arg(FEED_LENGTH)
                .arg("*")
                .arg("pipeline")
                .arg(set.pipeline_id)
                .arg("uid")
                .arg(set.transform_uid)
                .arg("set")
                .arg(set.id)
                .arg("version")
                .arg(version)
                .arg("kind")
                .arg(if add { "add" } else { "remove" })
                .arg("values")
                .arg(json(chunk))
                .ignore();
            let counts: Vec<u64> = pipe.query_async(&mut conn).await?;
            changed += counts.iter().sum::<u64>();
        }
        Ok(changed)
    }

    /// Makes `set` exactly `values` (not empty: an empty set is dropped) in one atomic step
    /// after staging them; answers the count after.
    pub(crate) async fn replace(&self, set: SetRef<'_>, values: &[String]) -> Result<u64> {
        let keys = self.keys(set.id);
        let mut conn = self.conn.clone();
        let () = redis::cmd("DEL").arg(&keys[4]).query_async(&mut conn).await?;
        let n = values.len() as i64;
        let base: i64 = redis::cmd("INCRBY").arg(&keys[1]).arg(n).query_async(&mut conn).await?;
        let base = base - n;
        let mut next = base;
        for chunk in values.chunks(WRITE_CHUNK) {
            let mut pipe = redis::pipe();
            for batch in chunk.chunks(BATCH) {
                let cmd = pipe.cmd("ZADD").arg(&keys[4]).arg("NX");
                for value in batch {
                    next += 1;
                    cmd.arg(next).arg(value);
                }
                cmd.ignore();
            }
            // A staging key a writer left when it died goes away by itself.
            pipe.cmd("EXPIRE").arg(&keys[4]).arg(3_600).ignore();
            let () = pipe.query_async(&mut conn).await?;
        }
        let mut cmd = self.script(REPLACE, &keys, set);
        if values.len() <= FEED_VALUES {
            cmd.arg("replace").arg(json(values));
        } else {
            cmd.arg("reload");
        }
        let (count, _): (u64, i64) = cmd.query_async(&mut conn).await?;
        Ok(count)
    }

    /// Deletes `set` and tells the feed: `emptied` when the set's filter stays (a replace
    /// with no values), else the set is gone.
    pub(crate) async fn drop_set(&self, set: SetRef<'_>, emptied: bool) -> Result<()> {
        let mut cmd = self.script(DROP, &self.keys(set.id), set);
        cmd.arg(if emptied { "replace" } else { "drop" });
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Deletes whatever `set` holds without telling anyone: for a set id just made, which a
    /// write that was rolled back may have used before.
    pub(crate) async fn clear(&self, set: i64) -> Result<()> {
        let keys = self.keys(set);
        let () = redis::cmd("DEL")
            .arg(&keys[0])
            .arg(&keys[1])
            .arg(&keys[2])
            .arg(&keys[4])
            .arg(&keys[5])
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    pub(crate) async fn count(&self, set: i64) -> Result<u64> {
        Ok(redis::cmd("ZCARD").arg(self.key(set, "")).query_async(&mut self.conn.clone()).await?)
    }

    pub(crate) async fn contains(&self, set: i64, value: &str) -> Result<bool> {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(self.key(set, ""))
            .arg(value)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(score.is_some())
    }

    pub(crate) async fn version(&self, set: i64) -> Result<i64> {
        let version: Option<i64> = redis::cmd("GET")
            .arg(self.key(set, "version"))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(version.unwrap_or(0))
    }

    /// Up to `limit` values with a seq above `after`, oldest first, and the seq of the last
    /// of them when more follow.
    pub(crate) async fn page(
        &self,
        set: i64,
        after: Option<i64>,
        limit: u32,
    ) -> Result<FilterValuePage> {
        let limit = limit.max(1) as usize;
        let rows = self.range(set, after.unwrap_or(0), limit + 1).await?;
        let more = rows.len() > limit;
        let page = &rows[..rows.len().min(limit)];
        let next = if more { page.last().map(|(_, seq)| *seq) } else { None };
        Ok(FilterValuePage { values: page.iter().map(|(value, _)| value.clone()).collect(), next })
    }

    /// Up to `count` `(value, seq)` with a seq above `after`, by seq.
    async fn range(&self, set: i64, after: i64, count: usize) -> Result<Vec<(String, i64)>> {
        let rows: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.key(set, ""))
            .arg(format!("({after}"))
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(count)
            .arg("WITHSCORES")
            .query_async(&mut self.conn.clone())
            .await?;
        #[allow(clippy::cast_possible_truncation)]
        Ok(rows.into_iter().map(|(value, seq)| (value, seq as i64)).collect())
    }

    /// Every value of `set`, read a page at a time by seq: a value that stays in the set
    /// while it is read is read once, whatever else changes meanwhile.
    pub(crate) async fn load(&self, set: i64) -> Result<ValueSet> {
        let count = self.count(set).await?;
        let mut values = ValueSet::with_capacity(usize::try_from(count).unwrap_or(0));
        let mut after = 0;
        loop {
            let rows = self.range(set, after, LOAD_PAGE).await?;
            for (value, _) in &rows {
                values.insert(value);
            }
            match rows.last() {
                Some((_, seq)) if rows.len() == LOAD_PAGE => after = *seq,
                _ => break,
            }
        }
        Ok(values)
    }

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

#[cfg(test)]
mod tests {
    use super::split_prefix;

    #[test]
    fn the_prefix_parameter_is_taken_out_of_the_url() {
        assert_eq!(
            split_prefix("redis://h:1/2"),
            ("redis://h:1/2".to_owned(), "sluice".to_owned())
        );
        assert_eq!(
            split_prefix("redis://h:1/2?prefix=t1"),
            ("redis://h:1/2".to_owned(), "t1".to_owned())
        );
        assert_eq!(
            split_prefix("redis://h:1?protocol=resp3&prefix=a"),
            ("redis://h:1?protocol=resp3".to_owned(), "a".to_owned())
        );
    }
}
