//! What a round reads before it decides: live jobs and their placements,
//! the stored plan, service received, merges, estimates, finished jobs'
//! curves and outputs, retries, fresh starts, the Prompt Bank, the
//! utilisation fits.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::policy::MergeMode;
use fmsched_core::{GpuUuid, JobId, NodeId};
use fmsched_estimator::footprint::UtilizationFit;
use uuid::Uuid;

use crate::persistence::records::{
    Assignment, BankPrompt, Estimate, JOB_COLUMNS, JobRecord, MergeRecord, job_from_row,
};
use crate::persistence::{Persistence, PersistenceError, corrupt, db_err};

/// A finished job's metric curve and the target it trained for: the
/// prior of the learned estimator for later jobs of its model and metric.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricCurve {
    pub model: String,
    pub metric: String,
    pub lower_is_better: bool,
    /// Its `target.metric.value`.
    pub target: f64,
    pub evals: Vec<f64>,
    /// It trained from another task's weights or beside another task
    /// ([`TRANSFERRED`]).
    pub transferred: bool,
}

/// Whether the job `j` (a `jobs` row) trained from another task's weights
/// or beside another task, as the learned prior tells finished jobs apart
/// (`curve_prior::Start::Transferred`): B of a temporal merge (a warm start
/// included) or a member of a spatial merge, split or not (its weights
/// came from the joint process), unless it was restarted from its
/// pre-trained weights since (a fresh start clears its evaluations, so its
/// curve is its own alone). One rule for finished jobs and running ones.
const TRANSFERRED: &str = "(EXISTS (SELECT 1 FROM merges m
        WHERE (m.mode = 'temporal' AND m.job_b = j.id)
           OR (m.mode = 'spatial' AND j.id IN (m.job_a, m.job_b)))
    AND NOT EXISTS (SELECT 1 FROM job_progress p
        WHERE p.job_id = j.id AND p.fresh_generation IS NOT NULL))";

/// The persisted intent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredPlan {
    pub generation: i64,
    pub assignments: Vec<Assignment>,
}

/// The service a job has received (table `job_service`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobService {
    pub attained_gpu_s: f64,
    pub executed_s: f64,
    pub fair_share_gpu_s: f64,
    pub lease_until: Option<DateTime<Utc>>,
    /// The last round predicted it to miss its deadline.
    pub at_risk: bool,
}

/// What the last round predicted of a live job, and its lease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobSchedule {
    pub predicted_finish: Option<DateTime<Utc>>,
    pub at_risk: bool,
    pub lease_until: Option<DateTime<Utc>>,
}

/// A job's failures so far (table `job_progress`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetryState {
    pub retries: u32,
    /// The process whose failure was counted last (a report repeated in the
    /// next heartbeat is not a new failure).
    pub last_failed_pid: Option<u32>,
    /// Reports of processes that last ran under an older plan generation
    /// than this are not new failures (the other members of a gang whose
    /// failure was counted, stale reports of the run before).
    pub last_failed_generation: Option<i64>,
    pub retry_after: Option<DateTime<Utc>>,
}

/// A job restarted from its initial weights ([`RoundWrites::fresh_starts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreshStart {
    /// The plan generation of the round that decided it: reports of the
    /// job's processes from older plans are the dropped run's.
    pub generation: i64,
    /// No node has reported the fresh process yet.
    pub pending: bool,
}

/// A `job_progress` row as the retry rule reads it.
#[derive(sqlx::FromRow)]
struct RetryRow {
    job_id: Uuid,
    retries: i32,
    last_failed_pid: Option<i64>,
    retry_after: Option<DateTime<Utc>>,
    last_failed_generation: Option<i64>,
}

/// An `assignments` row.
#[derive(sqlx::FromRow)]
struct AssignmentRow {
    job_id: Uuid,
    node_id: String,
    gpu_uuids: Vec<String>,
    profile: bool,
    rank_offset: i32,
    master_port: Option<i32>,
}

/// A `job_service` row.
#[derive(sqlx::FromRow)]
struct ServiceRow {
    job_id: Uuid,
    attained_gpu_s: f64,
    executed_s: f64,
    fair_share_gpu_s: f64,
    lease_until: Option<DateTime<Utc>>,
    at_risk: bool,
}

