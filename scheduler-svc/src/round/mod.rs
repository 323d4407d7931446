//! The scheduling loop: every interval one round (Ymir Fig. 6 steps 4–5;
//! STYLE §1 and §7). The decisions are `fmsched_core::round`'s, the same
//! code `fmsim` runs; this module does the IO around them.
//!
//! Phases of a round, each a short function:
//! 1. **observe** ([`observe`]) — read what Postgres holds and take in what
//!    agents report (progress, checkpoints, finished, failed and profiled
//!    processes, loss traces, evaluations; the merge guard). Writes
//!    nothing: every consequence is collected for the commit.
//! 2. **load inputs** ([`inputs`]) — the one translation from records to
//!    the round's view, the round's `prepare`, and every estimator call
//!    (transfer gains, the time table) with the logged in-process fallback.
//! 3. **decide** — `fmsched_core::round::decide` on the blocking pool: the
//!    policy's snapshot, its plan, and the plan interpreted into GPUs, new
//!    merges, state transitions, leases and what cannot run.
//! 4. **commit** — everything the round observed and decided in one
//!    transaction, which succeeds only while this replica holds the leader
//!    lease with the epoch it started the round under, and while the plan is
//!    still the generation the round read (`Persistence::commit_round`). A
//!    deposed leader's round fails here, is logged and counted, and writes
//!    nothing.
//! 5. **push** ([`push`]) — every connected node its complete desired set
//!    under the new generation and the leader's epoch.
//!
//! A *look-ahead* ([`look_ahead`], Ymir §6.2 pipeline switch) shares the
//! first three phases with [`run_round`] (its observe only predicts which
//! jobs finish before the switch), then sends `PrepareSwitch` hints instead
//! of a commit.
//!
//! The intent lives in Postgres, so a restarted scheduler pushes the same
//! plan under a newer generation: agents keep healthy processes (a repeated
//! desired task is a no-op for them) and nothing restarts.
//!
//! Merges (Ymir §5): profiled jobs' Task2Vec embeddings give transfer gains
//! (§4.1), the estimator's time table gives `T` and `TranWt` (Eq. 5, 12,
//! 13), and the policy picks pairs. A merge is persisted with the plan that
//! decides it and kept (only its size changes) until the merge guard (§4.3)
//! splits it. A spatial pair runs as one joint process `<a>+<b>`; a
//! temporal pair runs A (with B evaluated alongside), then B from A's
//! output weights. What a merge gained is measured on the jobs' losses and
//! taught to the estimator's gain regression (`RecordTransferOutcome`).
//!
//! Jobs over several nodes ([`gangs`]): a group the placement spreads over
//! nodes is one assignment per node, in rank order, and gets a rendezvous
//! port; each node's agent runs its part with torchrun's rank variables
//! (push). Only rank 0's process reports progress and completion; any
//! member's failure re-queues the job once (observe), and the next plan
//! stops the other members. `scheduling.max_nodes_per_job` caps the nodes
//! a group may span: a wider placement waits with an `unschedulable` event
//! (and `fmsched_unexecutable_placements_total`).

pub mod admission;
pub mod autosched;
mod gangs;
mod inputs;
mod launch;
mod observe;
mod pacing;
mod phases;
mod prompt_bank;
pub mod prompt_lane;
mod push;
#[cfg(test)]
mod tests;
mod writes;

pub use inputs::{Translated, ViewSources, build_view};
pub use pacing::{round_clock, scheduling_loop};
pub use phases::{DECIDE_GRACE, STUCK_ROUND};

// Used by sibling modules as `super::…`.
use crate::registry::master_addr;
use writes::account_observed;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use fmsched_core::policy::Policy;
use fmsched_core::round::phase;
use fmsched_core::{JobId, NodeId, round};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::Lut;
use observe::Observed;

use crate::config::SchedulingConfig;
use crate::estimates::EstimatorClient;
use crate::persistence::{Estimate, JobRecord, PersistenceError};
use crate::round::launch::{gang_ports, hint, plan_context};
use crate::round::phases::enter_phase;
use crate::round::writes::{after_commit, plan_writes};
use crate::service::Service;

/// Default iterations of a job whose target names neither iterations nor
/// epochs with a known dataset size (it stops on its metric).
const DEFAULT_ITERATIONS: u64 = 1000;

/// What one round did, for logs and tests.
#[derive(Debug, Default, PartialEq)]
pub struct RoundReport {
    pub generation: i64,
    pub jobs: usize,
    pub running: usize,
    pub completed: usize,
    pub failed: usize,
    /// The settings in force this round (the admin API's policy over the
    /// configuration's); None when the round stopped before reading them.
    pub scheduling: Option<crate::config::SchedulingConfig>,
}

