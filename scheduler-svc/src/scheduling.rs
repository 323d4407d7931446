//! The scheduling loop: every interval, observe → snapshot → decide →
//! persist → push (Ymir Fig. 6 steps 4–5; STYLE §1).
//!
//! Phases of a round, named as in the code below:
//! 1. **observe** — what agents reported (progress, checkpoints, finished
//!    or failed processes) is written to Postgres and moves job states.
//! 2. **prepare** — a snapshot of live jobs, their remaining time at every
//!    allocation (the estimator library's throughput table; iterations from
//!    the job's target minus its progress), available nodes and the current
//!    assignments, translated to the policy's dense ordinals.
//! 3. **decide** — the policy (`fmsched_core::policy`, the same code as
//!    `fmsim`) on the blocking pool: pure CPU work.
//! 4. **apply** — concrete GPUs for the plan (kept placements keep their
//!    GPUs), the new intent persisted under a new generation with job state
//!    changes, then every connected node gets its complete desired set.
//!
//! The intent lives in Postgres, so a restarted scheduler pushes the same
//! plan under a newer generation: agents keep healthy processes (a repeated
//! desired task is a no-op for them) and nothing restarts.
//!
//! Merges (Ymir §5): profiled jobs' Task2Vec embeddings give transfer
//! gains (§4.1), the estimator's time table gives `T` and `TranWt` (Eq. 5,
//! 12, 13), and the policy picks pairs. A merge is persisted with the plan
//! that decides it and kept (only its size changes) until the merge guard
//! (§4.3) splits it. A spatial pair runs as one joint process `<a>+<b>`; a
//! temporal pair runs A with B evaluated alongside (the guard's signal),
//! then B from A's output weights.
//!
//! Pipeline switch (Ymir §6.2): `scheduling.prewarm_lead` (30 s) before a
//! round, a *look-ahead* round predicts the next plan from what Postgres
//! holds (it observes and writes nothing) and sends each node a
//! `PrepareSwitch` hint for the tasks it would start there, so their
//! processes get their data loaders ready in standby while the GPUs finish
//! the outgoing jobs. Only jobs whose launch sets `prewarm` get hints.
//!
//! Not here yet: placements over several nodes. A job is offered at most
//! the largest node's GPUs; one that needs more waits with an
//! `unschedulable` event saying so.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use estimator_svc::analytic;
use estimator_svc::loss_curve::LossCurve;
use estimator_svc::lut::{Lut, Variant};
use estimator_svc::times;
use estimator_svc::transfer::TaskEmbedding;
use fmsched_core::policy::baselines::by_name;
use fmsched_core::policy::{
    ExistingMerge, MergeMode, NodeCap, PairCandidate, Plan, SchedJob, Snapshot, ymir_allocations,
};
use fmsched_core::{GpuUuid, JobId, JobState, NodeId, NodeState};
use fmsched_proto::v1 as pb;

use crate::api::AppState;
use crate::estimates::{Estimates, local_gains, local_times};
use crate::persistence::{
    Assignment, Estimate, JobRecord, JobService, MergeRecord, NewMerge, PersistenceError,
    ServiceUpdate,
};

/// Default iterations of a job whose target names neither iterations nor
/// epochs with a known dataset size (it stops on its metric).
const DEFAULT_ITERATIONS: u64 = 1000;

/// Counters of the scheduling loop, rendered on `/metrics`.
#[derive(Debug, Default)]
pub struct SchedulerMetrics {
    inner: std::sync::Mutex<MetricValues>,
}

#[derive(Clone, Debug, Default)]
pub struct MetricValues {
    pub rounds: u64,
    pub round_seconds_sum: f64,
    pub last_round_seconds: f64,
    pub solver_seconds_sum: f64,
    pub last_solver_seconds: f64,
    pub fallbacks: u64,
    pub context_switches: u64,
    pub completed: u64,
    pub failed: u64,
    pub retries: u64,
    pub queue_length: u64,
    pub model_variables: u64,
    pub merges_temporal: u64,
    pub merges_spatial: u64,
    pub guard_splits: u64,
    pub estimator_fallbacks: u64,
    pub prewarm_hints: u64,
}

