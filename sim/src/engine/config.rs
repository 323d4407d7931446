//! What a simulation is set up with: the cluster's node groups, the
//! simulator's rules and knobs (`SimConfig`), how layers and estimates
//! are modelled, and its errors.

use crate::cluster::NodeGroup;
use fmsched_core::NodeState;
use fmsched_core::round::{NodeView, RoundClock};
use fmsched_estimator::analytic;
use fmsched_estimator::curve_prior::{
    CurveLibrary, Metric, Query, Start, predict, remaining_spread,
};
use fmsched_estimator::lut::{Lut, Variant};

use crate::loans::Loans;

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
pub(crate) fn learned_epochs(
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
    /// (`scheduler_svc::round::round_clock`). Rounds on events
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
    pub(super) fn node_views(&self) -> Vec<NodeView> {
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
