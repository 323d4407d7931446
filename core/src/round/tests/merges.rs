//! Merge candidates, kept and released merges, warm starts.

use super::*;

/// Eligible pairs: one model, different tasks, sharing, never merged,
/// one training setup; temporal both ways, spatial once; neither of a
/// spatial pair started, and B of a temporal one not started (A may
/// have trained: B then starts from where A ends).
#[test]
fn merge_candidates_are_filtered_before_anything_is_estimated() {
    let mut jobs = vec![
        job("a", "rte", JobState::Queued, 1),
        job("b", "mrpc", JobState::Queued, 1),
        job("c", "rte", JobState::Queued, 1), // same task as a
        job("d", "qqp", JobState::Queued, 1),
        job("e", "sst2", JobState::Queued, 1),
        job("f", "cola", JobState::Queued, 1), // trains differently
    ];
    jobs[3].sharing = false;
    jobs[4].progress = 0.1;
    jobs[5].merge_setup = "amp=true ckpt=false petl=lora frozen=0".into();
    let v = view(vec![node("n", 4)], jobs);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let p = prepare(&v, by_name("ymir").unwrap().as_ref(), &cfg);
    let key = |a, b, mode| PairKey { a, b, mode };
    use MergeMode::*;
    assert_eq!(
        p.eligible,
        vec![
            key(0, 1, Temporal),
            key(0, 1, Spatial),
            key(1, 0, Temporal),
            key(1, 2, Temporal),
            key(1, 2, Spatial),
            key(2, 1, Temporal),
            // e has trained: only as the A of a temporal pair.
            key(4, 0, Temporal),
            key(4, 1, Temporal),
            key(4, 2, Temporal),
        ]
    );
    // A baseline merges nothing: no candidates at all.
    let p = prepare(&v, by_name("srtf").unwrap().as_ref(), &cfg);
    assert!(p.eligible.is_empty());
}

/// Ymir's round on one temporal pair a ↦ b (`helpful_temporal`, its
/// `TranWt` set to `tran_wt` where given), the two jobs queued on one
/// 2-GPU node.
fn decide_temporal(a: JobView, b: JobView, tran_wt: Option<f64>) -> Decision {
    let v = view(vec![node("n", 2)], vec![a, b]);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let p = prepare(&v, policy.as_ref(), &cfg);
    let mut e = estimates(&p, 3600.0);
    let mut c = helpful_temporal(&p, 0, 1);
    if let Some(w) = tran_wt {
        for x in c.tran_wt.iter_mut().filter(|x| **x > 0.0) {
            *x = w;
        }
    }
    e.candidates.push(c);
    decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap()
}

/// How many candidates Ymir's round keeps of one temporal pair a ↦ b
/// ([`decide_temporal`]).
fn temporal_candidates(a: JobView, b: JobView, tran_wt: Option<f64>) -> usize {
    decide_temporal(a, b, tran_wt).snapshot.candidates.len()
}

/// Merging with deadlines: a pair whose best time would make B (of a
/// temporal pair) miss its deadline is no candidate; with a deadline
/// it can meet, or one only on A, it stays one.
#[test]
fn a_merge_that_would_miss_a_deadline_is_no_candidate() {
    let steps = |by: f64| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by));
    let candidates = |deadline_a: Option<f64>, deadline_b: Option<f64>| {
        let mut a = job("a", "rte", JobState::Queued, 1);
        let mut b = job("b", "mrpc", JobState::Queued, 1);
        a.deadlines = deadline_a.map(steps).unwrap_or_default();
        b.deadlines = deadline_b.map(steps).unwrap_or_default();
        temporal_candidates(a, b, None)
    };
    // The pair's best: A on 2 GPUs (1800 s), then B from A's weights
    // (180 s) after its restart (30 s).
    assert_eq!(candidates(None, None), 1);
    assert_eq!(candidates(None, Some(1000.0)), 0, "B would miss");
    assert_eq!(candidates(None, Some(5000.0)), 1, "B makes it");
    assert_eq!(candidates(Some(1000.0), None), 1, "A trains as alone");
}

/// The temporal candidate a ↦ b's time at 1 and 2 GPUs, the two jobs
/// asking for 2 ([`decide_temporal`]; A needs 3600 / x s, B from A's
/// weights 360 / x s after its 30 s restart); infinite where it is no
/// candidate.
fn pair_times(a: JobView, b: JobView) -> [f64; 2] {
    let d = decide_temporal(a, b, None);
    assert!(d.snapshot.allocations.starts_with(&[0, 1, 2]));
    let Some(c) = d.snapshot.candidates.first() else {
        return [f64::INFINITY; 2];
    };
    [c.remaining_s[1], c.remaining_s[2]]
}

