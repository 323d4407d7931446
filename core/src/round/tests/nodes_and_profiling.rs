//! Nodes, profiling reservations, drains, cordons and predictions.

use super::*;

/// An elastic job of two-GPU workers (Lyra) grows by whole workers,
/// each on one node: on two 3-GPU nodes lyra gives it 4 GPUs as 2 + 2
/// (one GPU a worker would take 3 + 1).
#[test]
fn lyra_workers_of_two_gpus_sit_on_one_node_each() {
    let mut j = job("w", "rte", JobState::Queued, 2);
    (j.min_gpus, j.max_gpus, j.requested_gpus) = (2, 4, 2);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let placed = |worker_gpus: u32| {
        let mut j = j.clone();
        j.worker_gpus = worker_gpus;
        let v = view(vec![node("x", 3), node("y", 3)], vec![j]);
        let d = run(&v, "lyra", &cfg);
        let mut per: BTreeMap<usize, u32> = BTreeMap::new();
        for g in &d.outcome.groups[0].gpus {
            *per.entry(g.0).or_default() += 1;
        }
        let mut parts: Vec<u32> = per.into_values().collect();
        parts.sort_unstable();
        parts
    };
    assert_eq!(placed(2), vec![2, 2]);
    assert_eq!(placed(1), vec![1, 3]);
}

/// A job is estimated on the family it asks for, else the one it runs
/// on, else the cluster's most plentiful; the node size is that
/// family's largest present node.
#[test]
fn estimates_use_the_asked_then_the_held_then_the_most_plentiful_family() {
    let fam = |id: &str, gpus: u32, m: &str| NodeView {
        gpu_model: m.into(),
        ..node(id, gpus)
    };
    let mut offline = fam("t-off", 8, "T4");
    offline.state = NodeState::Offline;
    let v = view(
        vec![
            fam("v0", 4, "V100"),
            fam("v1", 4, "V100"),
            fam("v2", 2, "V100"),
            fam("a0", 8, "A100"),
            fam("h0", 4, "H100"),
            offline,
        ],
        vec![],
    );
    let free = job("free", "rte", JobState::Queued, 1);
    assert_eq!(estimate_shape(&v, &free), Some(("V100".into(), 4)));
    let mut held = free.clone();
    held.holds = vec![(4, 0)];
    assert_eq!(estimate_shape(&v, &held), Some(("H100".into(), 4)));
    let mut asks = held.clone();
    asks.gpu_model = Some("A100".into());
    assert_eq!(estimate_shape(&v, &asks), Some(("A100".into(), 8)));
    asks.gpu_model = Some("T4".into());
    assert_eq!(
        estimate_shape(&v, &asks),
        None,
        "only an Offline node has T4"
    );
    // Holding GPUs of an Offline node whose family no present node has:
    // the cluster's family instead.
    held.holds = vec![(5, 0)];
    assert_eq!(estimate_shape(&v, &held), Some(("V100".into(), 4)));
    // Ties go to the first name.
    let tie = view(vec![fam("h", 8, "H100"), fam("a", 8, "A100")], vec![]);
    assert_eq!(estimate_shape(&tie, &free), Some(("A100".into(), 8)));
}

/// Whatever the caller estimated, an expert-parallel (or pipeline) job
/// cannot run on a part of a replica: those allocations are `+∞` in the
/// policy's snapshot; a cluster without a node wide enough for one
/// group says so.
#[test]
fn allocations_that_are_not_whole_replicas_are_infinite() {
    let policy = by_name("ymir").unwrap();
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let mut moe = job("moe", "rte", JobState::Queued, 8);
    moe.expert_parallel = 4;
    let dense = job("dense", "mrpc", JobState::Queued, 8);
    let v = view(vec![node("a", 4), node("b", 4)], vec![moe, dense]);
    let p = prepare(&v, policy.as_ref(), &cfg);
    let snap = snapshot(&v, &p, &estimates(&p, 3600.0), &cfg).unwrap();
    for (k, &a) in snap.allocations.iter().enumerate() {
        let (m, d) = (snap.jobs[0].remaining_s[k], snap.jobs[1].remaining_s[k]);
        assert_eq!(m.is_finite(), a > 0 && a % 4 == 0, "moe at {a}: {m}");
        assert_eq!(d.is_finite(), a > 0, "dense at {a}: {d}");
    }
    let why = never_fits(
        Replica::Experts(8),
        1,
        None,
        &[(4, "A100"), (4, "A100")],
        None,
    );
    assert!(why.is_some_and(|w| w.contains("needs 8 GPUs on one node")));
}

#[test]
fn restart_cost_is_checkpoint_plus_the_profiles_context_switch() {
    assert_eq!(restart_cost(30.0, Some(12.5)), 42.5);
    assert_eq!(restart_cost(0.0, None), DEFAULT_CONTEXT_SWITCH_S);
}

