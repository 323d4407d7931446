//! Scheduling policies: pure functions from a [`Snapshot`] to a [`Plan`].
//!
//! The live scheduler and the simulator (`fmsim`) call exactly this code.
//! Nothing here does IO, reads the clock, or iterates a hash map: the same
//! snapshot always gives the same plan. One exception guards against a
//! solver bug: a MILP solve that has not returned well past its time limit
//! is abandoned ([`solve_watched`]); that only happens when HiGHS fails to
//! honour its limit, and the plan then says so (`stats.abandoned`).
//!
//! Phases of every round (see `README.md` beside this file):
//! 1. **allocate** — the policy decides how many GPUs each *group* gets (a
//!    group is one job, or two jobs merged by Ymir's task merger);
//! 2. **place** — [`placement::place`] maps group sizes onto nodes, keeping
//!    running groups where they are, packing onto as few nodes as possible.
//!
//! Time estimates come in the snapshot (`T_{i,a}` per allocation, from the
//! estimator), so the policies never compute throughput themselves.

pub mod baselines;
pub mod deadline;
pub mod icefrog;
pub mod lyra;
pub mod named;
pub mod placement;
pub mod prompttuner;
pub mod ymir;

use std::collections::BTreeMap;

/// A job's replica shape is the job's (`crate::job`); the policies place
/// whole replicas.
pub use crate::job::{PIPELINE_STAGES, Replica};
use crate::slo::RewardStep;
pub use named::{POLICY_NAMES, by_name, knob_names, with_knobs};

/// How the members of a group train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MergeMode {
    /// One job alone.
    Normal,
    /// `A ↦ B`: A runs, then B continues from A's output weights.
    Temporal,
    /// `A ‖ B`: one joint multi-task process trains both.
    Spatial,
    /// `A | B` on one GPU: two processes, each training its own job, share
    /// one GPU (ICEFROG §III-C, Eq. 8). Not a merge: neither job's work
    /// changes, each runs at [`SHARED_SLOWDOWN`] of its one-GPU speed.
    Shared,
}

impl MergeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MergeMode::Normal => "normal",
            MergeMode::Temporal => "temporal",
            MergeMode::Spatial => "spatial",
            MergeMode::Shared => "shared",
        }
    }
}

/// One job as a policy sees it. Indices into [`Snapshot::jobs`] are the
/// dense ordinals the policies work with; `id` only breaks ties and names
/// jobs in plans.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedJob {
    pub id: String,
    pub model: String,
    pub task: String,
    /// May be merged with other users' jobs (Ymir §9 privacy opt-out).
    pub sharing: bool,
    /// Pipeline-parallel: allocations of whole pipeline replicas
    /// ([`PIPELINE_STAGES`] GPUs on one node each).
    pub pipeline: bool,
    /// Expert-parallel group size (0 or 1 = none): allocations of whole
    /// groups, each on one node.
    pub expert_parallel: u32,
    /// GPUs of one worker of an elastic job (0 or 1 = one; Lyra): whole
    /// workers, each on one node.
    pub worker_gpus: u32,
    /// The GPU family it must run on (None = any; a group never spans two).
    pub gpu_model: Option<String>,
    /// GPU families it cannot run on at all (one replica's memory does not
    /// fit there): never placed there.
    pub unfit_families: Vec<String>,
    /// GPUs the user asked for (baselines give exactly this).
    pub requested_gpus: u32,
    /// Its queue's index in [`Snapshot::queue_gpus`] (None: no budget).
    pub queue: Option<usize>,
    /// Priority within its queue (higher first).
    pub priority: i32,
    pub min_gpus: u32,
    pub max_gpus: u32,
    /// Submission time (seconds on the snapshot's clock).
    pub submitted_at: f64,
    /// Fraction of its work done, in [0, 1] (spatial merging needs 0).
    pub progress: f64,
    /// GPU-seconds received so far (Tiresias' attained service).
    pub attained_gpu_s: f64,
    /// Seconds of running so far (wall).
    pub executed_s: f64,
    /// GPU-seconds an equal share of the cluster (at most its request) would
    /// have given it since it arrived: the "deserved service" the TitanSched
    /// simulator's Themis ranks by (see [`baselines::ThemisRank`]); fmsim
    /// accumulates it as time passes, the service plan by plan.
    pub fair_share_gpu_s: f64,
    /// GPUs it holds now (0 = queued).
    pub current_gpus: u32,
    /// Node index → GPUs it holds now.
    pub current_placement: Vec<(usize, u32)>,
    /// Its time on each other GPU family at the GPUs it holds, relative to
    /// its time where it runs now (1: as fast; 0.5: twice as fast); for a
    /// job that holds none, at its smallest allocation relative to the
    /// family its times are estimated on; empty: unknown. Placement puts a
    /// new group on the fastest family it fits as compactly, and moves a
    /// running job to a faster family whose GPUs the round leaves free when
    /// the time it saves pays its restart ([`placement`]): its times are
    /// estimated on one family ([`crate::round::estimate_shape`]), so the
    /// policy alone never sees that gain.
    pub family_time_ratio: Vec<(String, f64)>,
    /// Remaining seconds to finish alone with `allocations[k]` GPUs
    /// (`+∞` where it cannot run), i.e. `T_{i,a}` of Ymir Eq. 5.
    pub remaining_s: Vec<f64>,
    /// How sure `remaining_s` is: the relative spread `(p90 − p10) / p50`
    /// of the estimator's prediction (0: sure, or nothing known). Ymir
    /// plans on the pessimistic `T·(1 + κ·spread/2)` (its `risk_weight` κ),
    /// so a merge or a placement does not rest on a wide guess.
    pub spread: f64,
    /// Seconds a (re)start costs this job (checkpoint + context switch).
    pub restart_s: f64,
    /// Themis: the lease on its current GPUs runs until this time.
    pub lease_until: f64,
    /// Its reward steps (UniSched), earliest first, on the snapshot's
    /// clock; empty for a best-effort job.
    pub deadlines: Vec<RewardStep>,
    /// What its process takes of one GPU alone (None: unknown, it never
    /// shares a GPU; [`may_share`]).
    pub footprint: Option<GpuFootprint>,
    /// The job it shares its one GPU with now (ICEFROG Eq. 8), if any.
    pub shares_with: Option<usize>,
}

