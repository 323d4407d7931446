-- Capacity loaning (Lyra): inference servers lent to training. A node of
-- the inference pool (agent label fmsched.io/pool=inference) takes training
-- work only while its loan is 'active'. A reclaim marks it 'reclaiming'
-- (its workers move off from their checkpoints at the next round); the
-- leader's round that finds it empty — nothing planned there and no
-- process reported — marks it 'returned' in its fenced commit.
CREATE TABLE node_loans (
    node_id          TEXT PRIMARY KEY REFERENCES nodes (id),
    state            TEXT NOT NULL CHECK (state IN ('active', 'reclaiming', 'returned')),
    loaned_by        TEXT NOT NULL,
    loaned_at        TIMESTAMPTZ NOT NULL,
    reclaimed_by     TEXT NOT NULL DEFAULT '',
    reclaimed_at     TIMESTAMPTZ,
    reclaim_deadline TIMESTAMPTZ,
    -- Jobs the reclaim decision preempts (ids), and those it only scales in.
    preempted        JSONB NOT NULL DEFAULT '[]'::jsonb,
    scaled_in        JSONB NOT NULL DEFAULT '[]'::jsonb,
    returned_at      TIMESTAMPTZ
);
