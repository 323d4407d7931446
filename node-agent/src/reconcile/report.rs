//! What the node reports of its tasks: progress, evaluations, profiling
//! results and the last log lines, built from the driver's status.

use std::collections::BTreeMap;

use fmsched_core::trainer::TaskAssignment;
use fmsched_proto::v1 as pb;

use crate::reconcile::Reconciler;

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

/// The jobs a process evaluates without training them (eval-only tasks).
pub(crate) fn watched(tasks: &[pb::TrainerTask]) -> Vec<String> {
    tasks
        .iter()
        .filter(|t| t.eval_only)
        .map(|t| t.job_id.clone())
        .collect()
}

/// Job → the metric its target names, of the tasks of a process.
pub(crate) fn target_metrics(tasks: &[TaskAssignment]) -> BTreeMap<String, String> {
    tasks
        .iter()
        .filter_map(|t| Some((t.job_id.clone(), t.metric.clone()?)))
        .collect()
}

/// Per-job progress and evaluation values of a process (the first
/// [`MAX_EVALS`] evaluations per job) — of the metric its target names
/// (`metrics`), else of the first metric it reported: one series per job,
/// which the merge guard compares epoch to epoch.
pub(crate) fn job_reports(
    o: &crate::driver::Observed,
    metrics: &BTreeMap<String, String>,
) -> Vec<pb::JobReport> {
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
                ..Default::default()
            },
        );
    }
    for (job, (frozen, variance)) in &o.layer_variance {
        let r = out.entry(job).or_insert_with(|| pb::JobReport {
            job_id: job.clone(),
            ..Default::default()
        });
        r.frozen_layers = *frozen;
        r.layer_variance.clone_from(variance);
    }
    for (job, features) in &o.prompt_features {
        let r = out.entry(job).or_insert_with(|| pb::JobReport {
            job_id: job.clone(),
            ..Default::default()
        });
        r.prompt_features.clone_from(features);
    }
    for (job, (from, score, scored, candidates)) in &o.prompt_init {
        let r = out.entry(job).or_insert_with(|| pb::JobReport {
            job_id: job.clone(),
            ..Default::default()
        });
        r.prompt_init = Some(pb::PromptInit {
            from_job_id: from.clone(),
            score: *score,
            scored: *scored,
            candidates: *candidates,
        });
    }
    let mut series: BTreeMap<&str, &str> = metrics
        .iter()
        .map(|(j, m)| (j.as_str(), m.as_str()))
        .collect();
    for (job, _, epoch, metric, value) in &o.evals {
        if *series.entry(job.as_str()).or_insert(metric.as_str()) != metric.as_str() {
            continue;
        }
        let r = out.entry(job).or_insert_with(|| pb::JobReport {
            job_id: job.clone(),
            ..Default::default()
        });
        r.evals.push(*value);
        r.eval_epochs.push(*epoch);
    }
    out.into_values()
        .map(|mut r| {
            // The guard reads the first epochs; later ones are kept short.
            if r.evals.len() > MAX_EVALS {
                r.evals.truncate(MAX_EVALS);
                r.eval_epochs.truncate(MAX_EVALS);
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
            step_time_s: o.step_time_s.unwrap_or(0.0),
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
    /// What runs (or ran) here, for heartbeats. While a plan is being
    /// applied (suspensions wait for checkpoints, a standby for its loader)
    /// the report from before it is repeated, so heartbeats keep the node
    /// alive; the next one after the plan is fresh.
    pub async fn observed(&self) -> Vec<pb::ObservedTask> {
        let Ok(known) = self.known.try_lock() else {
            return self
                .last_observed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
        };
        let inv = self.gpus.inventory();
        let mut out = Vec::new();
        for (id, k) in known.iter().filter(|(_, k)| k.standby.is_none()) {
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
            // A checkpoint at iteration N means N iterations are done, even
            // before the first progress report (a trainer suspended early).
            let ckpt_iteration = checkpoint.as_ref().map_or(0, |c| c.1);
            let iteration = iteration.max(ckpt_iteration);
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
                rank_offset: k.ranks.rank_offset,
                world_size: k.ranks.world_size,
                master_port: if k.ranks.nnodes > 1 {
                    u32::from(k.ranks.master_port)
                } else {
                    0
                },
                outputs: s
                    .observed
                    .done
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                jobs: job_reports(&s.observed, &k.metrics)
                    .into_iter()
                    .map(|mut r| {
                        // A job of this process with evaluations but no
                        // progress report yet did the checkpoint's
                        // iterations.
                        if r.iteration == 0 && k.job_ids.contains(&r.job_id) {
                            r.iteration = ckpt_iteration;
                        }
                        r
                    })
                    .collect(),
                ..profile_results(
                    k.profile && !s.running,
                    !k.profile && s.running,
                    &s.observed,
                )
            });
        }
        out.clone_into(&mut self.last_observed.lock().unwrap_or_else(|p| p.into_inner()));
        out
    }

    /// The task whose log shows `job_id` here: its newest training process
    /// (by plan generation; a profiling run only when nothing else ran),
    /// else a task folder named after the job (from before a restart).
    pub async fn log_task(&self, job_id: &str, profile: bool) -> Option<String> {
        let profile_task = format!("{job_id}-profile");
        if profile {
            // The profiling run is always "<job>-profile".
            return self.driver.has_dir(&profile_task).then_some(profile_task);
        }
        let known = self.known.lock().await;
        known
            .iter()
            .filter(|(_, k)| k.job_ids.iter().any(|j| j == job_id))
            .max_by_key(|(_, k)| (!k.profile, k.generation))
            .map(|(id, _)| id.clone())
            .or_else(|| {
                [job_id.to_string(), profile_task]
                    .into_iter()
                    .find(|t| self.driver.has_dir(t))
            })
    }
}
