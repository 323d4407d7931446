//! A round's one fenced transaction ([`Persistence::commit_round`]): what
//! the round observed and decided (transitions, moves, observations,
//! merges and splits, service accounting, the new plan under a new
//! generation), written only while its writer still leads with the epoch
//! it started under and the plan is the one it read.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::round;
use fmsched_core::{JobId, JobState};
use uuid::Uuid;

use crate::persistence::nodes::node_event_in;
use crate::persistence::records::{RoundWrites, ServiceUpdate};
use crate::persistence::writes::{
    events_in, notes_in, transitions_in, write_merges, write_observations,
};
use crate::persistence::{Fence, Persistence, PersistenceError, check_fence, db_err, with_retries};

/// Adds the time since the stored plan was stored to the service of the
/// jobs it ran (training, not profiling) and to every live job's deserved
/// share (`service.fair_share_gpus`; a job submitted since then only from
/// when it came), and replaces the leases with `service.leases`. Part of
/// [`Persistence::commit_round`]'s transaction, before the old plan goes.
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
        // What the old plan's jobs trained on (not profiling runs), and
        // when each job now given a deserved share came; core's rule
        // (`round::accrue`, the one fmsim runs) turns them into the deltas
        // written below.
        let trained: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT job_id, SUM(cardinality(gpu_uuids))::bigint FROM assignments
             WHERE NOT profile GROUP BY job_id",
        )
        .fetch_all(&mut **tx)
        .await
        .map_err(db_err(op))?;
        let deserving: Vec<Uuid> = service.fair_share_gpus.iter().map(|(j, _)| j.0).collect();
        let came: BTreeMap<Uuid, DateTime<Utc>> =
            sqlx::query_as("SELECT id, created_at FROM jobs WHERE id = ANY($1::uuid[])")
                .bind(&deserving)
                .fetch_all(&mut **tx)
                .await
                .map_err(db_err(op))?
                .into_iter()
                .collect();
        let mut add: BTreeMap<Uuid, round::Accrued> = BTreeMap::new();
        for (job, gpus) in trained {
            let gpus = u32::try_from(gpus).unwrap_or(u32::MAX);
            let got = round::accrue(gpus, 0.0, held_s, 0.0);
            let a = add.entry(job).or_default();
            a.attained_gpu_s += got.attained_gpu_s;
            a.executed_s += got.executed_s;
        }
        for (job, deserved) in &service.fair_share_gpus {
            // A job submitted since the old plan deserves only the time
            // since it came.
            let Some(created) = came.get(&job.0) else {
                continue;
            };
            let present_s = (now - *created).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
            add.entry(job.0).or_default().fair_share_gpu_s +=
                round::accrue(0, *deserved, held_s, present_s).fair_share_gpu_s;
        }
        let mut jobs = Vec::with_capacity(add.len());
        let (mut attained, mut executed, mut fair) = (Vec::new(), Vec::new(), Vec::new());
        for (job, a) in add {
            jobs.push(job);
            attained.push(a.attained_gpu_s);
            executed.push(a.executed_s);
            fair.push(a.fair_share_gpu_s);
        }
        sqlx::query(
            "INSERT INTO job_service (job_id, attained_gpu_s, executed_s, fair_share_gpu_s)
             SELECT * FROM UNNEST($1::uuid[], $2::float8[], $3::float8[], $4::float8[])
             ON CONFLICT (job_id) DO UPDATE SET
               attained_gpu_s = job_service.attained_gpu_s + EXCLUDED.attained_gpu_s,
               executed_s = job_service.executed_s + EXCLUDED.executed_s,
               fair_share_gpu_s = job_service.fair_share_gpu_s + EXCLUDED.fair_share_gpu_s",
        )
        .bind(&jobs)
        .bind(&attained)
        .bind(&executed)
        .bind(&fair)
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

