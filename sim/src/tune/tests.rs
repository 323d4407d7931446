//! Tests of `tune`.

use super::*;
use crate::engine::History;

fn job(name: &str, submit_s: f64, gpus: u32, run_s: f64) -> WorkloadJob {
    WorkloadJob {
        name: name.into(),
        submit_s,
        model: "roberta-base".into(),
        task: "rte".into(),
        gpus,
        max_gpus: gpus,
        min_gpus: 0,
        batch: 32 * gpus,
        sharing: true,
        pipeline: false,
        epochs: None,
        target_metric: None,
        curve_key: None,
        trace_gpu_s: Some(run_s * f64::from(gpus)),
        gpu_model: None,
        expert_parallel: 0,
        slo: Default::default(),
        queueing: Default::default(),
        max_work_x: None,
    }
}

#[test]
fn knobs_are_rounded_to_three_significant_digits() {
    assert_eq!(round_knob(67.100_000_000_000_01), 67.1);
    assert_eq!(round_knob(0.938_000_000_1), 0.938);
    assert_eq!(round_knob(1234.5), 1230.0);
    assert_eq!(format!("{}", round_knob(64.600_000_000_000_01)), "64.6");
}

#[test]
fn buckets_split_at_five_and_thirty_minutes_one_two_and_four_hours() {
    assert_eq!(bucket_of(0.0), 0);
    assert_eq!(bucket_of(299.0), 0);
    assert_eq!(bucket_of(300.0), 1);
    assert_eq!(bucket_of(3599.0), 2);
    assert_eq!(bucket_of(7200.0), 4);
    assert_eq!(bucket_of(1e6), 5);
}

#[test]
fn the_matching_segment_is_the_past_hour_that_looked_like_the_last_one() {
    // Arrivals per 5 minutes, hour by hour: quiet (1) or busy (6). The
    // last hour (5) is quiet; the past quiet hours with a known
    // successor are 0 (then busy), 2 (then quiet) and 3 (then busy);
    // the most recent of equally close matches wins, so hour 4 (busy)
    // is replayed.
    let pattern = [1, 6, 1, 1, 6, 1];
    let mut t = Vec::new();
    for (h, per_bin) in pattern.iter().enumerate() {
        for bin in 0..12 {
            for k in 0..*per_bin {
                t.push(h as f64 * 3600.0 + bin as f64 * 300.0 + k as f64 * 10.0);
            }
        }
    }
    let from = matching_segment(&t, 0.0, 6.0 * 3600.0).unwrap();
    assert_eq!(from, 4.0 * 3600.0);
    let count = t
        .iter()
        .filter(|&&x| x >= from && x < from + 3600.0)
        .count();
    assert_eq!(count, 72, "the replayed hour is a busy one");
    // With hour 3 made busy, hour 2 is the latest quiet match: hour 3
    // is replayed.
    let t2: Vec<f64> = t
        .iter()
        .copied()
        .chain((0..60).map(|k| 3.0 * 3600.0 + k as f64 * 60.0 + 5.0))
        .collect();
    let mut t2 = t2;
    t2.sort_by(f64::total_cmp);
    assert_eq!(
        matching_segment(&t2, 0.0, 6.0 * 3600.0).unwrap(),
        3.0 * 3600.0
    );
    assert!(
        matching_segment(&t, 0.0, 1.5 * 3600.0).is_none(),
        "too little history"
    );
}

