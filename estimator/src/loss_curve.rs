//! Loss curves and iterations to converge (Ymir §4.2).
//!
//! Ymir Eq. 3: `L(k) = 1 / (β3·k² + β2·k + β1) + β0`, all β ≥ 0 — Optimus's
//! curve with a second-order term for Adam-trained fine-tuning.
//! Ymir Eq. 2: `K = argmin_k 1(L(k) − L(k+1) ≤ 0.001)` on the max-normalised
//! curve, capped by the job's iteration budget.
//!
//! Where the paper is loose, this module says what it does instead:
//! - Eq. 2 taken literally returns `k = 0` for a curve that starts flat
//!   (β3·k² dominating β2·k): the first differences rise before they fall.
//!   We search only past the steepest point of the curve, i.e. the first
//!   `k` after which the curve has *stopped* improving fast
//!   (`flat_start_is_not_convergence` pins this).
//! - Eq. 2 with a transferred curve (seeds README): `K_B^{A↦B}` is computed
//!   on `L_{A,B}(k) = L_B(k) / (1 + G_{A,B})`, normalised by the maximum of
//!   `L_B` (not of `L_{A,B}`, which would cancel `G`); see
//!   [`iterations_to_converge`] with `gain`.

use crate::fit::{Model, robust_fit};

/// Fitted Ymir Eq. 3 curve over iterations `k ≥ 0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossCurve {
    pub beta0: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub beta3: f64,
    /// Coefficient of determination of the fit, clamped to [0, 1].
    pub quality: f64,
}

/// Why a trace cannot support a fit.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("{field}: need at least {min} points, got {got}")]
    TooFewPoints {
        field: &'static str,
        min: usize,
        got: usize,
    },
    #[error("iterations and {field} have different lengths ({a} vs {b})")]
    LengthMismatch {
        field: &'static str,
        a: usize,
        b: usize,
    },
    #[error("{field}[{index}] is not a finite number")]
    NotFinite { field: &'static str, index: usize },
    #[error("iterations[{index}] must be >= 0 and strictly increasing")]
    NotIncreasing { index: usize },
    #[error("losses[{index}] is negative; Eq. 3 has non-negative coefficients")]
    Negative { index: usize },
    #[error("{field}: the trace is constant; it does not determine a curve")]
    Constant { field: &'static str },
    #[error("{field}: {max} points at most, got {got}")]
    TooManyPoints {
        field: &'static str,
        max: usize,
        got: usize,
    },
}

/// Longest trace accepted (longer traces are an input error, not a fit).
pub const MAX_POINTS: usize = 1_000_000;
/// Traces are averaged into at most this many buckets before fitting.
const FIT_POINTS: usize = 1_000;
pub const MIN_LOSS_POINTS: usize = 5;
pub const MIN_METRIC_POINTS: usize = 3;

impl LossCurve {
    /// `L(k)`, Ymir Eq. 3.
    pub fn eval(&self, k: f64) -> f64 {
        1.0 / (self.beta3 * k * k + self.beta2 * k + self.beta1) + self.beta0
    }

    /// Builds a curve from its coefficients (quality 1).
    pub fn new(beta0: f64, beta1: f64, beta2: f64, beta3: f64) -> Self {
        Self {
            beta0,
            beta1,
            beta2,
            beta3,
            quality: 1.0,
        }
    }
}

/// Eq. 3 on scaled axes: x = k / k_scale, y = L / y_scale; p = [b0, c1, c2, c3].
struct ScaledLoss;

impl Model for ScaledLoss {
    const N: usize = 4;
    fn eval(&self, p: &[f64], x: f64) -> f64 {
        1.0 / (p[1] + p[2] * x + p[3] * x * x) + p[0]
    }
    fn grad(&self, p: &[f64], x: f64, g: &mut [f64]) {
        self.eval_grad(p, x, g);
    }
    fn eval_grad(&self, p: &[f64], x: f64, g: &mut [f64]) -> f64 {
        let d = p[1] + p[2] * x + p[3] * x * x;
        let inv2 = -1.0 / (d * d);
        g[0] = 1.0;
        g[1] = inv2;
        g[2] = inv2 * x;
        g[3] = inv2 * x * x;
        1.0 / d + p[0]
    }
    fn bounds(&self) -> (&[f64], &[f64]) {
        (&[0.0, 1e-6, 0.0, 0.0], &[1e6, 1e9, 1e12, 1e12])
    }
}

fn check_points(field: &'static str, xs: &[f64], ys: &[f64], min: usize) -> Result<(), FitError> {
    if xs.len() != ys.len() {
        return Err(FitError::LengthMismatch {
            field,
            a: xs.len(),
            b: ys.len(),
        });
    }
    if xs.len() > MAX_POINTS {
        return Err(FitError::TooManyPoints {
            field,
            max: MAX_POINTS,
            got: xs.len(),
        });
    }
    if xs.len() < min {
        return Err(FitError::TooFewPoints {
            field,
            min,
            got: xs.len(),
        });
    }
    for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
        if !x.is_finite() {
            return Err(FitError::NotFinite {
                field: "iterations",
                index: i,
            });
        }
        if !y.is_finite() {
            return Err(FitError::NotFinite { field, index: i });
        }
        if x < 0.0 || (i > 0 && x <= xs[i - 1]) {
            return Err(FitError::NotIncreasing { index: i });
        }
    }
    let (lo, hi) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &y| (l.min(y), h.max(y)));
    if hi - lo <= 1e-12 * hi.abs().max(1.0) {
        return Err(FitError::Constant { field });
    }
    Ok(())
}

