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

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::policy::MergeMode;
use fmsched_core::{JobId, JobState, NodeId};
use fmsched_estimator::analytic;
use fmsched_estimator::curve_prior::{self, CurveLibrary, Metric, Query, Start};
use fmsched_estimator::icefrog;
use fmsched_estimator::loss_curve::{
    LossCurve, MIN_LOSS_POINTS, PLATEAU_THRESHOLD, fit_loss_curve, iterations_to_converge,
};
use fmsched_estimator::loss_prior::{self, LossLibrary};
use fmsched_estimator::lut::{Lut, Variant};
use fmsched_estimator::times;
use fmsched_estimator::transfer::{TaskEmbedding, observed_gain, spatial_score, temporal_score};
use fmsched_proto::v1 as pb;

use super::{DEFAULT_ITERATIONS, RoundError, RoundKind, iteration_budget};
use crate::api::AppState;
use crate::estimates::Estimates;
use crate::persistence::{
    AdminState, Assignment, Estimate, Failure, FreshStart, JobRecord, JobService, MergeRecord,
    MetricCurve, RetryState, RoundWrites, StoredPlan,
};
use crate::registry::LiveNode;

/// Task id suffix of a job's profiling run.
pub(crate) const PROFILE_SUFFIX: &str = "-profile";

/// Loss points a merged job's own trace needs before its observed gain is
/// measured (fewer at its completion: whatever it reported then).
const GAIN_POINTS: usize = 20;
const GAIN_POINTS_AT_END: usize = 5;

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
    /// Estimates, with what this round learned (profiles, refits).
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
    pub utilization_fits: BTreeMap<(String, String), icefrog::UtilizationFit>,

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

/// A report of a job restarted from its initial weights
/// ([`fresh_start_if_it_pays`]) counts only from a process of a plan at or
/// after the restart: an older one is the dropped run (its progress and
/// checkpoints are not the job's any more). None for such a stale report;
/// else the jobs whose fresh process it shows for the first time.
fn fresh_run(fresh: &BTreeMap<JobId, FreshStart>, t: &pb::ObservedTask) -> Option<Vec<JobId>> {
    let restarted: Vec<(JobId, &FreshStart)> = members_of(&t.task_id)
        .into_iter()
        .flatten()
        .filter_map(|j| fresh.get(&j).map(|f| (j, f)))
        .collect();
    if restarted.iter().any(|(_, f)| t.generation < f.generation) {
        return None;
    }
    Some(
        restarted
            .into_iter()
            .filter(|(_, f)| f.pending)
            .map(|(j, _)| j)
            .collect(),
    )
}

/// Phase 1 (see the module docs). A look-ahead round reads the same state
/// but takes in no report: it only predicts which jobs finish before the
/// switch.
pub(crate) async fn observe(
    state: &AppState,
    lut: &Lut,
    est: &Estimates,
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

/// A shared GPU reporting at least this utilisation is saturated: its two
/// processes want more than the GPU has (ICEFROG Eq. 8's second rule,
/// mispredicted), so each runs slower than the λ = 0.9 planned.
const SATURATED_PCT: u32 = 98;
/// Rounds in a row a shared GPU may run saturated before its pair is split.
const SATURATED_ROUNDS: u32 = 3;

/// ICEFROG Eq. 8 measured: a GPU two training processes share that reports
/// [`SATURATED_PCT`] or more for [`SATURATED_ROUNDS`] rounds in a row is
/// split — the later-submitted of its jobs never shares a GPU again
/// (written in the round's commit, with an event on the job), so the
/// policy moves it off or suspends it.
/// ICEFROG's utilisation regression fed by measurement
/// ([`icefrog::UtilizationFit`]): each one-GPU training process of one job
/// that runs alone on its GPU (no other job planned there, stepping) adds
/// its measured utilisation — its own NVML reading, else its GPU's — to
/// its model's fit on that GPU type, at its step work (its batch and its
/// variant with the frozen layers it trains with). The fits it changed are
/// written with the round; the next round's footprints predict from them.
fn learn_utilization(o: &mut Observed, nodes: &[LiveNode]) {
    let planned = jobs_by_gpu(&o.current.assignments);
    let mut changed: BTreeSet<(String, String)> = BTreeSet::new();
    for n in nodes {
        for t in &n.observed_tasks {
            let ([uuid], Some(members)) = (&t.gpu_uuids[..], members_of(&t.task_id)) else {
                continue;
            };
            let ([id], true) = (&members[..], t.phase == pb::TaskPhase::Running as i32) else {
                continue;
            };
            let (Some(job), Some(tel), Some(gpu)) = (
                o.live.get(id),
                n.telemetry.get(uuid),
                n.record.gpus.iter().find(|g| g.uuid.0 == *uuid),
            ) else {
                continue;
            };
            if t.step_time_s <= 0.0
                || t.world_size > 1
                || planned.get(uuid.as_str()).map(Vec::len) != Some(1)
            {
                continue;
            }
            let util = tel
                .processes
                .iter()
                .find(|p| p.pid == t.pid && p.utilization_percent > 0)
                .map_or(tel.utilization_percent, |p| p.utilization_percent);
            let frozen = t
                .jobs
                .iter()
                .find(|r| r.job_id == id.to_string() && !r.layer_variance.is_empty())
                .map_or(job.spec.frozen_count(), |r| r.frozen_layers);
            let variant = Variant {
                frozen_layers: frozen,
                ..Variant::of_spec(&job.spec)
            };
            let work = icefrog::step_work(
                &job.spec.model,
                &variant,
                job.spec.hyperparameters.global_batch_size.max(1),
            );
            let key = (job.spec.model.clone(), analytic::gpu_family(&gpu.model));
            if o.utilization_fits
                .entry(key.clone())
                .or_default()
                .add(work, f64::from(util))
            {
                changed.insert(key);
            }
        }
    }
    o.writes.utilization_fits = changed
        .into_iter()
        .filter_map(|k| o.utilization_fits.get(&k).map(|f| (k.clone(), *f)))
        .collect();
}

/// The jobs the plan in force trains on each GPU (by UUID; profiling runs
/// left out): two on a shared GPU.
fn jobs_by_gpu(assignments: &[crate::persistence::Assignment]) -> BTreeMap<&str, Vec<JobId>> {
    let mut on: BTreeMap<&str, Vec<JobId>> = BTreeMap::new();
    for a in assignments.iter().filter(|a| !a.profile) {
        for g in &a.gpus {
            on.entry(g.0.as_str()).or_default().push(a.job);
        }
    }
    on
}

fn watch_shared_gpus(state: &AppState, o: &mut Observed, nodes: &[LiveNode]) {
    let on = jobs_by_gpu(&o.current.assignments);
    let util = |uuid: &str| {
        nodes
            .iter()
            .find_map(|n| n.telemetry.get(uuid))
            .map(|t| t.utilization_percent)
    };
    let mut streaks = state
        .saturated_gpus
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    streaks.retain(|uuid, _| on.get(uuid.as_str()).is_some_and(|j| j.len() > 1));
    for (uuid, jobs) in on.iter().filter(|(_, j)| j.len() > 1) {
        let Some(u) = util(uuid) else { continue };
        let streak = streaks.entry((*uuid).to_string()).or_default();
        *streak = if u >= SATURATED_PCT { *streak + 1 } else { 0 };
        if *streak < SATURATED_ROUNDS {
            continue;
        }
        *streak = 0;
        let later = jobs
            .iter()
            .filter_map(|j| o.live.get(j))
            .max_by_key(|r| (r.created_at, r.id))
            .map(|r| r.id);
        if let Some(j) = later.filter(|j| o.no_sharing.insert(*j)) {
            let why = format!(
                "GPU {uuid} ran at {u} % or more for {SATURATED_ROUNDS} rounds while shared: \
                 it no longer shares a GPU (ICEFROG Eq. 8)"
            );
            tracing::warn!(job_id = %j, gpu = %uuid, utilization = u, "splitting a saturated shared GPU");
            o.writes.no_sharing.push(j);
            o.writes.notes.push((j, "gpu_sharing_split".into(), why));
        }
    }
}

/// Jobs whose own metric curve grew this round.
type OwnEvals = BTreeSet<JobId>;

/// What the processes reported this round, gathered across tasks.
struct Reports<'a> {
    /// Evaluations per job, its own or watched (the merge guard's).
    evals: &'a mut BTreeMap<JobId, Vec<f64>>,
    /// Each job's latest (iteration, loss) in a joint process.
    losses: &'a mut BTreeMap<JobId, (u64, f64)>,
    own: &'a mut OwnEvals,
}

/// Finished jobs' curves read as the prior per round, at most.
const PRIOR_CURVES: i64 = 2000;

/// Finished jobs' loss curves per model read as the loss prior, at most
/// (a prediction's cost grows with the library).
const PRIOR_LOSS_CURVES: i64 = 200;

/// Least fit quality (R²) of a finished job's loss curve in the prior.
const PRIOR_LOSS_QUALITY: f64 = 0.5;

/// The loss-curve prior (`estimator::loss_prior`) of `model`: the fitted
/// Eq. 3 curves of up to [`PRIOR_LOSS_CURVES`] finished jobs of the model
/// plus the shipped shapes. Read at most once a round per model, and only
/// when one of its jobs is estimated (a profile ended, or a running job's
/// own fit moved); a failed read leaves the shipped shapes (said in the
/// log).
async fn loss_prior_of<'a>(
    state: &AppState,
    priors: &'a mut BTreeMap<String, LossLibrary>,
    model: &str,
) -> &'a LossLibrary {
    if !priors.contains_key(model) {
        let mut lib = LossLibrary::shipped();
        match state
            .persistence
            .finished_loss_curves(model, PRIOR_LOSS_CURVES, PRIOR_LOSS_QUALITY)
            .await
        {
            Ok(rows) => {
                for curve in rows {
                    if let Some(c) = curve_from_json(&curve) {
                        lib.push(&c);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, model, "finished jobs' loss curves not read; predicting from the shipped shapes");
            }
        }
        priors.insert(model.to_string(), lib);
    }
    &priors[model]
}

