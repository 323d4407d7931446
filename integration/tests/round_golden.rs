//! The live round and fmsim decide alike: the same view and estimates go
//! through the functions the live scheduler's round calls
//! (`scheduler_svc::round`, with the settings its configuration gives)
//! and those fmsim's engine calls (`fmsched_sim::engine`, with a simulation's
//! settings), and must give the same snapshot, plan and outcome — for every
//! policy both run, on hand-built and on random views. Both run groups over
//! any number of nodes (the service as gangs), so the round settings are
//! the same; a service configured with `scheduling.max_nodes_per_job = 1`
//! and fmsim given the same cap decide alike too.

use fmsched_core::JobState;
use fmsched_core::NodeState;
use fmsched_core::policy::MergeMode;
use fmsched_core::policy::by_name;
use fmsched_core::round::{
    ClusterView, Decision, Estimates, JobView, MergeView, NodeView, PairEstimate, Prepared,
    Transition, testkit,
};
use proptest::prelude::*;
use scheduler_svc::config::Config;

/// A job of the golden view: `gpus` asked, holding `holds`, submitted a
/// minute ago, a 45 s restart.
fn job(id: &str, task: &str, state: JobState, gpus: u32, holds: &[(usize, u32)]) -> JobView {
    JobView {
        submitted_at: -60.0,
        restart_s: 45.0,
        holds: holds.to_vec(),
        profiling_run: state == JobState::Profiling,
        ..testkit::job(id, task, state, gpus)
    }
}

fn node(id: &str, gpus: u32, state: NodeState) -> NodeView {
    NodeView {
        state,
        ..testkit::node(id, gpus)
    }
}

/// Times that shrink with GPUs (work / a^0.8), a merged part at 40 % of B.
fn estimates(view: &ClusterView, p: &Prepared) -> Estimates {
    let row = |work: f64| testkit::power_law(p, work, 0.8);
    let work = |v: usize| 1800.0 * (1.0 + (v % 5) as f64) * (1.0 - view.jobs[v].progress);
    Estimates {
        jobs: p.jobs.iter().map(|&v| row(work(v))).collect(),
        kept: p
            .kept
            .iter()
            .map(|&m| row(0.4 * work(view.merges[m].b)))
            .collect(),
        candidates: p
            .eligible
            .iter()
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(k, pair)| PairEstimate {
                pair: *pair,
                seconds: row(0.4 * work(pair.b)),
                tran_wt: p
                    .allocations
                    .iter()
                    .map(|&a| {
                        if a == 0 {
                            0.0
                        } else {
                            1.0 + 0.1 * (k % 7) as f64
                        }
                    })
                    .collect(),
                gain_ab: 0.1,
                gain_ba: if pair.mode == MergeMode::Spatial {
                    0.1
                } else {
                    0.0
                },
            })
            .collect(),
        warm: Vec::new(),
        spread: Vec::new(),
        kept_b_alone: Vec::new(),
    }
}

/// (live, fmsim) decisions of a view under `policy`, with jobs over at
/// most `max_nodes` nodes (0: any number).
fn both(view: &ClusterView, policy: &str) -> (Decision, Decision) {
    both_capped(view, policy, 0)
}

