//! `fmsim lyra` as a user runs it: on the shipped small workload with an
//! inference cluster, one row per scenario of the thesis' Table 3.5 that
//! fmsched runs; without inference nodes, or with a bad trace flag, it is
//! refused by name.

use std::path::Path;
use std::process::Command;

fn fmsim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fmsim"))
        .args(args)
        .output()
        .expect("fmsim runs")
}

#[test]
fn lyra_cli_prints_every_scenario_and_refuses_a_run_without_inference_nodes() {
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/small-workload.csv");
    let w = w.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("inference.csv");
    // Idle for an hour, busy for the next, idle again.
    std::fs::write(&trace, "t_s,utilisation\n0,0\n3600,100\n7200,0\n").unwrap();
    let out = fmsim(&[
        "lyra",
        "--workload",
        w,
        "--nodes",
        "V100:1:4",
        "--inference-nodes",
        "V100:3:4",
        "--inference-trace",
        trace.to_str().unwrap(),
        "--loan-headroom",
        "0",
        "--elastic-share",
        "0.5",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "baseline (fifo, no loans)",
        "loaning alone (fifo)",
        "opportunistic (fifo)",
        "scaling alone (lyra)",
        "lyra, random reclaim",
        "lyra, scf reclaim",
        "gandiva-style",
        "optimus (afs-style)",
        "pollux",
    ] {
        assert!(text.contains(row), "{row}: {text}");
    }
    assert!(text.contains("12 inference GPUs to loan"), "{text}");
    // The loaning rows reclaimed (a reclaim time is shown), the others not.
    let lyra = text.lines().find(|l| l.starts_with("lyra  ")).unwrap();
    assert!(!lyra.trim_end().ends_with('-'), "{lyra}");
    let pollux = text.lines().find(|l| l.starts_with("pollux")).unwrap();
    assert!(pollux.trim_end().ends_with('-'), "{pollux}");

    let out = fmsim(&["lyra", "--workload", w]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--inference-nodes"));
    let out = fmsim(&[
        "lyra",
        "--workload",
        w,
        "--inference-nodes",
        "V100:2:4",
        "--inference-diurnal",
        "0.5",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--inference-diurnal"));
}
