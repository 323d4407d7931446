//! Phase 2a, **snapshot**: the policy's [`Snapshot`] of a prepared,
//! estimated round: remaining times per allocation, merged groups' times
//! and candidates, restart costs, current placements and queue budgets;
//! and the warm starts the snapshot's times assume.

use std::collections::BTreeMap;

use super::outcome::{Estimates, PairEstimate, Prepared, RoundError};
use super::pairs::is_eligible;
use super::shapes::mask_replicas;
use super::view::{ClusterView, JobView, RoundConfig, group_due, is_training, sharing_partners};
use crate::policy::{ExistingMerge, MergeMode, NodeCap, PairCandidate, SchedJob, Snapshot};
use crate::queue::Queues;

/// The warm start each job of the round takes (view job → index into
/// `estimates.warm`): of its estimated ones, the one with the highest
/// `TranWt` — Ymir Eq. 12 with A already done (`T_A = 0`), `T_B / T_{A↦B}`,
/// at its best allocation — if that gains (`TranWt > 1`,
/// [`crate::policy::merge_gains`], as a merge must). The start is
/// free to B (nothing to wait for) and to A (done), so the best one is
/// taken before the policy runs: the job's times in the snapshot are then
/// its times from those weights, and a merge candidate it is in is
/// weighed against them (its TranWt again, [`candidates`]). It starts from
/// those weights if it starts outside a merge; merged, it trains as the
/// pair's times say.
/// Ties go to the earlier estimate.
pub fn chosen_warm_starts(prepared: &Prepared, estimates: &Estimates) -> BTreeMap<usize, usize> {
    let mut best: BTreeMap<usize, (usize, f64)> = BTreeMap::new();
    if estimates.warm.is_empty() {
        return BTreeMap::new();
    }
    let ord: BTreeMap<usize, usize> = prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k))
        .collect();
    for (w, e) in estimates.warm.iter().enumerate() {
        let Some(cold) = ord.get(&e.key.job).and_then(|&k| estimates.jobs.get(k)) else {
            continue;
        };
        // Eq. 12, T_A = 0: (2·min(0, T_B) + max(0, T_B)) / (2·0 + T_{A↦B}).
        let tran_wt = cold
            .iter()
            .zip(&e.seconds)
            .filter(|(tb, tab)| tb.is_finite() && tab.is_finite() && **tab > 0.0)
            .map(|(tb, tab)| tb / tab)
            .fold(0.0, f64::max);
        if crate::policy::merge_gains(tran_wt)
            && best.get(&e.key.job).is_none_or(|&(_, b)| tran_wt > b)
        {
            best.insert(e.key.job, (w, tran_wt));
        }
    }
    best.into_iter().map(|(j, (w, _))| (j, w)).collect()
}

/// The policy's snapshot of a prepared round.
pub fn snapshot(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    cfg: &RoundConfig,
) -> Result<Snapshot, RoundError> {
    let warm = chosen_warm_starts(prepared, estimates);
    snapshot_with(view, prepared, estimates, cfg, &warm)
}

