-- PromptTuner's Prompt Bank (§4.4.3): per model, the tuned prompts of
-- completed prompt-tuning jobs with their activation features. The
-- two-layer K-medoid index over the features is rebuilt from these rows
-- (core `PromptBank::build`); a prompt evicted past the cap is deleted.
CREATE TABLE prompt_bank (
    job_id UUID PRIMARY KEY,
    seq BIGSERIAL NOT NULL,
    model TEXT NOT NULL,
    location TEXT NOT NULL,
    features DOUBLE PRECISION[] NOT NULL,
    added_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX prompt_bank_by_model ON prompt_bank (model, seq);
