//! The agent's process driver with the FAKE trainer binary: launch,
//! checkpoint-and-suspend, resume where it stopped, standby, profile mode,
//! completion, and SIGKILL for a trainer that ignores SIGTERM.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fmsched_core::trainer::TaskAssignment;
use fmsched_integration::bin;
use node_agent::driver::{DriverConfig, LaunchSpec, ProcessDriver, Ranks};

fn driver(dir: &std::path::Path, grace_ms: u64) -> ProcessDriver {
    ProcessDriver::new(DriverConfig {
        work_dir: dir.to_path_buf(),
        checkpoint_timeout: Duration::from_secs(2),
        grace: Duration::from_millis(grace_ms),
        checkpoint_interval: Duration::from_secs(3600),
        pass_env: Vec::new(),
        run_as: None,
    })
}

fn spec(id: &str, max_iterations: u64, env: &[(&str, &str)]) -> LaunchSpec {
    let mut e: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    e.entry("FMSCHED_FAKE_TIME_COMPRESSION".into())
        .or_insert_with(|| "100".into());
    LaunchSpec {
        id: id.into(),
        command: vec![bin("fake-trainer").display().to_string()],
        env: e,
        profile: false,
        tasks: vec![TaskAssignment {
            job_id: id.into(),
            model: "roberta-base".into(),
            task: "rte".into(),
            dataset_uri: "file:///data/rte".into(),
            global_batch_size: 32,
            max_iterations,
            metric: Some("accuracy".into()),
            metric_target: None,
            samples_per_epoch: Some(3200),
            max_epochs: 0,
            eval_only: false,
            prompt_bank: None,
            settings: Default::default(),
        }],
        gpus: vec![0],
        resume_from: None,
        init_weights: None,
        ranks: Ranks::single(1),
        standby: false,
        pipeline: false,
        expert_parallel: 0,
        prompt_banks: Default::default(),
        warm: false,
        working_dir: String::new(),
    }
}

async fn wait_for(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The iteration `job` last reported to the driver, if it reported yet.
async fn iteration(d: &ProcessDriver, job: &str) -> Option<u64> {
    let status = d.status(job).await.expect("the driver knows the job");
    status.observed.progress.get(job).map(|p| p.0)
}

#[tokio::test]
async fn suspend_and_resume_keep_progress() {
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 2000);
    let s = spec("job-a", 1_000_000, &[]);
    let t0 = Instant::now();
    d.launch(&s).await.unwrap();
    // A repeated plan launches nothing new.
    let started = d.status("job-a").await.unwrap().started;
    d.launch(&s).await.unwrap();
    assert_eq!(
        d.status("job-a").await.unwrap().started,
        started,
        "launch is idempotent"
    );
    wait_for("first progress", Duration::from_secs(10), async || {
        iteration(&d, "job-a").await.is_some_and(|i| i >= 100)
    })
    .await;
    eprintln!("launch to first progress report: {:?}", t0.elapsed());
    let t1 = Instant::now();
    let (ckpt, at) = d
        .suspend("job-a")
        .await
        .unwrap()
        .expect("a checkpoint was written");
    let suspend_took = t1.elapsed();
    assert!(at >= 100, "checkpoint at iteration {at}");
    assert!(ckpt.exists(), "{} exists", ckpt.display());
    let st = d.status("job-a").await.unwrap();
    assert!(!st.running && st.exit_code == Some(0), "{st:?}");
    // Resume from the checkpoint: progress continues from `at`.
    let t2 = Instant::now();
    d.launch(&LaunchSpec {
        resume_from: Some(ckpt.clone()),
        ..s.clone()
    })
    .await
    .unwrap();
    wait_for(
        "progress after resume",
        Duration::from_secs(10),
        async || iteration(&d, "job-a").await.is_some(),
    )
    .await;
    let first = d.status("job-a").await.unwrap().observed.progress["job-a"].0;
    assert!(first > at, "resumed at {first}, checkpoint was {at}");
    eprintln!(
        "suspend {suspend_took:?}, resume to first report {:?}",
        t2.elapsed()
    );
    d.suspend("job-a").await.unwrap();
}