/// Jobs with a metric target whose processes reported evaluations (folded
/// into their per-epoch curve by [`observe_task`], kept across restarts):
/// the curve is written, and a live job's iterations are re-estimated by
/// the learned prior
/// (`estimator::curve_prior`: a kernel regression on the finished jobs of
/// the same model and metric, each with its curve and the target it
/// trained for; model averaging over their curves and the shipped shapes
/// where no finished job's head is like this one's) —
/// epochs-to-target with its p10–p90 spread, times iterations per epoch.
/// A job without `dataset.num_samples` keeps its curve but no iteration
/// estimate (epochs cannot be turned into iterations).
async fn learn_metric_targets(state: &AppState, o: &mut Observed, own: &OwnEvals) {
    let mut changed: Vec<(JobId, Estimate)> = Vec::new();
    for id in own {
        let Some(e) = o.estimates.get(id) else {
            continue;
        };
        if o.live.contains_key(id) {
            changed.push((*id, e.clone()));
        } else {
            // Completed in this report: its whole curve, the prior of the
            // jobs after it.
            o.writes.estimates.push((*id, e.clone()));
        }
    }
    if changed.is_empty() {
        return;
    }
    let mut models: Vec<String> = changed
        .iter()
        .map(|(id, _)| o.live[id].spec.model.clone())
        .collect();
    models.sort_unstable();
    models.dedup();
    let prior = match state
        .persistence
        .finished_metric_curves(&models, PRIOR_CURVES)
        .await
    {
        Ok(p) => p,
        Err(err) => {
            tracing::warn!(error = %err, "finished jobs' metric curves not read; predicting from the shipped shapes");
            Vec::new()
        }
    };
    let ids: Vec<JobId> = changed.iter().map(|(id, _)| *id).collect();
    let transferred = match state.persistence.transferred_jobs(&ids).await {
        Ok(t) => t,
        Err(err) => {
            tracing::warn!(error = %err, "how jobs started not read; predicting each as a job alone");
            BTreeSet::new()
        }
    };
    let shapes = CurveLibrary::shipped();
    for (id, mut e) in changed {
        let job = &o.live[&id];
        let start = Start::from_transferred(transferred.contains(&id));
        predict_metric_target(job, start, &prior, &shapes, &mut e);
        o.writes.estimates.push((id, e.clone()));
        o.estimates.insert(id, e);
    }
}

/// Sets `e.iterations`, `e.spread` and `e.note` from `e.evals` (see
/// [`learn_metric_targets`]) for a job that started as `start`; `shapes`
/// is [`CurveLibrary::shipped`].
fn predict_metric_target(
    job: &JobRecord,
    start: Start,
    prior: &[MetricCurve],
    shapes: &CurveLibrary,
    e: &mut Estimate,
) {
    let Some(m) = &job.spec.target.metric else {
        return;
    };
    let metric = Metric::named(&m.name, m.lower_is_better);
    let mut lib = CurveLibrary::new();
    let mut longest = 0;
    for c in prior.iter().filter(|c| {
        c.model == job.spec.model && c.metric == m.name && c.lower_is_better == m.lower_is_better
    }) {
        // Its shape, and the same curve with its target: when it met what
        // its user set, and how it started.
        if lib
            .add_finished_as(
                &c.evals,
                c.target,
                metric,
                Start::from_transferred(c.transferred),
            )
            .is_ok()
        {
            longest = longest.max(c.evals.len());
        }
    }
    let finished = lib.len();
    let lib = lib.extended(shapes);
    let batch = u64::from(job.spec.hyperparameters.global_batch_size.max(1));
    let per_epoch = job
        .spec
        .dataset
        .num_samples
        .map(|n| n.div_ceil(batch).max(1));
    // The epochs it may run: its budget, else twice the longest curve known.
    let cap = match (
        job.spec.target.max_epochs,
        job.spec.target.max_iterations,
        per_epoch,
    ) {
        (Some(me), _, _) => me as usize,
        (None, Some(mi), Some(pe)) => mi.div_ceil(pe) as usize,
        _ => 2 * longest.max(10).max(e.evals.len()),
    }
    .max(1);
    let q = Query {
        head: &e.evals,
        target: m.value,
        metric,
        start,
        cap_epochs: cap,
    };
    let p = match curve_prior::predict(&lib, &q) {
        Ok(p) => p,
        Err(err) => {
            e.note = format!("metric {}: no prediction ({err})", m.name);
            return;
        }
    };
    let seen = e.evals.len();
    e.spread = curve_prior::remaining_spread(&p, seen);
    e.note = format!(
        "metric {}: {} at epoch {} (p10-p90 {}-{}) from {seen} evaluations; prior of {finished} finished {} jobs ({})",
        m.name,
        m.value,
        p.epochs,
        p.low,
        p.high,
        job.spec.model,
        match (p.by_targets, start) {
            (true, Start::Alone) => "when starts like this one met their targets",
            (true, Start::Transferred) => {
                "when transferred starts like this one met their targets"
            }
            (false, _) => "their curves' shapes",
        }
    );
    match per_epoch {
        Some(pe) => {
            let k = (p.epochs * pe as f64).ceil() as u64;
            let k = iteration_budget(job).map_or(k, |b| k.min(b));
            tracing::info!(job_id = %job.id, epochs = p.epochs, low = p.low, high = p.high, iterations = k,
                evaluations = seen, prior = finished, "metric target estimated");
            e.iterations = Some(k);
        }
        None => e.note += "; no dataset.num_samples: iterations not estimated",
    }
}

/// An active merge one of whose jobs ended without completing (cancelled,
/// or failed for good) is split, and the other job goes on alone: the
/// joint process of a spatial pair would otherwise go on training the
/// cancelled task beside the live one (every step takes a batch of each)
/// until it met its target. As a guard split, a spatial pair's live job
/// waits one round for the joint process's last checkpoint
/// (`split_now`). A job that completed ends nothing: a spatial pair's
/// other task trains on in the joint process, and a temporal B starts
/// from A's weights.
async fn split_merges_of_ended_jobs(state: &AppState, o: &mut Observed) -> Result<(), RoundError> {
    let ended: BTreeSet<JobId> = o
        .merges
        .iter()
        .filter(|m| m.active && !o.split_now.contains(&m.id))
        .flat_map(|m| [m.a, m.b])
        .filter(|j| !o.live.contains_key(j))
        .collect();
    for job in ended {
        let Some(rec) = state.persistence.get_job(job).await? else {
            continue;
        };
        if !rec.state.is_terminal() || rec.state == JobState::Completed {
            continue;
        }
        for m in o
            .merges
            .iter_mut()
            .filter(|m| m.active && (m.a == job || m.b == job))
        {
            let other = if m.a == job { m.b } else { m.a };
            let other_name = o.live.get(&other).map_or("", |r| r.spec.name.as_str());
            let reason = format!(
                "{} ({job}) was {}; {other_name} ({other}) trains on alone",
                rec.spec.name, rec.state
            );
            tracing::info!(merge = m.id, job_id = %job, state = %rec.state, "merge split: one of its jobs ended");
            o.split_now.insert(m.id);
            o.writes.released.push((m.clone(), reason));
            m.active = false;
        }
    }
    Ok(())
}

/// The merge guard (Ymir §4.3): a merge whose watched accuracy does not
/// improve in the first two epochs is split and both jobs are scheduled on
/// their own. Temporal A ↦ B: B's accuracy with A's weights, evaluated while
/// A trains. Spatial A ‖ B: each task's accuracy in the joint job. A spatial
/// verdict also measures the pair's gain (each job's loss against its own
/// curve); a temporal split shows no gain, not how much was lost, so it is
/// recorded as 0 (an upper bound), and a kept temporal merge is measured
/// later, on B's own training.
fn guard(
    o: &mut Observed,
    evals: &BTreeMap<JobId, Vec<f64>>,
    losses: &BTreeMap<JobId, (u64, f64)>,
) {
    let unguarded: Vec<MergeRecord> = o
        .merges
        .iter()
        .filter(|m| m.active && !m.guard_passed && !o.split_now.contains(&m.id))
        .cloned()
        .collect();
    for m in unguarded {
        let watched: Vec<Watched<'_>> = match m.mode {
            MergeMode::Temporal => vec![m.b],
            _ => vec![m.a, m.b],
        }
        .into_iter()
        .filter_map(|j| {
            let spec = &o.live.get(&j)?.spec;
            Some(Watched {
                job: j,
                evals: evals.get(&j).map(Vec::as_slice),
                lower_is_better: spec
                    .target
                    .metric
                    .as_ref()
                    .is_some_and(|t| t.lower_is_better),
            })
        })
        .collect();
        let verdict = guard_verdict(m.mode, &watched);
        let measured = match (&verdict, m.mode) {
            (GuardVerdict::Wait, _) => None,
            (GuardVerdict::Split(_), MergeMode::Temporal) => Some(0.0),
            (_, MergeMode::Temporal) => None,
            _ => spatial_gain(&o.estimates, losses, &m),
        };
        match verdict {
            GuardVerdict::Split(reason) => {
                tracing::warn!(merge = m.id, mode = m.mode.as_str(), %reason, "merge guard: splitting");
                o.split_now.insert(m.id);
                o.guard_splits += 1;
                o.writes.guard.push((m.clone(), Some(reason)));
            }
            GuardVerdict::Keep => o.writes.guard.push((m.clone(), None)),
            GuardVerdict::Wait => {}
        }
        if let Some(gain) = measured {
            record_outcome(o, &m, gain);
        }
    }
    for m in &mut o.merges {
        m.active &= !o.split_now.contains(&m.id);
    }
}

/// A spatial pair's observed gain: the mean over its two jobs of each one's
/// loss against its own (alone) curve at the iterations it reached in the
/// joint process.
fn spatial_gain(
    estimates: &BTreeMap<JobId, Estimate>,
    losses: &BTreeMap<JobId, (u64, f64)>,
    m: &MergeRecord,
) -> Option<f64> {
    let gains: Vec<f64> = [m.a, m.b]
        .iter()
        .filter_map(|j| {
            let curve = estimates.get(j)?.curve.as_ref().and_then(curve_from_json)?;
            let &(it, loss) = losses.get(j)?;
            observed_gain(&curve, &[it as f64], &[loss])
        })
        .collect();
    (gains.len() == 2).then(|| (gains[0] + gains[1]) / 2.0)
}

