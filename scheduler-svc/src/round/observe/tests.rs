//! Tests of the observe phase.

use std::collections::BTreeMap;

use chrono::Utc;
use fmsched_core::policy::MergeMode;
use fmsched_core::{JobId, JobState};
use fmsched_estimator::curve_prior::{CurveLibrary, Start};
use fmsched_estimator::loss_curve::{
    LossCurve, PLATEAU_THRESHOLD, fit_loss_curve, iterations_to_converge,
};
use fmsched_estimator::loss_prior::LossLibrary;
use fmsched_estimator::lut::Variant;
use fmsched_estimator::{analytic, footprint};
use fmsched_proto::v1 as pb;

use crate::persistence::{Assignment, Estimate, FreshStart, JobRecord, MergeRecord, MetricCurve};
use crate::round::observe::estimates::{
    curve_to_json, loss_refit, predict_metric_target, profile_estimate, refreshed_estimate,
};
use crate::round::observe::gang_placement;
use crate::round::observe::guard::{record_outcome, spatial_gain};
use crate::round::observe::tasks::{finishing, fresh_run, part_in_force};
use crate::round::observe::telemetry::{
    learn_utilization, profile_step_time_sample, running_step_time_sample,
};
use crate::round::observe::{Observed, PROFILE_SUFFIX};

pub(crate) fn job(n: u8) -> JobId {
    format!("01a20000-0000-7000-8000-0000000000{n:02}")
        .parse()
        .unwrap()
}

fn record(n: u8, max_iterations: Option<u64>) -> JobRecord {
    let spec = serde_json::json!({
        "model": "roberta-base",
        "dataset": { "uri": "file:///d", "task": "rte" },
        "hyperparameters": { "global_batch_size": 32, "learning_rate": 2e-5 },
        "target": { "max_iterations": max_iterations, "max_epochs": 3 },
        "resources": { "min_gpus": 1, "max_gpus": 1 },
        "launch": { "command": ["train"] }
    });
    JobRecord {
        id: job(n),
        owner: fmsched_core::UserName("u".into()),
        spec: serde_json::from_value(spec).unwrap(),
        idempotency_key: None,
        state: JobState::Running,
        state_reason: String::new(),
        output_path: None,
        created_at: Utc::now(),
        updated_at: Utc::now(),
        last_event_seq: 0,
    }
}