/// What one training process takes of a GPU it has alone: the inputs of
/// ICEFROG's sharing rule (Eq. 8).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuFootprint {
    /// GPU memory it allocates, GiB.
    pub memory_gib: f64,
    /// Its SM utilisation, percent of the GPU.
    pub utilization_pct: f64,
}

/// ICEFROG Eq. 8: a shared job runs at `λ = 0.9` of its speed alone (the
/// printed `λ = 0` without sharing is a misprint; see
/// `fmsched_estimator::icefrog::sharing_slowdown`).
pub const SHARED_SLOWDOWN: f64 = 0.9;
/// ICEFROG §III-C: predicted memory is padded by 10 % before the sharers'
/// sum is compared with the GPU's memory (Eq. 8, rule 1).
pub const SHARE_MEMORY_MARGIN: f64 = 1.1;

/// The GPU memory two jobs could share on: the smallest of the nodes both
/// may run on (one family per group), 0 when none says (no sharing).
pub fn share_memory_gib(snap: &Snapshot, a: usize, b: usize) -> f64 {
    let (ja, jb) = (&snap.jobs[a], &snap.jobs[b]);
    let model = ja.gpu_model.as_deref().or(jb.gpu_model.as_deref());
    snap.nodes
        .iter()
        .filter(|n| model.is_none_or(|m| m == n.gpu_model))
        .map(|n| n.gpu_memory_gib)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
        .unwrap_or(0.0)
}

/// Whether a job may train on one GPU alone (no pipeline, expert group or
/// multi-GPU worker; one GPU within its range): what sharing a GPU needs.
pub fn trains_on_one_gpu(j: &SchedJob) -> bool {
    j.min_gpus <= 1
        && j.max_gpus >= 1
        && !j.pipeline
        && j.expert_parallel <= 1
        && j.worker_gpus <= 1
}

/// Whether job `a` and job `b` may share one GPU of `gpu_memory_gib`
/// (ICEFROG Eq. 8's rules): both train on one GPU alone (no pipeline,
/// expert group or multi-GPU worker, one GPU within their range), both
/// footprints are known, `1.1 × (m_a + m_b)` fits the GPU's memory and
/// their utilisation sums to at most 100 %; and both may run on the same
/// GPU family. An unknown GPU memory (0) shares nothing.
pub fn may_share(a: &SchedJob, b: &SchedJob, gpu_memory_gib: f64) -> bool {
    let (Some(fa), Some(fb)) = (a.footprint, b.footprint) else {
        return false;
    };
    gpu_memory_gib > 0.0
        && trains_on_one_gpu(a)
        && trains_on_one_gpu(b)
        && same_gpus(a.gpu_model.as_deref(), b.gpu_model.as_deref())
        && SHARE_MEMORY_MARGIN * (fa.memory_gib + fb.memory_gib) <= gpu_memory_gib
        && fa.utilization_pct + fb.utilization_pct <= 100.0
}

/// A candidate merge of two jobs, with the estimator's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct PairCandidate {
    pub a: usize,
    pub b: usize,
    pub mode: MergeMode,
    /// Seconds the merged group needs at each allocation: for temporal
    /// pairs A's remaining time plus B's transferred time (`T_A + T_{A↦B}`),
    /// for spatial pairs the joint job's time `T_{A‖B}`.
    pub remaining_s: Vec<f64>,
    /// `TranWt` per allocation (Ymir Eq. 12–13).
    pub tran_wt: Vec<f64>,
}

