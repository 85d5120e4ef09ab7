-- Identity: organizations, their teams, users (one team membership each) and API keys.
CREATE TABLE orgs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    pipelines_enabled BOOLEAN NOT NULL,
    custom_transforms_enabled BOOLEAN NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (org_id, name)
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    team_id TEXT NOT NULL REFERENCES teams (id),
    name TEXT NOT NULL,
    is_operator BOOLEAN NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (team_id, name)
);

-- Keys are stored only as a SHA-256 hash; `prefix` (the first characters of the key) finds
-- the candidates, whose hashes are then compared in constant time.
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    prefix TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE INDEX api_keys_by_prefix ON api_keys (prefix);

-- Pipelines. Timestamps are fixed-width RFC 3339 text so they sort on both backends;
-- `tags` and `pipeline_config` are JSON text.
CREATE TABLE pipelines (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES orgs (id),
    owner_user_id TEXT NOT NULL REFERENCES users (id),
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    tags TEXT,
    static_egress_ip BOOLEAN NOT NULL,
    pod_size TEXT NOT NULL,
    delivery_guarantee TEXT NOT NULL,
    pipeline_config TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX pipelines_by_org ON pipelines (organization_id, created_at);

-- Roles other than owner (the owner is pipelines.owner_user_id). At most one per user.
CREATE TABLE pipeline_user_roles (
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users (id),
    role TEXT NOT NULL,
    PRIMARY KEY (pipeline_id, user_id)
);
CREATE INDEX pipeline_user_roles_by_user ON pipeline_user_roles (user_id);

CREATE TABLE pipeline_viewer_teams (
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    team_id TEXT NOT NULL REFERENCES teams (id),
    PRIMARY KEY (pipeline_id, team_id)
);
CREATE INDEX pipeline_viewer_teams_by_team ON pipeline_viewer_teams (team_id);

-- Values of set-filter transforms, kept apart from the configuration.
CREATE TABLE filter_values (
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    transform_uid TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (pipeline_id, transform_uid, value)
);
