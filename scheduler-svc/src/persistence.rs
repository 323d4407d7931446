//! All database access. This is the only module that imports sqlx: it owns
//! the row types, converts them to domain types, runs each operation as one
//! transaction (or one statement), names it for logs, and retries the
//! transient failures (serialization failure, deadlock) a bounded number of
//! times. SQLSTATE codes are mapped in one place, [`classify`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use fmsched_core::policy::MergeMode;
use fmsched_core::{GpuUuid, JobId, JobSpec, JobState, NodeId, NodeState, UserName};
use fmsched_estimator::icefrog::UtilizationFit;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// Migrations of `migrations/`, embedded at build time.
mod admin;
pub use admin::{
    AdminState, AuditEvent, CordonChange, LoanError, LoanState, NodeCordon, NodeLoan, POOL_LABEL,
    PolicySetting, QueueSetting, Requeue, SetQueuesError,
};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

#[derive(Debug, thiserror::Error)]
pub enum PersistenceError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("job {id} is {from}; it cannot become {to}")]
    InvalidTransition {
        id: JobId,
        from: JobState,
        to: JobState,
    },
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A fenced write whose writer no longer leads, or whose plan moved on
    /// under it: nothing was written.
    #[error("fenced: {0}")]
    Fenced(String),
    #[error("database error in {op}: {source}")]
    Database {
        op: &'static str,
        source: sqlx::Error,
    },
    #[error("corrupt row in {op}: {message}")]
    Corrupt { op: &'static str, message: String },
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// What kind of failure a sqlx error is (the one SQLSTATE mapping).
#[derive(Debug, PartialEq, Eq)]
enum ErrorClass {
    /// Serialization failure or deadlock: the transaction may be retried.
    Retryable,
    UniqueViolation,
    /// Connection refused, pool timed out, server shutting down.
    Unavailable,
    Other,
}

fn classify(e: &sqlx::Error) -> ErrorClass {
    match e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("40001") | Some("40P01") => ErrorClass::Retryable,
            Some("23505") => ErrorClass::UniqueViolation,
            // admin_shutdown, crash_shutdown, cannot_connect_now
            Some("57P01") | Some("57P02") | Some("57P03") => ErrorClass::Unavailable,
            _ => ErrorClass::Other,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_) => ErrorClass::Unavailable,
        _ => ErrorClass::Other,
    }
}

/// Adds the time since the stored plan was stored to the service of the
/// jobs it ran (training, not profiling) and to every live job's deserved
/// share (`service.fair_share_gpus`; a job submitted since then only from
/// when it came), and replaces the leases with `service.leases`. Part of
/// [`Persistence::store_plan`]'s transaction, before the old plan goes.
async fn account_service(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    service: &ServiceUpdate,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    // Seconds the old plan held (none before the first; a clock that
    // went back counts nothing).
    let held_s: f64 = sqlx::query_scalar(
        "SELECT COALESCE(GREATEST(EXTRACT(EPOCH FROM ($1 - stored_at))::float8, 0), 0)
         FROM plan_generation FOR UPDATE",
    )
    .bind(now)
    .fetch_one(&mut **tx)
    .await
    .map_err(db_err(op))?;
    if held_s > 0.0 {
        sqlx::query(
            "INSERT INTO job_service (job_id, attained_gpu_s, executed_s)
             SELECT a.job_id, SUM(cardinality(a.gpu_uuids)) * $1, $1
             FROM assignments a WHERE NOT a.profile GROUP BY a.job_id
             ON CONFLICT (job_id) DO UPDATE SET
               attained_gpu_s = job_service.attained_gpu_s + EXCLUDED.attained_gpu_s,
               executed_s = job_service.executed_s + EXCLUDED.executed_s",
        )
        .bind(held_s)
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
        let (jobs, gpus): (Vec<Uuid>, Vec<f64>) = service
            .fair_share_gpus
            .iter()
            .map(|(j, g)| (j.0, g.max(0.0)))
            .unzip();
        // A job submitted since the old plan deserves only the time
        // since it came.
        sqlx::query(
            "INSERT INTO job_service (job_id, fair_share_gpu_s)
             SELECT u.job_id,
                    u.gpus * LEAST($3, GREATEST(EXTRACT(EPOCH FROM ($4 - j.created_at))::float8, 0))
             FROM UNNEST($1::uuid[], $2::float8[]) AS u(job_id, gpus)
             JOIN jobs j ON j.id = u.job_id
             ON CONFLICT (job_id) DO UPDATE SET
               fair_share_gpu_s = job_service.fair_share_gpu_s + EXCLUDED.fair_share_gpu_s",
        )
        .bind(&jobs)
        .bind(&gpus)
        .bind(held_s)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    if service.carry_over {
        return Ok(());
    }
    let (leased, until): (Vec<Uuid>, Vec<DateTime<Utc>>) =
        service.leases.iter().map(|(j, t)| (j.0, *t)).unzip();
    sqlx::query(
        "UPDATE job_service SET lease_until = NULL
         WHERE lease_until IS NOT NULL AND job_id <> ALL($1::uuid[])",
    )
    .bind(&leased)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    sqlx::query(
        "INSERT INTO job_service (job_id, lease_until)
         SELECT * FROM UNNEST($1::uuid[], $2::timestamptz[])
         ON CONFLICT (job_id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
    )
    .bind(&leased)
    .bind(&until)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    let p = &service.predictions;
    let jobs: Vec<Uuid> = p.iter().map(|x| x.0.0).collect();
    let finish: Vec<Option<DateTime<Utc>>> = p.iter().map(|x| x.1).collect();
    let risk: Vec<bool> = p.iter().map(|x| x.2).collect();
    sqlx::query(
        "UPDATE job_service SET predicted_finish = NULL, at_risk = false
         WHERE (predicted_finish IS NOT NULL OR at_risk) AND job_id <> ALL($1::uuid[])",
    )
    .bind(&jobs)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    sqlx::query(
        "INSERT INTO job_service (job_id, predicted_finish, at_risk)
         SELECT * FROM UNNEST($1::uuid[], $2::timestamptz[], $3::bool[])
         ON CONFLICT (job_id) DO UPDATE
         SET predicted_finish = EXCLUDED.predicted_finish, at_risk = EXCLUDED.at_risk",
    )
    .bind(&jobs)
    .bind(&finish)
    .bind(&risk)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}

/// Moves a job to `to` inside the caller's transaction, with its row lock
/// and a `state_changed` event. The state it is in already: a no-op.
async fn transition_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: JobId,
    to: JobState,
    reason: &str,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<JobRecord, PersistenceError> {
    let row = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 FOR UPDATE"
    ))
    .bind(id.0)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db_err(op))?
    .ok_or_else(|| PersistenceError::NotFound(format!("job {id}")))?;
    let job = job_from_row(&row)?;
    if job.state == to {
        return Ok(job);
    }
    if !job.state.can_transition_to(to) {
        return Err(PersistenceError::InvalidTransition {
            id,
            from: job.state,
            to,
        });
    }
    write_moves(
        tx,
        &[id.0],
        &[job.state.as_str()],
        &[to.as_str()],
        &[reason],
        now,
        op,
    )
    .await?;
    let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
        .bind(id.0)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err(op))?;
    job_from_row(&row)
}

/// The ids once each, ascending (the order a batch locks rows in).
fn distinct(ids: impl Iterator<Item = Uuid>) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = ids.collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Moves jobs to new states inside the caller's transaction, in the order
/// given, with the cost of two statements however many there are: one
/// locking read of their rows (in id order, as every batch locks), then
/// one statement that writes every `state_changed` event and every row.
/// A move to the state the job is in already, a move its state forbids (a
/// job cancelled meanwhile) and an unknown job are skipped. A job moved
/// twice moves through both states, each with its event.
async fn transitions_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    moves: &[(JobId, JobState, &str)],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    if moves.is_empty() {
        return Ok(());
    }
    let ids = distinct(moves.iter().map(|m| m.0.0));
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, state FROM jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await
            .map_err(db_err(op))?;
    let mut state: HashMap<Uuid, JobState> = HashMap::with_capacity(rows.len());
    for (id, s) in rows {
        state.insert(id, s.parse().map_err(|e: String| corrupt(op, e))?);
    }
    let (mut jobs, mut from, mut to, mut reasons) = (vec![], vec![], vec![], vec![]);
    for &(id, target, reason) in moves {
        let Some(current) = state.get_mut(&id.0) else {
            continue;
        };
        if *current == target || !current.can_transition_to(target) {
            continue;
        }
        jobs.push(id.0);
        from.push(current.as_str());
        to.push(target.as_str());
        reasons.push(reason);
        *current = target;
    }
    write_moves(tx, &jobs, &from, &to, &reasons, now, op).await
}

