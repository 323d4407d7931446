//! `fmsim sweep` and `--estimates learned` as a user runs them: on a
//! workload of metric targets over published-layout curves, the sweep
//! prints a row per noise level, the learned estimator's row and a row per
//! Ymir knob value, with a summary; bad combinations are refused by name.

use std::path::Path;
use std::process::Command;

fn fmsim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fmsim"))
        .args(args)
        .output()
        .expect("fmsim runs")
}

/// Six roberta-base tasks with 10-epoch accuracy curves (saturating at
/// different rates, two of them over-fitting after a peak) in the published
/// `task-curves.json` layout, and 24 jobs whose targets are points of their
/// curves, in the TitanSched workload layout.
fn write_inputs(dir: &Path) -> (String, String, Vec<String>) {
    let mut tasks = serde_json::Map::new();
    let mut samples = Vec::new();
    for t in 0..6 {
        let r = 0.2 + 0.15 * f64::from(t);
        let curve: Vec<serde_json::Value> = (1..=10)
            .map(|e| {
                let mut v = 0.5 + 0.4 * (1.0 - (-r * f64::from(e)).exp());
                if t % 3 == 2 && e > 6 {
                    v -= 0.01 * f64::from(e - 6);
                }
                serde_json::json!([e, v])
            })
            .collect();
        tasks.insert(
            format!("task{t}"),
            serde_json::json!({"lr=1e-3,grad_accum=1": {"curve": curve, "metric": "eval_accuracy"}}),
        );
        samples.push(format!("task{t}={}", 2000 + 500 * t));
    }
    let catalog = serde_json::json!({"models": {"roberta-base": {"alone": tasks, "temporal": {}, "spatial": {}}}});
    let c = dir.join("curves.json");
    std::fs::write(&c, serde_json::to_string(&catalog).unwrap()).unwrap();
    let mut w = String::from(
        "name,submission_time,application,num_gpus,target_batch_size,target_lr,target_gradient_steps,target_metric\n",
    );
    for j in 0..24 {
        let t = j % 6;
        let r = 0.2 + 0.15 * f64::from(t);
        let reach = 3 + (j % 5);
        let target = 0.5 + 0.4 * (1.0 - (-r * f64::from(reach)).exp()) - 1e-9;
        w += &format!(
            "roberta-base@task{t}-{j},{},roberta-base@task{t},{},32,1e-3,1,{target}\n",
            300 * j,
            1 + j % 2
        );
    }
    let wp = dir.join("w.csv");
    std::fs::write(&wp, w).unwrap();
    (wp.display().to_string(), c.display().to_string(), samples)
}

#[test]
fn estimate_prior_sweep_prints_noise_learned_and_knob_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (w, c, samples) = write_inputs(dir.path());
    let mut args = vec![
        "sweep",
        "--workload",
        &w,
        "--catalog",
        &c,
        "--nodes",
        "2",
        "--noise",
        "0,0.4",
        "--gain-noise-levels",
        "0.4",
        "--srtf-weights",
        "0.5",
        "--intervals",
        "60",
        "--resize-horizons",
        "0",
        "--baselines",
        "srtf,optimus",
    ];
    for s in &samples {
        args.extend(["--samples-per-epoch", s.as_str()]);
    }
    let out = fmsim(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "noise=0 ",
        "noise=0.4 ",
        "learned ",
        "gain_noise=0.4 ",
        "srtf_weight=0.5 ",
        "interval_s=60 ",
        "resize_horizon_s=0 ",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} row in\n{stdout}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 8, "{line}");
        let avg: f64 = cols[1].parse().unwrap();
        assert!(avg > 0.0 && avg.is_finite(), "{line}");
        assert!(["srtf", "optimus"].contains(&cols[3]), "{line}");
    }
    assert!(
        stdout.contains("summary: Ymir ahead of the best baseline"),
        "{stdout}"
    );

    // Learned estimates with a run: refused with noise, refused without curves.
    let mut run = vec![
        "run",
        "--policy",
        "ymir",
        "--workload",
        &w,
        "--catalog",
        &c,
        "--nodes",
        "2",
        "--estimates",
        "learned",
    ];
    for s in &samples {
        run.extend(["--samples-per-epoch", s.as_str()]);
    }
    let ok = fmsim(&run);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    run.extend(["--estimate-noise", "0.1"]);
    let e = fmsim(&run);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("--estimate-noise only with --estimates exact"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/small-workload.csv");
    let e = fmsim(&[
        "run",
        "--policy",
        "ymir",
        "--workload",
        shipped.to_str().unwrap(),
        "--estimates",
        "learned",
    ]);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("--estimates learned: no job of the workload"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let e = fmsim(&["sweep", "--workload", &w, "--noise", "1.5"]);
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("--noise"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    for (args, says) in [
        (
            vec!["sweep", "--workload", &w, "--gain-noise-levels", "0.2,1.5"],
            "--gain-noise-levels: 1.5 is outside [0, 1)",
        ),
        (
            vec!["sweep", "--workload", &w, "--gain-noise", "0.2"],
            "leave out --estimate-noise, --gain-noise and --estimates",
        ),
        (
            vec![
                "run",
                "--policy",
                "ymir",
                "--workload",
                &w,
                "--gain-noise",
                "1",
            ],
            "--gain-noise 1: must be in [0, 1)",
        ),
    ] {
        let e = fmsim(&args);
        let err = String::from_utf8_lossy(&e.stderr);
        assert!(!e.status.success() && err.contains(says), "{args:?}: {err}");
    }
}
