-- fmsched scheduler schema, version 7: leadership as a lease, fenced plans,
-- and merge outcomes.
--
-- Leadership was a Postgres session advisory lock: it lasted as long as the
-- leader's connection, not as long as the leader worked, so a frozen leader
-- held the cluster. It is now a lease with an expiry the leader renews and a
-- standby takes over once it lapses (the database's clock decides both), and
-- an epoch that grows with every new holder. Every round commits in one
-- transaction that first checks, under a lock of this row, that its writer
-- still holds the lease with its epoch; the epoch also travels in every plan
-- an agent receives, so an agent ignores plans of a deposed leader.

CREATE TABLE leader_lease (
    singleton   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    -- Who holds it ("<hostname>/<process uuid>"), '' before anyone did.
    holder      TEXT NOT NULL DEFAULT '',
    epoch       BIGINT NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    expires_at  TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);
INSERT INTO leader_lease DEFAULT VALUES;

-- The epoch of the leader that wrote the current plan.
ALTER TABLE plan_generation ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;

-- The transfer gain a merge showed (Ymir Eq. 1, measured on losses against
-- the jobs' own curves; see docs), once it was sent to the estimator's
-- regression. NULL: not observed yet.
ALTER TABLE merges ADD COLUMN observed_gain DOUBLE PRECISION;
