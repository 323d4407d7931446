//! Jobs and their event history: submission (with idempotency keys),
//! reads and listings, user-facing transitions and notes, counts and the
//! SLO report the metrics show.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fmsched_core::{JobId, JobSpec, JobState, UserName};

use crate::persistence::records::{JOB_COLUMNS, JobRecord, job_from_row, opt_state};
use crate::persistence::writes::{notes_in, transition_in};
use crate::persistence::{Persistence, PersistenceError, corrupt, db_err, with_retries};

/// Deadline outcomes for the SLO metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SloReport {
    /// Per class (`slo`, `soft_slo`): (jobs with a deadline that ended,
    /// those that missed it: failed, or completed after it).
    pub finished: BTreeMap<&'static str, (u64, u64)>,
    pub best_effort_completed: u64,
    /// Mean JCT (completion − submission) of completed best-effort jobs.
    pub best_effort_avg_jct_s: f64,
    /// Live jobs the last round predicted to miss their deadline.
    pub at_risk: u64,
}

/// One entry of a job's history.
#[derive(Clone, Debug, PartialEq)]
pub struct JobEventRecord {
    pub seq: i64,
    pub job_id: JobId,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub from_state: Option<JobState>,
    pub to_state: Option<JobState>,
    pub message: String,
}

/// A new job to insert.
pub struct NewJob<'a> {
    pub id: JobId,
    pub owner: &'a UserName,
    pub spec: &'a JobSpec,
    pub idempotency_key: Option<&'a str>,
    pub now: DateTime<Utc>,
}

#[derive(Debug)]
pub enum SubmitOutcome {
    Created(JobRecord),
    /// An earlier submission with the same (owner, idempotency key).
    Existing(JobRecord),
}

/// Filter and page of [`Persistence::list_jobs`].
#[derive(Clone, Debug, Default)]
pub struct JobQuery {
    pub owner: Option<UserName>,
    pub states: Vec<JobState>,
    /// Only jobs with a smaller id (ids are time-ordered: older jobs).
    pub before: Option<JobId>,
    pub limit: u32,
}

/// A `job_events` row as stored.
#[derive(sqlx::FromRow)]
struct EventRow {
    seq: i64,
    job_id: uuid::Uuid,
    at: DateTime<Utc>,
    kind: String,
    from_state: Option<String>,
    to_state: Option<String>,
    message: String,
}

