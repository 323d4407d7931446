//! Phase 1 of a round: read what Postgres holds and take in what agents
//! report — progress and checkpoints, finished, failed and profiled
//! processes, step times, loss traces, evaluations — and run the merge
//! guard (Ymir §4.3).
//!
//! Nothing here writes to Postgres: every consequence is collected in
//! [`RoundWrites`] and committed with the round's plan in one fenced
//! transaction, so a deposed leader's observations are lost with its round
//! (the agents report them again to the new leader). The only IO besides
//! the reads is teaching the estimator service measured step times, which
//! is learning, not cluster state.

mod estimates;
mod failures;
mod guard;
mod tasks;
mod telemetry;
#[cfg(test)]
pub(crate) mod tests;

pub(crate) use tasks::embedding;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::JobId;
use fmsched_estimator::footprint;
use fmsched_estimator::loss_curve::LossCurve;
use fmsched_estimator::loss_prior::LossLibrary;
use fmsched_estimator::lut::Lut;

use super::{RoundError, RoundKind};
use crate::estimates::EstimatorClient;
use crate::persistence::{
    AdminState, Assignment, Estimate, FreshStart, JobRecord, JobService, MergeRecord, RetryState,
    RoundWrites, StoredPlan,
};
use crate::registry::LiveNode;
use crate::round::observe::estimates::learn_metric_targets;
use crate::round::observe::guard::{guard, split_merges_of_ended_jobs};
use crate::round::observe::tasks::{finishing, fresh_run, observe_task};
use crate::round::observe::telemetry::{learn_utilization, watch_shared_gpus};
use crate::service::Service;

/// Task id suffix of a job's profiling run.
pub(crate) const PROFILE_SUFFIX: &str = "-profile";

/// A merge outcome for the estimator's gain regression (Ymir §4.1: Task2Vec
/// score → linear regression → `G`), sent once the round committed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TransferOutcome {
    pub merge: i64,
    pub score: f64,
    pub gain: f64,
}

/// What the observe phase leaves for the rest of the round.
#[derive(Default)]
pub(crate) struct Observed {
    pub nodes: Vec<LiveNode>,
    /// Live jobs: those that finished or failed for good this round are
    /// gone; those whose profiling ended are queued.
    pub live: BTreeMap<JobId, JobRecord>,
    /// Merges of live jobs; those split this round are inactive.
    pub merges: Vec<MergeRecord>,
    /// EstimatorClient, with what this round learned (profiles, refits).
    pub estimates: BTreeMap<JobId, Estimate>,
    /// Iterations done and newest checkpoint, with this round's reports.
    pub progress: BTreeMap<JobId, (u64, Option<String>)>,
    /// Failures so far, with this round's.
    pub retries: BTreeMap<JobId, RetryState>,
    /// Merges split this round: their spatial jobs wait one round for the
    /// joint process's last checkpoint.
    pub split_now: BTreeSet<i64>,
    /// Look-ahead rounds: the outputs of jobs predicted to finish first.
    pub reported_outputs: BTreeMap<JobId, String>,
    /// The plan in force (its generation fences this round's commit).
    pub current: StoredPlan,
    pub service: BTreeMap<JobId, JobService>,
    /// What the round writes besides its plan.
    pub writes: RoundWrites,
    /// Merge outcomes to teach the estimator once the round committed.
    pub outcomes: Vec<TransferOutcome>,
    pub completed: usize,
    pub failed: usize,
    pub retried: usize,
    pub guard_splits: usize,
    /// Layer-elastic jobs running alone in their process: the frozen layers
    /// ICEFROG's tuner picked this round (the plan tells their trainers).
    pub frozen_layers: BTreeMap<JobId, u32>,
    /// Layer-elastic live jobs: the per-layer gradient variance each one's
    /// trainer last reported (this round's, else the leader's memory of an
    /// earlier one): the time table tunes their frozen layers per
    /// allocation from it (ICEFROG Eq. 16).
    pub layer_variance: BTreeMap<JobId, Vec<f64>>,
    /// ICEFROG's utilisation regression per (model, GPU family), with this
    /// round's measurements.
    pub utilization_fits: BTreeMap<(String, String), footprint::UtilizationFit>,

