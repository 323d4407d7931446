//! All database access. This is the only module that imports sqlx: it owns
//! the row types, converts them to domain types, runs each operation as one
//! transaction (or one statement), names it for logs, and retries the
//! transient failures (serialization failure, deadlock) a bounded number of
//! times. SQLSTATE codes are mapped in one place, [`classify`].

mod admin;
mod commit;
mod jobs;
mod leadership;
mod nodes;
mod records;
mod round_inputs;
mod writes;

pub use admin::{
    AdminState, AuditEvent, CordonChange, LoanError, LoanState, NodeCordon, NodeLoan, POOL_LABEL,
    PolicySetting, QueueSetting, Requeue, SetQueuesError, TuningRecord,
};
pub use jobs::{JobEventRecord, JobQuery, NewJob, SloReport, SubmitOutcome};
pub use leadership::LeaderLease;
pub use nodes::{GpuRecord, NodeRecord};
pub use records::{
    Assignment, BankPrompt, Estimate, Failure, JobRecord, MergeRecord, NewMerge, RoundWrites,
    ServiceUpdate,
};
pub use round_inputs::{FreshStart, JobSchedule, JobService, MetricCurve, RetryState, StoredPlan};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fmsched_core::{JobId, JobState};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

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
pub(crate) enum ErrorClass {
    /// Serialization failure or deadlock: the transaction may be retried.
    Retryable,
    UniqueViolation,
    /// Connection refused, pool timed out, server shutting down.
    Unavailable,
    Other,
}

pub(crate) fn classify(e: &sqlx::Error) -> ErrorClass {
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

pub(crate) fn db_err(op: &'static str) -> impl FnOnce(sqlx::Error) -> PersistenceError {
    move |e| match classify(&e) {
        ErrorClass::Unavailable => PersistenceError::Unavailable(format!("{op}: {e}")),
        _ => PersistenceError::Database { op, source: e },
    }
}

pub(crate) fn corrupt(op: &'static str, message: impl Into<String>) -> PersistenceError {
    PersistenceError::Corrupt {
        op,
        message: message.into(),
    }
}

const MAX_ATTEMPTS: u32 = 5;

/// Runs `f` and retries it when the database says the transaction may be
/// retried. Each attempt must be a whole transaction.
pub(crate) async fn with_retries<T, F, Fut>(
    op: &'static str,
    mut f: F,
) -> Result<T, PersistenceError>
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
pub(crate) async fn check_fence(
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

/// Owns the connection pool. Cloning is cheap (the pool is shared).
#[derive(Clone, Debug)]
pub struct Persistence {
    pool: PgPool,
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
}

/// Parses a stored UUID string (page tokens).
pub fn parse_uuid(s: &str) -> Option<Uuid> {
    Uuid::parse_str(s).ok()
}