/// Which round observes: a committing one takes in the agents' reports, a
/// look-ahead only reads what is persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundKind {
    /// Observe the agents' reports, decide, persist the plan under a new
    /// generation and push it.
    Commit,
    /// Predict the plan of the round expected at `switch_at` from what is
    /// persisted, and send `PrepareSwitch` hints for the tasks it would
    /// start (Ymir §6.2). Observes nothing, writes nothing.
    LookAhead { switch_at: DateTime<Utc> },
}

/// The round's error (logged; the next round tries again).
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    #[error(transparent)]
    Persistence(#[from] PersistenceError),
    #[error("policy task failed: {0}")]
    Join(String),
    #[error(transparent)]
    Decide(#[from] round::RoundError),
    #[error("this replica does not lead")]
    NotLeader,
    #[error(
        "the round's decision did not come within {0:?} (left running; the next round starts afresh)"
    )]
    DecideTimedOut(std::time::Duration),
}

impl RoundError {
    /// The round was refused because this replica no longer leads (or the
    /// plan moved on under it): nothing was written or pushed.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            RoundError::NotLeader | RoundError::Persistence(PersistenceError::Fenced(_))
        )
    }
}

/// Iterations a job needs in all (from its target).
fn total_iterations(job: &JobRecord) -> u64 {
    iteration_budget(job).unwrap_or(DEFAULT_ITERATIONS)
}

/// The job's own iteration budget ([`fmsched_core::JobSpec::iteration_budget`]).
fn iteration_budget(job: &JobRecord) -> Option<u64> {
    job.spec.iteration_budget()
}

/// Iterations the job is expected to need.
/// - A job that stops on a metric target: the estimate (its metric curve's
///   prediction, or its loss curve's before it has evaluated) within its
///   budget, when `estimator` — the policy plans on predicted iterations
///   ([`fmsched_core::policy::Policy::iteration_estimator`]); else its
///   budget.
/// - Any other job: the estimate from its fitted loss curve (Eq. 2) when it
///   names no iteration budget, else its target.
fn expected_iterations(job: &JobRecord, estimate: Option<&Estimate>, estimator: bool) -> u64 {
    let metric = job.spec.target.metric.is_some();
    let within = |k: u64| iteration_budget(job).map_or(k, |b| k.min(b));
    match (
        job.spec.target.max_iterations,
        estimate.and_then(|e| e.iterations),
    ) {
        _ if planned_at_budget(job, estimator) => total_iterations(job),
        _ if let Some(b) = planned_budget(job) => b,
        (_, Some(k)) if metric => within(k),
        (None, Some(k)) => within(k),
        _ => total_iterations(job),
    }
}

/// The iterations a job is planned at whatever its loss curve says: its
/// budget, for a job that names `max_iterations` and no metric target (it
/// trains to the end of it; [`expected_iterations`]).
fn planned_budget(job: &JobRecord) -> Option<u64> {
    (job.spec.target.metric.is_none() && job.spec.target.max_iterations.is_some())
        .then(|| total_iterations(job))
}

/// A metric-target job under a policy without an iteration estimator:
/// planned at its budget, with no estimate (nor its spread) in the plan.
fn planned_at_budget(job: &JobRecord, estimator: bool) -> bool {
    !estimator && job.spec.target.metric.is_some()
}

/// The scheduling settings in force: the configuration's, with the policy
/// an admin set live (`AdminService.SetPolicy`, validated when set). A
/// stored policy this build cannot run (a knob removed in an upgrade) is
/// dropped from `admin` with an error in the log, and the configuration's
/// runs.
fn in_force(state: &Service, admin: &mut crate::persistence::AdminState) -> SchedulingConfig {
    let base = &state.config.scheduling;
    let s = base.with_setting(admin.policy.as_ref());
    if let Err(e) = s.build_policy() {
        tracing::error!(error = %e, policy = %s.policy,
            "the policy set through the admin API cannot run; running the configured one");
        admin.policy = None;
        return base.clone();
    }
    s
}

/// The policy of settings in force.
fn policy(s: &SchedulingConfig) -> Box<dyn Policy + Send + Sync> {
    s.build_policy().expect("checked by in_force")
}

/// What the first three phases leave: observed, loaded, decided.
struct Decided {
    scheduling: SchedulingConfig,
    observed: Observed,
    inputs: inputs::Inputs,
    decision: round::Decision,
    solve_s: f64,
}

