//! Phase 5 of a round: every connected node gets its complete desired set
//! under the round's generation and the leader's epoch (agents ignore older
//! generations and plans of a deposed leader), and look-ahead rounds send
//! `PrepareSwitch` hints (Ymir §6.2) for the tasks their predicted plan
//! would start.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::policy::{GpuFootprint, MergeMode};
use fmsched_core::trainer::TrainingSettings;
use fmsched_core::{JobId, NodeId};
use fmsched_proto::v1 as pb;

use super::iteration_budget;
use super::observe::PROFILE_SUFFIX;
use crate::persistence::{Assignment, JobRecord, MergeRecord};
use crate::registry::LiveNode;
use crate::service::Service;

/// The trainer's view of one task of a job (`FMSCHED_TASKS`).
pub(crate) fn trainer_task(job: &JobRecord) -> pb::TrainerTask {
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
        ..settings_to_proto(TrainingSettings::of(s))
    }
}

/// The training settings of a trainer task (the rest left default).
fn settings_to_proto(t: TrainingSettings) -> pb::TrainerTask {
    pb::TrainerTask {
        learning_rate: t.learning_rate,
        optimizer: t.optimizer,
        weight_decay: t.weight_decay,
        amp: t.amp,
        gradient_checkpointing: t.gradient_checkpointing,
        petl: t.petl,
        frozen_layers: t.frozen_layers,
        max_frozen_layers: t.max_frozen_layers,
        objective: t.objective,
        metric_lower_is_better: t.metric_lower_is_better,
        num_virtual_tokens: t.num_virtual_tokens,
        initial_prompt: t.initial_prompt,
        ..Default::default()
    }
}

/// What [`push_plans`] turns into desired tasks.
pub(crate) struct PlanView<'a> {
    pub live: &'a BTreeMap<JobId, JobRecord>,
    pub assignments: &'a [Assignment],
    pub progress: &'a BTreeMap<JobId, (u64, Option<String>)>,
    pub merges: &'a [MergeRecord],
    /// B of a temporal merge whose A completed: A's output weights.
    pub init_weights: &'a BTreeMap<JobId, String>,
    /// Layer-elastic jobs: the frozen layers the tuner picked (else their
    /// spec's).
    pub frozen_layers: &'a BTreeMap<JobId, u32>,
    /// The plan's leases (leasing policies).
    pub leases: &'a BTreeMap<JobId, DateTime<Utc>>,
    /// What each job's process is predicted to take of one GPU alone.
    pub footprints: &'a BTreeMap<JobId, GpuFootprint>,
    /// By model: the Prompt Bank a prompt-tuning job without an initial
    /// prompt gets when it starts afresh.
    pub prompt_banks: &'a BTreeMap<String, Vec<pb::PromptCandidate>>,
    /// Nodes nothing new may start on (cordoned, drained, reclaimed,
    /// faulty): their warm processes are stopped now.
    pub closed: &'a BTreeSet<NodeId>,
    /// Jobs restarted from their initial weights whose fresh process no
    /// node has reported yet (`DesiredTask.fresh_start`).
    pub fresh: &'a BTreeSet<JobId>,
}

