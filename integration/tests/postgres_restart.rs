//! Postgres restarts under a running cluster: the scheduler keeps serving
//! (rounds fail while the database is down, then resume), the leader keeps
//! its lease through an outage shorter than the lease, and every job
//! completes. Runs its own throw-away Postgres
//! (Debian's binaries, as `scripts/dev-up.sh` does), so the shared test
//! server is never restarted.

use std::process::Command;
use std::time::{Duration, Instant};

use fmsched_integration::*;
use serde_json::Value;

const ROOT: &str = "root-token-0123456789ab";
const JOIN: &str = "join-token-0123456789abc";

fn states(port: u16) -> Result<Vec<String>, String> {
    let v: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "jobs"])?).map_err(|e| e.to_string())?;
    Ok(v.as_array()
        .ok_or("not an array")?
        .iter()
        .map(|j| j["state"].as_str().unwrap_or_default().to_string())
        .collect())
}

#[test]
fn e2e_a_postgres_restart_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pgc = PrivatePostgres::start(dir.path());
    let port = free_port();
    let mut c = Command::new(bin("scheduler-svc"));
    c.env("FMSCHED_DATABASE_URL", pgc.url())
        .env("FMSCHED_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("FMSCHED_API_TOKENS", format!("root={ROOT}"))
        .env("FMSCHED_JOIN_TOKEN", JOIN)
        .env("FMSCHED_AUTH__ADMINS", "root")
        .env("FMSCHED_LIVENESS__HEARTBEAT_INTERVAL", "200ms")
        .env("FMSCHED_SCHEDULING__INTERVAL", "1s")
        .env("RUST_LOG", "info");
    let sched = Proc::spawn("scheduler", c, dir.path());
    wait_for("scheduler up", Duration::from_secs(30), || {
        fmctl(port, &["summary"]).map(|_| ())
    });
    let mut a = Command::new(bin("node-agent"));
    a.args([
        "--scheduler",
        &format!("http://127.0.0.1:{port}"),
        "--node-id",
        "node-a",
    ])
    .args(["--fake-gpus", "4", "--fake-gpu-model", "A100-80GB"])
    .env("FMSCHED_JOIN_TOKEN", JOIN)
    .env("FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER", "true")
    .env(
        "FMSCHED_AGENT_PROCESSES__WORK_DIR",
        dir.path().join("node-a"),
    )
    .env("FMSCHED_AGENT_PROCESSES__CHECKPOINT_INTERVAL", "1s")
    .env("FMSCHED_AGENT_RECONNECT__MAX_DELAY", "1s");
    let _agent = Proc::spawn("node-a", a, dir.path());
    let jobs = (0..4).map(|k| {
        let manifest = format!(
            "name: j{k}\nmodel: roberta-base\ndataset: {{ uri: file:///d, task: t{k}, num_samples: 3200 }}\n\
             hyperparameters: {{ global_batch_size: 32, learning_rate: 2.0e-5, amp: true }}\ntarget: {{ max_iterations: 2500 }}\n\
             resources: {{ min_gpus: 1, max_gpus: 1 }}\nlaunch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"40\" }}\n",
            bin("fake-trainer").display()
        );
        (format!("j{k}"), manifest)
    });
    submit_manifests(port, ROOT, dir.path(), jobs).expect("submit");
    wait_for("jobs running", Duration::from_secs(30), || {
        let s = states(port)?;
        if s.iter().filter(|x| *x == "running").count() >= 2 {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    });
    // Postgres goes away for a few seconds and comes back.
    let t = Instant::now();
    pgc.ctl("stop");
    std::thread::sleep(Duration::from_secs(3));
    pgc.ctl("start");
    let done = wait_for(
        "every job completed after the restart",
        Duration::from_secs(120),
        || {
            let s = states(port)?;
            if s.len() == 4 && s.iter().all(|x| x == "completed") {
                Ok(s)
            } else {
                Err(format!("{s:?}"))
            }
        },
    );
    eprintln!(
        "completed {} jobs {:?} after the Postgres restart",
        done.len(),
        t.elapsed()
    );
    let log = sched.log_text();
    // The outage was shorter than the lease: the leader kept its term
    // throughout (renewals waited for the database, none lapsed).
    assert_eq!(
        log.matches("now the active scheduler").count(),
        1,
        "one term throughout a restart shorter than the lease"
    );
    assert!(!log.contains("lost the leader lease"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// `fmctl` as the admin.
fn fmctl(port: u16, args: &[&str]) -> Result<String, String> {
    fmsched_integration::fmctl(port, ROOT, args)
}
