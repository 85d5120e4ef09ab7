//! The trade consumer: reads every `<chain>.dex_trade` stream and `hyperliquid.trade` from
//! the stream log with its own consumer group, counts the trades, and commits the offsets
//! only after the candles are stored. A crash in between replays the batch, and the dedup of
//! trade ids makes the replay count nothing twice.
//!
//! On a cluster the nodes share the partitions ([`Share`]): each reads the partitions whose
//! owner is its place among the live nodes, and takes a partition over from the offset the
//! group committed when the nodes change. While nodes disagree about who is live a partition
//! may be read twice (the dedup counts it once) or not at all for a moment (its offsets wait
//! for its next owner).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{StreamLog, topics};
use sluice_core::catalog::Catalog;
use sluice_core::prices::Trade;

use crate::service::PriceService;
use crate::trade::{HYPERLIQUID, parse_dex_trade, parse_hyperliquid_trade};

/// The consumer group of the price service.
pub const GROUP: &str = "prices";

/// How a stream's records become trades.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TradeSource {
    /// `<chain>.dex_trade`.
    Dex { chain: String },
    /// `hyperliquid.trade`.
    Hyperliquid,
}

impl TradeSource {
    fn parse(&self, value: &[u8]) -> Result<Trade, crate::TradeError> {
        match self {
            Self::Dex { chain } => parse_dex_trade(chain, value),
            Self::Hyperliquid => parse_hyperliquid_trade(value),
        }
    }
}

/// The finalized trade streams of `catalog` with the way to read each: every chain's
/// `dex_trade`, and Hyperliquid's `trade`. Zerolag streams are not read: a price must not
/// move on a trade of a block that may be reorged away.
pub fn trade_topics(catalog: &Catalog) -> Vec<(String, TradeSource)> {
    let mut out = Vec::new();
    for entry in catalog.entries() {
        let source = match (entry.chain.as_str(), entry.entity.as_str()) {
            (chain, "dex_trade") => TradeSource::Dex { chain: chain.to_owned() },
            (HYPERLIQUID, "trade") => TradeSource::Hyperliquid,
            _ => continue,
        };
        out.push((topics::chain_stream(&entry.chain, &entry.entity, false), source));
    }
    out
}

/// How the consumer paces itself; tests shorten the waits.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerSettings {
    /// Most records read per round, from all partitions together (counted in one
    /// transaction).
    pub batch_size: usize,
    /// Wait after a round that found nothing new; it doubles with each further such round,
    /// up to `idle_wait_max`, and is back to this after a round that read something.
    pub idle_wait: Duration,
    /// The longest wait between rounds while the trade streams are quiet. On Kafka each
    /// read of a partition is a fetch, and a reader left at a partition's end long-polls
    /// the broker until it is parked (2 s unused): a quiet consumer that read every
    /// partition five times a second kept every one of them polled.
    pub idle_wait_max: Duration,
    /// Wait after a failed round before trying again.
    pub retry_wait: Duration,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            // Large enough that a catching-up consumer pays the per-batch costs (statements,
            // a commit) rarely; a live stream's rounds read what is there, usually far less.
            batch_size: 50_000,
            idle_wait: Duration::from_millis(200),
            idle_wait_max: Duration::from_secs(5),
            retry_wait: Duration::from_secs(1),
        }
    }
}

struct Stream {
    topic: String,
    source: TradeSource,
    /// Next offset to read, by partition this node reads.
    next: BTreeMap<u32, u64>,
    /// Whether `next` was read for the present share (the topic exists).
    found: bool,
}

/// This node's place among the nodes that share the trade streams: `(index, count)`, asked
/// before each round. `(0, 1)` reads every partition.
pub type Share = Arc<dyn Fn() -> (usize, usize) + Send + Sync>;

/// Whether partition `partition` of `topic` is read by node `index` of `count`: the
/// partitions of each topic go round the nodes from a place its name picks, so small topics
/// do not all land on the first node.
pub fn reads_partition(topic: &str, partition: u32, (index, count): (usize, usize)) -> bool {
    if count <= 1 {
        return true;
    }
    let start = sluice_core::hash::fnv1a(topic.as_bytes());
    (start.wrapping_add(u64::from(partition)) % count as u64) as usize == index
}

/// Runs the consumer, reading every partition, until the task is aborted.
pub fn spawn_consumer(
    service: Arc<PriceService>,
    log: Arc<dyn StreamLog>,
    streams: Vec<(String, TradeSource)>,
    settings: ConsumerSettings,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(consume(service, log, streams, settings, Arc::new(|| (0, 1))))
}

