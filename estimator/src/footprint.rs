//! What one training process takes of a GPU (ICEFROG Eq. 8's inputs for
//! the sharing rule): its memory from the LUT's memory table, and its SM
//! utilisation from [`UtilizationFit`] on its step's work
//! ([`step_work`]). fmsim and the scheduler both ask this.

use crate::lut::Variant;
use crate::lut::variants::variant_factors;

/// What a one-GPU training process of `variant` of `model` takes of a
/// `gpu_type` GPU at batch `bsz` (ICEFROG Eq. 8's inputs): the memory its
/// profile predicts (the memory table's `fixed + bsz · per_sample`, fitted
/// from the model's profile and adjusted for the variant through θ_ℓ:
/// [`crate::lut::variants::adjust_memory`]) and its utilisation by `fit`, the model's
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
/// AMP, checkpointing and PETL as [`crate::lut::variants::adjust_variant`] counts them.
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

#[cfg(test)]
mod tests {
    use super::*;

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
