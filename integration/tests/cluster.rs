//! End to end: Postgres + the real `scheduler-svc` + two `node-agent`s with
//! fake GPUs + `fmctl`. Submit the example jobs, see both nodes with GPUs
//! and telemetry, `kill -9` the scheduler and restart it (same jobs and
//! states; agents re-register within their backoff), then kill an agent and
//! watch it become Suspect, then Offline.

use std::process::Command;
use std::time::Duration;

use fmsched_integration::*;
use serde_json::Value;

const ROOT_TOKEN: &str = "root-token-0123456789ab";
const ALICE_TOKEN: &str = "alice-token-0123456789a";
const JOIN: &str = "join-token-0123456789abc";

fn scheduler(db: &str, port: u16, dir: &std::path::Path) -> Proc {
    let mut c = Command::new(bin("scheduler-svc"));
    c.env("FMSCHED_DATABASE_URL", db_url(db))
        .env("FMSCHED_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env(
            "FMSCHED_API_TOKENS",
            format!("root={ROOT_TOKEN},alice={ALICE_TOKEN}"),
        )
        .env("FMSCHED_JOIN_TOKEN", JOIN)
        .env("FMSCHED_AUTH__ADMINS", "root")
        .env("FMSCHED_LIVENESS__HEARTBEAT_INTERVAL", "300ms")
        .env("FMSCHED_LIVENESS__SUSPECT_AFTER", "1500ms")
        .env("FMSCHED_LIVENESS__OFFLINE_AFTER", "3s")
        .env("FMSCHED_LIVENESS__CHECK_INTERVAL", "100ms")
        // This test is about the API, the registry and restarts; the
        // scheduling loop has its own end-to-end test (e2e_jobs_run_to_completion).
        .env("FMSCHED_SCHEDULING__ENABLED", "false")
        .env("RUST_LOG", "info");
    Proc::spawn("scheduler", c, dir)
}

fn agent(node: &str, port: u16, dir: &std::path::Path) -> Proc {
    let mut c = Command::new(bin("node-agent"));
    c.args([
        "--scheduler",
        &format!("http://127.0.0.1:{port}"),
        "--node-id",
        node,
    ])
    .args([
        "--fake-gpus",
        "4",
        "--fake-gpu-model",
        "A100-80GB",
        "--label",
        "zone=test",
    ])
    .env("FMSCHED_JOIN_TOKEN", JOIN)
    .env("FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER", "true")
    .env("FMSCHED_AGENT_RECONNECT__INITIAL_DELAY", "100ms")
    .env("FMSCHED_AGENT_RECONNECT__MAX_DELAY", "1s")
    .env("RUST_LOG", "info");
    Proc::spawn(node, c, dir)
}

fn fmctl_json(port: u16, args: &[&str]) -> Result<Value, String> {
    let mut a = vec!["-o", "json"];
    a.extend_from_slice(args);
    let s = fmctl(port, ROOT_TOKEN, &a)?;
    serde_json::from_str(&s).map_err(|e| format!("{e}: {s}"))
}

