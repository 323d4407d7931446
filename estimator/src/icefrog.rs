//! Layer elasticity (ICEFROG §III, Eq. 1–8): frozen penalty, layer-aware
//! throughput and effective progress, plus the derivation of unprofiled
//! LUT variants (frozen layers, AMP, checkpointing, PETL) from a profiled one.
//!
//! Misprint fixed: ICEFROG Eq. 8 as printed sets the sharing slowdown
//! `λ(s, m, ℓ) = 0` when `s = 0` (the job does not share its GPU), which
//! would give every unshared job zero throughput through Eq. 4. The intent —
//! λ is a slowdown *caused by sharing* — is `λ = 1` without sharing, `0` when
//! sharing breaks the packing rules (the pair is not allowed), and `0.9`
//! otherwise. [`sharing_slowdown`] does that; `unshared_jobs_keep_their_throughput`
//! shows why.

use crate::lut::Variant;

/// ICEFROG Eq. 1: time to accuracy `T_acc = T_age + P / E`.
pub fn time_to_accuracy(age_s: f64, remaining_samples: f64, effective_progress: f64) -> f64 {
    if effective_progress <= 0.0 {
        return f64::INFINITY;
    }
    age_s + remaining_samples / effective_progress
}

/// ICEFROG Eq. 2: effective progress `E = ψ · T`.
pub fn effective_progress(frozen_penalty: f64, throughput: f64) -> f64 {
    frozen_penalty * throughput
}

/// ICEFROG Eq. 3: `ψ_t(ℓ) = σ²_t[ℓ+1:L] / (σ²_{t0}[1:ℓ] + σ²_t[ℓ+1:L])`:
/// the gradient variance the frozen layers had when frozen (`t0`) against the
/// variance of the layers still training. No frozen variance → ψ = 1.
pub fn frozen_penalty(frozen_var_at_freeze: f64, trainable_var_now: f64) -> f64 {
    let f = frozen_var_at_freeze.max(0.0);
    let t = trainable_var_now.max(0.0);
    if f == 0.0 {
        return 1.0;
    }
    t / (f + t)
}

/// ICEFROG Eq. 3 over per-layer variances: `ψ(ℓ)` with the first `ℓ`
/// layers frozen, `variance[i]` layer `i`'s gradient variance (a frozen
/// layer's as it was when frozen, `σ²_{t0}`; the others' now, `σ²_t`).
pub fn frozen_penalty_of_layers(variance: &[f64], frozen: u32) -> f64 {
    let l = (frozen as usize).min(variance.len());
    let clean = |v: &[f64]| {
        v.iter()
            .filter(|x| x.is_finite())
            .map(|x| x.max(0.0))
            .sum::<f64>()
    };
    frozen_penalty(clean(&variance[..l]), clean(&variance[l..]))
}

/// ICEFROG's layer tuner (Eq. 2 with Eq. 15's choice): the frozen layers
/// `ℓ* = argmax_ℓ ψ(ℓ) · T(ℓ)` over `range`, from the per-layer gradient
/// variance (see [`frozen_penalty_of_layers`]) and `throughput(ℓ)`, the
/// samples per second with `ℓ` frozen (Eq. 4; None = does not fit). Ties
/// go to fewer frozen layers. Returns `(ℓ*, E(ℓ*))`; None when nothing in
/// the range runs or no variance was reported.
pub fn tune_frozen_layers(
    variance: &[f64],
    range: std::ops::RangeInclusive<u32>,
    throughput: impl Fn(u32) -> Option<f64>,
) -> Option<(u32, f64)> {
    if variance.is_empty() {
        return None;
    }
    let mut best: Option<(u32, f64)> = None;
    for l in range {
        let Some(t) = throughput(l).filter(|t| t.is_finite() && *t > 0.0) else {
            continue;
        };
        let e = effective_progress(frozen_penalty_of_layers(variance, l), t);
        if best.is_none_or(|(_, b)| e > b * (1.0 + 1e-9)) {
            best = Some((l, e));
        }
    }
    best
}

