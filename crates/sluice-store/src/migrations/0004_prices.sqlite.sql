-- Token prices (docs/prices.md); the PostgreSQL script is the same but for WITHOUT ROWID,
-- which keeps each table in its primary-key B-tree (one tree to update per row, not two). Amount sums are exact integers of 10^-18 units written as
-- decimal text (they outgrow 64 bits); trade order keys are text that sorts like the trades.
CREATE TABLE price_candles (
    chain TEXT NOT NULL,
    token TEXT NOT NULL,
    granularity BIGINT NOT NULL,
    window_start BIGINT NOT NULL,
    open DOUBLE PRECISION NOT NULL,
    high DOUBLE PRECISION NOT NULL,
    low DOUBLE PRECISION NOT NULL,
    close DOUBLE PRECISION NOT NULL,
    usd_volume TEXT NOT NULL,
    token_volume TEXT NOT NULL,
    trade_count BIGINT NOT NULL,
    first_trade TEXT NOT NULL,
    last_trade TEXT NOT NULL,
    PRIMARY KEY (chain, token, granularity, window_start)
) WITHOUT ROWID;
CREATE INDEX price_candles_by_age ON price_candles (granularity, window_start);

CREATE TABLE price_trades (
    chain TEXT NOT NULL,
    transaction_hash TEXT NOT NULL,
    log_index BIGINT NOT NULL,
    block_time BIGINT NOT NULL,
    PRIMARY KEY (chain, transaction_hash, log_index)
) WITHOUT ROWID;
CREATE INDEX price_trades_by_time ON price_trades (block_time);

CREATE TABLE price_tokens (
    chain TEXT NOT NULL,
    token TEXT NOT NULL,
    decimals BIGINT NOT NULL,
    last_trade TEXT NOT NULL,
    PRIMARY KEY (chain, token)
) WITHOUT ROWID;
CREATE INDEX price_tokens_by_last_trade ON price_tokens (last_trade);

CREATE TABLE price_pools (
    chain TEXT NOT NULL,
    token TEXT NOT NULL,
    pool TEXT NOT NULL,
    reserve TEXT NOT NULL,
    last_trade TEXT NOT NULL,
    PRIMARY KEY (chain, token, pool)
) WITHOUT ROWID;
