//! The scheduler's Prometheus metrics: the counters and gauges the round
//! loop, the prompt lane and the agent sessions update
//! ([`SchedulerMetrics`]), and their exposition on `/metrics`
//! ([`render_metrics`]; job counts and SLO figures are read from
//! Postgres at scrape time). The metric names and labels are an interface
//! users scrape: `fmsched_*` here, `process_*` from the runtime.
//!
//! Owns: what is counted and how it is rendered. Does not own: when a
//! round runs or what it decides (`round`), or the stuck-round watch
//! (`round::phases`, which reads the phase recorded here).

use std::collections::BTreeMap;

use fmsched_core::JobState;
use fmsched_runtime::metrics::{Exposition, Kind};

use crate::persistence::{Persistence, SloReport};
use crate::registry::LiveNode;

/// Counters of the scheduling loop, rendered on `/metrics`.
#[derive(Debug, Default)]
pub struct SchedulerMetrics {
    inner: std::sync::Mutex<MetricValues>,
}

#[derive(Clone, Debug, Default)]
pub struct MetricValues {
    pub rounds: u64,
    pub round_seconds_sum: f64,
    pub last_round_seconds: f64,
    pub solver_seconds_sum: f64,
    pub last_solver_seconds: f64,
    pub fallbacks: u64,
    /// MILP solves abandoned for not returning long past their time limit.
    pub solver_abandoned: u64,
    pub context_switches: u64,
    pub completed: u64,
    pub failed: u64,
    pub retries: u64,
    pub queue_length: u64,
    /// Groups the last round's policy gave GPUs that placement found no
    /// room for (their jobs wait for the next round).
    pub unplaced_groups: u64,
    pub model_variables: u64,
    pub merges_temporal: u64,
    pub merges_spatial: u64,
    pub guard_splits: u64,
    /// Kept temporal merges split because B would finish sooner alone.
    pub merges_released: u64,
    pub estimator_fallbacks: u64,
    pub prewarm_hints: u64,
    /// Rounds whose commit was refused: the writer no longer led, or the
    /// plan moved on under it.
    pub fenced_rounds: u64,
    /// Groups the policy placed where this service cannot run them (over
    /// several nodes): their jobs wait, with an event.
    pub unexecutable_placements: u64,
    /// Merge outcomes sent to the estimator's gain regression.
    pub transfer_outcomes: u64,
    /// AutoSched tunings run, configurations adopted, and the last
    /// tuning's predicted gain and wall seconds.
    pub autosched_tunings: u64,
    pub autosched_adopted: u64,
    pub autosched_last_gain: f64,
    pub autosched_last_seconds: f64,
    /// The last measured realised gain of an adoption (0: none yet).
    pub autosched_realised_gain: f64,
    /// Registrations refused because another agent process holds a live
    /// session on the node id.
    pub duplicate_registrations: u64,
    /// Registrations refused for their credentials (a node token for
    /// another node, a wrong join token).
    pub refused_registrations: u64,
    /// Agent messages over the limits (the session was closed).
    pub refused_messages: u64,
    /// Telemetry values outside physical bounds, read as unknown.
    pub telemetry_out_of_range: u64,
    /// Sessions closed for sending over the message rate.
    pub rate_limited_sessions: u64,
    /// Process reports ignored because the reporting node was never given
    /// the job (forged or misrouted), counted once per round they appear in.
    pub ignored_reports: u64,
    /// Per queue after the last round: GPUs it deserved, GPUs its jobs
    /// could use, GPUs the plan gives its jobs (the quota pass's view;
    /// crate::queue). Empty when no quota pass ran.
    pub queues: BTreeMap<String, QueueGauges>,
    /// The phase the round in progress is in, and since when (None between
    /// rounds): what the stuck-round watch reports.
    pub round_phase: Option<(&'static str, std::time::Instant)>,
    /// Seconds of each phase the round in progress has left, in order.
    pub phases_in_progress: Vec<(&'static str, f64)>,
    /// Seconds of each phase of the last committing round (observe, load
    /// inputs, decide, commit, push plans, after commit), and their sums
    /// over all committing rounds: where a round's time goes.
    pub last_round_phases: BTreeMap<&'static str, f64>,
    pub round_phase_seconds_sum: BTreeMap<&'static str, f64>,
    /// Rounds whose decision did not come within [`crate::round::DECIDE_GRACE`].
    pub decide_timeouts: u64,
    /// Tuned prompts filed in the Prompt Bank, and evicted from it
    /// (committed rounds).
    pub prompt_bank_filed: u64,
    pub prompt_bank_evicted: u64,
    /// Prompt Bank indexes built from the stored prompts (a new leader, a
    /// failed commit, `round(√C)` moved).
    pub prompt_bank_builds: u64,
    /// Prompts in each model's index the leader holds.
    pub prompt_bank_prompts: BTreeMap<String, u64>,
    /// Prompt lane passes that decided (a request was pending).
    pub prompt_decisions: u64,
    /// Seconds those decisions took (pools to GPUs), summed, and the most.
    pub prompt_decision_seconds_sum: f64,
    pub prompt_decision_seconds_max: f64,
    /// Seconds of whole lane passes (observe, decide, commit, push), summed.
    pub prompt_pass_seconds_sum: f64,
    /// Requests the lane started on a warm process of their model (hits) /
    /// loading the model afresh (misses).
    pub prompt_warm_starts: u64,
    pub prompt_cold_starts: u64,
    /// Requests waiting for warm GPUs that free up in time (last pass).
    pub prompt_delayed: u64,
}

/// One queue's figures after a round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueGauges {
    pub deserved: u32,
    pub demand: u32,
    pub planned: u32,
}

impl SchedulerMetrics {
    pub fn update(&self, f: impl FnOnce(&mut MetricValues)) {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn values(&self) -> MetricValues {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Renders the scheduler's metrics: the loop's counters (`metrics`), the
/// nodes the registry holds, the leader's epoch, and job counts and SLO
/// figures read from Postgres at scrape time (left out when it does not
/// answer).
pub async fn render_metrics(
    persistence: &Persistence,
    metrics: &SchedulerMetrics,
    nodes: &[LiveNode],
    leader_epoch: i64,
) -> String {
    let mut e = Exposition::default();
    e.family("fmsched_jobs", Kind::Gauge, "Jobs by state.");
    if let Ok(counts) = persistence.job_counts_by_state().await {
        for st in JobState::ALL {
            e.sample(
                "fmsched_jobs",
                &[("state", st.as_str())],
                counts.get(&st).copied().unwrap_or(0) as f64,
            );
        }
    }
    let v = metrics.values();
    queue_families(&mut e, &v);
    prompt_families(&mut e, &v);
    node_families(&mut e, nodes);
    counter_families(&mut e, &v);
    round_families(&mut e, &v, leader_epoch as f64);
    if let Ok(r) = persistence.slo_report().await {
        slo_families(&mut e, &r);
    }
    e.process();
    e.finish()
}

/// Each queue's deserved, demanded and planned GPUs after the last round.
fn queue_families(e: &mut Exposition, v: &MetricValues) {
    for (metric, help, pick) in [
        (
            "fmsched_queue_deserved_gpus",
            "GPUs each queue deserved in the last round (its guarantee, then its share by weight, within its limit).",
            (|g: &QueueGauges| g.deserved) as fn(&QueueGauges) -> u32,
        ),
        (
            "fmsched_queue_demand_gpus",
            "GPUs each queue's jobs could use in the last round.",
            |g: &QueueGauges| g.demand,
        ),
        (
            "fmsched_queue_planned_gpus",
            "GPUs the last round's plan gives each queue's jobs.",
            |g: &QueueGauges| g.planned,
        ),
    ] {
        if v.queues.is_empty() {
            break;
        }
        e.family(metric, Kind::Gauge, help);
        for (name, g) in &v.queues {
            // The implicit queue when none is configured.
            let label = if name.is_empty() { "cluster" } else { name };
            e.sample(metric, &[("queue", label)], f64::from(pick(g)));
        }
    }
}

/// The Prompt Bank and the prompt lane.
fn prompt_families(e: &mut Exposition, v: &MetricValues) {
    e.scalar(
        "fmsched_prompt_bank_filed_total",
        Kind::Counter,
        "Tuned prompts filed in the Prompt Bank.",
        v.prompt_bank_filed as f64,
    );
    e.scalar(
        "fmsched_prompt_bank_evicted_total",
        Kind::Counter,
        "Prompts evicted from the Prompt Bank past its cap.",
        v.prompt_bank_evicted as f64,
    );
    e.scalar(
        "fmsched_prompt_bank_index_builds_total",
        Kind::Counter,
        "Prompt Bank indexes built from the stored prompts.",
        v.prompt_bank_builds as f64,
    );
    if !v.prompt_bank_prompts.is_empty() {
        e.family(
            "fmsched_prompt_bank_prompts",
            Kind::Gauge,
            "Prompts in each model's Prompt Bank index (the leader's).",
        );
        for (model, n) in &v.prompt_bank_prompts {
            e.sample(
                "fmsched_prompt_bank_prompts",
                &[("model", model)],
                *n as f64,
            );
        }
    }
    e.scalar(
        "fmsched_prompt_decisions_total",
        Kind::Counter,
        "Prompt lane passes that decided with a request pending (PromptTuner's 50 ms loop).",
        v.prompt_decisions as f64,
    );
    e.scalar(
        "fmsched_prompt_decision_seconds_sum",
        Kind::Counter,
        "Seconds the prompt lane's decisions took (Algorithms 1 and 2, then GPUs), summed.",
        v.prompt_decision_seconds_sum,
    );
    e.scalar(
        "fmsched_prompt_decision_seconds_max",
        Kind::Gauge,
        "The longest prompt lane decision so far, seconds.",
        v.prompt_decision_seconds_max,
    );
    e.scalar(
        "fmsched_prompt_pass_seconds_sum",
        Kind::Counter,
        "Seconds of whole prompt lane passes (observe, decide, commit, push), summed.",
        v.prompt_pass_seconds_sum,
    );
    e.family(
        "fmsched_prompt_starts_total",
        Kind::Counter,
        "Prompt-tuning requests the lane started: on a warm process of their model (hit) or loading it afresh (miss).",
    );
    e.sample(
        "fmsched_prompt_starts_total",
        &[("start", "warm")],
        v.prompt_warm_starts as f64,
    );
    e.sample(
        "fmsched_prompt_starts_total",
        &[("start", "cold")],
        v.prompt_cold_starts as f64,
    );
    e.scalar(
        "fmsched_prompt_delayed",
        Kind::Gauge,
        "Prompt-tuning requests waiting for warm GPUs that free up in time (last lane pass).",
        v.prompt_delayed as f64,
    );
}

/// Warm processes by model and nodes by liveness.
fn node_families(e: &mut Exposition, nodes: &[LiveNode]) {
    let mut warm: BTreeMap<&str, usize> = BTreeMap::new();
    for w in nodes.iter().flat_map(|n| &n.warm) {
        *warm.entry(w.model.as_str()).or_default() += w.gpu_uuids.len();
    }
    e.family(
        "fmsched_prompt_warm_gpus",
        Kind::Gauge,
        "Idle warm GPUs per model: processes with the model loaded waiting for a request (PromptTuner's warm pools).",
    );
    for (model, n) in &warm {
        e.sample("fmsched_prompt_warm_gpus", &[("model", model)], *n as f64);
    }
    e.family("fmsched_nodes", Kind::Gauge, "Nodes by liveness state.");
    for st in ["available", "suspect", "offline"] {
        let n = nodes.iter().filter(|x| x.state.as_str() == st).count();
        e.sample("fmsched_nodes", &[("state", st)], n as f64);
    }
}

/// The round loop's counters: rounds, solves, merges, restarts, refusals, AutoSched.
fn counter_families(e: &mut Exposition, v: &MetricValues) {
    e.scalar(
        "fmsched_autosched_tunings_total",
        Kind::Counter,
        "AutoSched tunings run (dry runs included).",
        v.autosched_tunings as f64,
    );
    e.scalar(
        "fmsched_autosched_adopted_total",
        Kind::Counter,
        "AutoSched tunings that changed the policy's knobs.",
        v.autosched_adopted as f64,
    );
    e.scalar(
        "fmsched_autosched_predicted_gain",
        Kind::Gauge,
        "The last tuning's best over active score on the predicted workload.",
        v.autosched_last_gain,
    );
    e.scalar(
        "fmsched_autosched_realised_gain",
        Kind::Gauge,
        "The objective since the last adoption over the same span before it (0: not measured yet).",
        v.autosched_realised_gain,
    );
    e.scalar(
        "fmsched_autosched_tune_seconds_last",
        Kind::Gauge,
        "Wall seconds of the last tuning.",
        v.autosched_last_seconds,
    );
    e.scalar(
        "fmsched_queue_length",
        Kind::Gauge,
        "Live jobs without GPUs after the last round.",
        v.queue_length as f64,
    );
    e.scalar(
        "fmsched_round_unplaced_groups",
        Kind::Gauge,
        "Groups the last round's policy gave GPUs that placement found no room for: their jobs wait (a fragmented cluster, or families they cannot run on held by others).",
        v.unplaced_groups as f64,
    );
    e.scalar(
        "fmsched_rounds_total",
        Kind::Counter,
        "Scheduling rounds run.",
        v.rounds as f64,
    );
    e.scalar(
        "fmsched_round_duration_seconds_sum",
        Kind::Counter,
        "Total seconds spent in rounds.",
        v.round_seconds_sum,
    );
    e.scalar(
        "fmsched_round_duration_seconds_last",
        Kind::Gauge,
        "Seconds of the last round.",
        v.last_round_seconds,
    );
    e.scalar(
        "fmsched_solver_seconds_sum",
        Kind::Counter,
        "Total seconds in the policy (MILP solve for Ymir).",
        v.solver_seconds_sum,
    );
    e.scalar(
        "fmsched_solver_seconds_last",
        Kind::Gauge,
        "Seconds of the last policy call.",
        v.last_solver_seconds,
    );
    e.scalar(
        "fmsched_solver_fallbacks_total",
        Kind::Counter,
        "Rounds whose MILP hit its time limit and used the greedy fallback.",
        v.fallbacks as f64,
    );
    e.scalar(
        "fmsched_solver_abandoned_total",
        Kind::Counter,
        "MILP solves abandoned for not returning long past their time limit (a solver bug; the greedy fallback ran).",
        v.solver_abandoned as f64,
    );
    e.scalar(
        "fmsched_round_decide_timeouts_total",
        Kind::Counter,
        "Rounds given up because their decision did not come within 60 s.",
        v.decide_timeouts as f64,
    );
    e.scalar(
        "fmsched_round_phase_seconds",
        Kind::Gauge,
        "Seconds the round in progress has been in its current phase (0 between rounds).",
        v.round_phase
            .map_or(0.0, |(_, since)| since.elapsed().as_secs_f64()),
    );
}

/// Where a round's time goes, phase by phase.
fn round_families(e: &mut Exposition, v: &MetricValues, leader_epoch: f64) {
    e.family(
        "fmsched_round_phase_duration_seconds_last",
        Kind::Gauge,
        "Seconds of each phase of the last committing round.",
    );
    for (phase, s) in &v.last_round_phases {
        e.sample(
            "fmsched_round_phase_duration_seconds_last",
            &[("phase", phase)],
            *s,
        );
    }
    e.family(
        "fmsched_round_phase_duration_seconds_sum",
        Kind::Counter,
        "Seconds of each phase summed over committing rounds.",
    );
    for (phase, s) in &v.round_phase_seconds_sum {
        e.sample(
            "fmsched_round_phase_duration_seconds_sum",
            &[("phase", phase)],
            *s,
        );
    }
    e.scalar(
        "fmsched_solver_model_variables",
        Kind::Gauge,
        "Variables of the last MILP.",
        v.model_variables as f64,
    );
    e.family(
        "fmsched_merges_total",
        Kind::Counter,
        "Merges decided, by mode.",
    );
    e.sample(
        "fmsched_merges_total",
        &[("mode", "temporal")],
        v.merges_temporal as f64,
    )
    .sample(
        "fmsched_merges_total",
        &[("mode", "spatial")],
        v.merges_spatial as f64,
    );
    e.scalar(
        "fmsched_merge_guard_splits_total",
        Kind::Counter,
        "Merges split by the merge guard (no accuracy gain in two epochs).",
        v.guard_splits as f64,
    );
    e.scalar(
        "fmsched_merges_released_total",
        Kind::Counter,
        "Kept temporal merges split because their waiting job would finish sooner alone.",
        v.merges_released as f64,
    );
    e.scalar(
        "fmsched_estimator_fallbacks_total",
        Kind::Counter,
        "Estimator service calls that failed; the in-process estimator answered.",
        v.estimator_fallbacks as f64,
    );
    e.scalar(
        "fmsched_prewarm_hints_total",
        Kind::Counter,
        "Pipeline-switch hints sent: tasks started in standby ahead of a round (Ymir §6.2).",
        v.prewarm_hints as f64,
    );
    e.scalar(
        "fmsched_fenced_rounds_total",
        Kind::Counter,
        "Rounds whose commit was refused because this replica no longer led or the plan moved on under it (nothing was written or pushed).",
        v.fenced_rounds as f64,
    );
    e.scalar(
        "fmsched_unexecutable_placements_total",
        Kind::Counter,
        "Groups the policy placed over more nodes than scheduling.max_nodes_per_job allows (the jobs wait, with an event).",
        v.unexecutable_placements as f64,
    );
    e.scalar(
        "fmsched_transfer_outcomes_total",
        Kind::Counter,
        "Observed merge gains sent to the estimator's transfer regression (RecordTransferOutcome).",
        v.transfer_outcomes as f64,
    );
    e.scalar(
        "fmsched_agent_duplicate_registrations_total",
        Kind::Counter,
        "Registrations refused with ALREADY_EXISTS: another agent process holds a live session on the node id.",
        v.duplicate_registrations as f64,
    );
    e.scalar(
        "fmsched_agent_refused_registrations_total",
        Kind::Counter,
        "Registrations refused for their credentials (a node token of another node, a wrong join token).",
        v.refused_registrations as f64,
    );
    e.scalar(
        "fmsched_agent_refused_messages_total",
        Kind::Counter,
        "Agent messages over the protocol's limits (the session was closed with INVALID_ARGUMENT).",
        v.refused_messages as f64,
    );
    e.scalar(
        "fmsched_agent_telemetry_out_of_range_total",
        Kind::Counter,
        "GPU telemetry values outside physical bounds (utilisation over 100 %, memory over 16 TiB, temperature over 150 °C, power not in 0..10 kW), stored as unknown.",
        v.telemetry_out_of_range as f64,
    );
    e.scalar(
        "fmsched_agent_rate_limited_sessions_total",
        Kind::Counter,
        "Agent sessions closed with RESOURCE_EXHAUSTED for sending over the message rate (1,000 at once, 200 a second).",
        v.rate_limited_sessions as f64,
    );
    e.scalar(
        "fmsched_agent_ignored_reports_total",
        Kind::Counter,
        "Process reports ignored because the reporting node was never given the job (forged or misrouted), per round.",
        v.ignored_reports as f64,
    );
    e.scalar(
        "fmsched_leader_epoch",
        Kind::Gauge,
        "Leadership term this replica holds (0 = standby).",
        leader_epoch,
    );
    e.scalar(
        "fmsched_context_switches_total",
        Kind::Counter,
        "Jobs started, moved or resized (each costs a checkpoint and a restart).",
        v.context_switches as f64,
    );
    e.family(
        "fmsched_jobs_finished_total",
        Kind::Counter,
        "Jobs completed or failed by this process.",
    )
    .sample(
        "fmsched_jobs_finished_total",
        &[("outcome", "completed")],
        v.completed as f64,
    )
    .sample(
        "fmsched_jobs_finished_total",
        &[("outcome", "failed")],
        v.failed as f64,
    );
    e.scalar(
        "fmsched_retries_total",
        Kind::Counter,
        "Failed training processes retried.",
        v.retries as f64,
    );
}

/// Deadlines met and missed by class, and best-effort JCT (from Postgres).
fn slo_families(e: &mut Exposition, r: &SloReport) {
    let by_class = |missed: bool| {
        ["slo", "soft_slo"].map(|class| {
            let (n, m) = r.finished.get(class).copied().unwrap_or((0, 0));
            (class, if missed { m } else { n })
        })
    };
    e.family(
        "fmsched_slo_jobs_finished_total",
        Kind::Counter,
        "Jobs with a deadline that ended (completed or failed), by class.",
    );
    for (class, n) in by_class(false) {
        e.sample(
            "fmsched_slo_jobs_finished_total",
            &[("class", class)],
            n as f64,
        );
    }
    e.family(
        "fmsched_slo_deadline_misses_total",
        Kind::Counter,
        "Of those, the ones that missed their deadline (failed, or completed after it), by class.",
    );
    for (class, n) in by_class(true) {
        e.sample(
            "fmsched_slo_deadline_misses_total",
            &[("class", class)],
            n as f64,
        );
    }
    let (n, missed) = r
        .finished
        .values()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    e.scalar(
        "fmsched_slo_attainment_ratio",
        Kind::Gauge,
        "Share of ended jobs with a deadline that met it (1 before any ended).",
        if n == 0 {
            1.0
        } else {
            (n - missed) as f64 / n as f64
        },
    );
    e.scalar(
        "fmsched_slo_jobs_at_risk",
        Kind::Gauge,
        "Live jobs the last round predicted to miss their deadline.",
        r.at_risk as f64,
    );
    e.scalar(
        "fmsched_best_effort_jobs_completed_total",
        Kind::Counter,
        "Best-effort jobs completed.",
        r.best_effort_completed as f64,
    );
    e.scalar(
        "fmsched_best_effort_jct_seconds_avg",
        Kind::Gauge,
        "Mean job completion time (completion - submission) of completed best-effort jobs.",
        r.best_effort_avg_jct_s,
    );
}