/// Writes checked moves (parallel slices, in order) in one statement: each
/// a `state_changed` event, each job's row at its last move. Sequence
/// numbers are drawn in the order of the moves, so a job's newest event is
/// its last move.
async fn write_moves(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    jobs: &[Uuid],
    from: &[&str],
    to: &[&str],
    reasons: &[&str],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    if jobs.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "WITH t AS MATERIALIZED (
            SELECT j, f, s, r, o, nextval(pg_get_serial_sequence('job_events', 'seq')) AS seq
            FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(j, f, s, r, o)
         ), ev AS (
            INSERT INTO job_events (seq, job_id, at, kind, from_state, to_state, message)
            SELECT seq, j, $5, 'state_changed', f, s, r FROM t
         )
         UPDATE jobs SET state = l.s, state_reason = l.r, updated_at = $5, last_event_seq = l.seq
         FROM (SELECT DISTINCT ON (j) j, s, r, seq FROM t ORDER BY j, o DESC) AS l
         WHERE jobs.id = l.j",
    )
    .bind(jobs)
    .bind(from)
    .bind(to)
    .bind(reasons)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}

/// Appends events that change no state, each unless its job's newest
/// event already says the same (a condition noted every round is noted
/// once): one read of the jobs' newest events, then [`events_in`].
async fn notes_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    notes: &[(JobId, &str, &str)],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    if notes.is_empty() {
        return Ok(());
    }
    let ids = distinct(notes.iter().map(|n| n.0.0));
    // `last_event_seq` is the seq of the job's newest event: every writer
    // of an event sets it in the same statement or transaction.
    let newest: Vec<(Uuid, String, String)> = sqlx::query_as(
        "SELECT e.job_id, e.kind, e.message FROM jobs j JOIN job_events e ON e.seq = j.last_event_seq
         WHERE j.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut **tx)
    .await
    .map_err(db_err(op))?;
    let mut last: HashMap<Uuid, (&str, &str)> = newest
        .iter()
        .map(|(j, k, m)| (*j, (k.as_str(), m.as_str())))
        .collect();
    let mut fresh = Vec::new();
    for &(job, kind, message) in notes {
        if last.get(&job.0) != Some(&(kind, message)) {
            last.insert(job.0, (kind, message));
            fresh.push((job, kind, message));
        }
    }
    events_in(tx, &fresh, now, op).await
}

/// Appends events that change no state (inside the caller's transaction)
/// in one statement, in the order given, advancing each job's event
/// sequence (`jobs.last_event_seq` is the seq of its newest event).
async fn events_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    events: &[(JobId, &str, &str)],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    if events.is_empty() {
        return Ok(());
    }
    let jobs: Vec<Uuid> = events.iter().map(|e| e.0.0).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.1).collect();
    let messages: Vec<&str> = events.iter().map(|e| e.2).collect();
    sqlx::query(
        "WITH t AS MATERIALIZED (
            SELECT j, k, m, nextval(pg_get_serial_sequence('job_events', 'seq')) AS seq
            FROM UNNEST($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS u(j, k, m, o)
         ), ev AS (
            INSERT INTO job_events (seq, job_id, at, kind, message) SELECT seq, j, $4, k, m FROM t
         )
         UPDATE jobs SET last_event_seq = l.seq
         FROM (SELECT j, max(seq) AS seq FROM t GROUP BY j) AS l WHERE jobs.id = l.j",
    )
    .bind(&jobs)
    .bind(&kinds)
    .bind(&messages)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}

/// A Postgres `float8[]` literal of `v` that reads back exactly: Rust's
/// shortest round-trip form, and Postgres' names of NaN and the infinities.
fn float8_array_literal(v: &[f64]) -> String {
    let one = |x: &f64| {
        if x.is_nan() {
            "NaN".to_string()
        } else if x.is_infinite() {
            if *x > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
        } else {
            format!("{x:?}")
        }
    };
    format!("{{{}}}", v.iter().map(one).collect::<Vec<_>>().join(","))
}

/// The observed part of a round (see [`Persistence::commit_round`]), in the
/// order it happened: progress and checkpoints, estimates learned, failed
/// processes counted, completions, the merge guard's verdicts and the
/// merge outcomes sent to the estimator.
async fn write_observations(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    w: &RoundWrites,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    let jobs: Vec<Uuid> = w.progress.iter().map(|p| p.0.0).collect();
    let iterations: Vec<i64> = w
        .progress
        .iter()
        .map(|p| p.1.min(i64::MAX as u64) as i64)
        .collect();
    let checkpoints: Vec<Option<&str>> = w.progress.iter().map(|p| p.2.as_deref()).collect();
    sqlx::query(
        "INSERT INTO job_progress (job_id, iteration, checkpoint_path, updated_at)
         SELECT j, i, c, $4 FROM UNNEST($1::uuid[], $2::bigint[], $3::text[]) AS t(j, i, c)
         ON CONFLICT (job_id) DO UPDATE SET iteration = GREATEST(job_progress.iteration, EXCLUDED.iteration),
           checkpoint_path = COALESCE(EXCLUDED.checkpoint_path, job_progress.checkpoint_path),
           updated_at = EXCLUDED.updated_at",
    )
    .bind(&jobs)
    .bind(&iterations)
    .bind(&checkpoints)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    if !w.fresh_seen.is_empty() {
        let seen: Vec<Uuid> = w.fresh_seen.iter().map(|j| j.0).collect();
        sqlx::query("UPDATE job_progress SET fresh_pending = FALSE WHERE job_id = ANY($1)")
            .bind(&seen)
            .execute(&mut **tx)
            .await
            .map_err(db_err(op))?;
    }
    if !w.estimates.is_empty() {
        // One statement for all of them. Postgres has no ragged arrays: each
        // vector goes as an array literal (text) and each curve as JSON text.
        let e = &w.estimates;
        let jobs: Vec<Uuid> = e.iter().map(|(j, _)| j.0).collect();
        let iterations: Vec<Option<i64>> = e
            .iter()
            .map(|(_, e)| e.iterations.map(|i| i.min(i64::MAX as u64) as i64))
            .collect();
        let curves: Vec<Option<String>> = e
            .iter()
            .map(|(_, e)| e.curve.as_ref().map(|c| c.to_string()))
            .collect();
        let literals = |v: fn(&Estimate) -> &[f64]| -> Vec<String> {
            e.iter().map(|(_, e)| float8_array_literal(v(e))).collect()
        };
        let fisher = literals(|e| &e.fisher);
        let repeat = literals(|e| &e.fisher_repeat);
        let evals = literals(|e| &e.evals);
        let steps: Vec<Option<f64>> = e.iter().map(|(_, e)| e.step_time_s).collect();
        let notes: Vec<&str> = e.iter().map(|(_, e)| e.note.as_str()).collect();
        let spreads: Vec<f64> = e.iter().map(|(_, e)| e.spread).collect();
        // A job estimated twice in one round: its last estimate (one row
        // may not be upserted twice in one statement).
        sqlx::query(
            "INSERT INTO job_estimates (job_id, iterations, curve, fisher, fisher_repeat, step_time_s, note,
                                        estimated_at, evals, spread)
             SELECT DISTINCT ON (j) j, i, c::jsonb, f::float8[], r::float8[], s, n, $10, v::float8[], p
             FROM UNNEST($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::float8[],
                         $7::text[], $8::text[], $9::float8[]) WITH ORDINALITY AS t(j, i, c, f, r, s, n, v, p, o)
             ORDER BY j, o DESC
             ON CONFLICT (job_id) DO UPDATE SET iterations = EXCLUDED.iterations, curve = EXCLUDED.curve,
               fisher = EXCLUDED.fisher, fisher_repeat = EXCLUDED.fisher_repeat, step_time_s = EXCLUDED.step_time_s,
               note = EXCLUDED.note, estimated_at = EXCLUDED.estimated_at, evals = EXCLUDED.evals,
               spread = EXCLUDED.spread",
        )
        .bind(&jobs)
        .bind(&iterations)
        .bind(&curves)
        .bind(&fisher)
        .bind(&repeat)
        .bind(&steps)
        .bind(&notes)
        .bind(&evals)
        .bind(&spreads)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    for f in &w.failures {
        sqlx::query(
            "INSERT INTO job_progress (job_id, iteration, updated_at, retries, last_failed_pid, retry_after,
                                       last_failed_generation)
             VALUES ($1, 0, $2, $3, $4, $5, $6)
             ON CONFLICT (job_id) DO UPDATE SET retries = EXCLUDED.retries,
               last_failed_pid = EXCLUDED.last_failed_pid, retry_after = EXCLUDED.retry_after,
               last_failed_generation = EXCLUDED.last_failed_generation,
               updated_at = EXCLUDED.updated_at",
        )
        .bind(f.job.0)
        .bind(now)
        .bind(f.retries.min(i32::MAX as u32) as i32)
        .bind(i64::from(f.pid))
        .bind(f.retry_after)
        .bind(f.generation)
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    if !w.completions.is_empty() {
        let jobs: Vec<Uuid> = w.completions.iter().map(|c| c.0.0).collect();
        let outputs: Vec<&str> = w.completions.iter().map(|c| c.1.as_str()).collect();
        sqlx::query(
            "UPDATE jobs SET output_path = t.o FROM UNNEST($1::uuid[], $2::text[]) AS t(j, o)
             WHERE jobs.id = t.j",
        )
        .bind(&jobs)
        .bind(&outputs)
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
        let reasons: Vec<String> = w
            .completions
            .iter()
            .map(|(_, output)| format!("target reached; weights at {output}"))
            .collect();
        let moves: Vec<(JobId, JobState, &str)> = w
            .completions
            .iter()
            .zip(&reasons)
            .map(|((job, _), reason)| (*job, JobState::Completed, reason.as_str()))
            .collect();
        transitions_in(tx, &moves, now, op).await?;
    }
    for (m, split) in &w.guard {
        guard_in(tx, m, split.as_deref(), now, op).await?;
    }
    for (m, reason) in &w.released {
        split_in(tx, m, reason, "the round", now, op).await?;
    }
    for (merge, gain) in &w.observed_gains {
        sqlx::query("UPDATE merges SET observed_gain = $2 WHERE id = $1")
            .bind(merge)
            .bind(gain)
            .execute(&mut **tx)
            .await
            .map_err(db_err(op))?;
    }
    Ok(())
}

