//! Queues: guarantees, limits, rigid policies' budgets.

use super::*;

/// Queue b holds all 8 GPUs with two 4-GPU jobs; queue a (guarantee
/// 4) submits one: b's later job is suspended from its checkpoint in
/// that same round and a's runs, under every policy.
#[test]
fn a_queue_below_its_guarantee_gets_its_gpus_back_in_one_round() {
    let mut b1 = job("b1", "qqp", JobState::Running, 4);
    b1.holds = (0..4).map(|g| (0, g)).collect();
    b1.min_gpus = 4;
    let mut b2 = job("b2", "rte", JobState::Running, 4);
    b2.holds = (0..4).map(|g| (1, g)).collect();
    b2.min_gpus = 4;
    b2.submitted_at = 1.0;
    let mut a1 = job("a1", "mrpc", JobState::Queued, 4);
    a1.min_gpus = 4;
    a1.submitted_at = 2.0;
    b1.queue = "b".into();
    b2.queue = "b".into();
    a1.queue = "a".into();
    let v = view(vec![node("x", 4), node("y", 4)], vec![b1, b2, a1]);
    for policy in ["fifo", "srtf", "ymir", "tiresias"] {
        let cfg = RoundConfig {
            profiling: false,
            queues: two_queues(4, None, 4, None),
            ..Default::default()
        };
        let d = run(&v, policy, &cfg);
        let u = usage(&v, &d.outcome);
        assert_eq!(u.get("a"), Some(&4), "{policy}: {:?}", d.outcome.groups);
        let t = d.outcome.transitions.iter().find(|t| t.job == 1).unwrap();
        assert_eq!(t.to, JobState::Queued, "{policy}");
        assert!(
            t.reason.starts_with("preempted: queue b may use 4 GPUs"),
            "{policy}: {}",
            t.reason
        );
        // Without queues FIFO keeps b's jobs and a waits.
        if policy == "fifo" {
            let d = run(
                &v,
                policy,
                &RoundConfig {
                    profiling: false,
                    ..Default::default()
                },
            );
            assert_eq!(usage(&v, &d.outcome).get("a"), None, "{policy}");
        }
    }
}

/// Queue a may use 6 GPUs (its limit) and its job asks for 8 (it can
/// run on 1 to 8). A rigid policy never grows a job later, so the job
/// waits for room for all 8 rather than starting on 6 and staying
/// there; an elastic policy starts it on 6 and may grow it later.
#[test]
fn a_rigid_policy_admits_a_job_only_at_its_requested_size() {
    let mut a1 = job("a1", "qqp", JobState::Queued, 8);
    a1.queue = "a".into();
    a1.min_gpus = 1;
    let v = view(vec![node("x", 8)], vec![a1]);
    let cfg = RoundConfig {
        profiling: false,
        queues: two_queues(0, Some(6), 0, None),
        ..Default::default()
    };
    for policy in [
        "fifo", "srtf", "tiresias", "themis", "edf", "hydra", "chronus",
    ] {
        let d = run(&v, policy, &cfg);
        assert_eq!(usage(&v, &d.outcome).get("a"), None, "{policy}");
        let (_, why) = d.outcome.unexecutable.iter().find(|u| u.0 == 0).unwrap();
        assert!(why.contains("queue a may use 6 GPUs"), "{policy}: {why}");
    }
    for policy in ["optimus", "pollux", "ymir"] {
        let d = run(&v, policy, &cfg);
        let held = usage(&v, &d.outcome).get("a").copied().unwrap_or(0);
        assert!((1..=6).contains(&held), "{policy}: {held}");
    }
}

