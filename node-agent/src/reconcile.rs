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
//!
//! Pipeline switch (Ymir §6.2): a `PrepareSwitch` hint launches the next
//! task in *standby* while its GPUs still run the current one: it prepares
//! its data loader and waits. The plan that then runs it with the same
//! launch on the same GPUs starts it (SIGUSR1) after the outgoing task has
//! checkpointed, so the switch costs no loader time. A standby the plan does
//! not run, or runs differently, is stopped; one no plan claims expires.
//! Standby processes are not reported (they run nothing yet).
//!
//! Warm processes (PromptTuner §4.4.4): a task the plan marks `warm` is
//! launched with `FMSCHED_WARM=1`. Once its trainer reported `warm` (its
//! jobs done, the model still loaded) and the plan no longer runs it, the
//! process is kept as a *warm process* of its model on its GPUs. A later
//! `warm` task with the same command and model on exactly those GPUs is
//! handed to it (no launch, no weight load); a task that needs any of its
//! GPUs otherwise stops it first, and one idle for the plan's
//! `warm_idle_release` (60 s) is stopped. Warm processes are reported in
//! heartbeats, not as tasks.
//!
//! Reverse-order stage switch (Ymir §6.2, Fig. 9): a pipeline-parallel task
//! gets its GPUs in the reverse order of the last pipeline task that trained
//! on the same GPUs, so its first stage runs where the previous job's last
//! stage (the first to finish its backward pass) ran.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fmsched_core::trainer::{TaskAssignment, TrainingSettings};
use fmsched_proto::v1 as pb;

use crate::driver::{LaunchSpec, ProcessDriver, Ranks};
use crate::gpu::GpuBackend;

/// What the reconciler remembers of a task between plans.
#[derive(Clone, Debug, Default)]
struct Known {
    generation: i64,
    gpus: Vec<u32>,
    /// The rank layout it runs under (a change relaunches it).
    ranks: Ranks,
    job_ids: Vec<String>,
    /// Newest checkpoint taken here.
    checkpoint: Option<(PathBuf, u64)>,
    suspended: bool,
    pid: u32,
    profile: bool,
    /// Launched ahead of a switch and not started yet.
    standby: Option<Standby>,
    /// Job → the metric its target names: only that metric's evaluations
    /// are reported for it (a trainer may evaluate several per epoch).
    metrics: BTreeMap<String, String>,
    /// The frozen layers the process was launched with or last told
    /// (ICEFROG's layer tuner changes them without a restart).
    frozen_layers: u32,
    /// The lease end last written to its control file (Unix seconds).
    lease_end: Option<f64>,
    /// Another process shares its GPU (as launched or last told).
    shared: bool,
    /// Jobs it evaluates without training them, as launched (B of a
    /// temporal merge, the merge guard's watch): a plan that adds one
    /// relaunches it from its checkpoint, since a trainer learns its tasks
    /// at launch.
    watching: Vec<String>,
    /// Launched warm: (model, command) it stays loaded with after its job.
    warm: Option<(String, Vec<String>)>,
    /// Launched, or last kept, under a plan that set `fresh_start`: the
    /// process starts from the initial weights, so that plan's flag does
    /// not relaunch it again.
    fresh: bool,
}

/// A process of a finished `warm` task waiting for the next task of its
/// model (keyed by its process id in the driver).
#[derive(Clone, Debug)]
struct WarmProc {
    model: String,
    command: Vec<String>,
    /// GPU indices, sorted.
    gpus: Vec<u32>,
    since: std::time::Instant,
}

/// Why a warm process is stopped (counted apart in [`SwitchStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WarmStop {
    /// Idle past the plan's `warm_idle_release`.
    Idle,
    /// The plan gives its GPUs to another task.
    Needed,
    /// It could not take the task it was handed.
    Failed,
}

impl WarmStop {
    fn reason(self) -> &'static str {
        match self {
            WarmStop::Idle => "idle past the warm release",
            WarmStop::Needed => "the plan needs its GPUs",
            WarmStop::Failed => "it could not take its task",
        }
    }
}

/// Idle warm processes are stopped after this long unless the plan says
/// otherwise (PromptTuner §4.6.3.3: 60 s).
pub const WARM_IDLE_RELEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the plan runs desired task `t` on a GPU another process shares
/// (`FMSCHED_SHARED_GPU=1` in its environment; ICEFROG GPU sharing).
fn shared_of(t: &pb::DesiredTask) -> bool {
    t.env
        .get(fmsched_core::trainer::env::SHARED_GPU)
        .is_some_and(|v| v == "1")
}

