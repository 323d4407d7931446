//! Allocation sets, replicas, GPU families and the sizes a job is offered.

use super::*;

/// The round offers the policy's own allocation set: Optimus grows
/// jobs one GPU at a time, so 5–7 GPUs on an 8-GPU node are offered to
/// it, where Ymir's set {0, 1, 2, 3, 4m} has none of them.
#[test]
fn the_policy_decides_its_own_allocation_set() {
    let v = view(
        vec![node("n", 8)],
        vec![job("a", "qqp", JobState::Queued, 8)],
    );
    let cfg = RoundConfig {
        profiling: false,
        max_nodes_per_group: Some(1),
        ..Default::default()
    };
    let optimus = prepare(&v, by_name("optimus").unwrap().as_ref(), &cfg);
    assert_eq!(optimus.allocations, (0..=8).collect::<Vec<u32>>());
    let ymir = prepare(&v, by_name("ymir").unwrap().as_ref(), &cfg);
    assert_eq!(ymir.allocations, vec![0, 1, 2, 3, 4, 8]);
}

/// The set stops at the widest size a job of the round may take: its
/// maximum, or the GPUs it holds. On 32 GPUs, Ymir's set would run to
/// 32 and every estimate row with it.
#[test]
fn the_allocation_set_stops_at_the_widest_job() {
    let nodes = (0..4).map(|n| node(&format!("n{n}"), 8)).collect();
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let ymir = by_name("ymir").unwrap();
    let small = vec![
        job("a", "qqp", JobState::Queued, 4),
        job("b", "rte", JobState::Queued, 2),
    ];
    let p = prepare(&view(nodes, small.clone()), ymir.as_ref(), &cfg);
    assert_eq!(p.allocations, vec![0, 1, 2, 3, 4]);
    // A running job holding 12 GPUs (more than its maximum of 2).
    let mut held = job("c", "sst2", JobState::Running, 2);
    held.holds = (0..12u32).map(|g| ((g / 8) as usize, g % 8)).collect();
    let nodes = (0..4).map(|n| node(&format!("n{n}"), 8)).collect();
    let p = prepare(
        &view(nodes, [small, vec![held]].concat()),
        ymir.as_ref(),
        &cfg,
    );
    assert_eq!(p.allocations, vec![0, 1, 2, 3, 4, 8, 12]);
    let nodes = (0..4).map(|n| node(&format!("n{n}"), 8)).collect();
    let optimus = by_name("optimus").unwrap();
    let p = prepare(
        &view(nodes, vec![job("d", "qqp", JobState::Queued, 3)]),
        optimus.as_ref(),
        &cfg,
    );
    assert_eq!(p.allocations, vec![0, 1, 2, 3]);
}

#[test]
fn a_job_wider_than_every_node_is_unschedulable_on_a_single_node_executor() {
    let mut wide = job("w", "qqp", JobState::Queued, 8);
    wide.min_gpus = 8;
    let v = view(vec![node("x", 4), node("y", 4)], vec![wide]);
    let cfg = RoundConfig {
        profiling: false,
        max_nodes_per_group: Some(1),
        ..Default::default()
    };
    let d = run(&v, "ymir", &cfg);
    assert!(d.snapshot.jobs.is_empty());
    assert!(d.outcome.unschedulable[0].1.contains("largest node has 4"));
}

