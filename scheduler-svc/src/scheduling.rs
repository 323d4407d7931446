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
use crate::persistence::{Assignment, JobRecord, PersistenceError};

/// Default iterations of a job whose target names neither iterations nor
/// epochs with a known dataset size (it stops on its metric).
const DEFAULT_ITERATIONS: u64 = 1000;

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
    let held: BTreeMap<JobId, &Assignment> =
        current.assignments.iter().map(|a| (a.job, a)).collect();
    // Jobs in their retry backoff wait outside the snapshot.
    let held_back: BTreeSet<JobId> = p.retry_holds(now).await?.into_iter().collect();
    let ids: Vec<JobId> = live
        .keys()
        .copied()
        .filter(|id| !held_back.contains(id))
        .collect();
    let mut jobs = Vec::with_capacity(ids.len());
    for id in &ids {
        let j = &live[id];
        let done = progress.get(id).map_or(0, |p| p.0);
        let remaining = total_iterations(j).saturating_sub(done).max(1);
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
                gpus: if n.state == NodeState::Suspect {
                    current
                        .assignments
                        .iter()
                        .filter(|a| a.node == n.record.id && live.contains_key(&a.job))
                        .map(|a| a.gpus.len() as u32)
                        .sum()
                } else {
                    n.record.gpus.len() as u32
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
    let plan: Plan = tokio::task::spawn_blocking(move || {
        let policy = by_name(&policy_name).expect("validated at start-up");
        policy.schedule(&snap2)
    })
    .await
    .map_err(|e| RoundError::Join(e.to_string()))?;
    if let Err(e) = plan.consistency_check(&snap) {
        // Never push a plan that breaks an invariant; keep the old one.
        tracing::error!(error = %e, "policy produced an inconsistent plan; keeping the current one");
        return Ok(report);
    }

    // ---- 4. apply ---------------------------------------------------------
    // Concrete GPUs: a job that keeps its node and size keeps its GPUs.
    let mut used: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut assignments = Vec::new();
    let mut pending = Vec::new();
    for e in &plan.entries {
        for &k in &e.jobs {
            let id = ids[k];
            match (held.get(&id), e.placement.as_slice()) {
                (Some(a), [(n, g)])
                    if node_index.get(&a.node) == Some(n) && a.gpus.len() as u32 == *g =>
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
            });
        }
    }
    let running: BTreeSet<JobId> = assignments.iter().map(|a| a.job).collect();
    let mut transitions = Vec::new();
    for (id, j) in &live {
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
    let generation = p.store_plan(&assignments, &transitions, now).await?;
    for (id, to, reason) in &transitions {
        tracing::info!(job_id = %id, to = %to, %reason, generation, "job state");
    }
    push_plans(state, &live, &assignments, &progress, generation);
    report.generation = generation;
    report.jobs = live.len();
    report.running = assignments.len();
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
        per_node
            .entry(a.node.clone())
            .or_default()
            .push(pb::DesiredTask {
                task_id: a.job.to_string(),
                job_ids: vec![a.job.to_string()],
                mode: pb::TaskMode::Train as i32,
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
        let started = std::time::Instant::now();
        match run_round(&state, &lut).await {
            Ok(r) => tracing::debug!(generation = r.generation, jobs = r.jobs, running = r.running,
                completed = r.completed, failed = r.failed, took = ?started.elapsed(), "scheduling round"),
            Err(e) => tracing::warn!(error = %e, "scheduling round failed; retrying next interval"),
        }
    }
}
