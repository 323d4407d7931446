//! Persistence suite on the real Postgres; `#[sqlx::test]` gives every test
//! its own freshly migrated database.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fmsched_core::{GpuUuid, JobId, JobState, NodeId, NodeState, UserName};
use scheduler_svc::persistence::{
    Assignment, BankPrompt, Fence, GpuRecord, JobQuery, JobSchedule, LeaderLease, NewJob,
    NodeRecord, Persistence, PersistenceError, RoundWrites, ServiceUpdate, SubmitOutcome,
};
use sqlx::PgPool;

fn t(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
}

fn spec() -> fmsched_core::JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": "n", "model": "roberta-base",
        "dataset": {"uri": "s3://d", "task": "qqp"},
        "hyperparameters": {"global_batch_size": 8, "learning_rate": 0.1},
        "target": {"max_iterations": 10},
        "resources": {"min_gpus": 1, "max_gpus": 1},
        "launch": {"command": ["true"]}
    }))
    .unwrap()
}

async fn submit(p: &Persistence, owner: &str, key: Option<&str>, at: i64) -> SubmitOutcome {
    let owner = UserName(owner.into());
    let s = spec();
    p.submit_job(NewJob {
        id: JobId::new_v7(),
        owner: &owner,
        spec: &s,
        idempotency_key: key,
        now: t(at),
    })
    .await
    .unwrap()
}

/// Submits `s` for `owner` at `t(at)`, without an idempotency key.
async fn submit_spec(
    p: &Persistence,
    owner: &UserName,
    s: &fmsched_core::JobSpec,
    at: i64,
) -> JobId {
    let id = JobId::new_v7();
    p.submit_job(NewJob {
        id,
        owner,
        spec: s,
        idempotency_key: None,
        now: t(at),
    })
    .await
    .unwrap();
    id
}

