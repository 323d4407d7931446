//! ICEFROG in fmsim: GPU sharing (Eq. 8), the layer tuner (Eq. 2, 15),
//! FreezeOut schedules, IceShare and the Lucid-style baseline, and the
//! paper's workload construction.

mod common;

use common::run;
use fmsched_estimator::analytic;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::engine::{LayerMode, NodeGroup, SimConfig, SimResult, freezeout_layers};
use fmsched_sim::generate::icefrog_workload;
use fmsched_sim::iceeval::{self, Spec};
use fmsched_sim::workload::WorkloadJob;

/// A one-GPU roberta-base job on `rte` at `batch`, submitted at `t`, of
/// `gpu_h` GPU-hours.
fn job(name: &str, t: f64, batch: u32, gpu_h: f64) -> WorkloadJob {
    WorkloadJob {
        name: name.into(),
        submit_s: t,
        model: "roberta-base".into(),
        task: "rte".into(),
        gpus: 1,
        max_gpus: 1,
        min_gpus: 0,
        batch,
        sharing: true,
        pipeline: false,
        epochs: None,
        target_metric: None,
        curve_key: None,
        trace_gpu_s: Some(gpu_h * 3600.0),
        gpu_model: None,
        expert_parallel: 0,
        slo: Default::default(),
        queueing: Default::default(),
        max_work_x: None,
    }
}

fn cfg(nodes: u32, gpus: u32, layers: LayerMode, gpu_sharing: bool) -> SimConfig {
    SimConfig {
        cluster: vec![NodeGroup::new("A100", nodes, gpus)],
        profile_s: 0.0,
        checkpoint_s: 30.0,
        context_switch_s: Some(30.0),
        layers,
        gpu_sharing,
        ..Default::default()
    }
}

fn avg_jct(r: &SimResult) -> f64 {
    r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64
}

#[test]
fn two_shared_jobs_each_run_at_nine_tenths_of_their_speed() {
    // One GPU, two alike small-batch jobs: Lucid packs the second onto the
    // first's GPU; both finish at (restart + work / 0.9) instead of one
    // waiting for the other.
    let jobs = [job("a", 0.0, 8, 1.0), job("b", 0.0, 8, 1.0)];
    let shared = run("lucid", &cfg(1, 1, LayerMode::Off, true), &jobs);
    let alone = run("lucid", &cfg(1, 1, LayerMode::Off, false), &jobs);
    assert_eq!(shared.jobs.len(), 2);
    assert!(shared.shared_gpu_s > 0.0, "nothing shared");
    assert_eq!(alone.shared_gpu_s, 0.0);
    let work_s = 3600.0;
    for j in &shared.jobs {
        let expect = 60.0 + work_s / 0.9;
        assert!(
            (j.jct_s - expect).abs() < 0.02 * expect,
            "{}: JCT {:.0} s, expected about {expect:.0} s",
            j.name,
            j.jct_s
        );
    }
    // Alone, the second waits for the first: 1 h + 2 h finishes.
    let mut jct: Vec<f64> = alone.jobs.iter().map(|j| j.jct_s).collect();
    jct.sort_by(f64::total_cmp);
    assert!(jct[1] > 2.0 * work_s, "{jct:?}");
    assert!(avg_jct(&shared) < avg_jct(&alone));
}

#[test]
fn jobs_over_half_a_gpu_never_share() {
    // Batch 64 of 512 tokens: over half the GPU busy (Eq. 8's utilisation
    // rule), so sharing is never chosen, by Lucid or IceShare.
    let jobs = [job("a", 0.0, 64, 0.5), job("b", 0.0, 64, 0.5)];
    for policy in ["lucid", "icefrog"] {
        let r = run(policy, &cfg(1, 1, LayerMode::Off, true), &jobs);
        assert_eq!(r.shared_gpu_s, 0.0, "{policy}");
        assert_eq!(r.jobs.len(), 2, "{policy}");
    }
}

#[test]
fn iceshare_shares_when_jobs_outnumber_gpus_and_finishes_everything() {
    let jobs: Vec<WorkloadJob> = (0..8)
        .map(|k| {
            job(
                &format!("j{k}"),
                60.0 * f64::from(k),
                8,
                0.5 + 0.25 * f64::from(k % 3),
            )
        })
        .collect();
    let shared = run("icefrog", &cfg(1, 4, LayerMode::Off, true), &jobs);
    let alone = run("icefrog", &cfg(1, 4, LayerMode::Off, false), &jobs);
    assert_eq!(shared.jobs.len(), 8);
    assert_eq!(alone.jobs.len(), 8);
    assert!(shared.shared_gpu_s > 0.0);
    assert!(
        avg_jct(&shared) < avg_jct(&alone),
        "sharing {:.0} s vs alone {:.0} s",
        avg_jct(&shared),
        avg_jct(&alone)
    );
}