impl SchedulerMetrics {
    pub fn update(&self, f: impl FnOnce(&mut MetricValues)) {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn values(&self) -> MetricValues {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Renders the scheduler's metrics (job counts come from Postgres).
pub async fn render_metrics(state: &AppState) -> String {
    use fmsched_runtime::metrics::Exposition;
    let mut e = Exposition::default();
    e.family("fmsched_jobs", "gauge", "Jobs by state.");
    if let Ok(counts) = state.persistence.job_counts_by_state().await {
        for st in JobState::ALL {
            e.sample(
                "fmsched_jobs",
                &[("state", st.as_str())],
                counts.get(&st).copied().unwrap_or(0) as f64,
            );
        }
    }
    e.family("fmsched_nodes", "gauge", "Nodes by liveness state.");
    let nodes = state.registry.snapshot();
    for st in ["available", "suspect", "offline"] {
        let n = nodes.iter().filter(|x| x.state.as_str() == st).count();
        e.sample("fmsched_nodes", &[("state", st)], n as f64);
    }
    let v = state.metrics.values();
    e.scalar(
        "fmsched_queue_length",
        "gauge",
        "Live jobs without GPUs after the last round.",
        v.queue_length as f64,
    );
    e.scalar(
        "fmsched_rounds_total",
        "counter",
        "Scheduling rounds run.",
        v.rounds as f64,
    );
    e.scalar(
        "fmsched_round_duration_seconds_sum",
        "counter",
        "Total seconds spent in rounds.",
        v.round_seconds_sum,
    );
    e.scalar(
        "fmsched_round_duration_seconds_last",
        "gauge",
        "Seconds of the last round.",
        v.last_round_seconds,
    );
    e.scalar(
        "fmsched_solver_seconds_sum",
        "counter",
        "Total seconds in the policy (MILP solve for Ymir).",
        v.solver_seconds_sum,
    );
    e.scalar(
        "fmsched_solver_seconds_last",
        "gauge",
        "Seconds of the last policy call.",
        v.last_solver_seconds,
    );
    e.scalar(
        "fmsched_solver_fallbacks_total",
        "counter",
        "Rounds whose MILP hit its time limit and used the greedy fallback.",
        v.fallbacks as f64,
    );
    e.scalar(
        "fmsched_solver_model_variables",
        "gauge",
        "Variables of the last MILP.",
        v.model_variables as f64,
    );
    e.family(
        "fmsched_merges_total",
        "counter",
        "Merges decided, by mode.",
    );
    e.sample(
        "fmsched_merges_total",
        &[("mode", "temporal")],
        v.merges_temporal as f64,
    )
    .sample(
        "fmsched_merges_total",
        &[("mode", "spatial")],
        v.merges_spatial as f64,
    );
    e.scalar(
        "fmsched_merge_guard_splits_total",
        "counter",
        "Merges split by the merge guard (no accuracy gain in two epochs).",
        v.guard_splits as f64,
    );
    e.scalar(
        "fmsched_estimator_fallbacks_total",
        "counter",
        "Estimator service calls that failed; the in-process estimator answered.",
        v.estimator_fallbacks as f64,
    );
    e.scalar(
        "fmsched_prewarm_hints_total",
        "counter",
        "Pipeline-switch hints sent: tasks started in standby ahead of a round (Ymir §6.2).",
        v.prewarm_hints as f64,
    );
    e.scalar(
        "fmsched_context_switches_total",
        "counter",
        "Jobs started, moved or resized (each costs a checkpoint and a restart).",
        v.context_switches as f64,
    );
    e.family(
        "fmsched_jobs_finished_total",
        "counter",
        "Jobs completed or failed by this process.",
    )
    .sample(
        "fmsched_jobs_finished_total",
        &[("outcome", "completed")],
        v.completed as f64,
    )
    .sample(
        "fmsched_jobs_finished_total",
        &[("outcome", "failed")],
        v.failed as f64,
    );
    e.scalar(
        "fmsched_retries_total",
        "counter",
        "Failed training processes retried.",
        v.retries as f64,
    );
    e.finish()
}

/// What one round did, for logs and tests.
#[derive(Debug, Default, PartialEq)]
pub struct RoundReport {
    pub generation: i64,
    pub jobs: usize,
    pub running: usize,
    pub completed: usize,
    pub failed: usize,
    /// Look-ahead rounds: `PrepareSwitch` hints sent.
    pub hints: usize,
}

/// What a round does with the plan it decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundKind {
    /// Observe the agents' reports, decide, persist the plan under a new
    /// generation and push it.
    Commit,
    /// Predict the plan of the round expected at `switch_at` from what is
    /// persisted, and send `PrepareSwitch` hints for the tasks it would
    /// start (Ymir §6.2). Observes nothing, writes nothing.
    LookAhead { switch_at: DateTime<Utc> },
}

impl RoundKind {
    fn commits(self) -> bool {
        self == RoundKind::Commit
    }
}

/// The round's error (logged; the next round tries again).
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    #[error(transparent)]
    Persistence(#[from] PersistenceError),
    #[error("policy task failed: {0}")]
    Join(String),
}

/// Iterations a job needs in all (from its target).
fn total_iterations(job: &JobRecord) -> u64 {
    let t = &job.spec.target;
    if let Some(i) = t.max_iterations {
        return i;
    }
    if let (Some(e), Some(n)) = (t.max_epochs, job.spec.dataset.num_samples) {
        let batch = u64::from(job.spec.hyperparameters.global_batch_size.max(1));
        return (u64::from(e) * n).div_ceil(batch);
    }
    DEFAULT_ITERATIONS
}

/// The job's own iteration budget: its `max_iterations`, or its epoch
/// budget in iterations when the dataset size is known.
fn iteration_budget(job: &JobRecord) -> Option<u64> {
    let t = &job.spec.target;
    t.max_iterations.or_else(|| {
        t.max_epochs
            .and(job.spec.dataset.num_samples)
            .map(|_| total_iterations(job))
    })
}

/// Iterations the job is expected to need: the estimate from its fitted
/// loss curve (Eq. 2) when it names no iteration budget, else its target.
fn expected_iterations(job: &JobRecord, estimate: Option<&Estimate>) -> u64 {
    match (
        job.spec.target.max_iterations,
        estimate.and_then(|e| e.iterations),
    ) {
        (None, Some(k)) => k,
        _ => total_iterations(job),
    }
}

fn trainer_task(job: &JobRecord) -> pb::TrainerTask {
    let s = &job.spec;
    pb::TrainerTask {
        job_id: job.id.to_string(),
        model: s.model.clone(),
        task: s.dataset.task.clone(),
        dataset_uri: s.dataset.uri.clone(),
        global_batch_size: s.hyperparameters.global_batch_size,
        // An epoch budget with a known dataset size is an iteration budget.
        max_iterations: iteration_budget(job).unwrap_or(0),
        max_epochs: s.target.max_epochs.unwrap_or(0),
        eval_only: false,
        metric: s
            .target
            .metric
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        metric_target: s.target.metric.as_ref().map_or(0.0, |m| m.value),
        samples_per_epoch: s.dataset.num_samples.unwrap_or(0),
    }
}

/// Profiling allocations of this round: kept ones (job still profiling,
/// node still usable) and new ones for submitted jobs, oldest first, 1 GPU
/// (4 on one node for pipeline-parallel jobs). Free GPUs first; GPUs held by
/// training jobs only while profiling holds less than an eighth of the
/// cluster.
fn profiling_reservations(
    state: &AppState,
    live: &BTreeMap<JobId, JobRecord>,
    current: &[Assignment],
    available: &[&crate::registry::LiveNode],
) -> Vec<Assignment> {
    if !state.config.scheduling.profiling {
        return Vec::new();
    }
    let usable = |node: &NodeId| {
        available
            .iter()
            .find(|n| &n.record.id == node)
            .is_some_and(|n| n.state == NodeState::Available && !faulty(n))
    };
    let mut out: Vec<Assignment> = current
        .iter()
        .filter(|a| {
            a.profile
                && usable(&a.node)
                && live
                    .get(&a.job)
                    .is_some_and(|j| j.state == JobState::Profiling)
        })
        .cloned()
        .collect();
    let total: usize = available.iter().map(|n| n.record.gpus.len()).sum();
    let cap = (total / 8).max(1);
    let busy: BTreeSet<String> = current
        .iter()
        .filter(|a| !a.profile)
        .flat_map(|a| a.gpus.iter().map(|g| g.0.clone()))
        .collect();
    let mut taken: BTreeSet<String> = out
        .iter()
        .flat_map(|a| a.gpus.iter().map(|g| g.0.clone()))
        .collect();
    for (id, j) in live.iter().filter(|(_, j)| j.state == JobState::Submitted) {
        let need = if j.spec.resources.pipeline_parallel {
            4
        } else {
            1
        };
        let used_now: usize = out.iter().map(|a| a.gpus.len()).sum();
        let mut pick = None;
        for prefer_free in [true, false] {
            if !prefer_free && used_now + need > cap {
                break;
            }
            pick = available
                .iter()
                .filter(|n| n.state == NodeState::Available && !faulty(n))
                .find_map(|n| {
                    let gpus: Vec<GpuUuid> = n
                        .record
                        .gpus
                        .iter()
                        .filter(|g| {
                            !taken.contains(&g.uuid.0)
                                && (!prefer_free || !busy.contains(&g.uuid.0))
                        })
                        .take(need)
                        .map(|g| g.uuid.clone())
                        .collect();
                    (gpus.len() == need).then(|| (n.record.id.clone(), gpus))
                });
            if pick.is_some() {
                break;
            }
        }
        let Some((node, gpus)) = pick else { break };
        taken.extend(gpus.iter().map(|g| g.0.clone()));
        out.push(Assignment {
            job: *id,
            node,
            gpus,
            profile: true,
        });
    }
    out
}

/// Task id suffix of a job's profiling run.
const PROFILE_SUFFIX: &str = "-profile";

/// Turns an ended profiling run into estimates (Ymir §4: Eq. 3 fit, Eq. 2
/// iterations; the Task2Vec embedding kept for transferability) and queues
/// the job. A run that failed or whose trace cannot support a fit still
/// queues the job, with the reason in its estimates and its event.
async fn observe_profile(
    state: &AppState,
    id: JobId,
    t: &pb::ObservedTask,
    now: chrono::DateTime<Utc>,
) -> Result<Option<Estimate>, RoundError> {
    use estimator_svc::loss_curve::{PLATEAU_THRESHOLD, fit_loss_curve, iterations_to_converge};
    let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
    if !matches!(phase, pb::TaskPhase::Succeeded | pb::TaskPhase::Failed) {
        return Ok(None);
    }
    let p = &state.persistence;
    let job = p.get_job(id).await?;
    let cap = job.as_ref().map_or(DEFAULT_ITERATIONS * 100, |j| {
        j.spec
            .target
            .max_iterations
            .unwrap_or(DEFAULT_ITERATIONS * 100)
    });
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
                let k = iterations_to_converge(&c, 0.0, PLATEAU_THRESHOLD, cap);
                est.iterations = Some(k);
                est.curve = Some(serde_json::json!({
                    "beta0": c.beta0, "beta1": c.beta1, "beta2": c.beta2, "beta3": c.beta3, "quality": c.quality
                }));
                est.note = format!(
                    "fit on {} loss points, quality {:.3}",
                    t.trace_losses.len(),
                    c.quality
                );
                format!(
                    "profiled: about {k} iterations to converge (Eq. 2; fit quality {:.2})",
                    c.quality
                )
            }
            Err(e) => {
                est.note = format!("no loss-curve fit: {e}");
                format!(
                    "profiled, but the loss trace supports no fit ({e}); using the job's target"
                )
            }
        }
    };
    p.store_estimate(id, &est, now).await?;
    p.transition_job(id, JobState::Queued, &reason, now).await?;
    tracing::info!(job_id = %id, %reason, "profiling done");
    Ok(Some(est))
}

/// Refits a running job's loss curve (Eq. 3) on the trace its process
/// reported and stores the new iterations-to-converge (Eq. 2) when they moved
/// by more than 5 % — the profile saw 50 steps, the running job sees many
/// more. A trace too short or too noisy to fit leaves the estimate alone.
/// Returns the estimate stored, if any.
async fn refresh_estimate(
    p: &crate::persistence::Persistence,
    job: &JobRecord,
    t: &pb::ObservedTask,
    old: Option<&Estimate>,
    now: chrono::DateTime<Utc>,
) -> Result<Option<Estimate>, RoundError> {
    use estimator_svc::loss_curve::{PLATEAU_THRESHOLD, fit_loss_curve, iterations_to_converge};
    const MIN_POINTS: usize = 20;
    const MIN_QUALITY: f64 = 0.5;
    if t.trace_losses.len() < MIN_POINTS {
        return Ok(None);
    }
    let Ok(c) = fit_loss_curve(&t.trace_iterations, &t.trace_losses) else {
        return Ok(None);
    };
    if c.quality < MIN_QUALITY {
        return Ok(None);
    }
    let cap = iteration_budget(job).unwrap_or(DEFAULT_ITERATIONS * 100);
    let k = iterations_to_converge(&c, 0.0, PLATEAU_THRESHOLD, cap);
    let before = old.and_then(|e| e.iterations);
    if before.is_some_and(|b| (k as f64 - b as f64).abs() <= 0.05 * b as f64) {
        return Ok(None);
    }
    let mut e = old.cloned().unwrap_or_default();
    e.iterations = Some(k);
    e.curve = Some(serde_json::json!({
        "beta0": c.beta0, "beta1": c.beta1, "beta2": c.beta2, "beta3": c.beta3, "quality": c.quality
    }));
    let last = t.trace_iterations.last().copied().unwrap_or(0.0);
    e.note = format!(
        "refit on {} loss points of the running process (to iteration {last:.0}), quality {:.3}",
        t.trace_losses.len(),
        c.quality
    );
    p.store_estimate(job.id, &e, now).await?;
    tracing::info!(job_id = %job.id, iterations = k, before = ?before, quality = c.quality, "estimate refreshed from the running process");
    Ok(Some(e))
}