fn created(o: SubmitOutcome) -> scheduler_svc::persistence::JobRecord {
    match o {
        SubmitOutcome::Created(j) => j,
        SubmitOutcome::Existing(j) => panic!("expected a new job, got existing {}", j.id),
    }
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn submitted_job_reads_back_with_its_event(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let j = created(submit(&p, "alice", None, 0).await);
    let got = p.get_job(j.id).await.unwrap().unwrap();
    assert_eq!(got, j);
    let ev = p.job_events(j.id, 0, 10).await.unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, "submitted");
    assert_eq!(ev[0].seq, j.last_event_seq);
    assert_eq!(ev[0].to_state, Some(JobState::Submitted));
    assert!(p.get_job(JobId::new_v7()).await.unwrap().is_none());
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn idempotency_key_is_per_owner(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let a = created(submit(&p, "alice", Some("k"), 0).await);
    match submit(&p, "alice", Some("k"), 1).await {
        SubmitOutcome::Existing(e) => assert_eq!(e.id, a.id),
        SubmitOutcome::Created(_) => panic!("duplicate key created a second job"),
    }
    created(submit(&p, "bob", Some("k"), 2).await);
    // Jobs without a key never collide.
    created(submit(&p, "alice", None, 3).await);
    created(submit(&p, "alice", None, 4).await);
    assert_eq!(
        p.list_jobs(&JobQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .len(),
        4
    );
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn transitions_follow_the_state_machine_and_append_events(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let j = created(submit(&p, "alice", None, 0).await);
    for (to, at) in [
        (JobState::Profiling, 1),
        (JobState::Queued, 2),
        (JobState::Running, 3),
        (JobState::Queued, 4),
    ] {
        let r = p.transition_job(j.id, to, "test", t(at)).await.unwrap();
        assert_eq!(r.state, to);
        assert_eq!(r.updated_at, t(at));
    }
    // Same state: a no-op, no new event.
    let before = p.job_events(j.id, 0, 100).await.unwrap().len();
    p.transition_job(j.id, JobState::Queued, "again", t(5))
        .await
        .unwrap();
    assert_eq!(p.job_events(j.id, 0, 100).await.unwrap().len(), before);
    // Illegal edge.
    let e = p
        .transition_job(j.id, JobState::Submitted, "", t(6))
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        PersistenceError::InvalidTransition {
            from: JobState::Queued,
            to: JobState::Submitted,
            ..
        }
    ));
    p.transition_job(j.id, JobState::Cancelled, "bye", t(7))
        .await
        .unwrap();
    let e = p
        .transition_job(j.id, JobState::Running, "", t(8))
        .await
        .unwrap_err();
    assert!(
        matches!(e, PersistenceError::InvalidTransition { .. }),
        "terminal states are final"
    );

    let ev = p.job_events(j.id, 0, 100).await.unwrap();
    let path: Vec<_> = ev.iter().map(|e| e.to_state.unwrap()).collect();
    assert_eq!(
        path,
        vec![
            JobState::Submitted,
            JobState::Profiling,
            JobState::Queued,
            JobState::Running,
            JobState::Queued,
            JobState::Cancelled
        ]
    );
    assert!(ev.windows(2).all(|w| w[0].seq < w[1].seq));
    let last = p.get_job(j.id).await.unwrap().unwrap();
    assert_eq!(last.last_event_seq, ev.last().unwrap().seq);
    assert_eq!(last.state_reason, "bye");
    // Paging through events.
    let tail = p.job_events(j.id, ev[2].seq, 100).await.unwrap();
    assert_eq!(tail.len(), ev.len() - 3);
    let e = p
        .transition_job(JobId::new_v7(), JobState::Cancelled, "", t(9))
        .await
        .unwrap_err();
    assert!(matches!(e, PersistenceError::NotFound(_)));
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn concurrent_transitions_serialise_on_the_row(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let j = created(submit(&p, "alice", None, 0).await);
    // Ten racing cancels: exactly one state change is recorded.
    let mut handles = Vec::new();
    for i in 0..10 {
        let p = p.clone();
        handles.push(tokio::spawn(async move {
            p.transition_job(j.id, JobState::Cancelled, "race", t(i))
                .await
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap().state, JobState::Cancelled);
    }
    let ev = p.job_events(j.id, 0, 100).await.unwrap();
    assert_eq!(ev.len(), 2, "{ev:?}");
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn list_filters_by_owner_state_and_pages(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let mut alice = Vec::new();
    for i in 0..5 {
        alice.push(created(submit(&p, "alice", None, i).await).id);
    }
    created(submit(&p, "bob", None, 10).await);
    p.transition_job(alice[1], JobState::Cancelled, "", t(20))
        .await
        .unwrap();

    let q = |owner: Option<&str>, states: Vec<JobState>, before: Option<JobId>, limit| JobQuery {
        owner: owner.map(|o| UserName(o.into())),
        states,
        before,
        limit,
    };
    assert_eq!(
        p.list_jobs(&q(Some("alice"), vec![], None, 100))
            .await
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        p.list_jobs(&q(None, vec![], None, 100))
            .await
            .unwrap()
            .len(),
        6
    );
    let c = p
        .list_jobs(&q(None, vec![JobState::Cancelled], None, 100))
        .await
        .unwrap();
    assert_eq!(c.iter().map(|j| j.id).collect::<Vec<_>>(), vec![alice[1]]);
    let page1 = p
        .list_jobs(&q(Some("alice"), vec![], None, 2))
        .await
        .unwrap();
    assert_eq!(
        page1.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![alice[4], alice[3]]
    );
    let page2 = p
        .list_jobs(&q(Some("alice"), vec![], Some(alice[3]), 2))
        .await
        .unwrap();
    assert_eq!(
        page2.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![alice[2], alice[1]]
    );
    let counts = p.job_counts_by_state().await.unwrap();
    assert_eq!(counts.get(&JobState::Submitted), Some(&5));
    assert_eq!(counts.get(&JobState::Cancelled), Some(&1));
}

fn node(id: &str, gpus: &[(&str, u32)]) -> NodeRecord {
    NodeRecord {
        id: NodeId::try_from(id.to_string()).unwrap(),
        hostname: format!("{id}.example"),
        address: String::new(),
        agent_version: "1.0".into(),
        gpu_backend: "fake".into(),
        labels: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
        state: NodeState::Available,
        registered_at: t(0),
        last_heartbeat_at: t(0),
        gpus: gpus
            .iter()
            .map(|(u, i)| GpuRecord {
                uuid: GpuUuid(u.to_string()),
                index: *i,
                model: "A100-80GB".into(),
                memory_total_bytes: 80 << 30,
                pci_bus_id: format!("0000:{i:02}:00.0"),
            })
            .collect(),
    }
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn node_registration_replaces_gpus_and_records_history(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    p.register_node(&node("a", &[("G0", 0), ("G1", 1)]), None, None, t(0))
        .await
        .unwrap();
    p.register_node(&node("b", &[("G2", 0)]), None, None, t(0))
        .await
        .unwrap();
    // Node a comes back with one GPU swapped, and G2 moved over from b.
    p.register_node(
        &node("a", &[("G0", 0), ("G3", 1), ("G2", 2)]),
        None,
        None,
        t(5),
    )
    .await
    .unwrap();
    let nodes = p.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    let a = &nodes[0];
    assert_eq!(a.id.as_str(), "a");
    assert_eq!(
        a.gpus.iter().map(|g| g.uuid.0.as_str()).collect::<Vec<_>>(),
        vec!["G0", "G3", "G2"]
    );
    assert_eq!(a.labels.get("rack").map(String::as_str), Some("r1"));
    assert!(nodes[1].gpus.is_empty(), "G2 moved to a");

    let id = NodeId::try_from("a".to_string()).unwrap();
    p.set_node_state(&id, NodeState::Suspect, t(6), None, t(10))
        .await
        .unwrap();
    p.set_node_state(&id, NodeState::Offline, t(6), None, t(20))
        .await
        .unwrap();
    let a = p.list_nodes().await.unwrap().remove(0);
    assert_eq!(a.state, NodeState::Offline);
    assert_eq!(a.last_heartbeat_at, t(6));
    p.register_node(&node("a", &[("G0", 0)]), None, None, t(30))
        .await
        .unwrap();
    let a = p.list_nodes().await.unwrap().remove(0);
    assert_eq!(a.state, NodeState::Available);
    let kinds: Vec<String> = p
        .node_event_kinds(&id)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, m)| format!("{k}:{}", m.split(' ').next().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            "registered:2",
            "registered:3",
            "state_changed:suspect",
            "state_changed:offline",
            "registered:1"
        ]
    );
    let missing = NodeId::try_from("zz".to_string()).unwrap();
    assert!(matches!(
        p.set_node_state(&missing, NodeState::Offline, t(0), None, t(1))
            .await,
        Err(PersistenceError::NotFound(_))
    ));
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn duplicate_gpu_index_is_a_conflict_and_writes_nothing(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let e = p
        .register_node(&node("a", &[("G0", 0), ("G1", 0)]), None, None, t(0))
        .await
        .unwrap_err();
    assert!(matches!(e, PersistenceError::Conflict(_)), "{e}");
    assert!(
        p.list_nodes().await.unwrap().is_empty(),
        "the transaction rolled back"
    );
}

/// Every stored plan adds the time since the previous one to the service of
/// the jobs that plan ran (GPU-seconds and seconds, not for profiling) and
/// to every live job's deserved share (only since it came); the new plan's
/// leases replace the old ones.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn stored_plans_account_service_and_leases(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    p.register_node(
        &node("a", &[("G0", 0), ("G1", 1), ("G2", 2), ("G3", 3)]),
        None,
        None,
        t(0),
    )
    .await
    .unwrap();
    let j1 = created(submit(&p, "u", None, 0).await).id;
    let j2 = created(submit(&p, "u", None, 0).await).id;
    let on = |job: JobId, gpus: &[&str], profile: bool| Assignment {
        job,
        node: NodeId::try_from("a".to_string()).unwrap(),
        gpus: gpus.iter().map(|g| GpuUuid(g.to_string())).collect(),
        profile,
        rank_offset: 0,
        master_port: None,
    };
    // Each leased job is predicted to finish 100 s after its lease, and
    // to be at risk when that is past 1000 s.
    let share = |jobs: &[(JobId, f64)], leases: &[(JobId, i64)]| ServiceUpdate {
        fair_share_gpus: jobs.to_vec(),
        leases: leases.iter().map(|&(j, s)| (j, t(s))).collect(),
        predictions: leases
            .iter()
            .map(|&(j, s)| (j, Some(t(s + 100)), s + 100 > 1000))
            .collect(),
        carry_over: false,
    };
    // The first plan: nothing held before it.
    plan(
        &p,
        vec![on(j1, &["G0", "G1"], false)],
        share(&[(j1, 2.0), (j2, 2.0)], &[(j1, 600)]),
        t(0),
    )
    .await;
    assert_eq!(p.service().await.unwrap()[&j1].attained_gpu_s, 0.0);
    assert_eq!(p.service().await.unwrap()[&j1].lease_until, Some(t(600)));
    let sched = p.job_schedules(&[j1, j2]).await.unwrap();
    assert_eq!(
        sched[&j1],
        JobSchedule {
            predicted_finish: Some(t(700)),
            at_risk: false,
            lease_until: Some(t(600)),
        }
    );
    assert!(!sched.contains_key(&j2), "nothing said of j2");
    // 50 s later the prompt lane adds a plan (carry-over): service accrues
    // by the last round's shares; the round's lease and prediction stay.
    let lane = |fair: &[(JobId, f64)]| ServiceUpdate {
        fair_share_gpus: fair.to_vec(),
        carry_over: true,
        ..Default::default()
    };
    plan(
        &p,
        vec![on(j1, &["G0", "G1"], false)],
        lane(&[(j1, 1.5), (j2, 1.5)]),
        t(50),
    )
    .await;
    assert_eq!(
        p.job_schedules(&[j1]).await.unwrap()[&j1],
        JobSchedule {
            predicted_finish: Some(t(700)),
            at_risk: false,
            lease_until: Some(t(600)),
        },
        "a lane commit keeps the round's lease and prediction"
    );
    // 50 s more: j1 held 2 GPUs all along; j2 profiles now.
    plan(
        &p,
        vec![on(j1, &["G0", "G1"], false), on(j2, &["G2"], true)],
        share(&[(j1, 1.5), (j2, 1.5)], &[(j1, 600)]),
        t(100),
    )
    .await;
    let j3 = created(submit(&p, "u", None, 130).await).id;
    // 60 s later: j2's profiling counts nothing; j3 deserves 30 s only.
    plan(
        &p,
        vec![],
        share(&[(j1, 1.0), (j2, 1.0), (j3, 1.0)], &[]),
        t(160),
    )
    .await;
    let s = p.service().await.unwrap();
    assert_eq!(s[&j1].attained_gpu_s, 2.0 * 160.0);
    assert_eq!(s[&j1].executed_s, 160.0);
    assert_eq!(s[&j1].fair_share_gpu_s, 1.5 * 100.0 + 1.0 * 60.0);
    assert_eq!(s[&j1].lease_until, None, "the empty plan ends every lease");
    assert_eq!(s[&j2].attained_gpu_s, 0.0, "profiling is not service");
    assert_eq!(s[&j2].fair_share_gpu_s, 1.5 * 100.0 + 1.0 * 60.0);
    assert_eq!(s[&j3].fair_share_gpu_s, 30.0);
    assert_eq!(
        p.job_schedules(&[j1]).await.unwrap()[&j1],
        JobSchedule::default(),
        "a plan that predicts nothing of j1 clears its prediction"
    );
    // A clock that goes back adds nothing.
    plan(
        &p,
        vec![on(j1, &["G0"], false)],
        share(&[(j1, 4.0)], &[]),
        t(150),
    )
    .await;
    assert_eq!(p.service().await.unwrap()[&j1].fair_share_gpu_s, 210.0);
}

/// A job over two nodes is stored as one assignment per node with its rank
/// offset and rendezvous port, read back in rank order, and its service
/// counts the GPUs of both parts once per second held.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn a_gang_is_stored_per_node_and_accounted_once(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    for (n, g) in [("a", ["A0", "A1"]), ("b", ["B0", "B1"])] {
        p.register_node(&node(n, &[(g[0], 0), (g[1], 1)]), None, None, t(0))
            .await
            .unwrap();
    }
    let j = created(submit(&p, "u", None, 0).await).id;
    let part = |n: &str, gpus: [&str; 2], rank_offset: u32| Assignment {
        job: j,
        node: NodeId::try_from(n.to_string()).unwrap(),
        gpus: gpus.iter().map(|g| GpuUuid(g.to_string())).collect(),
        profile: false,
        rank_offset,
        master_port: Some(29501),
    };
    let gang = vec![part("b", ["B0", "B1"], 2), part("a", ["A0", "A1"], 0)];
    let share = ServiceUpdate {
        fair_share_gpus: vec![(j, 4.0)],
        ..Default::default()
    };
    plan(&p, gang.clone(), share.clone(), t(0)).await;
    let stored = p.current_plan().await.unwrap().assignments;
    assert_eq!(stored, vec![gang[1].clone(), gang[0].clone()], "rank order");
    plan(&p, gang, share, t(10)).await;
    let s = p.service().await.unwrap();
    assert_eq!(s[&j].attained_gpu_s, 4.0 * 10.0, "both parts' GPUs");
    assert_eq!(s[&j].executed_s, 10.0, "seconds once, not per part");
}

/// Every node a live job was placed on is remembered after the plan moves
/// it (its suspension reports from there), and only live jobs are read.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn placements_remember_every_node_a_live_job_ran_on(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    for (n, g) in [("a", "A0"), ("b", "B0")] {
        p.register_node(&node(n, &[(g, 0)]), None, None, t(0))
            .await
            .unwrap();
    }
    let j = created(submit(&p, "u", None, 0).await).id;
    let k = created(submit(&p, "u", None, 0).await).id;
    let on = |job: JobId, n: &str, g: &str| Assignment {
        job,
        node: NodeId::try_from(n.to_string()).unwrap(),
        gpus: vec![GpuUuid(g.to_string())],
        profile: false,
        rank_offset: 0,
        master_port: None,
    };
    let none = ServiceUpdate::default();
    plan(&p, vec![on(j, "a", "A0")], none.clone(), t(0)).await;
    plan(
        &p,
        vec![on(j, "b", "B0"), on(k, "a", "A0")],
        none.clone(),
        t(10),
    )
    .await;
    plan(&p, vec![], none, t(20)).await;
    let placed = p.placements_of_live_jobs().await.unwrap();
    let names = |job: &JobId| -> Vec<&str> { placed[job].iter().map(|n| n.as_str()).collect() };
    assert_eq!(names(&j), ["a", "b"]);
    assert_eq!(names(&k), ["a"]);
    assert_eq!(placed.len(), 2);
}

