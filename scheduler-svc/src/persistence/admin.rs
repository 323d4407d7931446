//! Operators' controls in Postgres (migrations 0010, 0012, 0014): node
//! cordons and drains, inference nodes' loans, job re-queue requests, the policy and the queues set live,
//! and the audit log.
//! Any replica writes them (each change and its audit event in one
//! transaction); the leader's rounds read them.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::{JobId, JobSpec, JobState, NodeId};
use uuid::Uuid;

use crate::persistence::nodes::node_event_in;
use crate::persistence::writes::notes_in;
use crate::persistence::{Persistence, PersistenceError, corrupt, db_err, with_retries};

/// An operator's hold on a node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCordon {
    /// Drain: its jobs move off too (else only nothing new starts).
    pub drain: bool,
    pub by: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// The policy set through the admin API.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySetting {
    pub policy: String,
    pub knobs: BTreeMap<String, f64>,
    pub set_by: String,
    pub set_at: DateTime<Utc>,
}

/// The queues set through the admin API (the whole set).
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSetting {
    pub queues: Vec<fmsched_core::queue::QueueSpec>,
    pub set_by: String,
    pub set_at: DateTime<Utc>,
}

/// Why a queue set was not stored.
#[derive(Debug, thiserror::Error)]
pub enum SetQueuesError {
    /// Live jobs name a queue the new set lacks (or makes a department).
    #[error("{0}")]
    InUse(String),
    #[error(transparent)]
    Db(#[from] PersistenceError),
}

/// A pending request to take a job off its GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Requeue {
    pub by: String,
    pub at: DateTime<Utc>,
    pub reason: String,
}

/// The agent label that puts a node in the inference pool (Lyra): such a
/// node trains only while an admin has it on loan.
pub const POOL_LABEL: &str = "fmsched.io/pool";

/// Where a loaned node stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoanState {
    /// In the training whitelist.
    Active,
    /// Asked back: its workers move off; returned once it is empty.
    Reclaiming,
    /// Back with the inference side.
    Returned,
}

impl LoanState {
    pub fn as_str(self) -> &'static str {
        match self {
            LoanState::Active => "active",
            LoanState::Reclaiming => "reclaiming",
            LoanState::Returned => "returned",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        [
            LoanState::Active,
            LoanState::Reclaiming,
            LoanState::Returned,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// An inference node's loan to training.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLoan {
    pub state: LoanState,
    pub loaned_by: String,
    pub loaned_at: DateTime<Utc>,
    pub reclaimed_by: String,
    pub reclaimed_at: Option<DateTime<Utc>>,
    pub reclaim_deadline: Option<DateTime<Utc>>,
    /// Jobs the reclaim decision preempts, and those it scales in.
    pub preempted: Vec<JobId>,
    pub scaled_in: Vec<JobId>,
    pub returned_at: Option<DateTime<Utc>>,
}

impl NodeLoan {
    /// On loan now (active or still being reclaimed).
    pub fn lent(&self) -> bool {
        self.state != LoanState::Returned
    }
}

/// Why a loan change was refused (nothing was written).
#[derive(Debug, thiserror::Error)]
pub enum LoanError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Db(#[from] PersistenceError),
}

/// Everything the admin API set that a round reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdminState {
    pub cordons: BTreeMap<NodeId, NodeCordon>,
    /// Every inference node's loan (returned ones too).
    pub loans: BTreeMap<NodeId, NodeLoan>,
    pub requeues: BTreeMap<JobId, Requeue>,
    /// None: the scheduler's configuration decides.
    pub policy: Option<PolicySetting>,
    /// None: the configuration's queues.
    pub queues: Option<QueueSetting>,
}

/// One change an admin made.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

/// What a cordon call changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CordonChange {
    Cordon,
    Drain,
    Uncordon,
}

impl CordonChange {
    fn action(self) -> &'static str {
        match self {
            CordonChange::Cordon => "cordon",
            CordonChange::Drain => "drain",
            CordonChange::Uncordon => "uncordon",
        }
    }
}

async fn audit_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    actor: &str,
    action: &str,
    target: &str,
    detail: &str,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    sqlx::query(
        "INSERT INTO audit_events (at, actor, action, target, detail) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(now)
    .bind(actor)
    .bind(action)
    .bind(target)
    .bind(detail)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}

