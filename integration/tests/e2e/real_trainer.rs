//! End-to-end tests: real trainer.

use std::process::Command;
use std::time::{Duration, Instant};

use fmsched_integration::*;
use sqlx::Connection;

use crate::{agent_env, all_completed, fmctl, jobs, print_events, scheduler_env, submit, wait_up};

/// The Python that runs the real example trainers (`scripts/trainer-venv.sh`
/// prints it; `scripts/test.sh` exports it as `REAL_TRAINER_PYTHON`).
/// `None` — and the test returns — only when it is not given and
/// `REQUIRE_REAL_TRAINER` is not `1`; `scripts/test.sh` sets both,
/// so CI always runs the real path.
fn real_trainer_python() -> Option<String> {
    match std::env::var("REAL_TRAINER_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            assert!(
                std::env::var("REQUIRE_REAL_TRAINER").as_deref() != Ok("1"),
                "REQUIRE_REAL_TRAINER=1 but REAL_TRAINER_PYTHON is not set \
                 (python=$(scripts/trainer-venv.sh))"
            );
            eprintln!(
                "SKIPPED: set REAL_TRAINER_PYTHON=$(scripts/trainer-venv.sh) to run the real trainer"
            );
            None
        }
    }
}

/// Writes a synthetic sentiment dataset (`fmsched_trainer.examples.synthetic
/// glue`) to `dir`.
fn synthetic_glue(python: &str, dir: &std::path::Path, args: &[&str]) {
    let out = run(Command::new(python)
        .args(["-m", "fmsched_trainer.examples.synthetic", "glue"])
        .arg(dir)
        .args(args)
        .env("PYTHONPATH", repo_root().join("python")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An agent (4 fake GPUs) for real trainers: Python with torch starts,
/// checkpoints and exits in seconds, not milliseconds.
fn real_trainer_agent(port: u16, dir: &std::path::Path, checkpoint_interval: &str) -> Proc {
    agent_env(
        "node-a",
        &format!("http://127.0.0.1:{port}"),
        dir,
        None,
        &[
            ("FMSCHED_AGENT_PROCESSES__GRACE", "30s"),
            ("FMSCHED_AGENT_PROCESSES__CHECKPOINT_TIMEOUT", "30s"),
            (
                "FMSCHED_AGENT_PROCESSES__CHECKPOINT_INTERVAL",
                checkpoint_interval,
            ),
        ],
    )
}

/// A job of the real `glue` example trainer (PyTorch + HF `Trainer`, a tiny
/// randomly initialised RoBERTa, bytes as tokens) on 4 fake GPUs.
fn real_glue_job(
    python: &str,
    name: &str,
    data: &std::path::Path,
    target: &str,
    extra: &str,
) -> String {
    format!(
        "name: {name}\nmodel: roberta-base\n\
         dataset: {{ uri: \"file://{}\", task: {name}, num_samples: 512, objective: sequence-classification }}\n\
         hyperparameters: {{ global_batch_size: 16, learning_rate: 0.001, amp: false }}\n\
         target: {target}\n\
         resources: {{ min_gpus: 4, max_gpus: 4 }}\n{extra}\
         launch:\n  command: [\"{python}\", -m, fmsched_trainer.examples.glue, --tiny, --profile-steps, \"40\", --logging-steps, \"5\"]\n\
         \x20 env: {{ PYTHONPATH: \"{}\", HF_HUB_OFFLINE: \"1\", OMP_NUM_THREADS: \"1\" }}\n",
        data.display(),
        repo_root().join("python").display()
    )
}

/// The losses HF's `Trainer` printed (`{'loss': '0.69', …}` lines).
fn printed_losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.split("'loss': ").nth(1)?;
            rest.trim_start_matches(['\'', '"'])
                .split(['\'', '"', ','])
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The real path on this machine's CPU: a PyTorch/HF trainer under the
/// real scheduler (UniSched, short leases) and agent. Job A is profiled
/// (real gradients → a Task2Vec embedding, step times → the estimate),
/// runs, checkpoints; a strict-SLO job B takes its GPUs, so A is suspended
/// (SIGUSR2 → checkpoint → SIGTERM) and later resumed from that checkpoint
/// with its iteration counter going on; both complete with their weights
/// written and A's loss going down.
#[tokio::test]
async fn e2e_real_trainer_profile_run_suspend_resume_complete() {
    let Some(python) = real_trainer_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    synthetic_glue(&python, &dir.path().join("sent-a"), &[]);
    synthetic_glue(&python, &dir.path().join("sent-b"), &["--flip"]);
    let db = TestDb::create("fmsched_real").await;
    let port = free_port();
    let _sched = scheduler_env(
        &db,
        port,
        dir.path(),
        None,
        &[
            ("FMSCHED_SCHEDULING__POLICY", "unisched"),
            // Leases well above a Python trainer's start-up (about 10 s
            // here): shorter ones hand the GPUs back and forth faster than
            // either process starts.
            ("FMSCHED_SCHEDULING__KNOBS__BE_LEASE_S", "20"),
            ("FMSCHED_SCHEDULING__KNOBS__SLO_LEASE_S", "60"),
        ],
    );
    wait_up("scheduler up", port);
    let _agent = real_trainer_agent(port, dir.path(), "2s");
    let a = real_glue_job(
        &python,
        "real-a",
        &dir.path().join("sent-a"),
        "{ max_iterations: 1500 }",
        "",
    );
    submit(port, dir.path(), [("real-a".to_string(), a)]).expect("submit A");
    let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
    // A runs and has written a checkpoint.
    let until = Instant::now() + Duration::from_secs(120);
    let (a_id, first_ckpt) = loop {
        let row: Option<(uuid::Uuid, String, Option<i64>)> = sqlx::query_as(
            "SELECT j.id, j.state, p.iteration FROM jobs j LEFT JOIN job_progress p ON p.job_id = j.id
             WHERE j.name = 'real-a' AND p.checkpoint_path IS NOT NULL",
        )
        .fetch_optional(&mut c)
        .await
        .unwrap();
        match row {
            Some((id, s, Some(it))) if s == "running" && it > 0 => break (id, it),
            Some((_, s, _)) if s == "failed" => panic!(
                "A failed: {:?}",
                fmctl(port, &["logs", "real-a", "--stderr"])
            ),
            _ => {}
        }
        assert!(
            Instant::now() < until,
            "A never ran with a checkpoint: {:?}",
            jobs(port)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(300);
    let b = real_glue_job(
        &python,
        "real-b",
        &dir.path().join("sent-b"),
        "{ max_iterations: 300 }",
        &format!("deadline: \"{}\"\nslo_class: slo\n", deadline.to_rfc3339()),
    );
    submit(port, dir.path(), [("real-b".to_string(), b)]).expect("submit B");
    let done = all_completed(port, 2, Duration::from_secs(300));
    let a_key = a_id.to_string();
    // Profiling: the real probe's embedding and measured step time.
    let (fisher, step_time): (Vec<f64>, Option<f64>) =
        sqlx::query_as("SELECT fisher, step_time_s FROM job_estimates WHERE job_id = $1")
            .bind(a_id)
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert!(
        !fisher.is_empty() && fisher.iter().all(|x| x.is_finite()),
        "no Task2Vec embedding"
    );
    assert!(step_time.is_some_and(|s| s > 0.0), "no measured step time");
    // Suspended and resumed.
    let events: Vec<(String, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT coalesce(from_state, ''), coalesce(to_state, ''), at FROM job_events WHERE job_id = $1 ORDER BY seq",
    )
    .bind(a_id)
    .fetch_all(&mut c)
    .await
    .unwrap();
    let suspended = events
        .iter()
        .position(|e| e.0 == "running" && e.1 == "queued");
    let Some(s) = suspended else {
        panic!("A was never suspended: {events:?}")
    };
    let resumed = events[s..]
        .iter()
        .find(|e| e.0 == "queued" && e.1 == "running")
        .expect("A resumed");
    let err = fmctl(port, &["logs", &a_key, "--stderr"]).unwrap();
    let out = fmctl(port, &["logs", &a_key]).unwrap();
    // The resumed process started from a checkpoint at or after the first
    // one seen, and went on counting from there.
    let resumes: Vec<u64> = err
        .lines()
        .filter_map(|l| {
            l.split("fmsched_trainer: train from iteration ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        resumes.iter().any(|&it| it >= first_ckpt as u64),
        "no training run started from A's checkpoint ({first_ckpt}): {resumes:?}\n{err}"
    );
    assert!(err.contains("resuming from "), "{err}");
    let losses = printed_losses(&out);
    assert!(losses.len() >= 10, "{out}");
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(
        last < 0.5 * first,
        "the loss did not go down: {first} → {last}"
    );
    for (id, (_, output)) in &done {
        let weights = std::path::Path::new(output).join("model.safetensors");
        assert!(
            weights.exists(),
            "job {id}: no weights at {}",
            weights.display()
        );
    }
    // Figures for the record.
    let ckpt: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(": checkpoint "))
        .collect();
    let stop: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("stopped on SIGTERM"))
        .collect();
    let progress_after: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT max(at) FROM job_events WHERE job_id = $1 AND to_state = 'completed'",
    )
    .bind(a_id)
    .fetch_one(&mut c)
    .await
    .unwrap();
    eprintln!(
        "real trainer: Task2Vec dimension {}, profiled step {:.4} s; suspended {}, resumed after {:.1} s; \
         runs started at iterations {resumes:?}; loss {first:.3} → {last:.3} over {} reports; A done {:.1} s after its resume",
        fisher.len(),
        step_time.unwrap_or_default(),
        events[s].2,
        (resumed.2 - events[s].2).num_milliseconds() as f64 / 1000.0,
        losses.len(),
        progress_after.map_or(0.0, |t| (t - resumed.2).num_milliseconds() as f64 / 1000.0)
    );
    let all = print_events(&mut c).await;
    // A real trainer never failed on the way.
    let failures: Vec<_> = all
        .iter()
        .filter(|e| e.3.contains("exited with code"))
        .collect();
    assert!(failures.is_empty(), "a trainer failed: {failures:#?}");
    // The node's heartbeats went on while a trainer took seconds to
    // checkpoint and exit.
    let suspect: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM node_events WHERE kind = 'state_changed' AND message = 'suspect'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(suspect, 0, "the node went suspect during a suspension");
    eprintln!("checkpoints: {}", ckpt.last().copied().unwrap_or("none"));
    eprintln!("suspend: {}", stop.first().copied().unwrap_or("none"));
    for l in err
        .lines()
        .filter(|l| l.contains("after the process started"))
    {
        eprintln!("start-up: {l}");
    }
    drop(c);
}

/// Merges with the real trainer under Ymir: two jobs of one model on
/// related data arrive together on a node that holds one at a time. The
/// merger pairs them, and the pair runs as decided: a temporal merge A ↦ B
/// has A's process score B every epoch (the merge guard's input) and B's
/// process start from A's output weights; a spatial merge trains both in
/// one process, each finishing on its own.
#[tokio::test]
async fn e2e_real_trainer_a_merged_pair_runs_as_the_merger_decided() {
    let Some(python) = real_trainer_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Two samples of one sentiment task: each gains from the other.
    for (name, seed) in [("sent-a", "1"), ("sent-b", "2")] {
        synthetic_glue(
            &python,
            &dir.path().join(name),
            &["--train", "2048", "--seed", seed],
        );
    }
    let db = TestDb::create("fmsched_real").await;
    let port = free_port();
    // Ymir plans on an estimate's pessimistic side (`risk_weight`), and
    // the spread comes from how many loss points the profiling run saw:
    // under a loaded suite it saw fewer, the spread widened, and the
    // merger ran the two apart (no merge to check). This test is about
    // the pair running as decided, so it plans on the estimates alone.
    let _sched = scheduler_env(
        &db,
        port,
        dir.path(),
        None,
        &[("FMSCHED_SCHEDULING__KNOBS__RISK_WEIGHT", "0")],
    );
    wait_up("scheduler up", port);
    let _agent = real_trainer_agent(port, dir.path(), "5s");
    let target = "{ max_epochs: 4, metric: { name: accuracy, value: 0.999 } }";
    let job = |name: &str, data: &str| {
        let spec = real_glue_job(&python, name, &dir.path().join(data), target, "")
            .replace("num_samples: 512", "num_samples: 2048");
        (name.to_string(), spec)
    };
    submit(
        port,
        dir.path(),
        [job("real-a", "sent-a"), job("real-b", "sent-b")],
    )
    .expect("submit");
    let done = all_completed(port, 2, Duration::from_secs(300));
    let mut c = sqlx::PgConnection::connect(&db_url(&db)).await.unwrap();
    let merges: Vec<(String, String, String, String, bool)> = sqlx::query_as(
        "SELECT job_a::text, job_b::text, mode, state, guard_passed FROM merges ORDER BY id",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    eprintln!("merges: {merges:?}");
    let events = print_events(&mut c).await;
    let failures: Vec<_> = events
        .iter()
        .filter(|e| e.3.contains("exited with code"))
        .collect();
    assert!(failures.is_empty(), "a trainer failed: {failures:#?}");
    let (first, second, mode) = merges
        .iter()
        .find(|m| m.3 == "active")
        .map(|m| (m.0.clone(), m.1.clone(), m.2.clone()))
        .unwrap_or_else(|| panic!("no kept merge of the two: {merges:?}"));
    let first_err = fmctl(port, &["logs", &first, "--stderr"]).unwrap();
    eprintln!("{mode} merge; the first job's log:\n{first_err}");
    if mode == "temporal" {
        assert!(
            first_err.contains(&format!("watching {second}")),
            "A's process did not score B:\n{first_err}"
        );
        // B starts from A's output, not from a checkpoint of its own.
        let first_out = &done[&first].1;
        let second_err = fmctl(port, &["logs", &second, "--stderr"]).unwrap();
        eprintln!("the second job's log:\n{second_err}");
        assert!(
            second_err.contains(&format!("weights from {first_out}")),
            "B did not start from A's output {first_out}:\n{second_err}"
        );
        assert!(!second_err.contains("resuming from"), "{second_err}");
    } else {
        // One process trained both, and each finished with its own weights.
        assert!(first_err.contains("spatial merge"), "{first_err}");
        for id in [&first, &second] {
            assert!(
                first_err.contains(&format!("({id}) done")),
                "{id} did not finish in the joint process:\n{first_err}"
            );
            let w = std::path::Path::new(&done[id].1).join("model.safetensors");
            assert!(w.exists(), "{}", w.display());
        }
    }
    drop(c);
}
