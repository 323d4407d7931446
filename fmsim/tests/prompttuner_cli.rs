//! `fmsim bench-prompttuner` prints the decision time of PromptTuner's
//! allocation (Algorithms 1 and 2) at the queue length asked for, and the
//! Prompt Bank's build time and lookup cost at the size asked for.

use std::process::Command;

#[test]
fn prompttuner_bench_prints_its_decision_time() {
    let out = Command::new(env!("CARGO_BIN_EXE_fmsim"))
        .args([
            "bench-prompttuner",
            "--requests",
            "50",
            "--models",
            "3",
            "--rounds",
            "20",
            "--prompts",
            "100",
            "--features",
            "8",
        ])
        .output()
        .expect("fmsim runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("prompttuner decision: 50 queued requests, 3 models: mean")
            && text.contains("over 20 decisions")
            && text.contains("prompt bank: 100 prompts of 8 features in 10 clusters"),
        "{text}"
    );
}

/// `fmsim prompttuner` replays a generated low-load trace under the three
/// systems, one row each, and says how PromptTuner compares; a trace file
/// it wrote replays the same; bad arguments name themselves.
#[test]
fn prompttuner_eval_prints_violations_and_cost_of_each_system() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_fmsim"))
            .arg("prompttuner")
            .args(args)
            .output()
            .expect("fmsim runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let traces = dir.path().to_str().expect("utf-8 path");
    let (ok, text, err) = run(&[
        "--load",
        "low",
        "--slo-emergence",
        "1",
        "--write-traces",
        traces,
    ]);
    assert!(ok, "{text}{err}");
    for system in ["prompttuner", "infless", "elasticflow"] {
        assert!(
            text.lines().any(|l| l.starts_with("low")
                && l.contains(&format!(" {system} "))
                && l.contains(" 138 ")),
            "no row for {system}:\n{text}"
        );
    }
    assert!(
        text.contains("prompttuner vs infless: violations")
            && text.contains("prompttuner vs elasticflow: violations"),
        "{text}"
    );
    // The written trace replays to the same rows.
    let csv = dir.path().join("low.csv");
    let (ok, again, err) = run(&[
        "--trace",
        csv.to_str().expect("utf-8 path"),
        "--slo-emergence",
        "1",
    ]);
    assert!(ok, "{again}{err}");
    let rows = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains(" prompttuner ") && !l.contains(" vs "))
            .map(|l| {
                l.split_once(' ')
                    .map(|x| x.1.trim().to_string())
                    .unwrap_or_default()
            })
            .collect()
    };
    // Same figures but the decision times (wall clock, last column).
    let strip = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .map(|l| l.rsplit_once(' ').map(|x| x.0.to_string()).unwrap_or(l))
            .collect()
    };
    assert_eq!(strip(rows(&text)), strip(rows(&again)));
    // Bad arguments are refused, naming the flag.
    let (ok, _, err) = run(&["--load", "extreme"]);
    assert!(!ok && err.contains("--load"), "{err}");
    let (ok, _, err) = run(&["--slo-emergence", "0"]);
    assert!(!ok && err.contains("--slo-emergence"), "{err}");
    let (ok, _, err) = run(&["--idle-release", "soon"]);
    assert!(!ok && err.contains("--idle-release"), "{err}");
    std::fs::write(
        dir.path().join("bad.csv"),
        "arrival_s,model,gpus,duration_s\n1,gpt2-base,0,30\n",
    )
    .expect("write");
    let (ok, _, err) = run(&[
        "--trace",
        dir.path().join("bad.csv").to_str().expect("utf-8"),
    ]);
    assert!(!ok && err.contains("line 2: gpus must be ≥ 1"), "{err}");
    std::fs::write(
        dir.path().join("odd.csv"),
        "arrival_s,model,gpus,duration_s\n1,bloom,1,30\n",
    )
    .expect("write");
    let (ok, _, err) = run(&[
        "--trace",
        dir.path().join("odd.csv").to_str().expect("utf-8"),
    ]);
    assert!(
        !ok && err.contains("model \"bloom\" has no cold-start profile"),
        "{err}"
    );
    let (ok, text, err) = run(&[
        "--trace",
        dir.path().join("odd.csv").to_str().expect("utf-8"),
        "--cold-start",
        "bloom=30",
        "--systems",
        "prompttuner",
    ]);
    assert!(ok && text.contains(" prompttuner "), "{text}{err}");
}