/// [`snapshot`] with the round's warm starts already chosen
/// ([`chosen_warm_starts`]).
pub(super) fn snapshot_with(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    cfg: &RoundConfig,
    warm: &BTreeMap<usize, usize>,
) -> Result<Snapshot, RoundError> {
    check_estimates(prepared, estimates)?;
    let raw_candidates = &estimates.candidates;
    // A warm-started job's own times from the pre-trained weights: what it
    // takes as A of a new temporal pair.
    let cold: BTreeMap<usize, Vec<f64>> = prepared
        .jobs
        .iter()
        .zip(&estimates.jobs)
        .filter(|(v, _)| warm.contains_key(v))
        .map(|(&v, row)| {
            let unit = view.jobs[v].replica().gpus();
            (v, mask_replicas(&prepared.allocations, unit, 0, row))
        })
        .collect();
    let estimates = &whole_replicas(view, prepared, estimates, warm);
    let ord: BTreeMap<usize, usize> = prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k))
        .collect();
    let placements = current_placements(view, prepared, &ord);
    // A job its queue's share caps below what it holds is shown holding
    // only its cap (its last GPUs dropped), so a policy that keeps running
    // jobs as they are shrinks it rather than keeping it over the cap.
    let current: Vec<Vec<(usize, u32)>> = placements
        .iter()
        .zip(&prepared.jobs)
        .map(|(pl, i)| {
            let Some(&cap) = prepared.caps.get(i) else {
                return pl.clone();
            };
            let mut left = cap;
            pl.iter()
                .filter_map(|&(n, g)| {
                    let take = g.min(left);
                    left -= take;
                    (take > 0).then_some((n, take))
                })
                .collect()
        })
        .collect();
    let partners = sharing_partners(view, &prepared.jobs);
    let jobs: Vec<SchedJob> = prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let j = &view.jobs[i];
            // The executor's cap, then the job's queue's share.
            let quota = prepared.caps.get(&i).copied().unwrap_or(u32::MAX);
            let cap = |g: u32, j: &JobView| {
                prepared
                    .offered(cfg, g, j)
                    .min(quota)
                    .max(j.min_gpus.min(g))
            };
            SchedJob {
                id: j.id.clone(),
                model: j.model.clone(),
                task: j.task.clone(),
                sharing: j.sharing,
                pipeline: j.pipeline,
                expert_parallel: j.expert_parallel,
                worker_gpus: j.worker_gpus,
                gpu_model: j.gpu_model.clone(),
                unfit_families: j.unfit_families.clone(),
                requested_gpus: cap(j.requested_gpus, j),
                queue: prepared.budgets.keys().position(|q| *q == j.queue),
                priority: j.priority,
                min_gpus: j.min_gpus,
                max_gpus: cap(j.max_gpus, j),
                submitted_at: j.submitted_at,
                progress: j.progress,
                attained_gpu_s: j.attained_gpu_s,
                executed_s: j.executed_s,
                fair_share_gpu_s: j.fair_share_gpu_s,
                current_gpus: current[k].iter().map(|p| p.1).sum(),
                current_placement: current[k].clone(),
                family_time_ratio: j.family_time_ratio.clone(),
                remaining_s: estimates.jobs[k].clone(),
                spread: estimates.spread.get(k).copied().unwrap_or(0.0).max(0.0),
                restart_s: j.restart_s,
                lease_until: j.lease_until,
                deadlines: j.deadlines.clone(),
                footprint: j.footprint,
                shares_with: partners[k],
            }
        })
        .collect();
    let merges = prepared
        .kept
        .iter()
        .zip(&estimates.kept)
        .map(|(&m, secs)| {
            let mv = &view.merges[m];
            ExistingMerge {
                a: ord[&mv.a],
                b: ord[&mv.b],
                mode: mv.mode,
                remaining_s: kept_within_deadline(
                    group_time(view, estimates, &ord, mv.a, mv.b, mv.mode, secs),
                    group_due(view, mv.a, mv.b, mv.mode),
                ),
            }
        })
        .collect();
    Ok(Snapshot {
        now: view.now,
        nodes: prepared
            .nodes
            .iter()
            .zip(&prepared.capacity)
            .map(|(&n, &gpus)| NodeCap {
                id: view.nodes[n].id.clone(),
                gpus,
                gpu_model: view.nodes[n].gpu_model.clone(),
                loaned: view.nodes[n].loaned,
                gpu_memory_gib: view.nodes[n].gpu_memory_gib,
            })
            .collect(),
        allocations: prepared.allocations.clone(),
        queue_gpus: prepared.budgets.values().copied().collect(),
        jobs,
        candidates: candidates(
            view,
            prepared,
            estimates,
            raw_candidates,
            &ord,
            &cfg.queues,
            (warm, &cold),
        )?,
        merges,
        placement_rule: cfg.placement_rule,
    })
}

