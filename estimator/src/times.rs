//! Time estimates (Ymir §4.3 and §5.1): `T_{i,a} = S(a, cfgs) · K_i`
//! (Eq. 5) for every allocation `a`, for single jobs and for temporal
//! (`A ↦ B`) and spatial (`A ‖ B`) pairs, and the pair weights `TranWt`
//! (Eq. 12–13). The scheduler asks once per round for the whole table, so
//! [`time_table`] takes every pending job and candidate pair at once and
//! shares the per-job lookups between the pairs.
//!
//! Conventions:
//! - `S(a, cfgs)` is the LUT's time of one optimizer iteration with the job's
//!   global batch split over `a` GPUs packed onto as few nodes as possible;
//!   `a = 0`, an allocation that does not fit in GPU memory, and a
//!   pipeline-parallel job on anything but whole 4-GPU servers take `+∞`.
//! - `T_{A↦B,a}` is the time of B trained from A's output weights, i.e.
//!   `S(a, cfgs_B) · K_B^{A↦B}` with `K_B^{A↦B}` from the transferred curve
//!   `L_B / (1 + G_{A,B})` (seeds README fix of Eq. 2).
//! - `T_{A‖B,a}` is the joint multi-task job: batch `M_A + M_B` in A's
//!   configuration, `K` by Eq. 4 with each task's transferred iterations.

use std::collections::HashMap;

use crate::icefrog;
use crate::loss_curve::{Convergence, LossCurve, PLATEAU_THRESHOLD};
use crate::lut::{Lut, LutError, Variant};
use crate::transfer::spatial_iterations;

/// One job as the time estimator needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobInput {
    pub id: String,
    pub model: String,
    pub gpu_type: String,
    /// GPUs per node of the cluster (placement shapes).
    pub gpus_per_node: u32,
    pub global_batch: u32,
    pub variant: Variant,
    /// Transformer layers (derives frozen-layer variants).
    pub layers: u32,
    /// Iterations still needed alone (`K_i` minus progress).
    pub remaining_iterations: u64,
    /// Iterations already done.
    pub done_iterations: u64,
    /// Fitted loss curve, when profiled: transferred `K` comes from it.
    pub curve: Option<LossCurve>,
    /// The job's iteration budget (caps every `K`; 0 = none).
    pub max_iterations: u64,
    /// Training samples per epoch (`D_i` of Eq. 4).
    pub samples_per_epoch: u64,
    /// A layer-elastic job's tuner inputs: its row then holds, at every
    /// allocation, the time at its best frozen layers there (ICEFROG Eq. 16
    /// with Eq. 15's `ℓ*`). None: the job trains at `variant` as it is.
    pub layer_tuning: Option<LayerTuning>,
}

/// What ICEFROG's layer tuner needs of a layer-elastic job: the per-layer
/// gradient variance its trainer last reported and how many layers it may
/// freeze. The range tuned is `variant.frozen_layers ..= max_frozen`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerTuning {
    pub variance: Vec<f64>,
    pub max_frozen: u32,
}

/// How two jobs are merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MergeMode {
    /// `A ↦ B`: A runs, then B starts from A's output weights.
    Temporal,
    /// `A ‖ B`: one joint multi-task process trains both.
    Spatial,
}

/// A candidate pair, by index into the job list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairInput {
    pub a: usize,
    pub b: usize,
    pub mode: MergeMode,
    /// `G_{A,B}`: gain of B from A (Eq. 1).
    pub gain_ab: f64,
    /// `G_{B,A}`: gain of A from B (spatial only).
    pub gain_ba: f64,
}

/// Times of one pair at every allocation.
#[derive(Clone, Debug, PartialEq)]
pub struct PairTimes {
    pub pair: PairInput,
    /// Iterations of the merged part (`K_B^{A↦B}` or Eq. 4's joint `K`).
    pub iterations: u64,
    /// `T_{A↦B,a}` or `T_{A‖B,a}` per allocation (seconds).
    pub seconds: Vec<f64>,
    /// `TranWt` per allocation (Eq. 12 or 13); 0 where undefined.
    pub tran_wt: Vec<f64>,
}

