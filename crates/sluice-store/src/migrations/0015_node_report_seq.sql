-- Each node's report gets a number that moves only when the report changes: the other
-- nodes read every row's heartbeat age and this number each second, and a report itself only
-- when its number moved (a report is ~350 bytes per worker; reading all of them every second
-- is N² reads that grow with the cluster).
ALTER TABLE nodes ADD COLUMN report_seq BIGINT NOT NULL DEFAULT 0;