/// Whether any GPU of the node reports Xid or uncorrectable ECC errors.
fn faulty(n: &crate::registry::LiveNode) -> bool {
    n.telemetry
        .values()
        .any(|t| t.xid_errors > 0 || t.ecc_uncorrected_errors > 0)
}

/// One scheduling round (see the module docs).
pub async fn run_round(
    state: &AppState,
    lut: &Arc<Lut>,
    est: &Estimates,
    kind: RoundKind,
) -> Result<RoundReport, RoundError> {
    let p = &state.persistence;
    let now = Utc::now();
    let mut report = RoundReport::default();

    // ---- 1. observe -------------------------------------------------------
    let Observed {
        nodes,
        live,
        merges,
        estimates,
        split_now,
        reported_outputs,
    } = observe(state, lut, est, kind, now, &mut report).await?;

    // ---- 2. prepare -------------------------------------------------------
    let progress = p.progress().await?;
    let current = p.current_plan().await?;
    let service = p.service().await?;
    // Offline nodes are out: their jobs are re-placed from their last
    // checkpoint. A Suspect node keeps what it runs (it may only be late)
    // but gets nothing new: its capacity is what it holds.
    let available: Vec<_> = nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && !n.record.gpus.is_empty())
        .collect();
    for n in available.iter().filter(|n| faulty(n)) {
        let bad: Vec<&str> = n
            .telemetry
            .values()
            .filter(|t| t.xid_errors > 0 || t.ecc_uncorrected_errors > 0)
            .map(|t| t.uuid.as_str())
            .collect();
        tracing::warn!(node_id = %n.record.id, gpus = ?bad, "draining node: GPUs report Xid or uncorrectable ECC errors");
    }
    let node_index: BTreeMap<&NodeId, usize> = available
        .iter()
        .enumerate()
        .map(|(k, n)| (&n.record.id, k))
        .collect();
    let gpu_family = available
        .first()
        .and_then(|n| n.record.gpus.first())
        .map(|g| analytic::gpu_family(&g.model))
        .unwrap_or_else(|| "V100".into());
    let per_node = available
        .iter()
        .map(|n| n.record.gpus.len() as u32)
        .max()
        .unwrap_or(4)
        .clamp(1, 9);
    let total: u32 = available.iter().map(|n| n.record.gpus.len() as u32).sum();
    let allocations = ymir_allocations(total);
    let held: BTreeMap<JobId, &Assignment> = current
        .assignments
        .iter()
        .filter(|a| !a.profile)
        .map(|a| (a.job, a))
        .collect();
    // Profiling runs first (Ymir Fig. 6 step 2): kept where they run,
    // new ones on free GPUs, else on GPUs taken from the policy's capacity
    // (at most an eighth of the cluster at a time).
    let profiling = profiling_reservations(state, &live, &current.assignments, &available);
    let mut reserved: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for a in &profiling {
        if let Some(&k) = node_index.get(&a.node) {
            reserved
                .entry(k)
                .or_default()
                .extend(a.gpus.iter().map(|g| g.0.clone()));
        }
    }
    // Jobs in their retry backoff wait outside the snapshot; so do jobs not
    // profiled yet, and the jobs of a spatial merge split this round (they
    // resume from the joint process's last checkpoint, next round).
    let mut held_back: BTreeSet<JobId> = p.retry_holds(now).await?.into_iter().collect();
    for m in merges
        .iter()
        .filter(|m| split_now.contains(&m.id) && m.mode == MergeMode::Spatial)
    {
        held_back.extend([m.a, m.b]);
    }
    let profiling_on = state.config.scheduling.profiling;
    // Jobs run on one node (placements over several nodes are not driven
    // yet): a job that needs more GPUs than the largest node waits, and says
    // why; the others are offered at most one node's GPUs, so the plan never
    // holds GPUs for a group it cannot start.
    let largest_node = available
        .iter()
        .map(|n| n.record.gpus.len() as u32)
        .max()
        .unwrap_or(0);
    for (id, j) in live.iter().filter(|(_, j)| j.state == JobState::Queued) {
        if j.spec.resources.min_gpus > largest_node && largest_node > 0 && kind.commits() {
            let why = format!(
                "waiting: needs at least {} GPUs on one node and the largest node has {largest_node} (jobs over several nodes are not run yet)",
                j.spec.resources.min_gpus
            );
            p.note_job(*id, "unschedulable", &why, now).await?;
        }
    }
    let ids: Vec<JobId> = live
        .iter()
        .filter(|(id, j)| {
            let unprofiled =
                profiling_on && matches!(j.state, JobState::Submitted | JobState::Profiling);
            !(held_back.contains(id) || unprofiled || j.spec.resources.min_gpus > largest_node)
        })
        .map(|(id, _)| *id)
        .collect();
    let ord: BTreeMap<JobId, usize> = ids.iter().enumerate().map(|(k, id)| (*id, k)).collect();
    // The gain a merged job receives (its K is transferred, Eq. 2 with
    // L/(1+G)): B of a temporal merge from A; each job of a spatial merge
    // from the other.
    let mut gain_for: BTreeMap<JobId, f64> = BTreeMap::new();
    for m in merges.iter().filter(|m| m.active) {
        gain_for.insert(m.b, m.gain_ab);
        if m.mode == MergeMode::Spatial {
            gain_for.insert(m.a, m.gain_ba);
        }
    }
    let mut inputs = Vec::with_capacity(ids.len());
    for id in &ids {
        let j = &live[id];
        let done = progress.get(id).map_or(0, |p| p.0);
        let est = estimates.get(id);
        let curve = est.and_then(|e| e.curve.as_ref()).and_then(curve_from_json);
        let total = expected_iterations(j, est);
        let mut input = times::JobInput {
            id: id.to_string(),
            model: j.spec.model.clone(),
            gpu_type: gpu_family.clone(),
            gpus_per_node: per_node,
            global_batch: j.spec.hyperparameters.global_batch_size.max(1),
            variant: Variant {
                pipeline: j.spec.resources.pipeline_parallel,
                amp: true,
                ..Default::default()
            },
            layers: analytic::layers_of(&j.spec.model).unwrap_or(12),
            remaining_iterations: total.saturating_sub(done).max(1),
            done_iterations: done,
            curve,
            max_iterations: total_iterations(j),
            samples_per_epoch: j
                .spec
                .dataset
                .num_samples
                .unwrap_or(u64::from(j.spec.hyperparameters.global_batch_size.max(1)) * 100),
        };
        if let Some(&g) = gain_for.get(id) {
            input.remaining_iterations = times::transferred_iterations(&input, g).max(1);
        }
        inputs.push(input);
    }
    // Kept merges (both jobs in the snapshot) and new candidates: pairs of
    // jobs of one model and different tasks that both allow sharing, have
    // made no progress, were never merged, and were profiled (Task2Vec
    // embeddings). Gains come from the embeddings (Ymir §4.1: score →
    // linear regression → G, Eq. 1).
    let embedding = |id: &JobId| {
        estimates
            .get(id)
            .filter(|e| !e.fisher.is_empty() && e.fisher.len() == e.fisher_repeat.len())
            .map(|e| TaskEmbedding {
                fisher: e.fisher.clone(),
                fisher_repeat: e.fisher_repeat.clone(),
            })
    };
    let mut pairs: Vec<times::PairInput> = Vec::new();
    let mut kept_pairs: Vec<(usize, MergeMode)> = Vec::new(); // (pair index, mode)
    for m in merges.iter().filter(|m| m.active) {
        if let (Some(&a), Some(&b)) = (ord.get(&m.a), ord.get(&m.b)) {
            kept_pairs.push((pairs.len(), m.mode));
            pairs.push(times::PairInput {
                a,
                b,
                mode: time_mode(m.mode),
                gain_ab: m.gain_ab,
                gain_ba: m.gain_ba,
            });
        }
    }
    let first_candidate = pairs.len();
    if state.config.scheduling.merging {
        let ever_merged: BTreeSet<JobId> = merges.iter().flat_map(|m| [m.a, m.b]).collect();
        let open: Vec<(usize, TaskEmbedding)> = ids
            .iter()
            .enumerate()
            .filter(|(_, id)| {
                let j = &live[*id];
                j.spec.sharing
                    && !ever_merged.contains(*id)
                    && progress.get(*id).is_none_or(|p| p.0 == 0)
            })
            .filter_map(|(k, id)| embedding(id).map(|e| (k, e)))
            .collect();
        let named: Vec<(String, TaskEmbedding)> = open
            .iter()
            .map(|(k, e)| (ids[*k].to_string(), e.clone()))
            .collect();
        let gains = match est.gains(&named).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "estimator service failed; transfer gains from the in-process estimator");
                state.metrics.update(|m| m.estimator_fallbacks += 1);
                local_gains(&named)
            }
        };
        let gain = |m: &BTreeMap<(usize, usize), f64>, a, b| {
            m.get(&(a, b)).copied().unwrap_or(f64::NEG_INFINITY)
        };
        for (x, (ka, _)) in open.iter().enumerate() {
            for (y, (kb, _)) in open.iter().enumerate().skip(x + 1) {
                let (ja, jb) = (&live[&ids[*ka]], &live[&ids[*kb]]);
                if ja.spec.model != jb.spec.model
                    || ja.spec.dataset.task == jb.spec.dataset.task
                    || ja.spec.resources.pipeline_parallel != jb.spec.resources.pipeline_parallel
                {
                    continue;
                }
                let g_ab = gain(&gains.temporal, x, y);
                let g_ba = gain(&gains.temporal, y, x);
                let g_sp = gain(&gains.spatial, x, y);
                // Only pairs the estimator classifies as positive transfer
                // (Ymir Table 2's G ≥ 0 class): a joint job can out-run two
                // separate ones on throughput alone, but a merge is for
                // transfer, and negative transfer costs accuracy.
                for (a, b, mode, gab, gba) in [
                    (*ka, *kb, times::MergeMode::Temporal, g_ab, 0.0),
                    (*kb, *ka, times::MergeMode::Temporal, g_ba, 0.0),
                    (*ka, *kb, times::MergeMode::Spatial, g_sp, g_sp),
                ] {
                    if gab >= 0.0 && gba >= 0.0 {
                        pairs.push(times::PairInput {
                            a,
                            b,
                            mode,
                            gain_ab: gab,
                            gain_ba: gba,
                        });
                    }
                }
            }
        }
    }
    let remote = if est.is_remote() && !inputs.is_empty() {
        match est.times(&inputs, &pairs, &allocations).await {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "estimator service failed; time table from the in-process estimator");
                state.metrics.update(|m| m.estimator_fallbacks += 1);
                None
            }
        }
    } else {
        None
    };
    let table = match remote.map_or_else(|| local_times(lut, &inputs, &pairs, &allocations), Ok) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "time estimates failed; keeping the current plan");
            return Ok(report);
        }
    };
    let restart_s = 60.0;
    // The merged group's remaining time: temporal = A, then B from A's
    // weights (plus B's start); spatial = the joint job (Eq. 4).
    let group_time = |pt: &times::PairTimes| -> Vec<f64> {
        match pt.pair.mode {
            times::MergeMode::Temporal => table.jobs[pt.pair.a]
                .iter()
                .zip(&pt.seconds)
                .map(|(ta, tab)| ta + tab + restart_s)
                .collect(),
            times::MergeMode::Spatial => pt.seconds.clone(),
        }
    };
    let kept: Vec<ExistingMerge> = kept_pairs
        .iter()
        .map(|&(k, mode)| {
            let pt = &table.pairs[k];
            ExistingMerge {
                a: pt.pair.a,
                b: pt.pair.b,
                mode,
                remaining_s: group_time(pt),
            }
        })
        .collect();
    let candidates: Vec<PairCandidate> = table.pairs[first_candidate..]
        .iter()
        .filter(|pt| pt.tran_wt.iter().any(|&w| w >= 1.0))
        .map(|pt| PairCandidate {
            a: pt.pair.a,
            b: pt.pair.b,
            mode: policy_mode(pt.pair.mode),
            remaining_s: group_time(pt),
            tran_wt: pt.tran_wt.clone(),
        })
        .collect();
    // The placement each job holds now; a kept merge's jobs share their
    // group's (a temporal B rides on A's GPUs).
    let mut holding: BTreeMap<JobId, Vec<(usize, u32)>> = BTreeMap::new();
    for id in &ids {
        if let Some(a) = held.get(id)
            && let Some(&k) = node_index.get(&a.node)
        {
            holding.insert(*id, vec![(k, a.gpus.len() as u32)]);
        }
    }
    for m in &kept {
        let (a, b) = (ids[m.a], ids[m.b]);
        if let Some(pl) = holding.get(&a).or_else(|| holding.get(&b)).cloned() {
            holding.insert(a, pl.clone());
            holding.insert(b, pl);
        }
    }
    // What a job asks for: at most one node's GPUs (jobs run on one node).
    let request = |j: &JobRecord| j.spec.resources.max_gpus.min(largest_node);
    let mut jobs = Vec::with_capacity(ids.len());
    for (k, id) in ids.iter().enumerate() {
        let j = &live[id];
        let done = progress.get(id).map_or(0, |p| p.0);
        let placement = holding.get(id).cloned().unwrap_or_default();
        let sv = service.get(id).cloned().unwrap_or_default();
        jobs.push(SchedJob {
            id: id.to_string(),
            model: j.spec.model.clone(),
            task: j.spec.dataset.task.clone(),
            sharing: j.spec.sharing,
            pipeline: j.spec.resources.pipeline_parallel,
            requested_gpus: request(j),
            min_gpus: j.spec.resources.min_gpus,
            max_gpus: request(j),
            submitted_at: (j.created_at - now).num_milliseconds() as f64 / 1000.0,
            progress: done as f64 / total_iterations(j).max(1) as f64,
            attained_gpu_s: sv.attained_gpu_s,
            executed_s: sv.executed_s,
            fair_share_gpu_s: sv.fair_share_gpu_s,
            current_gpus: placement.iter().map(|p| p.1).sum(),
            current_placement: placement,
            remaining_s: table.jobs[k].clone(),
            restart_s,
            lease_until: sv
                .lease_until
                .map_or(0.0, |t| (t - now).num_milliseconds() as f64 / 1000.0),
        });
    }
    let snap = Snapshot {
        now: 0.0,
        nodes: available
            .iter()
            .map(|n| NodeCap {
                id: n.record.id.as_str().to_string(),
                // A node whose GPUs report Xid or uncorrectable ECC errors is
                // drained: nothing stays or starts there.
                gpus: if faulty(n) {
                    0
                } else if n.state == NodeState::Suspect {
                    current
                        .assignments
                        .iter()
                        .filter(|a| {
                            !a.profile && a.node == n.record.id && live.contains_key(&a.job)
                        })
                        .map(|a| a.gpus.len() as u32)
                        .sum()
                } else {
                    let k = node_index[&n.record.id];
                    n.record.gpus.len() as u32 - reserved.get(&k).map_or(0, |r| r.len() as u32)
                },
            })
            .collect(),
        allocations,
        jobs,
        candidates,
        merges: kept,
        placement_rule: Default::default(),
    };

    // ---- 3. decide --------------------------------------------------------
    let policy_name = state.config.scheduling.policy.clone();
    let snap = Arc::new(snap);
    let snap2 = snap.clone();
    let solve_started = std::time::Instant::now();
    let plan: Plan = tokio::task::spawn_blocking(move || {
        let policy = by_name(&policy_name).expect("validated at start-up");
        policy.schedule(&snap2)
    })
    .await
    .map_err(|e| RoundError::Join(e.to_string()))?;
    let solve_s = solve_started.elapsed().as_secs_f64();
    state.metrics.update(|m| {
        if !kind.commits() {
            return;
        }
        m.solver_seconds_sum += solve_s;
        m.last_solver_seconds = solve_s;
        m.model_variables = plan.stats.variables as u64;
        m.fallbacks += u64::from(plan.stats.fallback);
    });
    if let Err(e) = plan.consistency_check(&snap) {
        // Never push a plan that breaks an invariant; keep the old one.
        tracing::error!(error = %e, "policy produced an inconsistent plan; keeping the current one");
        return Ok(report);
    }

    // ---- 4. apply ---------------------------------------------------------
    // Concrete GPUs: a group that keeps its node and size keeps its GPUs
    // (unless a profiling run took one of them).
    let active_of = |a: JobId, b: JobId| merges.iter().find(|m| m.active && m.a == a && m.b == b);
    let mut used: BTreeMap<usize, BTreeSet<String>> = reserved.clone();
    // (members, mode, node, GPUs) of every placed group.
    let mut groups: Vec<(Vec<JobId>, MergeMode, usize, Vec<GpuUuid>)> = Vec::new();
    let mut pending = Vec::new();
    let mut new_merges = Vec::new();
    for e in &plan.entries {
        let members: Vec<JobId> = e.jobs.iter().map(|&k| ids[k]).collect();
        if let [a, b] = members[..]
            && active_of(a, b).is_none()
        {
            // A new merge: the gains it was decided on are recorded with it.
            let (ka, kb) = (e.jobs[0], e.jobs[1]);
            let mode = time_mode(e.mode);
            if let Some(pi) = pairs
                .iter()
                .find(|p| p.a == ka && p.b == kb && p.mode == mode)
            {
                new_merges.push(NewMerge {
                    a,
                    b,
                    mode: e.mode,
                    gain_ab: pi.gain_ab,
                    gain_ba: pi.gain_ba,
                });
            }
        }
        let group_held = members.iter().find_map(|m| held.get(m));
        match (group_held, e.placement.as_slice()) {
            (Some(a), [(n, g)])
                if node_index.get(&a.node) == Some(n)
                    && a.gpus.len() as u32 == *g
                    && !a
                        .gpus
                        .iter()
                        .any(|u| reserved.get(n).is_some_and(|r| r.contains(&u.0))) =>
            {
                used.entry(*n)
                    .or_default()
                    .extend(a.gpus.iter().map(|u| u.0.clone()));
                groups.push((members, e.mode, *n, a.gpus.clone()));
            }
            // Multi-node placements are not driven yet: the group waits.
            (_, [(n, g)]) => pending.push((members, e.mode, *n, *g)),
            _ => {}
        }
    }
    for (members, mode, n, g) in pending {
        let taken = used.entry(n).or_default();
        let free: Vec<GpuUuid> = available[n]
            .record
            .gpus
            .iter()
            .filter(|u| !taken.contains(&u.uuid.0))
            .take(g as usize)
            .map(|u| u.uuid.clone())
            .collect();
        if free.len() == g as usize {
            taken.extend(free.iter().map(|u| u.0.clone()));
            groups.push((members, mode, n, free));
        }
    }
    // One assignment per job that trains: both jobs of a spatial pair (one
    // joint process), only A of a temporal pair (B waits for A's weights).
    let mut assignments = Vec::new();
    for (members, mode, n, gpus) in &groups {
        let trains = if *mode == MergeMode::Temporal {
            &members[..1]
        } else {
            &members[..]
        };
        for id in trains {
            assignments.push(Assignment {
                job: *id,
                node: available[*n].record.id.clone(),
                gpus: gpus.clone(),
                profile: false,
            });
        }
    }
    let running: BTreeSet<JobId> = assignments.iter().map(|a| a.job).collect();
    // Everything the plan's processes need about merges: all active ones
    // (those decided now included) and the outputs of finished A's.
    let mut all_merges = merges.clone();
    all_merges.extend(new_merges.iter().map(|m| MergeRecord {
        id: 0,
        a: m.a,
        b: m.b,
        mode: m.mode,
        gain_ab: m.gain_ab,
        gain_ba: m.gain_ba,
        active: true,
        guard_passed: false,
    }));
    let mut init_weights = BTreeMap::new();
    for m in all_merges
        .iter()
        .filter(|m| m.active && m.mode == MergeMode::Temporal && running.contains(&m.b))
    {
        if live.contains_key(&m.a) {
            continue;
        }
        let out = match reported_outputs.get(&m.a) {
            Some(o) => Some(o.clone()), // a look-ahead: A reported its output
            None => p
                .get_job(m.a)
                .await?
                .filter(|a| a.state == JobState::Completed)
                .and_then(|a| a.output_path),
        };
        if let Some(out) = out.filter(|o| !o.is_empty()) {
            init_weights.insert(m.b, out);
        }
    }
    if let RoundKind::LookAhead { switch_at } = kind {
        // ---- 4'. hint --------------------------------------------------------
        let view = PlanView {
            live: &live,
            assignments: &assignments,
            progress: &progress,
            merges: &all_merges,
            init_weights: &init_weights,
        };
        report.hints = send_switch_hints(state, &view, &held, switch_at);
        return Ok(report);
    }
    let mut transitions = Vec::new();
    let profiled: BTreeSet<JobId> = profiling.iter().map(|a| a.job).collect();
    for (id, j) in &live {
        if profiled.contains(id) {
            if j.state == JobState::Submitted {
                let a = profiling.iter().find(|a| a.job == *id).expect("reserved");
                let reason = format!("profiling on {} ({} GPU)", a.node, a.gpus.len());
                transitions.push((*id, JobState::Profiling, reason));
            }
            continue;
        }
        if profiling_on && j.state == JobState::Profiling {
            // Its profiling node is gone: profile again.
            transitions.push((
                *id,
                JobState::Submitted,
                "profiling node lost; profiling again".to_string(),
            ));
            continue;
        }
        if profiling_on && j.state == JobState::Submitted {
            continue; // waits for a profiling GPU
        }
        let want = if running.contains(id) {
            JobState::Running
        } else {
            JobState::Queued
        };
        let from = j.state;
        if from != want {
            let reason = if want == JobState::Running {
                let a = assignments
                    .iter()
                    .find(|a| a.job == *id)
                    .expect("running jobs have assignments");
                format!(
                    "placed on {} ({} GPUs) by {}",
                    a.node,
                    a.gpus.len(),
                    state.config.scheduling.policy
                )
            } else if from == JobState::Running
                && let Some(h) = held.get(id).filter(|h| !node_index.contains_key(&h.node))
            {
                format!(
                    "node {} is offline: re-queued from its last checkpoint (iteration {})",
                    h.node,
                    progress.get(id).map_or(0, |p| p.0)
                )
            } else if from == JobState::Running {
                "suspended by the plan (checkpointed)".to_string()
            } else {
                "waiting for GPUs".to_string()
            };
            // submitted → queued → running goes through queued.
            if from == JobState::Submitted && want == JobState::Running {
                transitions.push((*id, JobState::Queued, "accepted for scheduling".to_string()));
            }
            transitions.push((*id, want, reason));
        }
    }
    // Service: every live job deserves an equal share of the cluster, at
    // most its request (Themis's deserved service); the plan's leases.
    let share = f64::from(total) / live.len().max(1) as f64;
    let service_update = ServiceUpdate {
        fair_share_gpus: live
            .iter()
            .map(|(id, j)| (*id, share.min(f64::from(request(j)))))
            .collect(),
        leases: leases_after(
            &assignments,
            &held,
            &service,
            by_name(&state.config.scheduling.policy).map_or(0.0, |p| p.lease_s()),
            now,
        ),
    };
    let training = assignments.len();
    assignments.extend(profiling);
    let generation = p
        .store_plan(
            &assignments,
            &transitions,
            &new_merges,
            &service_update,
            now,
        )
        .await?;
    // A context switch: a job whose GPUs differ from what it held.
    let switches = assignments
        .iter()
        .filter(|a| {
            held.get(&a.job)
                .is_none_or(|h| h.node != a.node || h.gpus != a.gpus)
        })
        .count() as u64;
    let queued = live.len().saturating_sub(training) as u64;
    let (completed, failed) = (report.completed as u64, report.failed as u64);
    let merged_temporal = new_merges
        .iter()
        .filter(|m| m.mode == MergeMode::Temporal)
        .count() as u64;
    let merged_spatial = new_merges.len() as u64 - merged_temporal;
    state.metrics.update(|m| {
        m.context_switches += switches;
        m.queue_length = queued;
        m.completed += completed;
        m.failed += failed;
        m.merges_temporal += merged_temporal;
        m.merges_spatial += merged_spatial;
    });
    for (id, to, reason) in &transitions {
        tracing::info!(job_id = %id, to = %to, %reason, generation, "job state");
    }
    for m in &new_merges {
        tracing::info!(a = %m.a, b = %m.b, mode = m.mode.as_str(), gain_ab = m.gain_ab, gain_ba = m.gain_ba, generation, "merge decided");
    }
    push_plans(
        state,
        &PlanView {
            live: &live,
            assignments: &assignments,
            progress: &progress,
            merges: &all_merges,
            init_weights: &init_weights,
        },
        generation,
    );
    report.generation = generation;
    report.jobs = live.len();
    report.running = training;
    Ok(report)
}