/// A job resumed from a checkpoint in which it had already reached its
/// target (a merged pair's process wrote it, then the pair was split
/// before its output reached the scheduler) reports its output and exits
/// 0, as a trainer resumed at its last step saves its model: it used to
/// exit 0 with no output, and the job completed without one.
#[tokio::test]
async fn a_trainer_resumed_at_its_target_reports_its_output() {
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 2000);
    let ckpt = tmp.path().join("ckpt-000000600.json");
    let state = serde_json::json!({
        "format": "fmsched-fake-trainer/2",
        "tasks": [{
            "job_id": "done-job", "iteration": 600, "samples": 19200,
            "done": true, "effective": 600.0, "gain": 0.0
        }]
    });
    std::fs::write(&ckpt, serde_json::to_vec(&state).unwrap()).unwrap();
    d.launch(&LaunchSpec {
        resume_from: Some(ckpt),
        ..spec("done-job", 600, &[])
    })
    .await
    .unwrap();
    let st = d.wait("done-job", Duration::from_secs(20)).await.unwrap();
    assert_eq!(st.exit_code, Some(0), "{st:?}");
    let out = st
        .observed
        .done
        .get("done-job")
        .expect("an output reported");
    assert!(std::path::Path::new(out).exists(), "{out}");
}

/// A prompt task's Prompt Bank reaches its trainer as a file (the agent
/// writes what the plan sent); the fake trainer walks it, starts from the
/// prompt of its own task, and the agent observes its `prompt_init` and,
/// at the end, the tuned prompt's features.
#[tokio::test]
async fn a_prompt_bank_reaches_the_trainer_and_its_pick_comes_back() {
    use fmsched_core::trainer::BankCandidate;
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 2000);
    // Two earlier prompts: one of this task (the fake world's features of
    // its own task), one whose file is not there.
    let mine = tmp.path().join("mine.json");
    let mut s = spec("prompt", 200, &[]);
    s.tasks[0].settings.petl = "prompt_tuning".into();
    s.tasks[0].settings.num_virtual_tokens = 8;
    let features: Vec<f64> = {
        // Ask the fake trainer itself for the features: a finished prompt
        // job's done report carries them.
        let mut p = spec("teacher", 200, &[]);
        p.tasks[0].settings.petl = "prompt_tuning".into();
        d.launch(&p).await.unwrap();
        wait_for("the teacher done", Duration::from_secs(20), async || {
            !d.status("teacher")
                .await
                .unwrap()
                .observed
                .prompt_features
                .is_empty()
        })
        .await;
        d.status("teacher").await.unwrap().observed.prompt_features["teacher"].clone()
    };
    assert_eq!(features.len(), 16);
    std::fs::write(
        &mine,
        serde_json::json!({ "features": features }).to_string(),
    )
    .unwrap();
    s.prompt_banks.insert(
        "prompt".into(),
        vec![
            BankCandidate {
                id: "gone".into(),
                path: tmp.path().join("gone.json").display().to_string(),
                cluster: 0,
                medoid: true,
            },
            BankCandidate {
                id: "teacher".into(),
                path: mine.display().to_string(),
                cluster: 0,
                medoid: false,
            },
        ],
    );
    d.launch(&s).await.unwrap();
    wait_for("its pick", Duration::from_secs(20), async || {
        d.status("prompt")
            .await
            .unwrap()
            .observed
            .prompt_init
            .contains_key("prompt")
    })
    .await;
    let o = d.status("prompt").await.unwrap().observed;
    let (from, score, scored, candidates) = o.prompt_init["prompt"].clone();
    assert_eq!((from.as_str(), scored, candidates), ("teacher", 2, 2));
    assert!(
        (1.0..1.05).contains(&score),
        "its own task's prompt: {score}"
    );
    wait_for("done", Duration::from_secs(20), async || {
        d.status("prompt")
            .await
            .unwrap()
            .observed
            .prompt_features
            .contains_key("prompt")
    })
    .await;
    let bank =
        std::fs::read_to_string(tmp.path().join("prompt").join("prompt-bank-0.json")).unwrap();
    assert!(bank.contains("\"teacher\""), "{bank}");
}

