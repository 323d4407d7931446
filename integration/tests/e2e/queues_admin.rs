//! End-to-end tests: queues admin.

use std::time::{Duration, Instant};

use fmsched_integration::*;
use serde_json::Value;
use sqlx::Connection;

use crate::ROOT;
use crate::{
    LYRA_ENV, agent, agent_env, all_completed, checkpoint_iteration, events_saying, fmctl,
    job_yaml, jobs, node_hold, resumed_from, running_job, scheduler_env, scrape, strip_ansi,
    submit, training_launches, wait_two_nodes, wait_up,
};

/// The live service under the baselines that rank by the service jobs
/// received: Themis (leases, deserved share) and Tiresias (attained
/// GPU-seconds) run a queue longer than the node to completion; a job
/// Themis runs holds a lease while it runs, and every job's service is
/// accounted.
#[tokio::test]
async fn e2e_the_service_baselines_run_a_queue_to_completion() {
    for policy in ["themis", "tiresias"] {
        let c = Cluster::builder(&format!("fmsched_{policy}"))
            .scheduler_env(&[("FMSCHED_SCHEDULING__POLICY", policy)])
            .agent("node-a")
            .start()
            .await;
        let (db, dir, port) = (&c.db, &c.dir, c.port);
        submit(
            port,
            dir.path(),
            (0..6u64).map(|k| {
                let name = format!("{policy}-{k}");
                let manifest = job_yaml(
                    &name,
                    ["rte", "mrpc", "stsb"][k as usize % 3],
                    600 + 300 * (k % 3),
                    1 + (k % 2) as u32,
                );
                (name, manifest)
            }),
        )
        .expect("submit");
        let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
        if policy == "themis" {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let leased: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM job_service s JOIN jobs j ON j.id = s.job_id
                     WHERE j.state = 'running' AND s.lease_until > now()",
                )
                .fetch_one(&mut c)
                .await
                .unwrap();
                if leased > 0 {
                    break;
                }
                assert!(Instant::now() < deadline, "no running job holds a lease");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        all_completed(port, 6, Duration::from_secs(150));
        let unserved: Vec<(String, f64, f64)> = sqlx::query_as(
            "SELECT j.name, coalesce(s.attained_gpu_s, 0), coalesce(s.executed_s, 0)
             FROM jobs j LEFT JOIN job_service s ON s.job_id = j.id
             WHERE coalesce(s.attained_gpu_s, 0) <= 0 OR s.executed_s <= 0",
        )
        .fetch_all(&mut c)
        .await
        .unwrap();
        assert!(
            unserved.is_empty(),
            "{policy}: jobs without accounted service: {unserved:?}"
        );
        drop(c);
    }
}

