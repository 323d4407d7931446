-- ICEFROG's utilisation regression (fmsched's form, see the estimator's
-- UtilizationFit): per model and GPU family, the decayed least-squares sums
-- of the per-step overhead fitted from processes measured running alone.
CREATE TABLE utilization_fits (
    model TEXT NOT NULL,
    gpu_family TEXT NOT NULL,
    sum_xy DOUBLE PRECISION NOT NULL,
    sum_xx DOUBLE PRECISION NOT NULL,
    samples BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (model, gpu_family)
);
