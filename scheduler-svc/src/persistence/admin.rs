//! Operators' controls in Postgres (migrations 0010, 0012): node cordons
//! and drains, job re-queue requests, the policy and the queues set live,
//! and the audit log.
//! Any replica writes them (each change and its audit event in one
//! transaction); the leader's rounds read them.

use super::*;

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

/// Everything the admin API set that a round reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdminState {
    pub cordons: BTreeMap<NodeId, NodeCordon>,
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
            requeues: requeues
                .into_iter()
                .map(|(j, by, at, reason)| (JobId(j), Requeue { by, at, reason }))
                .collect(),
            policy: self.policy_setting().await?,
            queues: self.queue_setting().await?,
        })
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
            note_in(&mut tx, job, "requeue_requested", &message, now, OP).await?;
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
