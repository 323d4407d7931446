//! The discrete-event simulation: a virtual clock, arrivals, a scheduling
//! round every policy interval (the policy is `fmsched_core::policy`, the
//! same code the scheduler runs), and jobs that progress at the speed the
//! throughput LUT gives for their actual placement.
//!
//! What is modelled, and how:
//! - **work** — a job needs `epochs × samples_per_epoch` samples (epochs from
//!   the workload, else the catalog); it processes `batch / t_iter` samples
//!   per second, `t_iter` from the LUT for its placement shape, its global
//!   batch split over the GPUs with gradient accumulation when the local
//!   batch does not fit in memory.
//! - **restarts** — every start, resume or change of placement costs
//!   `checkpoint_s` plus the model's context-switch time (the profile's, or
//!   `context_switch_s`) before progress resumes.
//! - **profiling** — a new job first runs `profile_s` seconds on 1 GPU
//!   (4 for pipeline-parallel), never merged; it then joins the policy's
//!   queue with zero progress (the profiling run only measures). Those GPUs
//!   are taken from the capacity the policy sees.
//! - **temporal transfer** `A ↦ B` — A runs to its own target; then B starts
//!   (a new process, one restart) from A's weights and needs the catalog's
//!   `A->B` epochs.
//! - **warm starts** — a job that has not trained may start from the output
//!   weights of a finished job of another task (temporal transfer from an
//!   A that is done, `core::round::WarmKey`): it then needs the catalog's
//!   `A->B` epochs, waits for nothing, and the merge guard watches it as B.
//! - **spatial transfer** `A ‖ B` — one joint process at batch `M_A + M_B`,
//!   sampling both datasets in proportion to their sizes (Ymir Eq. 4's
//!   assumption). Each job completes when *its own* task reaches its target
//!   (the catalog's joint epochs for it); the other then continues alone.
//!   (The published simulator finishes both with the first — not copied.)
//! - **merge guard** (Ymir §4.3) — after two epochs of the merged part, a
//!   merge whose transfer does not help (merged epochs ≥ alone epochs) is
//!   split: temporal B restarts alone from scratch, spatial jobs continue
//!   alone from where they are.
//! - **estimates** — the policy sees remaining times computed from the
//!   catalog and the LUT (an oracle estimator).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use fmsched_core::policy::lyra::ReclaimRule;
use fmsched_core::policy::{
    MergeMode, PIPELINE_STAGES, Policy, Replica, SHARED_SLOWDOWN, ymir_allocations,
};
use fmsched_core::round::{
    self, ClusterView, Decision, Estimates, FinishedView, Gpu, JobView, MergeView, NodeView,
    PairEstimate, Prepared, RoundClock, RoundConfig, RoundOutcome, WarmEstimate,
};
use fmsched_core::slo::{self, RewardStep};
use fmsched_core::{JobState, NodeState, SloClass};
use fmsched_estimator::analytic;
use fmsched_estimator::curve_prior::{
    CurveLibrary, Metric, Query, Start, predict, remaining_spread,
};
use fmsched_estimator::icefrog;
use fmsched_estimator::lut::{Lut, Variant, expert_group};
use fmsched_estimator::times::{tran_wt_spatial, tran_wt_temporal};

use crate::catalog::{Catalog, JobTargets, TaskInfo, Work};
use crate::loans::{LoanStats, Loans};
use crate::workload::WorkloadJob;

/// What a job's throughput depends on besides its placement shape: its
/// configuration (an index into the distinct (LUT model, layers, variant)
/// of the workload), its global batch, whether the TitanSched estimate
/// model is asked for, the GPU family (an index), and the frozen layers.
type RateKey = (u32, u32, bool, usize, u32);

/// How jobs pick their frozen layers (ICEFROG §III).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LayerMode {
    /// As the workload trains: no layer elasticity.
    #[default]
    Off,
    /// Every job is layer-elastic up to 90 % of its layers (the paper's
    /// end-to-end setting, §V-B): the layer tuner (Eq. 15) picks the frozen
    /// layers for the GPUs it runs on at every (re)allocation, and the
    /// policy sees the best choice at each allocation (Eq. 16). Progress is
    /// ψ(ℓ) · samples/s (Eq. 2) over the synthetic variance profile
    /// ([`fmsched_estimator::icefrog::synthetic_layer_variance`]).
    Tuner,
    /// FreezeOut-style fixed schedule (Brock et al. 2017, as ICEFROG's
    /// baselines use it): from `t0` of the way to its target the job
    /// freezes its first layers one by one, linearly in progress, up to 90 %
    /// of them by the end; `t0` is tuned per job on effective progress at
    /// its requested GPUs ("tuned FreezeOut", §V-A). The policy does not
    /// see it (its estimates are those of plain training).
    Freezeout,
}

/// ICEFROG §V-B: at most 90 % of a model's layers are frozen.
pub const MAX_FROZEN_SHARE: f64 = 0.9;

/// The frozen layers of a FreezeOut schedule starting at `t0` at progress
/// `p` (both fractions of the target): none before `t0`, then one more of
/// `max` every `(1 − t0) / max` of progress.
pub fn freezeout_layers(t0: f64, p: f64, max: u32) -> u32 {
    if p < t0 || max == 0 || t0 >= 1.0 {
        return 0;
    }
    let f = (p - t0) / (1.0 - t0);
    ((f * f64::from(max)).floor() as u32 + 1).min(max)
}

/// How the remaining times the policy sees are estimated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EstimateModel {
    /// From the same throughput the simulation runs at (an oracle).
    #[default]
    Exact,
    /// As the TitanSched simulator the Ymir authors evaluate with predicts
    /// them: its `predict_remaining_time` counts one compute pass more per
    /// iteration than its progress then runs (`step + (step − sync)·(a + 1)`
    /// against `a` gradient-accumulation steps). Over-predicting most where
    /// an iteration is short, it makes Optimus give fewer GPUs than the true
    /// gains warrant. `fmsim fidelity` only, to replay their runs.
    TitanSched,
}

/// Epochs of metric curve a job's profiling shows the learned estimator
/// (the published curves' convention: three evaluations).
pub const PROFILED_EPOCHS: usize = 3;

/// The learned estimator's epochs-to-target for a job alone with per-epoch
/// `curve` of `metric` and `target`, and the relative spread of its
/// remaining time ([`remaining_spread`]), after `n` observed epochs, for
/// every `n` from 0 to the curve's length (below [`PROFILED_EPOCHS`] it
/// has seen that many).
fn learned_epochs(
    lib: &CurveLibrary,
    curve: &[f64],
    metric: Metric,
    target: f64,
) -> Vec<(f64, f64)> {
    (0..=curve.len())
        .map(|n| {
            let head = &curve[..n.max(PROFILED_EPOCHS).min(curve.len())];
            let q = Query {
                head,
                target,
                metric,
                start: Start::Alone,
                cap_epochs: curve.len(),
            };
            predict(lib, &q).map_or((curve.len() as f64, 0.0), |p| {
                (p.epochs, remaining_spread(&p, head.len()))
            })
        })
        .collect()
}

/// An iteration as the TitanSched simulator predicts it: the LUT's time
/// `it` (gradient accumulation included) plus one more compute pass,
/// `step − sync`, of one micro-batch at `it`'s local batch.
pub fn titansched_iteration_s(
    lut: &Lut,
    model: &str,
    gpu_type: &str,
    placement: &str,
    variant: &Variant,
    layers: u32,
    it: fmsched_estimator::lut::IterationTime,
) -> f64 {
    let one = fmsched_estimator::lut::ThroughputKey {
        model: model.to_string(),
        gpu_type: gpu_type.to_string(),
        placement: placement.to_string(),
        local_bsz: it.local_bsz,
        grad_accum: 1,
        variant: variant.clone(),
    };
    it.seconds
        + lut
            .step_time(&one, layers)
            .map_or(0.0, |st| (st.step - st.sync).max(0.0))
}

/// Nodes of one kind: `count` nodes of `gpus` GPUs of `gpu_type` each.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// A GPU model or family (`V100`, `A100-80GB`, …; reduced to its family
    /// by `fmsched_estimator::analytic::gpu_family`).
    pub gpu_type: String,
    pub count: u32,
    pub gpus: u32,
}

impl NodeGroup {
    pub fn new(gpu_type: &str, count: u32, gpus: u32) -> Self {
        Self {
            gpu_type: gpu_type.to_string(),
            count,
            gpus,
        }
    }
}

/// fmsim's default `deadline_gap_s`, as the service's
/// `scheduling.deadline_round_gap`.
pub const DEFAULT_DEADLINE_GAP_S: f64 = 5.0;

/// Simulation settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The cluster: node groups in order (node ids count up through them).
    /// A group never mixes GPU families, as in the service.
    pub cluster: Vec<NodeGroup>,
    /// Seconds to write and load a checkpoint on every (re)start.
    pub checkpoint_s: f64,
    /// Context-switch seconds; None = the profile's for the model.
    pub context_switch_s: Option<f64>,
    /// Seconds of profiling before a job is schedulable (0 = none).
    pub profile_s: f64,
    /// Split merges that do not help after two epochs.
    pub merge_guard: bool,
    /// Give up after this much virtual time.
    pub horizon_s: f64,
    /// Estimation error given to the policy: each job's remaining times are
    /// scaled by a fixed factor drawn uniformly from [1 − e, 1 + e] (Ymir
    /// §7.3's sensitivity study). 0 = oracle estimates.
    pub estimate_noise: f64,
    /// Transfer-gain error given to the policy (Ymir §7.3, Fig. 8a: noise
    /// on the transferability estimator's predictions): the work a merge
    /// or warm start is predicted to save a job is scaled by a fixed factor
    /// per pair and direction, uniform in [1 − e, 1 + e]; what the pair
    /// then trains is the truth. 0 = the true gains.
    pub gain_noise: f64,
    /// The policy sees the learned estimator's epochs-to-target instead of
    /// the truth (`--estimates learned`): a job whose catalog entry is a
    /// per-epoch metric curve is predicted by
    /// [`fmsched_estimator::curve_prior`] from the epochs it has seen
    /// (at least [`PROFILED_EPOCHS`], what profiling shows it), with a prior
    /// of the same model's other tasks' curves, and its remaining times are
    /// scaled by predicted / true remaining work — the estimator's own
    /// errors replayed. Jobs with no curve keep exact estimates.
    pub learned_estimates: bool,
    /// Print one line per scheduling round on stderr (default: set when
    /// `FMSIM_DEBUG` is in the environment).
    pub trace_rounds: bool,
    /// How groups that fit no single node are placed.
    pub placement_rule: fmsched_core::policy::PlacementRule,
    /// How the policy's remaining times are estimated.
    pub estimate_model: EstimateModel,
    /// Rounds fire at `origin + k · interval` on the workload's clock; None:
    /// every `interval` from the first arrival. The TitanSched simulator's
    /// rounds run from 0 (`fmsim fidelity` sets `Some(0.0)`), so a job that
    /// arrives between two of them waits for the next one as it does there.
    pub round_origin_s: Option<f64>,
    /// Rounds on events (`--event-gap`, the service's
    /// `scheduling.event_round_gap`): an arrival, a completion or a
    /// profiling run's end brings the next round forward to now, at least
    /// this many seconds after the last one began
    /// ([`fmsched_core::round::round_after_event`]), and the periodic one
    /// follows an interval after it. None: a round per interval only.
    pub event_gap_s: Option<f64>,
    /// Rounds for deadlines (`--deadline-gap`, the service's
    /// `scheduling.deadline_round_gap`): on an arrival, a completion or a
    /// profiling run's end, a job with a deadline that waits to start and
    /// would miss it by waiting for the periodic round brings that round
    /// forward, as an event would
    /// ([`fmsched_core::round::round_for_deadline`]). None, or with
    /// `round_origin_s` (the authors' fixed grid): off. On by default (5 s),
    /// as in the service.
    pub deadline_gap_s: Option<f64>,
    /// Queues with quotas (`--queues`; empty: none).
    pub queues: fmsched_core::queue::Queues,
    /// An inference cluster that loans idle servers to training (Lyra);
    /// None: the training cluster alone.
    pub loans: Option<Loans>,
    /// Lyra's job model: a job never runs on fewer GPUs than it asks for
    /// (its base demand; an elastic one may grow to `max_gpus`). Off: any
    /// job may shrink to one GPU (Ymir's malleable jobs).
    pub base_demands: bool,
    /// How jobs pick their frozen layers (ICEFROG).
    pub layers: LayerMode,
    /// GPU sharing (ICEFROG Eq. 8): the policy sees each one-GPU job's
    /// memory and utilisation alone and the GPUs' memory, so it may put two
    /// jobs on one GPU (each at λ = 0.9 of its speed). Off: no job shares.
    pub gpu_sharing: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            cluster: vec![NodeGroup::new("V100", 8, 4)],
            checkpoint_s: 30.0,
            context_switch_s: None,
            profile_s: 60.0,
            merge_guard: true,
            horizon_s: 90.0 * 86_400.0,
            estimate_noise: 0.0,
            gain_noise: 0.0,
            learned_estimates: false,
            trace_rounds: std::env::var_os("FMSIM_DEBUG").is_some(),
            placement_rule: Default::default(),
            estimate_model: EstimateModel::Exact,
            round_origin_s: None,
            event_gap_s: None,
            deadline_gap_s: Some(DEFAULT_DEADLINE_GAP_S),
            queues: Default::default(),
            loans: None,
            base_demands: false,
            layers: LayerMode::Off,
            gpu_sharing: false,
        }
    }
}