/// The desired set of every node the registry knows (empty for a node the
/// plan gives nothing).
fn desired_sets(state: &Service, v: &PlanView<'_>) -> BTreeMap<NodeId, Vec<pb::DesiredTask>> {
    let nodes = state.registry.snapshot();
    let mut per_node: BTreeMap<NodeId, Vec<pb::DesiredTask>> = nodes
        .iter()
        .map(|n| (n.record.id.clone(), Vec::new()))
        .collect();
    // Each job's parts (one per node for a gang), in rank order.
    let mut parts: BTreeMap<(JobId, bool), Vec<&Assignment>> = BTreeMap::new();
    for a in v.assignments {
        parts.entry((a.job, a.profile)).or_default().push(a);
    }
    for p in parts.values_mut() {
        p.sort_by_key(|a| a.rank_offset);
    }
    // GPUs two training processes share (ICEFROG Eq. 8).
    let mut users: BTreeMap<&str, u32> = BTreeMap::new();
    for a in v.assignments.iter().filter(|a| !a.profile) {
        for g in &a.gpus {
            *users.entry(g.0.as_str()).or_default() += 1;
        }
    }
    let mut emitted: BTreeSet<(NodeId, String)> = BTreeSet::new();
    for a in v.assignments {
        let gang = &parts[&(a.job, a.profile)];
        let node_rank = gang.iter().position(|x| x.node == a.node).unwrap_or(0);
        let (world_size, master_addr) = if gang.len() > 1 {
            (
                gang.iter().map(|x| x.gpus.len() as u32).sum(),
                super::master_addr(&nodes, &gang[0].node),
            )
        } else {
            (a.gpus.len() as u32, String::new())
        };
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
            world_size,
            rank_offset: a.rank_offset,
            master_addr,
            master_port: a.master_port.map_or(0, u32::from),
            nnodes: gang.len() as u32,
            node_rank: node_rank as u32,
            tasks: vec![trainer_task(job)],
            pipeline_parallel: job.spec.resources.pipeline_parallel,
            expert_parallel: job.spec.resources.expert_parallel,
            lease_until: None,               // set below for training processes
            expected_utilization_percent: 0, // set below
            // A prompt-tuning job of the lane stays warm for the next
            // request of its model (PromptTuner's warm pools).
            warm: !a.profile && state.in_prompt_lane(job),
            fresh_start: false, // set below for a job's own process
        };
        shape_task(&mut task, a, merge, v);
        adjust_task(&mut task, a, job, v, &users);
        if emitted.insert((a.node.clone(), task.task_id.clone())) {
            per_node.entry(a.node.clone()).or_default().push(task);
        }
    }
    hold_moved_tasks(&nodes, &mut per_node);
    per_node
}

/// A task's shape beyond one job's own process: a profiling run is a
/// process of its own, a spatial pair one joint process, a temporal A's
/// process evaluates B with A's weights, and a warm-started B starts from
/// A's output weights.
fn shape_task(
    task: &mut pb::DesiredTask,
    a: &Assignment,
    merge: Option<&MergeRecord>,
    v: &PlanView<'_>,
) {
    let resume_of = |id: &JobId| v.progress.get(id).and_then(|p| p.1.clone());
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
}

/// What a training process is told beyond its shape: a fresh start, its
/// expected utilisation, a shared GPU, its frozen layers, its model's
/// Prompt Bank, and its lease.
fn adjust_task(
    task: &mut pb::DesiredTask,
    a: &Assignment,
    job: &JobRecord,
    v: &PlanView<'_>,
    users: &BTreeMap<&str, u32>,
) {
    task.fresh_start = !a.profile && task.job_ids.len() == 1 && v.fresh.contains(&a.job);
    if task.fresh_start {
        task.resume_path.clear();
        task.initial_weights_path.clear();
    }
    if !a.profile
        && task.job_ids.len() == 1
        && let Some(f) = v.footprints.get(&a.job)
    {
        task.expected_utilization_percent = f.utilization_pct.round().clamp(1.0, 100.0) as u32;
    }
    if !a.profile && a.gpus.iter().any(|g| users.get(g.0.as_str()) > Some(&1)) {
        // Trainer contract: the process shares its GPU with another.
        task.env
            .insert(fmsched_core::trainer::env::SHARED_GPU.into(), "1".into());
    }
    if !a.profile
        && let ([t], Some(&l)) = (&mut task.tasks[..], v.frozen_layers.get(&a.job))
    {
        t.frozen_layers = l;
    }
    if !a.profile
        && task.resume_path.is_empty()
        && super::prompt_bank::draws_from_bank(job)
        && let ([t], Some(bank)) = (&mut task.tasks[..], v.prompt_banks.get(&job.spec.model))
    {
        t.prompt_bank.clone_from(bank);
    }
    if !a.profile {
        // A merged pair's process holds both leases: the earliest ends it.
        task.lease_until = task
            .job_ids
            .iter()
            .filter_map(|j| j.parse::<JobId>().ok())
            .filter_map(|j| v.leases.get(&j))
            .min()
            .map(|t| fmsched_proto::convert::timestamp_to_proto(*t));
    }
}

