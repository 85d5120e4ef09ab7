//! Set-filter values in Redis (`--sets redis://…`): one append-only log per stored set, and
//! one change feed every node follows.
//!
//! The metadata store keeps what it always kept about a set: its `filter_sets` row (the
//! set's id, made when the set is first written and never reused) and the pipeline row whose
//! lock serialises the set's writers across every node. Redis keeps the values, as a log of
//! what each write did, so that Redis does no work per value: membership is decided by the
//! writer, which holds the set in memory (a [`ValueSet`], as every filtering node does) under
//! the pipeline lock.
//!
//! - `{prefix}:set:{id}:log`: a sorted set of *chunks*, scored by their last seq. An add
//!   chunk holds up to [`LOG_CHUNK`] values that were new, each with its seq (the listing
//!   cursor); a remove chunk holds values removed, all under one seq. Seqs only grow, so
//!   reading the chunks by score replays the set's history in order. Values added later list
//!   after values added earlier, and a value keeps its seq while it stays in the set (a
//!   replace included).
//! - `{prefix}:set:{id}:mark`: the last seq written. A write puts its chunks in the log
//!   and moves the mark in one `MULTI`/`EXEC` with its version, count and feed entry, and a
//!   reader reads the log only up to the mark it read with the generation, so it sees whole
//!   writes.
//! - `{prefix}:set:{id}:removed`: a hash `value → seq of its last removal`, so a page can
//!   tell a live entry (added after the value's last removal) from a dead one without
//!   replaying the log.
//! - `{prefix}:set:{id}:count` and `:version`: the set's size, and a counter incremented by
//!   every write of the set (in the same transaction as the change and its feed entry).
//! - `{prefix}:set:{id}:generation`: incremented when the log is rewritten — by a replace,
//!   or by a compaction once removals outweigh half the set ([`RedisSets::compact_if_due`]):
//!   live entries keep their seqs, dead entries, remove chunks and the removed hash go. A
//!   copy of the set kept in memory is brought up to date from the log while the generation
//!   it read is current, and read again after a rewrite.
//! - `{prefix}:feed`: a stream with one entry per change: the set, its new version, and the
//!   values added, removed or now held (a replace of more than [`FEED_VALUES`] values says
//!   only that the set changed). Trimmed to about [`FEED_LENGTH`] entries, and of entries
//!   older than ten minutes ([`SetFeed::trim`]); a node that falls further behind sees a
//!   version gap and reads the set again. Dataset changes go on the same feed once the
//!   metadata store committed them ([`RedisSets::publish_dataset`]): the entries stay in the
//!   store, the feed only tells every node's index.
//!
//! A chunk's score is its last seq as a double: exact below 2^53 values written per set.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Value};
use sluice_filter::ValueSet;

use crate::filter_values::FilterValuePage;
use crate::{Result, StoreError};

/// Values per write step: an add or remove of more is applied in steps of this many, each
/// atomic (and each one feed entry).
pub const WRITE_CHUNK: usize = 100_000;

/// A replace of at most this many values carries them in its feed entry; a larger one tells
/// the nodes to read the set again.
pub const FEED_VALUES: usize = 100_000;

/// About how many entries the feed keeps.
pub const FEED_LENGTH: usize = 256;

/// Values per chunk of a set's log: a page of the listing reads one or a few chunks.
pub const LOG_CHUNK: usize = 4_096;

/// Chunks per read when a log is read whole.
const READ_CHUNKS: usize = 64;

/// Chunks per command when a log is rewritten.
const WRITE_CHUNKS: usize = 64;

/// A log is compacted once its removed values number more than half the set plus this.
const COMPACT_SLACK: u64 = 65_536;

/// The longest a command may take: reading chunks, or a step's transaction.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// Deletes the set's keys and appends a feed entry of kind `ARGV[5]` (`drop`: the set is
/// gone; `replace` with no values: it was emptied) one version past the last.
const DROP: &str = r"
local version = tonumber(redis.call('GET', KEYS[3]) or '0') + 1
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'pipeline', ARGV[1], 'uid', ARGV[2],
  'set', ARGV[3], 'version', version, 'kind', ARGV[5], 'values', '[]')