/// A merge that was decided earlier and is kept (only its size changes).
#[derive(Clone, Debug, PartialEq)]
pub struct ExistingMerge {
    pub a: usize,
    pub b: usize,
    pub mode: MergeMode,
    pub remaining_s: Vec<f64>,
}

/// A node's capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCap {
    pub id: String,
    pub gpus: u32,
    /// Its GPUs' family (a group never spans two).
    pub gpu_model: String,
    /// An inference server on loan (Lyra): elastic jobs prefer it, and a
    /// reclaim may take it back ([`lyra::reclaim`]).
    pub loaned: bool,
    /// Memory of one of its GPUs, GiB (0: unknown; nothing shares a GPU
    /// there, [`may_share`]).
    pub gpu_memory_gib: f64,
}

/// How placement treats a group that fits no single node and no set of
/// whole nodes (see [`placement`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementRule {
    /// Spread a data-parallel group over the nodes with the most free GPUs
    /// (fewest nodes possible then): fmsched's rule.
    #[default]
    Pack,
    /// A group must sit on the fewest nodes its size needs
    /// (`⌈gpus / node size⌉`), else it waits for the next round: the rule of
    /// the TitanSched simulator the Ymir authors evaluate with (their
    /// consolidated placement rejects a placement that uses more nodes than
    /// necessary). `fmsim fidelity` uses it to replay their runs.
    FewestNodes,
}

/// Everything a policy may look at.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Seconds on the caller's clock (virtual in the simulator).
    pub now: f64,
    pub nodes: Vec<NodeCap>,
    /// The allocation set; `remaining_s` vectors are indexed like it.
    pub allocations: Vec<u32>,
    pub jobs: Vec<SchedJob>,
    pub candidates: Vec<PairCandidate>,
    pub merges: Vec<ExistingMerge>,
    /// How groups that fit no single node are placed.
    pub placement_rule: PlacementRule,
    /// GPUs each queue's jobs may hold together this round, for a rigid
    /// policy (crate::queue leaves the choice among a queue's jobs to the
    /// policy's own order); empty when no budget applies.
    pub queue_gpus: Vec<u32>,
}

/// Seconds past a MILP's own time limit before [`solve_watched`] gives up
/// on it: `3 × limit + 1 s`, far beyond HiGHS' own checks (it stops within
/// milliseconds of its limit when it honours it) and beyond a busy
/// machine's scheduling delays.
pub fn solve_grace(time_limit_s: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(3.0 * time_limit_s.max(0.001) + 1.0)
}

/// Solves `model` (with its time limit `time_limit_s` already set) on its
/// own thread and waits at most [`solve_grace`] for the answer. HiGHS does
/// not always honour its time limit (ERGO-Code/HiGHS#885, #2226: some
/// models loop in the MIP search without checking it); a round waiting on
/// such a solve would never end. `None` when the solve was abandoned: its
/// thread is left to finish on its own (it cannot be stopped), its answer
/// dropped, and the caller falls back as on a time limit without a usable
/// answer, setting `stats.abandoned` so the service counts and logs it.
pub(crate) fn solve_watched(
    model: good_lp::solvers::highs::HighsProblem,
    time_limit_s: f64,
) -> Option<Result<good_lp::solvers::highs::HighsSolution, good_lp::ResolutionError>> {
    use good_lp::SolverModel;
    within(solve_grace(time_limit_s), move || model.solve())
}

/// [`solve_watched`], then [`usable_solution`] of its answer: what a MILP
/// policy acts on, or None (the caller falls back). An abandoned solve
/// sets `stats.abandoned`.
pub(crate) fn solve_usable(
    model: good_lp::solvers::highs::HighsProblem,
    time_limit_s: f64,
    value_of: impl Fn(&good_lp::solvers::highs::HighsSolution) -> f64,
    warm_value: f64,
    stats: &mut SolveStats,
) -> Option<good_lp::solvers::highs::HighsSolution> {
    let answer = solve_watched(model, time_limit_s);
    stats.abandoned |= answer.is_none();
    usable_solution(answer?, value_of, warm_value)
}

/// Runs `f` on a new thread and returns its result if it comes within
/// `grace`; `None` otherwise (the thread is detached and its result
/// dropped when it ends).
fn within<T: Send + 'static>(
    grace: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("fmsched-milp".into())
        .spawn(move || {
            // The receiver is gone when the answer came too late.
            let _ = tx.send(f());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(grace).ok(),
        // No thread to be had (resource limits): counted like a solve
        // that did not return.
        Err(_) => None,
    }
}