impl SimConfig {
    /// The round clock of a run whose first job arrives at `t0_s`, under a
    /// policy's `interval_s`: core's one rule, as the service's
    /// (`scheduler_svc::scheduling::round_clock`). Rounds on events
    /// (`event_gap_s`), or for deadlines (`deadline_gap_s`, off on rounds
    /// aligned to `round_origin_s`, the authors' grid, whose first round is
    /// the first grid point at or after `t0_s`).
    pub fn round_clock(&self, interval_s: f64, t0_s: f64) -> RoundClock {
        let first_s = match self.round_origin_s {
            Some(origin) => origin + ((t0_s - origin) / interval_s).ceil().max(0.0) * interval_s,
            None => t0_s,
        };
        let deadline_gap_s = self
            .deadline_gap_s
            .filter(|_| self.round_origin_s.is_none());
        RoundClock::new(interval_s, self.event_gap_s, deadline_gap_s, first_s)
    }

    /// A cluster of `nodes` nodes of `gpus_per_node` `gpu_type` GPUs.
    pub fn uniform(nodes: u32, gpus_per_node: u32, gpu_type: &str) -> Self {
        Self {
            cluster: vec![NodeGroup::new(gpu_type, nodes, gpus_per_node)],
            ..Default::default()
        }
    }

    /// GPUs of the training cluster.
    pub fn total_gpus(&self) -> u32 {
        self.cluster.iter().map(|g| g.count * g.gpus).sum()
    }

    /// GPUs of the inference servers that may be loaned.
    pub fn inference_gpus(&self) -> u32 {
        self.loans
            .iter()
            .flat_map(|l| &l.inference)
            .map(|g| g.count * g.gpus)
            .sum()
    }

    /// Every node as the round sees it (families resolved): the training
    /// cluster's, then the inference servers' (out of the round — Offline —
    /// until loaned).
    fn node_views(&self) -> Vec<NodeView> {
        let mut out = Vec::new();
        let inference = self.loans.iter().flat_map(|l| &l.inference);
        for (g, training) in self
            .cluster
            .iter()
            .map(|g| (g, true))
            .chain(inference.map(|g| (g, false)))
        {
            let family = analytic::gpu_family(&g.gpu_type);
            for _ in 0..g.count {
                out.push(NodeView {
                    id: if training {
                        format!("node-{}", out.len())
                    } else {
                        format!("inference-{}", out.len())
                    },
                    gpus: g.gpus,
                    state: if training {
                        NodeState::Available
                    } else {
                        NodeState::Offline
                    },
                    drained: false,
                    cordoned: false,
                    gpu_memory_gib: if self.gpu_sharing {
                        fmsched_estimator::lut::gpu_memory_gib(&family).unwrap_or(0.0)
                    } else {
                        0.0
                    },
                    gpu_model: family.clone(),
                    loaned: false,
                });
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("job {job}: {message}")]
    Job { job: String, message: String },
    #[error("invalid plan at t={t:.0}s: {message}")]
    Plan { t: f64, message: String },
    #[error("{0}")]
    Config(String),
}

/// Per-job outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct JobResult {
    pub name: String,
    pub model: String,
    pub task: String,
    pub submit_s: f64,
    pub first_start_s: Option<f64>,
    /// When it first trained (its profiling run not counted): the end of
    /// its queuing.
    pub first_train_s: Option<f64>,
    pub finish_s: f64,
    pub jct_s: f64,
    /// JCT over the time alone at the requested GPUs (finish-time fairness ρ).
    pub ftf: f64,
    /// Themis' ρ against an equal share of the cluster: the GPU-seconds an
    /// equal share (at most its request) would have given it over its life
    /// over the GPU-seconds it got. With progress linear in GPU-seconds this
    /// is T_shared / T_ideal of Themis, where T_ideal runs on a 1/N share;
    /// ρ ≤ 1: it did no worse than under an equal split.
    pub fair_rho: f64,
    pub restarts: u32,
    /// Merge it took part in: (mode, partner).
    pub merged: Option<(MergeMode, String)>,
    /// GPU families it ran on (profiling included), sorted; one per run.
    pub gpu_types: Vec<String>,
    /// Its service class (UniSched).
    pub class: SloClass,
    /// Its reward steps (absolute seconds), empty for best-effort.
    pub deadlines: Vec<RewardStep>,
    /// A floor under its JCT: started once, alone at its requested GPUs,
    /// with no wait; and when profiling runs and its work outlasts the
    /// profiling run even at that speed, the profiling run before it (its
    /// start and `profile_s`: it trains at one replica's speed at most,
    /// then stops, and its progress is not kept). A deadline before
    /// `submit_s` plus this is one no schedule at that size meets.
    pub best_case_s: f64,
}

impl JobResult {
    /// The reward it earned (SLO jobs; [`slo::reward_at`]).
    pub fn reward(&self) -> Option<f64> {
        (!self.deadlines.is_empty()).then(|| slo::reward_at(&self.deadlines, self.finish_s))
    }

    /// An SLO job whose first deadline comes before its best case
    /// ([`JobResult::best_case_s`]): no policy could have met it.
    pub fn unreachable(&self) -> bool {
        self.deadlines
            .first()
            .is_some_and(|d| d.by < self.submit_s + self.best_case_s)
    }
}

/// A whole run.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub policy: String,
    pub jobs: Vec<JobResult>,
    pub makespan_s: f64,
    pub gpu_utilisation: f64,
    pub restarts: u32,
    pub merges_temporal: u32,
    pub merges_spatial: u32,
    /// Jobs that started from a finished job's output weights
    /// (`RoundOutcome::warm_starts`); not counted in `merges_temporal`.
    pub warm_starts: u32,
    pub guard_splits: u32,
    /// Kept temporal merges split because B would finish sooner alone
    /// (`RoundOutcome::released`).
    pub merges_released: u32,
    pub rounds: u32,
    pub fallbacks: u32,
    /// Wall-clock seconds of each `Policy::schedule` call.
    pub round_wall_s: Vec<f64>,
    /// (variables, constraints) of each round (MILP policies).
    pub model_sizes: Vec<(usize, usize)>,
    pub wall_s: f64,
    /// Loans and reclaims (runs with an inference cluster).
    pub loans: LoanStats,
    /// GPU-seconds two jobs shared one GPU (ICEFROG Eq. 8).
    pub shared_gpu_s: f64,
}

/// A re-tuning hook for [`Simulation::run_retuned`]: called every
/// `every_s` simulated seconds with the run so far and the active policy;
/// a returned policy replaces it.
pub struct Retune<'h> {
    pub every_s: f64,
    #[allow(clippy::type_complexity)]
    pub hook:
        &'h mut dyn FnMut(&Observation<'_>, &dyn Policy) -> Option<Box<dyn Policy + Send + Sync>>,
}

/// What a job carries over into a simulation ([`Simulation::seed_history`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct History {
    pub attained_gpu_s: f64,
    pub executed_s: f64,
    /// Seconds since it was submitted.
    pub age_s: f64,
    /// Themis' deserved service so far (GPU-seconds of an equal share).
    pub fair_share_gpu_s: f64,
}

/// The run as a tuner sees it.
#[derive(Debug)]
pub struct Observation<'a> {
    pub now: f64,
    /// Every job that has arrived, in workload order.
    pub jobs: Vec<ObservedJob<'a>>,
}

/// One arrived job: what was asked and how far it got, in time.
#[derive(Debug)]
pub struct ObservedJob<'a> {
    /// Its index in the workload.
    pub index: usize,
    pub spec: &'a WorkloadJob,
    pub state: ObservedState,
    /// Seconds it has run (restart costs included).
    pub executed_s: f64,
    pub attained_gpu_s: f64,
    pub fair_share_gpu_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ObservedState {
    Waiting,
    Running,
    Done { finish_s: f64 },
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    NotArrived,
    Profiling { until: f64 },
    Waiting,
    Done,
}

impl Job {
    /// Arrived and not finished.
    fn in_system(&self) -> bool {
        matches!(self.phase, Phase::Profiling { .. } | Phase::Waiting)
    }
}

#[derive(Clone, Debug)]
struct Alloc {
    gpus: u32,
    /// Node → GPUs, by node.
    placement: Vec<(usize, u32)>,
    /// The GPUs themselves (what the shared round keeps or moves).
    held: Vec<Gpu>,
    /// Progress resumes at this time (restart cost).
    ready_at: f64,
    /// It shares its one GPU with another job (ICEFROG Eq. 8).
    shared: bool,
}

impl Alloc {
    /// An allocation of `held` from `ready_at` on.
    fn on(mut held: Vec<Gpu>, ready_at: f64) -> Self {
        held.sort_unstable();
        let mut placement: Vec<(usize, u32)> = Vec::new();
        for g in &held {
            match placement.last_mut() {
                Some(p) if p.0 == g.0 => p.1 += 1,
                _ => placement.push((g.0, 1)),
            }
        }
        Self {
            gpus: held.len() as u32,
            placement,
            held,
            ready_at,
            shared: false,
        }
    }
}

#[derive(Clone, Debug)]
struct Job {
    w: WorkloadJob,
    /// Model name in the LUT (aliases resolved).
    lut_model: String,
    layers: u32,
    variant: Variant,
    /// Index of (lut_model, layers, variant) among the workload's distinct
    /// configurations (the throughput cache's key).
    config: u32,
    /// The GPU family (index into `Simulation::families`) and node size
    /// of its ideal time and trace matching: where it would run alone
    /// ([`round::default_shape`]).
    family: usize,
    per_node: u32,
    samples_per_epoch: f64,
    alone_epochs: f64,
    /// With learned estimates: the predicted epochs-to-target alone after
    /// `n` observed epochs and the relative spread of the remaining time,
    /// by `n` (empty: exact estimates).
    predicted_epochs: Vec<(f64, f64)>,
    /// A job that stops on a metric target: its user's maximum epochs,
    /// what a policy without an iteration estimator plans it at
    /// ([`Policy::iteration_estimator`]); None: it stops on its budget.
    budget_epochs: Option<f64>,
    /// Samples the current path needs, and has done.
    target: f64,
    done: f64,
    phase: Phase,
    alloc: Option<Alloc>,
    restart_s: f64,
    /// Layer elasticity: the most layers it may freeze (0: none), the
    /// layers a FreezeOut schedule freezes now, and that schedule's start.
    max_frozen: u32,
    frozen: u32,
    freeze_t0: f64,
    /// Its process alone on one GPU (GPU sharing; None: it never shares).
    footprint: Option<fmsched_core::policy::GpuFootprint>,
    attained_gpu_s: f64,
    executed_s: f64,
    /// Themis's deserved service: GPU-seconds of an equal share.
    fair_share_gpu_s: f64,
    restarts: u32,
    lease_until: f64,
    first_start: Option<f64>,
    first_train: Option<f64>,
    finish: Option<f64>,
    /// The merge it is in now (progress flows through it).
    merged: Option<(MergeMode, usize)>,
    /// The merge it took part in, for the report (never cleared).
    ever_merged: Option<(MergeMode, usize)>,
    ideal_s: f64,
    /// GPU families it ran on, each once (indices into
    /// `Simulation::families`).
    ran_on: Vec<usize>,
    /// Its reward steps (UniSched), on the simulation's clock.
    deadlines: Vec<RewardStep>,
    /// Seconds it was in the system before it arrived here
    /// ([`Simulation::seed_history`]).
    history_s: f64,
    /// GPU families where one replica's memory does not fit (the table's
    /// step time is infeasible there): never placed there.
    unfit: Vec<String>,
}

