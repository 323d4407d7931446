//! The gRPC edge: request handlers and the one conversion from internal
//! errors to `tonic::Status`.

pub mod admin;
pub mod agent_traffic;
pub mod agents;
pub mod cluster;
pub mod jobs;

use fmsched_core::FieldError;
use tonic::Status;

use crate::auth::AuthError;
use crate::persistence::PersistenceError;

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

impl From<crate::round::autosched::TuneError> for ApiError {
    fn from(e: crate::round::autosched::TuneError) -> Self {
        use crate::round::autosched::TuneError;
        match e {
            TuneError::InvalidArgument(f) => ApiError::InvalidArgument(f),
            TuneError::FailedPrecondition(m) => ApiError::FailedPrecondition(m),
            TuneError::Internal(m) => ApiError::Internal(m),
            TuneError::Persistence(e) => e.into(),
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
