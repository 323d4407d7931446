//! The records the persistence modules share: a job as stored and how a
//! `jobs` row decodes, estimates, merges and Prompt Bank entries as the
//! round reads them, and what a round writes ([`RoundWrites`]). Types and
//! row decoding only; the queries live with their aggregate.

use chrono::{DateTime, Utc};
use fmsched_core::policy::MergeMode;
use fmsched_core::{GpuUuid, JobId, JobSpec, JobState, NodeId, UserName};
use fmsched_estimator::footprint::UtilizationFit;
use sqlx::FromRow;

use crate::persistence::{PersistenceError, corrupt};

/// A job as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub id: JobId,
    pub owner: UserName,
    pub spec: JobSpec,
    pub idempotency_key: Option<String>,
    pub state: JobState,
    pub state_reason: String,
    pub output_path: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_event_seq: i64,
}

/// The `jobs` columns [`job_from_row`] reads, in a `SELECT`'s order.
pub(crate) const JOB_COLUMNS: &str = "id, owner, spec, idempotency_key, state, state_reason, output_path, \
                           created_at, updated_at, last_event_seq";

/// A `jobs` row as a [`JobRecord`]; a row that does not decode is
/// reported as corrupt, naming the column.
pub(crate) fn job_from_row(row: &sqlx::postgres::PgRow) -> Result<JobRecord, PersistenceError> {
    const OP: &str = "decode job";
    let r = JobRow::from_row(row).map_err(|e| corrupt(OP, e.to_string()))?;
    Ok(JobRecord {
        id: JobId(r.id),
        owner: UserName(r.owner),
        spec: serde_json::from_value(r.spec).map_err(|e| corrupt(OP, format!("spec: {e}")))?,
        idempotency_key: r.idempotency_key,
        state: r.state.parse().map_err(|e: String| corrupt(OP, e))?,
        state_reason: r.state_reason,
        output_path: r.output_path,
        created_at: r.created_at,
        updated_at: r.updated_at,
        last_event_seq: r.last_event_seq,
    })
}

/// The [`JOB_COLUMNS`] of a `jobs` row as stored.
#[derive(sqlx::FromRow)]
struct JobRow {
    id: uuid::Uuid,
    owner: String,
    spec: serde_json::Value,
    idempotency_key: Option<String>,
    state: String,
    state_reason: String,
    output_path: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    last_event_seq: i64,
}

pub(crate) fn opt_state(
    op: &'static str,
    s: Option<String>,
) -> Result<Option<JobState>, PersistenceError> {
    s.map(|s| s.parse().map_err(|e: String| corrupt(op, e)))
        .transpose()
}

/// What a profiling run taught about a job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Iterations to converge (Ymir Eq. 2), None without a usable fit.
    pub iterations: Option<u64>,
    pub curve: Option<serde_json::Value>,
    pub fisher: Vec<f64>,
    pub fisher_repeat: Vec<f64>,
    pub step_time_s: Option<f64>,
    pub note: String,
    /// Its target metric per epoch so far (`evals[e − 1]` at epoch `e`),
    /// kept across restarts; empty for a job without a metric target.
    pub evals: Vec<f64>,
    /// Relative spread of the prediction: from `evals` for a metric target
    /// that has evaluated (p90 − p10 epochs over the epochs left), else
    /// from the loss prior once finished jobs of the model inform it (p90 −
    /// p10 iterations over the iterations left); 0 = sure or none.
    pub spread: f64,
}

/// A merge decided by the task merger (Ymir §5), kept until the merge guard
/// splits it.
#[derive(Clone, Debug, PartialEq)]
pub struct MergeRecord {
    pub id: i64,
    pub a: JobId,
    pub b: JobId,
    pub mode: MergeMode,
    /// Predicted `G_{A,B}` and `G_{B,A}` when decided.
    pub gain_ab: f64,
    pub gain_ba: f64,
    /// False once split by the guard.
    pub active: bool,
    pub guard_passed: bool,
    /// The transfer gain it showed, once measured (and sent to the
    /// estimator's regression): B of a temporal merge on its own training
    /// from A's weights, a spatial pair's mean at its guard, 0 for a
    /// temporal guard split.
    pub observed_gain: Option<f64>,
}

/// One tuned prompt in the Prompt Bank (table `prompt_bank`).
#[derive(Clone, Debug, PartialEq)]
pub struct BankPrompt {
    /// The prompt-tuning job that tuned it.
    pub job: JobId,
    pub model: String,
    /// Its prompt file (the job's output).
    pub location: String,
    /// Its activation features (PromptTuner §4.4.3.1).
    pub features: Vec<f64>,
}