/// B of a temporal transfer from a completed job (a warm start, or a merge
/// whose A finished) measured the gain `gain` on its own training. Where
/// the transfer hurts so much that starting again from the pre-trained
/// weights finishes B sooner, counting the restart
/// ([`times::fresh_start_pays`]), the merge is split (the guard's verdict,
/// with the figures) and B restarts from those weights: its progress and
/// checkpoint are reset in this round's commit, the plan tells its node to
/// start it afresh (`DesiredTask.fresh_start`), and reports of the dropped
/// run are ignored from then on ([`crate::persistence::FreshStart`]). The
/// merge guard's first-two-epochs rule cannot see this: from another
/// task's weights B's accuracy may still rise, only more slowly than from
/// the pre-trained ones. Only a job whose stop depends on how it learns (a
/// metric target, or a loss plateau without an iteration budget) can gain
/// by it: a fixed budget runs its iterations either way.
async fn fresh_start_if_it_pays(
    state: &AppState,
    lut: &Lut,
    o: &mut Observed,
    n: &LiveNode,
    m: &MergeRecord,
    curve: &LossCurve,
    gain: f64,
) {
    let b = m.b;
    let Some(job) = o.live.get(&b) else {
        return;
    };
    let budget = iteration_budget(job);
    if job.spec.target.metric.is_none() && budget.is_some() {
        return;
    }
    let Some(step_s) = o
        .estimates
        .get(&b)
        .and_then(|e| e.step_time_s)
        .filter(|s| s.is_finite() && *s > 0.0)
    else {
        return;
    };
    let sched = &state.config.scheduling;
    let family = super::inputs::node_family(n);
    let restart_s = fmsched_core::round::restart_cost(
        sched.checkpoint_cost.as_secs_f64(),
        sched
            .context_switch
            .map(|d| d.as_secs_f64())
            .or_else(|| lut.context_switch_s(&job.spec.model, &family)),
    );
    let done = o.progress.get(&b).map_or(0, |p| p.0);
    let Some((left, fresh)) =
        times::fresh_start_pays(curve, gain, done, budget.unwrap_or(0), restart_s / step_s)
    else {
        return;
    };
    // A completed (a read error only costs the history its name).
    let from = match state.persistence.get_job(m.a).await {
        Ok(Some(a)) => format!("{} ({})", a.spec.name, m.a),
        _ => m.a.to_string(),
    };
    let reason = format!(
        "{} ({b}) trains worse from the output weights of {from} than from the pre-trained ones (measured gain {gain:+.3} at iteration {done}): about {left} more iterations from them against {fresh} from scratch and a {restart_s:.0} s restart, so it starts again from the pre-trained weights",
        job.spec.name
    );
    tracing::warn!(merge = m.id, job_id = %b, gain, done, left, fresh, "harmful transfer: restarting from the pre-trained weights");
    o.split_now.insert(m.id);
    o.guard_splits += 1;
    o.writes.guard.push((m.clone(), Some(reason)));
    if let Some(rec) = o.merges.iter_mut().find(|x| x.id == m.id) {
        rec.active = false;
    }
    // What it trained from the other job's weights is dropped.
    o.writes.fresh_starts.push(b);
    o.progress.insert(b, (0, None));
    if let Some(e) = o.estimates.get_mut(&b)
        && !e.evals.is_empty()
    {
        e.evals.clear();
        let e = e.clone();
        o.writes.estimates.retain(|(j, _)| *j != b);
        o.writes.estimates.push((b, e));
    }
    o.fresh.insert(
        b,
        FreshStart {
            generation: o.current.generation + 1,
            pending: true,
        },
    );
}

/// Queues a merge outcome (score from the two jobs' Task2Vec embeddings)
/// and marks the merge as measured, once.
fn record_outcome(o: &mut Observed, m: &MergeRecord, gain: f64) {
    if m.observed_gain.is_some() || o.outcomes.iter().any(|x| x.merge == m.id) {
        return;
    }
    let emb = |j: &JobId| {
        o.estimates
            .get(j)
            .filter(|e| !e.fisher.is_empty() && e.fisher.len() == e.fisher_repeat.len())
            .map(|e| TaskEmbedding {
                fisher: e.fisher.clone(),
                fisher_repeat: e.fisher_repeat.clone(),
            })
    };
    let (Some(ea), Some(eb)) = (emb(&m.a), emb(&m.b)) else {
        return;
    };
    let score = match m.mode {
        MergeMode::Spatial => spatial_score(&ea, &eb),
        _ => temporal_score(&ea, &eb),
    };
    if !(score.is_finite() && gain.is_finite()) {
        return;
    }
    tracing::info!(
        merge = m.id,
        mode = m.mode.as_str(),
        score,
        gain,
        predicted = m.gain_ab,
        "merge outcome measured"
    );
    o.writes.observed_gains.push((m.id, gain));
    // This round plans on it already (`inputs::job_inputs`).
    if let Some(rec) = o.merges.iter_mut().find(|x| x.id == m.id) {
        rec.observed_gain = Some(gain);
    }
    o.outcomes.push(TransferOutcome {
        merge: m.id,
        score,
        gain,
    });
}

/// Takes in one process a node reports: a profiling run that ended queues
/// its job with what it measured; a training process records progress and
/// checkpoints, teaches the estimator its step time and loss trace, and
/// completes or retries (then fails) its jobs.
#[allow(clippy::too_many_arguments)]
async fn observe_task(
    state: &AppState,
    lut: &Lut,
    est: &Estimates,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    now: DateTime<Utc>,
    reports: Reports<'_>,
) {
    let Reports { evals, losses, own } = reports;
    // Profiling runs: "<job>-profile".
    if let Some(job_part) = t.task_id.strip_suffix(PROFILE_SUFFIX) {
        if let Ok(id) = job_part.parse::<JobId>() {
            observe_profile_run(state, est, o, n, t, id).await;
        }
        return;
    }
    // A training process: one job ("<job>") or a spatial pair ("<a>+<b>",
    // one joint process).
    let Some(members) = members_of(&t.task_id) else {
        return;
    };
    let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
    // A non-zero member of a gang: rank 0 reports progress, checkpoints and
    // completion; this process only counts when it fails (its job's gang
    // broke: the job is re-queued from rank 0's last checkpoint) as a part
    // of the job's run in force. A part of a run the plan has replaced (its
    // job moved off this node, or to other GPUs or ranks here) exits
    // non-zero by the contract once its rank 0 went away: that is the
    // replaced run's end, not a failure of the job.
    if t.rank_offset > 0 {
        if phase == pb::TaskPhase::Failed {
            for &id in &members {
                if o.live
                    .get(&id)
                    .is_some_and(|j| j.state == JobState::Running)
                    && part_in_force(&o.current.assignments, id, &n.record.id, t)
                {
                    failed(state, o, n, t, &members, id, now);
                }
            }
        }
        return;
    }
    let ckpt = Some(t.checkpoint_path.clone()).filter(|c| !c.is_empty());
    // One row per job: a job reported twice (the stale last report of a
    // lost node beside its new process) keeps its furthest report.
    let progressed = |o: &mut Observed, j: JobId, iteration: u64| {
        match o.writes.progress.iter_mut().find(|p| p.0 == j) {
            Some(p) if p.1 > iteration => {}
            Some(p) => {
                p.1 = iteration;
                if ckpt.is_some() {
                    p.2.clone_from(&ckpt);
                }
            }
            None => o.writes.progress.push((j, iteration, ckpt.clone())),
        }
        let entry = o.progress.entry(j).or_insert((0, None));
        if iteration >= entry.0 {
            entry.0 = iteration;
            if ckpt.is_some() {
                entry.1.clone_from(&ckpt);
            }
        }
    };
    if t.jobs.is_empty() && o.live.contains_key(&members[0]) {
        // An agent that reports no per-job progress.
        progressed(o, members[0], t.iteration);
    }
    // Evaluations count for the process's own jobs and, in a temporal
    // merge, for the partner it evaluates; a report naming any other job is
    // not this process's to make.
    let watched = |o: &Observed, j: JobId| {
        members.contains(&j)
            || o.merges.iter().any(|m| {
                m.active
                    && ((m.a == j && members.contains(&m.b))
                        || (m.b == j && members.contains(&m.a)))
            })
    };
    for r in &t.jobs {
        let Ok(j) = r.job_id.parse::<JobId>() else {
            continue;
        };
        if let Some(p) = &r.prompt_init
            && members.contains(&j)
            && o.live.contains_key(&j)
        {
            o.writes.first_notes.push((
                j,
                "prompt_bank".into(),
                format!(
                    "initial prompt from the Prompt Bank: job {}'s tuned prompt (score {:.4}; {} of {} prompts scored)",
                    p.from_job_id, p.score, p.scored, p.candidates
                ),
            ));
        }
        if !r.evals.is_empty() && watched(o, j) {
            evals.insert(j, r.evals.clone());
        }
        // A job's own training curve (not a partner's weights evaluated on
        // its task), per epoch — folded now, while a job that completes in
        // this report is still here to say it has a metric target.
        if members.contains(&j)
            && !r.eval_epochs.is_empty()
            && o.live
                .get(&j)
                .is_some_and(|job| job.spec.target.metric.is_some())
        {
            let mut e = o.estimates.get(&j).cloned().unwrap_or_default();
            if curve_prior::fold_evals(&mut e.evals, &r.eval_epochs, &r.evals) {
                o.estimates.insert(j, e);
                own.insert(j);
            }
        }
        // Watched (eval-only) jobs are not trained by this process.
        if members.contains(&j) && o.live.contains_key(&j) {
            progressed(o, j, r.iteration);
            if r.loss > 0.0 && r.iteration > 0 {
                losses.insert(j, (r.iteration, r.loss));
            }
        }
    }
    learn_from_running(state, lut, est, o, n, t, &members, phase).await;
    for &id in &members {
        let Some(job) = o.live.get(&id) else { continue };
        if job.state != JobState::Running {
            continue;
        }
        // A job completes when its own task reached its target, even while
        // the joint process trains its partner on.
        let output = t.outputs.get(&id.to_string()).cloned();
        if output.is_some() || phase == pb::TaskPhase::Succeeded {
            // A process that exits 0 without reporting its output (a plain
            // command that does not speak the report protocol, or a trainer
            // that broke the contract) still completes its job: exit 0 is
            // success. Its history says the output is missing, so the empty
            // path is not taken for a result.
            if output.is_none() {
                tracing::warn!(job_id = %id, node_id = %n.record.id,
                    "job completed: its process exited 0 without reporting an output");
                o.writes.first_notes.push((
                    id,
                    "no_output".into(),
                    format!(
                        "process {} on node {} exited 0 without a `done` report: completed with no output recorded (the trainer contract's `done` line names it)",
                        t.task_id, n.record.id
                    ),
                ));
            }
            let output = output.unwrap_or_default();
            tracing::info!(job_id = %id, node_id = %n.record.id, %output, "job completed");
            // A tuned prompt goes into its model's Prompt Bank.
            if let Some(r) = t.jobs.iter().find(|r| r.job_id == id.to_string())
                && job.spec.kind == fmsched_core::JobKind::PromptTuning
                && !r.prompt_features.is_empty()
                && !output.is_empty()
            {
                let model = job.spec.model.clone();
                o.bank_new.push(crate::persistence::BankPrompt {
                    job: id,
                    model,
                    location: output.clone(),
                    features: r.prompt_features.clone(),
                });
            }
            o.writes.completions.push((id, output));
            if let Some(j) = o.live.remove(&id) {
                o.finished.insert(id, j);
            }
            o.completed += 1;
            continue;
        }
        if phase == pb::TaskPhase::Failed {
            failed(state, o, n, t, &members, id, now);
        }
    }
}