/// ICEFROG Eq. 4: samples per second `M / T_iter · λ`.
pub fn layer_aware_throughput(global_batch: f64, t_iter: f64, lambda: f64) -> f64 {
    if t_iter <= 0.0 {
        return 0.0;
    }
    global_batch / t_iter * lambda
}

/// ICEFROG Eq. 5: `T_iter = T_fwd + (T_bwd^γ + T_sync^γ)^{1/γ}`, γ ≥ 1
/// (γ = 1: no overlap of backward and synchronisation; γ → ∞: full overlap).
pub fn iteration_time(t_fwd: f64, t_bwd: f64, t_sync: f64, gamma: f64) -> f64 {
    let g = gamma.max(1.0);
    t_fwd + (t_bwd.max(0.0).powf(g) + t_sync.max(0.0).powf(g)).powf(1.0 / g)
}

/// ICEFROG Eq. 6: `T_bwd(m, ℓ) = α + β · θ_ℓ^γ · T_bwd(m, 0)`; θ_ℓ is the
/// FLOPs ratio of the layers still trained.
pub fn backward_time_frozen(
    alpha: f64,
    beta: f64,
    gamma_flop: f64,
    theta: f64,
    t_bwd0: f64,
) -> f64 {
    alpha + beta * theta.clamp(0.0, 1.0).powf(gamma_flop) * t_bwd0
}

/// ICEFROG Eq. 7: `T_sync(a, ℓ) = α + β · ω_ℓ · T_sync(a, 0)`; ω_ℓ is the
/// fraction of parameters still trained.
pub fn sync_time_frozen(alpha: f64, beta: f64, omega: f64, t_sync0: f64) -> f64 {
    alpha + beta * omega.clamp(0.0, 1.0) * t_sync0
}

/// ICEFROG Eq. 8 (fixed, see the module docs): slowdown from GPU sharing.
/// Rules: (1) the sharers' memory fits the GPU, (2) their utilisation sums
/// to at most 100 %.
pub fn sharing_slowdown(
    shared: bool,
    memory_sum_gib: f64,
    gpu_memory_gib: f64,
    utilization_sum_pct: f64,
) -> f64 {
    if !shared {
        return 1.0;
    }
    if memory_sum_gib > gpu_memory_gib || utilization_sum_pct > 100.0 {
        return 0.0;
    }
    fmsched_core::policy::SHARED_SLOWDOWN
}

/// A synthetic per-layer gradient variance, `σ²[i] ∝ i + 1` (layers near
/// the input settle first), stationary — a frozen layer's variance when
/// frozen equals today's. What the fake trainer reports each epoch and
/// what fmsim's layer-elastic jobs are tuned on (no published trace
/// carries per-layer variance). Freezing half of 12 layers gives
/// ψ = 57/78 ≈ 0.73 (Eq. 3).
pub fn synthetic_layer_variance(layers: u32) -> Vec<f64> {
    (1..=layers.max(1)).map(f64::from).collect()
}

/// Eq. 3 over [`synthetic_layer_variance`]: `ψ(ℓ)` of a model of `layers`.
pub fn synthetic_frozen_penalty(frozen: u32, layers: u32) -> f64 {
    frozen_penalty_of_layers(&synthetic_layer_variance(layers), frozen)
}

