-- fmsched scheduler schema, version 19: fresh starts.
--
-- A job that trained from another job's output weights (a warm start, or
-- B of a temporal merge whose A completed) and measured a transfer that
-- hurts so much that starting again from the pre-trained weights finishes
-- it sooner is restarted from them: its progress and checkpoint are reset
-- in the round that decides it, whose plan generation is kept here.
-- Reports of its processes from plans older than that generation are the
-- dropped run's and are ignored. `fresh_pending` holds while the nodes
-- have not reported the fresh process yet; the plan tells them to start
-- the job from its initial weights (DesiredTask.fresh_start) until then.
ALTER TABLE job_progress ADD COLUMN fresh_generation BIGINT;
ALTER TABLE job_progress ADD COLUMN fresh_pending BOOLEAN NOT NULL DEFAULT FALSE;