/// The placement shape of a job over several nodes (the throughput table's
/// digits: its GPUs on each node, in rank order) from the plan in force;
/// None when the plan no longer gives it `world_size` GPUs or a node holds
/// more than 9 of them (a shape the table cannot name).
fn gang_placement(plan: &[Assignment], job: JobId, world_size: u32) -> Option<String> {
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

/// A job's profiling run: once it ended, its job is queued with what it
/// measured (estimates; its step time teaches the estimator's table). A
/// run still going leaves the job profiling: it must not be scheduled yet.
async fn observe_profile_run(
    state: &AppState,
    est: &Estimates,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    id: JobId,
) {
    let Some(model) = o
        .live
        .get(&id)
        .filter(|j| j.state == JobState::Profiling)
        .map(|j| j.spec.model.clone())
    else {
        return;
    };
    let fits =
        t.phase == pb::TaskPhase::Succeeded as i32 && t.trace_losses.len() >= MIN_LOSS_POINTS;
    if fits {
        loss_prior_of(state, &mut o.loss_priors, &model).await;
    }
    let Some(j) = o.live.get_mut(&id) else {
        return;
    };
    let Some((learned, reason)) = profile_estimate(j, t, o.loss_priors.get(&model)) else {
        return;
    };
    tracing::info!(job_id = %id, %reason, "profiling done");
    o.writes.estimates.push((id, learned.clone()));
    o.writes.transitions.push((id, JobState::Queued, reason));
    o.estimates.insert(id, learned);
    j.state = JobState::Queued;
    // 1 GPU, the job's batch; AMP as the shipped profiles.
    if t.step_time_s > 0.0
        && let Some(g) = n.record.gpus.first()
    {
        let sample = profile_step_time_sample(j, &g.model, t.step_time_s);
        if let Err(e) = est.record_step_times(vec![sample]).await {
            tracing::warn!(job_id = %id, error = %e, "step time not recorded");
        }
    }
}

/// Whether reported process `t` on `node` is `job`'s part there in the
/// plan in force: the same GPUs and ranks.
fn part_in_force(plan: &[Assignment], job: JobId, node: &NodeId, t: &pb::ObservedTask) -> bool {
    plan.iter().any(|a| {
        a.job == job
            && !a.profile
            && &a.node == node
            && a.rank_offset == t.rank_offset
            && a.gpus.len() == t.gpu_uuids.len()
            && a.gpus.iter().zip(&t.gpu_uuids).all(|(g, u)| &g.0 == u)
    })
}

/// A training process of `id` failed: counted once (by its pid), the job
/// is held back `retry_backoff · 2^(retries − 1)` and retried from its last
/// checkpoint, or fails after `max_retries`. A failed joint process splits
/// its merge.
fn failed(
    state: &AppState,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    members: &[JobId],
    id: JobId,
    now: DateTime<Utc>,
) {
    if members.len() > 1
        && let Some(m) = o
            .merges
            .iter()
            .find(|m| m.active && m.a == members[0] && !o.split_now.contains(&m.id))
    {
        o.writes
            .guard
            .push((m.clone(), Some("the joint process failed".into())));
        o.split_now.insert(m.id);
    }
    let prev = o.retries.get(&id).cloned().unwrap_or_default();
    if prev.last_failed_pid == Some(t.pid) {
        return; // this process's failure was counted already
    }
    // A process that last ran under an older plan than the one that
    // re-queued the job: another member of a gang whose failure was
    // counted, or the run before's. One failure per run, not per rank.
    if t.generation > 0
        && prev
            .last_failed_generation
            .is_some_and(|g| t.generation < g)
    {
        return;
    }
    // This round's plan (the generation after the one in force) is the
    // first a new run of the job can start under.
    let generation = o.current.generation + 1;
    let cfg = &state.config.scheduling;
    let retries = prev.retries + 1;
    let wait = cfg.retry_backoff.saturating_mul(1 << (retries - 1).min(10));
    let retry_after = now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX);
    o.retries.insert(
        id,
        RetryState {
            retries,
            last_failed_pid: Some(t.pid),
            retry_after: Some(retry_after),
            last_failed_generation: Some(generation),
        },
    );
    o.writes.failures.push(Failure {
        job: id,
        pid: t.pid,
        generation,
        retries,
        retry_after,
    });
    let what = format!(
        "training process exited with code {} on node {}{}",
        t.exit_code,
        n.record.id,
        if t.message.is_empty() {
            String::new()
        } else {
            format!("; last log lines:\n{}", t.message)
        }
    );
    if retries > cfg.max_retries {
        let reason = format!("{what}\n(gave up after {} retries)", cfg.max_retries);
        tracing::warn!(job_id = %id, retries, "job failed");
        o.writes.transitions.push((id, JobState::Failed, reason));
        o.live.remove(&id);
        o.failed += 1;
    } else {
        let reason = format!(
            "{what}\n(retry {retries} of {} in {wait:?}, from the last checkpoint)",
            cfg.max_retries
        );
        tracing::warn!(job_id = %id, retries, ?wait, "training process failed; will retry");
        o.writes.transitions.push((id, JobState::Queued, reason));
        o.retried += 1;
        if let Some(j) = o.live.get_mut(&id) {
            j.state = JobState::Queued;
        }
    }
}

/// What a running process teaches: a data-parallel job training alone
/// gives the estimator's table its measured step time (once per process)
/// and refreshes its own estimate from its loss trace; B of a temporal
/// merge, training from A's weights, shows the transfer gain it got.
#[allow(clippy::too_many_arguments)]
async fn learn_from_running(
    state: &AppState,
    lut: &Lut,
    est: &Estimates,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    members: &[JobId],
    phase: pb::TaskPhase,
) {
    let [id] = members[..] else {
        return;
    };
    let Some(job) = o.live.get(&id) else {
        return;
    };
    let merge = o
        .merges
        .iter()
        .find(|m| m.active && (m.a == id || m.b == id))
        .cloned();
    // B of a temporal merge trains from A's output weights: its loss
    // against its own (alone) curve is the gain it got (Eq. 2 with
    // L/(1+G)); measured once, with enough points or at its end.
    if let Some(m) = &merge
        && m.mode == MergeMode::Temporal
        && m.b == id
        && !o.live.contains_key(&m.a)
    {
        let enough = if phase == pb::TaskPhase::Succeeded {
            GAIN_POINTS_AT_END
        } else {
            GAIN_POINTS
        };
        if t.trace_losses.len() >= enough
            && let Some(curve) = o
                .estimates
                .get(&id)
                .and_then(|e| e.curve.as_ref())
                .and_then(curve_from_json)
            && let Some(gain) = observed_gain(&curve, &t.trace_iterations, &t.trace_losses)
        {
            let first = m.observed_gain.is_none();
            record_outcome(o, m, gain);
            if first && phase == pb::TaskPhase::Running {
                fresh_start_if_it_pays(state, lut, o, n, m, &curve, gain).await;
            }
        }
        return;
    }
    if phase != pb::TaskPhase::Running || merge.is_some() {
        return;
    }
    let report = t.jobs.iter().find(|r| r.job_id == id.to_string());
    // The frozen layers the process trains with now (its spec's until its
    // trainer reports them).
    let trains_with = report
        .filter(|r| !r.layer_variance.is_empty())
        .map_or(job.spec.frozen_count(), |r| r.frozen_layers);
    if let Some(r) =
        report.filter(|r| !r.layer_variance.is_empty() && job.spec.layer_elasticity.is_some())
    {
        o.layer_variance.insert(id, r.layer_variance.clone());
    }
    if let (Some(r), Some(g)) = (report, n.record.gpus.first())
        && let Some(l) = tune_layers(lut, job, r, &analytic::gpu_family(&g.model), t)
    {
        if l != r.frozen_layers {
            tracing::info!(job_id = %id, from = r.frozen_layers, to = l, "layer tuner: new frozen layers");
        }
        o.frozen_layers.insert(id, l);
    }
    // Merged and pipeline jobs are left out of the table: their batch or
    // layout is not one job's. A job over several nodes is measured by its
    // rank 0 for the whole gang, at the plan's GPUs per node.
    let gang = t.world_size as usize > t.gpu_uuids.len().max(1);
    let placement = if gang {
        (t.rank_offset == 0)
            .then(|| gang_placement(&o.current.assignments, id, t.world_size))
            .flatten()
    } else {
        // A table shape names at most 9 GPUs a node.
        let n = t.gpu_uuids.len().max(1);
        (n <= 9).then(|| n.to_string())
    };
    if t.step_time_s > 0.0
        && est.is_remote()
        && !job.spec.resources.pipeline_parallel
        && let Some(placement) = placement
        && let Some(g) = n.record.gpus.first()
        && est.first_sample_of(&t.task_id, t.pid)
    {
        let sample =
            running_step_time_sample(lut, job, &g.model, &placement, trains_with, t.step_time_s);
        if let Err(e) = est.record_step_times(vec![sample]).await {
            tracing::warn!(job_id = %id, error = %e, "step time not recorded");
        }
    }
    if let Some(refit) = loss_refit(job, t, o.estimates.get(&id)) {
        let prior = loss_prior_of(state, &mut o.loss_priors, &job.spec.model).await;
        let e = refreshed_estimate(job, t, o.estimates.get(&id), refit, prior);
        o.writes.estimates.push((id, e.clone()));
        o.estimates.insert(id, e);
    }
}

/// Turns an ended profiling run into estimates (Ymir §4: Eq. 3 fit, Eq. 2
/// iterations — here over the loss prior of the model's finished jobs,
/// [`predict_loss`]; the Task2Vec embedding kept for transferability)
/// and the reason its job is queued. A run that failed or whose trace
/// cannot support a fit still queues the job, with the reason in its
/// estimates. None while the run has not ended.
fn profile_estimate(
    job: &JobRecord,
    t: &pb::ObservedTask,
    prior: Option<&LossLibrary>,
) -> Option<(Estimate, String)> {
    let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
    if !matches!(phase, pb::TaskPhase::Succeeded | pb::TaskPhase::Failed) {
        return None;
    }
    let cap = job
        .spec
        .target
        .max_iterations
        .unwrap_or(DEFAULT_ITERATIONS * 100);
    let mut est = Estimate {
        fisher: t.fisher.clone(),
        fisher_repeat: t.fisher_repeat.clone(),
        step_time_s: Some(t.step_time_s).filter(|s| *s > 0.0),
        ..Default::default()
    };
    let reason = if phase == pb::TaskPhase::Failed {
        est.note = format!(
            "profiling run exited with code {}: {}",
            t.exit_code, t.message
        );
        format!(
            "profiling failed (exit code {}); scheduling without estimates",
            t.exit_code
        )
    } else {
        match fit_loss_curve(&t.trace_iterations, &t.trace_losses) {
            Ok(c) => {
                let (p, prior_note) = predict_loss(job, t, c, cap, prior);
                est.iterations = Some(p.iterations);
                est.spread = weighed_spread(&p, prior, 0);
                est.curve = Some(curve_to_json(&c));
                est.note = format!(
                    "fit on {} loss points, quality {:.3}; {prior_note}",
                    t.trace_losses.len(),
                    c.quality
                );
                let basis = format!(
                    "Eq. 2 over the loss prior of {} finished {} jobs, p10-p90 {}-{}; own fit quality {:.2}",
                    prior.map_or(0, LossLibrary::jobs),
                    job.spec.model,
                    p.low,
                    p.high,
                    c.quality
                );
                // A job that trains to its `max_iterations` is planned at
                // them: the curve's convergence is not when it ends.
                match super::planned_budget(job) {
                    Some(b) => format!(
                        "profiled: trains its budget of {b} iterations (its loss curve flattens after about {}: {basis})",
                        p.iterations
                    ),
                    None => format!(
                        "profiled: about {} iterations to converge ({basis})",
                        p.iterations
                    ),
                }
            }
            Err(e) => {
                est.note = format!("no loss-curve fit: {e}");
                format!(
                    "profiled, but the loss trace supports no fit ({e}); using the job's target"
                )
            }
        }
    };
    Some((est, reason))
}

