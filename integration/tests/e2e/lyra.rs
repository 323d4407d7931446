//! End-to-end tests: lyra.

use std::time::Duration;

use fmsched_integration::*;
use serde_json::Value;
use sqlx::Connection;

use crate::{
    LYRA_ENV, agent, agent_command, all_completed, fmctl, job_yaml, node_hold, resumed_from,
    scheduler_env, submit, wait_up,
};

/// A scheduler running lyra with no inference headroom, the training node
/// `train-a` and the inference nodes `inference` (agent label
/// `fmsched.io/pool=inference`), all registered.
fn lyra_cluster(
    db: &str,
    port: u16,
    dir: &std::path::Path,
    inference: &[&str],
) -> (Proc, Vec<Proc>) {
    let sched = scheduler_env(db, port, dir, None, &LYRA_ENV);
    wait_up("scheduler up", port);
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut agents = vec![agent("train-a", port, dir)];
    for n in inference {
        let mut c = agent_command(n, &endpoint, dir, None, 4, &[]);
        c.args(["--label", "fmsched.io/pool=inference"]);
        agents.push(Proc::spawn(n, c, dir));
    }
    wait_for("every node registered", Duration::from_secs(20), || {
        let out = fmctl(port, &["nodes"])?;
        std::iter::once(&"train-a")
            .chain(inference)
            .all(|n| out.contains(n))
            .then_some(())
            .ok_or(out)
    });
    (sched, agents)
}

