//! `AgentService.Session`: one long-lived stream per node agent.
//!
//! Protocol: the first message must be `Register` with the join token; the
//! registration is persisted, then acknowledged with the heartbeat interval.
//! Heartbeats and task updates only touch the in-memory registry (telemetry
//! is relearned after a restart). The session ends when the agent hangs up,
//! when a newer session of the same node replaces it, or when the node is
//! declared Offline.

use std::sync::Arc;

use std::collections::BTreeSet;

use chrono::Utc;
use fmsched_core::{GpuUuid, NodeId, NodeState};
use fmsched_proto::convert::{duration_to_proto, timestamp_to_proto};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::agent_message::Msg;
use fmsched_proto::v1::agent_service_server::AgentService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::agent_traffic::{MessageBudget, clamp_telemetry};
use super::{ApiError, check_len};
use crate::auth::NodeAuth;
use crate::persistence::{GpuRecord, NodeRecord};
use crate::service::Service;

pub struct AgentApi {
    state: Service,
    /// Held from a registration's duplicate check to its session being
    /// recorded (registrations are rare; heartbeats never take it).
    registering: tokio::sync::Mutex<()>,
}

impl AgentApi {
    pub fn new(state: Service) -> Self {
        Self {
            state,
            registering: tokio::sync::Mutex::new(()),
        }
    }

    /// A session's first message, which must be the agent's `register`
    /// within `liveness.register_timeout`.
    async fn first_register(
        &self,
        inbound: &mut Streaming<pb::AgentMessage>,
    ) -> Result<pb::Register, Status> {
        let timeout = self.state.config.liveness.register_timeout;
        let first = match tokio::time::timeout(timeout, inbound.message()).await {
            Err(_) => return Err(Status::deadline_exceeded("no Register message in time")),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(None)) => {
                return Err(Status::cancelled(
                    "agent closed the stream before registering",
                ));
            }
            Ok(Ok(Some(m))) => m,
        };
        let Some(Msg::Register(reg)) = first.msg else {
            return Err(ApiError::field(
                "msg",
                "the first message of a session must be `register`",
            )
            .into());
        };
        Ok(reg)
    }

    /// Refuses a registration while another agent process holds a live
    /// session on the node id (a cloned host image, say): counted, recorded
    /// as a node event, and answered ALREADY_EXISTS naming both agents.
    async fn refuse_a_second_agent(
        &self,
        node_id: &NodeId,
        reg: &pb::Register,
        record: &crate::persistence::NodeRecord,
        fence: &crate::persistence::Fence,
        now: chrono::DateTime<Utc>,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<(), Status> {
        let within = self.state.config.liveness.suspect_after;
        if let Some(held) =
            self.state
                .registry
                .live_session_of_another(node_id, &reg.instance_id, now, within)
        {
            let ago = (now - held.last_heard).num_milliseconds().max(0) as f64 / 1000.0;
            // Names no instance id: one is half of what a registration
            // presents, and the refusal goes to whoever asked.
            let message = format!(
                "node {node_id} already has a live session (agent on host {:?}, heard {ago:.1} s ago); \
                 a second agent with the same node id (host {:?}) is refused until that session ends \
                 (a cloned host image? give each host its own node_id)",
                held.hostname, record.hostname
            );
            tracing::warn!(node_id = %node_id, ?peer, "{message}");
            self.state
                .metrics
                .update(|m| m.duplicate_registrations += 1);
            if let Err(e) = self
                .state
                .persistence
                .node_event(node_id, "duplicate_refused", &message, fence, now)
                .await
            {
                tracing::warn!(node_id = %node_id, error = %e, "duplicate-registration event not written");
            }
            return Err(ApiError::AlreadyExists(message).into());
        }
        Ok(())
    }
}

