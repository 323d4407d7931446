//! What the leader's loops keep in memory between rounds, and what wakes
//! them early. A new leader starts with it empty and relearns it from the
//! agents' next reports and from Postgres; nothing here must survive a
//! failover.
//!
//! The round loop and the prompt lane own it; the gRPC handlers reach it
//! only through the narrow methods below (a job was submitted, a task
//! ended), never its fields.

use std::collections::BTreeMap;
use std::sync::Mutex;

use fmsched_core::JobId;

mod bank;
mod deadline_waits;

pub use bank::{BankIndexes, Indexed};
pub use deadline_waits::DeadlineWaits;

/// The leader's memory (see the module docs).
#[derive(Default)]
pub struct LeaderMemory {
    /// Shared GPUs (by UUID) and the rounds in a row each reported
    /// saturated (the leader's own count; a new leader counts afresh).
    pub(crate) saturated_gpus: Mutex<BTreeMap<String, u32>>,
    /// Layer-elastic jobs' last reported per-layer gradient variance (the
    /// leader's memory, so a suspended job is still tuned per allocation).
    pub(crate) layer_variance: Mutex<BTreeMap<JobId, Vec<f64>>>,
    /// The Prompt Bank's index per model (checked against Postgres before
    /// each use).
    pub(crate) prompt_banks: BankIndexes,
    /// PromptTuner's lane: its wake-up, the lock it shares with rounds.
    pub(crate) prompt_lane: PromptLane,
    /// Wakes the round loop for a round on an event (a submission, a task
    /// that ended) when `scheduling.event_round_gap` is set.
    pub(crate) round_wake: tokio::sync::Notify,
    /// Jobs with a deadline submitted here, for rounds for deadlines
    /// (`scheduling.deadline_round_gap`).
    pub(crate) deadline_waits: DeadlineWaits,
}

impl LeaderMemory {
    /// An event the round loop may bring its next round forward for (a
    /// submission, a task that ended).
    pub fn wake_round(&self) {
        self.round_wake.notify_one();
    }

    /// A prompt-tuning request or a warm process for the prompt lane.
    pub fn wake_prompt_lane(&self) {
        self.prompt_lane.wake.notify_one();
    }

    /// A job with a deadline was submitted: it needs `need_s` from a
    /// round's start and must finish by `by` (rounds for deadlines).
    pub fn wait_for_deadline(&self, job: &JobId, need_s: f64, by: tokio::time::Instant) {
        self.deadline_waits.add(job, need_s, by);
    }

    /// Whether a job with a deadline waits for its first start: then a
    /// task's end may bring the next round forward.
    pub fn waits_on_deadlines(&self) -> bool {
        !self.deadline_waits.is_empty()
    }
}

/// The lane's state in the leader process.
#[derive(Default)]
pub struct PromptLane {
    /// Wakes the loop (a prompt-tuning submission; an agent reported a
    /// finished or a warm process).
    pub wake: tokio::sync::Notify,
    /// Held by a round from observe to commit, and by a lane pass: one
    /// decides at a time on the plan in force.
    pub round_lock: tokio::sync::Mutex<()>,
    /// The last round's fair shares: a lane commit accrues by them until
    /// the next round.
    pub fair_share: std::sync::Mutex<Vec<(JobId, f64)>>,
}