#[derive(Clone, Debug)]
struct Merge {
    a: usize,
    b: usize,
    mode: MergeMode,
    /// Samples of the merged part done when the guard looks.
    guard_at: f64,
    guard_done: bool,
}

/// The simulator over one workload.
pub struct Simulation<'a> {
    cfg: SimConfig,
    lut: &'a Lut,
    /// Every node as the round sees it.
    nodes: Vec<NodeView>,
    /// The cluster's GPU families, sorted, and each node's (an index).
    families: Vec<String>,
    node_family: Vec<usize>,
    total_gpus: u32,
    jobs: Vec<Job>,
    merges: Vec<Merge>,
    allocations: Vec<u32>,
    /// Samples per second by what determines them (configuration, batch,
    /// estimate model, then placement shape): jobs of one configuration and
    /// batch share entries, so a LUT interpolation runs once per distinct
    /// case, and a hit allocates nothing.
    rate_cache: HashMap<RateKey, HashMap<String, f64>>,
    /// Each job's current progress rate, valid while `version` is unchanged
    /// (bumped by every change of allocations or merges).
    current_rate: Vec<(u64, f64)>,
    version: u64,
    now: f64,
    busy_gpu_s: f64,
    stats: SimResult,
    /// The deciding policy's [`Policy::iteration_estimator`], set each
    /// round.
    iteration_estimator: bool,
}

fn placement_string(p: &[(usize, u32)]) -> String {
    let mut per: Vec<u32> = p.iter().map(|x| x.1).filter(|&g| g > 0).collect();
    per.sort_unstable();
    per.iter()
        .map(|g| char::from(b'0' + (*g).min(9) as u8))
        .collect()
}

fn packed(gpus: u32, per_node: u32) -> String {
    fmsched_estimator::lut::packed_placement(gpus, per_node)
}

impl<'a> Simulation<'a> {
    /// Prepares a run: resolves every job's model, epochs and samples.
    pub fn new(
        cfg: SimConfig,
        lut: &'a Lut,
        catalog: &Catalog,
        workload: &[WorkloadJob],
    ) -> Result<Self, SimError> {
        let nodes = cfg.node_views();
        if nodes.is_empty() || nodes.iter().any(|n| n.gpus == 0 || n.gpus > 9) {
            return Err(SimError::Config(
                "the cluster needs at least one node, each of 1-9 GPUs".into(),
            ));
        }
        let mut families: Vec<String> = nodes.iter().map(|n| n.gpu_model.clone()).collect();
        families.sort_unstable();
        families.dedup();
        let node_family: Vec<usize> = nodes
            .iter()
            .map(|n| families.iter().position(|f| *f == n.gpu_model).unwrap_or(0))
            .collect();
        let shapes: Vec<(u32, &str)> = nodes
            .iter()
            .map(|n| (n.gpus, n.gpu_model.as_str()))
            .collect();
        // The allocation set spans what may ever be in the round.
        let total = cfg.total_gpus() + cfg.inference_gpus();
        let has_profile = |m: &str, fam: &str| {
            lut.profile(m, fam, &Variant::base()).is_some()
                || lut.gpu_types(m).iter().any(|g| g == fam)
        };
        let mut jobs = Vec::with_capacity(workload.len());
        let mut configs: Vec<(String, u32, Variant)> = Vec::new();
        let mut libraries: HashMap<(String, String), CurveLibrary> = HashMap::new();
        // Per model and task, the workload's jobs with a metric target (curve
        // key, target): the learned estimator's finished jobs.
        let mut targets: BTreeMap<String, JobTargets> = BTreeMap::new();
        if cfg.learned_estimates {
            for w in workload {
                if let Some(t) = w.target_metric {
                    targets
                        .entry(w.model.clone())
                        .or_default()
                        .entry(w.task.clone())
                        .or_default()
                        .push((w.curve_key.clone(), t));
                }
            }
        }
        for w in workload {
            let err = |m: String| SimError::Job {
                job: w.name.clone(),
                message: m,
            };
            let asked = w.gpu_model.as_deref().map(analytic::gpu_family);
            // Said now, not after simulating the horizon with it waiting.
            let replica = Replica::of(w.pipeline, w.expert_parallel);
            if let Some(why) = round::never_fits(replica, 1, asked.as_deref(), &shapes, None) {
                return Err(err(format!("can never run on this cluster: {why}")));
            }
            // It may run on the family it asks for, else on any.
            let allowed: Vec<&str> = match &asked {
                Some(m) => vec![m.as_str()],
                None => families.iter().map(String::as_str).collect(),
            };
            let lut_model = [w.model.as_str(), alias(&w.model)]
                .into_iter()
                .find(|m| allowed.iter().all(|f| has_profile(m, f)))
                .ok_or_else(|| {
                    let missing = allowed
                        .iter()
                        .find(|f| !has_profile(&w.model, f))
                        .unwrap_or(&allowed[0]);
                    err(format!(
                        "no throughput profile for model {:?} on {missing}{}",
                        w.model,
                        if allowed.len() > 1 {
                            " (a job that names no gpu_model may run on every GPU type of the cluster)"
                        } else {
                            ""
                        }
                    ))
                })?
                .to_string();
            let layers = analytic::layers_of(&lut_model).unwrap_or(12);
            let variant = Variant {
                pipeline: w.pipeline,
                expert_parallel: expert_group(w.expert_parallel),
                ..Variant::base()
            };
            // Families where one replica's memory does not fit: never there.
            let unfit: Vec<String> = families
                .iter()
                .filter(|f| !lut.runs_on(&lut_model, f, replica.gpus(), w.batch, &variant, layers))
                .cloned()
                .collect();
            if round::fits_no_family(&allowed, None, &unfit) {
                let allowed: Vec<String> = allowed.iter().map(|f| f.to_string()).collect();
                return Err(err(format!(
                    "can never run on this cluster: {}",
                    round::unfit_reason(&w.model, &allowed)
                )));
            }
            let (family, per_node) = round::default_shape(&nodes, asked.as_deref(), &unfit)
                .ok_or_else(|| err("no node of its GPU model".into()))?;
            let family = families.iter().position(|f| *f == family).unwrap_or(0);
            let info = catalog.task(&w.model, &w.task);
            let samples = match info {
                None => {
                    return Err(err(format!(
                        "task {:?} of model {:?} is not in the catalog",
                        w.task, w.model
                    )));
                }
                Some(t) if t.samples_per_epoch <= 0.0 => {
                    return Err(err(format!(
                        "task {:?} of model {:?} has no samples per epoch in the catalog (published \
                         curves carry none): give them with --samples-per-epoch {}=N",
                        w.task, w.model, w.task
                    )));
                }
                Some(t) => t.samples_per_epoch,
            };
            let work = match (w.epochs, info) {
                (Some(_), _) => None,
                (None, Some(t)) => Some(
                    w.curve_key
                        .as_ref()
                        .and_then(|k| t.alone.get(k))
                        .or_else(|| t.alone.values().next())
                        .ok_or_else(|| err("the catalog has no alone entry for its task".into()))?,
                ),
                (None, None) => unreachable!("checked above"),
            };
            // The workload's epochs, else the catalog's work (one is set).
            let epochs = w
                .epochs
                .or_else(|| work.map(|work| work.epochs(w.target_metric)))
                .expect("no catalog work only where the workload gives epochs");
            let predicted_epochs = match (work, w.target_metric) {
                (Some(Work::Curve(curve)), Some(target)) if cfg.learned_estimates => {
                    let lib = libraries
                        .entry((w.model.clone(), w.task.clone()))
                        .or_insert_with(|| {
                            let none = BTreeMap::new();
                            let targets = targets.get(&w.model).unwrap_or(&none);
                            catalog.prior_library(&w.model, &w.task, targets)
                        });
                    let metric = info.map(TaskInfo::prior_metric).unwrap_or_default();
                    learned_epochs(lib, curve, metric, target)
                }
                _ => Vec::new(),
            };
            // Its user's maximum: a multiple of its work (generated
            // workloads), or the whole curve for a metric target on a
            // per-epoch curve (published workloads).
            let budget_epochs = match (w.max_work_x, work, w.target_metric) {
                (Some(x), _, _) => Some(x * epochs),
                (None, Some(Work::Curve(curve)), Some(_)) => Some(curve.len() as f64),
                _ => None,
            }
            .filter(|&b| b > epochs);
            let config = match configs
                .iter()
                .position(|c| c.0 == lut_model && c.1 == layers && c.2 == variant)
            {
                Some(k) => k,
                None => {
                    configs.push((lut_model.clone(), layers, variant.clone()));
                    configs.len() - 1
                }
            } as u32;
            let mut j = Job {
                w: w.clone(),
                lut_model,
                layers,
                variant,
                config,
                family,
                per_node,
                samples_per_epoch: samples,
                alone_epochs: epochs,
                predicted_epochs,
                budget_epochs,
                target: epochs * samples,
                done: 0.0,
                phase: Phase::NotArrived,
                alloc: None,
                restart_s: 0.0,
                max_frozen: match cfg.layers {
                    LayerMode::Off => 0,
                    _ if w.pipeline => 0,
                    _ => (MAX_FROZEN_SHARE * f64::from(layers)).floor() as u32,
                },
                frozen: 0,
                freeze_t0: 1.0,
                footprint: None,
                attained_gpu_s: 0.0,
                executed_s: 0.0,
                fair_share_gpu_s: 0.0,
                restarts: 0,
                lease_until: 0.0,
                first_start: None,
                first_train: None,
                finish: None,
                merged: None,
                ever_merged: None,
                ideal_s: 0.0,
                ran_on: Vec::new(),
                deadlines: Vec::new(),
                history_s: 0.0,
                unfit,
            };
            // Helios / Philly: scale the epochs so the work at the trace's GPU
            // count takes the trace's duration.
            j.w.max_gpus = j.w.max_gpus.clamp(1, total);
            j.w.gpus = j.w.gpus.clamp(1, total);
            if j.w.pipeline && j.w.max_gpus < PIPELINE_STAGES {
                return Err(err(format!(
                    "a pipeline-parallel job runs on whole replicas of {PIPELINE_STAGES} GPUs and it asks for at most {}",
                    j.w.max_gpus
                )));
            }
            if let Replica::Experts(ep) = replica
                && j.w.max_gpus < ep
            {
                return Err(err(format!(
                    "an expert-parallel job runs on whole groups of {ep} GPUs and it asks for at most {}",
                    j.w.max_gpus
                )));
            }
            j.restart_s = round::restart_cost(
                cfg.checkpoint_s,
                cfg.context_switch_s
                    .or_else(|| lut.context_switch_s(&j.lut_model, &families[j.family])),
            );
            // GPU sharing: its memory (the profile's, at its whole batch on
            // one GPU) and utilisation alone (the regression's prior: a
            // simulation measures nothing).
            let one_gpu = !j.w.pipeline && j.w.expert_parallel <= 1;
            if cfg.gpu_sharing && one_gpu {
                j.footprint = icefrog::one_gpu_footprint(
                    lut,
                    &j.lut_model,
                    &families[j.family],
                    &j.variant,
                    j.w.batch,
                    None,
                );
            }
            jobs.push(j);
        }
        let mut sim = Simulation {
            cfg,
            lut,
            nodes,
            families,
            node_family,
            total_gpus: total,
            jobs,
            merges: Vec::new(),
            allocations: ymir_allocations(total),
            rate_cache: HashMap::new(),
            current_rate: Vec::new(),
            version: 1,
            now: 0.0,
            busy_gpu_s: 0.0,
            iteration_estimator: true,
            stats: SimResult {
                policy: String::new(),
                jobs: Vec::new(),
                makespan_s: 0.0,
                gpu_utilisation: 0.0,
                restarts: 0,
                merges_temporal: 0,
                merges_spatial: 0,
                guard_splits: 0,
                merges_released: 0,
                warm_starts: 0,
                rounds: 0,
                fallbacks: 0,
                round_wall_s: Vec::new(),
                model_sizes: Vec::new(),
                wall_s: 0.0,
                loans: LoanStats::default(),
                shared_gpu_s: 0.0,
            },
        };
        for i in 0..sim.jobs.len() {
            let (fam, per_node) = (sim.jobs[i].family, sim.jobs[i].per_node);
            if let Some(gpu_s) = sim.jobs[i].w.trace_gpu_s {
                let g = sim.jobs[i].w.gpus;
                let rate = sim.rate(i, sim.jobs[i].w.batch, fam, &packed(g, per_node))?;
                let secs = gpu_s / f64::from(g);
                let j = &mut sim.jobs[i];
                j.alone_epochs = (secs * rate / j.samples_per_epoch).max(0.01);
                j.target = j.alone_epochs * j.samples_per_epoch;
            }
            let g = sim.jobs[i].w.gpus;
            let rate = sim.rate(i, sim.jobs[i].w.batch, fam, &packed(g, per_node))?;
            if sim.cfg.layers == LayerMode::Freezeout && sim.jobs[i].max_frozen > 0 {
                sim.jobs[i].freeze_t0 = sim.tune_freezeout(i, (fam, &packed(g, per_node)))?;
            }
            let j = &mut sim.jobs[i];
            j.ideal_s = j.target / rate + j.restart_s;
            // Its deadline: seconds after submission, or a multiple of this
            // time alone (how the thesis generates them, §5.4.2).
            let deadline = j.w.slo.deadline_after(j.ideal_s).map(|d| j.w.submit_s + d);
            j.deadlines = slo::reward_steps(j.w.slo.class(), j.w.submit_s, deadline);
        }
        Ok(sim)
    }