/// What the observe phase leaves for the rest of the round.
struct Observed {
    nodes: Vec<crate::registry::LiveNode>,
    /// Live jobs: those that finished or failed for good this round are
    /// gone; those whose profiling ended are queued.
    live: BTreeMap<JobId, JobRecord>,
    /// Merges of live jobs; those split this round are inactive.
    merges: Vec<MergeRecord>,
    /// Estimates, with what this round learned (profiles, refits).
    estimates: BTreeMap<JobId, Estimate>,
    /// Merges split this round: their spatial jobs wait one round for the
    /// joint process's last checkpoint.
    split_now: BTreeSet<i64>,
    /// Look-ahead rounds: the outputs of jobs predicted to finish first.
    reported_outputs: BTreeMap<JobId, String>,
}

/// Phase 1 of a round: read the live jobs, merges and estimates; take in
/// what agents report (progress and checkpoints, finished, failed and
/// profiled processes, step times, evaluations) and run the merge guard.
/// A look-ahead round writes nothing: it only predicts which jobs finish
/// before the switch.
async fn observe(
    state: &AppState,
    lut: &Lut,
    est: &Estimates,
    kind: RoundKind,
    now: DateTime<Utc>,
    report: &mut RoundReport,
) -> Result<Observed, RoundError> {
    let p = &state.persistence;
    let nodes = state.registry.snapshot();
    let mut live: BTreeMap<JobId, JobRecord> = p
        .live_jobs()
        .await?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    let merges = p.merges_of_live_jobs().await?;
    // Read once; what this round learns (profiles, refits) is written
    // through to Postgres and into this map.
    let mut estimates = p.estimates().await?;
    // Evaluation values per job reported this round (the guard reads them).
    let mut evals: BTreeMap<JobId, Vec<f64>> = BTreeMap::new();
    // Merges split this round: their spatial jobs wait one round for the
    // joint process's last checkpoint.
    let mut split_now: BTreeSet<i64> = BTreeSet::new();
    // A look-ahead writes nothing: it predicts from what is persisted, and
    // from the reports only which jobs finish before the switch.
    let reporting = if kind.commits() { &nodes[..] } else { &[] };
    let mut reported_outputs: BTreeMap<JobId, String> = BTreeMap::new();
    if let RoundKind::LookAhead { switch_at } = kind {
        let lead_s = (switch_at - now).num_milliseconds().max(0) as f64 / 1000.0;
        let observed = nodes.iter().flat_map(|n| &n.observed_tasks);
        for (id, output) in finishing(observed, &live, &estimates, lead_s) {
            live.remove(&id);
            if let Some(o) = output {
                reported_outputs.insert(id, o);
            }
        }
    }
    let mut cx = Observing {
        state,
        lut,
        est,
        now,
        merges: &merges,
        live: &mut live,
        estimates: &mut estimates,
        evals: &mut evals,
        split_now: &mut split_now,
        report,
    };
    for n in reporting {
        for t in &n.observed_tasks {
            observe_task(&mut cx, n, t).await?;
        }
    }

    // The merge guard (Ymir §4.3): a merge whose watched accuracy does not
    // improve in the first two epochs is split and both jobs are scheduled
    // on their own. Temporal A ↦ B: B's accuracy with A's weights, evaluated
    // while A trains. Spatial A ‖ B: each task's accuracy in the joint job.
    let unguarded: Vec<&MergeRecord> = merges
        .iter()
        .filter(|m| m.active && !m.guard_passed && !split_now.contains(&m.id))
        .filter(|_| kind.commits())
        .collect();
    for m in unguarded {
        let watched: Vec<(JobId, Option<&[f64]>)> = match m.mode {
            MergeMode::Temporal => vec![m.b],
            _ => vec![m.a, m.b],
        }
        .into_iter()
        .filter(|j| live.contains_key(j))
        .map(|j| (j, evals.get(&j).map(Vec::as_slice)))
        .collect();
        match guard_verdict(m.mode, &watched) {
            GuardVerdict::Split(reason) => {
                tracing::warn!(merge = m.id, mode = m.mode.as_str(), %reason, "merge guard: splitting");
                p.guard_merge(m, Some(&reason), now).await?;
                split_now.insert(m.id);
                state.metrics.update(|x| x.guard_splits += 1);
            }
            GuardVerdict::Keep => p.guard_merge(m, None, now).await?,
            GuardVerdict::Wait => {}
        }
    }
    let merges: Vec<MergeRecord> = merges
        .into_iter()
        .map(|mut m| {
            m.active &= !split_now.contains(&m.id);
            m
        })
        .collect();

    Ok(Observed {
        nodes,
        live,
        merges,
        estimates,
        split_now,
        reported_outputs,
    })
}