#[test]
fn fair_share_is_an_equal_share_capped_by_the_request() {
    assert_eq!(fair_share(8, 4, 4), 2.0);
    assert_eq!(fair_share(8, 2, 1), 1.0);
    assert_eq!(fair_share(8, 0, 4), 0.0);
}

/// Profiling takes free GPUs first, oldest job first, a pipeline job
/// one replica (4 GPUs) on one node; the walk stops at the first job that
/// finds nothing, and GPUs of running work are taken only under the
/// eighth-of-the-cluster cap.
#[test]
fn profiling_reserves_free_gpus_oldest_first_within_the_cap() {
    let mut running = job("r", "qqp", JobState::Running, 3);
    running.holds = vec![(0, 0), (0, 1), (0, 2)];
    let mut old = job("old", "rte", JobState::Submitted, 1);
    old.submitted_at = -10.0;
    let new = job("new", "mrpc", JobState::Submitted, 1);
    let mut pipe = job("pipe", "sst2", JobState::Submitted, 2);
    pipe.pipeline = true;
    pipe.submitted_at = 5.0;
    let v = view(
        vec![node("a", 4), node("b", 2)],
        vec![running, new, old, pipe],
    );
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    let got: Vec<(usize, Vec<Gpu>)> = p
        .profiling
        .iter()
        .map(|r| (r.job, r.gpus.clone()))
        .collect();
    // old (job 2) first on the free GPU (0,3); new takes (1,0); the
    // pipeline job needs 4 GPUs on one node — nowhere free, and taking
    // running work's GPUs would pass the cap of 6/8 → 1: it waits.
    assert_eq!(got, vec![(2, vec![(0, 3)]), (1, vec![(1, 0)])]);
    // Capacity for the policy: node a loses its reserved GPU.
    assert_eq!(p.capacity, vec![3, 1]);
    // Unprofiled jobs stay out of the snapshot.
    assert_eq!(p.jobs, vec![0]);
}

/// A prompt-tuning job (skip_profiling) takes no profiling run: it is
/// in the policy's snapshot from its first round, beside a fine-tuning
/// job submitted with it that profiles first.
#[test]
fn a_job_that_skips_profiling_is_scheduled_at_once() {
    let mut prompt = job("p", "samsum", JobState::Submitted, 1);
    prompt.skip_profiling = true;
    let fine = job("f", "rte", JobState::Submitted, 1);
    let v = view(vec![node("a", 4)], vec![prompt, fine]);
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    let profiled: Vec<usize> = p.profiling.iter().map(|r| r.job).collect();
    assert_eq!(profiled, vec![1], "only the fine-tuning job profiles");
    assert_eq!(p.jobs, vec![0], "the prompt-tuning job is scheduled now");
}

#[test]
fn a_suspect_node_keeps_what_it_runs_and_a_drained_one_gives_nothing() {
    let mut a = job("a", "qqp", JobState::Running, 2);
    a.holds = vec![(0, 0), (0, 1)];
    let mut nodes = vec![node("s", 4), node("d", 4), node("off", 4)];
    nodes[0].state = NodeState::Suspect;
    nodes[1].drained = true;
    nodes[2].state = NodeState::Offline;
    let v = view(nodes, vec![a]);
    let p = prepare(
        &v,
        by_name("ymir").unwrap().as_ref(),
        &RoundConfig::default(),
    );
    assert_eq!(p.nodes, vec![0, 1], "the offline node is out");
    assert_eq!(p.capacity, vec![2, 0]);
    assert_eq!(p.total_gpus, 8);
}

/// An operator's cordon: the running job keeps its GPUs, the queued
/// one does not start there though GPUs are free, and no new profiling
/// run lands there.
#[test]
fn a_cordoned_node_keeps_what_runs_there_and_takes_nothing_new() {
    let mut a = job("a", "qqp", JobState::Running, 2);
    a.holds = vec![(0, 0), (0, 1)];
    let b = job("b", "rte", JobState::Queued, 2);
    let c = job("c", "mrpc", JobState::Submitted, 1);
    let mut nodes = vec![node("c", 4)];
    nodes[0].cordoned = true;
    let v = view(nodes, vec![a, b, c]);
    let policy = by_name("srtf").unwrap();
    let p = prepare(&v, policy.as_ref(), &RoundConfig::default());
    assert!(
        p.profiling.is_empty(),
        "no new profiling run: {:?}",
        p.profiling
    );
    assert_eq!(p.capacity, vec![2], "what runs there");
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let d = run(&v, "srtf", &cfg);
    let ga = d.outcome.groups.iter().find(|g| g.jobs == [0]).unwrap();
    assert!(ga.kept);
    assert!(d.outcome.groups.iter().all(|g| !g.jobs.contains(&1)));
    // Uncordoned, b starts on the free GPUs.
    let mut v = v;
    v.nodes[0].cordoned = false;
    let d = run(&v, "srtf", &cfg);
    assert!(d.outcome.groups.iter().any(|g| g.jobs == [1]));
}

