//! Tests of `inputs`.

use fmsched_core::JobState;

use super::*;
use crate::persistence::{GpuRecord, NodeRecord};

fn job(n: u8) -> JobId {
    format!("01a20000-0000-7000-8000-0000000000{n:02}")
        .parse()
        .unwrap()
}

fn record(n: u8, state: JobState) -> JobRecord {
    let spec = serde_json::json!({
        "model": "roberta-base",
        "dataset": { "uri": "file:///d", "task": format!("t{n}") },
        "hyperparameters": { "global_batch_size": 32, "learning_rate": 2e-5 },
        "target": { "max_iterations": 1000 },
        "resources": { "min_gpus": 1, "max_gpus": 2 },
        "launch": { "command": ["train"] }
    });
    let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    JobRecord {
        id: job(n),
        owner: fmsched_core::UserName("u".into()),
        spec: serde_json::from_value(spec).unwrap(),
        idempotency_key: None,
        state,
        state_reason: String::new(),
        output_path: None,
        created_at: now - chrono::Duration::seconds(i64::from(n)),
        updated_at: now,
        last_event_seq: 0,
    }
}

/// Warm-start sources (`ClusterView::finished`): completed jobs that
/// left output weights and share, the newest of each model, task,
/// setup and queue; the translation maps each back to its job.
#[test]
fn tail_the_view_lists_the_newest_finished_job_of_each_task_as_a_warm_start_source() {
    let done = |n: u8, task: &str| {
        let mut r = record(n, JobState::Completed);
        r.spec.dataset.task = task.into();
        r.output_path = Some(format!("/out/{n}"));
        r
    };
    let mut private = done(5, "mrpc");
    private.spec.sharing = false;
    let mut no_output = done(6, "sst2");
    no_output.output_path = Some(String::new());
    let mut failed = done(7, "cola");
    failed.state = JobState::Failed;
    let mut other_queue = done(8, "rte");
    other_queue.spec.queue = "research".into();
    // Newest first, as `finished_outputs` reads them.
    let finished = vec![
        done(1, "rte"),
        done(2, "rte"),
        done(3, "qnli"),
        private,
        no_output,
        failed,
        other_queue,
    ];
    let live: BTreeMap<JobId, JobRecord> = [(job(9), record(9, JobState::Queued))].into();
    let t = build_view(&ViewSources {
        nodes: &[node("x", 4)],
        live: &live,
        merges: &[],
        assignments: &[],
        progress: &BTreeMap::new(),
        service: &BTreeMap::new(),
        held_back: &BTreeSet::new(),
        pinned: &BTreeSet::new(),
        cordons: &BTreeMap::new(),
        loans: &BTreeMap::new(),
        restart_s: &|_| 0.0,
        footprint: &|_| None,
        unfit: &|_| Vec::new(),
        finished: &finished,
        now: Utc::now(),
    });
    assert_eq!(t.finished, vec![job(1), job(3), job(8)]);
    let tasks: Vec<(&str, &str)> = t
        .view
        .finished
        .iter()
        .map(|f| (f.task.as_str(), f.queue.as_str()))
        .collect();
    assert_eq!(tasks, vec![("rte", ""), ("qnli", ""), ("rte", "research")]);
    assert!(
        t.view
            .finished
            .iter()
            .all(|f| f.sharing && f.model == "roberta-base")
    );
}

/// The view of `live` jobs and `merges` on `nodes`, nothing placed,
/// held back or cordoned, restarts free.
fn plain_view(
    nodes: &[LiveNode],
    live: &BTreeMap<JobId, JobRecord>,
    merges: &[MergeRecord],
    now: DateTime<Utc>,
) -> Translated {
    build_view(&ViewSources {
        nodes,
        live,
        merges,
        assignments: &[],
        progress: &BTreeMap::new(),
        service: &BTreeMap::new(),
        held_back: &BTreeSet::new(),
        pinned: &BTreeSet::new(),
        cordons: &BTreeMap::new(),
        loans: &BTreeMap::new(),
        restart_s: &|_| 0.0,
        footprint: &|_| None,
        unfit: &|_| Vec::new(),
        finished: &[],
        now,
    })
}