/// A standby process: what it was launched as, and when it expires.
#[derive(Clone, Debug)]
struct Standby {
    spec: LaunchSpec,
    since: std::time::Instant,
    expires: std::time::Instant,
    /// The task had no state here before its standby (forgotten on stop).
    fresh: bool,
}

/// How long after the expected switch an unclaimed standby is kept: the
/// plan that claims it may come a round late.
const STANDBY_SLACK: std::time::Duration = std::time::Duration::from_secs(60);

/// Longest wait, when a plan claims a standby, for its `prewarmed` report:
/// the start signal is sent only after it (a trainer has its handler
/// installed by then), and a cold launch would need that loader time too.
const STANDBY_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Counters of the pipeline switch, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SwitchStats {
    /// Standby processes launched on a `PrepareSwitch` hint.
    pub standby_launches: u64,
    /// Standby processes a plan started (their loader was ready or nearly).
    pub standby_started: u64,
    /// Standby processes stopped unused (the plan changed its mind).
    pub standby_wasted: u64,
    /// Seconds from the standby launch to its start, summed.
    pub standby_lead_seconds_sum: f64,
    /// Hints refused because `max_standby` processes were waiting already.
    pub standby_refused: u64,
    /// `warm` tasks handed to a warm process of their model (no launch).
    pub warm_starts: u64,
    /// `warm` tasks launched afresh (no warm process matched).
    pub cold_starts: u64,
    /// Warm processes stopped after idling `warm_idle_release`.
    pub warm_released: u64,
    /// Warm processes stopped because a task needed their GPUs.
    pub warm_evicted: u64,
}

pub struct Reconciler {
    driver: Arc<ProcessDriver>,
    gpus: Arc<dyn GpuBackend>,
    known: tokio::sync::Mutex<BTreeMap<String, Known>>,
    switches: std::sync::Mutex<SwitchStats>,
    /// Per GPU set (sorted indices): the device order of the last
    /// pipeline-parallel process that trained there.
    stage_orders: std::sync::Mutex<BTreeMap<Vec<u32>, Vec<u32>>>,
    /// Most standby processes at once (`processes.max_standby`).
    max_standby: usize,
    /// The last [`Reconciler::observed`] report, answered while a plan is
    /// being applied (it holds `known` through checkpoints and standby
    /// waits; heartbeats must not stop meanwhile).
    last_observed: std::sync::Mutex<Vec<pb::ObservedTask>>,
    /// Warm processes (never held across an await).
    warm: std::sync::Mutex<BTreeMap<String, WarmProc>>,
    /// The newest plan's idle release for warm processes.
    warm_idle_release: std::sync::Mutex<std::time::Duration>,
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
        // Written to a file at launch (LaunchSpec::prompt_banks).
        prompt_bank: None,
        settings: TrainingSettings {
            learning_rate: t.learning_rate,
            optimizer: t.optimizer.clone(),
            weight_decay: t.weight_decay,
            amp: t.amp,
            gradient_checkpointing: t.gradient_checkpointing,
            petl: t.petl.clone(),
            frozen_layers: t.frozen_layers,
            max_frozen_layers: t.max_frozen_layers,
            objective: t.objective.clone(),
            metric_lower_is_better: t.metric_lower_is_better,
            num_virtual_tokens: t.num_virtual_tokens,
            initial_prompt: t.initial_prompt.clone(),
        },
    }
}

