//! Iterations to converge (Ymir Eq. 2) with a prior on the Eq. 3 loss
//! curve learned across jobs.
//!
//! Ymir §4.2 fits each job's Eq. 3 curve to its own trace alone. Four
//! parameters fitted to the head of a curve leave its floor open: a trace
//! that stops while the loss still falls fits a high floor reached soon as
//! well as a low floor reached late, and Eq. 2 turns the second into a
//! huge iteration count (from half a trace the per-job fit's APE has a
//! median of 14 % and a mean in the thousands of percent, see
//! `estimator-accuracy`). Here the prior is what finished jobs of the same
//! model looked like, as [`crate::curve_prior`] does for metric curves.
//!
//! **Shape and scale.** Every Eq. 3 curve with `β2 + β3 > 0` is a scaled
//! copy of a normalised one,
//!
//! ```text
//! L(k) = b · ℓ(k / h),   ℓ(x) = f + (1 − f) / (1 + (1 − w)·x + w·x²)
//! ```
//!
//! with `b = L(0)` (the starting loss), `h` the half-life (the iteration at
//! which the loss is halfway down to its floor), `f = β0 / L(0)` the floor
//! as a share of the start and `w ∈ [0, 1]` the share of the second-order
//! term at `h` — in Eq. 3's terms `β0 = b·f`, `β1 = 1/(b(1−f))`,
//! `β2 = (1−w)/(b(1−f)h)`, `β3 = w/(b(1−f)h²)`. `b` and `h` are the
//! job's own (its loss scale, its data and batch size); the shape `(f, w)`
//! is what jobs of one model share, so the shape is what the prior holds.
//!
//! **Prediction** (Bayesian model averaging, as Domhan et al., IJCAI 2015,
//! combine curve families):
//! 1. the library's shapes: finished jobs' fitted curves (one job's worth
//!    each), the shipped shapes together one job's worth
//!    ([`LossLibrary::shipped`]: formulas, not data), and the job's own
//!    Eq. 3 fit (one job's worth: with a long trace it wins on its own);
//! 2. each shape at each half-life `h` on a log grid around the trace
//!    (ratio [`H_RATIO`], from [`H_MIN`] to [`H_MAX`] times the trace's
//!    span) is fitted to the trace by its scale `b` alone (closed form)
//!    and weighted by its prior weight times the Gaussian likelihood
//!    `exp(−SSE / (2σ²))` of the trace, σ the residual the job's own fit
//!    leaves (`SSE / (n − 4)`, at least 0.1 % of the mean loss);
//! 3. each member predicts Eq. 2's `K` of its curve (`b` cancels: Eq. 2
//!    normalises by `L(0)`), capped by the job's budget;
//! 4. the prediction is the weighted median, the spread the weighted 10th
//!    and 90th percentiles.
//!
//! The trace is averaged into at most [`BUCKETS`] points first (the
//! likelihood's σ is measured on the same points). Measured by
//! `estimator-accuracy` (synthetic Eq. 3 curves, each predicted with the
//! other curves as its library): see docs/benchmarks.md.

use crate::curve_prior::quantile;
use crate::loss_curve::{
    FitError, LossCurve, PLATEAU_THRESHOLD, buckets, fit_loss_curve, iterations_to_converge,
};

/// Half-life grid: ratio between neighbours.
pub const H_RATIO: f64 = 1.25;
/// Shortest half-life tried, as a share of the trace's span.
pub const H_MIN: f64 = 0.01;
/// Longest half-life tried, as a multiple of the trace's span.
pub const H_MAX: f64 = 300.0;
/// The trace is averaged into at most this many points.
pub const BUCKETS: usize = 48;
/// Prior weight of all the shipped shapes together, in finished jobs.
pub const SHAPES_MASS: f64 = 1.0;
/// Prior weight of the job's own fit, in finished jobs.
pub const OWN_MASS: f64 = 1.0;
/// Least σ, as a share of the trace's mean loss.
pub const SIGMA_FLOOR_REL: f64 = 0.001;

/// The scale-free shape of an Eq. 3 curve: floor share `f ∈ [0, 1)` and
/// second-order share `w ∈ [0, 1]` (module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossShape {
    pub floor: f64,
    pub quad: f64,
}

