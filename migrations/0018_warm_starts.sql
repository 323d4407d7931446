-- fmsched scheduler schema, version 18: warm starts.
--
-- A warm start is a temporal merge whose A had already completed when it
-- was decided: B starts from A's output weights (Ymir's temporal transfer
-- from an A that is done). A finished job may be the A of many warm
-- starts, so "a job merges at most once" holds for a job's own merges
-- (not warm) as A, and for every merge as B.
ALTER TABLE merges ADD COLUMN warm BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE merges ADD CONSTRAINT merges_warm_is_temporal CHECK (NOT warm OR mode = 'temporal');
DROP INDEX merges_job_a_idx;
CREATE UNIQUE INDEX merges_job_a_idx ON merges (job_a) WHERE NOT warm;
