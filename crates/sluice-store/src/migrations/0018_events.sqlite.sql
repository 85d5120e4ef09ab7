-- Service events (docs/events.md). `id` numbers events in the order they were stored (the
-- API's cursor and the SSE id); `dedupe_key` names a fact several nodes may report at once
-- (a node lost, a chain stalled), kept once. `severity` is 0 info, 1 warning, 2 error.
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dedupe_key TEXT UNIQUE,
    time TEXT NOT NULL,
    org_id TEXT,
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    severity BIGINT NOT NULL,
    pipeline_id TEXT,
    job_id TEXT,
    chain TEXT,
    node TEXT,
    message TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX events_by_org ON events (org_id, id);
CREATE INDEX events_by_pipeline ON events (pipeline_id, id);
CREATE INDEX events_by_time ON events (time);
-- An organization's notification destinations (a JSON array), and per destination how far
-- delivery got: `delivered_id` is the last event it acknowledged.
CREATE TABLE notification_destinations (
    org_id TEXT PRIMARY KEY REFERENCES orgs (id) ON DELETE CASCADE,
    destinations TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE notification_progress (
    org_id TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    uid TEXT NOT NULL,
    delivered_id BIGINT NOT NULL,
    delivered_count BIGINT NOT NULL,
    failures BIGINT NOT NULL,
    last_error TEXT,
    last_attempt_at TEXT,
    last_delivered_at TEXT,
    PRIMARY KEY (org_id, uid)
);
-- Thresholds of the events that have them, by subject (`pipeline:<id>`, `chain:<name>`):
-- a JSON object of the settings given (docs/events.md, "Thresholds").
CREATE TABLE event_thresholds (
    subject TEXT PRIMARY KEY,
    settings TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
