//! The clock, a waiting job's need, leases and the reasons of a suspension.

use super::*;

/// An event brings the round forward to now, or to the gap after the
/// last one, never past the periodic round.
#[test]
fn an_event_brings_the_round_forward_within_the_gap() {
    // Last round at 0, periodic one at 60, gap 5.
    assert_eq!(round_after_event(60.0, 20.0, 0.0, 5.0), 20.0);
    assert_eq!(round_after_event(60.0, 2.0, 0.0, 5.0), 5.0);
    assert_eq!(round_after_event(60.0, 59.0, 58.0, 5.0), 60.0);
    assert_eq!(round_after_event(3.0, 2.0, 0.0, 5.0), 3.0);
}

/// A waiting job needs its time at its request with its start; one
/// whose request is not an allocation the fewest GPUs it may run on;
/// a job that runs or has trained needs nothing (it is not waiting).
#[test]
fn a_waiting_jobs_need_is_its_time_alone_at_its_request() {
    use crate::policy::testkit::{cluster, job};
    let all = crate::policy::ymir_allocations(64);
    let job = |id: &str, asks: u32| job(id, 800.0, asks, &all);
    let mut running = job("running", 2);
    running.current_gpus = 2;
    let mut trained = job("trained", 2);
    trained.progress = 0.3;
    let mut odd = job("odd", 5);
    odd.min_gpus = 2;
    let snap = cluster(2, 4, vec![job("asks-4", 4), odd, running, trained]);
    assert!(!snap.allocations.contains(&5), "{:?}", snap.allocations);
    assert_eq!(need_alone(&snap, 0), Some(800.0 / 4.0 + 30.0));
    assert_eq!(need_alone(&snap, 1), Some(800.0 / 2.0 + 30.0));
    assert_eq!(need_alone(&snap, 2), None);
    assert_eq!(need_alone(&snap, 3), None);
    assert_eq!(need_alone(&snap, 4), None, "no such job");
}

/// A job with a deadline brings the round forward only when waiting
/// for the periodic one would make it miss, and starting now would not.
#[test]
fn a_deadline_brings_the_round_forward_only_when_waiting_would_miss_it() {
    // Last round at 0, periodic one at 120, gap 5, now 20; the job
    // needs 1,000 s.
    assert_eq!(
        round_for_deadline(120.0, 20.0, 0.0, 5.0, 1_000.0, 1_100.0),
        20.0
    );
    // Room to wait for the periodic round: it stays.
    assert_eq!(
        round_for_deadline(120.0, 20.0, 0.0, 5.0, 1_000.0, 1_120.0),
        120.0
    );
    // Missed even at once: nothing to gain by a round now.
    assert_eq!(
        round_for_deadline(120.0, 20.0, 0.0, 5.0, 1_000.0, 1_010.0),
        120.0
    );
    // The gap after the last round still holds.
    assert_eq!(
        round_for_deadline(120.0, 2.0, 0.0, 5.0, 1_000.0, 1_050.0),
        5.0
    );
}

#[test]
fn leases_are_kept_while_running_and_renewed_when_won_again() {
    let mut a = job("a", "qqp", JobState::Running, 1);
    a.holds = vec![(0, 0)];
    a.lease_until = 100.0; // running lease
    let mut b = job("b", "rte", JobState::Running, 1);
    b.holds = vec![(0, 1)];
    b.lease_until = -1.0; // ran out; wins again
    let c = job("c", "mrpc", JobState::Queued, 1);
    let v = view(vec![node("n", 4)], vec![a, b, c]);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let d = run(&v, "themis", &cfg);
    let lease: BTreeMap<usize, f64> = d.outcome.leases.iter().copied().collect();
    let new = by_name("themis").unwrap().lease_s();
    assert_eq!(lease[&0], 100.0);
    assert_eq!(lease[&1], new);
    assert_eq!(lease[&2], new);
    assert!(run(&v, "srtf", &cfg).outcome.leases.is_empty());
}

/// A job that cannot start is told why once its state changes: a
/// running job pushed out is suspended, a queued one waits.
#[test]
fn the_reasons_of_a_suspension() {
    let mut a = job("a", "qqp", JobState::Running, 4);
    a.holds = (0..4).map(|g| (0, g)).collect();
    a.attained_gpu_s = 1e9; // Tiresias demotes it
    let mut b = job("b", "rte", JobState::Queued, 4);
    b.submitted_at = -1.0;
    let v = view(vec![node("n", 4)], vec![a, b]);
    let cfg = RoundConfig {
        profiling: false,
        ..Default::default()
    };
    let d = run(&v, "tiresias", &cfg);
    let reasons: Vec<(usize, JobState, &str)> = d
        .outcome
        .transitions
        .iter()
        .map(|t| (t.job, t.to, t.reason.as_str()))
        .collect();
    assert!(
        reasons.contains(&(0, JobState::Queued, "suspended by the plan (checkpointed)")),
        "{reasons:?}"
    );
}

