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
mod memory;
mod observe;
mod prompt_bank;
pub mod prompt_lane;
mod push;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use fmsched_core::policy::Policy;
use fmsched_core::round::{self, RoundOutcome, phase};
use fmsched_core::{JobId, JobState, NodeId};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::Lut;

pub use inputs::{Translated, ViewSources, build_view};
pub use memory::LeaderMemory;
pub use prompt_bank::BankIndexes;
pub use prompt_lane::PromptLane;

use crate::config::SchedulingConfig;
use crate::estimates::Estimates;
use crate::metrics::QueueGauges;
use crate::persistence::{
    Assignment, Estimate, JobRecord, MergeRecord, NewMerge, PersistenceError, ServiceUpdate,
};
use crate::service::Service;
use observe::Observed;

/// Default iterations of a job whose target names neither iterations nor
/// epochs with a known dataset size (it stops on its metric).
const DEFAULT_ITERATIONS: u64 = 1000;

/// How long a round's decision (pure code on the blocking pool) may take
/// before the round gives up on it and the next round starts afresh: far
/// beyond any policy's time limit (MILP solves are themselves abandoned
/// [`fmsched_core::policy::solve_grace`] past theirs).
pub const DECIDE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// A round in one phase this long is reported stuck (a warning naming the
/// phase, repeated every [`STUCK_ROUND`] while it lasts).
pub const STUCK_ROUND: std::time::Duration = std::time::Duration::from_secs(30);

/// Records that the round in progress entered `phase` (None: it ended),
/// keeping the time of the phase it leaves.
fn enter_phase(state: &Service, phase: Option<&'static str>) {
    state.metrics.update(|m| {
        if let Some((left, since)) = m.round_phase.take() {
            m.phases_in_progress
                .push((left, since.elapsed().as_secs_f64()));
        }
        m.round_phase = phase.map(|p| (p, std::time::Instant::now()));
    });
}

/// Ends the round in progress. A committing round's phase times become
/// the last round's and add to the sums; a look-ahead's are dropped (it
/// commits nothing, and runs between rounds).
fn end_round(state: &Service, committing: bool) {
    enter_phase(state, None);
    state.metrics.update(|m| {
        let phases = std::mem::take(&mut m.phases_in_progress);
        if committing {
            m.last_round_phases.clear();
            for (phase, s) in phases {
                *m.last_round_phases.entry(phase).or_default() += s;
                *m.round_phase_seconds_sum.entry(phase).or_default() += s;
            }
        }
    });
}

/// Reports a round stuck in one phase for [`STUCK_ROUND`] or more (the
/// scheduler cannot interrupt a blocked query or solve; this says where
/// it is, once per [`STUCK_ROUND`] while it lasts).
async fn watch_rounds(state: Service) {
    let mut reported = None;
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        let phase = state.metrics.values().round_phase;
        let stuck = phase.map(|(_, since)| since.elapsed()).unwrap_or_default();
        if let Some(p) = stuck_phase(phase, stuck, &mut reported) {
            tracing::warn!(
                phase = p,
                stuck_s = stuck.as_secs(),
                "scheduling round stuck: no progress in this phase (no plan is committed until it ends)"
            );
        }
    }
}

