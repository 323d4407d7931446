//! Tests of the scheduling loop.

use chrono::Utc;
use fmsched_core::round::{ClusterView, JobView, RoundConfig, RoundOutcome};
use fmsched_core::{GpuUuid, JobId, JobState, NodeId, round};

use crate::leader::DeadlineWaits;
use crate::round::phases::stuck_phase;
use crate::round::writes::plan_writes;
use crate::round::{RoundError, Translated, blocking_within, decide_round, prepare_round};

/// A decision that does not come within its grace gives the round up
/// (the next starts afresh); one that comes is returned.
#[tokio::test]
async fn a_decision_that_does_not_come_gives_the_round_up() {
    let (release, stuck) = std::sync::mpsc::channel::<()>();
    let grace = std::time::Duration::from_millis(50);
    let out = blocking_within(grace, move || stuck.recv().is_ok()).await;
    assert!(
        matches!(out, Err(RoundError::DecideTimedOut(g)) if g == grace),
        "{out:?}"
    );
    drop(release);
    let out = blocking_within(std::time::Duration::from_secs(60), || 7).await;
    assert_eq!(out.unwrap(), 7);
}

/// The stuck-round watch warns once per 30 s a round stays in one
/// phase, and afresh for a new phase.
#[test]
fn a_round_stuck_in_one_phase_is_reported_once_per_period() {
    let secs = std::time::Duration::from_secs;
    let since = std::time::Instant::now();
    let decide = Some(("decide", since));
    let mut said = None;
    assert_eq!(stuck_phase(decide, secs(10), &mut said), None);
    assert_eq!(stuck_phase(decide, secs(31), &mut said), Some("decide"));
    assert_eq!(stuck_phase(decide, secs(45), &mut said), None);
    assert_eq!(stuck_phase(decide, secs(61), &mut said), Some("decide"));
    let commit = Some(("commit", since + secs(62)));
    assert_eq!(stuck_phase(commit, secs(1), &mut said), None);
    assert_eq!(stuck_phase(commit, secs(30), &mut said), Some("commit"));
    assert_eq!(stuck_phase(None, secs(0), &mut said), None);
    assert_eq!(said, None, "between rounds nothing is kept");
}

fn id(n: u8) -> JobId {
    format!("01a20000-0000-7000-8000-0000000000{n:02}")
        .parse()
        .unwrap()
}

fn job(n: u8, gpus: u32, holds: &[(usize, u32)]) -> JobView {
    let state = if holds.is_empty() {
        JobState::Queued
    } else {
        JobState::Running
    };
    JobView {
        submitted_at: -f64::from(n),
        holds: holds.to_vec(),
        ..round::testkit::job(&id(n).to_string(), &format!("t{n}"), state, gpus)
    }
}

/// Rounds for deadlines weigh only jobs still waiting for their first
/// start, on the round's own estimate once they have one: after a
/// round, a job it started and a job no longer live leave the list,
/// and a waiting job's need becomes its time alone at its request with
/// its start (admission's bound was lower), as fmsim weighs it.
#[test]
fn deadline_waits_keep_only_waiting_jobs_at_the_rounds_estimate() {
    let view = round::testkit::view(
        vec![round::testkit::node("x", 4)],
        vec![job(1, 4, &[(0, 0), (0, 1), (0, 2), (0, 3)]), job(2, 2, &[])],
    );
    let cfg = RoundConfig {
        profiling: false,
        policy: "srtf".into(),
        ..Default::default()
    };
    let policy = fmsched_core::policy::by_name("srtf").unwrap();
    let prepared = prepare_round(&view, policy.as_ref(), &cfg);
    let estimates = round::testkit::estimates(&prepared, 3600.0);
    let d = decide_round(&view, &prepared, &estimates, policy.as_ref(), &cfg).unwrap();
    let started: Vec<&str> = d
        .plan
        .entries
        .iter()
        .filter(|e| e.gpus > 0)
        .flat_map(|e| e.jobs.iter().map(|&k| d.snapshot.jobs[k].id.as_str()))
        .collect();
    let (one, two) = (id(1).to_string(), id(2).to_string());
    assert_eq!(
        started,
        vec![one.as_str()],
        "the shorter running job keeps the node"
    );
    let waits = DeadlineWaits::default();
    assert!(waits.is_empty(), "a task's end wakes nothing");
    let by = tokio::time::Instant::now() + std::time::Duration::from_secs(7200);
    waits.add(&id(1), 900.0, by);
    waits.add(&id(2), 1000.0, by);
    waits.add(&id(9), 100.0, by);
    waits.after_round(&view, &d);
    // Job 2 alone at its 2 GPUs: 3,600 GPU-s of work in 1,800 s, and
    // its start (30 s).
    assert_eq!(waits.needs(), vec![(two, 1830.0)]);
    assert!(!waits.is_empty());
}

