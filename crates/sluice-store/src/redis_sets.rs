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
//!   values added, removed or now held (a replace of more than
//!   [`FEED_VALUES`](feed::FEED_VALUES) values says only that the set changed). Trimmed to
//!   about [`FEED_LENGTH`] entries, and of entries
//!   older than ten minutes ([`SetFeed::trim`]); a node that falls further behind sees a
//!   version gap and reads the set again. Dataset changes go on the same feed once the
//!   metadata store committed them ([`RedisSets::publish_dataset`]): the entries stay in the
//!   store, the feed only tells every node's index.
//!
//! A chunk's score is its last seq as a double: exact below 2^53 values written per set.
//!
//! Here: connecting, reading a set, adding, removing, listing and dropping. In `redis_sets/`:
//! `chunk.rs`, the format of a log chunk; `rewrite.rs`, a replace and a compaction, which
//! write a log anew; `feed.rs`, the change feed and its reader ([`SetFeed`]); `upgrade.rs`,
//! the one-off move of sets an earlier build kept as sorted sets.

mod chunk;
mod feed;
mod rewrite;
mod upgrade;

use std::time::Duration;

use redis::Client;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice_filter::ValueSet;

use self::chunk::{ChunkWriter, Entry, decode};
use self::feed::FEED_LENGTH;
use self::feed::feed_entry;
pub use self::feed::{
    DatasetFeedChange, DatasetFeedEntry, FeedEntry, SetFeed, SetFeedChange, SetFeedEntry,
};
use crate::filter_values::FilterValuePage;
use crate::{Result, StoreError};

/// Values per write step: an add or remove of more is applied in steps of this many, each
/// atomic (and each one feed entry).
pub const WRITE_CHUNK: usize = 100_000;

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

    /// Answers when Redis does.
    ///
    /// # Errors
    /// When it does not.
    pub async fn ping(&self) -> Result<()> {
        let _: String = self.read(&redis::cmd("PING")).await?;
        Ok(())
    }

    /// Runs `cmd`, which only reads, and runs it once more when the connection had dropped.
    /// After Redis restarts (or a connection is cut), the first command on the old
    /// connection fails with a broken pipe while the manager connects anew for the next; a
    /// read can simply be asked again. A write is never sent twice: it may have been applied
    /// before the connection dropped.
    async fn read<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        match cmd.query_async(&mut self.conn.clone()).await {
            Err(error) if error.is_connection_dropped() => {
                tracing::debug!(%error, "the Redis connection dropped; reading again");
                Ok(cmd.query_async(&mut self.conn.clone()).await?)
            }
            read => Ok(read?),
        }
    }

    /// Where `set`'s log stands now.
    pub(crate) async fn state(&self, set: i64) -> Result<LogState> {
        let keys = self.keys(set);
        let mut mget = redis::cmd("MGET");
        mget.arg(&keys.version).arg(&keys.generation).arg(&keys.mark).arg(&keys.count);
        let got: Vec<Option<i64>> = self.read(&mget).await?;
        let at = |i: usize| got.get(i).copied().flatten().unwrap_or(0);
        Ok(LogState { version: at(0), generation: at(1), mark: at(2), count: at(3) })
    }

    pub(crate) async fn version(&self, set: i64) -> Result<i64> {
        Ok(self.state(set).await?.version)
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
        let mut zrange = redis::cmd("ZRANGE");
        zrange.arg(self.keys(set).log).arg(format!("({after}")).arg(to).arg("BYSCORE");
        zrange.arg("LIMIT").arg(0).arg(count).arg("WITHSCORES");
        let rows: Vec<(Vec<u8>, f64)> = self.read(&zrange).await?;
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
            let any_removed: u64 = self.read(redis::cmd("HLEN").arg(&removed_key)).await?;
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
        let mut live = Vec::with_capacity(found.len());
        for part in found.chunks(LOG_CHUNK) {
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(removed_key).arg(part.iter().map(|(_, value)| value).collect::<Vec<_>>());
            let removals: Vec<Option<i64>> = self.read(&hmget).await?;
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
