//! `fmsim generate --shape` and `fmsim tune` as a user runs them: a shaped
//! workload is written, every row of the tuning table comes out with the
//! tuner's cost, decisions are written, and bad arguments are refused by
//! name.

use std::process::Command;

fn fmsim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fmsim"))
        .args(args)
        .output()
        .expect("fmsim runs")
}

#[test]
fn tune_prints_every_row_and_writes_its_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let d = dir.path().join("decisions.csv");
    let out = fmsim(&[
        "generate",
        "--shape",
        "philly",
        "--days",
        "1",
        "--compress",
        "6",
        "--jobs",
        "120",
        "--seed",
        "4",
        "-o",
        w.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&w).unwrap();
    assert!(text.starts_with("job_id,gpu_num,submit_time,duration,state\n"));
    let common = [
        "tune",
        "--workload",
        w.to_str().unwrap(),
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--checkpoint-s",
        "5",
        "--profile-s",
        "10",
        "--samples",
        "3",
        "--fixed-samples",
        "2",
        "--threads",
        "2",
    ];
    let mut args = common.to_vec();
    args.extend(["--decisions", d.to_str().unwrap()]);
    let out = fmsim(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in ["default ", "fixed ", "selftune ", "autosched "] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row}row in\n{stdout}"));
        assert!(line.contains("threshold_gpu_h="), "{line}");
    }
    // Four hours of arrivals: the tuned rows tuned at least three times.
    let tuned = stdout
        .lines()
        .find(|l| l.starts_with("autosched "))
        .unwrap();
    let tunings: usize = tuned.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(tunings >= 3, "{tuned}");
    let decisions = std::fs::read_to_string(&d).unwrap();
    assert!(decisions.starts_with("mode,at_s,"));
    assert!(
        decisions
            .lines()
            .filter(|l| l.starts_with("autosched,"))
            .count()
            == tunings
    );
    assert!(decisions.lines().any(|l| l.starts_with("selftune,")));

    // Refused, naming what is wrong.
    let mut bad = common.to_vec();
    bad.extend(["--policy", "ymir"]);
    let out = fmsim(&bad);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--policy"));
    let mut bad = common.to_vec();
    bad.extend(["--modes", "default,oracle"]);
    let out = fmsim(&bad);
    assert!(String::from_utf8_lossy(&out.stderr).contains("oracle"));
    let mut bad = common.to_vec();
    bad.extend(["--threshold", "0.5"]);
    assert!(!fmsim(&bad).status.success());
}