impl Persistence {
    /// Inserts a job and its `submitted` event in one statement (one round
    /// trip, one commit). With an idempotency key already used by this owner
    /// it returns the existing job instead; the caller compares specs.
    pub async fn submit_job(&self, new: NewJob<'_>) -> Result<SubmitOutcome, PersistenceError> {
        const OP: &str = "submit_job";
        let spec = serde_json::to_value(new.spec).map_err(|e| corrupt(OP, e.to_string()))?;
        // The event's sequence number is drawn in the jobs insert so both rows
        // agree without a second statement.
        let seq: Option<i64> = sqlx::query_scalar(
            "WITH ins AS (
                INSERT INTO jobs (id, owner, name, model, spec, idempotency_key, state,
                                  created_at, updated_at, last_event_seq)
                VALUES ($1, $2, $3, $4, $5, $6, 'submitted', $7, $7,
                        nextval(pg_get_serial_sequence('job_events', 'seq')))
                ON CONFLICT ON CONSTRAINT jobs_owner_idempotency_key DO NOTHING
                RETURNING id, last_event_seq
             ), ev AS (
                INSERT INTO job_events (seq, job_id, at, kind, to_state, message)
                SELECT last_event_seq, id, $7, 'submitted', 'submitted', 'job submitted' FROM ins
             )
             SELECT last_event_seq FROM ins",
        )
        .bind(new.id.0)
        .bind(&new.owner.0)
        .bind(&new.spec.name)
        .bind(&new.spec.model)
        .bind(&spec)
        .bind(new.idempotency_key)
        .bind(new.now)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_err(OP))?;

        if let Some(seq) = seq {
            return Ok(SubmitOutcome::Created(JobRecord {
                id: new.id,
                owner: new.owner.clone(),
                spec: new.spec.clone(),
                idempotency_key: new.idempotency_key.map(str::to_string),
                state: JobState::Submitted,
                state_reason: String::new(),
                output_path: None,
                created_at: new.now,
                updated_at: new.now,
                last_event_seq: seq,
            }));
        }
        let key = new
            .idempotency_key
            .ok_or_else(|| corrupt(OP, "insert returned nothing without a key"))?;
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE owner = $1 AND idempotency_key = $2"
        ))
        .bind(&new.owner.0)
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(db_err(OP))?;
        Ok(SubmitOutcome::Existing(job_from_row(&row)?))
    }

    /// Adds an event to a job's history (skipped when it repeats the last
    /// one), outside any round: what the API says at submit.
    pub async fn note(
        &self,
        job: JobId,
        kind: &str,
        message: &str,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "note";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            notes_in(&mut tx, &[(job, kind, message)], now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    pub async fn get_job(&self, id: JobId) -> Result<Option<JobRecord>, PersistenceError> {
        let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_err("get_job"))?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Jobs newest first.
    pub async fn list_jobs(&self, q: &JobQuery) -> Result<Vec<JobRecord>, PersistenceError> {
        let states: Vec<String> = q.states.iter().map(|s| s.as_str().to_string()).collect();
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs
             WHERE ($1::text IS NULL OR owner = $1)
               AND (cardinality($2::text[]) = 0 OR state = ANY($2))
               AND ($3::uuid IS NULL OR id < $3)
             ORDER BY id DESC
             LIMIT $4"
        ))
        .bind(q.owner.as_ref().map(|o| o.0.as_str()))
        .bind(&states)
        .bind(q.before.map(|b| b.0))
        .bind(i64::from(q.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err("list_jobs"))?;
        rows.iter().map(job_from_row).collect()
    }

    /// Moves a job to `to`, appending an event, in one transaction that holds
    /// the job's row lock (so one job's events commit in sequence order).
    /// Moving a job to the state it is already in is a no-op that returns it.
    pub async fn transition_job(
        &self,
        id: JobId,
        to: JobState,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<JobRecord, PersistenceError> {
        const OP: &str = "transition_job";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            let job = transition_in(&mut tx, id, to, reason, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(job)
        })
        .await
    }

    /// A job's events with `seq > after`, oldest first.
    pub async fn job_events(
        &self,
        id: JobId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<JobEventRecord>, PersistenceError> {
        const OP: &str = "job_events";
        let rows = sqlx::query_as::<_, EventRow>(
            "SELECT seq, job_id, at, kind, from_state, to_state, message FROM job_events
             WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(id.0)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        rows.into_iter()
            .map(|r| {
                Ok(JobEventRecord {
                    seq: r.seq,
                    job_id: JobId(r.job_id),
                    at: r.at,
                    kind: r.kind,
                    from_state: opt_state(OP, r.from_state)?,
                    to_state: opt_state(OP, r.to_state)?,
                    message: r.message,
                })
            })
            .collect()
    }

    pub async fn job_counts_by_state(&self) -> Result<BTreeMap<JobState, u64>, PersistenceError> {
        const OP: &str = "job_counts_by_state";
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, count(*) FROM jobs GROUP BY state")
                .fetch_all(&self.pool)
                .await
                .map_err(db_err(OP))?;
        let mut out = BTreeMap::new();
        for (s, n) in rows {
            out.insert(s.parse().map_err(|e: String| corrupt(OP, e))?, n as u64);
        }
        Ok(out)
    }

    /// Deadline outcomes of finished jobs and best-effort JCT, for the
    /// SLO metrics (read at scrape time, like the job counts).
    pub async fn slo_report(&self) -> Result<SloReport, PersistenceError> {
        const OP: &str = "slo_report";
        // Jobs with a deadline that ended, with when they completed.
        let rows: Vec<(serde_json::Value, String, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT j.spec, j.state,
                    (SELECT max(e.at) FROM job_events e
                     WHERE e.job_id = j.id AND e.to_state = 'completed')
             FROM jobs j
             WHERE j.state IN ('completed', 'failed') AND j.spec ? 'deadline'",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut r = SloReport::default();
        for (spec, state, done) in rows {
            let spec: JobSpec =
                serde_json::from_value(spec).map_err(|e| corrupt(OP, e.to_string()))?;
            let (class, Some(deadline)) = (spec.class(), spec.deadline) else {
                continue;
            };
            if class == fmsched_core::SloClass::BestEffort {
                continue;
            }
            let e = r.finished.entry(class.as_str()).or_default();
            e.0 += 1;
            let met = state == "completed" && done.is_some_and(|t| t <= deadline);
            e.1 += u64::from(!met);
        }
        // Best-effort: no deadline, or one the spec marks best-effort.
        let (n, avg): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), avg(EXTRACT(EPOCH FROM (e.at - j.created_at)))::float8
             FROM jobs j JOIN job_events e ON e.job_id = j.id AND e.to_state = 'completed'
             WHERE j.state = 'completed'
               AND (NOT j.spec ? 'deadline' OR j.spec->>'slo_class' = 'best_effort')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db_err(OP))?;
        r.best_effort_completed = n as u64;
        r.best_effort_avg_jct_s = avg.unwrap_or(0.0);
        r.at_risk = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM job_service s JOIN jobs j ON j.id = s.job_id
             WHERE s.at_risk AND j.state IN ('submitted','profiling','queued','running')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db_err(OP))? as u64;
        Ok(r)
    }
}
