//! What a decided round predicts of each job, for users (`fmctl jobs`)
//! and SLO metrics: finish times and deadline risk.

use std::collections::{BTreeMap, BTreeSet};

use super::outcome::{Estimates, Prepared, RoundOutcome};
use super::view::ClusterView;

/// What a round predicts of one snapshot job, for users (`fmctl jobs`)
/// and SLO metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// View job.
    pub job: usize,
    /// Seconds from the view's clock until it finishes at the GPUs the
    /// round gave it (`T_{i,a}`, its remaining time alone); None when it
    /// waits or trains merged (a pair's finish depends on the merge).
    pub finish_in: Option<f64>,
    /// It has a deadline and is predicted to miss it: running, finishing
    /// after it; waiting, unable to make it even if started now on its
    /// fastest allocation.
    pub at_risk: bool,
    /// Seconds its fastest allocation alone would take from now.
    pub best_in: Option<f64>,
    /// Its deadline (the full reward's), seconds from the view's clock.
    pub deadline_in: Option<f64>,
}

/// The round's predictions for its snapshot jobs (pure; the service
/// stores them with the plan).
pub fn predictions(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    outcome: &RoundOutcome,
) -> Vec<Prediction> {
    let alone: BTreeMap<usize, u32> = outcome
        .groups
        .iter()
        .filter(|g| g.jobs.len() == 1)
        .map(|g| (g.jobs[0], g.gpus.len() as u32))
        .collect();
    let merged: BTreeSet<usize> = outcome
        .groups
        .iter()
        .filter(|g| g.jobs.len() > 1)
        .flat_map(|g| g.jobs.iter().copied())
        .collect();
    prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let times = estimates.jobs.get(k).map(Vec::as_slice).unwrap_or(&[]);
            let at = |gpus: u32| {
                prepared
                    .allocations
                    .iter()
                    .position(|&a| a == gpus)
                    .and_then(|x| times.get(x).copied())
                    .filter(|t| t.is_finite())
            };
            let finish_in = alone.get(&i).and_then(|&g| at(g));
            let deadline = view.jobs[i].deadline_in(view.now);
            let best = times
                .iter()
                .copied()
                .filter(|t| t.is_finite())
                .fold(f64::INFINITY, f64::min);
            let at_risk = deadline.is_some_and(|d| match finish_in {
                Some(f) => f > d,
                None if merged.contains(&i) => false,
                // A cluster without GPUs (no agent registered yet) runs
                // nothing: that says nothing about the job.
                None if best.is_infinite() && prepared.total_gpus == 0 => false,
                None => best > d,
            });
            Prediction {
                job: i,
                finish_in,
                at_risk,
                best_in: best.is_finite().then_some(best),
                deadline_in: deadline,
            }
        })
        .collect()
}