/// A job whose GPUs change on its node (shrunk for a newcomer) is
/// relaunched from the checkpoint its process wrote as the agent stopped
/// it, not from the older one the plan names (the last the scheduler had
/// heard of). Found live: a resize relaunched a job from a checkpoint 45 s
/// old, losing what it trained since.
#[tokio::test]
async fn e2e_queue_a_resized_job_resumes_from_the_checkpoint_its_stop_wrote() {
    // The test ends as the job relaunches: that trainer goes with it.
    let env = [
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
    ];
    let c = Cluster::builder("fmsched_resize_ckpt")
        .scheduler_env(&env)
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let node = agent("node-a", port, dir.path());
    submit(
        port,
        dir.path(),
        [("big".to_string(), job_yaml("big", "qnli", 400_000, 4))],
    )
    .expect("submit");
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let id: String = sqlx::query_scalar("SELECT id::text FROM jobs WHERE name = 'big'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let launched = format!("launched task={id} ");
    let launches = || {
        strip_ansi(&node.log_text())
            .lines()
            .filter(|l| l.contains(&launched))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let until = Instant::now() + Duration::from_secs(60);
    while !launches().iter().any(|l| l.contains("gpus=[0, 1, 2, 3]")) {
        assert!(
            Instant::now() < until,
            "never ran on 4 GPUs: {:?}",
            launches()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It trains and checkpoints (every second here) for a while; then a
    // newcomer takes some of its GPUs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    submit(
        port,
        dir.path(),
        [(
            "newcomer".to_string(),
            job_yaml("newcomer", "rte", 400_000, 2),
        )],
    )
    .expect("submit");
    let until = Instant::now() + Duration::from_secs(60);
    let relaunch = loop {
        if let Some(l) = launches().get(1) {
            break l.clone();
        }
        assert!(Instant::now() < until, "never resized: {:?}", launches());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = strip_ansi(&node.log_text());
    let stopped = log
        .lines()
        .find(|l| l.contains(&format!("task={id} ")) && l.contains(" stopped"))
        .unwrap_or_else(|| panic!("no stop logged:\n{log}"));
    assert!(
        checkpoint_iteration(stopped).is_some(),
        "its stop wrote no checkpoint: {stopped}"
    );
    assert_eq!(
        checkpoint_iteration(&relaunch),
        checkpoint_iteration(stopped),
        "resumed from another checkpoint than its stop's:\n{stopped}\n{relaunch}"
    );
    // Its history says so: it stays running, so no state change does.
    let n = relaunch
        .split("gpus=[")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .map_or(0, |g| g.split(',').count());
    let resized: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM job_events WHERE job_id = $1::uuid AND kind = 'resized' ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert!(
        resized
            .first()
            .is_some_and(|m| m.starts_with(&format!("resized from 4 to {n} GPUs on node-a"))),
        "{resized:?} ({relaunch})"
    );
}

/// A job moved to another node in one round resumes there from the
/// checkpoint its process writes as it stops, not from the last one the
/// scheduler had heard of: the launch on the new node waits for it. Found
/// live: a drained node's job was launched on the other node at once,
/// from scratch (no checkpoint reported yet), while its history said
/// "from its checkpoint (iteration 14900)".
#[tokio::test]
async fn e2e_queue_admin_a_job_moved_off_a_drained_node_resumes_from_its_last_step() {
    // The test ends as the job relaunches: that trainer goes with it.
    let env = [
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
        ("FMSCHED_API_TOKENS", "root=root-token-0123456789ab"),
    ];
    let c = Cluster::builder("fmsched_move_ckpt")
        .scheduler_env(&env)
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    // Two GPU families: the job starts on the faster (H100s), and the
    // drain moves it to the A100s. Periodic checkpoints as deployed (every
    // 10 minutes): none is taken before the drain.
    let ep = format!("http://127.0.0.1:{port}");
    let every = ("FMSCHED_AGENT_PROCESSES__CHECKPOINT_INTERVAL", "600s");
    let h100 = [("FMSCHED_AGENT_GPU__FAKE_MODEL", "H100-80GB"), every];
    let agents = [
        (
            "node-a",
            agent_env("node-a", &ep, dir.path(), None, &[every]),
        ),
        ("node-b", agent_env("node-b", &ep, dir.path(), None, &h100)),
    ];
    wait_two_nodes(port);
    submit(
        port,
        dir.path(),
        [("mover".to_string(), job_yaml("mover", "qnli", 400_000, 2))],
    )
    .expect("submit");
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let id: String = sqlx::query_scalar("SELECT id::text FROM jobs WHERE name = 'mover'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    // It trains a while on one node.
    let (from, to) = wait_for("the job trains", Duration::from_secs(60), || {
        let on_a = node_hold(port, "node-a")?.1;
        let on_b = node_hold(port, "node-b")?.1;
        match (on_a.is_empty(), on_b.is_empty()) {
            (false, true) => Ok((0, 1)),
            (true, false) => Ok((1, 0)),
            _ => Err(format!("{on_a:?} / {on_b:?}")),
        }
    });
    let iteration = async |c: &mut sqlx::PgConnection| -> i64 {
        sqlx::query_scalar("SELECT coalesce(max(iteration), 0) FROM job_progress")
            .fetch_one(c)
            .await
            .unwrap()
    };
    let until = Instant::now() + Duration::from_secs(60);
    while iteration(&mut c).await < 2000 {
        assert!(Instant::now() < until, "no progress");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = iteration(&mut c).await;
    fmctl(port, &["admin", "drain", agents[from].0]).unwrap();
    // Its launch on the other node: from a checkpoint at least as far.
    let launched = format!("launched task={id} ");
    let until = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let log = strip_ansi(&agents[to].1.log_text());
        if let Some(l) = log.lines().find(|l| l.contains(&launched)) {
            break l.to_string();
        }
        assert!(Instant::now() < until, "never launched on {}", agents[to].0);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("{before} iterations before the drain; {line}");
    let resumed_at = checkpoint_iteration(&line)
        .unwrap_or_else(|| panic!("not resumed from a checkpoint: {line}"));
    assert!(
        resumed_at >= before,
        "resumed at iteration {resumed_at}, {before} done before the drain: {line}"
    );
}

/// Drain: the node's jobs move off from their checkpoints, the node stays
/// empty, nothing is lost; a re-queued job is suspended from its checkpoint
/// and runs again; cordon keeps what runs; every change is in the audit
/// log; a user who is not an admin is refused and changes nothing.
#[tokio::test]
async fn e2e_queue_admin_drain_empties_a_node_and_nothing_is_lost() {
    let env = [
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
        (
            "FMSCHED_API_TOKENS",
            "root=root-token-0123456789ab,bob=bob-token-0123456789abcd",
        ),
    ];
    let c = Cluster::builder("fmsched_drain")
        .scheduler_env(&env)
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let b = agent("node-b", port, dir.path());
    wait_two_nodes(port);
    // A user who is not an admin: refused, nothing written.
    let bob = fmsched_integration::fmctl(
        port,
        "bob-token-0123456789abcd",
        &["admin", "drain", "node-b"],
    )
    .expect_err("bob is no admin");
    assert!(bob.contains("not an admin"), "{bob}");
    assert_eq!(node_hold(port, "node-b").unwrap().0, "schedulable");
    // Cordon node-b before any work: nothing starts there.
    let out = fmctl(
        port,
        &["admin", "cordon", "node-b", "--reason", "fan noise"],
    )
    .unwrap();
    assert!(out.contains("available,cordoned"), "{out}");
    submit(
        port,
        dir.path(),
        (0..4).map(|k| {
            let name = format!("drain-{k}");
            let manifest = job_yaml(&name, ["rte", "mrpc", "stsb", "cola"][k], 4000, 2);
            (name, manifest)
        }),
    )
    .expect("submit");
    let on_a = wait_for("two jobs run on node-a", Duration::from_secs(60), || {
        let (_, jobs) = node_hold(port, "node-a")?;
        (jobs.len() == 4)
            .then_some(jobs.clone())
            .ok_or(format!("{jobs:?}"))
    });
    std::thread::sleep(Duration::from_secs(3));
    let (hold, held) = node_hold(port, "node-b").unwrap();
    assert_eq!(
        (hold.as_str(), held.len()),
        ("cordoned", 0),
        "nothing new on a cordoned node"
    );
    // Uncordoned, node-b takes the two waiting jobs.
    fmctl(port, &["admin", "uncordon", "node-b"]).unwrap();
    let node_b_dir = dir.path().join("node-b").display().to_string();
    let on_b = wait_for(
        "jobs run and checkpoint on node-b",
        Duration::from_secs(60),
        || {
            let (_, jobs) = node_hold(port, "node-b")?;
            let checkpointed = std::fs::read_dir(&node_b_dir)
                .map(|d| {
                    d.flatten()
                        .filter(|t| {
                            std::fs::read_dir(t.path().join("checkpoints"))
                                .is_ok_and(|c| c.count() > 0)
                        })
                        .count()
                })
                .unwrap_or(0);
            (jobs.len() == 4 && checkpointed >= 1)
                .then_some(jobs.clone())
                .ok_or(format!("{jobs:?}, {checkpointed} checkpointed"))
        },
    );
    // Let a heartbeat carry the checkpoints; then drain node-b.
    std::thread::sleep(Duration::from_secs(2));
    let out = fmctl(
        port,
        &["admin", "drain", "node-b", "--reason", "replace a DIMM"],
    )
    .unwrap();
    assert!(out.contains("available,draining"), "{out}");
    let draining = node_hold(port, "node-b").unwrap().1;
    wait_for("node-b drained", Duration::from_secs(60), || {
        let (hold, jobs) = node_hold(port, "node-b")?;
        (hold == "drained" && jobs.is_empty())
            .then_some(())
            .ok_or(format!("{hold} {jobs:?}"))
    });
    let launches_drained = training_launches(&b.log_text());
    // Each job node-b ran says in its history that it left the drained
    // node: suspended, or moved to node-a in the same round (its state
    // stays running there, so only a `moved` event says it).
    let left = events_saying(db, "node node-b is drained").await;
    for job in &draining {
        assert!(
            left.iter().any(|(j, _)| j == job),
            "{job} left node-b and its history does not say so: {left:?}"
        );
    }
    // (Which jobs node-a runs now is the policy's choice: node-b's, moved
    // from their checkpoints, or its own; the unit tests of the round pin
    // the reasons.) Re-queue a running job: suspended from its checkpoint,
    // then placed again.
    let victim = wait_for("a running job re-queued", Duration::from_secs(30), || {
        let j = jobs(port)?;
        let (id, _) = j
            .iter()
            .find(|(_, s)| s.0 == "running")
            .ok_or(format!("{j:?}"))?;
        let out = fmctl(port, &["admin", "requeue", id, "--reason", "test"])?;
        assert!(out.contains("re-queue requested"), "{out}");
        Ok(id.clone())
    });
    let victim = &victim;
    let done = wait_for("every job completed", Duration::from_secs(240), || {
        let j = jobs(port)?;
        assert!(!j.values().any(|s| s.0 == "failed"), "a job failed: {j:?}");
        (j.len() == 4 && j.values().all(|s| s.0 == "completed"))
            .then_some(j.clone())
            .ok_or(format!("{j:?}"))
    });
    assert_eq!(done.len(), 4, "nothing lost");
    assert_eq!(
        training_launches(&b.log_text()),
        launches_drained,
        "nothing started on the drained node"
    );
    assert_eq!(
        node_hold(port, "node-b").unwrap().0,
        "drained",
        "it stays drained"
    );
    let held_back = events_saying(db, "held back this round (re-queued").await;
    assert!(
        held_back.iter().any(|(j, _)| j == victim),
        "the re-queue suspended {victim}: {held_back:?}"
    );
    // Jobs from node-b resumed on node-a from node-b's checkpoints.
    let resumed = resumed_from(&dir.path().join("node-a"), &node_b_dir);
    assert!(
        resumed >= 1,
        "a drained job resumed from its checkpoint ({on_b:?}, {on_a:?})"
    );
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let node_events: Vec<(String, String)> =
        sqlx::query_as("SELECT kind, message FROM node_events WHERE node_id = 'node-b' AND kind IN ('cordon', 'uncordon', 'drain') ORDER BY seq")
            .fetch_all(&mut c)
            .await
            .unwrap();
    assert_eq!(
        node_events,
        [
            (
                "cordon".to_string(),
                "cordon by root: fan noise".to_string()
            ),
            ("uncordon".into(), "uncordon by root".into()),
            ("drain".into(), "drain by root: replace a DIMM".into()),
        ]
    );
    let audit = fmctl(port, &["admin", "audit"]).unwrap();
    assert!(
        audit.contains("replace a DIMM") && audit.contains("ACTOR"),
        "{audit}"
    );
    let audit: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "admin", "audit"]).unwrap()).unwrap();
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["requeue", "drain", "uncordon", "cordon"],
        "newest first; bob's refused call wrote nothing"
    );
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["actor"] == "root")
    );
}