/// Two 4-stage pipeline jobs share one 8-GPU server on the service's
/// single-node executor (they waited forever when "whole servers"
/// meant the largest node's size); on 2-GPU servers a pipeline job can
/// never run and says so instead of waiting silently.
#[test]
fn pipeline_jobs_take_replicas_inside_nodes_and_say_when_none_fits() {
    let pipe = |id: &str, task: &str| {
        let mut j = job(id, task, JobState::Queued, 4);
        j.pipeline = true;
        j.min_gpus = 4;
        j.max_gpus = 4;
        j
    };
    let cfg = RoundConfig {
        profiling: false,
        merging: false,
        max_nodes_per_group: Some(1),
        ..Default::default()
    };
    let v = view(
        vec![node("big", 8)],
        vec![pipe("p", "qqp"), pipe("q", "rte")],
    );
    let d = run(&v, "ymir", &cfg);
    let mut got: Vec<Vec<Gpu>> = d.outcome.groups.iter().map(|g| g.gpus.clone()).collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            vec![(0, 0), (0, 1), (0, 2), (0, 3)],
            vec![(0, 4), (0, 5), (0, 6), (0, 7)]
        ],
        "{d:?}"
    );
    let v = view(vec![node("a", 2), node("b", 2)], vec![pipe("p", "qqp")]);
    let d = run(&v, "ymir", &cfg);
    assert!(d.outcome.groups.is_empty());
    let why = &d.outcome.unschedulable[0].1;
    assert!(
        why.contains("pipeline") && why.contains("largest node has 2"),
        "{why}"
    );
    // Nor may it profile on those nodes and hold up the jobs behind it.
    let mut sub = pipe("p", "qqp");
    sub.state = JobState::Submitted;
    let v = view(
        vec![node("a", 2), node("b", 2)],
        vec![sub, job("d", "rte", JobState::Submitted, 1)],
    );
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    assert_eq!(p.profiling.len(), 1);
    assert_eq!(p.profiling[0].job, 1, "the data-parallel job profiles");
    assert_eq!(p.unschedulable.len(), 1);
}

/// `resources.gpu_model` acts: the job profiles and runs on its family
/// only, never merges with a job bound to another, and on a cluster
/// without that family it says so instead of waiting silently.
#[test]
fn a_job_runs_only_on_the_gpu_model_it_asks_for() {
    let mut nodes = vec![node("a100", 4), node("h100", 4)];
    nodes[1].gpu_model = "H100".into();
    let mut h = job("h", "qqp", JobState::Submitted, 1);
    h.gpu_model = Some("H100".into());
    let v = view(nodes.clone(), vec![h.clone()]);
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    assert_eq!(
        p.profiling[0].gpus,
        vec![(1, 0)],
        "profiles on the H100 node"
    );

    h.state = JobState::Queued;
    let mut a = job("a", "rte", JobState::Queued, 1);
    a.gpu_model = Some("A100".into());
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let v = view(nodes.clone(), vec![h.clone(), a]);
    let p = prepare(&v, by_name("ymir").unwrap().as_ref(), &cfg);
    assert!(p.eligible.is_empty(), "no merge across GPU models");
    let d = run(&v, "ymir", &cfg);
    for g in &d.outcome.groups {
        let want = if g.jobs == vec![0] { 1 } else { 0 };
        assert!(g.gpus.iter().all(|x| x.0 == want), "{g:?}");
    }

    // On the single-node executor it is offered its family's largest
    // node (4 H100s), not the cluster's (8 A100s), so it runs there
    // rather than wait for 8 H100s on one node.
    let mut wide = h.clone();
    wide.max_gpus = 8;
    wide.requested_gpus = 8;
    let mut nodes8 = nodes.clone();
    nodes8[0].gpus = 8;
    let single = RoundConfig {
        max_nodes_per_group: Some(1),
        ..cfg.clone()
    };
    let d = run(&view(nodes8, vec![wide]), "srtf", &single);
    assert_eq!(d.snapshot.jobs[0].max_gpus, 4);
    assert_eq!(d.outcome.groups[0].gpus.len(), 4, "{d:?}");
    assert!(d.outcome.groups[0].gpus.iter().all(|g| g.0 == 1));

    let v = view(vec![node("a", 8)], vec![h]);
    let d = run(&v, "ymir", &cfg);
    assert!(d.outcome.groups.is_empty());
    let why = &d.outcome.unschedulable[0].1;
    assert!(why.contains("no node has GPU model H100"), "{why}");
}

