//! Every RPC of the scheduler against a real Postgres: happy paths, each
//! validation error, each authentication failure, idempotency, watch,
//! agent sessions, health and reflection.

mod common;

use std::time::Duration;

use common::*;
use fmsched_core::JobState;
use fmsched_proto::convert::job_spec_to_proto;
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::agent_service_client::AgentServiceClient;
use tokio_stream::StreamExt;
use tonic::Code;

async fn job_count(s: &TestScheduler) -> i64 {
    let pool = s.pool().await;
    let n: (i64,) = sqlx::query_as("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let e: (i64,) = sqlx::query_as("SELECT count(*) FROM job_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n.0 + e.0
}

#[tokio::test]
async fn submit_get_list_cancel_watch() {
    let s = TestScheduler::start().await;
    let alice = s.client(ALICE).await.unwrap();
    let (job, created) = alice.submit(&spec(), None).await.unwrap();
    assert!(created);
    assert_eq!(job.owner, "alice");
    assert_eq!(job.state, pb::JobState::Submitted as i32);
    let got = alice.get_job(&job.id).await.unwrap();
    assert_eq!(got.id, job.id);
    assert_eq!(
        fmsched_proto::convert::job_spec_from_proto(got.spec.unwrap()).unwrap(),
        spec()
    );

    let (jobs, next) = alice.list_jobs(&Default::default()).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert!(next.is_none());

    // Watch from the start: history first, then the live cancellation, then end.
    let mut w = alice.watch_job(&job.id, 0).await.unwrap();
    let first = w.next().await.unwrap().unwrap();
    assert_eq!(first.kind, "submitted");
    let watcher = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Some(ev) = w.next().await {
            rest.push(ev.unwrap());
        }
        rest
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c = alice.cancel_job(&job.id, "changed my mind").await.unwrap();
    assert_eq!(c.state, pb::JobState::Cancelled as i32);
    assert!(c.state_reason.contains("changed my mind"));
    let rest = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("watch ends")
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].to_state, pb::JobState::Cancelled as i32);
    assert_eq!(rest[0].from_state, pb::JobState::Submitted as i32);

    // Cancelling again returns the job unchanged; the history has 2 events.
    let again = alice.cancel_job(&job.id, "").await.unwrap();
    assert_eq!(again.last_event_sequence, c.last_event_sequence);
    let mut w = alice.watch_job(&job.id, 0).await.unwrap();
    let mut n = 0;
    while let Some(ev) = w.next().await {
        ev.unwrap();
        n += 1;
    }
    assert_eq!(
        n, 2,
        "a watch of a finished job replays its history and ends"
    );

    // Filter by state.
    let (cancelled, _) = alice
        .list_jobs(&fmctl::JobFilter {
            states: vec![JobState::Cancelled],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 1);
    let (queued, _) = alice
        .list_jobs(&fmctl::JobFilter {
            states: vec![JobState::Queued],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(queued.is_empty());
    s.teardown().await;
}

#[tokio::test]
async fn pagination_walks_every_job_once() {
    let s = TestScheduler::start().await;
    let alice = s.client(ALICE).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(alice.submit(&spec(), None).await.unwrap().0.id);
    }
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let (page, next) = alice
            .list_jobs(&fmctl::JobFilter {
                page_size: 3,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.len() <= 3);
        seen.extend(page.into_iter().map(|j| j.id));
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    ids.reverse(); // newest first
    assert_eq!(seen, ids);
    let e = alice
        .list_jobs(&fmctl::JobFilter {
            page_token: Some("garbage".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument));
    assert!(e.to_string().contains("page_token"));
    s.teardown().await;
}

#[tokio::test]
async fn idempotency_key_returns_same_job_or_already_exists() {
    let s = TestScheduler::start().await;
    let alice = s.client(ALICE).await.unwrap();
    let (a, created_a) = alice.submit(&spec(), Some("run-1")).await.unwrap();
    let (b, created_b) = alice.submit(&spec(), Some("run-1")).await.unwrap();
    assert!(created_a && !created_b);
    assert_eq!(a.id, b.id);
    let mut other = spec();
    other.hyperparameters.learning_rate = 1e-4;
    let e = alice.submit(&other, Some("run-1")).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::AlreadyExists));
    assert!(e.to_string().contains(&a.id));
    // Keys are per user: bob may use the same key.
    let bob = s.client(BOB).await.unwrap();
    let (c, created_c) = bob.submit(&spec(), Some("run-1")).await.unwrap();
    assert!(created_c);
    assert_ne!(c.id, a.id);
    s.teardown().await;
}

/// Each bad input is INVALID_ARGUMENT naming the field, and writes nothing.
#[tokio::test]
async fn bad_input_names_the_field_and_writes_nothing() {
    let s = TestScheduler::start().await;
    let alice = s.client(ALICE).await.unwrap();
    let base = job_spec_to_proto(&spec());
    type Edit = Box<dyn Fn(&mut pb::JobSpec)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("spec.model", Box::new(|p| p.model = String::new())),
        ("spec.model", Box::new(|p| p.model = "gpt-17".into())),
        (
            "spec.resources.min_gpus",
            Box::new(|p| {
                let r = p.resources.as_mut().unwrap();
                r.min_gpus = 4;
                r.max_gpus = 2;
            }),
        ),
        (
            "spec.hyperparameters.global_batch_size",
            Box::new(|p| p.hyperparameters.as_mut().unwrap().global_batch_size = 0),
        ),
        (
            "spec.hyperparameters.learning_rate",
            Box::new(|p| p.hyperparameters.as_mut().unwrap().learning_rate = f64::NAN),
        ),
        (
            "spec.hyperparameters.learning_rate",
            Box::new(|p| p.hyperparameters.as_mut().unwrap().learning_rate = -0.1),
        ),
        (
            "spec.target.metric.value",
            Box::new(|p| p.target.as_mut().unwrap().metric.as_mut().unwrap().value = f64::INFINITY),
        ),
        (
            "spec.target",
            Box::new(|p| {
                let t = p.target.as_mut().unwrap();
                t.max_epochs = 0;
                t.max_iterations = 0;
            }),
        ),
        (
            "spec.dataset.uri",
            Box::new(|p| p.dataset.as_mut().unwrap().uri = "x".repeat(64 * 1024 + 1)),
        ),
        (
            "spec.launch.env",
            Box::new(|p| {
                let env = &mut p.launch.as_mut().unwrap().env;
                for i in 0..257 {
                    env.insert(format!("V{i}"), "1".into());
                }
            }),
        ),
        (
            "spec.hyperparameters.optimizer",
            Box::new(|p| p.hyperparameters.as_mut().unwrap().optimizer = 77),
        ),
        ("spec.slo_class", Box::new(|p| p.slo_class = 9)),
        (
            "spec.resources.gpu_model",
            Box::new(|p| p.resources.as_mut().unwrap().gpu_model = "TPU-v9".into()),
        ),
        (
            "spec.deadline",
            Box::new(|p| {
                p.deadline = Some(prost_types::Timestamp {
                    seconds: 1_000_000_000,
                    nanos: 0,
                })
            }),
        ),
        ("spec.resources", Box::new(|p| p.resources = None)),
        (
            "spec.launch.command",
            Box::new(|p| p.launch.as_mut().unwrap().command.clear()),
        ),
    ];
    for (field, edit) in &cases {
        let mut p = base.clone();
        edit(&mut p);
        let e = alice.submit_proto(p, None).await.unwrap_err();
        assert_eq!(e.code(), Some(Code::InvalidArgument), "{field}: {e}");
        assert!(e.to_string().contains(field), "expected {field} in {e}");
    }
    // No spec at all.
    let e = alice
        .submit_proto(pb::JobSpec::default(), None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument));
    // Over-long idempotency key.
    let e = alice
        .submit_proto(base.clone(), Some(&"k".repeat(300)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("idempotency_key"), "{e}");
    // A 10 MB string: refused by the server before decoding (limit 4 MiB).
    let mut huge = base.clone();
    huge.name = "n".repeat(10 * 1024 * 1024);
    let e = alice.submit_proto(huge, None).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            Some(Code::OutOfRange | Code::ResourceExhausted | Code::InvalidArgument)
        ),
        "{e}"
    );
    assert_eq!(
        job_count(&s).await,
        0,
        "nothing may be written for bad input"
    );
    s.teardown().await;
}