/// The whole table of one round.
#[derive(Clone, Debug, PartialEq)]
pub struct TimeTable {
    pub allocations: Vec<u32>,
    /// `T_{i,a}` per job, per allocation.
    pub jobs: Vec<Vec<f64>>,
    pub pairs: Vec<PairTimes>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TimeError {
    #[error("jobs[{index}] ({id}): {source}")]
    Lut {
        index: usize,
        id: String,
        source: LutError,
    },
    #[error("pairs[{index}]: {message}")]
    Pair { index: usize, message: String },
    #[error("jobs[{index}].{field}: must be > 0")]
    Zero { index: usize, field: &'static str },
}

use fmsched_core::policy::PIPELINE_STAGES;
/// Ymir's allocation set {0, 1, 2, 3, 4m} (defined once, with the policies).
pub use fmsched_core::policy::ymir_allocations;

/// `S(a, cfgs)`: seconds per iteration, `+∞` where the allocation is not
/// usable (see the module docs).
pub fn seconds_per_iteration(
    lut: &Lut,
    job: &JobInput,
    batch: u32,
    a: u32,
) -> Result<f64, LutError> {
    if a == 0 || (job.variant.pipeline && !a.is_multiple_of(PIPELINE_STAGES)) {
        return Ok(f64::INFINITY);
    }
    let it = lut.iteration_time(
        &job.model,
        &job.gpu_type,
        a,
        job.gpus_per_node,
        batch,
        &job.variant,
        job.layers,
    )?;
    Ok(if it.feasible {
        it.seconds
    } else {
        f64::INFINITY
    })
}

/// Seconds per full-gradient iteration of a layer-elastic job at `a` GPUs
/// at its best frozen layers there (ICEFROG Eq. 15–16):
/// `min_ℓ S(a, ℓ) · ψ(ℓ_0) / ψ(ℓ)` over `ℓ_0 = variant.frozen_layers ..=
/// max_frozen`, i.e. `M / max_ℓ E(a, ℓ)` with `E = ψ·T` (Eq. 2, 4) as the
/// live tuner ([`icefrog::tune_frozen_layers`]) picks it. ψ is taken
/// relative to the job's own floor `ℓ_0`: its remaining iterations were
/// estimated training those layers as it does (the user froze them), so at
/// `ℓ_0` the row is [`seconds_per_iteration`]'s. Without tuning inputs, or
/// when no ℓ fits, the plain time.
pub fn seconds_per_effective_iteration(
    lut: &Lut,
    job: &JobInput,
    batch: u32,
    a: u32,
) -> Result<f64, LutError> {
    let plain = seconds_per_iteration(lut, job, batch, a)?;
    let Some(t) = job.layer_tuning.as_ref().filter(|t| !t.variance.is_empty()) else {
        return Ok(plain);
    };
    let from = job.variant.frozen_layers;
    let to = t.max_frozen.clamp(from, job.layers.max(from));
    let at = |l: u32| -> Option<f64> {
        let v = JobInput {
            variant: Variant {
                frozen_layers: l,
                ..job.variant.clone()
            },
            layer_tuning: None,
            ..job.clone()
        };
        seconds_per_iteration(lut, &v, batch, a)
            .ok()
            .filter(|s| s.is_finite())
            // Eq. 4 without sharing (λ = 1, the Eq. 8 fix).
            .map(|s| icefrog::layer_aware_throughput(f64::from(batch), s, 1.0))
    };
    let floor = icefrog::frozen_penalty_of_layers(&t.variance, from);
    Ok(
        match icefrog::tune_frozen_layers(&t.variance, from..=to, at) {
            Some((l, _)) if l == from => plain,
            Some((_, e)) if e > 0.0 && floor > 0.0 => f64::from(batch) * floor / e,
            _ => plain,
        },
    )
}

/// Iterations of `job` when helped by a gain `g` (from its curve when it has
/// one; else `K / (1 + G)`, the same scaling applied to the iteration count).
pub fn transferred_iterations(job: &JobInput, g: f64) -> u64 {
    JobSearch::new(job).transferred(job, g)
}

/// A job's Eq. 2 search for the round's many gains (one per pair it may
/// join): its curve's [`Convergence`], found once, and its iterations
/// alone, `K(0)`, found once when a temporal pair first asks.
struct JobSearch {
    convergence: Option<Convergence>,
    alone: std::cell::OnceCell<u64>,
}

impl JobSearch {
    fn new(job: &JobInput) -> Self {
        Self {
            convergence: job.curve.as_ref().map(|c| Convergence::new(c, cap_of(job))),
            alone: std::cell::OnceCell::new(),
        }
    }

    /// [`transferred_iterations`].
    fn transferred(&self, job: &JobInput, g: f64) -> u64 {
        match &self.convergence {
            Some(c) => c
                .iterations(g, PLATEAU_THRESHOLD)
                .saturating_sub(job.done_iterations),
            None => ((job.remaining_iterations as f64) / (1.0 + g.max(-0.9))).ceil() as u64,
        }
    }

    /// [`iterations_from_weights`].
    fn after_weights(&self, job: &JobInput, g: f64) -> u64 {
        match &self.convergence {
            Some(c) if job.done_iterations == 0 => {
                let k0 = *self
                    .alone
                    .get_or_init(|| c.iterations(0.0, PLATEAU_THRESHOLD));
                let kg = c.iterations(g, PLATEAU_THRESHOLD) as f64;
                ((job.remaining_iterations as f64) * kg / k0.max(1) as f64).ceil() as u64
            }
            _ => self.transferred(job, g),
        }
    }
}

/// Iterations of B of a temporal transfer (from A's output weights, A live
/// or done) when helped by a gain `g`. B has not trained, and its own
/// remaining iterations are scaled by what the gain does to its curve,
/// `K(G) / K(0)` (Eq. 2 on `L(k)/(1+G)` and on `L(k)`): they are the
/// round's estimate of B (a metric target's prediction, or the loss
/// prior's), which need not be its curve's `K(0)`, and B's time from A's
/// weights must be on the same footing as its time alone, or a positive
/// gain can look like a loss (a prior of 186 iterations against a curve's
/// `K(G)` of 240). A B that has trained (a kept merge) needs
/// [`transferred_iterations`]. Spatial pairs keep that one too (Eq. 4 on
/// each task's curve).
pub fn iterations_from_weights(job: &JobInput, g: f64) -> u64 {
    JobSearch::new(job).after_weights(job, g)
}

/// B of a temporal transfer from a completed job has trained `done`
/// iterations from that job's weights and showed the gain `g` there
/// (its loss against its own curve, [`crate::transfer::observed_gain`]).
/// Going on needs `K(G) − done` more iterations (Eq. 2 on `L(k)/(1+G)`,
/// the seeds README's fix), starting again from the pre-trained weights
/// `K(0)` plus the restart (`restart_iterations`: the restart's seconds in
/// B's iterations). Returns `(left from the weights, from scratch)` when
/// starting again finishes sooner, else None: a gain that helps never
/// restarts, nor does a job whose iteration cap `cap` (0 = none) binds
/// either way, nor one that has come far enough that going on is shorter.
pub fn fresh_start_pays(
    curve: &LossCurve,
    g: f64,
    done: u64,
    cap: u64,
    restart_iterations: f64,
) -> Option<(u64, u64)> {
    if !(g < 0.0 && restart_iterations.is_finite()) {
        return None;
    }
    let cap = if cap == 0 { u64::MAX / 4 } else { cap };
    let search = Convergence::new(curve, cap);
    let fresh = search.iterations(0.0, PLATEAU_THRESHOLD);
    let left = search.iterations(g, PLATEAU_THRESHOLD).saturating_sub(done);
    fmsched_core::policy::fresh_start_pays(left as f64, fresh as f64, restart_iterations)
        .then_some((left, fresh))
}

/// A job's iteration cap (0: none).
fn cap_of(job: &JobInput) -> u64 {
    if job.max_iterations == 0 {
        u64::MAX / 4
    } else {
        job.max_iterations
    }
}

/// Ymir Eq. 12–13 (`TranWt`), kept in `fmsched-core` where the round
/// also weighs a pair against a warm start.
pub use fmsched_core::policy::{tran_wt_spatial, tran_wt_temporal};

/// Computes the round's table: Eq. 5 for every job and allocation, then the
/// pairs' times and `TranWt`. Errors name the job or pair at fault.
pub fn time_table(
    lut: &Lut,
    jobs: &[JobInput],
    pairs: &[PairInput],
    allocations: &[u32],
) -> Result<TimeTable, TimeError> {
    // Phase 1: S(a) per job at its own batch, and T_{i,a} (Eq. 5). Jobs of
    // one configuration class (model, GPU type, variant, node size) share
    // their LUT lookups per batch size — a round has many jobs of few kinds.
    let mut classes: Vec<&JobInput> = Vec::new();
    let class_of: Vec<usize> = jobs
        .iter()
        .map(|j| {
            let same = |c: &&JobInput| {
                c.model == j.model
                    && c.gpu_type == j.gpu_type
                    && c.variant == j.variant
                    && c.gpus_per_node == j.gpus_per_node
                    && c.layers == j.layers
                    && c.layer_tuning == j.layer_tuning
            };
            classes.iter().position(same).unwrap_or_else(|| {
                classes.push(j);
                classes.len() - 1
            })
        })
        .collect();
    let mut cache: HashMap<(usize, u32), Vec<f64>> = HashMap::new();
    let mut lookup = |index: usize, batch: u32| -> Result<Vec<f64>, TimeError> {
        let key = (class_of[index], batch);
        if let Some(v) = cache.get(&key) {
            return Ok(v.clone());
        }
        let j = &jobs[index];
        let v = row(allocations, index, j, |a| {
            seconds_per_iteration(lut, j, batch, a)
        })?;
        cache.insert(key, v.clone());
        Ok(v)
    };
    let mut per_iter: Vec<Vec<f64>> = Vec::with_capacity(jobs.len());
    for (index, j) in jobs.iter().enumerate() {
        if j.global_batch == 0 {
            return Err(TimeError::Zero {
                index,
                field: "global_batch_size",
            });
        }
        per_iter.push(lookup(index, j.global_batch)?);
    }
    // A job's own row: a layer-elastic one at its best frozen layers per
    // allocation (Eq. 16). Pairs keep the plain times: a merged process is
    // not layer-tuned.
    let mut tuned: HashMap<(usize, u32), Vec<f64>> = HashMap::new();
    let mut job_times: Vec<Vec<f64>> = Vec::with_capacity(jobs.len());
    for (index, (j, s)) in jobs.iter().zip(&per_iter).enumerate() {
        let s = if j.layer_tuning.is_some() {
            match tuned.get(&(class_of[index], j.global_batch)) {
                Some(v) => v.clone(),
                None => {
                    let v = row(allocations, index, j, |a| {
                        seconds_per_effective_iteration(lut, j, j.global_batch, a)
                    })?;
                    tuned.insert((class_of[index], j.global_batch), v.clone());
                    v
                }
            }
        } else {
            s.clone()
        };
        job_times.push(
            s.iter()
                .map(|&s| times_k(s, j.remaining_iterations))
                .collect(),
        );
    }

    // Phase 2: pairs. Spatial pairs run at batch M_A + M_B in A's
    // configuration (looked up through the same cache). Each job's Eq. 2
    // search is set up once for all the gains its pairs try.
    let searches: Vec<JobSearch> = jobs.iter().map(JobSearch::new).collect();
    let mut out = Vec::with_capacity(pairs.len());
    for (index, p) in pairs.iter().enumerate() {
        if p.a >= jobs.len() || p.b >= jobs.len() || p.a == p.b {
            return Err(TimeError::Pair {
                index,
                message: format!(
                    "job indices ({}, {}) must be two different jobs of {}",
                    p.a,
                    p.b,
                    jobs.len()
                ),
            });
        }
        if !(p.gain_ab.is_finite() && p.gain_ba.is_finite()) {
            return Err(TimeError::Pair {
                index,
                message: "gains must be finite numbers".into(),
            });
        }
        let (ja, jb) = (&jobs[p.a], &jobs[p.b]);
        let (ta, tb) = (&job_times[p.a], &job_times[p.b]);
        let (iterations, seconds, tran_wt) = match p.mode {
            MergeMode::Temporal => {
                let k = searches[p.b].after_weights(jb, p.gain_ab);
                let secs: Vec<f64> = per_iter[p.b].iter().map(|&s| times_k(s, k)).collect();
                let wt = (0..allocations.len())
                    .map(|i| tran_wt_temporal(ta[i], tb[i], secs[i]))
                    .collect();
                (k, secs, wt)
            }
            MergeMode::Spatial => {
                // Eq. 4 with each task's transferred iterations.
                let k = spatial_iterations(
                    searches[p.a].transferred(ja, p.gain_ba),
                    ja.global_batch,
                    ja.samples_per_epoch.max(1),
                    searches[p.b].transferred(jb, p.gain_ab),
                    jb.global_batch,
                    jb.samples_per_epoch.max(1),
                );
                let s_joint = lookup(p.a, ja.global_batch.saturating_add(jb.global_batch))?;
                let secs: Vec<f64> = s_joint.iter().map(|&s| times_k(s, k)).collect();
                let wt = (0..allocations.len())
                    .map(|i| tran_wt_spatial(ta[i], tb[i], secs[i]))
                    .collect();
                (k, secs, wt)
            }
        };
        out.push(PairTimes {
            pair: *p,
            iterations,
            seconds,
            tran_wt,
        });
    }
    Ok(TimeTable {
        allocations: allocations.to_vec(),
        jobs: job_times,
        pairs: out,
    })
}

/// One job's seconds per iteration at every allocation by `at`, a LUT
/// error naming the job.
fn row(
    allocations: &[u32],
    index: usize,
    j: &JobInput,
    at: impl Fn(u32) -> Result<f64, LutError>,
) -> Result<Vec<f64>, TimeError> {
    allocations
        .iter()
        .map(|&a| at(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TimeError::Lut {
            index,
            id: j.id.clone(),
            source,
        })
}

/// Eq. 5: `S · K` (0 iterations take 0 s even where `S` is infinite).
fn times_k(s: f64, k: u64) -> f64 {
    if k == 0 { 0.0 } else { s * k as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss_curve::iterations_to_converge;
    use proptest::prelude::*;

    fn lut() -> Lut {
        let mut l = Lut::default();
        l.import_csv(
            "m",
            "V100",
            "placements",
            "p.csv",
            "placement,local_bsz,step_time,sync_time\n1,8,0.10,0\n1,16,0.20,0\n1,32,0.40,0\n2,8,0.12,0.02\n2,16,0.22,0.02\n\
             3,8,0.13,0.03\n3,16,0.23,0.03\n4,4,0.08,0.03\n4,8,0.13,0.03\n4,16,0.23,0.03\n44,4,0.10,0.05\n44,8,0.15,0.05\n",
        )
        .unwrap();
        l
    }

    fn job(id: &str, batch: u32, k: u64) -> JobInput {
        JobInput {
            id: id.into(),
            model: "m".into(),
            gpu_type: "V100".into(),
            gpus_per_node: 4,
            global_batch: batch,
            variant: Variant::base(),
            layers: 12,
            remaining_iterations: k,
            done_iterations: 0,
            curve: None,
            max_iterations: 0,
            samples_per_epoch: 1000,
            layer_tuning: None,
        }
    }

    #[test]
    fn eq5_by_hand() {
        let l = lut();
        let t = time_table(&l, &[job("a", 16, 1000)], &[], &[0, 1, 2, 4, 8]).unwrap();
        // 1 GPU: 0.20 s × 1000; 2 GPUs: local 8 → 0.12 s; 4 GPUs: local 4 → 0.08;
        // 8 GPUs ("44"): local 2, extrapolated from (4, .10), (8, .15) → 0.075.
        let want = [f64::INFINITY, 200.0, 120.0, 80.0, 75.0];
        for (got, want) in t.jobs[0].iter().zip(want) {
            assert!(
                (got - want).abs() < 1e-9 || (got.is_infinite() && want.is_infinite()),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn eq12_and_eq13_by_hand() {
        // T_A = 100, T_B = 300, T_{A↦B} = 150: (2·100 + 300) / (2·100 + 150) = 500/350.
        assert!((tran_wt_temporal(100.0, 300.0, 150.0) - 500.0 / 350.0).abs() < 1e-12);
        // Spatial: T_{A‖B} = 200: 500 / 400.
        assert!((tran_wt_spatial(100.0, 300.0, 200.0) - 1.25).abs() < 1e-12);
        assert_eq!(tran_wt_spatial(100.0, f64::INFINITY, 200.0), 0.0);
        // A pair that takes as long as SRTF of the two has weight 1.
        assert!((tran_wt_temporal(100.0, 300.0, 300.0) - 1.0).abs() < 1e-12);
    }

    /// ICEFROG Eq. 16 at every allocation: a layer-elastic job's row is its
    /// time at its best frozen layers there, by hand; it freezes only where
    /// freezing pays (ψ barely drops when the early layers have settled),
    /// and a job whose early layers still learn keeps its plain row.
    #[test]
    fn layer_elastic_rows_take_the_best_frozen_layers_per_allocation() {
        let lut = lut();
        let allocations = [1, 2, 4];
        let plain = job("p", 16, 100);
        let settled = JobInput {
            id: "settled".into(),
            // Gradient variance concentrated in the deep layers.
            layer_tuning: Some(LayerTuning {
                variance: (0..12).map(|i| if i < 6 { 1e-3 } else { 1.0 }).collect(),
                max_frozen: 10,
            }),
            ..job("settled", 16, 100)
        };
        let learning = JobInput {
            id: "learning".into(),
            layer_tuning: Some(LayerTuning {
                variance: (0..12).map(|i| if i < 6 { 5.0 } else { 0.1 }).collect(),
                max_frozen: 10,
            }),
            ..job("learning", 16, 100)
        };
        let t = time_table(
            &lut,
            &[plain.clone(), settled.clone(), learning],
            &[],
            &allocations,
        )
        .unwrap();
        for (k, &a) in allocations.iter().enumerate() {
            // By hand: min over ℓ of S(a, ℓ) / ψ(ℓ) (ψ(0) = 1).
            let by_hand = (0..=10u32)
                .map(|l| {
                    let v = JobInput {
                        variant: Variant {
                            frozen_layers: l,
                            ..Variant::base()
                        },
                        layer_tuning: None,
                        ..plain.clone()
                    };
                    let s = seconds_per_iteration(&lut, &v, 16, a).unwrap();
                    s / icefrog::frozen_penalty_of_layers(
                        &settled.layer_tuning.as_ref().unwrap().variance,
                        l,
                    )
                })
                .fold(f64::INFINITY, f64::min);
            assert!((t.jobs[1][k] - 100.0 * by_hand).abs() < 1e-9 * t.jobs[1][k]);
            assert!(
                t.jobs[1][k] < t.jobs[0][k],
                "freezing settled layers pays at {a} GPUs"
            );
            assert_eq!(t.jobs[2][k], t.jobs[0][k], "no ℓ beats ℓ = 0 at {a} GPUs");
        }
    }

    /// The layers a user froze are the job's floor: its row at the floor
    /// is the plain row of that variant (ψ relative to the floor), so a
    /// layer-elastic job whose tuner can do no better costs what it costs.
    #[test]
    fn a_user_frozen_floor_is_not_penalised() {
        let lut = lut();
        let floor = JobInput {
            variant: Variant {
                frozen_layers: 4,
                ..Variant::base()
            },
            ..job("f", 16, 50)
        };
        let elastic = JobInput {
            layer_tuning: Some(LayerTuning {
                // Layers 5.. still learn hard: freezing more never pays.
                variance: (0..12).map(|i| if i < 4 { 1.0 } else { 50.0 }).collect(),
                max_frozen: 4,
            }),
            ..floor.clone()
        };
        let t = time_table(&lut, &[floor, elastic], &[], &[1, 2]).unwrap();
        assert_eq!(t.jobs[0], t.jobs[1]);
    }

    /// A job that has not trained keeps its own estimate's footing under a
    /// gain: its remaining iterations times the curve's `K(G) / K(0)`, so
    /// a positive gain always shortens it; one that has trained needs its
    /// curve's `K(G)` less what it has done.
    #[test]
    fn tail_transferred_iterations_scale_the_jobs_own_estimate() {
        let curve = LossCurve::new(0.2, 0.6, 0.002, 1e-7);
        let k0 = iterations_to_converge(&curve, 0.0, PLATEAU_THRESHOLD, u64::MAX / 4) as f64;
        let kg = iterations_to_converge(&curve, 0.25, PLATEAU_THRESHOLD, u64::MAX / 4) as f64;
        assert!(kg < k0);
        let mut j = job("b", 16, 186);
        j.curve = Some(curve);
        j.max_iterations = 0;
        let t = iterations_from_weights(&j, 0.25);
        assert_eq!(t, (186.0 * kg / k0).ceil() as u64);
        assert!(t < 186, "{t}");
        j.done_iterations = 10;
        assert_eq!(iterations_from_weights(&j, 0.25), kg as u64 - 10);
        assert_eq!(transferred_iterations(&j, 0.25), kg as u64 - 10);
    }

    /// A warm start that hurt (measured `G` = −0.4) restarts from the
    /// pre-trained weights while what it still needs from them exceeds a
    /// fresh start plus the restart; not once it has come far enough, not
    /// for a restart that costs more than it saves, never for a gain that
    /// helps, and never where the iteration cap binds both ways.
    #[test]
    fn tail_a_harmful_warm_start_restarts_only_where_that_finishes_sooner() {
        let curve = LossCurve::new(0.2, 0.6, 0.002, 1e-7);
        let none = u64::MAX / 4;
        let k0 = iterations_to_converge(&curve, 0.0, PLATEAU_THRESHOLD, none);
        let kg = iterations_to_converge(&curve, -0.4, PLATEAU_THRESHOLD, none);
        assert!(kg > k0 + 100, "{kg} vs {k0}");
        assert_eq!(
            fresh_start_pays(&curve, -0.4, 20, 0, 10.0),
            Some((kg - 20, k0))
        );
        // Far along: going on is shorter than starting again.
        let far = kg - k0;
        assert_eq!(fresh_start_pays(&curve, -0.4, far, 0, 10.0), None);
        // A restart that costs more than the start saves.
        let saved = (kg - 20 - k0) as f64;
        assert_eq!(fresh_start_pays(&curve, -0.4, 20, 0, saved + 1.0), None);
        assert!(fresh_start_pays(&curve, -0.4, 20, 0, saved - 1.0).is_some());
        // A gain that helps, or none.
        assert_eq!(fresh_start_pays(&curve, 0.2, 20, 0, 0.0), None);
        assert_eq!(fresh_start_pays(&curve, 0.0, 20, 0, 0.0), None);
        // A cap below both: the job runs to it either way.
        assert_eq!(fresh_start_pays(&curve, -0.4, 20, k0 / 2, 0.0), None);
    }

    #[test]
    fn pairs_use_transferred_iterations() {
        let l = lut();
        let jobs = [job("a", 16, 1000), job("b", 16, 2000)];
        let pairs = [
            PairInput {
                a: 0,
                b: 1,
                mode: MergeMode::Temporal,
                gain_ab: 1.0,
                gain_ba: 0.0,
            },
            PairInput {
                a: 0,
                b: 1,
                mode: MergeMode::Spatial,
                gain_ab: 1.0,
                gain_ba: 0.25,
            },
        ];
        let t = time_table(&l, &jobs, &pairs, &[1]).unwrap();
        // Temporal: K_B = 2000 / (1 + 1) = 1000 at 0.20 s = 200 s;
        // TranWt = (2·200 + 400) / (2·200 + 200) = 800 / 600.
        assert_eq!(t.pairs[0].iterations, 1000);
        assert!((t.pairs[0].seconds[0] - 200.0).abs() < 1e-9);
        assert!((t.pairs[0].tran_wt[0] - 800.0 / 600.0).abs() < 1e-12);
        // Spatial: K_A = 800, K_B = 1000; epochs 800·16/1000 = 12.8 and 16;
        // joint K = 16 · 2000 / 32 = 1000 at batch 32 on 1 GPU (0.40 s) = 400 s.
        assert_eq!(t.pairs[1].iterations, 1000);
        assert!((t.pairs[1].seconds[0] - 400.0).abs() < 1e-9);
        assert!((t.pairs[1].tran_wt[0] - 800.0 / 800.0).abs() < 1e-12);
    }

    #[test]
    fn pipeline_jobs_only_run_on_whole_servers_and_errors_name_the_job() {
        let mut l = lut();
        let pipe = Variant {
            pipeline: true,
            ..Variant::base()
        };
        l.profile_mut("m", "V100", &pipe).placements.insert(
            "4".into(),
            vec![crate::lut::Point {
                local_bsz: 16,
                step: 0.3,
                sync: 0.0,
            }],
        );
        let mut j = job("p", 16, 10);
        j.variant = pipe;
        let t = time_table(&l, &[j], &[], &[1, 2, 4]).unwrap();
        assert!(t.jobs[0][0].is_infinite() && t.jobs[0][1].is_infinite());
        assert!((t.jobs[0][2] - 3.0).abs() < 1e-9);
        let mut unknown = job("x", 16, 10);
        unknown.model = "nope".into();
        let e = time_table(&l, &[unknown], &[], &[1]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("jobs[0] (x): no throughput profile"),
            "{e}"
        );
        let bad = [PairInput {
            a: 0,
            b: 0,
            mode: MergeMode::Spatial,
            gain_ab: 0.0,
            gain_ba: 0.0,
        }];
        assert!(matches!(
            time_table(&l, &[job("a", 16, 1)], &bad, &[1]),
            Err(TimeError::Pair { index: 0, .. })
        ));
    }

    proptest! {
        /// Eq. 13 is symmetric in A and B when the joint job is (Ymir §5.1:
        /// "numerically equal").
        #[test]
        fn spatial_tran_wt_is_symmetric(ka in 1u64..5000, kb in 1u64..5000, ga in -0.5f64..2.0, gb in -0.5f64..2.0) {
            let l = lut();
            let jobs = [job("a", 16, ka), job("b", 16, kb)];
            let ab = PairInput { a: 0, b: 1, mode: MergeMode::Spatial, gain_ab: gb, gain_ba: ga };
            let ba = PairInput { a: 1, b: 0, mode: MergeMode::Spatial, gain_ab: ga, gain_ba: gb };
            let t = time_table(&l, &jobs, &[ab, ba], &[1, 2, 4]).unwrap();
            for i in 0..3 {
                prop_assert!((t.pairs[0].tran_wt[i] - t.pairs[1].tran_wt[i]).abs() < 1e-9);
            }
        }
    }
}
