//! End-to-end tests: hardening.

use std::time::Duration;

use fmsched_integration::*;
use fmsched_proto::v1 as pb;
use serde_json::Value;
use sqlx::Connection;

use crate::{
    JOIN, agent, agent_env, all_completed, fmctl, job_yaml, jobs, metric_value, node_view,
    running_job, scheduler_env, scheduler_without_profiling, scrape, submit, trainer_processes,
    wait_up,
};

/// A registration as a raw client (no node-agent process) would send it:
/// 4 GPUs of its own, the given credentials.
fn raw_register(node: &str, join: &str, node_token: &str, instance: &str) -> pb::Register {
    pb::Register {
        node_id: node.into(),
        hostname: format!("{node}-raw"),
        gpus: (0..4)
            .map(|i| pb::GpuInfo {
                uuid: format!("GPU-{node}-raw-{i}"),
                index: i,
                model: "A100-80GB".into(),
                memory_total_bytes: 80 << 30,
                pci_bus_id: format!("0000:2{i}:00.0"),
            })
            .collect(),
        agent_version: "raw".into(),
        join_token: join.into(),
        node_token: node_token.into(),
        instance_id: instance.into(),
        gpu_backend: "fake".into(),
        ..Default::default()
    }
}

/// Opens a raw agent session: the sender for its next messages, the
/// scheduler's stream and its acknowledgement, or the refusal.
async fn raw_session(
    port: u16,
    reg: pb::Register,
) -> Result<
    (
        tokio::sync::mpsc::Sender<pb::AgentMessage>,
        tonic::Streaming<pb::SchedulerMessage>,
        pb::RegisterAck,
    ),
    tonic::Status,
> {
    use fmsched_proto::v1::agent_service_client::AgentServiceClient;
    let mut client = AgentServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("scheduler reachable");
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Register(reg)),
    })
    .await
    .unwrap();
    let mut inbound = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    match inbound.message().await?.and_then(|m| m.msg) {
        Some(pb::scheduler_message::Msg::RegisterAck(ack)) => Ok((tx, inbound, ack)),
        other => panic!("expected a RegisterAck, got {other:?}"),
    }
}