#[test]
fn the_predictor_conditions_on_survival_and_follows_the_gpu_class() {
    let mut h = Vec::new();
    for k in 0..40 {
        // One-GPU jobs are short (10 min), eight-GPU jobs long (3 h).
        h.push(Finished {
            finish_s: k as f64 * 100.0,
            gpus: 1,
            duration_s: 600.0,
        });
        h.push(Finished {
            finish_s: k as f64 * 100.0,
            gpus: 8,
            duration_s: 3.0 * 3600.0,
        });
    }
    let p = DurationPredictor::default();
    assert_eq!(p.bucket(&h, 4000.0, 1, 0.0), Some(1));
    assert_eq!(p.bucket(&h, 4000.0, 8, 0.0), Some(4));
    // A one-GPU job that has run an hour is no ten-minute job.
    assert_eq!(p.bucket(&h, 4000.0, 1, 3600.0), Some(4));
    let mut rng = Rng::new(1);
    let rem = p.remaining(&h, 4000.0, 1, 3600.0, &mut rng);
    assert!((rem - 2.0 * 3600.0).abs() < 1.0, "{rem}");
    // Longer than anything seen: as long again.
    assert_eq!(
        p.remaining(&h, 4000.0, 8, 5.0 * 3600.0, &mut rng),
        5.0 * 3600.0
    );
    assert_eq!(p.accuracy(&h, 0.25), Some(1.0));
}

#[test]
fn the_aggregator_keeps_gpu_time_and_merges_only_alike_jobs() {
    let jobs: Vec<TraceJob> = vec![
        job("a", 10.0, 1, 600.0),
        job("b", 20.0, 1, 700.0),
        job("c", 30.0, 1, 800.0),
        job("d", 40.0, 2, 650.0),  // other GPU count
        job("e", 50.0, 1, 4000.0), // other bucket
        job("f", 400.0, 1, 600.0), // other 5-minute bin
    ]
    .into_iter()
    .map(TraceJob::arriving)
    .collect();
    let gpu_s = |v: &[TraceJob]| v.iter().map(|t| t.job.trace_gpu_s.unwrap()).sum::<f64>();
    let agg = aggregate(&jobs, 8);
    assert_eq!(agg.len(), 4, "{agg:#?}");
    assert!((gpu_s(&agg) - gpu_s(&jobs)).abs() < 1e-6);
    let merged = agg
        .iter()
        .find(|t| t.job.name.starts_with("agg-3x"))
        .unwrap();
    assert_eq!(merged.job.gpus, 3);
    assert!((merged.job.submit_s - 20.0).abs() < 1e-9);
    // A cap of two GPUs splits the three into a pair and a single.
    assert_eq!(aggregate(&jobs, 2).len(), 5);
}

/// Short jobs arriving steadily on one 4-GPU node, with a few long
/// ones: round intervals matter (a job waits for the next round).
fn steady(hours: f64) -> Vec<WorkloadJob> {
    let mut rng = Rng::new(7);
    let mut out = Vec::new();
    let mut t = 0.0;
    let mut k = 0;
    while t < hours * 3600.0 {
        let long = k % 10 == 0;
        let run = if long {
            5400.0
        } else {
            200.0 + 400.0 * rng.f64()
        };
        out.push(job(&format!("j{k}"), t, if long { 2 } else { 1 }, run));
        t += 150.0 + 150.0 * rng.f64();
        k += 1;
    }
    out
}

fn setup() -> (SimConfig, Lut, Catalog) {
    let cfg = SimConfig {
        profile_s: 0.0,
        ..SimConfig::uniform(1, 4, "V100")
    };
    (
        cfg,
        fmsched_estimator::analytic::default_lut().unwrap(),
        Catalog::default_synthetic(),
    )
}