/// A running job that trains alone on A100s moves to the H100s the
/// round leaves free (3,600 s of work there takes 40 % of the time),
/// and the round says so in its history: the family, the GPUs, the
/// node and the iteration it resumes from. Held where it is (no ratio
/// to H100s), it stays and nothing is said.
#[test]
fn a_job_moved_to_a_faster_family_says_from_which_to_which() {
    let mut nodes = vec![node("a100", 4), node("h100", 4)];
    nodes[1].gpu_model = "H100".into();
    let mut j = job("long", "qqp", JobState::Running, 2);
    (j.holds, j.iteration, j.progress) = (vec![(0, 0), (0, 1)], 700, 0.1);
    j.family_time_ratio = vec![("H100".into(), 0.4)];
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let d = run(&view(nodes.clone(), vec![j.clone()]), "ymir", &cfg);
    let g = &d.outcome.groups[0];
    assert_eq!(g.gpus, vec![(1, 0), (1, 1)], "{d:?}");
    let v = view(nodes.clone(), vec![j.clone()]);
    assert_eq!(
        restarts(&v, &d.outcome.groups),
        vec![(
            0,
            "moved",
            "moved from A100 to H100 GPUs (2 on h100), from its checkpoint (iteration 700)"
                .to_string()
        )]
    );

    j.family_time_ratio.clear();
    let v = view(nodes, vec![j]);
    let d = run(&v, "ymir", &cfg);
    assert!(d.outcome.groups[0].kept, "{d:?}");
    assert!(restarts(&v, &d.outcome.groups).is_empty());
}

/// A temporal pair whose A trains on V100s moves to H100s that are
/// free, as a job alone does (rule 4), its time there from both
/// members' ratios: B's are at the GPUs its A holds, where it will
/// train. Found on a generated mixed load: a pair whose A had 850
/// epochs to train sat 54 h on 4 V100s, the last 48 h with the rest of
/// the cluster idle, as only jobs alone had times on other families.
/// A spatial pair (one joint process) gets none; a pair whose B's time
/// there is unknown stays.
#[test]
fn tail_a_temporal_pair_moves_to_a_faster_family_that_frees_up() {
    let mut nodes = vec![node("v100", 4), node("h100", 4)];
    nodes[0].gpu_model = "V100".into();
    nodes[1].gpu_model = "H100".into();
    let mut a = job("a", "fashion_mnist", JobState::Running, 4);
    (a.holds, a.iteration, a.progress) = ((0..4).map(|g| (0, g)).collect(), 700, 0.1);
    let b = job("b", "food101", JobState::Queued, 4);
    let mut v = view(nodes, vec![a, b]);
    v.merges.push(MergeView {
        a: 0,
        b: 1,
        mode: MergeMode::Temporal,
    });
    // Each job's seconds: H100s 2.5× as fast, at the GPUs asked.
    let mut asked = Vec::new();
    family_time_ratios(&mut v, |j, family, gpus, _| {
        asked.push((j, family.to_string(), gpus));
        Ok::<_, ()>(Some(if family == "H100" { 0.4 } else { 1.0 }))
    })
    .unwrap();
    assert!(
        asked.contains(&(1, "V100".to_string(), 4)),
        "B at A's GPUs: {asked:?}"
    );
    for j in &v.jobs {
        assert_eq!(
            j.family_time_ratio,
            vec![("H100".to_string(), 0.4)],
            "{}",
            j.id
        );
    }
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let pair = |d: &Decision| {
        let g = d.outcome.groups.iter().find(|g| g.jobs == vec![0, 1]);
        g.cloned()
            .unwrap_or_else(|| panic!("the pair does not run: {d:?}"))
    };
    let d = run(&v, "ymir", &cfg);
    assert!(
        pair(&d).gpus.iter().all(|x| x.0 == 1),
        "not on the H100s: {d:?}"
    );
    assert_eq!(restarts(&v, &d.outcome.groups)[0].1, "moved");

    // Without B's time on H100s the pair's is not known: it stays.
    let mut unknown = v.clone();
    unknown.jobs[1].family_time_ratio.clear();
    let d = run(&unknown, "ymir", &cfg);
    assert!(pair(&d).kept, "{d:?}");

    // A spatial pair gets no times on other families.
    let mut spatial = v.clone();
    spatial.merges[0].mode = MergeMode::Spatial;
    for j in &mut spatial.jobs {
        j.family_time_ratio.clear();
    }
    family_time_ratios(&mut spatial, |_, _, _, _| Ok::<_, ()>(Some(1.0))).unwrap();
    assert!(spatial.jobs.iter().all(|j| j.family_time_ratio.is_empty()));
}