impl LossShape {
    /// `ℓ(x)`.
    pub fn eval(&self, x: f64) -> f64 {
        self.floor + (1.0 - self.floor) / (1.0 + (1.0 - self.quad) * x + self.quad * x * x)
    }

    /// The Eq. 3 curve `b·ℓ(k/h)`.
    pub fn curve(&self, b: f64, h: f64) -> LossCurve {
        let d = b * (1.0 - self.floor);
        LossCurve::new(
            b * self.floor,
            1.0 / d,
            (1.0 - self.quad) / (d * h),
            self.quad / (d * h * h),
        )
    }

    /// The shape, start `b` and half-life `h` of an Eq. 3 curve; None for
    /// a flat curve (`β2 = β3 = 0`) or a non-finite one.
    pub fn of(c: &LossCurve) -> Option<(LossShape, f64, f64)> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(c.beta0) && ok(c.beta2) && ok(c.beta3) && c.beta1.is_finite() && c.beta1 > 0.0) {
            return None;
        }
        // Half-life: β3·h² + β2·h = β1 (the denominator doubles).
        let h = if c.beta3 > 0.0 {
            (-c.beta2 + (c.beta2 * c.beta2 + 4.0 * c.beta3 * c.beta1).sqrt()) / (2.0 * c.beta3)
        } else if c.beta2 > 0.0 {
            c.beta1 / c.beta2
        } else {
            return None;
        };
        let b = c.beta0 + 1.0 / c.beta1;
        if !(h.is_finite() && h > 0.0 && b.is_finite() && b > 0.0) {
            return None;
        }
        let shape = LossShape {
            floor: (c.beta0 / b).clamp(0.0, 1.0 - 1e-12),
            quad: (c.beta3 * h * h / c.beta1).clamp(0.0, 1.0),
        };
        Some((shape, b, h))
    }
}

/// Shapes of Eq. 3 curves: finished jobs' and the shipped ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossLibrary {
    jobs: Vec<LossShape>,
    shapes: Vec<LossShape>,
}

impl LossLibrary {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a finished job's fitted curve. False (and nothing added) for a
    /// curve with no shape (flat or not finite).
    pub fn push(&mut self, c: &LossCurve) -> bool {
        match LossShape::of(c) {
            Some((s, _, _)) => {
                self.jobs.push(s);
                true
            }
            None => false,
        }
    }

    /// Jobs' shapes held (not the shipped ones).
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// The prior before any job of the model has finished: floors of 0 to
    /// 80 % of the starting loss (12 values) times second-order shares 0,
    /// 0.1, 0.3, 0.6 and 1 — 60 shapes spanning Eq. 3, together
    /// [`SHAPES_MASS`] jobs' worth. Shapes, not data: with them alone the
    /// job's own fit decides (on `estimator-accuracy`'s synthetic curves the
    /// median prediction equals the own fit's for every curve); what they
    /// add is a spread, which says little of the model (the service does
    /// not weigh it).
    pub fn shipped() -> Self {
        let mut shapes = Vec::with_capacity(60);
        for floor in [
            0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
        ] {
            for quad in [0.0, 0.1, 0.3, 0.6, 1.0] {
                shapes.push(LossShape { floor, quad });
            }
        }
        Self {
            jobs: Vec::new(),
            shapes,
        }
    }

    /// This library with another's shapes added.
    pub fn extended(mut self, other: &LossLibrary) -> Self {
        self.jobs.extend(other.jobs.iter().copied());
        self.shapes.extend(other.shapes.iter().copied());
        self
    }
}

/// Iterations to converge with their spread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossPrediction {
    /// Weighted median of the members' Eq. 2 `K` (≤ the cap).
    pub iterations: u64,
    /// Weighted 10th and 90th percentiles.
    pub low: u64,
    pub high: u64,
    /// The job's own Eq. 3 fit (what a finished job leaves for the
    /// library) and its `K`.
    pub fit: LossCurve,
    pub fit_iterations: u64,
    /// Effective number of members behind the prediction, `(Σw)²/Σw²`.
    pub support: f64,
}

impl LossPrediction {
    /// Relative spread `(high − low) / iterations`.
    pub fn spread(&self) -> f64 {
        (self.high - self.low) as f64 / (self.iterations.max(1)) as f64
    }