/// Averages consecutive points into at most `FIT_POINTS` buckets (keeps the
/// fit fast on long traces and damps step-to-step noise).
fn bucket(xs: &[f64], ys: &[f64]) -> (Vec<f64>, Vec<f64>) {
    buckets(xs, ys, FIT_POINTS)
}

/// Averages consecutive points into at most `n` buckets of equal count
/// (the points as they are when there are no more than `n`).
pub(crate) fn buckets(xs: &[f64], ys: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    if xs.len() <= n {
        return (xs.to_vec(), ys.to_vec());
    }
    let per = xs.len().div_ceil(n.max(1));
    xs.chunks(per)
        .zip(ys.chunks(per))
        .map(|(a, b)| {
            (
                a.iter().sum::<f64>() / a.len() as f64,
                b.iter().sum::<f64>() / b.len() as f64,
            )
        })
        .unzip()
}

fn r_squared(sse: f64, ys: &[f64]) -> f64 {
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
    let sst: f64 = ys.iter().map(|y| (y - mean).powi(2)).sum();
    if sst <= 0.0 {
        0.0
    } else {
        (1.0 - sse / sst).clamp(0.0, 1.0)
    }
}

/// Fits Ymir Eq. 3 to a loss trace (iterations, losses). Robust: several
/// starts, bounded LM, one Huber pass. Errors name what is wrong.
pub fn fit_loss_curve(iterations: &[f64], losses: &[f64]) -> Result<LossCurve, FitError> {
    check_points("losses", iterations, losses, MIN_LOSS_POINTS)?;
    if let Some(i) = losses.iter().position(|&l| l < 0.0) {
        return Err(FitError::Negative { index: i });
    }
    let (xs, ys) = bucket(iterations, losses);
    let k_scale = xs.last().copied().unwrap_or(1.0).max(1.0);
    let y_scale = ys.iter().copied().fold(0.0, f64::max).max(1e-12);
    let xs: Vec<f64> = xs.iter().map(|x| x / k_scale).collect();
    let ys: Vec<f64> = ys.iter().map(|y| y / y_scale).collect();
    let y0 = ys[0].max(1e-6);
    let ymin = ys.iter().copied().fold(f64::MAX, f64::min);
    let mut starts = Vec::new();
    for floor in [0.0, 0.5 * ymin, 0.9 * ymin] {
        let c1 = 1.0 / (y0 - floor).max(1e-3);
        // Matches the curve's value at the end of the trace with a linear
        // or a quadratic denominator.
        let end = 1.0 / (ymin - floor).max(1e-3);
        starts.push(vec![floor, c1, (end - c1).max(0.0), 0.0]);
        starts.push(vec![floor, c1, 0.0, (end - c1).max(0.0)]);
    }
    let f = robust_fit(&ScaledLoss, &starts, &xs, &ys);
    let p = &f.params;
    // Undo the scaling: L = y_scale·(1/D(k/k_scale) + b0).
    Ok(LossCurve {
        beta0: p[0] * y_scale,
        beta1: p[1] / y_scale,
        beta2: p[2] / (y_scale * k_scale),
        beta3: p[3] / (y_scale * k_scale * k_scale),
        quality: r_squared(f.sse, &ys),
    })
}

