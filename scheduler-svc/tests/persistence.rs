//! Persistence suite on the real Postgres; `#[sqlx::test]` gives every test
//! its own freshly migrated database.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fmsched_core::{GpuUuid, JobId, JobState, NodeId, NodeState, UserName};
use scheduler_svc::persistence::{
    Assignment, GpuRecord, JobQuery, NewJob, NodeRecord, Persistence, PersistenceError,
    ServiceUpdate, SubmitOutcome,
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
    p.register_node(&node("a", &[("G0", 0), ("G1", 1)]), t(0))
        .await
        .unwrap();
    p.register_node(&node("b", &[("G2", 0)]), t(0))
        .await
        .unwrap();
    // Node a comes back with one GPU swapped, and G2 moved over from b.
    p.register_node(&node("a", &[("G0", 0), ("G3", 1), ("G2", 2)]), t(5))
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
    p.set_node_state(&id, NodeState::Suspect, t(6), t(10))
        .await
        .unwrap();
    p.set_node_state(&id, NodeState::Offline, t(6), t(20))
        .await
        .unwrap();
    let a = p.list_nodes().await.unwrap().remove(0);
    assert_eq!(a.state, NodeState::Offline);
    assert_eq!(a.last_heartbeat_at, t(6));
    p.register_node(&node("a", &[("G0", 0)]), t(30))
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
        p.set_node_state(&missing, NodeState::Offline, t(0), t(1))
            .await,
        Err(PersistenceError::NotFound(_))
    ));
}

#[sqlx::test(migrator = "scheduler_svc::persistence::MIGRATOR")]
async fn duplicate_gpu_index_is_a_conflict_and_writes_nothing(pool: PgPool) {
    let p = Persistence::from_pool(pool);
    let e = p
        .register_node(&node("a", &[("G0", 0), ("G1", 0)]), t(0))
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
    };
    let share = |jobs: &[(JobId, f64)], leases: &[(JobId, i64)]| ServiceUpdate {
        fair_share_gpus: jobs.to_vec(),
        leases: leases.iter().map(|&(j, s)| (j, t(s))).collect(),
    };
    // The first plan: nothing held before it.
    p.store_plan(
        &[on(j1, &["G0", "G1"], false)],
        &[],
        &[],
        &share(&[(j1, 2.0), (j2, 2.0)], &[(j1, 600)]),
        t(0),
    )
    .await
    .unwrap();
    assert_eq!(p.service().await.unwrap()[&j1].attained_gpu_s, 0.0);
    assert_eq!(p.service().await.unwrap()[&j1].lease_until, Some(t(600)));
    // 100 s later: j1 held 2 GPUs all along; j2 profiles now.
    p.store_plan(
        &[on(j1, &["G0", "G1"], false), on(j2, &["G2"], true)],
        &[],
        &[],
        &share(&[(j1, 1.5), (j2, 1.5)], &[(j1, 600)]),
        t(100),
    )
    .await
    .unwrap();
    let j3 = created(submit(&p, "u", None, 130).await).id;
    // 60 s later: j2's profiling counts nothing; j3 deserves 30 s only.
    p.store_plan(
        &[],
        &[],
        &[],
        &share(&[(j1, 1.0), (j2, 1.0), (j3, 1.0)], &[]),
        t(160),
    )
    .await
    .unwrap();
    let s = p.service().await.unwrap();
    assert_eq!(s[&j1].attained_gpu_s, 2.0 * 160.0);
    assert_eq!(s[&j1].executed_s, 160.0);
    assert_eq!(s[&j1].fair_share_gpu_s, 1.5 * 100.0 + 1.0 * 60.0);
    assert_eq!(s[&j1].lease_until, None, "the empty plan ends every lease");
    assert_eq!(s[&j2].attained_gpu_s, 0.0, "profiling is not service");
    assert_eq!(s[&j2].fair_share_gpu_s, 1.5 * 100.0 + 1.0 * 60.0);
    assert_eq!(s[&j3].fair_share_gpu_s, 30.0);
    // A clock that goes back adds nothing.
    p.store_plan(
        &[on(j1, &["G0"], false)],
        &[],
        &[],
        &share(&[(j1, 4.0)], &[]),
        t(150),
    )
    .await
    .unwrap();
    assert_eq!(p.service().await.unwrap()[&j1].fair_share_gpu_s, 210.0);
}