#[tokio::test]
async fn authentication_and_ownership() {
    let s = TestScheduler::start().await;
    // No token.
    let anon = fmctl::Client::connect(fmctl::ClientConfig {
        endpoint: s.endpoint(),
        token: None,
        ..Default::default()
    })
    .await
    .unwrap();
    let e = anon.submit(&spec(), None).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated));
    assert_eq!(
        anon.list_nodes(&[]).await.unwrap_err().code(),
        Some(Code::Unauthenticated)
    );
    // Wrong token.
    let forged = s.client("not-a-real-token-000000").await.unwrap();
    assert_eq!(
        forged
            .list_jobs(&Default::default())
            .await
            .unwrap_err()
            .code(),
        Some(Code::Unauthenticated)
    );

    let alice = s.client(ALICE).await.unwrap();
    let bob = s.client(BOB).await.unwrap();
    let root = s.client(ROOT).await.unwrap();
    let (job, _) = alice.submit(&spec(), None).await.unwrap();
    bob.submit(&spec(), None).await.unwrap();

    // Bob can neither see nor cancel nor watch alice's job.
    assert_eq!(
        bob.get_job(&job.id).await.unwrap_err().code(),
        Some(Code::NotFound)
    );
    assert_eq!(
        bob.cancel_job(&job.id, "").await.unwrap_err().code(),
        Some(Code::NotFound)
    );
    assert_eq!(
        bob.watch_job(&job.id, 0).await.unwrap_err().code(),
        Some(Code::NotFound)
    );
    let (bobs, _) = bob.list_jobs(&Default::default()).await.unwrap();
    assert_eq!(bobs.len(), 1);
    assert!(bobs.iter().all(|j| j.owner == "bob"));
    let e = bob
        .list_jobs(&fmctl::JobFilter {
            owner: Some("alice".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PermissionDenied));
    assert_eq!(
        alice.get_job(&job.id).await.unwrap().state,
        pb::JobState::Submitted as i32
    );

    // The admin sees everyone's jobs and may cancel any.
    let (all, _) = root.list_jobs(&Default::default()).await.unwrap();
    assert_eq!(all.len(), 2);
    let (alices, _) = root
        .list_jobs(&fmctl::JobFilter {
            owner: Some("alice".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(alices.len(), 1);
    assert_eq!(
        root.cancel_job(&job.id, "maintenance").await.unwrap().state,
        pb::JobState::Cancelled as i32
    );
    // Malformed ids name the field.
    let e = alice.get_job("not-a-uuid").await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument));
    assert!(e.to_string().contains("job_id"));
    s.teardown().await;
}

fn register(node: &str, token: &str) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Register(pb::Register {
            node_id: node.into(),
            hostname: node.into(),
            gpus: (0..4)
                .map(|i| pb::GpuInfo {
                    uuid: format!("GPU-{node}-{i}"),
                    index: i,
                    model: "A100-80GB".into(),
                    memory_total_bytes: 80 << 30,
                    pci_bus_id: format!("0000:1{i}:00.0"),
                })
                .collect(),
            agent_version: "test".into(),
            join_token: token.into(),
            gpu_backend: "fake".into(),
            ..Default::default()
        })),
    }
}