/// Enrolment stores the token's hash and says so; enrolling again replaces
/// it (the old token is revoked) and says that.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn enrolment_keeps_the_token_hash_and_a_second_one_revokes_the_first(pool: PgPool) {
    let p = Persistence::from_pool(pool.clone());
    let id = NodeId::try_from("a".to_string()).unwrap();
    assert_eq!(
        p.node_token_sha256(&id).await.unwrap(),
        None,
        "unknown node"
    );
    p.register_node(&node("a", &[("G0", 0)]), None, None, t(0))
        .await
        .unwrap();
    assert_eq!(
        p.node_token_sha256(&id).await.unwrap(),
        None,
        "not enrolled"
    );
    p.register_node(&node("a", &[("G0", 0)]), Some("h1"), None, t(1))
        .await
        .unwrap();
    assert_eq!(
        p.node_token_sha256(&id).await.unwrap().as_deref(),
        Some("h1")
    );
    p.register_node(&node("a", &[("G0", 0)]), Some("h2"), None, t(2))
        .await
        .unwrap();
    assert_eq!(
        p.node_token_sha256(&id).await.unwrap().as_deref(),
        Some("h2")
    );
    p.register_node(&node("a", &[("G0", 0)]), None, None, t(3))
        .await
        .unwrap();
    assert_eq!(
        p.node_token_sha256(&id).await.unwrap().as_deref(),
        Some("h2"),
        "a registration with the node token keeps it"
    );
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM node_events WHERE node_id = 'a' AND kind = 'enrolled' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(events.len(), 2);
    assert!(events[0].contains("node token issued"), "{events:?}");
    assert!(events[1].contains("previous one revoked"), "{events:?}");
}