/// The policy set through the admin API decides from the next round and
/// survives a scheduler restart; a bad knob is refused naming it and
/// changes nothing.
#[tokio::test]
async fn e2e_queue_admin_policy_set_live_changes_the_next_round_and_survives_a_restart() {
    let db = TestDb::create("fmsched_policy").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env = [
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
        ("FMSCHED_SCHEDULING__POLICY", "fifo"),
    ];
    let mut sched = scheduler_env(&db, port, dir.path(), None, &env);
    wait_up("scheduler up", port);
    let _a = agent("node-a", port, dir.path());
    let p = fmctl(port, &["admin", "policy"]).unwrap();
    assert!(p.contains("fifo") && p.contains("configuration"), "{p}");
    // FIFO: a long job holds the node; a short one waits behind it.
    submit(
        port,
        dir.path(),
        [("long".to_string(), job_yaml("long", "rte", 200_000, 4))],
    )
    .unwrap();
    let long = running_job(port);
    submit(
        port,
        dir.path(),
        [("short".to_string(), job_yaml("short", "mrpc", 3000, 4))],
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let j = jobs(port).unwrap();
    assert_eq!(j[&long].0, "running");
    assert_eq!(j.values().filter(|s| s.0 == "queued").count(), 1, "{j:?}");
    // A bad knob: refused naming it; nothing stored.
    let e = fmctl(
        port,
        &["admin", "set-policy", "srtf", "--knob", "srtf_weight=1"],
    )
    .unwrap_err();
    assert!(
        e.contains("knobs") && e.contains("srtf_weight") && e.contains("interval_s"),
        "{e}"
    );
    let e = fmctl(
        port,
        &["admin", "set-policy", "srtf", "--knob", "interval_s=0.01"],
    )
    .unwrap_err();
    assert!(e.contains("interval_s"), "{e}");
    let e = fmctl(port, &["admin", "set-policy", "no-such-policy"]).unwrap_err();
    assert!(e.contains("policy") && e.contains("unknown"), "{e}");
    assert!(
        fmctl(port, &["admin", "audit"]).unwrap().lines().count() <= 1,
        "nothing audited"
    );
    // SRTF from the next round: the short job preempts the long one.
    let p = fmctl(
        port,
        &["admin", "set-policy", "srtf", "--knob", "interval_s=1"],
    )
    .unwrap();
    assert!(p.contains("srtf") && p.contains("set by root"), "{p}");
    let short = wait_for("the short job runs", Duration::from_secs(30), || {
        let j = jobs(port)?;
        let short = j.iter().find(|(id, s)| **id != long && s.0 != "queued");
        match (j[&long].0.as_str(), short) {
            ("queued", Some((id, _))) => Ok(id.clone()),
            _ => Err(format!("{j:?}")),
        }
    });
    let placed = events_saying(&db, "by srtf").await;
    assert!(placed.iter().any(|(j, _)| *j == short), "{placed:?}");
    let suspended = events_saying(&db, "suspended by the plan").await;
    assert!(suspended.iter().any(|(j, _)| *j == long), "{suspended:?}");
    assert!(sched.log_text().contains("policy in force changed"));
    // A restart keeps the setting.
    sched.kill9();
    let _sched = scheduler_env(&db, port, dir.path(), None, &LYRA_ENV);
    wait_up("scheduler up again", port);
    let p: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "admin", "policy"]).unwrap()).unwrap();
    assert_eq!(p["policy"], "srtf");
    assert_eq!(p["source"], "admin");
    assert_eq!(p["set_by"], "root");
    assert_eq!(p["interval_s"], 1.0);
    wait_for("the short job completes", Duration::from_secs(60), || {
        let j = jobs(port)?;
        (j[&short].0 == "completed")
            .then_some(())
            .ok_or(format!("{j:?}"))
    });
    fmctl(port, &["cancel", &long]).unwrap();
}

