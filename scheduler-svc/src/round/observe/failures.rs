//! A failed process: retried from its last checkpoint with backoff, a gang
//! re-queued once, or the job failed with its last log lines.

use chrono::{DateTime, Utc};
use fmsched_core::{JobId, JobState};
use fmsched_proto::v1 as pb;

use crate::persistence::{Failure, RetryState};
use crate::registry::LiveNode;
use crate::round::observe::Observed;
use crate::service::Service;

/// A training process of `id` failed: counted once (by its pid), the job
/// is held back `retry_backoff · 2^(retries − 1)` and retried from its last
/// checkpoint, or fails after `max_retries`. A failed joint process splits
/// its merge.
pub(crate) fn failed(
    state: &Service,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    members: &[JobId],
    id: JobId,
    now: DateTime<Utc>,
) {
    if members.len() > 1
        && let Some(m) = o
            .merges
            .iter()
            .find(|m| m.active && m.a == members[0] && !o.split_now.contains(&m.id))
    {
        o.writes
            .guard
            .push((m.clone(), Some("the joint process failed".into())));
        o.split_now.insert(m.id);
    }
    let prev = o.retries.get(&id).cloned().unwrap_or_default();
    if prev.last_failed_pid == Some(t.pid) {
        return; // this process's failure was counted already
    }
    // A process that last ran under an older plan than the one that
    // re-queued the job: another member of a gang whose failure was
    // counted, or the run before's. One failure per run, not per rank.
    if t.generation > 0
        && prev
            .last_failed_generation
            .is_some_and(|g| t.generation < g)
    {
        return;
    }
    // This round's plan (the generation after the one in force) is the
    // first a new run of the job can start under.
    let generation = o.current.generation + 1;
    let cfg = &state.config.scheduling;
    let retries = prev.retries + 1;
    let wait = cfg.retry_backoff.saturating_mul(1 << (retries - 1).min(10));
    let retry_after = now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX);
    o.retries.insert(
        id,
        RetryState {
            retries,
            last_failed_pid: Some(t.pid),
            retry_after: Some(retry_after),
            last_failed_generation: Some(generation),
        },
    );
    o.writes.failures.push(Failure {
        job: id,
        pid: t.pid,
        generation,
        retries,
        retry_after,
    });
    let what = format!(
        "training process exited with code {} on node {}{}",
        t.exit_code,
        n.record.id,
        if t.message.is_empty() {
            String::new()
        } else {
            format!("; last log lines:\n{}", t.message)
        }
    );
    if retries > cfg.max_retries {
        let reason = format!("{what}\n(gave up after {} retries)", cfg.max_retries);
        tracing::warn!(job_id = %id, retries, "job failed");
        o.writes.transitions.push((id, JobState::Failed, reason));
        o.live.remove(&id);
        o.failed += 1;
    } else {
        let reason = format!(
            "{what}\n(retry {retries} of {} in {wait:?}, from the last checkpoint)",
            cfg.max_retries
        );
        tracing::warn!(job_id = %id, retries, ?wait, "training process failed; will retry");
        o.writes.transitions.push((id, JobState::Queued, reason));
        o.retried += 1;
        if let Some(j) = o.live.get_mut(&id) {
            j.state = JobState::Queued;
        }
    }
}