/// Observe, load the inputs and decide: the part a committing round and a
/// look-ahead share. `None` when no time table could be had.
async fn observe_and_decide(
    state: &Service,
    lut: &Arc<Lut>,
    est: &EstimatorClient,
    kind: RoundKind,
    now: DateTime<Utc>,
) -> Result<Option<Decided>, RoundError> {
    enter_phase(state, Some(phase::OBSERVE));
    let mut observed = observe::observe(state, lut, est, kind, now).await?;
    let sched = in_force(state, &mut observed.admin);
    enter_phase(state, Some(phase::LOAD_INPUTS));
    let Some(inputs) =
        inputs::load(state, lut, est, &observed, policy(&sched).as_ref(), now).await?
    else {
        return Ok(None);
    };
    enter_phase(state, Some(phase::DECIDE));
    let (decision, solve_s) = decide(inputs.clone_parts(policy(&sched))).await?;
    Ok(Some(Decided {
        scheduling: sched,
        observed,
        inputs,
        decision,
        solve_s,
    }))
}

/// Ymir §6.2's look-ahead: predicts the round expected at `switch_at` from
/// what is persisted and sends `PrepareSwitch` hints for the tasks it would
/// start. Writes nothing. Returns the hints sent.
pub async fn look_ahead(
    state: &Service,
    lut: &Arc<Lut>,
    est: &EstimatorClient,
    switch_at: DateTime<Utc>,
) -> Result<usize, RoundError> {
    state.leadership.fence().ok_or(RoundError::NotLeader)?;
    let kind = RoundKind::LookAhead { switch_at };
    match observe_and_decide(state, lut, est, kind, Utc::now()).await? {
        Some(d) => {
            hint(
                state,
                &d.observed,
                &d.inputs,
                &d.decision.outcome,
                switch_at,
            )
            .await
        }
        None => Ok(0),
    }
}

/// One scheduling round (see the module docs).
pub async fn run_round(
    state: &Service,
    lut: &Arc<Lut>,
    est: &EstimatorClient,
) -> Result<RoundReport, RoundError> {
    // The term this round works under: its commit is fenced by it.
    let fence = state.leadership.fence().ok_or(RoundError::NotLeader)?;
    // The prompt lane decides on the same plan: one at a time.
    let _one = state.leader.prompt_lane.round_lock.lock().await;
    let now = Utc::now();
    let Some(Decided {
        scheduling,
        observed,
        inputs,
        decision,
        solve_s,
    }) = observe_and_decide(state, lut, est, RoundKind::Commit, now).await?
    else {
        return Ok(RoundReport::default()); // no time table: the plan stays
    };
    let writes = plan_writes(
        &observed,
        &inputs,
        &decision.outcome,
        &gang_ports(state),
        now,
    );
    enter_phase(state, Some(phase::COMMIT));
    let generation = state
        .persistence
        .commit_round(&fence, observed.current.generation, &writes, now)
        .await?;
    // A deposed leader pushes nothing, even a plan it committed in time.
    let leads = state.leadership.fence().as_ref() == Some(&fence);
    *state
        .leader
        .prompt_lane
        .fair_share
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = writes.service.fair_share_gpus.clone();
    if leads {
        enter_phase(state, Some(phase::PUSH_PLANS));
        push_committed(
            state,
            &observed,
            &writes,
            &writes.service.leases.iter().copied().collect(),
            &inputs.t.footprints(),
            generation,
            fence.epoch,
        )
        .await?;
    }
    // What was committed is accounted (and its merge outcomes taught to
    // the estimator) once the agents have their plans.
    enter_phase(state, Some(phase::AFTER_COMMIT));
    after_commit(
        state, est, &observed, &inputs, &decision, solve_s, generation,
    )
    .await;
    state
        .leader
        .deadline_waits
        .after_round(&inputs.t.view, &decision);
    if !leads {
        return Err(RoundError::NotLeader);
    }
    Ok(RoundReport {
        generation,
        jobs: observed.live.len(),
        running: writes.assignments.iter().filter(|a| !a.profile).count(),
        completed: observed.completed,
        failed: observed.failed,
        scheduling: Some(scheduling),
    })
}

/// Pushes a committed plan (`w.assignments` under `generation`) to every
/// node, with what its tasks need beyond their assignments.
async fn push_committed(
    state: &Service,
    o: &Observed,
    w: &crate::persistence::RoundWrites,
    leases: &BTreeMap<JobId, DateTime<Utc>>,
    footprints: &BTreeMap<JobId, fmsched_core::policy::GpuFootprint>,
    generation: i64,
    epoch: i64,
) -> Result<(), RoundError> {
    let (live, progress, merges, init_weights) = plan_context(state, o, w).await?;
    let prompt_banks = prompt_bank::for_plan(state, &live, &w.assignments, &progress).await?;
    let closed: BTreeSet<NodeId> = o
        .nodes
        .iter()
        .filter(|n| {
            let v = inputs::node_view(n, &o.admin.cordons, &o.admin.loans);
            v.drained || v.cordoned || v.state == fmsched_core::NodeState::Offline
        })
        .map(|n| n.record.id.clone())
        .collect();
    push::push_plans(
        state,
        &push::PlanView {
            live: &live,
            assignments: &w.assignments,
            progress: &progress,
            merges: &merges,
            init_weights: &init_weights,
            frozen_layers: &o.frozen_layers,
            leases,
            footprints,
            prompt_banks: &prompt_banks,
            closed: &closed,
            fresh: &o.fresh_pending(),
        },
        generation,
        epoch,
    );
    Ok(())
}

