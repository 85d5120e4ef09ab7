-- One number that moves with every write of a dataset (made, its entries changed, deleted):
-- a cluster node reads it each second and reads every dataset's row only when it moved.
CREATE TABLE datasets_seq (
    id BIGINT PRIMARY KEY,
    seq BIGINT NOT NULL
);
INSERT INTO datasets_seq (id, seq) VALUES (1, 0);
