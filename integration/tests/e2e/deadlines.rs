//! End-to-end tests: deadlines.

use std::time::{Duration, Instant};

use fmsched_integration::*;
use serde_json::Value;
use sqlx::Connection;

use crate::{
    all_completed, fmctl, futures_block, job_yaml, jobs, metric_value, node_view, running_job,
    scrape, submit, walk,
};

/// UniSched live: two best-effort jobs fill the node; a strict SLO job
/// submitted last takes GPUs from one of them when its lease runs out
/// (short leases through `scheduling.knobs`) and finishes by its deadline,
/// long before the best-effort work ends. (Under Hydra-style priorities,
/// which never preempt, it waits for them: this test fails.)
#[tokio::test]
async fn e2e_deadline_a_tight_slo_job_submitted_last_preempts_best_effort_work() {
    let c = Cluster::builder("fmsched_unisched")
        .scheduler_env(&[
            ("FMSCHED_SCHEDULING__POLICY", "unisched"),
            ("FMSCHED_SCHEDULING__KNOBS__BE_LEASE_S", "3"),
            ("FMSCHED_SCHEDULING__KNOBS__SLO_LEASE_S", "6"),
            // A profiling run would itself take a GPU from a running job.
            ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ])
        .metrics()
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let mport = c.metrics_port.expect("metrics asked for");
    let rigid = |name: &str, task: &str, iterations: u64, extra: &str| {
        format!(
            "{}{extra}",
            job_yaml(name, task, iterations, 2).replace("min_gpus: 1", "min_gpus: 2")
        )
    };
    submit(
        port,
        dir.path(),
        ["mrpc", "stsb"]
            .iter()
            .map(|t| (format!("be-{t}"), rigid(&format!("be-{t}"), t, 40_000, ""))),
    )
    .expect("submit best-effort");
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE state = 'running' AND name LIKE 'be-%'",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        if running == 2 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the best-effort jobs never both ran"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The SLO job: 4 minutes away, feasible by the shipped table.
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(240);
    let slo = rigid(
        "slo",
        "rte",
        2_000,
        &format!("deadline: \"{}\"\nslo_class: slo\n", deadline.to_rfc3339()),
    );
    submit(port, dir.path(), [("slo".to_string(), slo)]).expect("submit the SLO job");
    // Users see its deadline, reward, lease and predicted finish.
    let slo_id: String = sqlx::query_scalar("SELECT id::text FROM jobs WHERE name = 'slo'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let shown = wait_for("the SLO job's prediction", Duration::from_secs(30), || {
        let v: Value = serde_json::from_str(&fmctl(port, &["-o", "json", "job", &slo_id])?)
            .map_err(|e| e.to_string())?;
        (v["state"] == "running" && v["predicted_finish"].is_string())
            .then_some(v.clone())
            .ok_or(format!("{v}"))
    });
    let at = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    assert!(at(&shown["predicted_finish"]) <= deadline, "{shown}");
    assert_eq!(shown["at_risk"], false);
    assert!(
        shown["lease_until"].is_string(),
        "a leasing policy: {shown}"
    );
    let steps = shown["reward_steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "a strict SLO: one step");
    assert_eq!(steps[0]["reward"], 100.0);
    assert!((at(&steps[0]["by"]) - deadline).num_milliseconds().abs() < 1000);
    let table = fmctl(port, &["jobs"]).unwrap();
    assert!(
        table.contains("DEADLINE") && table.contains("PREDICTED FINISH"),
        "{table}"
    );
    let detail = fmctl(port, &["job", &slo_id]).unwrap();
    assert!(
        detail.contains("Reward:      100 by") && detail.contains("Lease until:"),
        "{detail}"
    );
    let done: chrono::DateTime<chrono::Utc> = wait_for_slo_job(
        "the SLO job completed",
        Duration::from_secs(150),
        &mut c,
        |row: Option<(String, chrono::DateTime<chrono::Utc>)>| match row {
            Some((s, at)) if s == "completed" => Ok(at),
            Some((s, _)) if s == "failed" => panic!("the SLO job failed"),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert!(
        done <= deadline,
        "finished {done}, after its deadline {deadline}"
    );
    // It did not wait for the best-effort work (about 70 s each): it took
    // their GPUs.
    let be_done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE name LIKE 'be-%' AND state = 'completed'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(be_done, 0, "the SLO job waited for best-effort work");
    let suspended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id
         WHERE j.name LIKE 'be-%' AND e.from_state = 'running' AND e.to_state = 'queued'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert!(suspended >= 1, "no best-effort job gave up its GPUs");
    // Prometheus: one strict SLO job ended, on time.
    let m = scrape(mport).await;
    let sample = |name: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {m}"))
    };
    assert_eq!(
        sample("fmsched_slo_jobs_finished_total{class=\"slo\"}"),
        1.0
    );
    assert_eq!(
        sample("fmsched_slo_deadline_misses_total{class=\"slo\"}"),
        0.0
    );
    assert_eq!(metric_value(&m, "fmsched_slo_attainment_ratio"), 1.0);
    // Told their lease ends (3 s and 6 s leases), trainers checkpointed
    // ahead of them.
    let ahead = walk(&dir.path().join("node-a"))
        .iter()
        .filter(|f| f.ends_with("stderr.log"))
        .filter(|f| {
            std::fs::read_to_string(f).is_ok_and(|l| l.contains("checkpoint ahead of the lease"))
        })
        .count();
    assert!(ahead >= 1, "no trainer checkpointed ahead of its lease");
    drop(c);
}

/// Polls the SLO job's (state, updated_at) until `f` accepts it.
async fn wait_for_slo_job<T>(
    what: &str,
    timeout: Duration,
    c: &mut sqlx::PgConnection,
    f: impl Fn(Option<(String, chrono::DateTime<chrono::Utc>)>) -> Result<T, String>,
) -> T {
    let until = Instant::now() + timeout;
    loop {
        let row: Option<(String, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as("SELECT state, updated_at FROM jobs WHERE name = 'slo'")
                .fetch_optional(&mut *c)
                .await
                .unwrap();
        match f(row) {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < until, "{what}: timed out: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Deadline admission: a job whose deadline no schedule could meet — not
/// even alone on its fastest allocation, never suspended — is refused at
/// submit naming `deadline` and the earliest deadline it could meet, when
/// it is an SLO job (a deadline without a class makes one); nothing is
/// stored, and that earliest deadline is then accepted. A best-effort job
/// with the same deadline is kept with a warning; a metric-target SLO job
/// is kept with a note that it could not be checked.
#[tokio::test]
async fn e2e_deadline_an_infeasible_strict_deadline_is_refused_at_submit() {
    let c = Cluster::builder("fmsched_admission")
        .agent("node-a")
        .start()
        .await;
    let (dir, port) = (&c.dir, c.port);
    wait_for("node-a registered", Duration::from_secs(10), || {
        let out = fmctl(port, &["nodes"])?;
        if out.contains("node-a") {
            Ok(())
        } else {
            Err(out)
        }
    });
    let in_s = |s: i64| (chrono::Utc::now() + chrono::Duration::seconds(s)).to_rfc3339();
    let spec = |name: &str, iterations: u64, extra: &str| {
        format!("{}{extra}", job_yaml(name, "rte", iterations, 2))
    };
    let submit_json = |name: &str, yaml: String| -> Result<Value, String> {
        let f = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        let out = fmctl(port, &["-o", "json", "submit", &f.display().to_string()])?;
        Ok(serde_json::from_str::<Value>(&out).unwrap()[0].clone())
    };
    // 200,000 iterations by a deadline two minutes away: refused.
    let tight = format!("deadline: \"{}\"\n", in_s(120));
    let err = submit_json("tight", spec("tight", 200_000, &tight)).unwrap_err();
    assert!(
        err.contains("spec.deadline")
            && err.contains("cannot be met")
            && err.contains("earliest deadline it could meet is"),
        "{err}"
    );
    assert!(
        jobs(port).unwrap().is_empty(),
        "a refused job stores nothing"
    );
    // The earliest deadline it named (plus a margin for the time since) is
    // accepted, without a warning.
    let earliest = earliest_deadline(&err);
    let ok = format!(
        "deadline: \"{}\"\n",
        (earliest + chrono::Duration::seconds(60)).to_rfc3339()
    );
    let v = submit_json("earliest", spec("earliest", 200_000, &ok)).unwrap();
    assert!(
        v["created"] == true && v["warnings"] == serde_json::json!([]),
        "{v}"
    );
    // Best-effort with the tight deadline: kept, with a warning.
    let be = format!("{tight}slo_class: best_effort\n");
    let v = submit_json("be", spec("be", 200_000, &be)).unwrap();
    let w = v["warnings"].to_string();
    assert!(
        v["created"] == true && w.contains("accepted as best-effort"),
        "{v}"
    );
    // A metric target: its iterations are unknown at submit.
    let metric = spec("metric", 200_000, &tight).replace(
        "target: { max_iterations: 200000 }",
        "target: { max_epochs: 3, metric: { name: accuracy, value: 0.7 } }",
    );
    let v = submit_json("metric", metric).unwrap();
    assert!(
        v["created"] == true && v["warnings"].to_string().contains("deadline not checked"),
        "{v}"
    );
    assert_eq!(jobs(port).unwrap().len(), 3);
}

/// A job predicted to miss its deadline says so once, in its events, in
/// `fmctl jobs` and in the at-risk gauge (a soft SLO is kept although its
/// deadline is out of reach).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_deadline_a_job_predicted_to_miss_its_deadline_says_so_once() {
    let c = Cluster::builder("fmsched_atrisk")
        .scheduler_env(&[
            ("FMSCHED_SCHEDULING__PROFILING", "false"),
            ("FMSCHED_SCHEDULING__MERGING", "false"),
        ])
        .metrics()
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    let mport = c.metrics_port.expect("metrics asked for");
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(30);
    let spec = format!(
        "{}deadline: \"{}\"\nslo_class: soft_slo\nreward_steps: [{{ at: 1.0, reward: 100 }}, {{ at: 3.0, reward: 10 }}]\n",
        job_yaml("late", "rte", 200_000, 2),
        deadline.to_rfc3339()
    );
    submit(port, dir.path(), [("late".to_string(), spec)]).unwrap();
    let id = running_job(port);
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let said = wait_for("an at-risk event", Duration::from_secs(20), || {
        let rows: Vec<String> = futures_block(
            sqlx::query_scalar("SELECT message FROM job_events WHERE kind = 'at_risk'")
                .fetch_all(&mut c),
        )
        .unwrap();
        rows.first().cloned().ok_or("none yet".to_string())
    });
    assert!(said.contains("after its deadline"), "{said}");
    std::thread::sleep(Duration::from_secs(3)); // a few more rounds
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM job_events WHERE kind = 'at_risk'")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1, "said once, not every round");
    let table = fmctl(port, &["jobs"]).unwrap();
    assert!(table.contains("(at risk)"), "{table}");
    // Its own reward steps, not UniSched's four.
    let v: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "job", &id]).unwrap()).unwrap();
    let rewards: Vec<f64> = v["reward_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reward"].as_f64().unwrap())
        .collect();
    assert_eq!(rewards, [100.0, 10.0]);
    let m = scrape(mport).await;
    assert_eq!(metric_value(&m, "fmsched_slo_jobs_at_risk"), 1.0);
    fmctl(port, &["cancel", &id]).unwrap();
    drop(c);
}

