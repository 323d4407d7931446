-- fmsched scheduler schema, version 4: profiling runs and their estimates.
--
-- A new job first runs a short profiling allocation (1 GPU, 4 for
-- pipeline-parallel jobs); its loss trace and Task2Vec embedding become the
-- job's estimates (Ymir Fig. 6 steps 2-3), stored so a restart keeps them.

ALTER TABLE assignments ADD COLUMN profile BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE job_estimates (
    job_id         UUID PRIMARY KEY REFERENCES jobs (id),
    -- Iterations to converge (Ymir Eq. 2 on the fitted Eq. 3 curve), capped
    -- by the job's budget; NULL when the trace could not support a fit.
    iterations     BIGINT,
    curve          JSONB,          -- {"beta0":…, "beta1":…, "beta2":…, "beta3":…, "quality":…}
    fisher         DOUBLE PRECISION[] NOT NULL DEFAULT '{}',
    fisher_repeat  DOUBLE PRECISION[] NOT NULL DEFAULT '{}',
    step_time_s    DOUBLE PRECISION,
    note           TEXT NOT NULL DEFAULT '',
    estimated_at   TIMESTAMPTZ NOT NULL
);
