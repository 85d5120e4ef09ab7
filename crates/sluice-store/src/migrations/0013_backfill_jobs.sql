-- Backfill jobs. The job record is kept as JSON (every field of docs/contract.md §Backfill
-- job, and ours); the columns beside it are what the store selects and orders by: `seq`
-- numbers jobs in the order they were inserted (creation order, also for jobs created in the
-- same microsecond).
CREATE TABLE backfill_jobs (
    job_id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    org_id TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    status TEXT NOT NULL,
    job TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX backfill_jobs_by_org ON backfill_jobs (org_id, seq);
CREATE INDEX backfill_jobs_by_status ON backfill_jobs (status);
