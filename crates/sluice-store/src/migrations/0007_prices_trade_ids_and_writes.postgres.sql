-- Token prices, second step (docs/prices.md). The SQLite script is the same but for
-- WITHOUT ROWID.
--
-- Counted trade ids keyed by block time first: trades arrive roughly in time order, so new
-- ids are appended at the right edge of the key instead of landing on random pages of a
-- large tree (the old key started with the transaction hash), and the retention delete is a
-- range at the left edge, with no second index. A duplicate of a trade carries its block
-- time, so the time in the key does not change which trades are duplicates.
CREATE TABLE price_trade_ids (
    block_time BIGINT NOT NULL,
    chain TEXT NOT NULL,
    transaction_hash TEXT NOT NULL,
    log_index BIGINT NOT NULL,
    PRIMARY KEY (block_time, chain, transaction_hash, log_index)
);
INSERT INTO price_trade_ids (block_time, chain, transaction_hash, log_index)
    SELECT block_time, chain, transaction_hash, log_index FROM price_trades;
DROP TABLE price_trades;

-- One row counting the transactions that changed candles. A price service that keeps
-- candles in memory remembers the count its memory matches; when the stored count differs,
-- another writer changed candles and the memory is not used until reloaded.
CREATE TABLE price_writes (
    id BIGINT NOT NULL PRIMARY KEY,
    seq BIGINT NOT NULL
);
INSERT INTO price_writes (id, seq) VALUES (1, 0);
