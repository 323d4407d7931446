//! `ClusterService`: nodes, GPUs with live telemetry, cluster summary.

use std::collections::BTreeMap;

use fmsched_core::{JobState, NodeId, NodeState};
use fmsched_proto::convert::{
    job_state_to_proto, node_state_from_proto, node_state_to_proto, timestamp_to_proto,
};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::cluster_service_server::ClusterService;
use tonic::{Request, Response, Status};

use super::{ApiError, AppState};
use crate::registry::LiveNode;

pub struct ClusterApi {
    state: AppState,
}

impl ClusterApi {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// The GPUs the stored plan holds (read from Postgres, so a standby
    /// replica answers as the leader would).
    async fn held(&self) -> Result<HeldGpus, Status> {
        let plan = self
            .state
            .persistence
            .current_plan()
            .await
            .map_err(ApiError::from)?;
        Ok(plan
            .assignments
            .iter()
            .flat_map(|a| a.gpus.iter().map(|g| (g.0.clone(), a.job.to_string())))
            .collect())
    }
}

/// GPU UUID → the job whose current plan holds it (training or profiling).
pub type HeldGpus = BTreeMap<String, String>;

pub fn node_to_proto(n: &LiveNode, held: &HeldGpus) -> pb::Node {
    let r = &n.record;
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
                allocated_to_job: held.get(&g.uuid.0).cloned().unwrap_or_default(),
            })
            .collect(),
        connected: n.session.is_some(),
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
        let node = self
            .state
            .registry
            .get(&id)
            .ok_or_else(|| ApiError::NotFound(format!("node {id} not found")))?;
        Ok(Response::new(node_to_proto(&node, &self.held().await?)))
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
                // Free: on an Available node and held by no assignment.
                e.1 += u32::from(!held.contains_key(&g.uuid.0));
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
