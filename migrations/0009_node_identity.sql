-- Node identity and report provenance (hardening).
--
-- A node enrolls with the shared join token and is then issued its own
-- token, valid for its node id only; Postgres keeps its SHA-256, never the
-- token. NULL = not enrolled yet (or enrolled before this migration).
ALTER TABLE nodes ADD COLUMN token_sha256 TEXT;

-- Every node a job has been placed on (training or profiling). A report of
-- a job's process counts only from one of them: a report from any other
-- node is forged (or misrouted) and ignored. Kept after the job left the
-- node, for the checkpoint its suspension reports under the next plan.
CREATE TABLE job_placements (
    job_id   UUID NOT NULL REFERENCES jobs (id),
    node_id  TEXT NOT NULL REFERENCES nodes (id),
    PRIMARY KEY (job_id, node_id)
);
INSERT INTO job_placements (job_id, node_id)
    SELECT DISTINCT job_id, node_id FROM assignments
    ON CONFLICT DO NOTHING;
