//! Tests of `placement`.

use super::super::testkit::*;
use super::super::{PlanEntry, pipeline_fits};
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

/// A cluster whose nodes have these sizes.
fn sized(sizes: &[u32], n_jobs: usize) -> Snapshot {
    let mut snap = cluster(sizes.len(), 1, jobs(n_jobs));
    for (n, &g) in snap.nodes.iter_mut().zip(sizes) {
        n.gpus = g;
    }
    snap
}

fn place_sizes(snap: &Snapshot, sizes: &[u32]) -> Plan {
    let plan = Plan {
        entries: sizes
            .iter()
            .enumerate()
            .map(|(j, &g)| PlanEntry::single(j, g))
            .collect(),
        ..Default::default()
    };
    let p = place(snap, plan);
    p.consistency_check(snap).unwrap();
    p
}

/// Ymir's `{4m}` rule on servers that are not 4 GPUs wide: a 4-stage
/// pipeline takes half an 8-GPU server (two share one), and was left
/// waiting forever when "whole servers" meant the largest node.
#[test]
fn pipeline_replicas_fit_inside_nodes_of_any_size() {
    let mut snap = sized(&[8, 8], 3);
    for j in &mut snap.jobs {
        j.pipeline = true;
    }
    let p = place_sizes(&snap, &[4, 4, 8]);
    assert_eq!(p.stats.unplaced, 0, "{p:?}");
    let at = |j: usize| {
        p.entries
            .iter()
            .find(|e| e.jobs == vec![j])
            .unwrap()
            .placement
            .clone()
    };
    assert_eq!(at(2), vec![(0, 8)], "largest first, one whole node");
    assert_eq!(at(0), vec![(1, 4)]);
    assert_eq!(at(1), vec![(1, 4)], "the two 4-stage jobs share node 1");

    // 8 GPUs when no node has 8 free: two replicas on two nodes, each
    // whole inside its node.
    let mut snap = sized(&[8, 8], 3);
    for (j, n) in [(0, 0), (1, 1)] {
        snap.jobs[j].current_placement = vec![(n, 4)];
        snap.jobs[j].current_gpus = 4;
    }
    snap.jobs[2].pipeline = true;
    let p = place_sizes(&snap, &[4, 4, 8]);
    assert_eq!(p.entries.len(), 3, "{p:?}");
    let e = p.entries.iter().find(|e| e.jobs == vec![2]).unwrap();
    assert_eq!(e.placement, vec![(0, 4), (1, 4)]);
}

#[test]
fn a_pipeline_replica_is_never_split_across_nodes() {
    // 2 + 2 free GPUs on two nodes is not a place for 4 stages.
    let mut snap = sized(&[4, 4], 3);
    for (j, n) in [(0, 0), (1, 1)] {
        snap.jobs[j].current_placement = vec![(n, 2)];
        snap.jobs[j].current_gpus = 2;
    }
    snap.jobs[2].pipeline = true;
    let p = place_sizes(&snap, &[2, 2, 4]);
    assert_eq!(p.stats.unplaced, 1);
    assert!(p.entries.iter().all(|e| e.jobs != vec![2]));
    // Nor 6 (not a whole number of replicas).
    let mut snap = sized(&[8], 1);
    snap.jobs[0].pipeline = true;
    assert_eq!(place_sizes(&snap, &[6]).stats.unplaced, 1);
}