return version
";

/// Ends the move of a set from a sorted set to a log (`KEYS`: the sorted set, the staged
/// log, the log, the old seq counter, the mark, the count, the generation; `ARGV`: the
/// count and the last seq), unless another node did it first. Answers 1 when it did it.
const UPGRADE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
  return 0
end
if tonumber(ARGV[1]) > 0 then
  redis.call('RENAME', KEYS[2], KEYS[3])
end
local seq = tonumber(redis.call('GET', KEYS[4]) or '0')
redis.call('SET', KEYS[5], math.max(seq, tonumber(ARGV[2])))
redis.call('SET', KEYS[6], ARGV[1])
redis.call('INCR', KEYS[7])
redis.call('DEL', KEYS[1], KEYS[4])
return 1
";

/// One stored set, as the feed names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetRef<'a> {
    pub pipeline_id: &'a str,
    pub transform_uid: &'a str,
    pub id: i64,
}

/// Where a set's log stands: its version, generation and mark (the last committed seq), and
/// how many values the set holds. A copy of the set in memory is current for exactly one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogState {
    pub version: i64,
    pub generation: i64,
    pub mark: i64,
    pub count: i64,
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

/// The keys of one set.
struct SetKeys {
    log: String,
    mark: String,
    version: String,
    feed: String,
    count: String,
    removed: String,
    generation: String,
    staging: String,
    /// What a set was kept in before the log (a sorted set of values): deleted with the set.
    legacy: String,
}

impl RedisSets {
    /// Opens one connection to the Redis `url` names, sends `PING` and closes it.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`](crate::StoreError::InvalidUrl) or
    /// [`StoreError::Unreachable`](crate::StoreError::Unreachable), saying why.
    pub async fn check_reachable(url: &str) -> Result<()> {
        let shown = || sluice_core::redaction::redact_password(url);
        let (bare, _) = split_prefix(url);
        let client = Client::open(bare.as_str()).map_err(|error| {
            crate::StoreError::InvalidUrl { url: shown(), reason: error.to_string() }
        })?;
        let unreachable = |error: redis::RedisError| {
            let reason = if error.is_connection_refusal() {
                "connection refused".to_owned()
            } else {
                error.to_string()
            };
            crate::StoreError::Unreachable { url: shown(), reason }
        };
        let mut connection =
            client.get_multiplexed_async_connection().await.map_err(unreachable)?;
        redis::cmd("PING").query_async::<String>(&mut connection).await.map_err(unreachable)?;
        Ok(())
    }

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

    fn keys(&self, set: i64) -> SetKeys {
        let key = |part: &str| format!("{}:set:{set}:{part}", self.prefix);
        SetKeys {
            log: key("log"),
            mark: key("mark"),
            version: key("version"),
            feed: self.feed_key(),
            count: key("count"),
            removed: key("removed"),
            generation: key("generation"),
            staging: key("staging"),
            legacy: format!("{}:set:{set}", self.prefix),
        }
    }

    fn feed_key(&self) -> String {
        format!("{}:feed", self.prefix)
    }