/// A HiGHS answer a MILP policy may act on: proven (optimal or within the
/// MIP gap), or stopped at the time limit with an incumbent worth more than
/// nothing and at least the warm start (what the jobs hold) — better than
/// repairing a fallback. None otherwise: a time limit without a usable
/// incumbent, infeasible, or a solver error (the caller falls back).
pub(crate) fn usable_solution<S: good_lp::Solution>(
    answer: Result<S, good_lp::ResolutionError>,
    value_of: impl Fn(&S) -> f64,
    warm_value: f64,
) -> Option<S> {
    use good_lp::SolutionStatus;
    match answer {
        Ok(s)
            if matches!(
                s.status(),
                SolutionStatus::Optimal | SolutionStatus::GapLimit
            ) =>
        {
            Some(s)
        }
        Ok(s) if value_of(&s) > 0.0 && value_of(&s) >= warm_value - 1e-9 => Some(s),
        Ok(_) | Err(_) => None,
    }
}

/// What is left of each queue's budget ([`Snapshot::queue_gpus`]) as a
/// policy fills a plan.
pub struct QueueRoom {
    left: Vec<u32>,
}

impl QueueRoom {
    /// The budgets less what `plan` already gives.
    pub fn new(snap: &Snapshot, plan: &Plan) -> Self {
        let mut room = Self {
            left: snap.queue_gpus.clone(),
        };
        for e in &plan.entries {
            room.take(snap, e.jobs[0], e.gpus);
        }
        room
    }

    /// Whether job `i` may take `a` more GPUs under its queue's budget.
    pub fn fits(&self, snap: &Snapshot, i: usize, a: u32) -> bool {
        match snap.jobs[i].queue {
            Some(q) => self.left.get(q).is_none_or(|&l| a <= l),
            None => true,
        }
    }

    pub fn take(&mut self, snap: &Snapshot, i: usize, a: u32) {
        if let Some(l) = snap.jobs[i].queue.and_then(|q| self.left.get_mut(q)) {
            *l = l.saturating_sub(a);
        }
    }
}

/// `order` with higher priorities first (stable: the policy's own order
/// holds within a priority).
pub fn by_priority(snap: &Snapshot, order: &mut [usize]) {
    order.sort_by_key(|&i| std::cmp::Reverse(snap.jobs[i].priority));
}

/// The time of `times` (one per allocation of `allocations`) at `a` GPUs;
/// `+∞` when `a` is not in the set or has no time.
pub(crate) fn time_in(allocations: &[u32], times: &[f64], a: u32) -> f64 {
    // Allocation sets are ascending (a binary search; a set that is not
    // finds `a` by a scan): a datacenter's set has thousands of sizes.
    allocations
        .binary_search(&a)
        .ok()
        .or_else(|| allocations.iter().position(|&x| x == a))
        .and_then(|k| times.get(k).copied())
        .unwrap_or(f64::INFINITY)
}

impl Snapshot {
    pub fn total_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus).sum()
    }

    /// Index of allocation `a` in the allocation set.
    pub fn alloc_index(&self, a: u32) -> Option<usize> {
        self.allocations.iter().position(|&x| x == a)
    }

    /// Remaining time of job `i` at `a` GPUs (`+∞` when `a` is not in the set).
    pub fn time_at(&self, i: usize, a: u32) -> f64 {
        time_in(&self.allocations, &self.jobs[i].remaining_s, a)
    }

    /// The job's group when it is part of a kept merge.
    pub fn merge_of(&self, i: usize) -> Option<usize> {
        self.merges.iter().position(|m| m.a == i || m.b == i)
    }
}

/// One group in a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanEntry {
    /// Job indices: one, or two for a merge (A first).
    pub jobs: Vec<usize>,
    pub mode: MergeMode,
    pub gpus: u32,
    /// Node index → GPUs. Empty until placed.
    pub placement: Vec<(usize, u32)>,
}

impl PlanEntry {
    /// One job on its own (not merged), not yet placed.
    pub fn single(job: usize, gpus: u32) -> Self {
        Self {
            jobs: vec![job],
            mode: MergeMode::Normal,
            gpus,
            placement: Vec::new(),
        }
    }
}

/// Counters a round reports (never silent about a fallback).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SolveStats {
    pub variables: usize,
    pub constraints: usize,
    pub candidate_pairs: usize,
    /// The MILP hit its time limit (or failed) and the fallback plan was used.
    pub fallback: bool,
    /// Groups the placement could not fit (they wait for the next round).
    pub unplaced: usize,
    /// Their jobs (snapshot index, GPUs the plan gave its group): the
    /// round tells each why it waits.
    pub unplaced_jobs: Vec<(usize, u32)>,
    /// Jobs of groups that gave their GPUs to a group with less time to
    /// run (placement's rule 6; snapshot indices: the job, the first job
    /// of the group it gave way to). Their groups are among the unplaced.
    pub displaced: Vec<(usize, usize)>,
    /// The MILP's objective at its solution (0 for greedy policies and on
    /// a fallback; the sum over parts when partitioned).
    pub objective: f64,
    /// Parts the round was solved in (0: one solve, unpartitioned).
    pub partitions: usize,
    /// Solved (in part) by the greedy of the LP relaxation instead of the
    /// MILP (a round too large for the solver's time limit).
    pub relaxed: bool,
    /// A MILP solve did not return within [`solve_grace`] of its time
    /// limit and was abandoned (a solver bug); the fallback plan was used
    /// (`fallback` is set too).
    pub abandoned: bool,
}