/// Lina: an expert-parallel group's all-to-all stays on one node. Free
/// GPUs of 2 + 2 hold a data-parallel 4 (split) but not one expert
/// group of 4; they do hold two groups of 2, one per node; 6 over
/// 4 + 4 free takes whole groups of 2 on each, never 3 + 3.
#[test]
fn an_expert_group_is_never_split_across_nodes() {
    let mut snap = sized(&[4, 4], 3);
    for (j, n) in [(0, 0), (1, 1)] {
        snap.jobs[j].current_placement = vec![(n, 2)];
        snap.jobs[j].current_gpus = 2;
    }
    let dp = place_sizes(&snap, &[2, 2, 4]);
    assert_eq!(dp.stats.unplaced, 0, "a data-parallel 4 spreads: {dp:?}");
    snap.jobs[2].expert_parallel = 4;
    let p = place_sizes(&snap, &[2, 2, 4]);
    assert_eq!(p.stats.unplaced, 1);
    assert!(p.entries.iter().all(|e| e.jobs != vec![2]));
    snap.jobs[2].expert_parallel = 2;
    let p = place_sizes(&snap, &[2, 2, 4]);
    assert_eq!(p.stats.unplaced, 0);
    let e = p.entries.iter().find(|e| e.jobs == vec![2]).unwrap();
    assert_eq!(e.placement, vec![(0, 2), (1, 2)]);
    let mut snap = sized(&[4, 4], 1);
    snap.jobs[0].expert_parallel = 2;
    let p = place_sizes(&snap, &[6]);
    assert!(p.entries[0].placement.iter().all(|x| x.1 % 2 == 0), "{p:?}");
    // The consistency check refuses a plan that splits a group.
    let mut bad = p.clone();
    bad.entries[0].placement = vec![(0, 3), (1, 3)];
    let err = bad.consistency_check(&snap).unwrap_err();
    assert!(err.contains("split across nodes"), "{err}");
}

/// Fewest nodes, then best fit for the last one: 6 GPUs over free
/// nodes of 4, 4, 4 and 2 take 4 + 2, leaving two whole 4-GPU nodes
/// for the 8-GPU group behind it.
#[test]
fn a_wide_group_spreads_over_the_fewest_nodes_then_best_fits_the_rest() {
    let snap = sized(&[4, 4, 4, 2], 2);
    let p = place_sizes(&snap, &[8, 6]);
    assert_eq!(p.stats.unplaced, 0, "{p:?}");
    assert_eq!(p.entries[0].placement, vec![(0, 4), (1, 4)]);
    assert_eq!(p.entries[1].placement, vec![(2, 4), (3, 2)]);
    // Mixed sizes: 12 GPUs on an 8- and a 4-GPU node, not three 4s.
    let snap = sized(&[4, 8, 4, 4], 1);
    let p = place_sizes(&snap, &[12]);
    assert_eq!(p.entries[0].placement, vec![(0, 4), (1, 8)]);
}

#[test]
fn the_authors_rule_counts_the_fewest_nodes_by_each_nodes_size() {
    // 12 GPUs need two nodes of 8 + 4 GPUs: allowed while the 8-GPU
    // node is free; with half of it taken, 4 + 4 + 4 is one node too
    // many and the group waits.
    let mut snap = sized(&[8, 4, 4], 2);
    snap.placement_rule = PlacementRule::FewestNodes;
    let p = place_sizes(&snap, &[0, 12]);
    assert_eq!(p.stats.unplaced, 0, "{p:?}");
    assert_eq!(p.entries[1].placement, vec![(0, 8), (1, 4)]);
    snap.jobs[0].current_placement = vec![(0, 4)];
    snap.jobs[0].current_gpus = 4;
    let p = place_sizes(&snap, &[4, 12]);
    assert_eq!(p.stats.unplaced, 1, "{p:?}");
    // A 16-GPU node holds 12 alone: two nodes are one too many.
    let mut snap = sized(&[16, 4, 4], 2);
    snap.placement_rule = PlacementRule::FewestNodes;
    snap.jobs[0].current_placement = vec![(0, 8)];
    snap.jobs[0].current_gpus = 8;
    assert_eq!(place_sizes(&snap, &[8, 12]).stats.unplaced, 1);
    snap.placement_rule = PlacementRule::Pack;
    let p = place_sizes(&snap, &[8, 12]);
    assert_eq!(
        p.entries[1].placement,
        vec![(0, 8), (1, 4)],
        "fmsched's rule spreads"
    );
}

#[test]
fn pipeline_fits_needs_one_node_as_wide_as_a_replica() {
    assert!(pipeline_fits([2, 8]));
    assert!(!pipeline_fits([2, 2, 2, 2]));
    assert!(!pipeline_fits([]));
}

