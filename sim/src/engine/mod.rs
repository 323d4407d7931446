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

mod config;
mod events;
mod lending;
mod merges;
mod results;
mod rounds;
mod speed;
#[cfg(test)]
mod tests;

pub use crate::cluster::NodeGroup;
pub use config::{
    DEFAULT_DEADLINE_GAP_S, EstimateModel, LayerMode, MAX_FROZEN_SHARE, PROFILED_EPOCHS, SimConfig,
    SimError, freezeout_layers, titansched_iteration_s,
};
pub use results::{History, JobResult, Observation, ObservedJob, ObservedState, Retune, SimResult};
pub use rounds::{decide_round, prepare_round, round_config};

use std::collections::{BTreeMap, HashMap};

use fmsched_core::policy::{MergeMode, PIPELINE_STAGES, Replica, ymir_allocations};
use fmsched_core::round::{Gpu, NodeView};
use fmsched_core::slo::RewardStep;
use fmsched_core::{round, slo};
use fmsched_estimator::curve_prior::CurveLibrary;
use fmsched_estimator::lut::{Lut, Variant, expert_group};
use fmsched_estimator::{analytic, footprint};

use crate::catalog::{Catalog, JobTargets, TaskInfo, Work};
use crate::engine::config::learned_epochs;
use crate::engine::rounds::alias;
use crate::loans::LoanStats;
use crate::workload::WorkloadJob;

/// What a job's throughput depends on besides its placement shape: its
/// configuration (an index into the distinct (LUT model, layers, variant)
/// of the workload), its global batch, whether the TitanSched estimate
/// model is asked for, the GPU family (an index), and the frozen layers.
type RateKey = (u32, u32, bool, usize, u32);

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Phase {
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
pub(crate) struct Alloc {
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
pub(crate) struct Job {
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
pub(crate) struct Merge {
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

pub(crate) fn placement_string(p: &[(usize, u32)]) -> String {
    let mut per: Vec<u32> = p.iter().map(|x| x.1).filter(|&g| g > 0).collect();
    per.sort_unstable();
    per.iter()
        .map(|g| char::from(b'0' + (*g).min(9) as u8))
        .collect()
}

pub(crate) fn packed(gpus: u32, per_node: u32) -> String {
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
                j.footprint = footprint::one_gpu_footprint(
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
}
