-- Organization secrets (credentials of external sinks) and the org-admin role that manages
-- them. A value is stored sealed (ChaCha20-Poly1305 under the server's secrets key, whose id
-- is kept beside it so a key rotation can find what to reseal); `revision` changes on every
-- write, so a deployment can tell that a secret it started with has changed since.
ALTER TABLE users ADD COLUMN is_org_admin BOOLEAN NOT NULL DEFAULT FALSE;
CREATE TABLE org_secrets (
    org_id TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    key_id TEXT NOT NULL,
    sealed BYTEA NOT NULL,
    revision TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (org_id, name)
);
