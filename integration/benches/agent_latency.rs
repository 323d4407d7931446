//! Agent-side latency of plans, with the FAKE GPU backend and the FAKE
//! trainer (real processes, real checkpoints):
//!
//! - plan → process spawned: `Reconciler::apply` of a plan that starts a
//!   task, until the process exists;
//! - plan → first report: until the trainer's first progress report;
//! - suspend: a plan without the task, until its checkpoint is written and
//!   the process has exited;
//! - suspend → resumed: from the suspending plan to the first progress
//!   report of the process resumed from that checkpoint (it pays the fake
//!   trainer's data-loader start-up, 2 simulated seconds);
//! - standby → reporting: the same resume when a `PrepareSwitch` hint
//!   started the process in standby beforehand (Ymir §6.2): from the plan
//!   to its first progress report, the loader already prepared.
//! - gang start: one job over two nodes (two reconcilers, 4 GPUs each), the
//!   plan applied on both at once, until the part of rank 0 reports
//!   progress (its rendezvous waits for the other node's part, so every
//!   rank is up);
//! - gang suspend: a plan without the job on both at once, until both
//!   parts exited (rank 0 checkpointed; the other reported that
//!   checkpoint).
//!
//! `cargo build --release --bins && cargo bench -p fmsched-integration --bench agent_latency [-- N]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use fmsched_integration::fake_trainer_task as desired;
use fmsched_proto::v1 as pb;
use node_agent::driver::{DriverConfig, ProcessDriver};
use node_agent::gpu::GpuBackend;
use node_agent::gpu::fake::FakeGpuBackend;
use node_agent::reconcile::Reconciler;

