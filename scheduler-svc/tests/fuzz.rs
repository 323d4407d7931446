//! Fuzzing of every input the scheduler decodes from the network: job specs
//! through the submit path's pure steps (proto → spec, default name,
//! validation, deadline admission, fit check, throughput variant), and
//! agent messages through their checks and the registry's handlers.
//!
//! Each test runs a fixed number of cases from a fixed seed (bounded time
//! in CI; `FMSCHED_FUZZ_ITERATIONS` and `FMSCHED_FUZZ_SEED` run longer or
//! elsewhere) over three kinds of input: random bytes, byte-level mutations
//! of a valid encoded message (flips, truncations, insertions), and valid
//! messages with fields set to extreme values (0, MAX, NaN, ±inf, huge
//! strings). A panic anywhere fails the test with the case that caused it.

use std::time::Duration;

use chrono::Utc;
use fmsched_core::{Limits, ModelCatalog, ValidationContext};
use fmsched_proto::convert::{job_spec_from_proto, job_spec_to_proto};
use fmsched_proto::v1 as pb;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scheduler_svc::api::agents::{validate_agent_message, validate_register};
use scheduler_svc::registry::NodeRegistry;

fn iterations() -> usize {
    std::env::var("FMSCHED_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

fn rng() -> StdRng {
    let seed = std::env::var("FMSCHED_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    StdRng::seed_from_u64(seed)
}

/// Random bytes, or `valid` with a few bytes flipped, cut or inserted.
fn mutate_bytes(rng: &mut StdRng, valid: &[u8]) -> Vec<u8> {
    if rng.random_bool(0.2) || valid.is_empty() {
        let n = rng.random_range(0..256);
        return (0..n).map(|_| rng.random()).collect();
    }
    let mut b = valid.to_vec();
    for _ in 0..rng.random_range(1..5) {
        let i = rng.random_range(0..b.len().max(1));
        let last = b.len().saturating_sub(1);
        match rng.random_range(0..4) {
            0 if !b.is_empty() => b[i.min(last)] ^= 1 << rng.random_range(0..8),
            1 if !b.is_empty() => b[i.min(last)] = rng.random(),
            2 => b.truncate(i),
            _ => {
                let at = i.min(b.len());
                b.insert(at, rng.random());
            }
        }
    }
    b
}

fn extreme_u64(rng: &mut StdRng) -> u64 {
    *[0, 1, u64::from(u32::MAX), i64::MAX as u64, u64::MAX]
        .get(rng.random_range(0..5))
        .unwrap()
}

fn extreme_u32(rng: &mut StdRng) -> u32 {
    *[0, 1, 3, 4, 8, 1 << 20, u32::MAX]
        .get(rng.random_range(0..7))
        .unwrap()
}

fn extreme_f64(rng: &mut StdRng) -> f64 {
    *[
        0.0,
        -0.0,
        -1.0,
        1e-300,
        1e300,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
    ]
    .get(rng.random_range(0..9))
    .unwrap()
}

fn extreme_string(rng: &mut StdRng) -> String {
    match rng.random_range(0..6) {
        0 => String::new(),
        1 => "x".repeat(70_000),
        2 => "../../etc/passwd".into(),
        3 => "a\0b\nc".into(),
        4 => "ü🚀".repeat(100),
        _ => "s3://b/x".into(),
    }
}

fn base_spec() -> pb::JobSpec {
    let deadline = (Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let yaml = format!(
        r#"
name: qqp
model: roberta-base
dataset: {{ uri: s3://d/glue/qqp, task: qqp, objective: sequence-classification, num_samples: 3200 }}
hyperparameters: {{ global_batch_size: 64, learning_rate: 0.00002, amp: true }}
target: {{ max_epochs: 3, max_iterations: 500, metric: {{ name: f1, value: 0.88 }} }}
resources: {{ min_gpus: 1, max_gpus: 8 }}
deadline: "{deadline}"
layer_elasticity: {{ max_frozen_layers: 4 }}
launch: {{ command: [python, train.py], env: {{ A: "1" }} }}
"#
    );
    job_spec_to_proto(&fmctl::parse_spec("fuzz", &yaml).unwrap())
}

/// One field of a valid spec set to an extreme value.
fn extreme_spec(rng: &mut StdRng) -> pb::JobSpec {
    let mut s = base_spec();
    for _ in 0..rng.random_range(1..4) {
        let d = s.dataset.get_or_insert_default();
        let h = s.hyperparameters.get_or_insert_default();
        match rng.random_range(0..21) {
            0 => d.num_samples = extreme_u64(rng),
            1 => d.uri = extreme_string(rng),
            2 => h.global_batch_size = extreme_u32(rng),
            3 => h.learning_rate = extreme_f64(rng),
            4 => h.weight_decay = extreme_f64(rng),
            5 => s.target.get_or_insert_default().max_iterations = extreme_u64(rng),
            6 => s.target.get_or_insert_default().max_epochs = extreme_u32(rng),
            7 => {
                s.target
                    .get_or_insert_default()
                    .metric
                    .get_or_insert_default()
                    .value = extreme_f64(rng)
            }
            8 => s.resources.get_or_insert_default().min_gpus = extreme_u32(rng),
            9 => s.resources.get_or_insert_default().max_gpus = extreme_u32(rng),
            10 => s.resources.get_or_insert_default().expert_parallel = extreme_u32(rng),
            11 => s.resources.get_or_insert_default().pipeline_parallel = rng.random(),
            12 => {
                s.model =
                    ["switch-base-8", "llama-2-7b", "", "gpt-17"][rng.random_range(0..4)].into()
            }
            13 => {
                let f = s.frozen_layers.get_or_insert_default();
                f.first = extreme_u32(rng);
                f.last = extreme_u32(rng);
            }
            14 => s.layer_elasticity.get_or_insert_default().max_frozen_layers = extreme_u32(rng),
            15 => {
                s.deadline = Some(prost_types::Timestamp {
                    seconds: [i64::MIN, i64::MAX, 0, Utc::now().timestamp() + 60]
                        [rng.random_range(0..4)],
                    nanos: [0, -1, 999_999_999, i32::MAX][rng.random_range(0..4)],
                })
            }
            16 => s.slo_class = rng.random_range(-2..6),
            17 => s.kind = rng.random_range(-2..5),
            18 => {
                s.kind = 2; // prompt tuning
                s.prompt_tuning.get_or_insert_default().num_virtual_tokens = extreme_u32(rng);
            }
            19 => {
                s.kind = 2;
                s.layer_elasticity = None;
                s.prompt_tuning.get_or_insert_default().initial_prompt = extreme_string(rng);
            }
            _ => s.name = extreme_string(rng),
        }
    }
    s
}

/// The submit path without Postgres: what `SubmitJob` runs before and
/// after the insert. Returns whether the spec was accepted.
fn submit_path(spec: pb::JobSpec, models: &ModelCatalog, nodes: &NodeRegistry) -> bool {
    let Ok(mut spec) = job_spec_from_proto(spec) else {
        return false;
    };
    spec.default_name();
    let now = Utc::now();
    let ctx = ValidationContext {
        now,
        models,
        limits: Limits::default(),
    };
    if spec.validate(&ctx).is_err() {
        return false;
    }
    spec.apply_kind_defaults();
    let snapshot = nodes.snapshot();
    let lut = scheduler_svc::round::shipped_lut().unwrap();
    let _ = scheduler_svc::round::admission::check_deadline(&lut, &snapshot, &spec, now)
        .verdict(spec.class());
    let _ = scheduler_svc::round::never_fits_on(
        &scheduler_svc::config::Config::default(),
        &snapshot,
        &spec,
    );
    let _ = fmsched_estimator::lut::Variant::of_spec(&spec);
    let _ = spec.iteration_budget();
    true
}

/// A registry with two 8-GPU nodes, as the submit path sees one.
fn two_nodes() -> NodeRegistry {
    let r = NodeRegistry::load(vec![], Utc::now());
    for (node, model) in [("a", "A100-80GB"), ("b", "H100-80GB")] {
        let reg = register(node, model);
        let rec = validate_register(&reg, Utc::now()).unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        std::mem::forget(rx);
        r.register(rec, "i", Utc::now(), tx, vec![], 0);
    }
    r
}

fn register(node: &str, model: &str) -> pb::Register {
    pb::Register {
        node_id: node.into(),
        hostname: node.into(),
        gpus: (0..8)
            .map(|i| pb::GpuInfo {
                uuid: format!("GPU-{node}-{i}"),
                index: i,
                model: model.into(),
                memory_total_bytes: 80 << 30,
                pci_bus_id: format!("0000:1{i}:00.0"),
            })
            .collect(),
        agent_version: "fuzz".into(),
        gpu_backend: "fake".into(),
        ..Default::default()
    }
}

#[test]
fn fuzz_job_specs_through_the_submit_path_never_panic() {
    let models = ModelCatalog::builtin();
    let nodes = two_nodes();
    let valid = pb::SubmitJobRequest {
        spec: Some(base_spec()),
        idempotency_key: "k".into(),
    }
    .encode_to_vec();
    assert!(
        submit_path(base_spec(), &models, &nodes),
        "the base spec is valid"
    );
    let mut rng = rng();
    let (n, mut decoded, mut accepted) = (iterations(), 0usize, 0usize);
    for i in 0..n {
        let spec = if i % 2 == 0 {
            let bytes = mutate_bytes(&mut rng, &valid);
            match pb::SubmitJobRequest::decode(&bytes[..]) {
                Ok(r) => r.spec.unwrap_or_default(),
                Err(_) => continue,
            }
        } else {
            extreme_spec(&mut rng)
        };
        decoded += 1;
        accepted += usize::from(submit_path(spec, &models, &nodes));
    }
    eprintln!("fuzz: {n} job-spec cases, {decoded} decoded, {accepted} accepted, 0 panics");
    // Both kinds of case reach past validation (the run explores the
    // paths after it), and most extreme values are refused.
    assert!(
        accepted > n / 20 && accepted < decoded,
        "{accepted} of {decoded}"
    );
}

fn base_messages() -> Vec<pb::AgentMessage> {
    let task = pb::ObservedTask {
        task_id: "01a20000-0000-7000-8000-000000000001".into(),
        job_ids: vec!["01a20000-0000-7000-8000-000000000001".into()],
        phase: pb::TaskPhase::Running as i32,
        pid: 42,
        gpu_uuids: vec!["GPU-a-0".into()],
        iteration: 100,
        loss: 0.5,
        checkpoint_path: "/ckpt/1".into(),
        trace_iterations: vec![1.0, 2.0],
        trace_losses: vec![0.9, 0.8],
        step_time_s: 0.1,
        jobs: vec![pb::JobReport {
            job_id: "01a20000-0000-7000-8000-000000000001".into(),
            iteration: 100,
            evals: vec![0.5],
            layer_variance: vec![0.1, 0.2],
            ..Default::default()
        }],
        world_size: 1,
        ..Default::default()
    };
    use pb::agent_message::Msg;
    vec![
        pb::AgentMessage {
            msg: Some(Msg::Register(pb::Register {
                tasks: vec![task.clone()],
                ..register("a", "A100-80GB")
            })),
        },
        pb::AgentMessage {
            msg: Some(Msg::Heartbeat(pb::Heartbeat {
                sequence: 1,
                gpus: vec![pb::GpuTelemetry {
                    uuid: "GPU-a-0".into(),
                    utilization_percent: 50,
                    ..Default::default()
                }],
                tasks: vec![task.clone()],
                applied_generation: 3,
                ..Default::default()
            })),
        },
        pb::AgentMessage {
            msg: Some(Msg::TaskStatus(pb::TaskStatus { task: Some(task) })),
        },
        pb::AgentMessage {
            msg: Some(Msg::LogData(pb::LogData {
                request_id: 1,
                task_id: "t".into(),
                data: b"log".to_vec(),
                next_offset: 3,
                error: String::new(),
            })),
        },
    ]
}

/// A valid message with fields of its process report (or the message
/// itself) set to extreme values.
fn extreme_message(rng: &mut StdRng) -> pb::AgentMessage {
    use pb::agent_message::Msg;
    let mut all = base_messages();
    let mut m = all.swap_remove(rng.random_range(0..all.len()));
    let task = match &mut m.msg {
        Some(Msg::Register(r)) => {
            if rng.random_bool(0.2) {
                r.node_id = extreme_string(rng);
            }
            if rng.random_bool(0.1) {
                r.tasks = vec![r.tasks[0].clone(); 1025];
            }
            r.tasks.first_mut()
        }
        Some(Msg::Heartbeat(hb)) => {
            if rng.random_bool(0.1) {
                hb.gpus = vec![hb.gpus[0].clone(); 65];
            }
            hb.applied_generation = extreme_u64(rng) as i64;
            hb.tasks.first_mut()
        }
        Some(Msg::TaskStatus(ts)) => ts.task.as_mut(),
        Some(Msg::LogData(d)) => {
            d.data = vec![b'x'; [0, 1 << 20, (1 << 20) + 1][rng.random_range(0..3)]];
            d.next_offset = extreme_u64(rng);
            None
        }
        None => None,
    };
    if let Some(t) = task {
        for _ in 0..rng.random_range(1..4) {
            match rng.random_range(0..14) {
                0 => t.iteration = extreme_u64(rng),
                1 => t.step_time_s = extreme_f64(rng),
                2 => t.loss = extreme_f64(rng),
                3 => t.rank_offset = extreme_u32(rng),
                4 => t.world_size = extreme_u32(rng),
                5 => t.task_id = extreme_string(rng),
                6 => t.message = extreme_string(rng),
                7 => t.phase = rng.random_range(-1..9),
                8 => t.trace_losses = vec![extreme_f64(rng); rng.random_range(0..70_000)],
                9 => t.jobs[0].iteration = extreme_u64(rng),
                10 => t.jobs[0].evals = vec![extreme_f64(rng); rng.random_range(0..3)],
                11 => {
                    t.jobs[0].prompt_features = vec![extreme_f64(rng); rng.random_range(0..20_000)]
                }
                12 => {
                    t.jobs[0].prompt_init = Some(pb::PromptInit {
                        from_job_id: extreme_string(rng),
                        score: extreme_f64(rng),
                        scored: extreme_u32(rng),
                        candidates: extreme_u32(rng),
                    })
                }
                _ => t.exit_code = rng.random(),
            }
        }
    }
    m
}

/// One message through what the scheduler does with it: its checks, then
/// (when it passes) the registry's handlers on a live session.
fn handle(reg: &NodeRegistry, m: pb::AgentMessage) -> bool {
    use pb::agent_message::Msg;
    let now = Utc::now();
    let node = fmsched_core::NodeId::try_from("a".to_string()).unwrap();
    match m.msg {
        Some(Msg::Register(r)) => {
            let Ok(rec) = validate_register(&r, now) else {
                return false;
            };
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            std::mem::forget(rx);
            let _ =
                reg.live_session_of_another(&rec.id, &r.instance_id, now, Duration::from_secs(5));
            reg.register(rec, &r.instance_id, now, tx, r.tasks, r.applied_generation);
            true
        }
        msg => {
            let m = pb::AgentMessage { msg };
            if validate_agent_message(&m).is_err() {
                return false;
            }
            let session = reg.get(&node).and_then(|n| n.session).unwrap_or(0);
            match m.msg {
                Some(Msg::Heartbeat(hb)) => {
                    reg.heartbeat(&node, session, hb, now);
                }
                Some(Msg::TaskStatus(ts)) => {
                    if let Some(t) = ts.task {
                        reg.task_status(&node, session, t, now);
                    }
                }
                Some(Msg::LogData(d)) => reg.deliver_log(d),
                _ => {}
            }
            true
        }
    }
}

#[test]
fn fuzz_agent_messages_through_checks_and_handlers_never_panic() {
    let reg = NodeRegistry::load(vec![], Utc::now());
    let bases: Vec<Vec<u8>> = base_messages().iter().map(|m| m.encode_to_vec()).collect();
    for m in base_messages() {
        assert!(handle(&reg, m), "the base messages are valid");
    }
    let mut rng = rng();
    let (n, mut decoded, mut accepted) = (iterations(), 0usize, 0usize);
    for i in 0..n {
        let m = if i % 2 == 0 {
            let base = &bases[rng.random_range(0..bases.len())];
            let bytes = mutate_bytes(&mut rng, base);
            match pb::AgentMessage::decode(&bytes[..]) {
                Ok(m) => m,
                Err(_) => continue,
            }
        } else {
            extreme_message(&mut rng)
        };
        decoded += 1;
        accepted += usize::from(handle(&reg, m));
    }
    eprintln!("fuzz: {n} agent-message cases, {decoded} decoded, {accepted} accepted, 0 panics");
    // Both accepted and refused messages are explored.
    assert!(
        accepted > n / 20 && accepted < decoded,
        "{accepted} of {decoded}"
    );
}