#[tokio::test]
async fn a_trainer_that_ignores_sigterm_is_killed_after_the_grace() {
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 300);
    d.launch(&spec(
        "stubborn",
        1_000_000,
        &[("FMSCHED_FAKE_IGNORE_SIGTERM", "1")],
    ))
    .await
    .unwrap();
    wait_for("progress", Duration::from_secs(10), async || {
        iteration(&d, "stubborn").await.is_some()
    })
    .await;
    let t = Instant::now();
    let ckpt = d.suspend("stubborn").await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "waited out the grace"
    );
    assert!(ckpt.is_some(), "SIGUSR2 still produced a checkpoint");
    let st = d.status("stubborn").await.unwrap();
    assert!(!st.running, "killed");
    assert_eq!(
        st.exit_code, None,
        "ended by a signal (SIGKILL), not by exiting"
    );
}

#[tokio::test]
async fn standby_profile_and_completion() {
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 2000);
    // Standby: the loader (0.5 s of wall time here) is prepared, `prewarmed`
    // reported, and nothing trains until the start signal.
    let warm = LaunchSpec {
        standby: true,
        ..spec("warm", 1_000_000, &[("FMSCHED_FAKE_LOADER_S", "50")])
    };
    let launched = Instant::now();
    d.launch(&warm).await.unwrap();
    wait_for("prewarmed report", Duration::from_secs(10), async || {
        d.status("warm").await.unwrap().observed.prewarmed
    })
    .await;
    let ready = launched.elapsed();
    assert!(ready >= Duration::from_millis(450), "loader took {ready:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = d.status("warm").await.unwrap();
    assert!(st.running, "a standby waits");
    assert!(
        st.observed.progress.is_empty(),
        "a standby trains nothing: {st:?}"
    );
    let started = Instant::now();
    d.start("warm").await.unwrap();
    wait_for(
        "progress after start",
        Duration::from_secs(10),
        async || iteration(&d, "warm").await.is_some(),
    )
    .await;
    let first = started.elapsed();
    eprintln!("standby: loader ready after {ready:?}; start → first progress {first:?}");
    assert!(
        first < ready,
        "a started standby pays no loader time again: {first:?} vs {ready:?}"
    );
    d.suspend("warm").await.unwrap();
    // A standby that is not wanted stops at once on SIGTERM (no checkpoint
    // to wait for).
    d.launch(&LaunchSpec {
        id: "unused".into(),
        ..warm.clone()
    })
    .await
    .unwrap();
    let t = Instant::now();
    d.terminate("unused").await.unwrap();
    let st = d.status("unused").await.unwrap();
    // (Stopped so early it may die of the signal before its handler.)
    assert!(!st.running, "{st:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(st.observed.last_checkpoint.is_none());

    // Profile mode: a Task2Vec embedding, then exit 0.
    d.launch(&LaunchSpec {
        profile: true,
        ..spec("prof", 0, &[("FMSCHED_FAKE_PROFILE_STEPS", "20")])
    })
    .await
    .unwrap();
    let st = d.wait("prof", Duration::from_secs(10)).await.unwrap();
    assert_eq!(st.exit_code, Some(0), "{st:?}");
    let (f, f2) = &st.observed.embeddings["prof"];
    assert_eq!(f.len(), f2.len());
    assert!(f.iter().all(|x| x.is_finite() && *x >= 0.0));

    // A job with a small budget completes and leaves its output.
    d.launch(&spec("short", 300, &[])).await.unwrap();
    let st = d.wait("short", Duration::from_secs(20)).await.unwrap();
    assert_eq!(st.exit_code, Some(0), "{st:?}");
    let out = &st.observed.done["short"];
    assert!(std::path::Path::new(out).exists(), "{out}");
    assert!(!st.observed.evals.is_empty(), "evaluated every epoch");
}

#[tokio::test]
async fn a_bad_command_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 100);
    let mut s = spec("nope", 10, &[]);
    s.command = vec!["/no/such/trainer".into()];
    let e = d.launch(&s).await.unwrap_err().to_string();
    assert!(e.contains("nope") && e.contains("/no/such/trainer"), "{e}");
    assert!(d.suspend("never-started").await.is_err());
}

