//! The agent's reconciler with the FAKE GPU backend and the FAKE trainer:
//! plans start processes, a move to other GPUs checkpoints and resumes
//! there, a task left out of the plan is suspended, and a later plan resumes
//! it from the checkpoint this node took. Telemetry follows the processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fmsched_integration::fake_trainer_task as desired;
use fmsched_proto::v1 as pb;
use node_agent::driver::{DriverConfig, ProcessDriver};
use node_agent::gpu::GpuBackend;
use node_agent::gpu::fake::FakeGpuBackend;
use node_agent::reconcile::Reconciler;

async fn observed(r: &Reconciler, id: &str) -> Option<pb::ObservedTask> {
    r.observed().await.into_iter().find(|t| t.task_id == id)
}

async fn wait_iteration(r: &Reconciler, id: &str, at_least: u64) -> pb::ObservedTask {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(t) = observed(r, id).await
            && t.iteration >= at_least
            && t.phase == pb::TaskPhase::Running as i32
        {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} never reached iteration {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn plans_move_suspend_and_resume_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let gpus = Arc::new(FakeGpuBackend::new("node-r", 2, "A100-80GB").unwrap());
    let uuids: Vec<String> = gpus.inventory().iter().map(|g| g.uuid.clone()).collect();
    let driver = Arc::new(ProcessDriver::new(DriverConfig {
        work_dir: tmp.path().to_path_buf(),
        checkpoint_timeout: Duration::from_secs(2),
        grace: Duration::from_secs(2),
        checkpoint_interval: Duration::from_secs(3600),
    }));
    let backend: Arc<dyn GpuBackend> = gpus.clone();
    let r = Reconciler::new(driver, backend);

    // Generation 1: run on GPU 0; telemetry follows the process.
    let plan = |generation, tasks| pb::NodePlan { generation, tasks };
    let t0 = Instant::now();
    assert!(
        r.apply(&plan(1, vec![desired("job-1", &uuids[0])]))
            .await
            .is_empty()
    );
    eprintln!("plan to process running: {:?}", t0.elapsed());
    let first = wait_iteration(&r, "job-1", 50).await;
    assert_eq!(first.gpu_uuids, vec![uuids[0].clone()]);
    let tel = gpus.sample();
    assert!(
        tel[0].utilization_percent > 50 && tel[1].utilization_percent < 10,
        "{tel:?}"
    );
    // The same plan again changes nothing.
    let pid = first.pid;
    r.apply(&plan(1, vec![desired("job-1", &uuids[0])])).await;
    assert_eq!(
        observed(&r, "job-1").await.unwrap().pid,
        pid,
        "a repeated plan restarts nothing"
    );

    // Generation 2: moved to GPU 1 → checkpoint, resume there.
    let before = observed(&r, "job-1").await.unwrap().iteration;
    assert!(
        r.apply(&plan(2, vec![desired("job-1", &uuids[1])]))
            .await
            .is_empty()
    );
    let moved = wait_iteration(&r, "job-1", before).await;
    assert_ne!(moved.pid, pid, "a new process");
    assert_eq!(moved.gpu_uuids, vec![uuids[1].clone()]);
    assert!(
        moved.iteration >= before,
        "progress kept: {} vs {before}",
        moved.iteration
    );

    // Generation 3: absent → suspended with a checkpoint.
    r.apply(&plan(3, vec![])).await;
    let s = observed(&r, "job-1").await.unwrap();
    assert_eq!(s.phase, pb::TaskPhase::Suspended as i32);
    assert!(!s.checkpoint_path.is_empty());
    let stopped_at = s.iteration;

    // Generation 4: running again, no resume path in the plan → the node's own checkpoint.
    r.apply(&plan(4, vec![desired("job-1", &uuids[0])])).await;
    let resumed = wait_iteration(&r, "job-1", stopped_at).await;
    assert!(resumed.iteration >= stopped_at);

    // A plan naming a GPU this node does not have is refused for that task.
    let problems = r
        .apply(&plan(
            5,
            vec![desired("job-1", &uuids[0]), desired("job-2", "GPU-nope")],
        ))
        .await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("job-2") && problems[0].contains("GPU-nope"));
    r.apply(&plan(6, vec![])).await;
}
