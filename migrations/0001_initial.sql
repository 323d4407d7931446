-- fmsched scheduler schema, version 1.
--
-- Stored here: what cannot be relearned — jobs and their append-only
-- history, the node registry. What nodes observe (telemetry, running
-- processes) is relearned from agents after a restart and is not stored.

CREATE TABLE jobs (
    id               UUID PRIMARY KEY,            -- UUIDv7: sorts by submission time
    owner            TEXT NOT NULL,
    name             TEXT NOT NULL,
    model            TEXT NOT NULL,
    spec             JSONB NOT NULL,              -- fmsched_core::JobSpec
    idempotency_key  TEXT,                        -- NULL = no key
    state            TEXT NOT NULL CHECK (state IN
                       ('submitted','profiling','queued','running','completed','failed','cancelled')),
    state_reason     TEXT NOT NULL DEFAULT '',
    output_path      TEXT,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    -- Sequence of this job's newest event; every change of the row writes an
    -- event in the same transaction.
    last_event_seq   BIGINT NOT NULL,
    CONSTRAINT jobs_owner_idempotency_key UNIQUE (owner, idempotency_key)
);

CREATE INDEX jobs_owner_id_idx ON jobs (owner, id DESC);
CREATE INDEX jobs_state_id_idx ON jobs (state, id DESC);

-- Append-only: rows are inserted, never updated or deleted.
CREATE TABLE job_events (
    seq         BIGSERIAL PRIMARY KEY,
    job_id      UUID NOT NULL REFERENCES jobs (id),
    at          TIMESTAMPTZ NOT NULL,
    kind        TEXT NOT NULL,
    from_state  TEXT,
    to_state    TEXT,
    message     TEXT NOT NULL DEFAULT ''
);

CREATE INDEX job_events_job_seq_idx ON job_events (job_id, seq);

CREATE TABLE nodes (
    id                 TEXT PRIMARY KEY,
    hostname           TEXT NOT NULL,
    agent_version      TEXT NOT NULL,
    gpu_backend        TEXT NOT NULL,
    labels             JSONB NOT NULL DEFAULT '{}'::jsonb,
    state              TEXT NOT NULL CHECK (state IN ('available','suspect','offline')),
    registered_at      TIMESTAMPTZ NOT NULL,
    -- Written on registration and state changes, not on every heartbeat.
    last_heartbeat_at  TIMESTAMPTZ NOT NULL,
    state_changed_at   TIMESTAMPTZ NOT NULL
);

CREATE TABLE gpus (
    uuid                TEXT PRIMARY KEY,
    node_id             TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    idx                 INTEGER NOT NULL,
    model               TEXT NOT NULL,
    memory_total_bytes  BIGINT NOT NULL,
    pci_bus_id          TEXT NOT NULL,
    UNIQUE (node_id, idx)
);

-- Node history, for operators (state changes, registrations).
CREATE TABLE node_events (
    seq      BIGSERIAL PRIMARY KEY,
    node_id  TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    at       TIMESTAMPTZ NOT NULL,
    kind     TEXT NOT NULL,
    message  TEXT NOT NULL DEFAULT ''
);

CREATE INDEX node_events_node_seq_idx ON node_events (node_id, seq);
