//! Phases 2 and 3 in order: [`decide`] builds the snapshot, runs the
//! policy, checks the plan and interprets it. The one file that calls the
//! phase files; they call only the shared types and rules.

use std::collections::BTreeSet;

use super::interpret::{interpret, released_merges};
use super::outcome::{Decision, Estimates, Prepared, RoundError, WarmStart};
use super::snapshot::{chosen_warm_starts, snapshot_with};
use super::view::{ClusterView, RoundConfig};
use crate::policy::{MergeMode, Plan, Policy, Snapshot};

/// Phases 2 and 3 (see the module docs).
pub fn decide(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    policy: &dyn Policy,
    cfg: &RoundConfig,
) -> Result<Decision, RoundError> {
    let chosen = chosen_warm_starts(prepared, estimates);
    let snapshot = snapshot_with(view, prepared, estimates, cfg, &chosen)?;
    let plan = within_budgets(&snapshot, policy.schedule(&snapshot));
    plan.consistency_check(&snapshot)
        .map_err(RoundError::InconsistentPlan)?;
    let mut outcome = interpret(view, prepared, estimates, &snapshot, &plan, policy, cfg);
    outcome.released = released_merges(view, prepared, estimates, &snapshot, &outcome);
    if !chosen.is_empty() {
        // Those that start training now (not profiling: a profiling run
        // holds no group) outside a merge: alone, or beside another job on
        // a shared GPU. A merge's jobs train as the pair's times say (a
        // spatial pair's joint process and a temporal B from other
        // weights), and a job takes part in one merge, so A of a new
        // temporal pair starts from the pre-trained weights too.
        let starting: BTreeSet<usize> = outcome
            .groups
            .iter()
            .filter(|g| matches!(g.mode, MergeMode::Normal | MergeMode::Shared))
            .flat_map(|g| g.starts(view).collect::<Vec<_>>())
            .collect();
        outcome.warm_starts = chosen
            .iter()
            .filter(|(j, _)| starting.contains(j))
            .map(|(&job, &w)| WarmStart {
                job,
                from: estimates.warm[w].key.from,
                gain: estimates.warm[w].gain,
            })
            .collect();
    }
    Ok(Decision {
        snapshot,
        plan,
        outcome,
    })
}

/// Drops the groups a plan gives beyond their queue's budget
/// ([`Snapshot::queue_gpus`]): kept groups first, then by priority and
/// submission. The budgeted policies' own walks already stay within them;
/// this holds for every part of a policy (Chronus' SLO ILP knows no
/// queues).
fn within_budgets(snap: &Snapshot, mut plan: Plan) -> Plan {
    if snap.queue_gpus.is_empty() {
        return plan;
    }
    let mut order: Vec<usize> = (0..plan.entries.len()).collect();
    order.sort_by(|&x, &y| {
        let (a, b) = (
            &snap.jobs[plan.entries[x].jobs[0]],
            &snap.jobs[plan.entries[y].jobs[0]],
        );
        (b.current_gpus > 0)
            .cmp(&(a.current_gpus > 0))
            .then(b.priority.cmp(&a.priority))
            .then(a.submitted_at.total_cmp(&b.submitted_at))
            .then(x.cmp(&y))
    });
    let mut room = crate::policy::QueueRoom::new(snap, &Plan::default());
    let mut keep = vec![false; plan.entries.len()];
    for k in order {
        let e = &plan.entries[k];
        if e.jobs.iter().all(|&i| room.fits(snap, i, e.gpus)) {
            for &i in &e.jobs {
                room.take(snap, i, e.gpus);
            }
            keep[k] = true;
        }
    }
    let mut k = 0;
    plan.entries.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    plan
}