/// The merge guard's verdict (Ymir §4.3): `split` with the reason, or
/// passed. Both jobs get an event; a split merge never re-forms.
async fn guard_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    m: &MergeRecord,
    split: Option<&str>,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    if let Some(reason) = split {
        return split_in(tx, m, reason, "the guard", now, op).await;
    }
    let changed =
        sqlx::query("UPDATE merges SET guard_passed = TRUE WHERE id = $1 AND NOT guard_passed")
            .bind(m.id)
            .execute(&mut **tx)
            .await
            .map_err(db_err(op))?
            .rows_affected();
    if changed > 0 {
        let msg = format!(
            "merge {}: accuracy improved in the first two epochs; kept",
            m.id
        );
        let kind = "merge_guard_passed";
        events_in(tx, &[(m.a, kind, &msg), (m.b, kind, &msg)], now, op).await?;
    }
    Ok(())
}

/// Splits an active merge, `by` whom and why, with an event on both jobs;
/// a split merge never re-forms.
async fn split_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    m: &MergeRecord,
    reason: &str,
    by: &str,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    let changed = sqlx::query(
        "UPDATE merges SET state = 'split', reason = $2, split_at = $3
         WHERE id = $1 AND state = 'active'",
    )
    .bind(m.id)
    .bind(reason)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?
    .rows_affected();
    if changed > 0 {
        let msg = format!("merge {} split by {by}: {reason}", m.id);
        let kind = "merge_split";
        events_in(tx, &[(m.a, kind, &msg), (m.b, kind, &msg)], now, op).await?;
    }
    Ok(())
}

/// Records the merges a round decided, each with an event on both jobs.
async fn write_merges(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    merges: &[NewMerge],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    if merges.is_empty() {
        return Ok(());
    }
    let a: Vec<Uuid> = merges.iter().map(|m| m.a.0).collect();
    let b: Vec<Uuid> = merges.iter().map(|m| m.b.0).collect();
    let modes: Vec<&str> = merges.iter().map(|m| m.mode.as_str()).collect();
    let gain_ab: Vec<f64> = merges.iter().map(|m| m.gain_ab).collect();
    let gain_ba: Vec<f64> = merges.iter().map(|m| m.gain_ba).collect();
    let warm: Vec<bool> = merges.iter().map(|m| m.warm).collect();
    sqlx::query(
        "INSERT INTO merges (job_a, job_b, mode, gain_ab, gain_ba, warm, decided_at)
         SELECT a, b, m, x, y, w, $7
         FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::float8[], $6::bool[])
              AS t(a, b, m, x, y, w)",
    )
    .bind(&a)
    .bind(&b)
    .bind(&modes)
    .bind(&gain_ab)
    .bind(&gain_ba)
    .bind(&warm)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    // Each job by its name and its ID (an ID alone says nothing in a
    // job's history).
    let ids: Vec<Uuid> = a.iter().chain(&b).copied().collect();
    let names: BTreeMap<Uuid, String> =
        sqlx::query_as::<_, (Uuid, String)>("SELECT id, name FROM jobs WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await
            .map_err(db_err(op))?
            .into_iter()
            .collect();
    let named = |j: JobId| {
        names
            .get(&j.0)
            .map_or_else(|| j.to_string(), |n| format!("{n} ({j})"))
    };
    let what: Vec<String> = merges
        .iter()
        .map(|m| match m.mode {
            MergeMode::Temporal if m.warm => format!(
                "warm start: {} starts from the output weights of {}, which completed (temporal transfer; predicted gain {:+.3})",
                named(m.b),
                named(m.a),
                m.gain_ab
            ),
            MergeMode::Temporal => format!(
                "merged temporally: {} ↦ {} (B starts from A's output; predicted gain {:+.3})",
                named(m.a),
                named(m.b),
                m.gain_ab
            ),
            _ => format!(
                "merged spatially: {} ‖ {} (one joint process; predicted gains {:+.3} / {:+.3})",
                named(m.a),
                named(m.b),
                m.gain_ab,
                m.gain_ba
            ),
        })
        .collect();
    let events: Vec<(JobId, &str, &str)> = merges
        .iter()
        .zip(&what)
        .flat_map(|(m, what)| {
            [
                (m.a, "merged", what.as_str()),
                (m.b, "merged", what.as_str()),
            ]
        })
        .collect();
    events_in(tx, &events, now, op).await
}

/// Appends to a node's history (nothing when the node is not registered).
async fn node_event_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    node: &NodeId,
    kind: &str,
    message: &str,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    sqlx::query(
        "INSERT INTO node_events (node_id, at, kind, message)
         SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM nodes WHERE id = $1)",
    )
    .bind(node.as_str())
    .bind(now)
    .bind(kind)
    .bind(message)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}

fn db_err(op: &'static str) -> impl FnOnce(sqlx::Error) -> PersistenceError {
    move |e| match classify(&e) {
        ErrorClass::Unavailable => PersistenceError::Unavailable(format!("{op}: {e}")),
        _ => PersistenceError::Database { op, source: e },
    }
}

fn corrupt(op: &'static str, message: impl Into<String>) -> PersistenceError {
    PersistenceError::Corrupt {
        op,
        message: message.into(),
    }
}

const MAX_ATTEMPTS: u32 = 5;

