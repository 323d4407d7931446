//! One scheduling round, shared by the scheduler service and `fmsim`:
//! everything between "what the cluster looks like" and "what runs where
//! next", without the IO on either side (STYLE §7: if the simulator and the
//! service can disagree about a rule, the rule is in the wrong place).
//!
//! A round has three pure phases; the caller does the IO between them:
//! 1. **prepare** ([`prepare`]) — the nodes the round may use and their
//!    capacity (Offline nodes are out, drained ones give nothing, a Suspect
//!    or cordoned one keeps only what it runs), profiling reservations (Ymir Fig. 6
//!    step 2), the jobs that enter the policy's snapshot, the policy's own
//!    allocation set, the merges kept from earlier rounds, the pairs
//!    eligible for a new merge, and jobs no node can ever hold.
//!
//!    The caller then estimates times for those jobs and pairs
//!    ([`Estimates`]): the service asks its estimator (with the logged
//!    in-process fallback), fmsim its catalog. That is the one input that
//!    differs between the two, by design.
//! 2. **decide** ([`decide`]) — the policy's [`Snapshot`] (remaining times,
//!    merged groups' times, restart costs, current placements), the plan
//!    (`Policy::schedule`: allocate, then place) and its consistency check.
//! 3. **interpret** (the end of [`decide`]) — concrete GPUs (a group that
//!    keeps its node and size keeps its GPUs), new merges, job state
//!    transitions with their reasons, leases, context switches, and the
//!    placements the executor cannot run (each named, never dropped
//!    silently).
//!
//! Everything here is deterministic: sorted vectors and `BTreeMap`s only,
//! ties broken by index. The same view and estimates give the same outcome
//! in the service and in fmsim.

use std::collections::{BTreeMap, BTreeSet};

use crate::job::JobState;
use crate::node::NodeState;
use crate::policy::{
    ExistingMerge, GpuFootprint, MergeMode, NodeCap, PairCandidate, PlacementRule, Plan, Policy,
    Replica, SchedJob, Snapshot, SolveStats,
};
use crate::queue::{Queues, QuotaJob};
use crate::slo::RewardStep;

/// The phases of a live committing round, in order, as the scheduler
/// names them on `/metrics` (`fmsched_round_phase_duration_seconds_{last,sum}{phase}`)
/// and in its stuck-round warning; `fmctl bench-agents` reads them back.
pub mod phase {
    pub const OBSERVE: &str = "observe";
    pub const LOAD_INPUTS: &str = "load inputs";
    pub const DECIDE: &str = "decide";
    pub const COMMIT: &str = "commit";
    pub const PUSH_PLANS: &str = "push plans";
    pub const AFTER_COMMIT: &str = "after commit";
    pub const ALL: [&str; 6] = [
        OBSERVE,
        LOAD_INPUTS,
        DECIDE,
        COMMIT,
        PUSH_PLANS,
        AFTER_COMMIT,
    ];
}

/// A GPU: (node ordinal in the [`ClusterView`], index on that node).
pub type Gpu = (usize, u32);

/// Seconds a (re)start costs when the profile names no context-switch time.
pub const DEFAULT_CONTEXT_SWITCH_S: f64 = 30.0;

/// What a (re)start of a job costs: writing and loading its checkpoint plus
/// the model's context switch (process start, weights, data loader) from its
/// throughput profile. The service and fmsim both charge exactly this.
pub fn restart_cost(checkpoint_s: f64, context_switch_s: Option<f64>) -> f64 {
    checkpoint_s.max(0.0)
        + context_switch_s
            .unwrap_or(DEFAULT_CONTEXT_SWITCH_S)
            .max(0.0)
}

/// When the next round runs once an event came (a job submitted, a task
/// ended: GPUs freed, a profiling run done), seconds on one clock: at once,
/// but no sooner than `gap_s` after the last round began, and never later
/// than the periodic round `next_s`. A round per interval leaves a new
/// short job up to an interval to wait, twice when it profiles first; with
/// deadlines of 1.1–2× a job's time alone that wait alone misses them
/// (docs/fmsim.md, "Rounds on events"). The service and fmsim both run
/// this rule (`scheduling.event_round_gap`, `fmsim --event-gap`).
pub fn round_after_event(next_s: f64, now_s: f64, last_started_s: f64, gap_s: f64) -> f64 {
    next_s.min(now_s.max(last_started_s + gap_s))
}

/// When the next round runs once a job with a deadline is waiting to start
/// (it arrived, its profiling run ended, GPUs were freed): as for any event
/// ([`round_after_event`]) when starting it at the periodic round `next_s`
/// and running `need_s` (its time alone at its request, with its starts)
/// would finish after `deadline_s` while starting now would not; else the
/// periodic round. Only such a job brings the round forward, so a periodic
/// round still finds the other arrivals waiting together (the pairs Ymir
/// merges): rounds on every event meet the same deadlines but cost the
/// default policy 8–15 % of its mean JCT (docs/fmsim.md, "Rounds for
/// deadlines"). The service and fmsim both run this rule
/// (`scheduling.deadline_round_gap`, `fmsim --deadline-gap`).
pub fn round_for_deadline(
    next_s: f64,
    now_s: f64,
    last_started_s: f64,
    gap_s: f64,
    need_s: f64,
    deadline_s: f64,
) -> f64 {
    if next_s + need_s > deadline_s && now_s + need_s <= deadline_s {
        round_after_event(next_s, now_s, last_started_s, gap_s)
    } else {
        next_s
    }
}

/// What job `k` of a round's snapshot needs from a round's start to finish
/// alone, as the round's estimates have it: its time at the GPUs it asked
/// for (the fewest it may run on when its request is not in the allocation
/// set) and its start. None for a job that has trained (it is no longer
/// waiting for its first start) or whose times are all unknown. The need
/// [`round_for_deadline`] weighs once a job has profiled: the service
/// refreshes admission's bound with it after each round, and fmsim's
/// `deadline_needs` is the same time from its own model of the job.
pub fn need_alone(snap: &crate::policy::Snapshot, k: usize) -> Option<f64> {
    let j = snap.jobs.get(k)?;
    if j.progress > 0.0 || j.current_gpus > 0 {
        return None;
    }
    let time = Some(snap.time_at(k, j.requested_gpus))
        .filter(|t| t.is_finite())
        .or_else(|| {
            snap.allocations
                .iter()
                .zip(&j.remaining_s)
                .find(|&(&a, t)| a > 0 && a >= j.min_gpus && t.is_finite())
                .map(|(_, &t)| t)
        })?;
    Some(time + j.restart_s)
}

/// GPUs per second a live job deserves: an equal share of the cluster, at
/// most what it asked for — Themis's deserved service, accumulated by the
/// service plan by plan and by fmsim as time passes.
pub fn fair_share(total_gpus: u32, live_jobs: usize, requested_gpus: u32) -> f64 {
    if live_jobs == 0 {
        return 0.0;
    }
    (f64::from(total_gpus) / live_jobs as f64).min(f64::from(requested_gpus))
}

/// One node as the round sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub id: String,
    /// Number of GPUs (addressed `0..gpus`).
    pub gpus: u32,
    pub state: NodeState,
    /// Nothing stays or starts there: its GPUs report Xid or uncorrectable
    /// ECC errors, or an operator drains it (its jobs move off from their
    /// checkpoints).
    pub drained: bool,
    /// An operator cordoned it: what runs there stays, nothing new starts
    /// (no new group, no new profiling run).
    pub cordoned: bool,
    /// Its GPUs' family (`V100`, `A100`, `H100`, or the name as reported
    /// for others; see `fmsched_estimator::analytic::gpu_family`). A group
    /// never spans two families.
    pub gpu_model: String,
    /// An inference server on loan to training (Lyra): in the whitelist
    /// until a reclaim returns it.
    pub loaned: bool,
    /// Memory of one of its GPUs, GiB (0: unknown; no GPU is shared
    /// there, [`crate::policy::may_share`]).
    pub gpu_memory_gib: f64,
}

/// One live job (submitted, profiling, queued or running).
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    pub id: String,
    pub state: JobState,
    pub model: String,
    pub task: String,
    /// May be merged with other users' jobs (Ymir §9).
    pub sharing: bool,
    pub pipeline: bool,
    /// Expert-parallel group size (`resources.expert_parallel`; 0 or 1 =
    /// none): whole groups, each on one node.
    pub expert_parallel: u32,
    /// GPUs of one worker of an elastic job
    /// (`resources.workers.gpus_per_worker`; 0 or 1 = one): whole workers,
    /// each on one node.
    pub worker_gpus: u32,
    /// The GPU family it must run on (`resources.gpu_model`, as a family);
    /// None = any, one family per group.
    pub gpu_model: Option<String>,
    /// GPU families of the cluster it cannot run on at all (one replica's
    /// memory does not fit there; the caller asks the throughput table,
    /// `Lut::runs_on`): it is never placed, profiled or estimated there.
    pub unfit_families: Vec<String>,
    pub min_gpus: u32,
    pub max_gpus: u32,
    /// GPUs it asks for (baselines give this; its deserved share is capped
    /// by it).
    pub requested_gpus: u32,
    /// Submission time, seconds on the view's clock.
    pub submitted_at: f64,
    /// Iterations done (named in reasons only).
    pub iteration: u64,
    /// Fraction of its work done, in [0, 1].
    pub progress: f64,
    pub attained_gpu_s: f64,
    pub executed_s: f64,
    pub fair_share_gpu_s: f64,
    /// Its lease runs until this time (seconds on the view's clock; leasing
    /// policies only).
    pub lease_until: f64,
    /// Seconds a (re)start costs it ([`restart_cost`]).
    pub restart_s: f64,
    /// GPUs it holds in the current intent (empty = none).
    pub holds: Vec<Gpu>,
    /// Those GPUs run its profiling run, not its training.
    pub profiling_run: bool,
    /// Waits outside this round (retry backoff; a spatial pair split this
    /// round waits for its joint process's checkpoint).
    pub held_back: bool,
    /// Took part in a merge before: a job merges once.
    pub ever_merged: bool,
    /// Its process-wide training settings (precision, checkpointing, PETL,
    /// frozen layers; [`crate::job::JobSpec::merge_setup`]): only jobs
    /// that train alike merge.
    pub merge_setup: String,
    /// Its reward steps (UniSched, [`crate::slo::reward_steps`]) on the
    /// view's clock; empty for a best-effort job.
    pub deadlines: Vec<RewardStep>,
    /// Its queue (`""`: no queues configured; [`crate::queue`]).
    pub queue: String,
    /// Priority within its queue (higher first; default 0).
    pub priority: i32,
    /// May be suspended once running (default true). A running
    /// non-preemptible job keeps its GPUs outside the policy and is never
    /// merged.
    pub preemptible: bool,
    /// What its process takes of one GPU alone (ICEFROG Eq. 8's inputs);
    /// None: unknown, it never shares a GPU.
    pub footprint: Option<GpuFootprint>,
    /// Scheduled without a profiling run of its own
    /// ([`crate::job::JobSpec::skips_profiling`]: a prompt-tuning job).
    pub skip_profiling: bool,
    /// For a job that trains now: its time on each other GPU family at the
    /// GPUs it holds, relative to its time where it runs (1: as fast; 0.5:
    /// twice as fast), from the caller's throughput table; for one that
    /// holds none, at its smallest allocation, relative to the family its
    /// times are estimated on. Empty: unknown (it is never moved for
    /// speed, and placed on any family). See [`SchedJob::family_time_ratio`].
    pub family_time_ratio: Vec<(String, f64)>,
}

impl JobView {
    /// GPUs that must sit together on one node.
    pub fn replica(&self) -> Replica {
        Replica::of(self.pipeline, self.expert_parallel).with_workers(self.worker_gpus)
    }

    /// Its (first, full-reward) deadline, seconds after `now`; `None`
    /// without one.
    pub fn deadline_in(&self, now: f64) -> Option<f64> {
        self.deadlines.first().map(|s| s.by - now)
    }
}

/// An active merge of two live jobs (indices into [`ClusterView::jobs`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MergeView {
    pub a: usize,
    pub b: usize,
    pub mode: MergeMode,
}

/// What a round knows about the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterView {
    /// Seconds on the view's clock (virtual in fmsim; the service counts
    /// from the round's start, so `now = 0`).
    pub now: f64,
    pub nodes: Vec<NodeView>,
    pub jobs: Vec<JobView>,
    pub merges: Vec<MergeView>,
    /// Finished jobs whose output weights a new job may start from (a
    /// warm start, [`WarmKey`]); empty: none are offered. The caller lists
    /// at most one per model, task, training setup and queue (the most
    /// recent): the published transfer figures are per pair of tasks, so
    /// a second job of the same task adds a candidate and nothing else.
    pub finished: Vec<FinishedView>,
}

/// A finished job whose output weights are kept: what a warm start from
/// it needs to know ([`WarmKey`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedView {
    pub id: String,
    pub model: String,
    pub task: String,
    /// Its user let other users' jobs use its work (as for a merge, Ymir §9).
    pub sharing: bool,
    pub pipeline: bool,
    /// [`JobView::merge_setup`]: only weights trained alike are a start.
    pub merge_setup: String,
    pub queue: String,
}

/// Settings of a round that are not the policy's.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundConfig {
    /// New jobs profile before they are scheduled (Ymir Fig. 6 step 2).
    pub profiling: bool,
    /// Build merge candidates (for a policy that merges).
    pub merging: bool,
    /// The most nodes one group may span for the executor to run it (None:
    /// any). With `Some(1)` a job is offered at most the largest node's GPUs
    /// and one that needs more is reported as unschedulable.
    pub max_nodes_per_group: Option<usize>,
    pub placement_rule: PlacementRule,
    /// Policy name, for the reasons written on jobs.
    pub policy: String,
    /// The share of the cluster's GPUs profiling runs may take from
    /// training (at least one GPU); free GPUs are always used first.
    pub profiling_share: f64,
    /// Queues with quotas (empty: none; [`crate::queue`]).
    pub queues: Queues,
}

/// Profiling may take an eighth of the cluster from training by default.
pub const DEFAULT_PROFILING_SHARE: f64 = 0.125;

impl Default for RoundConfig {
    fn default() -> Self {
        Self {
            profiling: true,
            merging: true,
            max_nodes_per_group: None,
            placement_rule: PlacementRule::Pack,
            policy: "ymir".into(),
            profiling_share: DEFAULT_PROFILING_SHARE,
            queues: Queues::default(),
        }
    }
}

/// GPUs held for a job's profiling run.
#[derive(Clone, Debug, PartialEq)]
pub struct Reservation {
    pub job: usize,
    pub gpus: Vec<Gpu>,
    /// Reserved this round (else kept from an earlier one).
    pub new: bool,
}

/// A warm start: view job `job`, which has not trained, starting from the
/// output weights of `view.finished[from]` — temporal transfer (Ymir
/// Fig. 2b: "task B is fine-tuned from the FM fine-tuned previously on
/// another task A") from an A that is already done. B waits for nothing
/// and A pays nothing, so the only question is whether B's time from those
/// weights beats its time from the pre-trained ones
/// ([`chosen_warm_starts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WarmKey {
    pub job: usize,
    pub from: usize,
}

/// A pair of jobs (view indices) and how they would merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PairKey {
    pub a: usize,
    pub b: usize,
    pub mode: MergeMode,
}

/// The first phase's result: what the caller must estimate, and what
/// [`decide`] needs besides.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// View node of each snapshot node (Offline nodes and nodes without
    /// GPUs are left out).
    pub nodes: Vec<usize>,
    /// Each snapshot node's GPUs for the policy.
    pub capacity: Vec<u32>,
    pub profiling: Vec<Reservation>,
    /// View job of each snapshot job.
    pub jobs: Vec<usize>,
    /// The policy's allocation set up to the widest size a job of the round
    /// may take; estimated times are indexed like it.
    pub allocations: Vec<u32>,
    /// Merges kept from earlier rounds (indices into `view.merges`): both
    /// jobs are in the snapshot.
    pub kept: Vec<usize>,
    /// Pairs eligible for a new merge, in the order candidates are built.
    pub eligible: Vec<PairKey>,
    /// Warm starts the caller may estimate: an unstarted job of the round
    /// from a finished job's output weights ([`ClusterView::finished`]).
    pub warm: Vec<WarmKey>,
    /// Jobs no node can hold under the executor's rule, and why.
    pub unschedulable: Vec<(usize, String)>,
    /// GPUs of each node the round may use (not Offline), per GPU family,
    /// largest first.
    pub family_nodes: BTreeMap<String, Vec<u32>>,
    /// GPUs of every node that is not Offline.
    pub total_gpus: u32,
    /// Running non-preemptible jobs that keep their GPUs outside the policy
    /// (view jobs; their GPUs are out of `capacity`).
    pub pinned: Vec<usize>,
    /// The most GPUs a snapshot job may get under its queue's share (view
    /// job → GPUs; only where below its own maximum).
    pub caps: BTreeMap<usize, u32>,
    /// Jobs the quota pass keeps out of this round, and why (view jobs).
    pub queue_out: Vec<(usize, String)>,
    /// Each queue's deserved GPUs this round (what the quota pass
    /// computed).
    pub deserved: BTreeMap<String, u32>,
    /// GPUs each queue's candidate jobs could use this round (a rigid
    /// policy's jobs count at their requested size).
    pub demand: BTreeMap<String, u32>,
    /// For a rigid policy: GPUs each queue's snapshot jobs may hold
    /// together (what it deserves less its pinned jobs' GPUs); the policy
    /// picks among them in its own order. Empty otherwise.
    pub budgets: BTreeMap<String, u32>,
    /// Waiting jobs left to a rigid policy beyond their queue's share, and
    /// why they wait if it does not start them (view jobs).
    pub queue_short: Vec<(usize, String)>,
}

impl Prepared {
    /// GPUs job `j` asking for `gpus` is offered: at most what one GPU
    /// family it may run on holds ([`offered`]).
    pub fn offered(&self, cfg: &RoundConfig, gpus: u32, j: &JobView) -> u32 {
        offered(
            cfg,
            &self.family_nodes,
            gpus,
            j.gpu_model.as_deref(),
            &j.unfit_families,
        )
    }
}

/// GPUs a job asking for `gpus` is offered. A group runs on one GPU
/// family (its `gpu_model` if it names one, else any its model fits, not
/// those of `unfit`), on at most `max_nodes_per_group` of that family's
/// nodes: at most the most GPUs such a set of nodes holds. Offered more, a
/// policy plans a size no placement can hold, and the job waits on a
/// cluster with room for it (4 A100s and 4 H100s: planned on 8).
fn offered(
    cfg: &RoundConfig,
    family_nodes: &BTreeMap<String, Vec<u32>>,
    gpus: u32,
    gpu_model: Option<&str>,
    unfit: &[String],
) -> u32 {
    let span = cfg.max_nodes_per_group.unwrap_or(usize::MAX);
    let most = family_nodes
        .iter()
        .filter(|(f, _)| gpu_model.is_none_or(|m| m == f.as_str()) && !unfit.contains(f))
        .map(|(_, sizes)| sizes.iter().take(span).sum::<u32>())
        .max()
        .unwrap_or(0);
    gpus.min(most)
}

/// A candidate merge as the caller estimated it.
#[derive(Clone, Debug, PartialEq)]
pub struct PairEstimate {
    pub pair: PairKey,
    /// Seconds of the merged part at each allocation: `T_{A↦B}` (B from A's
    /// weights) for a temporal pair, `T_{A‖B}` (the joint job, Ymir Eq. 4)
    /// for a spatial one.
    pub seconds: Vec<f64>,
    /// `TranWt` at each allocation (Ymir Eq. 12–13).
    pub tran_wt: Vec<f64>,
    /// Predicted gains the merge is decided on (recorded with it).
    pub gain_ab: f64,
    pub gain_ba: f64,
}

/// A warm start as the caller estimated it.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmEstimate {
    pub key: WarmKey,
    /// The job's remaining seconds from those weights at each allocation
    /// (`T_{A↦B}` with A done).
    pub seconds: Vec<f64>,
    /// The predicted transfer gain `G_{A,B}` (Ymir Eq. 1) behind them,
    /// recorded with the start.
    pub gain: f64,
}

/// A warm start the round decided: view job `job` starts training this
/// round from the output weights of `view.finished[from]`.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmStart {
    pub job: usize,
    pub from: usize,
    pub gain: f64,
}

/// The caller's estimates for a [`Prepared`] round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Estimates {
    /// Per snapshot job: remaining seconds alone at each allocation
    /// (`T_{i,a}`, Ymir Eq. 5; `+∞` where it cannot run).
    pub jobs: Vec<Vec<f64>>,
    /// Per kept merge (in `Prepared::kept` order): the merged part's seconds
    /// as in [`PairEstimate::seconds`].
    pub kept: Vec<Vec<f64>>,
    /// The eligible pairs the caller could estimate (others are not
    /// candidates this round).
    pub candidates: Vec<PairEstimate>,
    /// The warm starts of [`Prepared::warm`] the caller could estimate.
    pub warm: Vec<WarmEstimate>,
    /// Per snapshot job: the relative spread of its remaining time, `(p90 −
    /// p10) / p50` of the estimator's prediction (0: sure, or unknown;
    /// empty: 0 for every job). See [`SchedJob::spread`].
    pub spread: Vec<f64>,
    /// Per kept merge (in `Prepared::kept` order): B's remaining seconds
    /// at each allocation were it to train alone, from scratch — its time
    /// if the merge were split (a merged B's row in `jobs` is its time from
    /// A's weights). An empty row (or none at all): not known, and the
    /// merge is never released ([`RoundOutcome::released`]).
    pub kept_b_alone: Vec<Vec<f64>>,
}

/// A group that holds GPUs after the round.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// View jobs: one, or A then B of a merge.
    pub jobs: Vec<usize>,
    pub mode: MergeMode,
    /// Concrete GPUs, sorted.
    pub gpus: Vec<Gpu>,
    /// It holds exactly these GPUs already (no restart).
    pub kept: bool,
    /// The merge was decided this round: the predicted gains it rests on.
    pub new_merge: Option<(f64, f64)>,
}

impl Group {
    /// The jobs whose processes train on the group's GPUs: both of a
    /// spatial pair (one joint process), only A of a temporal pair (B waits
    /// for A's output weights).
    pub fn trainers(&self) -> &[usize] {
        if self.mode == MergeMode::Temporal {
            &self.jobs[..1]
        } else {
            &self.jobs
        }
    }

    /// The trainers that (re)start on the group's GPUs this round: none
    /// of a kept group; of a shared GPU, the sharers that were not on it.
    pub fn starts<'a>(&'a self, view: &'a ClusterView) -> impl Iterator<Item = usize> + 'a {
        self.trainers().iter().copied().filter(move |&i| {
            let stays = self.mode == MergeMode::Shared && holds_exactly(&view.jobs[i], &self.gpus);
            !(self.kept || stays)
        })
    }

    /// The nodes it spans, in order.
    pub fn nodes(&self) -> Vec<usize> {
        let mut n: Vec<usize> = self.gpus.iter().map(|g| g.0).collect();
        n.dedup();
        n
    }
}

/// A job state change the round decided, with the reason written on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub job: usize,
    pub to: JobState,
    pub reason: String,
}

/// Everything a round decided, in view terms.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundOutcome {
    pub groups: Vec<Group>,
    pub profiling: Vec<Reservation>,
    pub transitions: Vec<Transition>,
    /// Leases after the round (job, until), for leasing policies.
    pub leases: Vec<(usize, f64)>,
    pub unschedulable: Vec<(usize, String)>,
    /// Jobs the policy placed where the executor cannot run them (they
    /// wait), and why.
    pub unexecutable: Vec<(usize, String)>,
    /// Waiting jobs the plan ran and placement found no room for (counted
    /// in `stats.unplaced`), and why.
    pub unplaced: Vec<(usize, String)>,
    /// Trainers that start, resume or move (each costs a restart).
    pub switches: usize,
    /// The policy's counters (variables, fallback, unplaced groups).
    pub stats: SolveStats,
    /// Snapshot jobs that hold no GPUs after the round.
    pub queued: usize,
    /// Kept temporal merges (indices into `view.merges`) whose B, still
    /// waiting behind an A that has trained, would finish sooner alone:
    /// the caller splits them before the next round ([`released_merges`]).
    pub released: Vec<usize>,
    /// Jobs that start training this round from a finished job's weights
    /// ([`chosen_warm_starts`]); the caller launches them from those
    /// weights and watches them as B of a temporal merge (the merge guard).
    pub warm_starts: Vec<WarmStart>,
}

