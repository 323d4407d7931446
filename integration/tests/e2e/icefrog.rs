//! End-to-end tests: icefrog.

use std::time::Duration;

use fmsched_integration::*;
use serde_json::Value;
use sqlx::Connection;

use crate::{
    agent_gpus, all_completed, fmctl, job_yaml, job_yaml_env, jobs, scheduler_env, submit, wait_up,
};

/// ICEFROG layer elasticity live: a job that opts in reports its
/// per-layer gradient variance every epoch; the scheduler's layer tuner
/// picks `ℓ* = argmax ψ(ℓ)·T(ℓ)` (Eq. 2, 15) — 3 of roberta-base's 12
/// layers on one A100 in the fake world (variance ∝ depth) — and the
/// running trainer takes it at an epoch start through its control file,
/// without a restart.
#[tokio::test]
async fn e2e_icefrog_a_layer_elastic_job_gets_a_new_l_without_a_restart() {
    let c = Cluster::builder("fmsched_elastic")
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let yaml = format!(
        "{}layer_elasticity: {{ max_frozen_layers: 10 }}\n",
        job_yaml_env("elastic", "rte", 2000, 1, "")
    )
    .replace("\"40\"", "\"20\"");
    submit(port, dir.path(), [("elastic".to_string(), yaml)]).expect("submit");
    let done = all_completed(port, 1, Duration::from_secs(120));
    let (id, _) = done.into_iter().next().unwrap();
    let err = fmctl(port, &["logs", &id, "--stderr"]).unwrap();
    assert!(
        err.contains("fake-trainer: frozen layers 0 → 3 at epoch"),
        "the tuner's ℓ reached the running trainer:\n{err}"
    );
    assert_eq!(
        err.matches("fake-trainer: training rte").count(),
        1,
        "one training process, never restarted:\n{err}"
    );
    // It ran alone on its GPU: ICEFROG's utilisation regression took the
    // agent's measurements of it, fenced with the rounds.
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let samples: i64 = sqlx::query_scalar(
        "SELECT samples FROM utilization_fits WHERE model = 'roberta-base' AND gpu_family = 'A100'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert!(samples >= 1, "{samples} utilisation samples");
    drop(c);
}

/// Two one-GPU jobs of global batch `batch` on a node of one fake GPU
/// under `icefrog` (profiling off): the first is submitted and runs alone,
/// then the second joins it. Returned once both run, which on one GPU only
/// sharing allows.
struct SharedPair {
    db: TestDb,
    dir: tempfile::TempDir,
    port: u16,
    procs: [Proc; 2],
    /// The first job's id.
    first: String,
    /// Both jobs' ids.
    running: Vec<String>,
}

async fn shared_pair(db: &str, batch: u32, iterations: u64) -> SharedPair {
    let db = TestDb::create(db).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let sched = scheduler_env(
        &db,
        port,
        dir.path(),
        None,
        &[
            ("FMSCHED_SCHEDULING__POLICY", "icefrog"),
            ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ],
    );
    wait_up("scheduler up", port);
    let endpoints = format!("http://127.0.0.1:{port}");
    let agent = agent_gpus("node-a", &endpoints, dir.path(), None, 1, &[]);
    let yaml = |name: &str, task: &str| {
        job_yaml(name, task, iterations, 1).replace(
            "global_batch_size: 32",
            &format!("global_batch_size: {batch}"),
        )
    };
    submit(
        port,
        dir.path(),
        [("pair-a".to_string(), yaml("pair-a", "rte"))],
    )
    .expect("submit");
    let first = wait_for("the first job running", Duration::from_secs(60), || {
        let j = jobs(port)?;
        j.iter()
            .find(|(_, s)| s.0 == "running")
            .map(|(id, _)| id.clone())
            .ok_or_else(|| format!("{j:?}"))
    });
    submit(
        port,
        dir.path(),
        [("pair-b".to_string(), yaml("pair-b", "mrpc"))],
    )
    .expect("submit");
    let running = wait_for(
        "both jobs running on the one GPU",
        Duration::from_secs(60),
        || {
            let j = jobs(port)?;
            let running: Vec<String> = j
                .iter()
                .filter(|(_, s)| s.0 == "running")
                .map(|(id, _)| id.clone())
                .collect();
            if running.len() == 2 {
                Ok(running)
            } else {
                Err(format!("{j:?}"))
            }
        },
    );
    SharedPair {
        db,
        dir,
        port,
        procs: [sched, agent],
        first,
        running,
    }
}

/// ICEFROG GPU sharing live: two one-GPU jobs whose profiles fit half of
/// a GPU (batch 4 of 512 tokens: 33 % utilisation; a few GiB of an 80 GiB
/// A100) on a node of one fake GPU, the second submitted while the first
/// runs. IceShare puts the second on the first's GPU (Eq. 8: both at
/// λ = 0.9 rather than one waiting) without moving the first; the second
/// learns it shares at launch, the first through its control file, neither
/// restarts, and both complete.
#[tokio::test]
async fn e2e_icefrog_two_one_gpu_jobs_share_one_fake_gpu_and_both_complete() {
    let SharedPair {
        db: _db,
        dir: _dir,
        port,
        procs: _procs,
        first,
        running: ids,
    } = shared_pair("fmsched_share", 4, 4000).await;
    // `fmctl nodes` names both on the one GPU.
    let nodes: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "nodes"]).unwrap()).unwrap();
    let held = nodes[0]["gpus"][0]["allocated_to_job"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        ids.iter().all(|id| held.split(',').any(|h| h == id)),
        "the GPU is held by {held:?}, not by both of {ids:?}"
    );
    // Each process learns it shares its GPU: the second at launch, the
    // first (alone before) through its control file at its next epoch,
    // without a restart.
    let done = all_completed(port, 2, Duration::from_secs(180));
    for id in done.keys() {
        let err = fmctl(port, &["logs", id, "--stderr"]).unwrap();
        let told = if *id == first {
            "fake-trainer: sharing its GPU with another process (λ = 0.9) from now on"
        } else {
            "fake-trainer: sharing its GPU with another process (λ = 0.9)\n"
        };
        assert!(
            err.contains(told),
            "job {id} was not told it shares its GPU ({told:?}):\n{err}"
        );
        assert_eq!(
            err.matches("fake-trainer: training").count(),
            1,
            "job {id} was restarted:\n{err}"
        );
    }
}