/// Iterations to converge from a fitted trace with the loss prior of the
/// job's model (`estimator::loss_prior`; the shipped shapes when the round
/// read none), and the note saying what it rests on.
fn predict_loss(
    job: &JobRecord,
    t: &pb::ObservedTask,
    fit: LossCurve,
    cap: u64,
    prior: Option<&LossLibrary>,
) -> (loss_prior::LossPrediction, String) {
    let shipped;
    let prior = match prior {
        Some(p) => p,
        None => {
            shipped = LossLibrary::shipped();
            &shipped
        }
    };
    let p = loss_prior::predict_with_fit(prior, &t.trace_iterations, &t.trace_losses, fit, cap);
    let note = format!(
        "loss prior of {} finished {} jobs: {} iterations (p10-p90 {}-{}), own fit alone {}",
        prior.jobs(),
        job.spec.model,
        p.iterations,
        p.low,
        p.high,
        p.fit_iterations
    );
    (p, note)
}

/// The spread the plan weighs for a loss-prior prediction after `done`
/// iterations: its p10–p90 width over the iterations left once the prior
/// holds finished jobs of the model (their shapes cover the truth's p10–p90
/// 88 % of the time on `estimator-accuracy`'s synthetic curves), 0 while it
/// holds only the shipped shapes. Those say nothing of the model: a
/// 10-point profile then spans 2–5× (39 to 201 iterations, say), and
/// Ymir's risk rule (`(TranWt − 1)·max(0, 1 − κ·s/2)`) would take every
/// merge from a model's first jobs for that ignorance.
fn weighed_spread(p: &loss_prior::LossPrediction, prior: Option<&LossLibrary>, done: u64) -> f64 {
    if prior.is_some_and(|l| l.jobs() > 0) {
        p.remaining_spread(done)
    } else {
        0.0
    }
}

/// Refits a running job's loss curve (Eq. 3) on the trace its process
/// reported; `Some((fit, cap))` when its own fit moved by more than 5 % in
/// Eq. 2's terms since the stored one (the profile saw 50 steps, the
/// running job sees many more): then [`refreshed_estimate`] predicts its
/// iterations to converge again with the loss prior. A trace too short or
/// too noisy to fit leaves the estimate alone.
fn loss_refit(
    job: &JobRecord,
    t: &pb::ObservedTask,
    old: Option<&Estimate>,
) -> Option<(LossCurve, u64)> {
    const MIN_POINTS: usize = 20;
    const MIN_QUALITY: f64 = 0.5;
    if t.trace_losses.len() < MIN_POINTS {
        return None;
    }
    // A metric target's evaluations, once there are any, say when it
    // stops ([`learn_metric_targets`]), not the loss plateau.
    if job.spec.target.metric.is_some() && old.is_some_and(|e| !e.evals.is_empty()) {
        return None;
    }
    let c = fit_loss_curve(&t.trace_iterations, &t.trace_losses).ok()?;
    if c.quality < MIN_QUALITY {
        return None;
    }
    let cap = iteration_budget(job).unwrap_or(DEFAULT_ITERATIONS * 100);
    let converge = |c: &LossCurve| iterations_to_converge(c, 0.0, PLATEAU_THRESHOLD, cap);
    let own = converge(&c);
    let stored = old
        .and_then(|e| e.curve.as_ref())
        .and_then(curve_from_json)
        .map(|s| converge(&s));
    if stored.is_some_and(|b| (own as f64 - b as f64).abs() <= 0.05 * b as f64) {
        return None;
    }
    Some((c, cap))
}

/// A running job's estimate after [`loss_refit`]: the loss prior's
/// iterations and spread ([`predict_loss`]), its new own fit stored.
fn refreshed_estimate(
    job: &JobRecord,
    t: &pb::ObservedTask,
    old: Option<&Estimate>,
    (c, cap): (LossCurve, u64),
    prior: &LossLibrary,
) -> Estimate {
    let (p, prior_note) = predict_loss(job, t, c, cap, Some(prior));
    let before = old.and_then(|e| e.iterations);
    let mut e = old.cloned().unwrap_or_default();
    let last = t.trace_iterations.last().copied().unwrap_or(0.0);
    e.iterations = Some(p.iterations);
    e.spread = weighed_spread(&p, Some(prior), last.max(0.0) as u64);
    e.curve = Some(curve_to_json(&c));
    e.note = format!(
        "refit on {} loss points of the running process (to iteration {last:.0}), quality {:.3}; {prior_note}",
        t.trace_losses.len(),
        c.quality
    );
    tracing::info!(job_id = %job.id, iterations = p.iterations, own_fit = p.fit_iterations, before = ?before, quality = c.quality, "estimate refreshed from the running process");
    e
}

fn curve_to_json(c: &LossCurve) -> serde_json::Value {
    serde_json::json!({
        "beta0": c.beta0, "beta1": c.beta1, "beta2": c.beta2, "beta3": c.beta3, "quality": c.quality
    })
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

/// A profiling run's measured step time as a sample for the estimator's
/// table: one replica (1 GPU; a pipeline's 4 stages at the job's global
/// batch; an expert-parallel group's GPUs sharing it) in the job's own
/// variant (precision, checkpointing, PETL, frozen layers, expert group).
fn profile_step_time_sample(
    job: &JobRecord,
    gpu_model: &str,
    step_time_s: f64,
) -> pb::StepTimeSample {
    let r = &job.spec.resources;
    let gpus = r.replica().gpus().max(1);
    let global = job.spec.hyperparameters.global_batch_size;
    pb::StepTimeSample {
        key: Some(pb::ThroughputKey {
            model: job.spec.model.clone(),
            gpu_type: analytic::gpu_family(gpu_model),
            placement: gpus.to_string(),
            local_batch_size: if r.pipeline_parallel {
                global
            } else {
                global.div_ceil(gpus)
            },
            gradient_accumulation: 1,
            ..variant_key(&Variant::of_spec(&job.spec))
        }),
        step_time_seconds: step_time_s,
        sync_time_seconds: 0.0,
    }
}

/// ICEFROG's layer tuner (Eq. 2, 15) for a layer-elastic job running alone
/// in its process, from the per-layer gradient variance its trainer
/// reported: `ℓ* = argmax ψ(ℓ)·T(a, s, m, ℓ)` over its frozen layers'
/// range (`frozen_layers` .. `layer_elasticity.max_frozen_layers`), `T` on
/// this node's part of its allocation in the throughput table. Run every
/// round, so at every reallocation and every epoch's new variance.
fn tune_layers(
    lut: &Lut,
    job: &JobRecord,
    r: &pb::JobReport,
    family: &str,
    t: &pb::ObservedTask,
) -> Option<u32> {
    let e = job.spec.layer_elasticity?;
    if r.layer_variance.is_empty() {
        return None;
    }
    let model = &job.spec.model;
    let batch = job.spec.hyperparameters.global_batch_size.max(1);
    let layers = analytic::layers_of(model).unwrap_or(r.layer_variance.len() as u32);
    let placement = (t.gpu_uuids.len().clamp(1, 9)).to_string();
    let base = Variant::of_spec(&job.spec);
    let from = job.spec.frozen_count().min(e.max_frozen_layers);
    fmsched_estimator::icefrog::tune_frozen_layers(
        &r.layer_variance,
        from..=e.max_frozen_layers,
        |l| {
            let v = Variant {
                frozen_layers: l,
                ..base.clone()
            };
            lut.iteration_time_on(model, family, &placement, batch, &v, layers)
                .ok()
                .filter(|it| it.feasible)
                // Eq. 4 without sharing (λ = 1, the Eq. 8 fix).
                .map(|it| {
                    fmsched_estimator::icefrog::layer_aware_throughput(
                        f64::from(batch),
                        it.seconds,
                        1.0,
                    )
                })
        },
    )
    .map(|(l, _)| l)
}

/// A throughput key naming only a variant (the rest left default).
fn variant_key(v: &Variant) -> pb::ThroughputKey {
    pb::ThroughputKey {
        amp: v.amp,
        frozen_layers: v.frozen_layers,
        gradient_checkpointing: v.gradient_checkpointing,
        petl: v.petl.clone(),
        pipeline_parallel: v.pipeline,
        expert_parallel: v.expert_parallel,
        ..Default::default()
    }
}

/// A running data-parallel job's measured step time as a sample for the
/// estimator's table: the job's model and global batch on `gpus` GPUs of
/// one node of `gpu_model` in the job's variant, under the local
/// batch and gradient accumulation the table itself picks for that batch
/// (so the sample lands on the key the table is asked for).
fn running_step_time_sample(
    lut: &Lut,
    job: &JobRecord,
    gpu_model: &str,
    placement: &str,
    frozen_layers: u32,
    step_time_s: f64,
) -> pb::StepTimeSample {
    let gpu_type = analytic::gpu_family(gpu_model);
    let gpus: u32 = placement
        .bytes()
        .map(|b| u32::from(b - b'0'))
        .sum::<u32>()
        .max(1);
    let placement = placement.to_string();
    let global = job.spec.hyperparameters.global_batch_size.max(1);
    let variant = Variant {
        frozen_layers,
        ..Variant::of_spec(&job.spec)
    };
    let layers = analytic::layers_of(&job.spec.model).unwrap_or(12);
    let (local, accum) = lut
        .iteration_time_on(
            &job.spec.model,
            &gpu_type,
            &placement,
            global,
            &variant,
            layers,
        )
        .map_or((global.div_ceil(gpus), 1), |it| {
            (it.local_bsz, it.grad_accum)
        });
    pb::StepTimeSample {
        key: Some(pb::ThroughputKey {
            model: job.spec.model.clone(),
            gpu_type,
            placement,
            local_batch_size: local,
            gradient_accumulation: accum,
            ..variant_key(&variant)
        }),
        step_time_seconds: step_time_s,
        sync_time_seconds: 0.0,
    }
}

/// Jobs of training processes that finish before a switch `lead_s`
/// seconds away, for a look-ahead round: those that reported their output
/// (with it) or ended, and those whose remaining iterations at their
/// reported step time take less than `lead_s` (Ymir §6.2: the next job
/// prepares while they finish).
pub(crate) fn finishing<'a>(
    observed: impl IntoIterator<Item = &'a pb::ObservedTask>,
    live: &BTreeMap<JobId, JobRecord>,
    estimates: &BTreeMap<JobId, Estimate>,
    lead_s: f64,
) -> Vec<(JobId, Option<String>)> {
    let mut out = Vec::new();
    for t in observed {
        if t.task_id.ends_with(PROFILE_SUFFIX) {
            continue;
        }
        let Some(members) = members_of(&t.task_id) else {
            continue;
        };
        let ended = t.phase == pb::TaskPhase::Succeeded as i32;
        for id in members {
            let Some(j) = live.get(&id) else { continue };
            let key = id.to_string();
            if let Some(o) = t.outputs.get(&key) {
                out.push((id, Some(o.clone())));
                continue;
            }
            let done = t
                .jobs
                .iter()
                .find(|r| r.job_id == key)
                .map_or(t.iteration, |r| r.iteration);
            // When it will really end: on the estimate, whatever the
            // policy plans on.
            let total = super::expected_iterations(j, estimates.get(&id), true);
            // A job past its estimated iterations (a metric target the
            // estimate undershot) is not predicted to finish.
            let soon = t.step_time_s > 0.0
                && total > done
                && (total - done) as f64 * t.step_time_s <= lead_s;
            if ended || soon {
                out.push((id, None));
            }
        }
    }
    out
}