/// Opens an agent session that registers `node` with the join token: the
/// sender for its next messages and the scheduler's answers.
async fn open_session(
    agents: &mut AgentServiceClient<tonic::transport::Channel>,
    node: &str,
) -> (
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::SchedulerMessage>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(register(node, JOIN)).await.unwrap();
    let inbound = agents
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, inbound)
}

fn heartbeat(node: &str, util: u32) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            sequence: 1,
            gpus: (0..4)
                .map(|i| pb::GpuTelemetry {
                    uuid: format!("GPU-{node}-{i}"),
                    utilization_percent: util,
                    memory_total_bytes: 80 << 30,
                    temperature_celsius: 40,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn agents_need_the_join_token_and_report_telemetry() {
    let s = TestScheduler::start().await;
    let mut agents = AgentServiceClient::new(s.channel().await);

    // Wrong token: refused, nothing registered.
    let e = agents
        .session(tokio_stream::iter(vec![register(
            "n1",
            "wrong-token-0000000000",
        )]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // First message not a Register.
    let e = agents
        .session(tokio_stream::iter(vec![heartbeat("n1", 0)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let root = s.client(ROOT).await.unwrap();
    assert!(root.list_nodes(&[]).await.unwrap().is_empty());

    // Right token: acknowledged with the heartbeat interval.
    let (tx, mut inbound) = open_session(&mut agents, "n1").await;
    let ack = inbound.next().await.unwrap().unwrap();
    let Some(pb::scheduler_message::Msg::RegisterAck(ack)) = ack.msg else {
        panic!("expected ack")
    };
    assert_eq!(ack.node_id, "n1");
    assert!(ack.heartbeat_interval.is_some());
    tx.send(heartbeat("n1", 87)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let nodes = root.list_nodes(&[]).await.unwrap();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.state, pb::NodeState::Available as i32);
    assert!(n.connected);
    assert_eq!(n.gpus.len(), 4);
    assert_eq!(
        n.gpus[0].telemetry.as_ref().unwrap().utilization_percent,
        87
    );
    let sum = root.cluster_summary().await.unwrap();
    assert_eq!(sum.gpus_total, 4);
    assert_eq!(sum.gpus_free, 4);
    assert_eq!(sum.gpus_by_model[0].model, "A100-80GB");
    // A plan that holds two GPUs: they are no longer free, and the node
    // names the job on them (it said "all free" while jobs ran).
    let alice = s.client(ALICE).await.unwrap();
    let (job, _) = alice.submit(&spec(), None).await.unwrap();
    let pool = s.pool().await;
    sqlx::query(
        "INSERT INTO assignments (job_id, node_id, gpu_uuids, generation, assigned_at)
         VALUES ($1::uuid, 'n1', ARRAY['GPU-n1-0', 'GPU-n1-1'], 1, now())",
    )
    .bind(&job.id)
    .execute(&pool)
    .await
    .unwrap();
    let sum = root.cluster_summary().await.unwrap();
    assert_eq!((sum.gpus_total, sum.gpus_free), (4, 2));
    assert_eq!(
        (sum.gpus_by_model[0].total, sum.gpus_by_model[0].free),
        (4, 2)
    );
    let held: Vec<String> = root
        .get_node("n1")
        .await
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.allocated_to_job.clone())
        .collect();
    assert_eq!(
        held,
        vec![job.id.clone(), job.id.clone(), String::new(), String::new()]
    );
    sqlx::query("DELETE FROM assignments")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(root.get_node("n1").await.unwrap().id, "n1");
    assert_eq!(
        root.get_node("nope").await.unwrap_err().code(),
        Some(Code::NotFound)
    );

    // Silence: Suspect, then Offline (and the scheduler closes the session).
    let mut saw_suspect = false;
    let mut offline = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let st = root.get_node("n1").await.unwrap().state;
        saw_suspect |= st == pb::NodeState::Suspect as i32;
        if st == pb::NodeState::Offline as i32 {
            offline = true;
            break;
        }
    }
    assert!(
        saw_suspect && offline,
        "suspect={saw_suspect} offline={offline}"
    );
    // Every heartbeat was acknowledged under the leader's term, then the
    // session ended.
    let mut acks = Vec::new();
    let end = loop {
        let m = tokio::time::timeout(Duration::from_secs(2), inbound.next())
            .await
            .expect("session closed");
        match m {
            Some(Ok(pb::SchedulerMessage {
                msg: Some(pb::scheduler_message::Msg::HeartbeatAck(a)),
            })) => acks.push(a),
            other => break other,
        }
    };
    assert!(end.is_none() || end.unwrap().is_err());
    assert!(ack.epoch >= 1, "the ack names the leader's term");
    assert_eq!(
        acks,
        vec![pb::HeartbeatAck {
            sequence: 1,
            epoch: ack.epoch
        }]
    );
    // The sweep changes the registry first and writes Postgres after it (a
    // fenced write, retried on the next sweep if it fails), so the row may
    // trail what GetNode showed by one write.
    let pool = s.pool().await;
    let mut state = String::new();
    for _ in 0..100 {
        (state,) = sqlx::query_as("SELECT state FROM nodes WHERE id = 'n1'")
            .fetch_one(&pool)
            .await
            .unwrap();
        if state == "offline" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "offline", "liveness transitions are persisted");
    pool.close().await;

    // Re-registering brings it back: with the node token it was issued
    // (the join token no longer re-issues a credential the node holds).
    let e = agents
        .session(tokio_stream::iter(vec![register("n1", JOIN)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("holds a node credential"), "{e:?}");
    let mut again = register("n1", "");
    if let Some(pb::agent_message::Msg::Register(r)) = &mut again.msg {
        r.node_token = ack.node_token.clone();
    }
    let (tx2, rx2) = tokio::sync::mpsc::channel(8);
    tx2.send(again).await.unwrap();
    let mut inbound2 = agents
        .session(tokio_stream::wrappers::ReceiverStream::new(rx2))
        .await
        .unwrap()
        .into_inner();
    inbound2.next().await.unwrap().unwrap();
    assert_eq!(
        root.get_node("n1").await.unwrap().state,
        pb::NodeState::Available as i32
    );
    drop(tx);
    drop(tx2);
    s.teardown().await;
}

/// A heartbeat past the protocol's limits ends the session with
/// INVALID_ARGUMENT naming the field; the node keeps what it had.
#[tokio::test]
async fn an_agent_message_over_the_limits_closes_its_session_naming_the_field() {
    let s = TestScheduler::start().await;
    let mut agents = AgentServiceClient::new(s.channel().await);
    let (tx, mut inbound) = open_session(&mut agents, "n1").await;
    let Some(Ok(pb::SchedulerMessage {
        msg: Some(pb::scheduler_message::Msg::RegisterAck(ack)),
    })) = inbound.next().await
    else {
        panic!("expected ack")
    };
    assert!(
        ack.node_token.starts_with("fmn_"),
        "enrolled with the join token"
    );
    let task = pb::ObservedTask {
        task_id: "t".into(),
        ..Default::default()
    };
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            sequence: 1,
            tasks: vec![task; 1025],
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match inbound.next().await {
                Some(Ok(_)) => continue,
                other => break other,
            }
        }
    })
    .await
    .expect("the session ends");
    let status = end.expect("an error, not a silent close").unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("heartbeat.tasks"),
        "{status:?}"
    );
    let root = s.client(ROOT).await.unwrap();
    let n = root.get_node("n1").await.unwrap();
    assert!(!n.connected);
    assert_eq!(n.gpus.len(), 4);
    s.teardown().await;
}

#[tokio::test]
async fn health_and_reflection() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let s = TestScheduler::start().await;
    let ch = s.channel().await;
    let mut health = HealthClient::new(ch.clone());
    for svc in [
        "",
        "fmsched.v1.JobService",
        "fmsched.v1.ClusterService",
        "fmsched.v1.AgentService",
    ] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: svc.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{svc}"
        );
    }

    let mut refl = ServerReflectionClient::new(ch);
    let reqs = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "fmsched.v1.JobService".into(),
            )),
        },
    ];
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(reqs))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "fmsched.v1.JobService",
        "fmsched.v1.ClusterService",
        "fmsched.v1.AgentService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    let Some(MessageResponse::FileDescriptorResponse(fd)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a file descriptor")
    };
    assert!(!fd.file_descriptor_proto.is_empty());
    s.teardown().await;
}

