//! `fmctl bench-agents`: N simulated node agents in one process, speaking
//! the real `AgentService` protocol to a scheduler — register (with the
//! join token), heartbeat with telemetry at a fixed interval, and run the
//! plans they receive with simulated progress: a profiling run reports a
//! loss trace after `profile_s`, a training process advances `it_per_s`
//! iterations per second from its resume point and reports success at its
//! budget, a process the plan drops reports its checkpoint and stops.
//!
//! It measures what the scheduler costs at that scale: heartbeat handling
//! (send → `HeartbeatAck`), agents that had to register again (their
//! session was dropped: a Suspect/Offline flap or a refusal), and — from
//! the scheduler's `/metrics` — round latency, CPU and resident memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fmsched_proto::v1 as pb;
use fmsched_proto::v1::agent_message::Msg;
use fmsched_proto::v1::agent_service_client::AgentServiceClient;
use fmsched_proto::v1::scheduler_message::Msg as SMsg;
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// What the swarm simulates.
#[derive(Clone, Debug)]
pub struct SwarmConfig {
    pub endpoint: String,
    pub join_token: String,
    pub agents: usize,
    pub gpus: u32,
    pub gpu_model: String,
    pub interval: Duration,
    /// Node ids are `<prefix>-<index>`.
    pub prefix: String,
    /// Seconds a profiling run takes.
    pub profile_s: f64,
    /// Iterations a training process makes per second.
    pub it_per_s: f64,
    /// HTTP/2 connections the agents share (each agent is one stream).
    pub connections: usize,
}

/// What the agents saw, shared by all of them.
#[derive(Debug, Default)]
pub struct SwarmStats {
    /// Heartbeat send → acknowledgement.
    pub heartbeats: std::sync::Mutex<Vec<Duration>>,
    pub registered: AtomicUsize,
    /// Registrations after an agent's first: its session was dropped.
    pub reregistrations: AtomicUsize,
    pub refusals: AtomicUsize,
    pub plans: AtomicUsize,
    pub succeeded: AtomicUsize,
    pub suspended: AtomicUsize,
}

impl SwarmStats {
    /// (p50, p99, max) of the heartbeat latencies so far, in ms.
    pub fn heartbeat_ms(&self) -> (f64, f64, f64) {
        let mut v = self
            .heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        v.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        (
            ms(crate::percentile(&v, 50.0)),
            ms(crate::percentile(&v, 99.0)),
            ms(crate::percentile(&v, 100.0)),
        )
    }
}

/// How a simulated process ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    /// It reached its budget: it reports success until the plan drops it
    /// (the scheduler reads only the newest heartbeat of each round).
    Succeeded { at: u64 },
    /// The plan dropped it: it reports its checkpoint a few more times.
    Checkpointed { at: u64, reports_left: u32 },
}

/// One process as the simulated agent runs it.
struct SimTask {
    desired: pb::DesiredTask,
    started: Instant,
    start_iteration: u64,
    budget: u64,
    stopped: Option<Stop>,
}

impl SimTask {
    fn new(desired: pb::DesiredTask) -> Self {
        // Resume paths are `/swarm/ckpt/<task>/<iteration>` (ours).
        let start_iteration = desired
            .resume_path
            .rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let budget = desired
            .tasks
            .iter()
            .map(|t| t.max_iterations)
            .max()
            .filter(|&b| b > 0)
            .unwrap_or(1000);
        Self {
            desired,
            started: Instant::now(),
            start_iteration,
            budget,
            stopped: None,
        }
    }

    fn profiling(&self) -> bool {
        self.desired.mode == pb::TaskMode::Profile as i32
    }

    fn iteration(&self, it_per_s: f64) -> u64 {
        let ran = (self.started.elapsed().as_secs_f64() * it_per_s) as u64;
        (self.start_iteration + ran).min(self.budget)
    }

