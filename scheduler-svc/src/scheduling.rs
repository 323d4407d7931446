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
//! Not here yet: profiling runs before the first allocation (new jobs are
//! queued directly), merges (no transfer estimates are collected yet, so no
//! candidates), retries of failed processes, leader election.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::Utc;
use estimator_svc::analytic;
use estimator_svc::lut::{Lut, Variant, packed_placement};
use fmsched_core::policy::baselines::by_name;
use fmsched_core::policy::{NodeCap, Plan, SchedJob, Snapshot, ymir_allocations};
use fmsched_core::{GpuUuid, JobId, JobState, NodeId, NodeState};
use fmsched_proto::v1 as pb;

use crate::api::AppState;
use crate::persistence::{Assignment, Estimate, JobRecord, PersistenceError};

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
    e.family(
        "fmsched_queue_length",
        "gauge",
        "Live jobs without GPUs after the last round.",
    )
    .sample("fmsched_queue_length", &[], v.queue_length as f64);
    e.family("fmsched_rounds_total", "counter", "Scheduling rounds run.")
        .sample("fmsched_rounds_total", &[], v.rounds as f64);
    e.family(
        "fmsched_round_duration_seconds_sum",
        "counter",
        "Total seconds spent in rounds.",
    )
    .sample(
        "fmsched_round_duration_seconds_sum",
        &[],
        v.round_seconds_sum,
    );
    e.family(
        "fmsched_round_duration_seconds_last",
        "gauge",
        "Seconds of the last round.",
    )
    .sample(
        "fmsched_round_duration_seconds_last",
        &[],
        v.last_round_seconds,
    );
    e.family(
        "fmsched_solver_seconds_sum",
        "counter",
        "Total seconds in the policy (MILP solve for Ymir).",
    )
    .sample("fmsched_solver_seconds_sum", &[], v.solver_seconds_sum);
    e.family(
        "fmsched_solver_seconds_last",
        "gauge",
        "Seconds of the last policy call.",
    )
    .sample("fmsched_solver_seconds_last", &[], v.last_solver_seconds);
    e.family(
        "fmsched_solver_fallbacks_total",
        "counter",
        "Rounds whose MILP hit its time limit and used the greedy fallback.",
    )
    .sample("fmsched_solver_fallbacks_total", &[], v.fallbacks as f64);
    e.family(
        "fmsched_solver_model_variables",
        "gauge",
        "Variables of the last MILP.",
    )
    .sample(
        "fmsched_solver_model_variables",
        &[],
        v.model_variables as f64,
    );
    e.family(
        "fmsched_merges_total",
        "counter",
        "Merges decided, by mode.",
    );
    for mode in ["temporal", "spatial"] {
        e.sample("fmsched_merges_total", &[("mode", mode)], 0.0);
    }
    e.family(
        "fmsched_context_switches_total",
        "counter",
        "Jobs started, moved or resized (each costs a checkpoint and a restart).",
    )
    .sample(
        "fmsched_context_switches_total",
        &[],
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
    e.family(
        "fmsched_retries_total",
        "counter",
        "Failed training processes retried.",
    )
    .sample("fmsched_retries_total", &[], v.retries as f64);
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

fn trainer_task(job: &JobRecord) -> pb::TrainerTask {
    let s = &job.spec;
    pb::TrainerTask {
        job_id: job.id.to_string(),
        model: s.model.clone(),
        task: s.dataset.task.clone(),
        dataset_uri: s.dataset.uri.clone(),
        global_batch_size: s.hyperparameters.global_batch_size,
        max_iterations: s.target.max_iterations.unwrap_or(0),
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
) -> Result<bool, RoundError> {
    use estimator_svc::loss_curve::{PLATEAU_THRESHOLD, fit_loss_curve, iterations_to_converge};
    let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
    if !matches!(phase, pb::TaskPhase::Succeeded | pb::TaskPhase::Failed) {
        return Ok(false);
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
    Ok(true)
}

/// Whether any GPU of the node reports Xid or uncorrectable ECC errors.
fn faulty(n: &crate::registry::LiveNode) -> bool {
    n.telemetry
        .values()
        .any(|t| t.xid_errors > 0 || t.ecc_uncorrected_errors > 0)
}

/// One scheduling round (see the module docs).
pub async fn run_round(state: &AppState, lut: &Arc<Lut>) -> Result<RoundReport, RoundError> {
    let p = &state.persistence;
    let now = Utc::now();
    let mut report = RoundReport::default();

    // ---- 1. observe -------------------------------------------------------
    let nodes = state.registry.snapshot();
    let mut live: BTreeMap<JobId, JobRecord> = p
        .live_jobs()
        .await?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    for n in &nodes {
        for t in &n.observed_tasks {
            // Profiling runs: "<job>-profile".
            if let Some(job_part) = t.task_id.strip_suffix(PROFILE_SUFFIX) {
                let Ok(id) = job_part.parse::<JobId>() else {
                    continue;
                };
                // Only a finished run queues the job (a running one leaves
                // it profiling: it must not be scheduled yet).
                if live
                    .get(&id)
                    .is_some_and(|j| j.state == JobState::Profiling)
                    && observe_profile(state, id, t, now).await?
                    && let Some(j) = live.get_mut(&id)
                {
                    j.state = JobState::Queued;
                }
                continue;
            }
            let Ok(id) = t.task_id.parse::<JobId>() else {
                continue;
            };
            let Some(job) = live.get(&id) else { continue };
            let ckpt = Some(t.checkpoint_path.as_str()).filter(|c| !c.is_empty());
            p.record_progress(id, t.iteration, ckpt, now).await?;
            let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
            if job.state == JobState::Running {
                match phase {
                    pb::TaskPhase::Succeeded => {
                        let output = t.outputs.get(&t.task_id).cloned().unwrap_or_default();
                        p.complete_job(id, &output, now).await?;
                        tracing::info!(job_id = %id, node_id = %n.record.id, %output, "job completed");
                        live.remove(&id);
                        report.completed += 1;
                    }
                    pb::TaskPhase::Failed => {
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
                        let Some(retries) =
                            p.note_failure(id, t.pid, cfg.retry_backoff, now).await?
                        else {
                            continue; // this process's failure was counted already
                        };
                        if retries > cfg.max_retries {
                            let reason =
                                format!("{what}\n(gave up after {} retries)", cfg.max_retries);
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
                    _ => {}
                }
            }
        }
    }

    // ---- 2. prepare -------------------------------------------------------
    let progress = p.progress().await?;
    let current = p.current_plan().await?;
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
    let estimates = p.estimates().await?;
    // Jobs in their retry backoff wait outside the snapshot; so do jobs not
    // profiled yet.
    let held_back: BTreeSet<JobId> = p.retry_holds(now).await?.into_iter().collect();
    let profiling_on = state.config.scheduling.profiling;
    let ids: Vec<JobId> = live
        .iter()
        .filter(|(id, j)| {
            let unprofiled =
                profiling_on && matches!(j.state, JobState::Submitted | JobState::Profiling);
            !(held_back.contains(id) || unprofiled)
        })
        .map(|(id, _)| *id)
        .collect();
    let mut jobs = Vec::with_capacity(ids.len());
    for id in &ids {
        let j = &live[id];
        let done = progress.get(id).map_or(0, |p| p.0);
        // Iterations to converge from the profile's fitted curve (Eq. 2) when
        // the job names no iteration budget.
        let total = match (
            j.spec.target.max_iterations,
            estimates.get(id).and_then(|e| e.iterations),
        ) {
            (None, Some(k)) => k,
            _ => total_iterations(j),
        };
        let remaining = total.saturating_sub(done).max(1);
        let layers = analytic::layers_of(&j.spec.model).unwrap_or(12);
        let variant = Variant {
            pipeline: j.spec.resources.pipeline_parallel,
            amp: true,
            ..Default::default()
        };
        let remaining_s = allocations
            .iter()
            .map(|&a| {
                if a == 0 {
                    return f64::INFINITY;
                }
                lut.iteration_time_on(
                    &j.spec.model,
                    &gpu_family,
                    &packed_placement(a, per_node),
                    j.spec.hyperparameters.global_batch_size,
                    &variant,
                    layers,
                )
                .ok()
                .filter(|it| it.feasible)
                .map_or(f64::INFINITY, |it| it.seconds * remaining as f64)
            })
            .collect();
        let placement: Vec<(usize, u32)> = held
            .get(id)
            .and_then(|a| node_index.get(&a.node).map(|&k| (k, a.gpus.len() as u32)))
            .into_iter()
            .collect();
        jobs.push(SchedJob {
            id: id.to_string(),
            model: j.spec.model.clone(),
            task: j.spec.dataset.task.clone(),
            sharing: j.spec.sharing,
            pipeline: j.spec.resources.pipeline_parallel,
            requested_gpus: j.spec.resources.max_gpus,
            min_gpus: j.spec.resources.min_gpus,
            max_gpus: j.spec.resources.max_gpus,
            submitted_at: (j.created_at - now).num_milliseconds() as f64 / 1000.0,
            progress: done as f64 / total_iterations(j).max(1) as f64,
            attained_gpu_s: 0.0,
            executed_s: 0.0,
            current_gpus: placement.iter().map(|p| p.1).sum(),
            current_placement: placement,
            remaining_s,
            restart_s: 60.0,
            lease_until: 0.0,
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
        candidates: Vec::new(),
        merges: Vec::new(),
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
    // Concrete GPUs: a job that keeps its node and size keeps its GPUs
    // (unless a profiling run took one of them).
    let mut used: BTreeMap<usize, BTreeSet<String>> = reserved.clone();
    let mut assignments = Vec::new();
    let mut pending = Vec::new();
    for e in &plan.entries {
        for &k in &e.jobs {
            let id = ids[k];
            match (held.get(&id), e.placement.as_slice()) {
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
                    assignments.push((*a).clone());
                }
                // Multi-node placements are not driven yet: the job waits.
                (_, [(n, g)]) => pending.push((id, *n, *g)),
                _ => {}
            }
        }
    }
    for (id, n, g) in pending {
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
            assignments.push(Assignment {
                job: id,
                node: available[n].record.id.clone(),
                gpus: free,
                profile: false,
            });
        }
    }
    let running: BTreeSet<JobId> = assignments.iter().map(|a| a.job).collect();
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
    let training = assignments.len();
    assignments.extend(profiling);
    let generation = p.store_plan(&assignments, &transitions, now).await?;
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
    state.metrics.update(|m| {
        m.context_switches += switches;
        m.queue_length = queued;
        m.completed += completed;
        m.failed += failed;
    });
    for (id, to, reason) in &transitions {
        tracing::info!(job_id = %id, to = %to, %reason, generation, "job state");
    }
    push_plans(state, &live, &assignments, &progress, generation);
    report.generation = generation;
    report.jobs = live.len();
    report.running = training;
    Ok(report)
}

/// Sends every connected node its complete desired set.
fn push_plans(
    state: &AppState,
    live: &BTreeMap<JobId, JobRecord>,
    assignments: &[Assignment],
    progress: &BTreeMap<JobId, (u64, Option<String>)>,
    generation: i64,
) {
    let nodes = state.registry.snapshot();
    let mut per_node: BTreeMap<NodeId, Vec<pb::DesiredTask>> = nodes
        .iter()
        .map(|n| (n.record.id.clone(), Vec::new()))
        .collect();
    for a in assignments {
        let Some(job) = live.get(&a.job) else {
            continue;
        };
        let resume = progress
            .get(&a.job)
            .and_then(|p| p.1.clone())
            .unwrap_or_default();
        // A profiling run is a process of its own ("<job>-profile").
        let (task_id, mode, resume) = if a.profile {
            (
                format!("{}{PROFILE_SUFFIX}", a.job),
                pb::TaskMode::Profile,
                String::new(),
            )
        } else {
            (a.job.to_string(), pb::TaskMode::Train, resume)
        };
        per_node
            .entry(a.node.clone())
            .or_default()
            .push(pb::DesiredTask {
                task_id,
                job_ids: vec![a.job.to_string()],
                mode: mode as i32,
                phase: pb::DesiredPhase::Running as i32,
                gpu_uuids: a.gpus.iter().map(|g| g.0.clone()).collect(),
                command: job.spec.launch.command.clone(),
                env: job.spec.launch.env.clone().into_iter().collect(),
                working_dir: job.spec.launch.working_dir.clone().unwrap_or_default(),
                resume_path: resume,
                initial_weights_path: String::new(),
                world_size: a.gpus.len() as u32,
                rank_offset: 0,
                master_addr: String::new(),
                master_port: 0,
                tasks: vec![trainer_task(job)],
            });
    }
    for (node, tasks) in per_node {
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

/// Runs rounds every `scheduling.interval` until the task is aborted.
pub async fn scheduling_loop(state: AppState) {
    let lut = match analytic::default_lut() {
        Ok(l) => Arc::new(l),
        Err(e) => {
            tracing::error!(error = %e, "no throughput table; scheduling disabled");
            return;
        }
    };
    let mut tick = tokio::time::interval(state.config.scheduling.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !state.leader.load(std::sync::atomic::Ordering::SeqCst) {
            continue; // a standby decides nothing
        }
        let started = std::time::Instant::now();
        let result = run_round(&state, &lut).await;
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
    }
}
