//! What a simulation returns (per-job and summary results) and what it
//! shows a tuner mid-run (observations and job histories).

use fmsched_core::policy::{MergeMode, Policy};
use fmsched_core::slo::RewardStep;
use fmsched_core::{SloClass, slo};

use crate::loans::LoanStats;
use crate::workload::WorkloadJob;

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