#[tokio::test]
async fn restart_keeps_jobs_and_nodes() {
    let mut s = TestScheduler::start().await;
    let alice = s.client(ALICE).await.unwrap();
    let (job, _) = alice.submit(&spec(), Some("k")).await.unwrap();
    let mut agents = AgentServiceClient::new(s.channel().await);
    let (tx, mut inbound) = open_session(&mut agents, "n9").await;
    inbound.next().await.unwrap().unwrap();
    drop(tx);
    s.stop().await;

    let db = s.db.clone();
    let s2 = TestScheduler::start_on(db, None).await;
    let alice = s2.client(ALICE).await.unwrap();
    let got = alice.get_job(&job.id).await.unwrap();
    assert_eq!(got.state, pb::JobState::Submitted as i32);
    let (again, created) = alice.submit(&spec(), Some("k")).await.unwrap();
    assert!(!created);
    assert_eq!(again.id, job.id, "idempotency survives a restart");
    let nodes = alice.list_nodes(&[]).await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].gpus.len(), 4);
    assert!(!nodes[0].connected);
    s2.teardown().await;
}

#[tokio::test]
async fn tls_when_certificates_are_configured() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let (ca, crt, key) = (p("ca.crt"), p("s.crt"), p("s.key"));
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("openssl is installed");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    // A CA, and a server certificate for localhost signed by it.
    openssl(
        &[
            &["req", "-x509"],
            &ec[..],
            &[
                "-days",
                "1",
                "-subj",
                "/CN=fmsched test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"],
            &ec[..],
            &[
                "-subj",
                "/CN=localhost",
                "-keyout",
                "s.key",
                "-out",
                "s.csr",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        p("ext.cnf"),
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "s.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "s.crt",
    ]);
    let db = create_db().await;
    let (c2, k2) = (crt.clone(), key.clone());
    let s = TestScheduler::start_with(db, None, move |cfg| {
        cfg.tls.cert_path = Some(c2);
        cfg.tls.key_path = Some(k2);
    })
    .await;
    let endpoint = format!("https://localhost:{}", s.addr.port());
    let mut client = None;
    for _ in 0..100 {
        match fmctl::Client::connect(fmctl::ClientConfig {
            endpoint: endpoint.clone(),
            token: Some(ALICE.into()),
            ca_cert: Some(ca.clone()),
            ..Default::default()
        })
        .await
        {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(e) => {
                eprintln!("tls connect: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await
            }
        }
    }
    let client = client.expect("TLS client connects with the CA certificate");
    let (job, _) = client.submit(&spec(), None).await.unwrap();
    assert_eq!(client.get_job(&job.id).await.unwrap().id, job.id);
    // A plaintext client cannot talk to the TLS server.
    let plain = fmctl::Client::connect(fmctl::ClientConfig {
        endpoint: format!("http://127.0.0.1:{}", s.addr.port()),
        token: Some(ALICE.into()),
        ..Default::default()
    })
    .await;
    match plain {
        Err(_) => {}
        Ok(c) => assert!(c.list_jobs(&Default::default()).await.is_err()),
    }
    s.teardown().await;
}

/// Bytes sent as they are, for requests no client library would make.
#[derive(Default)]
struct RawBytes;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        buf.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = pb::SubmitJobResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<pb::SubmitJobResponse>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// A request that is not protobuf of its method's type, or that carries a
/// string that is not UTF-8, is the caller's error: INVALID_ARGUMENT (not
/// INTERNAL, which a client would retry), and nothing is written.
#[tokio::test]
async fn garbage_and_invalid_utf8_over_raw_grpc_are_invalid_arguments() {
    use prost::Message;
    let s = TestScheduler::start().await;
    let mut valid = pb::SubmitJobRequest {
        spec: Some(job_spec_to_proto(&spec())),
        ..Default::default()
    };
    valid.spec.as_mut().unwrap().name = "zzzzzzzz".into();
    let bytes = valid.encode_to_vec();
    let at = bytes
        .windows(8)
        .position(|w| w == b"zzzzzzzz")
        .expect("the name is in the message");
    let mut not_utf8 = bytes.clone();
    not_utf8[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
    for (what, body) in [
        ("garbage", vec![0xff; 24]),
        ("a truncated message", bytes[..bytes.len() / 2].to_vec()),
        ("a name that is not UTF-8", not_utf8),
    ] {
        let mut grpc = tonic::client::Grpc::new(s.channel().await);
        grpc.ready().await.unwrap();
        let mut req = tonic::Request::new(body);
        req.metadata_mut()
            .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/fmsched.v1.JobService/SubmitJob",
        );
        let e = grpc.unary(req, path, RawBytes).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains("does not decode"), "{what}: {e:?}");
    }
    let alice = s.client(ALICE).await.unwrap();
    let (jobs, _) = alice.list_jobs(&Default::default()).await.unwrap();
    assert!(jobs.is_empty(), "nothing was written: {jobs:?}");
    s.teardown().await;
}
