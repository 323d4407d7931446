//! End-to-end tests: fmctl.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use fmsched_integration::*;

use crate::{
    ROOT, agent, fmctl, job_yaml, job_yaml_env, jobs, kill_processes_with_env, running_job, submit,
};

#[tokio::test]
async fn e2e_fmctl_logs_prints_and_follows_a_jobs_output() {
    let c = Cluster::builder("fmsched_logs")
        .agent("node-a")
        .start()
        .await;
    let (dir, port) = (&c.dir, c.port);
    submit(
        port,
        dir.path(),
        [("logged".to_string(), job_yaml("logged", "rte", 3000, 1))],
    )
    .expect("submit");
    let id = running_job(port);
    // Standard error: the trainer's start-up line, from the node's log file.
    let err = wait_for(
        "stderr has the start-up line",
        Duration::from_secs(10),
        || {
            let out = fmctl(port, &["logs", &id, "--stderr"])?;
            if out.contains("fake-trainer: training rte on 1") {
                Ok(out)
            } else {
                Err(out)
            }
        },
    );
    assert!(err.contains("s/iteration"), "{err}");
    // Following standard output ends when the job does, with every epoch.
    let started = Instant::now();
    let out = fmctl(port, &["logs", &id, "--follow"]).expect("logs --follow");
    let state = jobs(port).unwrap()[&id].0.clone();
    assert_eq!(
        state, "completed",
        "--follow returned only when the job ended"
    );
    let epochs = out.lines().filter(|l| l.starts_with("epoch ")).count();
    // 3000 iterations of 32 samples over 3200 samples per epoch: 30 epochs.
    assert!(
        epochs >= 29,
        "{epochs} epoch lines after {:?}:\n{out}",
        started.elapsed()
    );
    assert!(out.contains("epoch 30 rte"), "{out}");
    // Its profiling run's output, still there after it trained; following
    // it ends at once (the run is over).
    let prof = fmctl(port, &["logs", &id, "--profile", "--stderr", "--follow"]).unwrap();
    assert!(prof.contains("fake-trainer: profiling rte on 1"), "{prof}");
    assert!(!prof.contains("fake-trainer: training"), "{prof}");
    let e = fmctl(port, &["logs", &id, "--profile", "--rank", "1"]).unwrap_err();
    assert!(e.contains("rank"), "{e}");
    // A bounded tail.
    let tail = fmctl(port, &["logs", &id, "--tail", "100"]).unwrap();
    assert!(tail.len() <= 100 && !tail.is_empty(), "{tail:?}");
    // Errors name what is wrong.
    let e = fmctl(port, &["logs", "01a20000-0000-7000-8000-000000000000"]).unwrap_err();
    assert!(e.contains("not found"), "{e}");
}

/// `fmctl logs --follow` follows a job to the node it resumes on when its
/// node is lost, says so on stderr, and ends when the job completes.
#[tokio::test]
async fn e2e_fmctl_logs_follow_a_job_to_its_new_node() {
    let c = Cluster::builder("fmsched_logmove").start().await;
    let (dir, port) = (&c.dir, c.port);
    let mut agents: BTreeMap<&str, Proc> = ["node-a", "node-b"]
        .into_iter()
        .map(|n| (n, agent(n, port, dir.path())))
        .collect();
    submit(
        port,
        dir.path(),
        [("moving".to_string(), job_yaml("moving", "rte", 6000, 1))],
    )
    .expect("submit");
    let id = running_job(port);
    let node = wait_for("its node", Duration::from_secs(10), || {
        ["node-a", "node-b"]
            .into_iter()
            .find(|n| dir.path().join(n).join(&id).join("stdout.log").exists())
            .ok_or_else(|| "no task folder yet".to_string())
    });
    let other = if node == "node-a" { "node-b" } else { "node-a" };
    let (out_path, err_path) = (dir.path().join("follow.out"), dir.path().join("follow.err"));
    let mut follow = Command::new(bin("fmctl"))
        .args(["logs", &id, "--follow"])
        .env("FMSCHED_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("FMSCHED_TOKEN", ROOT)
        .env("FMCTL_CONFIG", "/dev/null")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_for("following", Duration::from_secs(30), || {
        let out = read(&out_path);
        if out.contains("epoch 2 ") {
            Ok(())
        } else {
            Err(out)
        }
    });
    // The node is lost: its agent and its training process.
    agents.get_mut(node).unwrap().kill9();
    let killed = kill_processes_with_env(&format!("{}", dir.path().join(node).display()));
    assert!(killed >= 1, "the job's trainer was on {node}");
    let status = wait_for(
        "--follow ends with the job",
        Duration::from_secs(120),
        || {
            follow
                .try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "still following".to_string())
        },
    );
    let (out, err) = (read(&out_path), read(&err_path));
    assert!(status.success(), "{err}");
    assert_eq!(jobs(port).unwrap()[&id].0, "completed");
    assert!(
        err.contains(&format!("--- now node {other}")),
        "stderr: {err}"
    );
    // 6000 iterations of 32 samples over 3200 samples per epoch: 60 epochs,
    // the last ones written on the other node.
    assert!(out.contains("epoch 60 rte"), "{out}");
    assert!(
        std::fs::read_to_string(dir.path().join(other).join(&id).join("stdout.log"))
            .unwrap()
            .contains("epoch 60 rte")
    );
}

