//! Writing a set's log anew: a replace ([`RedisSets::replace`]) and a compaction
//! ([`RedisSets::compact_if_due`]) both stage the new log under a key of its own
//! ([`Staged`]) and swap it in with one transaction.

use std::collections::HashMap;

use redis::aio::ConnectionManager;
use sluice_filter::ValueSet;

use super::chunk::{ChunkWriter, Entry, decode};
use super::feed::{FEED_VALUES, feed_entry};
use super::{
    COMPACT_SLACK, LOG_CHUNK, LogState, READ_CHUNKS, RedisSets, SetRef, WRITE_CHUNKS, corrupt,
};
use crate::Result;

impl RedisSets {
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
    pub(super) async fn compact_if_due(&self, set: SetRef<'_>, at: LogState) -> Result<LogState> {
        let removed: u64 = self.read(redis::cmd("HLEN").arg(self.keys(set.id).removed)).await?;
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
}

/// What a replace wants: the set `values` ask for, each once in request order.
struct Replace<'a> {
    wanted: &'a ValueSet,
    order: &'a [&'a str],
    values: &'a [String],
}

/// Chunks of a rewritten log, written to its staging key [`WRITE_CHUNKS`] at a time.
pub(super) struct Staged<'a> {
    key: &'a str,
    chunk: ChunkWriter,
    full: Vec<(Vec<u8>, i64)>,
    count: i64,
}

impl<'a> Staged<'a> {
    pub(super) fn new(key: &'a str) -> Self {
        Self { key, chunk: ChunkWriter::added(), full: Vec::new(), count: 0 }
    }

    pub(super) fn push(&mut self, seq: i64, value: &str) {
        self.chunk.push(seq, value);
        self.count += 1;
        if self.chunk.len == LOG_CHUNK {
            self.full.push(self.chunk.take());
        }
    }

    /// Writes the full chunks once there are [`WRITE_CHUNKS`] of them.
    pub(super) async fn flush_full(&mut self, conn: &mut ConnectionManager) -> Result<()> {
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
    pub(super) async fn finish(mut self, conn: &mut ConnectionManager) -> Result<i64> {
        if self.chunk.len > 0 {
            self.full.push(self.chunk.take());
        }
        self.flush(conn).await?;
        Ok(self.count)
    }
}
