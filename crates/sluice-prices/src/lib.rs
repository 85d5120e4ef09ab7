//! `sluice-prices` owns token prices: reading trades from the chain streams
//! (`<chain>.dex_trade`, `hyperliquid.trade`), counting each once into candles of 15s, 1m,
//! 5m, 1h and 1d, and answering the latest-price and history queries under the rules of
//! docs/contract.md §Token price endpoints.
//!
//! Start at [`PriceService`]; trades come in through [`spawn_consumer`] (its own consumer
//! group on the stream log) or [`PriceService::ingest`]; record parsing is in [`trade`],
//! the exact candle arithmetic in `sluice_core::prices`, storage behind
//! `sluice_store::PriceStore`. `docs/prices.md` explains the semantics. This crate must not
//! depend on the API.

mod consumer;
mod cursor;
mod recent;
mod service;
pub mod trade;

pub use consumer::{
    ConsumerSettings, GROUP, Share, TradeSource, consume, reads_partition, spawn_consumer,
    trade_topics,
};
pub use recent::HOT_HORIZON_SECONDS;
pub use service::{
    DEDUP_HORIZON_SECONDS, HistoryPage, HistoryQuery, HistorySeries, IngestReport, LatestPrice,
    NO_TRADE_CUTOFF_SECONDS, PriceError, PriceService, PriceSettings,
};
pub use trade::TradeError;
