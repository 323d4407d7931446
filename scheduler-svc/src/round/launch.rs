//! What a plan tells a node to run: rendezvous ports and addresses of
//! gangs, each task's launch context (initial weights, resume points),
//! and the look-ahead's standby hints.

use crate::registry::master_addr;
use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::round::RoundOutcome;
use fmsched_core::{JobId, JobState};

use super::observe::Observed;
use crate::persistence::{JobRecord, MergeRecord};
use crate::round::RoundError;
use crate::round::writes::{decided, incarnation, restarted, training_assignments, warm_merges};
use crate::service::Service;

/// `scheduling.gang_ports` (validated at start-up; the default range if
/// not).
pub(crate) fn gang_ports(state: &Service) -> std::ops::RangeInclusive<u16> {
    state
        .config
        .scheduling
        .gang_port_range()
        .unwrap_or(29500..=29999)
}

/// What pushing a plan needs beyond its assignments: the live jobs and
/// their progress (resume paths), the merges in force (decided now
/// included), and the output weights a temporal B starts from.
pub(crate) async fn plan_context(
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
pub(crate) async fn hint(
    state: &Service,
    o: &Observed,
    inputs: &super::inputs::Inputs,
    outcome: &RoundOutcome,
    switch_at: DateTime<Utc>,
) -> Result<usize, RoundError> {
    let t = &inputs.t;
    let mut assignments = training_assignments(t, outcome);
    let address = |n: &fmsched_core::NodeId| master_addr(&o.nodes, n);
    super::gangs::assign_ports(
        &mut assignments,
        &o.current.assignments,
        address,
        &gang_ports(state),
        |j| incarnation(o, j),
        &restarted(t, outcome),
        &super::gangs::ports_alive(&o.nodes, address),
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
    let prompt_banks =
        super::prompt_bank::for_plan(state, &o.live, &assignments, &o.progress).await?;
    let view = super::push::PlanView {
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
    Ok(super::push::send_switch_hints(
        state, &view, &held, switch_at,
    ))
}
