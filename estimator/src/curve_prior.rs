//! Epochs to a metric target with a prior learned across jobs.
//!
//! Ymir §4.2 fits each job's own curve (Eq. 3) to its own profiling trace.
//! Three evaluation points fix a three-parameter saturating curve exactly
//! and say nothing about where it goes next, so a job's first epochs alone
//! predict epochs-to-target poorly. Here the prior is a **library of
//! per-epoch metric curves**: finished jobs of the same model (the service
//! and fmsim add them) and, before any have finished, a few shipped curve
//! shapes ([`CurveLibrary::shipped`]). The prediction is Bayesian model
//! averaging over the library, as Domhan et al. (IJCAI 2015) combine curve
//! families and Chandrashekaran & Lane (ECML 2017) use earlier curves as
//! the prior for a new one — the extrapolation UniSched §5.3 cites for
//! metric targets:
//!
//! 1. each library curve `ℓ` is mapped onto the job's observed head by the
//!    affine map `m(e) ≈ a + b·ℓ(e)` (least squares over the head, `b ≥ 0`:
//!    the same shape, shifted and stretched);
//! 2. its weight is its prior weight (a finished job's curve 1, the
//!    shipped shapes together 1) times the Gaussian likelihood of the head
//!    under that map,
//!    `w = exp(−SSE / (2σ²))`, σ the evaluation noise the library's job
//!    curves show (the median of `|Δ²|/√6` over their epochs; at least
//!    0.5 % of the target: evaluations vary by more than their i.i.d.
//!    jitter from epoch to epoch), or 3 % of the target with no job curve
//!    yet;
//! 3. it predicts the first epoch after the head at which `a + b·ℓ(e)`
//!    reaches the target, else the cap (the job runs out its epochs) — but
//!    a curve shorter than the cap that never reaches it is left out (it
//!    ends where its own job stopped and says nothing about when);
//! 4. the prediction is the weighted median of these, the spread the
//!    weighted 10th and 90th percentiles.
//!
//! A target already met in the head is met at that epoch (no spread). More
//! observed epochs (a running job's evaluations) narrow the likelihood, so
//! the same call refreshes the estimate as a job reports.
//!
//! **Finished jobs with their targets** ([`CurveLibrary::add_example`])
//! say more than their curves' shapes: how far a head like this one was
//! from the target its user set, and when that target was met. Where the
//! library holds such examples, the prediction is a kernel regression on
//! them instead (Nadaraya–Watson over [`target_features`]: the share of
//! the climb to the target the head has made, and its last step in the
//! same unit), so it learns how users' targets sit on this model's curves
//! (at the plateau's best value, in the published workloads) rather than
//! extrapolating an affine map that three points hardly fix:
//!
//! 5. each example whose curve is longer than the head and whose own head
//!    of the same length had not met its target gives its epochs to
//!    target (the first epoch at or past it; one that ran out its curve
//!    without it counts as the cap if its curve covers the cap, else it is
//!    left out, as in step 3), weighted by a Gaussian kernel of width
//!    [`KERNEL_WIDTH`] on the distance of its features to the job's. Where
//!    the metric's best value is known ([`Metric::named`]: 1 for an
//!    accuracy, 0 for a loss) a third feature counts, the share of the
//!    headroom left above the head's best that the target asks for
//!    ([`headroom_share`]): the climb's shares are free of the metric's
//!    level, and so cannot tell a target near the metric's top (met late,
//!    or by one lucky evaluation) from the same climb far below it. A job
//!    that trained from another task's weights or beside another task
//!    ([`Start::Transferred`]) is judged by finished jobs that did too:
//!    its target was set by its task's runs alone (Ymir §4.2: "the same
//!    validation accuracy as the normal transfer"), not on a curve of its
//!    kind, and finished jobs alone, whose users set their targets on
//!    their own curves (at the plateau's best, in the published
//!    workloads), say when such a target is met late. A job alone is
//!    judged by every finished job;
//! 6. the prediction is the median of those epochs weighted by
//!    `kernel / epochs`, the point that minimises the expected absolute
//!    percentage error (the error Ymir Table 2 reports) under the kernel's
//!    distribution; the spread is the kernel-weighted 10th and 90th
//!    percentiles;
//! 7. with less than [`MIN_KERNEL_MASS`] examples' worth of kernel weight
//!    near the job (a head unlike any finished job's), steps 1–4 decide;
//! 8. where the kernel decides and the library holds curve shapes (the
//!    shipped ones), the prediction combines the kernel's reading with the
//!    shapes' own (steps 1–4 on the shapes alone, σ as with no job curve),
//!    point and p10/p90 alike, with inverse-variance weights (Bates &
//!    Granger's combination of forecasts; for two normal beliefs, their
//!    product), each reading's p10–p90 width standing for its standard
//!    deviation: two forecasts whose errors differ in kind — one learned
//!    from where finished jobs' users set their targets, one from curve
//!    shapes fixed before any job ran — as Domhan et al. combine curve
//!    families. Nothing is tuned. Where finished jobs agree (a job like
//!    one that finished, whose examples all say one epoch: no spread) the
//!    kernel decides alone; where they scatter, the shapes pull the
//!    prediction towards theirs (docs/benchmarks.md has both readings
//!    and the equal-weight average measured beside it).
//!
//! Measured by `estimator-accuracy --anchor-dir` on the published curves
//! with each job's own task left out of the library: see docs/benchmarks.md
//! (from 3 epochs 9.79 % alone, 9.81 % temporal and 12.8 %
//! for merged pairs' tasks; 10.15 / 11.7 / 16.1 % before the third feature
//! and the transferred jobs' rule).