/// Takes the leader lease for `holder` (it must be free).
async fn lead(p: &Persistence, holder: &str, ttl_s: u64) -> (LeaderLease, Fence) {
    let lease = LeaderLease::new(p, holder.into(), std::time::Duration::from_secs(ttl_s));
    lease.refresh().await.unwrap().expect("the lease is free");
    let fence = lease.fence().unwrap();
    (lease, fence)
}

/// Commits a round that only replaces the plan (under a fresh lease).
async fn plan(
    p: &Persistence,
    assignments: Vec<Assignment>,
    service: ServiceUpdate,
    at: DateTime<Utc>,
) {
    let lease = LeaderLease::new(p, "test-leader".into(), std::time::Duration::from_secs(60));
    lease
        .refresh()
        .await
        .unwrap()
        .expect("the lease is free or ours");
    let generation = p.current_plan().await.unwrap().generation;
    let w = RoundWrites {
        assignments,
        service,
        ..Default::default()
    };
    p.commit_round(&lease.fence().unwrap(), generation, &w, at)
        .await
        .unwrap();
    lease.resign().await;
}

/// The lease: one holder at a time, renewals keep the epoch, a lapsed lease
/// is taken over under a larger epoch, and resigning frees it at once.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn the_leader_lease_has_one_holder_and_a_growing_epoch(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let (a, fa) = lead(&p, "a", 1).await;
    let b = LeaderLease::new(&p, "b".into(), std::time::Duration::from_secs(1));
    assert_eq!(b.refresh().await.unwrap(), None, "a holds it");
    assert!(b.fence().is_none());
    assert_eq!(
        a.refresh().await.unwrap(),
        Some(fa.epoch),
        "a renewal keeps the epoch"
    );
    // a stops renewing: after the lease b takes over with a larger epoch,
    // and a's local deadline has passed too.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert!(a.fence().is_none(), "a's own clock ended its term");
    let eb = b.refresh().await.unwrap().expect("lapsed: b takes over");
    assert!(eb > fa.epoch);
    assert_eq!(a.refresh().await.unwrap(), None, "a is deposed");
    // A restarted process of replica b (same name, no term of its own)
    // takes b's lease over at once, under a new term.
    let b2 = LeaderLease::new(&p, "b".into(), std::time::Duration::from_secs(60));
    let eb2 = b2.refresh().await.unwrap().expect("b's own lease");
    assert!(eb2 > eb);
    assert_eq!(
        b.refresh().await.unwrap(),
        None,
        "the old process of b is deposed"
    );
    b2.resign().await;
    assert!(b2.fence().is_none());
    let (_c, fc) = lead(&p, "c", 5).await;
    assert!(fc.epoch > eb2, "a resigned lease is free at once");
}

/// The Prompt Bank's rows: filed prompts are kept per model (oldest
/// first), evicted ones deleted (also one filed in the same round), and a
/// once-per-job event is written once.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn the_prompt_bank_keeps_filed_prompts_and_drops_evicted_ones(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let (_l, fence) = lead(&p, "l", 60).await;
    let mut ids = Vec::new();
    for k in 0..4 {
        ids.push(created(submit(&p, "u", None, k).await).id);
    }
    let prompt = |k: usize, model: &str| BankPrompt {
        job: ids[k],
        model: model.into(),
        location: format!("/out/{k}/prompt.json"),
        features: vec![k as f64, 1.0],
    };
    let note = |k: usize, m: &str| (ids[k], "prompt_bank".to_string(), m.to_string());
    let w = RoundWrites {
        bank_adds: vec![
            prompt(0, "gpt2"),
            prompt(1, "gpt2"),
            prompt(2, "llama-2-7b"),
        ],
        // Twice for one job in one commit: the first is written; one read
        // answers for every job.
        first_notes: vec![note(3, "from 0"), note(2, "two"), note(3, "again")],
        ..Default::default()
    };
    let g = p.commit_round(&fence, 0, &w, t(1)).await.unwrap();
    let w = RoundWrites {
        bank_adds: vec![prompt(3, "gpt2")],
        bank_evictions: vec![ids[0], ids[3]],
        first_notes: vec![note(3, "from 1")],
        ..Default::default()
    };
    p.commit_round(&fence, g, &w, t(2)).await.unwrap();
    let bank = p
        .prompt_bank(&["gpt2".into(), "llama-2-7b".into(), "t5".into()])
        .await
        .unwrap();
    assert_eq!(bank["gpt2"], vec![prompt(1, "gpt2")]);
    assert_eq!(bank["llama-2-7b"], vec![prompt(2, "llama-2-7b")]);
    assert!(!bank.contains_key("t5"));
    let ids_of = p.prompt_bank_ids(&["gpt2".into()]).await.unwrap();
    assert_eq!(
        ids_of["gpt2"].iter().copied().collect::<Vec<_>>(),
        vec![ids[1]]
    );
    let notes = async |k: usize| -> Vec<String> {
        p.job_events(ids[k], 0, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "prompt_bank")
            .map(|e| e.message)
            .collect()
    };
    assert_eq!(notes(3).await, vec!["from 0".to_string()], "written once");
    assert_eq!(notes(2).await, vec!["two".to_string()]);
}