/// Checks a registration and turns it into the record to persist.
pub fn validate_register(
    reg: &pb::Register,
    now: chrono::DateTime<Utc>,
) -> Result<NodeRecord, ApiError> {
    let id = NodeId::try_from(reg.node_id.clone())
        .map_err(|e| ApiError::field("register.node_id", e))?;
    check_len("register.hostname", &reg.hostname, 253)?;
    check_len("register.address", &reg.address, 253)?;
    if reg
        .address
        .contains(|c: char| c.is_whitespace() || c == '/' || c.is_control())
    {
        return Err(ApiError::field(
            "register.address",
            "must be a host name or IP address",
        ));
    }
    check_len("register.agent_version", &reg.agent_version, 128)?;
    if !matches!(reg.gpu_backend.as_str(), "nvml" | "fake") {
        return Err(ApiError::field(
            "register.gpu_backend",
            "must be \"nvml\" or \"fake\"",
        ));
    }
    if reg.labels.len() > 64 {
        return Err(ApiError::field("register.labels", "at most 64 labels"));
    }
    for (k, v) in &reg.labels {
        check_len("register.labels (key)", k, 253)?;
        check_len(&format!("register.labels[{k:?}]"), v, 1024)?;
    }
    if reg.gpus.len() > limits::GPUS {
        return Err(ApiError::field(
            "register.gpus",
            format!("at most {} GPUs per node", limits::GPUS),
        ));
    }
    check_len("register.node_token", &reg.node_token, 256)?;
    check_len("register.instance_id", &reg.instance_id, 128)?;
    if reg.tasks.len() > limits::TASKS {
        return Err(ApiError::field(
            "register.tasks",
            format!("at most {} processes", limits::TASKS),
        ));
    }
    for (i, t) in reg.tasks.iter().enumerate() {
        validate_observed_task(&format!("register.tasks[{i}]"), t)?;
    }
    let mut seen_uuid = BTreeSet::new();
    let mut seen_idx = BTreeSet::new();
    let mut gpus = Vec::with_capacity(reg.gpus.len());
    for (i, g) in reg.gpus.iter().enumerate() {
        let f = |name: &str| format!("register.gpus[{i}].{name}");
        if g.uuid.is_empty() {
            return Err(ApiError::field(f("uuid"), "is required"));
        }
        check_len(&f("uuid"), &g.uuid, 128)?;
        check_len(&f("model"), &g.model, 253)?;
        check_len(&f("pci_bus_id"), &g.pci_bus_id, 64)?;
        if !seen_uuid.insert(g.uuid.clone()) {
            return Err(ApiError::field(
                f("uuid"),
                format!("{} appears twice", g.uuid),
            ));
        }
        if !seen_idx.insert(g.index) {
            return Err(ApiError::field(
                f("index"),
                format!("{} appears twice", g.index),
            ));
        }
        gpus.push(GpuRecord {
            uuid: GpuUuid(g.uuid.clone()),
            index: g.index,
            model: g.model.clone(),
            memory_total_bytes: g.memory_total_bytes,
            pci_bus_id: g.pci_bus_id.clone(),
        });
    }
    Ok(NodeRecord {
        id,
        hostname: reg.hostname.clone(),
        address: reg.address.clone(),
        agent_version: reg.agent_version.clone(),
        gpu_backend: reg.gpu_backend.clone(),
        labels: reg.labels.clone().into_iter().collect(),
        state: NodeState::Available,
        registered_at: now,
        last_heartbeat_at: now,
        gpus,
    })
}

/// Limits on what one agent message may carry. Generous for any real node
/// (a node runs a few processes on at most 64 GPUs); they bound the memory
/// and work a broken or hostile agent can cause, and every count the
/// scheduler does arithmetic on.
pub mod limits {
    /// Processes in one heartbeat or registration.
    pub const TASKS: usize = 1024;
    /// GPUs per node (registration and telemetry).
    pub const GPUS: usize = 64;
    /// Bytes of one log chunk (an agent sends at most 1 MiB per request).
    pub const LOG_CHUNK: usize = 1 << 20;
    /// Jobs one process trains or evaluates, and its outputs.
    pub const JOBS_PER_TASK: usize = 16;
    /// Points of a loss trace, an embedding or one job's evaluations.
    pub const SERIES: usize = 1 << 16;
    /// Per-layer values of one job.
    pub const LAYERS: usize = 4096;
    /// Activation features of one tuned prompt (a model's hidden size; the
    /// agent drops longer ones, `node_agent::driver::MAX_PROMPT_FEATURES`).
    pub const PROMPT_FEATURES: usize = 16_384;
    /// Bytes of a process's message (its last log lines) and of a path.
    pub const MESSAGE: usize = 64 * 1024;
    pub const PATH: usize = 4096;
}