/// What observing one process reads and may change.
struct Observing<'a> {
    state: &'a AppState,
    lut: &'a Lut,
    est: &'a Estimates,
    now: DateTime<Utc>,
    merges: &'a [MergeRecord],
    live: &'a mut BTreeMap<JobId, JobRecord>,
    estimates: &'a mut BTreeMap<JobId, Estimate>,
    /// Evaluation values per job reported this round (the guard reads them).
    evals: &'a mut BTreeMap<JobId, Vec<f64>>,
    split_now: &'a mut BTreeSet<i64>,
    report: &'a mut RoundReport,
}

/// Takes in one process a node reports: a profiling run that ended queues
/// its job with what it measured; a training process records progress and
/// checkpoints, teaches the estimator its step time and loss trace, and
/// completes or retries (then fails) its jobs.
async fn observe_task(
    cx: &mut Observing<'_>,
    n: &crate::registry::LiveNode,
    t: &pb::ObservedTask,
) -> Result<(), RoundError> {
    let (state, lut, est, now, merges) = (cx.state, cx.lut, cx.est, cx.now, cx.merges);
    let p = &state.persistence;
    let live = &mut *cx.live;
    let estimates = &mut *cx.estimates;
    let evals = &mut *cx.evals;
    let split_now = &mut *cx.split_now;
    let report = &mut *cx.report;
    // Profiling runs: "<job>-profile".
    if let Some(job_part) = t.task_id.strip_suffix(PROFILE_SUFFIX) {
        let Ok(id) = job_part.parse::<JobId>() else {
            return Ok(());
        };
        // Only a finished run queues the job (a running one leaves
        // it profiling: it must not be scheduled yet).
        if live
            .get(&id)
            .is_some_and(|j| j.state == JobState::Profiling)
            && let Some(learned) = observe_profile(state, id, t, now).await?
            && let Some(j) = live.get_mut(&id)
        {
            estimates.insert(id, learned);
            j.state = JobState::Queued;
            // The measured step time teaches the estimator's table
            // (1 GPU, the job's batch; AMP as the shipped profiles).
            if t.step_time_s > 0.0
                && let Some(g) = n.record.gpus.first()
            {
                let sample = profile_step_time_sample(j, &g.model, t.step_time_s);
                if let Err(e) = est.record_step_times(vec![sample]).await {
                    tracing::warn!(job_id = %id, error = %e, "step time not recorded");
                }
            }
        }
        return Ok(());
    }
    // A training process: one job ("<job>") or a spatial pair
    // ("<a>+<b>", one joint process).
    let Some(members) = members_of(&t.task_id) else {
        return Ok(());
    };
    let ckpt = Some(t.checkpoint_path.as_str()).filter(|c| !c.is_empty());
    if t.jobs.is_empty() {
        // An agent that reports no per-job progress.
        if live.contains_key(&members[0]) {
            p.record_progress(members[0], t.iteration, ckpt, now)
                .await?;
        }
    }
    for r in &t.jobs {
        let Ok(j) = r.job_id.parse::<JobId>() else {
            continue;
        };
        if !r.evals.is_empty() {
            evals.insert(j, r.evals.clone());
        }
        // Watched (eval-only) jobs are not trained by this process.
        if members.contains(&j) && live.contains_key(&j) {
            p.record_progress(j, r.iteration, ckpt, now).await?;
        }
    }
    let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
    // One job, not merged, running: it trains alone.
    let alone = match members[..] {
        [id] if phase == pb::TaskPhase::Running
            && !merges.iter().any(|m| m.active && (m.a == id || m.b == id)) =>
        {
            live.get(&id).map(|job| (id, job))
        }
        _ => None,
    };
    // A data-parallel job training alone teaches the estimator's
    // table its measured step time, once per process (the LUT is
    // updated online; merged and pipeline jobs are left out: their
    // batch or layout is not one job's).
    if let Some((id, job)) = alone
        && t.step_time_s > 0.0
        && est.is_remote()
        && !job.spec.resources.pipeline_parallel
        && let Some(g) = n.record.gpus.first()
        && est.first_sample_of(&t.task_id, t.pid)
    {
        let gpus = t.gpu_uuids.len().max(1) as u32;
        let sample = running_step_time_sample(lut, job, &g.model, gpus, t.step_time_s);
        if let Err(e) = est.record_step_times(vec![sample]).await {
            tracing::warn!(job_id = %id, error = %e, "step time not recorded");
        }
    }
    // A job training alone refreshes its estimate from its own loss
    // trace (merged jobs learn on transferred curves: left as is).
    if let Some((id, job)) = alone
        && let Some(e) = refresh_estimate(p, job, t, estimates.get(&id), now).await?
    {
        estimates.insert(id, e);
    }
    for &id in &members {
        let Some(job) = live.get(&id) else { continue };
        if job.state != JobState::Running {
            continue;
        }
        // A job completes when its own task reached its target, even
        // while the joint process trains its partner on.
        let output = t.outputs.get(&id.to_string()).cloned();
        let finished = output.is_some() || phase == pb::TaskPhase::Succeeded;
        if finished {
            let output = output.unwrap_or_default();
            p.complete_job(id, &output, now).await?;
            tracing::info!(job_id = %id, node_id = %n.record.id, %output, "job completed");
            live.remove(&id);
            report.completed += 1;
            continue;
        }
        if phase != pb::TaskPhase::Failed {
            continue;
        }
        if members.len() > 1
            && let Some(m) = merges.iter().find(|m| m.active && m.a == members[0])
        {
            p.guard_merge(m, Some("the joint process failed"), now)
                .await?;
            split_now.insert(m.id);
        }
        let cfg = &state.config.scheduling;
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
        // Held back retry_backoff · 2^(retries − 1) before the next try.
        let Some(retries) = p.note_failure(id, t.pid, cfg.retry_backoff, now).await? else {
            continue; // this process's failure was counted already
        };
        if retries > cfg.max_retries {
            let reason = format!("{what}\n(gave up after {} retries)", cfg.max_retries);
            p.transition_job(id, JobState::Failed, &reason, now).await?;
            tracing::warn!(job_id = %id, retries, "job failed");
            live.remove(&id);
            report.failed += 1;
        } else {
            let wait = cfg.retry_backoff.saturating_mul(1 << (retries - 1).min(10));
            let reason = format!(
                "{what}\n(retry {retries} of {} in {wait:?}, from the last checkpoint)",
                cfg.max_retries
            );
            p.transition_job(id, JobState::Queued, &reason, now).await?;
            tracing::warn!(job_id = %id, retries, ?wait, "training process failed; will retry");
            state.metrics.update(|m| m.retries += 1);
            if let Some(j) = live.get_mut(&id) {
                j.state = JobState::Queued;
            }
        }
    }
    Ok(())
}