/// A group never spans two GPU families, and a job that names one runs
/// only there: 8 GPUs over an A100 and an H100 node with 4 free each
/// wait; the H100 job takes the H100 node even where an A100 node is
/// free.
#[test]
fn groups_stay_on_one_gpu_family_and_on_the_one_they_ask_for() {
    let mut snap = sized(&[4, 4, 8], 3);
    snap.nodes[1].gpu_model = "H100".into();
    snap.jobs[1].gpu_model = Some("H100".into());
    let p = place_sizes(&snap, &[8, 2, 2]);
    let at = |j: usize| {
        p.entries
            .iter()
            .find(|e| e.jobs == vec![j])
            .map(|e| e.placement.clone())
    };
    assert_eq!(at(0), Some(vec![(2, 8)]));
    assert_eq!(at(1), Some(vec![(1, 2)]), "on H100");
    assert_eq!(
        at(2),
        Some(vec![(1, 2)]),
        "it names no family: best fit anywhere, the H100 node's last two"
    );

    // Two half-free nodes of different families hold no 8-GPU group.
    let mut snap = sized(&[8, 8], 3);
    snap.nodes[1].gpu_model = "H100".into();
    for (j, n) in [(0, 0), (1, 1)] {
        snap.jobs[j].current_placement = vec![(n, 4)];
        snap.jobs[j].current_gpus = 4;
    }
    let p = place_sizes(&snap, &[4, 4, 8]);
    assert_eq!(p.stats.unplaced, 1, "{p:?}");
    // The same nodes of one family do hold it.
    snap.nodes[1].gpu_model = "A100".into();
    assert_eq!(place_sizes(&snap, &[4, 4, 8]).stats.unplaced, 0);
}

/// A job that stays where it runs moves to a faster family whose GPUs
/// the round leaves free, when the time it saves is more than twice
/// its restart; not for less, not onto GPUs the round gives another
/// group, and not a job pinned to its family.
#[test]
fn a_running_job_moves_to_a_faster_family_left_free_when_it_pays() {
    let snap_with = |ratio: f64| {
        let mut snap = sized(&[4, 4], 2);
        snap.nodes[1].gpu_model = "H100".into();
        snap.allocations = vec![1, 2, 3, 4];
        for j in &mut snap.jobs {
            j.remaining_s = vec![4000.0, 2000.0, 1400.0, 1000.0];
        }
        let j = &mut snap.jobs[0];
        j.current_placement = vec![(0, 4)];
        j.current_gpus = 4;
        j.family_time_ratio = vec![("H100".into(), ratio)];
        snap
    };
    let placed = |snap: &Snapshot, sizes: &[u32]| {
        place_sizes(snap, sizes)
            .entries
            .iter()
            .find(|e| e.jobs == vec![0])
            .map(|e| e.placement.clone())
    };
    // 1,000 s here, 500 s on the H100s: 500 s saved, its restart 30 s.
    assert_eq!(placed(&snap_with(0.5), &[4]), Some(vec![(1, 4)]), "moved");
    // 40 s saved: not twice its restart.
    assert_eq!(placed(&snap_with(0.96), &[4]), Some(vec![(0, 4)]), "stays");
    // The round gives the H100s to job 1: no room left.
    assert_eq!(placed(&snap_with(0.5), &[4, 4]), Some(vec![(0, 4)]));
    // Pinned to its family.
    let mut pinned = snap_with(0.5);
    pinned.jobs[0].gpu_model = Some("A100".into());
    assert_eq!(placed(&pinned, &[4]), Some(vec![(0, 4)]));
    // Nothing known of other families: it stays.
    let mut unknown = snap_with(0.5);
    unknown.jobs[0].family_time_ratio.clear();
    assert_eq!(placed(&unknown, &[4]), Some(vec![(0, 4)]));
    // A group that runs on H100s only waits for them (the plan gives
    // it more than are free): the free ones stay free for it, not
    // taken for speed (found on generated mixed loads: temporal pairs
    // moved up took the fast families' GPUs a piece at a time, and a
    // pipeline job that fits those only waited 29 times its length).
    let mut waiting = snap_with(0.5);
    waiting.jobs[1].unfit_families = vec!["A100".into()];
    assert_eq!(placed(&waiting, &[4, 8]), Some(vec![(0, 4)]), "kept free");
    // One that may run anywhere reserves nothing.
    waiting.jobs[1].unfit_families.clear();
    assert_eq!(placed(&waiting, &[4, 8]), Some(vec![(1, 4)]));
}