/// Ten finished roberta-base jobs whose loss curves share a shape (a
/// floor at 40 % of the start), and a new job of the model whose
/// profile saw the first half of the iterations it needs: the loss
/// prior predicts them within 15 %, where the job's own fit alone is
/// further off; the stored curve is the job's own fit (what it leaves
/// for the jobs after it). A running job's refit is only redone when
/// its own fit moved.
#[test]
fn estimate_prior_loss_a_profile_is_predicted_with_the_models_finished_jobs() {
    use fmsched_estimator::loss_prior::LossShape;
    let shape = |i: u32| LossShape {
        floor: 0.38 + 0.004 * f64::from(i),
        quad: 0.15 + 0.01 * f64::from(i),
    };
    let mut lib = LossLibrary::shipped();
    for i in 0..10 {
        assert!(lib.push(&shape(i).curve(1.0 + 0.2 * f64::from(i), 30.0 + 9.0 * f64::from(i))));
    }
    let truth = shape(5).curve(2.3, 70.0);
    let k = iterations_to_converge(&truth, 0.0, PLATEAU_THRESHOLD, 100_000) as f64;
    let (its, losses): (Vec<f64>, Vec<f64>) = (0..=(k as u32 / 2))
        .map(|i| {
            let x = f64::from(i);
            (x, truth.eval(x) * (1.0 + 0.04 * (7.3 * x).sin()))
        })
        .unzip();
    let t = pb::ObservedTask {
        task_id: format!("{}-profile", job(1)),
        phase: pb::TaskPhase::Succeeded as i32,
        trace_iterations: its,
        trace_losses: losses,
        ..Default::default()
    };
    let j = record(1, Some(100_000));
    let (est, reason) = profile_estimate(&j, &t, Some(&lib)).unwrap();
    let predicted = est.iterations.unwrap() as f64;
    let own = fit_loss_curve(&t.trace_iterations, &t.trace_losses).unwrap();
    let own_k = iterations_to_converge(&own, 0.0, PLATEAU_THRESHOLD, 100_000) as f64;
    assert!(
        (predicted - k).abs() / k < 0.15,
        "{predicted} vs {k}: {reason}"
    );
    assert!(
        (predicted - k).abs() < (own_k - k).abs(),
        "prior {predicted}, own fit {own_k}, truth {k}"
    );
    assert!(
        est.note
            .contains("loss prior of 10 finished roberta-base jobs"),
        "{}",
        est.note
    );
    assert_eq!(est.curve, Some(curve_to_json(&own)));
    // It trains to its max_iterations: the history says so, and what
    // the curve predicts; without them it says the prediction.
    assert!(
        reason.starts_with(
            "profiled: trains its budget of 100000 iterations (its loss curve flattens after about"
        ),
        "{reason}"
    );
    let (_, open) = profile_estimate(&record(1, None), &t, Some(&lib)).unwrap();
    assert!(
        open.starts_with(&format!(
            "profiled: about {} iterations to converge (Eq. 2",
            est.iterations.unwrap()
        )),
        "{open}"
    );
    // The plan weighs its p10–p90 width over the iterations left; with
    // the shipped shapes alone (no finished job) there is nothing to
    // weigh.
    assert!(est.spread > 0.0 && est.spread < 0.5, "{}", est.spread);
    let (alone, _) = profile_estimate(&j, &t, Some(&LossLibrary::shipped())).unwrap();
    assert_eq!(alone.spread, 0.0);
    // The running process reports the same trace: its own fit did not
    // move, so nothing is re-estimated.
    let running = pb::ObservedTask {
        task_id: job(1).to_string(),
        phase: pb::TaskPhase::Running as i32,
        ..t.clone()
    };
    assert!(loss_refit(&j, &running, Some(&est)).is_none());
    // Stored with a very different fit, it is re-estimated with the prior.
    let mut stale = est.clone();
    stale.curve = Some(curve_to_json(&LossCurve::new(0.0, 1.0, 1.0, 0.0)));
    let refit = loss_refit(&j, &running, Some(&stale)).unwrap();
    let e = refreshed_estimate(&j, &running, Some(&stale), refit, &lib);
    assert_eq!(e.iterations, est.iterations);
    assert!(e.note.starts_with("refit on"), "{}", e.note);
}

/// A profiling run's step time is filed at the replica it ran on, in
/// the job's variant: 1 GPU at the global batch; a pipeline's 4 stages
/// at the global batch; an expert group of 4 GPUs sharing the batch,
/// keyed by its group size (a table of another group size would read
/// it wrong).
#[test]
fn a_profiling_sample_is_keyed_by_the_replica_it_ran_on() {
    let mut plain = record(1, None);
    plain.spec.model = "switch-base-8".into();
    let key = |j: &JobRecord| profile_step_time_sample(j, "A100", 0.5).key.unwrap();
    let k = key(&plain);
    assert_eq!(
        (k.placement.as_str(), k.local_batch_size, k.expert_parallel),
        ("1", 32, 0)
    );
    let mut moe = plain.clone();
    moe.spec.resources.expert_parallel = 4;
    moe.spec.resources.max_gpus = 4;
    let k = key(&moe);
    assert_eq!(
        (k.placement.as_str(), k.local_batch_size, k.expert_parallel),
        ("4", 8, 4)
    );
    let mut pipe = record(2, None);
    pipe.spec.resources.pipeline_parallel = true;
    let k = key(&pipe);
    assert_eq!(
        (
            k.placement.as_str(),
            k.local_batch_size,
            k.pipeline_parallel
        ),
        ("4", 32, true)
    );
}

/// A curve shape of finished and running jobs: `level` at the start,
/// saturating 0.3 above it.
fn shape(level: f64, e: usize) -> f64 {
    level + 0.3 * (1.0 - (-0.4 * e as f64).exp())
}

/// A job with a budget of 10 epochs of 100 iterations whose accuracy
/// target is `shape(0.6, 6)`.
fn metric_job() -> JobRecord {
    let mut job = record(1, None);
    job.spec.target.max_epochs = Some(10);
    job.spec.dataset.num_samples = Some(3200); // 100 iterations per epoch
    job.spec.target.metric = Some(fmsched_core::MetricTarget {
        name: "eval_accuracy".into(),
        value: shape(0.6, 6),
        lower_is_better: false,
    });
    job
}

