-- fmsched scheduler schema, version 3: retries of failed training processes.
-- A failure is counted once per process (its pid); after `retries` reaches
-- the configured limit the job fails with the process's last log lines.
ALTER TABLE job_progress
    ADD COLUMN retries          INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN last_failed_pid  BIGINT,
    ADD COLUMN retry_after      TIMESTAMPTZ;
