-- Operators' controls (AdminService): node cordons and drains, job
-- re-queues, the active policy and its knobs, and the audit log of every
-- change. Written by any replica; the leader's next round reads them.

-- A cordoned node takes no new work; a draining one also has its jobs
-- moved off from their checkpoints. NULL cordoned_at = schedulable.
ALTER TABLE nodes
    ADD COLUMN cordoned_at   TIMESTAMPTZ,
    ADD COLUMN cordoned_by   TEXT NOT NULL DEFAULT '',
    ADD COLUMN cordon_reason TEXT NOT NULL DEFAULT '',
    ADD COLUMN draining      BOOLEAN NOT NULL DEFAULT false;

-- Jobs an admin asked to take off their GPUs; the round that does it
-- deletes the row in its commit.
CREATE TABLE job_requeues (
    job_id       UUID PRIMARY KEY REFERENCES jobs (id),
    requested_by TEXT NOT NULL,
    requested_at TIMESTAMPTZ NOT NULL,
    reason       TEXT NOT NULL DEFAULT ''
);

-- The policy set through the admin API (one row at most; none = the
-- scheduler's configuration).
CREATE TABLE policy_setting (
    singleton BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    policy    TEXT NOT NULL,
    knobs     JSONB NOT NULL DEFAULT '{}'::jsonb,  -- {"knob": number}
    set_by    TEXT NOT NULL,
    set_at    TIMESTAMPTZ NOT NULL
);

CREATE TABLE audit_events (
    id      BIGSERIAL PRIMARY KEY,
    at      TIMESTAMPTZ NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,   -- cordon, drain, uncordon, requeue, set_policy
    target  TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_events_at ON audit_events (at DESC);