    /// Moves every set an earlier build kept as a sorted set of values (`{prefix}:set:{id}`,
    /// scored by seq) into a log, with the same seqs, versions and count; answers how many.
    /// Run before the store serves; two nodes starting at once convert each set once.
    ///
    /// # Errors
    /// When Redis does not answer.
    pub async fn upgrade_sorted_sets(&self) -> Result<usize> {
        let mut conn = self.conn.clone();
        let pattern = format!("{}:set:*", self.prefix);
        let mut legacy = Vec::new();
        let mut cursor = 0_u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1_000)
                .arg("TYPE")
                .arg("zset")
                .query_async(&mut conn)
                .await?;
            let prefix = format!("{}:set:", self.prefix);
            legacy.extend(
                keys.iter().filter_map(|key| key.strip_prefix(&prefix)?.parse::<i64>().ok()),
            );
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        legacy.sort_unstable();
        legacy.dedup();
        let mut upgraded = 0;
        for set in legacy {
            let keys = self.keys(set);
            let () = redis::cmd("DEL").arg(&keys.staging).query_async(&mut conn).await?;
            let mut out = Staged::new(&keys.staging);
            let mut after = String::from("-inf");
            let mut mark = 0;
            loop {
                let rows: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(&keys.legacy)
                    .arg(&after)
                    .arg("+inf")
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(100_000)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await?;
                #[allow(clippy::cast_possible_truncation)]
                for (value, seq) in &rows {
                    mark = *seq as i64;
                    out.push(mark, value);
                }
                out.flush_full(&mut conn).await?;
                if rows.len() < 100_000 {
                    break;
                }
                after = format!("({mark}");
            }
            let count = out.finish(&mut conn).await?;
            let done: i64 = redis::cmd("EVAL")
                .arg(UPGRADE)
                .arg(7)
                .arg(&keys.legacy)
                .arg(&keys.staging)
                .arg(&keys.log)
                .arg(format!("{}:seq", keys.legacy))
                .arg(&keys.mark)
                .arg(&keys.count)
                .arg(&keys.generation)
                .arg(count)
                .arg(mark)
                .query_async(&mut conn)
                .await?;
            upgraded += usize::from(done == 1);
        }
        Ok(upgraded)
    }

    /// Answers when Redis does.
    ///
    /// # Errors
    /// When it does not.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Where `set`'s log stands now.
    pub(crate) async fn state(&self, set: i64) -> Result<LogState> {
        let keys = self.keys(set);
        let got: Vec<Option<i64>> = redis::cmd("MGET")
            .arg(&keys.version)
            .arg(&keys.generation)
            .arg(&keys.mark)
            .arg(&keys.count)
            .query_async(&mut self.conn.clone())
            .await?;
        let at = |i: usize| got.get(i).copied().flatten().unwrap_or(0);
        Ok(LogState { version: at(0), generation: at(1), mark: at(2), count: at(3) })
    }

    pub(crate) async fn version(&self, set: i64) -> Result<i64> {
        Ok(self.state(set).await?.version)
    }

    pub(crate) async fn count(&self, set: i64) -> Result<u64> {
        Ok(u64::try_from(self.state(set).await?.count).unwrap_or(0))
    }

    /// The values of `set` now: `copy` (the set's values as of `at`) when `at` is current,
    /// brought up to date from the log when only its version or mark is behind, else the
    /// set read whole. Exact when the caller holds the pipeline lock (no writer runs); without
    /// it, at least as new as the state read first.
    pub(crate) async fn current(
        &self,
        set: i64,
        copy: Option<(ValueSet, LogState)>,
    ) -> Result<(ValueSet, LogState)> {
        let now = self.state(set).await?;
        match copy {
            Some((values, at)) if at.generation == now.generation && at.mark == now.mark => {
                Ok((values, LogState { version: now.version, ..at }))
            }
            Some((mut values, at)) if at.generation == now.generation && at.mark < now.mark => {
                self.replay(set, at.mark, now.mark, &mut values).await?;
                if self.state(set).await?.generation == now.generation {
                    return checked(set, values, now);
                }
                self.load_at(set).await
            }
            _ => self.load_at(set).await,
        }
    }

    /// Every value of `set`, read from its log (again when a rewrite ran meanwhile), and the
    /// state it is current for.
    async fn load_at(&self, set: i64) -> Result<(ValueSet, LogState)> {
        loop {
            let at = self.state(set).await?;
            let mut values = ValueSet::with_capacity(usize::try_from(at.count).unwrap_or(0));
            self.replay(set, 0, at.mark, &mut values).await?;
            if self.state(set).await?.generation == at.generation {
                tracing::debug!(set, values = values.len(), "filter set read from Redis");
                return checked(set, values, at);
            }
        }
    }

    /// Every value of `set`.
    pub(crate) async fn load(&self, set: i64) -> Result<ValueSet> {
        Ok(self.load_at(set).await?.0)
    }

    /// Applies the chunks of `set`'s log scored in `(after, to]` to `values`, in order,
    /// [`READ_CHUNKS`] at a time.
    async fn replay(&self, set: i64, after: i64, to: i64, values: &mut ValueSet) -> Result<()> {
        let mut last = after;
        loop {
            let chunks = self.chunks(set, last, to, READ_CHUNKS).await?;
            for (bytes, score) in &chunks {
                decode(bytes, |entry| {
                    match entry {
                        Entry::Added(_, value) => values.insert(value),
                        Entry::Removed(value) => values.remove(value),
                    };
                })
                .map_err(|detail| corrupt(set, &detail))?;
                last = *score;
            }
            if chunks.len() < READ_CHUNKS {
                return Ok(());
            }
        }
    }

    /// Up to `count` chunks of `set`'s log scored in `(after, to]`, by score.
    async fn chunks(
        &self,
        set: i64,
        after: i64,
        to: i64,
        count: usize,
    ) -> Result<Vec<(Vec<u8>, i64)>> {
        if after >= to {
            return Ok(Vec::new());
        }
        let rows: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys(set).log)
            .arg(format!("({after}"))
            .arg(to)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(count)
            .arg("WITHSCORES")
            .query_async(&mut self.conn.clone())
            .await?;
        #[allow(clippy::cast_possible_truncation)]
        Ok(rows.into_iter().map(|(bytes, score)| (bytes, score as i64)).collect())
    }

    /// Adds `values` to `set`, whose values are `members` as of `at` (the caller holds the
    /// pipeline lock), in request order; answers how many were new and the state after. On
    /// an error `members` may be ahead of Redis: the caller drops it.
    pub(crate) async fn add(
        &self,
        set: SetRef<'_>,
        members: &mut ValueSet,
        at: LogState,
        values: &[String],
    ) -> Result<(u64, LogState)> {
        self.write(set, members, at, values, true).await
    }

    /// Removes `values` from `set` as [`Self::add`] adds; answers how many were there and
    /// the state after (the log compacted when due).
    pub(crate) async fn remove(
        &self,
        set: SetRef<'_>,
        members: &mut ValueSet,
        at: LogState,
        values: &[String],
    ) -> Result<(u64, LogState)> {
        let (removed, at) = self.write(set, members, at, values, false).await?;
        Ok((removed, self.compact_if_due(set, at).await?))
    }

    /// Adds (`add`) or removes `values`, [`WRITE_CHUNK`] at a time. Each step is one
    /// `MULTI`/`EXEC`: the chunks of the values it changes (a removal's seq also in the
    /// removed hash), the mark, count and version, and the step's feed entry.
    async fn write(
        &self,
        set: SetRef<'_>,
        members: &mut ValueSet,
        mut at: LogState,
        values: &[String],
        add: bool,
    ) -> Result<(u64, LogState)> {
        let keys = self.keys(set.id);
        let mut conn = self.conn.clone();
        let mut changed = 0;
        for chunk in values.chunks(WRITE_CHUNK) {
            let changes: Vec<&str> = chunk
                .iter()
                .map(String::as_str)
                .filter(|value| if add { members.insert(value) } else { members.remove(value) })
                .collect();
            let mut pipe = redis::pipe();
            pipe.atomic();
            for part in changes.chunks(LOG_CHUNK) {
                // Added values take a seq each; removed ones share the chunk's.
                let mut log = if add {
                    ChunkWriter::added()
                } else {
                    at.mark += 1;
                    let hset = pipe.cmd("HSET").arg(&keys.removed);
                    for value in part {
                        hset.arg(*value).arg(at.mark);
                    }
                    hset.ignore();
                    ChunkWriter::removed(at.mark)
                };
                for value in part {
                    at.mark += i64::from(add);
                    log.push(at.mark, value);
                }
                let (bytes, score) = log.take();
                pipe.cmd("ZADD").arg(&keys.log).arg(score).arg(bytes).ignore();
            }
            let n = changes.len() as i64;
            at.count += if add { n } else { -n };
            at.version += 1;
            commit_step(&mut pipe, &keys, &at, set, if add { "add" } else { "remove" }, chunk);
            let () = pipe.query_async(&mut conn).await?;
            changed += changes.len() as u64;
        }
        Ok((changed, at))
    }

    /// Makes `set` exactly `values` (not empty: an empty set is dropped) in one atomic step
    /// (the caller holds the pipeline lock): the log is rewritten with the live values it
    /// keeps, at their seqs, then the new ones in request order. Answers the set's values and
    /// state after.
    pub(crate) async fn replace(
        &self,
        set: SetRef<'_>,
        values: &[String],
    ) -> Result<(ValueSet, LogState)> {
        let at = self.state(set.id).await?;
        let mut wanted = ValueSet::with_capacity(values.len());
        let order: Vec<&str> =
            values.iter().map(String::as_str).filter(|value| wanted.insert(value)).collect();
        let at =
            self.rewrite(set, at, Some(Replace { wanted: &wanted, order: &order, values })).await?;
        Ok((wanted, at))
    }

    /// Rewrites `set`'s log once its removed values outweigh half the set (the caller holds
    /// the pipeline lock); answers the state after.
    async fn compact_if_due(&self, set: SetRef<'_>, at: LogState) -> Result<LogState> {
        let removed: u64 = redis::cmd("HLEN")
            .arg(self.keys(set.id).removed)
            .query_async(&mut self.conn.clone())
            .await?;
        if removed <= u64::try_from(at.count).unwrap_or(0) / 2 + COMPACT_SLACK {
            return Ok(at);
        }
        tracing::debug!(set = set.id, removed, count = at.count, "compacting a filter set's log");
        self.rewrite(set, at, None).await
    }

    /// Writes `set`'s log anew (the caller holds the pipeline lock): its live entries at their
    /// seqs — only those `replace` wants, then its other values with new seqs — into a staging
    /// key, which then becomes the log in one transaction with the removed hash gone, the
    /// generation incremented and, for a replace, the version and feed entry. Answers the
    /// state after.
    async fn rewrite(
        &self,
        set: SetRef<'_>,
        mut at: LogState,
        replace: Option<Replace<'_>>,
    ) -> Result<LogState> {
        let keys = self.keys(set.id);
        let mut conn = self.conn.clone();
        let removed: Vec<(String, i64)> =
            redis::cmd("HGETALL").arg(&keys.removed).query_async(&mut conn).await?;
        let removed: HashMap<String, i64> = removed.into_iter().collect();
        let () = redis::cmd("DEL").arg(&keys.staging).query_async(&mut conn).await?;
        let mut out = Staged::new(&keys.staging);
        let mut kept = ValueSet::new();
        let mut last = 0;
        loop {
            let chunks = self.chunks(set.id, last, at.mark, READ_CHUNKS).await?;
            for (bytes, score) in &chunks {
                decode(bytes, |entry| {
                    let Entry::Added(seq, value) = entry else { return };
                    let live = removed.get(value).is_none_or(|removal| *removal < seq);
                    let wanted = replace.as_ref().is_none_or(|r| r.wanted.contains(value));
                    if live && wanted {
                        if replace.is_some() {
                            kept.insert(value);
                        }
                        out.push(seq, value);
                    }
                })
                .map_err(|detail| corrupt(set.id, &detail))?;
                last = *score;
            }
            out.flush_full(&mut conn).await?;
            if chunks.len() < READ_CHUNKS {
                break;
            }
        }
        if let Some(replace) = &replace {
            for value in replace.order.iter().filter(|value| !kept.contains(value)) {
                at.mark += 1;
                out.push(at.mark, value);
            }
        }
        at.count = out.finish(&mut conn).await?;
        at.generation += 1;
        let mut pipe = redis::pipe();
        pipe.atomic();
        if at.count > 0 {
            pipe.cmd("RENAME").arg(&keys.staging).arg(&keys.log).ignore();
        } else {
            pipe.cmd("DEL").arg(&keys.log).arg(&keys.staging).ignore();
        }
        pipe.cmd("DEL").arg(&keys.removed).ignore();
        pipe.cmd("SET").arg(&keys.generation).arg(at.generation).ignore();
        pipe.cmd("SET").arg(&keys.mark).arg(at.mark).ignore();
        pipe.cmd("SET").arg(&keys.count).arg(at.count).ignore();
        if let Some(replace) = &replace {
            at.version += 1;
            pipe.cmd("SET").arg(&keys.version).arg(at.version).ignore();
            let values = (replace.values.len() <= FEED_VALUES).then_some(replace.values);
            let kind = if values.is_some() { "replace" } else { "reload" };
            feed_entry(&mut pipe, &keys.feed, at.version, set, kind, values);
        }
        let () = pipe.query_async(&mut conn).await?;
        Ok(at)
    }

    /// Deletes `set` and tells the feed: `emptied` when the set's filter stays (a replace
    /// with no values), else the set is gone.
    pub(crate) async fn drop_set(&self, set: SetRef<'_>, emptied: bool) -> Result<()> {
        let keys = self.keys(set.id);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(DROP).arg(9);
        cmd.arg(&keys.log).arg(&keys.mark).arg(&keys.version).arg(&keys.feed);
        cmd.arg(&keys.count).arg(&keys.removed).arg(&keys.generation).arg(&keys.staging);
        cmd.arg(&keys.legacy);
        cmd.arg(set.pipeline_id).arg(set.transform_uid).arg(set.id).arg(FEED_LENGTH);
        cmd.arg(if emptied { "replace" } else { "drop" });
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Deletes whatever `set` holds without telling anyone: for a set id just made, which a
    /// write that was rolled back may have used before.
    pub(crate) async fn clear(&self, set: i64) -> Result<()> {
        let keys = self.keys(set);
        let () = redis::cmd("DEL")
            .arg(&keys.log)
            .arg(&keys.mark)
            .arg(&keys.version)
            .arg(&keys.count)
            .arg(&keys.removed)
            .arg(&keys.generation)
            .arg(&keys.staging)
            .arg(&keys.legacy)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
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
        let after = after.unwrap_or(0);
        let removed_key = self.keys(set).removed;
        // Enough chunks for the page and the one after when none of their entries is dead.
        let per_read = (limit + 1).div_ceil(LOG_CHUNK) + 1;
        loop {
            let at = self.state(set).await?;
            let any_removed: u64 =
                redis::cmd("HLEN").arg(&removed_key).query_async(&mut self.conn.clone()).await?;
            let mut live: Vec<(i64, String)> = Vec::new();
            let mut last = after;
            loop {
                let chunks = self.chunks(set, last, at.mark, per_read).await?;
                let mut found = Vec::new();
                for (bytes, score) in &chunks {
                    decode(bytes, |entry| {
                        if let Entry::Added(seq, value) = entry {
                            if seq > after {
                                found.push((seq, value.to_owned()));
                            }
                        }
                    })
                    .map_err(|detail| corrupt(set, &detail))?;
                    last = *score;
                }
                if any_removed > 0 {
                    self.drop_dead(&removed_key, &mut found).await?;
                }
                live.extend(found);
                if live.len() > limit || chunks.len() < per_read {
                    break;
                }
            }
            // A rewrite meanwhile may have taken away the removals that made entries dead.
            if self.state(set).await?.generation != at.generation {
                continue;
            }
            let more = live.len() > limit;
            live.truncate(limit);
            let next = if more { live.last().map(|(seq, _)| *seq) } else { None };
            let values = live.into_iter().map(|(_, value)| value).collect();
            return Ok(FilterValuePage { values, next });
        }
    }

    /// Keeps the entries of `found` added after their value's last removal.
    async fn drop_dead(&self, removed_key: &str, found: &mut Vec<(i64, String)>) -> Result<()> {
        let mut conn = self.conn.clone();
        let mut live = Vec::with_capacity(found.len());
        for part in found.chunks(LOG_CHUNK) {
            let removals: Vec<Option<i64>> = redis::cmd("HMGET")
                .arg(removed_key)
                .arg(part.iter().map(|(_, value)| value).collect::<Vec<_>>())
                .query_async(&mut conn)
                .await?;
            live.extend(
                part.iter()
                    .zip(removals)
                    .map(|((seq, _), removal)| removal.is_none_or(|r| r < *seq)),
            );
        }
        let mut live = live.into_iter();
        found.retain(|_| live.next().unwrap_or(false));
        Ok(())
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

/// What a replace wants: the set `values` ask for, each once in request order.
struct Replace<'a> {
    wanted: &'a ValueSet,
    order: &'a [&'a str],
    values: &'a [String],
}