/// Predictions: a placed job finishes after its remaining time at its
/// GPUs; it is at risk past its deadline; a waiting job is at risk
/// only when even its fastest allocation started now misses.
#[test]
fn predictions_give_finish_times_and_deadline_risk() {
    let mut a = job("a", "qqp", JobState::Queued, 4);
    a.deadlines = crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(3000.0));
    let mut b = job("b", "rte", JobState::Queued, 4);
    b.deadlines = crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(500.0));
    let v = view(vec![node("n", 4)], vec![a, b]);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("edf").unwrap();
    let p = prepare(&v, policy.as_ref(), &cfg);
    let e = estimates(&p, 3600.0);
    let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
    let pr = predictions(&v, &p, &e, &d.outcome);
    // EDF runs b (earliest deadline) on the node; a waits.
    let pb = pr.iter().find(|x| x.job == 1).unwrap();
    let pa = pr.iter().find(|x| x.job == 0).unwrap();
    let placed = d.outcome.groups.iter().find(|g| g.jobs == [1]).unwrap();
    let k = p
        .allocations
        .iter()
        .position(|&x| x == placed.gpus.len() as u32)
        .unwrap();
    assert_eq!(pb.finish_in, Some(e.jobs[1][k]));
    // 3600 GPU-seconds on 4 GPUs: 900 s, past b's 500 s.
    assert!(
        pb.at_risk,
        "b needs {:?} s, its deadline is in 500 s",
        pb.finish_in
    );
    assert_eq!(pa.finish_in, None);
    let best = e.jobs[0].iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(pa.at_risk, best > 3000.0);
    // Before any agent registers the cluster has no GPUs and runs
    // nothing: no job is "at risk" for that (a first round used to
    // flag every deadline job "no allocation can run it", once).
    let mut empty = v.clone();
    empty.nodes.clear();
    let p = prepare(&empty, policy.as_ref(), &cfg);
    let e = Estimates {
        jobs: p
            .jobs
            .iter()
            .map(|_| vec![f64::INFINITY; p.allocations.len()])
            .collect(),
        ..Default::default()
    };
    let d = decide(&empty, &p, &e, policy.as_ref(), &cfg).unwrap();
    let pr = predictions(&empty, &p, &e, &d.outcome);
    assert_eq!(pr.len(), 2);
    assert!(
        pr.iter().all(|x| !x.at_risk && x.best_in.is_none()),
        "{pr:?}"
    );
}

/// Profiling takes GPUs from training up to `profiling_share` of the
/// cluster (at least one).
#[test]
fn profiling_takes_at_most_its_share_from_training() {
    let mut a = job("a", "qqp", JobState::Running, 8);
    a.holds = (0..8).map(|g| (0, g)).collect();
    let mut jobs = vec![a];
    for (k, t) in ["rte", "mrpc", "cola", "stsb"].iter().enumerate() {
        let mut j = job(&format!("s{k}"), t, JobState::Submitted, 1);
        j.submitted_at = k as f64;
        jobs.push(j);
    }
    let v = view(vec![node("n", 8)], jobs);
    let policy = by_name("srtf").unwrap();
    let reserved = |share: f64| {
        let cfg = RoundConfig {
            profiling_share: share,
            ..Default::default()
        };
        prepare(&v, policy.as_ref(), &cfg).profiling.len()
    };
    assert_eq!(reserved(DEFAULT_PROFILING_SHARE), 1, "an eighth of 8");
    assert_eq!(reserved(0.5), 4);
    assert_eq!(reserved(0.01), 1, "at least one");
}

/// A drained node: its job moves to a node with room, or, with none,
/// is queued saying why.
#[test]
fn a_drained_nodes_jobs_move_off_or_wait_saying_why() {
    let mut a = job("a", "qqp", JobState::Running, 2);
    a.holds = vec![(0, 0), (0, 1)];
    a.iteration = 40;
    let mut nodes = vec![node("d", 4), node("n", 2)];
    nodes[0].drained = true;
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let v = view(nodes.clone(), vec![a.clone()]);
    let d = run(&v, "srtf", &cfg);
    let g = d.outcome.groups.iter().find(|g| g.jobs == [0]).unwrap();
    assert_eq!(g.gpus, vec![(1, 0), (1, 1)], "moved to n");
    let v = view(vec![nodes[0].clone()], vec![a]);
    let d = run(&v, "srtf", &cfg);
    assert!(d.outcome.groups.is_empty());
    assert_eq!(
        d.outcome.transitions,
        vec![Transition {
            job: 0,
            to: JobState::Queued,
            reason: "node d is drained: moved off from its checkpoint (iteration 40)".into()
        }]
    );
}