    /// The relative spread of the *remaining* iterations after `done`:
    /// `(high − low)` over the iterations the prediction leaves (at least
    /// one), at most 4 — what the plan weighs as uncertainty
    /// (`SchedJob::spread`), as [`crate::curve_prior::remaining_spread`]
    /// for metric targets.
    pub fn remaining_spread(&self, done: u64) -> f64 {
        let left = self.iterations.saturating_sub(done).max(1);
        ((self.high - self.low) as f64 / left as f64).clamp(0.0, 4.0)
    }
}

/// Predicts a job's iterations to converge (Eq. 2, capped at `cap`) from
/// its loss trace and the library. The trace is checked as
/// [`fit_loss_curve`] checks it (errors name the field).
pub fn predict_iterations(
    library: &LossLibrary,
    iterations: &[f64],
    losses: &[f64],
    cap: u64,
) -> Result<LossPrediction, FitError> {
    let fit = fit_loss_curve(iterations, losses)?;
    Ok(predict_with_fit(library, iterations, losses, fit, cap))
}

/// [`predict_iterations`] for a trace already checked and fitted
/// ([`fit_loss_curve`] gave `fit`).
pub fn predict_with_fit(
    library: &LossLibrary,
    iterations: &[f64],
    losses: &[f64],
    fit: LossCurve,
    cap: u64,
) -> LossPrediction {
    let fit_k = iterations_to_converge(&fit, 0.0, PLATEAU_THRESHOLD, cap);
    let (xs, ys) = buckets(iterations, losses, BUCKETS);
    let n = xs.len();
    let mean = ys.iter().sum::<f64>() / n as f64;
    let own_sse: f64 = xs
        .iter()
        .zip(&ys)
        .map(|(&x, &y)| (y - fit.eval(x)).powi(2))
        .sum();
    let sigma = (own_sse / n.saturating_sub(4).max(1) as f64)
        .sqrt()
        .max(SIGMA_FLOOR_REL * mean)
        .max(1e-300);
    let two_var = 2.0 * sigma * sigma;
    let syy: f64 = ys.iter().map(|y| y * y).sum();
    let span = xs[n - 1].max(xs[0]).max(1.0);

    // Members: (K, log weight). The own fit first.
    let mut members: Vec<(f64, f64)> = vec![(fit_k as f64, OWN_MASS.ln() - own_sse / two_var)];
    let shape_prior = SHAPES_MASS / library.shapes.len().max(1) as f64;
    let sets = [(&library.jobs, 1.0), (&library.shapes, shape_prior)];
    let steps = ((H_MAX / H_MIN).ln() / H_RATIO.ln()).ceil() as i32;
    let hs: Vec<f64> = (0..=steps)
        .map(|i| span * H_MIN * H_RATIO.powi(i))
        .collect();
    // Each shape is one member at the half-life that fits it best: the
    // grid finds the basin, a golden-section search on log h the bottom.
    let mut l = vec![0.0; n];
    let mut sse_at = |s: &LossShape, h: f64| -> Option<f64> {
        let (mut sll, mut syl) = (0.0, 0.0);
        for ((li, &x), &y) in l.iter_mut().zip(&xs).zip(&ys) {
            *li = s.eval(x / h);
            sll += *li * *li;
            syl += y * *li;
        }
        // Closed-form scale b = Σyℓ/Σℓ²; SSE = Σy² − (Σyℓ)²/Σℓ².
        (sll > 0.0 && syl > 0.0).then(|| (syy - syl * syl / sll).max(0.0))
    };
    let mut scored: Vec<(LossShape, f64, f64)> = Vec::new();
    for (set, prior) in sets {
        for s in set.iter() {
            let Some((i, _)) = hs
                .iter()
                .enumerate()
                .filter_map(|(i, &h)| sse_at(s, h).map(|e| (i, e)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
            else {
                continue;
            };
            let (mut a, mut b) = (
                hs[i.saturating_sub(1)].ln(),
                hs[(i + 1).min(hs.len() - 1)].ln(),
            );
            const G: f64 = 0.618_033_988_749_895;
            let mut f = |lh: f64| sse_at(s, lh.exp()).unwrap_or(f64::INFINITY);
            let (mut c, mut d) = (b - G * (b - a), a + G * (b - a));
            let (mut fc, mut fd) = (f(c), f(d));
            for _ in 0..24 {
                if fc < fd {
                    b = d;
                    (d, fd) = (c, fc);
                    c = b - G * (b - a);
                    fc = f(c);
                } else {
                    a = c;
                    (c, fc) = (d, fd);
                    d = a + G * (b - a);
                    fd = f(d);
                }
            }
            let (lh, sse) = if fc < fd { (c, fc) } else { (d, fd) };
            if sse.is_finite() {
                scored.push((*s, lh.exp(), prior.ln() - sse / two_var));
            }
        }
    }
    let top = scored
        .iter()
        .map(|m| m.2)
        .chain(std::iter::once(members[0].1))
        .fold(f64::NEG_INFINITY, f64::max);
    // Members whose weight is under 1e-9 of the best cannot move a
    // quantile; Eq. 2 is solved only for the rest.
    for (s, h, lw) in scored {
        if lw - top < -20.7 {
            continue;
        }
        let k = iterations_to_converge(&s.curve(1.0, h), 0.0, PLATEAU_THRESHOLD, cap);
        members.push((k as f64, lw));
    }
    let mut weighted: Vec<(f64, f64)> = members
        .iter()
        .map(|&(k, lw)| (k, (lw - top).exp()))
        .collect();
    let total: f64 = weighted.iter().map(|m| m.1).sum();
    let sq: f64 = weighted.iter().map(|m| m.1 * m.1).sum();
    weighted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let q = |p: f64| quantile(&weighted, total, p).round().clamp(0.0, cap as f64) as u64;
    LossPrediction {
        iterations: q(0.5),
        low: q(0.1),
        high: q(0.9),
        fit,
        fit_iterations: fit_k,
        support: total * total / sq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// xorshift in [−1, 1).
    fn noise(seed: &mut u64) -> f64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }

    /// A trace of `c` over `[0, end]`, `n` points, multiplicative noise.
    fn trace(c: &LossCurve, end: f64, n: usize, rel: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                let k = (end * i as f64 / n as f64).round();
                (k as u64, c.eval(k) * (1.0 + rel * noise(&mut s)))
            })
            .collect::<std::collections::BTreeMap<u64, f64>>()
            .into_iter()
            .map(|(k, v)| (k as f64, v))
            .unzip()
    }

    fn k_of(c: &LossCurve) -> f64 {
        iterations_to_converge(c, 0.0, PLATEAU_THRESHOLD, 100_000_000) as f64
    }

    #[test]
    fn estimate_prior_loss_shape_round_trips_through_eq3() {
        for (f, w, b, h) in [
            (0.3, 0.2, 2.5, 400.0),
            (0.0, 0.0, 1.0, 10.0),
            (0.7, 1.0, 0.4, 3e4),
        ] {
            let s = LossShape { floor: f, quad: w };
            let c = s.curve(b, h);
            // The half-life: the excess over the floor halves at h.
            let half = (c.eval(h) - c.beta0) / (c.eval(0.0) - c.beta0);
            assert!((half - 0.5).abs() < 1e-12, "{half}");
            let (s2, b2, h2) = LossShape::of(&c).unwrap();
            assert!((s2.floor - f).abs() < 1e-12 && (s2.quad - w).abs() < 1e-12);
            assert!((b2 - b).abs() < 1e-12 * b && (h2 - h).abs() < 1e-9 * h);
            for k in [0.0, h / 3.0, h, 7.0 * h] {
                assert!((c.eval(k) - b * s.eval(k / h)).abs() < 1e-12);
            }
        }
        // A flat curve has no shape.
        assert!(LossShape::of(&LossCurve::new(0.1, 1.0, 0.0, 0.0)).is_none());
        assert!(!LossLibrary::new().push(&LossCurve::new(0.1, f64::NAN, 0.1, 0.0)));
    }

    /// Jobs of one model: floors near 40 % of the start, a little
    /// second-order term, their own scale and half-life (30–120
    /// iterations: Eq. 2's plateau rule, a 0.1 % drop per iteration, is
    /// met at once by a curve much slower than that).
    fn family(i: u64) -> LossCurve {
        // splitmix64: neighbouring i give unrelated draws.
        let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let mut s = (z ^ (z >> 27)) | 1;
        let floor = 0.4 + 0.05 * noise(&mut s);
        let quad = 0.2 + 0.1 * noise(&mut s);
        let b = 1.0 + 1.6 * noise(&mut s).abs();
        let h = 30.0 * 10f64.powf(0.6 * noise(&mut s).abs());
        LossShape { floor, quad }.curve(b, h)
    }

    #[test]
    fn estimate_prior_loss_learns_the_family_from_finished_jobs() {
        // Ten finished jobs of the model teach the prior; twenty new jobs
        // are predicted from the first half of the iterations they need.
        let mut lib = LossLibrary::shipped();
        for i in 0..10 {
            assert!(lib.push(&family(i)));
        }
        let (mut prior_ape, mut fit_ape, mut inside) = (0.0, 0.0, 0);
        let n = 20;
        for i in 100..100 + n {
            let truth = family(i);
            let k = k_of(&truth);
            let (xs, ys) = trace(&truth, 0.5 * k, 200, 0.05, i);
            let p = predict_iterations(&lib, &xs, &ys, 100_000_000).unwrap();
            prior_ape += (p.iterations as f64 - k).abs() / k;
            fit_ape += (p.fit_iterations as f64 - k).abs() / k;
            inside += usize::from(p.low as f64 <= k && k <= p.high as f64);
        }
        let (prior_ape, fit_ape) = (prior_ape / n as f64, fit_ape / n as f64);
        assert!(prior_ape < 0.15, "prior APE {prior_ape}");
        assert!(
            prior_ape < 0.6 * fit_ape,
            "prior {prior_ape} vs own fit {fit_ape}"
        );
        assert!(inside >= 13, "truth inside p10–p90 for {inside} of {n}");
    }

    #[test]
    fn estimate_prior_loss_a_full_trace_follows_the_jobs_own_fit() {
        // A job unlike the library's shapes, with its whole curve seen:
        // the prediction is its own (near the truth), not the prior's.
        let mut lib = LossLibrary::new();
        for i in 0..10 {
            lib.push(&family(i));
        }
        let truth = LossShape {
            floor: 0.05,
            quad: 0.0,
        }
        .curve(3.0, 250.0);
        let k = k_of(&truth);
        let (xs, ys) = trace(&truth, 1.5 * k, 400, 0.02, 3);
        let p = predict_iterations(&lib, &xs, &ys, 100_000_000).unwrap();
        assert!(
            (p.iterations as f64 - k).abs() / k < 0.05,
            "{} vs {k} (own fit {})",
            p.iterations,
            p.fit_iterations
        );
    }

    #[test]
    fn estimate_prior_loss_more_trace_narrows_the_spread() {
        let lib = LossLibrary::shipped();
        let truth = family(42);
        let k = k_of(&truth);
        let spread = |frac: f64| {
            let (xs, ys) = trace(&truth, frac * k, 200, 0.03, 9);
            predict_iterations(&lib, &xs, &ys, 100_000_000)
                .unwrap()
                .spread()
        };
        let (short, long) = (spread(0.3), spread(1.2));
        assert!(long < short, "{long} vs {short}");
    }

    #[test]
    fn estimate_prior_loss_bad_traces_are_refused_naming_the_field() {
        let lib = LossLibrary::shipped();
        let k: Vec<f64> = (0..10).map(f64::from).collect();
        let mut l: Vec<f64> = k.iter().map(|x| 1.0 / (1.0 + x)).collect();
        l[3] = f64::INFINITY;
        assert_eq!(
            predict_iterations(&lib, &k, &l, 1000),
            Err(FitError::NotFinite {
                field: "losses",
                index: 3
            })
        );
        assert!(matches!(
            predict_iterations(&lib, &k[..2], &l[..2], 1000),
            Err(FitError::TooFewPoints { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever the trace, low ≤ median ≤ high ≤ cap.
        #[test]
        fn estimate_prior_loss_predictions_are_ordered_and_capped(
            f in 0.0f64..0.9, w in 0.0f64..1.0, h in 1.0f64..1e5,
            frac in 0.05f64..3.0, cap in 1u64..10_000_000, seed in 1u64..1000,
        ) {
            let truth = LossShape { floor: f, quad: w }.curve(2.0, h);
            let (xs, ys) = trace(&truth, (frac * h).max(10.0), 60, 0.05, seed);
            if let Ok(p) = predict_iterations(&LossLibrary::shipped(), &xs, &ys, cap) {
                prop_assert!(p.low <= p.iterations && p.iterations <= p.high && p.high <= cap);
                prop_assert!(p.support >= 1.0 - 1e-9);
            }
        }
    }
}
