//! Estimates refined from what jobs report: the loss prior and the metric
//! prior over finished jobs, a profiled job's estimate, and its refit as
//! the running process reports more of its curve.

use std::collections::{BTreeMap, BTreeSet};

use fmsched_core::JobId;
use fmsched_core::policy::MergeMode;
use fmsched_estimator::curve_prior::{CurveLibrary, Metric, Query, Start};
use fmsched_estimator::loss_curve::{
    LossCurve, PLATEAU_THRESHOLD, fit_loss_curve, iterations_to_converge,
};
use fmsched_estimator::loss_prior::LossLibrary;
use fmsched_estimator::lut::Lut;
use fmsched_estimator::transfer::observed_gain;
use fmsched_estimator::{analytic, curve_prior, loss_prior};
use fmsched_proto::v1 as pb;

use crate::estimates::EstimatorClient;
use crate::persistence::{Estimate, JobRecord, MetricCurve};
use crate::registry::LiveNode;
use crate::round::observe::guard::{
    GAIN_POINTS, GAIN_POINTS_AT_END, fresh_start_if_it_pays, record_outcome,
};
use crate::round::observe::telemetry::{running_step_time_sample, tune_layers};
use crate::round::observe::{Observed, OwnEvals};
use crate::round::observe::{curve_from_json, gang_placement};
use crate::round::{DEFAULT_ITERATIONS, iteration_budget};
use crate::service::Service;

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
pub(crate) async fn loss_prior_of<'a>(
    state: &Service,
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
pub(crate) async fn learn_metric_targets(state: &Service, o: &mut Observed, own: &OwnEvals) {
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
pub(crate) fn predict_metric_target(
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

/// What a running process teaches: a data-parallel job training alone
/// gives the estimator's table its measured step time (once per process)
/// and refreshes its own estimate from its loss trace; B of a temporal
/// merge, training from A's weights, shows the transfer gain it got.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn learn_from_running(
    state: &Service,
    lut: &Lut,
    est: &EstimatorClient,
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
pub(crate) fn profile_estimate(
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
                match crate::round::planned_budget(job) {
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
pub(crate) fn loss_refit(
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
pub(crate) fn refreshed_estimate(
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

pub(crate) fn curve_to_json(c: &LossCurve) -> serde_json::Value {
    serde_json::json!({
        "beta0": c.beta0, "beta1": c.beta1, "beta2": c.beta2, "beta3": c.beta3, "quality": c.quality
    })
}
