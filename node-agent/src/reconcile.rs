//! The agent's reconciler: makes this node's processes match the newest
//! `NodePlan` (the node's complete desired state) and reports what it
//! observes.
//!
//! Per desired task, every step idempotent (plans are repeated):
//! - `RUNNING`, not running here → launch (resuming from the plan's
//!   checkpoint, else from the newest one this node took of the task);
//! - `RUNNING` on other GPUs than it has → suspend (checkpoint), relaunch on
//!   the new GPUs from that checkpoint;
//! - `SUSPENDED`, or absent from the plan → suspend if running.
//!
//! A process that exits by itself is reported (`SUCCEEDED` / `FAILED` with
//! its exit code) and not restarted until a newer plan asks again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fmsched_core::trainer::TaskAssignment;
use fmsched_proto::v1 as pb;

use crate::driver::{LaunchSpec, ProcessDriver};
use crate::gpu::GpuBackend;

/// What the reconciler remembers of a task between plans.
#[derive(Clone, Debug, Default)]
struct Known {
    generation: i64,
    gpus: Vec<u32>,
    job_ids: Vec<String>,
    /// Newest checkpoint taken here.
    checkpoint: Option<(PathBuf, u64)>,
    suspended: bool,
    pid: u32,
    profile: bool,
}

pub struct Reconciler {
    driver: Arc<ProcessDriver>,
    gpus: Arc<dyn GpuBackend>,
    known: tokio::sync::Mutex<BTreeMap<String, Known>>,
}

fn assignment(t: &pb::TrainerTask) -> TaskAssignment {
    TaskAssignment {
        job_id: t.job_id.clone(),
        model: t.model.clone(),
        task: t.task.clone(),
        dataset_uri: t.dataset_uri.clone(),
        global_batch_size: t.global_batch_size,
        max_iterations: t.max_iterations,
        metric: Some(t.metric.clone()).filter(|m| !m.is_empty()),
        metric_target: Some(t.metric_target).filter(|_| !t.metric.is_empty()),
        samples_per_epoch: Some(t.samples_per_epoch).filter(|&n| n > 0),
        max_epochs: t.max_epochs,
        eval_only: t.eval_only,
    }
}