/// The decision of one round: the groups that hold GPUs. Jobs not in any
/// entry are queued.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub entries: Vec<PlanEntry>,
    pub stats: SolveStats,
}

impl Plan {
    /// GPUs each job holds in this plan (by job index).
    pub fn gpus_by_job(&self) -> BTreeMap<usize, u32> {
        let mut m = BTreeMap::new();
        for e in &self.entries {
            for &j in &e.jobs {
                m.insert(j, e.gpus);
            }
        }
        m
    }

    /// Recounts the plan from scratch and reports the first broken rule:
    /// no job twice, no node over capacity, placements adding up to the
    /// group size, pairs of two distinct jobs of one model that both allow
    /// sharing. Run by tests and by the simulator in debug builds.
    pub fn consistency_check(&self, snap: &Snapshot) -> Result<(), String> {
        let mut seen = vec![false; snap.jobs.len()];
        let mut used = vec![0u32; snap.nodes.len()];
        for (k, e) in self.entries.iter().enumerate() {
            if e.jobs.is_empty() || e.jobs.len() > 2 {
                return Err(format!("entry {k}: {} jobs", e.jobs.len()));
            }
            for &j in &e.jobs {
                if j >= seen.len() {
                    return Err(format!("entry {k}: job {j} does not exist"));
                }
                if std::mem::replace(&mut seen[j], true) {
                    return Err(format!("job {} is in the plan twice", snap.jobs[j].id));
                }
            }
            if e.jobs.len() == 2 {
                let (a, b) = (&snap.jobs[e.jobs[0]], &snap.jobs[e.jobs[1]]);
                if e.mode == MergeMode::Normal {
                    return Err(format!("entry {k}: two jobs without a merge mode"));
                }
                if e.mode == MergeMode::Shared {
                    // ICEFROG Eq. 8 on the GPU it got.
                    let memory = match e.placement[..] {
                        [] => f64::INFINITY,
                        [(n, 1)] if n < snap.nodes.len() => snap.nodes[n].gpu_memory_gib,
                        _ => 0.0,
                    };
                    if e.gpus != 1 || !may_share(a, b, memory) {
                        return Err(format!(
                            "entry {k}: {} and {} may not share {} GPU(s) (ICEFROG Eq. 8)",
                            a.id, b.id, e.gpus
                        ));
                    }
                } else if a.model != b.model || !a.sharing || !b.sharing {
                    return Err(format!(
                        "entry {k}: {} and {} may not be merged",
                        a.id, b.id
                    ));
                }
            }
            let placed: u32 = e.placement.iter().map(|p| p.1).sum();
            if !e.placement.is_empty() && placed != e.gpus {
                return Err(format!("entry {k}: placed {placed} GPUs of {}", e.gpus));
            }
            let unit = entry_replica(snap, &e.jobs);
            if e.placement.iter().any(|p| !p.1.is_multiple_of(unit)) {
                return Err(format!(
                    "entry {k}: a replica of {} ({unit} GPUs) is split across nodes",
                    snap.jobs[e.jobs[0]].id
                ));
            }
            if !placement::one_family(snap, &e.placement, placement::entry_model(snap, &e.jobs)) {
                return Err(format!(
                    "entry {k}: placed over two GPU models or not on the one {} asks for",
                    snap.jobs[e.jobs[0]].id
                ));
            }
            for &(n, g) in &e.placement {
                if n >= used.len() {
                    return Err(format!("entry {k}: node {n} does not exist"));
                }
                used[n] += g;
            }
        }
        for (n, &u) in used.iter().enumerate() {
            if u > snap.nodes[n].gpus {
                return Err(format!(
                    "node {} holds {u} GPUs of {}",
                    snap.nodes[n].id, snap.nodes[n].gpus
                ));
            }
        }
        let total: u32 = self.entries.iter().map(|e| e.gpus).sum();
        if total > snap.total_gpus() {
            return Err(format!("plan uses {total} GPUs of {}", snap.total_gpus()));
        }
        Ok(())
    }
}

