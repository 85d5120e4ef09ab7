-- The nodes of a cluster: each `sluice serve` process writes its row every heartbeat.
-- `heartbeat_ms` is the database's clock (milliseconds since the epoch) at the last write, so
-- liveness never depends on the nodes' clocks agreeing; `report` is the node's own JSON
-- (address, start time, the workers it runs), read back by the other nodes.
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    heartbeat_ms BIGINT NOT NULL,
    report TEXT NOT NULL
);
