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

/// A reconciler over `n` FAKE A100 GPUs with its own work folder (kept
/// while the returned guard lives), and the GPUs' UUIDs.
fn node(
    name: &str,
    n: u32,
) -> (
    tempfile::TempDir,
    Arc<FakeGpuBackend>,
    Vec<String>,
    Reconciler,
) {
    let tmp = tempfile::tempdir().unwrap();
    let gpus = Arc::new(FakeGpuBackend::new(name, n, "A100-80GB").unwrap());
    let uuids: Vec<String> = gpus.inventory().iter().map(|g| g.uuid.clone()).collect();
    let driver = Arc::new(ProcessDriver::new(DriverConfig {
        work_dir: tmp.path().to_path_buf(),
        checkpoint_timeout: Duration::from_secs(2),
        grace: Duration::from_secs(2),
        checkpoint_interval: Duration::from_secs(3600),
        pass_env: Vec::new(),
        run_as: None,
    }));
    let backend: Arc<dyn GpuBackend> = gpus.clone();
    (tmp, gpus, uuids, Reconciler::new(driver, backend))
}

/// Waits until task `id` runs in standby with its loader ready.
async fn wait_prewarmed(r: &Reconciler, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r
        .driver()
        .status(id)
        .await
        .is_some_and(|s| s.observed.prewarmed)
    {
        assert!(Instant::now() < deadline, "{id}: standby never prewarmed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn plans_move_suspend_and_resume_processes() {
    let (_tmp, gpus, uuids, r) = node("node-r", 2);

    // Generation 1: run on GPU 0; telemetry follows the process.
    let plan = |generation, tasks| pb::NodePlan {
        generation,
        tasks,
        epoch: 1,
        warm_idle_release: None,
    };
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
    assert_eq!(first.master_port, 0, "a job on one node has no rendezvous");
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

/// A plan that sets `fresh_start` restarts a running task from its initial
/// weights: a new process from iteration 0, not from the checkpoint its
/// stop wrote; the same flag in the next plans keeps that process; a
/// later suspension and resume (the flag cleared) resumes from the fresh
/// process's own checkpoint.
#[tokio::test]
async fn tail_a_fresh_start_relaunches_a_task_from_its_initial_weights_once() {
    let (_tmp, _, uuids, r) = node("node-f", 1);
    let plan = |generation, tasks| pb::NodePlan {
        generation,
        tasks,
        epoch: 1,
        warm_idle_release: None,
    };
    let fresh = |on: bool| pb::DesiredTask {
        fresh_start: on,
        ..desired("job-f", &uuids[0])
    };
    r.apply(&plan(1, vec![fresh(false)])).await;
    let first = wait_iteration(&r, "job-f", 300).await;
    assert!(r.apply(&plan(2, vec![fresh(true)])).await.is_empty());
    let restarted = observed(&r, "job-f").await.unwrap();
    assert_ne!(restarted.pid, first.pid, "a new process");
    assert!(
        restarted.iteration < first.iteration,
        "from its initial weights: {} after {}",
        restarted.iteration,
        first.iteration
    );
    let again = wait_iteration(&r, "job-f", 50).await;
    assert_eq!(again.pid, restarted.pid);
    r.apply(&plan(3, vec![fresh(true)])).await;
    assert_eq!(
        observed(&r, "job-f").await.unwrap().pid,
        restarted.pid,
        "the flag restarts a task once"
    );
    let trained = wait_iteration(&r, "job-f", again.iteration + 50).await;
    // Suspended, then resumed from the fresh process's own checkpoint.
    r.apply(&plan(4, vec![])).await;
    let s = observed(&r, "job-f").await.unwrap();
    assert!(s.iteration >= trained.iteration && !s.checkpoint_path.is_empty());
    r.apply(&plan(5, vec![fresh(false)])).await;
    let resumed = wait_iteration(&r, "job-f", s.iteration).await;
    assert!(resumed.iteration >= s.iteration);
    r.apply(&plan(6, vec![])).await;
}

/// Ymir §6.2 pipeline switch: job-a trains on GPU 0; a hint starts job-b in
/// standby there (its data loader gets ready while job-a trains; it is not
/// reported); the plan that switches checkpoints job-a and starts *that*
/// job-b process, which trains at once. A standby the next plan does not run
/// is stopped and forgotten; a suspended task resumes through a standby from
/// its checkpoint.
#[tokio::test]
async fn a_switch_hint_prepares_the_next_task_before_the_plan_switches() {
    let (_tmp, _, uuids, r) = node("node-s", 2);
    let plan = |generation, tasks| pb::NodePlan {
        generation,
        tasks,
        epoch: 1,
        warm_idle_release: None,
    };
    // A loader of 200 simulated seconds: 2 s of wall time at 100×.
    let loader = Duration::from_secs(2);
    let slow = |id: &str, gpu: &str| {
        let mut t = desired(id, gpu);
        t.env.insert("FMSCHED_FAKE_LOADER_S".into(), "200".into());
        t
    };
    let lead = Duration::from_secs(5);

    r.apply(&plan(1, vec![slow("job-a", &uuids[0])])).await;
    wait_iteration(&r, "job-a", 1).await;
    let hinted = Instant::now();
    assert!(r.prepare(&slow("job-b", &uuids[0]), lead).await);
    assert!(
        !r.prepare(&slow("job-b", &uuids[0]), lead).await,
        "a repeated hint launches nothing"
    );
    wait_prewarmed(&r, "job-b").await;
    eprintln!("hint → loader ready: {:?}", hinted.elapsed());
    let standby = r.driver().status("job-b").await.unwrap();
    assert!(standby.running && standby.observed.progress.is_empty());
    assert!(
        observed(&r, "job-b").await.is_none(),
        "a standby is not reported to the scheduler"
    );
    let a_before = observed(&r, "job-a").await.unwrap().iteration;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        observed(&r, "job-a").await.unwrap().iteration > a_before,
        "job-a keeps training while job-b waits"
    );

    // The switch: job-a checkpoints, the waiting job-b process starts.
    let switched = Instant::now();
    assert!(
        r.apply(&plan(2, vec![slow("job-b", &uuids[0])]))
            .await
            .is_empty()
    );
    let b = wait_iteration(&r, "job-b", 1).await;
    let took = switched.elapsed();
    eprintln!("plan → switched job training: {took:?} (loader {loader:?})");
    assert_eq!(b.pid, standby.pid, "the standby process itself was started");
    assert!(took < loader, "the switch paid the loader again: {took:?}");
    let a = observed(&r, "job-a").await.unwrap();
    assert_eq!(a.phase, pb::TaskPhase::Suspended as i32);
    assert!(!a.checkpoint_path.is_empty());
    assert_eq!(r.switch_stats().standby_started, 1);

    // A hint the next plan does not follow: the standby is stopped and
    // never reported (it must not read as a finished job).
    assert!(r.prepare(&slow("job-c", &uuids[1]), lead).await);
    r.apply(&plan(3, vec![slow("job-b", &uuids[0])])).await;
    assert!(observed(&r, "job-c").await.is_none());
    assert!(r.driver().status("job-c").await.is_none(), "forgotten");
    assert_eq!(r.switch_stats().standby_wasted, 1);

    // job-a resumes on GPU 1 through a standby, from its own checkpoint.
    assert!(r.prepare(&slow("job-a", &uuids[1]), lead).await);
    r.apply(&plan(
        4,
        vec![slow("job-b", &uuids[0]), slow("job-a", &uuids[1])],
    ))
    .await;
    let resumed = wait_iteration(&r, "job-a", a.iteration).await;
    assert!(resumed.iteration >= a.iteration);
    assert_eq!(r.switch_stats().standby_started, 2);
    r.apply(&plan(5, vec![])).await;

    // A node keeps at most `processes.max_standby` processes waiting.
    let (_tmp2, _, u2, r2) = node("node-m", 2);
    let r2 = r2.with_max_standby(1);
    assert!(r2.prepare(&slow("job-x", &u2[0]), lead).await);
    assert!(!r2.prepare(&slow("job-y", &u2[1]), lead).await);
    assert_eq!(r2.switch_stats().standby_refused, 1);
    r2.apply(&plan(1, vec![])).await;
    assert!(
        r2.driver().status("job-x").await.is_none(),
        "stopped unused"
    );
}

/// An environment variable of a live process.
fn env_of(pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    String::from_utf8_lossy(&env)
        .split('\0')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// Ymir §6.2 (Fig. 9), reverse-order stage switch: a pipeline-parallel job
/// switched in after another on the same four GPUs runs its stages in
/// reverse device order — its first stage on the GPU of the previous job's
/// last stage, which finishes its backward pass first. Through a standby
/// too, and back again for the next switch.
#[tokio::test]
async fn pipeline_jobs_switch_stages_in_reverse_order() {
    let (_tmp, _, uuids, r) = node("node-p", 4);
    let plan = |generation, tasks| pb::NodePlan {
        generation,
        tasks,
        epoch: 1,
        warm_idle_release: None,
    };
    let pipe = |id: &str| {
        let mut t = desired(id, &uuids[0]);
        t.gpu_uuids = uuids.clone();
        t.pipeline_parallel = true;
        t
    };
    let devices = |pid| {
        (
            env_of(pid, "CUDA_VISIBLE_DEVICES").unwrap(),
            env_of(pid, "FMSCHED_PIPELINE_STAGES").unwrap(),
        )
    };

    r.apply(&plan(1, vec![pipe("pipe-a")])).await;
    let a = wait_iteration(&r, "pipe-a", 1).await;
    assert_eq!(devices(a.pid), ("0,1,2,3".into(), "4".into()));

    // pipe-b replaces pipe-a on the same GPUs: stages in reverse.
    r.apply(&plan(2, vec![pipe("pipe-b")])).await;
    let b = wait_iteration(&r, "pipe-b", 1).await;
    assert_eq!(devices(b.pid).0, "3,2,1,0");

    // pipe-a comes back through a standby: reverse of pipe-b's order.
    assert!(r.prepare(&pipe("pipe-a"), Duration::from_secs(5)).await);
    // (Read its environment once it runs the trainer, not the forked agent.)
    wait_prewarmed(&r, "pipe-a").await;
    let standby_pid = r.driver().status("pipe-a").await.unwrap().pid;
    assert_eq!(devices(standby_pid).0, "0,1,2,3");
    r.apply(&plan(3, vec![pipe("pipe-a")])).await;
    let a2 = wait_iteration(&r, "pipe-a", a.iteration).await;
    assert_eq!(a2.pid, standby_pid, "started from its standby");
    assert_eq!(r.switch_stats().standby_started, 1);

    // A data-parallel task gets the plan's order, whatever ran before.
    r.apply(&plan(4, vec![desired("dp", &uuids[3])])).await;
    let dp = wait_iteration(&r, "dp", 1).await;
    assert_eq!(env_of(dp.pid, "CUDA_VISIBLE_DEVICES").unwrap(), "3");
    assert_eq!(env_of(dp.pid, "FMSCHED_PIPELINE_STAGES"), None);
    r.apply(&plan(5, vec![])).await;
}

/// Node `node_rank`'s part (on `gpus`, 2 of the gang's 4) of gang `id`
/// over two nodes, rank 0 listening at 127.0.0.1:`port`.
fn gang_part(id: &str, gpus: &[String], node_rank: u32, port: u16) -> pb::DesiredTask {
    pb::DesiredTask {
        gpu_uuids: gpus.to_vec(),
        world_size: 4,
        rank_offset: 2 * node_rank,
        nnodes: 2,
        node_rank,
        master_addr: "127.0.0.1".into(),
        master_port: u32::from(port),
        ..desired(id, &gpus[0])
    }
}

fn plan(generation: i64, tasks: Vec<pb::DesiredTask>) -> pb::NodePlan {
    pb::NodePlan {
        generation,
        tasks,
        epoch: 1,
        warm_idle_release: None,
    }
}

/// Two nodes' agents run one gang (a job over both): the part of
/// `NODE_RANK` 0 listens for the rendezvous, the other joins it; only rank
/// 0 reports progress, each node reports its rank layout; suspending the
/// gang takes one checkpoint (rank 0's) that both parts report; a new rank
/// layout on the same GPUs relaunches the part; both report the run's
/// rendezvous port; when rank 0 goes away the
/// other part exits as failed instead of hanging.
#[tokio::test]
async fn a_gang_over_two_nodes_rendezvous_suspends_and_breaks_cleanly() {
    let (_tx, _gx, ux, x) = node("node-x", 2);
    let (_ty, _gy, uy, y) = node("node-y", 2);
    let port = fmsched_integration::free_port();
    let part = |gpus: &[String], node_rank, port| gang_part("gang-1", gpus, node_rank, port);
    assert!(x.apply(&plan(1, vec![part(&ux, 0, port)])).await.is_empty());
    assert!(y.apply(&plan(1, vec![part(&uy, 1, port)])).await.is_empty());
    let lead = wait_iteration(&x, "gang-1", 30).await;
    assert_eq!((lead.rank_offset, lead.world_size), (0, 4));
    // Both parts report the run's port: the scheduler keeps it from new
    // runs while rank 0's process lives.
    assert_eq!(lead.master_port, u32::from(port));
    let other = observed(&y, "gang-1").await.unwrap();
    assert_eq!(other.master_port, u32::from(port));
    assert_eq!(
        other.phase,
        pb::TaskPhase::Running as i32,
        "joined: {other:?}"
    );
    assert_eq!((other.rank_offset, other.world_size), (2, 4));
    assert_eq!(other.iteration, 0, "only rank 0 reports progress");
    // Suspend both (as one plan does): one checkpoint, rank 0's, on both.
    let stop = plan(2, vec![]);
    let (sx, sy) = tokio::join!(x.apply(&stop), y.apply(&stop));
    assert!(sx.is_empty() && sy.is_empty());
    let (a, b) = (
        observed(&x, "gang-1").await.unwrap(),
        observed(&y, "gang-1").await.unwrap(),
    );
    assert_eq!(a.phase, pb::TaskPhase::Suspended as i32);
    assert_eq!(b.phase, pb::TaskPhase::Suspended as i32);
    assert!(!a.checkpoint_path.is_empty());
    let dir_of = |p: &str| std::path::Path::new(p).parent().map(|d| d.to_path_buf());
    assert_eq!(
        dir_of(&b.checkpoint_path),
        dir_of(&a.checkpoint_path),
        "node-y reports a checkpoint rank 0 wrote: {} vs {}",
        b.checkpoint_path,
        a.checkpoint_path
    );
    // Resume on a new port: both parts start from rank 0's checkpoint.
    let port2 = fmsched_integration::free_port();
    let resume = |gpus: &[String], node_rank, port| pb::DesiredTask {
        resume_path: a.checkpoint_path.clone(),
        ..part(gpus, node_rank, port)
    };
    x.apply(&plan(3, vec![resume(&ux, 0, port2)])).await;
    y.apply(&plan(3, vec![resume(&uy, 1, port2)])).await;
    let resumed = wait_iteration(&x, "gang-1", a.iteration + 10).await;
    // Same GPUs, another layout (rank 0 moved its port): relaunched.
    let port3 = fmsched_integration::free_port();
    x.apply(&plan(4, vec![resume(&ux, 0, port3)])).await;
    let relaunched = observed(&x, "gang-1").await.unwrap();
    assert_ne!(
        relaunched.pid, resumed.pid,
        "a new rank layout is a new process"
    );
    // Node-y still follows the old rendezvous: rank 0 went away, so it fails.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = observed(&y, "gang-1").await.unwrap();
        if t.phase == pb::TaskPhase::Failed as i32 {
            assert!(t.message.contains("went away"), "{}", t.message);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the orphaned part never stopped: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its newer plan joins the new rendezvous, and the gang trains again.
    y.apply(&plan(4, vec![resume(&uy, 1, port3)])).await;
    wait_iteration(&x, "gang-1", resumed.iteration + 10).await;
    let stop = plan(5, vec![]);
    let (sx, sy) = tokio::join!(x.apply(&stop), y.apply(&stop));
    assert!(sx.is_empty() && sy.is_empty());
}

/// A gang part still in its rendezvous, stopped by its plan, goes at once
/// and by itself: rank 0 (its other node never joined) checkpoints the
/// state it started from and closes its listener, so a later start of the
/// job can never be joined to it; the part of another node, stopped while
/// rank 0 is not there yet, exits too. Both are suspensions, not failures,
/// and neither needs the agent's SIGKILL.
#[tokio::test]
async fn a_gang_part_stopped_in_its_rendezvous_goes_at_once() {
    let (_tx, _gx, ux, x) = node("node-x", 2);
    let (_ty, _gy, uy, y) = node("node-y", 2);
    let part = |gpus: &[String], node_rank, port| gang_part("gang-r", gpus, node_rank, port);
    // Rank 0 on node-x waits for node-y, which never comes.
    let port = fmsched_integration::free_port();
    assert!(x.apply(&plan(1, vec![part(&ux, 0, port)])).await.is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "rank 0 never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(x.apply(&plan(2, vec![])).await.is_empty());
    let t = observed(&x, "gang-r").await.unwrap();
    assert_eq!(t.phase, pb::TaskPhase::Suspended as i32, "{t:?}");
    assert!(!t.checkpoint_path.is_empty(), "it checkpointed when asked");
    assert_eq!(x.driver().stats().kills, 0, "it went by itself");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "its listener is closed"
    );
    // Node-y's part waits for a rank 0 that is not there yet.
    let absent = fmsched_integration::free_port();
    assert!(
        y.apply(&plan(3, vec![part(&uy, 1, absent)]))
            .await
            .is_empty()
    );
    let log = y
        .driver()
        .status("gang-r")
        .await
        .unwrap()
        .dir
        .join("stderr.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("joining rank 0")) {
        assert!(
            Instant::now() < deadline,
            "node-y's part never tried to join"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(y.apply(&plan(4, vec![])).await.is_empty());
    let t = observed(&y, "gang-r").await.unwrap();
    assert_eq!(t.phase, pb::TaskPhase::Suspended as i32, "{t:?}");
    assert_eq!(y.driver().stats().kills, 0, "it went by itself");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("stopped before joining"), "{log}");
}

/// A task running a Python `script` as its trainer.
fn python_task(id: &str, gpu: &str, script: &str) -> pb::DesiredTask {
    let mut t = desired(id, gpu);
    t.command = vec!["python3".into(), "-c".into(), script.into()];
    t
}

/// Waits until the trainers of `ids` have written `ready` into their
/// checkpoint folders; returns those folders.
async fn checkpoints_ready(r: &Reconciler, ids: &[String]) -> Vec<std::path::PathBuf> {
    let mut dirs = Vec::new();
    for id in ids {
        dirs.push(r.driver().status(id).await.unwrap().dir.join("checkpoints"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dirs.iter().all(|d| d.join("ready").exists()) {
        assert!(Instant::now() < deadline, "the trainers never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    dirs
}

/// A plan that leaves out several processes of a node suspends them at
/// once: every one is asked for its checkpoint before any has finished
/// writing it (a checkpoint takes a second here), so the node's
/// suspensions take the longest of them, not their sum, before the next
/// plan's processes may start.
#[tokio::test]
async fn processes_a_plan_leaves_out_checkpoint_at_once() {
    let (_tmp, _gpus, uuids, r) = node("node-s", 3);
    let script = r#"
import json, os, signal, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["FMSCHED_REPORT_SOCKET"])
d = os.environ["FMSCHED_CHECKPOINT_DIR"]
def ckpt(*_):
    open(os.path.join(d, "asked"), "w").write(repr(time.time()))
    time.sleep(1.0)
    open(os.path.join(d, "ck-3"), "w").write("3")
    open(os.path.join(d, "saved"), "w").write(repr(time.time()))
    s.sendall((json.dumps({"type": "checkpoint", "path": os.path.join(d, "ck-3"), "iteration": 3}) + "\n").encode())
signal.signal(signal.SIGUSR2, ckpt)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open(os.path.join(d, "ready"), "w").write("1")
while True: time.sleep(0.05)
"#;
    let ids: Vec<String> = (0..3).map(|i| format!("slow-{i}")).collect();
    let tasks = ids
        .iter()
        .zip(&uuids)
        .map(|(id, gpu)| python_task(id, gpu, script))
        .collect();
    assert!(r.apply(&plan(1, tasks)).await.is_empty());
    let dirs = checkpoints_ready(&r, &ids).await;
    assert!(r.apply(&plan(2, vec![])).await.is_empty());
    let at = |d: &std::path::PathBuf, f: &str| -> f64 {
        std::fs::read_to_string(d.join(f)).unwrap().parse().unwrap()
    };
    let asked_last = dirs.iter().map(|d| at(d, "asked")).fold(f64::MIN, f64::max);
    let saved_first = dirs.iter().map(|d| at(d, "saved")).fold(f64::MAX, f64::min);
    assert!(
        asked_last < saved_first,
        "every process was asked ({asked_last}) before the first had saved ({saved_first})"
    );
    for id in &ids {
        let t = observed(&r, id).await.unwrap();
        assert_eq!(t.phase, pb::TaskPhase::Suspended as i32, "{t:?}");
        assert!(t.checkpoint_path.ends_with("ck-3"), "{t:?}");
    }
}

/// A trainer suspended before its first progress report (a real one
/// starting up) still wrote a checkpoint at some iteration: the node
/// reports that iteration with it, so the scheduler counts the job as
/// started (a temporal merge must not restart it from another job's
/// weights).
#[tokio::test]
async fn a_checkpoint_before_any_progress_report_counts_as_progress() {
    let (_tmp, _gpus, uuids, r) = node("node-ck", 1);
    // Reports nothing until SIGUSR2, then a checkpoint at iteration 7 and
    // an evaluation (no progress report).
    let script = r#"
import json, os, signal, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["FMSCHED_REPORT_SOCKET"])
d = os.environ["FMSCHED_CHECKPOINT_DIR"]
def send(r): s.sendall((json.dumps(r) + "\n").encode())
def ckpt(*_):
    open(os.path.join(d, "ck-7"), "w").write("7")
    send({"type": "checkpoint", "path": os.path.join(d, "ck-7"), "iteration": 7})
    send({"type": "eval", "job_id": "early", "iteration": 7, "epoch": 0.2, "metric": "accuracy", "value": 0.5})
signal.signal(signal.SIGUSR2, ckpt)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open(os.path.join(d, "ready"), "w").write("1")
while True: time.sleep(0.05)
"#;
    r.apply(&pb::NodePlan {
        generation: 1,
        tasks: vec![python_task("early", &uuids[0], script)],
        epoch: 1,
        warm_idle_release: None,
    })
    .await;
    checkpoints_ready(&r, &["early".to_string()]).await;
    // The next plan leaves it out: suspended with its checkpoint.
    r.apply(&pb::NodePlan {
        generation: 2,
        tasks: vec![],
        epoch: 1,
        warm_idle_release: None,
    })
    .await;
    let t = observed(&r, "early").await.expect("still reported");
    assert_eq!(t.phase, pb::TaskPhase::Suspended as i32, "{t:?}");
    assert!(t.checkpoint_path.ends_with("ck-7"), "{t:?}");
    assert_eq!(t.iteration, 7, "the checkpoint's iteration is progress");
    // So is the job's own row, which an evaluation created.
    assert_eq!(t.jobs.len(), 1, "{t:?}");
    assert_eq!(t.jobs[0].iteration, 7, "{t:?}");
}

/// Under a leasing policy the plan carries each process's lease end: the
/// agent writes it to the trainer's control file at launch and at every
/// renewal, and the fake trainer checkpoints ahead of it (without being
/// suspended).
#[tokio::test]
async fn the_lease_end_reaches_the_trainer_which_checkpoints_ahead_of_it() {
    let (tmp, _gpus, uuids, r) = node("node-l", 1);
    // A lease end `s` seconds from now: (Unix seconds, the plan's field).
    let at = |s: f64| {
        let t = chrono::Utc::now() + chrono::Duration::milliseconds((s * 1000.0) as i64);
        (
            t.timestamp_micros() as f64 / 1e6,
            fmsched_proto::convert::timestamp_to_proto(t),
        )
    };
    let plan = |generation, lease| pb::NodePlan {
        generation,
        tasks: vec![pb::DesiredTask {
            lease_until: Some(lease),
            ..desired("leased", &uuids[0])
        }],
        epoch: 1,
        warm_idle_release: None,
    };
    let control = tmp.path().join("leased").join("control.json");
    let lease_end = || -> Option<f64> {
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&control).ok()?).ok()?;
        c["lease_end"].as_f64()
    };
    let (far, ts) = at(600.0);
    assert!(r.apply(&plan(1, ts)).await.is_empty());
    wait_iteration(&r, "leased", 1).await;
    assert!((lease_end().unwrap() - far).abs() < 1e-3, "told at launch");
    // Renewed to end in 2 s: rewritten; the trainer checkpoints ahead.
    let (near, ts) = at(2.0);
    assert!(r.apply(&plan(2, ts)).await.is_empty());
    assert!(
        (lease_end().unwrap() - near).abs() < 1e-3,
        "told at renewal"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let stderr = tmp.path().join("leased").join("stderr.log");
    loop {
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        if log.contains("checkpoint ahead of the lease") {
            break;
        }
        assert!(Instant::now() < deadline, "no checkpoint ahead: {log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The trainer says so before it writes the checkpoint and reports it:
    // the report may come a moment later (under a loaded machine, after
    // the log line was read).
    loop {
        let t = observed(&r, "leased").await.unwrap();
        assert_eq!(t.phase, pb::TaskPhase::Running as i32, "it goes on");
        if !t.checkpoint_path.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "no checkpoint reported: {t:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its process does not outlive the test.
    r.apply(&pb::NodePlan {
        generation: 9,
        tasks: vec![],
        epoch: 1,
        warm_idle_release: None,
    })
    .await;
}

/// PromptTuner's warm processes on one node: a `warm` prompt-tuning task
/// that finished stays as a warm process of its model once the plan drops
/// it (reported in heartbeats, not as a task); the next `warm` task of the
/// model on exactly its GPU is handed to it (same pid, no launch); a task
/// of another model on that GPU stops it first; and an idle one is
/// stopped after the plan's `warm_idle_release`.
#[tokio::test]
async fn a_finished_warm_task_stays_warm_takes_the_next_and_is_released() {
    let (_tmp, _gpus, uuids, r) = node("node-w", 2);
    let plan = |generation, tasks, release_ms: u64| pb::NodePlan {
        generation,
        tasks,
        epoch: 1,
        warm_idle_release: Some(fmsched_proto::convert::duration_to_proto(
            Duration::from_millis(release_ms),
        )),
    };
    let prompt = |id: &str, model: &str, gpu: &str| {
        let mut t = desired(id, gpu);
        t.warm = true;
        t.env
            .insert("FMSCHED_FAKE_TIME_COMPRESSION".into(), "1000".into());
        t.tasks[0].model = model.into();
        t.tasks[0].max_iterations = 200;
        t.tasks[0].petl = "prompt_tuning".into();
        t
    };
    let done = async |id: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(t) = observed(&r, id).await
                && t.outputs.contains_key(id)
            {
                return t;
            }
            assert!(Instant::now() < deadline, "{id} never finished");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    r.apply(&plan(1, vec![prompt("p1", "gpt2", &uuids[0])], 60_000))
        .await;
    let first = done("p1").await;
    // The plan drops the finished task: its process stays warm.
    r.apply(&plan(2, vec![], 60_000)).await;
    let warm = r.warm_report();
    assert_eq!(warm.len(), 1, "{warm:?}");
    assert_eq!(
        (warm[0].model.as_str(), warm[0].gpu_uuids.clone()),
        ("gpt2", vec![uuids[0].clone()])
    );
    assert!(
        observed(&r, "p1").await.is_none(),
        "not reported as a task any more"
    );
    // The next gpt2 request on that GPU: handed over, not launched.
    r.apply(&plan(3, vec![prompt("p2", "gpt2", &uuids[0])], 60_000))
        .await;
    assert!(r.warm_report().is_empty());
    let second = done("p2").await;
    assert_eq!(second.pid, first.pid, "the warm process ran it");
    assert_eq!(
        (r.switch_stats().warm_starts, r.switch_stats().cold_starts),
        (1, 1)
    );
    r.apply(&plan(4, vec![], 60_000)).await;
    assert_eq!(r.warm_report().len(), 1);
    // Another model on that GPU: the warm process is stopped first.
    r.apply(&plan(
        5,
        vec![prompt("p3", "roberta-base", &uuids[0])],
        60_000,
    ))
    .await;
    let third = done("p3").await;
    assert_ne!(third.pid, first.pid);
    assert_eq!(r.switch_stats().warm_evicted, 1);
    // Idle past a short release: stopped on the next look.
    r.apply(&plan(6, vec![], 200)).await;
    assert_eq!(r.warm_report().len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.expire_warm().await;
    assert!(r.warm_report().is_empty());
    assert_eq!(r.switch_stats().warm_released, 1);
    assert!(
        !r.driver().status("p3").await.is_some_and(|s| s.running),
        "its process ended"
    );
}