/// A training task whose process on some node the plan stops or
/// relaunches (other GPUs or ranks), and that the plan runs on another
/// node too, is started nowhere this round: every process of it stops,
/// rank 0's writes the checkpoint of its stop, and the next round
/// launches every part from that checkpoint. Launched at once, a move
/// resumed from the last checkpoint the scheduler had heard of, or from
/// scratch (found live: a drained node's job restarted at iteration 0 on
/// another node while its history said "from its checkpoint (iteration
/// 14900)"), and a gang that grew onto a node or changed its GPUs
/// resumed its parts from different checkpoints: the one its stop wrote
/// on its rank 0 node, and the plan's older path on the others. A
/// relaunch on its only node needs no wait: that node's agent resumes
/// it from the checkpoint its stop wrote. A process the plan keeps as it
/// runs does not count, so a gang just launched, with one node's report
/// still on its way, is not held back. (An offline node's process does
/// not count either: its jobs go on from their last checkpoint.)
fn hold_moved_tasks(nodes: &[LiveNode], per_node: &mut BTreeMap<NodeId, Vec<pb::DesiredTask>>) {
    let changed: BTreeMap<&str, BTreeSet<&NodeId>> = nodes
        .iter()
        .filter(|n| n.state != fmsched_core::NodeState::Offline)
        .flat_map(|n| {
            let planned = per_node.get(&n.record.id);
            n.observed_tasks
                .iter()
                .filter(move |t| {
                    crate::registry::process_alive(t)
                        && !t.task_id.ends_with(PROFILE_SUFFIX)
                        && planned
                            .and_then(|p| p.iter().find(|d| d.task_id == t.task_id))
                            .is_none_or(|d| !same_launch(t, d))
                })
                .map(move |t| (t.task_id.as_str(), &n.record.id))
        })
        .fold(BTreeMap::new(), |mut m, (t, n)| {
            m.entry(t).or_insert_with(BTreeSet::new).insert(n);
            m
        });
    let waiting: BTreeSet<String> = per_node
        .iter()
        .flat_map(|(node, tasks)| tasks.iter().map(move |d| (node, d)))
        .filter(|(node, d)| {
            d.mode == pb::TaskMode::Train as i32
                && changed
                    .get(d.task_id.as_str())
                    .is_some_and(|on| on.iter().any(|n| n != node))
        })
        .map(|(_, d)| d.task_id.clone())
        .collect();
    for (node, tasks) in per_node.iter_mut() {
        tasks.retain(|d| {
            let wait = waiting.contains(&d.task_id);
            if wait {
                tracing::info!(task = %d.task_id, node_id = %node,
                    "restarted on other nodes: launched here once all its processes have stopped and checkpointed");
            }
            !wait
        });
    }
}

/// Whether the process `t` runs as `d` asks: the same GPUs and ranks (a
/// change relaunches it on its node).
fn same_launch(t: &pb::ObservedTask, d: &pb::DesiredTask) -> bool {
    let mut have: Vec<&str> = t.gpu_uuids.iter().map(String::as_str).collect();
    let mut want: Vec<&str> = d.gpu_uuids.iter().map(String::as_str).collect();
    have.sort_unstable();
    want.sort_unstable();
    have == want && t.world_size == d.world_size && t.rank_offset == d.rank_offset
}

/// The warm idle release of a node nothing new may start on: its warm
/// processes go at once (zero would mean the agent's default).
const CLOSED_WARM_RELEASE: std::time::Duration = std::time::Duration::from_millis(1);

/// Sends every connected node its complete desired set.
pub(crate) fn push_plans(state: &Service, v: &PlanView<'_>, generation: i64, epoch: i64) {
    for (node, tasks) in desired_sets(state, v) {
        let n = tasks.len();
        let msg = pb::SchedulerMessage {
            msg: Some(pb::scheduler_message::Msg::Plan(pb::NodePlan {
                generation,
                tasks,
                epoch,
                warm_idle_release: Some(fmsched_proto::convert::duration_to_proto(
                    if v.closed.contains(&node) {
                        CLOSED_WARM_RELEASE
                    } else {
                        state.config.scheduling.prompt_warm_idle_release
                    },
                )),
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
pub(crate) fn send_switch_hints(
    state: &Service,
    v: &PlanView<'_>,
    held: &BTreeSet<JobId>,
    switch_at: DateTime<Utc>,
) -> usize {
    let mut sent = 0;
    for (node, tasks) in desired_sets(state, v) {
        for task in tasks {
            let jobs: Vec<JobId> = task.job_ids.iter().filter_map(|j| j.parse().ok()).collect();
            let starts = task.mode == pb::TaskMode::Train as i32
                && !jobs.is_empty()
                && jobs.iter().all(|j| {
                    !held.contains(j) && v.live.get(j).is_some_and(|r| r.spec.launch.prewarm)
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