/// A job with a metric target: its evaluations so far and the curves of
/// finished jobs give its iterations (epochs × iterations per epoch,
/// within its budget) and a note with the spread; curves of another
/// model or metric are no prior; without `dataset.num_samples` no
/// iterations are estimated.
#[test]
fn estimate_prior_metric_target_sets_the_iterations_from_its_curve() {
    let mut job = metric_job();
    // Finished jobs of the same shape, each with the target of its
    // epoch 6 (another model's or metric's met theirs at epoch 2).
    let finished = |model: &str, metric: &str, level: f64| MetricCurve {
        model: model.into(),
        metric: metric.into(),
        lower_is_better: false,
        target: shape(level, if level > 0.5 { 6 } else { 2 }),
        evals: (1..=10).map(|e| shape(level, e)).collect(),
        transferred: false,
    };
    let prior = vec![
        finished("roberta-base", "eval_accuracy", 0.55),
        finished("roberta-base", "eval_accuracy", 0.6),
        finished("roberta-base", "eval_accuracy", 0.62),
        finished("vit-base", "eval_accuracy", 0.1),
        finished("roberta-base", "eval_f1", 0.1),
    ];
    // The job follows the same shape from 0.6: its target is epoch 6's.
    let mut e = Estimate {
        evals: (1..=3).map(|e| shape(0.6, e)).collect(),
        ..Default::default()
    };
    predict_metric_target(&job, Start::Alone, &prior, &CurveLibrary::shipped(), &mut e);
    assert_eq!(e.iterations, Some(600), "{}", e.note);
    assert!(e.note.contains("p10-p90"), "{}", e.note);
    assert!(e.note.contains("prior of 3 finished"), "{}", e.note);
    assert!(e.note.contains("met their targets"), "{}", e.note);
    // Its spread, what the plan weighs (p90 − p10 over the epochs left).
    assert!((0.0..=4.0).contains(&e.spread), "{}", e.spread);
    // The budget caps it.
    job.spec.target.max_iterations = Some(450);
    predict_metric_target(&job, Start::Alone, &prior, &CurveLibrary::shipped(), &mut e);
    assert_eq!(e.iterations, Some(450));
    // No samples per epoch: the curve is kept, no iterations.
    job.spec.dataset.num_samples = None;
    let mut e = Estimate {
        evals: vec![0.6, 0.7],
        ..Default::default()
    };
    predict_metric_target(&job, Start::Alone, &prior, &CurveLibrary::shipped(), &mut e);
    assert_eq!(e.iterations, None);
    assert!(e.note.contains("no dataset.num_samples"), "{}", e.note);
}

/// A job that trained from another task's weights or beside another
/// task is judged by finished jobs that did too: with only jobs alone
/// finished, the same evaluations read the curves' shapes; once a
/// transferred job like it finished, its target's epoch.
#[test]
fn estimate_prior_a_transferred_job_reads_finished_transferred_jobs() {
    let job = metric_job();
    let finished = |level: f64, transferred: bool| MetricCurve {
        model: "roberta-base".into(),
        metric: "eval_accuracy".into(),
        lower_is_better: false,
        target: shape(level, 6),
        evals: (1..=10).map(|e| shape(level, e)).collect(),
        transferred,
    };
    let alone = vec![
        finished(0.55, false),
        finished(0.6, false),
        finished(0.62, false),
    ];
    let evals: Vec<f64> = (1..=3).map(|e| shape(0.6, e)).collect();
    let predict = |start: Start, prior: &[MetricCurve]| {
        let mut e = Estimate {
            evals: evals.clone(),
            ..Default::default()
        };
        predict_metric_target(&job, start, prior, &CurveLibrary::shipped(), &mut e);
        e
    };
    let e = predict(Start::Alone, &alone);
    assert!(
        e.note.contains("when starts like this one met"),
        "{}",
        e.note
    );
    assert_eq!(e.iterations, Some(600), "{}", e.note);
    let e = predict(Start::Transferred, &alone);
    assert!(e.note.contains("their curves' shapes"), "{}", e.note);
    let mut both = alone.clone();
    both.extend([finished(0.57, true), finished(0.61, true)]);
    let e = predict(Start::Transferred, &both);
    assert!(
        e.note.contains("when transferred starts like this one met"),
        "{}",
        e.note
    );
    assert_eq!(e.iterations, Some(600), "{}", e.note);
}