/// Evaluation noise σ of step 2 when the library holds no job's curve (the
/// shipped shapes only), as a share of the target's magnitude: loose, as
/// nothing says how noisy this model's evaluations are.
pub const SIGMA_REL: f64 = 0.03;

/// Epochs the shipped shapes are drawn over (a job that may run longer
/// gets no vote from them past it).
pub const SHAPE_EPOCHS: i32 = 60;

/// Prior weight of all the shipped shapes together, in finished jobs: one
/// job of the model counts as much as every shape.
pub const SHAPES_MASS: f64 = 1.0;

/// Least σ, as a share of the target's magnitude, when the library's
/// curves give it (smooth curves would otherwise make one shape decide).
pub const SIGMA_FLOOR_REL: f64 = 0.005;

/// Width of the kernel of step 5, in the units of [`target_features`]
/// (shares of the climb from the first evaluation to the target): heads
/// within about a fifth of the climb of each other count as alike.
/// Measured on the published curves (`estimator-accuracy`, each job's own
/// task left out; the kernel alone, before step 8 was added): 0.1 / 0.2 /
/// 0.4 give a 3-epoch APE of 15.2 / 11.6 / 13.3 % alone and 13.8 / 13.0 /
/// 12.7 % temporal, and 6.4 / 5.7 / 5.7 % and 3.2 / 2.8 / 3.0 % from 5
/// epochs (at 0.1 more heads fall back to the shapes, step 7;
/// docs/benchmarks.md).
pub const KERNEL_WIDTH: f64 = 0.2;

/// Least total kernel weight, in examples, for step 5 to decide (step 7).
pub const MIN_KERNEL_MASS: f64 = 1.0;

/// Why a prediction cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PriorError {
    #[error("{field} is empty")]
    Empty { field: &'static str },
    #[error("{field}[{index}] is not a finite number")]
    NotFinite { field: &'static str, index: usize },
    #[error("target is not a finite number")]
    Target,
    #[error("cap_epochs must be at least 1")]
    Cap,
}

/// Per-epoch metric curves, stored higher-is-better (lower-is-better
/// metrics are negated on the way in).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CurveLibrary {
    /// Jobs' curves: each one finished job's worth of prior.
    curves: Vec<Vec<f64>>,
    /// The shipped shapes: together [`SHAPES_MASS`] jobs' worth.
    shapes: Vec<Vec<f64>>,
    /// |second differences| / √6 of every interior epoch of the curves
    /// pushed (jobs' curves, not the shipped shapes): their median
    /// estimates the evaluation noise σ.
    jitter: Vec<f64>,
    /// Finished jobs' curves with the targets they trained for (steps
    /// 5–7), stored higher-is-better as `curves`.
    examples: Vec<Example>,
}