/// A round commits only under the lease it started with and on the plan it
/// read: a deposed writer (or one whose plan moved on) writes nothing at
/// all — no plan, no state change, no progress.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn a_fenced_commit_by_a_stale_writer_writes_nothing(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    p.register_node(&node("a", &[("G0", 0)]), None, None, t(0))
        .await
        .unwrap();
    let j = created(submit(&p, "u", None, 0).await).id;
    let writes = RoundWrites {
        progress: vec![(j, 5, Some("/ckpt/5".into()))],
        transitions: vec![(j, JobState::Queued, "accepted".into())],
        assignments: vec![Assignment {
            job: j,
            node: NodeId::try_from("a".to_string()).unwrap(),
            gpus: vec![GpuUuid("G0".into())],
            profile: false,
            rank_offset: 0,
            master_port: None,
        }],
        utilization_fits: vec![(
            ("roberta-base".into(), "A100".into()),
            fmsched_estimator::footprint::UtilizationFit {
                sum_xy: 3.0,
                sum_xx: 2e-4,
                samples: 4,
            },
        )],
        bank_adds: vec![BankPrompt {
            job: j,
            model: "gpt2".into(),
            location: "/out/prompt.json".into(),
            features: vec![0.5, -0.5],
        }],
        ..Default::default()
    };
    let (old, stale) = lead(&p, "old", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let (_new, fresh) = lead(&p, "new", 60).await;
    assert!(old.fence().is_none());
    let e = p.commit_round(&stale, 0, &writes, t(1)).await.unwrap_err();
    assert!(matches!(e, PersistenceError::Fenced(_)), "{e}");
    assert!(
        e.to_string().contains("no longer holds the leader lease"),
        "{e}"
    );
    let nothing = |p: Persistence| async move {
        let plan = p.current_plan().await.unwrap();
        assert_eq!(plan.generation, 0);
        assert!(plan.assignments.is_empty());
        assert_eq!(
            p.get_job(j).await.unwrap().unwrap().state,
            JobState::Submitted
        );
        assert!(p.progress().await.unwrap().is_empty());
        assert!(p.utilization_fits().await.unwrap().is_empty());
        assert!(p.prompt_bank(&["gpt2".into()]).await.unwrap().is_empty());
    };
    nothing(p.clone()).await;
    // The leader's round reads generation 0; another write moves it on.
    assert_eq!(
        p.commit_round(&fresh, 0, &RoundWrites::default(), t(2))
            .await
            .unwrap(),
        1
    );
    let e = p.commit_round(&fresh, 0, &writes, t(3)).await.unwrap_err();
    assert!(e.to_string().contains("the plan moved on"), "{e}");
    assert!(p.current_plan().await.unwrap().assignments.is_empty());
    // On the plan it read, it commits everything at once.
    assert_eq!(p.commit_round(&fresh, 1, &writes, t(4)).await.unwrap(), 2);
    assert_eq!(p.current_plan().await.unwrap().assignments.len(), 1);
    assert_eq!(p.get_job(j).await.unwrap().unwrap().state, JobState::Queued);
    assert_eq!(p.progress().await.unwrap()[&j], (5, Some("/ckpt/5".into())));
    let fits = p.utilization_fits().await.unwrap();
    assert_eq!(
        fits.into_iter().collect::<Vec<_>>(),
        writes.utilization_fits
    );
    assert_eq!(
        p.prompt_bank(&["gpt2".into()]).await.unwrap()["gpt2"],
        writes.bank_adds
    );
    // Fenced node writes too.
    let e = p
        .set_node_state(
            &NodeId::try_from("a".to_string()).unwrap(),
            NodeState::Offline,
            t(0),
            Some(&stale),
            t(5),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, PersistenceError::Fenced(_)));
}

/// A job's metric curve is kept with its estimates; the finished curves of
/// a model's completed jobs with a metric target are the learned prior —
/// not a running job's, not another model's, not a job without a metric.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn estimate_prior_metric_curves_are_kept_and_finished_ones_read_back(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let with_metric = |model: &str| -> fmsched_core::JobSpec {
        let mut s = spec();
        s.model = model.into();
        s.target.metric = Some(fmsched_core::MetricTarget {
            name: "eval_accuracy".into(),
            value: 0.9,
            lower_is_better: false,
        });
        s
    };
    let owner = UserName("alice".into());
    let mut ids = Vec::new();
    for (k, s) in [
        with_metric("roberta-base"),
        with_metric("roberta-base"),
        with_metric("vit-base"),
        spec(),
    ]
    .iter()
    .enumerate()
    {
        ids.push(submit_spec(&p, &owner, s, k as i64).await);
    }
    let curve = |x: f64| vec![0.5 + x, 0.6 + x, 0.7 + x];
    let w = RoundWrites {
        estimates: ids
            .iter()
            .enumerate()
            .map(|(k, id)| {
                (
                    *id,
                    scheduler_svc::persistence::Estimate {
                        iterations: Some(100),
                        evals: curve(0.01 * k as f64),
                        ..Default::default()
                    },
                )
            })
            .collect(),
        ..Default::default()
    };
    let (lease, fence) = lead(&p, "leader", 60).await;
    let generation = p.current_plan().await.unwrap().generation;
    p.commit_round(&fence, generation, &w, t(10)).await.unwrap();
    lease.resign().await;
    assert_eq!(p.estimates().await.unwrap()[&ids[1]].evals, curve(0.01));
    // Job 0 completes, job 1 still runs, job 2 (vit-base) and 3 (no metric)
    // complete.
    for (k, id) in ids.iter().enumerate() {
        for (to, at) in [
            (JobState::Profiling, 11),
            (JobState::Queued, 12),
            (JobState::Running, 13),
        ] {
            p.transition_job(*id, to, "test", t(at)).await.unwrap();
        }
        if k != 1 {
            p.transition_job(*id, JobState::Completed, "done", t(14))
                .await
                .unwrap();
        }
    }
    let got = p
        .finished_metric_curves(&["roberta-base".into()], 100)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].evals, curve(0.0));
    assert_eq!(
        (
            got[0].model.as_str(),
            got[0].metric.as_str(),
            got[0].lower_is_better,
            got[0].target
        ),
        ("roberta-base", "eval_accuracy", false, 0.9)
    );
    let both = p
        .finished_metric_curves(&["roberta-base".into(), "vit-base".into()], 100)
        .await
        .unwrap();
    assert_eq!(both.len(), 2);
}