/// Runs `f` and retries it when the database says the transaction may be
/// retried. Each attempt must be a whole transaction.
async fn with_retries<T, F, Fut>(op: &'static str, mut f: F) -> Result<T, PersistenceError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PersistenceError>>,
{
    let mut attempt = 1;
    loop {
        match f().await {
            Err(PersistenceError::Database { source, .. })
                if attempt < MAX_ATTEMPTS && classify(&source) == ErrorClass::Retryable =>
            {
                tracing::debug!(op, attempt, error = %source, "retrying transaction");
                tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// One job's GPUs on one node in the plan (a job over several nodes has
/// one per node).
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub job: JobId,
    pub node: NodeId,
    pub gpus: Vec<GpuUuid>,
    /// A profiling run (not the training run).
    pub profile: bool,
    /// Global rank of this part's first GPU (0 on the node of rank 0).
    pub rank_offset: u32,
    /// A job over several nodes: the rendezvous port of its rank 0.
    pub master_port: Option<u16>,
}

/// What a profiling run taught about a job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Iterations to converge (Ymir Eq. 2), None without a usable fit.
    pub iterations: Option<u64>,
    pub curve: Option<serde_json::Value>,
    pub fisher: Vec<f64>,
    pub fisher_repeat: Vec<f64>,
    pub step_time_s: Option<f64>,
    pub note: String,
    /// Its target metric per epoch so far (`evals[e − 1]` at epoch `e`),
    /// kept across restarts; empty for a job without a metric target.
    pub evals: Vec<f64>,
    /// Relative spread of the prediction: from `evals` for a metric target
    /// that has evaluated (p90 − p10 epochs over the epochs left), else
    /// from the loss prior once finished jobs of the model inform it (p90 −
    /// p10 iterations over the iterations left); 0 = sure or none.
    pub spread: f64,
}

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

/// A merge decided by the task merger (Ymir §5), kept until the merge guard
/// splits it.
#[derive(Clone, Debug, PartialEq)]
pub struct MergeRecord {
    pub id: i64,
    pub a: JobId,
    pub b: JobId,
    pub mode: MergeMode,
    /// Predicted `G_{A,B}` and `G_{B,A}` when decided.
    pub gain_ab: f64,
    pub gain_ba: f64,
    /// False once split by the guard.
    pub active: bool,
    pub guard_passed: bool,
    /// The transfer gain it showed, once measured (and sent to the
    /// estimator's regression): B of a temporal merge on its own training
    /// from A's weights, a spatial pair's mean at its guard, 0 for a
    /// temporal guard split.
    pub observed_gain: Option<f64>,
}

/// A merge to record with a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct NewMerge {
    pub a: JobId,
    pub b: JobId,
    pub mode: MergeMode,
    pub gain_ab: f64,
    pub gain_ba: f64,
    /// A warm start: A had completed when it was decided (a temporal
    /// merge; a finished job may be the A of many).
    pub warm: bool,
}

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

/// What the last round predicted of a live job, and its lease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobSchedule {
    pub predicted_finish: Option<DateTime<Utc>>,
    pub at_risk: bool,
    pub lease_until: Option<DateTime<Utc>>,
}

/// What a stored plan records about service besides the assignments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceUpdate {
    /// GPUs each live job deserves per second until the next plan (an equal
    /// share of the cluster, at most its request).
    pub fair_share_gpus: Vec<(JobId, f64)>,
    /// The leases of the new plan; every other job's lease ends.
    pub leases: Vec<(JobId, DateTime<Utc>)>,
    /// The round's predictions (`core::round::predictions`): finish time
    /// and deadline risk; every other job's are cleared.
    pub predictions: Vec<(JobId, Option<DateTime<Utc>>, bool)>,
    /// A prompt-lane commit (no policy decided): leases and predictions
    /// stay as the last round set them; `fair_share_gpus` are that
    /// round's.
    pub carry_over: bool,
}

/// A failed training process, counted once (by its pid): the job's new
/// retry count and when it may run again.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub job: JobId,
    pub pid: u32,
    /// The plan generation from which on a failure report counts again
    /// (the one this round commits).
    pub generation: i64,
    pub retries: u32,
    pub retry_after: DateTime<Utc>,
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

/// Everything one round writes, committed by [`Persistence::commit_round`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundWrites {
    /// (job, iterations done, newest checkpoint).
    pub progress: Vec<(JobId, u64, Option<String>)>,
    pub estimates: Vec<(JobId, Estimate)>,
    pub failures: Vec<Failure>,
    /// (job, output weights).
    pub completions: Vec<(JobId, String)>,
    /// Merge guard verdicts: split (with the reason) or passed.
    pub guard: Vec<(MergeRecord, Option<String>)>,
    /// Kept temporal merges the round splits (`RoundOutcome::released`),
    /// with the reason.
    pub released: Vec<(MergeRecord, String)>,
    /// (merge id, observed gain) sent to the estimator's regression.
    pub observed_gains: Vec<(i64, f64)>,
    pub new_merges: Vec<NewMerge>,
    /// State changes in order (the observed ones first, then the plan's).
    pub transitions: Vec<(JobId, JobState, String)>,
    /// Events that change no state: (job, kind, message), each written
    /// unless the job's newest event says the same.
    pub notes: Vec<(JobId, String, String)>,
    /// The new plan (training and profiling).
    pub assignments: Vec<Assignment>,
    pub service: ServiceUpdate,
    /// Admin re-queue requests this round acted on (job, requested at):
    /// deleted, unless renewed since.
    pub requeued: Vec<(JobId, DateTime<Utc>)>,
    /// Reclaimed nodes found empty (nothing planned, no process): their
    /// loans end.
    pub returned: Vec<NodeId>,
    /// Jobs taken off a shared GPU that ran saturated: they never share a
    /// GPU again (ICEFROG Eq. 8's rule measured).
    pub no_sharing: Vec<JobId>,
    /// Utilisation fits this round's measurements changed, by (model, GPU
    /// family): written whole.
    pub utilization_fits: Vec<((String, String), UtilizationFit)>,
    /// Tuned prompts of prompt-tuning jobs that completed, filed in their
    /// model's Prompt Bank.
    pub bank_adds: Vec<BankPrompt>,
    /// Prompts evicted from the Prompt Bank (past its cap; possibly one of
    /// `bank_adds`).
    pub bank_evictions: Vec<JobId>,
    /// Events written once per job: (job, kind, message), skipped when the
    /// job has an event of that kind already.
    pub first_notes: Vec<(JobId, String, String)>,
    /// Jobs restarted from their initial weights (a transfer from a
    /// completed job's weights measured to hurt): their progress and
    /// checkpoint reset, fenced by this commit's plan generation
    /// ([`Persistence::fresh_starts`]).
    pub fresh_starts: Vec<JobId>,
    /// Fresh starts whose fresh process the nodes reported: the plan stops
    /// asking for it.
    pub fresh_seen: Vec<JobId>,
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

/// One tuned prompt in the Prompt Bank (table `prompt_bank`).
#[derive(Clone, Debug, PartialEq)]
pub struct BankPrompt {
    /// The prompt-tuning job that tuned it.
    pub job: JobId,
    pub model: String,
    /// Its prompt file (the job's output).
    pub location: String,
    /// Its activation features (PromptTuner §4.4.3.1).
    pub features: Vec<f64>,
}

/// Proof of leadership that a leader-only write carries: the lease's holder
/// and epoch. Such a write checks, in its own transaction and under a lock
/// of the lease row, that the lease is still this holder's with this epoch
/// and has not expired by the database's clock ([`check_fence`]); a takeover
/// waits for that transaction, so a write is either before it or refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub holder: Arc<str>,
    pub epoch: i64,
}

/// Refuses the transaction unless `fence` still holds the leader lease.
async fn check_fence(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    fence: &Fence,
    op: &'static str,
) -> Result<(), PersistenceError> {
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT epoch FROM leader_lease
         WHERE holder = $1 AND epoch = $2 AND expires_at > clock_timestamp() FOR SHARE",
    )
    .bind(&*fence.holder)
    .bind(fence.epoch)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db_err(op))?;
    match held {
        Some(_) => Ok(()),
        None => Err(PersistenceError::Fenced(format!(
            "{op}: this replica no longer holds the leader lease of epoch {}",
            fence.epoch
        ))),
    }
}

/// Leadership among scheduler replicas: a lease in Postgres with an expiry
/// the leader renews, taken over by a standby once it lapses, and an epoch
/// that grows with every new term (table `leader_lease`). The database's
/// clock decides expiry. This process also keeps a deadline on its own
/// monotonic clock, taken *before* each renewal is sent, so it stops acting
/// as the leader no later than the database stops believing it is — a
/// process frozen past its lease (SIGSTOP, a long GC-like stall, a VM
/// pause) finds its deadline passed the moment it runs again.
pub struct LeaderLease {
    pool: PgPool,
    holder: Arc<str>,
    ttl: Duration,
    /// (epoch, local deadline) while this process holds the lease.
    held: std::sync::Mutex<Option<(i64, std::time::Instant)>>,
}

