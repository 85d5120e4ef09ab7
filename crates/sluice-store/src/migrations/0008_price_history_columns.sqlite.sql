-- Token prices, third step (docs/prices.md): each candle row also holds its history point,
-- packed (`point`: 48 bytes, little-endian: window start as i64, then the volume-weighted
-- price, open, high, close and low as f64 bits), so a history read concatenates the points
-- of a series in SQL and pays the driver's per-row cost once per series instead of once per
-- window, with no decimal parsing. The PostgreSQL script is the same but for `BYTEA`.
--
-- Every candle write sets it. Rows written before this migration are filled when the price
-- store opens (`open_prices`, by the partial index below, which is empty afterwards): the
-- price must be the `f64` the service computes from the exact integer sums, which SQL cannot
-- compute exactly here. Until then a history read falls back to those rows' columns.
ALTER TABLE price_candles ADD COLUMN point BLOB;
CREATE INDEX price_candles_without_point ON price_candles (chain, token, granularity, window_start)
    WHERE point IS NULL;