/// The end of a write step: the mark, count and version it leaves, and its feed entry.
fn commit_step(
    pipe: &mut redis::Pipeline,
    keys: &SetKeys,
    at: &LogState,
    set: SetRef<'_>,
    kind: &str,
    values: &[String],
) {
    pipe.cmd("SET").arg(&keys.mark).arg(at.mark).ignore();
    pipe.cmd("SET").arg(&keys.count).arg(at.count).ignore();
    pipe.cmd("SET").arg(&keys.version).arg(at.version).ignore();
    feed_entry(pipe, &keys.feed, at.version, set, kind, Some(values));
}

/// Appends a set's feed entry: its new `version`, the change's `kind` and its values.
fn feed_entry(
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

/// `values`, read from `set`'s log up to `at`, when they number what the set's count says.
fn checked(set: i64, values: ValueSet, at: LogState) -> Result<(ValueSet, LogState)> {
    if values.len() as i64 == at.count {
        return Ok((values, at));
    }
    let detail =
        format!("{} values in the log up to seq {}, {} counted", values.len(), at.mark, at.count);
    Err(corrupt(set, &detail))
}

fn corrupt(set: i64, detail: &str) -> StoreError {
    StoreError::Corrupt { what: "filter set log", detail: format!("set {set}: {detail}") }
}

/// Chunks of a rewritten log, written to its staging key [`WRITE_CHUNKS`] at a time.
struct Staged<'a> {
    key: &'a str,
    chunk: ChunkWriter,
    full: Vec<(Vec<u8>, i64)>,
    count: i64,
}

