-- fmsched scheduler schema, version 13: each job's evaluation metric per
-- epoch, kept across restarts. A running job's curve so far predicts its
-- epochs to a metric target; finished jobs' curves are the prior
-- (estimator::curve_prior).

ALTER TABLE job_estimates ADD COLUMN evals DOUBLE PRECISION[] NOT NULL DEFAULT '{}';
-- How sure the prediction is: (p90 - p10) epochs over the epochs left
-- (0 = sure, or no prediction); Ymir plans on the pessimistic side of it.
ALTER TABLE job_estimates ADD COLUMN spread DOUBLE PRECISION NOT NULL DEFAULT 0;
