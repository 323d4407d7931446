//! Unprofiled LUT variants derived from a profiled one (ICEFROG Eq. 6–7
//! for frozen layers; AMP, activation checkpointing and PETL from the
//! sources named below): step and synchronisation times
//! ([`adjust_variant`]) and memory ([`adjust_memory`]).

use super::Variant;
use crate::icefrog::{backward_time_frozen, sync_time_frozen};

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
pub(crate) fn variant_factors(v: &Variant, layers: u32) -> (f64, f64) {
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
}
