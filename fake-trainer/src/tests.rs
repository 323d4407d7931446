//! Tests of the fake trainer.

use fmsched_core::trainer::TaskAssignment;
use fmsched_estimator::analytic;
use fmsched_estimator::lut::Variant;

use crate::world::{Curve, embedding_of, frozen_penalty_of, true_gain};

const TASKS: [&str; 8] = ["cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "stsb"];

/// ψ by hand (Eq. 3 on σ²[i] ∝ i): 1 with nothing frozen, 57/78 with
/// half of 12 layers, 0 with all. Freezing half of roberta-base makes a
/// step faster and each step teach less: effective progress per second
/// (Eq. 2) stays near full training's, the trade ICEFROG's tuner
/// weighs.
#[test]
fn frozen_layers_trade_step_time_for_learning_per_step() {
    assert_eq!(frozen_penalty_of(0, 12), 1.0);
    assert!((frozen_penalty_of(6, 12) - 57.0 / 78.0).abs() < 1e-12);
    assert_eq!(frozen_penalty_of(12, 12), 0.0);
    assert!(frozen_penalty_of(3, 12) > frozen_penalty_of(9, 12));
    let lut = analytic::default_lut().unwrap();
    let step = |frozen| {
        let v = Variant {
            frozen_layers: frozen,
            ..Variant::base()
        };
        lut.iteration_time_on("roberta-base", "A100", "1", 32, &v, 12)
            .unwrap()
            .seconds
    };
    let (full, half) = (step(0), step(6));
    assert!(
        half < full,
        "frozen layers make a step faster ({half} < {full})"
    );
    // Effective progress (Eq. 2) per second, relative to full training.
    let e = frozen_penalty_of(6, 12) * full / half;
    assert!(e > 0.9 && e < 1.3, "{e}");
}

/// A loss target is evaluated as a falling validation loss and reached
/// from above; an accuracy target from below.
#[test]
fn a_lower_is_better_target_is_reached_from_above() {
    let c = Curve::for_task("roberta-base", "rte");
    let (early, late) = (c.evaluation(10.0, true), c.evaluation(5000.0, true));
    assert!(late < early, "a validation loss falls: {early} → {late}");
    assert!(c.evaluation(5000.0, false) > c.evaluation(10.0, false));
    let mut t = TaskAssignment {
        job_id: "j".into(),
        model: "roberta-base".into(),
        task: "rte".into(),
        dataset_uri: "file:///d".into(),
        global_batch_size: 32,
        max_iterations: 0,
        metric: Some("loss".into()),
        metric_target: Some((early + late) / 2.0),
        samples_per_epoch: None,
        max_epochs: 0,
        eval_only: false,
        prompt_bank: None,
        settings: Default::default(),
    };
    t.settings.metric_lower_is_better = true;
    assert!(!t.metric_reached(early) && t.metric_reached(late));
    t.settings.metric_lower_is_better = false;
    assert!(t.metric_reached(early) && !t.metric_reached(late));
}

/// The fake world has helpful and harmful pairs, as real task mixes do
/// (Ymir Fig. 3: gains from about −30 % to +30 %), so the merger has
/// something to choose and the guard something to catch.
#[test]
fn transfer_law_has_helpful_and_harmful_pairs() {
    let mut gains = Vec::new();
    for a in TASKS {
        for b in TASKS {
            if a != b {
                gains.push(true_gain("roberta-base", a, b, false));
            }
        }
    }
    let positive = gains.iter().filter(|&&g| g > 0.0).count();
    let (lo, hi) = gains
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &g| (l.min(g), h.max(g)));
    eprintln!(
        "{positive}/{} positive, range {lo:.3}..{hi:.3}",
        gains.len()
    );
    assert!(positive >= gains.len() / 4, "{positive} of {}", gains.len());
    assert!(positive < gains.len(), "no harmful pair");
    assert!(lo > -0.5 && hi < 0.5, "{lo}..{hi}");
}

/// A task learns faster from a closer task: the law follows the
/// embeddings it reports (what the estimator sees).
#[test]
fn closer_embeddings_transfer_better() {
    use fmsched_estimator::transfer::{TaskEmbedding, temporal_score};
    let emb = |t: &str| TaskEmbedding {
        fisher: embedding_of("roberta-base", t, false),
        fisher_repeat: embedding_of("roberta-base", t, true),
    };
    let mut pts: Vec<(f64, f64)> = Vec::new();
    for a in TASKS {
        for b in TASKS.iter().filter(|b| **b != a) {
            let s = temporal_score(&emb(a), &emb(b));
            pts.push((s, true_gain("roberta-base", a, b, false)));
        }
    }
    pts.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = pts.len() / 4;
    let mean = |v: &[(f64, f64)]| v.iter().map(|p| p.1).sum::<f64>() / v.len() as f64;
    assert!(
        mean(&pts[..n]) > mean(&pts[pts.len() - n..]) + 0.1,
        "closest quarter {:.3} vs farthest {:.3}",
        mean(&pts[..n]),
        mean(&pts[pts.len() - n..])
    );
}