/// A finished job's per-epoch curve and the target it trained for.
#[derive(Clone, Debug, PartialEq)]
struct Example {
    curve: Vec<f64>,
    target: f64,
    /// How it started (step 5 judges a transferred job by transferred
    /// finished jobs only).
    start: Start,
    /// Its metric's best value ([`Metric::best`]), signed as `curve`.
    best: Option<f64>,
}

/// How a job trained, as the prior tells finished jobs apart (Ymir §3's
/// transfer modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Start {
    /// From the pre-trained weights, on its own.
    #[default]
    Alone,
    /// From another task's fine-tuned weights (a temporal merge's B, a
    /// warm start) or beside another task in one joint process (a member
    /// of a spatial merge): its target was set by its task's runs alone
    /// (Ymir §4.2: the merged job must reach "the same validation accuracy
    /// as the normal transfer"), not on a curve of its own kind.
    Transferred,
}

impl Start {
    /// [`Start::Transferred`] if `transferred`, else [`Start::Alone`].
    pub fn from_transferred(transferred: bool) -> Self {
        if transferred {
            Start::Transferred
        } else {
            Start::Alone
        }
    }
}

/// A metric as the prior reads it: its sense, and the best value it can
/// take where that is known.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metric {
    /// Reached from above (a loss).
    pub lower_is_better: bool,
    /// The best value the metric can take (1 for an accuracy, an F1 or a
    /// correlation; 0 for a loss or an error rate), None where unknown:
    /// the third feature of step 5 (`headroom_share`).
    pub best: Option<f64>,
}

impl Metric {
    /// The factor that makes its values higher-is-better (−1 for a loss).
    fn sign(&self) -> f64 {
        if self.lower_is_better { -1.0 } else { 1.0 }
    }

    /// Its best value, finite, made higher-is-better as its values are.
    fn signed_best(&self) -> Option<f64> {
        self.best.filter(|b| b.is_finite()).map(|b| self.sign() * b)
    }

    /// A metric of this sense whose best value is unknown.
    pub fn sense(lower_is_better: bool) -> Self {
        Self {
            lower_is_better,
            best: None,
        }
    }

    /// A metric by the name a trainer reports it under (`eval_accuracy`,
    /// `f1`, `loss`; an `eval_`, `validation_`, `val_` or `test_` prefix
    /// and letter case do not count), with its best value where the name is
    /// one whose range is fixed: accuracy, F1, precision, recall, AUC and
    /// the Pearson, Spearman and Matthews correlations top out at 1; a
    /// loss, an error rate, MSE and MAE bottom out at 0. A name it does not
    /// know, or a sense the name contradicts (an accuracy reached from
    /// above), leaves the best unknown: the prior then reads two features.
    /// So does a metric reported on another scale (an accuracy in percent:
    /// no headroom below 1 is left, [`headroom_share`] is None).
    pub fn named(name: &str, lower_is_better: bool) -> Self {
        let lower = name.trim().to_ascii_lowercase();
        let bare = ["eval_", "validation_", "val_", "test_"]
            .iter()
            .find_map(|p| lower.strip_prefix(p))
            .unwrap_or(&lower);
        let best = match (bare, lower_is_better) {
            (
                "accuracy"
                | "acc"
                | "f1"
                | "f1_score"
                | "macro_f1"
                | "micro_f1"
                | "precision"
                | "recall"
                | "auc"
                | "roc_auc"
                | "pearson"
                | "pearsonr"
                | "spearman"
                | "spearmanr"
                | "matthews_correlation"
                | "mcc",
                false,
            ) => Some(1.0),
            ("loss" | "error" | "error_rate" | "mse" | "mae" | "rmse", true) => Some(0.0),
            _ => None,
        };
        Self {
            lower_is_better,
            best,
        }
    }
}

/// A job whose epochs to its metric target are to be predicted.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    /// Its per-epoch metric so far (at least one epoch).
    pub head: &'a [f64],
    pub target: f64,
    pub metric: Metric,
    pub start: Start,
    /// The epochs it may run.
    pub cap_epochs: usize,
}

