-- One number that moves with every write of `deployments` (stored, replaced or deleted, a
-- pipeline's deletion included): a cluster node reads it each second and reads the
-- deployments' versions only when it moved.
CREATE TABLE deployments_seq (
    id BIGINT PRIMARY KEY,
    seq BIGINT NOT NULL
);
INSERT INTO deployments_seq (id, seq) VALUES (1, 0);