/// A round that could not be decided.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RoundError {
    #[error("estimates do not match the prepared round: {0}")]
    Estimates(String),
    #[error("the policy produced an inconsistent plan: {0}")]
    InconsistentPlan(String),
}

// ---- 1. prepare ----------------------------------------------------------

/// Phase 1 (see the module docs).
pub fn prepare(view: &ClusterView, policy: &dyn Policy, cfg: &RoundConfig) -> Prepared {
    let present: Vec<usize> = (0..view.nodes.len())
        .filter(|&n| view.nodes[n].state != NodeState::Offline && view.nodes[n].gpus > 0)
        .collect();
    let total_gpus: u32 = present.iter().map(|&n| view.nodes[n].gpus).sum();
    let mut family_nodes: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for &n in &present {
        family_nodes
            .entry(view.nodes[n].gpu_model.clone())
            .or_default()
            .push(view.nodes[n].gpus);
    }
    for sizes in family_nodes.values_mut() {
        sizes.sort_unstable_by(|a, b| b.cmp(a));
    }
    let profiling = if cfg.profiling {
        reserve_profiling(view, &present, total_gpus, cfg.profiling_share)
    } else {
        Vec::new()
    };
    let reserved: BTreeSet<Gpu> = profiling.iter().flat_map(|r| r.gpus.clone()).collect();
    let mut capacity: Vec<u32> = present
        .iter()
        .map(|&n| {
            let node = &view.nodes[n];
            if node.drained {
                0
            } else if node.state == NodeState::Suspect || node.cordoned {
                // Suspect, it may only be late; cordoned, an operator holds
                // it: either way it keeps what it runs and gets nothing new.
                view.jobs
                    .iter()
                    .filter(|j| !j.profiling_run)
                    .flat_map(|j| &j.holds)
                    .filter(|g| g.0 == n)
                    .count() as u32
            } else {
                node.gpus - reserved.iter().filter(|g| g.0 == n).count() as u32
            }
        })
        .collect();

    let sizes = node_shapes(view, &present);
    let mut unschedulable = Vec::new();
    let mut jobs = Vec::new();
    for (i, j) in view.jobs.iter().enumerate() {
        let why = never_fits(
            j.replica(),
            j.min_gpus,
            j.gpu_model.as_deref(),
            &sizes,
            cfg.max_nodes_per_group,
        )
        .or_else(|| {
            fits_no_family_of(j, &sizes).then(|| unfit_reason(&j.model, &j.unfit_families))
        });
        if let Some(why) = why {
            // Said of a queued job, and of a submitted one that cannot
            // even profile here (the others say it once they are queued).
            let say = match j.state {
                JobState::Queued => true,
                JobState::Submitted => cfg.profiling && cannot_profile(j, &sizes),
                _ => false,
            };
            if say {
                unschedulable.push((i, format!("waiting: {why}")));
            }
            continue;
        }
        let unprofiled = cfg.profiling
            && !j.skip_profiling
            && matches!(j.state, JobState::Submitted | JobState::Profiling);
        if !(j.held_back || unprofiled || j.state.is_terminal()) {
            jobs.push(i);
        }
    }
    // Queues, priorities and preemption classes (crate::queue).
    let quota = {
        let sizes_of_policy = policy.allocation_set(total_gpus);
        let takes_work = |n: usize| {
            let node = &view.nodes[n];
            node.state != NodeState::Offline && !node.drained
        };
        let q: Vec<QuotaJob> = jobs
            .iter()
            .map(|&i| {
                let j = &view.jobs[i];
                let holds: Vec<&Gpu> = j.holds.iter().filter(|_| !j.profiling_run).collect();
                let cap = |g: u32| {
                    offered(
                        cfg,
                        &family_nodes,
                        g,
                        j.gpu_model.as_deref(),
                        &j.unfit_families,
                    )
                };
                let max_gpus = cap(j.max_gpus).max(j.min_gpus);
                // A rigid policy runs the job at its request or not at all
                // (as policy::requested_allocation picks it), so the queue
                // must find room for all of it.
                let (min_gpus, max_gpus) = if policy.rigid() {
                    let unit = j.replica().gpus().max(1);
                    let fits: Vec<u32> = sizes_of_policy
                        .iter()
                        .copied()
                        .filter(|&a| a > 0 && a >= j.min_gpus && a <= max_gpus && a % unit == 0)
                        .collect();
                    let size = crate::policy::nearest_request(&fits, cap(j.requested_gpus))
                        .unwrap_or(max_gpus);
                    // A running job counts at what it holds (a
                    // non-preemptive policy keeps it so).
                    let size = size.max(holds.len() as u32);
                    (size, size)
                } else {
                    (j.min_gpus, max_gpus)
                };
                QuotaJob {
                    queue: j.queue.clone(),
                    priority: j.priority,
                    preemptible: j.preemptible,
                    holds: holds.len() as u32,
                    may_stay: holds.iter().all(|g| takes_work(g.0)),
                    min_gpus,
                    max_gpus,
                    submitted_at: j.submitted_at,
                }
            })
            .collect();
        crate::queue::apply(&cfg.queues, &q, capacity.iter().sum(), policy.rigid())
    };
    let pinned: Vec<usize> = quota.pinned.iter().map(|&k| jobs[k]).collect();
    for &i in &pinned {
        for g in &view.jobs[i].holds {
            if let Some(k) = present.iter().position(|&n| n == g.0) {
                capacity[k] = capacity[k].saturating_sub(1);
            }
        }
    }
    let queue_out: Vec<(usize, String)> = quota
        .out
        .iter()
        .map(|(k, why)| (jobs[*k], why.clone()))
        .collect();
    let caps: BTreeMap<usize, u32> = quota.caps.iter().map(|(&k, &c)| (jobs[k], c)).collect();
    let queue_short: Vec<(usize, String)> = quota
        .short
        .iter()
        .map(|(k, why)| (jobs[*k], why.clone()))
        .collect();
    let budgets: BTreeMap<String, u32> = if policy.rigid() {
        quota
            .deserved
            .iter()
            .map(|(q, &d)| {
                let pinned: u32 = pinned
                    .iter()
                    .filter(|&&i| view.jobs[i].queue == *q)
                    .map(|&i| view.jobs[i].holds.len() as u32)
                    .sum();
                (q.clone(), d.saturating_sub(pinned))
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let gone: BTreeSet<usize> = pinned
        .iter()
        .copied()
        .chain(queue_out.iter().map(|o| o.0))
        .collect();
    jobs.retain(|i| !gone.contains(i));
    let ord: BTreeMap<usize, usize> = jobs.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let kept = (0..view.merges.len())
        .filter(|&m| ord.contains_key(&view.merges[m].a) && ord.contains_key(&view.merges[m].b))
        .collect();
    let (eligible, warm) = if cfg.merging && policy.merges() {
        (
            eligible_pairs(view, &jobs, &cfg.queues),
            if policy.warm_starts() {
                warm_keys(view, &jobs, &cfg.queues)
            } else {
                Vec::new()
            },
        )
    } else {
        (Vec::new(), Vec::new())
    };
    // No job of the round may run wider than its maximum (a merge, than
    // the larger of its jobs'), or hold more than it holds: the set stops
    // there. A datacenter's set has thousands of sizes (Ymir's {0,1,2,3,4m}
    // reaches 2,003 at 8,000 GPUs), every estimate row spans the whole set,
    // and a round's jobs use a handful of them.
    let widest = jobs
        .iter()
        .map(|&i| {
            let j = &view.jobs[i];
            j.max_gpus.max(j.min_gpus).max(j.holds.len() as u32)
        })
        .max()
        .unwrap_or(0);
    let allocations = policy
        .allocation_set(total_gpus)
        .into_iter()
        .filter(|&a| a <= widest)
        .collect();
    Prepared {
        nodes: present,
        capacity,
        profiling,
        jobs,
        allocations,
        kept,
        eligible,
        warm,
        unschedulable,
        family_nodes,
        total_gpus,
        pinned,
        caps,
        queue_out,
        deserved: quota.deserved,
        demand: quota.demand,
        budgets,
        queue_short,
    }
}

/// No node of the cluster can hold `job`'s profiling run (one GPU, or one
/// pipeline replica, of its GPU model).
fn cannot_profile(job: &JobView, nodes: &[(u32, &str)]) -> bool {
    never_fits(job.replica(), 1, job.gpu_model.as_deref(), nodes, None).is_some()
        || fits_no_family_of(job, nodes)
}

/// [`fits_no_family`] of a view job on these nodes.
fn fits_no_family_of(job: &JobView, nodes: &[(u32, &str)]) -> bool {
    let families: Vec<&str> = nodes.iter().map(|n| n.1).collect();
    fits_no_family(&families, job.gpu_model.as_deref(), &job.unfit_families)
}

/// Every GPU family of `families` (the cluster's, one per node or once)
/// that a job may use — its own `gpu_model`, if it names one — is one its
/// model does not fit (`unfit`, [`JobView::unfit_families`]). No family
/// (an empty cluster) says nothing. The service's round and fmsim's
/// workload check both ask this.
pub fn fits_no_family(families: &[&str], gpu_model: Option<&str>, unfit: &[String]) -> bool {
    !families.is_empty()
        && families
            .iter()
            .filter(|f| gpu_model.is_none_or(|m| m == **f))
            .all(|f| unfit.iter().any(|u| u == f))
}

/// Why a job fits no family: one replica of `model` does not fit the GPU
/// memory of `families`.
pub fn unfit_reason(model: &str, families: &[String]) -> String {
    format!(
        "one replica of {model} does not fit the GPU memory of {}",
        families.join(", ")
    )
}

/// `(GPUs, GPU family)` of these view nodes, for [`never_fits`].
fn node_shapes<'v>(view: &'v ClusterView, nodes: &[usize]) -> Vec<(u32, &'v str)> {
    nodes
        .iter()
        .map(|&n| (view.nodes[n].gpus, view.nodes[n].gpu_model.as_str()))
        .collect()
}

/// Why no set of these nodes (`(GPUs, GPU family)` each) can ever hold a
/// job of at least `min_gpus` in replicas of `replica` (each on one node),
/// on `gpu_model` or any one family, when a group may span
/// `max_nodes_per_group` nodes, or None if one can. An empty cluster holds nothing yet and says nothing
/// (nodes may still register). The service's round and fmsim's workload
/// check both ask this.
pub fn never_fits(
    replica: Replica,
    min_gpus: u32,
    gpu_model: Option<&str>,
    nodes: &[(u32, &str)],
    max_nodes_per_group: Option<usize>,
) -> Option<String> {
    if nodes.is_empty() {
        return None;
    }
    let mut families: Vec<&str> = nodes.iter().map(|n| n.1).collect();
    families.sort_unstable();
    families.dedup();
    if let Some(m) = gpu_model {
        if !families.contains(&m) {
            return Some(format!(
                "no node has GPU model {m} (the cluster has {})",
                families.join(", ")
            ));
        }
        families = vec![m];
    }
    let mut why = None;
    for fam in &families {
        let sizes: Vec<u32> = nodes.iter().filter(|n| n.1 == *fam).map(|n| n.0).collect();
        let w = never_fits_sizes(replica, min_gpus, &sizes, max_nodes_per_group)?;
        why.get_or_insert(if families.len() > 1 || gpu_model.is_some() {
            format!("{w} (on {fam} nodes; a job runs on one GPU model)")
        } else {
            w
        });
    }
    why
}

/// The GPU family and node size a job's times are estimated on: a job's
/// remaining time at each allocation is one number per round, not one per
/// family, so it is estimated on the family it asks for; else the one it
/// holds GPUs on now (keeping them costs nothing); else the cluster's
/// ([`default_shape`]). The node size is that family's largest present
/// node. None when no node of the family is present. The service's
/// estimates and fmsim's ask this.
pub fn estimate_shape(view: &ClusterView, job: &JobView) -> Option<(String, u32)> {
    if job.gpu_model.is_none() {
        let held = job
            .holds
            .first()
            .and_then(|g| view.nodes.get(g.0))
            .filter(|n| !job.unfit_families.contains(&n.gpu_model));
        if let Some(shape) = held.and_then(|n| largest_of(&view.nodes, &n.gpu_model)) {
            return Some(shape);
        }
    }
    default_shape(&view.nodes, job.gpu_model.as_deref(), &job.unfit_families)
}

/// [`estimate_shape`] of a job that holds no GPUs: the family it asks for,
/// else the one with the most GPUs on nodes that are not Offline among
/// those it can run on (not in `unfit`; ties: the first by name), and that
/// family's largest present node.
pub fn default_shape(
    nodes: &[NodeView],
    gpu_model: Option<&str>,
    unfit: &[String],
) -> Option<(String, u32)> {
    if let Some(m) = gpu_model {
        return largest_of(nodes, m);
    }
    let mut gpus: BTreeMap<&str, u32> = BTreeMap::new();
    for n in nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && n.gpus > 0 && !unfit.contains(&n.gpu_model))
    {
        *gpus.entry(n.gpu_model.as_str()).or_default() += n.gpus;
    }
    // max_by_key keeps the last of equals: walk the names backwards.
    let (family, _) = gpus.iter().rev().max_by_key(|e| *e.1)?;
    largest_of(nodes, family)
}

/// Fills [`JobView::family_time_ratio`] of each job that trains alone or
/// waits to, or is in a temporal merge (it is in no spatial merge and
/// names no GPU model): its time on every
/// other GPU family of the cluster at the GPUs it holds (B of a temporal
/// merge: at the GPUs its A holds, where it will train), relative to its
/// time where it runs, for placement's move to a faster family; for a job
/// that holds none (or holds a profiling run's), at its smallest
/// allocation relative to the family its times are estimated on
/// ([`default_shape`]), for placement's choice of family.
/// `time(v, family, gpus, per_node)` is job `v`'s time (any unit)
/// on `gpus` GPUs of `family` packed on nodes of `per_node` (each family's
/// largest present node, as estimates pack on it); `None` where it is not
/// known or cannot run, and for a job its caller keeps where it is.
/// Nothing on a cluster of one family. fmsim reads the times from the
/// throughput table its progress comes from, the service from the table
/// its estimates come from.
pub fn family_time_ratios<E>(
    view: &mut ClusterView,
    mut time: impl FnMut(usize, &str, u32, u32) -> Result<Option<f64>, E>,
) -> Result<(), E> {
    let families: BTreeSet<&str> = view
        .nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && n.gpus > 0)
        .map(|n| n.gpu_model.as_str())
        .collect();
    if families.len() < 2 {
        return Ok(());
    }
    let per_node: BTreeMap<String, u32> = families
        .iter()
        .filter_map(|&f| largest_of(&view.nodes, f))
        .collect();
    let spatial: BTreeSet<usize> = view
        .merges
        .iter()
        .filter(|m| m.mode != MergeMode::Temporal)
        .flat_map(|m| [m.a, m.b])
        .collect();
    // B of a temporal merge trains on A's GPUs once A is done: its times
    // are on those.
    let lead: BTreeMap<usize, usize> = view
        .merges
        .iter()
        .filter(|m| m.mode == MergeMode::Temporal)
        .map(|m| (m.b, m.a))
        .collect();
    let usable = |t: Option<f64>| t.filter(|t| t.is_finite() && *t > 0.0);
    for v in 0..view.jobs.len() {
        let j = &view.jobs[v];
        if j.gpu_model.is_some() || spatial.contains(&v) {
            continue;
        }
        // A profiling run's GPUs are not where the job will train.
        let holder = lead.get(&v).map_or(j, |&a| &view.jobs[a]);
        let training = holder.holds.first().filter(|_| !holder.profiling_run);
        let (here, gpus) = match training {
            Some(g) => match view.nodes.get(g.0) {
                Some(n) => (n.gpu_model.clone(), holder.holds.len() as u32),
                None => continue,
            },
            // One that holds none: against the family its times are
            // estimated on, at its smallest allocation.
            None => match default_shape(&view.nodes, None, &j.unfit_families) {
                Some((family, _)) => (family, j.min_gpus.max(j.replica().gpus()).max(1)),
                None => continue,
            },
        };
        let Some(&own_node) = per_node.get(&here) else {
            continue;
        };
        let Some(own) = usable(time(v, &here, gpus, own_node)?) else {
            continue;
        };
        let mut ratios = Vec::new();
        for (f, &node) in &per_node {
            if *f != here
                && !j.unfit_families.contains(f)
                && let Some(t) = usable(time(v, f, gpus, node)?)
            {
                ratios.push((f.clone(), t / own));
            }
        }
        view.jobs[v].family_time_ratio = ratios;
    }
    Ok(())
}

/// `family` and the GPUs of its largest node that is not Offline.
fn largest_of(nodes: &[NodeView], family: &str) -> Option<(String, u32)> {
    nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && n.gpu_model == family)
        .map(|n| n.gpus)
        .max()
        .filter(|&g| g > 0)
        .map(|g| (family.to_string(), g))
}

/// [`never_fits`] on nodes of one family.
fn never_fits_sizes(
    replica: Replica,
    min_gpus: u32,
    node_gpus: &[u32],
    max_nodes_per_group: Option<usize>,
) -> Option<String> {
    let largest = node_gpus.iter().copied().max()?;
    let total: u32 = node_gpus.iter().sum();
    match replica {
        Replica::Pipeline if !crate::policy::pipeline_fits(node_gpus.iter().copied()) => {
            return Some(format!(
                "a pipeline-parallel job needs {} GPUs on one node (one replica of its {} stages) and the largest node has {largest}",
                crate::policy::PIPELINE_STAGES,
                crate::policy::PIPELINE_STAGES
            ));
        }
        Replica::Experts(ep) if ep > largest => {
            return Some(format!(
                "an expert-parallel job needs {ep} GPUs on one node (one group of its experts) and the largest node has {largest}"
            ));
        }
        Replica::Worker(g) if g > largest => {
            return Some(format!(
                "a worker of this elastic job needs {g} GPUs on one node and the largest node has {largest}"
            ));
        }
        _ => {}
    }
    if max_nodes_per_group == Some(1) && min_gpus > largest {
        return Some(format!(
            "needs at least {min_gpus} GPUs on one node and the largest node has {largest} (jobs do not span nodes here)"
        ));
    }
    if min_gpus > total {
        return Some(format!(
            "needs at least {min_gpus} GPUs and the cluster has {total}"
        ));
    }
    None
}

/// Profiling reservations: kept ones (job still profiling, every GPU on a
/// usable node) and new ones for submitted jobs, oldest first — one
/// replica on one node ([`JobView::replica`]: 1 GPU, a pipeline's 4 stages
/// as Ymir §5.2 profiles them, or an expert group), on the GPU model it
/// asks for. Free GPUs first; GPUs held by training only
/// while profiling holds at most `share` of the cluster (at least one
/// GPU; [`RoundConfig::profiling_share`]). The first job
/// that finds no GPUs stops the walk (later ones do not overtake it); a
/// job the cluster can never hold is passed over.
fn reserve_profiling(
    view: &ClusterView,
    present: &[usize],
    total_gpus: u32,
    share: f64,
) -> Vec<Reservation> {
    let usable = |n: usize| view.nodes[n].state == NodeState::Available && !view.nodes[n].drained;
    let mut out: Vec<Reservation> = view
        .jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| {
            j.state == JobState::Profiling
                && j.profiling_run
                && !j.holds.is_empty()
                && j.holds
                    .iter()
                    .all(|g| g.0 < view.nodes.len() && usable(g.0))
        })
        .map(|(i, j)| Reservation {
            job: i,
            gpus: j.holds.clone(),
            new: false,
        })
        .collect();
    let cap = ((f64::from(total_gpus) * share.clamp(0.0, 1.0)).floor() as usize).max(1);
    let busy: BTreeSet<Gpu> = view
        .jobs
        .iter()
        .filter(|j| !j.profiling_run)
        .flat_map(|j| j.holds.iter().copied())
        .collect();
    // GPUs of running non-preemptible jobs are never taken for profiling
    // (crate::queue pins them).
    let mut taken: BTreeSet<Gpu> = out
        .iter()
        .flat_map(|r| r.gpus.clone())
        .chain(
            view.jobs
                .iter()
                .filter(|j| !j.profiling_run && !j.preemptible)
                .flat_map(|j| j.holds.iter().copied()),
        )
        .collect();
    let mut waiting: Vec<usize> = (0..view.jobs.len())
        .filter(|&i| view.jobs[i].state == JobState::Submitted && !view.jobs[i].skip_profiling)
        .collect();
    waiting.sort_by(|&x, &y| {
        view.jobs[x]
            .submitted_at
            .total_cmp(&view.jobs[y].submitted_at)
            .then(x.cmp(&y))
    });
    let shapes = node_shapes(view, present);
    for i in waiting {
        let j = &view.jobs[i];
        if cannot_profile(j, &shapes) {
            // It can never run here (the round says why): it must not
            // hold up the jobs behind it.
            continue;
        }
        // One replica: a pipeline's stages, an expert group, or 1 GPU.
        let need = j.replica().gpus() as usize;
        let on_its_gpus = |n: usize| {
            j.gpu_model
                .as_deref()
                .is_none_or(|m| view.nodes[n].gpu_model == m)
                && !j.unfit_families.contains(&view.nodes[n].gpu_model)
        };
        let used_now: usize = out.iter().map(|r| r.gpus.len()).sum();
        let mut pick = None;
        for prefer_free in [true, false] {
            if !prefer_free && used_now + need > cap {
                break;
            }
            pick = present
                .iter()
                .filter(|&&n| usable(n) && !view.nodes[n].cordoned && on_its_gpus(n))
                .find_map(|&n| {
                    let gpus: Vec<Gpu> = (0..view.nodes[n].gpus)
                        .map(|g| (n, g))
                        .filter(|g| !taken.contains(g) && (!prefer_free || !busy.contains(g)))
                        .take(need)
                        .collect();
                    (gpus.len() == need).then_some(gpus)
                });
            if pick.is_some() {
                break;
            }
        }
        let Some(gpus) = pick else { break };
        taken.extend(gpus.iter().copied());
        out.push(Reservation {
            job: i,
            gpus,
            new: true,
        });
    }
    out
}

/// Pairs that may merge (Ymir §5, the filter before any estimate): both in
/// the snapshot, one model, different tasks, both allow sharing, both
/// data-parallel or both pipeline (of one expert-parallel degree), no two
/// different GPU models asked for, the same training setup (precision,
/// checkpointing, PETL, frozen layers: one process trains a spatial pair,
/// and A's weights start B of a temporal one), neither merged before;
/// neither of a spatial pair started (one new process trains both from
/// the start), B of a temporal one not started (it starts from A's
/// weights). A of a temporal pair may have trained, running or suspended:
/// B then waits for what A has left. Without that, a job that started alone
/// a moment before a partner arrived could never lead it, and a round on
/// every arrival (which starts each job at once) would merge far less.
/// Per model, for every ordered pair: `A ↦ B`, and `A ‖ B` once.
fn eligible_pairs(view: &ClusterView, snapshot_jobs: &[usize], queues: &Queues) -> Vec<PairKey> {
    let mut by_model: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &i in snapshot_jobs {
        let j = &view.jobs[i];
        // A merge suspends and restarts its jobs: never a non-preemptible one.
        if open_for_merge(j) {
            by_model.entry(j.model.as_str()).or_default().push(i);
        }
    }
    let mut out = Vec::new();
    for group in by_model.values() {
        for (x, &a) in group.iter().enumerate() {
            for (y, &b) in group.iter().enumerate() {
                if a == b || !may_pair(view, a, b, queues) {
                    continue;
                }
                if unstarted(&view.jobs[b]) {
                    out.push(PairKey {
                        a,
                        b,
                        mode: MergeMode::Temporal,
                    });
                }
                if x < y && unstarted(&view.jobs[a]) && unstarted(&view.jobs[b]) {
                    out.push(PairKey {
                        a,
                        b,
                        mode: MergeMode::Spatial,
                    });
                }
            }
        }
    }
    out
}

