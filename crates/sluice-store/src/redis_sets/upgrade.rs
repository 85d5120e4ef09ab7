//! The one-off move of sets an earlier build kept as sorted sets of values into logs
//! ([`RedisSets::upgrade_sorted_sets`]), run before the store serves.

use super::RedisSets;
use super::rewrite::Staged;
use crate::Result;

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

impl RedisSets {
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
}
