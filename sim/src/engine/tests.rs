//! Tests of the engine's own rules.

use fmsched_estimator::curve_prior::{CurveLibrary, Metric};

use super::*;

/// The learned estimator's epochs by observed epochs: exact once the
/// target is seen (or every epoch is), a prediction after the head
/// before that, never below what profiling showed.
#[test]
fn estimate_prior_learned_epochs_follow_what_was_seen() {
    let lib = CurveLibrary::shipped();
    let curve: Vec<f64> = (1..=10)
        .map(|e| 0.9 - 0.4 * (-0.35 * f64::from(e)).exp())
        .collect();
    let target = curve[6]; // reached at epoch 7
    let with_spread = learned_epochs(&lib, &curve, Metric::default(), target);
    assert!(with_spread.iter().all(|&(_, s)| (0.0..=4.0).contains(&s)));
    assert_eq!(with_spread[10].1, 0.0, "seen: sure");
    let p: Vec<f64> = with_spread.iter().map(|x| x.0).collect();
    assert_eq!(p.len(), 11);
    // Below PROFILED_EPOCHS the head is the profiled one.
    assert_eq!(p[0], p[PROFILED_EPOCHS]);
    for (n, &e) in p.iter().enumerate() {
        assert!(e > n.max(PROFILED_EPOCHS) as f64 || e == 7.0, "{n}: {e}");
        assert!((1.0..=10.0).contains(&e), "{n}: {e}");
    }
    for &e in &p[7..] {
        assert_eq!(e, 7.0);
    }
    // A target met in the profiled epochs is that epoch.
    let early = learned_epochs(&lib, &curve, Metric::default(), curve[1]);
    assert!(early.iter().all(|&e| e == (2.0, 0.0)), "{early:?}");
}
