//! What a committing round writes besides its plan: new merges and warm
//! starts, transitions and notes, predictions and leases, service
//! accounting's inputs, queue gauges; and what follows a commit (the
//! estimator taught, metrics, the Prompt Bank).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::round::RoundOutcome;
use fmsched_core::{JobId, JobState, round};

use super::observe::Observed;
use crate::estimates::EstimatorClient;
use crate::metrics::QueueGauges;
use crate::persistence::{Assignment, MergeRecord, NewMerge, ServiceUpdate};
use crate::registry::master_addr;
use crate::service::Service;

/// A merge decided this round as the records it will be read back as
/// (active, not yet guarded or measured).
pub(crate) fn decided(m: &NewMerge) -> MergeRecord {
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
pub(crate) fn warm_merges<'a>(
    t: &'a super::inputs::Translated,
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
pub(crate) fn plan_writes(
    o: &Observed,
    inputs: &super::inputs::Inputs,
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
                .extend(super::gangs::assignments(&[t.jobs[r.job]], &parts, true));
        }
    }
    let address = |n: &fmsched_core::NodeId| master_addr(&o.nodes, n);
    let starved = super::gangs::assign_ports(
        &mut w.assignments,
        &o.current.assignments,
        address,
        gang_ports,
        |j| incarnation(o, j),
        &restarted(t, outcome),
        &super::gangs::ports_alive(&o.nodes, address),
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
pub(crate) async fn account_observed(state: &Service, est: &EstimatorClient, o: &Observed) {
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
pub(crate) async fn after_commit(
    state: &Service,
    est: &EstimatorClient,
    o: &Observed,
    inputs: &super::inputs::Inputs,
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
pub(crate) fn training_assignments(
    t: &super::inputs::Translated,
    outcome: &RoundOutcome,
) -> Vec<Assignment> {
    outcome
        .groups
        .iter()
        .filter_map(|g| {
            let parts = t.parts(&g.gpus)?;
            let trainers: Vec<JobId> = g.trainers().iter().map(|&v| t.jobs[v]).collect();
            Some(super::gangs::assignments(&trainers, &parts, false))
        })
        .flatten()
        .collect()
}

/// Which run of a job a gang's port is for: the sequence number of its
/// newest event, which every stop (a suspension, a retry) moves on.
pub(crate) fn incarnation(o: &Observed, job: JobId) -> i64 {
    o.live.get(&job).map_or(0, |j| j.last_event_seq)
}

/// Jobs whose processes the outcome restarts where they run: the members
/// of its new merges (a new joint process, or A now evaluating B).
pub(crate) fn restarted(t: &super::inputs::Translated, outcome: &RoundOutcome) -> BTreeSet<JobId> {
    outcome
        .groups
        .iter()
        .filter(|g| g.new_merge.is_some())
        .flat_map(|g| g.jobs.iter().map(|&v| t.jobs[v]))
        .collect()
}