    /// The report of this process now.
    fn observed(&self, cfg: &SwarmConfig) -> pb::ObservedTask {
        let d = &self.desired;
        let mut t = pb::ObservedTask {
            task_id: d.task_id.clone(),
            job_ids: d.job_ids.clone(),
            pid: 1,
            gpu_uuids: d.gpu_uuids.clone(),
            rank_offset: d.rank_offset,
            world_size: d.world_size,
            step_time_s: 1.0 / cfg.it_per_s.max(1e-9),
            ..Default::default()
        };
        if self.profiling() {
            let done = self.started.elapsed().as_secs_f64() >= cfg.profile_s;
            t.phase = if done {
                pb::TaskPhase::Succeeded
            } else {
                pb::TaskPhase::Running
            } as i32;
            if done {
                // A plateauing loss (Ymir Eq. 3 fits it) and an embedding.
                t.trace_iterations = (1..=40).map(|i| f64::from(i) * 10.0).collect();
                t.trace_losses = (1..=40)
                    .map(|i| 0.3 + 2.0 / (1.0 + 0.05 * f64::from(i) * 10.0))
                    .collect();
                t.fisher = vec![1.0; 8];
                t.fisher_repeat = vec![1.0; 8];
            }
            return t;
        }
        let (iteration, phase) = match self.stopped {
            Some(Stop::Succeeded { at }) => (at, pb::TaskPhase::Succeeded),
            Some(Stop::Checkpointed { at, .. }) => (at, pb::TaskPhase::Suspended),
            None => {
                let it = self.iteration(cfg.it_per_s);
                let phase = if it >= self.budget {
                    pb::TaskPhase::Succeeded
                } else {
                    pb::TaskPhase::Running
                };
                (it, phase)
            }
        };
        t.phase = phase as i32;
        t.iteration = iteration;
        t.loss = 0.3 + 2.0 / (1.0 + 0.01 * iteration as f64);
        t.checkpoint_path = format!("/swarm/ckpt/{}/{iteration}", d.task_id);
        t.jobs = d
            .job_ids
            .iter()
            .map(|j| pb::JobReport {
                job_id: j.clone(),
                iteration,
                loss: t.loss,
                ..Default::default()
            })
            .collect();
        if phase == pb::TaskPhase::Succeeded {
            t.outputs = d
                .job_ids
                .iter()
                .map(|j| (j.clone(), format!("/swarm/out/{j}")))
                .collect();
        }
        t
    }
}