    /// Tuned FreezeOut (ICEFROG §V-A): the schedule start `t0` (of 0, 0.1,
    /// …, 1 = never) that reaches the target soonest at `shape`, from the
    /// effective progress at each frozen-layer count it passes through.
    fn tune_freezeout(
        &mut self,
        i: usize,
        (fam, placement): (usize, &str),
    ) -> Result<f64, SimError> {
        let max = self.jobs[i].max_frozen;
        let batch = self.jobs[i].w.batch;
        let mut e = Vec::with_capacity(max as usize + 1);
        for l in 0..=max {
            e.push(self.progress_at(i, (batch, fam, placement), EstimateModel::Exact, l)?);
        }
        let time = |t0: f64| {
            let d = (1.0 - t0) / f64::from(max);
            t0 / e[0] + (1..=max as usize).map(|k| d / e[k]).sum::<f64>()
        };
        Ok((0..=10)
            .map(|k| f64::from(k) / 10.0)
            .min_by(|&a, &b| time(a).total_cmp(&time(b)))
            .unwrap_or(1.0))
    }

    /// What a policy without an iteration estimator plans job `i` at: its
    /// user's maximum over its true remaining work (≥ 1); None for a job
    /// that stops on its budget, a merged one, or an estimating policy.
    fn budget_factor(&self, i: usize) -> Option<f64> {
        let j = &self.jobs[i];
        if self.iteration_estimator || j.merged.is_some() {
            return None;
        }
        let budget = j.budget_epochs? * j.samples_per_epoch;
        let truth = self.remaining(i);
        (truth > 0.0).then(|| ((budget - j.done).max(truth) / truth).min(1e6))
    }

    /// The learned estimator's (epochs, spread) for job `i` now: from the
    /// epochs it has done (at least the profiled ones); None without
    /// learned estimates, while it is merged, or under a policy that plans
    /// it at its maximum.
    fn learned_now(&self, i: usize) -> Option<(f64, f64)> {
        let j = &self.jobs[i];
        if j.predicted_epochs.is_empty() || j.merged.is_some() || self.budget_factor(i).is_some() {
            return None;
        }
        let seen = ((j.done / j.samples_per_epoch).floor() as usize)
            .max(PROFILED_EPOCHS)
            .min(j.predicted_epochs.len() - 1);
        Some(j.predicted_epochs[seen])
    }

    /// The estimation error of a spatial pair's joint time: each job's
    /// factor, weighted by the samples it has left (`need`).
    fn joint_noise(&self, a: usize, b: usize, need: (f64, f64)) -> f64 {
        let (wa, wb) = (need.0.max(0.0), need.1.max(0.0));
        if wa + wb <= 0.0 {
            return 1.0;
        }
        (self.noise_factor(a) * wa + self.noise_factor(b) * wb) / (wa + wb)
    }

    /// The estimation-error factor of job `i` now: its maximum over its
    /// true remaining work under a policy without an iteration estimator,
    /// the learned estimator's predicted over true remaining work, or the
    /// fixed noise factor (1: exact).
    fn noise_factor(&self, i: usize) -> f64 {
        if let Some(f) = self.budget_factor(i) {
            return f;
        }
        let j = &self.jobs[i];
        if let Some((epochs, _)) = self.learned_now(i) {
            let truth = self.remaining(i);
            let predicted = (epochs * j.samples_per_epoch - j.done).max(0.0);
            return if truth > 0.0 {
                (predicted / truth).clamp(0.05, 20.0)
            } else {
                1.0
            };
        }
        if self.cfg.estimate_noise <= 0.0 {
            return 1.0;
        }
        let h = fmsched_core::hash::fnv1a(self.jobs[i].w.name.as_bytes());
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        (1.0 + self.cfg.estimate_noise * (2.0 * u - 1.0)).max(0.05)
    }

    /// The samples job `to` is predicted to need from job `from`'s weights
    /// (or beside it), when it truly needs `need` and `alone` without
    /// them: the saving `alone − need` (the transfer gain's effect) scaled
    /// by the pair's fixed gain-noise factor in [1 − e, 1 + e]
    /// ([`SimConfig::gain_noise`]; `need` itself at e = 0).
    fn predicted_need(&self, from: usize, to: usize, need: f64, alone: f64) -> f64 {
        let e = self.cfg.gain_noise;
        if e <= 0.0 {
            return need;
        }
        let key = format!("gain:{}>{}", self.jobs[from].w.name, self.jobs[to].w.name);
        let h = fmsched_core::hash::fnv1a(key.as_bytes());
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let f = 1.0 + e * (2.0 * u - 1.0);
        (alone - (alone - need) * f).max(0.05 * need)
    }

    /// Samples per second of job `i`'s configuration at `batch` on
    /// `placement` of GPU family `fam` (an index into `families`).
    fn rate(&mut self, i: usize, batch: u32, fam: usize, placement: &str) -> Result<f64, SimError> {
        self.rate_as(i, batch, fam, placement, EstimateModel::Exact, 0)
    }

    /// Effective progress (ICEFROG Eq. 2, `E = ψ(ℓ) · T`) of job `i` with
    /// `frozen` layers frozen, as `model` estimates its speed.
    fn progress_at(
        &mut self,
        i: usize,
        (batch, fam, placement): (u32, usize, &str),
        model: EstimateModel,
        frozen: u32,
    ) -> Result<f64, SimError> {
        let r = self.rate_as(i, batch, fam, placement, model, frozen)?;
        let psi = if frozen > 0 {
            icefrog::synthetic_frozen_penalty(frozen, self.jobs[i].layers)
        } else {
            1.0
        };
        Ok(psi * r)
    }

    /// Samples-equivalents per second job `i` makes on `placement` under
    /// the layer mode: the layer tuner's best ℓ (Eq. 15), the FreezeOut
    /// schedule's ℓ now (`planning`: the policy sees plain training), or
    /// plain training.
    fn effective_rate(
        &mut self,
        i: usize,
        shape: (u32, usize, &str),
        model: EstimateModel,
        planning: bool,
    ) -> Result<f64, SimError> {
        let max = self.jobs[i].max_frozen;
        match self.cfg.layers {
            LayerMode::Tuner if max > 0 => {
                let mut best = 0.0f64;
                for l in 0..=max {
                    best = best.max(self.progress_at(i, shape, model, l)?);
                }
                Ok(best)
            }
            LayerMode::Freezeout if !planning => {
                let l = self.jobs[i].frozen;
                self.progress_at(i, shape, model, l)
            }
            _ => self.progress_at(i, shape, model, 0),
        }
    }

    /// [`Simulation::rate`] as `model` estimates it.
    fn rate_as(
        &mut self,
        i: usize,
        batch: u32,
        fam: usize,
        placement: &str,
        model: EstimateModel,
        frozen: u32,
    ) -> Result<f64, SimError> {
        let j = &self.jobs[i];
        let key = (
            j.config,
            batch,
            model == EstimateModel::TitanSched,
            fam,
            frozen,
        );
        let gpu_type = &self.families[fam];
        if let Some(&r) = self.rate_cache.get(&key).and_then(|m| m.get(placement)) {
            return Ok(r);
        }
        let variant = Variant {
            frozen_layers: frozen,
            ..j.variant.clone()
        };
        let r = match self.lut.iteration_time_on(
            &j.lut_model,
            gpu_type,
            placement,
            batch,
            &variant,
            j.layers,
        ) {
            Ok(it) if it.feasible && it.seconds > 0.0 => {
                let seconds = match model {
                    EstimateModel::Exact => it.seconds,
                    EstimateModel::TitanSched => titansched_iteration_s(
                        self.lut,
                        &j.lut_model,
                        gpu_type,
                        placement,
                        &variant,
                        j.layers,
                        it,
                    ),
                };
                f64::from(batch) / seconds
            }
            Ok(_) => 0.0,
            Err(e) => {
                return Err(SimError::Job {
                    job: j.w.name.clone(),
                    message: e.to_string(),
                });
            }
        };
        self.rate_cache
            .entry(key)
            .or_default()
            .insert(placement.to_string(), r);
        Ok(r)
    }

    /// Samples per second job `i` makes on its own task right now.
    fn progress_rate(&mut self, i: usize) -> Result<f64, SimError> {
        if self.current_rate.len() != self.jobs.len() {
            self.current_rate = vec![(0, 0.0); self.jobs.len()];
        }
        if self.current_rate[i].0 == self.version {
            return Ok(self.current_rate[i].1);
        }
        let r = self.compute_progress_rate(i)?;
        self.current_rate[i] = (self.version, r);
        Ok(r)
    }

    fn compute_progress_rate(&mut self, i: usize) -> Result<f64, SimError> {
        let Some(alloc) = self.jobs[i].alloc.clone() else {
            return Ok(0.0);
        };
        let p = placement_string(&alloc.placement);
        let fam = alloc.held.first().map_or(0, |g| self.node_family[g.0]);
        match self.jobs[i].merged {
            Some((MergeMode::Spatial, m)) => {
                let (a, b) = (self.merges[m].a, self.merges[m].b);
                let batch = self.jobs[a].w.batch + self.jobs[b].w.batch;
                let joint = self.rate(a, batch, fam, &p)?;
                let (da, db) = (
                    self.jobs[a].samples_per_epoch,
                    self.jobs[b].samples_per_epoch,
                );
                let share = if i == a {
                    da / (da + db)
                } else {
                    db / (da + db)
                };
                Ok(joint * share)
            }
            Some((MergeMode::Temporal, m)) if self.merges[m].b == i => Ok(0.0), // waits for A
            _ => {
                let b = self.jobs[i].w.batch;
                let r = self.effective_rate(i, (b, fam, &p), EstimateModel::Exact, false)?;
                // ICEFROG Eq. 8 (fixed): λ = 0.9 on a shared GPU.
                Ok(if alloc.shared { SHARED_SLOWDOWN * r } else { r })
            }
        }
    }

    fn remaining(&self, i: usize) -> f64 {
        (self.jobs[i].target - self.jobs[i].done).max(0.0)
    }

    /// Remaining seconds of job `i` alone at every allocation, packed on
    /// nodes of `per_node` GPUs of family `fam`.
    fn solo_times(
        &mut self,
        i: usize,
        (fam, per_node): (usize, u32),
    ) -> Result<Vec<f64>, SimError> {
        let allocs = self.allocations.clone();
        let rem = self.remaining(i);
        let j = &self.jobs[i];
        let (min, max, batch) = (self.min_gpus(i), j.w.max_gpus, j.w.batch);
        let unit = Replica::of(j.w.pipeline, j.w.expert_parallel).gpus();
        allocs
            .iter()
            .map(|&a| {
                if a == 0 || a < min || a > max || !a.is_multiple_of(unit) {
                    return Ok(f64::INFINITY);
                }
                let model = self.cfg.estimate_model;
                let r = self.effective_rate(i, (batch, fam, &packed(a, per_node)), model, true)?;
                Ok(if r > 0.0 { rem / r } else { f64::INFINITY })
            })
            .collect()
    }

    /// Joint job times (Eq. 4 with honest per-task targets) for samples
    /// `need_a`, `need_b` still to do, on `shape` as in [`Self::solo_times`].
    fn joint_times(
        &mut self,
        a: usize,
        b: usize,
        (need_a, need_b): (f64, f64),
        (fam, per_node): (usize, u32),
    ) -> Result<Vec<f64>, SimError> {
        let allocs = self.allocations.clone();
        let batch = self.jobs[a].w.batch + self.jobs[b].w.batch;
        let max = self.jobs[a].w.max_gpus.max(self.jobs[b].w.max_gpus);
        let (da, db) = (
            self.jobs[a].samples_per_epoch,
            self.jobs[b].samples_per_epoch,
        );
        allocs
            .iter()
            .map(|&x| {
                if x == 0 || x > max {
                    return Ok(f64::INFINITY);
                }
                let r = self.rate(a, batch, fam, &packed(x, per_node))?;
                if r <= 0.0 {
                    return Ok(f64::INFINITY);
                }
                Ok((need_a / (r * da / (da + db))).max(need_b / (r * db / (da + db))))
            })
            .collect()
    }