fn both_capped(view: &ClusterView, policy: &str, max_nodes: u32) -> (Decision, Decision) {
    let mut cfg = Config::default();
    cfg.scheduling.policy = policy.into();
    cfg.scheduling.max_nodes_per_job = max_nodes;
    let (live_cfg, live_policy) = scheduler_svc::round::round_setup(&cfg);
    let p = scheduler_svc::round::prepare_round(view, live_policy.as_ref(), &live_cfg);
    let e = estimates(view, &p);
    let live =
        scheduler_svc::round::decide_round(view, &p, &e, live_policy.as_ref(), &live_cfg).unwrap();
    let sim_policy = by_name(policy).unwrap();
    let mut sim_cfg = fmsched_sim::engine::round_config(
        &fmsched_sim::engine::SimConfig {
            profile_s: 60.0,
            ..Default::default()
        },
        sim_policy.as_ref(),
    );
    assert_eq!(
        live_cfg.max_nodes_per_group,
        (max_nodes > 0).then_some(max_nodes as usize)
    );
    assert_eq!(sim_cfg.max_nodes_per_group, None);
    sim_cfg.max_nodes_per_group = live_cfg.max_nodes_per_group;
    assert_eq!(sim_cfg, live_cfg, "{policy}: the round settings differ");
    let p2 = fmsched_sim::engine::prepare_round(view, sim_policy.as_ref(), &sim_cfg);
    assert_eq!(p, p2, "{policy}: the prepared rounds differ");
    let e2 = estimates(view, &p2);
    let sim =
        fmsched_sim::engine::decide_round(view, &p2, &e2, sim_policy.as_ref(), &sim_cfg).unwrap();
    (live, sim)
}

use fmsched_core::policy::POLICY_NAMES as POLICIES;

/// A cluster mid-run: a kept temporal merge, running and queued jobs, a
/// profiling run, jobs waiting to profile, a suspect node and one offline
/// (its job re-queued), and merge candidates.
fn golden_view() -> ClusterView {
    let mut jobs = vec![
        job("a-running", "qqp", JobState::Running, 2, &[(0, 0), (0, 1)]),
        job("b-temporal-a", "rte", JobState::Running, 1, &[(0, 2)]),
        job("c-temporal-b", "mrpc", JobState::Queued, 1, &[]),
        job("d-profiling", "cola", JobState::Profiling, 1, &[(1, 0)]),
        job("e-submitted", "sst2", JobState::Submitted, 2, &[]),
        job("f-submitted", "mnli", JobState::Submitted, 1, &[]),
        job("g-queued", "qnli", JobState::Queued, 4, &[]),
        job("h-queued", "stsb", JobState::Queued, 2, &[]),
        job("i-lost", "wnli", JobState::Running, 2, &[(3, 0), (3, 1)]),
        job("j-suspect", "boolq", JobState::Running, 1, &[(2, 0)]),
    ];
    jobs[0].progress = 0.4;
    jobs[0].lease_until = 120.0;
    jobs[1].ever_merged = true;
    jobs[2].ever_merged = true;
    jobs[4].submitted_at = -10.0;
    jobs[8].iteration = 900;
    jobs[9].progress = 0.2;
    ClusterView {
        now: 0.0,
        nodes: vec![
            node("n0", 4, NodeState::Available),
            node("n1", 4, NodeState::Available),
            node("n2", 4, NodeState::Suspect),
            node("n3", 4, NodeState::Offline),
        ],
        jobs,
        merges: vec![MergeView {
            a: 1,
            b: 2,
            mode: MergeMode::Temporal,
        }],
        finished: Vec::new(),
    }
}

#[test]
fn the_live_round_and_fmsim_decide_alike_on_a_golden_view() {
    let view = golden_view();
    for policy in POLICIES {
        let (live, sim) = both(&view, policy);
        assert_eq!(live, sim, "{policy}");
        // The golden view exercises the round: profiling starts for the
        // oldest submitted job, the lost node's job is re-queued.
        let o = &live.outcome;
        assert!(
            o.profiling
                .iter()
                .any(|r| r.new && view.jobs[r.job].id == "e-submitted"),
            "{policy}: {o:?}"
        );
        assert!(
            o.groups.iter().all(|g| g.gpus.iter().all(|gpu| gpu.0 != 3)),
            "{policy}: nothing on the offline node"
        );
        // The lost node's job is re-queued, naming the node, and either
        // waits (alone, or as the B of a temporal merge behind a job that
        // trains) or moves to a live node in the same round (then runs).
        let lost = view.jobs.iter().position(|j| j.id == "i-lost").unwrap();
        let moved = o.groups.iter().any(|g| g.trainers().contains(&lost));
        let moves: Vec<&Transition> = o.transitions.iter().filter(|t| t.job == lost).collect();
        assert!(
            moves.first().is_some_and(
                |t| t.to == JobState::Queued && t.reason.contains("node n3 is offline")
            ),
            "{policy}: {o:?}"
        );
        let last = moves.last().map(|t| t.to);
        let expected = if moved {
            JobState::Running
        } else {
            JobState::Queued
        };
        assert_eq!(last, Some(expected), "{policy}: {o:?}");
    }
    let (ymir, _) = both(&view, "ymir");
    eprintln!("ymir on the golden view: {:#?}", ymir.outcome.groups);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// On random clusters, every policy decides alike.
    #[test]
    fn the_live_round_and_fmsim_decide_alike_on_random_views(view in testkit::arb_view()) {
        for policy in POLICIES {
            let (live, sim) = both(&view, policy);
            prop_assert_eq!(live, sim, "{}", policy);
            // A service that keeps jobs on one node, and fmsim so capped.
            let (live, sim) = both_capped(&view, policy, 1);
            prop_assert_eq!(live, sim, "{} (one node per job)", policy);
        }
    }
}