/// Runs one agent until `stop` is set: registers, heartbeats, applies
/// plans; registers again (counted) when its session ends.
pub async fn run_agent(
    cfg: Arc<SwarmConfig>,
    index: usize,
    channel: Channel,
    stats: Arc<SwarmStats>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let node = format!("{}-{index:04}", cfg.prefix);
    let instance = uuid::Uuid::new_v4().simple().to_string();
    let mut node_token = String::new();
    let mut tasks: BTreeMap<String, SimTask> = BTreeMap::new();
    let mut first = true;
    // Spread the agents over the interval, as hosts booted at random.
    let offset = cfg.interval.mul_f64((index as f64 * 0.618_034) % 1.0);
    tokio::time::sleep(offset).await;
    while !stop.load(Ordering::Relaxed) {
        let mut client = AgentServiceClient::new(channel.clone());
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(16);
        let reg = register_message(&cfg, &node, &node_token, &instance);
        let _ = tx
            .send(pb::AgentMessage {
                msg: Some(Msg::Register(reg)),
            })
            .await;
        let session = client
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
        let mut inbound = match session {
            Ok(r) => r.into_inner(),
            Err(_) => {
                stats.refusals.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        match inbound.message().await {
            Ok(Some(pb::SchedulerMessage {
                msg: Some(SMsg::RegisterAck(ack)),
            })) => {
                if !ack.node_token.is_empty() {
                    node_token = ack.node_token;
                }
            }
            _ => {
                stats.refusals.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        }
        if first {
            stats.registered.fetch_add(1, Ordering::Relaxed);
            first = false;
        } else {
            stats.reregistrations.fetch_add(1, Ordering::Relaxed);
        }
        let mut sent: BTreeMap<u64, Instant> = BTreeMap::new();
        let mut seq = 0u64;
        let mut tick = tokio::time::interval(cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::select! {
                _ = tick.tick() => {
                    seq += 1;
                    let busy: std::collections::BTreeSet<&str> = tasks
                        .values()
                        .filter(|t| t.stopped.is_none())
                        .flat_map(|t| t.desired.gpu_uuids.iter().map(String::as_str))
                        .collect();
                    let gpus = (0..cfg.gpus)
                        .map(|i| {
                            let uuid = format!("GPU-{node}-{i}");
                            pb::GpuTelemetry {
                                utilization_percent: if busy.contains(uuid.as_str()) { 95 } else { 0 },
                                memory_total_bytes: 80 << 30,
                                temperature_celsius: 40,
                                uuid,
                                ..Default::default()
                            }
                        })
                        .collect();
                    let observed: Vec<pb::ObservedTask> = tasks.values().map(|t| t.observed(&cfg)).collect();
                    for t in &observed {
                        let phase = pb::TaskPhase::try_from(t.phase).unwrap_or_default();
                        if phase == pb::TaskPhase::Succeeded && !t.task_id.ends_with("-profile") {
                            // Counted once: the first heartbeat that says so.
                            if let Some(s) = tasks.get_mut(&t.task_id)
                                && s.stopped.is_none()
                            {
                                s.stopped = Some(Stop::Succeeded { at: t.iteration });
                                stats.succeeded.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    // Stopped processes are reported a few times, then forgotten.
                    tasks.retain(|_, t| match &mut t.stopped {
                        Some(Stop::Checkpointed { reports_left, .. }) => {
                            *reports_left = reports_left.saturating_sub(1);
                            *reports_left > 0
                        }
                        _ => true,
                    });
                    sent.insert(seq, Instant::now());
                    let hb = pb::Heartbeat {
                        sequence: seq,
                        gpus,
                        tasks: observed,
                        ..Default::default()
                    };
                    if tx.send(pb::AgentMessage { msg: Some(Msg::Heartbeat(hb)) }).await.is_err() {
                        break;
                    }
                }
                m = inbound.message() => match m {
                    Ok(Some(pb::SchedulerMessage { msg: Some(SMsg::HeartbeatAck(a)) })) => {
                        if let Some(t) = sent.remove(&a.sequence) {
                            stats.heartbeats.lock().unwrap_or_else(|p| p.into_inner()).push(t.elapsed());
                        }
                        sent.retain(|&s, _| s > a.sequence);
                    }
                    Ok(Some(pb::SchedulerMessage { msg: Some(SMsg::Plan(p)) })) => {
                        stats.plans.fetch_add(1, Ordering::Relaxed);
                        apply_plan(&cfg, &mut tasks, p, &stats);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A simulated agent's registration: its fake GPUs, its node token once
/// enrolled, its instance id.
fn register_message(
    cfg: &SwarmConfig,
    node: &str,
    node_token: &str,
    instance: &str,
) -> pb::Register {
    pb::Register {
        node_id: node.to_string(),
        hostname: node.to_string(),
        gpus: (0..cfg.gpus)
            .map(|i| pb::GpuInfo {
                uuid: format!("GPU-{node}-{i}"),
                index: i,
                model: cfg.gpu_model.clone(),
                memory_total_bytes: 80 << 30,
                pci_bus_id: format!("0000:{i:02x}:00.0"),
            })
            .collect(),
        agent_version: concat!("swarm-", env!("CARGO_PKG_VERSION")).into(),
        join_token: cfg.join_token.clone(),
        gpu_backend: "fake".into(),
        node_token: node_token.to_string(),
        instance_id: instance.to_string(),
        ..Default::default()
    }
}

/// Starts what the plan runs that is not running, and stops (with a
/// checkpoint) what runs that the plan no longer has.
fn apply_plan(
    cfg: &SwarmConfig,
    tasks: &mut BTreeMap<String, SimTask>,
    plan: pb::NodePlan,
    stats: &SwarmStats,
) {
    let wanted: BTreeMap<String, pb::DesiredTask> = plan
        .tasks
        .into_iter()
        .filter(|t| t.phase == pb::DesiredPhase::Running as i32)
        .map(|t| (t.task_id.clone(), t))
        .collect();
    // A finished process the plan dropped is gone (its job completed).
    tasks.retain(|id, t| {
        !matches!(t.stopped, Some(Stop::Succeeded { .. })) || wanted.contains_key(id)
    });
    for (id, t) in tasks.iter_mut() {
        if t.stopped.is_none() && !wanted.contains_key(id) {
            t.stopped = Some(Stop::Checkpointed {
                at: t.iteration(cfg.it_per_s),
                reports_left: 3,
            });
            stats.suspended.fetch_add(1, Ordering::Relaxed);
        }
    }
    for (id, d) in wanted {
        let start = match tasks.get(&id) {
            None => true,
            Some(t) => matches!(t.stopped, Some(Stop::Checkpointed { .. })),
        };
        if start {
            tasks.insert(id, SimTask::new(d));
        }
    }
}

/// A figure read from a Prometheus exposition (the unlabelled sample, or
/// the one with `label`).
pub fn metric(exposition: &str, name: &str, label: Option<&str>) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let rest = match label {
            Some(lb) => rest.strip_prefix('{')?.strip_prefix(lb)?.split_once('}')?.1,
            None => rest,
        };
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// Fetches `http://addr/metrics` (`addr` = host:port).
pub async fn scrape(addr: &str) -> Option<String> {
    let at = tokio::net::lookup_host(addr).await.ok()?.next()?;
    fmsched_runtime::metrics::scrape(at).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SwarmConfig {
        SwarmConfig {
            endpoint: String::new(),
            join_token: String::new(),
            agents: 1,
            gpus: 8,
            gpu_model: "A100-80GB".into(),
            interval: Duration::from_secs(1),
            prefix: "s".into(),
            profile_s: 0.0,
            it_per_s: 1e9,
            connections: 1,
        }
    }

    fn desired(id: &str, mode: pb::TaskMode, resume: &str) -> pb::DesiredTask {
        pb::DesiredTask {
            task_id: id.into(),
            job_ids: vec![id.trim_end_matches("-profile").into()],
            mode: mode as i32,
            phase: pb::DesiredPhase::Running as i32,
            resume_path: resume.into(),
            tasks: vec![pb::TrainerTask {
                max_iterations: 500,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn simulated_processes_resume_finish_and_report_checkpoints() {
        let c = cfg();
        let t = SimTask::new(desired("j", pb::TaskMode::Train, "/swarm/ckpt/j/120"));
        assert_eq!(t.start_iteration, 120);
        let o = t.observed(&c);
        assert_eq!(o.phase, pb::TaskPhase::Succeeded as i32, "at 1e9 it/s");
        assert_eq!(
            (o.iteration, o.outputs["j"].as_str()),
            (500, "/swarm/out/j")
        );
        let mut done = SimTask::new(desired("j", pb::TaskMode::Train, ""));
        done.stopped = Some(Stop::Succeeded { at: 500 });
        assert_eq!(
            done.observed(&c).phase,
            pb::TaskPhase::Succeeded as i32,
            "a finished process says so until the plan drops it"
        );
        let p = SimTask::new(desired("j-profile", pb::TaskMode::Profile, "")).observed(&c);
        assert_eq!(p.phase, pb::TaskPhase::Succeeded as i32);
        assert_eq!(p.trace_losses.len(), 40);
        // The plan drops a running process: it reports its checkpoint.
        let slow = SwarmConfig { it_per_s: 0.0, ..c };
        let stats = SwarmStats::default();
        let mut tasks = BTreeMap::new();
        let plan = |t: Vec<pb::DesiredTask>| pb::NodePlan {
            generation: 1,
            tasks: t,
            epoch: 1,
            warm_idle_release: None,
        };
        apply_plan(
            &slow,
            &mut tasks,
            plan(vec![desired("k", pb::TaskMode::Train, "/swarm/ckpt/k/40")]),
            &stats,
        );
        apply_plan(&slow, &mut tasks, plan(vec![]), &stats);
        let o = tasks["k"].observed(&slow);
        assert_eq!(o.phase, pb::TaskPhase::Suspended as i32);
        assert_eq!(o.checkpoint_path, "/swarm/ckpt/k/40");
        assert_eq!(stats.suspended.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn metrics_are_read_with_and_without_labels() {
        let e = "# HELP x\nfmsched_nodes{state=\"suspect\"} 3\nfmsched_rounds_total 12\n";
        assert_eq!(metric(e, "fmsched_rounds_total", None), Some(12.0));
        assert_eq!(
            metric(e, "fmsched_nodes", Some("state=\"suspect\"")),
            Some(3.0)
        );
        assert_eq!(metric(e, "fmsched_nodes", None), None);
    }
}