/// A pair that meets B's deadline at its best allocation but not at a
/// smaller one may not run at the smaller one: the policy could give
/// it those GPUs, and B would miss. Its time there is infinite.
#[test]
fn a_merge_may_not_run_where_it_would_miss_a_deadline() {
    let steps = |by: f64| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by));
    let a = || job("a", "rte", JobState::Queued, 2);
    let b = || job("b", "mrpc", JobState::Queued, 2);
    assert_eq!(pair_times(a(), b()), [3990.0, 2010.0]);
    let mut due_b = b();
    due_b.deadlines = steps(3000.0);
    assert_eq!(pair_times(a(), due_b), [f64::INFINITY, 2010.0]);
}

/// A of a temporal pair that trains now is launched again to evaluate
/// B: the merge costs it a restart, so an allocation at which its own
/// time plus that restart misses its deadline is no option (it missed
/// by its restart on generated SLO workloads). A that has not started
/// pays its start alone too, and its deadline does not bind the pair.
#[test]
fn a_merge_may_not_make_its_running_a_miss_by_a_restart() {
    let steps = |by: f64| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by));
    let b = || job("b", "mrpc", JobState::Queued, 2);
    let a = |running: bool, by: f64| {
        let mut a = job("a", "rte", JobState::Queued, 2);
        if running {
            a.state = JobState::Running;
            a.holds = vec![(0, 0), (0, 1)];
        }
        a.deadlines = steps(by);
        a
    };
    // A alone needs 1800 s on 2 GPUs, and 1830 s with the restart.
    assert_eq!(pair_times(a(true, 1820.0), b()), [f64::INFINITY; 2]);
    assert_eq!(pair_times(a(true, 1840.0), b()), [f64::INFINITY, 2010.0]);
    assert_eq!(pair_times(a(false, 1820.0), b()), [3990.0, 2010.0]);
}

/// A pair whose `TranWt` is 1 at every allocation (B needs as many
/// epochs from A's weights as alone) gains nothing and is no candidate
/// (`policy::merge_gains`); the same pair with a gain is one.
#[test]
fn tail_a_pair_without_gain_is_no_candidate() {
    let candidates = |w: f64| {
        temporal_candidates(
            job("a", "rte", JobState::Queued, 1),
            job("b", "mrpc", JobState::Queued, 1),
            Some(w),
        )
    };
    assert_eq!(candidates(1.0), 0, "no gain");
    assert_eq!(candidates(1.01), 1, "a gain");
}

/// One process trains a merge, so it never runs below either job's
/// `min_gpus`: a candidate pair with a job that needs 8 GPUs has no
/// time at fewer, and a kept merge with one neither (found when the
/// 40-job e2e's 8-GPU gangs were merged and placed on 1 GPU).
/// A finished job of the model whose weights a new job may start from.
fn finished(id: &str, task: &str) -> FinishedView {
    FinishedView {
        id: id.into(),
        model: "roberta-base".into(),
        task: task.into(),
        sharing: true,
        pipeline: false,
        merge_setup: String::new(),
        queue: String::new(),
    }
}

/// The warm start of job `job` from `from` at `work` seconds of work.
fn warm(p: &Prepared, job: usize, from: usize, work: f64) -> WarmEstimate {
    WarmEstimate {
        key: WarmKey { job, from },
        seconds: linear(p, work),
        gain: 0.3,
    }
}

