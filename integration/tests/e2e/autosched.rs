//! End-to-end tests: autosched.

use std::time::Duration;

use fmsched_integration::*;
use serde_json::Value;

use crate::{agent, all_completed, fmctl, job_yaml, scheduler_env, submit, wait_up};

/// AutoSched live: with history in Postgres, a dry run proposes knobs and
/// changes nothing (an audit event says what it would do); a tuning adopts
/// through the audited SetPolicy path as `autosched`; a non-tunable policy
/// is refused; with `autosched.enabled` the leader tunes on its own.
#[tokio::test]
async fn e2e_autosched_a_dry_run_proposes_a_tuning_adopts_and_the_leader_tunes_on_its_own() {
    let db = TestDb::create("fmsched_autosched").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env = [
        ("FMSCHED_SCHEDULING__PROFILING", "false"),
        ("FMSCHED_SCHEDULING__MERGING", "false"),
        ("FMSCHED_SCHEDULING__POLICY", "tiresias"),
    ];
    let mut sched = scheduler_env(&db, port, dir.path(), None, &env);
    wait_up("scheduler up", port);
    let _a = agent("node-a", port, dir.path());
    // History: eight short jobs run to completion.
    submit(
        port,
        dir.path(),
        (0..8u64).map(|k| {
            let name = format!("past-{k}");
            let manifest = job_yaml(
                &name,
                ["rte", "mrpc"][k as usize % 2],
                400 + 200 * (k % 3),
                1,
            );
            (name, manifest)
        }),
    )
    .unwrap();
    all_completed(port, 8, Duration::from_secs(150));
    // Knobs that make jobs wait: a round every ten minutes.
    fmctl(
        port,
        &[
            "admin",
            "set-policy",
            "tiresias",
            "--knob",
            "interval_s=600",
        ],
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    submit(
        port,
        dir.path(),
        (0..4u64).map(|k| {
            let name = format!("now-{k}");
            (name.clone(), job_yaml(&name, "rte", 400, 1))
        }),
    )
    .unwrap();
    let json = |args: &[&str]| -> Value {
        let mut a = vec!["-o", "json"];
        a.extend_from_slice(args);
        serde_json::from_str(&fmctl(port, &a).unwrap()).unwrap()
    };
    // A dry run: a proposal, nothing changed.
    let d = json(&["tune", "--dry-run", "--threshold", "1.0"]);
    assert_eq!(d["policy"], "tiresias", "{d}");
    assert_eq!(d["knobs_before"]["interval_s"], 600.0, "{d}");
    assert!(
        d["trace_jobs"].as_u64().unwrap() >= 4,
        "the waiting jobs are carried over: {d}"
    );
    assert!(d["carried_over"].as_u64().unwrap() >= 4, "{d}");
    assert_eq!(d["adopted"], false, "{d}");
    assert_eq!(d["passes"], true, "ten-minute rounds lose: {d}");
    assert!(d["proposed"]["interval_s"].as_f64().unwrap() < 600.0, "{d}");
    assert!(d["predicted_gain"].as_f64().unwrap() > 1.0, "{d}");
    let p = json(&["admin", "policy"]);
    assert_eq!(p["knobs"]["interval_s"], 600.0, "{p}");
    assert_eq!(p["set_by"], "root", "{p}");
    let audit = fmctl(port, &["admin", "audit"]).unwrap();
    assert!(
        audit.contains("autosched_dry_run") && audit.contains("asked by root"),
        "{audit}"
    );
    // Out-of-range threshold: refused naming it.
    let e = fmctl(port, &["tune", "--threshold", "0.5"]).unwrap_err();
    assert!(e.contains("threshold"), "{e}");
    // A tuning adopts, as autosched, through the audited path.
    let d = json(&["tune"]);
    assert_eq!(d["adopted"], true, "{d}");
    let after = d["knobs_after"]["interval_s"].as_f64().unwrap();
    assert!(after < 600.0, "{d}");
    let p = json(&["admin", "policy"]);
    assert_eq!(p["set_by"], "autosched", "{p}");
    assert_eq!(p["knobs"]["interval_s"].as_f64().unwrap(), after, "{p}");
    let audit = fmctl(port, &["admin", "audit"]).unwrap();
    assert!(
        audit.contains("set_policy") && audit.contains("autosched_tune"),
        "{audit}"
    );
    // The adopted, shorter interval brings the next round forward instead
    // of waiting out the ten minutes in force before.
    wait_for(
        "the next round brought forward",
        Duration::from_secs(10),
        || {
            if sched.log_text().contains("next round brought forward") {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    );
    // So does an operator's: the waiting jobs run now.
    fmctl(
        port,
        &["admin", "set-policy", "tiresias", "--knob", "interval_s=2"],
    )
    .unwrap();
    all_completed(port, 12, Duration::from_secs(90));
    // Only Tiresias and Themis are tuned.
    fmctl(port, &["admin", "set-policy", "fifo"]).unwrap();
    let e = fmctl(port, &["tune", "--dry-run"]).unwrap_err();
    assert!(e.contains("tiresias") && e.contains("fifo"), "{e}");
    fmctl(
        port,
        &[
            "admin",
            "set-policy",
            "tiresias",
            "--knob",
            "interval_s=600",
        ],
    )
    .unwrap();
    // Enabled, the leader tunes on its own.
    sched.kill9();
    let mut env2 = env.to_vec();
    env2.extend([
        ("FMSCHED_AUTOSCHED__ENABLED", "true"),
        ("FMSCHED_AUTOSCHED__EVERY", "2s"),
    ]);
    let _sched = scheduler_env(&db, port, dir.path(), None, &env2);
    wait_up("scheduler up again", port);
    wait_for(
        "the leader tunes by itself",
        Duration::from_secs(60),
        || {
            let p = json(&["admin", "policy"]);
            if p["set_by"] == "autosched" {
                Ok(())
            } else {
                Err(format!("{p}"))
            }
        },
    );
}