impl<'a> Staged<'a> {
    fn new(key: &'a str) -> Self {
        Self { key, chunk: ChunkWriter::added(), full: Vec::new(), count: 0 }
    }

    fn push(&mut self, seq: i64, value: &str) {
        self.chunk.push(seq, value);
        self.count += 1;
        if self.chunk.len == LOG_CHUNK {
            self.full.push(self.chunk.take());
        }
    }

    /// Writes the full chunks once there are [`WRITE_CHUNKS`] of them.
    async fn flush_full(&mut self, conn: &mut ConnectionManager) -> Result<()> {
        if self.full.len() >= WRITE_CHUNKS { self.flush(conn).await } else { Ok(()) }
    }

    async fn flush(&mut self, conn: &mut ConnectionManager) -> Result<()> {
        if self.full.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        let zadd = pipe.cmd("ZADD").arg(self.key);
        for (bytes, score) in self.full.drain(..) {
            zadd.arg(score).arg(bytes);
        }
        zadd.ignore();
        // A staging key a writer left when it died goes away by itself.
        pipe.cmd("EXPIRE").arg(self.key).arg(3_600).ignore();
        let () = pipe.query_async(conn).await?;
        Ok(())
    }

    /// Writes what is left; answers how many entries were written in all.
    async fn finish(mut self, conn: &mut ConnectionManager) -> Result<i64> {
        if self.chunk.len > 0 {
            self.full.push(self.chunk.take());
        }
        self.flush(conn).await?;
        Ok(self.count)
    }
}