/// A new job starts from the finished job whose weights save it the
/// most (Eq. 12 with A done: `T_B / T_{A↦B}`), its times in the
/// policy's snapshot are those from the weights, the outcome names the
/// start, and it is no candidate for a new merge that round.
#[test]
fn tail_a_new_job_starts_from_the_finished_job_that_saves_it_most() {
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let mut v = view(
        vec![node("a", 4)],
        vec![
            job("b", "snli", JobState::Queued, 4),
            job("other", "mrpc", JobState::Queued, 4),
        ],
    );
    v.finished = vec![finished("rte-done", "rte"), finished("qnli-done", "qnli")];
    let p = prepare(&v, policy.as_ref(), &cfg);
    // Both jobs may start from both finished ones.
    assert_eq!(
        p.warm,
        vec![
            WarmKey { job: 0, from: 0 },
            WarmKey { job: 0, from: 1 },
            WarmKey { job: 1, from: 0 },
            WarmKey { job: 1, from: 1 },
        ]
    );
    let mut e = estimates(&p, 3600.0);
    e.warm = vec![warm(&p, 0, 0, 2520.0), warm(&p, 0, 1, 3000.0)];
    assert_eq!(chosen_warm_starts(&p, &e), BTreeMap::from([(0, 0)]));
    let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
    assert_eq!(d.snapshot.jobs[0].remaining_s, linear(&p, 2520.0));
    assert_eq!(d.snapshot.jobs[1].remaining_s, linear(&p, 3600.0));
    assert!(
        d.outcome.groups.iter().any(|g| g.jobs == [0]),
        "b runs alone: {:?}",
        d.outcome.groups
    );
    assert_eq!(
        d.outcome.warm_starts,
        vec![WarmStart {
            job: 0,
            from: 0,
            gain: 0.3,
        }]
    );
    // A pair other ↦ b is weighed against b's start (Eq. 12 with T_B
    // from the weights): (2·2520 + 3600) / (2·3600 + 360) = 8640 / 7560
    // at every allocation, not the 1.8 estimated from scratch. Merged
    // as B, b starts from other's output, not from the finished job.
    e.candidates.push(helpful_temporal(&p, 1, 0));
    let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
    let c = &d.snapshot.candidates[0];
    for (k, &a) in d.snapshot.allocations.iter().enumerate() {
        let want = if a == 0 { 0.0 } else { 8640.0 / 7560.0 };
        assert!(
            (c.tran_wt[k] - want).abs() < 1e-9,
            "at {a}: {}",
            c.tran_wt[k]
        );
    }
    if d.outcome.groups.iter().any(|g| g.jobs == [1, 0]) {
        assert!(d.outcome.warm_starts.is_empty(), "{:?}", d.outcome);
    }
    // With no pair gaining over the start, no candidate.
    let mut weak = e.clone();
    weak.candidates[0].seconds = linear(&p, 3000.0);
    let d = decide(&v, &p, &weak, policy.as_ref(), &cfg).unwrap();
    assert!(
        d.snapshot.candidates.is_empty(),
        "{:?}",
        d.snapshot.candidates
    );
}

/// Weights that do not save time are no start (`TranWt > 1` as for a
/// merge), and nothing is offered from a finished job of the same
/// task, one whose user does not share, one trained otherwise, to a
/// job that does not share or has trained.
#[test]
fn tail_a_warm_start_must_gain_and_is_offered_only_between_sharers_trained_alike() {
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let mut v = view(
        vec![node("a", 4)],
        vec![job("b", "snli", JobState::Queued, 4)],
    );
    v.finished = vec![finished("rte-done", "rte")];
    let p = prepare(&v, policy.as_ref(), &cfg);
    let mut e = estimates(&p, 3600.0);
    e.warm = vec![warm(&p, 0, 0, 3600.0)];
    let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
    assert!(chosen_warm_starts(&p, &e).is_empty());
    assert!(d.outcome.warm_starts.is_empty());
    assert_eq!(d.snapshot.jobs[0].remaining_s, linear(&p, 3600.0));

    let offered = |v: &ClusterView| prepare(v, policy.as_ref(), &cfg).warm.len();
    assert_eq!(offered(&v), 1);
    let mut same_task = v.clone();
    same_task.finished[0].task = "snli".into();
    let mut private = v.clone();
    private.finished[0].sharing = false;
    let mut other_setup = v.clone();
    other_setup.finished[0].merge_setup = "lora r=8".into();
    let mut other_model = v.clone();
    other_model.finished[0].model = "vit-base".into();
    let mut b_private = v.clone();
    b_private.jobs[0].sharing = false;
    let mut b_trained = v.clone();
    b_trained.jobs[0].progress = 0.2;
    b_trained.jobs[0].state = JobState::Queued;
    for (what, w) in [
        ("same task", same_task),
        ("A private", private),
        ("trained otherwise", other_setup),
        ("another model", other_model),
        ("B private", b_private),
        ("B trained", b_trained),
    ] {
        assert_eq!(offered(&w), 0, "{what}");
    }
    // No merging policy, no start.
    let none = by_name("ymir-no-merge").unwrap();
    assert!(prepare(&v, none.as_ref(), &cfg).warm.is_empty());
    // An estimate of a start the round did not offer is refused.
    let mut bad = estimates(&p, 3600.0);
    bad.warm = vec![warm(&p, 0, 5, 100.0)];
    assert!(matches!(
        decide(&v, &p, &bad, policy.as_ref(), &cfg),
        Err(RoundError::Estimates(m)) if m.contains("warm start")
    ));
}