/// Lyra's loans live: inference nodes (agent label fmsched.io/pool=inference)
/// train nothing until an admin lends them; lent, they take the waiting
/// jobs; a node outside the pool cannot be lent; a reclaim by count picks
/// a node, names the jobs it preempts, survives a scheduler kill -9 in the
/// middle, and returns the node only once it is empty; the preempted jobs
/// resume from their checkpoints and every job completes.
#[tokio::test]
async fn e2e_lyra_lent_nodes_take_work_and_a_reclaim_loses_no_job() {
    let db = TestDb::create("fmsched_lyra").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (mut sched, _agents) = lyra_cluster(&db, port, dir.path(), &["inf-1", "inf-2"]);
    submit(
        port,
        dir.path(),
        (0..4).map(|k| {
            let name = format!("lyra-{k}");
            let manifest = job_yaml(&name, ["rte", "mrpc", "stsb", "cola"][k], 6000, 4);
            (name, manifest)
        }),
    )
    .expect("submit");
    wait_for("one job runs on train-a", Duration::from_secs(60), || {
        let (_, jobs) = node_hold(port, "train-a")?;
        (jobs.len() == 4).then_some(()).ok_or(format!("{jobs:?}"))
    });
    std::thread::sleep(Duration::from_secs(3));
    for n in ["inf-1", "inf-2"] {
        assert!(
            node_hold(port, n).unwrap().1.is_empty(),
            "an inference node trains nothing until lent"
        );
    }
    // A training node is not the inference side's to lend.
    let e = fmctl(port, &["admin", "lend", "train-a"]).expect_err("not in the pool");
    assert!(e.contains("not in the inference pool"), "{e}");
    let out = fmctl(port, &["admin", "lend", "inf-1", "inf-2"]).unwrap();
    assert!(out.contains("inf-1") && out.contains("active"), "{out}");
    let inf_dir = |n: &str| dir.path().join(n).display().to_string();
    wait_for(
        "the lent nodes run jobs that checkpoint",
        Duration::from_secs(60),
        || {
            let mut ok = true;
            for n in ["inf-1", "inf-2"] {
                let (_, jobs) = node_hold(port, n)?;
                let checkpointed = std::fs::read_dir(inf_dir(n))
                    .map(|d| {
                        d.flatten()
                            .filter(|t| {
                                std::fs::read_dir(t.path().join("checkpoints"))
                                    .is_ok_and(|c| c.count() > 0)
                            })
                            .count()
                    })
                    .unwrap_or(0);
                ok &= jobs.len() == 4 && checkpointed >= 1;
            }
            ok.then_some(()).ok_or("not yet".to_string())
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    // Reclaim one by count: the answer names it and the job it preempts.
    let r: Value = serde_json::from_str(
        &fmctl(
            port,
            &[
                "-o",
                "json",
                "admin",
                "reclaim",
                "--count",
                "1",
                "--deadline",
                "2m",
            ],
        )
        .unwrap(),
    )
    .unwrap();
    let back = r["node_ids"][0].as_str().unwrap().to_string();
    let kept = if back == "inf-1" { "inf-2" } else { "inf-1" };
    let preempted: Vec<String> = r["preempted_job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j.as_str().unwrap().to_string())
        .collect();
    assert_eq!(preempted.len(), 1, "{r}");
    assert_eq!(
        preempted,
        node_hold(port, &back).unwrap().1[..1].to_vec(),
        "the job on the node goes"
    );
    // The scheduler dies in the middle of the reclaim; the loans persist.
    sched.kill9();
    let _sched = scheduler_env(&db, port, dir.path(), None, &LYRA_ENV);
    wait_up("scheduler up again", port);
    let loans = |port| -> Result<Value, String> {
        serde_json::from_str(&fmctl(port, &["-o", "json", "admin", "loans"])?)
            .map_err(|e| e.to_string())
    };
    let l = loans(port).unwrap();
    let state = |l: &Value, n: &str| {
        l["loans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["node_id"] == n)
            .map(|x| x["state"].as_str().unwrap().to_string())
    };
    assert_eq!(state(&l, kept).as_deref(), Some("active"), "{l}");
    assert!(
        matches!(state(&l, &back).as_deref(), Some("reclaiming" | "returned")),
        "{l}"
    );
    wait_for(
        "the reclaimed node is returned empty",
        Duration::from_secs(60),
        || {
            let l = loans(port)?;
            let (_, jobs) = node_hold(port, &back)?;
            (state(&l, &back).as_deref() == Some("returned") && jobs.is_empty())
                .then_some(())
                .ok_or(format!("{l} {jobs:?}"))
        },
    );
    all_completed(port, 4, Duration::from_secs(240));
    assert!(
        node_hold(port, &back).unwrap().1.is_empty(),
        "a returned node trains nothing"
    );
    // The preempted job resumed from its checkpoint on the returned node.
    let resumed: usize = ["train-a", kept]
        .iter()
        .map(|n| resumed_from(&dir.path().join(n), &inf_dir(&back)))
        .sum();
    assert!(
        resumed >= 1,
        "the preempted job resumed from its checkpoint"
    );
    let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind FROM node_events WHERE node_id = $1 AND kind IN ('loaned', 'reclaiming', 'returned') ORDER BY seq",
    )
    .bind(&back)
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(kinds, ["loaned", "reclaiming", "returned"]);
    let audit = fmctl(port, &["admin", "audit"]).unwrap();
    assert!(
        audit.contains("reclaim") && audit.contains("loan"),
        "{audit}"
    );
}

/// An elastic job (`resources.workers`) under lyra: it runs on its base
/// workers, scales out onto a node as soon as it is lent, and a reclaim of
/// that node scales it back in — named as scaled in, not preempted — while
/// it keeps training to completion on its base.
#[tokio::test]
async fn e2e_lyra_an_elastic_job_scales_out_onto_a_lent_node_and_in_on_reclaim() {
    let db = TestDb::create("fmsched_lyra_elastic").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (_sched, _agents) = lyra_cluster(&db, port, dir.path(), &["inf-1"]);
    let manifest = format!(
        "name: elastic\nmodel: roberta-base\ndataset: {{ uri: file:///data/rte, task: rte, num_samples: 3200 }}\n\
         hyperparameters: {{ global_batch_size: 32, learning_rate: 2.0e-5, amp: true }}\n\
         target: {{ max_iterations: 24000 }}\n\
         resources: {{ min_gpus: 4, max_gpus: 8, workers: {{ min: 4, max: 8 }} }}\n\
         launch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"40\" }}\n",
        bin("fake-trainer").display()
    );
    submit(port, dir.path(), [("elastic".to_string(), manifest)]).expect("submit");
    let job = wait_for(
        "it runs on its base workers",
        Duration::from_secs(60),
        || {
            let (_, jobs) = node_hold(port, "train-a")?;
            (jobs.len() == 4)
                .then(|| jobs[0].clone())
                .ok_or(format!("{jobs:?}"))
        },
    );
    fmctl(port, &["admin", "lend", "inf-1"]).unwrap();
    wait_for(
        "it scales out onto the lent node",
        Duration::from_secs(60),
        || {
            let (_, a) = node_hold(port, "train-a")?;
            let (_, i) = node_hold(port, "inf-1")?;
            (a.len() + i.len() == 8 && i.iter().all(|j| *j == job))
                .then_some(())
                .ok_or(format!("train-a {a:?} inf-1 {i:?}"))
        },
    );
    // Let it checkpoint at the new size, then ask the node back.
    std::thread::sleep(Duration::from_secs(3));
    let r: Value = serde_json::from_str(
        &fmctl(port, &["-o", "json", "admin", "reclaim", "--count", "1"]).unwrap(),
    )
    .unwrap();
    assert_eq!(r["node_ids"], serde_json::json!(["inf-1"]), "{r}");
    assert_eq!(r["scaled_in_job_ids"], serde_json::json!([job]), "{r}");
    assert_eq!(r["preempted_job_ids"], serde_json::json!([]), "{r}");
    wait_for(
        "it scales in to its base and the node is returned",
        Duration::from_secs(60),
        || {
            let l: Value = serde_json::from_str(&fmctl(port, &["-o", "json", "admin", "loans"])?)
                .map_err(|e| e.to_string())?;
            let (_, a) = node_hold(port, "train-a")?;
            let (_, i) = node_hold(port, "inf-1")?;
            (l["loans"][0]["state"] == "returned" && i.is_empty() && a.len() == 4)
                .then_some(())
                .ok_or(format!("{l} train-a {a:?} inf-1 {i:?}"))
        },
    );
    all_completed(port, 1, Duration::from_secs(240));
}
