//! `AdminService`: operators' controls (admins only). Each change is one
//! Postgres transaction with its audit event; the leader's next round acts
//! on it (see `persistence::admin`).

use chrono::Utc;
use fmsched_core::{JobId, NodeId};
use fmsched_proto::convert::{
    duration_from_proto, queue_from_proto, queue_to_proto, timestamp_to_proto,
};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::admin_service_server::AdminService;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::cluster::node_answer;
use super::{ApiError, check_len};
use crate::auth::Principal;
use crate::persistence::{
    CordonChange, LoanError, LoanState, POOL_LABEL, PolicySetting, QueueSetting, SetQueuesError,
};
use crate::service::Service;
use fmsched_core::queue::{QueueSpec, Queues};
use std::collections::BTreeSet;

/// Longest reason accepted.
const MAX_REASON: usize = 1024;
/// Most audit events one call returns.
const MAX_AUDIT: u32 = 1000;

pub struct AdminApi {
    state: Service,
}

/// The fewest GPUs a job keeps running on when a reclaim takes some of its
/// GPUs: an elastic job's base workers (it scales in to them), any other
/// job all it holds (losing one GPU preempts it).
fn base_gpus(job: Option<&crate::persistence::JobRecord>, held: u32) -> u32 {
    match job.map(|j| &j.spec.resources) {
        Some(r) if r.workers.is_some() => r.base_gpus().min(held),
        _ => held,
    }
}

impl AdminApi {
    pub fn new(state: Service) -> Self {
        Self { state }
    }

    /// Every loan, with the inference pool's size and each node's GPUs in
    /// use by the plan in force.
    async fn loans_answer(&self) -> Result<pb::ListLoansResponse, ApiError> {
        let p = &self.state.persistence;
        let loans = p.loans().await?;
        let plan = p.current_plan().await?;
        let inference = p
            .list_nodes()
            .await?
            .iter()
            .filter(|n| n.labels.get(POOL_LABEL).is_some_and(|v| v == "inference"))
            .count();
        let now = Utc::now();
        let ids = |v: &[JobId]| v.iter().map(|j| j.to_string()).collect::<Vec<_>>();
        Ok(pb::ListLoansResponse {
            loans: loans
                .iter()
                .map(|(n, l)| {
                    let in_use: usize = plan
                        .assignments
                        .iter()
                        .filter(|a| a.node == *n)
                        .map(|a| a.gpus.len())
                        .sum();
                    pb::Loan {
                        node_id: n.to_string(),
                        state: l.state.as_str().into(),
                        loaned_by: l.loaned_by.clone(),
                        loaned_at: Some(timestamp_to_proto(l.loaned_at)),
                        reclaimed_by: l.reclaimed_by.clone(),
                        reclaimed_at: l.reclaimed_at.map(timestamp_to_proto),
                        reclaim_deadline: l.reclaim_deadline.map(timestamp_to_proto),
                        preempted_job_ids: ids(&l.preempted),
                        scaled_in_job_ids: ids(&l.scaled_in),
                        returned_at: l.returned_at.map(timestamp_to_proto),
                        gpus_in_use: in_use as u32,
                        overdue: l.state == LoanState::Reclaiming
                            && in_use > 0
                            && l.reclaim_deadline.is_some_and(|d| d < now),
                    }
                })
                .collect(),
            inference_nodes: inference as u32,
            headroom_nodes: self.state.config.loans.keep(inference) as u32,
        })
    }

    /// The caller, who must be an admin.
    fn admin(&self, md: &MetadataMap) -> Result<Principal, ApiError> {
        let who = self.state.auth.authenticate(md)?;
        if !who.admin {
            return Err(ApiError::PermissionDenied(format!(
                "AdminService needs an admin's token; {} is not an admin (auth.admins)",
                who.user
            )));
        }
        Ok(who)
    }