/// What the merge guard decides about one merge.
#[derive(Debug, PartialEq)]
pub(crate) enum GuardVerdict {
    /// Not two epochs of every watched job yet.
    Wait,
    /// Every watched job's accuracy improved from its first to its second
    /// epoch: the guard checks no more.
    Keep,
    /// A watched job's accuracy did not improve: why.
    Split(String),
}

/// One job the merge guard watches: its evaluation values so far, oldest
/// first, and the sense of its metric (`target.metric.lower_is_better`: a
/// loss or perplexity improves downwards; without a metric target the
/// trainer reports accuracy, which improves upwards).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Watched<'a> {
    pub job: JobId,
    pub evals: Option<&'a [f64]>,
    pub lower_is_better: bool,
}

/// The merge guard (Ymir §4.3) on the evaluation values reported so far of
/// each watched job still running: B for a temporal merge (its metric with
/// A's weights, evaluated while A trains), both jobs for a spatial one. One
/// job that does not improve, in its metric's sense, splits the merge at
/// once.
pub(crate) fn guard_verdict(mode: MergeMode, watched: &[Watched<'_>]) -> GuardVerdict {
    let mut waiting = watched.is_empty();
    for w in watched {
        let job = w.job;
        match w.evals {
            Some(&[first, second, ..])
                if !fmsched_core::job::metric_improved(first, second, w.lower_is_better) =>
            {
                let whose = if mode == MergeMode::Temporal {
                    format!("job {job}'s (evaluated with A's weights)")
                } else {
                    format!("job {job}'s")
                };
                let sense = if w.lower_is_better {
                    "metric (lower is better)"
                } else {
                    "metric"
                };
                return GuardVerdict::Split(format!(
                    "{whose} {sense} did not improve in its first two epochs ({first:.4} → {second:.4})"
                ));
            }
            Some([_, _, ..]) => {}
            _ => waiting = true,
        }
    }
    if waiting {
        GuardVerdict::Wait
    } else {
        GuardVerdict::Keep
    }
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

/// The Task2Vec embedding of a profiled job, when it has a usable one.
pub(crate) fn embedding(e: &Estimate) -> Option<TaskEmbedding> {
    (!e.fisher.is_empty() && e.fisher.len() == e.fisher_repeat.len()).then(|| TaskEmbedding {
        fisher: e.fisher.clone(),
        fisher_repeat: e.fisher_repeat.clone(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn job(n: u8) -> JobId {
        format!("01a20000-0000-7000-8000-0000000000{n:02}")
            .parse()
            .unwrap()
    }

    fn record(n: u8, max_iterations: Option<u64>) -> JobRecord {
        let spec = serde_json::json!({
            "model": "roberta-base",
            "dataset": { "uri": "file:///d", "task": "rte" },
            "hyperparameters": { "global_batch_size": 32, "learning_rate": 2e-5 },
            "target": { "max_iterations": max_iterations, "max_epochs": 3 },
            "resources": { "min_gpus": 1, "max_gpus": 1 },
            "launch": { "command": ["train"] }
        });
        JobRecord {
            id: job(n),
            owner: fmsched_core::UserName("u".into()),
            spec: serde_json::from_value(spec).unwrap(),
            idempotency_key: None,
            state: JobState::Running,
            state_reason: String::new(),
            output_path: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            last_event_seq: 0,
        }
    }

    /// Ten finished roberta-base jobs whose loss curves share a shape (a
    /// floor at 40 % of the start), and a new job of the model whose
    /// profile saw the first half of the iterations it needs: the loss
    /// prior predicts them within 15 %, where the job's own fit alone is
    /// further off; the stored curve is the job's own fit (what it leaves
    /// for the jobs after it). A running job's refit is only redone when
    /// its own fit moved.
    #[test]
    fn estimate_prior_loss_a_profile_is_predicted_with_the_models_finished_jobs() {
        use fmsched_estimator::loss_prior::LossShape;
        let shape = |i: u32| LossShape {
            floor: 0.38 + 0.004 * f64::from(i),
            quad: 0.15 + 0.01 * f64::from(i),
        };
        let mut lib = LossLibrary::shipped();
        for i in 0..10 {
            assert!(lib.push(&shape(i).curve(1.0 + 0.2 * f64::from(i), 30.0 + 9.0 * f64::from(i))));
        }
        let truth = shape(5).curve(2.3, 70.0);
        let k = iterations_to_converge(&truth, 0.0, PLATEAU_THRESHOLD, 100_000) as f64;
        let (its, losses): (Vec<f64>, Vec<f64>) = (0..=(k as u32 / 2))
            .map(|i| {
                let x = f64::from(i);
                (x, truth.eval(x) * (1.0 + 0.04 * (7.3 * x).sin()))
            })
            .unzip();
        let t = pb::ObservedTask {
            task_id: format!("{}-profile", job(1)),
            phase: pb::TaskPhase::Succeeded as i32,
            trace_iterations: its,
            trace_losses: losses,
            ..Default::default()
        };
        let j = record(1, Some(100_000));
        let (est, reason) = profile_estimate(&j, &t, Some(&lib)).unwrap();
        let predicted = est.iterations.unwrap() as f64;
        let own = fit_loss_curve(&t.trace_iterations, &t.trace_losses).unwrap();
        let own_k = iterations_to_converge(&own, 0.0, PLATEAU_THRESHOLD, 100_000) as f64;
        assert!(
            (predicted - k).abs() / k < 0.15,
            "{predicted} vs {k}: {reason}"
        );
        assert!(
            (predicted - k).abs() < (own_k - k).abs(),
            "prior {predicted}, own fit {own_k}, truth {k}"
        );
        assert!(
            est.note
                .contains("loss prior of 10 finished roberta-base jobs"),
            "{}",
            est.note
        );
        assert_eq!(est.curve, Some(curve_to_json(&own)));
        // It trains to its max_iterations: the history says so, and what
        // the curve predicts; without them it says the prediction.
        assert!(
            reason.starts_with("profiled: trains its budget of 100000 iterations (its loss curve flattens after about"),
            "{reason}"
        );
        let (_, open) = profile_estimate(&record(1, None), &t, Some(&lib)).unwrap();
        assert!(
            open.starts_with(&format!(
                "profiled: about {} iterations to converge (Eq. 2",
                est.iterations.unwrap()
            )),
            "{open}"
        );
        // The plan weighs its p10–p90 width over the iterations left; with
        // the shipped shapes alone (no finished job) there is nothing to
        // weigh.
        assert!(est.spread > 0.0 && est.spread < 0.5, "{}", est.spread);
        let (alone, _) = profile_estimate(&j, &t, Some(&LossLibrary::shipped())).unwrap();
        assert_eq!(alone.spread, 0.0);
        // The running process reports the same trace: its own fit did not
        // move, so nothing is re-estimated.
        let running = pb::ObservedTask {
            task_id: job(1).to_string(),
            phase: pb::TaskPhase::Running as i32,
            ..t.clone()
        };
        assert!(loss_refit(&j, &running, Some(&est)).is_none());
        // Stored with a very different fit, it is re-estimated with the prior.
        let mut stale = est.clone();
        stale.curve = Some(curve_to_json(&LossCurve::new(0.0, 1.0, 1.0, 0.0)));
        let refit = loss_refit(&j, &running, Some(&stale)).unwrap();
        let e = refreshed_estimate(&j, &running, Some(&stale), refit, &lib);
        assert_eq!(e.iterations, est.iterations);
        assert!(e.note.starts_with("refit on"), "{}", e.note);
    }

    /// A profiling run's step time is filed at the replica it ran on, in
    /// the job's variant: 1 GPU at the global batch; a pipeline's 4 stages
    /// at the global batch; an expert group of 4 GPUs sharing the batch,
    /// keyed by its group size (a table of another group size would read
    /// it wrong).
    #[test]
    fn a_profiling_sample_is_keyed_by_the_replica_it_ran_on() {
        let mut plain = record(1, None);
        plain.spec.model = "switch-base-8".into();
        let key = |j: &JobRecord| profile_step_time_sample(j, "A100", 0.5).key.unwrap();
        let k = key(&plain);
        assert_eq!(
            (k.placement.as_str(), k.local_batch_size, k.expert_parallel),
            ("1", 32, 0)
        );
        let mut moe = plain.clone();
        moe.spec.resources.expert_parallel = 4;
        moe.spec.resources.max_gpus = 4;
        let k = key(&moe);
        assert_eq!(
            (k.placement.as_str(), k.local_batch_size, k.expert_parallel),
            ("4", 8, 4)
        );
        let mut pipe = record(2, None);
        pipe.spec.resources.pipeline_parallel = true;
        let k = key(&pipe);
        assert_eq!(
            (
                k.placement.as_str(),
                k.local_batch_size,
                k.pipeline_parallel
            ),
            ("4", 32, true)
        );
    }

    /// A curve shape of finished and running jobs: `level` at the start,
    /// saturating 0.3 above it.
    fn shape(level: f64, e: usize) -> f64 {
        level + 0.3 * (1.0 - (-0.4 * e as f64).exp())
    }

    /// A job with a budget of 10 epochs of 100 iterations whose accuracy
    /// target is `shape(0.6, 6)`.
    fn metric_job() -> JobRecord {
        let mut job = record(1, None);
        job.spec.target.max_epochs = Some(10);
        job.spec.dataset.num_samples = Some(3200); // 100 iterations per epoch
        job.spec.target.metric = Some(fmsched_core::MetricTarget {
            name: "eval_accuracy".into(),
            value: shape(0.6, 6),
            lower_is_better: false,
        });
        job
    }

    /// A job with a metric target: its evaluations so far and the curves of
    /// finished jobs give its iterations (epochs × iterations per epoch,
    /// within its budget) and a note with the spread; curves of another
    /// model or metric are no prior; without `dataset.num_samples` no
    /// iterations are estimated.
    #[test]
    fn estimate_prior_metric_target_sets_the_iterations_from_its_curve() {
        let mut job = metric_job();
        // Finished jobs of the same shape, each with the target of its
        // epoch 6 (another model's or metric's met theirs at epoch 2).
        let finished = |model: &str, metric: &str, level: f64| MetricCurve {
            model: model.into(),
            metric: metric.into(),
            lower_is_better: false,
            target: shape(level, if level > 0.5 { 6 } else { 2 }),
            evals: (1..=10).map(|e| shape(level, e)).collect(),
            transferred: false,
        };
        let prior = vec![
            finished("roberta-base", "eval_accuracy", 0.55),
            finished("roberta-base", "eval_accuracy", 0.6),
            finished("roberta-base", "eval_accuracy", 0.62),
            finished("vit-base", "eval_accuracy", 0.1),
            finished("roberta-base", "eval_f1", 0.1),
        ];
        // The job follows the same shape from 0.6: its target is epoch 6's.
        let mut e = Estimate {
            evals: (1..=3).map(|e| shape(0.6, e)).collect(),
            ..Default::default()
        };
        predict_metric_target(&job, Start::Alone, &prior, &CurveLibrary::shipped(), &mut e);
        assert_eq!(e.iterations, Some(600), "{}", e.note);
        assert!(e.note.contains("p10-p90"), "{}", e.note);
        assert!(e.note.contains("prior of 3 finished"), "{}", e.note);
        assert!(e.note.contains("met their targets"), "{}", e.note);
        // Its spread, what the plan weighs (p90 − p10 over the epochs left).
        assert!((0.0..=4.0).contains(&e.spread), "{}", e.spread);
        // The budget caps it.
        job.spec.target.max_iterations = Some(450);
        predict_metric_target(&job, Start::Alone, &prior, &CurveLibrary::shipped(), &mut e);
        assert_eq!(e.iterations, Some(450));
        // No samples per epoch: the curve is kept, no iterations.
        job.spec.dataset.num_samples = None;
        let mut e = Estimate {
            evals: vec![0.6, 0.7],
            ..Default::default()
        };
        predict_metric_target(&job, Start::Alone, &prior, &CurveLibrary::shipped(), &mut e);
        assert_eq!(e.iterations, None);
        assert!(e.note.contains("no dataset.num_samples"), "{}", e.note);
    }

    /// A job that trained from another task's weights or beside another
    /// task is judged by finished jobs that did too: with only jobs alone
    /// finished, the same evaluations read the curves' shapes; once a
    /// transferred job like it finished, its target's epoch.
    #[test]
    fn estimate_prior_a_transferred_job_reads_finished_transferred_jobs() {
        let job = metric_job();
        let finished = |level: f64, transferred: bool| MetricCurve {
            model: "roberta-base".into(),
            metric: "eval_accuracy".into(),
            lower_is_better: false,
            target: shape(level, 6),
            evals: (1..=10).map(|e| shape(level, e)).collect(),
            transferred,
        };
        let alone = vec![
            finished(0.55, false),
            finished(0.6, false),
            finished(0.62, false),
        ];
        let evals: Vec<f64> = (1..=3).map(|e| shape(0.6, e)).collect();
        let predict = |start: Start, prior: &[MetricCurve]| {
            let mut e = Estimate {
                evals: evals.clone(),
                ..Default::default()
            };
            predict_metric_target(&job, start, prior, &CurveLibrary::shipped(), &mut e);
            e
        };
        let e = predict(Start::Alone, &alone);
        assert!(
            e.note.contains("when starts like this one met"),
            "{}",
            e.note
        );
        assert_eq!(e.iterations, Some(600), "{}", e.note);
        let e = predict(Start::Transferred, &alone);
        assert!(e.note.contains("their curves' shapes"), "{}", e.note);
        let mut both = alone.clone();
        both.extend([finished(0.57, true), finished(0.61, true)]);
        let e = predict(Start::Transferred, &both);
        assert!(
            e.note.contains("when transferred starts like this one met"),
            "{}",
            e.note
        );
        assert_eq!(e.iterations, Some(600), "{}", e.note);
    }

    /// A job over several nodes is measured at its plan's GPUs per node,
    /// in rank order; a plan that no longer gives it its world, a single
    /// node or a node share past 9 GPUs names no shape.
    #[test]
    fn a_gang_step_time_is_recorded_at_its_placement_over_nodes() {
        let at = |node: &str, gpus: usize, rank_offset: u32| Assignment {
            job: job(1),
            node: fmsched_core::NodeId::try_from(node.to_string()).unwrap(),
            gpus: (0..gpus)
                .map(|g| fmsched_core::GpuUuid(format!("{node}-{g}")))
                .collect(),
            profile: false,
            rank_offset,
            master_port: None,
        };
        let plan = vec![at("b", 2, 4), at("a", 4, 0)];
        assert_eq!(gang_placement(&plan, job(1), 6).as_deref(), Some("42"));
        assert_eq!(gang_placement(&plan, job(1), 8), None, "the plan moved on");
        assert_eq!(gang_placement(&plan, job(2), 6), None);
        assert_eq!(gang_placement(&plan[..1], job(1), 2), None, "one node");
        assert_eq!(
            gang_placement(&[at("a", 12, 0), at("b", 4, 12)], job(1), 16),
            None
        );
        let lut = analytic::default_lut().unwrap();
        let mut j = record(1, None);
        j.spec.hyperparameters.global_batch_size = 48;
        let s = running_step_time_sample(&lut, &j, "A100-SXM4-80GB", "42", 0, 0.5);
        let key = s.key.unwrap();
        assert_eq!(key.placement, "42");
        assert_eq!(key.local_batch_size * key.gradient_accumulation * 6, 48);
        assert_eq!(s.step_time_seconds, 0.5);
    }

    fn running(n: u8, iteration: u64, step_time_s: f64) -> pb::ObservedTask {
        pb::ObservedTask {
            task_id: job(n).to_string(),
            phase: pb::TaskPhase::Running as i32,
            iteration,
            step_time_s,
            ..Default::default()
        }
    }

    /// The look-ahead's prediction of what finishes before the switch:
    /// reported outputs, and jobs whose remaining iterations at their step
    /// time fit the lead — but not jobs already past their estimate.
    #[test]
    fn a_look_ahead_predicts_finishes_from_reports_and_step_times() {
        let live: BTreeMap<JobId, JobRecord> = [
            record(1, Some(1000)),
            record(2, Some(1000)),
            record(3, None),
            record(4, Some(1000)),
        ]
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
        // Job 3 names no iteration budget: its estimate says 500.
        let estimates: BTreeMap<JobId, Estimate> = [(
            job(3),
            Estimate {
                iterations: Some(500),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect();
        let mut done = running(4, 1000, 0.1);
        done.outputs
            .insert(job(4).to_string(), "/out/4/weights.json".into());
        let observed = [
            running(1, 990, 0.5), // 10 iterations × 0.5 s = 5 s ≤ 30 s
            running(2, 100, 0.5), // 450 s: not before the switch
            running(3, 600, 0.5), // past its estimated 500: unknown
            done,
        ];
        let mut got = finishing(&observed, &live, &estimates, 30.0);
        got.sort();
        assert_eq!(
            got,
            vec![(job(1), None), (job(4), Some("/out/4/weights.json".into()))]
        );
        // Without step times only reported outputs count.
        let slow = [running(1, 990, 0.0)];
        assert!(finishing(&slow, &live, &estimates, 30.0).is_empty());
    }

    /// A watched job whose metric improves upwards.
    fn w(job: JobId, evals: Option<&[f64]>) -> Watched<'_> {
        Watched {
            job,
            evals,
            lower_is_better: false,
        }
    }

    /// A loss target (`lower_is_better`) improves downwards: a falling
    /// loss keeps the merge, a rising or flat one splits it — the opposite
    /// of an accuracy with the same numbers.
    #[test]
    fn the_guard_reads_a_loss_target_downwards() {
        let (a, b) = (job(1), job(2));
        let falling = [0.9, 0.7];
        let rising = [0.7, 0.9];
        let loss = |job, evals| Watched {
            job,
            evals: Some(evals),
            lower_is_better: true,
        };
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[loss(b, &falling)]),
            GuardVerdict::Keep
        );
        assert!(matches!(
            guard_verdict(MergeMode::Temporal, &[w(b, Some(&falling))]),
            GuardVerdict::Split(_)
        ));
        let GuardVerdict::Split(why) =
            guard_verdict(MergeMode::Spatial, &[loss(a, &falling), loss(b, &rising)])
        else {
            panic!("a rising loss must split the pair")
        };
        assert!(
            why.contains(&b.to_string()) && why.contains("lower is better"),
            "{why}"
        );
        assert_eq!(
            guard_verdict(
                MergeMode::Spatial,
                &[loss(a, &falling), w(b, Some(&rising))]
            ),
            GuardVerdict::Keep
        );
    }

    #[test]
    fn the_guard_waits_for_two_epochs_of_every_watched_job() {
        let (a, b) = (job(1), job(2));
        let one = [0.6];
        let two = [0.6, 0.7];
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[w(b, None)]),
            GuardVerdict::Wait
        );
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[w(b, Some(&one))]),
            GuardVerdict::Wait
        );
        // Spatial: one job improving is not enough while the other is unknown.
        assert_eq!(
            guard_verdict(MergeMode::Spatial, &[w(a, Some(&two)), w(b, Some(&one))]),
            GuardVerdict::Wait
        );
        assert_eq!(
            guard_verdict(MergeMode::Spatial, &[w(a, Some(&two)), w(b, Some(&two))]),
            GuardVerdict::Keep
        );
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[w(b, Some(&two))]),
            GuardVerdict::Keep
        );
    }

    #[test]
    fn one_task_without_gain_splits_the_merge_naming_it() {
        let (a, b) = (job(1), job(2));
        let flat = [0.5, 0.5];
        let worse = [0.62, 0.58];
        let better = [0.5, 0.7];
        // Spatial: either task stalling splits (even before the other has
        // two epochs), and the reason names the task.
        let GuardVerdict::Split(why) = guard_verdict(
            MergeMode::Spatial,
            &[w(a, Some(&better)), w(b, Some(&flat))],
        ) else {
            panic!("a stalled task must split the pair")
        };
        assert!(
            why.contains(&b.to_string()) && why.contains("0.5000 → 0.5000"),
            "{why}"
        );
        assert!(matches!(
            guard_verdict(MergeMode::Spatial, &[w(a, Some(&worse)), w(b, None)]),
            GuardVerdict::Split(_)
        ));
        // Temporal: B's accuracy with A's weights.
        let GuardVerdict::Split(why) = guard_verdict(MergeMode::Temporal, &[w(b, Some(&worse))])
        else {
            panic!("no gain for B must split A ↦ B")
        };
        assert!(why.contains("evaluated with A's weights"), "{why}");
    }

    /// A spatial pair's gain is measured at the guard's verdict from each
    /// job's loss against its own curve, once.
    #[test]
    fn a_spatial_verdict_measures_the_pairs_gain_once() {
        let curve = LossCurve {
            beta0: 0.2,
            beta1: 1.0,
            beta2: 0.01,
            beta3: 0.0,
            quality: 1.0,
        };
        let emb = |x: f64| Estimate {
            curve: Some(curve_to_json(&curve)),
            fisher: vec![1.0, x, 0.5],
            fisher_repeat: vec![1.0, x, 0.52],
            ..Default::default()
        };
        let m = MergeRecord {
            id: 7,
            a: job(1),
            b: job(2),
            mode: MergeMode::Spatial,
            gain_ab: 0.1,
            gain_ba: 0.1,
            active: true,
            guard_passed: false,
            observed_gain: None,
        };
        let estimates: BTreeMap<JobId, Estimate> = [(job(1), emb(2.0)), (job(2), emb(1.5))]
            .into_iter()
            .collect();
        // Both at iteration 100 with losses 1.2× and 1.1× below their curves.
        let l = curve.eval(100.0);
        let losses: BTreeMap<JobId, (u64, f64)> =
            [(job(1), (100, l / 1.2)), (job(2), (100, l / 1.1))]
                .into_iter()
                .collect();
        let g = spatial_gain(&estimates, &losses, &m).unwrap();
        assert!((g - 0.15).abs() < 1e-9, "{g}");
        let mut o = empty_observed();
        o.estimates = estimates;
        record_outcome(&mut o, &m, g);
        record_outcome(&mut o, &m, g);
        assert_eq!(o.outcomes.len(), 1, "once per merge");
        assert_eq!(o.writes.observed_gains, vec![(7, g)]);
        let measured = MergeRecord {
            observed_gain: Some(0.1),
            ..m
        };
        let mut o2 = empty_observed();
        o2.estimates = o.estimates.clone();
        record_outcome(&mut o2, &measured, g);
        assert!(
            o2.outcomes.is_empty(),
            "a merge measured before is not sent again"
        );
    }

    /// A job restarted from its initial weights at plan 7: a report of its
    /// process from plan 6 is the dropped run and does not count; one from
    /// plan 7 on counts, and shows the fresh process once (pending); a job
    /// never restarted, or a profiling run, counts as always.
    #[test]
    fn tail_reports_of_a_dropped_run_do_not_count() {
        let fresh: BTreeMap<JobId, FreshStart> = [
            (
                job(1),
                FreshStart {
                    generation: 7,
                    pending: true,
                },
            ),
            (
                job(2),
                FreshStart {
                    generation: 3,
                    pending: false,
                },
            ),
        ]
        .into_iter()
        .collect();
        let report = |task: String, generation: i64| pb::ObservedTask {
            task_id: task,
            generation,
            ..Default::default()
        };
        assert_eq!(fresh_run(&fresh, &report(job(1).to_string(), 6)), None);
        assert_eq!(
            fresh_run(&fresh, &report(job(1).to_string(), 7)),
            Some(vec![job(1)])
        );
        assert_eq!(
            fresh_run(&fresh, &report(job(1).to_string(), 9)),
            Some(vec![job(1)])
        );
        assert_eq!(
            fresh_run(&fresh, &report(job(2).to_string(), 5)),
            Some(vec![])
        );
        assert_eq!(fresh_run(&fresh, &report(job(2).to_string(), 2)), None);
        assert_eq!(
            fresh_run(&fresh, &report(job(3).to_string(), 0)),
            Some(vec![])
        );
        let profile = format!("{}{PROFILE_SUFFIX}", job(1));
        assert_eq!(fresh_run(&fresh, &report(profile, 0)), Some(vec![]));
    }

    /// A gang part that failed counts against its job only as a part of
    /// the run in force: the same node, GPUs and ranks as the plan's. A
    /// part of a run the plan replaced (moved off the node, or onto other
    /// GPUs or ranks there) exits non-zero once its rank 0 went away; that
    /// is not the job failing.
    #[test]
    fn a_failed_gang_part_counts_only_as_a_part_of_the_run_in_force() {
        let node = |n: &str| fmsched_core::NodeId::try_from(n.to_string()).unwrap();
        let part = |n: &str, gpus: &[&str], rank_offset: u32| crate::persistence::Assignment {
            job: job(1),
            node: node(n),
            gpus: gpus
                .iter()
                .map(|g| fmsched_core::GpuUuid((*g).into()))
                .collect(),
            profile: false,
            rank_offset,
            master_port: Some(29_600),
        };
        let plan = vec![
            part("a", &["a-G0", "a-G1"], 0),
            part("b", &["b-G0", "b-G1"], 2),
        ];
        let failed = |gpus: &[&str], rank_offset: u32| pb::ObservedTask {
            task_id: job(1).to_string(),
            phase: pb::TaskPhase::Failed as i32,
            gpu_uuids: gpus.iter().map(|g| (*g).to_string()).collect(),
            rank_offset,
            ..Default::default()
        };
        let t = failed(&["b-G0", "b-G1"], 2);
        assert!(part_in_force(&plan, job(1), &node("b"), &t));
        assert!(
            !part_in_force(&plan, job(2), &node("b"), &t),
            "another job's"
        );
        assert!(
            !part_in_force(&plan, job(1), &node("c"), &t),
            "moved off node c"
        );
        let other_gpus = failed(&["b-G2", "b-G3"], 2);
        assert!(!part_in_force(&plan, job(1), &node("b"), &other_gpus));
        let other_ranks = failed(&["b-G0", "b-G1"], 4);
        assert!(!part_in_force(&plan, job(1), &node("b"), &other_ranks));
    }

    /// The utilisation regression learns from processes that run alone:
    /// a one-GPU job alone on its GPU adds its own NVML reading (its GPU's
    /// when the driver gives none) each round and the changed fit is
    /// written; a shared GPU, a profiling run and a process not yet
    /// stepping teach nothing. After three rounds the model's footprint
    /// predicts what was measured.
    #[test]
    fn utilization_is_learned_from_processes_running_alone() {
        let at = |n: u8, gpu: &str, profile: bool| crate::persistence::Assignment {
            job: job(n),
            node: fmsched_core::NodeId::try_from("a".to_string()).unwrap(),
            gpus: vec![fmsched_core::GpuUuid(gpu.into())],
            profile,
            rank_offset: 0,
            master_port: None,
        };
        let mut o = Observed {
            live: (1..=4).map(|n| (job(n), record(n, Some(1000)))).collect(),
            ..Default::default()
        };
        o.current.assignments = vec![
            at(1, "a-G0", false),
            at(2, "a-G1", false),
            at(3, "a-G1", false),
            at(4, "a-G2", true),
        ];
        let mut node = crate::scheduling::inputs::tests::node("a", 4);
        let telemetry = |uuid: &str, util: u32, procs: &[(u32, u32)]| pb::GpuTelemetry {
            uuid: uuid.into(),
            utilization_percent: util,
            processes: procs
                .iter()
                .map(|&(pid, u)| pb::GpuProcess {
                    pid,
                    utilization_percent: u,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        // Job 1's process reports no utilisation of its own: its GPU's 40 %.
        for t in [
            telemetry("a-G0", 40, &[(7, 0)]),
            telemetry("a-G1", 95, &[(8, 50), (9, 45)]),
            telemetry("a-G2", 30, &[]),
            telemetry("a-G3", 35, &[(11, 35)]),
        ] {
            node.telemetry.insert(t.uuid.clone(), t);
        }
        let on = |n: u8, gpu: &str, pid: u32, step: f64| pb::ObservedTask {
            gpu_uuids: vec![gpu.into()],
            pid,
            ..running(n, 10, step)
        };
        node.observed_tasks = vec![
            on(1, "a-G0", 7, 0.5),
            on(2, "a-G1", 8, 0.5),
            on(3, "a-G1", 9, 0.5),
            pb::ObservedTask {
                task_id: format!("{}{PROFILE_SUFFIX}", job(4)),
                ..on(4, "a-G2", 10, 0.5)
            },
            // Not planned there (a stale process) and not stepping yet.
            on(4, "a-G3", 11, 0.0),
        ];
        let key = ("roberta-base".to_string(), "A100".to_string());
        for round in 1..=3u64 {
            learn_utilization(&mut o, std::slice::from_ref(&node));
            assert_eq!(o.utilization_fits[&key].samples, round);
            assert_eq!(o.utilization_fits.len(), 1);
            assert_eq!(
                o.writes.utilization_fits,
                vec![(key.clone(), o.utilization_fits[&key])]
            );
        }
        // 32 × 512 tokens in fp32 (the spec leaves AMP off): twice the
        // plain work; at 40 %, h = 1.5 × that.
        let variant = Variant::of_spec(&o.live[&job(1)].spec);
        assert!(!variant.amp);
        let fit = o.utilization_fits[&key];
        assert!(
            (fit.overhead() - 1.5 * 2.0 * 16_384.0).abs() < 1e-6,
            "{}",
            fit.overhead()
        );
        let lut = analytic::default_lut().unwrap();
        let f = icefrog::one_gpu_footprint(&lut, "roberta-base", "A100", &variant, 32, Some(&fit))
            .unwrap();
        assert!(
            (f.utilization_pct - 40.0).abs() < 1e-9,
            "{}",
            f.utilization_pct
        );
    }

    pub(crate) fn empty_observed() -> Observed {
        Observed::default()
    }
}
