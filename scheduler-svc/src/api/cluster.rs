//! `ClusterService`: nodes, GPUs with live telemetry, cluster summary.

use std::collections::BTreeMap;

use fmsched_core::{JobState, NodeId, NodeState};
use fmsched_proto::convert::{
    job_state_to_proto, node_state_from_proto, node_state_to_proto, timestamp_to_proto,
};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::cluster_service_server::ClusterService;
use tonic::{Request, Response, Status};

use super::ApiError;
use crate::persistence::NodeCordon;
use crate::registry::{LiveNode, runs_a_process};
use crate::service::Service;

pub struct ClusterApi {
    state: Service,
}

impl ClusterApi {
    pub fn new(state: Service) -> Self {
        Self { state }
    }

    async fn held(&self) -> Result<Held, Status> {
        held(&self.state).await.map_err(Status::from)
    }
}

/// GPU UUID → the job whose current plan holds it (training or profiling;
/// two jobs sharing it, comma-separated).
pub type HeldGpus = BTreeMap<String, String>;

/// What a node's answer needs besides the registry: the GPUs the stored
/// plan holds and the admins' cordons (read from Postgres, so a standby
/// replica answers as the leader would).
pub struct Held {
    pub gpus: HeldGpus,
    pub cordons: BTreeMap<NodeId, NodeCordon>,
}

pub async fn held(state: &Service) -> Result<Held, ApiError> {
    let plan = state.persistence.current_plan().await?;
    let mut gpus = HeldGpus::new();
    for a in &plan.assignments {
        for g in &a.gpus {
            // Two jobs sharing a GPU (ICEFROG) are both named.
            let job = a.job.to_string();
            gpus.entry(g.0.clone())
                .and_modify(|held: &mut String| {
                    if !held.split(',').any(|h| h == job) {
                        held.push(',');
                        held.push_str(&job);
                    }
                })
                .or_insert(job);
        }
    }
    Ok(Held {
        gpus,
        cordons: state.persistence.cordons().await?,
    })
}

/// A registered node as the API answers it (NOT_FOUND for an unknown id).
pub async fn node_answer(state: &Service, id: &NodeId) -> Result<pb::Node, ApiError> {
    let node = state
        .registry
        .get(id)
        .ok_or_else(|| ApiError::NotFound(format!("node {id} not found")))?;
    Ok(node_to_proto(&node, &held(state).await?))
}

/// Whether new work may start on a node: schedulable, cordoned, or
/// draining until the plan holds none of its GPUs and no process of it is
/// still running or checkpointing, drained then.
fn scheduling(n: &LiveNode, held: &Held) -> pb::NodeScheduling {
    match held.cordons.get(&n.record.id) {
        None => pb::NodeScheduling::Schedulable,
        Some(c) if !c.drain => pb::NodeScheduling::Cordoned,
        Some(_) => {
            let busy = n
                .record
                .gpus
                .iter()
                .any(|g| held.gpus.contains_key(&g.uuid.0))
                || runs_a_process(n);
            if busy {
                pb::NodeScheduling::Draining
            } else {
                pb::NodeScheduling::Drained
            }
        }
    }
}

pub fn node_to_proto(n: &LiveNode, held: &Held) -> pb::Node {
    let r = &n.record;
    let cordon = held.cordons.get(&r.id);
    pb::Node {
        id: r.id.to_string(),
        hostname: r.hostname.clone(),
        state: node_state_to_proto(n.state) as i32,
        labels: r.labels.clone().into_iter().collect(),
        agent_version: r.agent_version.clone(),
        gpu_backend: r.gpu_backend.clone(),
        registered_at: Some(timestamp_to_proto(r.registered_at)),
        last_heartbeat_at: Some(timestamp_to_proto(
            n.last_heartbeat.max(r.last_heartbeat_at),
        )),
        gpus: r
            .gpus
            .iter()
            .map(|g| pb::Gpu {
                info: Some(pb::GpuInfo {
                    uuid: g.uuid.0.clone(),
                    index: g.index,
                    model: g.model.clone(),
                    memory_total_bytes: g.memory_total_bytes,
                    pci_bus_id: g.pci_bus_id.clone(),
                }),
                telemetry: n.telemetry.get(&g.uuid.0).cloned(),
                allocated_to_job: held.gpus.get(&g.uuid.0).cloned().unwrap_or_default(),
            })
            .collect(),
        connected: n.session.is_some(),
        scheduling: scheduling(n, held) as i32,
        cordoned_by: cordon.map(|c| c.by.clone()).unwrap_or_default(),
        cordon_reason: cordon.map(|c| c.reason.clone()).unwrap_or_default(),
        cordoned_at: cordon.map(|c| timestamp_to_proto(c.at)),
    }
}

#[tonic::async_trait]
impl ClusterService for ClusterApi {
    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.state
            .auth
            .authenticate(req.metadata())
            .map_err(ApiError::from)?;
        let mut wanted = Vec::new();
        for (i, s) in req.get_ref().states.iter().enumerate() {
            if let Some(s) =
                node_state_from_proto(&format!("states[{i}]"), *s).map_err(ApiError::from)?
            {
                wanted.push(s);
            }
        }
        let held = self.held().await?;
        let nodes = self
            .state
            .registry
            .snapshot()
            .iter()
            .filter(|n| wanted.is_empty() || wanted.contains(&n.state))
            .map(|n| node_to_proto(n, &held))
            .collect();
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn get_node(
        &self,
        req: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        self.state
            .auth
            .authenticate(req.metadata())
            .map_err(ApiError::from)?;
        let id = NodeId::try_from(req.into_inner().node_id)
            .map_err(|e| ApiError::field("node_id", e))?;
        Ok(Response::new(node_answer(&self.state, &id).await?))
    }

    async fn get_cluster_summary(
        &self,
        req: Request<pb::GetClusterSummaryRequest>,
    ) -> Result<Response<pb::ClusterSummary>, Status> {
        self.state
            .auth
            .authenticate(req.metadata())
            .map_err(ApiError::from)?;
        let nodes = self.state.registry.snapshot();
        let held = self.held().await?;
        let mut by_model: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        let mut by_state: BTreeMap<NodeState, u32> = BTreeMap::new();
        for n in &nodes {
            *by_state.entry(n.state).or_default() += 1;
            if n.state != NodeState::Available {
                continue;
            }
            for g in &n.record.gpus {
                let e = by_model.entry(g.model.clone()).or_default();
                e.0 += 1;
                // Free: on an Available node that takes new work (not
                // cordoned) and held by no assignment.
                e.1 += u32::from(
                    !held.gpus.contains_key(&g.uuid.0) && !held.cordons.contains_key(&n.record.id),
                );
            }
        }
        let counts = self
            .state
            .persistence
            .job_counts_by_state()
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::ClusterSummary {
            gpus_total: by_model.values().map(|v| v.0).sum(),
            gpus_free: by_model.values().map(|v| v.1).sum(),
            gpus_by_model: by_model
                .into_iter()
                .map(|(model, (total, free))| pb::GpuModelCount { model, total, free })
                .collect(),
            jobs_by_state: JobState::ALL
                .iter()
                .map(|s| pb::JobStateCount {
                    state: job_state_to_proto(*s) as i32,
                    count: counts.get(s).copied().unwrap_or(0),
                })
                .collect(),
            nodes_by_state: NodeState::ALL
                .iter()
                .map(|s| pb::NodeStateCount {
                    state: node_state_to_proto(*s) as i32,
                    count: by_state.get(s).copied().unwrap_or(0),
                })
                .collect(),
        }))
    }
}
