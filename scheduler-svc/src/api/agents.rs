//! `AgentService.Session`: one long-lived stream per node agent.
//!
//! Protocol: the first message must be `Register` with the join token; the
//! registration is persisted, then acknowledged with the heartbeat interval.
//! Heartbeats and task updates only touch the in-memory registry (telemetry
//! is relearned after a restart). The session ends when the agent hangs up,
//! when a newer session of the same node replaces it, or when the node is
//! declared Offline.

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

use super::{ApiError, AppState, check_len};
use crate::persistence::{GpuRecord, NodeRecord};

pub struct AgentApi {
    state: AppState,
}

impl AgentApi {
    pub fn new(state: AppState) -> Self {
        Self { state }
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
    if reg.gpus.len() > 64 {
        return Err(ApiError::field("register.gpus", "at most 64 GPUs per node"));
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
        if !self.state.auth.check_join_token(&reg.join_token) {
            tracing::warn!(node_id = %reg.node_id, ?peer, "agent refused: invalid join token");
            return Err(Status::unauthenticated("invalid join token"));
        }
        let now = Utc::now();
        let record = validate_register(&reg, now)?;
        self.state
            .persistence
            .register_node(&record, Some(&fence), now)
            .await
            .map_err(ApiError::from)?;
        let node_id = record.id.clone();
        tracing::info!(node_id = %node_id, gpus = record.gpus.len(), backend = %record.gpu_backend,
            agent_version = %record.agent_version, ?peer, running_tasks = reg.tasks.len(), "agent registered");

        let (tx, rx) = mpsc::channel(64);
        tx.send(Ok(pb::SchedulerMessage {
            msg: Some(pb::scheduler_message::Msg::RegisterAck(pb::RegisterAck {
                node_id: node_id.to_string(),
                heartbeat_interval: Some(duration_to_proto(
                    self.state.config.liveness.heartbeat_interval,
                )),
                server_time: Some(timestamp_to_proto(now)),
                epoch: fence.epoch,
            })),
        }))
        .await
        .map_err(|_| Status::cancelled("agent went away"))?;
        let registry = self.state.registry.clone();
        let leadership = self.state.leadership.clone();
        let session = registry.register(record, now, tx, reg.tasks, reg.applied_generation);

        tokio::spawn(async move {
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => {
                        tracing::info!(node_id = %node_id, "agent closed its session");
                        break;
                    }
                    Err(e) => {
                        tracing::info!(node_id = %node_id, error = %e, "agent session broken");
                        break;
                    }
                };
                let now = Utc::now();
                // A replica that stopped leading (its lease lapsed while it
                // was frozen, say) drops the session: the agent dials the
                // new leader.
                let Some(f) = leadership.fence().filter(|f| f.epoch == fence.epoch) else {
                    tracing::warn!(node_id = %node_id, "no longer the leader; closing the agent session");
                    break;
                };
                let current = match msg.msg {
                    Some(Msg::Heartbeat(hb)) => {
                        let sequence = hb.sequence;
                        let ok = registry.heartbeat(&node_id, session, hb, now);
                        if ok {
                            // The agent's proof that its leader is alive (a
                            // full queue drops it; the next one follows).
                            let ack = pb::HeartbeatAck {
                                sequence,
                                epoch: f.epoch,
                            };
                            registry.send(
                                &node_id,
                                pb::SchedulerMessage {
                                    msg: Some(pb::scheduler_message::Msg::HeartbeatAck(ack)),
                                },
                            );
                        }
                        ok
                    }
                    Some(Msg::TaskStatus(ts)) => match ts.task {
                        Some(t) => registry.task_status(&node_id, session, t, now),
                        None => true,
                    },
                    Some(Msg::LogData(d)) => {
                        registry.deliver_log(d);
                        true
                    }
                    Some(Msg::Register(_)) => {
                        tracing::warn!(node_id = %node_id, "duplicate Register in one session; ignored");
                        true
                    }
                    None => true,
                };
                if !current {
                    tracing::info!(node_id = %node_id, session, "session superseded or closed; dropping it");
                    break;
                }
            }
            registry.disconnect(&node_id, session);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
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
}