fn check(field: &'static str, xs: &[f64]) -> Result<(), PriorError> {
    if xs.is_empty() {
        return Err(PriorError::Empty { field });
    }
    match xs.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(PriorError::NotFinite { field, index }),
        None => Ok(()),
    }
}

impl CurveLibrary {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one job's per-epoch curve (at least two epochs; a one-point
    /// curve has no shape and is refused).
    pub fn push(&mut self, curve: &[f64], lower_is_better: bool) -> Result<(), PriorError> {
        check("curve", curve)?;
        if curve.len() < 2 {
            return Err(PriorError::Empty { field: "curve" });
        }
        let s = Metric::sense(lower_is_better).sign();
        self.curves.push(curve.iter().map(|v| s * v).collect());
        // Under i.i.d. noise of variance σ², e[i+1] − 2e[i] + e[i−1] has
        // variance 6σ² (the smooth part of a curve adds little per epoch).
        for w in curve.windows(3) {
            let d = (w[2] - 2.0 * w[1] + w[0]).abs() / 6f64.sqrt();
            self.jitter.push(d);
        }
        Ok(())
    }

    /// Adds a finished job's per-epoch curve with the metric target it
    /// trained for (steps 5–7), as a job alone whose metric's best value is
    /// unknown; at least two epochs, as for [`Self::push`]. The curve's
    /// shape is not added: call [`Self::push`] for that too.
    pub fn add_example(
        &mut self,
        curve: &[f64],
        target: f64,
        lower_is_better: bool,
    ) -> Result<(), PriorError> {
        self.add_example_as(curve, target, Metric::sense(lower_is_better), Start::Alone)
    }

    /// [`Self::add_example`] for a job that started so, on that metric.
    fn add_example_as(
        &mut self,
        curve: &[f64],
        target: f64,
        metric: Metric,
        start: Start,
    ) -> Result<(), PriorError> {
        check("curve", curve)?;
        if curve.len() < 2 {
            return Err(PriorError::Empty { field: "curve" });
        }
        if !target.is_finite() {
            return Err(PriorError::Target);
        }
        let s = metric.sign();
        self.examples.push(Example {
            curve: curve.iter().map(|v| s * v).collect(),
            target: s * target,
            start,
            best: metric.signed_best(),
        });
        Ok(())
    }

    /// Adds one finished job as the prior holds it: its curve's shape
    /// ([`Self::push`], steps 1–4) and its curve with the target it trained
    /// for (steps 5–7), as a job alone whose metric's best value is unknown
    /// ([`Self::add_finished_as`] says how it started and on what metric).
    pub fn add_finished(
        &mut self,
        curve: &[f64],
        target: f64,
        lower_is_better: bool,
    ) -> Result<(), PriorError> {
        self.add_finished_as(curve, target, Metric::sense(lower_is_better), Start::Alone)
    }

    /// Adds one finished job as the prior holds it: its curve's shape
    /// ([`Self::push`], steps 1–4) and its curve with the target it trained
    /// for, how it started and its metric (steps 5–7). The scheduler's
    /// prior holds every completed job with a metric target so, and the
    /// accuracy harness and fmsim build theirs the same way. Nothing is
    /// added when either is refused.
    pub fn add_finished_as(
        &mut self,
        curve: &[f64],
        target: f64,
        metric: Metric,
        start: Start,
    ) -> Result<(), PriorError> {
        if !target.is_finite() {
            return Err(PriorError::Target);
        }
        self.push(curve, metric.lower_is_better)?;
        self.add_example_as(curve, target, metric, start)
    }

    /// Finished jobs with their targets held (steps 5–7).
    pub fn examples(&self) -> usize {
        self.examples.len()
    }

    /// Evaluation noise σ the jobs' curves show (the median of their
    /// jitter), None without a job curve of three epochs or more.
    pub fn noise(&self) -> Option<f64> {
        let mut j = self.jitter.clone();
        let mid = j.len() / 2;
        (!j.is_empty()).then(|| *j.select_nth_unstable_by(mid, f64::total_cmp).1)
    }

