-- fmsched estimator schema, version 1. Lives in its own Postgres schema
-- (`fmsched_estimator`) so it can share a database with the scheduler.
--
-- Stored here: what the estimator learns online and cannot recompute —
-- measured step times folded into the throughput LUT, imported profile
-- tables, and observed merge outcomes of the score → gain regression.

-- Running statistics (Welford) of measured step times per exact LUT key.
CREATE TABLE lut_measurements (
    model            TEXT NOT NULL,
    gpu_type         TEXT NOT NULL,
    placement        TEXT NOT NULL,          -- canonical digit string
    local_bsz        INTEGER NOT NULL CHECK (local_bsz > 0),
    grad_accum       INTEGER NOT NULL CHECK (grad_accum > 0),
    amp              BOOLEAN NOT NULL,
    frozen_layers    INTEGER NOT NULL CHECK (frozen_layers >= 0),
    grad_ckpt        BOOLEAN NOT NULL,
    petl             TEXT NOT NULL,          -- '' = full fine-tuning
    pipeline         BOOLEAN NOT NULL,
    n                BIGINT NOT NULL CHECK (n > 0),
    mean_step        DOUBLE PRECISION NOT NULL,
    m2_step          DOUBLE PRECISION NOT NULL,
    mean_sync        DOUBLE PRECISION NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (model, gpu_type, placement, local_bsz, grad_accum, amp,
                 frozen_layers, grad_ckpt, petl, pipeline)
);

-- Profile tables imported through ImportProfile, replayed in order at start.
CREATE TABLE imported_profiles (
    seq          BIGSERIAL PRIMARY KEY,
    model        TEXT NOT NULL,
    gpu_type     TEXT NOT NULL,
    layout       TEXT NOT NULL,
    csv          TEXT NOT NULL,
    imported_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Observed (score, gain) pairs of merges (Ymir Eq. 1), replayed at start.
CREATE TABLE transfer_outcomes (
    seq          BIGSERIAL PRIMARY KEY,
    score        DOUBLE PRECISION NOT NULL,
    gain         DOUBLE PRECISION NOT NULL,
    observed_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