/// (id, state) of every job, sorted.
fn job_states(port: u16) -> Result<Vec<(String, String)>, String> {
    let v = fmctl_json(port, &["jobs"])?;
    let mut out: Vec<(String, String)> = v
        .as_array()
        .ok_or("not an array")?
        .iter()
        .map(|j| {
            (
                j["id"].as_str().unwrap().to_string(),
                j["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Nodes as (id, state, connected, gpus with telemetry).
fn nodes(port: u16) -> Result<Vec<(String, String, bool, usize)>, String> {
    let v = fmctl_json(port, &["nodes"])?;
    Ok(v.as_array()
        .ok_or("not an array")?
        .iter()
        .map(|n| {
            let with_telemetry = n["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|g| !g["telemetry"].is_null())
                .count();
            (
                n["id"].as_str().unwrap().to_string(),
                n["state"].as_str().unwrap().to_string(),
                n["connected"].as_bool().unwrap(),
                with_telemetry,
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn e2e_submit_restart_scheduler_and_lose_an_agent() {
    let db = TestDb::create("fmsched_it").await;
    let dir = tempfile_dir();
    let port = free_port();
    let mut sched = scheduler(&db, port, &dir);
    wait_for("scheduler to serve", Duration::from_secs(30), || {
        fmctl(port, ROOT_TOKEN, &["summary"]).map(|_| ())
    });
    let _a = agent("gpu-a", port, &dir);
    let mut b = agent("gpu-b", port, &dir);

    // Submit every example as alice.
    let examples: Vec<String> = std::fs::read_dir(repo_root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(examples.len() >= 3);
    let mut args = vec!["-o", "json", "submit", "--idempotency-key", "e2e"];
    args.extend(examples.iter().map(String::as_str));
    let out: Value = serde_json::from_str(&fmctl(port, ALICE_TOKEN, &args).unwrap()).unwrap();
    assert_eq!(out.as_array().unwrap().len(), examples.len());
    assert!(out.as_array().unwrap().iter().all(|r| r["created"] == true));

    // Both nodes registered, every GPU reporting telemetry.
    wait_for("two nodes with telemetry", Duration::from_secs(30), || {
        let n = nodes(port)?;
        let ok = n.len() == 2
            && n.iter()
                .all(|(_, st, conn, tel)| st == "available" && *conn && *tel == 4);
        if ok { Ok(()) } else { Err(format!("{n:?}")) }
    });
    let table = fmctl(port, ROOT_TOKEN, &["nodes"]).unwrap();
    assert!(
        table.contains("gpu-a") && table.contains("A100-80GB") && table.contains("fake"),
        "{table}"
    );
    let before = job_states(port).unwrap();
    assert_eq!(before.len(), examples.len());

    // kill -9 the scheduler and start it again on the same port.
    sched.kill9();
    assert!(
        fmctl(port, ROOT_TOKEN, &["summary"]).is_err(),
        "scheduler is down"
    );
    let _sched2 = scheduler(&db, port, &dir);
    wait_for("scheduler back", Duration::from_secs(30), || {
        fmctl(port, ROOT_TOKEN, &["summary"]).map(|_| ())
    });
    assert_eq!(
        job_states(port).unwrap(),
        before,
        "same jobs, same states after kill -9"
    );
    // Agents reconnect within their backoff (max 1 s) and re-register.
    wait_for("agents re-registered", Duration::from_secs(10), || {
        let n = nodes(port)?;
        if n.len() == 2
            && n.iter()
                .all(|(_, st, conn, tel)| st == "available" && *conn && *tel == 4)
        {
            Ok(())
        } else {
            Err(format!("{n:?}"))
        }
    });
    // Re-submitting with the same key creates nothing new.
    let again: Value = serde_json::from_str(&fmctl(port, ALICE_TOKEN, &args).unwrap()).unwrap();
    assert!(
        again
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["created"] == false)
    );
    assert_eq!(job_states(port).unwrap(), before);

    // Lose an agent: Suspect, then Offline.
    b.kill9();
    let mut seen_suspect = false;
    wait_for("gpu-b offline", Duration::from_secs(15), || {
        let n = nodes(port)?;
        let st = n
            .iter()
            .find(|x| x.0 == "gpu-b")
            .map(|x| x.1.clone())
            .unwrap_or_default();
        seen_suspect |= st == "suspect";
        if st == "offline" { Ok(()) } else { Err(st) }
    });
    assert!(seen_suspect, "gpu-b passed through suspect");
    let n = nodes(port).unwrap();
    assert_eq!(n.iter().find(|x| x.0 == "gpu-a").unwrap().1, "available");

    // Errors are one clear line with a non-zero exit.
    let e = fmctl(
        port,
        ALICE_TOKEN,
        &["job", "00000000-0000-0000-0000-000000000000"],
    )
    .unwrap_err();
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("not found"), "{e}");
    let e = fmctl(port, "bad-token-000000000000", &["jobs"]).unwrap_err();
    assert!(e.contains("unauthenticated"), "{e}");

    // Secrets never reach the logs.
    let logs = [&sched, &_sched2, &_a, &b].map(|p| p.log_text());
    assert!(
        logs[1].contains("agent registered"),
        "scheduler logs registrations"
    );
    for (text, who) in logs
        .iter()
        .zip(["scheduler", "scheduler (restarted)", "gpu-a", "gpu-b"])
    {
        for secret in [ROOT_TOKEN, ALICE_TOKEN, JOIN] {
            assert!(!text.contains(secret), "{who} log contains a token");
        }
    }

    drop(_a);
    drop(_sched2);
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fmsched-it-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