#[test]
fn a_retuned_run_sees_only_the_past_and_hands_on_to_the_new_policy() {
    let (cfg, lut, cat) = setup();
    let jobs = steady(3.0);
    let slow = with_knobs("tiresias", &Knobs::from([("interval_s".into(), 600.0)])).unwrap();
    let fast = with_knobs("tiresias", &Knobs::from([("interval_s".into(), 60.0)])).unwrap();
    let run = |p: &dyn Policy| {
        Simulation::new(cfg.clone(), &lut, &cat, &jobs)
            .unwrap()
            .run(p, &cat, |_, _| {})
            .unwrap()
    };
    let (slow_r, fast_r) = (run(slow.as_ref()), run(fast.as_ref()));
    let mut calls = Vec::new();
    let mut hook =
        |obs: &Observation<'_>, active: &dyn Policy| -> Option<Box<dyn Policy + Send + Sync>> {
            // Only arrived jobs, and nothing finished after now.
            assert!(obs.jobs.iter().all(|o| o.spec.submit_s <= obs.now));
            assert!(obs.jobs.iter().all(|o| match o.state {
                ObservedState::Done { finish_s } => finish_s <= obs.now,
                _ => true,
            }));
            calls.push((obs.now, active.interval_s()));
            with_knobs("tiresias", &Knobs::from([("interval_s".into(), 60.0)])).ok()
        };
    let swapped = Simulation::new(cfg.clone(), &lut, &cat, &jobs)
        .unwrap()
        .run_retuned(
            slow.as_ref(),
            &cat,
            |_, _| {},
            Some(crate::engine::Retune {
                every_s: 1800.0,
                hook: &mut hook,
            }),
        )
        .unwrap();
    assert!(calls.len() >= 5, "{calls:?}");
    assert_eq!(
        calls[0],
        (1800.0, 600.0),
        "the first call sees the starting policy"
    );
    assert_eq!(
        calls[1].1, 60.0,
        "later calls see the policy it handed over"
    );
    let avg = |r: &SimResult| r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
    assert!(
        avg(&fast_r) < avg(&slow_r),
        "the test needs intervals to matter"
    );
    assert!(
        avg(&swapped) < avg(&slow_r),
        "the handed-over policy decides"
    );
    assert!(
        avg(&swapped) > avg(&fast_r) - 1e-9,
        "the first half hour ran slow"
    );
}

#[test]
fn the_tuner_adopts_only_what_beats_the_active_knobs_by_the_threshold() {
    let (cfg, lut, cat) = setup();
    let jobs = steady(4.0);
    let start = Knobs::from([("interval_s".into(), 600.0)]);
    let search = SearchConfig {
        samples: 6,
        threads: 2,
        ..Default::default()
    };
    // A replay re-tuned hourly from `start` under `search`.
    let tuned_run = |search: SearchConfig| {
        let mut tuner = Tuner::new(
            "tiresias",
            start.clone(),
            cfg.clone(),
            Arc::new(lut.clone()),
            Arc::new(cat.clone()),
            Forecast::AutoSched,
            search,
        )
        .unwrap();
        let r = replay(
            &cfg,
            &lut,
            &cat,
            &jobs,
            "tiresias",
            &start,
            Some((&mut tuner, 3600.0)),
        )
        .unwrap();
        (r, tuner.decisions.clone(), tuner.knobs().clone())
    };
    let (tuned, decisions, knobs) = tuned_run(search.clone());
    let fixed = replay(&cfg, &lut, &cat, &jobs, "tiresias", &start, None).unwrap();
    let adopted: Vec<&TuneDecision> = decisions.iter().filter(|d| d.adopted).collect();
    assert!(!adopted.is_empty(), "{decisions:#?}");
    assert!(adopted.iter().all(|d| d.gain > 1.1));
    assert!(
        decisions
            .iter()
            .filter(|d| !d.adopted)
            .all(|d| d.gain <= 1.1)
    );
    assert!(knobs["interval_s"] < 600.0, "{knobs:?}");
    // Realised gains: none before the first adoption, then measured
    // on the jobs that finished since.
    let first = decisions.iter().position(|d| d.adopted).unwrap();
    assert!(
        decisions[..=first]
            .iter()
            .all(|d| d.realised_gain.is_none())
    );
    assert!(
        decisions[first + 1..]
            .iter()
            .any(|d| d.realised_gain.is_some_and(|g| g > 0.0)),
        "{decisions:#?}"
    );
    let avg = |r: &SimResult| r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
    assert!(
        avg(&tuned) < avg(&fixed),
        "{} vs {}",
        avg(&tuned),
        avg(&fixed)
    );
    // A threshold nothing can pass: the knobs never move.
    let (same, decisions, knobs) = tuned_run(SearchConfig {
        threshold: 1e9,
        ..search
    });
    assert!(!decisions.is_empty());
    assert!(decisions.iter().all(|d| !d.adopted));
    assert_eq!(knobs["interval_s"], 600.0);
    assert_eq!(avg(&same), avg(&fixed));
    assert!(
        Tuner::new(
            "ymir",
            Knobs::new(),
            cfg,
            Arc::new(lut.clone()),
            Arc::new(cat.clone()),
            Forecast::AutoSched,
            SearchConfig::default()
        )
        .is_err()
    );
}

