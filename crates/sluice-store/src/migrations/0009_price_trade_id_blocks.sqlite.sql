-- Token prices, fourth step (docs/prices.md): counted trade ids are stored compactly. Each
-- counted batch appends one row per hour of block time it touched (`bucket`: Unix seconds
-- / 3600), holding the 16-byte ids of that hour's new trades concatenated (the first 16
-- bytes of SHA-256 over chain, transaction hash and log index; the service computes them),
-- tagged with the batch's write count (`price_writes.seq`; 0 for ids moved over from the
-- old table). The service reads a bucket's rows whole when a trade of that hour first
-- arrives, and the rows written after the count it knows when another process wrote.
-- The PostgreSQL script is the same but for `BYTEA` and the key.
--
-- `price_trade_ids` (a row per trade) is moved over and dropped by the service when the
-- store opens (`open_prices`): SQL cannot compute the ids here.
CREATE TABLE price_trade_id_blocks (
    id INTEGER PRIMARY KEY,
    bucket BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    ids BLOB NOT NULL
);
CREATE INDEX price_trade_id_blocks_by_bucket ON price_trade_id_blocks (bucket);
CREATE INDEX price_trade_id_blocks_by_seq ON price_trade_id_blocks (seq);