/// The round clock both callers run: periodic rounds an interval after
/// each start; an event moves nothing without rounds on events or for
/// deadlines.
#[test]
fn the_round_clock_runs_an_interval_after_each_start() {
    let mut c = RoundClock::new(120.0, None, None, 0.0);
    assert!(c.is_due(0.0) && !c.wakes_on_events());
    c.round_started(0.0);
    assert_eq!((c.next_s(), c.last_started_s()), (120.0, 0.0));
    assert!(!c.on_event(10.0, [(60.0, 100.0)]));
    assert_eq!(c.next_s(), 120.0);
    assert!(!c.is_due(119.9) && c.is_due(120.0));
    // A changed interval counts from the round after the one due...
    c.set_interval(60.0);
    assert_eq!(c.next_s(), 120.0);
    c.round_started(120.0);
    assert_eq!(c.next_s(), 180.0);
    // ...unless the round that changed it counts from its own start.
    c.reset_interval(30.0);
    assert_eq!(c.next_s(), 150.0);
    // A shorter interval set live brings the next round forward only.
    c.round_started(150.0);
    assert!(c.next_within(10.0));
    assert_eq!((c.next_s(), c.interval_s()), (160.0, 30.0));
    assert!(!c.next_within(100.0));
    assert_eq!(c.next_s(), 160.0);
}

/// With rounds on events every event brings the round forward to no
/// sooner than the gap after the last start; deadlines are not consulted.
#[test]
fn the_round_clock_comes_forward_on_events_within_the_gap() {
    let mut c = RoundClock::new(120.0, Some(5.0), Some(1.0), 0.0);
    assert!(c.wakes_on_events());
    c.round_started(0.0);
    assert!(c.on_event(2.0, []));
    assert_eq!(c.next_s(), 5.0);
    c.round_started(5.0);
    assert!(c.on_event(30.0, []));
    assert_eq!(c.next_s(), 30.0);
    // Never later than the periodic round.
    c.round_started(30.0);
    assert!(c.on_event(149.0, []));
    assert_eq!(c.next_s(), 149.0);
}

/// With rounds for deadlines only a job that waiting for the periodic
/// round would make miss its deadline, and that can still make it, brings
/// the round forward.
#[test]
fn the_round_clock_comes_forward_for_a_deadline_that_waiting_would_miss() {
    let mut c = RoundClock::new(120.0, None, Some(5.0), 0.0);
    c.round_started(0.0);
    // Starting at 120 with 60 s to run makes 200: no hurry.
    assert!(!c.on_event(10.0, [(60.0, 200.0)]));
    // Or it cannot make it anyway.
    assert!(!c.on_event(10.0, [(60.0, 65.0)]));
    assert_eq!(c.next_s(), 120.0);
    // 180 > 150, but 10 + 60 <= 150: now.
    assert!(c.on_event(10.0, [(60.0, 200.0), (60.0, 150.0)]));
    assert_eq!(c.next_s(), 10.0);
    // No sooner than the gap after the last start.
    c.round_started(10.0);
    assert!(c.on_event(12.0, [(20.0, 100.0)]));
    assert_eq!(c.next_s(), 15.0);
}

/// Service accounting, as both callers accrue it: GPU-seconds and seconds
/// trained over the whole held period, the deserved share only for the
/// part the job was in the system, nothing for a clock that went back.
#[test]
fn a_held_period_accrues_service_and_a_late_arrival_deserves_only_its_part() {
    let got = accrue(4, 2.0, 100.0, 100.0);
    assert_eq!(
        got,
        Accrued {
            attained_gpu_s: 400.0,
            executed_s: 100.0,
            fair_share_gpu_s: 200.0,
        }
    );
    // Profiling only (no training GPUs), submitted 30 s before the plan ended.
    assert_eq!(
        accrue(0, 2.0, 100.0, 30.0),
        Accrued {
            attained_gpu_s: 0.0,
            executed_s: 0.0,
            fair_share_gpu_s: 60.0,
        }
    );
    // A job older than the plan deserves the whole period, never more.
    assert_eq!(accrue(0, 1.5, 10.0, 1e6).fair_share_gpu_s, 15.0);
    assert_eq!(accrue(8, 4.0, -5.0, 10.0), Accrued::default());
    assert_eq!(accrue(1, -1.0, 10.0, 10.0).fair_share_gpu_s, 0.0);
}