    /// Jobs' curves and shapes held.
    pub fn len(&self) -> usize {
        self.curves.len() + self.shapes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Jobs' curves held (not the shipped shapes).
    pub fn jobs(&self) -> usize {
        self.curves.len()
    }

    /// The prior before any job has finished: curve shapes, not data.
    /// Saturating curves `1 − exp(−r·e)` with rates `r` from 0.05 to 4.3
    /// per epoch (a factor 1.5 apart: from slow, still climbing at epoch
    /// 10, to done in one epoch), each also with over-fitting after epoch
    /// `p` = 2…9, a linear decline of `g·r·e^{−r·p}` per epoch (`g` = 0.1,
    /// 0.3, 1: a tenth of, a third of, or as fast as the remaining climb
    /// at `p`). 12 × (1 + 8 × 3) = 300 curves, drawn over
    /// [`SHAPE_EPOCHS`] epochs. The affine map of step 1 makes their level
    /// and scale irrelevant; only the shape counts. Together they weigh as
    /// much as [`SHAPES_MASS`] finished jobs, so a model's own jobs soon
    /// outweigh them.
    pub fn shipped() -> Self {
        let mut curves = Vec::with_capacity(300);
        for i in 0..12 {
            let r = 0.05 * 1.5f64.powi(i);
            let base: Vec<f64> = (1..=SHAPE_EPOCHS)
                .map(|e| 1.0 - (-r * f64::from(e)).exp())
                .collect();
            curves.push(base.clone());
            for p in 2..10 {
                for g in [0.1, 0.3, 1.0] {
                    let slope = g * r * (-r * f64::from(p)).exp();
                    curves.push(
                        (1..=SHAPE_EPOCHS)
                            .zip(&base)
                            .map(|(e, b)| b - slope * f64::from((e - p).max(0)))
                            .collect(),
                    );
                }
            }
        }
        Self {
            shapes: curves,
            ..Self::default()
        }
    }

    /// This library with another's curves added.
    pub fn extended(mut self, other: &CurveLibrary) -> Self {
        self.curves.extend(other.curves.iter().cloned());
        self.shapes.extend(other.shapes.iter().cloned());
        self.jitter.extend(other.jitter.iter().copied());
        self.examples.extend(other.examples.iter().cloned());
        self
    }
}

/// Epochs to the target: the weighted median and its spread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochsPrediction {
    /// Weighted median of the members' epochs (1-based, ≤ the cap).
    pub epochs: f64,
    /// Weighted 10th and 90th percentiles (equal to `epochs` when the
    /// target was met in the head).
    pub low: f64,
    pub high: f64,
    /// The target was already met in the observed head.
    pub observed: bool,
    /// Effective number of library curves behind the prediction,
    /// `(Σw)² / Σw²` (1 = one curve decides; small = little support).
    pub support: f64,
    /// Finished jobs with their targets decided it (steps 5–6), not the
    /// curves' shapes (steps 1–4).
    pub by_targets: bool,
}

impl EpochsPrediction {
    /// `epochs` with no spread and no library support behind it.
    fn certain(epochs: f64, observed: bool) -> Self {
        Self {
            epochs,
            low: epochs,
            high: epochs,
            observed,
            support: 0.0,
            by_targets: false,
        }
    }

    /// Step 8: two readings combined with inverse-variance weights, the
    /// spread `high − low` standing for each one's standard deviation (a
    /// fixed multiple of it for a normal belief: the multiple cancels).
    /// The point and both quantiles are averaged so. A reading with no
    /// spread takes all the weight (both without: equal weights).
    /// `by_targets` and `support` stay this one's.
    fn combined(&self, other: &EpochsPrediction) -> EpochsPrediction {
        let (sa, sb) = (self.high - self.low, other.high - other.low);
        let a = match (sa > 0.0, sb > 0.0) {
            (true, true) => sb * sb / (sa * sa + sb * sb),
            (false, true) => 1.0,
            (true, false) => 0.0,
            (false, false) => 0.5,
        };
        // Between the two, as a weighted mean is: rounding must not carry
        // it past either (6 and 6 mixed once read 6.000000000000001, a
        // p90 past the job's cap).
        let mix = |x: f64, y: f64| (a * x + (1.0 - a) * y).clamp(x.min(y), x.max(y));
        EpochsPrediction {
            epochs: mix(self.epochs, other.epochs),
            low: mix(self.low, other.low),
            high: mix(self.high, other.high),
            ..*self
        }
    }