/// The watch's rule: the phase to report when the round in progress
/// (`phase`, entered `stuck` ago) has spent another [`STUCK_ROUND`] in it
/// since the last report; `reported` keeps what was said of which entry.
fn stuck_phase(
    phase: Option<(&'static str, std::time::Instant)>,
    stuck: std::time::Duration,
    reported: &mut Option<(&'static str, std::time::Instant, u64)>,
) -> Option<&'static str> {
    let Some((name, since)) = phase else {
        *reported = None;
        return None;
    };
    let periods = stuck.as_secs() / STUCK_ROUND.as_secs().max(1);
    let before = match *reported {
        Some((p, s, n)) if p == name && s == since => n,
        _ => 0,
    };
    (periods > before).then(|| {
        *reported = Some((name, since, periods));
        name
    })
}

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
    est: &Estimates,
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
    est: &Estimates,
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
    est: &Estimates,
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
struct DecideParts {
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
async fn decide(p: DecideParts) -> Result<(round::Decision, f64), RoundError> {
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
async fn blocking_within<T: Send + 'static>(
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
        .map(|n| (n.record.gpus.len() as u32, inputs::node_family(n)))
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

/// A merge decided this round as the records it will be read back as
/// (active, not yet guarded or measured).
fn decided(m: &NewMerge) -> MergeRecord {
    MergeRecord {
        id: 0,
        a: m.a,
        b: m.b,
        mode: m.mode,
        gain_ab: m.gain_ab,
        gain_ba: m.gain_ba,
        active: true,
        guard_passed: false,
        observed_gain: None,
    }
}

/// The round's warm starts as temporal merges whose A is done: B is
/// launched from A's output weights (as B of a merge whose A completed,
/// [`initial_weights`]), the merge guard watches B, and both jobs' histories
/// say so.
fn warm_merges<'a>(
    t: &'a inputs::Translated,
    outcome: &'a RoundOutcome,
) -> impl Iterator<Item = NewMerge> + 'a {
    outcome.warm_starts.iter().map(|w| NewMerge {
        a: t.finished[w.from],
        b: t.jobs[w.job],
        mode: fmsched_core::policy::MergeMode::Temporal,
        gain_ab: w.gain,
        gain_ba: 0.0,
        warm: true,
    })
}

/// The plan part of the round's writes, after what it observed: the new
/// assignments (trainers and profiling runs), new merges, the plan's state
/// changes, events for jobs that cannot run here, and service accounting
/// (every live job's deserved share, the new leases).
fn plan_writes(
    o: &Observed,
    inputs: &inputs::Inputs,
    outcome: &RoundOutcome,
    gang_ports: &std::ops::RangeInclusive<u16>,
    now: DateTime<Utc>,
) -> crate::persistence::RoundWrites {
    let t = &inputs.t;
    let mut w = o.writes.clone();
    w.assignments.extend(training_assignments(t, outcome));
    for g in &outcome.groups {
        if let (Some((gab, gba)), [a, b]) = (g.new_merge, &g.jobs[..]) {
            w.new_merges.push(NewMerge {
                a: t.jobs[*a],
                b: t.jobs[*b],
                mode: g.mode,
                gain_ab: gab,
                gain_ba: gba,
                warm: false,
            });
        }
    }
    w.new_merges.extend(warm_merges(t, outcome));
    for r in &outcome.profiling {
        if let Some(parts) = t.parts(&r.gpus) {
            w.assignments
                .extend(gangs::assignments(&[t.jobs[r.job]], &parts, true));
        }
    }
    let address = |n: &fmsched_core::NodeId| master_addr(&o.nodes, n);
    let starved = gangs::assign_ports(
        &mut w.assignments,
        &o.current.assignments,
        address,
        gang_ports,
        |j| incarnation(o, j),
        &restarted(t, outcome),
        &gangs::ports_alive(&o.nodes, address),
    );
    w.transitions.extend(
        outcome
            .transitions
            .iter()
            .filter(|x| !(x.to == JobState::Running && starved.contains(&t.jobs[x.job])))
            .map(|x| (t.jobs[x.job], x.to, x.reason.clone())),
    );
    for &job in &starved {
        let why =
            "waiting: every rendezvous port of scheduling.gang_ports is taken on its rank-0 host";
        tracing::warn!(job_id = %job, "{why}");
        if o.live
            .get(&job)
            .is_some_and(|j| j.state == JobState::Running)
        {
            w.transitions.push((job, JobState::Queued, why.into()));
        }
        w.notes.push((job, "unschedulable".into(), why.into()));
    }
    w.notes.extend(
        outcome
            .unschedulable
            .iter()
            .chain(&outcome.unexecutable)
            .chain(&outcome.unplaced)
            .map(|(v, why)| (t.jobs[*v], "unschedulable".to_string(), why.clone())),
    );
    // Kept temporal merges whose waiting B would finish sooner alone.
    w.released.extend(outcome.released.iter().filter_map(|&m| {
        let rec = t.merges.get(m)?;
        Some((
            rec.clone(),
            "its second job would finish sooner alone, from scratch, on its fair share \
             of the cluster than waiting for the first"
                .to_string(),
        ))
    }));
    // A running job the round moves or resizes says so: it restarts from
    // its checkpoint with no change of state to show it.
    w.notes.extend(
        round::restarts(&t.view, &outcome.groups)
            .into_iter()
            .map(|(v, kind, note)| (t.jobs[v], kind.to_string(), note)),
    );
    // A reclaimed node is returned once nothing is planned there and its
    // agent runs no process (or is gone).
    w.returned = o
        .admin
        .loans
        .iter()
        .filter(|(_, l)| l.state == crate::persistence::LoanState::Reclaiming)
        .map(|(n, _)| n)
        .filter(|n| !w.assignments.iter().any(|a| a.node == **n))
        .filter(|n| {
            o.nodes
                .iter()
                .find(|l| l.record.id == **n)
                .is_none_or(|l| !crate::registry::runs_a_process(l))
        })
        .cloned()
        .collect();
    let live = t.view.jobs.len();
    let at = |s: f64| now + chrono::Duration::milliseconds((s * 1000.0) as i64);
    let predictions = round::predictions(&t.view, &inputs.prepared, &inputs.estimates, outcome);
    // A job newly at risk (after profiling refined its estimate, or as it
    // waits) says so once; the gauge fmsched_slo_jobs_at_risk counts them.
    for p in predictions.iter().filter(|p| p.at_risk) {
        let job = t.jobs[p.job];
        if !o.service.get(&job).is_some_and(|s| s.at_risk) {
            let why = at_risk_note(p, at);
            tracing::warn!(job_id = %job, "{why}");
            w.notes.push((job, "at_risk".into(), why));
        }
    }
    w.service = ServiceUpdate {
        fair_share_gpus: t
            .view
            .jobs
            .iter()
            .enumerate()
            .map(|(v, j)| {
                let request = inputs.prepared.offered(&inputs.config, j.requested_gpus, j);
                (
                    t.jobs[v],
                    round::fair_share(inputs.prepared.total_gpus, live, request),
                )
            })
            .collect(),
        leases: outcome
            .leases
            .iter()
            .map(|&(v, until)| (t.jobs[v], at(until)))
            .collect(),
        predictions: predictions
            .iter()
            .map(|p| (t.jobs[p.job], p.finish_in.map(at), p.at_risk))
            .collect(),
        carry_over: false,
    };
    w
}

/// The event of a job the round newly predicts to miss its deadline.
fn at_risk_note(p: &round::Prediction, at: impl Fn(f64) -> DateTime<Utc>) -> String {
    let time = |s: f64| at(s).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let deadline = p.deadline_in.map(&time).unwrap_or_default();
    match (p.finish_in, p.best_in) {
        (Some(f), _) => format!(
            "predicted to finish at {}, after its deadline {deadline}",
            time(f)
        ),
        (None, Some(b)) => format!(
            "cannot meet its deadline {deadline} any more: alone on its fastest allocation, started now, it would finish at {}",
            time(b)
        ),
        (None, None) => format!("cannot meet its deadline {deadline}: no allocation can run it"),
    }
}

/// Each queue's deserved, demanded and planned GPUs after a round.
fn queue_gauges(
    view: &round::ClusterView,
    prepared: &round::Prepared,
    out: &round::RoundOutcome,
) -> BTreeMap<String, QueueGauges> {
    let mut q: BTreeMap<String, QueueGauges> = BTreeMap::new();
    for (name, &d) in &prepared.deserved {
        q.entry(name.clone()).or_default().deserved = d;
    }
    for (name, &d) in &prepared.demand {
        q.entry(name.clone()).or_default().demand = d;
    }
    if q.is_empty() {
        return q;
    }
    for g in &out.groups {
        let names: BTreeSet<&str> = g
            .jobs
            .iter()
            .map(|&j| view.jobs[j].queue.as_str())
            .collect();
        for name in names {
            q.entry(name.to_string()).or_default().planned += g.gpus.len() as u32;
        }
    }
    q
}

/// What a committed round or lane pass observed, accounted: merge
/// outcomes taught to the estimator, completions, failures and retries
/// counted.
async fn account_observed(state: &Service, est: &Estimates, o: &Observed) {
    let mut taught = 0;
    for x in &o.outcomes {
        match est.record_transfer_outcome(x.score, x.gain).await {
            Ok(Some((intercept, slope, observed))) => {
                taught += 1;
                tracing::info!(
                    merge = x.merge,
                    score = x.score,
                    gain = x.gain,
                    intercept,
                    slope,
                    observed,
                    "merge outcome taught to the estimator"
                );
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(merge = x.merge, error = %e, "merge outcome not recorded"),
        }
    }
    state.metrics.update(|m| {
        m.completed += o.completed as u64;
        m.failed += o.failed as u64;
        m.retries += o.retried as u64;
        m.guard_splits += o.guard_splits as u64;
        m.transfer_outcomes += taught;
        m.prompt_bank_filed += o.writes.bank_adds.len() as u64;
        m.prompt_bank_evicted += o.writes.bank_evictions.len() as u64;
    });
}

/// After a commit: metrics, logs, and the merge outcomes taught to the
/// estimator's gain regression.
async fn after_commit(
    state: &Service,
    est: &Estimates,
    o: &Observed,
    inputs: &inputs::Inputs,
    d: &round::Decision,
    solve_s: f64,
    generation: i64,
) {
    let out = &d.outcome;
    let t = &inputs.t;
    let merged = |mode| {
        out.groups
            .iter()
            .filter(|g| g.new_merge.is_some() && g.mode == mode)
            .count() as u64
    };
    let (temporal, spatial) = (
        merged(fmsched_core::policy::MergeMode::Temporal),
        merged(fmsched_core::policy::MergeMode::Spatial),
    );
    account_observed(state, est, o).await;
    if out.stats.abandoned {
        tracing::error!(
            generation,
            solve_s,
            "a MILP solve did not return long past its time limit (a solver bug) and was abandoned; \
             this round used the greedy fallback"
        );
    }
    state.metrics.update(|m| {
        m.solver_seconds_sum += solve_s;
        m.last_solver_seconds = solve_s;
        m.model_variables = out.stats.variables as u64;
        m.fallbacks += u64::from(out.stats.fallback);
        m.solver_abandoned += u64::from(out.stats.abandoned);
        m.context_switches += out.switches as u64;
        m.queue_length = out.queued as u64;
        m.unplaced_groups = out.stats.unplaced as u64;
        m.merges_temporal += temporal;
        m.merges_spatial += spatial;
        m.merges_released += out.released.len() as u64;
        m.unexecutable_placements += out
            .unexecutable
            .iter()
            .map(|(v, _)| *v)
            .collect::<BTreeSet<_>>()
            .len() as u64;
        m.queues = queue_gauges(&t.view, &inputs.prepared, out);
    });
    for x in &out.transitions {
        tracing::info!(job_id = %t.jobs[x.job], to = %x.to, reason = %x.reason, generation, "job state");
    }
    for g in out.groups.iter().filter(|g| g.new_merge.is_some()) {
        let (gab, gba) = g.new_merge.unwrap_or_default();
        tracing::info!(a = %t.jobs[g.jobs[0]], b = %t.jobs[g.jobs[1]], mode = g.mode.as_str(), gain_ab = gab, gain_ba = gba, generation, "merge decided");
    }
    for (v, why) in &out.unexecutable {
        tracing::info!(job_id = %t.jobs[*v], %why, "placement not run");
    }
}

/// The trainers' assignments of the outcome's groups: one per trainer and
/// node (a gang has one per node), in rank order. A group's GPUs come from
/// the view, so every one resolves.
fn training_assignments(t: &inputs::Translated, outcome: &RoundOutcome) -> Vec<Assignment> {
    outcome
        .groups
        .iter()
        .filter_map(|g| {
            let parts = t.parts(&g.gpus)?;
            let trainers: Vec<JobId> = g.trainers().iter().map(|&v| t.jobs[v]).collect();
            Some(gangs::assignments(&trainers, &parts, false))
        })
        .flatten()
        .collect()
}

/// Which run of a job a gang's port is for: the sequence number of its
/// newest event, which every stop (a suspension, a retry) moves on.
fn incarnation(o: &Observed, job: JobId) -> i64 {
    o.live.get(&job).map_or(0, |j| j.last_event_seq)
}

/// Jobs whose processes the outcome restarts where they run: the members
/// of its new merges (a new joint process, or A now evaluating B).
fn restarted(t: &inputs::Translated, outcome: &RoundOutcome) -> BTreeSet<JobId> {
    outcome
        .groups
        .iter()
        .filter(|g| g.new_merge.is_some())
        .flat_map(|g| g.jobs.iter().map(|&v| t.jobs[v]))
        .collect()
}

/// `scheduling.gang_ports` (validated at start-up; the default range if
/// not).
fn gang_ports(state: &Service) -> std::ops::RangeInclusive<u16> {
    state
        .config
        .scheduling
        .gang_port_range()
        .unwrap_or(29500..=29999)
}

/// The address a node's peers reach it at: what its agent registered, else
/// its hostname, else its id.
pub(crate) fn master_addr(
    nodes: &[crate::registry::LiveNode],
    id: &fmsched_core::NodeId,
) -> String {
    nodes
        .iter()
        .find(|n| &n.record.id == id)
        .map(|n| &n.record)
        .and_then(|r| {
            [&r.address, &r.hostname]
                .into_iter()
                .find(|a| !a.is_empty())
                .cloned()
        })
        .unwrap_or_else(|| id.as_str().to_string())
}

/// What pushing a plan needs beyond its assignments: the live jobs and
/// their progress (resume paths), the merges in force (decided now
/// included), and the output weights a temporal B starts from.
async fn plan_context(
    state: &Service,
    o: &Observed,
    w: &crate::persistence::RoundWrites,
) -> Result<
    (
        BTreeMap<JobId, JobRecord>,
        BTreeMap<JobId, (u64, Option<String>)>,
        Vec<MergeRecord>,
        BTreeMap<JobId, String>,
    ),
    RoundError,
> {
    let mut merges = o.merges.clone();
    merges.extend(w.new_merges.iter().map(decided));
    let running: BTreeSet<JobId> = w.assignments.iter().map(|a| a.job).collect();
    let init_weights = initial_weights(
        state,
        &merges,
        &o.live,
        &running,
        &o.progress,
        &o.reported_outputs,
    )
    .await?;
    Ok((o.live.clone(), o.progress.clone(), merges, init_weights))
}

/// B of each active temporal merge that runs now, whose A is done and
/// which has no checkpoint of its own yet: the weights it starts from — A's
/// output, as A reported it (a look-ahead) or as recorded when A completed.
/// Once B has a checkpoint (trained from those weights) it resumes from
/// that alone.
async fn initial_weights(
    state: &Service,
    merges: &[MergeRecord],
    live: &BTreeMap<JobId, JobRecord>,
    running: &BTreeSet<JobId>,
    progress: &BTreeMap<JobId, (u64, Option<String>)>,
    reported: &BTreeMap<JobId, String>,
) -> Result<BTreeMap<JobId, String>, RoundError> {
    let mut out = BTreeMap::new();
    for m in merges.iter().filter(|m| {
        m.active
            && m.mode == fmsched_core::policy::MergeMode::Temporal
            && running.contains(&m.b)
            && !live.contains_key(&m.a)
            && progress.get(&m.b).and_then(|p| p.1.as_ref()).is_none()
    }) {
        let weights = match reported.get(&m.a) {
            Some(o) => Some(o.clone()),
            None => state
                .persistence
                .get_job(m.a)
                .await?
                .filter(|a| a.state == JobState::Completed)
                .and_then(|a| a.output_path),
        };
        if let Some(w) = weights.filter(|w| !w.is_empty()) {
            out.insert(m.b, w);
        }
    }
    Ok(out)
}

/// A look-ahead's hints (Ymir §6.2): the tasks the predicted plan would
/// start get a standby process on their node, launched exactly as the plan
/// will run them (B of a temporal merge from A's output weights).
async fn hint(
    state: &Service,
    o: &Observed,
    inputs: &inputs::Inputs,
    outcome: &RoundOutcome,
    switch_at: DateTime<Utc>,
) -> Result<usize, RoundError> {
    let t = &inputs.t;
    let mut assignments = training_assignments(t, outcome);
    let address = |n: &fmsched_core::NodeId| master_addr(&o.nodes, n);
    gangs::assign_ports(
        &mut assignments,
        &o.current.assignments,
        address,
        &gang_ports(state),
        |j| incarnation(o, j),
        &restarted(t, outcome),
        &gangs::ports_alive(&o.nodes, address),
    );
    let held: BTreeSet<JobId> = o
        .current
        .assignments
        .iter()
        .filter(|a| !a.profile)
        .map(|a| a.job)
        .collect();
    let running: BTreeSet<JobId> = assignments.iter().map(|a| a.job).collect();
    // The standby of a job the plan would start warm starts as it would.
    let mut merges = o.merges.clone();
    merges.extend(warm_merges(t, outcome).map(|m| decided(&m)));
    let init_weights = initial_weights(
        state,
        &merges,
        &o.live,
        &running,
        &o.progress,
        &o.reported_outputs,
    )
    .await?;
    let prompt_banks = prompt_bank::for_plan(state, &o.live, &assignments, &o.progress).await?;
    let view = push::PlanView {
        live: &o.live,
        assignments: &assignments,
        progress: &o.progress,
        merges: &o.merges,
        init_weights: &init_weights,
        frozen_layers: &o.frozen_layers,
        // Hints only start standby processes; the plan tells the lease.
        leases: &BTreeMap::new(),
        footprints: &t.footprints(),
        prompt_banks: &prompt_banks,
        // Hints carry no warm release.
        closed: &BTreeSet::new(),
        fresh: &o.fresh_pending(),
    };
    if state.leadership.fence().is_none() {
        return Ok(0); // a deposed leader sends nothing
    }
    Ok(push::send_switch_hints(state, &view, &held, switch_at))
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
        let now = tokio::time::Instant::now();
        let mut waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        waits.retain(|w| now + std::time::Duration::from_secs_f64(w.need_s.max(0.0)) <= w.by);
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
    fn after_round(&self, view: &round::ClusterView, d: &round::Decision) {
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
    fn needs(&self) -> Vec<(String, f64)> {
        let waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        waits.iter().map(|w| (w.job.clone(), w.need_s)).collect()
    }

    /// Each kept job's need and deadline on the round clock (`secs` turns
    /// an instant into the clock's seconds), for [`round::RoundClock::on_event`];
    /// jobs whose deadline can no longer be met are dropped.
    fn needs_by(&self, secs: impl Fn(tokio::time::Instant) -> f64) -> Vec<(f64, f64)> {
        let now = secs(tokio::time::Instant::now());
        let mut waits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        waits.retain(|w| now + w.need_s <= secs(w.by));
        waits.iter().map(|w| (w.need_s, secs(w.by))).collect()
    }
}

/// The round clock of the scheduling loop, on seconds since it started
/// (the first round at once): core's one rule, as fmsim's
/// (`fmsched_sim::engine::SimConfig::round_clock`). Rounds on events with
/// `scheduling.event_round_gap`; rounds for deadlines with a non-zero
/// `scheduling.deadline_round_gap`.
pub fn round_clock(s: &SchedulingConfig) -> round::RoundClock {
    let deadline_gap = s.deadline_round_gap;
    round::RoundClock::new(
        s.round_interval().as_secs_f64(),
        s.event_round_gap.map(|g| g.as_secs_f64()),
        (!deadline_gap.is_zero()).then_some(deadline_gap.as_secs_f64()),
        0.0,
    )
}

/// The round loop's clock: core's [`round::RoundClock`] (the rule fmsim
/// runs too) on seconds since the loop started.
struct LoopClock {
    epoch: tokio::time::Instant,
    rounds: round::RoundClock,
}

impl LoopClock {
    /// The first round due at once; rounds on events and for deadlines as
    /// configured (`scheduling.event_round_gap`, a non-zero
    /// `scheduling.deadline_round_gap`).
    fn new(s: &SchedulingConfig) -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            rounds: round_clock(s),
        }
    }

    /// Seconds on the clock of an instant (negative before the loop began).
    fn secs(&self, t: tokio::time::Instant) -> f64 {
        if t >= self.epoch {
            t.duration_since(self.epoch).as_secs_f64()
        } else {
            -self.epoch.duration_since(t).as_secs_f64()
        }
    }

    /// The instant of seconds on the clock.
    fn at(&self, s: f64) -> tokio::time::Instant {
        self.epoch + std::time::Duration::from_secs_f64(s.max(0.0))
    }

    /// When the next round is due.
    fn next(&self) -> tokio::time::Instant {
        self.at(self.rounds.next_s())
    }
}

/// Runs rounds every `scheduling.round_interval()` until the task is
/// aborted; with a `prewarm_lead`, a look-ahead round that long before each
/// round. A replica that does not lead runs none.
/// Sleeps until `lead` before the next round. The leader looks every
/// [`POLICY_POLL`] for a policy set live (an operator, AutoSched) whose
/// shorter interval brings that round forward, so a change out of a long
/// interval does not wait it out. With `scheduling.event_round_gap`, an
/// event ([`crate::service::Service::round_wake`]) brings it forward too.
async fn sleep_towards(state: &Service, clock: &mut LoopClock, lead: std::time::Duration) {
    loop {
        let now = tokio::time::Instant::now();
        let next = clock.next();
        let target = next.checked_sub(lead).unwrap_or(next);
        if now >= target {
            return;
        }
        let woke = tokio::select! {
            () = tokio::time::sleep_until(target.min(now + POLICY_POLL)) => false,
            () = state.leader.round_wake.notified(), if clock.rounds.wakes_on_events() => true,
        };
        if woke {
            // A submission or a task that ended: the round comes forward
            // by core's rule (for every event with rounds on events; only
            // for a job that would miss its deadline waiting, else).
            let now_s = clock.secs(tokio::time::Instant::now());
            let waits = state.leader.deadline_waits.needs_by(|t| clock.secs(t));
            if clock.rounds.on_event(now_s, waits) {
                tracing::debug!(
                    in_s = (clock.rounds.next_s() - now_s).max(0.0),
                    "an event (a submission, a task that ended, a deadline waiting) brings the next round forward"
                );
            }
            continue;
        }
        if tokio::time::Instant::now() >= target || !state.leadership.is_leader() {
            continue;
        }
        if let Ok(stored) = state.persistence.policy_setting().await {
            let s = state.config.scheduling.with_setting(stored.as_ref());
            if clock.rounds.next_within(s.round_interval().as_secs_f64()) {
                tracing::info!(policy = %s.policy, interval = ?s.round_interval(),
                    "policy set live with a shorter interval; next round brought forward");
            }
        }
    }
}

/// How often a sleeping leader looks for a policy set live.
const POLICY_POLL: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn scheduling_loop(state: Service) {
    let lut = match shipped_lut() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "no throughput table; scheduling disabled");
            return;
        }
    };
    let e = &state.config.estimates;
    let est = match Estimates::new(e.endpoint.as_deref(), e.timeout) {
        Ok(est) => est,
        Err(err) => {
            tracing::error!(error = %err, "estimator client; scheduling disabled");
            return;
        }
    };
    let est = Arc::new(est);
    if est.is_remote() {
        tracing::info!(endpoint = ?e.endpoint, "estimates from the estimator service");
    }
    // The stuck-round watch lives as long as this loop.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _watch = AbortOnDrop(tokio::spawn(watch_rounds(state.clone())));
    let _lane = AbortOnDrop(tokio::spawn(prompt_lane::lane_loop(
        state.clone(),
        lut.clone(),
        est.clone(),
    )));
    let lead = state.config.scheduling.effective_prewarm_lead();
    if !lead.is_zero() {
        tracing::info!(
            ?lead,
            "pipeline switch: look-ahead rounds send standby hints"
        );
    }
    // The settings in force: the configuration's until a round reads a
    // policy set through the admin API (its interval then paces the loop).
    let mut sched = state.config.scheduling.clone();
    let mut clock = LoopClock::new(&sched);
    loop {
        sleep_towards(&state, &mut clock, std::time::Duration::ZERO).await;
        let started = tokio::time::Instant::now();
        clock.rounds.round_started(clock.secs(started));
        if !state.leadership.is_leader() {
            continue; // a standby decides nothing
        }
        let result = run_round(&state, &lut, &est).await;
        end_round(&state, true);
        let took = started.elapsed().as_secs_f64();
        let timed_out = matches!(result, Err(RoundError::DecideTimedOut(_)));
        state.metrics.update(|m| {
            m.decide_timeouts += u64::from(timed_out);
            m.rounds += 1;
            m.round_seconds_sum += took;
            m.last_round_seconds = took;
        });
        match result {
            Ok(r) => {
                tracing::debug!(generation = r.generation, jobs = r.jobs, running = r.running,
                    completed = r.completed, failed = r.failed, took = ?started.elapsed(), "scheduling round");
                if let Some(s) = r.scheduling
                    && (s.policy != sched.policy
                        || s.knobs != sched.knobs
                        || s.interval != sched.interval)
                {
                    tracing::info!(policy = %s.policy, knobs = ?s.knobs, interval = ?s.round_interval(),
                        "policy in force changed (admin API); next round after this interval");
                    sched = s;
                    clock
                        .rounds
                        .reset_interval(sched.round_interval().as_secs_f64());
                }
            }
            Err(e) if e.is_fenced() => {
                state.metrics.update(|m| m.fenced_rounds += 1);
                tracing::warn!(error = %e, "round discarded: this replica no longer leads (nothing written or pushed)");
            }
            Err(e) => tracing::warn!(error = %e, "scheduling round failed; retrying next interval"),
        }
        // Ymir §6.2: predict the next round `lead` before it and let the
        // tasks it starts prepare their data loaders in standby.
        let lead = sched.effective_prewarm_lead();
        if lead.is_zero() {
            continue;
        }
        sleep_towards(&state, &mut clock, lead).await;
        if !state.leadership.is_leader() {
            continue;
        }
        let switch_at = Utc::now() + lead;
        let ahead = look_ahead(&state, &lut, &est, switch_at).await;
        end_round(&state, false);
        match ahead {
            Ok(hints) if hints > 0 => tracing::debug!(hints, "look-ahead round"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "look-ahead round failed; no standby hints this round")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fmsched_core::round::{ClusterView, JobView, RoundConfig};

    /// A decision that does not come within its grace gives the round up
    /// (the next starts afresh); one that comes is returned.
    #[tokio::test]
    async fn a_decision_that_does_not_come_gives_the_round_up() {
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let grace = std::time::Duration::from_millis(50);
        let out = blocking_within(grace, move || stuck.recv().is_ok()).await;
        assert!(
            matches!(out, Err(RoundError::DecideTimedOut(g)) if g == grace),
            "{out:?}"
        );
        drop(release);
        let out = blocking_within(std::time::Duration::from_secs(60), || 7).await;
        assert_eq!(out.unwrap(), 7);
    }

    /// The stuck-round watch warns once per 30 s a round stays in one
    /// phase, and afresh for a new phase.
    #[test]
    fn a_round_stuck_in_one_phase_is_reported_once_per_period() {
        let secs = std::time::Duration::from_secs;
        let since = std::time::Instant::now();
        let decide = Some(("decide", since));
        let mut said = None;
        assert_eq!(stuck_phase(decide, secs(10), &mut said), None);
        assert_eq!(stuck_phase(decide, secs(31), &mut said), Some("decide"));
        assert_eq!(stuck_phase(decide, secs(45), &mut said), None);
        assert_eq!(stuck_phase(decide, secs(61), &mut said), Some("decide"));
        let commit = Some(("commit", since + secs(62)));
        assert_eq!(stuck_phase(commit, secs(1), &mut said), None);
        assert_eq!(stuck_phase(commit, secs(30), &mut said), Some("commit"));
        assert_eq!(stuck_phase(None, secs(0), &mut said), None);
        assert_eq!(said, None, "between rounds nothing is kept");
    }
    use fmsched_core::{GpuUuid, NodeId};

    fn id(n: u8) -> JobId {
        format!("01a20000-0000-7000-8000-0000000000{n:02}")
            .parse()
            .unwrap()
    }

    fn job(n: u8, gpus: u32, holds: &[(usize, u32)]) -> JobView {
        let state = if holds.is_empty() {
            JobState::Queued
        } else {
            JobState::Running
        };
        JobView {
            submitted_at: -f64::from(n),
            holds: holds.to_vec(),
            ..round::testkit::job(&id(n).to_string(), &format!("t{n}"), state, gpus)
        }
    }

    /// Rounds for deadlines weigh only jobs still waiting for their first
    /// start, on the round's own estimate once they have one: after a
    /// round, a job it started and a job no longer live leave the list,
    /// and a waiting job's need becomes its time alone at its request with
    /// its start (admission's bound was lower), as fmsim weighs it.
    #[test]
    fn deadline_waits_keep_only_waiting_jobs_at_the_rounds_estimate() {
        let view = round::testkit::view(
            vec![round::testkit::node("x", 4)],
            vec![job(1, 4, &[(0, 0), (0, 1), (0, 2), (0, 3)]), job(2, 2, &[])],
        );
        let cfg = RoundConfig {
            profiling: false,
            policy: "srtf".into(),
            ..Default::default()
        };
        let policy = fmsched_core::policy::baselines::by_name("srtf").unwrap();
        let prepared = prepare_round(&view, policy.as_ref(), &cfg);
        let estimates = round::testkit::estimates(&prepared, 3600.0);
        let d = decide_round(&view, &prepared, &estimates, policy.as_ref(), &cfg).unwrap();
        let started: Vec<&str> = d
            .plan
            .entries
            .iter()
            .filter(|e| e.gpus > 0)
            .flat_map(|e| e.jobs.iter().map(|&k| d.snapshot.jobs[k].id.as_str()))
            .collect();
        let (one, two) = (id(1).to_string(), id(2).to_string());
        assert_eq!(
            started,
            vec![one.as_str()],
            "the shorter running job keeps the node"
        );
        let waits = DeadlineWaits::default();
        assert!(waits.is_empty(), "a task's end wakes nothing");
        let by = tokio::time::Instant::now() + std::time::Duration::from_secs(7200);
        waits.add(&id(1), 900.0, by);
        waits.add(&id(2), 1000.0, by);
        waits.add(&id(9), 100.0, by);
        waits.after_round(&view, &d);
        // Job 2 alone at its 2 GPUs: 3,600 GPU-s of work in 1,800 s, and
        // its start (30 s).
        assert_eq!(waits.needs(), vec![(two, 1830.0)]);
        assert!(!waits.is_empty());
    }

    /// The round's writes of `outcome` on nothing observed.
    fn writes_of(
        t: Translated,
        prepared: round::Prepared,
        estimates: round::Estimates,
        config: RoundConfig,
        outcome: &RoundOutcome,
    ) -> crate::persistence::RoundWrites {
        let inputs = inputs::Inputs {
            t,
            prepared,
            estimates,
            config,
        };
        let o = observe::tests::empty_observed();
        plan_writes(&o, &inputs, outcome, &(29500..=29999), Utc::now())
    }

    /// A kept temporal merge the round releases (B would finish sooner
    /// alone than behind a long A) is written as a split with the round's
    /// reason, for the persistence to end it and tell both jobs.
    #[test]
    fn tail_a_released_merge_is_written_as_a_split_with_its_reason() {
        let mut a = job(1, 8, &[(0, 0), (0, 1)]);
        a.progress = 0.1;
        let b = job(2, 8, &[]);
        let merge = crate::persistence::MergeRecord {
            id: 7,
            a: id(1),
            b: id(2),
            mode: fmsched_core::policy::MergeMode::Temporal,
            gain_ab: 0.2,
            gain_ba: 0.0,
            active: true,
            guard_passed: false,
            observed_gain: None,
        };
        let t = Translated {
            view: ClusterView {
                now: 0.0,
                nodes: vec![round::testkit::node("x", 16)],
                jobs: vec![a, b],
                merges: vec![round::MergeView {
                    a: 0,
                    b: 1,
                    mode: fmsched_core::policy::MergeMode::Temporal,
                }],
                finished: Vec::new(),
            },
            jobs: vec![id(1), id(2)],
            nodes: vec![(
                NodeId::try_from("x".to_string()).unwrap(),
                (0..16).map(|g| GpuUuid(format!("x-G{g}"))).collect(),
            )],
            merges: vec![merge.clone()],
            finished: Vec::new(),
        };
        let cfg = RoundConfig {
            profiling: false,
            policy: "ymir".into(),
            ..Default::default()
        };
        let policy = fmsched_core::policy::baselines::by_name("ymir").unwrap();
        let prepared = prepare_round(&t.view, policy.as_ref(), &cfg);
        let mut estimates = round::testkit::estimates(&prepared, 3600.0);
        estimates.jobs[0] = round::testkit::linear(&prepared, 100_000.0);
        estimates.kept_b_alone = vec![round::testkit::linear(&prepared, 3600.0)];
        let d = decide_round(&t.view, &prepared, &estimates, policy.as_ref(), &cfg).unwrap();
        assert_eq!(d.outcome.released, vec![0]);
        let w = writes_of(t, prepared, estimates, cfg, &d.outcome);
        assert_eq!(w.released.len(), 1);
        assert_eq!(w.released[0].0, merge);
        assert!(
            w.released[0].1.contains("would finish sooner alone"),
            "{}",
            w.released[0].1
        );
    }

    /// A group the policy spreads over two nodes is not run by this
    /// service: its job gets an event naming the nodes and no assignment,
    /// never a silent drop; the others are assigned their GPUs by UUID.
    #[test]
    fn a_placement_this_service_cannot_run_is_an_event_not_a_silent_drop() {
        let nodes = ["x", "y"];
        let t = Translated {
            view: ClusterView {
                now: 0.0,
                nodes: nodes.iter().map(|n| round::testkit::node(n, 4)).collect(),
                jobs: vec![
                    job(1, 2, &[(0, 0), (0, 1)]),
                    job(2, 2, &[(1, 0), (1, 1)]),
                    job(3, 3, &[]),
                ],
                merges: Vec::new(),
                finished: Vec::new(),
            },
            jobs: vec![id(1), id(2), id(3)],
            nodes: nodes
                .iter()
                .map(|n| {
                    (
                        NodeId::try_from(n.to_string()).unwrap(),
                        (0..4).map(|g| GpuUuid(format!("{n}-G{g}"))).collect(),
                    )
                })
                .collect(),
            merges: Vec::new(),
            finished: Vec::new(),
        };
        let cfg = RoundConfig {
            profiling: false,
            max_nodes_per_group: Some(1),
            policy: "srtf".into(),
            ..Default::default()
        };
        let policy = fmsched_core::policy::baselines::by_name("srtf").unwrap();
        let prepared = prepare_round(&t.view, policy.as_ref(), &cfg);
        let estimates = round::testkit::estimates(&prepared, 3600.0);
        let d = decide_round(&t.view, &prepared, &estimates, policy.as_ref(), &cfg).unwrap();
        let w = writes_of(t, prepared, estimates, cfg, &d.outcome);
        let assigned: Vec<JobId> = w.assignments.iter().map(|a| a.job).collect();
        assert_eq!(assigned, vec![id(1), id(2)]);
        assert_eq!(
            w.assignments[1].gpus,
            vec![GpuUuid("y-G0".into()), GpuUuid("y-G1".into())]
        );
        assert_eq!(w.notes.len(), 1, "{:?}", w.notes);
        let (job, kind, why) = &w.notes[0];
        assert_eq!((job, kind.as_str()), (&id(3), "unschedulable"));
        assert!(why.contains("over nodes x, y"), "{why}");
    }
}