#[test]
fn a_merge_never_runs_below_either_jobs_min_gpus() {
    let wide = || {
        let mut w = job("wide", "rte", JobState::Queued, 8);
        w.min_gpus = 8;
        w
    };
    let narrow = || job("narrow", "mrpc", JobState::Queued, 1);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let v = view(vec![node("a", 4), node("b", 4)], vec![narrow(), wide()]);
    let p = prepare(&v, policy.as_ref(), &cfg);
    let mut e = estimates(&p, 3600.0);
    e.candidates.push(helpful_temporal(&p, 0, 1));
    let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
    let c = &d.snapshot.candidates[0];
    for (k, &a) in d.snapshot.allocations.iter().enumerate() {
        assert_eq!(
            c.remaining_s[k].is_finite(),
            a >= 8,
            "the pair at {a}: {}",
            c.remaining_s[k]
        );
    }
    for g in d.outcome.groups.iter().filter(|g| g.jobs.contains(&1)) {
        assert!(g.gpus.len() >= 8, "{g:?}");
    }
    // Already merged: the kept merge's row has no time under 8 either.
    let mut kept = view(vec![node("a", 4), node("b", 4)], vec![narrow(), wide()]);
    kept.merges.push(MergeView {
        a: 0,
        b: 1,
        mode: MergeMode::Temporal,
    });
    let p = prepare(&kept, policy.as_ref(), &cfg);
    let d = decide(&kept, &p, &estimates(&p, 3600.0), policy.as_ref(), &cfg).unwrap();
    let m = &d.snapshot.merges[0];
    for (k, &a) in d.snapshot.allocations.iter().enumerate() {
        assert_eq!(m.remaining_s[k].is_finite(), a >= 8, "kept at {a}");
    }
}

/// A kept merge keeps the deadline of the job that finishes with it
/// where it can: the allocations at which B would miss are taken
/// away, as for a new pair. With none that meets it, its times stay
/// (the merge is not stranded).
#[test]
fn a_kept_merge_is_given_only_gpus_that_keep_bs_deadline() {
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let kept = |deadline_b: Option<f64>| {
        let mut b = job("b", "mrpc", JobState::Queued, 8);
        b.deadlines = deadline_b
            .map(|by| crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(by)))
            .unwrap_or_default();
        let mut v = view(
            vec![node("n", 8)],
            vec![job("a", "rte", JobState::Queued, 8), b],
        );
        v.merges.push(MergeView {
            a: 0,
            b: 1,
            mode: MergeMode::Temporal,
        });
        let p = prepare(&v, policy.as_ref(), &cfg);
        let d = decide(&v, &p, &estimates(&p, 3600.0), policy.as_ref(), &cfg).unwrap();
        (
            d.snapshot.allocations.clone(),
            d.snapshot.merges[0].remaining_s.clone(),
        )
    };
    let (allocs, free) = kept(None);
    let at = |a: u32| free[allocs.iter().position(|&x| x == a).unwrap()];
    assert!(at(4) > at(8), "{free:?}");
    // A deadline between the group's time on 8 GPUs and on 4.
    let due = (at(4) + at(8)) / 2.0;
    let (_, masked) = kept(Some(due));
    for (k, &a) in allocs.iter().enumerate() {
        let meets = free[k].is_finite() && free[k] <= due;
        assert_eq!(masked[k].is_finite(), meets, "at {a}: {masked:?}");
    }
    assert!(masked[allocs.iter().position(|&x| x == 8).unwrap()].is_finite());
    let (_, impossible) = kept(Some(1.0));
    assert_eq!(impossible, free, "no allocation meets it: as before");
}