/// The last `n` lines of a log file (at most its last 8 KiB).
fn last_lines(path: &std::path::Path, n: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Per-job progress and evaluation values of a process (the last
/// [`MAX_EVALS`] evaluations per job).
fn job_reports(o: &crate::driver::Observed) -> Vec<pb::JobReport> {
    const MAX_EVALS: usize = 16;
    let mut out: BTreeMap<&str, pb::JobReport> = BTreeMap::new();
    for (job, &(iteration, samples, loss)) in &o.progress {
        out.insert(
            job,
            pb::JobReport {
                job_id: job.clone(),
                iteration,
                samples,
                loss,
                evals: Vec::new(),
            },
        );
    }
    for (job, _, _, _, value) in &o.evals {
        out.entry(job)
            .or_insert_with(|| pb::JobReport {
                job_id: job.clone(),
                ..Default::default()
            })
            .evals
            .push(*value);
    }
    out.into_values()
        .map(|mut r| {
            // The guard reads the first epochs; later ones are kept short.
            if r.evals.len() > MAX_EVALS {
                r.evals.truncate(MAX_EVALS);
            }
            r
        })
        .collect()
}

/// Points of a running training process's loss trace sent with each
/// heartbeat (the scheduler refits its estimate from them).
const RUNNING_TRACE_POINTS: usize = 200;

/// The measurements of an ended profiling run; for a running training
/// process its loss trace, thinned to [`RUNNING_TRACE_POINTS`] (empty
/// otherwise).
fn profile_results(
    ended_profile: bool,
    training: bool,
    o: &crate::driver::Observed,
) -> pb::ObservedTask {
    if training && !ended_profile {
        let step = o.loss_trace.len().div_ceil(RUNNING_TRACE_POINTS).max(1);
        let pts: Vec<&(u64, f64)> = o.loss_trace.iter().step_by(step).collect();
        return pb::ObservedTask {
            trace_iterations: pts.iter().map(|p| p.0 as f64).collect(),
            trace_losses: pts.iter().map(|p| p.1).collect(),
            ..Default::default()
        };
    }
    if !ended_profile {
        return pb::ObservedTask::default();
    }
    let (fisher, fisher_repeat) = o.embeddings.values().next().cloned().unwrap_or_default();
    pb::ObservedTask {
        trace_iterations: o.loss_trace.iter().map(|p| p.0 as f64).collect(),
        trace_losses: o.loss_trace.iter().map(|p| p.1).collect(),
        fisher,
        fisher_repeat,
        step_time_s: o.step_time_s.unwrap_or(0.0),
        ..Default::default()
    }
}

impl Reconciler {
    pub fn new(driver: Arc<ProcessDriver>, gpus: Arc<dyn GpuBackend>) -> Self {
        Self {
            driver,
            gpus,
            known: tokio::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// GPU indices of the plan's UUIDs (unknown UUIDs are an error: the
    /// plan was made for another inventory).
    fn indices(&self, uuids: &[String]) -> Result<Vec<u32>, String> {
        let inv = self.gpus.inventory();
        uuids
            .iter()
            .map(|u| {
                inv.iter()
                    .find(|g| &g.uuid == u)
                    .map(|g| g.index)
                    .ok_or_else(|| format!("GPU {u} is not on this node"))
            })
            .collect()
    }

    /// Converges on `plan`. Returns the messages of tasks that could not be
    /// started (they are also reported as FAILED).
    pub async fn apply(&self, plan: &pb::NodePlan) -> Vec<String> {
        let mut known = self.known.lock().await;
        let mut problems = Vec::new();
        let wanted: BTreeMap<&str, &pb::DesiredTask> =
            plan.tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
        // Stop what the plan no longer runs.
        let running: Vec<String> = self.driver.ids().await;
        for id in running {
            let keep = wanted
                .get(id.as_str())
                .is_some_and(|t| t.phase == pb::DesiredPhase::Running as i32);
            if !keep {
                self.stop(&mut known, &id).await;
            }
        }
        for t in &plan.tasks {
            if t.phase != pb::DesiredPhase::Running as i32 {
                continue;
            }
            let gpus = match self.indices(&t.gpu_uuids) {
                Ok(g) => g,
                Err(e) => {
                    problems.push(format!("task {}: {e}", t.task_id));
                    continue;
                }
            };
            let status = self.driver.status(&t.task_id).await;
            let entry = known.entry(t.task_id.clone()).or_default();
            let alive = status.as_ref().is_some_and(|s| s.running);
            if alive && entry.gpus == gpus {
                entry.generation = plan.generation;
                continue;
            }
            if alive {
                // Moved to other GPUs: checkpoint here, resume there.
                self.stop(&mut known, &t.task_id).await;
            } else if let Some(s) = &status {
                // It ended by itself. A process that finished its work
                // (exit 0, not suspended by us) is never started again: the
                // scheduler sees SUCCEEDED on the next heartbeat and drops
                // it from the plan. A failed one is retried only when a
                // newer plan than the one that started it asks again.
                let entry = known.entry(t.task_id.clone()).or_default();
                if !entry.suspended
                    && (s.exit_code == Some(0) || entry.generation >= plan.generation)
                {
                    continue;
                }
                // Resume from the newest checkpoint it left.
                if let Some(c) = s.observed.last_checkpoint.clone() {
                    entry.checkpoint = Some(c);
                }
            }
            let entry = known.entry(t.task_id.clone()).or_default();
            let resume = Some(PathBuf::from(&t.resume_path))
                .filter(|p| !p.as_os_str().is_empty())
                .or_else(|| entry.checkpoint.as_ref().map(|c| c.0.clone()));
            let spec = LaunchSpec {
                id: t.task_id.clone(),
                command: t.command.clone(),
                env: {
                    let mut env: BTreeMap<String, String> =
                        t.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    // The GPUs' model (a job's own setting wins).
                    if let Some(g) = self
                        .gpus
                        .inventory()
                        .into_iter()
                        .find(|g| gpus.first() == Some(&g.index))
                    {
                        env.entry(fmsched_core::trainer::env::GPU_MODEL.to_string())
                            .or_insert(g.model);
                    }
                    env
                },
                profile: t.mode == pb::TaskMode::Profile as i32,
                tasks: t.tasks.iter().map(assignment).collect(),
                gpus: gpus.clone(),
                resume_from: resume,
                init_weights: Some(PathBuf::from(&t.initial_weights_path))
                    .filter(|p| !p.as_os_str().is_empty()),
                world_size: t.world_size.max(gpus.len() as u32),
                node_rank_offset: t.rank_offset,
                master_addr: if t.master_addr.is_empty() {
                    "127.0.0.1".into()
                } else {
                    t.master_addr.clone()
                },
                master_port: u16::try_from(t.master_port)
                    .ok()
                    .filter(|&p| p > 0)
                    .unwrap_or(29500),
            };
            match self.driver.launch(&spec).await {
                Ok(()) => {
                    let pid = self.driver.status(&t.task_id).await.map_or(0, |s| s.pid);
                    self.gpus.process_started(pid, &gpus);
                    *entry = Known {
                        generation: plan.generation,
                        gpus,
                        job_ids: t.job_ids.clone(),
                        checkpoint: entry.checkpoint.clone(),
                        suspended: false,
                        pid,
                        profile: spec.profile,
                    };
                }
                Err(e) => problems.push(e.to_string()),
            }
        }
        problems
    }

    async fn stop(&self, known: &mut BTreeMap<String, Known>, id: &str) {
        let was_running = self.driver.status(id).await.is_some_and(|s| s.running);
        let ckpt = self.driver.suspend(id).await.ok().flatten();
        let entry = known.entry(id.to_string()).or_default();
        if was_running {
            entry.suspended = true;
        }
        if ckpt.is_some() {
            entry.checkpoint = ckpt;
        }
        self.gpus.process_stopped(entry.pid);
    }

    /// What runs (or ran) here, for heartbeats.
    pub async fn observed(&self) -> Vec<pb::ObservedTask> {
        let known = self.known.lock().await;
        let inv = self.gpus.inventory();
        let mut out = Vec::new();
        for (id, k) in known.iter() {
            let Some(s) = self.driver.status(id).await else {
                continue;
            };
            let phase = if s.running {
                pb::TaskPhase::Running
            } else if k.suspended {
                pb::TaskPhase::Suspended
            } else if s.exit_code == Some(0) {
                pb::TaskPhase::Succeeded
            } else {
                pb::TaskPhase::Failed
            };
            if !s.running {
                self.gpus.process_stopped(s.pid);
            }
            let (iteration, loss) = s
                .observed
                .progress
                .values()
                .map(|p| (p.0, p.2))
                .max_by_key(|p| p.0)
                .unwrap_or((0, 0.0));
            let checkpoint = s.observed.last_checkpoint.clone().or(k.checkpoint.clone());
            out.push(pb::ObservedTask {
                task_id: id.clone(),
                job_ids: k.job_ids.clone(),
                phase: phase as i32,
                pid: s.pid,
                gpu_uuids: k
                    .gpus
                    .iter()
                    .filter_map(|&g| inv.iter().find(|i| i.index == g).map(|i| i.uuid.clone()))
                    .collect(),
                iteration,
                loss,
                checkpoint_path: checkpoint
                    .map(|c| c.0.display().to_string())
                    .unwrap_or_default(),
                exit_code: s
                    .exit_code
                    .unwrap_or(if s.running || k.suspended { 0 } else { -1 }),
                message: if phase == pb::TaskPhase::Failed {
                    last_lines(&s.dir.join("stderr.log"), 10)
                } else {
                    String::new()
                },
                generation: k.generation,
                outputs: s
                    .observed
                    .done
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                jobs: job_reports(&s.observed),
                ..profile_results(
                    k.profile && !s.running,
                    !k.profile && s.running,
                    &s.observed,
                )
            });
        }
        out
    }

    /// The process driver (for metrics).
    pub fn driver(&self) -> &ProcessDriver {
        &self.driver
    }

    /// The task whose log shows `job_id` here: its newest training process
    /// (by plan generation; a profiling run only when nothing else ran),
    /// else a task folder named after the job (from before a restart).
    pub async fn log_task(&self, job_id: &str) -> Option<String> {
        let known = self.known.lock().await;
        known
            .iter()
            .filter(|(_, k)| k.job_ids.iter().any(|j| j == job_id))
            .max_by_key(|(_, k)| (!k.profile, k.generation))
            .map(|(id, _)| id.clone())
            .or_else(|| {
                [job_id.to_string(), format!("{job_id}-profile")]
                    .into_iter()
                    .find(|t| self.driver.has_dir(t))
            })
    }

    /// Sends the pre-warm hint to a task that runs here.
    pub async fn prewarm(&self, task_id: &str) -> bool {
        self.driver.prewarm(task_id).await.is_ok()
    }
}