/// The round clock: the scheduler's loop and fmsim build core's one
/// `RoundClock` from their own settings, and with the same interval and
/// gaps they run their rounds at the same times through the same events
/// (a submission, a task that ended, a job with a deadline waiting).
#[test]
fn the_live_loop_and_fmsim_keep_one_round_clock() {
    use fmsched_core::round::RoundClock;
    use fmsched_sim::engine::SimConfig;
    use std::time::Duration;

    // (event gap, deadline gap; 0 s is off in the service, None in fmsim)
    for (event_gap, deadline_gap) in [(None, 0.0), (Some(5.0), 0.0), (None, 5.0), (Some(2.0), 5.0)]
    {
        let mut live = Config::default().scheduling;
        live.interval = Some(Duration::from_secs(120));
        live.event_round_gap = event_gap.map(Duration::from_secs_f64);
        live.deadline_round_gap = Duration::from_secs_f64(deadline_gap);
        let sim = SimConfig {
            event_gap_s: event_gap,
            deadline_gap_s: (deadline_gap > 0.0).then_some(deadline_gap),
            ..SimConfig::default()
        };
        let mut a = scheduler_svc::round::round_clock(&live);
        let mut b = sim.round_clock(120.0, 0.0);
        assert_eq!(a, b, "{event_gap:?} {deadline_gap}");
        // The same script of rounds and events gives the same rounds.
        let script: [(f64, Option<(f64, f64)>); 6] = [
            (0.0, None),
            (1.0, Some((60.0, 150.0))),
            (3.0, None),
            (40.0, Some((30.0, 400.0))),
            (90.0, Some((50.0, 200.0))),
            (121.0, None),
        ];
        let mut times = Vec::new();
        for clock in [&mut a, &mut b] {
            let mut started = Vec::new();
            for &(t, wait) in &script {
                if clock.is_due(t) {
                    clock.round_started(t);
                    started.push(t);
                }
                clock.on_event(t, wait);
                started.push(clock.next_s());
            }
            times.push(started);
        }
        assert_eq!(times[0], times[1], "{event_gap:?} {deadline_gap}");
        // And the settings act: events bring rounds forward only where on.
        let mut fixed = RoundClock::new(120.0, None, None, 0.0);
        fixed.round_started(0.0);
        fixed.on_event(1.0, [(60.0, 150.0)]);
        let moved = {
            let mut c = sim.round_clock(120.0, 0.0);
            c.round_started(0.0);
            c.on_event(1.0, [(60.0, 150.0)])
        };
        assert_eq!(moved, event_gap.is_some() || deadline_gap > 0.0);
        assert_eq!(fixed.next_s(), 120.0);
    }
    // fmsim's aligned grid (the authors' simulator) has no deadline rounds.
    let grid = SimConfig {
        round_origin_s: Some(0.0),
        ..SimConfig::default()
    };
    assert_eq!(grid.round_clock(120.0, 130.0).next_s(), 240.0);
    assert!(!grid.round_clock(120.0, 130.0).wakes_on_events());
}

