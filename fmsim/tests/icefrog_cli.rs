//! `fmsim icefrog` runs ICEFROG's evaluation and prints one row per system
//! and load; bad flags are refused naming the flag.

use std::process::Command;

fn fmsim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fmsim"))
        .args(args)
        .output()
        .expect("fmsim runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn icefrog_eval_prints_a_row_per_system_and_load() {
    let (ok, out, err) = fmsim(&[
        "icefrog",
        "--loads",
        "0.25",
        "--seeds",
        "2",
        "--systems",
        "icefrog,lucid,pollux+",
        "--nodes",
        "A100:3:4",
        "--threads",
        "2",
    ]);
    assert!(ok, "{out}{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        rows[0].contains("icefrog") && rows[0].contains("1.00x"),
        "{out}"
    );
    assert!(
        rows[1].contains("lucid") && rows[2].contains("pollux+"),
        "{out}"
    );
    assert!(
        rows.iter().all(|r| r.contains(" 30 ")),
        "every job finished: {out}"
    );
}

#[test]
fn icefrog_eval_names_a_bad_flag() {
    for (args, named) in [
        (vec!["icefrog", "--systems", "icefrog,ymir"], "--systems"),
        (vec!["icefrog", "--loads", "0"], "--loads"),
        (vec!["icefrog", "--nodes", "A100:3"], "--nodes"),
        (
            vec!["icefrog", "--knob", "srtf_weight=1"],
            "--knob srtf_weight",
        ),
        (vec!["icefrog", "--scale", "0"], "--scale"),
    ] {
        let (ok, out, err) = fmsim(&args);
        assert!(!ok, "{args:?} was accepted: {out}");
        assert!(err.contains(named), "{args:?}: {err}");
    }
}