    /// What the admin API set: cordons and drains, re-queue requests, the
    /// policy in force.
    pub admin: AdminState,
    /// Jobs that may no longer share a GPU (a shared GPU of theirs ran
    /// saturated), this round's included.
    pub no_sharing: BTreeSet<JobId>,
    /// Tuned prompts of prompt-tuning jobs that completed this round (filed
    /// in the Prompt Bank at the end of the observe phase).
    pub bank_new: Vec<crate::persistence::BankPrompt>,
    /// Jobs that completed this round, as they were live.
    pub finished: BTreeMap<JobId, JobRecord>,
    /// The loss-curve prior per model ([`loss_prior_of`]), read this round
    /// for the models whose jobs needed it.
    pub loss_priors: BTreeMap<String, LossLibrary>,
    /// Jobs restarted from their initial weights, this round's included
    /// ([`fresh_start_if_it_pays`]): the plan asks for the fresh process
    /// while `pending`.
    pub fresh: BTreeMap<JobId, FreshStart>,
}

impl Observed {
    /// Jobs restarted from their initial weights whose fresh process no
    /// node has reported yet.
    pub fn fresh_pending(&self) -> BTreeSet<JobId> {
        self.fresh
            .iter()
            .filter(|(_, f)| f.pending)
            .map(|(j, _)| *j)
            .collect()
    }
}

/// Phase 1 (see the module docs). A look-ahead round reads the same state
/// but takes in no report: it only predicts which jobs finish before the
/// switch.
pub(crate) async fn observe(
    state: &Service,
    lut: &Lut,
    est: &EstimatorClient,
    kind: RoundKind,
    now: DateTime<Utc>,
) -> Result<Observed, RoundError> {
    let p = &state.persistence;
    let nodes = state.registry.snapshot();
    // The reads are independent: on a pool, concurrent (one round's reads
    // cost the slowest of them, not their sum).
    let (
        live,
        placed,
        merges,
        estimates,
        progress,
        retries,
        current,
        service,
        admin,
        no_sharing,
        utilization_fits,
        fresh,
    ) = tokio::try_join!(
        p.live_jobs(),
        p.placements_of_live_jobs(),
        p.merges_of_live_jobs(),
        p.estimates(),
        p.progress(),
        p.retry_state(),
        p.current_plan(),
        p.service(),
        p.admin_state(),
        p.no_sharing_jobs(),
        p.utilization_fits(),
        p.fresh_starts(),
    )?;
    let live: BTreeMap<JobId, JobRecord> = live.into_iter().map(|j| (j.id, j)).collect();
    // Reports count only from a node the job was placed on: drop the rest
    // (forged, or misrouted) before anything reads them.
    let mut nodes = nodes;
    let mut ignored = 0u64;
    let mut fresh_seen = BTreeSet::new();
    for n in &mut nodes {
        n.observed_tasks.retain(|t| {
            let ok = reported_by_its_node(&placed, &live, &n.record.id, &t.task_id);
            if !ok && kind == RoundKind::Commit {
                ignored += 1;
                tracing::warn!(node_id = %n.record.id, task = %t.task_id, phase = t.phase,
                    "ignoring a report of a process this node was never given (forged or misrouted)");
            }
            let fresh_run = fresh_run(&fresh, t);
            if ok && let Some(seen) = &fresh_run {
                fresh_seen.extend(seen.iter().copied());
            }
            ok && fresh_run.is_some()
        });
    }
    if ignored > 0 {
        state.metrics.update(|m| m.ignored_reports += ignored);
    }
    let mut o = Observed {
        live,
        merges,
        estimates,
        progress,
        retries,
        current,
        service,
        admin,
        no_sharing,
        utilization_fits,
        fresh,
        ..Default::default()
    };
    if kind == RoundKind::Commit {
        // The fresh process reported: the plan stops asking for it.
        for j in fresh_seen {
            if let Some(f) = o.fresh.get_mut(&j) {
                f.pending = false;
                o.writes.fresh_seen.push(j);
            }
        }
    }
    // Layer-elastic jobs' last reported variance (the leader's memory:
    // a suspended job keeps its own; a new leader learns them afresh from
    // the next reports).
    o.layer_variance = {
        let mut seen = state
            .leader
            .layer_variance
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        seen.retain(|j, _| {
            o.live
                .get(j)
                .is_some_and(|r| r.spec.layer_elasticity.is_some())
        });
        seen.clone()
    };
    // This round holds back every job an admin asked to re-queue; its
    // commit retires those requests.
    o.writes.requeued = o.admin.requeues.iter().map(|(j, r)| (*j, r.at)).collect();
    if let RoundKind::LookAhead { switch_at } = kind {
        let lead_s = (switch_at - now).num_milliseconds().max(0) as f64 / 1000.0;
        let observed = nodes.iter().flat_map(|n| &n.observed_tasks);
        for (id, output) in finishing(observed, &o.live, &o.estimates, lead_s) {
            o.live.remove(&id);
            if let Some(out) = output {
                o.reported_outputs.insert(id, out);
            }
        }
        o.nodes = nodes;
        return Ok(o);
    }
    split_merges_of_ended_jobs(state, &mut o).await?;
    // Evaluation values per job reported this round (the guard reads them),
    // and each job's latest (iteration, loss) in a joint process.
    let mut evals: BTreeMap<JobId, Vec<f64>> = BTreeMap::new();
    let mut losses: BTreeMap<JobId, (u64, f64)> = BTreeMap::new();
    let mut own = OwnEvals::new();
    for n in &nodes {
        for t in &n.observed_tasks {
            let reports = Reports {
                evals: &mut evals,
                losses: &mut losses,
                own: &mut own,
            };
            observe_task(state, lut, est, &mut o, n, t, now, reports).await;
        }
    }
    guard(&mut o, &evals, &losses);
    state
        .leader
        .layer_variance
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(o.layer_variance.iter().map(|(j, v)| (*j, v.clone())));
    learn_metric_targets(state, &mut o, &own).await;
    watch_shared_gpus(state, &mut o, &nodes);
    learn_utilization(&mut o, &nodes);
    if !o.bank_new.is_empty() {
        let new = std::mem::take(&mut o.bank_new);
        (o.writes.bank_adds, o.writes.bank_evictions) =
            super::prompt_bank::file(state, new).await?;
    }
    o.nodes = nodes;
    Ok(o)
}

