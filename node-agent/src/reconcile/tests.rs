//! Tests of `reconcile`.

use super::report::job_reports;
use super::*;

/// A trainer that evaluates several metrics per epoch: the job's report
/// carries only its target's series (else the first metric it named),
/// so the merge guard never compares an accuracy with an F1.
#[test]
fn only_the_target_metric_is_reported_per_job() {
    let ev =
        |job: &str, metric: &str, value: f64| (job.to_string(), 0, 1.0, metric.to_string(), value);
    let o = crate::driver::Observed {
        evals: vec![
            ev("a", "accuracy", 0.70),
            ev("a", "f1", 0.60),
            ev("b", "accuracy", 0.50),
            ev("b", "f1", 0.40),
            ev("a", "accuracy", 0.72),
            ev("a", "f1", 0.65),
            ev("b", "accuracy", 0.55),
            ev("b", "f1", 0.45),
        ],
        ..Default::default()
    };
    let metrics: BTreeMap<String, String> = [("a".to_string(), "f1".to_string())].into();
    let got: BTreeMap<String, Vec<f64>> = job_reports(&o, &metrics)
        .into_iter()
        .map(|r| (r.job_id, r.evals))
        .collect();
    assert_eq!(got["a"], vec![0.60, 0.65], "the target's metric");
    assert_eq!(got["b"], vec![0.50, 0.55], "no target: the first metric");
}

/// Each evaluation goes with its epoch (the scheduler keeps a job's
/// curve per epoch across restarts), also when the series is cut short.
#[test]
fn estimate_prior_evaluations_carry_their_epochs() {
    let o = crate::driver::Observed {
        evals: (0..20)
            .map(|e| {
                let epoch = f64::from(e) + 3.0;
                ("a".to_string(), 0, epoch, "accuracy".to_string(), 0.5)
            })
            .collect(),
        ..Default::default()
    };
    let r = job_reports(&o, &BTreeMap::new()).remove(0);
    assert_eq!(r.evals.len(), 16);
    assert_eq!(r.eval_epochs.len(), 16);
    assert_eq!(
        r.eval_epochs[0], 3.0,
        "a resumed process starts at its epoch"
    );
    assert_eq!(r.eval_epochs[15], 18.0);
}

/// A prompt job's `done` features and its `prompt_init` reach the
/// scheduler in its job report; an oversized feature vector is dropped
/// (the scheduler would refuse the whole report).
#[test]
fn prompt_bank_reports_reach_the_job_report() {
    use fmsched_core::trainer::Report;
    let o = std::sync::Mutex::new(crate::driver::Observed::default());
    for r in [
        Report::PromptInit {
            job_id: "b".into(),
            from: "a".into(),
            score: 1.25,
            scored: 2,
            candidates: 3,
        },
        Report::Done {
            job_id: "b".into(),
            output: "/o/b/prompt.json".into(),
            prompt_features: vec![0.5, -0.5],
        },
        Report::Done {
            job_id: "c".into(),
            output: "/o/c/prompt.json".into(),
            prompt_features: vec![0.1; crate::driver::MAX_PROMPT_FEATURES + 1],
        },
    ] {
        crate::driver::apply_report(&o, r);
    }
    let reports = job_reports(&o.into_inner().unwrap(), &BTreeMap::new());
    let b = reports.iter().find(|r| r.job_id == "b").unwrap();
    assert_eq!(b.prompt_features, vec![0.5, -0.5]);
    let init = b.prompt_init.as_ref().unwrap();
    assert_eq!(
        (
            init.from_job_id.as_str(),
            init.score,
            init.scored,
            init.candidates
        ),
        ("a", 1.25, 2, 3)
    );
    assert!(
        reports
            .iter()
            .all(|r| r.job_id != "c" || r.prompt_features.is_empty()),
        "too many features are dropped"
    );
}