/// What a one-GPU training process of `variant` of `model` takes of a
/// `gpu_type` GPU at batch `bsz` (ICEFROG Eq. 8's inputs): the memory its
/// profile predicts (the memory table's `fixed + bsz · per_sample`, fitted
/// from the model's profile and adjusted for the variant through θ_ℓ:
/// [`adjust_memory`]) and its utilisation by `fit`, the model's
/// [`UtilizationFit`] on this GPU type (the prior without one). None
/// without a memory table. fmsim and the scheduler both ask this.
pub fn one_gpu_footprint(
    lut: &crate::lut::Lut,
    model: &str,
    gpu_type: &str,
    variant: &Variant,
    bsz: u32,
    fit: Option<&UtilizationFit>,
) -> Option<fmsched_core::policy::GpuFootprint> {
    let memory_gib = lut.memory_of(model, gpu_type, variant, layers_of(model), bsz)?;
    Some(fmsched_core::policy::GpuFootprint {
        memory_gib,
        utilization_pct: fit
            .copied()
            .unwrap_or_default()
            .predict(step_work(model, variant, bsz)),
    })
}

fn layers_of(model: &str) -> u32 {
    crate::analytic::layers_of(model).unwrap_or(12)
}

/// A training step's GPU work in plain-token equivalents: tokens per step
/// (`m` = batch × sequence length) times the variant's compute relative to
/// plain training — θ_ℓ through Eq. 6 (a frozen backward pass is shorter),
/// AMP, checkpointing and PETL as [`adjust_variant`] counts them.
pub fn step_work(model: &str, variant: &Variant, bsz: u32) -> f64 {
    let seq = crate::analytic::MODELS
        .iter()
        .find(|m| m.name == model)
        .map_or(512, |m| m.seq_len);
    let (compute, _) = variant_factors(variant, layers_of(model));
    // Plain training is 1 forward + 2 backward parts (variant_factors).
    f64::from(bsz) * f64::from(seq) * compute / 3.0
}

/// Predicted SM utilisation (percent) of one training process alone on a
/// GPU at `tokens` tokens per step of plain training: the prior of
/// [`UtilizationFit`] (the analytic step-time model's saturation,
/// `analytic::MFU_HALF_TOKENS`: half busy at 4,096 tokens).
pub fn predicted_utilization_pct(tokens: f64) -> f64 {
    UtilizationFit::default().predict(tokens)
}

/// ICEFROG's utilisation regression (`θ_util` of Eq. 14, on `(m, θ_ℓ)`;
/// the paper does not publish its form). fmsched's form: a training
/// process keeps its GPU busy for its step's work `W` ([`step_work`]) and
/// idle for a per-step overhead `h` (input pipeline, kernel launches, the
/// host's share of the step) in the same units, so its SM utilisation is
/// `100 · W / (W + h)`. `h` is fitted per model and GPU type by least
/// squares on the linear form `100/u − 1 = h · (1/W)` from the utilisation
/// the agents measure of processes running alone (NVML), older samples
/// decaying by [`UtilizationFit::DECAY`] each; before
/// [`UtilizationFit::MIN_SAMPLES`] the prior `h = MFU_HALF_TOKENS` holds.
/// ω_ℓ (the share of parameters trained) sets synchronisation, which a
/// one-GPU process does not do: it has no term here.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UtilizationFit {
    /// Σ x·y and Σ x² over the samples (x = 1/W, y = 100/u − 1), decayed.
    pub sum_xy: f64,
    pub sum_xx: f64,
    /// Samples taken (not decayed).
    pub samples: u64,
}

impl UtilizationFit {
    pub const MIN_SAMPLES: u64 = 3;
    /// Weight kept by the older samples at each new one (a measured regime
    /// change dominates after ~50 samples).
    pub const DECAY: f64 = 0.98;
    /// Measured utilisation outside this range says nothing about `h` (an
    /// idle or starting process; a saturated GPU) and is not taken.
    pub const USABLE_PCT: std::ops::RangeInclusive<f64> = 5.0..=99.0;

    /// The fitted per-step overhead `h` (plain-token equivalents).
    pub fn overhead(&self) -> f64 {
        if self.samples >= Self::MIN_SAMPLES && self.sum_xx > 0.0 {
            (self.sum_xy / self.sum_xx).max(0.0)
        } else {
            crate::analytic::MFU_HALF_TOKENS
        }
    }