/// A new group takes the family where it runs fastest among those
/// where it fits on as few nodes, where that saves more than twice its
/// restart (found live: a new job started on A100s while faster H100s
/// were free, and rule 4 moved it there the next round, restarting it
/// at iteration 0); not a slower family, not for less, not more nodes
/// for speed, and as before where nothing is known of its speed or it
/// is merged.
#[test]
fn a_new_job_is_placed_on_the_fastest_family_it_fits_as_compactly() {
    let times = |snap: &mut Snapshot| {
        snap.allocations = vec![1, 2, 4, 8];
        for j in &mut snap.jobs {
            j.remaining_s = vec![4000.0, 2000.0, 1000.0, 500.0];
        }
    };
    let snap_with = |ratio: Option<f64>| {
        let mut snap = sized(&[4, 4, 8], 2);
        times(&mut snap);
        snap.nodes[1].gpu_model = "H100".into();
        snap.nodes[2].gpu_model = "H100".into();
        // Its times are estimated on A100s; on H100s it takes `ratio`.
        snap.jobs[0].family_time_ratio = ratio
            .map(|r| vec![("H100".to_string(), r)])
            .unwrap_or_default();
        snap
    };
    let at = |snap: &Snapshot, sizes: &[u32]| {
        place_sizes(snap, sizes)
            .entries
            .iter()
            .find(|e| e.jobs.contains(&0))
            .map(|e| e.placement.clone())
    };
    // Unknown: best fit across families, the A100 node (the H100s'
    // 4-GPU node fits as well; the first family of equals).
    assert_eq!(at(&snap_with(None), &[4]), Some(vec![(0, 4)]));
    // Twice as fast on H100s, 500 s saved of 1,000 (its restart 30 s):
    // the H100s' 4-GPU node (best fit there).
    assert_eq!(at(&snap_with(Some(0.5)), &[4]), Some(vec![(1, 4)]));
    // 40 s saved: not twice its restart, placed as if unknown.
    assert_eq!(at(&snap_with(Some(0.96)), &[4]), Some(vec![(0, 4)]));
    // Slower on H100s: A100s.
    assert_eq!(at(&snap_with(Some(2.0)), &[4]), Some(vec![(0, 4)]));
    // Fewer nodes come before speed: 8 GPUs take one A100 node, not
    // two H100 ones.
    let mut spread = sized(&[8, 4, 4], 1);
    times(&mut spread);
    spread.nodes[1].gpu_model = "H100".into();
    spread.nodes[2].gpu_model = "H100".into();
    spread.jobs[0].family_time_ratio = vec![("H100".into(), 0.5)];
    assert_eq!(at(&spread, &[8]), Some(vec![(0, 8)]));
    // A merged pair places as before: its members' times are not one.
    let snap = snap_with(Some(0.5));
    let plan = Plan {
        entries: vec![PlanEntry {
            jobs: vec![0, 1],
            gpus: 4,
            mode: super::super::MergeMode::Spatial,
            ..PlanEntry::single(0, 4)
        }],
        ..Default::default()
    };
    let p = place(&snap, plan);
    assert_eq!(p.entries[0].placement, vec![(0, 4)]);
}