/// The rank layout a desired task names; a task without one (an older
/// scheduler, a job on one node) runs alone on its GPUs.
fn ranks_of(t: &pb::DesiredTask, gpus: u32) -> Ranks {
    let single = Ranks::single(gpus);
    Ranks {
        world_size: t.world_size.max(gpus).max(1),
        rank_offset: t.rank_offset,
        nnodes: t.nnodes.max(1),
        node_rank: t.node_rank,
        master_addr: Some(t.master_addr.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or(single.master_addr),
        master_port: u16::try_from(t.master_port)
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(single.master_port),
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

/// A desired task's lease end in Unix seconds (None: no lease).
fn lease_end_of(t: &pb::DesiredTask) -> Option<f64> {
    t.lease_until
        .as_ref()
        .map(|ts| ts.seconds as f64 + f64::from(ts.nanos) / 1e9)
        .filter(|&s| s > 0.0)
}

/// The frozen layers a process trains with (its trained task's).
fn frozen_of(tasks: &[TaskAssignment]) -> u32 {
    tasks
        .iter()
        .find(|t| !t.eval_only)
        .map_or(0, |t| t.settings.frozen_layers)
}

/// The jobs a process evaluates without training them (eval-only tasks).
fn watched(tasks: &[pb::TrainerTask]) -> Vec<String> {
    tasks
        .iter()
        .filter(|t| t.eval_only)
        .map(|t| t.job_id.clone())
        .collect()
}

/// Job → the metric its target names, of the tasks of a process.
fn target_metrics(tasks: &[TaskAssignment]) -> BTreeMap<String, String> {
    tasks
        .iter()
        .filter_map(|t| Some((t.job_id.clone(), t.metric.clone()?)))
        .collect()
}

/// Per-job progress and evaluation values of a process (the first
/// [`MAX_EVALS`] evaluations per job) — of the metric its target names
/// (`metrics`), else of the first metric it reported: one series per job,
/// which the merge guard compares epoch to epoch.
fn job_reports(
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
    pub fn new(driver: Arc<ProcessDriver>, gpus: Arc<dyn GpuBackend>) -> Self {
        Self {
            driver,
            gpus,
            known: tokio::sync::Mutex::new(BTreeMap::new()),
            switches: std::sync::Mutex::new(SwitchStats::default()),
            stage_orders: std::sync::Mutex::new(BTreeMap::new()),
            max_standby: 4,
            last_observed: std::sync::Mutex::new(Vec::new()),
            warm: std::sync::Mutex::new(BTreeMap::new()),
            warm_idle_release: std::sync::Mutex::new(WARM_IDLE_RELEASE),
        }
    }

    /// At most `n` processes in standby at once (0: no standby here).
    pub fn with_max_standby(mut self, n: u32) -> Self {
        self.max_standby = n as usize;
        self
    }

    /// The device order (stage `i` on `order[i]`) of a pipeline-parallel
    /// task on `gpus`: the reverse of the last pipeline task that trained
    /// on the same GPUs, else the plan's order. Ymir §6.2 (Fig. 9): the
    /// outgoing job's last stage finishes its backward pass first, so the
    /// incoming job's first stage goes there and the switch proceeds stage
    /// by stage in reverse.
    fn stage_order(&self, gpus: &[u32]) -> Vec<u32> {
        let mut key = gpus.to_vec();
        key.sort_unstable();
        match self
            .stage_orders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            Some(prev) => prev.iter().rev().copied().collect(),
            None => gpus.to_vec(),
        }
    }

    /// Remembers the device order of a pipeline task that starts training.
    fn trained_in_order(&self, spec: &LaunchSpec) {
        if !spec.pipeline {
            return;
        }
        let mut key = spec.gpus.clone();
        key.sort_unstable();
        self.stage_orders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, spec.gpus.clone());
    }

    /// Pipeline-switch counters.
    pub fn switch_stats(&self) -> SwitchStats {
        self.switches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn count(&self, f: impl FnOnce(&mut SwitchStats)) {
        f(&mut self.switches.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The launch of desired task `t` on GPU indices `gpus`.
    fn launch_spec(
        &self,
        t: &pb::DesiredTask,
        gpus: &[u32],
        resume: Option<PathBuf>,
    ) -> LaunchSpec {
        LaunchSpec {
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
            gpus: if t.pipeline_parallel {
                self.stage_order(gpus)
            } else {
                gpus.to_vec()
            },
            resume_from: resume,
            init_weights: Some(PathBuf::from(&t.initial_weights_path))
                .filter(|p| !p.as_os_str().is_empty()),
            ranks: ranks_of(t, gpus.len() as u32),
            standby: false,
            warm: t.warm,
            pipeline: t.pipeline_parallel,
            expert_parallel: t.expert_parallel,
            prompt_banks: t
                .tasks
                .iter()
                .filter(|x| !x.prompt_bank.is_empty())
                .map(|x| {
                    let bank = x
                        .prompt_bank
                        .iter()
                        .map(|c| fmsched_core::trainer::BankCandidate {
                            id: c.job_id.clone(),
                            path: c.path.clone(),
                            cluster: c.cluster,
                            medoid: c.medoid,
                        })
                        .collect();
                    (x.job_id.clone(), bank)
                })
                .collect(),
        }
    }

    /// The checkpoint a launch of `t` resumes from: the plan's, else the
    /// newest one this node took of the task.
    fn resume_of(t: &pb::DesiredTask, entry: &Known) -> Option<PathBuf> {
        Some(PathBuf::from(&t.resume_path))
            .filter(|p| !p.as_os_str().is_empty())
            .or_else(|| entry.checkpoint.as_ref().map(|c| c.0.clone()))
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
        let release = plan
            .warm_idle_release
            .as_ref()
            .and_then(fmsched_proto::convert::duration_from_proto)
            .filter(|d| !d.is_zero())
            .unwrap_or(WARM_IDLE_RELEASE);
        *self
            .warm_idle_release
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = release;
        // Stop what the plan no longer runs; a finished warm task's process
        // stays as a warm process.
        let running: Vec<String> = self.driver.ids().await;
        let mut leaving = Vec::new();
        for id in running {
            let keep = wanted
                .get(id.as_str())
                .is_some_and(|t| t.phase == pb::DesiredPhase::Running as i32);
            if keep || self.warm_procs().contains_key(&id) {
                continue;
            }
            if known.get(&id).is_some_and(|k| k.standby.is_some()) {
                self.drop_standby(&mut known, &id, "the plan does not run it")
                    .await;
            } else if !self.park_warm(&mut known, &id).await {
                leaving.push(id);
            }
        }
        // All of them checkpoint at once: the node's suspensions take the
        // longest one, not their sum, before the plan's new processes start.
        self.stop_all(&mut known, &leaving).await;
        let claimed = self.claim_warm(plan).await;
        // Standby starts last: they may wait for their loader, the rest
        // should not wait for them.
        let mut order: Vec<&pb::DesiredTask> = plan.tasks.iter().collect();
        order.sort_by_key(|t| known.get(&t.task_id).is_some_and(|k| k.standby.is_some()));
        for t in order {
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
            // The scheduler restarts the task from its initial weights (a
            // start from another job's weights it measured to hurt): a
            // process launched before it asked does not go on, and no
            // checkpoint taken here of the task is resumed from.
            let restart_fresh = t.fresh_start && !entry.fresh;
            if restart_fresh {
                entry.checkpoint = None;
                tracing::info!(task = %t.task_id, "restarting from the initial weights (the plan's fresh start)");
            }
            // The checkpoint a stop of its process here just wrote.
            let mut fresh: Option<(PathBuf, u64)> = None;
            if let Some(sb) = entry.standby.clone() {
                // Launched ahead of this switch: start it if the plan runs it
                // as it was launched; else stop it and launch afresh.
                let wanted = LaunchSpec {
                    standby: true,
                    ..self.launch_spec(t, &gpus, Self::resume_of(t, entry))
                };
                if alive
                    && sb.spec == wanted
                    && self.ready(&t.task_id).await
                    && self.driver.start(&t.task_id).await.is_ok()
                {
                    entry.standby = None;
                    entry.suspended = false;
                    entry.fresh = t.fresh_start;
                    entry.generation = plan.generation;
                    entry.ranks = sb.spec.ranks.clone();
                    entry.job_ids.clone_from(&t.job_ids);
                    self.gpus
                        .process_started(entry.pid, &gpus, t.expected_utilization_percent);
                    self.trained_in_order(&sb.spec);
                    let lead = sb.since.elapsed();
                    let ready = status.as_ref().is_some_and(|s| s.observed.prewarmed);
                    self.count(|c| {
                        c.standby_started += 1;
                        c.standby_lead_seconds_sum += lead.as_secs_f64();
                    });
                    tracing::info!(task = %t.task_id, ?lead, ready_before_plan = ready, generation = plan.generation,
                        "started from standby (pipeline switch)");
                    continue;
                }
                let why = if !alive {
                    "it died"
                } else if sb.spec.gpus != wanted.gpus {
                    "the plan runs it on other GPUs"
                } else if sb.spec != wanted {
                    "the plan launches it differently"
                } else {
                    "it never reported prewarmed"
                };
                self.drop_standby(&mut known, &t.task_id, why).await;
            } else if alive
                && !restart_fresh
                && entry.gpus == gpus
                && entry.ranks == ranks_of(t, gpus.len() as u32)
                && t.tasks
                    .iter()
                    .filter(|x| x.eval_only)
                    .all(|x| entry.watching.contains(&x.job_id))
            {
                entry.generation = plan.generation;
                entry.fresh = t.fresh_start;
                // The layer tuner's new ℓ and the lease end: told through
                // the control file (the whole of it each time), applied by
                // the trainer without a restart (ℓ at its next epoch).
                let single = t.tasks.len() == 1 && !entry.profile;
                let wanted = t.tasks.first().map_or(0, |x| x.frozen_layers);
                let lease = lease_end_of(t);
                let frozen_changed = single && wanted != entry.frozen_layers;
                // A partner joined or left its GPU.
                let shared = shared_of(t);
                let shared_changed = !entry.profile && shared != entry.shared;
                if frozen_changed || shared_changed || lease != entry.lease_end {
                    let c = fmsched_core::trainer::Control {
                        frozen_layers: single.then_some(wanted),
                        lease_end: lease,
                        shared_gpu: (!entry.profile).then_some(shared),
                    };
                    match self.driver.set_control(&t.task_id, &c).await {
                        Ok(()) => {
                            if frozen_changed {
                                tracing::info!(task = %t.task_id, from = entry.frozen_layers, to = wanted,
                                    "frozen layers changed (applied at the next epoch)");
                                entry.frozen_layers = wanted;
                            }
                            entry.lease_end = lease;
                            if shared_changed {
                                tracing::info!(task = %t.task_id, shared, "GPU sharing changed (told through the control file)");
                                entry.shared = shared;
                            }
                        }
                        Err(e) => problems.push(e.to_string()),
                    }
                }
                continue;
            } else if alive {
                // Moved to other GPUs, or its job's nodes changed (a new
                // rank layout), or it is to evaluate a job it was not
                // launched with: checkpoint here, resume there.
                let before = known.get(&t.task_id).and_then(|k| k.checkpoint.clone());
                self.stop(&mut known, &t.task_id).await;
                fresh = (known.get(&t.task_id).and_then(|k| k.checkpoint.clone()))
                    .filter(|c| Some(c) != before.as_ref());
                if restart_fresh {
                    // What it trained from the weights the plan drops.
                    fresh = None;
                    if let Some(k) = known.get_mut(&t.task_id) {
                        k.checkpoint = None;
                    }
                }
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
                // Resume from the newest checkpoint it left (none on a
                // fresh start).
                if let Some(c) = s.observed.last_checkpoint.clone()
                    && !restart_fresh
                {
                    entry.checkpoint = Some(c);
                }
            }
            let entry = known.entry(t.task_id.clone()).or_default();
            // A process this node just stopped left the newest checkpoint
            // there is (when its stop wrote one): the plan's path is the
            // last one the scheduler had heard of, older by what the
            // process trained since (found live: a resize relaunched a job
            // from a checkpoint 45 s old).
            let resume = fresh.map(|c| c.0).or_else(|| Self::resume_of(t, entry));
            let resume = resume.filter(|_| !t.fresh_start || entry.fresh);
            let spec = self.launch_spec(t, &gpus, resume);
            let launched = match claimed.get(&t.task_id) {
                Some(from) => match self.driver.hand_over(from, &spec).await {
                    Ok(()) => {
                        self.warm_procs().remove(from);
                        self.count(|c| c.warm_starts += 1);
                        Ok(())
                    }
                    Err(e) => {
                        tracing::warn!(task = %t.task_id, warm = %from, error = %e,
                            "warm process could not take the task; launching afresh");
                        self.stop_warm(from, WarmStop::Failed).await;
                        self.count(|c| c.cold_starts += 1);
                        self.driver.launch(&spec).await
                    }
                },
                None => {
                    if spec.warm {
                        self.count(|c| c.cold_starts += 1);
                    }
                    self.driver.launch(&spec).await
                }
            };
            match launched {
                Ok(()) => {
                    self.trained_in_order(&spec);
                    let pid = self.driver.status(&t.task_id).await.map_or(0, |s| s.pid);
                    self.gpus
                        .process_started(pid, &gpus, t.expected_utilization_percent);
                    *entry = Known {
                        generation: plan.generation,
                        ranks: spec.ranks.clone(),
                        gpus,
                        job_ids: t.job_ids.clone(),
                        checkpoint: entry.checkpoint.clone(),
                        suspended: false,
                        pid,
                        profile: spec.profile,
                        standby: None,
                        metrics: target_metrics(&spec.tasks),
                        frozen_layers: frozen_of(&spec.tasks),
                        lease_end: None,
                        shared: shared_of(t),
                        watching: watched(&t.tasks),
                        warm: spec.warm.then(|| {
                            (
                                spec.tasks
                                    .first()
                                    .map(|x| x.model.clone())
                                    .unwrap_or_default(),
                                spec.command.clone(),
                            )
                        }),
                        fresh: t.fresh_start,
                    };
                    // A leased process learns its lease end from the start.
                    if let Some(end) = lease_end_of(t).filter(|_| !spec.profile) {
                        let c = fmsched_core::trainer::Control {
                            frozen_layers: None,
                            lease_end: Some(end),
                            shared_gpu: Some(shared_of(t)),
                        };
                        match self.driver.set_control(&t.task_id, &c).await {
                            Ok(()) => entry.lease_end = Some(end),
                            Err(e) => problems.push(e.to_string()),
                        }
                    }
                }
                Err(e) => problems.push(e.to_string()),
            }
        }
        problems
    }

    fn warm_procs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, WarmProc>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the process of finished task `id` as a warm process if it was
    /// launched warm and reported `warm` (waiting up to 2 s for that report
    /// after its `done`). Returns whether it did.
    async fn park_warm(&self, known: &mut BTreeMap<String, Known>, id: &str) -> bool {
        let Some((model, command)) = known.get(id).and_then(|k| k.warm.clone()) else {
            return false;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match self.driver.status(id).await {
                Some(s) if s.running && s.observed.warm => break,
                Some(s)
                    if s.running
                        && !s.observed.done.is_empty()
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                _ => return false,
            }
        }
        let Some(k) = known.remove(id) else {
            return false;
        };
        self.gpus.process_stopped(k.pid);
        let mut gpus = k.gpus;
        gpus.sort_unstable();
        tracing::info!(task = id, %model, ?gpus, "kept warm: the model stays loaded for the next task");
        self.warm_procs().insert(
            id.to_string(),
            WarmProc {
                model,
                command,
                gpus,
                since: std::time::Instant::now(),
            },
        );
        true
    }

    /// Pairs the plan's `warm` tasks that do not run yet with warm
    /// processes of their model, command and exact GPUs (task → process),
    /// and stops the warm processes that are idle past the release or whose
    /// GPUs the plan gives to anything else.
    /// The newest plan's idle release for warm processes.
    fn warm_release(&self) -> std::time::Duration {
        *self
            .warm_idle_release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    async fn claim_warm(&self, plan: &pb::NodePlan) -> BTreeMap<String, String> {
        let release = self.warm_release();
        let mut claimed = BTreeMap::new();
        let mut needed: Vec<u32> = Vec::new();
        for t in &plan.tasks {
            if t.phase != pb::DesiredPhase::Running as i32 {
                continue;
            }
            let Ok(mut gpus) = self.indices(&t.gpu_uuids) else {
                continue;
            };
            gpus.sort_unstable();
            if self
                .driver
                .status(&t.task_id)
                .await
                .is_some_and(|s| s.running)
            {
                needed.extend(gpus);
                continue;
            }
            let model = t.tasks.first().map(|x| x.model.as_str());
            let taken: Vec<&String> = claimed.values().collect();
            let found = t
                .warm
                .then(|| {
                    self.warm_procs()
                        .iter()
                        .find(|(id, w)| {
                            w.gpus == gpus
                                && Some(w.model.as_str()) == model
                                && w.command == t.command
                                && !taken.contains(id)
                        })
                        .map(|(id, _)| id.clone())
                })
                .flatten();
            match found {
                Some(id) => {
                    claimed.insert(t.task_id.clone(), id);
                }
                None => needed.extend(gpus),
            }
        }
        let now = std::time::Instant::now();
        let to_stop: Vec<(String, WarmStop)> = self
            .warm_procs()
            .iter()
            .filter(|(id, _)| !claimed.values().any(|c| c == *id))
            .filter_map(|(id, w)| {
                if w.gpus.iter().any(|g| needed.contains(g)) {
                    Some((id.clone(), WarmStop::Needed))
                } else if now.duration_since(w.since) >= release {
                    Some((id.clone(), WarmStop::Idle))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in to_stop {
            self.stop_warm(&id, why).await;
        }
        claimed
    }

    /// Stops warm process `id` (SIGTERM: it has nothing to save) and
    /// forgets it.
    async fn stop_warm(&self, id: &str, why: WarmStop) {
        let Some(w) = self.warm_procs().remove(id) else {
            return;
        };
        if let Err(e) = self.driver.terminate(id).await {
            tracing::debug!(process = id, error = %e, "warm process already gone");
        }
        self.driver.forget(id).await;
        let idle = w.since.elapsed();
        if why == WarmStop::Idle {
            self.count(|c| c.warm_released += 1);
        } else {
            self.count(|c| c.warm_evicted += 1);
        }
        tracing::info!(process = id, model = %w.model, gpus = ?w.gpus, ?idle, reason = why.reason(), "warm process stopped");
    }

    /// Stops warm processes idle past the newest plan's release, and
    /// forgets those that ended by themselves (between plans).
    pub async fn expire_warm(&self) {
        let release = self.warm_release();
        let ids: Vec<(String, bool)> = self
            .warm_procs()
            .iter()
            .map(|(id, w)| (id.clone(), w.since.elapsed() >= release))
            .collect();
        for (id, idle) in ids {
            if idle {
                self.stop_warm(&id, WarmStop::Idle).await;
            } else if !self.driver.status(&id).await.is_some_and(|s| s.running) {
                self.warm_procs().remove(&id);
                self.driver.forget(&id).await;
                tracing::warn!(process = %id, "warm process ended by itself");
            }
        }
    }

    /// The warm processes, for heartbeats.
    pub fn warm_report(&self) -> Vec<pb::WarmProcess> {
        let inv = self.gpus.inventory();
        self.warm_procs()
            .values()
            .map(|w| pb::WarmProcess {
                model: w.model.clone(),
                gpu_uuids: w
                    .gpus
                    .iter()
                    .filter_map(|&g| inv.iter().find(|i| i.index == g).map(|i| i.uuid.clone()))
                    .collect(),
            })
            .collect()
    }

    async fn stop(&self, known: &mut BTreeMap<String, Known>, id: &str) {
        self.stop_all(known, &[id.to_string()]).await;
    }

    /// Suspends processes `ids` concurrently (each: checkpoint, SIGTERM,
    /// SIGKILL after the grace) and records what each left.
    async fn stop_all(&self, known: &mut BTreeMap<String, Known>, ids: &[String]) {
        let stopped = futures_util::future::join_all(ids.iter().map(|id| async move {
            let was_running = self.driver.status(id).await.is_some_and(|s| s.running);
            let ckpt = self.driver.suspend(id).await.ok().flatten();
            (id, was_running, ckpt)
        }))
        .await;
        for (id, was_running, ckpt) in stopped {
            if was_running {
                tracing::info!(task = %id, checkpoint = ?ckpt.as_ref().map(|c| &c.0), "stopped");
            }
            let entry = known.entry(id.clone()).or_default();
            if was_running {
                entry.suspended = true;
            }
            if ckpt.is_some() {
                entry.checkpoint = ckpt;
            }
            self.gpus.process_stopped(entry.pid);
        }
    }

    /// Waits (bounded) until a standby reported `prewarmed`; false if it
    /// died or never did.
    async fn ready(&self, id: &str) -> bool {
        let deadline = std::time::Instant::now() + STANDBY_READY_WAIT;
        loop {
            match self.driver.status(id).await {
                Some(s) if s.running && s.observed.prewarmed => return true,
                Some(s) if s.running && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                _ => return false,
            }
        }
    }

    /// Stops a standby process (no checkpoint: it trained nothing) and
    /// forgets it: it is not reported (its exit must not read as a finished
    /// or failed job). What the node knew of the task before (its newest
    /// checkpoint) is kept for a later launch.
    async fn drop_standby(&self, known: &mut BTreeMap<String, Known>, id: &str, why: &str) {
        let Some(sb) = known.get_mut(id).and_then(|k| k.standby.take()) else {
            return;
        };
        if let Err(e) = self.driver.terminate(id).await {
            tracing::debug!(task = id, error = %e, "standby already gone");
        }
        self.driver.forget(id).await;
        if sb.fresh {
            known.remove(id);
        }
        self.count(|c| c.standby_wasted += 1);
        tracing::info!(task = id, after = ?sb.since.elapsed(), reason = why, "standby stopped unused");
    }

    /// Launches desired task `t` in standby ahead of the round expected in
    /// `lead` (a `PrepareSwitch` hint, Ymir §6.2). Does nothing when the task
    /// runs here already (or waits in standby), finished here, or names GPUs
    /// this node lacks. Returns whether a standby was launched.
    pub async fn prepare(&self, t: &pb::DesiredTask, lead: std::time::Duration) -> bool {
        if t.phase != pb::DesiredPhase::Running as i32 || t.mode == pb::TaskMode::Profile as i32 {
            return false;
        }
        let Ok(gpus) = self.indices(&t.gpu_uuids) else {
            return false;
        };
        let mut known = self.known.lock().await;
        let status = self.driver.status(&t.task_id).await;
        if status.as_ref().is_some_and(|s| s.running) {
            return false;
        }
        let waiting = known.values().filter(|k| k.standby.is_some()).count();
        if waiting >= self.max_standby {
            self.count(|c| c.standby_refused += 1);
            tracing::debug!(task = %t.task_id, waiting, "switch hint refused: processes.max_standby reached");
            return false;
        }
        let fresh = !known.contains_key(&t.task_id);
        let entry = known.entry(t.task_id.clone()).or_default();
        if !fresh && !entry.suspended && status.as_ref().is_some_and(|s| s.exit_code == Some(0)) {
            return false; // finished here: the scheduler drops it
        }
        if let Some(s) = &status
            && let Some(c) = s.observed.last_checkpoint.clone()
        {
            entry.checkpoint = Some(c);
        }
        let spec = LaunchSpec {
            standby: true,
            ..self.launch_spec(t, &gpus, Self::resume_of(t, entry))
        };
        match self.driver.launch(&spec).await {
            Ok(()) => {
                let now = std::time::Instant::now();
                entry.pid = self.driver.status(&t.task_id).await.map_or(0, |s| s.pid);
                entry.gpus = gpus;
                entry.ranks = spec.ranks.clone();
                entry.job_ids.clone_from(&t.job_ids);
                entry.profile = false;
                entry.metrics = target_metrics(&spec.tasks);
                entry.watching = watched(&t.tasks);
                entry.frozen_layers = frozen_of(&spec.tasks);
                entry.lease_end = None; // told once the plan runs it
                entry.standby = Some(Standby {
                    spec,
                    since: now,
                    expires: now + lead + STANDBY_SLACK,
                    fresh,
                });
                self.count(|c| c.standby_launches += 1);
                true
            }
            Err(e) => {
                tracing::warn!(task = %t.task_id, error = %e, "standby launch failed");
                if fresh {
                    known.remove(&t.task_id);
                }
                false
            }
        }
    }

    /// Stops standby processes no plan claimed in time. Skipped while a
    /// plan is being applied (the next call catches up): the heartbeat
    /// calls this, and must not wait for a plan's checkpoints.
    pub async fn expire_standby(&self) {
        let Ok(mut known) = self.known.try_lock() else {
            return;
        };
        let now = std::time::Instant::now();
        let expired: Vec<String> = known
            .iter()
            .filter(|(_, k)| k.standby.as_ref().is_some_and(|s| s.expires <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.drop_standby(&mut known, &id, "no plan claimed it in time")
                .await;
        }
    }

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

    /// The process driver (for metrics).
    pub fn driver(&self) -> &ProcessDriver {
        &self.driver
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A trainer that evaluates several metrics per epoch: the job's report
    /// carries only its target's series (else the first metric it named),
    /// so the merge guard never compares an accuracy with an F1.
    #[test]
    fn only_the_target_metric_is_reported_per_job() {
        let ev = |job: &str, metric: &str, value: f64| {
            (job.to_string(), 0, 1.0, metric.to_string(), value)
        };
        let o = crate::driver::Observed {
            evals: vec![
                ev("a", "accuracy", 0.70),
                ev("a", "f1", 0.60),
                ev("b", "accuracy", 0.50),
                ev("b", "f1", 0.40),
                ev("a", "accuracy", 0.72),
                ev("a", "f1", 0.65),
                ev("b", "accuracy", 0.55),
                ev("b", "f1", 0.45),
            ],
            ..Default::default()
        };
        let metrics: BTreeMap<String, String> = [("a".to_string(), "f1".to_string())].into();
        let got: BTreeMap<String, Vec<f64>> = job_reports(&o, &metrics)
            .into_iter()
            .map(|r| (r.job_id, r.evals))
            .collect();
        assert_eq!(got["a"], vec![0.60, 0.65], "the target's metric");
        assert_eq!(got["b"], vec![0.50, 0.55], "no target: the first metric");
    }

    /// Each evaluation goes with its epoch (the scheduler keeps a job's
    /// curve per epoch across restarts), also when the series is cut short.
    #[test]
    fn estimate_prior_evaluations_carry_their_epochs() {
        let o = crate::driver::Observed {
            evals: (0..20)
                .map(|e| {
                    let epoch = f64::from(e) + 3.0;
                    ("a".to_string(), 0, epoch, "accuracy".to_string(), 0.5)
                })
                .collect(),
            ..Default::default()
        };
        let r = job_reports(&o, &BTreeMap::new()).remove(0);
        assert_eq!(r.evals.len(), 16);
        assert_eq!(r.eval_epochs.len(), 16);
        assert_eq!(
            r.eval_epochs[0], 3.0,
            "a resumed process starts at its epoch"
        );
        assert_eq!(r.eval_epochs[15], 18.0);
    }

    /// A prompt job's `done` features and its `prompt_init` reach the
    /// scheduler in its job report; an oversized feature vector is dropped
    /// (the scheduler would refuse the whole report).
    #[test]
    fn prompt_bank_reports_reach_the_job_report() {
        use fmsched_core::trainer::Report;
        let o = std::sync::Mutex::new(crate::driver::Observed::default());
        for r in [
            Report::PromptInit {
                job_id: "b".into(),
                from: "a".into(),
                score: 1.25,
                scored: 2,
                candidates: 3,
            },
            Report::Done {
                job_id: "b".into(),
                output: "/o/b/prompt.json".into(),
                prompt_features: vec![0.5, -0.5],
            },
            Report::Done {
                job_id: "c".into(),
                output: "/o/c/prompt.json".into(),
                prompt_features: vec![0.1; crate::driver::MAX_PROMPT_FEATURES + 1],
            },
        ] {
            crate::driver::apply_report(&o, r);
        }
        let reports = job_reports(&o.into_inner().unwrap(), &BTreeMap::new());
        let b = reports.iter().find(|r| r.job_id == "b").unwrap();
        assert_eq!(b.prompt_features, vec![0.5, -0.5]);
        let init = b.prompt_init.as_ref().unwrap();
        assert_eq!(
            (
                init.from_job_id.as_str(),
                init.score,
                init.scored,
                init.candidates
            ),
            ("a", 1.25, 2, 3)
        );
        assert!(
            reports
                .iter()
                .all(|r| r.job_id != "c" || r.prompt_features.is_empty()),
            "too many features are dropped"
        );
    }
}