/// The fewest GPUs a merge of jobs `a` and `b` may run on: the larger of
/// their `min_gpus` (one process trains both, so neither may get fewer
/// than it asked for).
fn pair_min_gpus(view: &ClusterView, a: usize, b: usize) -> u32 {
    view.jobs[a].min_gpus.max(view.jobs[b].min_gpus)
}

/// The estimates of jobs and kept merges with every allocation that is not
/// a whole number of a job's replicas ([`JobView::replica`]; a merge's are
/// its jobs'), or, for a merge, below either job's `min_gpus`, made `+∞`:
/// it cannot run there, whatever the caller estimated. One rule for the service and fmsim. Candidate pairs are
/// masked as [`candidates`] keeps them (there can be hundreds of thousands,
/// most of them dropped); the result has none. A job with a warm start
/// (`warm`: view job → index into `estimates.warm`,
/// [`chosen_warm_starts`]) has its times from those weights.
fn whole_replicas(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    warm: &BTreeMap<usize, usize>,
) -> Estimates {
    let allocs = &prepared.allocations;
    let unit = |v: usize| view.jobs[v].replica().gpus();
    Estimates {
        jobs: prepared
            .jobs
            .iter()
            .zip(&estimates.jobs)
            .map(|(&v, row)| {
                let row = warm.get(&v).map_or(row, |&w| &estimates.warm[w].seconds);
                mask_replicas(allocs, unit(v), 0, row)
            })
            .collect(),
        kept: prepared
            .kept
            .iter()
            .zip(&estimates.kept)
            .map(|(&m, row)| {
                let (a, b) = (view.merges[m].a, view.merges[m].b);
                mask_replicas(allocs, unit(a), pair_min_gpus(view, a, b), row)
            })
            .collect(),
        candidates: Vec::new(),
        warm: Vec::new(),
        spread: estimates.spread.clone(),
        // The snapshot does not read them; `released_merges` masks its own.
        kept_b_alone: Vec::new(),
    }
}

/// Estimates must fit the prepared round: a row per snapshot job and per
/// kept merge, a value per allocation everywhere.
fn check_estimates(prepared: &Prepared, estimates: &Estimates) -> Result<(), RoundError> {
    let width = prepared.allocations.len();
    let bad = |what: String| Err(RoundError::Estimates(what));
    if estimates.jobs.len() != prepared.jobs.len() {
        return bad(format!(
            "{} job rows for {} jobs",
            estimates.jobs.len(),
            prepared.jobs.len()
        ));
    }
    if estimates.kept.len() != prepared.kept.len() {
        return bad(format!(
            "{} kept-merge rows for {} kept merges",
            estimates.kept.len(),
            prepared.kept.len()
        ));
    }
    if !estimates.kept_b_alone.is_empty() && estimates.kept_b_alone.len() != prepared.kept.len() {
        return bad(format!(
            "{} rows of B alone for {} kept merges",
            estimates.kept_b_alone.len(),
            prepared.kept.len()
        ));
    }
    if estimates
        .kept_b_alone
        .iter()
        .any(|r| !r.is_empty() && r.len() != width)
    {
        return bad(format!("a row of B alone that is not {width} values wide"));
    }
    if !estimates.spread.is_empty() && estimates.spread.len() != prepared.jobs.len() {
        return bad(format!(
            "{} spreads for {} jobs",
            estimates.spread.len(),
            prepared.jobs.len()
        ));
    }
    if estimates.spread.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return bad("a spread that is not a finite number >= 0".into());
    }
    if let Some(w) = estimates
        .warm
        .iter()
        .find(|w| prepared.warm.binary_search(&w.key).is_err())
    {
        return bad(format!(
            "warm start of job {} from finished job {} is not one of the round's",
            w.key.job, w.key.from
        ));
    }
    let rows = estimates
        .jobs
        .iter()
        .chain(&estimates.kept)
        .chain(
            estimates
                .candidates
                .iter()
                .flat_map(|c| [&c.seconds, &c.tran_wt]),
        )
        .chain(estimates.warm.iter().map(|w| &w.seconds));
    for r in rows {
        if r.len() != width {
            return bad(format!(
                "a row of {} values for {width} allocations",
                r.len()
            ));
        }
    }
    Ok(())
}