/// The per-job half of [`eligible_pairs`]' filter: sharing, preemptible (a
/// merge may suspend and restart its jobs), never merged.
fn open_for_merge(j: &JobView) -> bool {
    j.sharing && j.preemptible && !j.ever_merged
}

/// Not trained yet: both jobs of a spatial pair, B of a temporal one.
fn unstarted(j: &JobView) -> bool {
    j.progress == 0.0
}

/// The pairwise half of [`eligible_pairs`]' filter.
fn may_pair(view: &ClusterView, a: usize, b: usize, queues: &Queues) -> bool {
    let (ja, jb) = (&view.jobs[a], &view.jobs[b]);
    ja.model == jb.model
        && ja.task != jb.task
        && ja.replica() == jb.replica()
        && ja.merge_setup == jb.merge_setup
        && queues.may_merge(&ja.queue, &jb.queue)
        && crate::policy::same_gpus(ja.gpu_model.as_deref(), jb.gpu_model.as_deref())
}

/// Whether `pair` is one [`eligible_pairs`] lists for the snapshot jobs
/// `ord` (job → snapshot index), decided for the one pair: the list is
/// quadratic in the jobs of a model (millions of pairs at thousands of
/// queued jobs), the candidates are not.
fn is_eligible(
    view: &ClusterView,
    ord: &BTreeMap<usize, usize>,
    queues: &Queues,
    pair: &PairKey,
) -> bool {
    let (Some(&x), Some(&y)) = (ord.get(&pair.a), ord.get(&pair.b)) else {
        return false;
    };
    pair.a != pair.b
        && open_for_merge(&view.jobs[pair.a])
        && open_for_merge(&view.jobs[pair.b])
        && may_pair(view, pair.a, pair.b, queues)
        && unstarted(&view.jobs[pair.b])
        && match pair.mode {
            MergeMode::Temporal => true,
            MergeMode::Spatial => x < y && unstarted(&view.jobs[pair.a]),
            // Sharing a GPU is the policy's pick, not a merge candidate.
            MergeMode::Normal | MergeMode::Shared => false,
        }
}

/// The warm starts of a round ([`WarmKey`]): each snapshot job open for a
/// merge (sharing, preemptible, never merged) that has not trained and
/// does not train now, from each finished job of the same model and
/// another task whose user shares its work, trained alike (same training
/// setup and pipeline layout), in a queue it may merge with.
fn warm_keys(view: &ClusterView, snapshot_jobs: &[usize], queues: &Queues) -> Vec<WarmKey> {
    let mut out = Vec::new();
    if view.finished.is_empty() {
        return out;
    }
    for &job in snapshot_jobs {
        let j = &view.jobs[job];
        if !open_for_merge(j) || !unstarted(j) || is_training(j) {
            continue;
        }
        for (from, f) in view.finished.iter().enumerate() {
            if f.sharing
                && f.model == j.model
                && f.task != j.task
                && f.pipeline == j.pipeline
                && f.merge_setup == j.merge_setup
                && queues.may_merge(&f.queue, &j.queue)
            {
                out.push(WarmKey { job, from });
            }
        }
    }
    out.sort_unstable();
    out
}

/// The warm start each job of the round takes (view job → index into
/// `estimates.warm`): of its estimated ones, the one with the highest
/// `TranWt` — Ymir Eq. 12 with A already done (`T_A = 0`), `T_B / T_{A↦B}`,
/// at its best allocation — if that gains (`TranWt > 1`,
/// [`crate::policy::merge_gains`], as a merge must). The start is
/// free to B (nothing to wait for) and to A (done), so the best one is
/// taken before the policy runs: the job's times in the snapshot are then
/// its times from those weights, and a merge candidate it is in is
/// weighed against them (its TranWt again, [`candidates`]). It starts from
/// those weights if it starts outside a merge; merged, it trains as the
/// pair's times say.
/// Ties go to the earlier estimate.
pub fn chosen_warm_starts(prepared: &Prepared, estimates: &Estimates) -> BTreeMap<usize, usize> {
    let mut best: BTreeMap<usize, (usize, f64)> = BTreeMap::new();
    if estimates.warm.is_empty() {
        return BTreeMap::new();
    }
    let ord: BTreeMap<usize, usize> = prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k))
        .collect();
    for (w, e) in estimates.warm.iter().enumerate() {
        let Some(cold) = ord.get(&e.key.job).and_then(|&k| estimates.jobs.get(k)) else {
            continue;
        };
        // Eq. 12, T_A = 0: (2·min(0, T_B) + max(0, T_B)) / (2·0 + T_{A↦B}).
        let tran_wt = cold
            .iter()
            .zip(&e.seconds)
            .filter(|(tb, tab)| tb.is_finite() && tab.is_finite() && **tab > 0.0)
            .map(|(tb, tab)| tb / tab)
            .fold(0.0, f64::max);
        if crate::policy::merge_gains(tran_wt)
            && best.get(&e.key.job).is_none_or(|&(_, b)| tran_wt > b)
        {
            best.insert(e.key.job, (w, tran_wt));
        }
    }
    best.into_iter().map(|(j, (w, _))| (j, w)).collect()
}

// ---- 2. decide -----------------------------------------------------------

/// What [`decide`] returns: the snapshot the policy saw, its plan, and the
/// outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub snapshot: Snapshot,
    pub plan: Plan,
    pub outcome: RoundOutcome,
}

/// Phases 2 and 3 (see the module docs).
pub fn decide(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    policy: &dyn Policy,
    cfg: &RoundConfig,
) -> Result<Decision, RoundError> {
    let chosen = chosen_warm_starts(prepared, estimates);
    let snapshot = snapshot_with(view, prepared, estimates, cfg, &chosen)?;
    let plan = within_budgets(&snapshot, policy.schedule(&snapshot));
    plan.consistency_check(&snapshot)
        .map_err(RoundError::InconsistentPlan)?;
    let mut outcome = interpret(view, prepared, estimates, &snapshot, &plan, policy, cfg);
    outcome.released = released_merges(view, prepared, estimates, &snapshot, &outcome);
    if !chosen.is_empty() {
        // Those that start training now (not profiling: a profiling run
        // holds no group) outside a merge: alone, or beside another job on
        // a shared GPU. A merge's jobs train as the pair's times say (a
        // spatial pair's joint process and a temporal B from other
        // weights), and a job takes part in one merge, so A of a new
        // temporal pair starts from the pre-trained weights too.
        let starting: BTreeSet<usize> = outcome
            .groups
            .iter()
            .filter(|g| matches!(g.mode, MergeMode::Normal | MergeMode::Shared))
            .flat_map(|g| g.starts(view).collect::<Vec<_>>())
            .collect();
        outcome.warm_starts = chosen
            .iter()
            .filter(|(j, _)| starting.contains(j))
            .map(|(&job, &w)| WarmStart {
                job,
                from: estimates.warm[w].key.from,
                gain: estimates.warm[w].gain,
            })
            .collect();
    }
    Ok(Decision {
        snapshot,
        plan,
        outcome,
    })
}

/// Drops the groups a plan gives beyond their queue's budget
/// ([`Snapshot::queue_gpus`]): kept groups first, then by priority and
/// submission. The budgeted policies' own walks already stay within them;
/// this holds for every part of a policy (Chronus' SLO ILP knows no
/// queues).
fn within_budgets(snap: &Snapshot, mut plan: Plan) -> Plan {
    if snap.queue_gpus.is_empty() {
        return plan;
    }
    let mut order: Vec<usize> = (0..plan.entries.len()).collect();
    order.sort_by(|&x, &y| {
        let (a, b) = (
            &snap.jobs[plan.entries[x].jobs[0]],
            &snap.jobs[plan.entries[y].jobs[0]],
        );
        (b.current_gpus > 0)
            .cmp(&(a.current_gpus > 0))
            .then(b.priority.cmp(&a.priority))
            .then(a.submitted_at.total_cmp(&b.submitted_at))
            .then(x.cmp(&y))
    });
    let mut room = crate::policy::QueueRoom::new(snap, &Plan::default());
    let mut keep = vec![false; plan.entries.len()];
    for k in order {
        let e = &plan.entries[k];
        if e.jobs.iter().all(|&i| room.fits(snap, i, e.gpus)) {
            for &i in &e.jobs {
                room.take(snap, i, e.gpus);
            }
            keep[k] = true;
        }
    }
    let mut k = 0;
    plan.entries.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    plan
}

/// The policy's snapshot of a prepared round.
pub fn snapshot(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    cfg: &RoundConfig,
) -> Result<Snapshot, RoundError> {
    let warm = chosen_warm_starts(prepared, estimates);
    snapshot_with(view, prepared, estimates, cfg, &warm)
}

/// [`snapshot`] with the round's warm starts already chosen
/// ([`chosen_warm_starts`]).
fn snapshot_with(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    cfg: &RoundConfig,
    warm: &BTreeMap<usize, usize>,
) -> Result<Snapshot, RoundError> {
    check_estimates(prepared, estimates)?;
    let raw_candidates = &estimates.candidates;
    // A warm-started job's own times from the pre-trained weights: what it
    // takes as A of a new temporal pair.
    let cold: BTreeMap<usize, Vec<f64>> = prepared
        .jobs
        .iter()
        .zip(&estimates.jobs)
        .filter(|(v, _)| warm.contains_key(v))
        .map(|(&v, row)| {
            let unit = view.jobs[v].replica().gpus();
            (v, mask_replicas(&prepared.allocations, unit, 0, row))
        })
        .collect();
    let estimates = &whole_replicas(view, prepared, estimates, warm);
    let ord: BTreeMap<usize, usize> = prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k))
        .collect();
    let placements = current_placements(view, prepared, &ord);
    // A job its queue's share caps below what it holds is shown holding
    // only its cap (its last GPUs dropped), so a policy that keeps running
    // jobs as they are shrinks it rather than keeping it over the cap.
    let current: Vec<Vec<(usize, u32)>> = placements
        .iter()
        .zip(&prepared.jobs)
        .map(|(pl, i)| {
            let Some(&cap) = prepared.caps.get(i) else {
                return pl.clone();
            };
            let mut left = cap;
            pl.iter()
                .filter_map(|&(n, g)| {
                    let take = g.min(left);
                    left -= take;
                    (take > 0).then_some((n, take))
                })
                .collect()
        })
        .collect();
    let partners = sharing_partners(view, &prepared.jobs);
    let jobs: Vec<SchedJob> = prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let j = &view.jobs[i];
            // The executor's cap, then the job's queue's share.
            let quota = prepared.caps.get(&i).copied().unwrap_or(u32::MAX);
            let cap = |g: u32, j: &JobView| {
                prepared
                    .offered(cfg, g, j)
                    .min(quota)
                    .max(j.min_gpus.min(g))
            };
            SchedJob {
                id: j.id.clone(),
                model: j.model.clone(),
                task: j.task.clone(),
                sharing: j.sharing,
                pipeline: j.pipeline,
                expert_parallel: j.expert_parallel,
                worker_gpus: j.worker_gpus,
                gpu_model: j.gpu_model.clone(),
                unfit_families: j.unfit_families.clone(),
                requested_gpus: cap(j.requested_gpus, j),
                queue: prepared.budgets.keys().position(|q| *q == j.queue),
                priority: j.priority,
                min_gpus: j.min_gpus,
                max_gpus: cap(j.max_gpus, j),
                submitted_at: j.submitted_at,
                progress: j.progress,
                attained_gpu_s: j.attained_gpu_s,
                executed_s: j.executed_s,
                fair_share_gpu_s: j.fair_share_gpu_s,
                current_gpus: current[k].iter().map(|p| p.1).sum(),
                current_placement: current[k].clone(),
                family_time_ratio: j.family_time_ratio.clone(),
                remaining_s: estimates.jobs[k].clone(),
                spread: estimates.spread.get(k).copied().unwrap_or(0.0).max(0.0),
                restart_s: j.restart_s,
                lease_until: j.lease_until,
                deadlines: j.deadlines.clone(),
                footprint: j.footprint,
                shares_with: partners[k],
            }
        })
        .collect();
    let merges = prepared
        .kept
        .iter()
        .zip(&estimates.kept)
        .map(|(&m, secs)| {
            let mv = &view.merges[m];
            ExistingMerge {
                a: ord[&mv.a],
                b: ord[&mv.b],
                mode: mv.mode,
                remaining_s: kept_within_deadline(
                    group_time(view, estimates, &ord, mv.a, mv.b, mv.mode, secs),
                    group_due(view, mv.a, mv.b, mv.mode),
                ),
            }
        })
        .collect();
    Ok(Snapshot {
        now: view.now,
        nodes: prepared
            .nodes
            .iter()
            .zip(&prepared.capacity)
            .map(|(&n, &gpus)| NodeCap {
                id: view.nodes[n].id.clone(),
                gpus,
                gpu_model: view.nodes[n].gpu_model.clone(),
                loaned: view.nodes[n].loaned,
                gpu_memory_gib: view.nodes[n].gpu_memory_gib,
            })
            .collect(),
        allocations: prepared.allocations.clone(),
        queue_gpus: prepared.budgets.values().copied().collect(),
        jobs,
        candidates: candidates(
            view,
            prepared,
            estimates,
            raw_candidates,
            &ord,
            &cfg.queues,
            (warm, &cold),
        )?,
        merges,
        placement_rule: cfg.placement_rule,
    })
}

/// `row` with every allocation that is not a whole number of `unit`-GPU
/// replicas made `+∞`.
fn mask_replicas(allocs: &[u32], unit: u32, least: u32, row: &[f64]) -> Vec<f64> {
    allocs
        .iter()
        .zip(row)
        .map(|(&a, &t)| {
            if a.is_multiple_of(unit) && a >= least {
                t
            } else {
                f64::INFINITY
            }
        })
        .collect()
}

/// The fewest GPUs a merge of jobs `a` and `b` may run on: the larger of
/// their `min_gpus` (one process trains both, so neither may get fewer
/// than it asked for).
fn pair_min_gpus(view: &ClusterView, a: usize, b: usize) -> u32 {
    view.jobs[a].min_gpus.max(view.jobs[b].min_gpus)
}

/// The estimates of jobs and kept merges with every allocation that is not
/// a whole number of a job's replicas ([`JobView::replica`]; a merge's are
/// its jobs'), or, for a merge, below either job's `min_gpus`, made `+∞`:
/// it cannot run there, whatever the caller estimated. One rule for the service and fmsim. Candidate pairs are
/// masked as [`candidates`] keeps them (there can be hundreds of thousands,
/// most of them dropped); the result has none. A job with a warm start
/// (`warm`: view job → index into `estimates.warm`,
/// [`chosen_warm_starts`]) has its times from those weights.
fn whole_replicas(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    warm: &BTreeMap<usize, usize>,
) -> Estimates {
    let allocs = &prepared.allocations;
    let unit = |v: usize| view.jobs[v].replica().gpus();
    Estimates {
        jobs: prepared
            .jobs
            .iter()
            .zip(&estimates.jobs)
            .map(|(&v, row)| {
                let row = warm.get(&v).map_or(row, |&w| &estimates.warm[w].seconds);
                mask_replicas(allocs, unit(v), 0, row)
            })
            .collect(),
        kept: prepared
            .kept
            .iter()
            .zip(&estimates.kept)
            .map(|(&m, row)| {
                let (a, b) = (view.merges[m].a, view.merges[m].b);
                mask_replicas(allocs, unit(a), pair_min_gpus(view, a, b), row)
            })
            .collect(),
        candidates: Vec::new(),
        warm: Vec::new(),
        spread: estimates.spread.clone(),
        // The snapshot does not read them; `released_merges` masks its own.
        kept_b_alone: Vec::new(),
    }
}

/// Estimates must fit the prepared round: a row per snapshot job and per
/// kept merge, a value per allocation everywhere.
fn check_estimates(prepared: &Prepared, estimates: &Estimates) -> Result<(), RoundError> {
    let width = prepared.allocations.len();
    let bad = |what: String| Err(RoundError::Estimates(what));
    if estimates.jobs.len() != prepared.jobs.len() {
        return bad(format!(
            "{} job rows for {} jobs",
            estimates.jobs.len(),
            prepared.jobs.len()
        ));
    }
    if estimates.kept.len() != prepared.kept.len() {
        return bad(format!(
            "{} kept-merge rows for {} kept merges",
            estimates.kept.len(),
            prepared.kept.len()
        ));
    }
    if !estimates.kept_b_alone.is_empty() && estimates.kept_b_alone.len() != prepared.kept.len() {
        return bad(format!(
            "{} rows of B alone for {} kept merges",
            estimates.kept_b_alone.len(),
            prepared.kept.len()
        ));
    }
    if estimates
        .kept_b_alone
        .iter()
        .any(|r| !r.is_empty() && r.len() != width)
    {
        return bad(format!("a row of B alone that is not {width} values wide"));
    }
    if !estimates.spread.is_empty() && estimates.spread.len() != prepared.jobs.len() {
        return bad(format!(
            "{} spreads for {} jobs",
            estimates.spread.len(),
            prepared.jobs.len()
        ));
    }
    if estimates.spread.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return bad("a spread that is not a finite number >= 0".into());
    }
    if let Some(w) = estimates
        .warm
        .iter()
        .find(|w| prepared.warm.binary_search(&w.key).is_err())
    {
        return bad(format!(
            "warm start of job {} from finished job {} is not one of the round's",
            w.key.job, w.key.from
        ));
    }
    let rows = estimates
        .jobs
        .iter()
        .chain(&estimates.kept)
        .chain(
            estimates
                .candidates
                .iter()
                .flat_map(|c| [&c.seconds, &c.tran_wt]),
        )
        .chain(estimates.warm.iter().map(|w| &w.seconds));
    for r in rows {
        if r.len() != width {
            return bad(format!(
                "a row of {} values for {width} allocations",
                r.len()
            ));
        }
    }
    Ok(())
}

/// Where each snapshot job trains now (snapshot node → GPUs); both jobs of
/// a kept merge share their group's GPUs (a temporal B rides on A's). A job
/// whose node left the round holds nothing.
fn current_placements(
    view: &ClusterView,
    prepared: &Prepared,
    ord: &BTreeMap<usize, usize>,
) -> Vec<Vec<(usize, u32)>> {
    let node_ord: BTreeMap<usize, usize> = prepared
        .nodes
        .iter()
        .enumerate()
        .map(|(k, &n)| (n, k))
        .collect();
    let placement_of = |i: usize| -> Vec<(usize, u32)> {
        let j = &view.jobs[i];
        if j.profiling_run || j.holds.is_empty() {
            return Vec::new();
        }
        let mut per: BTreeMap<usize, u32> = BTreeMap::new();
        for g in &j.holds {
            match node_ord.get(&g.0) {
                Some(&k) => *per.entry(k).or_default() += 1,
                None => return Vec::new(), // its node is gone
            }
        }
        per.into_iter().collect()
    };
    let mut placements: Vec<Vec<(usize, u32)>> =
        prepared.jobs.iter().map(|&i| placement_of(i)).collect();
    for &m in &prepared.kept {
        let (a, b) = (ord[&view.merges[m].a], ord[&view.merges[m].b]);
        let shared = if placements[a].is_empty() {
            placements[b].clone()
        } else {
            placements[a].clone()
        };
        placements[a].clone_from(&shared);
        placements[b] = shared;
    }
    placements
}

/// A merged group's remaining time at each allocation: temporal = A, then
/// B from A's weights after B's own start; spatial = the joint job (Ymir
/// Eq. 4). `merged` is the merged part's time ([`PairEstimate::seconds`]).
fn group_time(
    view: &ClusterView,
    estimates: &Estimates,
    ord: &BTreeMap<usize, usize>,
    a: usize,
    b: usize,
    mode: MergeMode,
    merged: &[f64],
) -> Vec<f64> {
    match mode {
        MergeMode::Temporal => estimates.jobs[ord[&a]]
            .iter()
            .zip(merged)
            .map(|(ta, tab)| ta + tab + view.jobs[b].restart_s)
            .collect(),
        _ => merged.to_vec(),
    }
}

/// The estimated pairs that may help (`TranWt > 1` at some allocation, Ymir
/// §5; [`crate::policy::merge_gains`]) as the policy's candidates; an estimate of a pair that is not
/// eligible is refused. A pair may not run at an allocation at which a job
/// with a deadline would miss it (its time there is infinite), and one
/// that misses at every allocation is no candidate: B of a temporal pair
/// finishes with the group, both of a spatial one do. A of a temporal pair
/// trains as alone, but one that trains now is launched again for the
/// merge, so the pair may not run where that restart makes A miss.
fn candidates(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    raw: &[PairEstimate],
    ord: &BTreeMap<usize, usize>,
    queues: &Queues,
    (warm, cold): (&BTreeMap<usize, usize>, &BTreeMap<usize, Vec<f64>>),
) -> Result<Vec<PairCandidate>, RoundError> {
    let mut out = Vec::new();
    for c in raw {
        let (a, b) = (c.pair.a, c.pair.b);
        // No eligible pair at all (merging off, or none this round) and
        // the one-pair test agree with the list: both from the snapshot's jobs.
        if prepared.eligible.is_empty() || !is_eligible(view, ord, queues, &c.pair) {
            return Err(RoundError::Estimates(format!(
                "candidate {:?} of jobs {a} and {b} is not an eligible pair",
                c.pair.mode
            )));
        }
        // A pair of a job with a warm start is weighed against that start:
        // its TranWt (Eq. 12–13) again, the jobs apart at their snapshot
        // times (from the finished job's weights), the pair as it trains —
        // from the pre-trained weights: its merged part as estimated, and
        // a temporal A at its own time from those (`cold`).
        let a_in_pair = cold.get(&a).unwrap_or(&estimates.jobs[ord[&a]]);
        let reweighed: Vec<f64>;
        let tran_wt = if warm.contains_key(&a) || warm.contains_key(&b) {
            let (ta, tb) = (&estimates.jobs[ord[&a]], &estimates.jobs[ord[&b]]);
            reweighed = (0..c.seconds.len())
                .map(|k| match c.pair.mode {
                    MergeMode::Temporal => crate::policy::tran_wt_temporal_apart(
                        ta[k],
                        tb[k],
                        a_in_pair[k],
                        c.seconds[k],
                    ),
                    _ => crate::policy::tran_wt_spatial(ta[k], tb[k], c.seconds[k]),
                })
                .collect();
            &reweighed
        } else {
            &c.tran_wt
        };
        if !tran_wt.iter().copied().any(crate::policy::merge_gains) {
            continue;
        }
        let seconds = mask_replicas(
            &prepared.allocations,
            view.jobs[a].replica().gpus(),
            pair_min_gpus(view, a, b),
            &c.seconds,
        );
        let mut remaining_s = match (c.pair.mode, cold.get(&a)) {
            (MergeMode::Temporal, Some(ta)) => ta
                .iter()
                .zip(&seconds)
                .map(|(ta, tab)| ta + tab + view.jobs[b].restart_s)
                .collect(),
            _ => group_time(view, estimates, ord, a, b, c.pair.mode, &seconds),
        };
        let due = |j: usize| view.jobs[j].deadline_in(view.now).unwrap_or(f64::INFINITY);
        // An allocation at which the group would finish after the deadline
        // of a job that finishes with it is no option for the pair (the
        // policy sees it as one that cannot run), so the pair can only be
        // given GPUs that keep it.
        let group_due = group_due(view, a, b, c.pair.mode);
        // A of a temporal pair trains as alone, but one that trains now is
        // launched again to evaluate B (the merge guard's watch): the merge
        // costs it a restart it would not pay alone, and an allocation at
        // which that restart makes it miss its deadline is no option
        // either (found on generated SLO workloads, where such an A missed
        // a tight deadline by its restart).
        let a_times: &[f64] = match c.pair.mode {
            MergeMode::Temporal if is_training(&view.jobs[a]) => &estimates.jobs[ord[&a]],
            _ => &[],
        };
        let a_due = due(a) - view.jobs[a].restart_s;
        for (k, t) in remaining_s.iter_mut().enumerate() {
            if *t > group_due || a_times.get(k).is_some_and(|&ta| ta > a_due) {
                *t = f64::INFINITY;
            }
        }
        if !remaining_s.iter().any(|t| t.is_finite()) {
            continue;
        }
        out.push(PairCandidate {
            a: ord[&a],
            b: ord[&b],
            mode: c.pair.mode,
            remaining_s,
            tran_wt: tran_wt.clone(),
        });
    }
    Ok(out)
}