/// A job over several nodes is measured at its plan's GPUs per node,
/// in rank order; a plan that no longer gives it its world, a single
/// node or a node share past 9 GPUs names no shape.
#[test]
fn a_gang_step_time_is_recorded_at_its_placement_over_nodes() {
    let at = |node: &str, gpus: usize, rank_offset: u32| Assignment {
        job: job(1),
        node: fmsched_core::NodeId::try_from(node.to_string()).unwrap(),
        gpus: (0..gpus)
            .map(|g| fmsched_core::GpuUuid(format!("{node}-{g}")))
            .collect(),
        profile: false,
        rank_offset,
        master_port: None,
    };
    let plan = vec![at("b", 2, 4), at("a", 4, 0)];
    assert_eq!(gang_placement(&plan, job(1), 6).as_deref(), Some("42"));
    assert_eq!(gang_placement(&plan, job(1), 8), None, "the plan moved on");
    assert_eq!(gang_placement(&plan, job(2), 6), None);
    assert_eq!(gang_placement(&plan[..1], job(1), 2), None, "one node");
    assert_eq!(
        gang_placement(&[at("a", 12, 0), at("b", 4, 12)], job(1), 16),
        None
    );
    let lut = analytic::default_lut().unwrap();
    let mut j = record(1, None);
    j.spec.hyperparameters.global_batch_size = 48;
    let s = running_step_time_sample(&lut, &j, "A100-SXM4-80GB", "42", 0, 0.5);
    let key = s.key.unwrap();
    assert_eq!(key.placement, "42");
    assert_eq!(key.local_batch_size * key.gradient_accumulation * 6, 48);
    assert_eq!(s.step_time_seconds, 0.5);
}

fn running(n: u8, iteration: u64, step_time_s: f64) -> pb::ObservedTask {
    pb::ObservedTask {
        task_id: job(n).to_string(),
        phase: pb::TaskPhase::Running as i32,
        iteration,
        step_time_s,
        ..Default::default()
    }
}

