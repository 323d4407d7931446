-- Queues set live through the admin API (one row at most; none = the
-- scheduler's configuration, [[scheduling.queues]]). The whole set is
-- replaced at once: a department's teams are validated together.
CREATE TABLE queue_setting (
    singleton BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    queues    JSONB NOT NULL,  -- [fmsched_core::queue::QueueSpec]
    set_by    TEXT NOT NULL,
    set_at    TIMESTAMPTZ NOT NULL
);