    async fn cordon(
        &self,
        md: &MetadataMap,
        node_id: String,
        reason: &str,
        change: CordonChange,
    ) -> Result<pb::Node, ApiError> {
        let who = self.admin(md)?;
        let id = NodeId::try_from(node_id).map_err(|e| ApiError::field("node_id", e))?;
        check_len("reason", reason, MAX_REASON)?;
        self.state
            .persistence
            .set_cordon(&id, change, who.user.0.as_str(), reason, Utc::now())
            .await?;
        tracing::info!(node_id = %id, ?change, by = %who.user, reason, "node cordon changed");
        node_answer(&self.state, &id).await
    }

    /// The setting in force: the stored one over the configuration's.
    fn setting_to_proto(&self, stored: Option<&PolicySetting>) -> pb::PolicySetting {
        let s = self.state.config.scheduling.with_setting(stored);
        pb::PolicySetting {
            known_knobs: fmsched_core::policy::knob_names(&s.policy)
                .unwrap_or_default()
                .iter()
                .map(|k| k.to_string())
                .collect(),
            interval_s: s.round_interval().as_secs_f64(),
            knobs: s.knobs.into_iter().collect(),
            policy: s.policy,
            source: if stored.is_some() { "admin" } else { "config" }.into(),
            set_by: stored.map(|p| p.set_by.clone()).unwrap_or_default(),
            set_at: stored.map(|p| timestamp_to_proto(p.set_at)),
        }
    }
}

impl AdminApi {
    /// The queue set in force, with each queue's figures now.
    async fn queues_answer(
        &self,
        stored: Option<&QueueSetting>,
    ) -> Result<pb::QueueSetting, ApiError> {
        let specs = match stored {
            Some(s) => s.queues.clone(),
            None => self.state.config.scheduling.queues.clone(),
        };
        let usage = self.state.persistence.queue_usage().await?;
        let gauges = self.state.metrics.values().queues;
        let mut names: Vec<String> = specs.iter().map(|q| q.name.clone()).collect();
        if specs.is_empty() {
            names.push(String::new()); // the implicit queue
        }
        let status = names
            .into_iter()
            .map(|name| {
                let (used, running, waiting) = usage.get(&name).copied().unwrap_or_default();
                let g = gauges.get(&name);
                pb::QueueStatus {
                    name,
                    used_gpus: used,
                    running_jobs: running,
                    waiting_jobs: waiting,
                    deserved_gpus: g.map(|g| g.deserved),
                    demand_gpus: g.map(|g| g.demand),
                }
            })
            .collect();
        Ok(pb::QueueSetting {
            queues: specs.iter().map(queue_to_proto).collect(),
            source: if stored.is_some() { "admin" } else { "config" }.into(),
            set_by: stored.map(|s| s.set_by.clone()).unwrap_or_default(),
            set_at: stored.map(|s| timestamp_to_proto(s.set_at)),
            status,
        })
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn get_queues(
        &self,
        req: Request<pb::GetQueuesRequest>,
    ) -> Result<Response<pb::QueueSetting>, Status> {
        self.admin(req.metadata())?;
        let stored = self
            .state
            .persistence
            .queue_setting()
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(self.queues_answer(stored.as_ref()).await?))
    }

    async fn set_queues(
        &self,
        req: Request<pb::SetQueuesRequest>,
    ) -> Result<Response<pb::QueueSetting>, Status> {
        let who = self.admin(req.metadata())?;
        let r = req.into_inner();
        let specs: Vec<QueueSpec> = r.queues.into_iter().map(queue_from_proto).collect();
        // The same checks as `[[scheduling.queues]]` at start-up.
        let set = Queues::new(specs.clone()).map_err(|e| {
            // "queues[i].field: why", the field named as the request names it.
            match e.split_once(": ") {
                Some((field, why)) if field.starts_with("queues") => ApiError::field(field, why),
                _ => ApiError::field("queues", e),
            }
        })?;
        let leaves: BTreeSet<String> = set.leaves().map(str::to_string).collect();
        let setting = QueueSetting {
            queues: specs,
            set_by: who.user.to_string(),
            set_at: Utc::now(),
        };
        match self.state.persistence.set_queues(&setting, &leaves).await {
            Ok(()) => {}
            Err(SetQueuesError::InUse(m)) => {
                return Err(ApiError::FailedPrecondition(format!("queues: {m}")).into());
            }
            Err(SetQueuesError::Db(e)) => return Err(ApiError::from(e).into()),
        }
        tracing::info!(queues = setting.queues.len(), by = %who.user,
            "queues set through the admin API; effective from the next round");
        Ok(Response::new(self.queues_answer(Some(&setting)).await?))
    }