/// The look-ahead's prediction of what finishes before the switch:
/// reported outputs, and jobs whose remaining iterations at their step
/// time fit the lead — but not jobs already past their estimate.
#[test]
fn a_look_ahead_predicts_finishes_from_reports_and_step_times() {
    let live: BTreeMap<JobId, JobRecord> = [
        record(1, Some(1000)),
        record(2, Some(1000)),
        record(3, None),
        record(4, Some(1000)),
    ]
    .into_iter()
    .map(|r| (r.id, r))
    .collect();
    // Job 3 names no iteration budget: its estimate says 500.
    let estimates: BTreeMap<JobId, Estimate> = [(
        job(3),
        Estimate {
            iterations: Some(500),
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    let mut done = running(4, 1000, 0.1);
    done.outputs
        .insert(job(4).to_string(), "/out/4/weights.json".into());
    let observed = [
        running(1, 990, 0.5), // 10 iterations × 0.5 s = 5 s ≤ 30 s
        running(2, 100, 0.5), // 450 s: not before the switch
        running(3, 600, 0.5), // past its estimated 500: unknown
        done,
    ];
    let mut got = finishing(&observed, &live, &estimates, 30.0);
    got.sort();
    assert_eq!(
        got,
        vec![(job(1), None), (job(4), Some("/out/4/weights.json".into()))]
    );
    // Without step times only reported outputs count.
    let slow = [running(1, 990, 0.0)];
    assert!(finishing(&slow, &live, &estimates, 30.0).is_empty());
}

/// A spatial pair's gain is measured at the guard's verdict from each
/// job's loss against its own curve, once.
#[test]
fn a_spatial_verdict_measures_the_pairs_gain_once() {
    let curve = LossCurve {
        beta0: 0.2,
        beta1: 1.0,
        beta2: 0.01,
        beta3: 0.0,
        quality: 1.0,
    };
    let emb = |x: f64| Estimate {
        curve: Some(curve_to_json(&curve)),
        fisher: vec![1.0, x, 0.5],
        fisher_repeat: vec![1.0, x, 0.52],
        ..Default::default()
    };
    let m = MergeRecord {
        id: 7,
        a: job(1),
        b: job(2),
        mode: MergeMode::Spatial,
        gain_ab: 0.1,
        gain_ba: 0.1,
        active: true,
        guard_passed: false,
        observed_gain: None,
    };
    let estimates: BTreeMap<JobId, Estimate> = [(job(1), emb(2.0)), (job(2), emb(1.5))]
        .into_iter()
        .collect();
    // Both at iteration 100 with losses 1.2× and 1.1× below their curves.
    let l = curve.eval(100.0);
    let losses: BTreeMap<JobId, (u64, f64)> = [(job(1), (100, l / 1.2)), (job(2), (100, l / 1.1))]
        .into_iter()
        .collect();
    let g = spatial_gain(&estimates, &losses, &m).unwrap();
    assert!((g - 0.15).abs() < 1e-9, "{g}");
    let mut o = empty_observed();
    o.estimates = estimates;
    record_outcome(&mut o, &m, g);
    record_outcome(&mut o, &m, g);
    assert_eq!(o.outcomes.len(), 1, "once per merge");
    assert_eq!(o.writes.observed_gains, vec![(7, g)]);
    let measured = MergeRecord {
        observed_gain: Some(0.1),
        ..m
    };
    let mut o2 = empty_observed();
    o2.estimates = o.estimates.clone();
    record_outcome(&mut o2, &measured, g);
    assert!(
        o2.outcomes.is_empty(),
        "a merge measured before is not sent again"
    );
}

/// A job restarted from its initial weights at plan 7: a report of its
/// process from plan 6 is the dropped run and does not count; one from
/// plan 7 on counts, and shows the fresh process once (pending); a job
/// never restarted, or a profiling run, counts as always.
#[test]
fn tail_reports_of_a_dropped_run_do_not_count() {
    let fresh: BTreeMap<JobId, FreshStart> = [
        (
            job(1),
            FreshStart {
                generation: 7,
                pending: true,
            },
        ),
        (
            job(2),
            FreshStart {
                generation: 3,
                pending: false,
            },
        ),
    ]
    .into_iter()
    .collect();
    let report = |task: String, generation: i64| pb::ObservedTask {
        task_id: task,
        generation,
        ..Default::default()
    };
    assert_eq!(fresh_run(&fresh, &report(job(1).to_string(), 6)), None);
    assert_eq!(
        fresh_run(&fresh, &report(job(1).to_string(), 7)),
        Some(vec![job(1)])
    );
    assert_eq!(
        fresh_run(&fresh, &report(job(1).to_string(), 9)),
        Some(vec![job(1)])
    );
    assert_eq!(
        fresh_run(&fresh, &report(job(2).to_string(), 5)),
        Some(vec![])
    );
    assert_eq!(fresh_run(&fresh, &report(job(2).to_string(), 2)), None);
    assert_eq!(
        fresh_run(&fresh, &report(job(3).to_string(), 0)),
        Some(vec![])
    );
    let profile = format!("{}{PROFILE_SUFFIX}", job(1));
    assert_eq!(fresh_run(&fresh, &report(profile, 0)), Some(vec![]));
}

/// A gang part that failed counts against its job only as a part of
/// the run in force: the same node, GPUs and ranks as the plan's. A
/// part of a run the plan replaced (moved off the node, or onto other
/// GPUs or ranks there) exits non-zero once its rank 0 went away; that
/// is not the job failing.
#[test]
fn a_failed_gang_part_counts_only_as_a_part_of_the_run_in_force() {
    let node = |n: &str| fmsched_core::NodeId::try_from(n.to_string()).unwrap();
    let part = |n: &str, gpus: &[&str], rank_offset: u32| crate::persistence::Assignment {
        job: job(1),
        node: node(n),
        gpus: gpus
            .iter()
            .map(|g| fmsched_core::GpuUuid((*g).into()))
            .collect(),
        profile: false,
        rank_offset,
        master_port: Some(29_600),
    };
    let plan = vec![
        part("a", &["a-G0", "a-G1"], 0),
        part("b", &["b-G0", "b-G1"], 2),
    ];
    let failed = |gpus: &[&str], rank_offset: u32| pb::ObservedTask {
        task_id: job(1).to_string(),
        phase: pb::TaskPhase::Failed as i32,
        gpu_uuids: gpus.iter().map(|g| (*g).to_string()).collect(),
        rank_offset,
        ..Default::default()
    };
    let t = failed(&["b-G0", "b-G1"], 2);
    assert!(part_in_force(&plan, job(1), &node("b"), &t));
    assert!(
        !part_in_force(&plan, job(2), &node("b"), &t),
        "another job's"
    );
    assert!(
        !part_in_force(&plan, job(1), &node("c"), &t),
        "moved off node c"
    );
    let other_gpus = failed(&["b-G2", "b-G3"], 2);
    assert!(!part_in_force(&plan, job(1), &node("b"), &other_gpus));
    let other_ranks = failed(&["b-G0", "b-G1"], 4);
    assert!(!part_in_force(&plan, job(1), &node("b"), &other_ranks));
}

/// The utilisation regression learns from processes that run alone:
/// a one-GPU job alone on its GPU adds its own NVML reading (its GPU's
/// when the driver gives none) each round and the changed fit is
/// written; a shared GPU, a profiling run and a process not yet
/// stepping teach nothing. After three rounds the model's footprint
/// predicts what was measured.
#[test]
fn utilization_is_learned_from_processes_running_alone() {
    let at = |n: u8, gpu: &str, profile: bool| crate::persistence::Assignment {
        job: job(n),
        node: fmsched_core::NodeId::try_from("a".to_string()).unwrap(),
        gpus: vec![fmsched_core::GpuUuid(gpu.into())],
        profile,
        rank_offset: 0,
        master_port: None,
    };
    let mut o = Observed {
        live: (1..=4).map(|n| (job(n), record(n, Some(1000)))).collect(),
        ..Default::default()
    };
    o.current.assignments = vec![
        at(1, "a-G0", false),
        at(2, "a-G1", false),
        at(3, "a-G1", false),
        at(4, "a-G2", true),
    ];
    let mut node = crate::round::inputs::tests::node("a", 4);
    let telemetry = |uuid: &str, util: u32, procs: &[(u32, u32)]| pb::GpuTelemetry {
        uuid: uuid.into(),
        utilization_percent: util,
        processes: procs
            .iter()
            .map(|&(pid, u)| pb::GpuProcess {
                pid,
                utilization_percent: u,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    // Job 1's process reports no utilisation of its own: its GPU's 40 %.
    for t in [
        telemetry("a-G0", 40, &[(7, 0)]),
        telemetry("a-G1", 95, &[(8, 50), (9, 45)]),
        telemetry("a-G2", 30, &[]),
        telemetry("a-G3", 35, &[(11, 35)]),
    ] {
        node.telemetry.insert(t.uuid.clone(), t);
    }
    let on = |n: u8, gpu: &str, pid: u32, step: f64| pb::ObservedTask {
        gpu_uuids: vec![gpu.into()],
        pid,
        ..running(n, 10, step)
    };
    node.observed_tasks = vec![
        on(1, "a-G0", 7, 0.5),
        on(2, "a-G1", 8, 0.5),
        on(3, "a-G1", 9, 0.5),
        pb::ObservedTask {
            task_id: format!("{}{PROFILE_SUFFIX}", job(4)),
            ..on(4, "a-G2", 10, 0.5)
        },
        // Not planned there (a stale process) and not stepping yet.
        on(4, "a-G3", 11, 0.0),
    ];
    let key = ("roberta-base".to_string(), "A100".to_string());
    for round in 1..=3u64 {
        learn_utilization(&mut o, std::slice::from_ref(&node));
        assert_eq!(o.utilization_fits[&key].samples, round);
        assert_eq!(o.utilization_fits.len(), 1);
        assert_eq!(
            o.writes.utilization_fits,
            vec![(key.clone(), o.utilization_fits[&key])]
        );
    }
    // 32 × 512 tokens in fp32 (the spec leaves AMP off): twice the
    // plain work; at 40 %, h = 1.5 × that.
    let variant = Variant::of_spec(&o.live[&job(1)].spec);
    assert!(!variant.amp);
    let fit = o.utilization_fits[&key];
    assert!(
        (fit.overhead() - 1.5 * 2.0 * 16_384.0).abs() < 1e-6,
        "{}",
        fit.overhead()
    );
    let lut = analytic::default_lut().unwrap();
    let f = footprint::one_gpu_footprint(&lut, "roberta-base", "A100", &variant, 32, Some(&fit))
        .unwrap();
    assert!(
        (f.utilization_pct - 40.0).abs() < 1e-9,
        "{}",
        f.utilization_pct
    );
}

pub(crate) fn empty_observed() -> Observed {
    Observed::default()
}
