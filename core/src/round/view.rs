//! What a round is given: the cluster as the caller sees it ([`ClusterView`]:
//! nodes, live jobs, merges, finished jobs) and the round's own settings
//! ([`RoundConfig`]), with the small questions every phase asks of them
//! (does a job train now, hold exactly these GPUs, share a GPU with whom,
//! when is a pair due). Owns no decision: it is read by every phase and
//! imports none of them.

use std::collections::BTreeMap;

use crate::job::JobState;
use crate::node::NodeState;
use crate::policy::{GpuFootprint, MergeMode, PlacementRule, Replica};
use crate::queue::Queues;
use crate::slo::RewardStep;

/// A GPU: (node ordinal in the [`ClusterView`], index on that node).
pub type Gpu = (usize, u32);

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

/// It trains on exactly `gpus` (sorted) now.
pub(super) fn holds_exactly(j: &JobView, gpus: &[Gpu]) -> bool {
    let mut h = j.holds.clone();
    h.sort_unstable();
    !j.profiling_run && h == gpus
}

/// It holds GPUs for training now (not a profiling run).
pub(super) fn is_training(j: &JobView) -> bool {
    !j.profiling_run && !j.holds.is_empty()
}

/// For each snapshot job (view jobs `jobs`), the snapshot job that trains
/// on the one GPU it trains on (a shared GPU, ICEFROG Eq. 8), if any.
pub(super) fn sharing_partners(view: &ClusterView, jobs: &[usize]) -> Vec<Option<usize>> {
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

/// GPUs per node, by node.
pub(super) fn per_node(gpus: &[Gpu]) -> Vec<(usize, u32)> {
    let mut per: BTreeMap<usize, u32> = BTreeMap::new();
    for g in gpus {
        *per.entry(g.0).or_default() += 1;
    }
    per.into_iter().collect()
}

/// The earliest deadline, seconds from now, of a job that finishes with
/// the merged group of `a` and `b`: B of a temporal pair, either job of a
/// spatial one (A of a temporal pair finishes before the group). Infinite
/// when neither has one.
pub(super) fn group_due(view: &ClusterView, a: usize, b: usize, mode: MergeMode) -> f64 {
    let finish_with_group: &[usize] = match mode {
        MergeMode::Temporal => &[b],
        _ => &[a, b],
    };
    finish_with_group
        .iter()
        .filter_map(|&j| view.jobs[j].deadline_in(view.now))
        .fold(f64::INFINITY, f64::min)
}