    /// Predicted utilisation (percent) of a process of step work `work`.
    pub fn predict(&self, work: f64) -> f64 {
        let w = work.max(0.0);
        let h = self.overhead();
        if w + h <= 0.0 {
            return 100.0;
        }
        100.0 * w / (w + h)
    }

    /// Takes one measurement: a process of step work `work` ran alone at
    /// `utilization_pct`. False (nothing learned) outside
    /// [`Self::USABLE_PCT`] or for a non-positive work.
    pub fn add(&mut self, work: f64, utilization_pct: f64) -> bool {
        if !(work > 0.0 && work.is_finite() && Self::USABLE_PCT.contains(&utilization_pct)) {
            return false;
        }
        let x = 1.0 / work;
        let y = 100.0 / utilization_pct - 1.0;
        self.sum_xy = self.sum_xy * Self::DECAY + x * y;
        self.sum_xx = self.sum_xx * Self::DECAY + x * x;
        self.samples += 1;
        true
    }
}

/// Defaults for deriving variants, with their sources:
/// - backward = 2 × forward FLOPs (Kaplan et al. 2020, "Scaling laws", §2.1);
/// - Eq. 6 with α = 0, β = 1, γ_flop = 0.8: ICEFROG Fig. 5 reports sub-linear
///   scaling (γ_flop < 1) of backward time with the trained FLOPs ratio;
/// - Eq. 7 with α = 0, β = 1 (linear in the trained parameter fraction);
/// - FP32 compute takes 2 × AMP compute (NVIDIA's mixed-precision guide
///   reports 1.5–3× speedups for transformer training);
/// - activation checkpointing re-runs the forward pass (+1 forward; Chen et
///   al. 2016);
/// - PETL skips weight gradients of the frozen backbone (backward ≈ ½) and
///   synchronises only adapter parameters (~2 % of the model).
pub const GAMMA_FLOP: f64 = 0.8;
pub const FP32_SLOWDOWN: f64 = 2.0;
pub const PETL_BACKWARD: f64 = 0.5;
pub const PETL_SYNC: f64 = 0.02;

/// Per-variant multipliers relative to the plain variant (AMP on, nothing
/// frozen, no checkpointing, full fine-tuning), whose compute is one part
/// forward and two parts backward: (compute / plain forward, sync / plain sync).
fn variant_factors(v: &Variant, layers: u32) -> (f64, f64) {
    let layers = layers.max(1);
    // θ_ℓ = ω_ℓ: the share of layers still trained (uniform layers).
    let trained = f64::from(layers.saturating_sub(v.frozen_layers)) / f64::from(layers);
    // Eq. 6 and Eq. 7 with α = 0, β = 1: the backward pass stops at the
    // first trained layer and only trained layers synchronise (1 when
    // nothing is frozen).
    let mut bwd = backward_time_frozen(0.0, 1.0, GAMMA_FLOP, trained, 1.0);
    let mut sync = sync_time_frozen(0.0, 1.0, trained, 1.0);
    // PETL on the layers still trained: activation gradients only, and
    // only the adapters synchronise.
    if !v.petl.is_empty() {
        bwd *= PETL_BACKWARD;
        sync *= PETL_SYNC;
    }
    let mut compute = 1.0 + 2.0 * bwd;
    if v.gradient_checkpointing {
        compute += 1.0;
    }
    if !v.amp {
        compute *= FP32_SLOWDOWN;
    }
    (compute, sync)
}

/// Derives (step, sync) of variant `to` from a measured (step, sync) of
/// variant `from` of the same model with `layers` transformer layers. The
/// measured step is read as compute + synchronisation.
pub fn adjust_variant(
    step: f64,
    sync: f64,
    from: &Variant,
    to: &Variant,
    layers: u32,
) -> (f64, f64) {
    let (cf, sf) = variant_factors(from, layers);
    let (ct, st) = variant_factors(to, layers);
    let fwd_plain = (step - sync).max(0.0) / cf;
    let sync_plain = if sf > 0.0 { sync / sf } else { 0.0 };
    let compute = fwd_plain * ct;
    let sync = sync_plain * st;
    (compute + sync, sync)
}

