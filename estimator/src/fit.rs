//! A small bounded Levenberg–Marquardt least-squares solver for models with
//! a handful of parameters (the loss and metric curves). Bounds are kept by
//! projecting each step onto the box; robustness against outliers comes from
//! one Huber re-weighting pass.

/// A model `f(x; p)` with its gradient with respect to `p`.
pub trait Model {
    const N: usize;
    fn eval(&self, p: &[f64], x: f64) -> f64;
    fn grad(&self, p: &[f64], x: f64, g: &mut [f64]);
    /// `eval` and `grad` in one pass: a model whose value and gradient
    /// share work (a denominator) overrides it. It must return exactly what
    /// `eval` returns and write exactly what `grad` writes.
    fn eval_grad(&self, p: &[f64], x: f64, g: &mut [f64]) -> f64 {
        self.grad(p, x, g);
        self.eval(p, x)
    }
    /// Lower and upper bound of each parameter.
    fn bounds(&self) -> (&[f64], &[f64]);
}

/// Result of a fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    pub params: Vec<f64>,
    /// Weighted sum of squared residuals.
    pub sse: f64,
    pub iterations: u32,
}

/// Solves `a x = b` (n ≤ 8) by Gaussian elimination with partial pivoting.
/// Returns `None` for a singular system.
pub fn solve(n: usize, a: &mut [f64], b: &mut [f64]) -> Option<()> {
    for col in 0..n {
        let piv =
            (col..n).max_by(|&i, &j| a[i * n + col].abs().total_cmp(&a[j * n + col].abs()))?;
        if a[piv * n + col].abs() < 1e-300 {
            return None;
        }
        if piv != col {
            for k in 0..n {
                a.swap(col * n + k, piv * n + k);
            }
            b.swap(col, piv);
        }
        for row in col + 1..n {
            let f = a[row * n + col] / a[col * n + col];
            for k in col..n {
                a[row * n + k] -= f * a[col * n + k];
            }
            b[row] -= f * b[col];
        }
    }
    for col in (0..n).rev() {
        let mut s = b[col];
        for k in col + 1..n {
            s -= a[col * n + k] * b[k];
        }
        b[col] = s / a[col * n + col];
    }
    Some(())
}

fn clamp_into<M: Model>(m: &M, p: &mut [f64]) {
    let (lo, hi) = m.bounds();
    for i in 0..M::N {
        p[i] = p[i].clamp(lo[i], hi[i]);
    }
}

fn sse<M: Model>(m: &M, p: &[f64], xs: &[f64], ys: &[f64], w: &[f64]) -> f64 {
    xs.iter()
        .zip(ys)
        .zip(w)
        .map(|((&x, &y), &wi)| {
            let r = y - m.eval(p, x);
            wi * r * r
        })
        .sum()
}

/// Bounded LM from `start`; `w` are per-point weights.
pub fn levenberg_marquardt<M: Model>(
    m: &M,
    start: &[f64],
    xs: &[f64],
    ys: &[f64],
    w: &[f64],
    max_iter: u32,
) -> Fit {
    let n = M::N;
    let mut p = start.to_vec();
    clamp_into(m, &mut p);
    let mut cost = sse(m, &p, xs, ys, w);
    let mut lambda = 1e-3;
    let mut g = vec![0.0; n];
    let mut jtj = vec![0.0; n * n];
    let mut jtr = vec![0.0; n];
    // Each trial step's damped system, its solution and the trial point.
    let (mut a, mut step, mut q) = (vec![0.0; n * n], vec![0.0; n], vec![0.0; n]);
    let mut iters = 0;
    while iters < max_iter {
        iters += 1;
        jtj.iter_mut().for_each(|v| *v = 0.0);
        jtr.iter_mut().for_each(|v| *v = 0.0);
        for ((&x, &y), &wi) in xs.iter().zip(ys).zip(w) {
            let r = y - m.eval_grad(&p, x, &mut g);
            for i in 0..n {
                let wg = wi * g[i];
                jtr[i] += wg * r;
                for j in i..n {
                    jtj[i * n + j] += wg * g[j];
                }
            }
        }
        for i in 0..n {
            for j in 0..i {
                jtj[i * n + j] = jtj[j * n + i];
            }
        }
        let mut improved = false;
        for _ in 0..12 {
            a.copy_from_slice(&jtj);
            for i in 0..n {
                a[i * n + i] += lambda * (jtj[i * n + i] + 1e-12);
            }
            step.copy_from_slice(&jtr);
            if solve(n, &mut a, &mut step).is_none() {
                lambda *= 10.0;
                continue;
            }
            for ((qi, pi), si) in q.iter_mut().zip(&p).zip(&step) {
                *qi = pi + si;
            }
            clamp_into(m, &mut q);
            let c = sse(m, &q, xs, ys, w);
            if c.is_finite() && c < cost {
                let rel = (cost - c) / cost.max(1e-300);
                std::mem::swap(&mut p, &mut q);
                cost = c;
                lambda = (lambda * 0.3).max(1e-12);
                improved = true;
                if rel < 1e-10 {
                    return Fit {
                        params: p,
                        sse: cost,
                        iterations: iters,
                    };
                }
                break;
            }
            lambda *= 10.0;
        }
        if !improved {
            break;
        }
    }
    Fit {
        params: p,
        sse: cost,
        iterations: iters,
    }
}

