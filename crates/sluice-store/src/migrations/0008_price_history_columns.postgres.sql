-- Token prices, third step (docs/prices.md): each candle row also holds its history point,
-- packed (`point`: 48 bytes, little-endian: window start as i64, then the volume-weighted
-- price, open, high, close and low as f64 bits), so a history read concatenates the points
-- of a series in SQL and pays the driver's per-row cost once per series instead of once per
-- window, with no decimal parsing. The SQLite script is the same but for `BLOB` and the key.
--
-- Every candle write sets it. Rows written before this migration are filled when the price
-- store opens (`open_prices`, by the partial index below, which is empty afterwards): the
-- price must be the `f64` the service computes from the exact integer sums, which SQL cannot
-- compute exactly here. Until then a history read falls back to those rows' columns.
ALTER TABLE price_candles ADD COLUMN point BYTEA;
CREATE INDEX price_candles_without_point ON price_candles (chain, token, granularity, window_start)
    WHERE point IS NULL;
-- The key also carries the point, so a history read is an index-only scan: the candle rows
-- of a series lie on as many heap pages as windows (candles are written in time order, all
-- tokens interleaved), which cost 80-120 ms for 50 series × 1,440 windows when read from
-- the heap. (SQLite keeps the table in its key already: WITHOUT ROWID.)
ALTER TABLE price_candles DROP CONSTRAINT price_candles_pkey,
    ADD CONSTRAINT price_candles_pkey PRIMARY KEY (chain, token, granularity, window_start)
    INCLUDE (point);
