-- fmsched scheduler schema, version 5: merges decided by the task merger.
--
-- A merge (Ymir §5) pairs two jobs of one model: temporal (A ↦ B: B starts
-- from A's output weights) or spatial (A ‖ B: one joint multi-task process).
-- It is kept once decided (only its GPU count is re-optimised) until the
-- merge guard (Ymir §4.3) splits it. A job merges at most once. The gains
-- are the estimator's predictions when the merge was decided.

CREATE TABLE merges (
    id           BIGSERIAL PRIMARY KEY,
    job_a        UUID NOT NULL REFERENCES jobs (id),
    job_b        UUID NOT NULL REFERENCES jobs (id),
    mode         TEXT NOT NULL CHECK (mode IN ('temporal', 'spatial')),
    gain_ab      DOUBLE PRECISION NOT NULL,
    gain_ba      DOUBLE PRECISION NOT NULL,
    state        TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'split')),
    -- The guard saw the first two epochs improve: it checks no more.
    guard_passed BOOLEAN NOT NULL DEFAULT FALSE,
    reason       TEXT NOT NULL DEFAULT '',
    decided_at   TIMESTAMPTZ NOT NULL,
    split_at     TIMESTAMPTZ,
    CHECK (job_a <> job_b)
);

CREATE UNIQUE INDEX merges_job_a_idx ON merges (job_a);
CREATE UNIQUE INDEX merges_job_b_idx ON merges (job_b);