    fn temporal_need(&self, catalog: &Catalog, a: usize, b: usize) -> Option<f64> {
        let (ja, jb) = (&self.jobs[a], &self.jobs[b]);
        let w = catalog.temporal(&ja.w.model, &ja.w.task, &jb.w.task)?;
        Some(w.epochs(jb.w.target_metric) * jb.samples_per_epoch)
    }

    fn spatial_need(&self, catalog: &Catalog, a: usize, b: usize) -> Option<(f64, f64)> {
        let (ja, jb) = (&self.jobs[a], &self.jobs[b]);
        let (wa, wb) = catalog.spatial(&ja.w.model, &ja.w.task, &jb.w.task)?;
        Some((
            wa.epochs(ja.w.target_metric) * ja.samples_per_epoch,
            wb.epochs(jb.w.target_metric) * jb.samples_per_epoch,
        ))
    }

    /// Runs the whole workload under `policy`.
    pub fn run(
        self,
        policy: &dyn Policy,
        catalog: &Catalog,
        progress: impl FnMut(usize, usize),
    ) -> Result<SimResult, SimError> {
        self.run_retuned(policy, catalog, progress, None)
    }

    /// Lets job `index` start with history from before the simulation's
    /// clock (the jobs a tuner carries over from the live cluster into a
    /// predicted trace). Policies see it as submitted `age_s` earlier, so a
    /// job that has waited long is as close to Tiresias' starvation
    /// promotion as it is live; its JCT here counts from its arrival.
    pub fn seed_history(&mut self, index: usize, h: &History) {
        if let Some(j) = self.jobs.get_mut(index) {
            j.attained_gpu_s = h.attained_gpu_s.max(0.0);
            j.executed_s = h.executed_s.max(0.0);
            j.history_s = h.age_s.max(0.0);
            j.fair_share_gpu_s = h.fair_share_gpu_s.max(0.0);
        }
    }