/// Default plateau threshold of Ymir Eq. 2.
pub const PLATEAU_THRESHOLD: f64 = 0.001;

/// Iterations to converge (Ymir Eq. 2) for a curve scaled by `1/(1+gain)`
/// (gain 0 = the job alone), capped at `cap`. See the module docs for the
/// flat-start and transferred-curve rules. [`Convergence`] answers it for
/// many gains of one curve.
pub fn iterations_to_converge(c: &LossCurve, gain: f64, threshold: f64, cap: u64) -> u64 {
    Convergence::new(c, cap).iterations(gain, threshold)
}

/// Ymir Eq. 2 on one curve, for any gain: the search the round runs for
/// every pair a job may join. The gain scales the loss by `1/(1+G)` and so
/// scales every per-iteration drop by the same factor: where the drop
/// peaks does not depend on it, and is found once here.
#[derive(Clone, Copy, Debug)]
pub struct Convergence {
    curve: LossCurve,
    cap: u64,
    /// The loss at 0, the largest of a non-increasing curve: drops are
    /// relative to it.
    norm: f64,
    /// The iteration at which the drop `L(k) − L(k+1)` peaks.
    peak: u64,
}

impl Convergence {
    pub fn new(c: &LossCurve, cap: u64) -> Self {
        let mut me = Self {
            curve: *c,
            cap,
            norm: c.eval(0.0).max(1e-300),
            peak: 0,
        };
        // The drop is unimodal in k: find its peak (ternary search on
        // integers).
        let (mut lo, mut hi) = (0u64, cap);
        while hi - lo > 2 {
            let m1 = lo + (hi - lo) / 3;
            let m2 = hi - (hi - lo) / 3;
            if me.drop(m1) < me.drop(m2) {
                lo = m1
            } else {
                hi = m2
            }
        }
        me.peak = (lo..=hi)
            .max_by(|&a, &b| me.drop(a).total_cmp(&me.drop(b)))
            .unwrap_or(0);
        me
    }

    /// The unscaled drop `L(k) − L(k+1)` relative to `L(0)`, as
    /// `(D(k+1) − D(k)) / (D(k)·D(k+1))` with D the Eq. 3 denominator:
    /// exact far out, where subtracting two losses that agree to the last
    /// bit leaves rounding noise (which once sent the peak search to a
    /// random k millions of iterations out).
    fn drop(&self, k: u64) -> f64 {
        let c = &self.curve;
        let den = |k: f64| c.beta3 * k * k + c.beta2 * k + c.beta1;
        let k = k as f64;
        (c.beta3 * (2.0 * k + 1.0) + c.beta2) / (den(k) * den(k + 1.0)) / self.norm
    }

    /// Eq. 2 for the curve scaled by `1/(1+gain)`: the first iteration past
    /// the peak whose relative drop is at most `threshold`, else the cap.
    pub fn iterations(&self, gain: f64, threshold: f64) -> u64 {
        // A gain at or below -1 would flip the curve; clamp to a 90 % loss.
        let scale = 1.0 / (1.0 + gain.max(-0.9));
        let met = |k: u64| scale * self.drop(k) <= threshold;
        if !met(self.cap) {
            return self.cap;
        }
        // First k >= peak that meets it (binary search on the falling side).
        let (mut lo, mut hi) = (self.peak, self.cap);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if met(mid) { hi = mid } else { lo = mid + 1 }
        }
        lo
    }
}

/// Saturating metric curve `m(k) = c − 1 / (a·k + b)` (a, b > 0), used to
/// predict when an evaluation metric reaches its target. Lower-is-better
/// metrics are fitted negated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MetricCurve {
    pub a: f64,
    pub b: f64,
    pub c: f64,
    pub lower_is_better: bool,
    pub quality: f64,
}

struct ScaledMetric;