/// What decide needs, owned (it runs on the blocking pool).
pub(crate) struct DecideParts {
    view: round::ClusterView,
    prepared: round::Prepared,
    estimates: round::Estimates,
    config: round::RoundConfig,
    policy: Box<dyn Policy + Send + Sync>,
}

impl inputs::Inputs {
    fn clone_parts(&self, policy: Box<dyn Policy + Send + Sync>) -> DecideParts {
        DecideParts {
            view: self.t.view.clone(),
            prepared: self.prepared.clone(),
            estimates: self.estimates.clone(),
            config: self.config.clone(),
            policy,
        }
    }
}

/// Phase 3: the shared round's decision, on the blocking pool (CPU work).
/// Returns it with the seconds it took.
pub(crate) async fn decide(p: DecideParts) -> Result<(round::Decision, f64), RoundError> {
    blocking_within(DECIDE_GRACE, move || {
        let started = std::time::Instant::now();
        let policy = p.policy;
        let d = decide_round(
            &p.view,
            &p.prepared,
            &p.estimates,
            policy.as_ref(),
            &p.config,
        )?;
        Ok((d, started.elapsed().as_secs_f64()))
    })
    .await?
}

/// Runs `f` on the blocking pool and waits at most `grace` for it. A
/// decision that does not come is left running (it cannot be stopped)
/// and the round given up ([`RoundError::DecideTimedOut`]); the next
/// starts afresh.
pub(crate) async fn blocking_within<T: Send + 'static>(
    grace: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RoundError> {
    match tokio::time::timeout(grace, tokio::task::spawn_blocking(f)).await {
        Ok(joined) => joined.map_err(|e| RoundError::Join(e.to_string())),
        Err(_) => Err(RoundError::DecideTimedOut(grace)),
    }
}

/// The shared round's first phase as the live round runs it (a golden test
/// holds it to fmsim's).
pub fn prepare_round(
    view: &round::ClusterView,
    policy: &dyn Policy,
    config: &round::RoundConfig,
) -> round::Prepared {
    round::prepare(view, policy, config)
}

/// The shared round's decision as the live round runs it (a golden test
/// holds it to fmsim's).
pub fn decide_round(
    view: &round::ClusterView,
    prepared: &round::Prepared,
    estimates: &round::Estimates,
    policy: &dyn Policy,
    config: &round::RoundConfig,
) -> Result<round::Decision, round::RoundError> {
    round::decide(view, prepared, estimates, policy, config)
}

/// The round settings and the policy the configuration gives the live
/// round.
pub fn round_setup(
    config: &crate::config::Config,
) -> (round::RoundConfig, Box<dyn Policy + Send + Sync>) {
    (
        inputs::round_config(config),
        config
            .scheduling
            .build_policy()
            .expect("validated at start-up"),
    )
}

/// Why no set of `nodes` can ever hold a job of `spec` under the
/// configuration's round settings (the round's own rule,
/// [`round::never_fits`]), or None if one can. Every registered node counts,
/// in any state (an Offline node may come back); with none registered yet
/// nothing is said. Submission reports it; the job is kept and waits for
/// such nodes with an `unschedulable` event.
pub fn never_fits_on(
    config: &crate::config::Config,
    nodes: &[crate::registry::LiveNode],
    spec: &fmsched_core::JobSpec,
) -> Option<String> {
    let families: Vec<(u32, String)> = nodes
        .iter()
        .filter(|n| !n.record.gpus.is_empty())
        .map(|n| (n.record.gpus.len() as u32, crate::registry::node_family(n)))
        .collect();
    let shapes: Vec<(u32, &str)> = families.iter().map(|(g, f)| (*g, f.as_str())).collect();
    let asked = spec
        .resources
        .gpu_model
        .as_deref()
        .map(fmsched_estimator::analytic::gpu_family);
    round::never_fits(
        spec.resources.replica(),
        spec.resources.min_gpus,
        asked.as_deref(),
        &shapes,
        inputs::round_config(config).max_nodes_per_group,
    )
}

/// The shipped throughput table (built once): the rounds' in-process
/// estimates and submit-time admission read the same one.
pub fn shipped_lut() -> Result<Arc<Lut>, String> {
    static LUT: std::sync::OnceLock<Result<Arc<Lut>, String>> = std::sync::OnceLock::new();
    LUT.get_or_init(|| {
        analytic::default_lut()
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })
    .clone()
}