impl LeaderLease {
    /// `holder` names this replica (unique among the replicas; a restarted
    /// process of the same replica takes its lease over); `ttl` is how long
    /// a renewal lasts.
    pub fn new(p: &Persistence, holder: String, ttl: Duration) -> Self {
        Self {
            pool: p.pool.clone(),
            holder: holder.into(),
            ttl,
            held: std::sync::Mutex::new(None),
        }
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    fn held(&self) -> Option<(i64, std::time::Instant)> {
        *self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_held(&self, v: Option<(i64, std::time::Instant)>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }

    /// Renews the lease this process holds, or takes it when it lapsed or
    /// when this process, new, finds it held under its replica's name by an
    /// earlier process (a replica restarted after a crash leads again at
    /// once instead of waiting for its old lease; a process that held a term
    /// and lost it never takes it back this way). Taking it starts a new term: the epoch grows, also for
    /// this process when its own lease lapsed before it renewed, so nothing
    /// an earlier term started can commit. Returns the epoch while this
    /// process leads, None while another does. A database error keeps the
    /// local deadline: leadership then ends when it passes.
    pub async fn refresh(&self) -> Result<Option<i64>, PersistenceError> {
        let mine = self.held().map_or(-1, |(e, _)| e);
        let sent = std::time::Instant::now();
        let got: Option<i64> = sqlx::query_scalar(
            "UPDATE leader_lease SET
                epoch = CASE WHEN holder = $1 AND epoch = $2 AND expires_at > clock_timestamp()
                             THEN epoch ELSE epoch + 1 END,
                holder = $1,
                expires_at = clock_timestamp() + make_interval(secs => $3)
             WHERE (holder = $1 AND epoch = $2 AND expires_at > clock_timestamp())
                OR expires_at <= clock_timestamp()
                OR (holder = $1 AND $2 = -1)
             RETURNING epoch",
        )
        .bind(&*self.holder)
        .bind(mine)
        .bind(self.ttl.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
        .map_err(db_err("leader_lease"))?;
        self.set_held(got.map(|e| (e, sent + self.ttl)));
        Ok(got)
    }

    /// The fence of this process's term, while its deadline has not passed.
    pub fn fence(&self) -> Option<Fence> {
        let (epoch, deadline) = self.held()?;
        (std::time::Instant::now() < deadline).then(|| Fence {
            holder: self.holder.clone(),
            epoch,
        })
    }

    /// Gives the lease up at once (a graceful shutdown), so a standby takes
    /// over without waiting for it to expire.
    pub async fn resign(&self) {
        let Some((epoch, _)) = self.held() else {
            return;
        };
        self.set_held(None);
        let _ = sqlx::query(
            "UPDATE leader_lease SET expires_at = clock_timestamp() WHERE holder = $1 AND epoch = $2",
        )
        .bind(&*self.holder)
        .bind(epoch)
        .execute(&self.pool)
        .await;
    }
}

/// A job as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub id: JobId,
    pub owner: UserName,
    pub spec: JobSpec,
    pub idempotency_key: Option<String>,
    pub state: JobState,
    pub state_reason: String,
    pub output_path: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_event_seq: i64,
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

#[derive(Clone, Debug, PartialEq)]
pub struct GpuRecord {
    pub uuid: GpuUuid,
    pub index: u32,
    pub model: String,
    pub memory_total_bytes: u64,
    pub pci_bus_id: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub hostname: String,
    /// Where its peers reach it ('' = the hostname): the `MASTER_ADDR` of a
    /// gang whose rank 0 runs there.
    pub address: String,
    pub agent_version: String,
    pub gpu_backend: String,
    pub labels: BTreeMap<String, String>,
    pub state: NodeState,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
    pub gpus: Vec<GpuRecord>,
}

/// Owns the connection pool. Cloning is cheap (the pool is shared).
#[derive(Clone, Debug)]
pub struct Persistence {
    pool: PgPool,
}

const JOB_COLUMNS: &str = "id, owner, spec, idempotency_key, state, state_reason, output_path, \
                           created_at, updated_at, last_event_seq";

fn job_from_row(row: &sqlx::postgres::PgRow) -> Result<JobRecord, PersistenceError> {
    const OP: &str = "decode job";
    let get = |e: sqlx::Error| corrupt(OP, e.to_string());
    let spec: serde_json::Value = row.try_get("spec").map_err(get)?;
    let state: String = row.try_get("state").map_err(get)?;
    Ok(JobRecord {
        id: JobId(row.try_get("id").map_err(get)?),
        owner: UserName(row.try_get("owner").map_err(get)?),
        spec: serde_json::from_value(spec).map_err(|e| corrupt(OP, format!("spec: {e}")))?,
        idempotency_key: row.try_get("idempotency_key").map_err(get)?,
        state: state.parse().map_err(|e: String| corrupt(OP, e))?,
        state_reason: row.try_get("state_reason").map_err(get)?,
        output_path: row.try_get("output_path").map_err(get)?,
        created_at: row.try_get("created_at").map_err(get)?,
        updated_at: row.try_get("updated_at").map_err(get)?,
        last_event_seq: row.try_get("last_event_seq").map_err(get)?,
    })
}

fn opt_state(op: &'static str, s: Option<String>) -> Result<Option<JobState>, PersistenceError> {
    s.map(|s| s.parse().map_err(|e: String| corrupt(op, e)))
        .transpose()
}

impl Persistence {
    /// Connects (failing fast if Postgres is unreachable) and returns the
    /// handle. A session left idle inside a transaction for `stuck_after`
    /// is ended by Postgres: a leader frozen mid-commit must not hold the
    /// lease row's lock (and with it every takeover) past its lease.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        stuck_after: Duration,
    ) -> Result<Self, PersistenceError> {
        let opts: PgConnectOptions = url.parse().map_err(db_err("parse database url"))?;
        let stuck_ms = stuck_after
            .as_millis()
            .clamp(1, i32::MAX as u128)
            .to_string();
        let opts = opts
            .application_name("fmsched-scheduler")
            .options([("idle_in_transaction_session_timeout", stuck_ms.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(opts)
            .await
            .map_err(db_err("connect"))?;
        Ok(Self { pool })
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Applies pending migrations (idempotent; safe with several replicas —
    /// sqlx takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), PersistenceError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Cheap liveness probe of the database.
    pub async fn ping(&self) -> Result<(), PersistenceError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(db_err("ping"))?;
        Ok(())
    }

    // ---- jobs --------------------------------------------------------------

    /// Inserts a job and its `submitted` event in one statement (one round
    /// trip, one commit). With an idempotency key already used by this owner
    /// it returns the existing job instead; the caller compares specs.
    pub async fn submit_job(&self, new: NewJob<'_>) -> Result<SubmitOutcome, PersistenceError> {
        const OP: &str = "submit_job";
        let spec = serde_json::to_value(new.spec).map_err(|e| corrupt(OP, e.to_string()))?;
        // The event's sequence number is drawn in the jobs insert so both rows
        // agree without a second statement.
        let row = sqlx::query(
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

        if let Some(row) = row {
            let seq: i64 = row.try_get(0).map_err(|e| corrupt(OP, e.to_string()))?;
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

    /// What the retry rule needs of every live job that failed before.
    pub async fn retry_state(&self) -> Result<BTreeMap<JobId, RetryState>, PersistenceError> {
        const OP: &str = "retry_state";
        let rows = sqlx::query(
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
            let get = |e: sqlx::Error| corrupt(OP, e.to_string());
            let pid: Option<i64> = r.try_get("last_failed_pid").map_err(get)?;
            out.insert(
                JobId(r.try_get("job_id").map_err(get)?),
                RetryState {
                    retries: r.try_get::<i32, _>("retries").map_err(get)?.max(0) as u32,
                    last_failed_pid: pid.map(|p| p.clamp(0, i64::from(u32::MAX)) as u32),
                    retry_after: r.try_get("retry_after").map_err(get)?,
                    last_failed_generation: r.try_get("last_failed_generation").map_err(get)?,
                },
            );
        }
        Ok(out)
    }

    /// Commits a whole round in one transaction: what it observed (progress,
    /// estimates, failures, completions, guard verdicts, merge outcomes),
    /// then its plan (new merges, state changes, notes, service accounting,
    /// the assignments under a new generation). It succeeds only while
    /// `fence` holds the leader lease and the plan is still the one of
    /// generation `read_generation` the round read; otherwise nothing is
    /// written and [`PersistenceError::Fenced`] says why. Returns the new
    /// generation.
    ///
    /// State changes that a concurrent request made impossible (a job
    /// cancelled meanwhile) are skipped, not failures: the job's own
    /// history has the cancellation.
    pub async fn commit_round(
        &self,
        fence: &Fence,
        read_generation: i64,
        w: &RoundWrites,
        now: DateTime<Utc>,
    ) -> Result<i64, PersistenceError> {
        const OP: &str = "commit_round";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            check_fence(&mut tx, fence, OP).await?;
            let generation: i64 =
                sqlx::query_scalar("SELECT generation FROM plan_generation FOR UPDATE")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
            if generation != read_generation {
                return Err(PersistenceError::Fenced(format!(
                    "{OP}: the plan moved on under this round (generation {generation}, the round read {read_generation})"
                )));
            }
            write_observations(&mut tx, w, now, OP).await?;
            write_merges(&mut tx, &w.new_merges, now, OP).await?;
            let moves: Vec<(JobId, JobState, &str)> = w
                .transitions
                .iter()
                .map(|(job, to, reason)| (*job, *to, reason.as_str()))
                .collect();
            transitions_in(&mut tx, &moves, now, OP).await?;
            let notes: Vec<(JobId, &str, &str)> = w
                .notes
                .iter()
                .map(|(job, kind, message)| (*job, kind.as_str(), message.as_str()))
                .collect();
            notes_in(&mut tx, &notes, now, OP).await?;
            account_service(&mut tx, &w.service, now, OP).await?;
            for ((model, family), f) in &w.utilization_fits {
                sqlx::query(
                    "INSERT INTO utilization_fits (model, gpu_family, sum_xy, sum_xx, samples, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (model, gpu_family) DO UPDATE SET sum_xy = $3, sum_xx = $4,
                        samples = $5, updated_at = $6",
                )
                .bind(model)
                .bind(family)
                .bind(f.sum_xy)
                .bind(f.sum_xx)
                .bind(i64::try_from(f.samples).unwrap_or(i64::MAX))
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            }
            if !w.first_notes.is_empty() {
                // One read for all of them: which (job, kind) have an event.
                let (jobs, kinds): (Vec<Uuid>, Vec<String>) =
                    w.first_notes.iter().map(|(j, k, _)| (j.0, k.clone())).unzip();
                let seen: Vec<(Uuid, String)> = sqlx::query_as(
                    "SELECT DISTINCT e.job_id, e.kind FROM job_events e
                     JOIN UNNEST($1::uuid[], $2::text[]) AS n(job_id, kind)
                       ON e.job_id = n.job_id AND e.kind = n.kind",
                )
                .bind(&jobs)
                .bind(&kinds)
                .fetch_all(&mut *tx)
                .await
                .map_err(db_err(OP))?;
                let seen: BTreeSet<(Uuid, &str)> =
                    seen.iter().map(|(j, k)| (*j, k.as_str())).collect();
                let mut written: BTreeSet<(Uuid, &str)> = BTreeSet::new();
                let fresh: Vec<(JobId, &str, &str)> = w
                    .first_notes
                    .iter()
                    .filter(|(job, kind, _)| {
                        let key = (job.0, kind.as_str());
                        !seen.contains(&key) && written.insert(key)
                    })
                    .map(|(job, kind, message)| (*job, kind.as_str(), message.as_str()))
                    .collect();
                events_in(&mut tx, &fresh, now, OP).await?;
            }
            for b in &w.bank_adds {
                sqlx::query(
                    "INSERT INTO prompt_bank (job_id, model, location, features, added_at)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id) DO NOTHING",
                )
                .bind(b.job.0)
                .bind(&b.model)
                .bind(&b.location)
                .bind(&b.features)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            }
            if !w.bank_evictions.is_empty() {
                let ids: Vec<uuid::Uuid> = w.bank_evictions.iter().map(|j| j.0).collect();
                sqlx::query("DELETE FROM prompt_bank WHERE job_id = ANY($1)")
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
            }
            if !w.no_sharing.is_empty() {
                let ids: Vec<uuid::Uuid> = w.no_sharing.iter().map(|j| j.0).collect();
                sqlx::query("UPDATE jobs SET no_gpu_sharing = true WHERE id = ANY($1)")
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
            }
            for n in &w.returned {
                let done = sqlx::query(
                    "UPDATE node_loans SET state = 'returned', returned_at = $2
                     WHERE node_id = $1 AND state = 'reclaiming'",
                )
                .bind(n.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?
                .rows_affected();
                if done > 0 {
                    node_event_in(&mut tx, n, "returned", "reclaim done: no worker left; back with inference", now, OP)
                        .await?;
                }
            }
            if !w.requeued.is_empty() {
                let jobs: Vec<Uuid> = w.requeued.iter().map(|r| r.0.0).collect();
                let at: Vec<DateTime<Utc>> = w.requeued.iter().map(|r| r.1).collect();
                sqlx::query(
                    "DELETE FROM job_requeues q USING UNNEST($1::uuid[], $2::timestamptz[]) AS t(j, a)
                     WHERE q.job_id = t.j AND q.requested_at = t.a",
                )
                .bind(&jobs)
                .bind(&at)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            }
            let generation: i64 = sqlx::query_scalar(
                "UPDATE plan_generation SET generation = generation + 1, stored_at = $1, epoch = $2
                 RETURNING generation",
            )
            .bind(now)
            .bind(fence.epoch)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            if !w.fresh_starts.is_empty() {
                // After this round's progress reports (written above): the
                // dropped run's last iteration and checkpoint go with it.
                let fresh: Vec<Uuid> = w.fresh_starts.iter().map(|j| j.0).collect();
                sqlx::query(
                    "INSERT INTO job_progress (job_id, iteration, checkpoint_path, updated_at,
                                               fresh_generation, fresh_pending)
                     SELECT j, 0, NULL, $2, $3, TRUE FROM UNNEST($1::uuid[]) AS t(j)
                     ON CONFLICT (job_id) DO UPDATE SET iteration = 0, checkpoint_path = NULL,
                       updated_at = $2, fresh_generation = $3, fresh_pending = TRUE",
                )
                .bind(&fresh)
                .bind(now)
                .bind(generation)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            }
            sqlx::query("DELETE FROM assignments")
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            let a = &w.assignments;
            let jobs: Vec<Uuid> = a.iter().map(|a| a.job.0).collect();
            let nodes: Vec<&str> = a.iter().map(|a| a.node.as_str()).collect();
            // One text per assignment: Postgres has no ragged arrays.
            let gpus: Vec<String> = a
                .iter()
                .map(|a| a.gpus.iter().map(|g| g.0.as_str()).collect::<Vec<_>>().join("\n"))
                .collect();
            let profile: Vec<bool> = a.iter().map(|a| a.profile).collect();
            let ranks: Vec<i32> = a.iter().map(|a| a.rank_offset as i32).collect();
            let ports: Vec<Option<i32>> = a.iter().map(|a| a.master_port.map(i32::from)).collect();
            sqlx::query(
                "INSERT INTO assignments (job_id, node_id, gpu_uuids, generation, assigned_at, profile,
                                          rank_offset, master_port)
                 SELECT j, n, string_to_array(g, E'\\n'), $5, $6, p, r, m
                 FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::bool[], $7::int[], $8::int[])
                      AS t(j, n, g, p, r, m)",
            )
            .bind(&jobs)
            .bind(&nodes)
            .bind(&gpus)
            .bind(&profile)
            .bind(generation)
            .bind(now)
            .bind(&ranks)
            .bind(&ports)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            sqlx::query(
                "INSERT INTO job_placements (job_id, node_id)
                 SELECT DISTINCT j, n FROM UNNEST($1::uuid[], $2::text[]) AS t(j, n)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&jobs)
            .bind(&nodes)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(generation)
        })
        .await
    }

    /// The SHA-256 (hex) of a node's token; None when the node is unknown
    /// or has not enrolled with the join token yet.
    pub async fn node_token_sha256(
        &self,
        node: &NodeId,
    ) -> Result<Option<String>, PersistenceError> {
        sqlx::query_scalar::<_, Option<String>>("SELECT token_sha256 FROM nodes WHERE id = $1")
            .bind(node.as_str())
            .fetch_optional(&self.pool)
            .await
            .map(Option::flatten)
            .map_err(db_err("node_token_sha256"))
    }

    /// Writes one node event (the node must be registered), fenced.
    pub async fn node_event(
        &self,
        node: &NodeId,
        kind: &str,
        message: &str,
        fence: &Fence,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "node_event";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            check_fence(&mut tx, fence, OP).await?;
            node_event_in(&mut tx, node, kind, message, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
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
        let rows = sqlx::query(
            "SELECT job_id, node_id, gpu_uuids, profile, rank_offset, master_port FROM assignments
             ORDER BY job_id, rank_offset",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut assignments = Vec::with_capacity(rows.len());
        for r in rows {
            let get = |e: sqlx::Error| corrupt(OP, e.to_string());
            assignments.push(Assignment {
                job: JobId(r.try_get("job_id").map_err(get)?),
                node: NodeId::try_from(r.try_get::<String, _>("node_id").map_err(get)?)
                    .map_err(|e| corrupt(OP, e))?,
                gpus: r
                    .try_get::<Vec<String>, _>("gpu_uuids")
                    .map_err(get)?
                    .into_iter()
                    .map(GpuUuid)
                    .collect(),
                profile: r.try_get("profile").map_err(get)?,
                rank_offset: r.try_get::<i32, _>("rank_offset").map_err(get)?.max(0) as u32,
                master_port: r
                    .try_get::<Option<i32>, _>("master_port")
                    .map_err(get)?
                    .and_then(|p| u16::try_from(p).ok()),
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
        let rows = sqlx::query(
            "SELECT s.job_id, s.attained_gpu_s, s.executed_s, s.fair_share_gpu_s, s.lease_until,
                    s.at_risk
             FROM job_service s JOIN jobs j ON j.id = s.job_id
             WHERE j.state IN ('submitted','profiling','queued','running')",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut out = BTreeMap::new();
        for r in rows {
            let get = |e: sqlx::Error| corrupt(OP, e.to_string());
            out.insert(
                JobId(r.try_get("job_id").map_err(get)?),
                JobService {
                    attained_gpu_s: r.try_get("attained_gpu_s").map_err(get)?,
                    executed_s: r.try_get("executed_s").map_err(get)?,
                    fair_share_gpu_s: r.try_get("fair_share_gpu_s").map_err(get)?,
                    lease_until: r.try_get("lease_until").map_err(get)?,
                    at_risk: r.try_get("at_risk").map_err(get)?,
                },
            );
        }
        Ok(out)
    }

    /// The merges a live job is part of (a merge whose jobs have both ended
    /// matters no more), oldest first.
    pub async fn merges_of_live_jobs(&self) -> Result<Vec<MergeRecord>, PersistenceError> {
        const OP: &str = "merges_of_live_jobs";
        let rows = sqlx::query(
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
        rows.iter()
            .map(|r| {
                let get = |e: sqlx::Error| corrupt(OP, e.to_string());
                let mode: String = r.try_get("mode").map_err(get)?;
                Ok(MergeRecord {
                    id: r.try_get("id").map_err(get)?,
                    a: JobId(r.try_get("job_a").map_err(get)?),
                    b: JobId(r.try_get("job_b").map_err(get)?),
                    mode: match mode.as_str() {
                        "temporal" => MergeMode::Temporal,
                        "spatial" => MergeMode::Spatial,
                        o => return Err(corrupt(OP, format!("merge mode {o:?}"))),
                    },
                    gain_ab: r.try_get("gain_ab").map_err(get)?,
                    gain_ba: r.try_get("gain_ba").map_err(get)?,
                    active: r.try_get::<String, _>("state").map_err(get)? == "active",
                    guard_passed: r.try_get("guard_passed").map_err(get)?,
                    observed_gain: r.try_get("observed_gain").map_err(get)?,
                })
            })
            .collect()
    }

    /// Every job's estimates.
    pub async fn estimates(&self) -> Result<BTreeMap<JobId, Estimate>, PersistenceError> {
        const OP: &str = "estimates";
        let rows = sqlx::query("SELECT job_id, iterations, curve, fisher, fisher_repeat, step_time_s, note, evals, spread FROM job_estimates")
            .fetch_all(&self.pool)
            .await
            .map_err(db_err(OP))?;
        let mut out = BTreeMap::new();
        for r in rows {
            let get = |e: sqlx::Error| corrupt(OP, e.to_string());
            let it: Option<i64> = r.try_get("iterations").map_err(get)?;
            out.insert(
                JobId(r.try_get("job_id").map_err(get)?),
                Estimate {
                    iterations: it.map(|i| i.max(0) as u64),
                    curve: r.try_get("curve").map_err(get)?,
                    fisher: r.try_get("fisher").map_err(get)?,
                    fisher_repeat: r.try_get("fisher_repeat").map_err(get)?,
                    step_time_s: r.try_get("step_time_s").map_err(get)?,
                    note: r.try_get("note").map_err(get)?,
                    evals: r.try_get("evals").map_err(get)?,
                    spread: r.try_get("spread").map_err(get)?,
                },
            );
        }
        Ok(out)
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
        let rows = sqlx::query(&sql)
            .bind(models)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_err(OP))?;
        rows.into_iter()
            .map(|r| {
                let get = |e: sqlx::Error| corrupt(OP, e.to_string());
                Ok(MetricCurve {
                    model: r.try_get("model").map_err(get)?,
                    metric: r
                        .try_get::<Option<String>, _>("metric")
                        .map_err(get)?
                        .unwrap_or_default(),
                    lower_is_better: r.try_get("lower").map_err(get)?,
                    target: r
                        .try_get::<Option<f64>, _>("target")
                        .map_err(get)?
                        .ok_or_else(|| corrupt(OP, "a metric target without a value"))?,
                    evals: r.try_get("evals").map_err(get)?,
                    transferred: r.try_get("transferred").map_err(get)?,
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
        let rows = sqlx::query("SELECT job_id, iteration, checkpoint_path FROM job_progress")
            .fetch_all(&self.pool)
            .await
            .map_err(db_err("progress"))?;
        let mut out = BTreeMap::new();
        for r in rows {
            let get = |e: sqlx::Error| corrupt("progress", e.to_string());
            let it: i64 = r.try_get("iteration").map_err(get)?;
            out.insert(
                JobId(r.try_get("job_id").map_err(get)?),
                (it.max(0) as u64, r.try_get("checkpoint_path").map_err(get)?),
            );
        }
        Ok(out)
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

    /// A job's events with `seq > after`, oldest first.
    pub async fn job_events(
        &self,
        id: JobId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<JobEventRecord>, PersistenceError> {
        const OP: &str = "job_events";
        let rows = sqlx::query(
            "SELECT seq, job_id, at, kind, from_state, to_state, message FROM job_events
             WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(id.0)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        rows.iter()
            .map(|r| {
                let get = |e: sqlx::Error| corrupt(OP, e.to_string());
                Ok(JobEventRecord {
                    seq: r.try_get("seq").map_err(get)?,
                    job_id: JobId(r.try_get("job_id").map_err(get)?),
                    at: r.try_get("at").map_err(get)?,
                    kind: r.try_get("kind").map_err(get)?,
                    from_state: opt_state(OP, r.try_get("from_state").map_err(get)?)?,
                    to_state: opt_state(OP, r.try_get("to_state").map_err(get)?)?,
                    message: r.try_get("message").map_err(get)?,
                })
            })
            .collect()
    }

    pub async fn job_counts_by_state(&self) -> Result<BTreeMap<JobState, u64>, PersistenceError> {
        const OP: &str = "job_counts_by_state";
        let rows = sqlx::query("SELECT state, count(*) FROM jobs GROUP BY state")
            .fetch_all(&self.pool)
            .await
            .map_err(db_err(OP))?;
        let mut out = BTreeMap::new();
        for r in rows {
            let s: String = r.try_get(0).map_err(|e| corrupt(OP, e.to_string()))?;
            let n: i64 = r.try_get(1).map_err(|e| corrupt(OP, e.to_string()))?;
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

    // ---- nodes -------------------------------------------------------------

    /// Records a (re-)registration: the node row, its GPUs (replacing the
    /// previous list) and an event, in one transaction. The node becomes
    /// Available. With a fence, only while that fence leads. `enrolled`:
    /// the SHA-256 of the node token just issued (the node enrolled with
    /// the join token); it replaces, and so revokes, any earlier one.
    pub async fn register_node(
        &self,
        n: &NodeRecord,
        enrolled: Option<&str>,
        fence: Option<&Fence>,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "register_node";
        let labels = serde_json::to_value(&n.labels).map_err(|e| corrupt(OP, e.to_string()))?;
        let uuids: Vec<&str> = n.gpus.iter().map(|g| g.uuid.0.as_str()).collect();
        let idx: Vec<i32> = n.gpus.iter().map(|g| g.index as i32).collect();
        let models: Vec<&str> = n.gpus.iter().map(|g| g.model.as_str()).collect();
        let mem: Vec<i64> = n.gpus.iter().map(|g| g.memory_total_bytes as i64).collect();
        let pci: Vec<&str> = n.gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            if let Some(f) = fence {
                check_fence(&mut tx, f, OP).await?;
            }
            sqlx::query(
                "INSERT INTO nodes (id, hostname, agent_version, gpu_backend, labels, state,
                                    registered_at, last_heartbeat_at, state_changed_at, address)
                 VALUES ($1, $2, $3, $4, $5, 'available', $6, $6, $6, $7)
                 ON CONFLICT (id) DO UPDATE SET
                    hostname = EXCLUDED.hostname, address = EXCLUDED.address,
                    agent_version = EXCLUDED.agent_version,
                    gpu_backend = EXCLUDED.gpu_backend, labels = EXCLUDED.labels,
                    state = 'available', registered_at = EXCLUDED.registered_at,
                    last_heartbeat_at = EXCLUDED.last_heartbeat_at,
                    state_changed_at = CASE WHEN nodes.state = 'available'
                                            THEN nodes.state_changed_at ELSE EXCLUDED.state_changed_at END",
            )
            .bind(n.id.as_str())
            .bind(&n.hostname)
            .bind(&n.agent_version)
            .bind(&n.gpu_backend)
            .bind(&labels)
            .bind(now)
            .bind(&n.address)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            // A GPU moved from another node (re-cabled host) is taken over.
            sqlx::query("DELETE FROM gpus WHERE node_id = $1 OR uuid = ANY($2)")
                .bind(n.id.as_str())
                .bind(&uuids)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            sqlx::query(
                "INSERT INTO gpus (uuid, node_id, idx, model, memory_total_bytes, pci_bus_id)
                 SELECT u, $1, i, m, b, p FROM UNNEST($2::text[], $3::int[], $4::text[], $5::bigint[], $6::text[])
                      AS t(u, i, m, b, p)",
            )
            .bind(n.id.as_str())
            .bind(&uuids)
            .bind(&idx)
            .bind(&models)
            .bind(&mem)
            .bind(&pci)
            .execute(&mut *tx)
            .await
            .map_err(|e| match classify(&e) {
                ErrorClass::UniqueViolation => PersistenceError::Conflict(format!("node {}: duplicate GPU index", n.id)),
                _ => db_err(OP)(e),
            })?;
            let registered = format!("{} GPUs, agent {}, backend {}", n.gpus.len(), n.agent_version, n.gpu_backend);
            node_event_in(&mut tx, &n.id, "registered", &registered, now, OP).await?;
            if let Some(hash) = enrolled {
                let before: Option<String> =
                    sqlx::query_scalar("SELECT token_sha256 FROM nodes WHERE id = $1 FOR UPDATE")
                        .bind(n.id.as_str())
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_err(OP))?;
                sqlx::query("UPDATE nodes SET token_sha256 = $2 WHERE id = $1")
                    .bind(n.id.as_str())
                    .bind(hash)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
                let message = if before.is_some() {
                    "enrolled again with the join token: a new node token was issued and the previous one revoked"
                } else {
                    "enrolled with the join token: node token issued"
                };
                node_event_in(&mut tx, &n.id, "enrolled", message, now, OP).await?;
            }
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// Persists a liveness transition with the heartbeat time that drove it
    /// (with a fence, only while that fence leads).
    pub async fn set_node_state(
        &self,
        id: &NodeId,
        state: NodeState,
        last_heartbeat_at: DateTime<Utc>,
        fence: Option<&Fence>,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "set_node_state";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            if let Some(f) = fence {
                check_fence(&mut tx, f, OP).await?;
            }
            let n = sqlx::query(
                "UPDATE nodes SET state = $2, last_heartbeat_at = GREATEST(last_heartbeat_at, $3),
                        state_changed_at = $4
                 WHERE id = $1",
            )
            .bind(id.as_str())
            .bind(state.as_str())
            .bind(last_heartbeat_at)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?
            .rows_affected();
            if n == 0 {
                return Err(PersistenceError::NotFound(format!("node {id}")));
            }
            node_event_in(&mut tx, id, "state_changed", state.as_str(), now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, PersistenceError> {
        const OP: &str = "list_nodes";
        let get = |e: sqlx::Error| corrupt(OP, e.to_string());
        let nodes = sqlx::query(
            "SELECT id, hostname, address, agent_version, gpu_backend, labels, state, registered_at, last_heartbeat_at
             FROM nodes ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let gpus = sqlx::query(
            "SELECT uuid, node_id, idx, model, memory_total_bytes, pci_bus_id FROM gpus ORDER BY node_id, idx",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut by_node: BTreeMap<String, Vec<GpuRecord>> = BTreeMap::new();
        for g in gpus {
            let node: String = g.try_get("node_id").map_err(get)?;
            by_node.entry(node).or_default().push(GpuRecord {
                uuid: GpuUuid(g.try_get("uuid").map_err(get)?),
                index: g.try_get::<i32, _>("idx").map_err(get)? as u32,
                model: g.try_get("model").map_err(get)?,
                memory_total_bytes: g.try_get::<i64, _>("memory_total_bytes").map_err(get)? as u64,
                pci_bus_id: g.try_get("pci_bus_id").map_err(get)?,
            });
        }
        nodes
            .iter()
            .map(|r| {
                let id: String = r.try_get("id").map_err(get)?;
                let state: String = r.try_get("state").map_err(get)?;
                let labels: serde_json::Value = r.try_get("labels").map_err(get)?;
                Ok(NodeRecord {
                    gpus: by_node.remove(&id).unwrap_or_default(),
                    id: NodeId::try_from(id).map_err(|e| corrupt(OP, e))?,
                    hostname: r.try_get("hostname").map_err(get)?,
                    address: r.try_get("address").map_err(get)?,
                    agent_version: r.try_get("agent_version").map_err(get)?,
                    gpu_backend: r.try_get("gpu_backend").map_err(get)?,
                    labels: serde_json::from_value(labels)
                        .map_err(|e| corrupt(OP, e.to_string()))?,
                    state: state.parse().map_err(|e: String| corrupt(OP, e))?,
                    registered_at: r.try_get("registered_at").map_err(get)?,
                    last_heartbeat_at: r.try_get("last_heartbeat_at").map_err(get)?,
                })
            })
            .collect()
    }

    /// Node history (newest last), for tests and operators.
    pub async fn node_event_kinds(
        &self,
        id: &NodeId,
    ) -> Result<Vec<(String, String)>, PersistenceError> {
        const OP: &str = "node_events";
        let rows =
            sqlx::query("SELECT kind, message FROM node_events WHERE node_id = $1 ORDER BY seq")
                .bind(id.as_str())
                .fetch_all(&self.pool)
                .await
                .map_err(db_err(OP))?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get(0).map_err(|e| corrupt(OP, e.to_string()))?,
                    r.try_get(1).map_err(|e| corrupt(OP, e.to_string()))?,
                ))
            })
            .collect()
    }
}

/// Parses a stored UUID string (page tokens).
pub fn parse_uuid(s: &str) -> Option<Uuid> {
    Uuid::parse_str(s).ok()
}
