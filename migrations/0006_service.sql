-- fmsched scheduler schema, version 6: the service each job has received.
--
-- The baselines rank jobs by it (Tiresias: attained GPU-seconds and time
-- run; Themis: leases and the deserved service of an equal share). Every
-- stored plan adds the time since the previous one (`plan_generation.
-- stored_at`) under the plan that held in between, in the same transaction,
-- so a restart or a fail-over neither loses nor double-counts service.

CREATE TABLE job_service (
    job_id            UUID PRIMARY KEY REFERENCES jobs (id),
    -- GPU-seconds held (training, not profiling).
    attained_gpu_s    DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (attained_gpu_s >= 0),
    -- Seconds held.
    executed_s        DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (executed_s >= 0),
    -- GPU-seconds an equal share of the cluster (at most the job's request)
    -- would have given it while it was live.
    fair_share_gpu_s  DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (fair_share_gpu_s >= 0),
    -- Themis: its GPUs are its own until then; NULL = no lease.
    lease_until       TIMESTAMPTZ
);

ALTER TABLE plan_generation ADD COLUMN stored_at TIMESTAMPTZ;