/// Bytes per parameter of mixed-precision (or fp32) Adam training: fp16
/// weight and gradient, fp32 master weight and two moments (ZeRO,
/// Rajbhandari et al. 2020, §3.1); a frozen parameter keeps only its 2-byte
/// weight.
pub const TRAINED_STATE_BYTES: f64 = 16.0;
pub const FROZEN_STATE_BYTES: f64 = 2.0;
/// Activation checkpointing keeps each layer's input, 2 bytes of the
/// `34 + 5·a·s/h` bytes per `s·h` a layer stores (Korthikanti et al. 2022,
/// Eq. 1; ≈ 1/17 for the models here), plus one layer's full activations
/// while it is recomputed.
pub const CKPT_KEPT: f64 = 2.0 / 34.0;

/// Per-variant memory multipliers relative to the plain variant: (state
/// per parameter, activations per sample).
fn memory_factors(v: &Variant, layers: u32) -> (f64, f64) {
    let layers = f64::from(layers.max(1));
    let trained = ((layers - f64::from(v.frozen_layers)) / layers).clamp(0.0, 1.0);
    // Trained parameters: of a PETL job only its adapters (PETL_SYNC of
    // the model), each at full state; everything else at its weight alone.
    let trained_params = if v.petl.is_empty() {
        trained
    } else {
        trained * PETL_SYNC
    };
    let state = (FROZEN_STATE_BYTES + (TRAINED_STATE_BYTES - FROZEN_STATE_BYTES) * trained_params)
        / TRAINED_STATE_BYTES;
    // The backward pass needs the activations of the layers it crosses
    // (at least one layer's, transiently).
    let mut act = trained.max(1.0 / layers);
    if v.gradient_checkpointing {
        act = act * CKPT_KEPT + 1.0 / layers;
    }
    if !v.amp {
        act *= 2.0; // fp32 activations
    }
    (state, act)
}