pub(crate) fn node(id: &str, gpus: u32) -> LiveNode {
    let now = Utc::now();
    let record = NodeRecord {
        id: NodeId::try_from(id.to_string()).unwrap(),
        hostname: id.into(),
        address: String::new(),
        agent_version: "t".into(),
        gpu_backend: "fake".into(),
        labels: Default::default(),
        state: NodeState::Available,
        registered_at: now,
        last_heartbeat_at: now,
        gpus: (0..gpus)
            .map(|i| GpuRecord {
                uuid: GpuUuid(format!("{id}-G{i}")),
                index: i,
                model: "A100-80GB".into(),
                memory_total_bytes: 80 << 30,
                pci_bus_id: String::new(),
            })
            .collect(),
    };
    crate::registry::NodeRegistry::load(vec![record], now)
        .snapshot()
        .remove(0)
}

/// A metric-target job is planned at its predicted iterations within
/// its budget, whichever field names the budget; at its budget under a
/// policy without an iteration estimator (Chronus as published). A job
/// without a metric target runs its iteration budget, or its Eq. 2
/// estimate when it names none. Before, a metric target with
/// `max_iterations` was planned at the budget under every policy: the
/// metric prediction was stored and not used.
#[test]
fn estimate_prior_metric_targets_are_planned_at_their_prediction_within_budget() {
    use super::super::expected_iterations;
    let predicted = |k: u64| crate::persistence::Estimate {
        iterations: Some(k),
        ..Default::default()
    };
    let mut j = record(1, JobState::Queued);
    // Iteration-based: the budget, whatever the loss curve says.
    assert_eq!(expected_iterations(&j, Some(&predicted(400)), true), 1000);
    assert_eq!(expected_iterations(&j, None, true), 1000);
    // A metric target with max_iterations: the prediction.
    j.spec.target.metric = Some(
        serde_json::from_value(serde_json::json!(
            { "name": "accuracy", "value": 0.8 }
        ))
        .unwrap(),
    );
    assert_eq!(expected_iterations(&j, Some(&predicted(400)), true), 400);
    assert_eq!(expected_iterations(&j, Some(&predicted(4000)), true), 1000);
    assert_eq!(expected_iterations(&j, None, true), 1000);
    // Without the iteration estimator: the budget.
    assert_eq!(expected_iterations(&j, Some(&predicted(400)), false), 1000);
    // A budget in epochs: 3 epochs of 3,200 samples at batch 32.
    j.spec.target.max_iterations = None;
    j.spec.target.max_epochs = Some(3);
    j.spec.dataset.num_samples = Some(3200);
    assert_eq!(expected_iterations(&j, Some(&predicted(120)), true), 120);
    assert_eq!(expected_iterations(&j, Some(&predicted(120)), false), 300);
    // No metric, no iteration budget: the loss curve's Eq. 2 estimate,
    // whatever the policy (a loss plateau is the job's own stop).
    j.spec.target.metric = None;
    assert_eq!(expected_iterations(&j, Some(&predicted(120)), false), 120);
}