/// The round's writes of `outcome` on nothing observed.
fn writes_of(
    t: Translated,
    prepared: round::Prepared,
    estimates: round::Estimates,
    config: RoundConfig,
    outcome: &RoundOutcome,
) -> crate::persistence::RoundWrites {
    let inputs = super::inputs::Inputs {
        t,
        prepared,
        estimates,
        config,
    };
    let o = super::observe::tests::empty_observed();
    plan_writes(&o, &inputs, outcome, &(29500..=29999), Utc::now())
}

/// A kept temporal merge the round releases (B would finish sooner
/// alone than behind a long A) is written as a split with the round's
/// reason, for the persistence to end it and tell both jobs.
#[test]
fn tail_a_released_merge_is_written_as_a_split_with_its_reason() {
    let mut a = job(1, 8, &[(0, 0), (0, 1)]);
    a.progress = 0.1;
    let b = job(2, 8, &[]);
    let merge = crate::persistence::MergeRecord {
        id: 7,
        a: id(1),
        b: id(2),
        mode: fmsched_core::policy::MergeMode::Temporal,
        gain_ab: 0.2,
        gain_ba: 0.0,
        active: true,
        guard_passed: false,
        observed_gain: None,
    };
    let t = Translated {
        view: ClusterView {
            now: 0.0,
            nodes: vec![round::testkit::node("x", 16)],
            jobs: vec![a, b],
            merges: vec![round::MergeView {
                a: 0,
                b: 1,
                mode: fmsched_core::policy::MergeMode::Temporal,
            }],
            finished: Vec::new(),
        },
        jobs: vec![id(1), id(2)],
        nodes: vec![(
            NodeId::try_from("x".to_string()).unwrap(),
            (0..16).map(|g| GpuUuid(format!("x-G{g}"))).collect(),
        )],
        merges: vec![merge.clone()],
        finished: Vec::new(),
    };
    let cfg = RoundConfig {
        profiling: false,
        policy: "ymir".into(),
        ..Default::default()
    };
    let policy = fmsched_core::policy::by_name("ymir").unwrap();
    let prepared = prepare_round(&t.view, policy.as_ref(), &cfg);
    let mut estimates = round::testkit::estimates(&prepared, 3600.0);
    estimates.jobs[0] = round::testkit::linear(&prepared, 100_000.0);
    estimates.kept_b_alone = vec![round::testkit::linear(&prepared, 3600.0)];
    let d = decide_round(&t.view, &prepared, &estimates, policy.as_ref(), &cfg).unwrap();
    assert_eq!(d.outcome.released, vec![0]);
    let w = writes_of(t, prepared, estimates, cfg, &d.outcome);
    assert_eq!(w.released.len(), 1);
    assert_eq!(w.released[0].0, merge);
    assert!(
        w.released[0].1.contains("would finish sooner alone"),
        "{}",
        w.released[0].1
    );
}

/// A group the policy spreads over two nodes is not run by this
/// service: its job gets an event naming the nodes and no assignment,
/// never a silent drop; the others are assigned their GPUs by UUID.
#[test]
fn a_placement_this_service_cannot_run_is_an_event_not_a_silent_drop() {
    let nodes = ["x", "y"];
    let t = Translated {
        view: ClusterView {
            now: 0.0,
            nodes: nodes.iter().map(|n| round::testkit::node(n, 4)).collect(),
            jobs: vec![
                job(1, 2, &[(0, 0), (0, 1)]),
                job(2, 2, &[(1, 0), (1, 1)]),
                job(3, 3, &[]),
            ],
            merges: Vec::new(),
            finished: Vec::new(),
        },
        jobs: vec![id(1), id(2), id(3)],
        nodes: nodes
            .iter()
            .map(|n| {
                (
                    NodeId::try_from(n.to_string()).unwrap(),
                    (0..4).map(|g| GpuUuid(format!("{n}-G{g}"))).collect(),
                )
            })
            .collect(),
        merges: Vec::new(),
        finished: Vec::new(),
    };
    let cfg = RoundConfig {
        profiling: false,
        max_nodes_per_group: Some(1),
        policy: "srtf".into(),
        ..Default::default()
    };
    let policy = fmsched_core::policy::by_name("srtf").unwrap();
    let prepared = prepare_round(&t.view, policy.as_ref(), &cfg);
    let estimates = round::testkit::estimates(&prepared, 3600.0);
    let d = decide_round(&t.view, &prepared, &estimates, policy.as_ref(), &cfg).unwrap();
    let w = writes_of(t, prepared, estimates, cfg, &d.outcome);
    let assigned: Vec<JobId> = w.assignments.iter().map(|a| a.job).collect();
    assert_eq!(assigned, vec![id(1), id(2)]);
    assert_eq!(
        w.assignments[1].gpus,
        vec![GpuUuid("y-G0".into()), GpuUuid("y-G1".into())]
    );
    assert_eq!(w.notes.len(), 1, "{:?}", w.notes);
    let (job, kind, why) = &w.notes[0];
    assert_eq!((job, kind.as_str()), (&id(3), "unschedulable"));
    assert!(why.contains("over nodes x, y"), "{why}");
}