/// ICEFROG Eq. 8 measured: two jobs of batch 8 (50 % predicted each) share
/// one fake GPU, which then reports 98-100 % busy — saturated, each slower
/// than the 0.9 planned. After three rounds in a row the pair is split: the
/// later job gets a `gpu_sharing_split` event, never shares again (stored:
/// `no_gpu_sharing`), waits for the GPU, and both complete.
#[tokio::test]
async fn e2e_icefrog_a_saturated_shared_gpu_is_split_and_the_later_job_evicted() {
    let SharedPair {
        db,
        dir: _dir,
        port,
        procs: _procs,
        first,
        ..
    } = shared_pair("fmsched_saturated", 8, 8000).await;
    let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
    let mut split: Vec<(uuid::Uuid, String)> = Vec::new();
    for _ in 0..300 {
        split = sqlx::query_as(
            "SELECT job_id, message FROM job_events WHERE kind = 'gpu_sharing_split'",
        )
        .fetch_all(&mut c)
        .await
        .unwrap();
        if !split.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(split.len(), 1, "one split: {split:?}");
    let (later, why) = &split[0];
    assert_ne!(later.to_string(), first, "the later job is the one evicted");
    assert!(why.contains("ran at") && why.contains("3 rounds"), "{why}");
    let stored: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM jobs WHERE no_gpu_sharing")
        .fetch_all(&mut c)
        .await
        .unwrap();
    assert_eq!(stored, vec![*later]);
    // It never shares again: both complete, one at a time.
    let done = all_completed(port, 2, Duration::from_secs(240));
    assert_eq!(done.len(), 2);
}

/// Every training setting of a spec acts (ICEFROG issue, item 1): a frozen
/// range nothing could act on is refused at submit naming the field, and
/// nothing is stored; a job with fp32, activation checkpointing, SGD, six
/// frozen layers and a *loss* target reaches its trainer with all of them
/// and stops when the loss falls below the target. The fake trainer's
/// world fixes when: rte's validation loss falls below 0.9 after 940
/// iterations' worth of learning, which with ψ(6 of 12) = 57/78 per
/// iteration (ICEFROG Eq. 2–3) takes 13 epochs of 100 iterations — 10
/// without the frozen penalty, 1 if the target were read upwards.
#[tokio::test]
async fn e2e_icefrog_training_settings_act_and_a_field_nothing_acts_on_is_refused() {
    let c = Cluster::builder("fmsched_settings")
        .agent("node-a")
        .start()
        .await;
    let (dir, port) = (&c.dir, c.port);
    let manifest = |name: &str, frozen: &str| {
        format!(
            "name: {name}\nmodel: roberta-base\n\
             dataset: {{ uri: file:///data/rte, task: rte, num_samples: 3200, objective: sequence-classification }}\n\
             hyperparameters: {{ global_batch_size: 32, learning_rate: 0.05, optimizer: sgd, weight_decay: 0.01, \
             amp: false, gradient_checkpointing: true }}\n\
             target: {{ max_epochs: 40, metric: {{ name: loss, value: 0.9, lower_is_better: true }} }}\n\
             resources: {{ min_gpus: 1, max_gpus: 1 }}\n\
             frozen_layers: {frozen}\n\
             launch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"200\" }}\n",
            bin("fake-trainer").display()
        )
    };
    // A frozen range that does not start at the input: refused, named.
    let e = submit(
        port,
        dir.path(),
        [(
            "middle".to_string(),
            manifest("middle", "{ first: 2, last: 5 }"),
        )],
    )
    .unwrap_err();
    assert!(
        e.contains("spec.frozen_layers.first") && e.contains("must be 0"),
        "{e}"
    );
    assert!(
        jobs(port).unwrap().is_empty(),
        "a refused spec stores nothing"
    );

    submit(
        port,
        dir.path(),
        [(
            "loss".to_string(),
            manifest("loss", "{ first: 0, last: 5 }"),
        )],
    )
    .expect("submit");
    let done = all_completed(port, 1, Duration::from_secs(90));
    let (id, (_, output)) = done.into_iter().next().unwrap();
    let err = fmctl(port, &["logs", &id, "--stderr"]).unwrap();
    assert!(
        err.contains(
            "settings: amp=false gradient_checkpointing=true petl=none frozen_layers=6 \
             optimizer=sgd learning_rate=0.05 weight_decay=0.01 objective=sequence-classification \
             metric_lower_is_better=true"
        ),
        "the trainer got every setting:\n{err}"
    );
    // It stopped on its loss target, at the epoch the frozen penalty sets.
    let weights: Value = serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    let iteration = weights["iteration"].as_u64().unwrap();
    assert!(
        (1300..1400).contains(&iteration),
        "stopped at iteration {iteration}, expected the 13th epoch (1300–1399)"
    );
    let out = fmctl(port, &["logs", &id]).unwrap();
    assert!(
        out.contains("epoch 13 rte") && !out.contains("epoch 14 rte"),
        "{out}"
    );
}