/// The earliest deadline, seconds from now, of a job that finishes with
/// the merged group of `a` and `b`: B of a temporal pair, either job of a
/// spatial one (A of a temporal pair finishes before the group). Infinite
/// when neither has one.
fn group_due(view: &ClusterView, a: usize, b: usize, mode: MergeMode) -> f64 {
    let finish_with_group: &[usize] = match mode {
        MergeMode::Temporal => &[b],
        _ => &[a, b],
    };
    finish_with_group
        .iter()
        .filter_map(|&j| view.jobs[j].deadline_in(view.now))
        .fold(f64::INFINITY, f64::min)
}

/// The kept temporal merges to split before the next round (indices into
/// `view.merges`; [`RoundOutcome::released`]): those whose A has trained
/// and whose B still waits behind it (it has not trained from A's
/// weights), where B alone, from scratch, on its fair share of the cluster
/// — at most the GPUs the round leaves free — would finish before the
/// group does at its best allocation: the test
/// Ymir applies to a new pair behind a trained A
/// ([`crate::policy::ymir::b_fares_no_worse`]), applied again while the
/// merge is kept. At formation A's time is its time then; the round then
/// sizes the group on the group's time, which ranks a long A with a B
/// behind it low under the shortest-remaining-time term, so on a busy
/// cluster it is kept on few GPUs and B waits for all of it (found on a
/// mixed cluster: A with 113,000 s left on one V100 for 30 h, B behind it,
/// while the cluster idled). A released B waits as any job and merges no
/// more (a job merges once). A merge that meets B's deadline is kept.
fn released_merges(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    snap: &Snapshot,
    outcome: &RoundOutcome,
) -> Vec<usize> {
    // B alone starts on GPUs nobody was given this round, or waits: its
    // share is at most those (on a node the pair fills, B waits behind A
    // merged or not, and a release would only lose B its transfer).
    let used: usize = outcome.groups.iter().map(|g| g.gpus.len()).sum::<usize>()
        + outcome
            .profiling
            .iter()
            .map(|r| r.gpus.len())
            .sum::<usize>();
    let free = prepared
        .capacity
        .iter()
        .map(|&c| c as usize)
        .sum::<usize>()
        .saturating_sub(used);
    if free == 0 {
        return Vec::new();
    }
    let share = crate::policy::ymir::share_of_cluster(snap).min(free as f64);
    let mut out = Vec::new();
    for (k, &m) in prepared.kept.iter().enumerate() {
        let (Some(group), Some(alone)) = (snap.merges.get(k), estimates.kept_b_alone.get(k)) else {
            continue;
        };
        if group.mode != MergeMode::Temporal || alone.is_empty() {
            continue;
        }
        let (a, b) = (&snap.jobs[group.a], &snap.jobs[group.b]);
        if a.progress <= 0.0 || b.progress > 0.0 {
            continue;
        }
        // A deadline the group meets is not gambled on B's wait for GPUs
        // of its own (found on generated SLO workloads: released Bs missed
        // deadlines their groups met).
        let due = group_due(
            view,
            view.merges[m].a,
            view.merges[m].b,
            MergeMode::Temporal,
        );
        if due.is_finite() && group.remaining_s.iter().any(|&t| t <= due) {
            continue;
        }
        let alone = mask_replicas(
            &prepared.allocations,
            view.jobs[view.merges[m].b].replica().gpus(),
            b.min_gpus,
            alone,
        );
        if !crate::policy::ymir::b_fares_no_worse(
            snap,
            &alone,
            b.restart_s,
            &group.remaining_s,
            share,
        ) {
            out.push(m);
        }
    }
    out
}

/// A kept merge's group times with the allocations at which a job that
/// finishes with the group would miss its deadline taken away (as for a
/// new pair in [`candidates`]), so the policy gives it GPUs that keep the
/// deadline where some do. Where none does, the times stay: the merge is
/// not split here (B may be running from A's weights), and the policy
/// sizes it as before.
fn kept_within_deadline(mut times: Vec<f64>, due: f64) -> Vec<f64> {
    if times.iter().any(|&t| t.is_finite() && t <= due) {
        for t in &mut times {
            if *t > due {
                *t = f64::INFINITY;
            }
        }
    }
    times
}

// ---- 3. interpret --------------------------------------------------------

/// Phase 3: the plan in view terms (see the module docs).
fn interpret(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    snap: &Snapshot,
    plan: &Plan,
    policy: &dyn Policy,
    cfg: &RoundConfig,
) -> RoundOutcome {
    let (groups, mut unexecutable) = assign_gpus(view, prepared, estimates, plan, cfg);
    // Waiting jobs the quota pass kept out say why (running ones through
    // their transition).
    unexecutable.extend(
        prepared
            .queue_out
            .iter()
            .filter(|(i, _)| !is_training(&view.jobs[*i]))
            .cloned(),
    );
    // So do those the plan gave GPUs and placement found no room for on
    // the GPUs they can run on (running ones through their transition).
    let said: BTreeSet<usize> = unexecutable.iter().map(|u| u.0).collect();
    let unplaced: Vec<(usize, String)> = plan
        .stats
        .unplaced_jobs
        .iter()
        .filter_map(|&(k, gpus)| Some((*prepared.jobs.get(k)?, gpus)))
        .filter(|(i, _)| !said.contains(i) && !is_training(&view.jobs[*i]))
        .map(|(i, gpus)| (i, unplaced_why(&view.jobs[i], gpus)))
        .collect();
    // So do those a rigid policy left waiting once their queue's budget
    // had no room for them.
    if !prepared.queue_short.is_empty() {
        let mut left: BTreeMap<&str, u32> = prepared
            .budgets
            .iter()
            .map(|(q, &b)| (q.as_str(), b))
            .collect();
        let mut said: BTreeSet<usize> = unexecutable.iter().map(|u| u.0).collect();
        for g in &groups {
            said.extend(&g.jobs);
            if let Some(l) = left.get_mut(view.jobs[g.jobs[0]].queue.as_str()) {
                *l = l.saturating_sub(g.gpus.len() as u32);
            }
        }
        let snap_index: BTreeMap<usize, usize> = prepared
            .jobs
            .iter()
            .enumerate()
            .map(|(k, &i)| (i, k))
            .collect();
        let short: Vec<(usize, String)> = prepared
            .queue_short
            .iter()
            .filter(|(i, _)| !said.contains(i))
            .filter(|(i, _)| {
                let size = snap_index
                    .get(i)
                    .and_then(|&k| crate::policy::requested_allocation(snap, k));
                let room = left.get(view.jobs[*i].queue.as_str()).copied();
                matches!((size, room), (Some(a), Some(l)) if a > l)
            })
            .cloned()
            .collect();
        unexecutable.extend(short);
    }
    unexecutable.sort_by_key(|u| u.0);
    // Jobs that gave their GPUs to a group with less time to run
    // (placement's rule 6), by view index.
    let gave_way: BTreeMap<usize, usize> = plan
        .stats
        .displaced
        .iter()
        .filter_map(|&(j, to)| Some((*prepared.jobs.get(j)?, *prepared.jobs.get(to)?)))
        .collect();
    let transitions = transitions(view, prepared, &groups, &gave_way, cfg);
    let leases = leases(view, &groups, policy.lease_s(), policy.slo_lease_s());
    let switches = groups.iter().map(|g| g.starts(view).count()).sum();
    let placed: usize = groups.iter().map(|g| g.jobs.len()).sum::<usize>() - prepared.pinned.len();
    RoundOutcome {
        groups,
        profiling: prepared.profiling.clone(),
        transitions,
        leases,
        unschedulable: prepared.unschedulable.clone(),
        unexecutable,
        unplaced,
        switches,
        stats: plan.stats.clone(),
        queued: snap.jobs.len().saturating_sub(placed),
        released: Vec::new(),
        warm_starts: Vec::new(),
    }
}

/// A plan entry whose GPUs are still to be picked.
struct Unfilled {
    entry: usize,
    members: Vec<usize>,
    /// View node → GPUs.
    placement: Vec<(usize, u32)>,
}

/// Concrete GPUs for the plan's groups: a group that keeps its node and
/// size keeps its GPUs (unless a profiling run took one of them); the rest
/// take the lowest free GPUs of the nodes the placement chose. A group the
/// executor cannot run (more nodes than `max_nodes_per_group`) waits and is
/// named with the reason. Groups come out in plan order, new merges marked
/// with the gains they rest on.
fn assign_gpus(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    plan: &Plan,
    cfg: &RoundConfig,
) -> (Vec<Group>, Vec<(usize, String)>) {
    let reserved: BTreeSet<Gpu> = prepared
        .profiling
        .iter()
        .flat_map(|r| r.gpus.iter().copied())
        .collect();
    let mut used: BTreeSet<Gpu> = reserved.clone();
    let mut unexecutable = Vec::new();
    let mut groups: Vec<(usize, Group)> = Vec::new();
    // Pinned (running non-preemptible) jobs keep their GPUs, after the
    // plan's groups.
    for (k, &i) in prepared.pinned.iter().enumerate() {
        let mut gpus = view.jobs[i].holds.clone();
        gpus.sort_unstable();
        used.extend(gpus.iter().copied());
        groups.push((
            plan.entries.len() + k,
            Group::new(vec![i], MergeMode::Normal, gpus, true),
        ));
    }
    let mut unfilled: Vec<Unfilled> = Vec::new();
    for (k, e) in plan.entries.iter().enumerate() {
        let members: Vec<usize> = e.jobs.iter().map(|&x| prepared.jobs[x]).collect();
        // Snapshot node ordinals → view node ordinals.
        let placement: Vec<(usize, u32)> = e
            .placement
            .iter()
            .map(|&(n, g)| (prepared.nodes[n], g))
            .collect();
        if let Some(max) = cfg.max_nodes_per_group
            && placement.len() > max
        {
            let names: Vec<&str> = placement
                .iter()
                .map(|p| view.nodes[p.0].id.as_str())
                .collect();
            let why = format!(
                "waiting: {} placed it on {} GPUs over nodes {}, and a job spans at most {max} node(s) here",
                cfg.policy,
                e.gpus,
                names.join(", ")
            );
            unexecutable.extend(members.iter().map(|&i| (i, why.clone())));
            continue;
        }
        let merged_before = match members[..] {
            [a, b] => view
                .merges
                .iter()
                .any(|m| (m.a, m.b) == (a, b) || (m.a, m.b) == (b, a)),
            _ => true,
        };
        // A group keeps its GPUs when its first trainer held exactly them
        // (a new joint process never does, nor does A of a new temporal
        // merge: it is launched again to evaluate B with its weights, the
        // merge guard's watch); a shared GPU stays where either sharer runs.
        let now_held = match e.mode {
            MergeMode::Spatial | MergeMode::Temporal if !merged_before => Vec::new(),
            MergeMode::Shared => group_holds(view, &members),
            _ => group_holds(view, &members[..1]),
        };
        if !now_held.is_empty()
            && per_node(&now_held) == placement
            && !now_held
                .iter()
                .any(|g| reserved.contains(g) || used.contains(g))
        {
            used.extend(now_held.iter().copied());
            // Both sharers must have been there for nothing to start.
            let kept = e.mode != MergeMode::Shared
                || members
                    .iter()
                    .all(|&i| holds_exactly(&view.jobs[i], &now_held));
            groups.push((k, Group::new(members, e.mode, now_held, kept)));
        } else {
            unfilled.push(Unfilled {
                entry: k,
                members,
                placement,
            });
        }
    }
    for u in unfilled {
        // A cordoned node keeps what runs there; a group none of whose
        // members held GPUs there does not start on it (its capacity is
        // what runs there, so this is a job taking a suspended one's GPUs).
        let new_on_cordoned = u.placement.iter().find(|&&(n, _)| {
            view.nodes[n].cordoned
                && !u.members.iter().any(|&i| {
                    let j = &view.jobs[i];
                    !j.profiling_run && j.holds.iter().any(|g| g.0 == n)
                })
        });
        if let Some(&(n, _)) = new_on_cordoned {
            let why = format!(
                "waiting: {} placed it on node {}, which is cordoned (no new work)",
                cfg.policy, view.nodes[n].id
            );
            unexecutable.extend(u.members.iter().map(|&i| (i, why.clone())));
            continue;
        }
        let mut gpus = Vec::new();
        for &(n, g) in &u.placement {
            gpus.extend(
                (0..view.nodes[n].gpus)
                    .map(|x| (n, x))
                    .filter(|x| !used.contains(x))
                    .take(g as usize),
            );
        }
        let want: u32 = u.placement.iter().map(|p| p.1).sum();
        if gpus.len() as u32 != want {
            // Placement respects capacity, so this is a bug; the group waits
            // rather than sharing a GPU.
            let why = format!(
                "waiting: no {want} free GPUs where the plan put it (placement and GPUs disagree)"
            );
            unexecutable.extend(u.members.iter().map(|&i| (i, why.clone())));
            continue;
        }
        used.extend(gpus.iter().copied());
        let mode = plan.entries[u.entry].mode;
        groups.push((u.entry, Group::new(u.members, mode, gpus, false)));
    }
    groups.sort_by_key(|(k, _)| *k);
    let mut groups: Vec<Group> = groups.into_iter().map(|(_, g)| g).collect();
    for g in &mut groups {
        if let [a, b] = g.jobs[..]
            && g.mode != MergeMode::Shared
            && !view
                .merges
                .iter()
                .any(|m| (m.a, m.b) == (a, b) || (m.a, m.b) == (b, a))
        {
            let est = estimates
                .candidates
                .iter()
                .find(|c| c.pair.a == a && c.pair.b == b && c.pair.mode == g.mode);
            g.new_merge = Some(est.map_or((0.0, 0.0), |c| (c.gain_ab, c.gain_ba)));
        }
    }
    (groups, unexecutable)
}

/// For each snapshot job (view jobs `jobs`), the snapshot job that trains
/// on the one GPU it trains on (a shared GPU, ICEFROG Eq. 8), if any.
fn sharing_partners(view: &ClusterView, jobs: &[usize]) -> Vec<Option<usize>> {
    let mut on: BTreeMap<Gpu, Vec<usize>> = BTreeMap::new();
    for (k, &i) in jobs.iter().enumerate() {
        let j = &view.jobs[i];
        if let ([gpu], false) = (&j.holds[..], j.profiling_run) {
            on.entry(*gpu).or_default().push(k);
        }
    }
    let mut out = vec![None; jobs.len()];
    for ks in on.values() {
        if let [a, b] = ks[..] {
            out[a] = Some(b);
            out[b] = Some(a);
        }
    }
    out
}

/// It trains on exactly `gpus` (sorted) now.
fn holds_exactly(j: &JobView, gpus: &[Gpu]) -> bool {
    let mut h = j.holds.clone();
    h.sort_unstable();
    !j.profiling_run && h == gpus
}

/// It holds GPUs for training now (not a profiling run).
fn is_training(j: &JobView) -> bool {
    !j.profiling_run && !j.holds.is_empty()
}

/// The training GPUs `members` hold now: those of the first that holds any,
/// sorted.
fn group_holds(view: &ClusterView, members: &[usize]) -> Vec<Gpu> {
    members
        .iter()
        .map(|&i| &view.jobs[i])
        .find(|j| !j.profiling_run && !j.holds.is_empty())
        .map(|j| {
            let mut g = j.holds.clone();
            g.sort_unstable();
            g
        })
        .unwrap_or_default()
}

/// GPUs per node, by node.
fn per_node(gpus: &[Gpu]) -> Vec<(usize, u32)> {
    let mut per: BTreeMap<usize, u32> = BTreeMap::new();
    for g in gpus {
        *per.entry(g.0).or_default() += 1;
    }
    per.into_iter().collect()
}

impl Group {
    fn new(jobs: Vec<usize>, mode: MergeMode, mut gpus: Vec<Gpu>, kept: bool) -> Self {
        gpus.sort_unstable();
        Self {
            jobs,
            mode,
            gpus,
            kept,
            new_merge: None,
        }
    }
}

/// The nodes of these GPUs (sorted, as a group's are), as a job's history
/// names them: `a+b`.
fn node_names(view: &ClusterView, gpus: &[Gpu]) -> String {
    let mut n: Vec<&str> = gpus
        .iter()
        .filter_map(|g| view.nodes.get(g.0))
        .map(|n| n.id.as_str())
        .collect();
    n.dedup();
    n.join("+")
}

/// A GPU the job holds on a node that is gone or Offline.
fn lost_gpu<'v>(view: &ClusterView, j: &'v JobView) -> Option<&'v Gpu> {
    j.holds.iter().find(|g| {
        view.nodes
            .get(g.0)
            .is_none_or(|n| n.state == NodeState::Offline)
    })
}

/// The running jobs a round restarts elsewhere with no change of state to
/// say so, each with the kind of event its history shows and the note:
/// `moved` to another GPU family (placement's move to faster GPUs, or a
/// resize that lands there), `moved` to other nodes of the same family (a
/// drained node's job placed elsewhere in the round, naming the drained
/// node, or placement), `resized` to another GPU count. Each restarts from
/// its checkpoint. Not said here: a job whose node was lost (its
/// transitions say it), the jobs of a merge decided this round (the merge
/// event says it), and a kept group (no restart). The service writes them
/// as events.
pub fn restarts(view: &ClusterView, groups: &[Group]) -> Vec<(usize, &'static str, String)> {
    let node = |gpu: &Gpu| view.nodes.get(gpu.0);
    let mut out = Vec::new();
    for g in groups.iter().filter(|g| g.new_merge.is_none()) {
        for v in g.starts(view) {
            let j = &view.jobs[v];
            if j.state != JobState::Running || j.profiling_run || j.holds.is_empty() {
                continue;
            }
            let mut held = j.holds.clone();
            held.sort_unstable();
            if lost_gpu(view, j).is_some() || held == g.gpus {
                continue;
            }
            let (Some(from), Some(to)) = (
                j.holds.first().and_then(node),
                g.gpus.first().and_then(node),
            ) else {
                continue;
            };
            let (was, now) = (node_names(view, &held), node_names(view, &g.gpus));
            let (kind, what) = if from.gpu_model != to.gpu_model {
                (
                    "moved",
                    format!(
                        "moved from {} to {} GPUs ({} on {now})",
                        from.gpu_model,
                        to.gpu_model,
                        g.gpus.len()
                    ),
                )
            } else if held.len() != g.gpus.len() {
                (
                    "resized",
                    format!(
                        "resized from {} to {} GPUs on {now}",
                        held.len(),
                        g.gpus.len()
                    ),
                )
            } else if was == now {
                (
                    "moved",
                    format!("moved to other GPUs of {now} ({})", g.gpus.len()),
                )
            } else {
                let mut off: Vec<&str> = held
                    .iter()
                    .filter_map(node)
                    .filter(|n| n.drained)
                    .map(|n| n.id.as_str())
                    .collect();
                off.dedup();
                let why = if off.is_empty() {
                    String::new()
                } else {
                    format!(" (node {} is drained)", off.join(", "))
                };
                (
                    "moved",
                    format!("moved from {was} to {now} ({} GPUs){why}", g.gpus.len()),
                )
            };
            out.push((
                v,
                kind,
                format!("{what}, from its checkpoint (iteration {})", j.iteration),
            ));
        }
    }
    out
}

/// The job state changes of a round, with the reasons written on the jobs:
/// profiling starts (or starts again when its node was lost), trainers run,
/// everyone else waits — suspended, re-queued from a lost node, or still
/// waiting. `submitted → running` goes through `queued`, and so does a
/// running job whose node went offline and that runs elsewhere now.
fn transitions(
    view: &ClusterView,
    prepared: &Prepared,
    groups: &[Group],
    gave_way: &BTreeMap<usize, usize>,
    cfg: &RoundConfig,
) -> Vec<Transition> {
    let training: BTreeMap<usize, &Group> = groups
        .iter()
        .flat_map(|g| g.trainers().iter().map(move |&i| (i, g)))
        .collect();
    let profiled: BTreeMap<usize, &Reservation> =
        prepared.profiling.iter().map(|r| (r.job, r)).collect();
    let mut out = Vec::new();
    for (i, j) in view.jobs.iter().enumerate() {
        let mut push = |to: JobState, reason: String| out.push(Transition { job: i, to, reason });
        if let Some(r) = profiled.get(&i) {
            if j.state == JobState::Submitted {
                let on = node_names(view, &r.gpus);
                push(
                    JobState::Profiling,
                    format!("profiling on {on} ({} GPU)", r.gpus.len()),
                );
            }
            continue;
        }
        if cfg.profiling && j.state == JobState::Profiling {
            push(
                JobState::Submitted,
                "profiling node lost; profiling again".into(),
            );
            continue;
        }
        if cfg.profiling && j.state == JobState::Submitted && !j.skip_profiling {
            continue; // waits for a profiling GPU
        }
        let want = if training.contains_key(&i) {
            JobState::Running
        } else {
            JobState::Queued
        };
        let lost = lost_gpu(view, j);
        let offline = |lost: &Gpu| {
            format!(
                "node {} is offline: re-queued from its last checkpoint (iteration {})",
                view.nodes.get(lost.0).map_or("?", |n| n.id.as_str()),
                j.iteration
            )
        };
        let placed = |g: &Group| {
            format!(
                "placed on {} ({} GPUs) by {}",
                node_names(view, &g.gpus),
                g.gpus.len(),
                cfg.policy
            )
        };
        if j.state == want {
            // A job whose node went offline, placed elsewhere in the same
            // round, restarts from its checkpoint there: its history says
            // both moves, as over two rounds.
            if let (JobState::Running, Some(lost), Some(g)) = (want, lost, training.get(&i)) {
                push(JobState::Queued, offline(lost));
                push(JobState::Running, placed(g));
            }
            continue;
        }
        let reason = match (training.get(&i), j.state, lost) {
            (Some(g), ..) => placed(g),
            (None, JobState::Running, Some(lost)) => offline(lost),
            (None, JobState::Running, None) => {
                let drained = j
                    .holds
                    .iter()
                    .find(|g| view.nodes.get(g.0).is_some_and(|n| n.drained));
                match drained {
                    Some(g) => format!(
                        "node {} is drained: moved off from its checkpoint (iteration {})",
                        view.nodes[g.0].id, j.iteration
                    ),
                    None if let Some((_, why)) = prepared.queue_out.iter().find(|o| o.0 == i) => {
                        format!("{why} (iteration {})", j.iteration)
                    }
                    None if let Some(&to) = gave_way.get(&i) => format!(
                        "suspended from its checkpoint (iteration {}): its GPUs go to job {}, \
                         which has less left to run and fits only some GPU families \
                         (shortest remaining time first)",
                        j.iteration, view.jobs[to].id
                    ),
                    None if j.held_back => format!(
                        "held back this round (re-queued or retrying): suspended from its \
                         checkpoint (iteration {})",
                        j.iteration
                    ),
                    None => "suspended by the plan (checkpointed)".into(),
                }
            }
            _ => "waiting for GPUs".into(),
        };
        if j.state == JobState::Submitted && want == JobState::Running {
            push(JobState::Queued, "accepted for scheduling".into());
        }
        push(want, reason);
    }
    out
}

/// Why job `j`, whose group the plan gave `gpus` GPUs and placement could
/// not fit, waits.
fn unplaced_why(j: &JobView, gpus: u32) -> String {
    let on = match (&j.gpu_model, &j.unfit_families[..]) {
        (Some(m), _) => format!("the {m} GPUs it asks for"),
        (None, []) => "any node".to_string(),
        (None, unfit) => format!(
            "GPUs other than {} (its model does not fit those)",
            unfit.join(", ")
        ),
    };
    format!(
        "waiting: the plan runs it on {gpus} GPUs, but placement found no room for them on {on}"
    )
}