/// How a job started, as the metric prior tells finished jobs apart: B of
/// a temporal merge (a warm start too) or a member of a spatial merge,
/// split or not, is transferred; A of a temporal merge, a job never
/// merged, and a B restarted since from its pre-trained weights are not.
/// One rule for running jobs (`transferred_jobs`) and finished ones.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn estimate_prior_how_a_job_started_is_read_from_its_merges(pool: PgPool) {
    use fmsched_core::policy::MergeMode;
    use scheduler_svc::persistence::NewMerge;
    let p = Persistence::from_pool(pool);
    let owner = UserName("alice".into());
    let mut s = spec();
    s.target.metric = Some(fmsched_core::MetricTarget {
        name: "eval_accuracy".into(),
        value: 0.9,
        lower_is_better: false,
    });
    let mut ids = Vec::new();
    for k in 0..8 {
        ids.push(submit_spec(&p, &owner, &s, k).await);
    }
    let merge = |a: usize, b: usize, mode, warm| NewMerge {
        a: ids[a],
        b: ids[b],
        mode,
        gain_ab: 0.2,
        gain_ba: 0.1,
        warm,
    };
    let (lease, fence) = lead(&p, "leader", 60).await;
    // 0 ↦ 1 temporal; 2 ‖ 3 spatial; 4 ↦ 5 and 4 ↦ 6 warm starts, 6 then
    // restarted fresh; 7 alone.
    let w = RoundWrites {
        new_merges: vec![
            merge(0, 1, MergeMode::Temporal, false),
            merge(2, 3, MergeMode::Spatial, false),
            merge(4, 5, MergeMode::Temporal, true),
            merge(4, 6, MergeMode::Temporal, true),
        ],
        // Job k's curve ends at 0.7 + k / 100: its curve names it.
        estimates: ids
            .iter()
            .enumerate()
            .map(|(k, id)| {
                (
                    *id,
                    scheduler_svc::persistence::Estimate {
                        evals: vec![0.5, 0.6, 0.7 + k as f64 / 100.0],
                        ..Default::default()
                    },
                )
            })
            .collect(),
        ..Default::default()
    };
    let g = p.commit_round(&fence, 0, &w, t(10)).await.unwrap();
    let transferred = |set: &std::collections::BTreeSet<JobId>| -> Vec<usize> {
        (0..ids.len()).filter(|k| set.contains(&ids[*k])).collect()
    };
    let running = p.transferred_jobs(&ids).await.unwrap();
    assert_eq!(transferred(&running), vec![1, 2, 3, 5, 6]);
    // Only the jobs asked about are answered.
    let some = p.transferred_jobs(&ids[..2]).await.unwrap();
    assert_eq!(transferred(&some), vec![1]);
    let w = RoundWrites {
        fresh_starts: vec![ids[6]],
        ..Default::default()
    };
    p.commit_round(&fence, g, &w, t(11)).await.unwrap();
    lease.resign().await;
    let running = p.transferred_jobs(&ids).await.unwrap();
    assert_eq!(transferred(&running), vec![1, 2, 3, 5]);
    // Finished, the same: each curve says how its job started.
    for id in &ids {
        for (to, at) in [
            (JobState::Profiling, 12),
            (JobState::Queued, 13),
            (JobState::Running, 14),
            (JobState::Completed, 15),
        ] {
            p.transition_job(*id, to, "test", t(at)).await.unwrap();
        }
    }
    let got = p
        .finished_metric_curves(&[s.model.clone()], 100)
        .await
        .unwrap();
    assert_eq!(got.len(), 8, "{got:?}");
    let mut finished: Vec<usize> = got
        .iter()
        .filter(|c| c.transferred)
        .map(|c| ((c.evals[2] - 0.7) * 100.0).round() as usize)
        .collect();
    finished.sort_unstable();
    assert_eq!(finished, vec![1, 2, 3, 5]);
}

/// The loss prior's read: the fitted curves of a model's completed jobs,
/// newest first and at most `per_model` of each model, none under the
/// quality floor, none of a running job, none without a curve.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn estimate_prior_loss_curves_of_finished_jobs_read_back(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let owner = UserName("alice".into());
    // (model, curve quality or no curve, completes)
    let jobs = [
        ("roberta-base", Some(0.9), true),
        ("roberta-base", Some(0.3), true),
        ("roberta-base", Some(0.95), false),
        ("roberta-base", None, true),
        ("roberta-base", Some(0.8), true),
        ("roberta-base", Some(0.7), true),
        ("vit-base", Some(0.99), true),
    ];
    let mut ids = Vec::new();
    for (k, (model, _, _)) in jobs.iter().enumerate() {
        let mut s = spec();
        s.model = (*model).into();
        // Ids in submission order whatever the clock's resolution.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let id = JobId::new_v7();
        p.submit_job(NewJob {
            id,
            owner: &owner,
            spec: &s,
            idempotency_key: None,
            now: t(k as i64),
        })
        .await
        .unwrap();
        ids.push(id);
    }
    let curve = |k: usize, q: f64| serde_json::json!({"beta0": 0.1 * k as f64, "beta1": 1.0, "beta2": 0.01, "beta3": 0.0, "quality": q});
    let w = RoundWrites {
        estimates: ids
            .iter()
            .zip(&jobs)
            .enumerate()
            .map(|(k, (id, (_, q, _)))| {
                (
                    *id,
                    scheduler_svc::persistence::Estimate {
                        iterations: Some(100),
                        curve: q.map(|q| curve(k, q)),
                        ..Default::default()
                    },
                )
            })
            .collect(),
        ..Default::default()
    };
    let (lease, fence) = lead(&p, "leader", 60).await;
    let generation = p.current_plan().await.unwrap().generation;
    p.commit_round(&fence, generation, &w, t(10)).await.unwrap();
    lease.resign().await;
    for (id, (_, _, completes)) in ids.iter().zip(&jobs) {
        for (to, at) in [
            (JobState::Profiling, 11),
            (JobState::Queued, 12),
            (JobState::Running, 13),
        ] {
            p.transition_job(*id, to, "test", t(at)).await.unwrap();
        }
        if *completes {
            p.transition_job(*id, JobState::Completed, "done", t(14))
                .await
                .unwrap();
        }
    }
    let beta0 = |v: &serde_json::Value| (v["beta0"].as_f64().unwrap() * 10.0).round() as usize;
    let got = p
        .finished_loss_curves("roberta-base", 10, 0.5)
        .await
        .unwrap();
    let mut which: Vec<usize> = got.iter().map(beta0).collect();
    which.sort_unstable();
    // Jobs 0, 4 and 5: job 1's fit is too poor, job 2 still runs, job 3
    // has no curve, job 6 is another model.
    assert_eq!(which, vec![0, 4, 5], "{got:?}");
    // At most two per model: the newest (ids are time-ordered).
    let mut which: Vec<(String, usize)> = Vec::new();
    for model in ["roberta-base", "vit-base"] {
        for c in p.finished_loss_curves(model, 2, 0.5).await.unwrap() {
            which.push((model.to_string(), beta0(&c)));
        }
    }
    which.sort();
    assert_eq!(
        which,
        vec![
            ("roberta-base".into(), 4),
            ("roberta-base".into(), 5),
            ("vit-base".into(), 6)
        ]
    );
}

