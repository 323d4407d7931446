//! The pipeline switch (Ymir §6.2): a standby process prepared ahead of
//! a switch, started by the plan that runs it, dropped when the plan does
//! not; counted for the metrics.

use std::collections::BTreeMap;

use fmsched_proto::v1 as pb;

use crate::driver::LaunchSpec;
use crate::reconcile::report::{target_metrics, watched};
use crate::reconcile::{Known, Reconciler, frozen_of};

/// A standby process: what it was launched as, and when it expires.
#[derive(Clone, Debug)]
pub(crate) struct Standby {
    pub(crate) spec: LaunchSpec,
    pub(crate) since: std::time::Instant,
    pub(crate) expires: std::time::Instant,
    /// The task had no state here before its standby (forgotten on stop).
    pub(crate) fresh: bool,
}

/// How long after the expected switch an unclaimed standby is kept: the
/// plan that claims it may come a round late.
const STANDBY_SLACK: std::time::Duration = std::time::Duration::from_secs(60);

/// Longest wait, when a plan claims a standby, for its `prewarmed` report:
/// the start signal is sent only after it (a trainer has its handler
/// installed by then), and a cold launch would need that loader time too.
const STANDBY_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Counters of the pipeline switch, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SwitchStats {
    /// Standby processes launched on a `PrepareSwitch` hint.
    pub standby_launches: u64,
    /// Standby processes a plan started (their loader was ready or nearly).
    pub standby_started: u64,
    /// Standby processes stopped unused (the plan changed its mind).
    pub standby_wasted: u64,
    /// Seconds from the standby launch to its start, summed.
    pub standby_lead_seconds_sum: f64,
    /// Hints refused because `max_standby` processes were waiting already.
    pub standby_refused: u64,
    /// `warm` tasks handed to a warm process of their model (no launch).
    pub warm_starts: u64,
    /// `warm` tasks launched afresh (no warm process matched).
    pub cold_starts: u64,
    /// Warm processes stopped after idling `warm_idle_release`.
    pub warm_released: u64,
    /// Warm processes stopped because a task needed their GPUs.
    pub warm_evicted: u64,
}

impl Reconciler {
    /// Pipeline-switch counters.
    pub fn switch_stats(&self) -> SwitchStats {
        self.switches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut SwitchStats)) {
        f(&mut self.switches.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Waits (bounded) until a standby reported `prewarmed`; false if it
    /// died or never did.
    pub(super) async fn ready(&self, id: &str) -> bool {
        let deadline = std::time::Instant::now() + STANDBY_READY_WAIT;
        loop {
            match self.driver.status(id).await {
                Some(s) if s.running && s.observed.prewarmed => return true,
                Some(s) if s.running && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                _ => return false,
            }
        }
    }

    /// Stops a standby process (no checkpoint: it trained nothing) and
    /// forgets it: it is not reported (its exit must not read as a finished
    /// or failed job). What the node knew of the task before (its newest
    /// checkpoint) is kept for a later launch.
    pub(super) async fn drop_standby(
        &self,
        known: &mut BTreeMap<String, Known>,
        id: &str,
        why: &str,
    ) {
        let Some(sb) = known.get_mut(id).and_then(|k| k.standby.take()) else {
            return;
        };
        if let Err(e) = self.driver.terminate(id).await {
            tracing::debug!(task = id, error = %e, "standby already gone");
        }
        self.driver.forget(id).await;
        if sb.fresh {
            known.remove(id);
        }
        self.count(|c| c.standby_wasted += 1);
        tracing::info!(task = id, after = ?sb.since.elapsed(), reason = why, "standby stopped unused");
    }

    /// Launches desired task `t` in standby ahead of the round expected in
    /// `lead` (a `PrepareSwitch` hint, Ymir §6.2). Does nothing when the task
    /// runs here already (or waits in standby), finished here, or names GPUs
    /// this node lacks. Returns whether a standby was launched.
    pub async fn prepare(&self, t: &pb::DesiredTask, lead: std::time::Duration) -> bool {
        if t.phase != pb::DesiredPhase::Running as i32 || t.mode == pb::TaskMode::Profile as i32 {
            return false;
        }
        let Ok(gpus) = self.indices(&t.gpu_uuids) else {
            return false;
        };
        let mut known = self.known.lock().await;
        let status = self.driver.status(&t.task_id).await;
        if status.as_ref().is_some_and(|s| s.running) {
            return false;
        }
        let waiting = known.values().filter(|k| k.standby.is_some()).count();
        if waiting >= self.max_standby {
            self.count(|c| c.standby_refused += 1);
            tracing::debug!(task = %t.task_id, waiting, "switch hint refused: processes.max_standby reached");
            return false;
        }
        let fresh = !known.contains_key(&t.task_id);
        let entry = known.entry(t.task_id.clone()).or_default();
        if !fresh && !entry.suspended && status.as_ref().is_some_and(|s| s.exit_code == Some(0)) {
            return false; // finished here: the scheduler drops it
        }
        if let Some(s) = &status
            && let Some(c) = s.observed.last_checkpoint.clone()
        {
            entry.checkpoint = Some(c);
        }
        let spec = LaunchSpec {
            standby: true,
            ..self.launch_spec(t, &gpus, Self::resume_of(t, entry))
        };
        match self.driver.launch(&spec).await {
            Ok(()) => {
                let now = std::time::Instant::now();
                entry.pid = self.driver.status(&t.task_id).await.map_or(0, |s| s.pid);
                entry.gpus = gpus;
                entry.ranks = spec.ranks.clone();
                entry.job_ids.clone_from(&t.job_ids);
                entry.profile = false;
                entry.metrics = target_metrics(&spec.tasks);
                entry.watching = watched(&t.tasks);
                entry.frozen_layers = frozen_of(&spec.tasks);
                entry.lease_end = None; // told once the plan runs it
                entry.standby = Some(Standby {
                    spec,
                    since: now,
                    expires: now + lead + STANDBY_SLACK,
                    fresh,
                });
                self.count(|c| c.standby_launches += 1);
                true
            }
            Err(e) => {
                tracing::warn!(task = %t.task_id, error = %e, "standby launch failed");
                if fresh {
                    known.remove(&t.task_id);
                }
                false
            }
        }
    }

    /// Stops standby processes no plan claimed in time. Skipped while a
    /// plan is being applied (the next call catches up): the heartbeat
    /// calls this, and must not wait for a plan's checkpoints.
    pub async fn expire_standby(&self) {
        let Ok(mut known) = self.known.try_lock() else {
            return;
        };
        let now = std::time::Instant::now();
        let expired: Vec<String> = known
            .iter()
            .filter(|(_, k)| k.standby.as_ref().is_some_and(|s| s.expires <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.drop_standby(&mut known, &id, "no plan claimed it in time")
                .await;
        }
    }
}