/// A profiling run's measured step time as a sample for the estimator's
/// table: 1 GPU (4 for a pipeline job) at the job's global batch, AMP as
/// the shipped profiles.
fn profile_step_time_sample(
    job: &JobRecord,
    gpu_model: &str,
    step_time_s: f64,
) -> pb::StepTimeSample {
    let pipeline = job.spec.resources.pipeline_parallel;
    pb::StepTimeSample {
        key: Some(pb::ThroughputKey {
            model: job.spec.model.clone(),
            gpu_type: analytic::gpu_family(gpu_model),
            placement: if pipeline { "4" } else { "1" }.into(),
            local_batch_size: job.spec.hyperparameters.global_batch_size,
            gradient_accumulation: 1,
            amp: true,
            pipeline_parallel: pipeline,
            ..Default::default()
        }),
        step_time_seconds: step_time_s,
        sync_time_seconds: 0.0,
    }
}

/// A running data-parallel job's measured step time as a sample for the
/// estimator's table: the job's model and global batch on `gpus` GPUs of
/// one node of `gpu_model` (AMP, as the shipped profiles), under the local
/// batch and gradient accumulation the table itself picks for that batch
/// (so the sample lands on the key the table is asked for).
fn running_step_time_sample(
    lut: &Lut,
    job: &JobRecord,
    gpu_model: &str,
    gpus: u32,
    step_time_s: f64,
) -> pb::StepTimeSample {
    let gpu_type = analytic::gpu_family(gpu_model);
    let placement = gpus.clamp(1, 9).to_string();
    let global = job.spec.hyperparameters.global_batch_size.max(1);
    let variant = Variant {
        amp: true,
        ..Default::default()
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
            amp: true,
            ..Default::default()
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
fn finishing<'a>(
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
            let total = expected_iterations(j, estimates.get(&id));
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
enum GuardVerdict {
    /// Not two epochs of every watched job yet.
    Wait,
    /// Every watched job's accuracy improved from its first to its second
    /// epoch: the guard checks no more.
    Keep,
    /// A watched job's accuracy did not improve: why.
    Split(String),
}

/// The merge guard (Ymir §4.3) on the evaluation values reported so far,
/// oldest first, of each watched job still running: B for a temporal merge
/// (its accuracy with A's weights, evaluated while A trains), both jobs for
/// a spatial one. One job that does not improve splits the merge at once.
fn guard_verdict(mode: MergeMode, watched: &[(JobId, Option<&[f64]>)]) -> GuardVerdict {
    let mut waiting = watched.is_empty();
    for (job, evals) in watched {
        match evals {
            Some([first, second, ..]) if second <= first => {
                let whose = if mode == MergeMode::Temporal {
                    format!("job {job}'s (evaluated with A's weights)")
                } else {
                    format!("job {job}'s")
                };
                return GuardVerdict::Split(format!(
                    "{whose} accuracy did not improve in its first two epochs ({first:.4} → {second:.4})"
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

/// The process of a training task: `<job>`, or `<a>+<b>` for the joint
/// process of a spatial merge. None for anything else.
fn members_of(task_id: &str) -> Option<Vec<JobId>> {
    match task_id.split_once('+') {
        Some((a, b)) => Some(vec![a.parse().ok()?, b.parse().ok()?]),
        None => Some(vec![task_id.parse().ok()?]),
    }
}

fn time_mode(m: MergeMode) -> times::MergeMode {
    match m {
        MergeMode::Spatial => times::MergeMode::Spatial,
        _ => times::MergeMode::Temporal,
    }
}

fn policy_mode(m: times::MergeMode) -> MergeMode {
    match m {
        times::MergeMode::Spatial => MergeMode::Spatial,
        times::MergeMode::Temporal => MergeMode::Temporal,
    }
}

/// The fitted Eq. 3 curve stored with a job's estimates.
fn curve_from_json(v: &serde_json::Value) -> Option<LossCurve> {
    let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    Some(LossCurve {
        beta0: f("beta0")?,
        beta1: f("beta1")?,
        beta2: f("beta2")?,
        beta3: f("beta3")?,
        quality: f("quality").unwrap_or(0.0),
    })
}

/// What [`push_plans`] turns into desired tasks.
struct PlanView<'a> {
    live: &'a BTreeMap<JobId, JobRecord>,
    assignments: &'a [Assignment],
    progress: &'a BTreeMap<JobId, (u64, Option<String>)>,
    merges: &'a [MergeRecord],
    /// B of a temporal merge whose A completed: A's output weights.
    init_weights: &'a BTreeMap<JobId, String>,
}

/// The desired set of every node the registry knows (empty for a node the
/// plan gives nothing).
fn desired_sets(state: &AppState, v: &PlanView<'_>) -> BTreeMap<NodeId, Vec<pb::DesiredTask>> {
    let nodes = state.registry.snapshot();
    let mut per_node: BTreeMap<NodeId, Vec<pb::DesiredTask>> = nodes
        .iter()
        .map(|n| (n.record.id.clone(), Vec::new()))
        .collect();
    let mut emitted: BTreeSet<String> = BTreeSet::new();
    for a in v.assignments {
        let Some(job) = v.live.get(&a.job) else {
            continue;
        };
        let merge = v
            .merges
            .iter()
            .find(|m| m.active && (m.a == a.job || m.b == a.job));
        let resume_of = |id: &JobId| v.progress.get(id).and_then(|p| p.1.clone());
        let mut task = pb::DesiredTask {
            task_id: a.job.to_string(),
            job_ids: vec![a.job.to_string()],
            mode: pb::TaskMode::Train as i32,
            phase: pb::DesiredPhase::Running as i32,
            gpu_uuids: a.gpus.iter().map(|g| g.0.clone()).collect(),
            command: job.spec.launch.command.clone(),
            env: job.spec.launch.env.clone().into_iter().collect(),
            working_dir: job.spec.launch.working_dir.clone().unwrap_or_default(),
            resume_path: resume_of(&a.job).unwrap_or_default(),
            initial_weights_path: String::new(),
            world_size: a.gpus.len() as u32,
            rank_offset: 0,
            master_addr: String::new(),
            master_port: 0,
            tasks: vec![trainer_task(job)],
            pipeline_parallel: job.spec.resources.pipeline_parallel,
        };
        if a.profile {
            // A profiling run is a process of its own ("<job>-profile").
            task.task_id = format!("{}{PROFILE_SUFFIX}", a.job);
            task.mode = pb::TaskMode::Profile as i32;
            task.resume_path.clear();
        } else if let Some(m) = merge {
            match m.mode {
                MergeMode::Spatial => {
                    // One joint process for both (A's command and
                    // environment); a partner that finished is carried by
                    // the process's checkpoint.
                    task.task_id = format!("{}+{}", m.a, m.b);
                    task.job_ids = vec![m.a.to_string(), m.b.to_string()];
                    task.tasks = [m.a, m.b]
                        .iter()
                        .filter_map(|id| v.live.get(id))
                        .map(trainer_task)
                        .collect();
                    if let Some(lead) = v.live.get(&m.a) {
                        task.command = lead.spec.launch.command.clone();
                        task.env = lead.spec.launch.env.clone().into_iter().collect();
                    }
                    task.resume_path = resume_of(&m.a)
                        .or_else(|| resume_of(&m.b))
                        .unwrap_or_default();
                }
                MergeMode::Temporal if m.a == a.job => {
                    // A trains; B is evaluated with A's weights every epoch
                    // (the guard watches it).
                    if let Some(b) = v.live.get(&m.b) {
                        let mut watch = trainer_task(b);
                        watch.eval_only = true;
                        task.tasks.push(watch);
                    }
                }
                _ => {
                    if let Some(w) = v.init_weights.get(&a.job) {
                        task.initial_weights_path.clone_from(w);
                    }
                }
            }
        }
        if emitted.insert(task.task_id.clone()) {
            per_node.entry(a.node.clone()).or_default().push(task);
        }
    }
    per_node
}

/// Sends every connected node its complete desired set.
fn push_plans(state: &AppState, v: &PlanView<'_>, generation: i64) {
    for (node, tasks) in desired_sets(state, v) {
        let n = tasks.len();
        let msg = pb::SchedulerMessage {
            msg: Some(pb::scheduler_message::Msg::Plan(pb::NodePlan {
                generation,
                tasks,
            })),
        };
        if !state.registry.send(&node, msg) {
            tracing::debug!(node_id = %node, tasks = n, "node not connected; it gets the plan on the next round");
        }
    }
}

/// Sends `PrepareSwitch` hints for the tasks a predicted plan would start:
/// training tasks none of whose jobs holds GPUs now (a start or a resume,
/// not a kept or moved placement), all of whose jobs' trainers implement
/// standby (`launch.prewarm`). Returns how many were sent.
fn send_switch_hints(
    state: &AppState,
    v: &PlanView<'_>,
    held: &BTreeMap<JobId, &Assignment>,
    switch_at: DateTime<Utc>,
) -> usize {
    let mut sent = 0;
    for (node, tasks) in desired_sets(state, v) {
        for task in tasks {
            let jobs: Vec<JobId> = task.job_ids.iter().filter_map(|j| j.parse().ok()).collect();
            let starts = task.mode == pb::TaskMode::Train as i32
                && !jobs.is_empty()
                && jobs.iter().all(|j| {
                    !held.contains_key(j) && v.live.get(j).is_some_and(|r| r.spec.launch.prewarm)
                });
            if !starts {
                continue;
            }
            let task_id = task.task_id.clone();
            let msg = pb::SchedulerMessage {
                msg: Some(pb::scheduler_message::Msg::Hint(pb::Hint {
                    hint: Some(pb::hint::Hint::PrepareSwitch(pb::PrepareSwitch {
                        task_id: task_id.clone(),
                        switch_at: Some(fmsched_proto::convert::timestamp_to_proto(switch_at)),
                        task: Some(task),
                    })),
                })),
            };
            if state.registry.send(&node, msg) {
                tracing::info!(task = %task_id, node_id = %node, %switch_at, "pipeline switch: standby hint sent");
                sent += 1;
            }
        }
    }
    if sent > 0 {
        state.metrics.update(|m| m.prewarm_hints += sent as u64);
    }
    sent
}

/// Runs rounds every `scheduling.round_interval()` until the task is aborted;
/// with a `prewarm_lead`, a look-ahead round that long before each round.
/// The leases of a new plan (Themis; none when `lease_s` is 0). A job that
/// keeps its GPUs keeps its lease until it runs out; one that keeps them
/// after its lease ran out won them again in the auction and gets a new
/// lease, as does every job placed anew.
fn leases_after(
    assignments: &[Assignment],
    held: &BTreeMap<JobId, &Assignment>,
    service: &BTreeMap<JobId, JobService>,
    lease_s: f64,
    now: DateTime<Utc>,
) -> Vec<(JobId, DateTime<Utc>)> {
    if lease_s <= 0.0 {
        return Vec::new();
    }
    let fresh = now + chrono::Duration::milliseconds((lease_s * 1000.0) as i64);
    assignments
        .iter()
        .filter(|a| !a.profile)
        .map(|a| {
            let kept = held
                .get(&a.job)
                .is_some_and(|h| h.node == a.node && h.gpus == a.gpus);
            let running_lease = service
                .get(&a.job)
                .and_then(|s| s.lease_until)
                .filter(|&t| kept && t > now);
            (a.job, running_lease.unwrap_or(fresh))
        })
        .collect()
}

pub async fn scheduling_loop(state: AppState) {
    let lut = match analytic::default_lut() {
        Ok(l) => Arc::new(l),
        Err(e) => {
            tracing::error!(error = %e, "no throughput table; scheduling disabled");
            return;
        }
    };
    let e = &state.config.estimates;
    let est = match Estimates::new(e.endpoint.as_deref(), e.timeout) {
        Ok(est) => est,
        Err(err) => {
            tracing::error!(error = %err, "estimator client; scheduling disabled");
            return;
        }
    };
    if est.is_remote() {
        tracing::info!(endpoint = ?e.endpoint, "estimates from the estimator service");
    }
    let lead = state.config.scheduling.effective_prewarm_lead();
    if !lead.is_zero() {
        tracing::info!(
            ?lead,
            "pipeline switch: look-ahead rounds send standby hints"
        );
    }
    let mut tick = tokio::time::interval(state.config.scheduling.round_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !state.leader.load(std::sync::atomic::Ordering::SeqCst) {
            continue; // a standby decides nothing
        }
        let started = std::time::Instant::now();
        let result = run_round(&state, &lut, &est, RoundKind::Commit).await;
        let took = started.elapsed().as_secs_f64();
        state.metrics.update(|m| {
            m.rounds += 1;
            m.round_seconds_sum += took;
            m.last_round_seconds = took;
        });
        match result {
            Ok(r) => tracing::debug!(generation = r.generation, jobs = r.jobs, running = r.running,
                completed = r.completed, failed = r.failed, took = ?started.elapsed(), "scheduling round"),
            Err(e) => tracing::warn!(error = %e, "scheduling round failed; retrying next interval"),
        }
        // Ymir §6.2: predict the next round `lead` before it and let the
        // tasks it starts prepare their data loaders in standby.
        if lead.is_zero() {
            continue;
        }
        let interval = state.config.scheduling.round_interval();
        tokio::time::sleep_until((started + interval - lead).into()).await;
        if !state.leader.load(std::sync::atomic::Ordering::SeqCst) {
            continue;
        }
        let switch_at = Utc::now() + lead;
        match run_round(&state, &lut, &est, RoundKind::LookAhead { switch_at }).await {
            Ok(r) if r.hints > 0 => tracing::debug!(hints = r.hints, "look-ahead round"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "look-ahead round failed; no standby hints this round")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Themis leases in the service: kept GPUs keep their lease until it
    /// runs out, kept GPUs past it get a new one (won again), moved or new
    /// jobs get a new one, profiling runs none, and no lease without a
    /// leasing policy.
    #[test]
    fn leases_run_out_renew_when_won_again_and_start_with_new_placements() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:10:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: i64| now + chrono::Duration::seconds(s);
        let node = |n: &str| NodeId::try_from(n.to_string()).unwrap();
        let assign = |j: u8, n: &str, gpus: &[&str]| Assignment {
            job: job(j),
            node: node(n),
            gpus: gpus.iter().map(|g| GpuUuid(g.to_string())).collect(),
            profile: false,
        };
        let old = [
            assign(1, "a", &["g0"]),
            assign(2, "a", &["g1"]),
            assign(3, "a", &["g2"]),
        ];
        let held: BTreeMap<JobId, &Assignment> = old.iter().map(|a| (a.job, a)).collect();
        let lease = |t: Option<DateTime<Utc>>| JobService {
            lease_until: t,
            ..Default::default()
        };
        let service: BTreeMap<JobId, JobService> = [
            (job(1), lease(Some(at(300)))), // running lease
            (job(2), lease(Some(at(-1)))),  // ran out
            (job(3), lease(Some(at(300)))), // moves
        ]
        .into();
        let mut new = vec![
            assign(1, "a", &["g0"]),
            assign(2, "a", &["g1"]),
            assign(3, "b", &["g0"]),
            assign(4, "a", &["g3"]),
        ];
        new.push(Assignment {
            profile: true,
            ..assign(5, "b", &["g1"])
        });
        let got: BTreeMap<JobId, DateTime<Utc>> = leases_after(&new, &held, &service, 600.0, now)
            .into_iter()
            .collect();
        assert_eq!(got.len(), 4, "no lease for a profiling run: {got:?}");
        assert_eq!(got[&job(1)], at(300));
        assert_eq!(got[&job(2)], at(600));
        assert_eq!(got[&job(3)], at(600));
        assert_eq!(got[&job(4)], at(600));
        assert!(leases_after(&new, &held, &service, 0.0, now).is_empty());
    }

    fn job(n: u8) -> JobId {
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
                curve: None,
                fisher: Vec::new(),
                fisher_repeat: Vec::new(),
                step_time_s: None,
                note: String::new(),
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

    #[test]
    fn the_guard_waits_for_two_epochs_of_every_watched_job() {
        let (a, b) = (job(1), job(2));
        let one = [0.6];
        let two = [0.6, 0.7];
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[(b, None)]),
            GuardVerdict::Wait
        );
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[(b, Some(&one))]),
            GuardVerdict::Wait
        );
        // Spatial: one job improving is not enough while the other is unknown.
        assert_eq!(
            guard_verdict(MergeMode::Spatial, &[(a, Some(&two)), (b, Some(&one))]),
            GuardVerdict::Wait
        );
        assert_eq!(
            guard_verdict(MergeMode::Spatial, &[(a, Some(&two)), (b, Some(&two))]),
            GuardVerdict::Keep
        );
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[(b, Some(&two))]),
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
        let GuardVerdict::Split(why) =
            guard_verdict(MergeMode::Spatial, &[(a, Some(&better)), (b, Some(&flat))])
        else {
            panic!("a stalled task must split the pair")
        };
        assert!(
            why.contains(&b.to_string()) && why.contains("0.5000 → 0.5000"),
            "{why}"
        );
        assert!(matches!(
            guard_verdict(MergeMode::Spatial, &[(a, Some(&worse)), (b, None)]),
            GuardVerdict::Split(_)
        ));
        // Temporal: B's accuracy with A's weights.
        let GuardVerdict::Split(why) = guard_verdict(MergeMode::Temporal, &[(b, Some(&worse))])
        else {
            panic!("no gain for B must split A ↦ B")
        };
        assert!(why.contains("evaluated with A's weights"), "{why}");
    }
}
