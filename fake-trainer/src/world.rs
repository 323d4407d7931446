//! The fake world's laws: loss curves (Ymir Eq. 3), transfer gains, layer
//! variance and frozen layers' penalty, task embeddings.

use fmsched_core::trainer::TaskAssignment;

use crate::var;

/// Deterministic number in [0, 1) from a name.
pub(crate) fn unit(name: &str) -> f64 {
    let mut h = fmsched_core::hash::fnv1a(name.as_bytes());
    h ^= h >> 31;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The Task2Vec-style embedding the fake reports for a task: tasks fall
/// into one of three families per model (the family's heavy-tailed Fisher
/// mass dominates, so tasks of one family are close and others far), plus a
/// task-specific share and a small per-draw perturbation.
pub(crate) fn embedding_of(model: &str, task: &str, repeat: bool) -> Vec<f64> {
    let family = (unit(&format!("{model}|{task}|family")) * 3.0) as u32;
    (0..64)
        .map(|d| {
            let shared = 2.0 * unit(&format!("{model}|family{family}|dim{d}")).powi(4);
            let own = 0.6 * unit(&format!("{model}|{task}|dim{d}")).powi(4);
            let draw = 0.01 * unit(&format!("{model}|{task}|dim{d}|{repeat}"));
            0.02 + shared + own + draw
        })
        .collect()
}

/// The fake world's transfer law: the gain `G` that training on `from` gives
/// `to` (Ymir Eq. 1). It follows Task2Vec's premise with the estimator's
/// prior line (`fmsched_estimator::transfer::GainModel`) plus a deterministic
/// per-pair deviation of up to ±0.08, so the estimator is good, not exact.
pub(crate) fn true_gain(model: &str, from: &str, to: &str, spatial: bool) -> f64 {
    use fmsched_estimator::transfer::{GainModel, TaskEmbedding, spatial_score, temporal_score};
    let emb = |t: &str| TaskEmbedding {
        fisher: embedding_of(model, t, false),
        fisher_repeat: embedding_of(model, t, true),
    };
    let (a, b) = (emb(from), emb(to));
    let s = if spatial {
        spatial_score(&a, &b)
    } else {
        temporal_score(&a, &b)
    };
    let offset: f64 = var("FMSCHED_FAKE_GAIN_OFFSET")
        .and_then(|o| o.parse().ok())
        .unwrap_or(0.0);
    let wobble = 0.16 * (unit(&format!("{model}|{from}->{to}")) - 0.5);
    (GainModel::default().predict(s) + wobble + offset).max(-0.9)
}

/// The synthetic learning behaviour of one task.
pub(crate) struct Curve {
    pub(crate) beta0: f64,
    pub(crate) beta1: f64,
    pub(crate) beta2: f64,
    /// Iterations to half of the metric's headroom.
    pub(crate) half: f64,
    pub(crate) metric_max: f64,
}

impl Curve {
    pub(crate) fn for_task(model: &str, task: &str) -> Curve {
        let k = format!("{model}|{task}");
        let beta1 = 1.0 / (1.0 + 1.5 * unit(&format!("{k}|a")));
        let h = 100.0 + 900.0 * unit(&format!("{k}|h"));
        Curve {
            beta0: 0.1 + 0.3 * unit(&format!("{k}|floor")),
            beta1,
            beta2: beta1 / h,
            half: h,
            metric_max: 0.80 + 0.18 * unit(&format!("{k}|m")),
        }
    }

    /// Ymir Eq. 3 with β3 = 0 at `x` iterations' worth of learning, scaled
    /// by an inherited transfer gain: `L/(1+G)` (seeds README fix of Eq. 2).
    pub(crate) fn loss(&self, x: f64, gain: f64) -> f64 {
        (1.0 / (self.beta2 * x + self.beta1) + self.beta0) / (1.0 + gain)
    }

    /// A saturating metric at `x` iterations' worth of learning.
    pub(crate) fn metric(&self, x: f64) -> f64 {
        0.5 + (self.metric_max - 0.5) * x / (x + self.half)
    }

    /// The evaluation at `x`: the accuracy-like [`Curve::metric`], or for a
    /// lower-is-better target the validation loss (the noiseless curve).
    pub(crate) fn evaluation(&self, x: f64, lower_is_better: bool) -> f64 {
        if lower_is_better {
            self.loss(x, 0.0)
        } else {
            self.metric(x)
        }
    }
}

/// The fake world's per-layer gradient variance
/// ([`fmsched_estimator::icefrog::synthetic_layer_variance`]): what a
/// layer-elastic fake trainer reports each epoch.
pub(crate) fn fake_layer_variance(layers: u32) -> Vec<f64> {
    fmsched_estimator::icefrog::synthetic_layer_variance(layers)
}

/// ICEFROG Eq. 3 for the fake world: `ψ(ℓ)` over [`fake_layer_variance`].
/// Freezing half of 12 layers gives ψ = 57/78 ≈ 0.73.
pub(crate) fn frozen_penalty_of(frozen: u32, layers: u32) -> f64 {
    fmsched_estimator::icefrog::synthetic_frozen_penalty(frozen, layers)
}

pub(crate) fn embedding(task: &TaskAssignment, repeat: bool) -> Vec<f64> {
    embedding_of(&task.model, &task.task, repeat)
}
