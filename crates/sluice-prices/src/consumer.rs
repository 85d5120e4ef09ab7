//! The trade consumer: reads every `<chain>.dex_trade` stream and `hyperliquid.trade` from
//! the stream log with its own consumer group, counts the trades, and commits the offsets
//! only after the candles are stored. A crash in between replays the batch, and the dedup of
//! trade ids makes the replay count nothing twice.

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
    /// Wait after a round that found nothing new.
    pub idle_wait: Duration,
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
            retry_wait: Duration::from_secs(1),
        }
    }
}

struct Stream {
    topic: String,
    source: TradeSource,
    /// Next offset to read, by partition; empty until the topic was found.
    next: BTreeMap<u32, u64>,
}

/// Runs the consumer until the task is aborted.
pub fn spawn_consumer(
    service: Arc<PriceService>,
    log: Arc<dyn StreamLog>,
    streams: Vec<(String, TradeSource)>,
    settings: ConsumerSettings,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(consume(service, log, streams, settings))
}

/// The consumer of [`spawn_consumer`] as a future of the caller's task: it never ends.
pub async fn consume(
    service: Arc<PriceService>,
    log: Arc<dyn StreamLog>,
    streams: Vec<(String, TradeSource)>,
    settings: ConsumerSettings,
) {
    let mut streams: Vec<Stream> = streams
        .into_iter()
        .map(|(topic, source)| Stream { topic, source, next: BTreeMap::new() })
        .collect();
    tracing::info!(streams = streams.len(), "price consumer started");
    let mut rotation = 0;
    loop {
        match round(&service, log.as_ref(), &mut streams, settings.batch_size, &mut rotation).await
        {
            Ok(0) => tokio::time::sleep(settings.idle_wait).await,
            Ok(_) => {}
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
) -> Result<usize, crate::PriceError> {
    for stream in streams.iter_mut().filter(|stream| stream.next.is_empty()) {
        if log.topic(&stream.topic).await?.is_none() {
            continue;
        }
        let committed = log.committed(GROUP, &stream.topic).await?;
        for (partition, range) in log.offsets(&stream.topic).await?.iter().enumerate() {
            let partition = partition as u32;
            let from = committed.get(&partition).copied().unwrap_or(range.start);
            stream.next.insert(partition, from);
        }
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
