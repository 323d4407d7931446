//! What passes between the round's phases and what it returns: the
//! prepared round ([`Prepared`]) and the keys of what the caller must
//! estimate, the caller's [`Estimates`], and the decided [`RoundOutcome`]
//! (groups on concrete GPUs, transitions, leases, warm starts). Types and
//! their small accessors only; the phases that fill them live beside it.

use std::collections::BTreeMap;

use super::view::{ClusterView, Gpu, JobView, RoundConfig, holds_exactly};
use crate::job::JobState;
use crate::policy::{MergeMode, Plan, Snapshot, SolveStats};

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
pub(super) fn offered(
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

impl Group {
    pub(super) fn new(jobs: Vec<usize>, mode: MergeMode, mut gpus: Vec<Gpu>, kept: bool) -> Self {
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

/// What [`decide`] returns: the snapshot the policy saw, its plan, and the
/// outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub snapshot: Snapshot,
    pub plan: Plan,
    pub outcome: RoundOutcome,
}