/// Where each snapshot job trains now (snapshot node → GPUs); both jobs of
/// a kept merge share their group's GPUs (a temporal B rides on A's). A job
/// whose node left the round holds nothing.
fn current_placements(
    view: &ClusterView,
    prepared: &Prepared,
    ord: &BTreeMap<usize, usize>,
) -> Vec<Vec<(usize, u32)>> {
    let node_ord: BTreeMap<usize, usize> = prepared
        .nodes
        .iter()
        .enumerate()
        .map(|(k, &n)| (n, k))
        .collect();
    let placement_of = |i: usize| -> Vec<(usize, u32)> {
        let j = &view.jobs[i];
        if j.profiling_run || j.holds.is_empty() {
            return Vec::new();
        }
        let mut per: BTreeMap<usize, u32> = BTreeMap::new();
        for g in &j.holds {
            match node_ord.get(&g.0) {
                Some(&k) => *per.entry(k).or_default() += 1,
                None => return Vec::new(), // its node is gone
            }
        }
        per.into_iter().collect()
    };
    let mut placements: Vec<Vec<(usize, u32)>> =
        prepared.jobs.iter().map(|&i| placement_of(i)).collect();
    for &m in &prepared.kept {
        let (a, b) = (ord[&view.merges[m].a], ord[&view.merges[m].b]);
        let shared = if placements[a].is_empty() {
            placements[b].clone()
        } else {
            placements[a].clone()
        };
        placements[a].clone_from(&shared);
        placements[b] = shared;
    }
    placements
}

/// A merged group's remaining time at each allocation: temporal = A, then
/// B from A's weights after B's own start; spatial = the joint job (Ymir
/// Eq. 4). `merged` is the merged part's time ([`PairEstimate::seconds`]).
fn group_time(
    view: &ClusterView,
    estimates: &Estimates,
    ord: &BTreeMap<usize, usize>,
    a: usize,
    b: usize,
    mode: MergeMode,
    merged: &[f64],
) -> Vec<f64> {
    match mode {
        MergeMode::Temporal => estimates.jobs[ord[&a]]
            .iter()
            .zip(merged)
            .map(|(ta, tab)| ta + tab + view.jobs[b].restart_s)
            .collect(),
        _ => merged.to_vec(),
    }
}