/// Leases after the round (Themis, UniSched; none when `lease_s` is 0): a
/// job that keeps its GPUs keeps its lease until it runs out; one that
/// keeps them after it ran out won them again and gets a new lease, as does
/// every job placed anew. A job with a deadline gets `slo_lease_s`.
fn leases(
    view: &ClusterView,
    groups: &[Group],
    lease_s: f64,
    slo_lease_s: f64,
) -> Vec<(usize, f64)> {
    if lease_s <= 0.0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for g in groups {
        for &i in &g.jobs {
            let running = view.jobs[i].lease_until;
            let term = if view.jobs[i].deadlines.iter().any(|s| s.by > view.now) {
                slo_lease_s
            } else {
                lease_s
            };
            let until = if g.kept && running > view.now {
                running
            } else {
                view.now + term
            };
            out.push((i, until));
        }
    }
    out
}

/// What a round predicts of one snapshot job, for users (`fmctl jobs`)
/// and SLO metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// View job.
    pub job: usize,
    /// Seconds from the view's clock until it finishes at the GPUs the
    /// round gave it (`T_{i,a}`, its remaining time alone); None when it
    /// waits or trains merged (a pair's finish depends on the merge).
    pub finish_in: Option<f64>,
    /// It has a deadline and is predicted to miss it: running, finishing
    /// after it; waiting, unable to make it even if started now on its
    /// fastest allocation.
    pub at_risk: bool,
    /// Seconds its fastest allocation alone would take from now.
    pub best_in: Option<f64>,
    /// Its deadline (the full reward's), seconds from the view's clock.
    pub deadline_in: Option<f64>,
}

/// The round's predictions for its snapshot jobs (pure; the service
/// stores them with the plan).
pub fn predictions(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    outcome: &RoundOutcome,
) -> Vec<Prediction> {
    let alone: BTreeMap<usize, u32> = outcome
        .groups
        .iter()
        .filter(|g| g.jobs.len() == 1)
        .map(|g| (g.jobs[0], g.gpus.len() as u32))
        .collect();
    let merged: BTreeSet<usize> = outcome
        .groups
        .iter()
        .filter(|g| g.jobs.len() > 1)
        .flat_map(|g| g.jobs.iter().copied())
        .collect();
    prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let times = estimates.jobs.get(k).map(Vec::as_slice).unwrap_or(&[]);
            let at = |gpus: u32| {
                prepared
                    .allocations
                    .iter()
                    .position(|&a| a == gpus)
                    .and_then(|x| times.get(x).copied())
                    .filter(|t| t.is_finite())
            };
            let finish_in = alone.get(&i).and_then(|&g| at(g));
            let deadline = view.jobs[i].deadline_in(view.now);
            let best = times
                .iter()
                .copied()
                .filter(|t| t.is_finite())
                .fold(f64::INFINITY, f64::min);
            let at_risk = deadline.is_some_and(|d| match finish_in {
                Some(f) => f > d,
                None if merged.contains(&i) => false,
                // A cluster without GPUs (no agent registered yet) runs
                // nothing: that says nothing about the job.
                None if best.is_infinite() && prepared.total_gpus == 0 => false,
                None => best > d,
            });
            Prediction {
                job: i,
                finish_in,
                at_risk,
                best_in: best.is_finite().then_some(best),
                deadline_in: deadline,
            }
        })
        .collect()
}

/// Builders of views for tests (this crate's, and others' with the
/// `testkit` feature): a node, a job, a view, and random views.
#[cfg(any(test, feature = "testkit"))]
pub mod testkit {
    use super::*;
    use proptest::prelude::*;

    /// An available node.
    pub fn node(id: &str, gpus: u32) -> NodeView {
        NodeView {
            id: id.into(),
            gpus,
            state: NodeState::Available,
            drained: false,
            cordoned: false,
            gpu_model: "A100".into(),
            loaned: false,
            gpu_memory_gib: 80.0,
        }
    }

    /// A job of `roberta-base` asking for `gpus` (1 at least), holding
    /// nothing, submitted at 0.
    pub fn job(id: &str, task: &str, state: JobState, gpus: u32) -> JobView {
        JobView {
            id: id.into(),
            state,
            model: "roberta-base".into(),
            task: task.into(),
            sharing: true,
            pipeline: false,
            expert_parallel: 0,
            worker_gpus: 0,
            gpu_model: None,
            unfit_families: Vec::new(),
            min_gpus: 1,
            max_gpus: gpus,
            requested_gpus: gpus,
            submitted_at: 0.0,
            iteration: 0,
            progress: 0.0,
            attained_gpu_s: 0.0,
            executed_s: 0.0,
            fair_share_gpu_s: 0.0,
            lease_until: 0.0,
            restart_s: 30.0,
            holds: Vec::new(),
            profiling_run: false,
            held_back: false,
            ever_merged: false,
            merge_setup: String::new(),
            deadlines: Vec::new(),
            queue: String::new(),
            priority: 0,
            preemptible: true,
            footprint: None,
            skip_profiling: false,
            family_time_ratio: Vec::new(),
        }
    }

    /// Linear scaling: `work / a` seconds at each allocation of the round
    /// (`+∞` at 0 GPUs).
    pub fn linear(p: &Prepared, work: f64) -> Vec<f64> {
        power_law(p, work, 1.0)
    }

    /// `work / a^k` seconds at each allocation of the round (`+∞` at 0
    /// GPUs): `k < 1` for jobs that scale sub-linearly.
    pub fn power_law(p: &Prepared, work: f64, k: f64) -> Vec<f64> {
        p.allocations
            .iter()
            .map(|&a| {
                if a == 0 {
                    f64::INFINITY
                } else {
                    work / f64::from(a).powf(k)
                }
            })
            .collect()
    }

    /// A temporal candidate of jobs `a` → `b` the caller estimated
    /// helpful: B from A's weights needs a tenth of its time (360 s of
    /// work), TranWt 1.8 at every allocation, `G_{A,B}` = 0.25.
    pub fn helpful_temporal(p: &Prepared, a: usize, b: usize) -> PairEstimate {
        PairEstimate {
            pair: PairKey {
                a,
                b,
                mode: MergeMode::Temporal,
            },
            seconds: linear(p, 360.0),
            tran_wt: p
                .allocations
                .iter()
                .map(|&x| if x == 0 { 0.0 } else { 1.8 })
                .collect(),
            gain_ab: 0.25,
            gain_ba: 0.0,
        }
    }

    /// Every snapshot job and kept merge scaling linearly with `work`, no
    /// candidate.
    pub fn estimates(p: &Prepared, work: f64) -> Estimates {
        Estimates {
            jobs: p.jobs.iter().map(|_| linear(p, work)).collect(),
            kept: p.kept.iter().map(|_| linear(p, work)).collect(),
            candidates: Vec::new(),
            warm: Vec::new(),
            spread: Vec::new(),
            kept_b_alone: Vec::new(),
        }
    }

    /// A view at time 0 without merges.
    pub fn view(nodes: Vec<NodeView>, jobs: Vec<JobView>) -> ClusterView {
        ClusterView {
            now: 0.0,
            nodes,
            jobs,
            merges: Vec::new(),
            finished: Vec::new(),
        }
    }