/// One entry of a log chunk.
#[derive(Debug, PartialEq, Eq)]
enum Entry<'a> {
    /// The value was added with this seq.
    Added(i64, &'a str),
    /// The value was removed.
    Removed(&'a str),
}

/// Builds one chunk of a log. An add chunk is `a` then, per entry, its seq less the entry
/// before's (the first: its seq) and the value, length first; a remove chunk is `r`, its
/// seq, then its values, length first. Numbers are LEB128 varints.
#[derive(Debug)]
struct ChunkWriter {
    bytes: Vec<u8>,
    /// The seq of the last entry (of a remove chunk: its seq).
    last: i64,
    len: usize,
    removal: bool,
}

impl ChunkWriter {
    fn added() -> Self {
        Self { bytes: vec![b'a'], last: 0, len: 0, removal: false }
    }

    fn removed(seq: i64) -> Self {
        let mut bytes = vec![b'r'];
        put_varint(&mut bytes, seq.unsigned_abs());
        Self { bytes, last: seq, len: 0, removal: true }
    }

    /// Appends `value` under `seq` (of an add chunk: above the last entry's).
    fn push(&mut self, seq: i64, value: &str) {
        if !self.removal {
            put_varint(&mut self.bytes, (seq - self.last).unsigned_abs());
            self.last = seq;
        }
        put_varint(&mut self.bytes, value.len() as u64);
        self.bytes.extend_from_slice(value.as_bytes());
        self.len += 1;
    }

    /// The chunk and its score (its last seq); the writer starts a new add chunk.
    fn take(&mut self) -> (Vec<u8>, i64) {
        let score = self.last;
        let bytes = std::mem::replace(&mut self.bytes, vec![b'a']);
        (self.last, self.len, self.removal) = (0, 0, false);
        (bytes, score)
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &mut &[u8]) -> std::result::Result<u64, String> {
    let mut value = 0_u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("a number past the chunk's end")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a number of more than 64 bits".to_owned())
}

/// Hands every entry of `chunk` to `f`, in order.
fn decode<'a>(chunk: &'a [u8], mut f: impl FnMut(Entry<'a>)) -> std::result::Result<(), String> {
    let (&kind, mut rest) = chunk.split_first().ok_or("an empty chunk")?;
    let removal = match kind {
        b'a' => false,
        b'r' => true,
        other => return Err(format!("a chunk of unknown kind {other}")),
    };
    let mut seq = if removal { take_varint(&mut rest)? } else { 0 };
    while !rest.is_empty() {
        if !removal {
            seq += take_varint(&mut rest)?;
        }
        let len = usize::try_from(take_varint(&mut rest)?).unwrap_or(usize::MAX);
        if len > rest.len() {
            return Err("a value past the chunk's end".to_owned());
        }
        let (value, tail) = rest.split_at(len);
        rest = tail;
        let value = std::str::from_utf8(value).map_err(|e| format!("a value: {e}"))?;
        let seq = i64::try_from(seq).map_err(|_| "a seq past i64".to_owned())?;
        f(if removal { Entry::Removed(value) } else { Entry::Added(seq, value) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{ChunkWriter, decode, split_prefix};

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

    #[test]
    fn chunks_read_back_as_written() {
        let mut added = ChunkWriter::added();
        added.push(7, "0xab");
        added.push(8, "");
        added.push(300, "ünï");
        let (bytes, score) = added.take();
        assert_eq!(score, 300);
        let mut seen = Vec::new();
        decode(&bytes, |entry| seen.push(format!("{entry:?}"))).unwrap();
        assert_eq!(seen, ["Added(7, \"0xab\")", "Added(8, \"\")", "Added(300, \"ünï\")"]);
        // The writer goes on with a new add chunk, its first seq written whole.
        added.push(1 << 40, "x");
        let (bytes, score) = added.take();
        assert_eq!(score, 1 << 40);
        let mut seen = Vec::new();
        decode(&bytes, |entry| seen.push(format!("{entry:?}"))).unwrap();
        assert_eq!(seen, [format!("Added({}, \"x\")", 1_i64 << 40)]);

        let mut removed = ChunkWriter::removed(301);
        removed.push(301, "0xab");
        removed.push(301, "ünï");
        let (bytes, score) = removed.take();
        assert_eq!(score, 301);
        let mut seen = Vec::new();
        decode(&bytes, |entry| seen.push(format!("{entry:?}"))).unwrap();
        assert_eq!(seen, ["Removed(\"0xab\")", "Removed(\"ünï\")"]);
    }

    #[test]
    fn a_damaged_chunk_is_an_error_not_a_panic() {
        let mut added = ChunkWriter::added();
        added.push(1, "0xabcdef");
        let (bytes, _) = added.take();
        // Cut anywhere past its kind, it ends inside an entry.
        for end in 2..bytes.len() {
            assert!(decode(&bytes[..end], |_| ()).is_err(), "cut at {end}");
        }
        assert!(decode(b"", |_| ()).is_err());
        assert!(decode(b"z", |_| ()).is_err());
        assert!(decode(&[b'a', 1, 2, 0xff, 0xfe], |_| ()).is_err(), "not UTF-8");
        assert!(
            decode(&[b'a', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1], |_| ())
                .is_err()
        );
    }
}