/// Waits until the task reports progress beyond `after` while running.
async fn first_report(r: &Reconciler, id: &str, after: u64) -> Duration {
    let t = Instant::now();
    loop {
        if let Some(o) = r.observed().await.into_iter().find(|o| o.task_id == id)
            && o.phase == pb::TaskPhase::Running as i32
            && o.iteration > after
        {
            return t.elapsed();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{id} never reported");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// The task's last reported iteration (0 when it is not running here).
async fn iteration(r: &Reconciler, id: &str) -> u64 {
    r.observed()
        .await
        .into_iter()
        .find(|o| o.task_id == id)
        .map_or(0, |o| o.iteration)
}

fn quantiles(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0;
    println!(
        "{name:<32} p50 {:>7.2} ms   p99 {:>7.2} ms   max {:>7.2} ms   (n = {})",
        q(0.5),
        q(0.99),
        q(1.0),
        v.len()
    );
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let tmp = tempfile::tempdir().unwrap();
    let gpus = Arc::new(FakeGpuBackend::new("bench", 4, "A100-80GB").unwrap());
    let uuids: Vec<String> = gpus.inventory().iter().map(|g| g.uuid.clone()).collect();
    let driver = Arc::new(ProcessDriver::new(DriverConfig {
        work_dir: tmp.path().to_path_buf(),
        checkpoint_timeout: Duration::from_secs(5),
        grace: Duration::from_secs(5),
        checkpoint_interval: Duration::from_secs(3600),
        pass_env: Vec::new(),
        run_as: None,
    }));
    let backend: Arc<dyn GpuBackend> = gpus;
    let r = Reconciler::new(driver, backend);
    let (mut spawn, mut report, mut suspend, mut resume, mut warm) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut generation = 0;
    let mut plan = |tasks| {
        generation += 1;
        pb::NodePlan {
            generation,
            tasks,
            epoch: 1,
            warm_idle_release: None,
        }
    };
    eprintln!("{n} launch / suspend / resume cycles …");
    for k in 0..n {
        let id = format!("job-{k}");
        let task = desired(&id, &uuids[k % uuids.len()]);
        // Launch.
        let t = Instant::now();
        let problems = r.apply(&plan(vec![task.clone()])).await;
        assert!(problems.is_empty(), "{problems:?}");
        spawn.push(t.elapsed());
        report.push(t.elapsed() + first_report(&r, &id, 0).await);
        // Suspend (checkpoint, then exit).
        let at = iteration(&r, &id).await;
        let t = Instant::now();
        r.apply(&plan(Vec::new())).await;
        suspend.push(t.elapsed());
        // Resume from that checkpoint: progress past where it stopped.
        r.apply(&plan(vec![task.clone()])).await;
        resume.push(t.elapsed() + first_report(&r, &id, at).await);
        // Suspend again, prepare a standby, then the plan that resumes it.
        let at = iteration(&r, &id).await;
        r.apply(&plan(Vec::new())).await;
        assert!(r.prepare(&task, Duration::from_secs(5)).await);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !r
            .driver()
            .status(&id)
            .await
            .is_some_and(|s| s.observed.prewarmed)
        {
            assert!(Instant::now() < deadline, "{id}: standby never ready");
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let t = Instant::now();
        r.apply(&plan(vec![task])).await;
        warm.push(t.elapsed() + first_report(&r, &id, at).await);
        r.apply(&plan(Vec::new())).await;
    }
    let (gang_start, gang_suspend) = gangs(n).await;
    quantiles("plan → process spawned", spawn);
    quantiles("plan → first report", report);
    quantiles("suspend (checkpoint + exit)", suspend);
    quantiles("suspend → resumed, reporting", resume);
    quantiles("standby → started, reporting", warm);
    quantiles("gang of 2 nodes: plan → all up", gang_start);
    quantiles("gang of 2 nodes: suspend", gang_suspend);
}

/// A reconciler over 4 FAKE A100s in `dir`, and its GPUs' UUIDs.
fn reconciler(name: &str, dir: &std::path::Path) -> (Reconciler, Vec<String>) {
    let gpus = Arc::new(FakeGpuBackend::new(name, 4, "A100-80GB").unwrap());
    let uuids: Vec<String> = gpus.inventory().iter().map(|g| g.uuid.clone()).collect();
    let driver = Arc::new(ProcessDriver::new(DriverConfig {
        work_dir: dir.join(name),
        checkpoint_timeout: Duration::from_secs(5),
        grace: Duration::from_secs(5),
        checkpoint_interval: Duration::from_secs(3600),
        pass_env: Vec::new(),
        run_as: None,
    }));
    let backend: Arc<dyn GpuBackend> = gpus;
    (Reconciler::new(driver, backend), uuids)
}

/// `n` start / suspend cycles of one job over two nodes: (start, suspend)
/// latencies.
async fn gangs(n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let tmp = tempfile::tempdir().unwrap();
    let (x, ux) = reconciler("gang-x", tmp.path());
    let (y, uy) = reconciler("gang-y", tmp.path());
    let (mut start, mut suspend) = (Vec::new(), Vec::new());
    eprintln!("{n} gang start / suspend cycles …");
    for k in 0..n {
        let id = format!("gang-{k}");
        let port = fmsched_integration::free_port();
        let part = |uuids: &[String], node_rank: u32| pb::DesiredTask {
            gpu_uuids: uuids.to_vec(),
            world_size: 8,
            rank_offset: 4 * node_rank,
            nnodes: 2,
            node_rank,
            master_addr: "127.0.0.1".into(),
            master_port: u32::from(port),
            ..desired(&id, &uuids[0])
        };
        let plan = |generation, tasks| pb::NodePlan {
            generation,
            tasks,
            epoch: 1,
            warm_idle_release: None,
        };
        let g = 2 * k as i64;
        let (px, py) = (
            plan(g + 1, vec![part(&ux, 0)]),
            plan(g + 1, vec![part(&uy, 1)]),
        );
        let t = Instant::now();
        let (a, b) = tokio::join!(x.apply(&px), y.apply(&py));
        assert!(a.is_empty() && b.is_empty(), "{a:?} {b:?}");
        start.push(t.elapsed() + first_report(&x, &id, 0).await);
        let stop = plan(g + 2, Vec::new());
        let t = Instant::now();
        tokio::join!(x.apply(&stop), y.apply(&stop));
        suspend.push(t.elapsed());
    }
    (start, suspend)
}