/// `field` holds `n` entries; at most `max` are allowed.
fn at_most(field: String, n: usize, max: usize) -> Result<(), ApiError> {
    if n > max {
        return Err(ApiError::field(
            field,
            format!("has {n} entries; at most {max} are allowed"),
        ));
    }
    Ok(())
}

/// An iteration count fits Postgres' BIGINT (and f64 arithmetic).
fn fits_bigint(field: String, v: u64) -> Result<(), ApiError> {
    if v > i64::MAX as u64 {
        return Err(ApiError::field(
            field,
            format!("must be at most {}", i64::MAX),
        ));
    }
    Ok(())
}

/// Checks one process report against [`limits`], naming the field.
pub fn validate_observed_task(field: &str, t: &pb::ObservedTask) -> Result<(), ApiError> {
    use limits::*;
    let f = |name: &str| format!("{field}.{name}");
    check_len(&f("task_id"), &t.task_id, 256)?;
    at_most(f("job_ids"), t.job_ids.len(), JOBS_PER_TASK)?;
    for j in &t.job_ids {
        check_len(&f("job_ids"), j, 64)?;
    }
    at_most(f("gpu_uuids"), t.gpu_uuids.len(), GPUS)?;
    for g in &t.gpu_uuids {
        check_len(&f("gpu_uuids"), g, 128)?;
    }
    check_len(&f("checkpoint_path"), &t.checkpoint_path, PATH)?;
    check_len(&f("message"), &t.message, MESSAGE)?;
    at_most(f("outputs"), t.outputs.len(), JOBS_PER_TASK)?;
    for (k, v) in &t.outputs {
        check_len(&f("outputs (key)"), k, 64)?;
        check_len(&format!("{field}.outputs[{k:?}]"), v, PATH)?;
    }
    at_most(f("trace_iterations"), t.trace_iterations.len(), SERIES)?;
    at_most(f("trace_losses"), t.trace_losses.len(), SERIES)?;
    at_most(f("fisher"), t.fisher.len(), SERIES)?;
    at_most(f("fisher_repeat"), t.fisher_repeat.len(), SERIES)?;
    at_most(f("jobs"), t.jobs.len(), JOBS_PER_TASK)?;
    fits_bigint(f("iteration"), t.iteration)?;
    if !(t.step_time_s.is_finite() && t.step_time_s >= 0.0) {
        return Err(ApiError::field(
            f("step_time_s"),
            format!("must be a finite number >= 0, got {}", t.step_time_s),
        ));
    }
    if t.world_size as usize > GPUS * 4096 || t.rank_offset >= t.world_size.max(1) {
        return Err(ApiError::field(
            f("rank_offset"),
            format!(
                "rank {} does not fit a world of {} ranks",
                t.rank_offset, t.world_size
            ),
        ));
    }
    for (i, r) in t.jobs.iter().enumerate() {
        let g = |name: &str| format!("{field}.jobs[{i}].{name}");
        check_len(&g("job_id"), &r.job_id, 64)?;
        fits_bigint(g("iteration"), r.iteration)?;
        at_most(g("evals"), r.evals.len(), SERIES)?;
        if !r.eval_epochs.is_empty() && r.eval_epochs.len() != r.evals.len() {
            return Err(ApiError::field(
                g("eval_epochs"),
                format!(
                    "{} epochs for {} evals: one per evaluation, or none",
                    r.eval_epochs.len(),
                    r.evals.len()
                ),
            ));
        }
        if let Some(k) = r
            .eval_epochs
            .iter()
            .position(|e| !e.is_finite() || *e < 0.0)
        {
            return Err(ApiError::field(
                format!("{}[{k}]", g("eval_epochs")),
                "must be a finite number >= 0",
            ));
        }
        at_most(g("layer_variance"), r.layer_variance.len(), LAYERS)?;
        at_most(
            g("prompt_features"),
            r.prompt_features.len(),
            PROMPT_FEATURES,
        )?;
        if let Some(k) = r.prompt_features.iter().position(|x| !x.is_finite()) {
            return Err(ApiError::field(
                format!("{}[{k}]", g("prompt_features")),
                "must be a finite number",
            ));
        }
        if let Some(p) = &r.prompt_init {
            check_len(&g("prompt_init.from_job_id"), &p.from_job_id, 64)?;
            if !p.score.is_finite() {
                return Err(ApiError::field(
                    g("prompt_init.score"),
                    format!("must be a finite number, got {}", p.score),
                ));
            }
        }
    }
    Ok(())
}

