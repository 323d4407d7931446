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

mod report;
mod standby;
mod warm;

pub use standby::SwitchStats;
pub use warm::WARM_IDLE_RELEASE;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fmsched_core::trainer::{TaskAssignment, TrainingSettings};
use fmsched_proto::v1 as pb;

use crate::driver::{LaunchSpec, ProcessDriver, Ranks};
use crate::gpu::GpuBackend;
use crate::reconcile::report::{target_metrics, watched};
use crate::reconcile::standby::Standby;
use crate::reconcile::warm::{WarmProc, WarmStop};

/// What the reconciler remembers of a task between plans.
#[derive(Clone, Debug, Default)]
pub(crate) struct Known {
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

/// Whether the plan runs desired task `t` on a GPU another process shares
/// (`FMSCHED_SHARED_GPU=1` in its environment; ICEFROG GPU sharing).
fn shared_of(t: &pb::DesiredTask) -> bool {
    t.env
        .get(fmsched_core::trainer::env::SHARED_GPU)
        .is_some_and(|v| v == "1")
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

/// A desired task's lease end in Unix seconds (None: no lease).
fn lease_end_of(t: &pb::DesiredTask) -> Option<f64> {
    t.lease_until
        .as_ref()
        .map(|ts| ts.seconds as f64 + f64::from(ts.nanos) / 1e9)
        .filter(|&s| s > 0.0)
}

/// The frozen layers a process trains with (its trained task's).
pub(crate) fn frozen_of(tasks: &[TaskAssignment]) -> u32 {
    tasks
        .iter()
        .find(|t| !t.eval_only)
        .map_or(0, |t| t.settings.frozen_layers)
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
    pub(super) fn stage_order(&self, gpus: &[u32]) -> Vec<u32> {
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
    pub(super) fn trained_in_order(&self, spec: &LaunchSpec) {
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

    /// The launch of desired task `t` on GPU indices `gpus`.
    pub(super) fn launch_spec(
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
            working_dir: t.working_dir.clone(),
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
    pub(super) fn resume_of(t: &pb::DesiredTask, entry: &Known) -> Option<PathBuf> {
        Some(PathBuf::from(&t.resume_path))
            .filter(|p| !p.as_os_str().is_empty())
            .or_else(|| entry.checkpoint.as_ref().map(|c| c.0.clone()))
    }

    /// GPU indices of the plan's UUIDs (unknown UUIDs are an error: the
    /// plan was made for another inventory).
    pub(super) fn indices(&self, uuids: &[String]) -> Result<Vec<u32>, String> {
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
                let prewarmed = status.as_ref().is_some_and(|s| s.observed.prewarmed);
                match self
                    .start_standby(entry, plan, t, &gpus, &sb, alive, prewarmed)
                    .await
                {
                    Ok(()) => continue,
                    Err(why) => self.drop_standby(&mut known, &t.task_id, why).await,
                }
            } else if alive
                && !restart_fresh
                && entry.gpus == gpus
                && entry.ranks == ranks_of(t, gpus.len() as u32)
                && t.tasks
                    .iter()
                    .filter(|x| x.eval_only)
                    .all(|x| entry.watching.contains(&x.job_id))
            {
                self.retune_running(entry, plan, t, &mut problems).await;
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
            self.launch_task(entry, plan, t, gpus, resume, &claimed, &mut problems)
                .await;
        }
        problems
    }

    /// Starts a task launched ahead of this plan (a pipeline switch's
    /// standby) when the plan runs it as it was launched and it is ready;
    /// otherwise says why not (the caller stops it and launches afresh).
    #[allow(clippy::too_many_arguments)]
    async fn start_standby(
        &self,
        entry: &mut Known,
        plan: &pb::NodePlan,
        t: &pb::DesiredTask,
        gpus: &[u32],
        sb: &Standby,
        alive: bool,
        prewarmed: bool,
    ) -> Result<(), &'static str> {
        let wanted = LaunchSpec {
            standby: true,
            ..self.launch_spec(t, gpus, Self::resume_of(t, entry))
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
                .process_started(entry.pid, gpus, t.expected_utilization_percent);
            self.trained_in_order(&sb.spec);
            let lead = sb.since.elapsed();
            let ready = prewarmed;
            self.count(|c| {
                c.standby_started += 1;
                c.standby_lead_seconds_sum += lead.as_secs_f64();
            });
            tracing::info!(task = %t.task_id, ?lead, ready_before_plan = ready, generation = plan.generation,
                "started from standby (pipeline switch)");
            return Ok(());
        }
        Err(if !alive {
            "it died"
        } else if sb.spec.gpus != wanted.gpus {
            "the plan runs it on other GPUs"
        } else if sb.spec != wanted {
            "the plan launches it differently"
        } else {
            "it never reported prewarmed"
        })
    }

    /// A running task the plan keeps where it is: takes the plan's
    /// generation, and tells the trainer through its control file (the
    /// whole of it each time) a new frozen-layer count, lease end or GPU
    /// partner, applied without a restart (ℓ at its next epoch).
    async fn retune_running(
        &self,
        entry: &mut Known,
        plan: &pb::NodePlan,
        t: &pb::DesiredTask,
        problems: &mut Vec<String>,
    ) {
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
    }

    /// Launches a task the plan runs (resuming from `resume` when given),
    /// on a warm process the plan claimed for it when there is one, and
    /// records what now runs.
    #[allow(clippy::too_many_arguments)]
    async fn launch_task(
        &self,
        entry: &mut Known,
        plan: &pb::NodePlan,
        t: &pb::DesiredTask,
        gpus: Vec<u32>,
        resume: Option<PathBuf>,
        claimed: &BTreeMap<String, String>,
        problems: &mut Vec<String>,
    ) {
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

    pub(super) async fn stop(&self, known: &mut BTreeMap<String, Known>, id: &str) {
        self.stop_all(known, &[id.to_string()]).await;
    }

    /// Suspends processes `ids` concurrently (each: checkpoint, SIGTERM,
    /// SIGKILL after the grace) and records what each left.
    pub(super) async fn stop_all(&self, known: &mut BTreeMap<String, Known>, ids: &[String]) {
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

    /// The process driver (for metrics).
    pub fn driver(&self) -> &ProcessDriver {
        &self.driver
    }
}

#[cfg(test)]
mod tests;