    /// Relative spread `(high − low) / epochs`.
    pub fn spread(&self) -> f64 {
        (self.high - self.low) / self.epochs.max(1e-9)
    }
}

/// The relative spread of a job's *remaining* time after `seen` epochs:
/// `(high − low)` epochs over the epochs the prediction leaves (at least
/// one), at most 4 — what the scheduler's plan weighs as uncertainty
/// (`SchedJob::spread`). 0 once the target was seen.
pub fn remaining_spread(p: &EpochsPrediction, seen: usize) -> f64 {
    if p.observed {
        return 0.0;
    }
    ((p.high - p.low) / (p.epochs - seen as f64).max(1.0)).clamp(0.0, 4.0)
}

/// Least-squares affine map of `x` onto `y` (same length, `b ≥ 0`):
/// returns `(a, b, sse)`. One point: a shift only.
fn affine(x: &[f64], y: &[f64]) -> (f64, f64, f64) {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|v| (v - mx) * (v - mx)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(u, v)| (u - mx) * (v - my)).sum();
    let b = if sxx > 1e-18 {
        (sxy / sxx).max(0.0)
    } else {
        0.0
    };
    let b = if x.len() == 1 { 1.0 } else { b };
    let a = my - b * mx;
    let sse = x.iter().zip(y).map(|(u, v)| (a + b * u - v).powi(2)).sum();
    (a, b, sse)
}

/// Weighted quantile `q` of `(value, weight)` pairs.
pub(crate) fn quantile(sorted: &[(f64, f64)], total: f64, q: f64) -> f64 {
    let mut acc = 0.0;
    for &(v, w) in sorted {
        acc += w;
        if acc >= q * total - 1e-12 {
            return v;
        }
    }
    sorted.last().map_or(f64::NAN, |p| p.0)
}

/// The features of step 5 for a head (higher-is-better, not at the target
/// yet) and its target: the share of the climb from the first evaluation
/// to the target the best evaluation so far has made, and the last step
/// (the last evaluation less the one before; 0 for one evaluation) in the
/// same unit. Both are free of the metric's level and scale, so jobs of
/// one model at different accuracies compare.
pub fn target_features(head: &[f64], target: f64) -> (f64, f64) {
    let climb = (target - head[0]).max(1e-12);
    let best = head.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let last = match head {
        [.., a, b] => b - a,
        _ => 0.0,
    };
    ((best - head[0]) / climb, last / climb)
}

/// The third feature of step 5, where the metric's best value `best` is
/// known (higher-is-better, as `head` and `target`): the share of the
/// headroom left above the head's best evaluation that the target asks
/// for, `(target − best so far) / (best − best so far)`. A target that
/// closes a twentieth of the error left is near; one that asks for most of
/// it sits at the top of what the job can reach, met late or by a lucky
/// evaluation. None without a best value, or with no headroom left.
pub fn headroom_share(head: &[f64], target: f64, best: Option<f64>) -> Option<f64> {
    let so_far = head.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let room = best? - so_far;
    (room > 1e-12).then(|| (target - so_far) / room)
}