/// `fmctl` as the admin: exit status, stdout, stderr.
fn fmctl_status(port: u16, args: &[&str]) -> (Option<i32>, String, String) {
    let out = fmctl_command(port, ROOT)
        .args(args)
        .output()
        .expect("fmctl runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `fmctl submit --wait` streams the jobs' events to their end and exits
/// with the outcome (0 completed, 3 failed: the worst of several); `fmctl
/// jobs --watch` keeps printing the list when it changes; `fmctl
/// completions` prints a shell script without a scheduler or a token.
#[tokio::test]
async fn e2e_fmctl_submit_wait_exits_with_the_outcome_and_jobs_watch_follows() {
    let c = Cluster::builder("fmsched_fmctl")
        .scheduler_env(&[
            ("FMSCHED_SCHEDULING__MAX_RETRIES", "0"),
            ("FMSCHED_SCHEDULING__MERGING", "false"),
        ])
        .agent("node-a")
        .start()
        .await;
    let (dir, port) = (&c.dir, c.port);
    let file = |name: &str, yaml: String| {
        let p = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&p, yaml).unwrap();
        p.display().to_string()
    };
    let ok = file("ok", job_yaml("ok", "sst2", 200, 1));
    let bad = file(
        "bad",
        job_yaml_env("bad", "cola", 400, 1, ", FMSCHED_FAKE_CRASH_AT: \"50\""),
    );
    // jobs --watch, started first, sees the jobs come and change.
    let mut watch = fmctl_command(port, ROOT)
        .args(["jobs", "--watch", "--interval", "200ms"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    let (code, out, err) = fmctl_status(port, &["submit", "--wait", &ok]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("submitted"), "{out}");
    assert!(out.contains("-> completed"), "no completion event:\n{out}");
    assert!(err.contains("(ok) completed"), "{err}");

    let (code, out, err) = fmctl_status(port, &["submit", "--wait", &bad]);
    assert_eq!(code, Some(3), "a failed job exits 3:\n{out}\n{err}");
    assert!(err.contains("(bad) failed"), "{err}");

    // Several at once: events prefixed by name, the worst outcome wins.
    let ok2 = file("ok2", job_yaml("ok2", "rte", 100, 1));
    let bad2 = file(
        "bad2",
        job_yaml_env("bad2", "mrpc", 400, 1, ", FMSCHED_FAKE_CRASH_AT: \"30\""),
    );
    let (code, out, err) = fmctl_status(port, &["submit", "--wait", &ok2, &bad2]);
    assert_eq!(code, Some(3), "{out}\n{err}");
    assert!(out.contains("ok2: ") && out.contains("bad2: "), "{out}");
    assert!(
        err.contains("(ok2) completed") && err.contains("(bad2) failed"),
        "{err}"
    );

    // The watch printed a list with every job in its final state, and
    // printed again only on changes (fewer lists than 200 ms ticks).
    tokio::time::sleep(Duration::from_millis(600)).await;
    watch.kill().unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(watch.stdout.as_mut().unwrap(), &mut text).unwrap();
    watch.wait().unwrap();
    let lists: Vec<&str> = text.split("\n# ").collect();
    let last = lists.last().unwrap();
    for name in ["ok ", "bad ", "ok2 ", "bad2 "] {
        assert!(
            last.contains(name),
            "{name} missing from the last list:\n{last}"
        );
    }
    assert_eq!(last.matches("completed").count(), 2, "{last}");
    assert_eq!(last.matches("failed").count(), 2, "{last}");
    assert!(lists.len() >= 3, "the list never changed:\n{text}");
    let unchanged = lists
        .windows(2)
        .filter(|w| w[0].split_once('\n').map(|x| x.1) == w[1].split_once('\n').map(|x| x.1));
    assert_eq!(unchanged.count(), 0, "printed an unchanged list:\n{text}");

    // Completions need neither a scheduler nor a token.
    let out = Command::new(bin("fmctl"))
        .args(["completions", "bash"])
        .env_remove("FMSCHED_TOKEN")
        .output()
        .unwrap();
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && script.contains("_fmctl") && script.contains("submit"));
}
