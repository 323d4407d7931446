//! Layer elasticity (ICEFROG §III, Eq. 1–8): frozen penalty, layer-aware
//! throughput and effective progress, the equations alone. Derived LUT
//! variants (frozen layers, AMP, checkpointing, PETL) are
//! [`crate::lut::variants`]; a process's GPU footprint for the sharing rule
//! is [`crate::footprint`].
//!
//! Misprint fixed: ICEFROG Eq. 8 as printed sets the sharing slowdown
//! `λ(s, m, ℓ) = 0` when `s = 0` (the job does not share its GPU), which
//! would give every unshared job zero throughput through Eq. 4. The intent —
//! λ is a slowdown *caused by sharing* — is `λ = 1` without sharing, `0` when
//! sharing breaks the packing rules (the pair is not allowed), and `0.9`
//! otherwise. [`sharing_slowdown`] does that; `unshared_jobs_keep_their_throughput`
//! shows why.

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
}