/// A group that can run on some families only, and finds them full,
/// gets room from a running job that can run elsewhere: the job moves
/// to the family with room, once the group has waited longer than the
/// move costs it (its restart and its slowdown there, 30 + 1,000 s);
/// not before, not a job pinned to its family or one whose time there
/// is not known, and not onto a family where that job cannot run.
#[test]
fn tail_a_job_that_fits_some_families_only_gets_room_from_one_that_fits_anywhere() {
    let snap_at = |now: f64| {
        let mut snap = sized(&[4, 4], 2);
        snap.nodes[0].gpu_model = "V100".into();
        snap.allocations = vec![1, 2, 3, 4];
        snap.now = now;
        for j in &mut snap.jobs {
            j.remaining_s = vec![4000.0, 2000.0, 1400.0, 1000.0];
        }
        let running = &mut snap.jobs[0];
        running.current_placement = vec![(1, 4)];
        running.current_gpus = 4;
        // Twice as slow on the V100s.
        running.family_time_ratio = vec![("V100".into(), 2.0)];
        snap.jobs[1].unfit_families = vec!["V100".into()];
        snap
    };
    let at = |p: &Plan, j: usize| {
        p.entries
            .iter()
            .find(|e| e.jobs == vec![j])
            .map(|e| e.placement.clone())
    };
    let p = place_sizes(&snap_at(2000.0), &[4, 4]);
    assert_eq!(at(&p, 0), Some(vec![(0, 4)]), "moved to the V100s: {p:?}");
    assert_eq!(at(&p, 1), Some(vec![(1, 4)]), "in the room it left");
    assert_eq!(p.stats.unplaced, 0);
    // Waited 500 s: less than the move costs; the group waits.
    let p = place_sizes(&snap_at(500.0), &[4, 4]);
    assert_eq!(at(&p, 0), Some(vec![(1, 4)]), "{p:?}");
    assert_eq!(at(&p, 1), None);
    assert_eq!(p.stats.unplaced, 1);
    // Pinned to its family, its time there unknown, or unfit there.
    let mut pinned = snap_at(2000.0);
    pinned.jobs[0].gpu_model = Some("A100".into());
    let mut unknown = snap_at(2000.0);
    unknown.jobs[0].family_time_ratio.clear();
    let mut unfit = snap_at(2000.0);
    unfit.jobs[0].unfit_families = vec!["V100".into()];
    for snap in [pinned, unknown, unfit] {
        let p = place_sizes(&snap, &[4, 4]);
        assert_eq!(at(&p, 0), Some(vec![(1, 4)]), "{p:?}");
        assert_eq!(p.stats.unplaced, 1);
    }
}

/// Where no one move makes room (two 2-GPU jobs share the only node
/// the 4-GPU group fits), both move, once the group has waited longer
/// than the two moves cost together (each its restart and 2,000 s more
/// on the V100s); not while it has waited less than that, though more
/// than one move costs.
#[test]
fn tail_a_group_gets_a_node_that_several_small_jobs_share() {
    let snap_at = |now: f64| {
        let mut snap = sized(&[4, 4], 3);
        snap.nodes[0].gpu_model = "V100".into();
        snap.allocations = vec![1, 2, 3, 4];
        snap.now = now;
        for j in &mut snap.jobs {
            j.remaining_s = vec![4000.0, 2000.0, 1400.0, 1000.0];
        }
        for j in snap.jobs.iter_mut().take(2) {
            j.current_placement = vec![(1, 2)];
            j.current_gpus = 2;
            j.family_time_ratio = vec![("V100".into(), 2.0)];
        }
        snap.jobs[2].unfit_families = vec!["V100".into()];
        snap
    };
    let at = |p: &Plan, j: usize| {
        p.entries
            .iter()
            .find(|e| e.jobs == vec![j])
            .map(|e| e.placement.clone())
    };
    let p = place_sizes(&snap_at(5000.0), &[2, 2, 4]);
    assert_eq!(at(&p, 0), Some(vec![(0, 2)]), "moved: {p:?}");
    assert_eq!(at(&p, 1), Some(vec![(0, 2)]), "moved: {p:?}");
    assert_eq!(at(&p, 2), Some(vec![(1, 4)]), "in the room they left");
    // Waited 3,000 s: more than one move costs, less than both.
    let p = place_sizes(&snap_at(3000.0), &[2, 2, 4]);
    assert_eq!(at(&p, 0), Some(vec![(1, 2)]), "{p:?}");
    assert_eq!(at(&p, 1), Some(vec![(1, 2)]), "{p:?}");
    assert_eq!(at(&p, 2), None);
}