/// Node identity: the join token (which every host of the cluster holds)
/// never takes over a node that holds a credential. A raw client with the
/// join token and a made-up instance id is refused while the real agent
/// keeps its session and its token; a second agent on its own disk (no
/// node token) is refused even after the first has gone; a clone that
/// carries the node's token file (a cloned host image) is refused with
/// ALREADY_EXISTS naming no instance id while the first session lives.
/// Only an admin's revocation lets the node enroll again. Refusals are
/// counted and written as node events.
#[tokio::test]
async fn e2e_node_identity_the_join_token_cannot_take_over_a_node() {
    let c = Cluster::builder("fmsched_dup")
        .scheduler_env(&[("FMSCHED_SCHEDULING__ENABLED", "false")])
        .metrics()
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let mport = c.metrics_port.expect("metrics asked for");
    let ep = format!("http://127.0.0.1:{port}");
    let a100 = vec!["A100-80GB".to_string(); 4];
    let h100 = vec!["H100-80GB".to_string(); 4];
    let mut first = agent("n1", port, dir.path());
    let file = dir.path().join("n1").join("node-n1.token");
    let token = wait_for("n1 enrolled", Duration::from_secs(20), || {
        std::fs::read_to_string(&file).map_err(|e| e.to_string())
    });
    wait_for(
        "n1 registered",
        Duration::from_secs(20),
        || match node_view(port, "n1")? {
            (true, m) if m == a100 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let before = n1_token_hash(&mut c).await;
    assert!(before.is_some());

    // The take-over: the join token and any instance id. Refused, and the
    // node's credential and session are untouched.
    let e = raw_session(port, raw_register("n1", JOIN, "", "made-up-instance"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("holds a node credential"), "{e:?}");
    assert_eq!(n1_token_hash(&mut c).await, before, "not re-issued");
    // A cloned host image carries the token: ALREADY_EXISTS while the
    // first session lives, naming no instance id.
    let e = raw_session(port, raw_register("n1", "", &token, "clone-instance"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("already has a live session"), "{e:?}");
    assert!(!e.message().contains("instance"), "{e:?}");

    // A second agent with its own disk (no node token) and other GPUs.
    let clone_dir = dir.path().join("clone");
    std::fs::create_dir_all(&clone_dir).unwrap();
    let clone = agent_env(
        "n1",
        &ep,
        &clone_dir,
        None,
        &[("FMSCHED_AGENT_GPU__FAKE_MODEL", "H100-80GB")],
    );
    // Refused as unauthenticated, the agent stops (it would not get in by
    // retrying).
    wait_for("the clone is refused", Duration::from_secs(20), || {
        let log = clone.log_text();
        if log.contains("holds a node credential") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert_eq!(node_view(port, "n1").unwrap(), (true, a100.clone()));
    // The first agent goes away: a second agent is still refused.
    first.kill9();
    let again = agent_env(
        "n1",
        &ep,
        &clone_dir,
        None,
        &[("FMSCHED_AGENT_GPU__FAKE_MODEL", "H100-80GB")],
    );
    wait_for("refused again", Duration::from_secs(20), || {
        let log = again.log_text();
        if log.contains("holds a node credential") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert_ne!(node_view(port, "n1").unwrap().1, h100, "not taken over");
    assert_eq!(n1_token_hash(&mut c).await, before);
    let m = scrape(mport).await;
    let refused = metric_value(&m, "fmsched_agent_refused_registrations_total");
    assert!(refused >= 3.0, "the refusals are counted: {refused}");
    assert!(metric_value(&m, "fmsched_agent_duplicate_registrations_total") >= 1.0);
    let (events, registrations): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'duplicate_refused'),
                count(*) FILTER (WHERE kind = 'registered')
         FROM node_events WHERE node_id = 'n1'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert!(events >= 1, "a node event says so");
    assert_eq!(registrations, 1, "no other agent registered");

    // An admin revokes the credential: the new agent enrolls the node.
    fmctl(
        port,
        &["admin", "revoke-token", "n1", "--reason", "host replaced"],
    )
    .unwrap();
    let _new = agent_env(
        "n1",
        &ep,
        &clone_dir,
        None,
        &[("FMSCHED_AGENT_GPU__FAKE_MODEL", "H100-80GB")],
    );
    wait_for(
        "the new agent enrolled",
        Duration::from_secs(20),
        || match node_view(port, "n1")? {
            (true, m) if m == h100 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let after = n1_token_hash(&mut c).await;
    assert!(after.is_some() && after != before, "a new credential");
    c.close().await.unwrap();
}

/// The SHA-256 of n1's node token on record (None: revoked).
async fn n1_token_hash(c: &mut sqlx::PgConnection) -> Option<String> {
    sqlx::query_scalar("SELECT token_sha256 FROM nodes WHERE id = 'n1'")
        .fetch_one(c)
        .await
        .unwrap()
}

/// Kubelet-style bootstrap: an agent enrolls with the join token and keeps
/// the node token it is issued (file mode 0600; Postgres keeps only its
/// hash); restarted without the join token it registers with that token;
/// the token admits no other node id, and a wrong one is refused.
#[tokio::test]
async fn e2e_hardening_a_node_token_works_only_for_its_own_node() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::builder("fmsched_ntok")
        .scheduler_env(&[("FMSCHED_SCHEDULING__ENABLED", "false")])
        .metrics()
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let mport = c.metrics_port.expect("metrics asked for");
    let ep = format!("http://127.0.0.1:{port}");
    let mut n1 = agent("n1", port, dir.path());
    let file = dir.path().join("n1").join("node-n1.token");
    let token = wait_for("n1 enrolled", Duration::from_secs(20), || {
        std::fs::read_to_string(&file).map_err(|e| e.to_string())
    });
    assert!(token.starts_with("fmn_"), "{token}");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT token_sha256 FROM nodes WHERE id = 'n1'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(stored.len(), 64, "a SHA-256 in hex");
    assert!(
        !stored.contains(&token[4..20]),
        "the token itself is not stored"
    );

    // n1's token presented for n2: refused, and nothing of n2 is written.
    let e = raw_session(port, raw_register("n2", "", &token, "x"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("not valid for node n2"), "{e:?}");
    let n2: i64 = sqlx::query_scalar("SELECT count(*) FROM nodes WHERE id = 'n2'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n2, 0);
    // A wrong token for n1 without the join token: refused too.
    let e = raw_session(port, raw_register("n1", "", "fmn_guessed", "x"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // Restarted without the join token, n1 comes back with its own token.
    n1.kill9();
    let _n1 = agent_env("n1", &ep, dir.path(), None, &[("FMSCHED_JOIN_TOKEN", "")]);
    wait_for("n1 back", Duration::from_secs(20), || {
        let (connected, _) = node_view(port, "n1")?;
        let log = _n1.log_text();
        if connected && log.contains("registered with scheduler") {
            Ok(())
        } else {
            Err(log)
        }
    });
    let (enrolled, registered): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'enrolled'), count(*) FILTER (WHERE kind = 'registered')
         FROM node_events WHERE node_id = 'n1'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(
        (enrolled, registered),
        (1, 2),
        "enrolled once, registered twice"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        token,
        "the same token"
    );
    let m = scrape(mport).await;
    assert!(metric_value(&m, "fmsched_agent_refused_registrations_total") >= 2.0);

    // An admin revokes n1's token: its session ends, and without the join
    // token it is refused from then on.
    let out = fmctl(
        port,
        &["admin", "revoke-token", "n1", "--reason", "host lost"],
    )
    .unwrap();
    assert!(out.contains("n1"), "{out}");
    wait_for("n1 refused", Duration::from_secs(20), || {
        let (connected, _) = node_view(port, "n1")?;
        let log = _n1.log_text();
        if !connected && log.contains("revoked") {
            Ok(())
        } else {
            Err(format!("connected={connected}: {log}"))
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !node_view(port, "n1").unwrap().0,
        "still refused after its retries"
    );
    let stored: Option<String> =
        sqlx::query_scalar("SELECT token_sha256 FROM nodes WHERE id = 'n1'")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(stored, None);
    let audit = fmctl(port, &["admin", "audit"]).unwrap();
    assert!(
        audit.contains("revoke_token") && audit.contains("host lost"),
        "{audit}"
    );
    c.close().await.unwrap();
}

/// A registered node reports a job it was never given as finished, with
/// forged output weights: the scheduler ignores it (and counts it), the job
/// keeps running on its node and completes there with its own output.
#[tokio::test]
async fn e2e_hardening_a_forged_completion_report_changes_nothing() {
    let db = TestDb::create("fmsched_forged").await;
    let dir = tempfile::tempdir().unwrap();
    let (port, mport) = (free_port(), free_port());
    let sched = scheduler_env(
        &db,
        port,
        dir.path(),
        Some(mport),
        &[
            ("FMSCHED_SCHEDULING__PROFILING", "false"),
            ("FMSCHED_SCHEDULING__MERGING", "false"),
        ],
    );
    wait_up("scheduler up", port);
    let honest = agent("honest", port, dir.path());
    wait_for("honest registered", Duration::from_secs(20), || {
        node_view(port, "honest").map(|_| ())
    });
    submit(
        port,
        dir.path(),
        [(
            "victim".to_string(),
            job_yaml("victim", "rte", 12_000, 4).replace("min_gpus: 1", "min_gpus: 4"),
        )],
    )
    .expect("submit");
    let id = running_job(port);
    // The forger joins with the join token and reports the victim's
    // process as succeeded, every heartbeat.
    let (tx, _inbound, _ack) = raw_session(port, raw_register("forger", JOIN, "", "forger-1"))
        .await
        .expect("the forger may join: it holds the join token");
    let forged = pb::ObservedTask {
        task_id: id.clone(),
        job_ids: vec![id.clone()],
        phase: pb::TaskPhase::Succeeded as i32,
        pid: 4242,
        gpu_uuids: (0..4).map(|i| format!("GPU-forger-raw-{i}")).collect(),
        iteration: 12_000,
        outputs: [(id.clone(), "/forged/weights".to_string())].into(),
        ..Default::default()
    };
    for seq in 1..=20u64 {
        tx.send(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
                sequence: seq,
                tasks: vec![forged.clone()],
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let state = &jobs(port).unwrap()[&id].0;
        assert_eq!(state, "running", "a forged report moved the job");
    }
    let ignored = metric_value(&scrape(mport).await, "fmsched_agent_ignored_reports_total");
    assert!(ignored >= 1.0, "the forged report is counted: {ignored}");
    assert!(
        sched
            .log_text()
            .contains("never given (forged or misrouted)")
    );
    drop(tx);
    let done = all_completed(port, 1, Duration::from_secs(120));
    let (state, output) = &done[&id];
    assert_eq!(state, "completed");
    assert!(
        !output.is_empty() && !output.contains("forged"),
        "completed with its own output: {output}"
    );
    assert!(honest.log_text().contains(&id));
}

/// `fmctl bench-agents` drives a small swarm of simulated agents over the
/// real protocol: every agent registers once and stays (no flap), every
/// submitted job is profiled, placed and completed by the simulated
/// processes, and the figures it prints come from what it measured.
#[tokio::test]
async fn e2e_hardening_bench_agents_runs_a_small_swarm_to_completion() {
    let c = Cluster::builder("fmsched_swarm").metrics().start().await;
    let port = c.port;
    let mport = c.metrics_port.expect("metrics asked for");
    let metrics = format!("127.0.0.1:{mport}");
    let out = fmctl(
        port,
        &[
            "bench-agents",
            "--agents",
            "10",
            "--gpus",
            "4",
            "--interval",
            "200ms",
            "--jobs",
            "12",
            "--iterations",
            "100",
            "--it-per-s",
            "200",
            "--profile",
            "300ms",
            "--duration",
            "90s",
            "--join-token",
            JOIN,
            "--scheduler-metrics",
            &metrics,
        ],
    )
    .expect("bench-agents runs");
    let last = out.lines().last().unwrap_or_default();
    let field = |k: &str| -> f64 {
        last.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}="))?.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {last:?}"))
    };
    assert_eq!(field("agents"), 10.0, "{out}");
    assert_eq!(field("completed"), 12.0, "every job completed: {out}");
    assert_eq!(field("re_registrations"), 0.0, "no agent flapped: {out}");
    assert_eq!(field("suspect_max"), 0.0, "{out}");
    assert!(
        field("hb_p99_ms") > 0.0 && field("round_p99_ms") > 0.0,
        "{out}"
    );
    assert!(
        field("sched_rss_mib") > 0.0,
        "read from the scheduler's metrics: {out}"
    );
    let nodes: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "nodes"]).unwrap()).unwrap();
    let swarm = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["id"].as_str().is_some_and(|id| id.starts_with("swarm-")))
        .count();
    assert_eq!(swarm, 10, "one node per simulated agent: {nodes}");
}

/// An agent killed with `kill -9` leaves its trainer running. Restarted on
/// the same work folder, the agent stops that orphan (SIGTERM: it
/// checkpoints) before it runs the node's plan, and says so; the job
/// resumes and completes, and no process of it is left.
#[tokio::test]
async fn e2e_hardening_a_restarted_agent_stops_the_trainer_its_predecessor_left() {
    let db = TestDb::create("fmsched_orphans").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _sched = scheduler_without_profiling(&db, port, dir.path());
    wait_up("scheduler up", port);
    let mut a = agent("node-a", port, dir.path());
    submit(
        port,
        dir.path(),
        [("j".to_string(), job_yaml("j", "qqp", 4000, 1))],
    )
    .expect("submit");
    let old = wait_for("a trainer runs", Duration::from_secs(60), || {
        trainer_processes(dir.path())
            .into_values()
            .next()
            .ok_or_else(|| "no trainer yet".to_string())
    });
    a.kill9();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        trainer_processes(dir.path()).values().any(|&p| p == old),
        "the trainer outlives its agent"
    );
    let a2 = agent("node-a", port, dir.path());
    all_completed(port, 1, Duration::from_secs(120));
    assert!(
        a2.log_text()
            .contains("stopped processes a previous agent left running"),
        "{}",
        a2.log_text()
    );
    let left = trainer_processes(dir.path());
    assert!(left.is_empty(), "processes left: {left:?}");
}