/// A round's moves and notes are written in batches, with the rules of one
/// at a time: a job moved twice in a round goes through both states, each
/// with its event in order; a move its state forbids and an unknown job
/// are skipped; a note repeating the job's newest event is not written
/// again (also inside one round); `last_event_seq` is the newest event's.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn a_rounds_moves_and_notes_keep_their_order_and_rules(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let (_l, fence) = lead(&p, "l", 60).await;
    let mut ids = Vec::new();
    for k in 0..3 {
        ids.push(created(submit(&p, "u", None, k).await).id);
    }
    let mv = |k: usize, to: JobState, why: &str| (ids[k], to, why.to_string());
    let note = |k: usize, kind: &str, m: &str| (ids[k], kind.to_string(), m.to_string());
    let w = RoundWrites {
        transitions: vec![
            mv(0, JobState::Queued, "profiled"),
            mv(1, JobState::Completed, "not from submitted"),
            (JobId::new_v7(), JobState::Queued, "no such job".into()),
            mv(0, JobState::Running, "placed"),
            mv(2, JobState::Queued, "profiled"),
            mv(2, JobState::Queued, "already"),
        ],
        notes: vec![
            note(2, "unschedulable", "too wide"),
            note(2, "unschedulable", "too wide"),
            note(1, "waiting", "for GPUs"),
        ],
        ..Default::default()
    };
    let g = p.commit_round(&fence, 0, &w, t(1)).await.unwrap();
    let history = async |k: usize| -> Vec<(String, Option<JobState>, String)> {
        p.job_events(ids[k], 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.kind, e.to_state, e.message))
            .collect()
    };
    let ev = |kind: &str, to: Option<JobState>, m: &str| (kind.to_string(), to, m.to_string());
    let submitted = ev("submitted", Some(JobState::Submitted), "job submitted");
    assert_eq!(
        history(0).await,
        vec![
            submitted.clone(),
            ev("state_changed", Some(JobState::Queued), "profiled"),
            ev("state_changed", Some(JobState::Running), "placed"),
        ]
    );
    assert_eq!(
        history(1).await,
        vec![submitted.clone(), ev("waiting", None, "for GPUs")],
        "a forbidden move is skipped"
    );
    assert_eq!(
        history(2).await,
        vec![
            submitted.clone(),
            ev("state_changed", Some(JobState::Queued), "profiled"),
            ev("unschedulable", None, "too wide"),
        ]
    );
    let state = async |k: usize| p.get_job(ids[k]).await.unwrap().unwrap();
    assert_eq!(state(0).await.state, JobState::Running);
    assert_eq!(state(0).await.state_reason, "placed");
    assert_eq!(state(1).await.state, JobState::Submitted);
    for id in &ids {
        let newest = p.job_events(*id, 0, 100).await.unwrap();
        let job = p.get_job(*id).await.unwrap().unwrap();
        assert_eq!(job.last_event_seq, newest.last().unwrap().seq);
    }
    // The next round: the same note is not repeated; a new one is. Its
    // estimates, also written in one statement, read back exactly; a job
    // estimated twice keeps the last.
    let first = scheduler_svc::persistence::Estimate {
        iterations: Some(7),
        ..Default::default()
    };
    let last = scheduler_svc::persistence::Estimate {
        iterations: None,
        curve: Some(serde_json::json!({"beta0": 0.1, "quality": "fit"})),
        fisher: vec![1e-13, 0.1, -2.5e300, f64::MIN_POSITIVE],
        fisher_repeat: vec![],
        step_time_s: Some(0.123_456_789_012_345_67),
        note: "a 'quoted', {braced} note".into(),
        evals: vec![0.5, 1.0 / 3.0],
        spread: 0.25,
    };
    let other = scheduler_svc::persistence::Estimate {
        iterations: Some(u64::MAX),
        fisher: vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
        ..Default::default()
    };
    let w = RoundWrites {
        notes: vec![
            note(2, "unschedulable", "too wide"),
            note(1, "waiting", "still"),
        ],
        estimates: vec![(ids[0], first), (ids[1], other), (ids[0], last.clone())],
        ..Default::default()
    };
    p.commit_round(&fence, g, &w, t(2)).await.unwrap();
    let stored = p.estimates().await.unwrap();
    assert_eq!(stored[&ids[0]], last);
    let other = &stored[&ids[1]];
    assert_eq!(other.iterations, Some(i64::MAX as u64));
    assert!(other.fisher[0].is_nan());
    assert_eq!(other.fisher[1..], [f64::INFINITY, f64::NEG_INFINITY]);
    assert_eq!(history(2).await.len(), 3);
    assert_eq!(history(1).await.last(), Some(&ev("waiting", None, "still")));
}

