-- fmsched scheduler schema, version 8: jobs over several nodes (gangs).
--
-- A job that trains on several nodes holds one assignment per node: its
-- part of the job's GPUs, the global rank of that part's first GPU, and the
-- rendezvous port of the job's rank 0 (the same on every row of the job;
-- NULL for a job on one node). A job never holds two parts on one node.
ALTER TABLE assignments DROP CONSTRAINT assignments_pkey;
ALTER TABLE assignments ADD PRIMARY KEY (job_id, node_id);
ALTER TABLE assignments
    ADD COLUMN rank_offset  INTEGER NOT NULL DEFAULT 0 CHECK (rank_offset >= 0),
    ADD COLUMN master_port  INTEGER CHECK (master_port BETWEEN 1 AND 65535);

-- Nodes: the address their peers reach them at (the MASTER_ADDR of a gang
-- whose rank 0 runs there); '' = the hostname.
ALTER TABLE nodes ADD COLUMN address TEXT NOT NULL DEFAULT '';

-- A failure is counted once per run of a job: the members of a gang that
-- fail together (or one after the other as their rendezvous breaks) are one
-- failure. A failed process's report counts only when it ran under a plan
-- generation at or after the one that re-queued the job last.
ALTER TABLE job_progress ADD COLUMN last_failed_generation BIGINT;