#[test]
fn a_carried_over_job_keeps_its_age_for_the_starvation_rule() {
    // Both jobs have attained 100 GPU-hours (Tiresias' low queue). The
    // waiter arrives a second later, so without its history it runs
    // second; having waited ten thousand seconds after running a hundred
    // (over Tiresias' starvation factor of 10), it is promoted and runs
    // first.
    let (_, lut, cat) = setup();
    let cfg = SimConfig {
        profile_s: 0.0,
        ..SimConfig::uniform(1, 1, "V100")
    };
    let jobs = vec![job("runner", 0.0, 1, 1800.0), job("waiter", 1.0, 1, 1800.0)];
    let tiresias = with_knobs("tiresias", &Knobs::new()).unwrap();
    let waiter_start = |age: f64| {
        let mut sim = Simulation::new(cfg.clone(), &lut, &cat, &jobs).unwrap();
        let h = |executed_s: f64, age_s: f64| History {
            attained_gpu_s: 100.0 * 3600.0,
            executed_s,
            age_s,
            fair_share_gpu_s: 0.0,
        };
        sim.seed_history(0, &h(3600.0, 3600.0));
        sim.seed_history(1, &h(100.0, age));
        let r = sim.run(tiresias.as_ref(), &cat, |_, _| {}).unwrap();
        r.jobs[1].first_start_s.unwrap()
    };
    assert!(waiter_start(0.0) > 1000.0, "{}", waiter_start(0.0));
    assert!(waiter_start(10_100.0) < 300.0, "{}", waiter_start(10_100.0));
}

#[test]
fn the_observed_objective_counts_only_jobs_finished_in_the_window() {
    let specs: Vec<WorkloadJob> = (0..3)
        .map(|k| job(&format!("j{k}"), 100.0 * k as f64, 1, 60.0))
        .collect();
    let live: Vec<LiveJob> = [(Some(200.0), 10.0), (Some(500.0), 10.0), (None, 5.0)]
        .iter()
        .enumerate()
        .map(|(k, (finish, fair))| LiveJob {
            id: format!("j{k}"),
            submitted_s: 100.0 * k as f64,
            model: "roberta-base".into(),
            gpus: 1,
            state: finish.map_or(ObservedState::Running, |f| ObservedState::Done {
                finish_s: f,
            }),
            executed_s: 60.0,
            attained_gpu_s: 60.0,
            fair_share_gpu_s: *fair,
        })
        .collect();
    let obs = live_observation(600.0, &live, &specs);
    // j0: JCT 200 s, finished at 200; j1: JCT 400 s, finished at 500.
    assert_eq!(
        Objective::AvgJct.observed(&obs, 0.0, 300.0),
        Some(1.0 / 200.0)
    );
    assert_eq!(
        Objective::AvgJct.observed(&obs, 0.0, 600.0),
        Some(2.0 / 600.0)
    );
    assert_eq!(Objective::AvgJct.observed(&obs, 501.0, 600.0), None);
    assert_eq!(Objective::FairShare.observed(&obs, 0.0, 600.0), Some(1.0));
}