/// Steps 5–6: the examples' kernel-weighted epochs to target for a head
/// of `n` epochs (higher-is-better) that has not met `t`; None below
/// [`MIN_KERNEL_MASS`] (step 7). `best` is the metric's best value (signed
/// as `head`) and `start` how the job started: a transferred job is
/// judged by finished jobs that were transferred too.
fn from_examples(
    examples: &[Example],
    head: &[f64],
    t: f64,
    best: Option<f64>,
    start: Start,
    cap_epochs: usize,
) -> Option<EpochsPrediction> {
    let n = head.len();
    let cap = cap_epochs as f64;
    let (z, s) = target_features(head, t);
    let h = headroom_share(head, t, best);
    // (epochs, kernel weight) of each example that says something.
    let mut members: Vec<(f64, f64)> = Vec::new();
    for ex in examples
        .iter()
        .filter(|ex| ex.curve.len() > n && (start == Start::Alone || ex.start == start))
    {
        if ex.curve[..n].iter().any(|&v| v >= ex.target) {
            continue;
        }
        let e = match ex.curve.iter().position(|&v| v >= ex.target) {
            Some(i) => ((i + 1) as f64).min(cap),
            None if ex.curve.len() >= cap_epochs => cap,
            None => continue,
        };
        let (zx, sx) = target_features(&ex.curve[..n], ex.target);
        // The headroom's share counts where both metrics' best is known
        // (the example's is not computed when the job's is not).
        let dh = h
            .and_then(|a| Some(a - headroom_share(&ex.curve[..n], ex.target, ex.best)?))
            .unwrap_or(0.0);
        let d2 = ((z - zx) / KERNEL_WIDTH).powi(2)
            + ((s - sx) / KERNEL_WIDTH).powi(2)
            + (dh / KERNEL_WIDTH).powi(2);
        members.push((e, (-d2 / 2.0).exp()));
    }
    let mass: f64 = members.iter().map(|m| m.1).sum();
    if mass < MIN_KERNEL_MASS {
        return None;
    }
    let sq: f64 = members.iter().map(|m| m.1 * m.1).sum();
    members.sort_by(|x, y| x.0.total_cmp(&y.0));
    // Step 6: the APE-optimal point weighs each epoch count by 1/epochs.
    let by_ape: Vec<(f64, f64)> = members.iter().map(|&(e, w)| (e, w / e)).collect();
    let ape_total: f64 = by_ape.iter().map(|m| m.1).sum();
    let (low, high) = (quantile(&members, mass, 0.1), quantile(&members, mass, 0.9));
    Some(EpochsPrediction {
        // Within the spread: with a tenth of the weight or less on early
        // epochs the 1/epochs weighting alone could put it below p10.
        epochs: quantile(&by_ape, ape_total, 0.5).clamp(low, high),
        low,
        high,
        observed: false,
        support: mass * mass / sq,
        by_targets: true,
    })
}

/// Predicts the epoch (1-based) at which a job alone whose per-epoch metric
/// so far is `head` first reaches `target`, at most `cap_epochs`, its
/// metric's best value unknown ([`predict`] with the rest). An empty
/// library predicts the cap with no support.
pub fn predict_epochs(
    library: &CurveLibrary,
    head: &[f64],
    target: f64,
    lower_is_better: bool,
    cap_epochs: usize,
) -> Result<EpochsPrediction, PriorError> {
    predict(
        library,
        &Query {
            head,
            target,
            metric: Metric::sense(lower_is_better),
            start: Start::Alone,
            cap_epochs,
        },
    )
}

/// Predicts the epoch (1-based) at which the job `q` first reaches its
/// target, at most its cap (steps 1–8). An empty library predicts the cap
/// with no support.
pub fn predict(library: &CurveLibrary, q: &Query<'_>) -> Result<EpochsPrediction, PriorError> {
    let (head, target, cap_epochs) = (q.head, q.target, q.cap_epochs);
    check("head", head)?;
    if !target.is_finite() {
        return Err(PriorError::Target);
    }
    if cap_epochs == 0 {
        return Err(PriorError::Cap);
    }
    let cap = cap_epochs as f64;
    let s = q.metric.sign();
    let t = s * target;
    let head: Vec<f64> = head.iter().map(|v| s * v).collect();
    if let Some(i) = head.iter().position(|&v| v >= t) {
        return Ok(EpochsPrediction::certain(((i + 1) as f64).min(cap), true));
    }
    let n = head.len();
    if n >= cap_epochs {
        // Every allowed epoch is observed and none reached it.
        return Ok(EpochsPrediction::certain(cap, false));
    }
    let shape_prior = SHAPES_MASS / library.shapes.len().max(1) as f64;
    let best = q.metric.signed_best();
    if let Some(p) = from_examples(&library.examples, &head, t, best, q.start, cap_epochs) {
        if library.shapes.is_empty() {
            return Ok(p);
        }
        // Step 8: the kernel's reading combined with the shapes' alone, at
        // the loose σ of a library without job curves: the shapes are not
        // this model's curves, and their misfit is larger than its
        // evaluation noise. At the library's σ they read 15.8 % alone from
        // 3 epochs, not 10.15 % (docs/benchmarks.md).
        let sigma = (SIGMA_REL * target.abs()).max(1e-9);
        let shapes = from_shapes(
            &[(&library.shapes, shape_prior)],
            &head,
            t,
            sigma,
            cap_epochs,
        );
        return Ok(p.combined(&shapes));
    }
    let sigma = match library.noise() {
        Some(n) => n.max(SIGMA_FLOOR_REL * target.abs()),
        None => SIGMA_REL * target.abs(),
    }
    .max(1e-9);
    // Prior weights: a job's curve 1, a shape its share of SHAPES_MASS.
    let sets = [(&library.curves, 1.0), (&library.shapes, shape_prior)];
    Ok(from_shapes(&sets, &head, t, sigma, cap_epochs))
}