#[test]
fn a_group_that_keeps_its_node_and_size_keeps_its_gpus() {
    let mut a = job("a", "qqp", JobState::Running, 2);
    a.holds = vec![(0, 1), (0, 3)];
    let b = job("b", "rte", JobState::Queued, 2);
    let v = view(vec![node("n", 4)], vec![a, b]);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let d = run(&v, "srtf", &cfg);
    let ga = d.outcome.groups.iter().find(|g| g.jobs == [0]).unwrap();
    assert!(ga.kept);
    assert_eq!(ga.gpus, vec![(0, 1), (0, 3)]);
    let gb = d.outcome.groups.iter().find(|g| g.jobs == [1]).unwrap();
    assert!(!gb.kept);
    assert_eq!(gb.gpus, vec![(0, 0), (0, 2)], "the free GPUs");
    assert_eq!(d.outcome.switches, 1);
    assert_eq!(
        d.outcome.transitions,
        vec![Transition {
            job: 1,
            to: JobState::Running,
            reason: "placed on n (2 GPUs) by ymir".into()
        }]
    );
}

#[test]
fn jobs_of_an_offline_node_are_requeued_naming_it() {
    let mut a = job("a", "qqp", JobState::Running, 4);
    a.holds = (0..4).map(|g| (1, g)).collect();
    a.iteration = 120;
    let mut nodes = vec![node("up", 2), node("gone", 4)];
    nodes[1].state = NodeState::Offline;
    let cfg = RoundConfig {
        profiling: false,
        max_nodes_per_group: Some(1),
        ..Default::default()
    };
    let d = run(&view(nodes, vec![a]), "srtf", &cfg);
    // Offered at most the largest remaining node: 2 GPUs there.
    assert_eq!(d.snapshot.jobs[0].max_gpus, 2);
    assert_eq!(d.snapshot.jobs[0].current_gpus, 0);
    assert_eq!(d.outcome.groups[0].gpus, vec![(0, 0), (0, 1)]);
    // Placed again in the same round, it still goes through `queued`:
    // its history names the lost node.
    let moves: Vec<(JobState, &str)> = d
        .outcome
        .transitions
        .iter()
        .map(|t| (t.to, t.reason.as_str()))
        .collect();
    assert_eq!(
        moves,
        vec![
            (
                JobState::Queued,
                "node gone is offline: re-queued from its last checkpoint (iteration 120)"
            ),
            (JobState::Running, "placed on up (2 GPUs) by ymir"),
        ]
    );
    let mut gone = job("b", "rte", JobState::Running, 4);
    gone.holds = (0..4).map(|g| (1, g)).collect();
    gone.iteration = 7;
    gone.min_gpus = 4;
    let mut nodes = vec![node("up", 2), node("gone", 4)];
    nodes[1].state = NodeState::Offline;
    let d = run(&view(nodes, vec![gone]), "srtf", &cfg);
    assert_eq!(
        d.outcome.transitions[0].reason,
        "node gone is offline: re-queued from its last checkpoint (iteration 7)"
    );
}

/// A spread the executor cannot run is named on the job, never dropped.
#[test]
fn a_placement_over_several_nodes_is_reported_when_the_executor_cannot_run_it() {
    let mut a = job("a", "qqp", JobState::Running, 2);
    a.holds = vec![(0, 0), (0, 1)];
    let mut b = job("b", "rte", JobState::Running, 2);
    b.holds = vec![(1, 0), (1, 1)];
    let c = job("c", "mrpc", JobState::Queued, 3);
    let v = view(vec![node("x", 4), node("y", 4)], vec![a, b, c]);
    let single = RoundConfig {
        profiling: false,
        max_nodes_per_group: Some(1),
        ..Default::default()
    };
    let d = run(&v, "srtf", &single);
    assert_eq!(d.outcome.unexecutable.len(), 1, "{:?}", d.outcome);
    assert_eq!(d.outcome.unexecutable[0].0, 2);
    assert!(
        d.outcome.unexecutable[0].1.contains("over nodes x, y"),
        "{}",
        d.outcome.unexecutable[0].1
    );
    assert!(d.outcome.groups.iter().all(|g| g.jobs != [2]));
    // An executor that runs gangs runs it.
    let any = RoundConfig {
        max_nodes_per_group: None,
        ..single
    };
    let d = run(&v, "srtf", &any);
    assert!(d.outcome.unexecutable.is_empty());
    let g = d.outcome.groups.iter().find(|g| g.jobs == [2]).unwrap();
    assert_eq!(g.nodes(), vec![0, 1]);
}