    /// What a tuner may see of the run at this moment: every arrived job,
    /// its state and the time it has run, never its remaining work.
    fn observe(&self) -> Observation<'_> {
        Observation {
            now: self.now,
            jobs: self
                .jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| !matches!(j.phase, Phase::NotArrived))
                .map(|(index, j)| ObservedJob {
                    index,
                    spec: &j.w,
                    state: match (j.finish, &j.alloc) {
                        (Some(finish_s), _) => ObservedState::Done { finish_s },
                        (None, Some(_)) => ObservedState::Running,
                        (None, None) => ObservedState::Waiting,
                    },
                    executed_s: j.executed_s,
                    attained_gpu_s: j.attained_gpu_s,
                    fair_share_gpu_s: j.fair_share_gpu_s,
                })
                .collect(),
        }
    }

    /// Runs the whole workload under `policy`; with `retune`, every
    /// `every_s` of simulated time the hook sees the run so far
    /// ([`Observation`]) and may hand back a policy (new knobs) that
    /// decides from the next round on — how AutoSched is replayed.
    pub fn run_retuned(
        mut self,
        policy: &dyn Policy,
        catalog: &Catalog,
        mut progress: impl FnMut(usize, usize),
        mut retune: Option<Retune<'_>>,
    ) -> Result<SimResult, SimError> {
        let started = Instant::now();
        self.stats.policy = policy.name().to_string();
        self.allocations = policy.allocation_set(self.total_gpus);
        let mut swapped: Option<Box<dyn Policy + Send + Sync>> = None;
        let interval = policy.interval_s().max(1.0);
        let mut order: Vec<usize> = (0..self.jobs.len()).collect();
        order.sort_by(|&a, &b| self.jobs[a].w.submit_s.total_cmp(&self.jobs[b].w.submit_s));
        let mut next_arrival = 0usize;
        let t0 = order.first().map_or(0.0, |&i| self.jobs[i].w.submit_s);
        self.now = t0;
        let mut finished = 0usize;
        let mut stalled = 0u32;
        let n = self.jobs.len();
        // `event` says whether an arrival, a completion or a profiling
        // run's end came since the round clock last heard.
        let mut clock = self.cfg.round_clock(interval, t0);
        let mut event = false;
        let mut next_retune = retune.as_ref().map_or(f64::INFINITY, |r| t0 + r.every_s);
        // The orchestrator's first decision as the trace starts.
        let mut next_loan = if self.cfg.loans.is_some() {
            t0
        } else {
            f64::INFINITY
        };
        while finished < n {
            if self.now - t0 > self.cfg.horizon_s {
                // Name a few, with what they asked for.
                let left: Vec<String> = self
                    .jobs
                    .iter()
                    .filter(|j| !matches!(j.phase, Phase::Done))
                    .take(5)
                    .map(|j| {
                        format!(
                            "{} ({} {}, {} GPU{})",
                            j.w.name,
                            j.w.model,
                            j.w.task,
                            j.w.gpus,
                            if j.w.gpus == 1 { "" } else { "s" }
                        )
                    })
                    .collect();
                return Err(SimError::Config(format!(
                    "{} of {n} jobs unfinished after {:.0} simulated days: the policy starves them or the cluster cannot run them: {}{}",
                    n - finished,
                    self.cfg.horizon_s / 86_400.0,
                    left.join(", "),
                    if n - finished > left.len() {
                        ", …"
                    } else {
                        ""
                    }
                )));
            }
            // The next event.
            let mut t_next = clock.next_s().min(next_retune).min(next_loan);
            if let Some(&i) = order.get(next_arrival) {
                t_next = t_next.min(self.jobs[i].w.submit_s);
            }
            for i in 0..n {
                if let Phase::Profiling { until } = self.jobs[i].phase {
                    t_next = t_next.min(until);
                }
                if let Some(ready_at) = self.jobs[i].alloc.as_ref().map(|a| a.ready_at) {
                    let ready = ready_at.max(self.now);
                    let r = self.progress_rate(i)?;
                    if r > 0.0 {
                        t_next = t_next.min(ready + self.remaining(i) / r);
                    } else if ready_at > self.now {
                        t_next = t_next.min(ready_at);
                    }
                }
            }
            for m in 0..self.merges.len() {
                let (done, mode, a, b, guard_at) = {
                    let mg = &self.merges[m];
                    (mg.guard_done, mg.mode, mg.a, mg.b, mg.guard_at)
                };
                if !done {
                    let i = if mode == MergeMode::Temporal { b } else { a };
                    let r = self.progress_rate(i)?;
                    if r > 0.0 && self.jobs[i].done < guard_at * (1.0 - 1e-9) - 1e-6 {
                        let ready = self.jobs[i]
                            .alloc
                            .as_ref()
                            .map_or(self.now, |a| a.ready_at.max(self.now));
                        t_next = t_next.min(ready + (guard_at - self.jobs[i].done) / r);
                    }
                }
            }
            let t_next = t_next.max(self.now);
            if t_next <= self.now {
                stalled += 1;
                if stalled > 100_000 {
                    return Err(SimError::Config(format!(
                        "the clock stopped at t={:.3}s (an event that never fires)",
                        self.now
                    )));
                }
            } else {
                stalled = 0;
            }
            self.advance(t_next)?;

            // Completions. Tolerances absorb rounding: a job within a
            // microsecond of its target is done (else the clock could stall
            // on steps too small to move it).
            for i in 0..n {
                if self.jobs[i].alloc.is_none() || self.jobs[i].finish.is_some() {
                    continue;
                }
                let rem = self.remaining(i);
                let near = rem <= 1e-6 * self.jobs[i].target.max(1.0) || {
                    let ready = self.jobs[i]
                        .alloc
                        .as_ref()
                        .is_some_and(|a| a.ready_at <= self.now);
                    let r = self.progress_rate(i)?;
                    ready && r > 0.0 && rem / r <= 1e-6
                };
                if near {
                    self.complete(i);
                    event = true;
                    finished += 1;
                    progress(finished, n);
                }
            }
            self.guard(catalog);
            // Profiling ends.
            for i in 0..n {
                if let Phase::Profiling { until } = self.jobs[i].phase
                    && until <= self.now
                {
                    // The profiling run measures (loss trace, throughput,
                    // Task2Vec); its weights are not kept, so the job starts
                    // from zero progress and stays eligible for merging.
                    self.version += 1;
                    event = true;
                    let j = &mut self.jobs[i];
                    j.phase = Phase::Waiting;
                    j.alloc = None;
                    j.done = 0.0;
                }
            }
            // Arrivals.
            while let Some(&i) = order.get(next_arrival) {
                if self.jobs[i].w.submit_s > self.now {
                    break;
                }
                next_arrival += 1;
                event = true;
                self.jobs[i].phase = if self.cfg.profile_s > 0.0 {
                    Phase::Profiling {
                        until: f64::INFINITY,
                    }
                } else {
                    Phase::Waiting
                };
            }
            if self.now >= next_retune
                && let Some(r) = retune.as_mut()
            {
                next_retune += r.every_s;
                let active: &dyn Policy = swapped.as_deref().map_or(policy, |p| p as &dyn Policy);
                if let Some(p) = (r.hook)(&self.observe(), active) {
                    // A changed interval takes effect from the round after
                    // the one already due.
                    clock.set_interval(p.interval_s().max(1.0));
                    swapped = Some(p);
                }
            }
            if self.now >= next_loan
                && let Some(every) = self.cfg.loans.as_ref().map(|l| l.every_s.max(1.0))
            {
                next_loan += every;
                self.orchestrate();
            }
            if std::mem::take(&mut event) {
                clock.on_event(self.now, self.deadline_needs());
            }
            if clock.is_due(self.now) {
                let active: &dyn Policy = swapped.as_deref().map_or(policy, |p| p as &dyn Policy);
                self.round(active, catalog)?;
                clock.round_started(self.now);
            }
        }
        let first = self
            .jobs
            .iter()
            .map(|j| j.w.submit_s)
            .fold(f64::INFINITY, f64::min);
        let last = self
            .jobs
            .iter()
            .filter_map(|j| j.finish)
            .fold(first, f64::max);
        self.stats.makespan_s = (last - first).max(0.0);
        // Over the training cluster and the GPU-seconds on loan.
        let total = f64::from(self.cfg.total_gpus());
        self.stats.gpu_utilisation = if self.stats.makespan_s > 0.0 {
            self.busy_gpu_s / (total * self.stats.makespan_s + self.stats.loans.loaned_gpu_s)
        } else {
            0.0
        };
        self.stats.jobs = self
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let finish = j.finish.unwrap_or(f64::NAN);
                JobResult {
                    name: j.w.name.clone(),
                    model: j.w.model.clone(),
                    task: j.w.task.clone(),
                    submit_s: j.w.submit_s,
                    first_start_s: j.first_start,
                    first_train_s: j.first_train,
                    finish_s: finish,
                    jct_s: finish - j.w.submit_s,
                    ftf: (finish - j.w.submit_s) / j.ideal_s.max(1e-9),
                    fair_rho: j.fair_share_gpu_s / j.attained_gpu_s.max(1e-9),
                    restarts: j.restarts,
                    merged: j.ever_merged.map(|(mode, m)| {
                        let mg = &self.merges[m];
                        let other = if mg.a == i { mg.b } else { mg.a };
                        (mode, self.jobs[other].w.name.clone())
                    }),
                    gpu_types: {
                        // Distinct already; families are sorted by name.
                        let mut f = j.ran_on.clone();
                        f.sort_unstable();
                        f.iter().map(|&k| self.families[k].clone()).collect()
                    },
                    class: j.w.slo.class(),
                    deadlines: j.deadlines.clone(),
                    best_case_s: self.best_case_s(j),
                }
            })
            .collect();
        self.stats.restarts = self.jobs.iter().map(|j| j.restarts).sum();
        self.stats.wall_s = started.elapsed().as_secs_f64();
        Ok(self.stats)
    }

    /// A floor under a job's JCT from its submission
    /// ([`JobResult::best_case_s`]).
    fn best_case_s(&self, j: &Job) -> f64 {
        j.ideal_s
            + if self.cfg.profile_s > 0.0 && j.ideal_s - j.restart_s > self.cfg.profile_s {
                // The profiling run: its start and its length.
                j.restart_s + self.cfg.profile_s
            } else {
                0.0
            }
    }

    /// Each job with a deadline that waits for its first start: what it
    /// needs from a round's start (its best case, [`Self::best_case_s`],
    /// once it has profiled its time alone at its request with its start)
    /// and its first deadline ([`RoundClock::on_event`]), as the policy's
    /// estimates have it.
    fn deadline_needs(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        (0..self.jobs.len()).filter_map(|i| {
            let j = &self.jobs[i];
            let by = j.deadlines.first()?.by;
            // Its time alone as the policy sees it (`estimate_noise`
            // scales its work as it does every time the policy sees).
            let alone = (j.ideal_s - j.restart_s) * self.noise_factor(i) + j.restart_s;
            let need = match j.phase {
                Phase::Profiling { until } if until.is_infinite() => {
                    self.best_case_s(j) - j.ideal_s + alone
                }
                Phase::Waiting if j.first_train.is_none() => alone,
                _ => return None,
            };
            Some((need, by))
        })
    }

    /// The fewest GPUs job `i` runs on: its request under
    /// [`SimConfig::base_demands`], else its workload's `min_gpus` (one
    /// when unset).
    fn min_gpus(&self, i: usize) -> u32 {
        if self.cfg.base_demands {
            self.jobs[i].w.gpus
        } else {
            self.jobs[i].w.min_gpus.max(1)
        }
    }

    /// GPUs of the nodes in the round now (training and loaned).
    fn present_gpus(&self) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.state != NodeState::Offline)
            .map(|n| n.gpus)
            .sum()
    }

    /// The loan orchestrator (Lyra §3.4): loans the inference servers the
    /// trace leaves idle, or reclaims what the inference side needs back.
    fn orchestrate(&mut self) {
        let Some(loans) = self.cfg.loans.clone() else {
            return;
        };
        let first = self.nodes.len()
            - loans
                .inference
                .iter()
                .map(|g| g.count as usize)
                .sum::<usize>();
        let inference: Vec<usize> = (first..self.nodes.len()).collect();
        let target = loans.loanable(inference.len(), self.now);
        let on_loan: Vec<usize> = inference
            .iter()
            .copied()
            .filter(|&n| self.nodes[n].loaned)
            .collect();
        if target > on_loan.len() {
            let more: Vec<usize> = inference
                .iter()
                .copied()
                .filter(|&n| !self.nodes[n].loaned)
                .take(target - on_loan.len())
                .collect();
            for &n in &more {
                self.nodes[n].loaned = true;
                self.nodes[n].state = NodeState::Available;
            }
            self.version += 1;
            self.stats.loans.loan_ops += 1;
            self.stats.loans.servers_loaned += more.len() as u32;
        } else if target < on_loan.len() {
            self.reclaim(&on_loan, on_loan.len() - target, loans.rule);
        }
    }

    /// Returns `need` of the loaned servers `on_loan`, chosen by `rule`:
    /// jobs left below their base demand are preempted (back to the
    /// queue, resumed later from their checkpoints), the others scale in
    /// (restart with fewer workers from their checkpoints).
    fn reclaim(&mut self, on_loan: &[usize], need: usize, rule: ReclaimRule) {
        use fmsched_core::policy::lyra::{self, ReclaimInput, ReclaimJob};
        // One reclaim job per group of GPUs (a merged pair shares them).
        let mut reps: Vec<Vec<usize>> = Vec::new();
        for i in 0..self.jobs.len() {
            let Some(a) = &self.jobs[i].alloc else {
                continue;
            };
            if !a.placement.iter().any(|p| on_loan.contains(&p.0)) {
                continue;
            }
            match reps.iter_mut().find(|r| {
                self.jobs[r[0]]
                    .alloc
                    .as_ref()
                    .is_some_and(|b| b.held == a.held)
            }) {
                Some(r) => r.push(i),
                None => reps.push(vec![i]),
            }
        }
        // Group k's parts on the loaned servers.
        let parts = reps.iter().enumerate().flat_map(|(k, r)| {
            let placement = self.jobs[r[0]]
                .alloc
                .as_ref()
                .map(|a| a.placement.as_slice());
            placement
                .unwrap_or_default()
                .iter()
                .filter_map(move |&(n, g)| on_loan.iter().position(|&l| l == n).map(|s| (s, k, g)))
        });
        let (input, order) = ReclaimInput::from_parts(
            on_loan.iter().map(|&n| self.nodes[n].id.clone()).collect(),
            parts,
            |k| {
                let (r, j) = (&reps[k], &self.jobs[reps[k][0]]);
                let held = j.alloc.as_ref().map_or(0, |a| a.gpus);
                // An elastic job keeps running on its base demand (its
                // request); any other (profiling runs included) needs all
                // it holds.
                let elastic =
                    r.len() == 1 && matches!(j.phase, Phase::Waiting) && j.w.max_gpus > j.w.gpus;
                ReclaimJob {
                    gpus: held,
                    base: if elastic { j.w.gpus.min(held) } else { held },
                }
            },
        );
        // The input's jobs in the order they first hold a part.
        let reps: Vec<Vec<usize>> = order.iter().map(|&k| reps[k].clone()).collect();
        let t = Instant::now();
        let out = lyra::reclaim(&input, need, rule);
        self.stats
            .loans
            .reclaim_wall_s
            .push(t.elapsed().as_secs_f64());
        if on_loan.len() <= 16 {
            let best = lyra::reclaim(&input, need, ReclaimRule::Exhaustive);
            self.stats.loans.searched_reclaims += 1;
            self.stats.loans.searched_preemptions += out.preempted.len() as u32;
            self.stats.loans.searched_optimal_preemptions += best.preempted.len() as u32;
        }
        let returned: Vec<usize> = out.servers.iter().map(|&s| on_loan[s]).collect();
        self.version += 1;
        for &k in &out.preempted {
            for &i in &reps[k] {
                let j = &mut self.jobs[i];
                j.alloc = None;
                if matches!(j.phase, Phase::Profiling { .. }) {
                    // Its profiling run starts over.
                    j.phase = Phase::Profiling {
                        until: f64::INFINITY,
                    };
                }
            }
        }
        for &(k, _) in &out.scaled_in {
            for &i in &reps[k] {
                let ready = self.now + self.jobs[i].restart_s;
                let j = &mut self.jobs[i];
                if let Some(a) = &j.alloc {
                    let held: Vec<Gpu> = a
                        .held
                        .iter()
                        .copied()
                        .filter(|g| !returned.contains(&g.0))
                        .collect();
                    j.alloc = Some(Alloc::on(held, ready));
                    j.restarts += 1;
                }
            }
        }
        for &n in &returned {
            self.nodes[n].loaned = false;
            self.nodes[n].state = NodeState::Offline;
        }
        let l = &mut self.stats.loans;
        l.reclaim_ops += 1;
        l.servers_reclaimed += returned.len() as u32;
        l.preemptions += out
            .preempted
            .iter()
            .map(|&k| reps[k].len() as u32)
            .sum::<u32>();
        l.scale_ins += out.scaled_in.len() as u32;
        l.collateral_gpus += out.collateral_gpus;
    }

    /// Moves the clock to `t`, advancing every running job.
    fn advance(&mut self, t: f64) -> Result<(), SimError> {
        let dt = t - self.now;
        if dt > 0.0 {
            // Every job in the system deserves an equal share of the
            // cluster, at most what it asked for (Themis's deserved service,
            // accumulated as the TitanSched simulator does).
            let present = self.jobs.iter().filter(|j| j.in_system()).count();
            let total = self.present_gpus();
            let loaned: Vec<bool> = self.nodes.iter().map(|n| n.loaned).collect();
            self.stats.loans.loaned_gpu_s += self
                .nodes
                .iter()
                .filter(|n| n.loaned)
                .map(|n| f64::from(n.gpus))
                .sum::<f64>()
                * dt;
            for j in self.jobs.iter_mut().filter(|j| j.in_system()) {
                // Every job in the system is present for the whole step:
                // arrivals are events, so a step starts at one.
                let deserved = round::fair_share(total, present, j.w.gpus);
                j.fair_share_gpu_s += round::accrue(0, deserved, dt, dt).fair_share_gpu_s;
            }
            for i in 0..self.jobs.len() {
                let Some(a) = self.jobs[i].alloc.clone() else {
                    continue;
                };
                let holder = match self.jobs[i].merged {
                    // A pair's GPUs are counted once, on A.
                    Some((_, m)) => self.merges[m].a == i,
                    None => true,
                };
                if holder {
                    // A shared GPU is counted once, half on each sharer.
                    let share = if a.shared { 0.5 } else { 1.0 };
                    self.busy_gpu_s += share * f64::from(a.gpus) * dt;
                    if a.shared {
                        self.stats.shared_gpu_s += 0.5 * dt;
                    }
                    let on_loan = a
                        .placement
                        .iter()
                        .filter(|p| loaned[p.0])
                        .map(|p| p.1)
                        .sum::<u32>();
                    self.stats.loans.loaned_busy_gpu_s += f64::from(on_loan) * dt;
                }
                let got = round::accrue(a.gpus, 0.0, dt, 0.0);
                self.jobs[i].attained_gpu_s += got.attained_gpu_s;
                self.jobs[i].executed_s += got.executed_s;
                let active = (t - a.ready_at.max(self.now)).max(0.0);
                if active > 0.0 {
                    let r = self.progress_rate(i)?;
                    let j = &mut self.jobs[i];
                    j.done = (j.done + r * active).min(j.target);
                }
            }
        }
        self.now = t;
        Ok(())
    }

    fn complete(&mut self, i: usize) {
        self.version += 1;
        let now = self.now;
        self.jobs[i].finish = Some(now);
        self.jobs[i].phase = Phase::Done;
        let alloc = self.jobs[i].alloc.take();
        if let Some((mode, m)) = self.jobs[i].merged {
            let (a, b) = (self.merges[m].a, self.merges[m].b);
            let other = if i == a { b } else { a };
            if self.jobs[other].finish.is_none() {
                // The partner keeps the GPUs. After A of a temporal pair, B
                // starts a new process from A's weights (one restart); a
                // spatial partner's process simply continues alone.
                if let Some(mut al) = alloc {
                    if mode == MergeMode::Temporal {
                        al.ready_at = now + self.jobs[other].restart_s;
                        self.jobs[other].restarts += 1;
                    }
                    self.jobs[other].alloc = Some(al);
                }
                // The partner is on its own from now on.
                self.jobs[other].merged = None;
            }
        }
        self.jobs[i].merged = None;
    }

    /// Ymir §4.3: split merges whose transfer does not help after two epochs.
    fn guard(&mut self, catalog: &Catalog) {
        if !self.cfg.merge_guard {
            return;
        }
        for m in 0..self.merges.len() {
            if self.merges[m].guard_done {
                continue;
            }
            let Merge {
                a,
                b,
                mode,
                guard_at,
                ..
            } = self.merges[m].clone();
            let watched = if mode == MergeMode::Temporal { b } else { a };
            if self.jobs[watched].finish.is_some()
                || (self.jobs[a].finish.is_some() && mode == MergeMode::Spatial)
            {
                self.merges[m].guard_done = true;
                continue;
            }
            if self.jobs[watched].merged.is_none() && mode == MergeMode::Spatial {
                self.merges[m].guard_done = true;
                continue;
            }
            if self.jobs[watched].done < guard_at * (1.0 - 1e-9) - 1e-6 {
                continue;
            }
            self.merges[m].guard_done = true;
            let hurt = |sim: &Self, j: usize, need: Option<f64>| {
                need.is_some_and(|n| n >= sim.jobs[j].alone_epochs * sim.jobs[j].samples_per_epoch)
            };
            match mode {
                MergeMode::Temporal => {
                    // B runs on A's output only after A finished; the guard
                    // looks at B's first two epochs, and B starts again from
                    // the pre-trained weights where that finishes it sooner
                    // than going on, its restart counted (the live rule,
                    // `policy::fresh_start_pays`, here on the catalog's truth).
                    let need = self.temporal_need(catalog, a, b);
                    let restart_pays = hurt(self, b, need) && {
                        let j = &self.jobs[b];
                        let (left, alone) = (
                            need.unwrap_or(0.0) - j.done,
                            j.alone_epochs * j.samples_per_epoch,
                        );
                        let restart_s = j.restart_s;
                        let rate = self.progress_rate(b).unwrap_or(0.0);
                        rate > 0.0
                            && fmsched_core::policy::fresh_start_pays(left, alone, restart_s * rate)
                    };
                    if restart_pays {
                        let j = &mut self.jobs[b];
                        j.target = j.alone_epochs * j.samples_per_epoch;
                        j.done = 0.0;
                        if let Some(al) = &mut j.alloc {
                            al.ready_at = self.now + j.restart_s;
                            j.restarts += 1;
                        }
                        self.stats.guard_splits += 1;
                    }
                }
                MergeMode::Spatial => {
                    let need = self.spatial_need(catalog, a, b);
                    if hurt(self, a, need.map(|n| n.0)) || hurt(self, b, need.map(|n| n.1)) {
                        for j in [a, b] {
                            let jj = &mut self.jobs[j];
                            jj.target = jj.alone_epochs * jj.samples_per_epoch;
                            jj.merged = None;
                        }
                        // B leaves the joint process and waits for its own GPUs.
                        self.jobs[b].alloc = None;
                        self.version += 1;
                        self.stats.guard_splits += 1;
                    }
                }
                MergeMode::Normal | MergeMode::Shared => {}
            }
        }
    }

    /// One scheduling round: the shared round of `fmsched_core::round`
    /// (profiling reservations, snapshot, policy, interpretation — the same
    /// code as the scheduler service) on this simulation's view, with times
    /// from the catalog and the LUT (the oracle estimator).
    fn round(&mut self, policy: &dyn Policy, catalog: &Catalog) -> Result<(), SimError> {
        self.version += 1;
        self.iteration_estimator = policy.iteration_estimator();
        if self.cfg.layers == LayerMode::Freezeout {
            for j in &mut self.jobs {
                let p = if j.target > 0.0 {
                    j.done / j.target
                } else {
                    0.0
                };
                j.frozen = freezeout_layers(j.freeze_t0, p, j.max_frozen);
            }
        }
        let (mut view, members, finished) = self.view();
        self.family_time_ratios(&mut view, &members)?;
        let cfg = round_config(&self.cfg, policy);
        let prepared = prepare_round(&view, policy, &cfg);
        // The set follows the GPUs in the round (loans change them).
        if self.allocations != prepared.allocations {
            self.allocations = prepared.allocations.clone();
        }
        let estimates = self.estimates(catalog, &prepared, &view, &members, &finished)?;
        let t = Instant::now();
        let decision = decide_round(&view, &prepared, &estimates, policy, &cfg).map_err(|e| {
            SimError::Plan {
                t: self.now,
                message: e.to_string(),
            }
        })?;
        self.stats.round_wall_s.push(t.elapsed().as_secs_f64());
        let stats = &decision.outcome.stats;
        if self.cfg.trace_rounds {
            eprintln!(
                "round {} t={:.0} waiting={} candidates={} vars={} solve_ms={:.1} fallback={} unplaced={}",
                self.stats.rounds,
                self.now,
                decision.snapshot.jobs.len(),
                decision.snapshot.candidates.len(),
                stats.variables,
                1000.0 * t.elapsed().as_secs_f64(),
                stats.fallback,
                stats.unplaced
            );
        }
        self.stats.rounds += 1;
        if stats.variables > 0 {
            self.stats
                .model_sizes
                .push((stats.variables, stats.constraints));
        }
        if stats.fallback {
            self.stats.fallbacks += 1;
        }
        if stats.abandoned {
            eprintln!(
                "warning: round {} t={:.0}: a MILP solve did not return long past its time limit \
                 (a solver bug); abandoned, the fallback plan used",
                self.stats.rounds, self.now
            );
        }
        for w in &decision.outcome.warm_starts {
            self.warm_start(catalog, finished[w.from], members[w.job]);
        }
        self.apply(&prepared, &decision.outcome, &members, catalog)?;
        self.release(&view, &decision.outcome.released, &members);
        Ok(())
    }

    /// Splits the kept temporal merges the round released
    /// (`RoundOutcome::released`): B leaves A's group and waits for GPUs of
    /// its own, to train from scratch (as the guard's temporal split
    /// leaves it); A trains on as a job alone.
    fn release(&mut self, view: &ClusterView, released: &[usize], members: &[usize]) {
        for &m in released {
            let mv = &view.merges[m];
            let (a, b) = (members[mv.a], members[mv.b]);
            if let Some((_, k)) = self.jobs[b].merged {
                // B trains alone from here: nothing for the guard to watch.
                self.merges[k].guard_done = true;
            }
            for j in [a, b] {
                self.jobs[j].merged = None;
            }
            let j = &mut self.jobs[b];
            j.target = j.alone_epochs * j.samples_per_epoch;
            j.alloc = None;
            self.stats.merges_released += 1;
            self.version += 1;
        }
    }

    /// [`round::family_time_ratios`] of the round's jobs, from the same
    /// throughput table their progress comes from.
    fn family_time_ratios(
        &mut self,
        view: &mut ClusterView,
        members: &[usize],
    ) -> Result<(), SimError> {
        round::family_time_ratios(view, |v, family, gpus, per_node| {
            let i = members[v];
            let j = &self.jobs[i];
            let Some(fam) = self.families.iter().position(|f| f == family) else {
                return Ok(None);
            };
            // A spatial pair trains as one joint process: its members'
            // times are not the group's. (A temporal pair's are: A trains,
            // then B, each at its own rate.)
            let spatial = j
                .merged
                .is_some_and(|(mode, _)| mode != MergeMode::Temporal);
            if spatial || j.alloc.as_ref().is_some_and(|a| a.shared) {
                return Ok(None);
            }
            let batch = j.w.batch;
            let rate = self.rate(i, batch, fam, &packed(gpus, per_node))?;
            Ok((rate > 0.0).then(|| 1.0 / rate))
        })
    }

    /// The finished jobs a new job may start from
    /// ([`ClusterView::finished`]): of each model, task and queue, the
    /// one that finished last (ties: the later in the workload), whose
    /// user shares its work, and the simulation job of each.
    fn finished(&self) -> (Vec<FinishedView>, Vec<usize>) {
        let mut last: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
        for (i, j) in self.jobs.iter().enumerate() {
            if j.finish.is_none() || !j.w.sharing {
                continue;
            }
            let key = (
                j.w.model.as_str(),
                j.w.task.as_str(),
                j.w.queueing.queue.as_str(),
            );
            let later = |k: usize| j.finish >= self.jobs[k].finish;
            if last.get(&key).is_none_or(|&k| later(k)) {
                last.insert(key, i);
            }
        }
        let members: Vec<usize> = last.into_values().collect();
        let views = members
            .iter()
            .map(|&i| {
                let j = &self.jobs[i];
                FinishedView {
                    id: j.w.name.clone(),
                    model: j.w.model.clone(),
                    task: j.w.task.clone(),
                    sharing: j.w.sharing,
                    pipeline: j.w.pipeline,
                    merge_setup: String::new(),
                    queue: j.w.queueing.queue.clone(),
                }
            })
            .collect();
        (views, members)
    }

    /// The round's view of the simulation: every job that arrived and has
    /// not finished (view index → job index in `members`), the nodes, the
    /// merges in force, and the finished jobs a new job may start from
    /// (with the simulation job of each, [`Simulation::finished`]).
    fn view(&self) -> (ClusterView, Vec<usize>, Vec<usize>) {
        let members: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| self.jobs[i].in_system() && self.jobs[i].finish.is_none())
            .collect();
        let mut ord = vec![usize::MAX; self.jobs.len()];
        for (k, &i) in members.iter().enumerate() {
            ord[i] = k;
        }
        let jobs = members
            .iter()
            .map(|&i| {
                let j = &self.jobs[i];
                let state = match (j.phase, &j.alloc) {
                    (Phase::Profiling { until }, _) if until.is_infinite() => JobState::Submitted,
                    (Phase::Profiling { .. }, _) => JobState::Profiling,
                    (_, Some(_)) => JobState::Running,
                    _ => JobState::Queued,
                };
                JobView {
                    id: j.w.name.clone(),
                    state,
                    model: j.w.model.clone(),
                    task: j.w.task.clone(),
                    sharing: j.w.sharing,
                    pipeline: j.w.pipeline,
                    expert_parallel: j.w.expert_parallel,
                    worker_gpus: 0,
                    gpu_model: j.w.gpu_model.as_deref().map(analytic::gpu_family),
                    unfit_families: j.unfit.clone(),
                    min_gpus: self.min_gpus(i),
                    max_gpus: j.w.max_gpus,
                    requested_gpus: j.w.gpus,
                    submitted_at: j.w.submit_s - j.history_s,
                    iteration: 0,
                    progress: if j.target > 0.0 {
                        j.done / j.target
                    } else {
                        0.0
                    },
                    attained_gpu_s: j.attained_gpu_s,
                    executed_s: j.executed_s,
                    fair_share_gpu_s: j.fair_share_gpu_s,
                    lease_until: j.lease_until,
                    restart_s: j.restart_s,
                    holds: j.alloc.as_ref().map(|a| a.held.clone()).unwrap_or_default(),
                    profiling_run: matches!(j.phase, Phase::Profiling { .. }),
                    held_back: false,
                    ever_merged: j.ever_merged.is_some(),
                    // The fmsim workload has one training setup (AMP, full
                    // fine-tuning): every job trains alike.
                    merge_setup: String::new(),
                    deadlines: j.deadlines.clone(),
                    queue: j.w.queueing.queue.clone(),
                    priority: j.w.queueing.priority,
                    preemptible: j.w.queueing.preemptible,
                    footprint: j.footprint,
                    skip_profiling: false,
                    // Filled in by `family_time_ratios` (it needs `&mut`).
                    family_time_ratio: Vec::new(),
                }
            })
            .collect();
        let merges = self
            .merges
            .iter()
            .filter(|m| {
                ord[m.a] != usize::MAX
                    && ord[m.b] != usize::MAX
                    && self.jobs[m.a].merged.is_some()
                    && self.jobs[m.b].merged.is_some()
            })
            .map(|m| MergeView {
                a: ord[m.a],
                b: ord[m.b],
                mode: m.mode,
            })
            .collect();
        let (finished, finished_jobs) = self.finished();
        let view = ClusterView {
            now: self.now,
            nodes: self.nodes.clone(),
            jobs,
            merges,
            finished,
        };
        (view, members, finished_jobs)
    }

    /// The oracle's estimates for a prepared round: remaining times from
    /// the catalog's work and the LUT's speed (scaled by the job's fixed
    /// estimation error), merged parts from the catalog's transfer entries
    /// with the same errors (B's for B after A, the two jobs' weighted by
    /// their samples for a joint job).
    /// A pair the catalog has no entry for is no candidate.
    fn estimates(
        &mut self,
        catalog: &Catalog,
        prepared: &Prepared,
        view: &ClusterView,
        members: &[usize],
        finished: &[usize],
    ) -> Result<Estimates, SimError> {
        let mut out = Estimates::default();
        let mut by_job: HashMap<usize, usize> = HashMap::new();
        // The GPUs each job would run on (one rule with the service's); a
        // pair is estimated on A's.
        let shape: Vec<(usize, u32)> = view
            .jobs
            .iter()
            .map(|j| {
                let (family, per_node) = round::estimate_shape(view, j)
                    .unwrap_or_else(|| (self.families[0].clone(), self.nodes[0].gpus));
                let fam = self.families.iter().position(|f| *f == family).unwrap_or(0);
                (fam, per_node)
            })
            .collect();
        for (k, &v) in prepared.jobs.iter().enumerate() {
            let i = members[v];
            let noise = self.noise_factor(i);
            let times = self.solo_times(i, shape[v])?;
            out.jobs
                .push(times.into_iter().map(|t| t * noise).collect());
            out.spread
                .push(self.learned_now(i).map_or(0.0, |(_, spread)| spread));
            by_job.insert(v, k);
        }
        for &m in &prepared.kept {
            let mv = &view.merges[m];
            let (a, b) = (members[mv.a], members[mv.b]);
            let (times, noise) = match mv.mode {
                // B's target is already the merged one.
                MergeMode::Temporal => {
                    // B alone, from scratch, as a split would leave it
                    // (`RoundOutcome::released`; the guard's split too).
                    let merged_target = self.jobs[b].target;
                    self.jobs[b].target =
                        self.jobs[b].alone_epochs * self.jobs[b].samples_per_epoch;
                    let alone = self.solo_times(b, shape[mv.b]);
                    self.jobs[b].target = merged_target;
                    let nb = self.noise_factor(b);
                    out.kept_b_alone
                        .push(alone?.into_iter().map(|t| t * nb).collect());
                    (self.solo_times(b, shape[mv.a])?, nb)
                }
                _ => {
                    out.kept_b_alone.push(Vec::new());
                    let need = (self.remaining(a), self.remaining(b));
                    (
                        self.joint_times(a, b, need, shape[mv.a])?,
                        self.joint_noise(a, b, need),
                    )
                }
            };
            out.kept
                .push(times.into_iter().map(|t| t * noise).collect());
        }
        for pair in &prepared.eligible {
            let (a, b) = (members[pair.a], members[pair.b]);
            let ta = out.jobs[by_job[&pair.a]].clone();
            let tb = out.jobs[by_job[&pair.b]].clone();
            match pair.mode {
                MergeMode::Temporal => {
                    let Some(need) = self.temporal_need(catalog, a, b) else {
                        continue;
                    };
                    let need = self.predicted_need(a, b, need, self.remaining(b));
                    let saved = self.jobs[b].target;
                    self.jobs[b].target = need;
                    let tab = self.solo_times(b, shape[pair.a]);
                    self.jobs[b].target = saved;
                    // B's part carries B's estimation error, as B alone
                    // does: an error common to both ways of training B
                    // does not make the merge look better or worse.
                    let nb = self.noise_factor(b);
                    let tab: Vec<f64> = tab?.into_iter().map(|t| t * nb).collect();
                    let tran_wt = (0..ta.len())
                        .map(|k| tran_wt_temporal(ta[k], tb[k], tab[k]))
                        .collect();
                    out.candidates.push(PairEstimate {
                        pair: *pair,
                        seconds: tab,
                        tran_wt,
                        gain_ab: 0.0,
                        gain_ba: 0.0,
                    });
                }
                _ => {
                    let Some((na, nb)) = self.spatial_need(catalog, a, b) else {
                        continue;
                    };
                    let na = self.predicted_need(b, a, na, self.remaining(a));
                    let nb = self.predicted_need(a, b, nb, self.remaining(b));
                    let noise = self.joint_noise(a, b, (na, nb));
                    let joint: Vec<f64> = self
                        .joint_times(a, b, (na, nb), shape[pair.a])?
                        .into_iter()
                        .map(|t| t * noise)
                        .collect();
                    let tran_wt = (0..ta.len())
                        .map(|k| tran_wt_spatial(ta[k], tb[k], joint[k]))
                        .collect();
                    out.candidates.push(PairEstimate {
                        pair: *pair,
                        seconds: joint,
                        tran_wt,
                        gain_ab: 0.0,
                        gain_ba: 0.0,
                    });
                }
            }
        }
        // Warm starts: B's row at the samples it needs from A's weights.
        // Its times are its work over the same rates, so each row is B's
        // own row scaled by need / remaining (B has done nothing), and of
        // a job's starts only the one that needs least can win (Eq. 12
        // with T_A = 0 is the same ratio at every allocation): only that
        // one is estimated.
        let mut best: BTreeMap<usize, (usize, f64)> = BTreeMap::new();
        for (k, key) in prepared.warm.iter().enumerate() {
            let (a, b) = (finished[key.from], members[key.job]);
            let Some(need) = self.temporal_need(catalog, a, b) else {
                continue;
            };
            let need = self.predicted_need(a, b, need, self.remaining(b));
            if need < self.remaining(b) && best.get(&key.job).is_none_or(|x| need < x.1) {
                best.insert(key.job, (k, need));
            }
        }
        for (v, (k, need)) in best {
            let rem = self.remaining(members[v]);
            let row = &out.jobs[by_job[&v]];
            out.warm.push(WarmEstimate {
                key: prepared.warm[k],
                seconds: row.iter().map(|t| t * need / rem).collect(),
                gain: 0.0,
            });
        }
        out.warm.sort_by_key(|w| w.key);
        Ok(out)
    }

    /// Carries out a round's outcome: profiling runs start, new merges set
    /// their jobs' targets, groups that did not keep their GPUs (re)start,
    /// and every snapshot job left out of the plan is suspended.
    fn apply(
        &mut self,
        prepared: &Prepared,
        outcome: &RoundOutcome,
        members: &[usize],
        catalog: &Catalog,
    ) -> Result<(), SimError> {
        self.version += 1;
        // The executor's rule, checked on every plan: one GPU family per
        // group, and the family a job asks for.
        let sets = outcome
            .profiling
            .iter()
            .map(|r| (vec![r.job], &r.gpus))
            .chain(outcome.groups.iter().map(|g| (g.jobs.clone(), &g.gpus)));
        for (jobs, gpus) in sets {
            let mut fams: Vec<usize> = gpus.iter().map(|g| self.node_family[g.0]).collect();
            fams.dedup();
            let names = || {
                jobs.iter()
                    .map(|&v| self.jobs[members[v]].w.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" + ")
            };
            if fams.len() > 1 {
                return Err(SimError::Plan {
                    t: self.now,
                    message: format!("{} placed over GPU families {fams:?}", names()),
                });
            }
            for &v in &jobs {
                let j = &self.jobs[members[v]];
                let asked = j.w.gpu_model.as_deref().map(analytic::gpu_family);
                if let (Some(m), Some(&f)) = (asked, fams.first())
                    && self.families[f] != m
                {
                    return Err(SimError::Plan {
                        t: self.now,
                        message: format!(
                            "{} asks for {m} and was placed on {}",
                            j.w.name, self.families[f]
                        ),
                    });
                }
            }
            for &v in &jobs {
                let ran_on = &mut self.jobs[members[v]].ran_on;
                if let Some(f) = fams.first().filter(|f| !ran_on.contains(f)) {
                    ran_on.push(*f);
                }
            }
        }
        for r in outcome.profiling.iter().filter(|r| r.new) {
            let i = members[r.job];
            let ready = self.now + self.jobs[i].restart_s;
            let j = &mut self.jobs[i];
            j.alloc = Some(Alloc::on(r.gpus.clone(), ready));
            j.phase = Phase::Profiling {
                until: ready + self.cfg.profile_s,
            };
            j.restarts += 1;
            j.first_start.get_or_insert(self.now);
        }
        let lease: HashMap<usize, f64> = outcome
            .leases
            .iter()
            .map(|&(v, t)| (members[v], t))
            .collect();
        let mut placed = vec![false; self.jobs.len()];
        for g in &outcome.groups {
            let ids: Vec<usize> = g.jobs.iter().map(|&v| members[v]).collect();
            if let ([a, b], Some(_)) = (&ids[..], g.new_merge) {
                let (a, b) = (*a, *b);
                self.merge(catalog, a, b, g.mode);
            }
            let shared = g.mode == MergeMode::Shared;
            for &i in &ids {
                placed[i] = true;
                let j = &mut self.jobs[i];
                if let Some(&t) = lease.get(&i) {
                    j.lease_until = t;
                }
                // A kept group, or a sharer already on the shared GPU,
                // goes on without a restart.
                let stays = j.alloc.as_ref().is_some_and(|a| shared && a.held == g.gpus);
                if g.kept || stays {
                    if let Some(a) = j.alloc.as_mut() {
                        a.shared = shared;
                    }
                    continue;
                }
                // A temporal B waits for A inside the group: it restarts
                // when it starts.
                let waiting_b =
                    matches!(j.merged, Some((MergeMode::Temporal, m)) if self.merges[m].b == i);
                let ready = self.now + if waiting_b { 0.0 } else { j.restart_s };
                let mut alloc = Alloc::on(g.gpus.clone(), ready);
                alloc.shared = shared;
                j.alloc = Some(alloc);
                if !waiting_b {
                    j.restarts += 1;
                }
                j.first_start.get_or_insert(self.now);
                j.first_train.get_or_insert(self.now);
            }
        }
        // Everyone else the policy saw is suspended.
        for &v in &prepared.jobs {
            let i = members[v];
            if !placed[i] {
                self.jobs[i].alloc = None;
            }
        }
        Ok(())
    }

    /// Records a warm start decided this round: B trains from the output
    /// weights of A, which is done, towards its target under transfer,
    /// and the merge guard watches it as the B of a temporal merge (two
    /// epochs in, a start that did not help sends it back to its
    /// pre-trained weights, from scratch). It merges with no one after.
    fn warm_start(&mut self, catalog: &Catalog, a: usize, b: usize) {
        let Some(need) = self.temporal_need(catalog, a, b) else {
            return;
        };
        let m = self.merges.len();
        self.jobs[b].target = need;
        self.jobs[b].ever_merged = Some((MergeMode::Temporal, m));
        self.stats.warm_starts += 1;
        self.merges.push(Merge {
            a,
            b,
            mode: MergeMode::Temporal,
            guard_at: 2.0 * self.jobs[b].samples_per_epoch,
            guard_done: false,
        });
    }

    /// Records a merge decided this round: B's target under transfer
    /// (temporal), both jobs' joint targets (spatial), and where the merge
    /// guard looks (two epochs of the merged part, Ymir §4.3).
    fn merge(&mut self, catalog: &Catalog, a: usize, b: usize, mode: MergeMode) {
        let m = self.merges.len();
        let guard_at = match mode {
            MergeMode::Temporal => {
                let need = self
                    .temporal_need(catalog, a, b)
                    .unwrap_or(self.jobs[b].target);
                self.jobs[b].target = need;
                self.stats.merges_temporal += 1;
                2.0 * self.jobs[b].samples_per_epoch
            }
            _ => {
                if let Some((na, nb)) = self.spatial_need(catalog, a, b) {
                    self.jobs[a].target = na;
                    self.jobs[b].target = nb;
                }
                self.stats.merges_spatial += 1;
                // Two epochs of A's task inside the joint job.
                2.0 * self.jobs[a].samples_per_epoch
            }
        };
        self.merges.push(Merge {
            a,
            b,
            mode,
            guard_at,
            guard_done: false,
        });
        for j in [a, b] {
            self.jobs[j].merged = Some((mode, m));
            self.jobs[j].ever_merged = Some((mode, m));
        }
    }
}