    async fn cordon_node(
        &self,
        req: Request<pb::CordonNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let (md, _, r) = req.into_parts();
        let n = self
            .cordon(&md, r.node_id, &r.reason, CordonChange::Cordon)
            .await?;
        Ok(Response::new(n))
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let (md, _, r) = req.into_parts();
        let n = self
            .cordon(&md, r.node_id, &r.reason, CordonChange::Drain)
            .await?;
        Ok(Response::new(n))
    }

    async fn uncordon_node(
        &self,
        req: Request<pb::UncordonNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let (md, _, r) = req.into_parts();
        let n = self
            .cordon(&md, r.node_id, "", CordonChange::Uncordon)
            .await?;
        Ok(Response::new(n))
    }

    async fn revoke_node_token(
        &self,
        req: Request<pb::RevokeNodeTokenRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let who = self.admin(req.metadata())?;
        let r = req.into_inner();
        let id = NodeId::try_from(r.node_id).map_err(|e| ApiError::field("node_id", e))?;
        check_len("reason", &r.reason, MAX_REASON)?;
        self.state
            .persistence
            .revoke_node_token(&id, who.user.0.as_str(), &r.reason, Utc::now())
            .await
            .map_err(ApiError::from)?;
        if let Some(session) = self.state.registry.get(&id).and_then(|n| n.session) {
            self.state.registry.close_with(
                &id,
                session,
                Status::unauthenticated(format!(
                    "the node token of {id} was revoked by {}; enroll again with the join token",
                    who.user
                )),
            );
        }
        tracing::warn!(node_id = %id, by = %who.user, reason = %r.reason, "node token revoked");
        Ok(Response::new(node_answer(&self.state, &id).await?))
    }

    async fn requeue_job(
        &self,
        req: Request<pb::RequeueJobRequest>,
    ) -> Result<Response<pb::RequeueJobResponse>, Status> {
        let who = self.admin(req.metadata())?;
        let r = req.into_inner();
        let id: JobId = super::jobs::parse_job_id(&r.job_id)?;
        check_len("reason", &r.reason, MAX_REASON).map_err(Status::from)?;
        let now = Utc::now();
        self.state
            .persistence
            .request_requeue(id, who.user.0.as_str(), &r.reason, now)
            .await
            .map_err(ApiError::from)?;
        let _ = self.state.job_events.send(id);
        tracing::info!(job_id = %id, by = %who.user, reason = %r.reason, "re-queue requested");
        Ok(Response::new(pb::RequeueJobResponse {
            requested_at: Some(timestamp_to_proto(now)),
        }))
    }

    async fn get_policy(
        &self,
        req: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::PolicySetting>, Status> {
        self.admin(req.metadata())?;
        let stored = self
            .state
            .persistence
            .policy_setting()
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(self.setting_to_proto(stored.as_ref())))
    }