/// Service accounting: the service's round commit turns each held plan
/// into deltas through core's `accrue`, and fmsim accrues through it as
/// its virtual time passes. Pinned here: what a job trained on, how long
/// it trained and what it deserved, for a job present the whole period,
/// one that came during it, a profiling-only job and a clock that went
/// back.
#[test]
fn the_commit_and_fmsim_accrue_service_by_one_rule() {
    use fmsched_core::round::{Accrued, accrue, fair_share};

    // 8 GPUs, 3 live jobs: a third each, at most what one asked for.
    assert_eq!(fair_share(8, 3, 4), 8.0 / 3.0);
    assert_eq!(fair_share(8, 3, 2), 2.0);
    assert_eq!(fair_share(8, 0, 2), 0.0);
    let whole = accrue(4, 2.0, 60.0, 60.0);
    assert_eq!(
        whole,
        Accrued {
            attained_gpu_s: 240.0,
            executed_s: 60.0,
            fair_share_gpu_s: 120.0,
        }
    );
    // Submitted 15 s before the commit: it deserved 15 s of its share.
    assert_eq!(accrue(0, 2.0, 60.0, 15.0).fair_share_gpu_s, 30.0);
    // Present longer than the plan held: only the held period counts.
    assert_eq!(accrue(0, 2.0, 60.0, 600.0).fair_share_gpu_s, 120.0);
    // Profiling or waiting: no attained service and no executed time.
    assert_eq!(accrue(0, 2.0, 60.0, 60.0).executed_s, 0.0);
    assert_eq!(accrue(2, 1.0, -5.0, -5.0), Accrued::default());
}

/// The merge guard's consequence: the service's round
/// (`observe::guard`, on its job ids) and fmsim's engine (`engine::merges`,
/// on its job indices) both apply core's `guard_consequence` of a ruling.
/// Pinned here: what a kept merge, a split and a fresh start do to A and B.
#[test]
fn the_live_guard_and_fmsim_guard_share_one_consequence() {
    use fmsched_core::round::guard::{
        GUARD_EPOCHS, GainMeasure, GuardRuling, GuardVerdict, guard_consequence, ruling_of,
    };

    assert_eq!(GUARD_EPOCHS, 2, "Ymir §4.3: the first two epochs");
    assert_eq!(ruling_of(&GuardVerdict::Wait), None);
    assert_eq!(ruling_of(&GuardVerdict::Keep), Some(GuardRuling::Keep));
    assert_eq!(
        ruling_of(&GuardVerdict::Split("why".into())),
        Some(GuardRuling::Split)
    );
    let (a, b) = ("a", "b");
    // (mode, ruling) -> (ends, alone, leaves the joint process, restarts, measure)
    let table = [
        (
            MergeMode::Spatial,
            GuardRuling::Keep,
            false,
            vec![],
            None,
            None,
            GainMeasure::EachAgainstOwnCurve,
        ),
        (
            MergeMode::Temporal,
            GuardRuling::Keep,
            false,
            vec![],
            None,
            None,
            GainMeasure::Later,
        ),
        (
            MergeMode::Spatial,
            GuardRuling::Split,
            true,
            vec![a, b],
            Some(b),
            None,
            GainMeasure::EachAgainstOwnCurve,
        ),
        (
            MergeMode::Temporal,
            GuardRuling::Split,
            true,
            vec![a, b],
            None,
            None,
            GainMeasure::NoGain,
        ),
        (
            MergeMode::Temporal,
            GuardRuling::RestartFresh,
            true,
            vec![b],
            None,
            Some(b),
            GainMeasure::AlreadyMeasured,
        ),
    ];
    for (mode, ruling, ends, alone, leaves, restarts, measure) in table {
        let c = guard_consequence(mode, a, b, ruling);
        assert_eq!(
            (
                c.ends,
                c.alone,
                c.leaves_joint_process,
                c.restarts,
                c.measure
            ),
            (ends, alone, leaves, restarts, measure),
            "{mode:?} {ruling:?}"
        );
    }
}