/// Steps 1–4 on the curve sets `sets` (each with its members' prior
/// weight) for a head (higher-is-better) that has not met `t`, σ the
/// evaluation noise of step 2.
fn from_shapes(
    sets: &[(&Vec<Vec<f64>>, f64)],
    head: &[f64],
    t: f64,
    sigma: f64,
    cap_epochs: usize,
) -> EpochsPrediction {
    let (n, cap) = (head.len(), cap_epochs as f64);
    // A mapped value within rounding of the target reaches it (a library
    // curve that is the job's own shape must predict the exact epoch).
    let t = t - 1e-9 * t.abs().max(1.0);
    let mut members: Vec<(f64, f64)> = Vec::new();
    let mut log_w = Vec::new();
    for &(set, prior) in sets {
        for l in set.iter().filter(|l| l.len() > n) {
            let (a, b, sse) = affine(&l[..n], head);
            let e = match l[n..].iter().position(|&v| a + b * v >= t) {
                Some(i) => ((n + i + 1) as f64).min(cap),
                // Never reached within its length: the cap if it covers
                // the cap; else it says nothing about when (a job's curve
                // ends where that job stopped) and has no vote.
                None if l.len() >= cap_epochs => cap,
                None => continue,
            };
            members.push((e, 0.0));
            // Step 2: Gaussian likelihood of the head under the map.
            log_w.push(prior.ln() - sse / (2.0 * sigma * sigma));
        }
    }
    if members.is_empty() {
        return EpochsPrediction::certain(cap, false);
    }
    let top = log_w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    for (m, lw) in members.iter_mut().zip(&log_w) {
        m.1 = (lw - top).exp();
    }
    let total: f64 = members.iter().map(|m| m.1).sum();
    let sq: f64 = members.iter().map(|m| m.1 * m.1).sum();
    members.sort_by(|x, y| x.0.total_cmp(&y.0));
    EpochsPrediction {
        epochs: quantile(&members, total, 0.5),
        low: quantile(&members, total, 0.1),
        high: quantile(&members, total, 0.9),
        observed: false,
        support: total * total / sq,
        by_targets: false,
    }
}

/// Folds one process's evaluations into a job's per-epoch curve (`curve[e
/// − 1]` = the value at epoch `e`): epochs are rounded to whole ones (an
/// evaluation at the end of epoch 3 may say 2.9999), an epoch already held
/// is overwritten (a resumed process evaluates it again), the next one is
/// appended, and one that would leave a gap is skipped (its predecessors
/// were never reported, and a curve with a hole has no shape). Returns
/// whether the curve changed.
pub fn fold_evals(curve: &mut Vec<f64>, epochs: &[f64], values: &[f64]) -> bool {
    let mut changed = false;
    for (&e, &v) in epochs.iter().zip(values) {
        if !e.is_finite() || !v.is_finite() || e < 0.5 {
            continue;
        }
        let i = e.round() as usize - 1;
        match i.cmp(&curve.len()) {
            std::cmp::Ordering::Less => {
                if curve[i] != v {
                    curve[i] = v;
                    changed = true;
                }
            }
            std::cmp::Ordering::Equal => {
                curve.push(v);
                changed = true;
            }
            std::cmp::Ordering::Greater => {}
        }
    }
    changed
}

#[cfg(test)]
mod tests;