/// The translation layer: GPUs by index, holds from the stored plan
/// (profiling marked), an assignment whose GPU left its node holds
/// nothing, B of a temporal merge whose A completed rides on A's GPUs,
/// and the clock starts at the round.
#[test]
fn the_view_of_the_services_records() {
    let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let nodes = vec![node("a", 4), node("b", 2)];
    let live: BTreeMap<JobId, JobRecord> = [
        record(1, JobState::Running),
        record(2, JobState::Profiling),
        record(3, JobState::Running),
        record(5, JobState::Queued),
        record(6, JobState::Running),
    ]
    .into_iter()
    .map(|r| (r.id, r))
    .collect();
    let at = |job: JobId, node: &str, gpus: &[&str], profile: bool| Assignment {
        job,
        node: NodeId::try_from(node.to_string()).unwrap(),
        gpus: gpus.iter().map(|g| GpuUuid(g.to_string())).collect(),
        profile,
        rank_offset: 0,
        master_port: None,
    };
    let assignments = vec![
        at(job(1), "a", &["a-G2", "a-G3"], false),
        at(job(2), "b", &["b-G1"], true),
        at(job(3), "b", &["gone-G0"], false), // its GPU is not there
        at(job(4), "a", &["a-G0"], false),    // A, completed
        // A gang: one part per node.
        at(job(6), "a", &["a-G1"], false),
        at(job(6), "b", &["b-G0"], false),
    ];
    let merges = vec![MergeRecord {
        id: 1,
        a: job(4),
        b: job(5),
        mode: MergeMode::Temporal,
        gain_ab: 0.2,
        gain_ba: 0.0,
        active: true,
        guard_passed: true,
        observed_gain: None,
    }];
    let progress: BTreeMap<JobId, (u64, Option<String>)> =
        [(job(1), (250, None))].into_iter().collect();
    let t = build_view(&ViewSources {
        nodes: &nodes,
        live: &live,
        merges: &merges,
        assignments: &assignments,
        progress: &progress,
        service: &BTreeMap::new(),
        held_back: &[job(3)].into_iter().collect(),
        pinned: &BTreeSet::new(),
        cordons: &BTreeMap::new(),
        loans: &BTreeMap::new(),
        restart_s: &|_| 42.0,
        footprint: &|_| None,
        unfit: &|_| Vec::new(),
        finished: &[],
        now,
    });
    let v = &t.view;
    assert_eq!(v.nodes.len(), 2);
    assert_eq!(t.jobs, vec![job(1), job(2), job(3), job(5), job(6)]);
    assert_eq!(
        v.jobs[4].holds,
        vec![(0, 1), (1, 0)],
        "a gang holds every part"
    );
    assert_eq!(v.jobs[0].holds, vec![(0, 2), (0, 3)]);
    assert_eq!(v.jobs[0].progress, 0.25);
    assert_eq!(v.jobs[0].submitted_at, -1.0);
    assert_eq!(v.jobs[0].restart_s, 42.0);
    assert_eq!(
        (v.jobs[1].holds.clone(), v.jobs[1].profiling_run),
        (vec![(1, 1)], true)
    );
    assert!(v.jobs[2].holds.is_empty() && v.jobs[2].held_back);
    assert_eq!(v.jobs[3].holds, vec![(0, 0)], "B rides on A's GPUs");
    assert!(v.jobs[3].ever_merged);
    assert!(
        v.merges.is_empty(),
        "A is no longer live: no merge in force"
    );
    // Parts in rank order whatever order the GPUs come in: nodes by id.
    let parts = t.parts(&[(1, 1), (0, 2), (1, 0), (0, 3)]).unwrap();
    let got: Vec<(&str, Vec<&str>, u32)> = parts
        .iter()
        .map(|p| {
            (
                p.node.as_str(),
                p.gpus.iter().map(|g| g.0.as_str()).collect(),
                p.rank_offset,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("a", vec!["a-G2", "a-G3"], 0),
            ("b", vec!["b-G0", "b-G1"], 2)
        ]
    );
    assert!(t.parts(&[(0, 9)]).is_none(), "an unknown GPU");
}

/// ICEFROG Eq. 16 live: a layer-elastic job whose trainer reported its
/// gradient variance goes to the time table with its tuner inputs, from
/// its own floor, and its row there is its time at the best frozen
/// layers per allocation (faster than training every layer when its
/// early layers have settled); one without a report trains at the
/// frozen layers the tuner last picked; a plain job has neither.
/// On a cluster of two families, a job that trains alone learns its
/// time on the other family relative to where it runs, from the
/// throughput table (what placement's move to a faster family reads);
/// a queued job learns its time on the other family at its smallest
/// allocation (1 GPU) relative to the family its times are estimated on
/// (the one with the most GPUs, H100: what placement's choice of family
/// reads); a job pinned to its family learns nothing.
#[test]
fn a_running_job_learns_its_time_on_the_other_family() {
    use fmsched_core::round::testkit;
    let mut v100 = testkit::node("v", 4);
    v100.gpu_model = "V100".into();
    let mut h100 = testkit::node("h", 8);
    h100.gpu_model = "H100".into();
    let running = |id: &str, gpus: u32| {
        let mut j = testkit::job(id, id, JobState::Running, gpus);
        j.holds = (0..gpus).map(|g| (0, g)).collect();
        j
    };
    let mut pinned = running("pinned", 1);
    pinned.holds = vec![(0, 3)];
    pinned.gpu_model = Some("V100".into());
    let mut view = testkit::view(
        vec![v100, h100],
        vec![
            running("alone", 2),
            testkit::job("queued", "q", JobState::Queued, 2),
            pinned,
        ],
    );
    let policy = fmsched_core::policy::by_name("srtf").unwrap();
    let prepared = fmsched_core::round::prepare(
        &view,
        policy.as_ref(),
        &RoundConfig {
            profiling: false,
            ..Default::default()
        },
    );
    let input = |id: &str| times::JobInput {
        id: id.into(),
        model: "roberta-base".into(),
        gpu_type: "V100".into(),
        gpus_per_node: 4,
        global_batch: 32,
        variant: Variant::default(),
        layers: 12,
        remaining_iterations: 1000,
        done_iterations: 0,
        curve: None,
        max_iterations: 1000,
        samples_per_epoch: 3200,
        layer_tuning: None,
    };
    let inputs: Vec<times::JobInput> = prepared
        .jobs
        .iter()
        .map(|&v| input(&view.jobs[v].id))
        .collect();
    let lut = analytic::default_lut().unwrap();
    family_time_ratios(&lut, &mut view, &prepared, &inputs);
    let seconds = |family: &str, gpus: u32, per_node: u32| {
        lut.iteration_time(
            "roberta-base",
            family,
            gpus,
            per_node,
            32,
            &Variant::default(),
            12,
        )
        .unwrap()
        .seconds
    };
    let ratio = seconds("H100", 2, 8) / seconds("V100", 2, 4);
    assert!(ratio < 1.0, "H100 is faster: {ratio}");
    assert_eq!(
        view.jobs[0].family_time_ratio,
        vec![("H100".to_string(), ratio)]
    );
    let queued = seconds("V100", 1, 4) / seconds("H100", 1, 8);
    assert!(queued > 1.0, "V100 is slower: {queued}");
    assert_eq!(
        view.jobs[1].family_time_ratio,
        vec![("V100".to_string(), queued)],
        "queued"
    );
    assert!(view.jobs[2].family_time_ratio.is_empty(), "pinned");
}

/// An active merge of jobs `a` and `b` at predicted gain `g` both ways,
/// not guarded or measured yet.
fn active_merge(id: i64, (a, b): (u8, u8), mode: MergeMode, g: f64) -> MergeRecord {
    MergeRecord {
        id,
        a: job(a),
        b: job(b),
        mode,
        gain_ab: g,
        gain_ba: g,
        active: true,
        guard_passed: false,
        observed_gain: None,
    }
}

/// B of a kept temporal merge is planned from A's weights (1,000
/// iterations at `G` = 0.5: 667), and also asked of the time table as
/// it would train alone, from scratch (1,000), for the round's test of
/// whether it would finish sooner so (`Estimates::kept_b_alone`). A
/// spatial merge has no such row.
#[test]
fn tail_a_kept_temporal_merges_b_is_also_planned_alone_from_scratch() {
    let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let live: BTreeMap<JobId, JobRecord> = [
        record(1, JobState::Queued),
        record(2, JobState::Queued),
        record(3, JobState::Queued),
        record(4, JobState::Queued),
    ]
    .into_iter()
    .map(|r| (r.id, r))
    .collect();
    let merges = vec![
        active_merge(1, (1, 2), MergeMode::Temporal, 0.5),
        active_merge(2, (3, 4), MergeMode::Spatial, 0.5),
    ];
    let o = Observed {
        live: live.clone(),
        merges: merges.clone(),
        ..Default::default()
    };
    let nodes = vec![node("a", 4)];
    let t = plain_view(&nodes, &live, &merges, now);
    let policy = fmsched_core::policy::by_name("ymir").unwrap();
    let prepared = fmsched_core::round::prepare(&t.view, policy.as_ref(), &RoundConfig::default());
    assert_eq!(prepared.kept.len(), 2);
    let planned = planned_jobs(&o, &t, &prepared, "A100", true);
    let b = planned
        .inputs
        .iter()
        .find(|i| i.id == job(2).to_string())
        .unwrap();
    assert_eq!(b.remaining_iterations, 667, "from A's weights");
    let alone: Vec<Option<u64>> = planned
        .kept_b_alone
        .iter()
        .map(|i| i.as_ref().map(|i| i.remaining_iterations))
        .collect();
    let temporal = prepared
        .kept
        .iter()
        .position(|&m| t.view.merges[m].mode == MergeMode::Temporal)
        .unwrap();
    assert_eq!(alone[temporal], Some(1000));
    assert_eq!(alone[1 - temporal], None, "spatial");
}

/// B of a warm start (A completed) plans its remaining time on the gain
/// it showed once measured, not on the prediction that started it: 400
/// of its 1,000 iterations done, predicted `G` = 0.5 (600 / 1.5 = 400
/// left), measured −0.25 (600 / 0.75 = 800 left). Before the
/// measurement, the prediction; a spatial pair's measured mean leaves
/// each job's prediction in place.
#[test]
fn tail_a_warm_starts_measured_gain_replaces_its_prediction() {
    let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let live: BTreeMap<JobId, JobRecord> = [
        record(2, JobState::Queued),
        record(3, JobState::Queued),
        record(4, JobState::Queued),
    ]
    .into_iter()
    .map(|r| (r.id, r))
    .collect();
    let left = |observed: Option<f64>, spatial_observed: Option<f64>| {
        let merges = vec![
            // Job 1 completed: not live.
            MergeRecord {
                observed_gain: observed,
                ..active_merge(1, (1, 2), MergeMode::Temporal, 0.5)
            },
            MergeRecord {
                observed_gain: spatial_observed,
                ..active_merge(2, (3, 4), MergeMode::Spatial, 0.25)
            },
        ];
        let mut o = Observed {
            live: live.clone(),
            merges: merges.clone(),
            ..Default::default()
        };
        o.progress.insert(job(2), (400, None));
        let nodes = vec![node("a", 4)];
        let t = plain_view(&nodes, &live, &merges, now);
        let policy = fmsched_core::policy::by_name("ymir").unwrap();
        let prepared =
            fmsched_core::round::prepare(&t.view, policy.as_ref(), &RoundConfig::default());
        let inputs = job_inputs(&o, &t, &prepared, "A100", true);
        let of = |n: u8| {
            inputs
                .iter()
                .find(|i| i.id == job(n).to_string())
                .map(|i| i.remaining_iterations)
                .unwrap()
        };
        (of(2), of(4))
    };
    assert_eq!(left(None, None), (400, 800), "the predictions");
    assert_eq!(left(Some(-0.25), None).0, 800, "the measured gain");
    assert_eq!(left(None, Some(-0.5)).1, 800, "a spatial mean: unchanged");
}

#[test]
fn layer_elastic_jobs_reach_the_time_table_with_their_variance() {
    let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let elastic = |n: u8| {
        let mut r = record(n, JobState::Queued);
        r.spec.layer_elasticity = Some(fmsched_core::job::LayerElasticity {
            max_frozen_layers: 10,
        });
        r
    };
    let live: BTreeMap<JobId, JobRecord> = [elastic(1), elastic(2), record(3, JobState::Queued)]
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
    let variance: Vec<f64> = (0..12).map(|i| if i < 6 { 1e-3 } else { 1.0 }).collect();
    let mut o = Observed {
        live: live.clone(),
        ..Default::default()
    };
    o.layer_variance.insert(job(1), variance.clone());
    o.frozen_layers.insert(job(2), 3);
    let nodes = vec![node("a", 4)];
    let t = plain_view(&nodes, &live, &[], now);
    let policy = fmsched_core::policy::by_name("icefrog").unwrap();
    let prepared = fmsched_core::round::prepare(&t.view, policy.as_ref(), &RoundConfig::default());
    let inputs = job_inputs(&o, &t, &prepared, "A100", true);
    let of = |n: u8| {
        inputs
            .iter()
            .position(|i| i.id == job(n).to_string())
            .unwrap()
    };
    let (tuned, picked, plain) = (of(1), of(2), of(3));
    assert_eq!(
        inputs[tuned].layer_tuning,
        Some(times::LayerTuning {
            variance,
            max_frozen: 10
        })
    );
    assert_eq!(
        inputs[tuned].variant.frozen_layers, 0,
        "tuned from its floor"
    );
    assert_eq!(inputs[picked].layer_tuning, None);
    assert_eq!(inputs[picked].variant.frozen_layers, 3);
    assert_eq!(inputs[plain].layer_tuning, None);
    assert_eq!(inputs[plain].variant.frozen_layers, 0);
    let lut = analytic::default_lut().unwrap();
    let table = crate::estimates::local_times(&lut, &inputs, &[], &prepared.allocations).unwrap();
    for (k, &a) in prepared
        .allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| **a > 0)
    {
        assert!(
            table.jobs[tuned][k] < table.jobs[plain][k],
            "at {a} GPUs: {} vs {}",
            table.jobs[tuned][k],
            table.jobs[plain][k]
        );
    }
}