/// GPU memory (GiB) of variant `to` at local batch `bsz`, from a table of
/// variant `from` read as `fixed + bsz · per_sample` (its state and its
/// activations).
pub fn adjust_memory(
    fixed_gib: f64,
    per_sample_gib: f64,
    from: &Variant,
    to: &Variant,
    layers: u32,
    bsz: u32,
) -> f64 {
    let (sf, af) = memory_factors(from, layers);
    let (st, at) = memory_factors(to, layers);
    fixed_gib * st / sf + f64::from(bsz) * per_sample_gib * at / af
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equations_by_hand() {
        assert!((time_to_accuracy(100.0, 5000.0, 50.0) - 200.0).abs() < 1e-12);
        assert_eq!(time_to_accuracy(1.0, 1.0, 0.0), f64::INFINITY);
        assert!((effective_progress(0.8, 100.0) - 80.0).abs() < 1e-12);
        // ψ = 3 / (1 + 3)
        assert!((frozen_penalty(1.0, 3.0) - 0.75).abs() < 1e-12);
        assert_eq!(frozen_penalty(0.0, 3.0), 1.0);
        assert!((layer_aware_throughput(64.0, 0.5, 0.9) - 115.2).abs() < 1e-12);
        // γ = 1: plain sum; γ = 2: 0.1 + sqrt(0.3² + 0.4²) = 0.6.
        assert!((iteration_time(0.1, 0.3, 0.4, 1.0) - 0.8).abs() < 1e-12);
        assert!((iteration_time(0.1, 0.3, 0.4, 2.0) - 0.6).abs() < 1e-12);
        assert!((backward_time_frozen(0.01, 1.0, 1.0, 0.5, 0.4) - 0.21).abs() < 1e-12);
        assert!((sync_time_frozen(0.0, 1.0, 0.25, 0.4) - 0.1).abs() < 1e-12);
    }

    /// Eq. 8 as printed (λ = 0 for s = 0) would make Eq. 4 zero for every
    /// job that does not share a GPU.
    #[test]
    fn unshared_jobs_keep_their_throughput() {
        let lambda = sharing_slowdown(false, 10.0, 80.0, 50.0);
        assert_eq!(lambda, 1.0);
        assert!(layer_aware_throughput(64.0, 0.5, lambda) > 0.0);
        assert_eq!(sharing_slowdown(true, 10.0, 80.0, 50.0), 0.9);
        assert_eq!(sharing_slowdown(true, 90.0, 80.0, 50.0), 0.0, "memory rule");
        assert_eq!(
            sharing_slowdown(true, 10.0, 80.0, 120.0),
            0.0,
            "utilisation rule"
        );
    }

    /// The tuner freezes nothing when the early layers still carry the
    /// gradient variance (ψ falls faster than throughput rises), freezes
    /// the settled early layers when the variance sits deep, and never
    /// picks an ℓ that does not fit.
    #[test]
    fn the_layer_tuner_weighs_the_penalty_against_throughput() {
        // Throughput rises 5 % per frozen layer of 12.
        let t = |l: u32| Some(100.0 * (1.0 + 0.05 * f64::from(l)));
        let early: Vec<f64> = (0..12).map(|i| f64::from(12 - i).powi(3)).collect();
        assert_eq!(tune_frozen_layers(&early, 0..=10, t).unwrap().0, 0);
        let deep: Vec<f64> = (0..12).map(|i| f64::from(i + 1).powi(3)).collect();
        let (l, e) = tune_frozen_layers(&deep, 0..=10, t).unwrap();
        assert!(l > 0 && l <= 10, "{l}");
        assert!(e > 100.0, "better than training everything: {e}");
        // Eq. 3 by hand: variance 1, 2, 3 with one layer frozen: 5 / 6.
        assert!((frozen_penalty_of_layers(&[1.0, 2.0, 3.0], 1) - 5.0 / 6.0).abs() < 1e-12);
        // Only ℓ ≥ 3 fits: the tuner stays there.
        let fits = |l: u32| (l >= 3).then(|| t(l).unwrap());
        assert_eq!(tune_frozen_layers(&early, 0..=10, fits).unwrap().0, 3);
        assert_eq!(tune_frozen_layers(&[], 0..=10, t), None);
    }

    /// Checkpointing and freezing shrink activations, PETL the optimizer
    /// state, fp32 doubles activations; the identity is exact.
    #[test]
    fn variant_memory_moves_the_right_way() {
        let base = Variant::base();
        let at = |v: &Variant, b| adjust_memory(10.0, 1.0, &base, v, 24, b);
        assert!((at(&base, 8) - 18.0).abs() < 1e-12);
        let ckpt = Variant {
            gradient_checkpointing: true,
            ..base.clone()
        };
        assert!(
            at(&ckpt, 64) < at(&base, 8),
            "64 checkpointed samples fit where 8 did"
        );
        let lora = Variant {
            petl: "lora".into(),
            ..base.clone()
        };
        assert!(at(&lora, 8) < 8.0 + 10.0 * 0.2, "{}", at(&lora, 8));
        let frozen = Variant {
            frozen_layers: 12,
            ..base.clone()
        };
        assert!((at(&frozen, 8) - (10.0 * (2.0 + 14.0 * 0.5) / 16.0 + 4.0)).abs() < 1e-12);
        let fp32 = Variant {
            amp: false,
            ..base.clone()
        };
        assert!((at(&fp32, 8) - 26.0).abs() < 1e-12);
    }

    #[test]
    fn variants_speed_up_and_slow_down_as_expected() {
        let base = Variant::base();
        let (s0, y0) = adjust_variant(0.4, 0.1, &base, &base, 12);
        assert!(
            (s0 - 0.4).abs() < 1e-12 && (y0 - 0.1).abs() < 1e-12,
            "identity"
        );
        let frozen = Variant {
            frozen_layers: 6,
            ..base.clone()
        };
        let (sf, yf) = adjust_variant(0.4, 0.1, &base, &frozen, 12);
        assert!(sf < 0.4 && (yf - 0.05).abs() < 1e-12, "{sf} {yf}");
        let fp32 = Variant {
            amp: false,
            ..base.clone()
        };
        assert!(adjust_variant(0.4, 0.1, &base, &fp32, 12).0 > 0.6);
        let ckpt = Variant {
            gradient_checkpointing: true,
            ..base.clone()
        };
        assert!((adjust_variant(0.4, 0.1, &base, &ckpt, 12).0 - 0.5).abs() < 1e-12);
        let lora = Variant {
            petl: "lora".into(),
            ..base.clone()
        };
        let (sl, yl) = adjust_variant(0.4, 0.1, &base, &lora, 12);
        assert!(sl < 0.3 && yl < 0.01);
        // Round trip: derive a variant, then derive the base back from it.
        let (s1, y1) = adjust_variant(0.4, 0.1, &base, &frozen, 12);
        let (s2, y2) = adjust_variant(s1, y1, &frozen, &base, 12);
        assert!(
            (s2 - 0.4).abs() < 1e-9 && (y2 - 0.1).abs() < 1e-9,
            "{s2} {y2}"
        );
    }

    /// The utilisation regression learns a model's per-step overhead from
    /// measured processes: samples drawn from `h = 12,000` at several batch
    /// sizes give `h` back (the prior is 4,096), the prior holds until
    /// three samples, and idle or saturated readings teach nothing.
    #[test]
    fn utilization_fit_learns_the_overhead_from_measurements() {
        let h = 12_000.0;
        let mut fit = UtilizationFit::default();
        assert_eq!(fit.overhead(), crate::analytic::MFU_HALF_TOKENS);
        assert!((fit.predict(4096.0) - 50.0).abs() < 1e-9, "the prior");
        assert!(!fit.add(4096.0, 100.0), "a saturated reading");
        assert!(!fit.add(4096.0, 0.0), "an idle reading");
        assert!(!fit.add(0.0, 50.0));
        for (k, w) in [2048.0, 8192.0, 16384.0, 65536.0].iter().enumerate() {
            let measured = 100.0 * w / (w + h);
            assert!(fit.add(*w, measured));
            if k < 2 {
                assert_eq!(fit.overhead(), crate::analytic::MFU_HALF_TOKENS);
            }
        }
        assert_eq!(fit.samples, 4);
        assert!((fit.overhead() - h).abs() < 1e-6 * h, "{}", fit.overhead());
        let w = 10_000.0;
        assert!((fit.predict(w) - 100.0 * w / (w + h)).abs() < 1e-6);
        // A later regime (a faster input pipeline, h = 2,000) takes over.
        for _ in 0..200 {
            fit.add(w, 100.0 * w / (w + 2000.0));
        }
        assert!(
            (fit.overhead() - 2000.0).abs() < 100.0,
            "within 5 %: {}",
            fit.overhead()
        );
    }

    /// θ_ℓ in the regression: a job with half its layers frozen does less
    /// work per step than the same job training every layer, so it is
    /// predicted to leave its GPU idler (and to share more readily).
    #[test]
    fn frozen_layers_lower_the_predicted_utilization() {
        let plain = Variant::base();
        let frozen = Variant {
            frozen_layers: 6,
            ..Variant::base()
        };
        let (wp, wf) = (
            step_work("roberta-base", &plain, 8),
            step_work("roberta-base", &frozen, 8),
        );
        assert!((wp - 8.0 * 512.0).abs() < 1e-9, "plain work = tokens: {wp}");
        assert!(wf < wp);
        let fit = UtilizationFit::default();
        assert!(fit.predict(wf) < fit.predict(wp));
    }
}