/// A scheduling policy. `allocate` decides group sizes; placement is
/// shared (see the module docs).
pub trait Policy {
    fn name(&self) -> &str;
    /// Seconds between rounds, as the policy's paper sets it.
    fn interval_s(&self) -> f64;
    /// Decides which groups hold how many GPUs (placement left empty).
    fn allocate(&self, snap: &Snapshot) -> Plan;
    /// Whether the policy merges jobs (callers then supply candidates).
    fn merges(&self) -> bool {
        false
    }
    /// Whether a job may start from a finished job's weights
    /// ([`crate::round::WarmKey`]; callers then list finished jobs and
    /// estimate the starts).
    fn warm_starts(&self) -> bool {
        false
    }
    /// The GPU counts this policy chooses among (the snapshot's
    /// `allocations`): Ymir's {0, 1, 2, 3, 4m} unless the policy's paper
    /// grows jobs one GPU at a time.
    fn allocation_set(&self, max_gpus: u32) -> Vec<u32> {
        ymir_allocations(max_gpus)
    }
    /// Whether the policy gives each job its requested size or nothing
    /// (FIFO, SRTF, Tiresias, Themis, EDF, Hydra, Chronus): it never grows
    /// a job later, so the quota pass admits such a job only at its
    /// requested size — shrunk to fit a queue's share, it would run small
    /// for the rest of its life while its queue's GPUs sat idle.
    fn rigid(&self) -> bool {
        false
    }
    /// Seconds a new allocation is leased for (Themis); 0 = no leases.
    /// The caller records `lease_until` on the jobs it starts.
    fn lease_s(&self) -> f64 {
        0.0
    }
    /// Seconds a new allocation of a job with a deadline is leased for
    /// (UniSched's SLO lease); the same as [`Policy::lease_s`] unless the
    /// policy tells the classes apart.
    fn slo_lease_s(&self) -> f64 {
        self.lease_s()
    }
    /// Whether a job that stops on a metric target is planned at the
    /// estimator's predicted iterations (UniSched's training-iteration
    /// estimator, §5.3.2.2). False: at its user's maximum iterations, as
    /// Chronus as published does (the thesis' baseline, §5.6.3, and the
    /// "without the iteration estimator" ablation of Fig. 5.9b). The
    /// caller builds the snapshot's times by it.
    fn iteration_estimator(&self) -> bool {
        true
    }
    /// A round: allocate, then place.
    fn schedule(&self, snap: &Snapshot) -> Plan {
        let plan = self.allocate(snap);
        placement::place(snap, plan)
    }
}

/// Whether a merge's `TranWt` (Ymir Eq. 12/13) at one allocation is a gain
/// over running its two jobs apart. Ymir §5 filters out combinations with
/// `TranWt < 1` as unnecessary; a pair at exactly 1 is just as unnecessary
/// (no JCT speedup: B of a temporal pair needs as many epochs from A's
/// weights as alone, say when neither reaches its target within its epoch
/// cap) but not harmless: the merged pair counts as two jobs in Eq. 7, so
/// the solver took such pairs on a busy cluster, and a temporal B then
/// waited for all of A for nothing. On FM-1-vit-large the two slowest jobs
/// were such Bs (`tail_no_gain_merges_are_not_candidates`).
pub fn merge_gains(tran_wt: f64) -> bool {
    tran_wt > 1.0 + 1e-9
}

/// B of a temporal transfer from a job that is done, having trained from
/// its weights, finishes sooner started again from the pre-trained ones:
/// what it still needs from those weights is more than its whole work from
/// scratch plus the restart (all in one unit: iterations live, samples in
/// fmsim). The rule by which the scheduler (from the gain it measured,
/// `times::fresh_start_pays`) and fmsim's guard (from the catalog's truth)
/// restart a warm start that hurts.
pub fn fresh_start_pays(left_from_weights: f64, from_scratch: f64, restart: f64) -> bool {
    from_scratch + restart.max(0.0) < left_from_weights
}

/// Ymir Eq. 12: `TranWt(A,B,↦,a) = (2·min(T_A,T_B) + max(T_A,T_B)) / (2·T_A + T_{A↦B})`.
/// The numerator is the total JCT of A and B under SRTF, the denominator the
/// total JCT of A and then B from A's weights.
pub fn tran_wt_temporal(t_a: f64, t_b: f64, t_ab: f64) -> f64 {
    tran_wt_temporal_apart(t_a, t_b, t_a, t_ab)
}

/// Eq. 12 where A's time apart (`t_a`, in the numerator's SRTF schedule of
/// the two jobs alone) is not its time in the pair (`t_a_pair`): a job
/// alone may start from a finished job's weights
/// ([`crate::round::WarmKey`]), as A of the pair from the pre-trained ones.
pub fn tran_wt_temporal_apart(t_a: f64, t_b: f64, t_a_pair: f64, t_ab: f64) -> f64 {
    tran_ratio(2.0 * t_a.min(t_b) + t_a.max(t_b), 2.0 * t_a_pair + t_ab)
}

/// Ymir Eq. 13: `TranWt(A,B,‖,a) = (2·min(T_A,T_B) + max(T_A,T_B)) / (2·T_{A‖B})`
/// (both jobs finish with the joint job).
pub fn tran_wt_spatial(t_a: f64, t_b: f64, t_joint: f64) -> f64 {
    tran_ratio(2.0 * t_a.min(t_b) + t_a.max(t_b), 2.0 * t_joint)
}

