-- fmsched scheduler schema, version 2: the scheduling loop's intent.
--
-- Stored: the plan generation (fences stale plans on agents), each running
-- job's assignment (the intent the reconcilers push), and what a job's
-- processes reported that a restart must not forget (iterations done, the
-- newest checkpoint, the output weights).

CREATE TABLE plan_generation (
    singleton   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    generation  BIGINT NOT NULL
);
INSERT INTO plan_generation (singleton, generation) VALUES (TRUE, 0);

-- One row per job that holds GPUs in the current plan.
CREATE TABLE assignments (
    job_id      UUID PRIMARY KEY REFERENCES jobs (id),
    node_id     TEXT NOT NULL REFERENCES nodes (id),
    gpu_uuids   TEXT[] NOT NULL,
    generation  BIGINT NOT NULL,
    assigned_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE job_progress (
    job_id           UUID PRIMARY KEY REFERENCES jobs (id),
    iteration        BIGINT NOT NULL DEFAULT 0,
    checkpoint_path  TEXT,
    updated_at       TIMESTAMPTZ NOT NULL
);