/// Queue a may use 4 GPUs and has two waiting 4-GPU jobs: a long one
/// submitted first and a short one. The queue's share is the quota
/// pass's to set, the choice between them the policy's: FIFO starts
/// the first, SRTF the short one, and a higher priority goes before
/// both; the other waits, told its queue's share.
#[test]
fn a_rigid_policy_orders_its_queues_jobs_within_their_share() {
    let mut long = job("long", "qqp", JobState::Queued, 4);
    long.min_gpus = 4;
    let mut short = job("short", "rte", JobState::Queued, 4);
    short.min_gpus = 4;
    short.submitted_at = 1.0;
    for j in [&mut long, &mut short] {
        j.queue = "a".into();
    }
    let v = view(vec![node("x", 8)], vec![long, short]);
    let cfg = RoundConfig {
        profiling: false,
        queues: two_queues(4, Some(4), 4, None),
        ..Default::default()
    };
    let started = |v: &ClusterView, policy: &str| {
        let pol = by_name(policy).unwrap();
        let p = prepare(v, pol.as_ref(), &cfg);
        let mut e = estimates(&p, 3600.0);
        for (k, &i) in p.jobs.iter().enumerate() {
            let work = if v.jobs[i].id == "long" {
                36000.0
            } else {
                3600.0
            };
            e.jobs[k] = linear(&p, work);
        }
        let d = decide(v, &p, &e, pol.as_ref(), &cfg).unwrap();
        assert_eq!(usage(v, &d.outcome).get("a"), Some(&4), "{policy}");
        let waits = d
            .outcome
            .unexecutable
            .iter()
            .find(|u| !d.outcome.groups.iter().any(|g| g.jobs.contains(&u.0)));
        assert!(
            waits.is_some_and(|(_, why)| why.contains("queue a may use 4 GPUs")),
            "{policy}: {:?}",
            d.outcome.unexecutable
        );
        let g = &d.outcome.groups[0];
        v.jobs[g.jobs[0]].id.clone()
    };
    assert_eq!(started(&v, "fifo"), "long");
    assert_eq!(started(&v, "srtf"), "short");
    assert_eq!(
        started(&v, "tiresias"),
        "long",
        "equal service: FIFO within its queue"
    );
    let mut v = v;
    v.jobs[0].priority = 1;
    assert_eq!(
        started(&v, "srtf"),
        "long",
        "priority before the policy's order"
    );
}

/// Profiling may suspend a running job for its GPU, never a running
/// non-preemptible one (its GPUs are pinned to it).
#[test]
fn profiling_never_takes_a_non_preemptible_jobs_gpus() {
    let mut pinned = job("pinned", "qqp", JobState::Running, 1);
    pinned.holds = vec![(0, 0)];
    let new = job("new", "rte", JobState::Submitted, 1);
    let cfg = RoundConfig::default();
    assert!(cfg.profiling);
    let v = view(vec![node("x", 1)], vec![pinned.clone(), new.clone()]);
    assert_eq!(
        run(&v, "ymir", &cfg).outcome.profiling.len(),
        1,
        "a preemptible job gives way"
    );
    pinned.preemptible = false;
    let v = view(vec![node("x", 1)], vec![pinned, new]);
    let d = run(&v, "ymir", &cfg);
    assert!(d.outcome.profiling.is_empty(), "{:?}", d.outcome.profiling);
    assert!(d.outcome.groups.iter().any(|g| g.jobs == [0] && g.kept));
}

/// A queue at its limit: its waiting job waits, told why, while the
/// cluster has free GPUs.
#[test]
fn a_queue_at_its_limit_waits_with_the_reason() {
    let mut a1 = job("a1", "qqp", JobState::Running, 2);
    a1.holds = vec![(0, 0), (0, 1)];
    a1.queue = "a".into();
    a1.min_gpus = 2;
    let mut a2 = job("a2", "rte", JobState::Queued, 2);
    a2.queue = "a".into();
    a2.min_gpus = 2;
    a2.submitted_at = 1.0;
    let v = view(vec![node("x", 8)], vec![a1, a2]);
    let cfg = RoundConfig {
        profiling: false,
        queues: two_queues(0, Some(2), 0, None),
        ..Default::default()
    };
    let d = run(&v, "srtf", &cfg);
    assert_eq!(usage(&v, &d.outcome).get("a"), Some(&2));
    let (_, why) = d.outcome.unexecutable.iter().find(|u| u.0 == 1).unwrap();
    assert!(
        why.contains("queue a may use 2 GPUs this round (guarantee 0, limit 2)"),
        "{why}"
    );
}