/// A `merges` row.
#[derive(sqlx::FromRow)]
struct MergeRow {
    id: i64,
    job_a: Uuid,
    job_b: Uuid,
    mode: String,
    gain_ab: f64,
    gain_ba: f64,
    state: String,
    guard_passed: bool,
    observed_gain: Option<f64>,
}

/// A `job_estimates` row.
#[derive(sqlx::FromRow)]
struct EstimateRow {
    job_id: Uuid,
    iterations: Option<i64>,
    curve: Option<serde_json::Value>,
    fisher: Vec<f64>,
    fisher_repeat: Vec<f64>,
    step_time_s: Option<f64>,
    note: String,
    evals: Vec<f64>,
    spread: f64,
}

/// A finished job's metric curve as [`Persistence::finished_metric_curves`]
/// selects it.
#[derive(sqlx::FromRow)]
struct CurveRow {
    model: String,
    metric: Option<String>,
    lower: bool,
    target: Option<f64>,
    evals: Vec<f64>,
    transferred: bool,
}

impl Persistence {
    /// What the retry rule needs of every live job that failed before.
    pub async fn retry_state(&self) -> Result<BTreeMap<JobId, RetryState>, PersistenceError> {
        const OP: &str = "retry_state";
        let rows = sqlx::query_as::<_, RetryRow>(
            "SELECT p.job_id, p.retries, p.last_failed_pid, p.retry_after, p.last_failed_generation
             FROM job_progress p
             JOIN jobs j ON j.id = p.job_id
             WHERE p.retries > 0 AND j.state IN ('submitted','profiling','queued','running')",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut out = BTreeMap::new();
        for r in rows {
            out.insert(
                JobId(r.job_id),
                RetryState {
                    retries: r.retries.max(0) as u32,
                    last_failed_pid: r
                        .last_failed_pid
                        .map(|p| p.clamp(0, i64::from(u32::MAX)) as u32),
                    retry_after: r.retry_after,
                    last_failed_generation: r.last_failed_generation,
                },
            );
        }
        Ok(out)
    }

    /// Every node each live job has been placed on (see migration 0009):
    /// reports of a job's process count only from these.
    pub async fn placements_of_live_jobs(
        &self,
    ) -> Result<BTreeMap<JobId, BTreeSet<NodeId>>, PersistenceError> {
        const OP: &str = "placements_of_live_jobs";
        let rows: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT p.job_id, p.node_id FROM job_placements p JOIN jobs j ON j.id = p.job_id
             WHERE j.state IN ('submitted','profiling','queued','running')",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut out: BTreeMap<JobId, BTreeSet<NodeId>> = BTreeMap::new();
        for (job, node) in rows {
            let node = NodeId::try_from(node).map_err(|e| corrupt(OP, e))?;
            out.entry(JobId(job)).or_default().insert(node);
        }
        Ok(out)
    }

    /// The last round's predictions and the leases of these jobs (those it
    /// said nothing of are absent).
    pub async fn job_schedules(
        &self,
        jobs: &[JobId],
    ) -> Result<BTreeMap<JobId, JobSchedule>, PersistenceError> {
        let ids: Vec<Uuid> = jobs.iter().map(|j| j.0).collect();
        type Row = (Uuid, Option<DateTime<Utc>>, bool, Option<DateTime<Utc>>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT job_id, predicted_finish, at_risk, lease_until FROM job_service
             WHERE job_id = ANY($1::uuid[])",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("job_schedules"))?;
        Ok(rows
            .into_iter()
            .map(|(j, predicted_finish, at_risk, lease_until)| {
                (
                    JobId(j),
                    JobSchedule {
                        predicted_finish,
                        at_risk,
                        lease_until,
                    },
                )
            })
            .collect())
    }

    /// Jobs that are not finished (submitted, profiling, queued, running),
    /// oldest first.
    /// Whether a prompt-tuning job waits to start (the prompt lane's cheap
    /// look before a pass).
    pub async fn prompt_jobs_pending(&self) -> Result<bool, PersistenceError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE state IN ('submitted','queued')
                AND spec->>'kind' = 'prompt_tuning')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db_err("prompt_jobs_pending"))
    }

    pub async fn live_jobs(&self) -> Result<Vec<JobRecord>, PersistenceError> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('submitted','profiling','queued','running') ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("live_jobs"))?;
        rows.iter().map(job_from_row).collect()
    }

    /// The `limit` most recently submitted completed jobs of `models` that
    /// left output weights (a warm start's source, `ClusterView::finished`).
    pub async fn finished_outputs(
        &self,
        models: &[String],
        limit: i64,
    ) -> Result<Vec<JobRecord>, PersistenceError> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs
             WHERE state = 'completed' AND model = ANY($1)
               AND output_path IS NOT NULL AND output_path <> ''
             ORDER BY id DESC LIMIT $2"
        ))
        .bind(models)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("finished_outputs"))?;
        rows.iter().map(job_from_row).collect()
    }

    /// The utilisation fits by (model, GPU family)
    /// ([`RoundWrites::utilization_fits`]).
    pub async fn utilization_fits(
        &self,
    ) -> Result<BTreeMap<(String, String), UtilizationFit>, PersistenceError> {
        let rows: Vec<(String, String, f64, f64, i64)> = sqlx::query_as(
            "SELECT model, gpu_family, sum_xy, sum_xx, samples FROM utilization_fits",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("utilization_fits"))?;
        Ok(rows
            .into_iter()
            .map(|(m, g, sum_xy, sum_xx, n)| {
                (
                    (m, g),
                    UtilizationFit {
                        sum_xy,
                        sum_xx,
                        samples: u64::try_from(n).unwrap_or(0),
                    },
                )
            })
            .collect())
    }

    /// The Prompt Bank of each of `models`, oldest prompt first.
    pub async fn prompt_bank(
        &self,
        models: &[String],
    ) -> Result<BTreeMap<String, Vec<BankPrompt>>, PersistenceError> {
        let mut out: BTreeMap<String, Vec<BankPrompt>> = BTreeMap::new();
        if models.is_empty() {
            return Ok(out);
        }
        let rows: Vec<(Uuid, String, String, Vec<f64>)> = sqlx::query_as(
            "SELECT job_id, model, location, features FROM prompt_bank
             WHERE model = ANY($1) ORDER BY seq",
        )
        .bind(models)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("prompt_bank"))?;
        for (job, model, location, features) in rows {
            out.entry(model.clone()).or_default().push(BankPrompt {
                job: JobId(job),
                model,
                location,
                features,
            });
        }
        Ok(out)
    }

    /// The prompts in the bank of each of `models` (models without any
    /// left out): what a cached index is checked against.
    pub async fn prompt_bank_ids(
        &self,
        models: &[String],
    ) -> Result<BTreeMap<String, BTreeSet<JobId>>, PersistenceError> {
        let rows: Vec<(String, Uuid)> =
            sqlx::query_as("SELECT model, job_id FROM prompt_bank WHERE model = ANY($1)")
                .bind(models)
                .fetch_all(&self.pool)
                .await
                .map_err(db_err("prompt_bank_ids"))?;
        let mut out: BTreeMap<String, BTreeSet<JobId>> = BTreeMap::new();
        for (m, j) in rows {
            out.entry(m).or_default().insert(JobId(j));
        }
        Ok(out)
    }

    /// Live jobs that may no longer share a GPU ([`RoundWrites::no_sharing`]).
    pub async fn no_sharing_jobs(&self) -> Result<BTreeSet<JobId>, PersistenceError> {
        let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
            "SELECT id FROM jobs WHERE no_gpu_sharing
             AND state IN ('submitted','profiling','queued','running')",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("no_sharing_jobs"))?;
        Ok(ids.into_iter().map(JobId).collect())
    }

    /// The current plan: generation and every assignment.
    pub async fn current_plan(&self) -> Result<StoredPlan, PersistenceError> {
        const OP: &str = "current_plan";
        let generation: i64 = sqlx::query_scalar("SELECT generation FROM plan_generation")
            .fetch_one(&self.pool)
            .await
            .map_err(db_err(OP))?;
        let rows = sqlx::query_as::<_, AssignmentRow>(
            "SELECT job_id, node_id, gpu_uuids, profile, rank_offset, master_port FROM assignments
             ORDER BY job_id, rank_offset",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut assignments = Vec::with_capacity(rows.len());
        for r in rows {
            assignments.push(Assignment {
                job: JobId(r.job_id),
                node: NodeId::try_from(r.node_id).map_err(|e| corrupt(OP, e))?,
                gpus: r.gpu_uuids.into_iter().map(GpuUuid).collect(),
                profile: r.profile,
                rank_offset: r.rank_offset.max(0) as u32,
                master_port: r.master_port.and_then(|p| u16::try_from(p).ok()),
            });
        }
        Ok(StoredPlan {
            generation,
            assignments,
        })
    }

    /// The service of every live job that has any, by job.
    pub async fn service(&self) -> Result<BTreeMap<JobId, JobService>, PersistenceError> {
        const OP: &str = "service";
        let rows = sqlx::query_as::<_, ServiceRow>(
            "SELECT s.job_id, s.attained_gpu_s, s.executed_s, s.fair_share_gpu_s, s.lease_until,
                    s.at_risk
             FROM job_service s JOIN jobs j ON j.id = s.job_id
             WHERE j.state IN ('submitted','profiling','queued','running')",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let out = rows
            .into_iter()
            .map(|r| {
                (
                    JobId(r.job_id),
                    JobService {
                        attained_gpu_s: r.attained_gpu_s,
                        executed_s: r.executed_s,
                        fair_share_gpu_s: r.fair_share_gpu_s,
                        lease_until: r.lease_until,
                        at_risk: r.at_risk,
                    },
                )
            })
            .collect();
        Ok(out)
    }

    /// The merges a live job is part of (a merge whose jobs have both ended
    /// matters no more), oldest first.
    pub async fn merges_of_live_jobs(&self) -> Result<Vec<MergeRecord>, PersistenceError> {
        const OP: &str = "merges_of_live_jobs";
        let rows = sqlx::query_as::<_, MergeRow>(
            "SELECT m.id, m.job_a, m.job_b, m.mode, m.gain_ab, m.gain_ba, m.state, m.guard_passed,
                    m.observed_gain
             FROM merges m
             WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id IN (m.job_a, m.job_b)
                           AND j.state IN ('submitted','profiling','queued','running'))
             ORDER BY m.id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        rows.into_iter()
            .map(|r| {
                Ok(MergeRecord {
                    id: r.id,
                    a: JobId(r.job_a),
                    b: JobId(r.job_b),
                    mode: match r.mode.as_str() {
                        "temporal" => MergeMode::Temporal,
                        "spatial" => MergeMode::Spatial,
                        o => return Err(corrupt(OP, format!("merge mode {o:?}"))),
                    },
                    gain_ab: r.gain_ab,
                    gain_ba: r.gain_ba,
                    active: r.state == "active",
                    guard_passed: r.guard_passed,
                    observed_gain: r.observed_gain,
                })
            })
            .collect()
    }

    /// Every job's estimates.
    pub async fn estimates(&self) -> Result<BTreeMap<JobId, Estimate>, PersistenceError> {
        const OP: &str = "estimates";
        let rows = sqlx::query_as::<_, EstimateRow>(
            "SELECT job_id, iterations, curve, fisher, fisher_repeat, step_time_s, note, evals, spread
             FROM job_estimates",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    JobId(r.job_id),
                    Estimate {
                        iterations: r.iterations.map(|i| i.max(0) as u64),
                        curve: r.curve,
                        fisher: r.fisher,
                        fisher_repeat: r.fisher_repeat,
                        step_time_s: r.step_time_s,
                        note: r.note,
                        evals: r.evals,
                        spread: r.spread,
                    },
                )
            })
            .collect())
    }

    /// The metric curves (two epochs or more) of the `limit` most recently
    /// submitted completed jobs of `models`.
    pub async fn finished_metric_curves(
        &self,
        models: &[String],
        limit: i64,
    ) -> Result<Vec<MetricCurve>, PersistenceError> {
        const OP: &str = "finished_metric_curves";
        let sql = format!(
            "SELECT j.model, j.spec #>> '{{target,metric,name}}' AS metric,
                    COALESCE((j.spec #>> '{{target,metric,lower_is_better}}')::boolean, FALSE) AS lower,
                    (j.spec #>> '{{target,metric,value}}')::float8 AS target,
                    e.evals, {TRANSFERRED} AS transferred
             FROM jobs j JOIN job_estimates e ON e.job_id = j.id
             WHERE j.state = 'completed' AND j.model = ANY($1)
               AND j.spec #> '{{target,metric}}' IS NOT NULL AND cardinality(e.evals) >= 2
             ORDER BY j.id DESC LIMIT $2"
        );
        let rows = sqlx::query_as::<_, CurveRow>(&sql)
            .bind(models)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_err(OP))?;
        rows.into_iter()
            .map(|r| {
                Ok(MetricCurve {
                    model: r.model,
                    metric: r.metric.unwrap_or_default(),
                    lower_is_better: r.lower,
                    target: r
                        .target
                        .ok_or_else(|| corrupt(OP, "a metric target without a value"))?,
                    evals: r.evals,
                    transferred: r.transferred,
                })
            })
            .collect()
    }

    /// Those of `jobs` that trained from another task's weights or beside
    /// another task ([`TRANSFERRED`], the rule the finished jobs' curves
    /// are told apart by).
    pub async fn transferred_jobs(
        &self,
        jobs: &[JobId],
    ) -> Result<BTreeSet<JobId>, PersistenceError> {
        let ids: Vec<Uuid> = jobs.iter().map(|j| j.0).collect();
        let sql = format!("SELECT j.id FROM jobs j WHERE j.id = ANY($1) AND {TRANSFERRED}");
        let rows: Vec<Uuid> = sqlx::query_scalar(&sql)
            .bind(&ids)
            .fetch_all(&self.pool)
            .await
            .map_err(db_err("transferred_jobs"))?;
        Ok(rows.into_iter().map(JobId).collect())
    }

    /// The fitted Eq. 3 loss curves (JSON, quality ≥ `min_quality`) of the
    /// `limit` most recently submitted completed jobs of `model`.
    pub async fn finished_loss_curves(
        &self,
        model: &str,
        limit: i64,
        min_quality: f64,
    ) -> Result<Vec<serde_json::Value>, PersistenceError> {
        sqlx::query_scalar(
            "SELECT e.curve FROM jobs j JOIN job_estimates e ON e.job_id = j.id
             WHERE j.state = 'completed' AND j.model = $1 AND e.curve IS NOT NULL
               AND jsonb_typeof(e.curve -> 'quality') = 'number'
               AND (e.curve ->> 'quality')::float8 >= $3
             ORDER BY j.id DESC LIMIT $2",
        )
        .bind(model)
        .bind(limit)
        .bind(min_quality)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("finished_loss_curves"))
    }

    /// Iterations done and newest checkpoint of every job that reported.
    pub async fn progress(
        &self,
    ) -> Result<BTreeMap<JobId, (u64, Option<String>)>, PersistenceError> {
        let rows: Vec<(Uuid, i64, Option<String>)> =
            sqlx::query_as("SELECT job_id, iteration, checkpoint_path FROM job_progress")
                .fetch_all(&self.pool)
                .await
                .map_err(db_err("progress"))?;
        Ok(rows
            .into_iter()
            .map(|(job, it, ckpt)| (JobId(job), (it.max(0) as u64, ckpt)))
            .collect())
    }

    /// Jobs restarted from their initial weights ([`FreshStart`]).
    pub async fn fresh_starts(&self) -> Result<BTreeMap<JobId, FreshStart>, PersistenceError> {
        let rows: Vec<(Uuid, i64, bool)> = sqlx::query_as(
            "SELECT job_id, fresh_generation, fresh_pending FROM job_progress
             WHERE fresh_generation IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("fresh_starts"))?;
        Ok(rows
            .into_iter()
            .map(|(j, generation, pending)| {
                (
                    JobId(j),
                    FreshStart {
                        generation,
                        pending,
                    },
                )
            })
            .collect())
    }
}