/// Queue quotas set through the admin API act from the next round and
/// survive a scheduler restart: research (guarantee 2) runs two 2-GPU jobs
/// on the 4-GPU node over quota; limiting it to 2 GPUs live preempts one
/// from its checkpoint. A bad set is refused naming the field, dropping a
/// queue live jobs name is refused, a non-admin is refused; none of them
/// writes anything.
#[tokio::test]
async fn e2e_queue_quotas_set_live_act_from_the_next_round_and_survive_a_restart() {
    let db = TestDb::create("fmsched_queues_live").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics = free_port();
    let config = dir.path().join("queues.toml");
    std::fs::write(
        &config,
        "[[scheduling.queues]]\nname = \"research\"\nguaranteed_gpus = 2\nusers = [\"alice\"]\n\n\
         [[scheduling.queues]]\nname = \"prod\"\nguaranteed_gpus = 2\nusers = [\"bob\"]\n",
    )
    .unwrap();
    let alice = "alice-token-0123456789abc";
    let tokens = format!("root={ROOT},alice={alice}");
    let env = [
        ("FMSCHED_CONFIG", config.to_str().unwrap()),
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
        ("FMSCHED_API_TOKENS", tokens.as_str()),
    ];
    let mut sched = scheduler_env(&db, port, dir.path(), Some(metrics), &env);
    wait_up("scheduler up", port);
    let _a = agent("node-a", port, dir.path());
    let rigid = |name: &str, task: &str| {
        job_yaml(name, task, 200_000, 2).replace("min_gpus: 1", "min_gpus: 2")
    };
    fmsched_integration::submit_manifests(
        port,
        alice,
        dir.path(),
        [
            ("a1".to_string(), rigid("a1", "qqp")),
            ("a2".to_string(), rigid("a2", "mnli")),
        ],
    )
    .expect("alice submits");
    wait_for("alice's two jobs run", Duration::from_secs(30), || {
        let j = jobs(port)?;
        let r = j.values().filter(|s| s.0 == "running").count();
        (r == 2).then_some(()).ok_or(format!("{j:?}"))
    });
    let q = wait_for(
        "research shows 4 GPUs used",
        Duration::from_secs(10),
        || {
            let q = fmctl(port, &["admin", "queues"])?;
            q.lines()
                .any(|l| l.starts_with("research") && l.split_whitespace().nth(7) == Some("4"))
                .then_some(q.clone())
                .ok_or(q)
        },
    );
    assert!(q.contains("from the scheduler's configuration"), "{q}");
    let m = scrape(metrics).await;
    assert!(
        m.contains("fmsched_queue_planned_gpus{queue=\"research\"} 4"),
        "{m}"
    );
    // Refused, nothing written: a non-admin; a limit below the guarantee;
    // dropping the queue alice's live jobs are in.
    let e = fmsched_integration::fmctl(port, alice, &["admin", "queues"]).unwrap_err();
    assert!(e.contains("permission denied"), "{e}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[queues]]\nname = \"research\"\nguaranteed_gpus = 2\nlimit_gpus = 1\n",
    )
    .unwrap();
    let e = fmctl(port, &["admin", "set-queues", bad.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("queues[0].limit_gpus"), "{e}");
    std::fs::write(&bad, "[[queues]]\nname = \"prod\"\nguaranteed_gpus = 2\n").unwrap();
    let e = fmctl(port, &["admin", "set-queues", bad.to_str().unwrap()]).unwrap_err();
    assert!(
        e.contains("failed precondition") && e.contains("(research)"),
        "{e}"
    );
    assert!(
        !fmctl(port, &["admin", "audit"])
            .unwrap()
            .contains("set_queues"),
        "nothing audited"
    );
    // Live: research may hold 2 GPUs at most.
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[queues]]\nname = \"research\"\nguaranteed_gpus = 2\nlimit_gpus = 2\nusers = [\"alice\"]\n\n\
         [[queues]]\nname = \"prod\"\nguaranteed_gpus = 2\nusers = [\"bob\"]\n",
    )
    .unwrap();
    let q = fmctl(port, &["admin", "set-queues", good.to_str().unwrap()]).unwrap();
    assert!(q.contains("set by root"), "{q}");
    wait_for(
        "one of alice's jobs is preempted",
        Duration::from_secs(30),
        || {
            let j = jobs(port)?;
            let r = j.values().filter(|s| s.0 == "running").count();
            (r == 1).then_some(()).ok_or(format!("{j:?}"))
        },
    );
    let preempted = events_saying(&db, "preempted: queue research may use 2 GPUs").await;
    assert_eq!(preempted.len(), 1, "{preempted:?}");
    assert!(
        fmctl(port, &["admin", "audit"])
            .unwrap()
            .contains("set_queues")
    );
    // A restart keeps the set; the second job stays out.
    sched.kill9();
    let _sched = scheduler_env(&db, port, dir.path(), Some(metrics), &env);
    wait_up("scheduler up again", port);
    let q: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "admin", "queues"]).unwrap()).unwrap();
    assert_eq!(q["source"], "admin");
    assert_eq!(q["set_by"], "root");
    assert_eq!(q["queues"][0]["limit_gpus"], 2);
    wait_for(
        "a round under the stored set",
        Duration::from_secs(20),
        || {
            let q: Value = serde_json::from_str(&fmctl(port, &["-o", "json", "admin", "queues"])?)
                .map_err(|e| e.to_string())?;
            let r = &q["status"][0];
            (r["deserved_gpus"] == 2).then_some(()).ok_or(q.to_string())
        },
    );
    let j = jobs(port).unwrap();
    assert_eq!(j.values().filter(|s| s.0 == "running").count(), 1, "{j:?}");
    for id in j.keys() {
        fmctl(port, &["cancel", id]).unwrap();
    }
}