impl Persistence {
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
            write_fits_and_first_notes(&mut tx, w, now, OP).await?;
            write_bank_sharing_loans_requeues(&mut tx, w, now, OP).await?;
            let generation: i64 = sqlx::query_scalar(
                "UPDATE plan_generation SET generation = generation + 1, stored_at = $1, epoch = $2
                 RETURNING generation",
            )
            .bind(now)
            .bind(fence.epoch)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            write_plan(&mut tx, w, generation, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(generation)
        })
        .await
    }
}

/// The utilisation fits the round changed, written whole; the events
/// written once per job (`first_notes`), each unless the job has one of
/// its kind. Part of [`Persistence::commit_round`]'s transaction.
async fn write_fits_and_first_notes(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    w: &RoundWrites,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
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
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    if !w.first_notes.is_empty() {
        // One read for all of them: which (job, kind) have an event.
        let (jobs, kinds): (Vec<Uuid>, Vec<String>) = w
            .first_notes
            .iter()
            .map(|(j, k, _)| (j.0, k.clone()))
            .unzip();
        let seen: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT DISTINCT e.job_id, e.kind FROM job_events e
             JOIN UNNEST($1::uuid[], $2::text[]) AS n(job_id, kind)
               ON e.job_id = n.job_id AND e.kind = n.kind",
        )
        .bind(&jobs)
        .bind(&kinds)
        .fetch_all(&mut **tx)
        .await
        .map_err(db_err(op))?;
        let seen: BTreeSet<(Uuid, &str)> = seen.iter().map(|(j, k)| (*j, k.as_str())).collect();
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
        events_in(tx, &fresh, now, op).await?;
    }
    Ok(())
}

/// The Prompt Bank's additions and evictions, jobs that never share a GPU
/// again, loans whose reclaim is done, and the admin re-queues the round
/// acted on. Part of [`Persistence::commit_round`]'s transaction.
async fn write_bank_sharing_loans_requeues(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    w: &RoundWrites,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
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
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    if !w.bank_evictions.is_empty() {
        let ids: Vec<uuid::Uuid> = w.bank_evictions.iter().map(|j| j.0).collect();
        sqlx::query("DELETE FROM prompt_bank WHERE job_id = ANY($1)")
            .bind(&ids)
            .execute(&mut **tx)
            .await
            .map_err(db_err(op))?;
    }
    if !w.no_sharing.is_empty() {
        let ids: Vec<uuid::Uuid> = w.no_sharing.iter().map(|j| j.0).collect();
        sqlx::query("UPDATE jobs SET no_gpu_sharing = true WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut **tx)
            .await
            .map_err(db_err(op))?;
    }
    for n in &w.returned {
        let done = sqlx::query(
            "UPDATE node_loans SET state = 'returned', returned_at = $2
             WHERE node_id = $1 AND state = 'reclaiming'",
        )
        .bind(n.as_str())
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?
        .rows_affected();
        if done > 0 {
            node_event_in(
                tx,
                n,
                "returned",
                "reclaim done: no worker left; back with inference",
                now,
                op,
            )
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
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    Ok(())
}

/// The new plan under `generation`: fresh starts reset (after this
/// round's progress reports), the assignments replaced, and the nodes each
/// job was placed on recorded. Part of [`Persistence::commit_round`]'s
/// transaction.
async fn write_plan(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    w: &RoundWrites,
    generation: i64,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
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
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    }
    sqlx::query("DELETE FROM assignments")
        .execute(&mut **tx)
        .await
        .map_err(db_err(op))?;
    let a = &w.assignments;
    let jobs: Vec<Uuid> = a.iter().map(|a| a.job.0).collect();
    let nodes: Vec<&str> = a.iter().map(|a| a.node.as_str()).collect();
    // One text per assignment: Postgres has no ragged arrays.
    let gpus: Vec<String> = a
        .iter()
        .map(|a| {
            a.gpus
                .iter()
                .map(|g| g.0.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
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
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    sqlx::query(
        "INSERT INTO job_placements (job_id, node_id)
         SELECT DISTINCT j, n FROM UNNEST($1::uuid[], $2::text[]) AS t(j, n)
         ON CONFLICT DO NOTHING",
    )
    .bind(&jobs)
    .bind(&nodes)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}
