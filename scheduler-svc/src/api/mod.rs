//! The gRPC edge: request handlers and the one conversion from internal
//! errors to `tonic::Status`.

pub mod admin;
pub mod agents;
pub mod cluster;
pub mod jobs;

use std::sync::Arc;

use fmsched_core::{FieldError, Limits, ModelCatalog};
use tokio::sync::broadcast;
use tonic::Status;

use crate::auth::{AuthError, Authenticator};
use crate::config::Config;
use crate::persistence::{Persistence, PersistenceError};
use crate::registry::NodeRegistry;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
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
    pub autosched: Arc<crate::scheduling::autosched::Autosched>,
    /// Shared GPUs (by UUID) and the rounds in a row each reported
    /// saturated (the leader's own count; a new leader counts afresh).
    pub saturated_gpus: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u32>>>,
    /// Layer-elastic jobs' last reported per-layer gradient variance (the
    /// leader's memory, so a suspended job is still tuned per allocation).
    pub layer_variance:
        Arc<std::sync::Mutex<std::collections::BTreeMap<fmsched_core::JobId, Vec<f64>>>>,
    /// The Prompt Bank's index per model (the leader's memory, checked
    /// against Postgres before each use).
    pub prompt_banks: Arc<crate::scheduling::BankIndexes>,
    /// PromptTuner's lane: its wake-up, the lock it shares with rounds.
    pub prompt_lane: Arc<crate::scheduling::PromptLane>,
    /// Wakes the round loop for a round on an event (a submission, a task
    /// that ended) when `scheduling.event_round_gap` is set.
    pub round_wake: Arc<tokio::sync::Notify>,
    /// Jobs with a deadline submitted here, for rounds for deadlines
    /// (`scheduling.deadline_round_gap`).
    pub deadline_waits: Arc<crate::scheduling::DeadlineWaits>,
}

/// Errors a handler returns; mapped to a status code in one place.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidArgument(FieldError),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidArgument(FieldError::new(field, message))
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::InvalidArgument(e)
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        ApiError::Unauthenticated(e.to_string())
    }
}

impl From<PersistenceError> for ApiError {
    fn from(e: PersistenceError) -> Self {
        match e {
            PersistenceError::NotFound(m) => ApiError::NotFound(format!("{m} not found")),
            PersistenceError::Conflict(m) => ApiError::AlreadyExists(m),
            e @ PersistenceError::InvalidTransition { .. } => {
                ApiError::FailedPrecondition(e.to_string())
            }
            PersistenceError::Unavailable(m) => {
                tracing::warn!(error = %m, "database unavailable");
                ApiError::Unavailable("database unavailable; retry later".into())
            }
            other => {
                tracing::error!(error = %other, "internal error");
                ApiError::Internal("internal error; see scheduler logs".into())
            }
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        match e {
            ApiError::InvalidArgument(f) => Status::invalid_argument(f.to_string()),
            ApiError::Unauthenticated(m) => Status::unauthenticated(m),
            ApiError::PermissionDenied(m) => Status::permission_denied(m),
            ApiError::NotFound(m) => Status::not_found(m),
            ApiError::AlreadyExists(m) => Status::already_exists(m),
            ApiError::FailedPrecondition(m) => Status::failed_precondition(m),
            ApiError::Unavailable(m) => Status::unavailable(m),
            ApiError::Internal(m) => Status::internal(m),
        }
    }
}

/// Rejects strings longer than `max` bytes, naming the field.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.len() > max {
        return Err(ApiError::field(
            field,
            format!("is {} bytes; at most {max} are allowed", value.len()),
        ));
    }
    Ok(())
}