impl Model for ScaledMetric {
    const N: usize = 3;
    fn eval(&self, p: &[f64], x: f64) -> f64 {
        p[2] - 1.0 / (p[0] * x + p[1])
    }
    fn grad(&self, p: &[f64], x: f64, g: &mut [f64]) {
        self.eval_grad(p, x, g);
    }
    fn eval_grad(&self, p: &[f64], x: f64, g: &mut [f64]) -> f64 {
        let d = p[0] * x + p[1];
        let inv2 = 1.0 / (d * d);
        g[0] = inv2 * x;
        g[1] = inv2;
        g[2] = 1.0;
        p[2] - 1.0 / d
    }
    fn bounds(&self) -> (&[f64], &[f64]) {
        (&[1e-9, 1e-6, -1e6], &[1e9, 1e9, 1e6])
    }
}

/// Prediction of when a metric target is reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TargetPrediction {
    /// First iteration at which the fitted curve reaches the target.
    At(f64),
    /// The curve saturates before the target.
    Unreachable { asymptote: f64 },
}

impl MetricCurve {
    pub fn eval(&self, k: f64) -> f64 {
        let v = self.c - 1.0 / (self.a * k + self.b);
        if self.lower_is_better { -v } else { v }
    }

    /// First `k ≥ 0` where the metric reaches `target`.
    pub fn first_reaching(&self, target: f64) -> TargetPrediction {
        let t = if self.lower_is_better {
            -target
        } else {
            target
        };
        if t >= self.c {
            let asym = if self.lower_is_better {
                -self.c
            } else {
                self.c
            };
            return TargetPrediction::Unreachable { asymptote: asym };
        }
        TargetPrediction::At(((1.0 / (self.c - t) - self.b) / self.a).max(0.0))
    }
}