/// One job's GPUs on one node in the plan (a job over several nodes has
/// one per node).
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub job: JobId,
    pub node: NodeId,
    pub gpus: Vec<GpuUuid>,
    /// A profiling run (not the training run).
    pub profile: bool,
    /// Global rank of this part's first GPU (0 on the node of rank 0).
    pub rank_offset: u32,
    /// A job over several nodes: the rendezvous port of its rank 0.
    pub master_port: Option<u16>,
}

/// A merge to record with a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct NewMerge {
    pub a: JobId,
    pub b: JobId,
    pub mode: MergeMode,
    pub gain_ab: f64,
    pub gain_ba: f64,
    /// A warm start: A had completed when it was decided (a temporal
    /// merge; a finished job may be the A of many).
    pub warm: bool,
}

/// What a stored plan records about service besides the assignments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceUpdate {
    /// GPUs each live job deserves per second until the next plan (an equal
    /// share of the cluster, at most its request).
    pub fair_share_gpus: Vec<(JobId, f64)>,
    /// The leases of the new plan; every other job's lease ends.
    pub leases: Vec<(JobId, DateTime<Utc>)>,
    /// The round's predictions (`core::round::predictions`): finish time
    /// and deadline risk; every other job's are cleared.
    pub predictions: Vec<(JobId, Option<DateTime<Utc>>, bool)>,
    /// A prompt-lane commit (no policy decided): leases and predictions
    /// stay as the last round set them; `fair_share_gpus` are that
    /// round's.
    pub carry_over: bool,
}

/// A failed training process, counted once (by its pid): the job's new
/// retry count and when it may run again.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub job: JobId,
    pub pid: u32,
    /// The plan generation from which on a failure report counts again
    /// (the one this round commits).
    pub generation: i64,
    pub retries: u32,
    pub retry_after: DateTime<Utc>,
}

/// Everything one round writes, committed by [`Persistence::commit_round`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundWrites {
    /// (job, iterations done, newest checkpoint).
    pub progress: Vec<(JobId, u64, Option<String>)>,
    pub estimates: Vec<(JobId, Estimate)>,
    pub failures: Vec<Failure>,
    /// (job, output weights).
    pub completions: Vec<(JobId, String)>,
    /// Merge guard verdicts: split (with the reason) or passed.
    pub guard: Vec<(MergeRecord, Option<String>)>,
    /// Kept temporal merges the round splits (`RoundOutcome::released`),
    /// with the reason.
    pub released: Vec<(MergeRecord, String)>,
    /// (merge id, observed gain) sent to the estimator's regression.
    pub observed_gains: Vec<(i64, f64)>,
    pub new_merges: Vec<NewMerge>,
    /// State changes in order (the observed ones first, then the plan's).
    pub transitions: Vec<(JobId, JobState, String)>,
    /// Events that change no state: (job, kind, message), each written
    /// unless the job's newest event says the same.
    pub notes: Vec<(JobId, String, String)>,
    /// The new plan (training and profiling).
    pub assignments: Vec<Assignment>,
    pub service: ServiceUpdate,
    /// Admin re-queue requests this round acted on (job, requested at):
    /// deleted, unless renewed since.
    pub requeued: Vec<(JobId, DateTime<Utc>)>,
    /// Reclaimed nodes found empty (nothing planned, no process): their
    /// loans end.
    pub returned: Vec<NodeId>,
    /// Jobs taken off a shared GPU that ran saturated: they never share a
    /// GPU again (ICEFROG Eq. 8's rule measured).
    pub no_sharing: Vec<JobId>,
    /// Utilisation fits this round's measurements changed, by (model, GPU
    /// family): written whole.
    pub utilization_fits: Vec<((String, String), UtilizationFit)>,
    /// Tuned prompts of prompt-tuning jobs that completed, filed in their
    /// model's Prompt Bank.
    pub bank_adds: Vec<BankPrompt>,
    /// Prompts evicted from the Prompt Bank (past its cap; possibly one of
    /// `bank_adds`).
    pub bank_evictions: Vec<JobId>,
    /// Events written once per job: (job, kind, message), skipped when the
    /// job has an event of that kind already.
    pub first_notes: Vec<(JobId, String, String)>,
    /// Jobs restarted from their initial weights (a transfer from a
    /// completed job's weights measured to hurt): their progress and
    /// checkpoint reset, fenced by this commit's plan generation
    /// ([`Persistence::fresh_starts`]).
    pub fresh_starts: Vec<JobId>,
    /// Fresh starts whose fresh process the nodes reported: the plan stops
    /// asking for it.
    pub fresh_seen: Vec<JobId>,
}