/// A kept temporal merge whose A has trained and still has a long way
/// to go is released when its waiting B would finish sooner alone, from
/// scratch, on its fair share (8 GPUs of 16, which the group on at most
/// 8 leaves free: 450 s and its 30 s start) than behind A (at best
/// 100,000 s / 8 of A): the caller splits it. Kept when A is nearly
/// done, when B alone is not known, when B has trained from A's
/// weights, when A has not trained (a pair of waiting jobs is Ymir's to
/// decide), when the group meets B's deadline, and when the round
/// leaves no GPU free (B would wait behind A merged or not, and lose
/// only its transfer: found live, a pair of real trainers on one node).
#[test]
fn tail_a_kept_merge_whose_b_would_finish_sooner_alone_is_released() {
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let released_on =
        |gpus: u32, a_work: f64, a_progress: f64, b_progress: f64, known: bool, due: f64| {
            let mut a = job("a", "rte", JobState::Running, 8);
            (a.holds, a.progress) = (vec![(0, 0), (0, 1)], a_progress);
            if a_progress == 0.0 {
                (a.state, a.holds) = (JobState::Queued, Vec::new());
            }
            let mut b = job("b", "mrpc", JobState::Queued, 8);
            b.progress = b_progress;
            if due.is_finite() {
                b.deadlines = crate::slo::reward_steps(crate::SloClass::Slo, 0.0, Some(due));
            }
            let mut v = view(vec![node("n", gpus)], vec![a, b]);
            v.merges.push(MergeView {
                a: 0,
                b: 1,
                mode: MergeMode::Temporal,
            });
            let p = prepare(&v, policy.as_ref(), &cfg);
            assert_eq!(p.jobs, vec![0, 1]);
            let mut e = estimates(&p, 3600.0);
            e.jobs[0] = linear(&p, a_work);
            e.kept[0] = linear(&p, 360.0);
            if known {
                e.kept_b_alone = vec![linear(&p, 3600.0)];
            }
            decide(&v, &p, &e, policy.as_ref(), &cfg)
                .unwrap()
                .outcome
                .released
        };
    let released = |a_work, a_progress, b_progress, known| {
        released_on(16, a_work, a_progress, b_progress, known, f64::INFINITY)
    };
    assert_eq!(released(100_000.0, 0.1, 0.0, true), vec![0]);
    assert!(released(600.0, 0.1, 0.0, true).is_empty(), "A nearly done");
    assert!(
        released(100_000.0, 0.1, 0.0, false).is_empty(),
        "B alone unknown"
    );
    assert!(
        released(100_000.0, 0.1, 0.2, true).is_empty(),
        "B trains from A"
    );
    assert!(
        released(100_000.0, 0.0, 0.0, true).is_empty(),
        "A has not trained"
    );
    // B due in 20,000 s: the group (12,575 s on 8 GPUs) meets it, and
    // it is not gambled; due in 5,000 s, the group misses it anyway.
    assert!(released_on(16, 100_000.0, 0.1, 0.0, true, 20_000.0).is_empty());
    assert_eq!(released_on(16, 100_000.0, 0.1, 0.0, true, 5_000.0), vec![0]);
    // The group fills the node: nothing is free for B.
    assert!(released_on(8, 100_000.0, 0.1, 0.0, true, f64::INFINITY).is_empty());
}

/// A new merge is decided on a candidate the caller estimated; the
/// group's time is A's, then B's from A's weights after B's restart.
#[test]
fn a_helpful_temporal_pair_is_merged_with_the_gains_it_rests_on() {
    let v = view(
        vec![node("n", 2)],
        vec![
            job("a", "rte", JobState::Queued, 1),
            job("b", "mrpc", JobState::Queued, 1),
            job("c", "qqp", JobState::Queued, 1),
            job("d", "sst2", JobState::Queued, 1),
        ],
    );
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let p = prepare(&v, policy.as_ref(), &cfg);
    let mut e = estimates(&p, 3600.0);
    // B from A's weights needs a tenth of its time.
    e.candidates.push(helpful_temporal(&p, 0, 1));
    let d = decide(&v, &p, &e, policy.as_ref(), &cfg).unwrap();
    let c = &d.snapshot.candidates[0];
    assert_eq!(c.remaining_s[1], 3600.0 + 360.0 + 30.0);
    let g = d
        .outcome
        .groups
        .iter()
        .find(|g| g.jobs == [0, 1])
        .expect("merged");
    assert_eq!(g.new_merge, Some((0.25, 0.0)));
    assert_eq!(g.trainers(), &[0]);
    // B is not trained yet: it stays queued.
    assert!(
        d.outcome
            .transitions
            .iter()
            .all(|t| t.job != 1 || t.to == JobState::Queued)
    );
}

#[test]
fn estimates_that_do_not_match_the_round_are_refused() {
    let v = view(
        vec![node("n", 2)],
        vec![job("a", "rte", JobState::Queued, 1)],
    );
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let policy = by_name("ymir").unwrap();
    let p = prepare(&v, policy.as_ref(), &cfg);
    let e = Estimates::default();
    assert!(matches!(
        decide(&v, &p, &e, policy.as_ref(), &cfg),
        Err(RoundError::Estimates(_))
    ));
    let mut e = estimates(&p, 100.0);
    e.candidates.push(PairEstimate {
        pair: PairKey {
            a: 0,
            b: 0,
            mode: MergeMode::Spatial,
        },
        seconds: linear(&p, 1.0),
        tran_wt: linear(&p, 1.0),
        gain_ab: 0.0,
        gain_ba: 0.0,
    });
    assert!(matches!(
        decide(&v, &p, &e, policy.as_ref(), &cfg),
        Err(RoundError::Estimates(m)) if m.contains("not an eligible pair")
    ));
}
