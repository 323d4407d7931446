-- What each round predicts of a live job, for users and SLO metrics: when
-- it finishes at the GPUs the plan gave it (NULL: waiting, merged, or
-- unknown) and whether it is predicted to miss its deadline.
ALTER TABLE job_service
    ADD COLUMN predicted_finish TIMESTAMPTZ,
    ADD COLUMN at_risk          BOOLEAN NOT NULL DEFAULT false;
