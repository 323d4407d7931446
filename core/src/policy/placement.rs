//! Placement: maps each group's GPU count onto nodes (Ymir §5.1: "pack each
//! workload with as few nodes as possible").
//!
//! Rules, in order:
//! 1. A group whose size did not change keeps its GPUs where they are
//!    (moving running work costs a context switch).
//! 2. Remaining groups are placed largest first (ties by first job index):
//!    groups of 4 or more GPUs take whole free nodes when the size is a
//!    multiple of the node size; smaller groups go to the node with the
//!    fewest free GPUs that still fits them (best fit, which keeps whole
//!    nodes free for large groups and avoids fragmenting them).
//! 3. A data-parallel group that fits no single node and no set of whole
//!    nodes is spread over the nodes with the most free GPUs (fewest nodes);
//!    a pipeline-parallel group is never spread — it waits, and the round
//!    reports it as unplaced. Under [`PlacementRule::FewestNodes`] (the
//!    authors' simulator) a spread over more than `⌈gpus / node size⌉`
//!    nodes is refused too: the group waits.

use super::{PlacementRule, Plan, Snapshot};

/// Places every entry of `plan`; entries that cannot be placed are dropped
/// from the plan (their jobs stay queued) and counted in `stats.unplaced`.
pub fn place(snap: &Snapshot, mut plan: Plan) -> Plan {
    let mut free: Vec<u32> = snap.nodes.iter().map(|n| n.gpus).collect();
    let mut placed: Vec<Option<Vec<(usize, u32)>>> = vec![None; plan.entries.len()];

    // Rule 1: unchanged running groups stay.
    for (k, e) in plan.entries.iter().enumerate() {
        let current = &snap.jobs[e.jobs[0]].current_placement;
        let held: u32 = current.iter().map(|p| p.1).sum();
        let same_group = e
            .jobs
            .iter()
            .all(|&j| snap.jobs[j].current_placement == *current);
        if held == e.gpus
            && held > 0
            && same_group
            && current.iter().all(|&(n, g)| n < free.len() && free[n] >= g)
        {
            for &(n, g) in current {
                free[n] -= g;
            }
            placed[k] = Some(current.clone());
        }
    }

    // Rule 2 and 3: the rest, largest first.
    let mut order: Vec<usize> = (0..plan.entries.len())
        .filter(|&k| placed[k].is_none())
        .collect();
    order.sort_by_key(|&k| {
        (
            std::cmp::Reverse(plan.entries[k].gpus),
            plan.entries[k].jobs[0],
        )
    });
    for k in order {
        let e = &plan.entries[k];
        let pipeline = e.jobs.iter().any(|&j| snap.jobs[j].pipeline);
        placed[k] = fit(snap, &mut free, e.gpus, pipeline);
    }

    let mut unplaced = 0;
    let mut kept = Vec::with_capacity(plan.entries.len());
    for (mut e, p) in plan.entries.into_iter().zip(placed) {
        match p {
            Some(p) => {
                e.placement = p;
                kept.push(e);
            }
            None => unplaced += 1,
        }
    }
    plan.entries = kept;
    plan.stats.unplaced += unplaced;
    plan
}