/// The Python trainer helper under the real process driver: the toy trainer
/// in `python/examples` (plain Python, no GPU) is suspended and resumed.
#[tokio::test]
async fn the_python_helper_follows_the_contract_under_the_driver() {
    let python = ["python3", "python"].into_iter().find(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        panic!(
            "python3 is needed for the trainer helper's test (scripts/test.sh installs what it needs)"
        );
    };
    let root = fmsched_integration::repo_root().join("python");
    let tmp = tempfile::tempdir().unwrap();
    let d = driver(tmp.path(), 2000);
    let mut s = spec("py", 100_000, &[]);
    s.command = vec![
        python.into(),
        root.join("examples/toy_trainer.py").display().to_string(),
    ];
    s.env
        .insert("PYTHONPATH".into(), root.display().to_string());
    d.launch(&s).await.unwrap();
    wait_for(
        "progress from python",
        Duration::from_secs(20),
        async || iteration(&d, "py").await.is_some_and(|i| i >= 50),
    )
    .await;
    let (ckpt, at) = d
        .suspend("py")
        .await
        .unwrap()
        .expect("SIGUSR2 checkpoint from python");
    assert!(at >= 50 && ckpt.exists());
    d.launch(&LaunchSpec {
        resume_from: Some(ckpt),
        ..s.clone()
    })
    .await
    .unwrap();
    wait_for("resumed progress", Duration::from_secs(20), async || {
        iteration(&d, "py").await.is_some_and(|i| i > at)
    })
    .await;
    let first_after = d.status("py").await.unwrap().observed.progress["py"].0;
    assert!(first_after > at);
    d.suspend("py").await.unwrap();
    // Profile mode: an embedding, then exit 0.
    d.launch(&LaunchSpec {
        id: "py-profile".into(),
        profile: true,
        ..s.clone()
    })
    .await
    .unwrap();
    let st = d.wait("py-profile", Duration::from_secs(20)).await.unwrap();
    assert_eq!(st.exit_code, Some(0), "{st:?}");
    assert!(
        st.observed.embeddings.contains_key("py"),
        "{:?}",
        st.observed
    );
    // Standby (the pipeline switch): the helper reports `prewarmed`, trains
    // nothing until the start signal, then trains.
    d.launch(&LaunchSpec {
        id: "py-standby".into(),
        standby: true,
        ..s.clone()
    })
    .await
    .unwrap();
    wait_for(
        "prewarmed from python",
        Duration::from_secs(20),
        async || d.status("py-standby").await.unwrap().observed.prewarmed,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = d.status("py-standby").await.unwrap();
    assert!(st.running && st.observed.progress.is_empty(), "{st:?}");
    d.start("py-standby").await.unwrap();
    wait_for(
        "python progress after start",
        Duration::from_secs(20),
        async || {
            !d.status("py-standby")
                .await
                .unwrap()
                .observed
                .progress
                .is_empty()
        },
    )
    .await;
    d.suspend("py-standby").await.unwrap();
}

/// A stop waits for the trainer's checkpoint and exit — seconds for a
/// real trainer — without holding up the rest of the node: while one
/// process is being stopped, another's status, the running count and a
/// launch answer at once (the heartbeat reads them), and the process being
/// stopped reads as running until it has ended.
#[tokio::test]
async fn a_slow_suspend_holds_up_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let d = std::sync::Arc::new(ProcessDriver::new(DriverConfig {
        work_dir: tmp.path().to_path_buf(),
        // The stopped process never checkpoints: the stop waits this long.
        checkpoint_timeout: Duration::from_secs(6),
        grace: Duration::from_secs(3),
        checkpoint_interval: Duration::from_secs(3600),
        pass_env: Vec::new(),
        run_as: None,
    }));
    let ready = tmp.path().join("ready");
    let slow = LaunchSpec {
        command: vec![
            "sh".into(),
            "-c".into(),
            format!("trap '' USR2; touch {}; sleep 60", ready.display()),
        ],
        ..spec("slow", 1, &[])
    };
    d.launch(&slow).await.unwrap();
    d.launch(&spec("other", 1_000_000, &[])).await.unwrap();
    // Its handler is in place (a signal before that would end it).
    wait_for(
        "the slow process ignores SIGUSR2",
        Duration::from_secs(10),
        async || ready.exists(),
    )
    .await;
    let stopping = {
        let d = d.clone();
        tokio::spawn(async move { d.suspend("slow").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let other = d.status("other").await.expect("other is known");
    let slow_now = d.status("slow").await.expect("slow is known");
    let running = d.running().await;
    d.launch(&spec("third", 1_000_000, &[])).await.unwrap();
    let took = t.elapsed();
    assert!(other.running && slow_now.running, "{other:?} {slow_now:?}");
    assert_eq!(running, 2);
    // Holding the table across the stop would take the 6 s timeout.
    assert!(
        took < Duration::from_secs(3),
        "status and launch waited {took:?} for a stop"
    );
    assert!(
        !stopping.is_finished(),
        "the stop is still waiting for a checkpoint"
    );
    stopping.await.unwrap().unwrap();
    assert!(!d.status("slow").await.unwrap().running);
    for id in ["other", "third"] {
        d.terminate(id).await.unwrap();
    }
}

/// A prompt-tuning task launched warm reports `done`, then `warm`, and
/// waits with its model loaded; handed the next task (same model, another
/// job) it runs it without loading the weights again, under the new task's
/// id, writing its output to the new task's folder. Each task's log is its
/// own part of the process's log: the first loaded the weights, the second
/// started warm. SIGTERM then ends it with exit 0.
#[tokio::test]
async fn a_warm_process_runs_the_next_task_without_loading_its_model_again() {
    let work = tempfile::tempdir().unwrap();
    let d = driver(work.path(), 3000);
    let prompt = |id: &str| {
        let mut s = spec(id, 200, &[("FMSCHED_FAKE_TIME_COMPRESSION", "1000")]);
        s.tasks[0].metric = None;
        s.tasks[0].settings.petl = "prompt_tuning".into();
        s.warm = true;
        s
    };
    let first = prompt("p1");
    d.launch(&first).await.unwrap();
    wait_for("p1 done and warm", Duration::from_secs(30), async || {
        d.status("p1")
            .await
            .is_some_and(|s| s.observed.warm && s.observed.done.contains_key("p1"))
    })
    .await;
    let s = d.status("p1").await.unwrap();
    assert!(s.running, "a warm process stays: {s:?}");
    let pid = s.pid;
    // A process not waiting warm cannot be handed a task.
    assert!(d.hand_over("nope", &prompt("p2")).await.is_err());
    let second = prompt("p2");
    d.hand_over("p1", &second).await.unwrap();
    assert!(
        d.status("p1").await.is_none(),
        "known by the new task's id now"
    );
    wait_for("p2 done", Duration::from_secs(30), async || {
        d.status("p2")
            .await
            .is_some_and(|s| s.observed.done.contains_key("p2"))
    })
    .await;
    let s = d.status("p2").await.unwrap();
    assert_eq!(s.pid, pid, "the same process ran it");
    assert!(!s.observed.done.contains_key("p1"), "reports start afresh");
    assert!(
        s.observed.done["p2"].starts_with(&work.path().join("p2").display().to_string()),
        "p2's output is in its own folder: {}",
        s.observed.done["p2"]
    );
    // Each task reads its own part of the process's log.
    let log = |id: &str| String::from_utf8(d.read_log(id, true, 0, 1 << 20).unwrap().0).unwrap();
    let (one, two) = (log("p1"), log("p2"));
    assert!(
        one.contains("loading the runtime and the weights") && !one.contains("warm start"),
        "{one}"
    );
    assert!(
        two.contains("warm start of job p2") && !two.contains("loading the runtime"),
        "{two}"
    );
    let (tail, _) = d.read_log("p2", true, -20, 1 << 20).unwrap();
    assert!(tail.len() <= 20 && two.ends_with(std::str::from_utf8(&tail).unwrap()));
    d.terminate("p2").await.unwrap();
    let s = d.wait("p2", Duration::from_secs(10)).await.unwrap();
    assert_eq!((s.running, s.exit_code), (false, Some(0)), "{s:?}");
}

/// A restarted agent finds the processes its predecessor left running (by
/// their record in the work folder) and stops them: SIGTERM, on which the
/// trainer writes a checkpoint and exits. A second look finds nothing; a
/// record whose process is gone (or whose pid was reused) is only removed.
#[tokio::test]
async fn a_restarted_agent_stops_the_processes_its_predecessor_left() {
    let work = tempfile::tempdir().unwrap();
    let old = driver(work.path(), 3000);
    old.launch(&spec("left", 10_000_000, &[])).await.unwrap();
    wait_for("progress", Duration::from_secs(20), async || {
        old.status("left")
            .await
            .is_some_and(|s| !s.observed.progress.is_empty())
    })
    .await;
    let pid = old.status("left").await.unwrap().pid;
    drop(old); // the agent died; its trainer did not
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "still running"
    );
    // A stale record: a process that is long gone.
    let stale = work.path().join("gone");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(
        stale.join("process.json"),
        r#"{"pgid":999999,"start_ticks":1}"#,
    )
    .unwrap();
    let new = driver(work.path(), 3000);
    assert_eq!(new.stop_orphans().await, 1);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "the orphan is gone: {stat}"
    );
    let ckpts: Vec<_> = std::fs::read_dir(work.path().join("left").join("checkpoints"))
        .unwrap()
        .flatten()
        .collect();
    assert!(!ckpts.is_empty(), "it checkpointed on SIGTERM");
    assert!(!stale.join("process.json").exists());
    assert_eq!(new.stop_orphans().await, 0);
}

/// An agent killed after it started a process and before it wrote the
/// process's record leaves an orphan with no record. The restarted agent
/// finds it by its checkpoint folder in the work folder and stops it; a
/// process of another agent's work folder, recorded or not, is left alone.
#[tokio::test]
async fn a_restarted_agent_stops_an_orphan_whose_record_was_never_written() {
    let root = tempfile::tempdir().unwrap();
    let (work, other_work) = (root.path().join("node-a"), root.path().join("node-b"));
    let old = driver(&work, 3000);
    let other = driver(&other_work, 3000);
    old.launch(&spec("unrecorded", 10_000_000, &[]))
        .await
        .unwrap();
    other
        .launch(&spec("neighbour", 10_000_000, &[]))
        .await
        .unwrap();
    for (d, id) in [(&old, "unrecorded"), (&other, "neighbour")] {
        wait_for("progress", Duration::from_secs(20), async || {
            d.status(id)
                .await
                .is_some_and(|s| !s.observed.progress.is_empty())
        })
        .await;
    }
    let pid = old.status("unrecorded").await.unwrap().pid;
    let neighbour = other.status("neighbour").await.unwrap().pid;
    drop(old);
    // The window: the process runs, its record is not on disk.
    let record = work.join("unrecorded").join("process.json");
    std::fs::remove_file(&record).expect("the driver records what it starts");
    let new = driver(&work, 3000);
    assert_eq!(new.stop_orphans().await, 1);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "the orphan is gone: {stat}"
    );
    assert!(
        std::fs::read_dir(work.join("unrecorded").join("checkpoints"))
            .unwrap()
            .next()
            .is_some(),
        "it checkpointed on SIGTERM"
    );
    let s = other.status("neighbour").await.unwrap();
    assert!(s.running && s.pid == neighbour, "{s:?}");
    assert_eq!(new.stop_orphans().await, 0);
    other.terminate("neighbour").await.unwrap();
    other
        .wait("neighbour", Duration::from_secs(10))
        .await
        .unwrap();
}
