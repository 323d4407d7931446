//! The scheduler's state: what the gRPC handlers, the round loop, the
//! prompt lane and the metrics share.
//!
//! Owns: the handles every part needs (Postgres, the node registry, the
//! authenticator, the model catalog and limits, the configuration, the
//! metrics, leadership, AutoSched's tuner) and the leader's memory
//! ([`LeaderMemory`], reached by the handlers only through its narrow
//! methods).
//!
//! Does not own: decisions (the round's, in `fmsched_core::round`), request
//! handling (`api`), or any IO of its own.

use std::sync::Arc;

use fmsched_core::{JobKind, Limits, ModelCatalog};
use tokio::sync::broadcast;

use crate::auth::Authenticator;
use crate::config::Config;
use crate::leader::LeaderMemory;
use crate::persistence::{JobRecord, Persistence};
use crate::registry::NodeRegistry;

/// Shared state of the scheduler's tasks; cloning is cheap.
#[derive(Clone)]
pub struct Service {
    pub persistence: Persistence,
    pub auth: Arc<Authenticator>,
    pub registry: Arc<NodeRegistry>,
    pub models: Arc<ModelCatalog>,
    pub limits: Limits,
    pub config: Arc<Config>,
    /// Wakes `WatchJob` streams when a job gets a new event in this process.
    pub job_events: broadcast::Sender<fmsched_core::JobId>,
    /// Counters of the scheduling loop (rendered on `/metrics`).
    pub metrics: Arc<crate::metrics::SchedulerMetrics>,
    /// Whether this replica leads, and the fence of its term: only the
    /// leader runs rounds, persists node liveness and accepts agent
    /// sessions, each write fenced by its term.
    pub leadership: Arc<crate::leadership::Leadership>,
    /// AutoSched's tuner (kept across tunings).
    pub autosched: Arc<crate::tuner::Autosched>,
    /// What the leader's loops keep in memory between rounds, and what
    /// wakes them early.
    pub leader: Arc<LeaderMemory>,
}

impl Service {
    /// Whether `job` is the prompt lane's: a prompt-tuning job while
    /// `scheduling.prompt_lane` is on (the round leaves it to the lane).
    pub fn in_prompt_lane(&self, job: &JobRecord) -> bool {
        self.config.scheduling.prompt_lane && job.spec.kind == JobKind::PromptTuning
    }
}