    /// Random clusters: 1–4 nodes of 1–8 GPUs (some offline, suspect or
    /// drained), up to 13 jobs in every live state of 1–8 GPUs, some
    /// pipeline or private, running and profiling ones holding GPUs where
    /// they fit, some started.
    pub fn arb_view() -> impl Strategy<Value = ClusterView> {
        let nodes = prop::collection::vec((1u32..=8, 0u8..10), 1..5);
        let jobs = prop::collection::vec(
            (
                0u8..4,
                1u32..=8,
                0u8..6,
                any::<bool>(),
                any::<bool>(),
                0u8..5,
            ),
            0..14,
        );
        (nodes, jobs).prop_map(|(nodes, jobs)| {
            let nodes: Vec<NodeView> = nodes
                .into_iter()
                .enumerate()
                .map(|(k, (gpus, st))| NodeView {
                    id: format!("n{k}"),
                    gpus,
                    state: match st {
                        0 => NodeState::Offline,
                        1 => NodeState::Suspect,
                        _ => NodeState::Available,
                    },
                    drained: st == 2,
                    cordoned: st == 3,
                    // Every third node is of another family.
                    gpu_model: if k % 3 == 2 { "H100" } else { "A100" }.into(),
                    loaned: st == 4,
                    gpu_memory_gib: 80.0,
                })
                .collect();
            let mut free: Vec<Vec<u32>> = nodes.iter().map(|n| (0..n.gpus).collect()).collect();
            let tasks = ["rte", "mrpc", "qqp", "sst2", "cola", "mnli"];
            let jobs = jobs
                .into_iter()
                .enumerate()
                .map(|(k, (st, gpus, task, pipeline, sharing, holds))| {
                    let state = [
                        JobState::Submitted,
                        JobState::Profiling,
                        JobState::Queued,
                        JobState::Running,
                    ][st as usize];
                    let mut j = job(&format!("j{k:02}"), tasks[task as usize], state, gpus);
                    j.pipeline = pipeline && gpus >= 4;
                    j.sharing = sharing;
                    if k % 5 == 4 {
                        j.gpu_model = Some("H100".into());
                    }
                    j.submitted_at = -(k as f64);
                    j.progress = f64::from(holds % 3) / 4.0;
                    if matches!(state, JobState::Running | JobState::Profiling) {
                        let n = holds as usize % nodes.len();
                        let want = if state == JobState::Profiling {
                            1
                        } else {
                            gpus
                        };
                        if free[n].len() >= want as usize {
                            j.holds = free[n].drain(..want as usize).map(|g| (n, g)).collect();
                            j.profiling_run = state == JobState::Profiling;
                        }
                    }
                    j
                })
                .collect();
            view(nodes, jobs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::{arb_view, estimates, helpful_temporal, job, linear, node, view};
    use super::*;
    use crate::policy::baselines::by_name;
    use proptest::prelude::*;

    fn run(v: &ClusterView, policy: &str, cfg: &RoundConfig) -> Decision {
        let policy = by_name(policy).unwrap();
        let p = prepare(v, policy.as_ref(), cfg);
        let e = estimates(&p, 3600.0);
        decide(v, &p, &e, policy.as_ref(), cfg).unwrap()
    }

    /// An elastic job of two-GPU workers (Lyra) grows by whole workers,
    /// each on one node: on two 3-GPU nodes lyra gives it 4 GPUs as 2 + 2
    /// (one GPU a worker would take 3 + 1).
    #[test]
    fn lyra_workers_of_two_gpus_sit_on_one_node_each() {
        let mut j = job("w", "rte", JobState::Queued, 2);
        (j.min_gpus, j.max_gpus, j.requested_gpus) = (2, 4, 2);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let placed = |worker_gpus: u32| {
            let mut j = j.clone();
            j.worker_gpus = worker_gpus;
            let v = view(vec![node("x", 3), node("y", 3)], vec![j]);
            let d = run(&v, "lyra", &cfg);
            let mut per: BTreeMap<usize, u32> = BTreeMap::new();
            for g in &d.outcome.groups[0].gpus {
                *per.entry(g.0).or_default() += 1;
            }
            let mut parts: Vec<u32> = per.into_values().collect();
            parts.sort_unstable();
            parts
        };
        assert_eq!(placed(2), vec![2, 2]);
        assert_eq!(placed(1), vec![1, 3]);
    }

    /// A job is estimated on the family it asks for, else the one it runs
    /// on, else the cluster's most plentiful; the node size is that
    /// family's largest present node.
    #[test]
    fn estimates_use_the_asked_then_the_held_then_the_most_plentiful_family() {
        let fam = |id: &str, gpus: u32, m: &str| NodeView {
            gpu_model: m.into(),
            ..node(id, gpus)
        };
        let mut offline = fam("t-off", 8, "T4");
        offline.state = NodeState::Offline;
        let v = view(
            vec![
                fam("v0", 4, "V100"),
                fam("v1", 4, "V100"),
                fam("v2", 2, "V100"),
                fam("a0", 8, "A100"),
                fam("h0", 4, "H100"),
                offline,
            ],
            vec![],
        );
        let free = job("free", "rte", JobState::Queued, 1);
        assert_eq!(estimate_shape(&v, &free), Some(("V100".into(), 4)));
        let mut held = free.clone();
        held.holds = vec![(4, 0)];
        assert_eq!(estimate_shape(&v, &held), Some(("H100".into(), 4)));
        let mut asks = held.clone();
        asks.gpu_model = Some("A100".into());
        assert_eq!(estimate_shape(&v, &asks), Some(("A100".into(), 8)));
        asks.gpu_model = Some("T4".into());
        assert_eq!(
            estimate_shape(&v, &asks),
            None,
            "only an Offline node has T4"
        );
        // Holding GPUs of an Offline node whose family no present node has:
        // the cluster's family instead.
        held.holds = vec![(5, 0)];
        assert_eq!(estimate_shape(&v, &held), Some(("V100".into(), 4)));
        // Ties go to the first name.
        let tie = view(vec![fam("h", 8, "H100"), fam("a", 8, "A100")], vec![]);
        assert_eq!(estimate_shape(&tie, &free), Some(("A100".into(), 8)));
    }

    /// Whatever the caller estimated, an expert-parallel (or pipeline) job
    /// cannot run on a part of a replica: those allocations are `+∞` in the
    /// policy's snapshot; a cluster without a node wide enough for one
    /// group says so.
    #[test]
    fn allocations_that_are_not_whole_replicas_are_infinite() {
        let policy = by_name("ymir").unwrap();
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let mut moe = job("moe", "rte", JobState::Queued, 8);
        moe.expert_parallel = 4;
        let dense = job("dense", "mrpc", JobState::Queued, 8);
        let v = view(vec![node("a", 4), node("b", 4)], vec![moe, dense]);
        let p = prepare(&v, policy.as_ref(), &cfg);
        let snap = snapshot(&v, &p, &estimates(&p, 3600.0), &cfg).unwrap();
        for (k, &a) in snap.allocations.iter().enumerate() {
            let (m, d) = (snap.jobs[0].remaining_s[k], snap.jobs[1].remaining_s[k]);
            assert_eq!(m.is_finite(), a > 0 && a % 4 == 0, "moe at {a}: {m}");
            assert_eq!(d.is_finite(), a > 0, "dense at {a}: {d}");
        }
        let why = never_fits(
            Replica::Experts(8),
            1,
            None,
            &[(4, "A100"), (4, "A100")],
            None,
        );
        assert!(why.is_some_and(|w| w.contains("needs 8 GPUs on one node")));
    }

    #[test]
    fn restart_cost_is_checkpoint_plus_the_profiles_context_switch() {
        assert_eq!(restart_cost(30.0, Some(12.5)), 42.5);
        assert_eq!(restart_cost(0.0, None), DEFAULT_CONTEXT_SWITCH_S);
    }

    #[test]
    fn fair_share_is_an_equal_share_capped_by_the_request() {
        assert_eq!(fair_share(8, 4, 4), 2.0);
        assert_eq!(fair_share(8, 2, 1), 1.0);
        assert_eq!(fair_share(8, 0, 4), 0.0);
    }

    /// Profiling takes free GPUs first, oldest job first, a pipeline job
    /// one replica (4 GPUs) on one node; the walk stops at the first job that
    /// finds nothing, and GPUs of running work are taken only under the
    /// eighth-of-the-cluster cap.
    #[test]
    fn profiling_reserves_free_gpus_oldest_first_within_the_cap() {
        let mut running = job("r", "qqp", JobState::Running, 3);
        running.holds = vec![(0, 0), (0, 1), (0, 2)];
        let mut old = job("old", "rte", JobState::Submitted, 1);
        old.submitted_at = -10.0;
        let new = job("new", "mrpc", JobState::Submitted, 1);
        let mut pipe = job("pipe", "sst2", JobState::Submitted, 2);
        pipe.pipeline = true;
        pipe.submitted_at = 5.0;
        let v = view(
            vec![node("a", 4), node("b", 2)],
            vec![running, new, old, pipe],
        );
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        let got: Vec<(usize, Vec<Gpu>)> = p
            .profiling
            .iter()
            .map(|r| (r.job, r.gpus.clone()))
            .collect();
        // old (job 2) first on the free GPU (0,3); new takes (1,0); the
        // pipeline job needs 4 GPUs on one node — nowhere free, and taking
        // running work's GPUs would pass the cap of 6/8 → 1: it waits.
        assert_eq!(got, vec![(2, vec![(0, 3)]), (1, vec![(1, 0)])]);
        // Capacity for the policy: node a loses its reserved GPU.
        assert_eq!(p.capacity, vec![3, 1]);
        // Unprofiled jobs stay out of the snapshot.
        assert_eq!(p.jobs, vec![0]);
    }

    /// A prompt-tuning job (skip_profiling) takes no profiling run: it is
    /// in the policy's snapshot from its first round, beside a fine-tuning
    /// job submitted with it that profiles first.
    #[test]
    fn a_job_that_skips_profiling_is_scheduled_at_once() {
        let mut prompt = job("p", "samsum", JobState::Submitted, 1);
        prompt.skip_profiling = true;
        let fine = job("f", "rte", JobState::Submitted, 1);
        let v = view(vec![node("a", 4)], vec![prompt, fine]);
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        let profiled: Vec<usize> = p.profiling.iter().map(|r| r.job).collect();
        assert_eq!(profiled, vec![1], "only the fine-tuning job profiles");
        assert_eq!(p.jobs, vec![0], "the prompt-tuning job is scheduled now");
    }

    #[test]
    fn a_suspect_node_keeps_what_it_runs_and_a_drained_one_gives_nothing() {
        let mut a = job("a", "qqp", JobState::Running, 2);
        a.holds = vec![(0, 0), (0, 1)];
        let mut nodes = vec![node("s", 4), node("d", 4), node("off", 4)];
        nodes[0].state = NodeState::Suspect;
        nodes[1].drained = true;
        nodes[2].state = NodeState::Offline;
        let v = view(nodes, vec![a]);
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        assert_eq!(p.nodes, vec![0, 1], "the offline node is out");
        assert_eq!(p.capacity, vec![2, 0]);
        assert_eq!(p.total_gpus, 8);
    }

    /// An operator's cordon: the running job keeps its GPUs, the queued
    /// one does not start there though GPUs are free, and no new profiling
    /// run lands there.
    #[test]
    fn a_cordoned_node_keeps_what_runs_there_and_takes_nothing_new() {
        let mut a = job("a", "qqp", JobState::Running, 2);
        a.holds = vec![(0, 0), (0, 1)];
        let b = job("b", "rte", JobState::Queued, 2);
        let c = job("c", "mrpc", JobState::Submitted, 1);
        let mut nodes = vec![node("c", 4)];
        nodes[0].cordoned = true;
        let v = view(nodes, vec![a, b, c]);
        let policy = by_name("srtf").unwrap();
        let p = prepare(&v, policy.as_ref(), &RoundConfig::default());
        assert!(
            p.profiling.is_empty(),
            "no new profiling run: {:?}",
            p.profiling
        );
        assert_eq!(p.capacity, vec![2], "what runs there");
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let d = run(&v, "srtf", &cfg);
        let ga = d.outcome.groups.iter().find(|g| g.jobs == [0]).unwrap();
        assert!(ga.kept);
        assert!(d.outcome.groups.iter().all(|g| !g.jobs.contains(&1)));
        // Uncordoned, b starts on the free GPUs.
        let mut v = v;
        v.nodes[0].cordoned = false;
        let d = run(&v, "srtf", &cfg);
        assert!(d.outcome.groups.iter().any(|g| g.jobs == [1]));
    }

    /// Predictions: a placed job finishes after its remaining time at its
    /// GPUs; it is at risk past its deadline; a waiting job is at risk
    /// only when even its fastest allocation started now misses.
    #[test]
    fn predictions_give_finish_times_and_deadline_risk() {
        let mut a = job("a", "qqp", JobState::Queued, 4);
        a.deadlines = crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(3000.0));
        let mut b = job("b", "rte", JobState::Queued, 4);
        b.deadlines = crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(500.0));
        let v = view(vec![node("n", 4)], vec![a, b]);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("edf").unwrap();
        let p = prepare(&v, policy.as_ref(), &cfg);
        let e = estimates(&p, 3600.0);
        let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
        let pr = predictions(&v, &p, &e, &d.outcome);
        // EDF runs b (earliest deadline) on the node; a waits.
        let pb = pr.iter().find(|x| x.job == 1).unwrap();
        let pa = pr.iter().find(|x| x.job == 0).unwrap();
        let placed = d.outcome.groups.iter().find(|g| g.jobs == [1]).unwrap();
        let k = p
            .allocations
            .iter()
            .position(|&x| x == placed.gpus.len() as u32)
            .unwrap();
        assert_eq!(pb.finish_in, Some(e.jobs[1][k]));
        // 3600 GPU-seconds on 4 GPUs: 900 s, past b's 500 s.
        assert!(
            pb.at_risk,
            "b needs {:?} s, its deadline is in 500 s",
            pb.finish_in
        );
        assert_eq!(pa.finish_in, None);
        let best = e.jobs[0].iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(pa.at_risk, best > 3000.0);
        // Before any agent registers the cluster has no GPUs and runs
        // nothing: no job is "at risk" for that (a first round used to
        // flag every deadline job "no allocation can run it", once).
        let mut empty = v.clone();
        empty.nodes.clear();
        let p = prepare(&empty, policy.as_ref(), &cfg);
        let e = Estimates {
            jobs: p
                .jobs
                .iter()
                .map(|_| vec![f64::INFINITY; p.allocations.len()])
                .collect(),
            ..Default::default()
        };
        let d = decide(&empty, &p, &e, policy.as_ref(), &cfg).unwrap();
        let pr = predictions(&empty, &p, &e, &d.outcome);
        assert_eq!(pr.len(), 2);
        assert!(
            pr.iter().all(|x| !x.at_risk && x.best_in.is_none()),
            "{pr:?}"
        );
    }

    /// Profiling takes GPUs from training up to `profiling_share` of the
    /// cluster (at least one).
    #[test]
    fn profiling_takes_at_most_its_share_from_training() {
        let mut a = job("a", "qqp", JobState::Running, 8);
        a.holds = (0..8).map(|g| (0, g)).collect();
        let mut jobs = vec![a];
        for (k, t) in ["rte", "mrpc", "cola", "stsb"].iter().enumerate() {
            let mut j = job(&format!("s{k}"), t, JobState::Submitted, 1);
            j.submitted_at = k as f64;
            jobs.push(j);
        }
        let v = view(vec![node("n", 8)], jobs);
        let policy = by_name("srtf").unwrap();
        let reserved = |share: f64| {
            let cfg = RoundConfig {
                profiling_share: share,
                ..Default::default()
            };
            prepare(&v, policy.as_ref(), &cfg).profiling.len()
        };
        assert_eq!(reserved(DEFAULT_PROFILING_SHARE), 1, "an eighth of 8");
        assert_eq!(reserved(0.5), 4);
        assert_eq!(reserved(0.01), 1, "at least one");
    }

    /// A drained node: its job moves to a node with room, or, with none,
    /// is queued saying why.
    #[test]
    fn a_drained_nodes_jobs_move_off_or_wait_saying_why() {
        let mut a = job("a", "qqp", JobState::Running, 2);
        a.holds = vec![(0, 0), (0, 1)];
        a.iteration = 40;
        let mut nodes = vec![node("d", 4), node("n", 2)];
        nodes[0].drained = true;
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let v = view(nodes.clone(), vec![a.clone()]);
        let d = run(&v, "srtf", &cfg);
        let g = d.outcome.groups.iter().find(|g| g.jobs == [0]).unwrap();
        assert_eq!(g.gpus, vec![(1, 0), (1, 1)], "moved to n");
        let v = view(vec![nodes[0].clone()], vec![a]);
        let d = run(&v, "srtf", &cfg);
        assert!(d.outcome.groups.is_empty());
        assert_eq!(
            d.outcome.transitions,
            vec![Transition {
                job: 0,
                to: JobState::Queued,
                reason: "node d is drained: moved off from its checkpoint (iteration 40)".into()
            }]
        );
    }

    #[test]
    fn a_group_that_keeps_its_node_and_size_keeps_its_gpus() {
        let mut a = job("a", "qqp", JobState::Running, 2);
        a.holds = vec![(0, 1), (0, 3)];
        let b = job("b", "rte", JobState::Queued, 2);
        let v = view(vec![node("n", 4)], vec![a, b]);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let d = run(&v, "srtf", &cfg);
        let ga = d.outcome.groups.iter().find(|g| g.jobs == [0]).unwrap();
        assert!(ga.kept);
        assert_eq!(ga.gpus, vec![(0, 1), (0, 3)]);
        let gb = d.outcome.groups.iter().find(|g| g.jobs == [1]).unwrap();
        assert!(!gb.kept);
        assert_eq!(gb.gpus, vec![(0, 0), (0, 2)], "the free GPUs");
        assert_eq!(d.outcome.switches, 1);
        assert_eq!(
            d.outcome.transitions,
            vec![Transition {
                job: 1,
                to: JobState::Running,
                reason: "placed on n (2 GPUs) by ymir".into()
            }]
        );
    }

    #[test]
    fn jobs_of_an_offline_node_are_requeued_naming_it() {
        let mut a = job("a", "qqp", JobState::Running, 4);
        a.holds = (0..4).map(|g| (1, g)).collect();
        a.iteration = 120;
        let mut nodes = vec![node("up", 2), node("gone", 4)];
        nodes[1].state = NodeState::Offline;
        let cfg = RoundConfig {
            profiling: false,
            max_nodes_per_group: Some(1),
            ..Default::default()
        };
        let d = run(&view(nodes, vec![a]), "srtf", &cfg);
        // Offered at most the largest remaining node: 2 GPUs there.
        assert_eq!(d.snapshot.jobs[0].max_gpus, 2);
        assert_eq!(d.snapshot.jobs[0].current_gpus, 0);
        assert_eq!(d.outcome.groups[0].gpus, vec![(0, 0), (0, 1)]);
        // Placed again in the same round, it still goes through `queued`:
        // its history names the lost node.
        let moves: Vec<(JobState, &str)> = d
            .outcome
            .transitions
            .iter()
            .map(|t| (t.to, t.reason.as_str()))
            .collect();
        assert_eq!(
            moves,
            vec![
                (
                    JobState::Queued,
                    "node gone is offline: re-queued from its last checkpoint (iteration 120)"
                ),
                (JobState::Running, "placed on up (2 GPUs) by ymir"),
            ]
        );
        let mut gone = job("b", "rte", JobState::Running, 4);
        gone.holds = (0..4).map(|g| (1, g)).collect();
        gone.iteration = 7;
        gone.min_gpus = 4;
        let mut nodes = vec![node("up", 2), node("gone", 4)];
        nodes[1].state = NodeState::Offline;
        let d = run(&view(nodes, vec![gone]), "srtf", &cfg);
        assert_eq!(
            d.outcome.transitions[0].reason,
            "node gone is offline: re-queued from its last checkpoint (iteration 7)"
        );
    }

    /// A spread the executor cannot run is named on the job, never dropped.
    #[test]
    fn a_placement_over_several_nodes_is_reported_when_the_executor_cannot_run_it() {
        let mut a = job("a", "qqp", JobState::Running, 2);
        a.holds = vec![(0, 0), (0, 1)];
        let mut b = job("b", "rte", JobState::Running, 2);
        b.holds = vec![(1, 0), (1, 1)];
        let c = job("c", "mrpc", JobState::Queued, 3);
        let v = view(vec![node("x", 4), node("y", 4)], vec![a, b, c]);
        let single = RoundConfig {
            profiling: false,
            max_nodes_per_group: Some(1),
            ..Default::default()
        };
        let d = run(&v, "srtf", &single);
        assert_eq!(d.outcome.unexecutable.len(), 1, "{:?}", d.outcome);
        assert_eq!(d.outcome.unexecutable[0].0, 2);
        assert!(
            d.outcome.unexecutable[0].1.contains("over nodes x, y"),
            "{}",
            d.outcome.unexecutable[0].1
        );
        assert!(d.outcome.groups.iter().all(|g| g.jobs != [2]));
        // An executor that runs gangs runs it.
        let any = RoundConfig {
            max_nodes_per_group: None,
            ..single
        };
        let d = run(&v, "srtf", &any);
        assert!(d.outcome.unexecutable.is_empty());
        let g = d.outcome.groups.iter().find(|g| g.jobs == [2]).unwrap();
        assert_eq!(g.nodes(), vec![0, 1]);
    }

    /// The round offers the policy's own allocation set: Optimus grows
    /// jobs one GPU at a time, so 5–7 GPUs on an 8-GPU node are offered to
    /// it, where Ymir's set {0, 1, 2, 3, 4m} has none of them.
    #[test]
    fn the_policy_decides_its_own_allocation_set() {
        let v = view(
            vec![node("n", 8)],
            vec![job("a", "qqp", JobState::Queued, 8)],
        );
        let cfg = RoundConfig {
            profiling: false,
            max_nodes_per_group: Some(1),
            ..Default::default()
        };
        let optimus = prepare(&v, by_name("optimus").unwrap().as_ref(), &cfg);
        assert_eq!(optimus.allocations, (0..=8).collect::<Vec<u32>>());
        let ymir = prepare(&v, by_name("ymir").unwrap().as_ref(), &cfg);
        assert_eq!(ymir.allocations, vec![0, 1, 2, 3, 4, 8]);
    }

    /// The set stops at the widest size a job of the round may take: its
    /// maximum, or the GPUs it holds. On 32 GPUs, Ymir's set would run to
    /// 32 and every estimate row with it.
    #[test]
    fn the_allocation_set_stops_at_the_widest_job() {
        let nodes = (0..4).map(|n| node(&format!("n{n}"), 8)).collect();
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let ymir = by_name("ymir").unwrap();
        let small = vec![
            job("a", "qqp", JobState::Queued, 4),
            job("b", "rte", JobState::Queued, 2),
        ];
        let p = prepare(&view(nodes, small.clone()), ymir.as_ref(), &cfg);
        assert_eq!(p.allocations, vec![0, 1, 2, 3, 4]);
        // A running job holding 12 GPUs (more than its maximum of 2).
        let mut held = job("c", "sst2", JobState::Running, 2);
        held.holds = (0..12u32).map(|g| ((g / 8) as usize, g % 8)).collect();
        let nodes = (0..4).map(|n| node(&format!("n{n}"), 8)).collect();
        let p = prepare(
            &view(nodes, [small, vec![held]].concat()),
            ymir.as_ref(),
            &cfg,
        );
        assert_eq!(p.allocations, vec![0, 1, 2, 3, 4, 8, 12]);
        let nodes = (0..4).map(|n| node(&format!("n{n}"), 8)).collect();
        let optimus = by_name("optimus").unwrap();
        let p = prepare(
            &view(nodes, vec![job("d", "qqp", JobState::Queued, 3)]),
            optimus.as_ref(),
            &cfg,
        );
        assert_eq!(p.allocations, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_job_wider_than_every_node_is_unschedulable_on_a_single_node_executor() {
        let mut wide = job("w", "qqp", JobState::Queued, 8);
        wide.min_gpus = 8;
        let v = view(vec![node("x", 4), node("y", 4)], vec![wide]);
        let cfg = RoundConfig {
            profiling: false,
            max_nodes_per_group: Some(1),
            ..Default::default()
        };
        let d = run(&v, "ymir", &cfg);
        assert!(d.snapshot.jobs.is_empty());
        assert!(d.outcome.unschedulable[0].1.contains("largest node has 4"));
    }

    /// Two 4-stage pipeline jobs share one 8-GPU server on the service's
    /// single-node executor (they waited forever when "whole servers"
    /// meant the largest node's size); on 2-GPU servers a pipeline job can
    /// never run and says so instead of waiting silently.
    #[test]
    fn pipeline_jobs_take_replicas_inside_nodes_and_say_when_none_fits() {
        let pipe = |id: &str, task: &str| {
            let mut j = job(id, task, JobState::Queued, 4);
            j.pipeline = true;
            j.min_gpus = 4;
            j.max_gpus = 4;
            j
        };
        let cfg = RoundConfig {
            profiling: false,
            merging: false,
            max_nodes_per_group: Some(1),
            ..Default::default()
        };
        let v = view(
            vec![node("big", 8)],
            vec![pipe("p", "qqp"), pipe("q", "rte")],
        );
        let d = run(&v, "ymir", &cfg);
        let mut got: Vec<Vec<Gpu>> = d.outcome.groups.iter().map(|g| g.gpus.clone()).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                vec![(0, 0), (0, 1), (0, 2), (0, 3)],
                vec![(0, 4), (0, 5), (0, 6), (0, 7)]
            ],
            "{d:?}"
        );
        let v = view(vec![node("a", 2), node("b", 2)], vec![pipe("p", "qqp")]);
        let d = run(&v, "ymir", &cfg);
        assert!(d.outcome.groups.is_empty());
        let why = &d.outcome.unschedulable[0].1;
        assert!(
            why.contains("pipeline") && why.contains("largest node has 2"),
            "{why}"
        );
        // Nor may it profile on those nodes and hold up the jobs behind it.
        let mut sub = pipe("p", "qqp");
        sub.state = JobState::Submitted;
        let v = view(
            vec![node("a", 2), node("b", 2)],
            vec![sub, job("d", "rte", JobState::Submitted, 1)],
        );
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        assert_eq!(p.profiling.len(), 1);
        assert_eq!(p.profiling[0].job, 1, "the data-parallel job profiles");
        assert_eq!(p.unschedulable.len(), 1);
    }

    /// `resources.gpu_model` acts: the job profiles and runs on its family
    /// only, never merges with a job bound to another, and on a cluster
    /// without that family it says so instead of waiting silently.
    #[test]
    fn a_job_runs_only_on_the_gpu_model_it_asks_for() {
        let mut nodes = vec![node("a100", 4), node("h100", 4)];
        nodes[1].gpu_model = "H100".into();
        let mut h = job("h", "qqp", JobState::Submitted, 1);
        h.gpu_model = Some("H100".into());
        let v = view(nodes.clone(), vec![h.clone()]);
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        assert_eq!(
            p.profiling[0].gpus,
            vec![(1, 0)],
            "profiles on the H100 node"
        );

        h.state = JobState::Queued;
        let mut a = job("a", "rte", JobState::Queued, 1);
        a.gpu_model = Some("A100".into());
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let v = view(nodes.clone(), vec![h.clone(), a]);
        let p = prepare(&v, by_name("ymir").unwrap().as_ref(), &cfg);
        assert!(p.eligible.is_empty(), "no merge across GPU models");
        let d = run(&v, "ymir", &cfg);
        for g in &d.outcome.groups {
            let want = if g.jobs == vec![0] { 1 } else { 0 };
            assert!(g.gpus.iter().all(|x| x.0 == want), "{g:?}");
        }

        // On the single-node executor it is offered its family's largest
        // node (4 H100s), not the cluster's (8 A100s), so it runs there
        // rather than wait for 8 H100s on one node.
        let mut wide = h.clone();
        wide.max_gpus = 8;
        wide.requested_gpus = 8;
        let mut nodes8 = nodes.clone();
        nodes8[0].gpus = 8;
        let single = RoundConfig {
            max_nodes_per_group: Some(1),
            ..cfg.clone()
        };
        let d = run(&view(nodes8, vec![wide]), "srtf", &single);
        assert_eq!(d.snapshot.jobs[0].max_gpus, 4);
        assert_eq!(d.outcome.groups[0].gpus.len(), 4, "{d:?}");
        assert!(d.outcome.groups[0].gpus.iter().all(|g| g.0 == 1));

        let v = view(vec![node("a", 8)], vec![h]);
        let d = run(&v, "ymir", &cfg);
        assert!(d.outcome.groups.is_empty());
        let why = &d.outcome.unschedulable[0].1;
        assert!(why.contains("no node has GPU model H100"), "{why}");
    }

    /// A running job that trains alone on A100s moves to the H100s the
    /// round leaves free (3,600 s of work there takes 40 % of the time),
    /// and the round says so in its history: the family, the GPUs, the
    /// node and the iteration it resumes from. Held where it is (no ratio
    /// to H100s), it stays and nothing is said.
    #[test]
    fn a_job_moved_to_a_faster_family_says_from_which_to_which() {
        let mut nodes = vec![node("a100", 4), node("h100", 4)];
        nodes[1].gpu_model = "H100".into();
        let mut j = job("long", "qqp", JobState::Running, 2);
        (j.holds, j.iteration, j.progress) = (vec![(0, 0), (0, 1)], 700, 0.1);
        j.family_time_ratio = vec![("H100".into(), 0.4)];
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let d = run(&view(nodes.clone(), vec![j.clone()]), "ymir", &cfg);
        let g = &d.outcome.groups[0];
        assert_eq!(g.gpus, vec![(1, 0), (1, 1)], "{d:?}");
        let v = view(nodes.clone(), vec![j.clone()]);
        assert_eq!(
            restarts(&v, &d.outcome.groups),
            vec![(
                0,
                "moved",
                "moved from A100 to H100 GPUs (2 on h100), from its checkpoint (iteration 700)"
                    .to_string()
            )]
        );

        j.family_time_ratio.clear();
        let v = view(nodes, vec![j]);
        let d = run(&v, "ymir", &cfg);
        assert!(d.outcome.groups[0].kept, "{d:?}");
        assert!(restarts(&v, &d.outcome.groups).is_empty());
    }

    /// A temporal pair whose A trains on V100s moves to H100s that are
    /// free, as a job alone does (rule 4), its time there from both
    /// members' ratios: B's are at the GPUs its A holds, where it will
    /// train. Found on a generated mixed load: a pair whose A had 850
    /// epochs to train sat 54 h on 4 V100s, the last 48 h with the rest of
    /// the cluster idle, as only jobs alone had times on other families.
    /// A spatial pair (one joint process) gets none; a pair whose B's time
    /// there is unknown stays.
    #[test]
    fn tail_a_temporal_pair_moves_to_a_faster_family_that_frees_up() {
        let mut nodes = vec![node("v100", 4), node("h100", 4)];
        nodes[0].gpu_model = "V100".into();
        nodes[1].gpu_model = "H100".into();
        let mut a = job("a", "fashion_mnist", JobState::Running, 4);
        (a.holds, a.iteration, a.progress) = ((0..4).map(|g| (0, g)).collect(), 700, 0.1);
        let b = job("b", "food101", JobState::Queued, 4);
        let mut v = view(nodes, vec![a, b]);
        v.merges.push(MergeView {
            a: 0,
            b: 1,
            mode: MergeMode::Temporal,
        });
        // Each job's seconds: H100s 2.5× as fast, at the GPUs asked.
        let mut asked = Vec::new();
        family_time_ratios(&mut v, |j, family, gpus, _| {
            asked.push((j, family.to_string(), gpus));
            Ok::<_, ()>(Some(if family == "H100" { 0.4 } else { 1.0 }))
        })
        .unwrap();
        assert!(
            asked.contains(&(1, "V100".to_string(), 4)),
            "B at A's GPUs: {asked:?}"
        );
        for j in &v.jobs {
            assert_eq!(
                j.family_time_ratio,
                vec![("H100".to_string(), 0.4)],
                "{}",
                j.id
            );
        }
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let pair = |d: &Decision| {
            let g = d.outcome.groups.iter().find(|g| g.jobs == vec![0, 1]);
            g.cloned()
                .unwrap_or_else(|| panic!("the pair does not run: {d:?}"))
        };
        let d = run(&v, "ymir", &cfg);
        assert!(
            pair(&d).gpus.iter().all(|x| x.0 == 1),
            "not on the H100s: {d:?}"
        );
        assert_eq!(restarts(&v, &d.outcome.groups)[0].1, "moved");

        // Without B's time on H100s the pair's is not known: it stays.
        let mut unknown = v.clone();
        unknown.jobs[1].family_time_ratio.clear();
        let d = run(&unknown, "ymir", &cfg);
        assert!(pair(&d).kept, "{d:?}");

        // A spatial pair gets no times on other families.
        let mut spatial = v.clone();
        spatial.merges[0].mode = MergeMode::Spatial;
        for j in &mut spatial.jobs {
            j.family_time_ratio.clear();
        }
        family_time_ratios(&mut spatial, |_, _, _, _| Ok::<_, ()>(Some(1.0))).unwrap();
        assert!(spatial.jobs.iter().all(|j| j.family_time_ratio.is_empty()));
    }

    /// A running job restarted elsewhere in one round says where and why in
    /// its history: off a drained node onto another of the same family
    /// (its state stays running, so no transition says it), resized on its
    /// node, or moved to other GPUs of it. A kept group, a job of a lost
    /// node (its transitions say it) and a merge decided this round (the
    /// merge event says it) write nothing here.
    #[test]
    fn a_job_restarted_within_its_family_says_so_in_its_history() {
        let mut nodes = vec![node("a", 4), node("b", 4)];
        nodes[1].drained = true;
        let mut j = job("long", "qqp", JobState::Running, 4);
        (j.holds, j.iteration, j.progress) = ((0..4).map(|g| (1, g)).collect(), 2380, 0.1);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let v = view(nodes.clone(), vec![j.clone()]);
        let d = run(&v, "ymir", &cfg);
        assert_eq!(
            d.outcome.groups[0].gpus,
            (0..4).map(|g| (0, g)).collect::<Vec<_>>()
        );
        assert_eq!(
            restarts(&v, &d.outcome.groups),
            vec![(
                0,
                "moved",
                "moved from b to a (4 GPUs) (node b is drained), from its checkpoint \
                 (iteration 2380)"
                    .to_string()
            )]
        );
        // The round's transitions say nothing of it: running stays running.
        assert!(d.outcome.transitions.is_empty(), "{d:?}");

        nodes[1].drained = false;
        let v = view(nodes.clone(), vec![j.clone()]);
        let on =
            |gpus: Vec<Gpu>, kept: bool| vec![Group::new(vec![0], MergeMode::Normal, gpus, kept)];
        assert_eq!(
            restarts(&v, &on(vec![(1, 0), (1, 1)], false)),
            vec![(
                0,
                "resized",
                "resized from 4 to 2 GPUs on b, from its checkpoint (iteration 2380)".to_string()
            )]
        );
        let mut two = j.clone();
        two.holds = vec![(1, 0), (1, 1)];
        let v2 = view(nodes.clone(), vec![two]);
        assert_eq!(
            restarts(&v2, &on(vec![(1, 2), (1, 3)], false)),
            vec![(
                0,
                "moved",
                "moved to other GPUs of b (2), from its checkpoint (iteration 2380)".to_string()
            )]
        );
        assert_eq!(
            restarts(&v2, &on(vec![(0, 0), (0, 1), (1, 0), (1, 1)], false))[0].2,
            "resized from 2 to 4 GPUs on a+b, from its checkpoint (iteration 2380)"
        );
        assert!(restarts(&v, &on((0..4).map(|g| (1, g)).collect(), true)).is_empty());
        let mut merged = on((0..4).map(|g| (0, g)).collect(), false);
        merged[0].new_merge = Some((1.2, 1.0));
        assert!(restarts(&v, &merged).is_empty());
        nodes[1].state = NodeState::Offline;
        let v = view(nodes, vec![j]);
        assert!(restarts(&v, &on((0..4).map(|g| (0, g)).collect(), false)).is_empty());
    }

    /// A job that does not fit the V100s, with the A100 node held by a job
    /// that could run there: once it has waited longer than the move
    /// costs (30 s of restart and 900 s more on V100s, twice as slow), the
    /// round moves the other job to the V100 node, says so, and runs the
    /// waiting one on the A100s; before, it waits and nothing moves.
    #[test]
    fn tail_a_job_that_fits_some_families_only_gets_room_in_the_round() {
        let mut nodes = vec![node("v100", 4), node("a100", 4)];
        nodes[0].gpu_model = "V100".into();
        let mut long = job("long", "qqp", JobState::Running, 4);
        (long.holds, long.iteration, long.progress) = ((0..4).map(|g| (1, g)).collect(), 700, 0.1);
        long.family_time_ratio = vec![("V100".into(), 2.0)];
        let mut big = job("big", "alpaca", JobState::Queued, 4);
        big.unfit_families = vec!["V100".into()];
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let at = |now: f64| {
            let mut v = view(nodes.clone(), vec![long.clone(), big.clone()]);
            v.now = now;
            let d = run(&v, "ymir", &cfg);
            (restarts(&v, &d.outcome.groups), d)
        };
        let (moves, d) = at(2000.0);
        let on = |d: &Decision, j: usize| {
            d.outcome
                .groups
                .iter()
                .find(|g| g.jobs == vec![j])
                .map(|g| g.gpus.clone())
        };
        assert_eq!(on(&d, 1), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
        assert_eq!(
            moves,
            vec![(
                0,
                "moved",
                "moved from A100 to V100 GPUs (4 on v100), from its checkpoint (iteration 700)"
                    .to_string()
            )]
        );
        let (moves, d) = at(500.0);
        assert_eq!(on(&d, 0), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
        assert_eq!(on(&d, 1), None);
        assert!(moves.is_empty());
        // Its history says why it waits though the plan ran it.
        assert_eq!(
            d.outcome.unplaced,
            vec![(
                1,
                "waiting: the plan runs it on 4 GPUs, but placement found no room for them \
                 on GPUs other than V100 (its model does not fit those)"
                    .to_string()
            )]
        );
        assert_eq!(d.outcome.stats.unplaced_jobs, vec![(1, 4)]);
    }

    /// Both jobs fit the A100 node only; the one running there has 36,000
    /// s left, the one waiting 1,000 s: Ymir's round suspends the longer
    /// one for the shorter (placement's rule 6) and its history names the
    /// job its GPUs went to; with `displace_longer` off it runs on.
    #[test]
    fn tail_a_job_that_fits_some_families_only_takes_gpus_from_a_longer_one_in_the_round() {
        let mut nodes = vec![node("v100", 4), node("a100", 4)];
        nodes[0].gpu_model = "V100".into();
        let mut long = job("long", "alpaca", JobState::Running, 4);
        (long.holds, long.iteration, long.progress) = ((0..4).map(|g| (1, g)).collect(), 700, 0.1);
        let mut short = job("short", "dolly", JobState::Queued, 4);
        for j in [&mut long, &mut short] {
            j.unfit_families = vec!["V100".into()];
        }
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let mut v = view(nodes, vec![long, short]);
        v.now = 2000.0;
        let decide_with = |knobs: &[(&str, f64)]| {
            let knobs = knobs.iter().map(|(k, x)| (k.to_string(), *x)).collect();
            let policy = crate::policy::baselines::with_knobs("ymir", &knobs).unwrap();
            let p = prepare(&v, policy.as_ref(), &cfg);
            let mut e = estimates(&p, 3600.0);
            e.jobs = vec![linear(&p, 4.0 * 36_000.0), linear(&p, 4.0 * 1000.0)];
            decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap()
        };
        let on = |d: &Decision, j: usize| {
            d.outcome
                .groups
                .iter()
                .find(|g| g.jobs == vec![j])
                .map(|g| g.gpus.clone())
        };
        let d = decide_with(&[]);
        assert_eq!(on(&d, 1), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
        assert_eq!(on(&d, 0), None);
        let why = d
            .outcome
            .transitions
            .iter()
            .find(|t| t.job == 0)
            .map(|t| t.reason.clone())
            .unwrap_or_default();
        assert_eq!(
            why,
            format!(
                "suspended from its checkpoint (iteration 700): its GPUs go to job {}, which has \
                 less left to run and fits only some GPU families (shortest remaining time first)",
                v.jobs[1].id
            )
        );
        let d = decide_with(&[("displace_longer", 0.0)]);
        assert_eq!(on(&d, 0), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
        assert_eq!(on(&d, 1), None);
    }

    /// A group runs on one GPU family, so a job that may grow past what one
    /// family holds is offered the most one family holds, not the
    /// cluster's GPUs: on 6 A100s and 2 + 2 H100s, a job of up to 100 GPUs
    /// runs on the 6 A100s (it was planned on all 10, placement found no
    /// room for them, and it waited on an empty cluster). Its own
    /// `gpu_model` narrows the offer to that family (over one node when a
    /// group may not span nodes), and a family its model does not fit is
    /// not offered.
    #[test]
    fn a_job_is_offered_no_more_gpus_than_one_gpu_family_holds() {
        let mut nodes = vec![node("a100", 6), node("h100-1", 2), node("h100-2", 2)];
        nodes[1].gpu_model = "H100".into();
        nodes[2].gpu_model = "H100".into();
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        for policy in ["ymir", "pollux"] {
            let mut big = job("big", "cola", JobState::Queued, 1);
            big.max_gpus = 100;
            let d = run(&view(nodes.clone(), vec![big]), policy, &cfg);
            assert_eq!(d.snapshot.jobs[0].max_gpus, 6, "{policy}");
            assert!(d.outcome.unplaced.is_empty(), "{policy}: {d:?}");
            assert_eq!(d.outcome.groups.len(), 1, "{policy}: {d:?}");
            let gpus = &d.outcome.groups[0].gpus;
            // The widest size of the policy's set that one family holds
            // (Ymir's {0,1,2,3,4m}: 4).
            let widest = d.snapshot.allocations.iter().filter(|&&a| a <= 6).max();
            assert_eq!(Some(&(gpus.len() as u32)), widest, "{policy}: {d:?}");
            let families: BTreeSet<&str> =
                gpus.iter().map(|g| nodes[g.0].gpu_model.as_str()).collect();
            assert_eq!(families.len(), 1, "{policy}: {d:?}");
        }
        // Over nodes of one family only when a group may span nodes.
        let single = RoundConfig {
            max_nodes_per_group: Some(1),
            ..cfg.clone()
        };
        let mut big = job("big", "cola", JobState::Queued, 1);
        big.max_gpus = 100;
        big.gpu_model = Some("H100".into());
        let d = run(&view(nodes.clone(), vec![big.clone()]), "ymir", &cfg);
        assert_eq!(d.snapshot.jobs[0].max_gpus, 4);
        let d = run(&view(nodes.clone(), vec![big.clone()]), "ymir", &single);
        assert_eq!(d.snapshot.jobs[0].max_gpus, 2);
        // A family the model does not fit is never offered.
        big.gpu_model = None;
        big.unfit_families = vec!["A100".into()];
        let d = run(&view(nodes.clone(), vec![big]), "ymir", &cfg);
        assert_eq!(d.snapshot.jobs[0].max_gpus, 4);
        assert!(d.outcome.groups[0].gpus.iter().all(|g| g.0 > 0), "{d:?}");
    }

    /// A job whose model does not fit a family's GPUs profiles and runs on
    /// the other family only, is estimated there, and on a cluster of that
    /// family alone it waits with an event saying why; the jobs behind it
    /// still profile.
    #[test]
    fn a_job_never_uses_a_family_its_model_does_not_fit() {
        let mut nodes = vec![node("v100", 4), node("a100", 4)];
        nodes[0].gpu_model = "V100".into();
        let mut big = job("big", "alpaca", JobState::Submitted, 1);
        big.unfit_families = vec!["V100".into()];
        let v = view(nodes.clone(), vec![big.clone()]);
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        assert_eq!(
            p.profiling[0].gpus,
            vec![(1, 0)],
            "profiles on the A100 node"
        );
        assert_eq!(estimate_shape(&v, &big).unwrap().0, "A100");
        big.state = JobState::Queued;
        big.holds = vec![(0, 0)];
        assert_eq!(
            estimate_shape(&view(nodes.clone(), vec![big.clone()]), &big)
                .unwrap()
                .0,
            "A100",
            "not estimated on the GPUs it holds but cannot run on"
        );
        big.holds.clear();
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let d = run(&view(nodes.clone(), vec![big.clone()]), "fifo", &cfg);
        assert!(
            d.outcome.groups[0].gpus.iter().all(|g| g.0 == 1),
            "{:?}",
            d.outcome.groups
        );
        let v100 = vec![nodes[0].clone()];
        let d = run(&view(v100.clone(), vec![big.clone()]), "fifo", &cfg);
        assert!(d.outcome.groups.is_empty());
        let why = &d.outcome.unschedulable[0].1;
        assert!(why.contains("does not fit the GPU memory of V100"), "{why}");
        let mut first = big.clone();
        first.state = JobState::Submitted;
        let v = view(
            v100,
            vec![first, job("small", "rte", JobState::Submitted, 1)],
        );
        let p = prepare(
            &v,
            by_name("ymir").unwrap().as_ref(),
            &RoundConfig::default(),
        );
        assert_eq!(
            p.profiling.len(),
            1,
            "the job behind it profiles: {:?}",
            p.profiling
        );
        assert_eq!(p.profiling[0].job, 1);
    }

    /// Eligible pairs: one model, different tasks, sharing, never merged,
    /// one training setup; temporal both ways, spatial once; neither of a
    /// spatial pair started, and B of a temporal one not started (A may
    /// have trained: B then starts from where A ends).
    #[test]
    fn merge_candidates_are_filtered_before_anything_is_estimated() {
        let mut jobs = vec![
            job("a", "rte", JobState::Queued, 1),
            job("b", "mrpc", JobState::Queued, 1),
            job("c", "rte", JobState::Queued, 1), // same task as a
            job("d", "qqp", JobState::Queued, 1),
            job("e", "sst2", JobState::Queued, 1),
            job("f", "cola", JobState::Queued, 1), // trains differently
        ];
        jobs[3].sharing = false;
        jobs[4].progress = 0.1;
        jobs[5].merge_setup = "amp=true ckpt=false petl=lora frozen=0".into();
        let v = view(vec![node("n", 4)], jobs);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let p = prepare(&v, by_name("ymir").unwrap().as_ref(), &cfg);
        let key = |a, b, mode| PairKey { a, b, mode };
        use MergeMode::*;
        assert_eq!(
            p.eligible,
            vec![
                key(0, 1, Temporal),
                key(0, 1, Spatial),
                key(1, 0, Temporal),
                key(1, 2, Temporal),
                key(1, 2, Spatial),
                key(2, 1, Temporal),
                // e has trained: only as the A of a temporal pair.
                key(4, 0, Temporal),
                key(4, 1, Temporal),
                key(4, 2, Temporal),
            ]
        );
        // A baseline merges nothing: no candidates at all.
        let p = prepare(&v, by_name("srtf").unwrap().as_ref(), &cfg);
        assert!(p.eligible.is_empty());
    }

    /// Ymir's round on one temporal pair a ↦ b (`helpful_temporal`, its
    /// `TranWt` set to `tran_wt` where given), the two jobs queued on one
    /// 2-GPU node.
    fn decide_temporal(a: JobView, b: JobView, tran_wt: Option<f64>) -> Decision {
        let v = view(vec![node("n", 2)], vec![a, b]);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let p = prepare(&v, policy.as_ref(), &cfg);
        let mut e = estimates(&p, 3600.0);
        let mut c = helpful_temporal(&p, 0, 1);
        if let Some(w) = tran_wt {
            for x in c.tran_wt.iter_mut().filter(|x| **x > 0.0) {
                *x = w;
            }
        }
        e.candidates.push(c);
        decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap()
    }

    /// How many candidates Ymir's round keeps of one temporal pair a ↦ b
    /// ([`decide_temporal`]).
    fn temporal_candidates(a: JobView, b: JobView, tran_wt: Option<f64>) -> usize {
        decide_temporal(a, b, tran_wt).snapshot.candidates.len()
    }

    /// Merging with deadlines: a pair whose best time would make B (of a
    /// temporal pair) miss its deadline is no candidate; with a deadline
    /// it can meet, or one only on A, it stays one.
    #[test]
    fn a_merge_that_would_miss_a_deadline_is_no_candidate() {
        let steps = |by: f64| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by));
        let candidates = |deadline_a: Option<f64>, deadline_b: Option<f64>| {
            let mut a = job("a", "rte", JobState::Queued, 1);
            let mut b = job("b", "mrpc", JobState::Queued, 1);
            a.deadlines = deadline_a.map(steps).unwrap_or_default();
            b.deadlines = deadline_b.map(steps).unwrap_or_default();
            temporal_candidates(a, b, None)
        };
        // The pair's best: A on 2 GPUs (1800 s), then B from A's weights
        // (180 s) after its restart (30 s).
        assert_eq!(candidates(None, None), 1);
        assert_eq!(candidates(None, Some(1000.0)), 0, "B would miss");
        assert_eq!(candidates(None, Some(5000.0)), 1, "B makes it");
        assert_eq!(candidates(Some(1000.0), None), 1, "A trains as alone");
    }

    /// The temporal candidate a ↦ b's time at 1 and 2 GPUs, the two jobs
    /// asking for 2 ([`decide_temporal`]; A needs 3600 / x s, B from A's
    /// weights 360 / x s after its 30 s restart); infinite where it is no
    /// candidate.
    fn pair_times(a: JobView, b: JobView) -> [f64; 2] {
        let d = decide_temporal(a, b, None);
        assert!(d.snapshot.allocations.starts_with(&[0, 1, 2]));
        let Some(c) = d.snapshot.candidates.first() else {
            return [f64::INFINITY; 2];
        };
        [c.remaining_s[1], c.remaining_s[2]]
    }

    /// A pair that meets B's deadline at its best allocation but not at a
    /// smaller one may not run at the smaller one: the policy could give
    /// it those GPUs, and B would miss. Its time there is infinite.
    #[test]
    fn a_merge_may_not_run_where_it_would_miss_a_deadline() {
        let steps = |by: f64| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by));
        let a = || job("a", "rte", JobState::Queued, 2);
        let b = || job("b", "mrpc", JobState::Queued, 2);
        assert_eq!(pair_times(a(), b()), [3990.0, 2010.0]);
        let mut due_b = b();
        due_b.deadlines = steps(3000.0);
        assert_eq!(pair_times(a(), due_b), [f64::INFINITY, 2010.0]);
    }

    /// A of a temporal pair that trains now is launched again to evaluate
    /// B: the merge costs it a restart, so an allocation at which its own
    /// time plus that restart misses its deadline is no option (it missed
    /// by its restart on generated SLO workloads). A that has not started
    /// pays its start alone too, and its deadline does not bind the pair.
    #[test]
    fn a_merge_may_not_make_its_running_a_miss_by_a_restart() {
        let steps = |by: f64| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by));
        let b = || job("b", "mrpc", JobState::Queued, 2);
        let a = |running: bool, by: f64| {
            let mut a = job("a", "rte", JobState::Queued, 2);
            if running {
                a.state = JobState::Running;
                a.holds = vec![(0, 0), (0, 1)];
            }
            a.deadlines = steps(by);
            a
        };
        // A alone needs 1800 s on 2 GPUs, and 1830 s with the restart.
        assert_eq!(pair_times(a(true, 1820.0), b()), [f64::INFINITY; 2]);
        assert_eq!(pair_times(a(true, 1840.0), b()), [f64::INFINITY, 2010.0]);
        assert_eq!(pair_times(a(false, 1820.0), b()), [3990.0, 2010.0]);
    }