/// Fits the saturating curve to evaluation points.
pub fn fit_metric_curve(
    iterations: &[f64],
    values: &[f64],
    lower_is_better: bool,
) -> Result<MetricCurve, FitError> {
    check_points("metric_values", iterations, values, MIN_METRIC_POINTS)?;
    let (xs, ys) = bucket(iterations, values);
    let k_scale = xs.last().copied().unwrap_or(1.0).max(1.0);
    let sign = if lower_is_better { -1.0 } else { 1.0 };
    let ys: Vec<f64> = ys.iter().map(|y| sign * y).collect();
    let xs: Vec<f64> = xs.iter().map(|x| x / k_scale).collect();
    let (lo, hi) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &y| (l.min(y), h.max(y)));
    let span = (hi - lo).max(1e-6);
    let mut starts = Vec::new();
    for head in [0.1, 0.5, 2.0] {
        let c = hi + head * span;
        let b = 1.0 / (c - ys[0]).max(1e-6);
        let end = 1.0 / (c - ys[ys.len() - 1]).max(1e-6);
        starts.push(vec![(end - b).max(1e-3), b, c]);
    }
    let f = robust_fit(&ScaledMetric, &starts, &xs, &ys);
    Ok(MetricCurve {
        a: f.params[0] / k_scale,
        b: f.params[1],
        c: f.params[2],
        lower_is_better,
        quality: r_squared(f.sse, &ys),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Eq. 2 as the search once ran it: the peak searched on the scaled
    /// drop, for each gain anew.
    fn converge_scaled_peak(c: &LossCurve, gain: f64, threshold: f64, cap: u64) -> u64 {
        let scale = 1.0 / (1.0 + gain.max(-0.9));
        let norm = c.eval(0.0).max(1e-300);
        let den = |k: f64| c.beta3 * k * k + c.beta2 * k + c.beta1;
        let drop = |k: u64| {
            let k = k as f64;
            scale * (c.beta3 * (2.0 * k + 1.0) + c.beta2) / (den(k) * den(k + 1.0)) / norm
        };
        let (mut lo, mut hi) = (0u64, cap);
        while hi - lo > 2 {
            let (m1, m2) = (lo + (hi - lo) / 3, hi - (hi - lo) / 3);
            if drop(m1) < drop(m2) {
                lo = m1
            } else {
                hi = m2
            }
        }
        let peak = (lo..=hi)
            .max_by(|&a, &b| drop(a).total_cmp(&drop(b)))
            .unwrap_or(0);
        if drop(cap) > threshold {
            return cap;
        }
        let (mut lo, mut hi) = (peak, cap);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if drop(mid) <= threshold {
                hi = mid
            } else {
                lo = mid + 1
            }
        }
        lo
    }

    #[test]
    fn one_convergence_search_serves_every_gain() {
        // Curves whose drop peaks at 0 (β3 = 0) and later (β3 > 0), fast
        // and slow, with caps that bind and that do not.
        let mut curves = Vec::new();
        for b2 in [1e-4, 2e-3, 5e-2] {
            for b3 in [0.0, 1e-9, 1e-6, 1e-4] {
                for b1 in [0.5, 2.0] {
                    curves.push(LossCurve::new(0.1, b1, b2, b3));
                }
            }
        }
        for c in &curves {
            for cap in [50, 5_000, 2_000_000, u64::MAX / 4] {
                let search = Convergence::new(c, cap);
                for g in [-2.0, -0.5, -0.1, 0.0, 0.05, 0.3, 1.0, 4.0] {
                    let k = search.iterations(g, PLATEAU_THRESHOLD);
                    assert_eq!(k, iterations_to_converge(c, g, PLATEAU_THRESHOLD, cap));
                    assert_eq!(
                        k,
                        converge_scaled_peak(c, g, PLATEAU_THRESHOLD, cap),
                        "{c:?} cap {cap} gain {g}"
                    );
                }
            }
        }
    }

    /// The fit's one-pass value is `eval`'s exactly (the fit's path, and so
    /// every fitted curve, must not change) and its gradient is the
    /// model's derivative (central differences).
    #[test]
    fn eval_grad_is_eval_bit_for_bit_and_the_derivative() {
        fn check<M: Model>(m: &M, p: &[f64]) {
            for x in [0.0, 1e-3, 0.37, 1.0, 12.5] {
                let mut g = vec![0.0; M::N];
                let v = m.eval_grad(p, x, &mut g);
                assert_eq!(v.to_bits(), m.eval(p, x).to_bits(), "{x}");
                for i in 0..M::N {
                    let h = 1e-6 * p[i].abs().max(1e-3);
                    let (mut up, mut down) = (p.to_vec(), p.to_vec());
                    up[i] += h;
                    down[i] -= h;
                    let fd = (m.eval(&up, x) - m.eval(&down, x)) / (2.0 * h);
                    assert!(
                        (fd - g[i]).abs() <= 1e-6 * g[i].abs() + 1e-9,
                        "x {x} p{i}: {fd} vs {}",
                        g[i]
                    );
                }
            }
        }
        check(&ScaledLoss, &[0.13, 1.7, 3.1, 0.29]);
        check(&ScaledMetric, &[2.3, 0.41, 0.93]);
    }

    fn trace(c: &LossCurve, n: usize, step: f64, noise: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let mut s = seed | 1;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        (0..n)
            .map(|i| {
                let k = i as f64 * step;
                (k, c.eval(k) * (1.0 + noise * rnd()))
            })
            .unzip()
    }

    #[test]
    fn eq3_by_hand() {
        let c = LossCurve::new(0.1, 0.5, 0.01, 0.0001);
        // k = 10: 1/(0.01 + 0.1 + 0.5) + 0.1
        assert!((c.eval(10.0) - (1.0 / 0.61 + 0.1)).abs() < 1e-12);
        assert!((c.eval(0.0) - 2.1).abs() < 1e-12);
    }

    #[test]
    fn fit_recovers_a_clean_curve() {
        let truth = LossCurve::new(0.2, 0.4, 0.002, 1e-6);
        let (k, l) = trace(&truth, 300, 10.0, 0.0, 1);
        let f = fit_loss_curve(&k, &l).unwrap();
        assert!(f.quality > 0.999, "{f:?}");
        for kk in [0.0, 500.0, 2999.0] {
            assert!(
                (f.eval(kk) - truth.eval(kk)).abs() / truth.eval(kk) < 0.01,
                "{kk}: {f:?}"
            );
        }
        let kt = iterations_to_converge(&truth, 0.0, PLATEAU_THRESHOLD, 1_000_000);
        let kf = iterations_to_converge(&f, 0.0, PLATEAU_THRESHOLD, 1_000_000);
        assert!(
            (kf as f64 - kt as f64).abs() / (kt as f64) < 0.02,
            "{kf} vs {kt}"
        );
    }

    #[test]
    fn eq2_by_hand() {
        // L(k) = 1/(1 + k) (β1 = 1, β2 = 1): drop(k) = 1/((k+1)(k+2)),
        // normalised by L(0) = 1. First k with drop <= 0.001: (k+1)(k+2) >= 1000 → k = 31.
        let c = LossCurve::new(0.0, 1.0, 1.0, 0.0);
        assert_eq!(iterations_to_converge(&c, 0.0, 0.001, 10_000), 31);
        // Capped by the budget.
        assert_eq!(iterations_to_converge(&c, 0.0, 0.001, 20), 20);
        // A transferred curve with G = 1 halves every drop: (k+1)(k+2) >= 500 → k = 21.
        assert_eq!(iterations_to_converge(&c, 1.0, 0.001, 10_000), 21);
    }

    /// Seeds README: K_B^{A↦B} must use L_B/(1+G). Re-normalising the
    /// transferred curve by its own maximum would cancel G entirely.
    #[test]
    fn transferred_curve_converges_sooner_and_renormalising_would_hide_it() {
        let b = LossCurve::new(0.1, 0.8, 0.003, 2e-7);
        let alone = iterations_to_converge(&b, 0.0, PLATEAU_THRESHOLD, 1_000_000);
        let helped = iterations_to_converge(&b, 0.4, PLATEAU_THRESHOLD, 1_000_000);
        let hurt = iterations_to_converge(&b, -0.3, PLATEAU_THRESHOLD, 1_000_000);
        assert!(helped < alone && alone < hurt, "{helped} {alone} {hurt}");
        // The wrong reading: normalise L_B/(1+G) by its own max → same K as alone.
        let scaled = LossCurve::new(b.beta0 / 1.4, b.beta1 * 1.4, b.beta2 * 1.4, b.beta3 * 1.4);
        assert_eq!(
            iterations_to_converge(&scaled, 0.0, PLATEAU_THRESHOLD, 1_000_000),
            alone
        );
    }

    /// Eq. 2 far out: the drop is computed from the denominators, not by
    /// subtracting two losses equal to the last bit. Subtracting sent the
    /// peak search to rounding noise millions of iterations out: this
    /// curve converges at 77 and was answered 6,635,119 with a cap of 10⁸
    /// (544 of 20,000 random Eq. 3 curves were answered wrong that way).
    #[test]
    fn eq2_is_exact_with_a_large_cap() {
        let c = LossCurve::new(
            0.163_238_242_821_585_58,
            1.970_471_173_401_739,
            0.072_639_115_909_003_52,
            0.004_247_495_624_400_345,
        );
        let small = iterations_to_converge(&c, 0.0, PLATEAU_THRESHOLD, 10_000);
        assert_eq!(small, 77);
        assert_eq!(
            iterations_to_converge(&c, 0.0, PLATEAU_THRESHOLD, 100_000_000),
            small
        );
    }

    #[test]
    fn flat_start_is_not_convergence() {
        // β2 = 0, β1 large, β3 > 0: the first drops are tiny and grow before
        // they shrink. Literal Eq. 2 would answer k = 0.
        let c = LossCurve::new(0.0, 100.0, 0.0, 0.01);
        let k = iterations_to_converge(&c, 0.0, 1e-6, 1_000_000);
        assert!(k > 100, "{k}");
    }

    #[test]
    fn bad_traces_are_rejected_with_reasons() {
        let k: Vec<f64> = (0..10).map(f64::from).collect();
        assert!(matches!(
            fit_loss_curve(&k[..3], &[1.0, 0.9, 0.8]),
            Err(FitError::TooFewPoints { .. })
        ));
        assert!(matches!(
            fit_loss_curve(&k, &[1.0; 10]),
            Err(FitError::Constant { .. })
        ));
        let mut nan = vec![1.0; 10];
        nan[4] = f64::NAN;
        assert_eq!(
            fit_loss_curve(&k, &nan),
            Err(FitError::NotFinite {
                field: "losses",
                index: 4
            })
        );
        assert!(matches!(
            fit_loss_curve(&k, &[1.0; 9]),
            Err(FitError::LengthMismatch { .. })
        ));
        let mut back = k.clone();
        back[5] = 2.0;
        assert_eq!(
            fit_loss_curve(&back, &[1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]),
            Err(FitError::NotIncreasing { index: 5 })
        );
        let neg: Vec<f64> = (0..10).map(|i| 1.0 - 0.2 * f64::from(i)).collect();
        assert!(matches!(
            fit_loss_curve(&k, &neg),
            Err(FitError::Negative { .. })
        ));
    }

    #[test]
    fn ten_million_points_are_an_input_error_not_a_fit() {
        let k: Vec<f64> = (0..10_000_000).map(f64::from).collect();
        let l = vec![1.0; k.len()];
        assert_eq!(
            fit_loss_curve(&k, &l),
            Err(FitError::TooManyPoints {
                field: "losses",
                max: MAX_POINTS,
                got: 10_000_000
            })
        );
    }

    #[test]
    fn noisy_non_monotone_trace_still_fits() {
        let truth = LossCurve::new(0.3, 0.5, 0.004, 0.0);
        let (k, l) = trace(&truth, 200, 5.0, 0.05, 7);
        let f = fit_loss_curve(&k, &l).unwrap();
        let kt = iterations_to_converge(&truth, 0.0, PLATEAU_THRESHOLD, 1_000_000) as f64;
        let kf = iterations_to_converge(&f, 0.0, PLATEAU_THRESHOLD, 1_000_000) as f64;
        assert!((kf - kt).abs() / kt < 0.15, "{kf} vs {kt}");
    }

    #[test]
    fn metric_target_reached_or_unreachable() {
        // m(k) = 0.9 - 1/(0.01 k + 2)
        let xs: Vec<f64> = (0..8).map(|i| f64::from(i) * 100.0).collect();
        let ys: Vec<f64> = xs.iter().map(|&k| 0.9 - 1.0 / (0.01 * k + 2.0)).collect();
        let m = fit_metric_curve(&xs, &ys, false).unwrap();
        match m.first_reaching(0.85) {
            // 0.9 - 1/(0.01k+2) = 0.85 → k = 1800
            TargetPrediction::At(k) => assert!((k - 1800.0).abs() < 20.0, "{k}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            m.first_reaching(0.95),
            TargetPrediction::Unreachable { .. }
        ));
        // Lower-is-better: a loss metric 1/(0.01k+2) + 0.1 reaching 0.15.
        let loss: Vec<f64> = xs.iter().map(|&k| 0.1 + 1.0 / (0.01 * k + 2.0)).collect();
        let m = fit_metric_curve(&xs, &loss, true).unwrap();
        match m.first_reaching(0.15) {
            TargetPrediction::At(k) => assert!((k - 1800.0).abs() < 20.0, "{k}"),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Fitted curves never increase (all β ≥ 0).
        #[test]
        fn fitted_curves_are_non_increasing(b0 in 0.0f64..1.0, b1 in 0.1f64..5.0, b2 in 0.0f64..0.05, b3 in 0.0f64..1e-5, seed in 1u64..1000) {
            let truth = LossCurve::new(b0, b1, b2, b3);
            let (k, l) = trace(&truth, 100, 20.0, 0.03, seed);
            if let Ok(f) = fit_loss_curve(&k, &l) {
                prop_assert!(f.beta0 >= 0.0 && f.beta1 > 0.0 && f.beta2 >= 0.0 && f.beta3 >= 0.0);
                let mut prev = f.eval(0.0);
                for i in 1..200 {
                    let v = f.eval(f64::from(i) * 25.0);
                    prop_assert!(v <= prev + 1e-12);
                    prev = v;
                }
            }
        }

        /// K grows when the plateau threshold shrinks.
        #[test]
        fn k_grows_as_threshold_shrinks(b1 in 0.1f64..5.0, b2 in 1e-4f64..0.05, b3 in 0.0f64..1e-5, t in 1e-5f64..1e-2) {
            let c = LossCurve::new(0.1, b1, b2, b3);
            let k1 = iterations_to_converge(&c, 0.0, t, 10_000_000);
            let k2 = iterations_to_converge(&c, 0.0, t / 2.0, 10_000_000);
            prop_assert!(k2 >= k1);
        }
    }
}