/// Jobs whose own metric curve grew this round.
pub(crate) type OwnEvals = BTreeSet<JobId>;

/// What the processes reported this round, gathered across tasks.
pub(crate) struct Reports<'a> {
    /// Evaluations per job, its own or watched (the merge guard's).
    evals: &'a mut BTreeMap<JobId, Vec<f64>>,
    /// Each job's latest (iteration, loss) in a joint process.
    losses: &'a mut BTreeMap<JobId, (u64, f64)>,
    own: &'a mut OwnEvals,
}

/// Whether `node` may report process `task_id`: every live job of the
/// process (a training task's members, a profiling run's job) was placed on
/// that node by some plan. A job's own suspension or a lost node's last
/// report comes from such a node, even after the plan moved the job; any
/// other report is forged or misrouted. Tasks of unknown or finished jobs
/// pass: nothing reads them.
pub(crate) fn reported_by_its_node(
    placed: &BTreeMap<JobId, BTreeSet<fmsched_core::NodeId>>,
    live: &BTreeMap<JobId, JobRecord>,
    node: &fmsched_core::NodeId,
    task_id: &str,
) -> bool {
    let jobs = match task_id.strip_suffix(PROFILE_SUFFIX) {
        Some(job) => job.parse::<JobId>().ok().map(|j| vec![j]),
        None => members_of(task_id),
    };
    jobs.unwrap_or_default()
        .iter()
        .filter(|j| live.contains_key(j))
        .all(|j| placed.get(j).is_some_and(|nodes| nodes.contains(node)))
}

/// The process of a training task: `<job>`, or `<a>+<b>` for the joint
/// process of a spatial merge. None for anything else.
pub(crate) fn members_of(task_id: &str) -> Option<Vec<JobId>> {
    match task_id.split_once('+') {
        Some((a, b)) => Some(vec![a.parse().ok()?, b.parse().ok()?]),
        None => Some(vec![task_id.parse().ok()?]),
    }
}

/// The fitted Eq. 3 curve stored with a job's estimates.
pub(crate) fn curve_from_json(v: &serde_json::Value) -> Option<LossCurve> {
    let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    Some(LossCurve {
        beta0: f("beta0")?,
        beta1: f("beta1")?,
        beta2: f("beta2")?,
        beta3: f("beta3")?,
        quality: f("quality").unwrap_or(0.0),
    })
}

/// The placement shape of a job over several nodes (the throughput table's
/// digits: its GPUs on each node, in rank order) from the plan in force;
/// None when the plan no longer gives it `world_size` GPUs or a node holds
/// more than 9 of them (a shape the table cannot name).
pub(crate) fn gang_placement(plan: &[Assignment], job: JobId, world_size: u32) -> Option<String> {
    let mut parts: Vec<&Assignment> = plan.iter().filter(|a| a.job == job && !a.profile).collect();
    parts.sort_by_key(|a| a.rank_offset);
    let counts: Vec<usize> = parts.iter().map(|a| a.gpus.len()).collect();
    if parts.len() < 2
        || counts.iter().sum::<usize>() != world_size as usize
        || counts.iter().any(|&c| !(1..=9).contains(&c))
    {
        return None;
    }
    Some(counts.iter().map(|c| c.to_string()).collect())
}