/// Rule 6 (Ymir's placement, `place_shortest_first`): a group that
/// can run on A100s only, with the A100 node full of a job that cannot
/// move either, takes that job's GPUs when the job has longer to run
/// than the group plus its own restart (the SRTF exchange: 4,000 s
/// against 1,000 + 30 s), once the group has waited longer than that
/// restart; not when the running job is the shorter, not before, and
/// never under the default placement. The displaced job says whom it
/// gave way to.
#[test]
fn tail_a_job_that_fits_some_families_only_takes_gpus_from_a_longer_one() {
    let snap_with = |now: f64, running_s: f64| {
        let mut snap = sized(&[4, 4], 2);
        snap.nodes[0].gpu_model = "V100".into();
        snap.allocations = vec![4];
        snap.now = now;
        snap.jobs[0].remaining_s = vec![running_s];
        snap.jobs[1].remaining_s = vec![1000.0];
        let running = &mut snap.jobs[0];
        running.current_placement = vec![(1, 4)];
        running.current_gpus = 4;
        running.executed_s = now;
        for j in &mut snap.jobs {
            j.unfit_families = vec!["V100".into()];
        }
        snap
    };
    let plan = || Plan {
        entries: vec![PlanEntry::single(0, 4), PlanEntry::single(1, 4)],
        ..Default::default()
    };
    let at = |p: &Plan, j: usize| {
        p.entries
            .iter()
            .find(|e| e.jobs == vec![j])
            .map(|e| e.placement.clone())
    };
    let snap = snap_with(100.0, 4000.0);
    let p = place_shortest_first(&snap, plan(), 1.0);
    p.consistency_check(&snap).unwrap();
    assert_eq!(at(&p, 1), Some(vec![(1, 4)]), "the shorter runs: {p:?}");
    assert_eq!(at(&p, 0), None, "the longer waits");
    assert_eq!(p.stats.unplaced, 1);
    assert_eq!(p.stats.displaced, vec![(0, 1)]);
    // The default placement keeps what runs.
    let p = place(&snap, plan());
    assert_eq!(at(&p, 0), Some(vec![(1, 4)]), "{p:?}");
    assert!(p.stats.displaced.is_empty());
    // The running job is the shorter (900 s), or longer by less than
    // its restart (1,020 s against 1,000 + 30): it runs on.
    for running_s in [900.0, 1020.0] {
        let p = place_shortest_first(&snap_with(100.0, running_s), plan(), 1.0);
        assert_eq!(at(&p, 0), Some(vec![(1, 4)]), "{running_s}: {p:?}");
        assert_eq!(at(&p, 1), None);
    }
    // Waited 10 s, less than the running job's restart (30 s).
    let p = place_shortest_first(&snap_with(10.0, 4000.0), plan(), 1.0);
    assert_eq!(at(&p, 0), Some(vec![(1, 4)]), "{p:?}");
    // A group that can run anywhere never displaces (rule 6 is for the
    // family-bound; the V100 node is free for it).
    let mut anywhere = snap_with(100.0, 4000.0);
    anywhere.jobs[1].unfit_families.clear();
    let p = place_shortest_first(&anywhere, plan(), 1.0);
    assert_eq!(at(&p, 0), Some(vec![(1, 4)]), "{p:?}");
    assert_eq!(at(&p, 1), Some(vec![(0, 4)]));
}