/// The earliest deadline a refusal at submit names.
fn earliest_deadline(err: &str) -> chrono::DateTime<chrono::FixedOffset> {
    err.split("earliest deadline it could meet is ")
        .nth(1)
        .and_then(|r| r.split(". ").next())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t.trim()).ok())
        .unwrap_or_else(|| panic!("no earliest deadline in {err}"))
}

/// Rounds for deadlines (`scheduling.deadline_round_gap`, on by default):
/// a job submitted without a deadline waits for the periodic round (60 s
/// here); a job whose deadline it would miss waiting for that round brings
/// it forward, and both start within seconds.
#[tokio::test]
async fn e2e_deadline_a_job_that_would_miss_waiting_brings_the_round_forward() {
    let c = Cluster::builder("fmsched_deadline_rounds")
        .scheduler_env(&[
            ("FMSCHED_SCHEDULING__INTERVAL", "60s"),
            ("FMSCHED_SCHEDULING__DEADLINE_ROUND_GAP", "300ms"),
        ])
        .metrics()
        .agent("node-a")
        .start()
        .await;
    let (dir, port) = (&c.dir, c.port);
    let mport = c.metrics_port.expect("metrics asked for");
    wait_for("node-a registered", Duration::from_secs(10), || {
        node_view(port, "node-a").map(|_| ())
    });
    // The replica's first round runs as it takes the lead: under a loaded
    // suite that once came after the submission below and profiled the
    // job without a deadline. Wait until it is counted; the periodic
    // round is then about a minute away.
    let rounds = async || -> f64 {
        scrape(mport)
            .await
            .lines()
            .find_map(|l| l.strip_prefix("fmsched_rounds_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let mut tries = 0;
    while rounds().await < 1.0 {
        tries += 1;
        assert!(tries < 100, "no round counted in 20 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let submit_yaml = |name: &str, yaml: String| -> Result<String, String> {
        let f = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        let out = fmctl(port, &["-o", "json", "submit", &f.display().to_string()])?;
        let v: Value = serde_json::from_str(&out).unwrap();
        Ok(v[0]["job"]["id"].as_str().unwrap_or_default().to_string())
    };
    let state = |id: &str| jobs(port).unwrap()[id].0.clone();
    let plain = submit_yaml("plain", job_yaml("plain", "rte", 200_000, 1)).unwrap();
    let waiting = state(&plain);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        state(&plain),
        waiting,
        "no deadline: it waits for the periodic round"
    );
    // The earliest deadline the job could meet (admission names it), and
    // 15 s more: less than the wait for the periodic round.
    let in_s = |s: i64| (chrono::Utc::now() + chrono::Duration::seconds(s)).to_rfc3339();
    let tight = |deadline: &str| {
        format!(
            "{}deadline: \"{deadline}\"\n",
            job_yaml("tight", "rte", 200_000, 1)
        )
    };
    let err = submit_yaml("tight", tight(&in_s(60))).unwrap_err();
    let earliest = earliest_deadline(&err);
    let submitted = Instant::now();
    let id = submit_yaml(
        "tight",
        tight(&(earliest + chrono::Duration::seconds(15)).to_rfc3339()),
    )
    .unwrap();
    wait_for("both jobs leave the queue", Duration::from_secs(15), || {
        let (a, b) = (state(&plain), state(&id));
        if a != waiting && b != waiting {
            Ok(())
        } else {
            Err(format!("{a} / {b}"))
        }
    });
    println!(
        "a job with a deadline brought the round forward: both started {:?} after its submission",
        submitted.elapsed()
    );
}

/// With `scheduling.event_round_gap`, a submission and a task's end bring
/// the next round forward: a job profiles and trains to completion within
/// one round interval (60 s) of its submission. A round per interval alone
/// takes two intervals before it trains: one to start its profiling run,
/// one to start it after.
#[tokio::test]
async fn e2e_deadline_rounds_on_events_run_a_job_within_one_interval() {
    let c = Cluster::builder("fmsched_event_rounds")
        .scheduler_env(&[
            ("FMSCHED_SCHEDULING__INTERVAL", "60s"),
            ("FMSCHED_SCHEDULING__EVENT_ROUND_GAP", "300ms"),
        ])
        .agent("node-a")
        .start()
        .await;
    let (db, dir, port) = (&c.db, &c.dir, c.port);
    wait_for("node-a registered", Duration::from_secs(10), || {
        node_view(port, "node-a").map(|_| ())
    });
    let submitted = Instant::now();
    submit(
        port,
        dir.path(),
        [("j".to_string(), job_yaml("j", "rte", 400, 1))],
    )
    .expect("submit");
    let done = all_completed(port, 1, Duration::from_secs(59));
    let took = submitted.elapsed();
    let id = done.keys().next().unwrap().clone();
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    let states: Vec<(String,)> = sqlx::query_as(
        "SELECT to_state FROM job_events WHERE job_id = $1::uuid AND kind = 'state_changed' ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&mut c)
    .await
    .unwrap();
    let states: Vec<&str> = states.iter().map(|s| s.0.as_str()).collect();
    assert!(
        states.contains(&"profiling") && states.contains(&"running"),
        "it profiled, then trained: {states:?}"
    );
    println!("submission → completed with a 60 s interval: {took:?} ({states:?})");
}