    async fn set_policy(
        &self,
        req: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::PolicySetting>, Status> {
        let who = self.admin(req.metadata())?;
        let r = req.into_inner();
        let setting = PolicySetting {
            policy: r.policy.trim().to_string(),
            knobs: r.knobs.into_iter().collect(),
            set_by: who.user.to_string(),
            set_at: Utc::now(),
        };
        // The same checks as the configuration's at start-up: a known
        // policy, its own knobs, values in range.
        let s = self.state.config.scheduling.with_setting(Some(&setting));
        if fmsched_core::policy::knob_names(&s.policy).is_none() {
            return Err(ApiError::field(
                "policy",
                format!(
                    "unknown policy {:?}; expected one of {}",
                    s.policy,
                    fmsched_core::policy::POLICY_NAMES.join(", ")
                ),
            )
            .into());
        }
        if let Err(e) = s.build_policy() {
            return Err(ApiError::field("knobs", e).into());
        }
        self.state
            .persistence
            .set_policy(&setting)
            .await
            .map_err(ApiError::from)?;
        tracing::info!(policy = %setting.policy, knobs = ?setting.knobs, by = %who.user,
            "policy set through the admin API; effective from the next round");
        Ok(Response::new(self.setting_to_proto(Some(&setting))))
    }

    async fn tune(
        &self,
        req: Request<pb::TuneRequest>,
    ) -> Result<Response<pb::TuneDecision>, Status> {
        use crate::round::autosched::{knob_map, tune_once};
        let who = self.admin(req.metadata())?;
        let r = req.into_inner();
        let o = tune_once(&self.state, r.dry_run, r.threshold, &who.user.to_string())
            .await
            .map_err(ApiError::from)?;
        let d = &o.decision;
        Ok(Response::new(pb::TuneDecision {
            policy: o.policy.clone(),
            knobs_before: knob_map(&o.before),
            proposed: knob_map(&d.proposed),
            knobs_after: knob_map(&d.knobs),
            predicted_gain: d.gain,
            threshold: o.threshold,
            passes: d.passes,
            adopted: d.adopted,
            trace_jobs: d.trace_jobs as u32,
            carried_over: d.carried_over as u32,
            aggregated_jobs: d.aggregated_jobs as u32,
            simulations: d.simulations as u32,
            rejected: d.rejected as u32,
            wall_seconds: d.wall_s,
            realised_gain: d.realised_gain,
        }))
    }

    async fn loan_nodes(
        &self,
        req: Request<pb::LoanNodesRequest>,
    ) -> Result<Response<pb::ListLoansResponse>, Status> {
        let who = self.admin(req.metadata())?;
        let nodes = node_ids(&req.get_ref().node_ids)?;
        let loans = &self.state.config.loans;
        self.state
            .persistence
            .loan_nodes(&nodes, &|n| loans.keep(n), who.user.0.as_str(), Utc::now())
            .await
            .map_err(loan_error)?;
        tracing::info!(nodes = ?nodes, by = %who.user, "inference nodes lent to training");
        Ok(Response::new(self.loans_answer().await?))
    }

    async fn reclaim_nodes(
        &self,
        req: Request<pb::ReclaimNodesRequest>,
    ) -> Result<Response<pb::ReclaimNodesResponse>, Status> {
        use fmsched_core::policy::lyra::{self, ReclaimInput, ReclaimJob, ReclaimRule};
        let who = self.admin(req.metadata())?;
        let r = req.into_inner();
        let named = node_ids(&r.node_ids)?;
        if named.is_empty() == (r.count == 0) {
            return Err(ApiError::field(
                "count",
                "give either node_ids or a count of nodes to reclaim (one of them)",
            )
            .into());
        }
        let deadline = match &r.deadline {
            Some(d) => duration_from_proto(d)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| ApiError::field("deadline", "must be a positive duration"))?,
            None => self.state.config.loans.reclaim_deadline,
        };
        let p = &self.state.persistence;
        let lent: Vec<NodeId> = p
            .loans()
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .filter(|(_, l)| l.state == LoanState::Active)
            .map(|(n, _)| n)
            .collect();
        if let Some(n) = named.iter().find(|n| !lent.contains(n)) {
            return Err(ApiError::FailedPrecondition(format!(
                "node {n} is not on loan (or is already being reclaimed)"
            ))
            .into());
        }
        if r.count as usize > lent.len() {
            return Err(ApiError::FailedPrecondition(format!(
                "{} node(s) asked back, {} on loan",
                r.count,
                lent.len()
            ))
            .into());
        }
        // Who holds what on the lent nodes, as the plan in force says.
        let plan = p.current_plan().await.map_err(ApiError::from)?;
        let live: std::collections::BTreeMap<JobId, crate::persistence::JobRecord> = p
            .live_jobs()
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|j| (j.id, j))
            .collect();
        let mut held: std::collections::BTreeMap<JobId, u32> = Default::default();
        for a in &plan.assignments {
            *held.entry(a.job).or_default() += a.gpus.len() as u32;
        }
        let (input, jobs) = ReclaimInput::from_parts(
            lent.iter().map(|n| n.to_string()).collect(),
            plan.assignments.iter().filter_map(|a| {
                let s = lent.iter().position(|n| *n == a.node)?;
                Some((s, a.job, a.gpus.len() as u32))
            }),
            |j| ReclaimJob {
                gpus: held[&j],
                base: base_gpus(live.get(&j), held[&j]),
            },
        );
        let chosen: Vec<usize> = if named.is_empty() {
            lyra::reclaim(&input, r.count as usize, ReclaimRule::Lyra).servers
        } else {
            named
                .iter()
                .filter_map(|n| lent.iter().position(|l| l == n))
                .collect()
        };
        let out = input.outcome(&chosen);
        let nodes: Vec<NodeId> = out.servers.iter().map(|&s| lent[s].clone()).collect();
        let preempted: Vec<JobId> = out.preempted.iter().map(|&k| jobs[k]).collect();
        let scaled_in: Vec<JobId> = out.scaled_in.iter().map(|&(k, _)| jobs[k]).collect();
        let now = Utc::now();
        let deadline = now
            + chrono::Duration::from_std(deadline)
                .map_err(|_| ApiError::field("deadline", "too long"))?;
        p.reclaim_nodes(
            &nodes,
            &preempted,
            &scaled_in,
            deadline,
            who.user.0.as_str(),
            now,
        )
        .await
        .map_err(loan_error)?;
        tracing::info!(nodes = ?nodes, preempted = preempted.len(), scaled_in = scaled_in.len(),
            by = %who.user, "reclaiming lent nodes");
        let ids = |v: &[JobId]| v.iter().map(|j| j.to_string()).collect::<Vec<_>>();
        Ok(Response::new(pb::ReclaimNodesResponse {
            node_ids: nodes.iter().map(|n| n.to_string()).collect(),
            preempted_job_ids: ids(&preempted),
            scaled_in_job_ids: ids(&scaled_in),
            deadline: Some(timestamp_to_proto(deadline)),
        }))
    }

    async fn list_loans(
        &self,
        req: Request<pb::ListLoansRequest>,
    ) -> Result<Response<pb::ListLoansResponse>, Status> {
        self.admin(req.metadata())?;
        Ok(Response::new(self.loans_answer().await?))
    }

    async fn list_audit_events(
        &self,
        req: Request<pb::ListAuditEventsRequest>,
    ) -> Result<Response<pb::ListAuditEventsResponse>, Status> {
        self.admin(req.metadata())?;
        let limit = match req.get_ref().limit {
            0 => 100,
            n => n.min(MAX_AUDIT),
        };
        let events = self
            .state
            .persistence
            .audit_events(limit)
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|e| pb::AuditEvent {
                id: e.id,
                at: Some(timestamp_to_proto(e.at)),
                actor: e.actor,
                action: e.action,
                target: e.target,
                detail: e.detail,
            })
            .collect();
        Ok(Response::new(pb::ListAuditEventsResponse { events }))
    }
}

/// Node ids of a request (`node_ids[i]` named when one is malformed),
/// each once.
fn node_ids(raw: &[String]) -> Result<Vec<NodeId>, ApiError> {
    let mut out: Vec<NodeId> = Vec::with_capacity(raw.len());
    for (i, n) in raw.iter().enumerate() {
        let id = NodeId::try_from(n.clone())
            .map_err(|e| ApiError::field(format!("node_ids[{i}]"), e))?;
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

fn loan_error(e: LoanError) -> ApiError {
    match e {
        LoanError::Refused(m) => ApiError::FailedPrecondition(m),
        LoanError::Db(e) => e.into(),
    }
}