#[test]
fn the_layer_tuner_finishes_jobs_sooner_than_plain_training() {
    // Eq. 15 picks the frozen layers with the most effective progress, ℓ = 0
    // included, so a tuned job is never slower; on the synthetic variance
    // profile freezing a few early layers pays.
    let jobs: Vec<WorkloadJob> = (0..4)
        .map(|k| {
            let mut j = job(&format!("j{k}"), 0.0, 32, 2.0);
            j.gpus = 2;
            j.max_gpus = 4;
            j
        })
        .collect();
    let plain = run("optimus", &cfg(2, 4, LayerMode::Off, false), &jobs);
    let tuned = run("optimus", &cfg(2, 4, LayerMode::Tuner, false), &jobs);
    let frozen = run("optimus", &cfg(2, 4, LayerMode::Freezeout, false), &jobs);
    assert!(
        avg_jct(&tuned) < 0.97 * avg_jct(&plain),
        "tuned {:.0} s vs plain {:.0} s",
        avg_jct(&tuned),
        avg_jct(&plain)
    );
    // Tuned FreezeOut may keep a job unfrozen, never make it slower than
    // the tuner.
    assert!(avg_jct(&frozen) >= avg_jct(&tuned) * 0.999);
}

#[test]
fn a_freezeout_schedule_freezes_layers_one_by_one_after_its_start() {
    assert_eq!(freezeout_layers(0.5, 0.4, 10), 0);
    assert_eq!(freezeout_layers(0.5, 0.5, 10), 1);
    assert_eq!(freezeout_layers(0.5, 0.75, 10), 6);
    assert_eq!(freezeout_layers(0.5, 1.0, 10), 10);
    assert_eq!(freezeout_layers(1.0, 1.0, 10), 0, "t0 = 1: never");
    assert_eq!(freezeout_layers(0.0, 0.3, 0), 0);
}

#[test]
fn the_icefrog_workload_samples_hours_3_to_6_and_sizes_tasks_by_gpu_time() {
    let catalog = Catalog::default_synthetic();
    let w = icefrog_workload(1.0, 7, &catalog, None).unwrap();
    assert_eq!(w.len(), 120);
    assert!(w.iter().all(|j| (0.0..3.0 * 3600.0).contains(&j.submit_s)));
    assert!(w.windows(2).all(|p| p[0].submit_s <= p[1].submit_s));
    for j in &w {
        let gpu_h = j.trace_gpu_s.unwrap() / 3600.0;
        let large = j.model.ends_with("-large");
        if gpu_h < 1.0 {
            assert!(!large, "{}: {gpu_h:.2} GPU-h", j.name);
        }
        if gpu_h >= 10.0 {
            assert!(large, "{}: {gpu_h:.2} GPU-h", j.name);
        }
        assert!(j.max_gpus >= j.gpus);
    }
    assert_eq!(icefrog_workload(2.0, 7, &catalog, None).unwrap().len(), 240);
    assert_eq!(
        w,
        icefrog_workload(1.0, 7, &catalog, None).unwrap(),
        "seeded"
    );
    assert!(icefrog_workload(0.0, 7, &catalog, None).is_err());
}

#[test]
fn the_evaluation_runs_every_system_and_names_a_bad_one() {
    let spec = Spec {
        loads: vec![0.25],
        seeds: vec![3],
        systems: ["icefrog", "lucid+", "optimus"]
            .iter()
            .map(|s| iceeval::system(s).unwrap())
            .collect(),
        cluster: vec![NodeGroup::new("A100", 3, 4)],
        scale: 1,
        knobs: Default::default(),
        trace: None,
    };
    let lut = analytic::default_lut().unwrap();
    let rows = iceeval::evaluate(&spec, &lut, &Catalog::default_synthetic(), 2).unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r.finished, r.jobs, "{}", r.label);
        assert_eq!(r.jobs, 30);
        assert!(r.avg_jct_h[0] > 0.0);
    }
    assert!(iceeval::table(&rows).contains("1.00x"));
    assert!(iceeval::system("pollux").is_ok());
    let e = iceeval::system("icefrog+").unwrap_err();
    assert!(e.contains("icefrog+"), "{e}");
}