/// Fits from several starts (scouted briefly, the best one refined), then re-weights once with Huber weights
/// (threshold 1.345·MAD/0.6745) from the best start and refits.
pub fn robust_fit<M: Model>(m: &M, starts: &[Vec<f64>], xs: &[f64], ys: &[f64]) -> Fit {
    let ones = vec![1.0; xs.len()];
    // Every start gets a short run; only the best one is polished. Starts
    // that lose after 25 steps practically never win after 200, and this
    // keeps a 1,000-point fit within a millisecond.
    let scout = starts
        .iter()
        .map(|s| levenberg_marquardt(m, s, xs, ys, &ones, 25))
        .min_by(|a, b| a.sse.total_cmp(&b.sse))
        .expect("at least one start");
    let best = levenberg_marquardt(m, &scout.params, xs, ys, &ones, 200);
    let mut res: Vec<f64> = xs
        .iter()
        .zip(ys)
        .map(|(&x, &y)| (y - m.eval(&best.params, x)).abs())
        .collect();
    let mut sorted = res.clone();
    sorted.sort_by(f64::total_cmp);
    let mad = sorted[sorted.len() / 2] / 0.6745;
    if mad <= 0.0 || !mad.is_finite() {
        return best;
    }
    let k = 1.345 * mad;
    for r in res.iter_mut() {
        *r = if *r <= k { 1.0 } else { k / *r };
    }
    let refit = levenberg_marquardt(m, &best.params, xs, ys, &res, 200);
    // Report the unweighted error of the robust parameters.
    Fit {
        sse: sse(m, &refit.params, xs, ys, &ones),
        ..refit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Line;
    impl Model for Line {
        const N: usize = 2;
        fn eval(&self, p: &[f64], x: f64) -> f64 {
            p[0] + p[1] * x
        }
        fn grad(&self, _: &[f64], x: f64, g: &mut [f64]) {
            g[0] = 1.0;
            g[1] = x;
        }
        fn bounds(&self) -> (&[f64], &[f64]) {
            (&[-10.0, 0.0], &[10.0, 10.0])
        }
    }

    #[test]
    fn solves_small_systems() {
        let mut a = vec![2.0, 1.0, 1.0, 3.0];
        let mut b = vec![3.0, 5.0];
        solve(2, &mut a, &mut b).unwrap();
        assert!((b[0] - 0.8).abs() < 1e-12 && (b[1] - 1.4).abs() < 1e-12);
        let mut s = vec![1.0, 2.0, 2.0, 4.0];
        assert!(solve(2, &mut s, &mut [1.0, 1.0]).is_none());
    }

    #[test]
    fn fits_a_line_and_respects_bounds() {
        let xs: Vec<f64> = (0..20).map(f64::from).collect();
        let ys: Vec<f64> = xs.iter().map(|x| 1.0 + 2.0 * x).collect();
        let f = robust_fit(&Line, &[vec![0.0, 0.0]], &xs, &ys);
        assert!((f.params[0] - 1.0).abs() < 1e-6 && (f.params[1] - 2.0).abs() < 1e-6);
        // A falling line cannot be fitted with slope >= 0: slope stays at the bound.
        let down: Vec<f64> = xs.iter().map(|x| 5.0 - x).collect();
        let f = robust_fit(&Line, &[vec![0.0, 1.0]], &xs, &down);
        assert_eq!(f.params[1], 0.0);
    }

    #[test]
    fn huber_pass_resists_an_outlier() {
        let xs: Vec<f64> = (0..30).map(f64::from).collect();
        let mut ys: Vec<f64> = xs.iter().map(|x| 1.0 + 0.5 * x).collect();
        ys[15] += 100.0;
        let f = robust_fit(&Line, &[vec![0.0, 0.0]], &xs, &ys);
        assert!((f.params[1] - 0.5).abs() < 0.05, "{:?}", f.params);
    }
}