    /// A pair whose `TranWt` is 1 at every allocation (B needs as many
    /// epochs from A's weights as alone) gains nothing and is no candidate
    /// (`policy::merge_gains`); the same pair with a gain is one.
    #[test]
    fn tail_a_pair_without_gain_is_no_candidate() {
        let candidates = |w: f64| {
            temporal_candidates(
                job("a", "rte", JobState::Queued, 1),
                job("b", "mrpc", JobState::Queued, 1),
                Some(w),
            )
        };
        assert_eq!(candidates(1.0), 0, "no gain");
        assert_eq!(candidates(1.01), 1, "a gain");
    }

    /// One process trains a merge, so it never runs below either job's
    /// `min_gpus`: a candidate pair with a job that needs 8 GPUs has no
    /// time at fewer, and a kept merge with one neither (found when the
    /// 40-job e2e's 8-GPU gangs were merged and placed on 1 GPU).
    /// A finished job of the model whose weights a new job may start from.
    fn finished(id: &str, task: &str) -> FinishedView {
        FinishedView {
            id: id.into(),
            model: "roberta-base".into(),
            task: task.into(),
            sharing: true,
            pipeline: false,
            merge_setup: String::new(),
            queue: String::new(),
        }
    }

    /// The warm start of job `job` from `from` at `work` seconds of work.
    fn warm(p: &Prepared, job: usize, from: usize, work: f64) -> WarmEstimate {
        WarmEstimate {
            key: WarmKey { job, from },
            seconds: linear(p, work),
            gain: 0.3,
        }
    }

    /// A new job starts from the finished job whose weights save it the
    /// most (Eq. 12 with A done: `T_B / T_{A↦B}`), its times in the
    /// policy's snapshot are those from the weights, the outcome names the
    /// start, and it is no candidate for a new merge that round.
    #[test]
    fn tail_a_new_job_starts_from_the_finished_job_that_saves_it_most() {
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let mut v = view(
            vec![node("a", 4)],
            vec![
                job("b", "snli", JobState::Queued, 4),
                job("other", "mrpc", JobState::Queued, 4),
            ],
        );
        v.finished = vec![finished("rte-done", "rte"), finished("qnli-done", "qnli")];
        let p = prepare(&v, policy.as_ref(), &cfg);
        // Both jobs may start from both finished ones.
        assert_eq!(
            p.warm,
            vec![
                WarmKey { job: 0, from: 0 },
                WarmKey { job: 0, from: 1 },
                WarmKey { job: 1, from: 0 },
                WarmKey { job: 1, from: 1 },
            ]
        );
        let mut e = estimates(&p, 3600.0);
        e.warm = vec![warm(&p, 0, 0, 2520.0), warm(&p, 0, 1, 3000.0)];
        assert_eq!(chosen_warm_starts(&p, &e), BTreeMap::from([(0, 0)]));
        let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
        assert_eq!(d.snapshot.jobs[0].remaining_s, linear(&p, 2520.0));
        assert_eq!(d.snapshot.jobs[1].remaining_s, linear(&p, 3600.0));
        assert!(
            d.outcome.groups.iter().any(|g| g.jobs == [0]),
            "b runs alone: {:?}",
            d.outcome.groups
        );
        assert_eq!(
            d.outcome.warm_starts,
            vec![WarmStart {
                job: 0,
                from: 0,
                gain: 0.3,
            }]
        );
        // A pair other ↦ b is weighed against b's start (Eq. 12 with T_B
        // from the weights): (2·2520 + 3600) / (2·3600 + 360) = 8640 / 7560
        // at every allocation, not the 1.8 estimated from scratch. Merged
        // as B, b starts from other's output, not from the finished job.
        e.candidates.push(helpful_temporal(&p, 1, 0));
        let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
        let c = &d.snapshot.candidates[0];
        for (k, &a) in d.snapshot.allocations.iter().enumerate() {
            let want = if a == 0 { 0.0 } else { 8640.0 / 7560.0 };
            assert!(
                (c.tran_wt[k] - want).abs() < 1e-9,
                "at {a}: {}",
                c.tran_wt[k]
            );
        }
        if d.outcome.groups.iter().any(|g| g.jobs == [1, 0]) {
            assert!(d.outcome.warm_starts.is_empty(), "{:?}", d.outcome);
        }
        // With no pair gaining over the start, no candidate.
        let mut weak = e.clone();
        weak.candidates[0].seconds = linear(&p, 3000.0);
        let d = decide(&v, &p, &weak, policy.as_ref(), &cfg).unwrap();
        assert!(
            d.snapshot.candidates.is_empty(),
            "{:?}",
            d.snapshot.candidates
        );
    }

    /// Weights that do not save time are no start (`TranWt > 1` as for a
    /// merge), and nothing is offered from a finished job of the same
    /// task, one whose user does not share, one trained otherwise, to a
    /// job that does not share or has trained.
    #[test]
    fn tail_a_warm_start_must_gain_and_is_offered_only_between_sharers_trained_alike() {
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let mut v = view(
            vec![node("a", 4)],
            vec![job("b", "snli", JobState::Queued, 4)],
        );
        v.finished = vec![finished("rte-done", "rte")];
        let p = prepare(&v, policy.as_ref(), &cfg);
        let mut e = estimates(&p, 3600.0);
        e.warm = vec![warm(&p, 0, 0, 3600.0)];
        let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
        assert!(chosen_warm_starts(&p, &e).is_empty());
        assert!(d.outcome.warm_starts.is_empty());
        assert_eq!(d.snapshot.jobs[0].remaining_s, linear(&p, 3600.0));

        let offered = |v: &ClusterView| prepare(v, policy.as_ref(), &cfg).warm.len();
        assert_eq!(offered(&v), 1);
        let mut same_task = v.clone();
        same_task.finished[0].task = "snli".into();
        let mut private = v.clone();
        private.finished[0].sharing = false;
        let mut other_setup = v.clone();
        other_setup.finished[0].merge_setup = "lora r=8".into();
        let mut other_model = v.clone();
        other_model.finished[0].model = "vit-base".into();
        let mut b_private = v.clone();
        b_private.jobs[0].sharing = false;
        let mut b_trained = v.clone();
        b_trained.jobs[0].progress = 0.2;
        b_trained.jobs[0].state = JobState::Queued;
        for (what, w) in [
            ("same task", same_task),
            ("A private", private),
            ("trained otherwise", other_setup),
            ("another model", other_model),
            ("B private", b_private),
            ("B trained", b_trained),
        ] {
            assert_eq!(offered(&w), 0, "{what}");
        }
        // No merging policy, no start.
        let none = by_name("ymir-no-merge").unwrap();
        assert!(prepare(&v, none.as_ref(), &cfg).warm.is_empty());
        // An estimate of a start the round did not offer is refused.
        let mut bad = estimates(&p, 3600.0);
        bad.warm = vec![warm(&p, 0, 5, 100.0)];
        assert!(matches!(
            decide(&v, &p, &bad, policy.as_ref(), &cfg),
            Err(RoundError::Estimates(m)) if m.contains("warm start")
        ));
    }

    #[test]
    fn a_merge_never_runs_below_either_jobs_min_gpus() {
        let wide = || {
            let mut w = job("wide", "rte", JobState::Queued, 8);
            w.min_gpus = 8;
            w
        };
        let narrow = || job("narrow", "mrpc", JobState::Queued, 1);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let v = view(vec![node("a", 4), node("b", 4)], vec![narrow(), wide()]);
        let p = prepare(&v, policy.as_ref(), &cfg);
        let mut e = estimates(&p, 3600.0);
        e.candidates.push(helpful_temporal(&p, 0, 1));
        let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
        let c = &d.snapshot.candidates[0];
        for (k, &a) in d.snapshot.allocations.iter().enumerate() {
            assert_eq!(
                c.remaining_s[k].is_finite(),
                a >= 8,
                "the pair at {a}: {}",
                c.remaining_s[k]
            );
        }
        for g in d.outcome.groups.iter().filter(|g| g.jobs.contains(&1)) {
            assert!(g.gpus.len() >= 8, "{g:?}");
        }
        // Already merged: the kept merge's row has no time under 8 either.
        let mut kept = view(vec![node("a", 4), node("b", 4)], vec![narrow(), wide()]);
        kept.merges.push(MergeView {
            a: 0,
            b: 1,
            mode: MergeMode::Temporal,
        });
        let p = prepare(&kept, policy.as_ref(), &cfg);
        let d = decide(&kept, &p, &estimates(&p, 3600.0), policy.as_ref(), &cfg).unwrap();
        let m = &d.snapshot.merges[0];
        for (k, &a) in d.snapshot.allocations.iter().enumerate() {
            assert_eq!(m.remaining_s[k].is_finite(), a >= 8, "kept at {a}");
        }
    }