/// A running job restarted elsewhere in one round says where and why in
/// its history: off a drained node onto another of the same family
/// (its state stays running, so no transition says it), resized on its
/// node, or moved to other GPUs of it. A kept group, a job of a lost
/// node (its transitions say it) and a merge decided this round (the
/// merge event says it) write nothing here.
#[test]
fn a_job_restarted_within_its_family_says_so_in_its_history() {
    let mut nodes = vec![node("a", 4), node("b", 4)];
    nodes[1].drained = true;
    let mut j = job("long", "qqp", JobState::Running, 4);
    (j.holds, j.iteration, j.progress) = ((0..4).map(|g| (1, g)).collect(), 2380, 0.1);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let v = view(nodes.clone(), vec![j.clone()]);
    let d = run(&v, "ymir", &cfg);
    assert_eq!(
        d.outcome.groups[0].gpus,
        (0..4).map(|g| (0, g)).collect::<Vec<_>>()
    );
    assert_eq!(
        restarts(&v, &d.outcome.groups),
        vec![(
            0,
            "moved",
            "moved from b to a (4 GPUs) (node b is drained), from its checkpoint \
             (iteration 2380)"
                .to_string()
        )]
    );
    // The round's transitions say nothing of it: running stays running.
    assert!(d.outcome.transitions.is_empty(), "{d:?}");

    nodes[1].drained = false;
    let v = view(nodes.clone(), vec![j.clone()]);
    let on = |gpus: Vec<Gpu>, kept: bool| vec![Group::new(vec![0], MergeMode::Normal, gpus, kept)];
    assert_eq!(
        restarts(&v, &on(vec![(1, 0), (1, 1)], false)),
        vec![(
            0,
            "resized",
            "resized from 4 to 2 GPUs on b, from its checkpoint (iteration 2380)".to_string()
        )]
    );
    let mut two = j.clone();
    two.holds = vec![(1, 0), (1, 1)];
    let v2 = view(nodes.clone(), vec![two]);
    assert_eq!(
        restarts(&v2, &on(vec![(1, 2), (1, 3)], false)),
        vec![(
            0,
            "moved",
            "moved to other GPUs of b (2), from its checkpoint (iteration 2380)".to_string()
        )]
    );
    assert_eq!(
        restarts(&v2, &on(vec![(0, 0), (0, 1), (1, 0), (1, 1)], false))[0].2,
        "resized from 2 to 4 GPUs on a+b, from its checkpoint (iteration 2380)"
    );
    assert!(restarts(&v, &on((0..4).map(|g| (1, g)).collect(), true)).is_empty());
    let mut merged = on((0..4).map(|g| (0, g)).collect(), false);
    merged[0].new_merge = Some((1.2, 1.0));
    assert!(restarts(&v, &merged).is_empty());
    nodes[1].state = NodeState::Offline;
    let v = view(nodes, vec![j]);
    assert!(restarts(&v, &on((0..4).map(|g| (0, g)).collect(), false)).is_empty());
}