/// The consumer of [`spawn_consumer`] as a future of the caller's task, reading the
/// partitions `share` gives this node: it never ends.
pub async fn consume(
    service: Arc<PriceService>,
    log: Arc<dyn StreamLog>,
    streams: Vec<(String, TradeSource)>,
    settings: ConsumerSettings,
    share: Share,
) {
    let mut streams: Vec<Stream> = streams
        .into_iter()
        .map(|(topic, source)| Stream { topic, source, next: BTreeMap::new(), found: false })
        .collect();
    tracing::info!(streams = streams.len(), "price consumer started");
    let mut rotation = 0;
    let mut place = share();
    let mut idle = settings.idle_wait;
    loop {
        let now = share();
        if now != place {
            // Partitions change hands: each is read again from the group's commit.
            tracing::info!(
                index = now.0,
                nodes = now.1,
                "price consumer shares the trade streams anew"
            );
            place = now;
            for stream in &mut streams {
                stream.next.clear();
                stream.found = false;
            }
        }
        match round(&service, log.as_ref(), &mut streams, settings.batch_size, &mut rotation, place)
            .await
        {
            Ok(0) => {
                tokio::time::sleep(idle).await;
                idle = (idle * 2).min(settings.idle_wait_max.max(settings.idle_wait));
            }
            Ok(_) => idle = settings.idle_wait,
            Err(error) => {
                tracing::warn!(%error, "price consumer round failed; retrying");
                tokio::time::sleep(settings.retry_wait).await;
            }
        }
    }
}

/// Reads up to `batch_size` records from the partitions (starting at a different partition
/// each round, so that none is starved when others have a backlog), counts their trades,
/// then commits. Returns the number of records read.
async fn round(
    service: &PriceService,
    log: &dyn StreamLog,
    streams: &mut [Stream],
    batch_size: usize,
    rotation: &mut usize,
    place: (usize, usize),
) -> Result<usize, crate::PriceError> {
    for stream in streams.iter_mut().filter(|stream| !stream.found) {
        if log.topic(&stream.topic).await?.is_none() {
            continue;
        }
        let committed = log.committed(GROUP, &stream.topic).await?;
        for (partition, range) in log.offsets(&stream.topic).await?.iter().enumerate() {
            let partition = partition as u32;
            if !reads_partition(&stream.topic, partition, place) {
                continue;
            }
            let from = committed.get(&partition).copied().unwrap_or(range.start);
            stream.next.insert(partition, from);
        }
        stream.found = true;
    }
    let partitions: Vec<(usize, u32, u64)> = streams
        .iter()
        .enumerate()
        .flat_map(|(index, stream)| stream.next.iter().map(move |(p, from)| (index, *p, *from)))
        .collect();
    if partitions.is_empty() {
        return Ok(0);
    }
    let first = *rotation % partitions.len();
    *rotation = rotation.wrapping_add(1);
    let mut trades = Vec::new();
    let mut read = 0;
    let mut skipped = 0;
    let mut advanced: Vec<(usize, u32, u64)> = Vec::new();
    for k in 0..partitions.len() {
        let room = batch_size.saturating_sub(read);
        if room == 0 {
            break;
        }
        let (index, partition, from) = partitions[(first + k) % partitions.len()];
        let stream = &streams[index];
        let records = log.read(&stream.topic, partition, from, room).await?;
        let Some(last) = records.last() else { continue };
        advanced.push((index, partition, last.offset + 1));
        read += records.len();
        for record in &records {
            match stream.source.parse(&record.value) {
                Ok(trade) => trades.push(trade),
                Err(error) => {
                    skipped += 1;
                    tracing::warn!(%error, topic = %stream.topic, partition, offset = record.offset, "skipping a record that is not a trade");
                }
            }
        }
    }
    if read == 0 {
        return Ok(0);
    }
    let report = service.ingest(trades).await?;
    tracing::debug!(
        read,
        skipped,
        counted = report.counted,
        duplicates = report.duplicates,
        too_old = report.too_old,
        "price consumer round"
    );
    let mut commits: BTreeMap<usize, Vec<(u32, u64)>> = BTreeMap::new();
    for (index, partition, next) in advanced {
        streams[index].next.insert(partition, next);
        commits.entry(index).or_default().push((partition, next));
    }
    for (index, offsets) in commits {
        // A failed commit only means a replay after a restart; the dedup absorbs it.
        if let Err(error) = log.commit(GROUP, &streams[index].topic, &offsets).await {
            tracing::warn!(%error, topic = %streams[index].topic, "price consumer commit failed");
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::reads_partition;

    #[test]
    fn every_partition_is_read_by_exactly_one_node_and_all_nodes_get_some() {
        for count in 1..=5 {
            let mut per_node = vec![0; count];
            for topic in ["base.dex_trade", "ethereum.dex_trade", "hyperliquid.trade"] {
                for partition in 0..8 {
                    let readers: Vec<usize> = (0..count)
                        .filter(|&index| reads_partition(topic, partition, (index, count)))
                        .collect();
                    assert_eq!(readers.len(), 1, "{topic}/{partition} of {count} nodes");
                    per_node[readers[0]] += 1;
                }
            }
            // Each topic gives every node at least its whole share of the eight.
            assert!(per_node.iter().all(|n| *n >= 3 * (8 / count)), "{per_node:?}");
        }
    }
}