    /// A kept merge keeps the deadline of the job that finishes with it
    /// where it can: the allocations at which B would miss are taken
    /// away, as for a new pair. With none that meets it, its times stay
    /// (the merge is not stranded).
    #[test]
    fn a_kept_merge_is_given_only_gpus_that_keep_bs_deadline() {
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let kept = |deadline_b: Option<f64>| {
            let mut b = job("b", "mrpc", JobState::Queued, 8);
            b.deadlines = deadline_b
                .map(|by| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by)))
                .unwrap_or_default();
            let mut v = view(
                vec![node("n", 8)],
                vec![job("a", "rte", JobState::Queued, 8), b],
            );
            v.merges.push(MergeView {
                a: 0,
                b: 1,
                mode: MergeMode::Temporal,
            });
            let p = prepare(&v, policy.as_ref(), &cfg);
            let d = decide(&v, &p, &estimates(&p, 3600.0), policy.as_ref(), &cfg).unwrap();
            (
                d.snapshot.allocations.clone(),
                d.snapshot.merges[0].remaining_s.clone(),
            )
        };
        let (allocs, free) = kept(None);
        let at = |a: u32| free[allocs.iter().position(|&x| x == a).unwrap()];
        assert!(at(4) > at(8), "{free:?}");
        // A deadline between the group's time on 8 GPUs and on 4.
        let due = (at(4) + at(8)) / 2.0;
        let (_, masked) = kept(Some(due));
        for (k, &a) in allocs.iter().enumerate() {
            let meets = free[k].is_finite() && free[k] <= due;
            assert_eq!(masked[k].is_finite(), meets, "at {a}: {masked:?}");
        }
        assert!(masked[allocs.iter().position(|&x| x == 8).unwrap()].is_finite());
        let (_, impossible) = kept(Some(1.0));
        assert_eq!(impossible, free, "no allocation meets it: as before");
    }

    /// A kept temporal merge whose A has trained and still has a long way
    /// to go is released when its waiting B would finish sooner alone, from
    /// scratch, on its fair share (8 GPUs of 16, which the group on at most
    /// 8 leaves free: 450 s and its 30 s start) than behind A (at best
    /// 100,000 s / 8 of A): the caller splits it. Kept when A is nearly
    /// done, when B alone is not known, when B has trained from A's
    /// weights, when A has not trained (a pair of waiting jobs is Ymir's to
    /// decide), when the group meets B's deadline, and when the round
    /// leaves no GPU free (B would wait behind A merged or not, and lose
    /// only its transfer: found live, a pair of real trainers on one node).
    #[test]
    fn tail_a_kept_merge_whose_b_would_finish_sooner_alone_is_released() {
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let released_on =
            |gpus: u32, a_work: f64, a_progress: f64, b_progress: f64, known: bool, due: f64| {
                let mut a = job("a", "rte", JobState::Running, 8);
                (a.holds, a.progress) = (vec![(0, 0), (0, 1)], a_progress);
                if a_progress == 0.0 {
                    (a.state, a.holds) = (JobState::Queued, Vec::new());
                }
                let mut b = job("b", "mrpc", JobState::Queued, 8);
                b.progress = b_progress;
                if due.is_finite() {
                    b.deadlines = crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(due));
                }
                let mut v = view(vec![node("n", gpus)], vec![a, b]);
                v.merges.push(MergeView {
                    a: 0,
                    b: 1,
                    mode: MergeMode::Temporal,
                });
                let p = prepare(&v, policy.as_ref(), &cfg);
                assert_eq!(p.jobs, vec![0, 1]);
                let mut e = estimates(&p, 3600.0);
                e.jobs[0] = linear(&p, a_work);
                e.kept[0] = linear(&p, 360.0);
                if known {
                    e.kept_b_alone = vec![linear(&p, 3600.0)];
                }
                decide(&v, &p, &e, policy.as_ref(), &cfg)
                    .unwrap()
                    .outcome
                    .released
            };
        let released = |a_work, a_progress, b_progress, known| {
            released_on(16, a_work, a_progress, b_progress, known, f64::INFINITY)
        };
        assert_eq!(released(100_000.0, 0.1, 0.0, true), vec![0]);
        assert!(released(600.0, 0.1, 0.0, true).is_empty(), "A nearly done");
        assert!(
            released(100_000.0, 0.1, 0.0, false).is_empty(),
            "B alone unknown"
        );
        assert!(
            released(100_000.0, 0.1, 0.2, true).is_empty(),
            "B trains from A"
        );
        assert!(
            released(100_000.0, 0.0, 0.0, true).is_empty(),
            "A has not trained"
        );
        // B due in 20,000 s: the group (12,575 s on 8 GPUs) meets it, and
        // it is not gambled; due in 5,000 s, the group misses it anyway.
        assert!(released_on(16, 100_000.0, 0.1, 0.0, true, 20_000.0).is_empty());
        assert_eq!(released_on(16, 100_000.0, 0.1, 0.0, true, 5_000.0), vec![0]);
        // The group fills the node: nothing is free for B.
        assert!(released_on(8, 100_000.0, 0.1, 0.0, true, f64::INFINITY).is_empty());
    }

    /// A new merge is decided on a candidate the caller estimated; the
    /// group's time is A's, then B's from A's weights after B's restart.
    #[test]
    fn a_helpful_temporal_pair_is_merged_with_the_gains_it_rests_on() {
        let v = view(
            vec![node("n", 2)],
            vec![
                job("a", "rte", JobState::Queued, 1),
                job("b", "mrpc", JobState::Queued, 1),
                job("c", "qqp", JobState::Queued, 1),
                job("d", "sst2", JobState::Queued, 1),
            ],
        );
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let p = prepare(&v, policy.as_ref(), &cfg);
        let mut e = estimates(&p, 3600.0);
        // B from A's weights needs a tenth of its time.
        e.candidates.push(helpful_temporal(&p, 0, 1));
        let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
        let c = &d.snapshot.candidates[0];
        assert_eq!(c.remaining_s[1], 3600.0 + 360.0 + 30.0);
        let g = d
            .outcome
            .groups
            .iter()
            .find(|g| g.jobs == [0, 1])
            .expect("merged");
        assert_eq!(g.new_merge, Some((0.25, 0.0)));
        assert_eq!(g.trainers(), &[0]);
        // B is not trained yet: it stays queued.
        assert!(
            d.outcome
                .transitions
                .iter()
                .all(|t| t.job != 1 || t.to == JobState::Queued)
        );
    }

    #[test]
    fn estimates_that_do_not_match_the_round_are_refused() {
        let v = view(
            vec![node("n", 2)],
            vec![job("a", "rte", JobState::Queued, 1)],
        );
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let policy = by_name("ymir").unwrap();
        let p = prepare(&v, policy.as_ref(), &cfg);
        let e = Estimates::default();
        assert!(matches!(
            decide(&v, &p, &e, policy.as_ref(), &cfg),
            Err(RoundError::Estimates(_))
        ));
        let mut e = estimates(&p, 100.0);
        e.candidates.push(PairEstimate {
            pair: PairKey {
                a: 0,
                b: 0,
                mode: MergeMode::Spatial,
            },
            seconds: linear(&p, 1.0),
            tran_wt: linear(&p, 1.0),
            gain_ab: 0.0,
            gain_ba: 0.0,
        });
        assert!(matches!(
            decide(&v, &p, &e, policy.as_ref(), &cfg),
            Err(RoundError::Estimates(m)) if m.contains("not an eligible pair")
        ));
    }

    /// An event brings the round forward to now, or to the gap after the
    /// last one, never past the periodic round.
    #[test]
    fn an_event_brings_the_round_forward_within_the_gap() {
        // Last round at 0, periodic one at 60, gap 5.
        assert_eq!(round_after_event(60.0, 20.0, 0.0, 5.0), 20.0);
        assert_eq!(round_after_event(60.0, 2.0, 0.0, 5.0), 5.0);
        assert_eq!(round_after_event(60.0, 59.0, 58.0, 5.0), 60.0);
        assert_eq!(round_after_event(3.0, 2.0, 0.0, 5.0), 3.0);
    }

    /// A waiting job needs its time at its request with its start; one
    /// whose request is not an allocation the fewest GPUs it may run on;
    /// a job that runs or has trained needs nothing (it is not waiting).
    #[test]
    fn a_waiting_jobs_need_is_its_time_alone_at_its_request() {
        use crate::policy::testkit::{cluster, job};
        let all = crate::policy::ymir_allocations(64);
        let job = |id: &str, asks: u32| job(id, 800.0, asks, &all);
        let mut running = job("running", 2);
        running.current_gpus = 2;
        let mut trained = job("trained", 2);
        trained.progress = 0.3;
        let mut odd = job("odd", 5);
        odd.min_gpus = 2;
        let snap = cluster(2, 4, vec![job("asks-4", 4), odd, running, trained]);
        assert!(!snap.allocations.contains(&5), "{:?}", snap.allocations);
        assert_eq!(need_alone(&snap, 0), Some(800.0 / 4.0 + 30.0));
        assert_eq!(need_alone(&snap, 1), Some(800.0 / 2.0 + 30.0));
        assert_eq!(need_alone(&snap, 2), None);
        assert_eq!(need_alone(&snap, 3), None);
        assert_eq!(need_alone(&snap, 4), None, "no such job");
    }

    /// A job with a deadline brings the round forward only when waiting
    /// for the periodic one would make it miss, and starting now would not.
    #[test]
    fn a_deadline_brings_the_round_forward_only_when_waiting_would_miss_it() {
        // Last round at 0, periodic one at 120, gap 5, now 20; the job
        // needs 1,000 s.
        assert_eq!(
            round_for_deadline(120.0, 20.0, 0.0, 5.0, 1_000.0, 1_100.0),
            20.0
        );
        // Room to wait for the periodic round: it stays.
        assert_eq!(
            round_for_deadline(120.0, 20.0, 0.0, 5.0, 1_000.0, 1_120.0),
            120.0
        );
        // Missed even at once: nothing to gain by a round now.
        assert_eq!(
            round_for_deadline(120.0, 20.0, 0.0, 5.0, 1_000.0, 1_010.0),
            120.0
        );
        // The gap after the last round still holds.
        assert_eq!(
            round_for_deadline(120.0, 2.0, 0.0, 5.0, 1_000.0, 1_050.0),
            5.0
        );
    }

    #[test]
    fn leases_are_kept_while_running_and_renewed_when_won_again() {
        let mut a = job("a", "qqp", JobState::Running, 1);
        a.holds = vec![(0, 0)];
        a.lease_until = 100.0; // running lease
        let mut b = job("b", "rte", JobState::Running, 1);
        b.holds = vec![(0, 1)];
        b.lease_until = -1.0; // ran out; wins again
        let c = job("c", "mrpc", JobState::Queued, 1);
        let v = view(vec![node("n", 4)], vec![a, b, c]);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let d = run(&v, "themis", &cfg);
        let lease: BTreeMap<usize, f64> = d.outcome.leases.iter().copied().collect();
        let new = by_name("themis").unwrap().lease_s();
        assert_eq!(lease[&0], 100.0);
        assert_eq!(lease[&1], new);
        assert_eq!(lease[&2], new);
        assert!(run(&v, "srtf", &cfg).outcome.leases.is_empty());
    }

    /// A job that cannot start is told why once its state changes: a
    /// running job pushed out is suspended, a queued one waits.
    #[test]
    fn the_reasons_of_a_suspension() {
        let mut a = job("a", "qqp", JobState::Running, 4);
        a.holds = (0..4).map(|g| (0, g)).collect();
        a.attained_gpu_s = 1e9; // Tiresias demotes it
        let mut b = job("b", "rte", JobState::Queued, 4);
        b.submitted_at = -1.0;
        let v = view(vec![node("n", 4)], vec![a, b]);
        let cfg = RoundConfig {
            profiling: false,
            ..Default::default()
        };
        let d = run(&v, "tiresias", &cfg);
        let reasons: Vec<(usize, JobState, &str)> = d
            .outcome
            .transitions
            .iter()
            .map(|t| (t.job, t.to, t.reason.as_str()))
            .collect();
        assert!(
            reasons.contains(&(0, JobState::Queued, "suspended by the plan (checkpointed)")),
            "{reasons:?}"
        );
    }

    fn two_queues(ga: u32, la: Option<u32>, gb: u32, lb: Option<u32>) -> Queues {
        let q = |name: &str, g: u32, l: Option<u32>| crate::queue::QueueSpec {
            name: name.into(),
            parent: None,
            guaranteed_gpus: g,
            over_quota_weight: 1.0,
            limit_gpus: l,
            models: vec![],
            users: vec![],
            merge_across_queues: false,
        };
        Queues::new(vec![q("a", ga, la), q("b", gb, lb)]).unwrap()
    }

    /// GPUs each queue's jobs hold after the round (a group counts once
    /// for each queue among its jobs).
    fn usage(v: &ClusterView, o: &RoundOutcome) -> BTreeMap<String, u32> {
        let mut u = BTreeMap::new();
        for g in &o.groups {
            let qs: BTreeSet<&str> = g.jobs.iter().map(|&j| v.jobs[j].queue.as_str()).collect();
            for q in qs {
                *u.entry(q.to_string()).or_default() += g.gpus.len() as u32;
            }
        }
        u
    }

    /// Queue b holds all 8 GPUs with two 4-GPU jobs; queue a (guarantee
    /// 4) submits one: b's later job is suspended from its checkpoint in
    /// that same round and a's runs, under every policy.
    #[test]
    fn a_queue_below_its_guarantee_gets_its_gpus_back_in_one_round() {
        let mut b1 = job("b1", "qqp", JobState::Running, 4);
        b1.holds = (0..4).map(|g| (0, g)).collect();
        b1.min_gpus = 4;
        let mut b2 = job("b2", "rte", JobState::Running, 4);
        b2.holds = (0..4).map(|g| (1, g)).collect();
        b2.min_gpus = 4;
        b2.submitted_at = 1.0;
        let mut a1 = job("a1", "mrpc", JobState::Queued, 4);
        a1.min_gpus = 4;
        a1.submitted_at = 2.0;
        b1.queue = "b".into();
        b2.queue = "b".into();
        a1.queue = "a".into();
        let v = view(vec![node("x", 4), node("y", 4)], vec![b1, b2, a1]);
        for policy in ["fifo", "srtf", "ymir", "tiresias"] {
            let cfg = RoundConfig {
                profiling: false,
                queues: two_queues(4, None, 4, None),
                ..Default::default()
            };
            let d = run(&v, policy, &cfg);
            let u = usage(&v, &d.outcome);
            assert_eq!(u.get("a"), Some(&4), "{policy}: {:?}", d.outcome.groups);
            let t = d.outcome.transitions.iter().find(|t| t.job == 1).unwrap();
            assert_eq!(t.to, JobState::Queued, "{policy}");
            assert!(
                t.reason.starts_with("preempted: queue b may use 4 GPUs"),
                "{policy}: {}",
                t.reason
            );
            // Without queues FIFO keeps b's jobs and a waits.
            if policy == "fifo" {
                let d = run(
                    &v,
                    policy,
                    &RoundConfig {
                        profiling: false,
                        ..Default::default()
                    },
                );
                assert_eq!(usage(&v, &d.outcome).get("a"), None, "{policy}");
            }
        }
    }

    /// Queue a may use 6 GPUs (its limit) and its job asks for 8 (it can
    /// run on 1 to 8). A rigid policy never grows a job later, so the job
    /// waits for room for all 8 rather than starting on 6 and staying
    /// there; an elastic policy starts it on 6 and may grow it later.
    #[test]
    fn a_rigid_policy_admits_a_job_only_at_its_requested_size() {
        let mut a1 = job("a1", "qqp", JobState::Queued, 8);
        a1.queue = "a".into();
        a1.min_gpus = 1;
        let v = view(vec![node("x", 8)], vec![a1]);
        let cfg = RoundConfig {
            profiling: false,
            queues: two_queues(0, Some(6), 0, None),
            ..Default::default()
        };
        for policy in [
            "fifo", "srtf", "tiresias", "themis", "edf", "hydra", "chronus",
        ] {
            let d = run(&v, policy, &cfg);
            assert_eq!(usage(&v, &d.outcome).get("a"), None, "{policy}");
            let (_, why) = d.outcome.unexecutable.iter().find(|u| u.0 == 0).unwrap();
            assert!(why.contains("queue a may use 6 GPUs"), "{policy}: {why}");
        }
        for policy in ["optimus", "pollux", "ymir"] {
            let d = run(&v, policy, &cfg);
            let held = usage(&v, &d.outcome).get("a").copied().unwrap_or(0);
            assert!((1..=6).contains(&held), "{policy}: {held}");
        }
    }

    /// Queue a may use 4 GPUs and has two waiting 4-GPU jobs: a long one
    /// submitted first and a short one. The queue's share is the quota
    /// pass's to set, the choice between them the policy's: FIFO starts
    /// the first, SRTF the short one, and a higher priority goes before
    /// both; the other waits, told its queue's share.
    #[test]
    fn a_rigid_policy_orders_its_queues_jobs_within_their_share() {
        let mut long = job("long", "qqp", JobState::Queued, 4);
        long.min_gpus = 4;
        let mut short = job("short", "rte", JobState::Queued, 4);
        short.min_gpus = 4;
        short.submitted_at = 1.0;
        for j in [&mut long, &mut short] {
            j.queue = "a".into();
        }
        let v = view(vec![node("x", 8)], vec![long, short]);
        let cfg = RoundConfig {
            profiling: false,
            queues: two_queues(4, Some(4), 4, None),
            ..Default::default()
        };
        let started = |v: &ClusterView, policy: &str| {
            let pol = by_name(policy).unwrap();
            let p = prepare(v, pol.as_ref(), &cfg);
            let mut e = estimates(&p, 3600.0);
            for (k, &i) in p.jobs.iter().enumerate() {
                let work = if v.jobs[i].id == "long" {
                    36000.0
                } else {
                    3600.0
                };
                e.jobs[k] = linear(&p, work);
            }
            let d = decide(v, &p, &e, pol.as_ref(), &cfg).unwrap();
            assert_eq!(usage(v, &d.outcome).get("a"), Some(&4), "{policy}");
            let waits = d
                .outcome
                .unexecutable
                .iter()
                .find(|u| !d.outcome.groups.iter().any(|g| g.jobs.contains(&u.0)));
            assert!(
                waits.is_some_and(|(_, why)| why.contains("queue a may use 4 GPUs")),
                "{policy}: {:?}",
                d.outcome.unexecutable
            );
            let g = &d.outcome.groups[0];
            v.jobs[g.jobs[0]].id.clone()
        };
        assert_eq!(started(&v, "fifo"), "long");
        assert_eq!(started(&v, "srtf"), "short");
        assert_eq!(
            started(&v, "tiresias"),
            "long",
            "equal service: FIFO within its queue"
        );
        let mut v = v;
        v.jobs[0].priority = 1;
        assert_eq!(
            started(&v, "srtf"),
            "long",
            "priority before the policy's order"
        );
    }

    /// Profiling may suspend a running job for its GPU, never a running
    /// non-preemptible one (its GPUs are pinned to it).
    #[test]
    fn profiling_never_takes_a_non_preemptible_jobs_gpus() {
        let mut pinned = job("pinned", "qqp", JobState::Running, 1);
        pinned.holds = vec![(0, 0)];
        let new = job("new", "rte", JobState::Submitted, 1);
        let cfg = RoundConfig::default();
        assert!(cfg.profiling);
        let v = view(vec![node("x", 1)], vec![pinned.clone(), new.clone()]);
        assert_eq!(
            run(&v, "ymir", &cfg).outcome.profiling.len(),
            1,
            "a preemptible job gives way"
        );
        pinned.preemptible = false;
        let v = view(vec![node("x", 1)], vec![pinned, new]);
        let d = run(&v, "ymir", &cfg);
        assert!(d.outcome.profiling.is_empty(), "{:?}", d.outcome.profiling);
        assert!(d.outcome.groups.iter().any(|g| g.jobs == [0] && g.kept));
    }

    /// A queue at its limit: its waiting job waits, told why, while the
    /// cluster has free GPUs.
    #[test]
    fn a_queue_at_its_limit_waits_with_the_reason() {
        let mut a1 = job("a1", "qqp", JobState::Running, 2);
        a1.holds = vec![(0, 0), (0, 1)];
        a1.queue = "a".into();
        a1.min_gpus = 2;
        let mut a2 = job("a2", "rte", JobState::Queued, 2);
        a2.queue = "a".into();
        a2.min_gpus = 2;
        a2.submitted_at = 1.0;
        let v = view(vec![node("x", 8)], vec![a1, a2]);
        let cfg = RoundConfig {
            profiling: false,
            queues: two_queues(0, Some(2), 0, None),
            ..Default::default()
        };
        let d = run(&v, "srtf", &cfg);
        assert_eq!(usage(&v, &d.outcome).get("a"), Some(&2));
        let (_, why) = d.outcome.unexecutable.iter().find(|u| u.0 == 1).unwrap();
        assert!(
            why.contains("queue a may use 2 GPUs this round (guarantee 0, limit 2)"),
            "{why}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// With queues, priorities and preemption classes on any cluster:
        /// no queue holds more than it deserves (so never above its limit),
        /// a queue with work deserves at least its guarantee (within what
        /// the cluster has), and a running non-preemptible job on a node
        /// that still takes work keeps exactly its GPUs.
        #[test]
        fn queues_hold_within_their_share_and_pinned_jobs_stay(
            v in arb_view(),
            policy in prop::sample::select(vec!["ymir", "srtf", "tiresias", "themis", "fifo", "edf", "hydra", "chronus", "optimus", "lyra", "gandiva"]),
            ga in 0u32..6, la in prop::option::of(6u32..12), gb in 0u32..6,
            seed in any::<u64>(),
        ) {
            let mut v = v;
            for (k, j) in v.jobs.iter_mut().enumerate() {
                let bits = seed.rotate_left(k as u32 * 5);
                j.queue = if bits & 1 == 0 { "a" } else { "b" }.into();
                j.priority = ((bits >> 1) % 3) as i32;
                j.preemptible = (bits >> 3) % 4 != 0;
            }
            let cfg = RoundConfig {
                queues: two_queues(ga, la, gb, None),
                ..Default::default()
            };
            let pol = by_name(policy).unwrap();
            let p = prepare(&v, pol.as_ref(), &cfg);
            let e = estimates(&p, 7200.0);
            let d = decide(&v, &p, &e, pol.as_ref(), &cfg).unwrap();
            let u = usage(&v, &d.outcome);
            for (q, &used) in &u {
                let pinned: u32 = p.pinned.iter().filter(|&&i| v.jobs[i].queue == *q)
                    .map(|&i| v.jobs[i].holds.len() as u32).sum();
                let deserved = p.deserved.get(q).copied().unwrap_or(0);
                prop_assert!(used <= deserved.max(pinned), "queue {q}: {used} > {deserved} ({pinned} pinned); groups {:?} caps {:?} deserved {:?} jobs {:?} out {:?} queues {:?} snapshot {:?}", d.outcome.groups, p.caps, p.deserved, p.jobs, p.queue_out, v.jobs.iter().map(|j| (&j.queue, j.priority, j.preemptible)).collect::<Vec<_>>(), d.snapshot.jobs.iter().map(|j| (j.min_gpus, j.max_gpus, j.requested_gpus)).collect::<Vec<_>>());
                if q == "a" && let Some(l) = la {
                    prop_assert!(used <= l.max(pinned), "queue a: {used} above its limit {l}");
                }
            }
            let total: u32 = p.capacity.iter().sum::<u32>()
                + p.pinned.iter().map(|&i| v.jobs[i].holds.len() as u32).sum::<u32>();
            if total >= ga + gb && let Some(&d) = p.deserved.get("a") {
                // Each job's largest size (its requested one under a rigid
                // policy: a_rigid_policy_admits_a_job_only_at_its_requested_size).
                let demand = p.demand.get("a").copied().unwrap_or(0);
                if !pol.rigid() {
                    let most: u32 = p.jobs.iter().chain(&p.pinned).chain(p.queue_out.iter().map(|o| &o.0))
                        .filter(|&&i| v.jobs[i].queue == "a")
                        .map(|&i| p.offered(&cfg, v.jobs[i].max_gpus, &v.jobs[i]).max(v.jobs[i].min_gpus))
                        .sum();
                    prop_assert_eq!(demand, most);
                }
                prop_assert!(d >= ga.min(demand), "a deserves {d} < min({ga}, {demand}); total {total} cap {:?} pinned {:?} deserved {:?} jobs {:?}", p.capacity, p.pinned, p.deserved, v.jobs.iter().map(|j| (&j.queue, j.preemptible, j.state, j.holds.len())).collect::<Vec<_>>());
            }
            for (i, j) in v.jobs.iter().enumerate() {
                let healthy = j.holds.iter().all(|g| {
                    let n = &v.nodes[g.0];
                    n.state != NodeState::Offline && !n.drained
                });
                if !j.preemptible && j.state == JobState::Running && !j.holds.is_empty()
                    && !j.profiling_run && !j.held_back && healthy
                    && p.unschedulable.iter().all(|u| u.0 != i)
                    // (a job no node of its GPU model can hold is no
                    // candidate at all)
                    && (p.jobs.contains(&i) || p.pinned.contains(&i) || p.queue_out.iter().any(|o| o.0 == i))
                {
                    let g = d.outcome.groups.iter().find(|g| g.jobs.contains(&i));
                    prop_assert!(g.is_some_and(|g| g.kept && g.gpus.len() == j.holds.len()),
                        "non-preemptible {} lost its GPUs", j.id);
                }
            }
        }

        /// On any cluster: no GPU given twice (profiling included), every
        /// GPU exists on a node the round may use, no job twice, merged
        /// groups are valid pairs, a kept group keeps exactly its GPUs, and
        /// the plan repeats on the same view.
        #[test]
        fn outcomes_respect_capacity_and_never_share_a_gpu(
            v in arb_view(),
            policy in prop::sample::select(vec!["ymir", "srtf", "tiresias", "optimus", "themis", "pollux", "fifo"]),
            single in any::<bool>(),
        ) {
            let cfg = RoundConfig {
                max_nodes_per_group: single.then_some(1),
                ..Default::default()
            };
            let pol = by_name(policy).unwrap();
            let p = prepare(&v, pol.as_ref(), &cfg);
            let mut e = estimates(&p, 7200.0);
            for (k, pair) in p.eligible.iter().enumerate() {
                if k % 3 == 0 {
                    e.candidates.push(PairEstimate {
                        pair: *pair,
                        seconds: linear(&p, 2000.0),
                        tran_wt: p.allocations.iter().map(|&a| if a == 0 { 0.0 } else { 1.5 }).collect(),
                        gain_ab: 0.2,
                        gain_ba: 0.1,
                    });
                }
            }
            let d = decide(&v, &p, &e, pol.as_ref(), &cfg).unwrap();
            let o = &d.outcome;
            let mut seen_gpu = BTreeSet::new();
            let mut seen_job = BTreeSet::new();
            for r in &o.profiling {
                for g in &r.gpus {
                    prop_assert!(seen_gpu.insert(*g), "GPU {g:?} twice");
                    prop_assert!(!r.new || !v.nodes[g.0].cordoned, "new profiling on a cordoned node");
                }
                prop_assert!(seen_job.insert(r.job));
            }
            for g in &o.groups {
                for gpu in &g.gpus {
                    prop_assert!(gpu.1 < v.nodes[gpu.0].gpus);
                    prop_assert!(v.nodes[gpu.0].state != NodeState::Offline);
                    prop_assert!(!v.nodes[gpu.0].drained);
                    prop_assert!(seen_gpu.insert(*gpu), "GPU {gpu:?} twice");
                    // A cordoned node gets no new work: only a member that
                    // trained there keeps GPUs on it.
                    if v.nodes[gpu.0].cordoned {
                        prop_assert!(g.jobs.iter().any(|&j| !v.jobs[j].profiling_run
                            && v.jobs[j].holds.iter().any(|h| h.0 == gpu.0)),
                            "a new group on cordoned node {}", gpu.0);
                    }
                }
                for &j in &g.jobs {
                    prop_assert!(seen_job.insert(j), "job {j} twice");
                }
                if let [a, b] = g.jobs[..] {
                    let (ja, jb) = (&v.jobs[a], &v.jobs[b]);
                    prop_assert!(ja.model == jb.model && ja.sharing && jb.sharing && ja.task != jb.task);
                }
                if g.kept {
                    let mut held = v.jobs[g.jobs[0]].holds.clone();
                    held.sort_unstable();
                    prop_assert_eq!(&held, &g.gpus);
                }
                if single {
                    prop_assert!(g.nodes().len() <= 1);
                }
            }
            let again = decide(&v, &p, &e, pol.as_ref(), &cfg).unwrap();
            prop_assert_eq!(&again.outcome, o);
        }
    }
}