/// A job as AutoSched learns from it: when it came, what it asked for,
/// where it is and the service it has had.
#[derive(Clone, Debug, PartialEq)]
pub struct TuningRecord {
    pub id: JobId,
    pub model: String,
    pub created_at: DateTime<Utc>,
    /// When it ended (its last update), for ended jobs.
    pub ended_at: Option<DateTime<Utc>>,
    pub running: bool,
    pub max_gpus: u32,
    pub attained_gpu_s: f64,
    pub executed_s: f64,
    pub fair_share_gpu_s: f64,
}

/// A `node_loans` row.
#[derive(sqlx::FromRow)]
struct LoanRow {
    node_id: String,
    state: String,
    loaned_by: String,
    loaned_at: DateTime<Utc>,
    reclaimed_by: String,
    reclaimed_at: Option<DateTime<Utc>>,
    reclaim_deadline: Option<DateTime<Utc>>,
    preempted: serde_json::Value,
    scaled_in: serde_json::Value,
    returned_at: Option<DateTime<Utc>>,
}

impl Persistence {
    /// Every job still live, and those that ended after `since`, oldest
    /// first, with their service (AutoSched's history).
    pub async fn tuning_records(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<TuningRecord>, PersistenceError> {
        const OP: &str = "tuning_records";
        type Row = (
            Uuid,
            String,
            serde_json::Value,
            String,
            DateTime<Utc>,
            DateTime<Utc>,
            Option<f64>,
            Option<f64>,
            Option<f64>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT j.id, j.model, j.spec, j.state, j.created_at, j.updated_at,
                    s.attained_gpu_s, s.executed_s, s.fair_share_gpu_s
             FROM jobs j LEFT JOIN job_service s ON s.job_id = j.id
             WHERE j.state NOT IN ('completed', 'failed', 'cancelled') OR j.updated_at >= $1
             ORDER BY j.id",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        rows.into_iter()
            .map(
                |(id, model, spec, state, created_at, updated_at, att, exe, fair)| {
                    let spec: JobSpec =
                        serde_json::from_value(spec).map_err(|e| corrupt(OP, e.to_string()))?;
                    let ended = matches!(state.as_str(), "completed" | "failed" | "cancelled");
                    Ok(TuningRecord {
                        id: JobId(id),
                        model,
                        created_at,
                        ended_at: ended.then_some(updated_at),
                        running: state == "running",
                        max_gpus: spec.resources.max_gpus,
                        attained_gpu_s: att.unwrap_or(0.0),
                        executed_s: exe.unwrap_or(0.0),
                        fair_share_gpu_s: fair.unwrap_or(0.0),
                    })
                },
            )
            .collect()
    }

    /// Writes one audit event on its own (a decision that changed nothing).
    pub async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &str,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "audit";
        let now = Utc::now();
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            audit_in(&mut tx, actor, action, target, detail, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// What a round reads of the admin API's settings.
    pub async fn admin_state(&self) -> Result<AdminState, PersistenceError> {
        const OP: &str = "admin_state";
        let requeues: Vec<(Uuid, String, DateTime<Utc>, String)> =
            sqlx::query_as("SELECT job_id, requested_by, requested_at, reason FROM job_requeues")
                .fetch_all(&self.pool)
                .await
                .map_err(db_err(OP))?;
        Ok(AdminState {
            cordons: self.cordons().await?,
            loans: self.loans().await?,
            requeues: requeues
                .into_iter()
                .map(|(j, by, at, reason)| (JobId(j), Requeue { by, at, reason }))
                .collect(),
            policy: self.policy_setting().await?,
            queues: self.queue_setting().await?,
        })
    }

    /// Every node's loan (returned ones too).
    pub async fn loans(&self) -> Result<BTreeMap<NodeId, NodeLoan>, PersistenceError> {
        const OP: &str = "loans";
        let rows = sqlx::query_as::<_, LoanRow>(
            "SELECT node_id, state, loaned_by, loaned_at, reclaimed_by, reclaimed_at,
                    reclaim_deadline, preempted, scaled_in, returned_at
             FROM node_loans ORDER BY node_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let jobs = |v: serde_json::Value| -> Result<Vec<JobId>, PersistenceError> {
            let ids: Vec<Uuid> =
                serde_json::from_value(v).map_err(|e| corrupt(OP, e.to_string()))?;
            Ok(ids.into_iter().map(JobId).collect())
        };
        let mut out = BTreeMap::new();
        for r in rows {
            let id = NodeId::try_from(r.node_id).map_err(|e| corrupt(OP, e))?;
            out.insert(
                id,
                NodeLoan {
                    state: LoanState::parse(&r.state)
                        .ok_or_else(|| corrupt(OP, format!("loan state {:?}", r.state)))?,
                    loaned_by: r.loaned_by,
                    loaned_at: r.loaned_at,
                    reclaimed_by: r.reclaimed_by,
                    reclaimed_at: r.reclaimed_at,
                    reclaim_deadline: r.reclaim_deadline,
                    preempted: jobs(r.preempted)?,
                    scaled_in: jobs(r.scaled_in)?,
                    returned_at: r.returned_at,
                },
            );
        }
        Ok(out)
    }

    /// Puts inference nodes on loan to training (a node already lent stays
    /// so; one being reclaimed is lent again). Refused, writing nothing,
    /// for a node that is not in the inference pool or when the loans would
    /// leave fewer than `keep(inference nodes)` inference nodes unlent.
    pub async fn loan_nodes(
        &self,
        nodes: &[NodeId],
        keep: &(dyn Fn(usize) -> usize + Sync),
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<(), LoanError> {
        const OP: &str = "loan_nodes";
        let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
        // One loan change at a time: the headroom check sees every other.
        sqlx::query("LOCK TABLE node_loans IN EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
        let pool: Vec<(String, Option<String>)> =
            sqlx::query_as("SELECT id, labels ->> $1 FROM nodes ORDER BY id")
                .bind(POOL_LABEL)
                .fetch_all(&mut *tx)
                .await
                .map_err(db_err(OP))?;
        let inference: BTreeSet<&str> = pool
            .iter()
            .filter(|(_, p)| p.as_deref() == Some("inference"))
            .map(|(id, _)| id.as_str())
            .collect();
        for n in nodes {
            if !pool.iter().any(|(id, _)| id == n.as_str()) {
                return Err(PersistenceError::NotFound(format!("node {n}")).into());
            }
            if !inference.contains(n.as_str()) {
                return Err(LoanError::Refused(format!(
                    "node {n} is not in the inference pool (its agent's label {POOL_LABEL}=inference)"
                )));
            }
        }
        let lent: Vec<String> = sqlx::query_scalar(
            "SELECT node_id FROM node_loans WHERE state IN ('active', 'reclaiming')",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db_err(OP))?;
        let after: BTreeSet<&str> = lent
            .iter()
            .map(String::as_str)
            .chain(nodes.iter().map(|n| n.as_str()))
            .collect();
        let keep = keep(inference.len());
        if after.len() + keep > inference.len() {
            return Err(LoanError::Refused(format!(
                "{} of the {} inference nodes would be on loan; {keep} must stay with inference (loans.headroom)",
                after.len(),
                inference.len()
            )));
        }
        for n in nodes {
            sqlx::query(
                "INSERT INTO node_loans (node_id, state, loaned_by, loaned_at)
                 VALUES ($1, 'active', $2, $3)
                 ON CONFLICT (node_id) DO UPDATE SET
                    state = 'active',
                    loaned_by = CASE WHEN node_loans.state = 'active' THEN node_loans.loaned_by ELSE EXCLUDED.loaned_by END,
                    loaned_at = CASE WHEN node_loans.state = 'active' THEN node_loans.loaned_at ELSE EXCLUDED.loaned_at END,
                    reclaimed_by = '', reclaimed_at = NULL, reclaim_deadline = NULL,
                    preempted = '[]'::jsonb, scaled_in = '[]'::jsonb, returned_at = NULL",
            )
            .bind(n.as_str())
            .bind(actor)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            node_event_in(
                &mut tx,
                n,
                "loaned",
                &format!("loaned to training by {actor}"),
                now,
                OP,
            )
            .await?;
            audit_in(&mut tx, actor, "loan", n.as_str(), "", now, OP).await?;
        }
        tx.commit().await.map_err(db_err(OP))?;
        Ok(())
    }

    /// Starts reclaiming lent nodes with the jobs the decision preempts and
    /// scales in. Refused, writing nothing, for a node not on loan.
    pub async fn reclaim_nodes(
        &self,
        nodes: &[NodeId],
        preempted: &[JobId],
        scaled_in: &[JobId],
        deadline: DateTime<Utc>,
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<(), LoanError> {
        const OP: &str = "reclaim_nodes";
        let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
        sqlx::query("LOCK TABLE node_loans IN EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
        let ids = |v: &[JobId]| serde_json::json!(v.iter().map(|j| j.0).collect::<Vec<_>>());
        for n in nodes {
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM node_loans WHERE node_id = $1")
                    .bind(n.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
            match state.as_deref() {
                Some("active") => {}
                Some("reclaiming") => {
                    return Err(LoanError::Refused(format!(
                        "node {n} is already being reclaimed"
                    )));
                }
                _ => return Err(LoanError::Refused(format!("node {n} is not on loan"))),
            }
            sqlx::query(
                "UPDATE node_loans SET state = 'reclaiming', reclaimed_by = $2, reclaimed_at = $3,
                        reclaim_deadline = $4, preempted = $5, scaled_in = $6
                 WHERE node_id = $1",
            )
            .bind(n.as_str())
            .bind(actor)
            .bind(now)
            .bind(deadline)
            .bind(ids(preempted))
            .bind(ids(scaled_in))
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            let detail = format!(
                "{} job(s) preempted, {} scaled in; deadline {}",
                preempted.len(),
                scaled_in.len(),
                deadline.to_rfc3339()
            );
            node_event_in(
                &mut tx,
                n,
                "reclaiming",
                &format!("reclaim by {actor}: {detail}"),
                now,
                OP,
            )
            .await?;
            audit_in(&mut tx, actor, "reclaim", n.as_str(), &detail, now, OP).await?;
        }
        tx.commit().await.map_err(db_err(OP))?;
        Ok(())
    }

    /// Cordoned and draining nodes.
    pub async fn cordons(&self) -> Result<BTreeMap<NodeId, NodeCordon>, PersistenceError> {
        const OP: &str = "cordons";
        let rows: Vec<(String, bool, String, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT id, draining, cordoned_by, cordon_reason, cordoned_at FROM nodes
             WHERE cordoned_at IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        rows.into_iter()
            .map(|(id, drain, by, reason, at)| {
                let id = NodeId::try_from(id).map_err(|e| corrupt(OP, e))?;
                Ok((
                    id,
                    NodeCordon {
                        drain,
                        by,
                        reason,
                        at,
                    },
                ))
            })
            .collect()
    }

    /// Cordons, drains or uncordons a registered node, with a node event
    /// and an audit event. NotFound for an unknown node.
    pub async fn set_cordon(
        &self,
        node: &NodeId,
        change: CordonChange,
        actor: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "set_cordon";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            let q = match change {
                CordonChange::Uncordon => sqlx::query(
                    "UPDATE nodes SET cordoned_at = NULL, cordoned_by = '', cordon_reason = '',
                            draining = false
                     WHERE id = $1",
                )
                .bind(node.as_str()),
                CordonChange::Cordon | CordonChange::Drain => sqlx::query(
                    "UPDATE nodes SET cordoned_at = COALESCE(cordoned_at, $2), cordoned_by = $3,
                            cordon_reason = $4, draining = $5
                     WHERE id = $1",
                )
                .bind(node.as_str())
                .bind(now)
                .bind(actor)
                .bind(reason)
                .bind(change == CordonChange::Drain),
            };
            if q.execute(&mut *tx)
                .await
                .map_err(db_err(OP))?
                .rows_affected()
                == 0
            {
                return Err(PersistenceError::NotFound(format!("node {node}")));
            }
            let action = change.action();
            let message = if reason.is_empty() {
                format!("{action} by {actor}")
            } else {
                format!("{action} by {actor}: {reason}")
            };
            node_event_in(&mut tx, node, action, &message, now, OP).await?;
            audit_in(&mut tx, actor, action, node.as_str(), reason, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// Forgets a node's token hash (its agent must enroll again with the
    /// join token), with a node event and an audit event. NotFound for an
    /// unknown node.
    pub async fn revoke_node_token(
        &self,
        node: &NodeId,
        actor: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "revoke_node_token";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            let r = sqlx::query("UPDATE nodes SET token_sha256 = NULL WHERE id = $1")
                .bind(node.as_str())
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            if r.rows_affected() == 0 {
                return Err(PersistenceError::NotFound(format!("node {node}")));
            }
            let mut message = format!(
                "node token revoked by {actor}; the agent must enroll again with the join token"
            );
            if !reason.is_empty() {
                message.push_str(&format!(" ({reason})"));
            }
            node_event_in(&mut tx, node, "token_revoked", &message, now, OP).await?;
            audit_in(
                &mut tx,
                actor,
                "revoke_token",
                node.as_str(),
                reason,
                now,
                OP,
            )
            .await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// Records a request to take a running job off its GPUs at the next
    /// round (a job event and an audit event with it). NotFound for an
    /// unknown job; InvalidTransition for a job that is not running.
    pub async fn request_requeue(
        &self,
        job: JobId,
        actor: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "request_requeue";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 FOR UPDATE")
                    .bind(job.0)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
            let state = state.ok_or_else(|| PersistenceError::NotFound(format!("job {job}")))?;
            let from: JobState = state.parse().map_err(|e: String| corrupt(OP, e))?;
            if from != JobState::Running {
                return Err(PersistenceError::InvalidTransition {
                    id: job,
                    from,
                    to: JobState::Queued,
                });
            }
            sqlx::query(
                "INSERT INTO job_requeues (job_id, requested_by, requested_at, reason)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (job_id) DO UPDATE
                 SET requested_by = $2, requested_at = $3, reason = $4",
            )
            .bind(job.0)
            .bind(actor)
            .bind(now)
            .bind(reason)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            let message = if reason.is_empty() {
                format!("re-queue requested by {actor}; the next round suspends it from its checkpoint")
            } else {
                format!(
                    "re-queue requested by {actor} ({reason}); the next round suspends it from its checkpoint"
                )
            };
            notes_in(&mut tx, &[(job, "requeue_requested", &message)], now, OP).await?;
            audit_in(&mut tx, actor, "requeue", &job.to_string(), reason, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// The policy set through the admin API, if any.
    pub async fn policy_setting(&self) -> Result<Option<PolicySetting>, PersistenceError> {
        const OP: &str = "policy_setting";
        let row: Option<(String, serde_json::Value, String, DateTime<Utc>)> =
            sqlx::query_as("SELECT policy, knobs, set_by, set_at FROM policy_setting")
                .fetch_optional(&self.pool)
                .await
                .map_err(db_err(OP))?;
        row.map(|(policy, knobs, set_by, set_at)| {
            let knobs = serde_json::from_value(knobs).map_err(|e| corrupt(OP, e.to_string()))?;
            Ok(PolicySetting {
                policy,
                knobs,
                set_by,
                set_at,
            })
        })
        .transpose()
    }

    /// Stores the policy the next rounds run (validated by the caller),
    /// with an audit event.
    pub async fn set_policy(&self, s: &PolicySetting) -> Result<(), PersistenceError> {
        const OP: &str = "set_policy";
        let knobs = serde_json::to_value(&s.knobs).map_err(|e| corrupt(OP, e.to_string()))?;
        let detail = if s.knobs.is_empty() {
            s.policy.clone()
        } else {
            let k: Vec<String> = s.knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{} {}", s.policy, k.join(" "))
        };
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            sqlx::query(
                "INSERT INTO policy_setting (singleton, policy, knobs, set_by, set_at)
                 VALUES (true, $1, $2, $3, $4)
                 ON CONFLICT (singleton) DO UPDATE
                 SET policy = $1, knobs = $2, set_by = $3, set_at = $4",
            )
            .bind(&s.policy)
            .bind(&knobs)
            .bind(&s.set_by)
            .bind(s.set_at)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            audit_in(
                &mut tx,
                &s.set_by,
                "set_policy",
                &s.policy,
                &detail,
                s.set_at,
                OP,
            )
            .await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// The queues set through the admin API, if any.
    pub async fn queue_setting(&self) -> Result<Option<QueueSetting>, PersistenceError> {
        const OP: &str = "queue_setting";
        let row: Option<(serde_json::Value, String, DateTime<Utc>)> =
            sqlx::query_as("SELECT queues, set_by, set_at FROM queue_setting")
                .fetch_optional(&self.pool)
                .await
                .map_err(db_err(OP))?;
        row.map(|(queues, set_by, set_at)| {
            let queues = serde_json::from_value(queues).map_err(|e| corrupt(OP, e.to_string()))?;
            Ok(QueueSetting {
                queues,
                set_by,
                set_at,
            })
        })
        .transpose()
    }

    /// Stores the queue set the next rounds and submissions use
    /// (validated by the caller), with an audit event. Refused, writing
    /// nothing, when a live job names a queue that would no longer take
    /// jobs (`leaves`: the names of the new set's leaf queues).
    pub async fn set_queues(
        &self,
        s: &QueueSetting,
        leaves: &BTreeSet<String>,
    ) -> Result<(), SetQueuesError> {
        const OP: &str = "set_queues";
        let queues = serde_json::to_value(&s.queues).map_err(|e| corrupt(OP, e.to_string()))?;
        let detail: Vec<String> = s
            .queues
            .iter()
            .map(|q| {
                let limit = q
                    .limit_gpus
                    .map_or(String::new(), |l| format!(" limit={l}"));
                format!(
                    "{} guaranteed={} weight={}{limit}",
                    q.name, q.guaranteed_gpus, q.over_quota_weight
                )
            })
            .collect();
        let detail = detail.join("; ");
        // Ok(Err(why)): refused, nothing written.
        let outcome = with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            // Serialises set calls. (A submission that resolved its queue from
            // the old set just before may still land in a removed queue; its
            // job then waits, its reason naming the queue's 0 GPUs, until the
            // queue is back or it is cancelled.)
            sqlx::query("LOCK TABLE queue_setting IN EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            let named: Vec<(Uuid, String)> = sqlx::query_as(
                "SELECT id, spec->>'queue' FROM jobs
                 WHERE state NOT IN ('completed', 'failed', 'cancelled')
                   AND coalesce(spec->>'queue', '') <> ''",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            let stranded: Vec<String> = named
                .iter()
                .filter(|(_, q)| !leaves.contains(q))
                .map(|(j, q)| format!("{j} ({q})"))
                .collect();
            if !stranded.is_empty() {
                let shown: Vec<&str> = stranded.iter().take(10).map(String::as_str).collect();
                return Ok(Err(format!(
                    "{} live job(s) name a queue the new set has no longer as a team: {}{}; \
                     keep the queue until they end, or cancel them",
                    stranded.len(),
                    shown.join(", "),
                    if stranded.len() > 10 { ", ..." } else { "" }
                )));
            }
            sqlx::query(
                "INSERT INTO queue_setting (singleton, queues, set_by, set_at)
                 VALUES (true, $1, $2, $3)
                 ON CONFLICT (singleton) DO UPDATE
                 SET queues = $1, set_by = $2, set_at = $3",
            )
            .bind(&queues)
            .bind(&s.set_by)
            .bind(s.set_at)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            audit_in(
                &mut tx,
                &s.set_by,
                "set_queues",
                "queues",
                &detail,
                s.set_at,
                OP,
            )
            .await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(Ok(()))
        })
        .await?;
        outcome.map_err(SetQueuesError::InUse)
    }

    /// GPUs held and jobs running and waiting, per queue (live jobs).
    pub async fn queue_usage(&self) -> Result<BTreeMap<String, (u32, u32, u32)>, PersistenceError> {
        const OP: &str = "queue_usage";
        let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT coalesce(j.spec->>'queue', ''),
                    coalesce(sum(g.n), 0)::bigint,
                    count(*) FILTER (WHERE j.state = 'running'),
                    count(*) FILTER (WHERE j.state IN ('submitted', 'profiling', 'queued'))
             FROM jobs j
             LEFT JOIN LATERAL (
                 SELECT sum(cardinality(a.gpu_uuids)) AS n FROM assignments a WHERE a.job_id = j.id
             ) g ON true
             WHERE j.state NOT IN ('completed', 'failed', 'cancelled')
             GROUP BY 1",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        Ok(rows
            .into_iter()
            .map(|(q, g, r, w)| (q, (g as u32, r as u32, w as u32)))
            .collect())
    }

    /// The newest `limit` audit events, newest first.
    pub async fn audit_events(&self, limit: u32) -> Result<Vec<AuditEvent>, PersistenceError> {
        const OP: &str = "audit_events";
        let rows: Vec<(i64, DateTime<Utc>, String, String, String, String)> = sqlx::query_as(
            "SELECT id, at, actor, action, target, detail FROM audit_events
             ORDER BY id DESC LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        Ok(rows
            .into_iter()
            .map(|(id, at, actor, action, target, detail)| AuditEvent {
                id,
                at,
                actor,
                action,
                target,
                detail,
            })
            .collect())
    }
}