/// Queues with guarantees: alice's queue fills the node while bob's is
/// idle; when bob submits within his queue's guarantee, one of alice's jobs
/// is suspended from its checkpoint in the next round (its history says
/// why) and bob's runs; everything completes. A job naming a queue its user
/// may not use, or one that does not exist, is refused and nothing is
/// written.
#[tokio::test]
async fn e2e_queue_quota_reclaims_gpus_from_an_over_quota_queue() {
    let db = TestDb::create("fmsched_queues").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("queues.toml");
    std::fs::write(
        &config,
        "[[scheduling.queues]]\nname = \"research\"\nguaranteed_gpus = 2\nusers = [\"alice\"]\n\n\
         [[scheduling.queues]]\nname = \"prod\"\nguaranteed_gpus = 2\nusers = [\"bob\"]\n",
    )
    .unwrap();
    let (alice, bob) = ("alice-token-0123456789abc", "bob-token-0123456789abcd");
    let tokens = format!("root={ROOT},alice={alice},bob={bob}");
    let env = [
        ("FMSCHED_CONFIG", config.to_str().unwrap()),
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
        ("FMSCHED_API_TOKENS", tokens.as_str()),
    ];
    let _sched = scheduler_env(&db, port, dir.path(), None, &env);
    wait_up("scheduler up", port);
    let _a = agent("node-a", port, dir.path());
    let rigid = |name: &str, task: &str, iterations: u64, extra: &str| {
        format!(
            "{}{extra}",
            job_yaml(name, task, iterations, 2).replace("min_gpus: 1", "min_gpus: 2")
        )
    };
    // Refused, naming the field, and nothing written.
    let e = fmsched_integration::submit_manifests(
        port,
        bob,
        dir.path(),
        [("x".to_string(), rigid("x", "rte", 100, "queue: research\n"))],
    )
    .unwrap_err();
    assert!(e.contains("may not submit to \"research\""), "{e}");
    let e = fmsched_integration::submit_manifests(
        port,
        bob,
        dir.path(),
        [("y".to_string(), rigid("y", "rte", 100, "queue: nope\n"))],
    )
    .unwrap_err();
    assert!(
        e.contains("spec.queue") && e.contains("research, prod"),
        "{e}"
    );
    let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 0, "refused submissions wrote nothing");

    fmsched_integration::submit_manifests(
        port,
        alice,
        dir.path(),
        [
            ("a1".to_string(), rigid("a1", "qqp", 4000, "")),
            ("a2".to_string(), rigid("a2", "mnli", 4000, "")),
        ],
    )
    .expect("alice submits");
    wait_for("alice's two jobs run", Duration::from_secs(30), || {
        let j = jobs(port)?;
        let r = j.values().filter(|s| s.0 == "running").count();
        (r == 2).then_some(()).ok_or(format!("{j:?}"))
    });
    fmsched_integration::submit_manifests(
        port,
        bob,
        dir.path(),
        [("b1".to_string(), rigid("b1", "rte", 600, ""))],
    )
    .expect("bob submits");
    let b1: String = sqlx::query_scalar("SELECT id::text FROM jobs WHERE name = 'b1'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let queue: String = sqlx::query_scalar("SELECT spec->>'queue' FROM jobs WHERE name = 'b1'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(queue, "prod", "bob's job lands in his queue");
    wait_for("bob's job runs", Duration::from_secs(20), || {
        let j = jobs(port)?;
        match j.get(&b1) {
            Some(s) if s.0 == "running" || s.0 == "completed" => Ok(()),
            s => Err(format!("{s:?}")),
        }
    });
    let preempted: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM job_events e JOIN jobs j ON j.id = e.job_id
         WHERE j.name IN ('a1', 'a2') AND e.to_state = 'queued'
           AND e.message LIKE 'preempted%'",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(preempted.len(), 1, "one of alice's jobs: {preempted:?}");
    assert!(
        preempted[0]
            .starts_with("preempted: queue research may use 2 GPUs this round (guarantee 2)"),
        "{preempted:?}"
    );
    let done = all_completed(port, 3, Duration::from_secs(180));
    assert_eq!(done.len(), 3);
}