/// `num / den`, 0 when either side is not a finite positive time (a pair
/// that cannot run at `a` brings nothing).
fn tran_ratio(num: f64, den: f64) -> f64 {
    if num.is_finite() && den.is_finite() && den > 0.0 {
        num / den
    } else {
        0.0
    }
}

/// Whether two GPU-model requirements can share a group (a merge): equal,
/// or at most one of them set.
/// SplitMix64's output for the state `x` (Steele et al. 2014; the state
/// advances by `0x9E37_79B9_7F4A_7C15` per draw): seeded, identical on
/// every platform. Lyra's random reclaim, the Prompt Bank's feature
/// hashing and fmsim's generator draw with it.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn same_gpus(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// Whether some node of these sizes can hold one pipeline replica: a
/// pipeline job on a cluster without one can never run.
pub fn pipeline_fits(node_gpus: impl IntoIterator<Item = u32>) -> bool {
    node_gpus.into_iter().any(|g| g >= PIPELINE_STAGES)
}

impl SchedJob {
    /// Seconds it has spent waiting at `now` since it arrived (in the
    /// system and not running).
    pub fn waited(&self, now: f64) -> f64 {
        (now - self.submitted_at - self.executed_s).max(0.0)
    }

    /// GPUs that must sit together on one node.
    pub fn replica(&self) -> Replica {
        Replica::of(self.pipeline, self.expert_parallel).with_workers(self.worker_gpus)
    }
}

/// GPUs of one replica of a group: the largest of its jobs' (a merge's
/// jobs have the same).
pub fn entry_replica(snap: &Snapshot, jobs: &[usize]) -> u32 {
    jobs.iter()
        .map(|&j| snap.jobs[j].replica().gpus())
        .max()
        .unwrap_or(1)
}

/// Ymir's allocation set {0, 1, 2, 3, 4m} up to `max_gpus` (Ymir §5.1).
pub fn ymir_allocations(max_gpus: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [0, 1, 2, 3]
        .into_iter()
        .filter(|&a| a <= max_gpus)
        .collect();
    v.extend((1..=max_gpus / 4).map(|m| 4 * m));
    v
}

/// The allocations a job may receive: those of the set inside its GPU
/// range where it can run (finite time), largest last. `0` is not included.
pub fn usable_allocations(snap: &Snapshot, i: usize) -> Vec<u32> {
    let j = &snap.jobs[i];
    // Allocation sets are ascending: only those up to the job's maximum
    // (a datacenter's set has thousands of sizes); another set whole.
    let end = if snap.allocations.is_sorted() {
        snap.allocations.partition_point(|&a| a <= j.max_gpus)
    } else {
        snap.allocations.len()
    };
    snap.allocations[..end]
        .iter()
        .zip(&j.remaining_s)
        .filter(|&(&a, &t)| a > 0 && a >= j.min_gpus && a <= j.max_gpus && t.is_finite())
        .map(|(&a, _)| a)
        .collect()
}

/// The allocation nearest to the job's request that it can use (the
/// largest usable one not above the request, else the smallest usable).
pub fn requested_allocation(snap: &Snapshot, i: usize) -> Option<u32> {
    nearest_request(&usable_allocations(snap, i), snap.jobs[i].requested_gpus)
}

/// Of `usable` (ascending), the largest not above `req`, else the smallest.
pub fn nearest_request(usable: &[u32], req: u32) -> Option<u32> {
    usable
        .iter()
        .rev()
        .find(|&&a| a <= req)
        .or_else(|| usable.first())
        .copied()
}

#[cfg(test)]
pub(crate) mod testkit {
    //! Small builders for policy tests: `cluster(nodes, gpus)`, `job(..)`.
    use super::*;

    /// Perfectly linear scaling: `work / a` seconds at each allocation `a`
    /// (infinite at 0 GPUs).
    pub fn linear_times(allocations: &[u32], work_gpu_s: f64) -> Vec<f64> {
        allocations
            .iter()
            .map(|&a| {
                if a == 0 {
                    f64::INFINITY
                } else {
                    work_gpu_s / f64::from(a)
                }
            })
            .collect()
    }

    /// Perfectly linear scaling: `work / a` seconds at `a` GPUs.
    pub fn job(id: &str, work_gpu_s: f64, requested: u32, allocations: &[u32]) -> SchedJob {
        SchedJob {
            id: id.into(),
            model: "roberta-base".into(),
            task: id.into(),
            sharing: true,
            pipeline: false,
            expert_parallel: 0,
            worker_gpus: 0,
            gpu_model: None,
            unfit_families: Vec::new(),
            requested_gpus: requested,
            queue: None,
            priority: 0,
            min_gpus: 1,
            max_gpus: 64,
            submitted_at: 0.0,
            progress: 0.0,
            attained_gpu_s: 0.0,
            executed_s: 0.0,
            current_gpus: 0,
            current_placement: Vec::new(),
            family_time_ratio: Vec::new(),
            remaining_s: linear_times(allocations, work_gpu_s),
            spread: 0.0,
            restart_s: 30.0,
            lease_until: 0.0,
            fair_share_gpu_s: 0.0,
            deadlines: Vec::new(),
            footprint: None,
            shares_with: None,
        }
    }