/// Checks a heartbeat against [`limits`], naming the field.
pub fn validate_heartbeat(hb: &pb::Heartbeat) -> Result<(), ApiError> {
    if hb.gpus.len() > limits::GPUS {
        return Err(ApiError::field(
            "heartbeat.gpus",
            format!("at most {} GPUs per node", limits::GPUS),
        ));
    }
    if hb.tasks.len() > limits::TASKS {
        return Err(ApiError::field(
            "heartbeat.tasks",
            format!("at most {} processes per heartbeat", limits::TASKS),
        ));
    }
    for (i, t) in hb.tasks.iter().enumerate() {
        validate_observed_task(&format!("heartbeat.tasks[{i}]"), t)?;
    }
    if hb.warm.len() > limits::GPUS {
        return Err(ApiError::field(
            "heartbeat.warm",
            format!("at most {} warm processes per node", limits::GPUS),
        ));
    }
    for (i, w) in hb.warm.iter().enumerate() {
        let f = |k: &str| format!("heartbeat.warm[{i}].{k}");
        check_len(&f("model"), &w.model, 128)?;
        at_most(f("gpu_uuids"), w.gpu_uuids.len(), limits::GPUS)?;
        for u in &w.gpu_uuids {
            check_len(&f("gpu_uuids"), u, 128)?;
        }
    }
    Ok(())
}

/// Checks a log chunk against [`limits`], naming the field.
pub fn validate_log_data(d: &pb::LogData) -> Result<(), ApiError> {
    if d.data.len() > limits::LOG_CHUNK {
        return Err(ApiError::field(
            "log_data.data",
            format!(
                "is {} bytes; at most {} per chunk",
                d.data.len(),
                limits::LOG_CHUNK
            ),
        ));
    }
    check_len("log_data.task_id", &d.task_id, 256)?;
    check_len("log_data.error", &d.error, limits::MESSAGE)
}