/// A fresh start resets the job's progress and checkpoint after the
/// round's own progress reports, under the commit's plan generation,
/// pending until the fresh process is seen; a later round's reports count
/// again from 0.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn tail_a_fresh_start_resets_progress_under_its_plan_generation(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let (_l, fence) = lead(&p, "l", 60).await;
    let b = created(submit(&p, "u", None, 0).await).id;
    let w = RoundWrites {
        progress: vec![(b, 50, Some("/ckpt/50".into()))],
        ..Default::default()
    };
    let g = p.commit_round(&fence, 0, &w, t(1)).await.unwrap();
    assert_eq!(
        p.progress().await.unwrap()[&b],
        (50, Some("/ckpt/50".into()))
    );
    assert!(p.fresh_starts().await.unwrap().is_empty());
    // The round that restarts it also took in its last report.
    let w = RoundWrites {
        progress: vec![(b, 60, Some("/ckpt/60".into()))],
        fresh_starts: vec![b],
        ..Default::default()
    };
    let g2 = p.commit_round(&fence, g, &w, t(2)).await.unwrap();
    assert_eq!(p.progress().await.unwrap()[&b], (0, None));
    let f = p.fresh_starts().await.unwrap()[&b];
    assert_eq!((f.generation, f.pending), (g2, true));
    let w = RoundWrites {
        progress: vec![(b, 5, None)],
        fresh_seen: vec![b],
        ..Default::default()
    };
    p.commit_round(&fence, g2, &w, t(3)).await.unwrap();
    assert_eq!(p.progress().await.unwrap()[&b].0, 5);
    let f = p.fresh_starts().await.unwrap()[&b];
    assert_eq!((f.generation, f.pending), (g2, false));
}

/// Two submitted jobs and a temporal merge of them (predicted gain 0.3),
/// committed by the first round: (A, B, the plan generation).
async fn temporal_merge_committed(p: &Persistence, fence: &Fence) -> (JobId, JobId, i64) {
    use fmsched_core::policy::MergeMode;
    use scheduler_svc::persistence::NewMerge;
    let a = created(submit(p, "u", None, 0).await).id;
    let b = created(submit(p, "u", None, 1).await).id;
    let w = RoundWrites {
        new_merges: vec![NewMerge {
            a,
            b,
            mode: MergeMode::Temporal,
            gain_ab: 0.3,
            gain_ba: 0.0,
            warm: false,
        }],
        ..Default::default()
    };
    (a, b, p.commit_round(fence, 0, &w, t(1)).await.unwrap())
}

/// A merge's measured transfer gain is read back with it (the round plans
/// B of a warm start on it, `inputs::job_inputs`): none until measured.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn tail_a_merges_measured_gain_is_read_back(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let (_l, fence) = lead(&p, "l", 60).await;
    let (_, _, g) = temporal_merge_committed(&p, &fence).await;
    let merges = p.merges_of_live_jobs().await.unwrap();
    assert_eq!(merges[0].observed_gain, None);
    let w = RoundWrites {
        observed_gains: vec![(merges[0].id, -0.25)],
        ..Default::default()
    };
    p.commit_round(&fence, g, &w, t(2)).await.unwrap();
    assert_eq!(
        p.merges_of_live_jobs().await.unwrap()[0].observed_gain,
        Some(-0.25)
    );
}

/// Issue "Ymir's core, sharper", the tail: a kept temporal merge the round
/// releases (`RoundOutcome::released`: B would finish sooner alone) is
/// split with the round's reason, and both jobs' histories say so; a
/// second release of a split merge writes nothing.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn tail_a_released_merge_is_split_with_the_rounds_reason(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let (_l, fence) = lead(&p, "l", 60).await;
    let (a, b, g) = temporal_merge_committed(&p, &fence).await;
    let merges = p.merges_of_live_jobs().await.unwrap();
    assert_eq!(merges.len(), 1);
    assert!(merges[0].active);
    let why = "its second job would finish sooner alone";
    let w = RoundWrites {
        released: vec![(merges[0].clone(), why.into())],
        ..Default::default()
    };
    let g = p.commit_round(&fence, g, &w, t(2)).await.unwrap();
    assert!(!p.merges_of_live_jobs().await.unwrap()[0].active, "split");
    let splits = async |job: JobId| -> Vec<String> {
        p.job_events(job, 0, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "merge_split")
            .map(|e| e.message)
            .collect()
    };
    let said = format!("merge {} split by the round: {why}", merges[0].id);
    assert_eq!(splits(a).await, vec![said.clone()]);
    assert_eq!(splits(b).await, vec![said]);
    p.commit_round(&fence, g, &w, t(3)).await.unwrap();
    assert_eq!(splits(a).await.len(), 1, "a split merge is split once");
}

/// Warm starts: a finished job may be the A of several (each new job
/// starts from its output weights), beside a merge of its own; a job's own
/// merges stay one per job as A and as B. Both histories name the start.
#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn tail_a_finished_job_may_be_the_source_of_several_warm_starts(pool: PgPool) {
    use fmsched_core::policy::MergeMode;
    use scheduler_svc::persistence::NewMerge;
    let p = Persistence::from_pool(pool);
    let (_l, fence) = lead(&p, "l", 60).await;
    let ids: Vec<JobId> = {
        let mut v = Vec::new();
        for k in 0..4 {
            v.push(created(submit(&p, "u", None, k).await).id);
        }
        v
    };
    let merge = |a: JobId, b: JobId, warm: bool| NewMerge {
        a,
        b,
        mode: MergeMode::Temporal,
        gain_ab: 0.2,
        gain_ba: 0.0,
        warm,
    };
    let w = RoundWrites {
        new_merges: vec![
            merge(ids[0], ids[1], false),
            merge(ids[0], ids[2], true),
            merge(ids[0], ids[3], true),
        ],
        ..Default::default()
    };
    let g = p.commit_round(&fence, 0, &w, t(1)).await.unwrap();
    let merges = p.merges_of_live_jobs().await.unwrap();
    assert_eq!(merges.len(), 3);
    assert!(merges.iter().all(|m| m.a == ids[0]));
    let said: Vec<String> = p
        .job_events(ids[2], 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "merged")
        .map(|e| e.message)
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("warm start: "), "{said:?}");
    // A second merge of its own as A, or any second one as B, is refused.
    for (a, b) in [(ids[0], ids[3]), (ids[1], ids[2])] {
        let w = RoundWrites {
            new_merges: vec![merge(a, b, false)],
            ..Default::default()
        };
        assert!(p.commit_round(&fence, g, &w, t(2)).await.is_err());
    }
    assert_eq!(
        p.merges_of_live_jobs().await.unwrap().len(),
        3,
        "nothing written"
    );
}