    pub fn cluster(nodes: usize, gpus: u32, jobs: Vec<SchedJob>) -> Snapshot {
        let allocations = ymir_allocations(nodes as u32 * gpus);
        let jobs = jobs
            .into_iter()
            .map(|mut j| {
                // Re-index the times to this cluster's allocation set.
                let work = j
                    .remaining_s
                    .iter()
                    .zip(ymir_allocations(64))
                    .find(|(t, _)| t.is_finite());
                if let Some((&t, a)) = work {
                    let w = t * f64::from(a);
                    j.remaining_s = linear_times(&allocations, w);
                }
                j
            })
            .collect();
        Snapshot {
            now: 0.0,
            nodes: (0..nodes)
                .map(|n| NodeCap {
                    id: format!("node-{n}"),
                    gpus,
                    gpu_model: "A100".into(),
                    loaned: false,
                    gpu_memory_gib: 80.0,
                })
                .collect(),
            allocations,
            jobs,
            candidates: Vec::new(),
            merges: Vec::new(),
            placement_rule: PlacementRule::Pack,
            queue_gpus: Vec::new(),
        }
    }

    pub fn jobs(n: usize) -> Vec<SchedJob> {
        (0..n)
            .map(|i| {
                job(
                    &format!("j{i}"),
                    3600.0 * (1 + i % 5) as f64,
                    1 + (i % 4) as u32,
                    &ymir_allocations(64),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::*;
    use super::*;

    #[test]
    fn a_solve_that_does_not_return_is_abandoned_after_its_grace() {
        use good_lp::{ProblemVariables, SolverModel, variable};
        // A solve that returns: its answer comes back.
        let mut vars = ProblemVariables::new();
        let x = vars.add(variable().binary());
        let mut model = vars.maximise(2.0 * x).using(good_lp::highs);
        model.set_verbose(false);
        let answer = solve_watched(model.with((1.0 * x).leq(1.0)), 1.0)
            .expect("a small model returns")
            .expect("and is solved");
        assert_eq!(good_lp::Solution::value(&answer, x).round(), 1.0);
        // One that does not (a solver stuck in a loop, here a thread
        // blocked until the test lets it go): abandoned after the grace.
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let out = within(std::time::Duration::from_millis(50), move || {
            let _ = stuck.recv();
            7
        });
        assert_eq!(out, None);
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
        drop(release);
        assert_eq!(within(std::time::Duration::from_secs(60), || 7), Some(7));
        assert_eq!(solve_grace(1.0), std::time::Duration::from_secs(4));
    }

    #[test]
    fn allocation_set() {
        assert_eq!(ymir_allocations(8), vec![0, 1, 2, 3, 4, 8]);
        assert_eq!(ymir_allocations(3), vec![0, 1, 2, 3]);
    }

    #[test]
    fn consistency_check_catches_each_broken_rule() {
        let snap = cluster(1, 4, jobs(3));
        let entry = |jobs: Vec<usize>, gpus, placement| PlanEntry {
            jobs,
            mode: MergeMode::Normal,
            gpus,
            placement,
        };
        let ok = Plan {
            entries: vec![
                entry(vec![0], 2, vec![(0, 2)]),
                entry(vec![1], 2, vec![(0, 2)]),
            ],
            ..Default::default()
        };
        assert_eq!(ok.consistency_check(&snap), Ok(()));
        let twice = Plan {
            entries: vec![
                entry(vec![0], 1, vec![(0, 1)]),
                entry(vec![0], 1, vec![(0, 1)]),
            ],
            ..Default::default()
        };
        assert!(
            twice
                .consistency_check(&snap)
                .unwrap_err()
                .contains("twice")
        );
        let over = Plan {
            entries: vec![
                entry(vec![0], 3, vec![(0, 3)]),
                entry(vec![1], 2, vec![(0, 2)]),
            ],
            ..Default::default()
        };
        assert!(over.consistency_check(&snap).is_err());
        let mut private = snap.clone();
        private.jobs[1].sharing = false;
        let pair = Plan {
            entries: vec![PlanEntry {
                jobs: vec![0, 1],
                mode: MergeMode::Spatial,
                gpus: 2,
                placement: vec![(0, 2)],
            }],
            ..Default::default()
        };
        assert_eq!(pair.consistency_check(&snap), Ok(()));
        assert!(
            pair.consistency_check(&private)
                .unwrap_err()
                .contains("may not be merged")
        );
    }
}
