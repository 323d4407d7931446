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