/// Checks one message of an open session (see [`limits`]).
pub fn validate_agent_message(m: &pb::AgentMessage) -> Result<(), ApiError> {
    match &m.msg {
        Some(Msg::Heartbeat(hb)) => validate_heartbeat(hb),
        Some(Msg::TaskStatus(ts)) => match &ts.task {
            Some(t) => validate_observed_task("task_status.task", t),
            None => Ok(()),
        },
        Some(Msg::LogData(d)) => validate_log_data(d),
        Some(Msg::Register(_)) | None => Ok(()),
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    type SessionStream = ReceiverStream<Result<pb::SchedulerMessage, Status>>;

    async fn session(
        &self,
        req: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let Some(fence) = self.state.leadership.fence() else {
            // Agents retry and rotate through their endpoints to the leader.
            return Err(Status::unavailable(
                "this scheduler replica is a standby; connect to the active one",
            ));
        };
        let peer = req.remote_addr();
        let mut inbound = req.into_inner();
        let reg = self.first_register(&mut inbound).await?;
        let now = Utc::now();
        let record = validate_register(&reg, now)?;
        let node_id = record.id.clone();
        // One registration at a time: the duplicate check, the write and
        // the session it opens are one step, so two agents racing for one
        // node id cannot both pass, nor leave the loser's inventory behind.
        let _one_at_a_time = self.registering.lock().await;
        let stored = self
            .state
            .persistence
            .node_token_sha256(&node_id)
            .await
            .map_err(ApiError::from)?;
        let how = self
            .state
            .auth
            .authenticate_node(
                node_id.as_str(),
                &reg.node_token,
                &reg.join_token,
                stored.as_deref(),
            )
            .map_err(|e| {
                tracing::warn!(node_id = %node_id, ?peer, error = %e, "agent refused");
                self.state.metrics.update(|m| m.refused_registrations += 1);
                Status::unauthenticated(e.to_string())
            })?;
        self.refuse_a_second_agent(&node_id, &reg, &record, &fence, now, peer)
            .await?;
        let (issued, enrolled) = match how {
            NodeAuth::NodeToken => (None, None),
            NodeAuth::Enroll { token, sha256 } => (Some(token), Some(sha256)),
        };
        self.state
            .persistence
            .register_node(&record, enrolled.as_deref(), Some(&fence), now)
            .await
            .map_err(ApiError::from)?;
        tracing::info!(node_id = %node_id, gpus = record.gpus.len(), backend = %record.gpu_backend,
            agent_version = %record.agent_version, ?peer, running_tasks = reg.tasks.len(),
            enrolled = issued.is_some(), "agent registered");

        let (tx, rx) = mpsc::channel(64);
        tx.send(Ok(pb::SchedulerMessage {
            msg: Some(pb::scheduler_message::Msg::RegisterAck(pb::RegisterAck {
                node_id: node_id.to_string(),
                heartbeat_interval: Some(duration_to_proto(
                    self.state.config.liveness.heartbeat_interval,
                )),
                server_time: Some(timestamp_to_proto(now)),
                epoch: fence.epoch,
                node_token: issued
                    .as_ref()
                    .map(|t| t.expose().to_string())
                    .unwrap_or_default(),
            })),
        }))
        .await
        .map_err(|_| Status::cancelled("agent went away"))?;
        let registry = self.state.registry.clone();
        let session = registry.register(
            record,
            &reg.instance_id,
            now,
            tx,
            reg.tasks,
            reg.applied_generation,
        );
        drop(_one_at_a_time);
        let pump = SessionPump {
            node_id,
            session,
            epoch: fence.epoch,
            registry,
            leader: self.state.leader.clone(),
            leadership: self.state.leadership.clone(),
            metrics: self.state.metrics.clone(),
            on_events: self.state.config.scheduling.event_round_gap.is_some(),
            for_deadlines: !self.state.config.scheduling.deadline_round_gap.is_zero(),
        };
        tokio::spawn(pump.run(inbound));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One agent's session after its registration: takes in its messages
/// (heartbeats, task status, log data) until it closes, breaks, sends
/// what the limits refuse, or this replica stops leading, and wakes the
/// leader's loops on what may concern them.
struct SessionPump {
    node_id: NodeId,
    session: u64,
    /// The leader's term the session was opened under.
    epoch: i64,
    registry: Arc<crate::registry::NodeRegistry>,
    leader: Arc<crate::leader::LeaderMemory>,
    leadership: Arc<crate::leadership::Leadership>,
    metrics: Arc<crate::metrics::SchedulerMetrics>,
    /// `scheduling.event_round_gap` is set.
    on_events: bool,
    /// `scheduling.deadline_round_gap` is not zero.
    for_deadlines: bool,
}

impl SessionPump {
    async fn run(self, mut inbound: Streaming<pb::AgentMessage>) {
        let mut budget = MessageBudget::for_agents(std::time::Instant::now());
        loop {
            let mut msg = match inbound.message().await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    tracing::info!(node_id = %self.node_id, "agent closed its session");
                    break;
                }
                Err(e) => {
                    tracing::info!(node_id = %self.node_id, error = %e, "agent session broken");
                    break;
                }
            };
            if !budget.take(std::time::Instant::now()) {
                tracing::warn!(node_id = %self.node_id, "agent over its message rate; closing the session");
                self.metrics.update(|m| m.rate_limited_sessions += 1);
                self.registry.close_with(
                    &self.node_id,
                    self.session,
                    Status::resource_exhausted(
                        "over the agent message rate (1,000 at once, 200 a second); reconnect",
                    ),
                );
                break;
            }
            if let Some(Msg::Heartbeat(hb)) = &mut msg.msg {
                let replaced = clamp_telemetry(&mut hb.gpus);
                if replaced > 0 {
                    tracing::warn!(node_id = %self.node_id, replaced, "telemetry out of physical bounds read as unknown");
                    self.metrics
                        .update(|m| m.telemetry_out_of_range += replaced);
                }
            }
            if let Err(e) = validate_agent_message(&msg) {
                // A broken or hostile agent: told why, and dropped.
                tracing::warn!(node_id = %self.node_id, error = %e, "agent message refused; closing the session");
                self.metrics.update(|m| m.refused_messages += 1);
                self.registry
                    .close_with(&self.node_id, self.session, Status::from(e));
                break;
            }
            let now = Utc::now();
            // A replica that stopped leading (its lease lapsed while it
            // was frozen, say) drops the session: the agent dials the
            // new leader.
            let Some(f) = self.leadership.fence().filter(|f| f.epoch == self.epoch) else {
                tracing::warn!(node_id = %self.node_id, "no longer the leader; closing the agent session");
                break;
            };
            let current = match msg.msg {
                Some(Msg::Heartbeat(hb)) => {
                    let sequence = hb.sequence;
                    // A finished or a warm process may let the prompt
                    // lane start a request.
                    if !hb.warm.is_empty() || hb.tasks.iter().any(|t| !t.outputs.is_empty()) {
                        self.leader.wake_prompt_lane();
                    }
                    self.wake_round_on_end(&hb.tasks);
                    let ok = self
                        .registry
                        .heartbeat(&self.node_id, self.session, hb, now);
                    if ok {
                        // The agent's proof that its leader is alive (a
                        // full queue drops it; the next one follows).
                        let ack = pb::HeartbeatAck {
                            sequence,
                            epoch: f.epoch,
                        };
                        self.registry.send(
                            &self.node_id,
                            pb::SchedulerMessage {
                                msg: Some(pb::scheduler_message::Msg::HeartbeatAck(ack)),
                            },
                        );
                    }
                    ok
                }
                Some(Msg::TaskStatus(ts)) => match ts.task {
                    Some(t) => {
                        // A phase change sent between heartbeats: the
                        // next heartbeat repeats it, so the wake is now.
                        self.wake_round_on_end(std::slice::from_ref(&t));
                        self.registry
                            .task_status(&self.node_id, self.session, t, now)
                    }
                    None => true,
                },
                Some(Msg::LogData(d)) => {
                    self.registry.deliver_log(d);
                    true
                }
                Some(Msg::Register(_)) => {
                    tracing::warn!(node_id = %self.node_id, "duplicate Register in one session; ignored");
                    true
                }
                None => true,
            };
            if !current {
                tracing::info!(node_id = %self.node_id, session = self.session, "session superseded or closed; dropping it");
                break;
            }
        }
        self.registry.disconnect(&self.node_id, self.session);
    }

    /// With rounds on events, a report that ends a task brings the next
    /// round forward (with rounds for deadlines, only while a job with a
    /// deadline waits here); checked before the registry records it, since
    /// a recorded end is no longer news.
    fn wake_round_on_end(&self, tasks: &[pb::ObservedTask]) {
        let wanted = self.on_events || (self.for_deadlines && self.leader.waits_on_deadlines());
        if wanted && self.registry.ends_a_task(&self.node_id, tasks) {
            self.leader.wake_round();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> pb::Register {
        pb::Register {
            node_id: "node-1".into(),
            hostname: "node-1".into(),
            gpus: (0..2)
                .map(|i| pb::GpuInfo {
                    uuid: format!("GPU-{i}"),
                    index: i,
                    model: "A100-80GB".into(),
                    memory_total_bytes: 80 << 30,
                    pci_bus_id: format!("0000:0{i}:00.0"),
                })
                .collect(),
            gpu_backend: "fake".into(),
            agent_version: "0.1.0".into(),
            ..Default::default()
        }
    }

    #[test]
    fn registration_checks_name_the_field() {
        assert!(validate_register(&reg(), Utc::now()).is_ok());
        let mut r = reg();
        r.node_id = "bad id".into();
        assert!(
            validate_register(&r, Utc::now())
                .unwrap_err()
                .to_string()
                .starts_with("register.node_id")
        );
        let mut r = reg();
        r.gpus[1].uuid = "GPU-0".into();
        assert!(
            validate_register(&r, Utc::now())
                .unwrap_err()
                .to_string()
                .starts_with("register.gpus[1].uuid")
        );
        let mut r = reg();
        r.gpu_backend = "cuda".into();
        assert!(
            validate_register(&r, Utc::now())
                .unwrap_err()
                .to_string()
                .starts_with("register.gpu_backend")
        );
    }

    /// A job report's Prompt Bank fields are checked, naming the field.
    #[test]
    fn prompt_bank_reports_are_checked_naming_the_field() {
        let task = |r: pb::JobReport| pb::ObservedTask {
            task_id: "j".into(),
            jobs: vec![r],
            ..Default::default()
        };
        let ok = pb::JobReport {
            job_id: "j".into(),
            prompt_features: vec![0.5; 768],
            prompt_init: Some(pb::PromptInit {
                from_job_id: "a".into(),
                score: 1.5,
                scored: 2,
                candidates: 3,
            }),
            ..Default::default()
        };
        assert!(validate_observed_task("t", &task(ok.clone())).is_ok());
        let err = |r: pb::JobReport| {
            validate_observed_task("t", &task(r))
                .unwrap_err()
                .to_string()
        };
        let mut r = ok.clone();
        r.prompt_features[7] = f64::NAN;
        assert!(err(r).starts_with("t.jobs[0].prompt_features[7]"));
        let mut r = ok.clone();
        r.prompt_features = vec![0.0; limits::PROMPT_FEATURES + 1];
        assert!(err(r).starts_with("t.jobs[0].prompt_features"));
        let mut r = ok.clone();
        r.prompt_init.as_mut().unwrap().score = f64::INFINITY;
        assert!(err(r).starts_with("t.jobs[0].prompt_init.score"));
        let mut r = ok;
        r.prompt_init.as_mut().unwrap().from_job_id = "x".repeat(65);
        assert!(err(r).starts_with("t.jobs[0].prompt_init.from_job_id"));
    }

    /// A heartbeat's warm processes are checked, naming the field.
    #[test]
    fn warm_processes_in_a_heartbeat_are_checked_naming_the_field() {
        let hb = |w: Vec<pb::WarmProcess>| pb::Heartbeat {
            warm: w,
            ..Default::default()
        };
        let ok = pb::WarmProcess {
            model: "gpt2".into(),
            gpu_uuids: vec!["GPU-a".into()],
        };
        assert!(validate_heartbeat(&hb(vec![ok.clone()])).is_ok());
        let err = |h: pb::Heartbeat| validate_heartbeat(&h).unwrap_err().to_string();
        assert!(err(hb(vec![ok.clone(); limits::GPUS + 1])).starts_with("heartbeat.warm"));
        let mut w = ok.clone();
        w.model = "m".repeat(129);
        assert!(err(hb(vec![ok.clone(), w])).starts_with("heartbeat.warm[1].model"));
        let mut w = ok;
        w.gpu_uuids = vec!["g".repeat(200)];
        assert!(err(hb(vec![w])).starts_with("heartbeat.warm[0].gpu_uuids"));
    }
}