/// A job that does not fit the V100s, with the A100 node held by a job
/// that could run there: once it has waited longer than the move
/// costs (30 s of restart and 900 s more on V100s, twice as slow), the
/// round moves the other job to the V100 node, says so, and runs the
/// waiting one on the A100s; before, it waits and nothing moves.
#[test]
fn tail_a_job_that_fits_some_families_only_gets_room_in_the_round() {
    let mut nodes = vec![node("v100", 4), node("a100", 4)];
    nodes[0].gpu_model = "V100".into();
    let mut long = job("long", "qqp", JobState::Running, 4);
    (long.holds, long.iteration, long.progress) = ((0..4).map(|g| (1, g)).collect(), 700, 0.1);
    long.family_time_ratio = vec![("V100".into(), 2.0)];
    let mut big = job("big", "alpaca", JobState::Queued, 4);
    big.unfit_families = vec!["V100".into()];
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let at = |now: f64| {
        let mut v = view(nodes.clone(), vec![long.clone(), big.clone()]);
        v.now = now;
        let d = run(&v, "ymir", &cfg);
        (restarts(&v, &d.outcome.groups), d)
    };
    let (moves, d) = at(2000.0);
    let on = |d: &Decision, j: usize| {
        d.outcome
            .groups
            .iter()
            .find(|g| g.jobs == vec![j])
            .map(|g| g.gpus.clone())
    };
    assert_eq!(on(&d, 1), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
    assert_eq!(
        moves,
        vec![(
            0,
            "moved",
            "moved from A100 to V100 GPUs (4 on v100), from its checkpoint (iteration 700)"
                .to_string()
        )]
    );
    let (moves, d) = at(500.0);
    assert_eq!(on(&d, 0), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
    assert_eq!(on(&d, 1), None);
    assert!(moves.is_empty());
    // Its history says why it waits though the plan ran it.
    assert_eq!(
        d.outcome.unplaced,
        vec![(
            1,
            "waiting: the plan runs it on 4 GPUs, but placement found no room for them \
             on GPUs other than V100 (its model does not fit those)"
                .to_string()
        )]
    );
    assert_eq!(d.outcome.stats.unplaced_jobs, vec![(1, 4)]);
}

/// Both jobs fit the A100 node only; the one running there has 36,000
/// s left, the one waiting 1,000 s: Ymir's round suspends the longer
/// one for the shorter (placement's rule 6) and its history names the
/// job its GPUs went to; with `displace_longer` off it runs on.
#[test]
fn tail_a_job_that_fits_some_families_only_takes_gpus_from_a_longer_one_in_the_round() {
    let mut nodes = vec![node("v100", 4), node("a100", 4)];
    nodes[0].gpu_model = "V100".into();
    let mut long = job("long", "alpaca", JobState::Running, 4);
    (long.holds, long.iteration, long.progress) = ((0..4).map(|g| (1, g)).collect(), 700, 0.1);
    let mut short = job("short", "dolly", JobState::Queued, 4);
    for j in [&mut long, &mut short] {
        j.unfit_families = vec!["V100".into()];
    }
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let mut v = view(nodes, vec![long, short]);
    v.now = 2000.0;
    let decide_with = |knobs: &[(&str, f64)]| {
        let knobs = knobs.iter().map(|(k, x)| (k.to_string(), *x)).collect();
        let policy = crate::policy::with_knobs("ymir", &knobs).unwrap();
        let p = prepare(&v, policy.as_ref(), &cfg);
        let mut e = estimates(&p, 3600.0);
        e.jobs = vec![linear(&p, 4.0 * 36_000.0), linear(&p, 4.0 * 1000.0)];
        decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap()
    };
    let on = |d: &Decision, j: usize| {
        d.outcome
            .groups
            .iter()
            .find(|g| g.jobs == vec![j])
            .map(|g| g.gpus.clone())
    };
    let d = decide_with(&[]);
    assert_eq!(on(&d, 1), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
    assert_eq!(on(&d, 0), None);
    let why = d
        .outcome
        .transitions
        .iter()
        .find(|t| t.job == 0)
        .map(|t| t.reason.clone())
        .unwrap_or_default();
    assert_eq!(
        why,
        format!(
            "suspended from its checkpoint (iteration 700): its GPUs go to job {}, which has \
             less left to run and fits only some GPU families (shortest remaining time first)",
            v.jobs[1].id
        )
    );
    let d = decide_with(&[("displace_longer", 0.0)]);
    assert_eq!(on(&d, 0), Some((0..4).map(|g| (1, g)).collect()), "{d:?}");
    assert_eq!(on(&d, 1), None);
}

/// A group runs on one GPU family, so a job that may grow past what one
/// family holds is offered the most one family holds, not the
/// cluster's GPUs: on 6 A100s and 2 + 2 H100s, a job of up to 100 GPUs
/// runs on the 6 A100s (it was planned on all 10, placement found no
/// room for them, and it waited on an empty cluster). Its own
/// `gpu_model` narrows the offer to that family (over one node when a
/// group may not span nodes), and a family its model does not fit is
/// not offered.
#[test]
fn a_job_is_offered_no_more_gpus_than_one_gpu_family_holds() {
    let mut nodes = vec![node("a100", 6), node("h100-1", 2), node("h100-2", 2)];
    nodes[1].gpu_model = "H100".into();
    nodes[2].gpu_model = "H100".into();
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    for policy in ["ymir", "pollux"] {
        let mut big = job("big", "cola", JobState::Queued, 1);
        big.max_gpus = 100;
        let d = run(&view(nodes.clone(), vec![big]), policy, &cfg);
        assert_eq!(d.snapshot.jobs[0].max_gpus, 6, "{policy}");
        assert!(d.outcome.unplaced.is_empty(), "{policy}: {d:?}");
        assert_eq!(d.outcome.groups.len(), 1, "{policy}: {d:?}");
        let gpus = &d.outcome.groups[0].gpus;
        // The widest size of the policy's set that one family holds
        // (Ymir's {0,1,2,3,4m}: 4).
        let widest = d.snapshot.allocations.iter().filter(|&&a| a <= 6).max();
        assert_eq!(Some(&(gpus.len() as u32)), widest, "{policy}: {d:?}");
        let families: BTreeSet<&str> = gpus.iter().map(|g| nodes[g.0].gpu_model.as_str()).collect();
        assert_eq!(families.len(), 1, "{policy}: {d:?}");
    }
    // Over nodes of one family only when a group may span nodes.
    let single = RoundConfig {
        max_nodes_per_group: Some(1),
        ..cfg.clone()
    };
    let mut big = job("big", "cola", JobState::Queued, 1);
    big.max_gpus = 100;
    big.gpu_model = Some("H100".into());
    let d = run(&view(nodes.clone(), vec![big.clone()]), "ymir", &cfg);
    assert_eq!(d.snapshot.jobs[0].max_gpus, 4);
    let d = run(&view(nodes.clone(), vec![big.clone()]), "ymir", &single);
    assert_eq!(d.snapshot.jobs[0].max_gpus, 2);
    // A family the model does not fit is never offered.
    big.gpu_model = None;
    big.unfit_families = vec!["A100".into()];
    let d = run(&view(nodes.clone(), vec![big]), "ymir", &cfg);
    assert_eq!(d.snapshot.jobs[0].max_gpus, 4);
    assert!(d.outcome.groups[0].gpus.iter().all(|g| g.0 > 0), "{d:?}");
}

/// A job whose model does not fit a family's GPUs profiles and runs on
/// the other family only, is estimated there, and on a cluster of that
/// family alone it waits with an event saying why; the jobs behind it
/// still profile.
#[test]
fn a_job_never_uses_a_family_its_model_does_not_fit() {
    let mut nodes = vec![node("v100", 4), node("a100", 4)];
    nodes[0].gpu_model = "V100".into();
    let mut big = job("big", "alpaca", JobState::Submitted, 1);
    big.unfit_families = vec!["V100".into()];
    let v = view(nodes.clone(), vec![big.clone()]);
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    assert_eq!(
        p.profiling[0].gpus,
        vec![(1, 0)],
        "profiles on the A100 node"
    );
    assert_eq!(estimate_shape(&v, &big).unwrap().0, "A100");
    big.state = JobState::Queued;
    big.holds = vec![(0, 0)];
    assert_eq!(
        estimate_shape(&view(nodes.clone(), vec![big.clone()]), &big)
            .unwrap()
            .0,
        "A100",
        "not estimated on the GPUs it holds but cannot run on"
    );
    big.holds.clear();
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let d = run(&view(nodes.clone(), vec![big.clone()]), "fifo", &cfg);
    assert!(
        d.outcome.groups[0].gpus.iter().all(|g| g.0 == 1),
        "{:?}",
        d.outcome.groups
    );
    let v100 = vec![nodes[0].clone()];
    let d = run(&view(v100.clone(), vec![big.clone()]), "fifo", &cfg);
    assert!(d.outcome.groups.is_empty());
    let why = &d.outcome.unschedulable[0].1;
    assert!(why.contains("does not fit the GPU memory of V100"), "{why}");
    let mut first = big.clone();
    first.state = JobState::Submitted;
    let v = view(
        v100,
        vec![first, job("small", "rte", JobState::Submitted, 1)],
    );
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    assert_eq!(
        p.profiling.len(),
        1,
        "the job behind it profiles: {:?}",
        p.profiling
    );
    assert_eq!(p.profiling[0].job, 1);
}