fn fit(snap: &Snapshot, free: &mut [u32], gpus: u32, pipeline: bool) -> Option<Vec<(usize, u32)>> {
    if gpus == 0 {
        return Some(Vec::new());
    }
    let size = |n: usize| snap.nodes[n].gpus;
    // Whole nodes for multiples of the node size (the smallest node ids).
    let whole: Vec<usize> = (0..free.len())
        .filter(|&n| free[n] == size(n) && size(n) > 0)
        .collect();
    let node_size = snap.nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
    if node_size > 0 && gpus >= node_size && gpus.is_multiple_of(node_size) {
        let need = (gpus / node_size) as usize;
        let full: Vec<usize> = whole
            .iter()
            .copied()
            .filter(|&n| size(n) == node_size)
            .take(need)
            .collect();
        if full.len() == need {
            for &n in &full {
                free[n] = 0;
            }
            return Some(full.into_iter().map(|n| (n, node_size)).collect());
        }
    }
    if pipeline {
        return None;
    }
    // Best fit inside one node.
    if let Some(n) = (0..free.len())
        .filter(|&n| free[n] >= gpus)
        .min_by_key(|&n| (free[n], n))
    {
        free[n] -= gpus;
        return Some(vec![(n, gpus)]);
    }
    // Spread over the fewest nodes: most free first.
    let total: u32 = free.iter().sum();
    if total < gpus {
        return None;
    }
    let mut by_free: Vec<usize> = (0..free.len()).filter(|&n| free[n] > 0).collect();
    by_free.sort_by_key(|&n| (std::cmp::Reverse(free[n]), n));
    if snap.placement_rule == PlacementRule::FewestNodes {
        // The authors' rule: no more nodes than the size needs.
        let mut left = gpus;
        let used = by_free
            .iter()
            .take_while(|&&n| {
                let more = left > 0;
                left = left.saturating_sub(free[n]);
                more
            })
            .count() as u32;
        if used > gpus.div_ceil(node_size.max(1)) {
            return None;
        }
    }
    let mut left = gpus;
    let mut out = Vec::new();
    for n in by_free {
        if left == 0 {
            break;
        }
        let take = free[n].min(left);
        free[n] -= take;
        left -= take;
        out.push((n, take));
    }
    out.sort_unstable();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::PlanEntry;
    use super::super::testkit::*;
    use super::*;

    #[test]
    fn packs_whole_nodes_and_best_fits_small_groups() {
        let snap = cluster(3, 4, jobs(4));
        let plan = Plan {
            entries: vec![
                PlanEntry::single(0, 1),
                PlanEntry::single(1, 8),
                PlanEntry::single(2, 3),
            ],
            ..Default::default()
        };
        let p = place(&snap, plan);
        assert_eq!(
            p.entries[1].placement,
            vec![(0, 4), (1, 4)],
            "8 GPUs on two whole nodes"
        );
        // The 3-GPU group takes node 2; the 1-GPU group best-fits into its last GPU.
        assert_eq!(p.entries[2].placement, vec![(2, 3)]);
        assert_eq!(p.entries[0].placement, vec![(2, 1)]);
        p.consistency_check(&snap).unwrap();
    }

    #[test]
    fn the_authors_rule_makes_a_group_wait_rather_than_spread_over_extra_nodes() {
        // Two nodes with 2 free GPUs each (1 GPU of each held by a kept job)
        // and a 3-GPU group: fmsched spreads it 2+1; the authors'
        // consolidated placement refuses two nodes for 3 GPUs.
        let mut snap = cluster(2, 4, jobs(3));
        for (j, n) in [(0, 0), (1, 1)] {
            snap.jobs[j].current_placement = vec![(n, 2)];
            snap.jobs[j].current_gpus = 2;
        }
        let plan = || Plan {
            entries: vec![
                PlanEntry::single(0, 2),
                PlanEntry::single(1, 2),
                PlanEntry::single(2, 3),
            ],
            ..Default::default()
        };
        let packed = place(&snap, plan());
        assert_eq!(packed.entries[2].placement, vec![(0, 2), (1, 1)]);
        snap.placement_rule = PlacementRule::FewestNodes;
        let strict = place(&snap, plan());
        assert_eq!(strict.stats.unplaced, 1, "{strict:?}");
        assert_eq!(strict.entries.len(), 2, "the 3-GPU group waits");
        // Five GPUs on two nodes is the fewest possible: allowed.
        let snap5 = Snapshot {
            placement_rule: PlacementRule::FewestNodes,
            ..cluster(2, 4, jobs(1))
        };
        let p = place(
            &snap5,
            Plan {
                entries: vec![PlanEntry::single(0, 5)],
                ..Default::default()
            },
        );
        assert_eq!(p.entries[0].placement.len(), 2);
    }

    #[test]
    fn running_groups_stay_and_pipelines_are_never_spread() {
        let mut snap = cluster(2, 4, jobs(3));
        snap.jobs[0].current_placement = vec![(1, 2)];
        snap.jobs[0].current_gpus = 2;
        snap.jobs[1].pipeline = true;
        let plan = Plan {
            entries: vec![
                PlanEntry::single(0, 2),
                PlanEntry::single(1, 4),
                PlanEntry::single(2, 2),
            ],
            ..Default::default()
        };
        let p = place(&snap, plan);
        assert_eq!(p.entries[0].placement, vec![(1, 2)], "kept where it runs");
        assert_eq!(p.entries[1].placement, vec![(0, 4)]);
        assert_eq!(p.entries[2].placement, vec![(1, 2)]);
        // A second pipeline job of 4 cannot be spread over two half nodes.
        let plan = Plan {
            entries: vec![
                PlanEntry::single(0, 2),
                PlanEntry::single(2, 2),
                PlanEntry::single(1, 4),
            ],
            ..Default::default()
        };
        let mut snap2 = snap.clone();
        snap2.jobs[2].current_placement = vec![(0, 2)];
        snap2.jobs[2].current_gpus = 2;
        let p = place(&snap2, plan);
        assert_eq!(p.stats.unplaced, 1);
        assert_eq!(p.entries.len(), 2);
    }
}
