-- Expert parallelism is part of a LUT key: an MoE job's step time depends
-- on how many GPUs its experts are spread over (Lina §4.2). Rows stored
-- before this column were keyed without it: 0 = no expert-parallel group,
-- which is what every dense model's key says.
ALTER TABLE lut_measurements
    ADD COLUMN expert_parallel INTEGER NOT NULL DEFAULT 0 CHECK (expert_parallel >= 0);
ALTER TABLE lut_measurements DROP CONSTRAINT lut_measurements_pkey;
ALTER TABLE lut_measurements ADD PRIMARY KEY (model, gpu_type, placement, local_bsz,
    grad_accum, amp, frozen_layers, grad_ckpt, petl, pipeline, expert_parallel);