/// The round settings a simulation runs with: profiling when it has a
/// profiling time, merge candidates for a merging policy, groups on any
/// number of nodes (fmsim runs gangs), the configured placement rule.
pub fn round_config(cfg: &SimConfig, policy: &dyn Policy) -> RoundConfig {
    RoundConfig {
        profiling: cfg.profile_s > 0.0,
        merging: true,
        max_nodes_per_group: None,
        placement_rule: cfg.placement_rule,
        policy: policy.name().to_string(),
        queues: cfg.queues.clone(),
        ..Default::default()
    }
}

/// The shared round's first phase as the simulation runs it (a golden test
/// holds it to the live round's).
pub fn prepare_round(view: &ClusterView, policy: &dyn Policy, cfg: &RoundConfig) -> Prepared {
    round::prepare(view, policy, cfg)
}

/// The shared round's decision as the simulation runs it (a golden test
/// holds it to the live round's).
pub fn decide_round(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    policy: &dyn Policy,
    cfg: &RoundConfig,
) -> Result<Decision, round::RoundError> {
    round::decide(view, prepared, estimates, policy, cfg)
}

/// Model names of published profiles that differ from fmsched's catalog.
fn alias(model: &str) -> &str {
    match model {
        "vit" => "vit-base",
        "vit-base" => "vit",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The learned estimator's epochs by observed epochs: exact once the
    /// target is seen (or every epoch is), a prediction after the head
    /// before that, never below what profiling showed.
    #[test]
    fn estimate_prior_learned_epochs_follow_what_was_seen() {
        let lib = CurveLibrary::shipped();
        let curve: Vec<f64> = (1..=10)
            .map(|e| 0.9 - 0.4 * (-0.35 * f64::from(e)).exp())
            .collect();
        let target = curve[6]; // reached at epoch 7
        let with_spread = learned_epochs(&lib, &curve, Metric::default(), target);
        assert!(with_spread.iter().all(|&(_, s)| (0.0..=4.0).contains(&s)));
        assert_eq!(with_spread[10].1, 0.0, "seen: sure");
        let p: Vec<f64> = with_spread.iter().map(|x| x.0).collect();
        assert_eq!(p.len(), 11);
        // Below PROFILED_EPOCHS the head is the profiled one.
        assert_eq!(p[0], p[PROFILED_EPOCHS]);
        for (n, &e) in p.iter().enumerate() {
            assert!(e > n.max(PROFILED_EPOCHS) as f64 || e == 7.0, "{n}: {e}");
            assert!((1.0..=10.0).contains(&e), "{n}: {e}");
        }
        for &e in &p[7..] {
            assert_eq!(e, 7.0);
        }
        // A target met in the profiled epochs is that epoch.
        let early = learned_epochs(&lib, &curve, Metric::default(), curve[1]);
        assert!(early.iter().all(|&e| e == (2.0, 0.0)), "{early:?}");
    }
}