/// The estimated pairs that may help (`TranWt > 1` at some allocation, Ymir
/// §5; [`crate::policy::merge_gains`]) as the policy's candidates; an estimate of a pair that is not
/// eligible is refused. A pair may not run at an allocation at which a job
/// with a deadline would miss it (its time there is infinite), and one
/// that misses at every allocation is no candidate: B of a temporal pair
/// finishes with the group, both of a spatial one do. A of a temporal pair
/// trains as alone, but one that trains now is launched again for the
/// merge, so the pair may not run where that restart makes A miss.
fn candidates(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    raw: &[PairEstimate],
    ord: &BTreeMap<usize, usize>,
    queues: &Queues,
    (warm, cold): (&BTreeMap<usize, usize>, &BTreeMap<usize, Vec<f64>>),
) -> Result<Vec<PairCandidate>, RoundError> {
    let mut out = Vec::new();
    for c in raw {
        let (a, b) = (c.pair.a, c.pair.b);
        // No eligible pair at all (merging off, or none this round) and
        // the one-pair test agree with the list: both from the snapshot's jobs.
        if prepared.eligible.is_empty() || !is_eligible(view, ord, queues, &c.pair) {
            return Err(RoundError::Estimates(format!(
                "candidate {:?} of jobs {a} and {b} is not an eligible pair",
                c.pair.mode
            )));
        }
        // A pair of a job with a warm start is weighed against that start:
        // its TranWt (Eq. 12–13) again, the jobs apart at their snapshot
        // times (from the finished job's weights), the pair as it trains —
        // from the pre-trained weights: its merged part as estimated, and
        // a temporal A at its own time from those (`cold`).
        let a_in_pair = cold.get(&a).unwrap_or(&estimates.jobs[ord[&a]]);
        let reweighed: Vec<f64>;
        let tran_wt = if warm.contains_key(&a) || warm.contains_key(&b) {
            let (ta, tb) = (&estimates.jobs[ord[&a]], &estimates.jobs[ord[&b]]);
            reweighed = (0..c.seconds.len())
                .map(|k| match c.pair.mode {
                    MergeMode::Temporal => crate::policy::tran_wt_temporal_apart(
                        ta[k],
                        tb[k],
                        a_in_pair[k],
                        c.seconds[k],
                    ),
                    _ => crate::policy::tran_wt_spatial(ta[k], tb[k], c.seconds[k]),
                })
                .collect();
            &reweighed
        } else {
            &c.tran_wt
        };
        if !tran_wt.iter().copied().any(crate::policy::merge_gains) {
            continue;
        }
        let seconds = mask_replicas(
            &prepared.allocations,
            view.jobs[a].replica().gpus(),
            pair_min_gpus(view, a, b),
            &c.seconds,
        );
        let mut remaining_s = match (c.pair.mode, cold.get(&a)) {
            (MergeMode::Temporal, Some(ta)) => ta
                .iter()
                .zip(&seconds)
                .map(|(ta, tab)| ta + tab + view.jobs[b].restart_s)
                .collect(),
            _ => group_time(view, estimates, ord, a, b, c.pair.mode, &seconds),
        };
        let due = |j: usize| view.jobs[j].deadline_in(view.now).unwrap_or(f64::INFINITY);
        // An allocation at which the group would finish after the deadline
        // of a job that finishes with it is no option for the pair (the
        // policy sees it as one that cannot run), so the pair can only be
        // given GPUs that keep it.
        let group_due = group_due(view, a, b, c.pair.mode);
        // A of a temporal pair trains as alone, but one that trains now is
        // launched again to evaluate B (the merge guard's watch): the merge
        // costs it a restart it would not pay alone, and an allocation at
        // which that restart makes it miss its deadline is no option
        // either (found on generated SLO workloads, where such an A missed
        // a tight deadline by its restart).
        let a_times: &[f64] = match c.pair.mode {
            MergeMode::Temporal if is_training(&view.jobs[a]) => &estimates.jobs[ord[&a]],
            _ => &[],
        };
        let a_due = due(a) - view.jobs[a].restart_s;
        for (k, t) in remaining_s.iter_mut().enumerate() {
            if *t > group_due || a_times.get(k).is_some_and(|&ta| ta > a_due) {
                *t = f64::INFINITY;
            }
        }
        if !remaining_s.iter().any(|t| t.is_finite()) {
            continue;
        }
        out.push(PairCandidate {
            a: ord[&a],
            b: ord[&b],
            mode: c.pair.mode,
            remaining_s,
            tran_wt: tran_wt.clone(),
        });
    }
    Ok(out)
}

/// A kept merge's group times with the allocations at which a job that
/// finishes with the group would miss its deadline taken away (as for a
/// new pair in [`candidates`]), so the policy gives it GPUs that keep the
/// deadline where some do. Where none does, the times stay: the merge is
/// not split here (B may be running from A's weights), and the policy
/// sizes it as before.
fn kept_within_deadline(mut times: Vec<f64>, due: f64) -> Vec<f64> {
    if times.iter().any(|&t| t.is_finite() && t <= due) {
        for t in &mut times {
            if *t > due {
                *t = f64::INFINITY;
            }
        }
    }
    times
}
