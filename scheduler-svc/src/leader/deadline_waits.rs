//! The deadline waits: jobs with a deadline waiting for their first start,
//! which the round loop may round early for (`scheduling.deadline_round_gap`).

use std::collections::BTreeSet;

use fmsched_core::{JobId, round};

/// Jobs with a deadline submitted to this replica, for rounds for
/// deadlines (`scheduling.deadline_round_gap`): what each needs from a
/// round's start and its deadline on the round loop's clock. The need is
/// admission's estimate at submit (its best case alone, a lower bound);
/// each round then sets it to the round's own estimate of its time alone
/// at its request ([`round::need_alone`], as fmsim weighs a job that has
/// profiled) and drops the jobs that started or left, so only a job that
/// still waits for its first start brings a round forward, as in fmsim.
/// An entry also goes once its deadline can no longer be met.
#[derive(Debug, Default)]
pub struct DeadlineWaits(std::sync::Mutex<Vec<DeadlineWait>>);

/// One job in [`DeadlineWaits`].
#[derive(Clone, Debug, PartialEq)]
struct DeadlineWait {
    job: String,
    need_s: f64,
    by: tokio::time::Instant,
}

impl DeadlineWaits {
    /// Keeps a job's need and deadline, dropping those that can no longer
    /// be met (on a standby replica nothing else drops them).
    pub fn add(&self, job: &JobId, need_s: f64, by: tokio::time::Instant) {
        let mut waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        drop_unreachable(&mut waits, tokio::time::Instant::now());
        waits.push(DeadlineWait {
            job: job.to_string(),
            need_s,
            by,
        });
    }

    /// After a round: a job that the round started, that has trained or
    /// that is no longer live is dropped; one still waiting in the round's
    /// snapshot needs what the round's estimates say ([`round::need_alone`]).
    /// A job not yet in the snapshot (its profiling run not done) keeps
    /// admission's need.
    pub(crate) fn after_round(&self, view: &round::ClusterView, d: &round::Decision) {
        let snap = &d.snapshot;
        let started: BTreeSet<usize> = d
            .plan
            .entries
            .iter()
            .filter(|e| e.gpus > 0)
            .flat_map(|e| e.jobs.iter().copied())
            .collect();
        let mut waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        waits.retain_mut(|w| {
            if !view.jobs.iter().any(|j| j.id == w.job) {
                return false;
            }
            let Some(k) = snap.jobs.iter().position(|j| j.id == w.job) else {
                return true;
            };
            if started.contains(&k) {
                return false;
            }
            match round::need_alone(snap, k) {
                Some(need_s) => {
                    w.need_s = need_s;
                    true
                }
                None => false,
            }
        });
    }

    /// Whether no job here waits with a deadline: then a task's end need
    /// not wake the round loop.
    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Each kept job and its need (for tests).
    #[cfg(test)]
    pub(crate) fn needs(&self) -> Vec<(String, f64)> {
        let waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        waits.iter().map(|w| (w.job.clone(), w.need_s)).collect()
    }

    /// Each kept job's need and deadline on the round clock (`secs` turns
    /// an instant into the clock's seconds), for [`round::RoundClock::on_event`];
    /// jobs whose deadline can no longer be met are dropped.
    pub(crate) fn needs_by(&self, secs: impl Fn(tokio::time::Instant) -> f64) -> Vec<(f64, f64)> {
        let mut waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        drop_unreachable(&mut waits, tokio::time::Instant::now());
        waits.iter().map(|w| (w.need_s, secs(w.by))).collect()
    }
}

/// Drops the waits whose deadline can no longer be met: started `now`,
/// the job would need past it.
fn drop_unreachable(waits: &mut Vec<DeadlineWait>, now: tokio::time::Instant) {
    waits.retain(|w| now + std::time::Duration::from_secs_f64(w.need_s.max(0.0)) <= w.by);
}
