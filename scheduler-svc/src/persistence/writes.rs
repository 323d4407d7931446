//! The batched writers [`Persistence::commit_round`] runs inside its
//! transaction: state changes, moves, notes, events, observations,
//! merges, guard verdicts and splits, each in one statement over many rows.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use fmsched_core::policy::MergeMode;
use fmsched_core::{JobId, JobState};
use uuid::Uuid;

use crate::persistence::records::{
    Estimate, JOB_COLUMNS, JobRecord, MergeRecord, NewMerge, RoundWrites, job_from_row,
};
use crate::persistence::{PersistenceError, corrupt, db_err};

/// Moves a job to `to` inside the caller's transaction, with its row lock
/// and a `state_changed` event. The state it is in already: a no-op.
pub(crate) async fn transition_in(
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
pub(crate) async fn transitions_in(
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
pub(crate) async fn notes_in(
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
pub(crate) async fn events_in(
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
pub(crate) async fn write_observations(
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
pub(crate) async fn write_merges(
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
