//! Transferability between tasks (Ymir §4.1, thesis Ch.3 Eq. 3.2–3.4).
//!
//! A task is embedded by the diagonal of its Fisher information matrix
//! (Task2Vec, Eq. 3.2), computed twice on random subsets (`F`, `F'`).
//! - Eq. 3.3: `d_sym(F_A, F_B) = d_cos(F_A / (F_A + F_B), F_B / (F_A + F_B))`
//!   (element-wise division).
//! - Eq. 3.4: `d(F_A, F_B, F'_B) = d_sym(F_A, F_B) − d_sym(F_B, F'_B)`: the
//!   temporal score `S(A, B)` from A to B. Lower = closer = more transferable.
//! - Spatial: the mean of both directions.
//!
//! The score is mapped to the transfer gain `G` (Ymir Eq. 1,
//! `G_{A,B} = (P_{A,B} − P_B) / P_B`) by a linear regression learned online
//! from observed merges, starting from a documented prior.

/// Diagonal-Fisher embedding of one task, computed twice (`F` and `F'`).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskEmbedding {
    pub fisher: Vec<f64>,
    pub fisher_repeat: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EmbeddingError {
    #[error("{field}: embedding is empty")]
    Empty { field: &'static str },
    #[error("{field}: length {got} differs from {expected}")]
    Length {
        field: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{field}[{index}]: must be a finite number >= 0 (a Fisher diagonal)")]
    Value { field: &'static str, index: usize },
}

impl TaskEmbedding {
    pub fn validate(&self, dim: Option<usize>) -> Result<(), EmbeddingError> {
        for (field, v) in [
            ("fisher", &self.fisher),
            ("fisher_repeat", &self.fisher_repeat),
        ] {
            if v.is_empty() {
                return Err(EmbeddingError::Empty { field });
            }
            let expected = dim.unwrap_or(self.fisher.len());
            if v.len() != expected {
                return Err(EmbeddingError::Length {
                    field,
                    expected,
                    got: v.len(),
                });
            }
            if let Some(i) = v.iter().position(|x| !x.is_finite() || *x < 0.0) {
                return Err(EmbeddingError::Value { field, index: i });
            }
        }
        Ok(())
    }
}

/// Cosine distance `1 − a·b / (|a||b|)`; 1 when either vector is zero.
pub fn cosine_distance(a: &[f64], b: &[f64]) -> f64 {
    let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na <= 0.0 || nb <= 0.0 {
        return 1.0;
    }
    1.0 - dot / (na.sqrt() * nb.sqrt())
}

/// Thesis Eq. 3.3. Entries where both embeddings are 0 carry no information
/// and count as equal (½, ½). Symmetric: `d_sym(a, b) == d_sym(b, a)`
/// exactly (each entry's two shares swap, and so do the two norms).
pub fn d_sym(fa: &[f64], fb: &[f64]) -> f64 {
    let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
    for (&x, &y) in fa.iter().zip(fb) {
        let s = x + y;
        let (u, v) = if s > 0.0 { (x / s, y / s) } else { (0.5, 0.5) };
        dot += u * v;
        na += u * u;
        nb += v * v;
    }
    if na <= 0.0 || nb <= 0.0 {
        return 1.0;
    }
    1.0 - dot / (na.sqrt() * nb.sqrt())
}

/// Thesis Eq. 3.4: asymmetric distance from A to B.
pub fn d_asym(fa: &[f64], fb: &[f64], fb_repeat: &[f64]) -> f64 {
    d_sym(fa, fb) - d_sym(fb, fb_repeat)
}

/// Temporal score `S(A, B)` (A ↦ B).
pub fn temporal_score(a: &TaskEmbedding, b: &TaskEmbedding) -> f64 {
    d_asym(&a.fisher, &b.fisher, &b.fisher_repeat)
}

/// Spatial score: mean of both directions (Ymir §4.1).
pub fn spatial_score(a: &TaskEmbedding, b: &TaskEmbedding) -> f64 {
    0.5 * (temporal_score(a, b) + temporal_score(b, a))
}

/// Scores of every ordered pair of `tasks`: `(i, j, S(i ↦ j))` for `i ≠ j`.
/// Each task's self-distance `d_sym(F_j, F'_j)` (the second term of Eq. 3.4)
/// is computed once, not once per pair, and `d_sym` is symmetric (Eq. 3.3
/// treats both sides alike), so a round's matrix costs one `d_sym` per
/// unordered pair.
pub fn temporal_scores(tasks: &[TaskEmbedding]) -> Vec<(usize, usize, f64)> {
    let n = tasks.len();
    let own: Vec<f64> = tasks
        .iter()
        .map(|t| d_sym(&t.fisher, &t.fisher_repeat))
        .collect();
    // d_sym(F_i, F_j) for i < j, row by row.
    let mut upper = Vec::with_capacity(n * n.saturating_sub(1) / 2);
    for (i, a) in tasks.iter().enumerate() {
        for b in &tasks[i + 1..] {
            upper.push(d_sym(&a.fisher, &b.fisher));
        }
    }
    // Row i starts after rows 0..i, of n−1, n−2, … entries.
    let at = |i: usize, j: usize| {
        let (i, j) = if i < j { (i, j) } else { (j, i) };
        upper[i * (2 * n - i - 1) / 2 + (j - i - 1)]
    };
    let mut out = Vec::with_capacity(n * n.saturating_sub(1));
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            out.push((i, j, at(i, j) - own[j]));
        }
    }
    out
}

/// Linear regression `G = intercept + slope · S` (Ymir §4.1), learned online.
///
/// Prior (used until merges are observed, and as a regulariser after): two
/// pseudo-observations of weight [`GainModel::PRIOR_WEIGHT`] each, at
/// `S = 0` (identical tasks) → `G = +0.30` and `S = 1` (orthogonal tasks) →
/// `G = −0.30`. The range matches the transfer gains the papers report
/// (Ymir Fig. 3: from about −30 % to +30 % relative accuracy; thesis
/// Table 3.2: positive/negative classification accuracy 97–99 %), and the
/// negative slope encodes Task2Vec's premise that closer tasks transfer
/// better. Observed (S, G) pairs then dominate after a few merges.
#[derive(Clone, Debug, PartialEq)]
pub struct GainModel {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    observed: u64,
}

impl Default for GainModel {
    fn default() -> Self {
        let mut m = GainModel {
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
            observed: 0,
        };
        m.add(0.0, 0.30, Self::PRIOR_WEIGHT);
        m.add(1.0, -0.30, Self::PRIOR_WEIGHT);
        m
    }
}

impl GainModel {
    pub const PRIOR_WEIGHT: f64 = 2.0;

    fn add(&mut self, s: f64, g: f64, w: f64) {
        self.n += w;
        self.sx += w * s;
        self.sy += w * g;
        self.sxx += w * s * s;
        self.sxy += w * s * g;
    }

    /// Records an observed merge outcome: score `s`, measured gain `g`
    /// (Ymir Eq. 1). Non-finite values are ignored.
    pub fn observe(&mut self, s: f64, g: f64) {
        if s.is_finite() && g.is_finite() {
            self.add(s, g, 1.0);
            self.observed += 1;
        }
    }

    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// (intercept, slope) of the least-squares line.
    pub fn coefficients(&self) -> (f64, f64) {
        let var = self.n * self.sxx - self.sx * self.sx;
        let slope = if var.abs() < 1e-12 {
            0.0
        } else {
            (self.n * self.sxy - self.sx * self.sy) / var
        };
        ((self.sy - slope * self.sx) / self.n, slope)
    }

    /// Predicted transfer gain for a score.
    pub fn predict(&self, s: f64) -> f64 {
        let (a, b) = self.coefficients();
        a + b * s
    }

    /// Positive transfer (`G ≥ 0`) or negative.
    pub fn is_positive(&self, s: f64) -> bool {
        self.predict(s) >= 0.0
    }
}

/// The transfer gain a merged job showed: the median over its reported
/// points of `L(k) / ℓ_k − 1`, with `L` its own curve fitted alone (Ymir
/// Eq. 3, from its profile) and `ℓ_k` the loss it reported at iteration `k`
/// under the merge. It inverts the transferred curve the estimator predicts
/// with, `L_{A,B}(k) = L_B(k) / (1 + G_{A,B})` (Ymir Eq. 2 as fixed in the
/// seeds README), so the regression of [`GainModel`] learns `G` on the scale
/// it is used on. Ymir Eq. 1 defines `G` on accuracy (`(P_{A,B} − P_B) /
/// P_B`); a job's accuracy alone is never observed once it is merged, its
/// loss curve alone is. Points at iteration 0, with a non-positive loss, or
/// not finite are skipped; None without a usable point.
pub fn observed_gain(
    alone: &crate::loss_curve::LossCurve,
    iterations: &[f64],
    losses: &[f64],
) -> Option<f64> {
    let mut ratios: Vec<f64> = iterations
        .iter()
        .zip(losses)
        .filter(|&(&k, &l)| k >= 1.0 && k.is_finite() && l > 0.0 && l.is_finite())
        .map(|(&k, &l)| alone.eval(k) / l - 1.0)
        .filter(|g| g.is_finite())
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let m = ratios.len() / 2;
    Some(if ratios.len() % 2 == 1 {
        ratios[m]
    } else {
        0.5 * (ratios[m - 1] + ratios[m])
    })
}

/// Ymir Eq. 4: iterations of a spatially merged pair (one joint job trained
/// on both datasets; batch `M_A + M_B`):
/// `K = max(K_A·M_A/D_A, K_B·M_B/D_B) · (D_A + D_B)/(M_A + M_B)`,
/// with `K_i` the (transferred) iterations of each task, `M_i` its global
/// batch, `D_i` its training-set size. Both jobs finish with the pair.
pub fn spatial_iterations(k_a: u64, m_a: u32, d_a: u64, k_b: u64, m_b: u32, d_b: u64) -> u64 {
    let epochs_a = k_a as f64 * f64::from(m_a) / d_a.max(1) as f64;
    let epochs_b = k_b as f64 * f64::from(m_b) / d_b.max(1) as f64;
    let joint = epochs_a.max(epochs_b) * (d_a + d_b) as f64 / f64::from(m_a + m_b).max(1.0);
    joint.ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_by_hand() {
        assert!((cosine_distance(&[1.0, 0.0], &[0.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!(cosine_distance(&[1.0, 2.0], &[2.0, 4.0]).abs() < 1e-12);
        // Identical embeddings: both normalise to (½, ½, …) → distance 0.
        assert!(d_sym(&[1.0, 3.0], &[1.0, 3.0]).abs() < 1e-12);
        // fa=(1,0), fb=(0,1): normalised (1,0) and (0,1) → 1.
        assert!((d_sym(&[1.0, 0.0], &[0.0, 1.0]) - 1.0).abs() < 1e-12);
        // fa=(3,1), fb=(1,1): u=(3/4,1/2), v=(1/4,1/2); cos = (3/16+1/4)/(|u||v|)
        let u = [0.75f64, 0.5];
        let v = [0.25f64, 0.5];
        let cos = (u[0] * v[0] + u[1] * v[1])
            / ((u[0] * u[0] + u[1] * u[1]).sqrt() * (v[0] * v[0] + v[1] * v[1]).sqrt());
        assert!((d_sym(&[3.0, 1.0], &[1.0, 1.0]) - (1.0 - cos)).abs() < 1e-12);
    }

    #[test]
    fn asymmetric_score_subtracts_the_targets_self_distance() {
        let a = TaskEmbedding {
            fisher: vec![3.0, 1.0],
            fisher_repeat: vec![3.0, 1.2],
        };
        let b = TaskEmbedding {
            fisher: vec![1.0, 1.0],
            fisher_repeat: vec![1.1, 0.9],
        };
        let s_ab = temporal_score(&a, &b);
        let expected = d_sym(&[3.0, 1.0], &[1.0, 1.0]) - d_sym(&[1.0, 1.0], &[1.1, 0.9]);
        assert!((s_ab - expected).abs() < 1e-15);
        assert_ne!(
            s_ab,
            temporal_score(&b, &a),
            "temporal transfer is asymmetric"
        );
        let sp = spatial_score(&a, &b);
        assert!(
            (sp - spatial_score(&b, &a)).abs() < 1e-15,
            "spatial score is symmetric"
        );
        assert!((sp - 0.5 * (s_ab + temporal_score(&b, &a))).abs() < 1e-15);
    }

    /// A trace that follows `L/(1+G)` with noise gives back `G`, so the
    /// regression learns on the scale Eq. 2 uses it.
    #[test]
    fn observed_gain_inverts_the_transferred_curve() {
        let alone = crate::loss_curve::LossCurve::new(0.3, 0.8, 0.004, 0.0);
        for g in [-0.2, 0.0, 0.15, 0.3] {
            let its: Vec<f64> = (1..=60).map(|k| f64::from(k) * 10.0).collect();
            let losses: Vec<f64> = its
                .iter()
                .enumerate()
                .map(|(n, &k)| {
                    let noise = 1.0 + 0.03 * if n % 2 == 0 { 1.0 } else { -1.0 };
                    alone.eval(k) / (1.0 + g) * noise
                })
                .collect();
            let got = observed_gain(&alone, &its, &losses).unwrap();
            assert!((got - g).abs() < 0.05 * (1.0 + g), "{g}: {got}");
        }
        assert_eq!(observed_gain(&alone, &[0.0], &[1.0]), None);
        assert_eq!(observed_gain(&alone, &[5.0], &[0.0]), None);
    }

    #[test]
    fn gain_model_starts_from_the_prior_and_learns() {
        let mut m = GainModel::default();
        assert!((m.predict(0.0) - 0.30).abs() < 1e-12);
        assert!((m.predict(1.0) + 0.30).abs() < 1e-12);
        assert!(m.is_positive(0.2) && !m.is_positive(0.8));
        // Observations of a steeper, shifted relation pull the line over.
        for i in 0..200 {
            let s = f64::from(i % 10) / 10.0;
            m.observe(s, 0.5 - 1.2 * s);
        }
        let (a, b) = m.coefficients();
        assert!((a - 0.5).abs() < 0.05 && (b + 1.2).abs() < 0.1, "{a} {b}");
        m.observe(f64::NAN, 1.0);
        assert_eq!(m.observed(), 200);
    }

    /// `n` pseudo-random Fisher diagonals of `dim` entries, some 0 in both.
    fn embeddings(n: usize, dim: usize) -> Vec<TaskEmbedding> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let f: Vec<f64> = (0..dim)
                    .map(|k| if k % 7 == 3 { 0.0 } else { next() * 2.0 })
                    .collect();
                TaskEmbedding {
                    fisher_repeat: f.iter().map(|x| x * (0.9 + 0.2 * next())).collect(),
                    fisher: f,
                }
            })
            .collect()
    }

    #[test]
    fn d_sym_is_symmetric_bit_for_bit() {
        // temporal_scores computes it once per unordered pair.
        for dim in [1, 3, 9, 517] {
            let t = embeddings(3, dim);
            for (a, b) in [(0, 1), (1, 2), (2, 0)] {
                let (fa, fb) = (&t[a].fisher, &t[b].fisher);
                assert_eq!(
                    d_sym(fa, fb).to_bits(),
                    d_sym(fb, fa).to_bits(),
                    "dim {dim}"
                );
            }
        }
    }

    #[test]
    fn batch_scores_of_many_tasks_equal_pairwise_scores_in_order() {
        let tasks = embeddings(7, 37);
        let all = temporal_scores(&tasks);
        let expected: Vec<(usize, usize)> = (0..7)
            .flat_map(|i| (0..7).filter(move |&j| j != i).map(move |j| (i, j)))
            .collect();
        assert_eq!(
            all.iter().map(|&(i, j, _)| (i, j)).collect::<Vec<_>>(),
            expected
        );
        for (i, j, s) in all {
            assert_eq!(s, temporal_score(&tasks[i], &tasks[j]), "{i} {j}");
        }
        assert!(temporal_scores(&[]).is_empty());
        assert!(temporal_scores(&tasks[..1]).is_empty());
    }

    #[test]
    fn batch_scores_equal_pairwise_scores() {
        let tasks = vec![
            TaskEmbedding {
                fisher: vec![3.0, 1.0, 0.5],
                fisher_repeat: vec![3.0, 1.2, 0.4],
            },
            TaskEmbedding {
                fisher: vec![1.0, 1.0, 2.0],
                fisher_repeat: vec![1.1, 0.9, 2.0],
            },
            TaskEmbedding {
                fisher: vec![0.0, 4.0, 1.0],
                fisher_repeat: vec![0.1, 3.8, 1.0],
            },
        ];
        let all = temporal_scores(&tasks);
        assert_eq!(all.len(), 6);
        for (i, j, s) in all {
            assert!(
                (s - temporal_score(&tasks[i], &tasks[j])).abs() < 1e-15,
                "{i} {j}"
            );
        }
    }

    #[test]
    fn eq4_by_hand() {
        // A: 1000 it × 32 / 3200 samples = 10 epochs; B: 500 × 16 / 4000 = 2 epochs.
        // Joint: max(10, 2) × (3200 + 4000) / (32 + 16) = 1500 iterations.
        assert_eq!(spatial_iterations(1000, 32, 3200, 500, 16, 4000), 1500);
        assert_eq!(
            spatial_iterations(500, 16, 4000, 1000, 32, 3200),
            1500,
            "symmetric"
        );
    }

    #[test]
    fn embeddings_are_validated() {
        let e = TaskEmbedding {
            fisher: vec![1.0, f64::NAN],
            fisher_repeat: vec![1.0, 1.0],
        };
        assert_eq!(
            e.validate(None),
            Err(EmbeddingError::Value {
                field: "fisher",
                index: 1
            })
        );
        let e = TaskEmbedding {
            fisher: vec![1.0],
            fisher_repeat: vec![1.0, 1.0],
        };
        assert!(matches!(
            e.validate(None),
            Err(EmbeddingError::Length { .. })
        ));
        let e = TaskEmbedding {
            fisher: vec![1.0, 2.0],
            fisher_repeat: vec![1.0, 2.0],
        };
        assert!(matches!(
            e.validate(Some(3)),
            Err(EmbeddingError::Length { .. })
        ));
    }
}