/// Rule 6 does not gamble on a wide estimate. The waiting A100-only
/// job (1,000 s at its median) displaces the running one (2,500 s) on
/// the medians; not when its own estimate is unsure (spread 2: at
/// κ = 1 it is judged at 2,000 s, plus the 30 s restart, against the
/// running job's 2,500 s at spread 0.4, judged at 2,000 s), nor when
/// the running job's is (spread 1.6: judged at 500 s); at κ = 0 both
/// exchanges are made on the medians again. A sure, large exchange
/// (4,000 s, spreads 0.4) is still made.
#[test]
fn tail_a_wide_estimate_does_not_displace_a_running_job() {
    let snap_with = |running_s: f64, spreads: [f64; 2]| {
        let mut snap = sized(&[4, 4], 2);
        snap.nodes[0].gpu_model = "V100".into();
        snap.allocations = vec![4];
        snap.now = 100.0;
        snap.jobs[0].remaining_s = vec![running_s];
        snap.jobs[1].remaining_s = vec![1000.0];
        let running = &mut snap.jobs[0];
        running.current_placement = vec![(1, 4)];
        running.current_gpus = 4;
        running.executed_s = 100.0;
        for (j, s) in snap.jobs.iter_mut().zip(spreads) {
            j.unfit_families = vec!["V100".into()];
            j.spread = s;
        }
        snap
    };
    let plan = || Plan {
        entries: vec![PlanEntry::single(0, 4), PlanEntry::single(1, 4)],
        ..Default::default()
    };
    let displaced = |snap: &Snapshot, kappa: f64| {
        let p = place_shortest_first(snap, plan(), kappa);
        p.consistency_check(snap).unwrap();
        p.stats.displaced
    };
    assert_eq!(displaced(&snap_with(2500.0, [0.0, 0.0]), 1.0), vec![(0, 1)]);
    // The waiting job's estimate is wide: 1,000 × (1 + 2/2) + 30 > 2,500 × 0.8.
    let unsure_waiting = snap_with(2500.0, [0.4, 2.0]);
    assert!(displaced(&unsure_waiting, 1.0).is_empty());
    assert_eq!(
        displaced(&unsure_waiting, 0.0),
        vec![(0, 1)],
        "κ = 0: medians"
    );
    // The running job's is: 1,000 + 30 > 2,500 × (1 − 1.6/2).
    let unsure_running = snap_with(2500.0, [1.6, 0.0]);
    assert!(displaced(&unsure_running, 1.0).is_empty());
    assert_eq!(displaced(&unsure_running, 0.0), vec![(0, 1)]);
    // Sure enough: 1,000 × 1.2 + 30 < 4,000 × 0.8.
    assert_eq!(displaced(&snap_with(4000.0, [0.4, 0.4]), 1.0), vec![(0, 1)]);
}

/// A family where a job cannot run at all (its replica's memory does
/// not fit) is never used for it: best fit would take the small V100
/// node, the job goes to the A100 node; a group running there (placed
/// before) is moved; with only unfit GPUs free it waits. Other jobs
/// still use that family.
#[test]
fn a_job_is_never_placed_on_a_family_it_cannot_run_on() {
    let mut snap = sized(&[2, 8], 2);
    snap.nodes[0].gpu_model = "V100".into();
    snap.jobs[0].unfit_families = vec!["V100".into()];
    let p = place_sizes(&snap, &[2, 2]);
    let at = |p: &Plan, j: usize| {
        p.entries
            .iter()
            .find(|e| e.jobs == vec![j])
            .map(|e| e.placement.clone())
    };
    assert_eq!(at(&p, 0), Some(vec![(1, 2)]), "not on V100: {p:?}");
    assert_eq!(
        at(&p, 1),
        Some(vec![(0, 2)]),
        "the other job fits the V100 node"
    );
    snap.jobs[0].current_placement = vec![(0, 2)];
    snap.jobs[0].current_gpus = 2;
    let p = place_sizes(&snap, &[2, 2]);
    assert_eq!(at(&p, 0), Some(vec![(1, 2)]), "moved off V100: {p:?}");
    let mut small = sized(&[2, 2], 1);
    small.nodes[0].gpu_model = "V100".into();
    small.nodes[1].gpu_model = "V100".into();
    small.jobs[0].unfit_families = vec!["V100".into()];
    assert_eq!(place_sizes(&small, &[2]).stats.unplaced, 1);
}

/// A running group kept on the wrong family (placed before the job's
/// model was honoured) is placed afresh, and the consistency check
/// refuses a plan that mixes families.
#[test]
fn a_group_on_the_wrong_family_moves_and_a_mixed_plan_is_refused() {
    let mut snap = sized(&[4, 4], 1);
    snap.nodes[1].gpu_model = "H100".into();
    snap.jobs[0].gpu_model = Some("H100".into());
    snap.jobs[0].current_placement = vec![(0, 2)];
    snap.jobs[0].current_gpus = 2;
    let p = place_sizes(&snap, &[2]);
    assert_eq!(p.entries[0].placement, vec![(1, 2)]);
    let mixed = Plan {
        entries: vec![PlanEntry {
            placement: vec![(0, 1), (1, 1)],
            ..PlanEntry::single(0, 2)
        }],
        ..Default::default()
    };
    snap.jobs[0].gpu_model = None;
    assert!(mixed.consistency_check(&snap).is_err());
}
