//! The merge guard (Ymir §4.3), its verdict and its consequence.
//!
//! - [`guard_verdict`]: whether a merge whose watched jobs have reported
//!   their first epochs' evaluations is kept, split (and why), or still
//!   waits. The service reads the evaluations its trainers reported; fmsim
//!   judges its merges on its catalog's curves instead (it has no
//!   evaluation trace per merge) and reaches the same [`GuardRuling`]s.
//! - [`guard_consequence`]: what a ruling does to the merge's two jobs.
//!   Both callers apply exactly its fields, each in its own state: the
//!   service in the round's observed state and its commit, fmsim in its
//!   jobs' targets, allocations and progress.

use crate::JobId;
use crate::policy::MergeMode;

/// What the merge guard decides about one merge.
#[derive(Debug, PartialEq)]
pub enum GuardVerdict {
    /// Not two epochs of every watched job yet.
    Wait,
    /// Every watched job's accuracy improved from its first to its second
    /// epoch: the guard checks no more.
    Keep,
    /// A watched job's accuracy did not improve: why.
    Split(String),
}

/// One job the merge guard watches: its evaluation values so far, oldest
/// first, and the sense of its metric (`target.metric.lower_is_better`: a
/// loss or perplexity improves downwards; without a metric target the
/// trainer reports accuracy, which improves upwards).
#[derive(Clone, Copy, Debug)]
pub struct Watched<'a> {
    pub job: JobId,
    pub evals: Option<&'a [f64]>,
    pub lower_is_better: bool,
}

/// The merge guard (Ymir §4.3) on the evaluation values reported so far of
/// each watched job still running: B for a temporal merge (its metric with
/// A's weights, evaluated while A trains), both jobs for a spatial one. One
/// job that does not improve, in its metric's sense, splits the merge at
/// once.
pub fn guard_verdict(mode: MergeMode, watched: &[Watched<'_>]) -> GuardVerdict {
    let mut waiting = watched.is_empty();
    for w in watched {
        let job = w.job;
        match w.evals {
            Some(&[first, second, ..])
                if !crate::job::metric_improved(first, second, w.lower_is_better) =>
            {
                let whose = if mode == MergeMode::Temporal {
                    format!("job {job}'s (evaluated with A's weights)")
                } else {
                    format!("job {job}'s")
                };
                let sense = if w.lower_is_better {
                    "metric (lower is better)"
                } else {
                    "metric"
                };
                return GuardVerdict::Split(format!(
                    "{whose} {sense} did not improve in its first two epochs ({first:.4} → {second:.4})"
                ));
            }
            Some([_, _, ..]) => {}
            _ => waiting = true,
        }
    }
    if waiting {
        GuardVerdict::Wait
    } else {
        GuardVerdict::Keep
    }
}

/// Epochs of the merged part the guard waits for before it rules (Ymir
/// §4.3: "the first two epochs"). The service reads that many evaluation
/// values of each watched job; fmsim rules once the watched job has
/// trained that many epochs' samples.
pub const GUARD_EPOCHS: u32 = 2;

/// What the guard rules on one merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardRuling {
    /// The merge stays and the guard checks it no more.
    Keep,
    /// The transfer did not help in its first epochs ([`guard_verdict`]'s
    /// `Split`; fmsim: the catalog's curve under transfer needs at least
    /// what the job needs alone): the merge ends.
    Split,
    /// B of a temporal transfer trains so much worse from A's weights that
    /// starting again from the pre-trained ones finishes it sooner, its
    /// restart counted (`policy::fresh_start_pays`).
    RestartFresh,
}

/// What a merge gained, as the guard's ruling lets the service measure it
/// for the estimator (fmsim, whose catalog knows the truth, measures
/// nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GainMeasure {
    /// Not now: a kept temporal merge is measured later, on B's own
    /// training.
    Later,
    /// Each job's loss in the joint process against its own curve (a
    /// spatial pair, kept or split).
    EachAgainstOwnCurve,
    /// A temporal split shows that the transfer gained nothing, not how
    /// much it lost: recorded as 0, an upper bound.
    NoGain,
    /// Already measured: the ruling was made on it (a fresh start).
    AlreadyMeasured,
}

/// What a [`GuardRuling`] does to merge A ↦ B (temporal) or A ‖ B
/// (spatial), for a job id type `J` of the caller's (the service's job
/// ids, fmsim's job indices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardConsequence<J> {
    /// The merge ends, and counts as one of the guard's splits
    /// (`fmsched_merge_guard_splits_total`; fmsim's `guard_splits`).
    pub ends: bool,
    /// Jobs that train on towards their own targets, as jobs alone.
    pub alone: Vec<J>,
    /// A spatial pair's joint process stops: B leaves it and waits for
    /// GPUs of its own, A goes on as a job alone. The service holds both
    /// back a round while the joint process writes its last checkpoint;
    /// fmsim, which has no checkpoints, lets A go on in place.
    pub leaves_joint_process: Option<J>,
    /// The job whose progress restarts from zero, from the pre-trained
    /// weights, paying a restart (its reports and evaluations of the
    /// dropped run no longer count).
    pub restarts: Option<J>,
    /// What the merge gained, measured now or not.
    pub measure: GainMeasure,
}

/// The consequence of the guard's `ruling` on merge `a`/`b` in `mode`
/// (Ymir §4.3: a split merge's jobs "are scheduled on their own"; the
/// fresh start is fmsched's addition for a temporal transfer that hurts).
pub fn guard_consequence<J: Copy>(
    mode: MergeMode,
    a: J,
    b: J,
    ruling: GuardRuling,
) -> GuardConsequence<J> {
    let spatial = mode == MergeMode::Spatial;
    let measure_spatial = if spatial {
        GainMeasure::EachAgainstOwnCurve
    } else {
        GainMeasure::Later
    };
    match ruling {
        GuardRuling::Keep => GuardConsequence {
            ends: false,
            alone: Vec::new(),
            leaves_joint_process: None,
            restarts: None,
            measure: measure_spatial,
        },
        GuardRuling::Split => GuardConsequence {
            ends: true,
            alone: vec![a, b],
            leaves_joint_process: spatial.then_some(b),
            restarts: None,
            measure: if spatial {
                GainMeasure::EachAgainstOwnCurve
            } else {
                GainMeasure::NoGain
            },
        },
        GuardRuling::RestartFresh => GuardConsequence {
            ends: true,
            alone: vec![b],
            leaves_joint_process: None,
            restarts: Some(b),
            measure: GainMeasure::AlreadyMeasured,
        },
    }
}

/// The ruling a [`GuardVerdict`] gives, if any yet.
pub fn ruling_of(verdict: &GuardVerdict) -> Option<GuardRuling> {
    match verdict {
        GuardVerdict::Wait => None,
        GuardVerdict::Keep => Some(GuardRuling::Keep),
        GuardVerdict::Split(_) => Some(GuardRuling::Split),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u8) -> JobId {
        format!("01a20000-0000-7000-8000-0000000000{n:02}")
            .parse()
            .unwrap()
    }

    /// A watched job whose metric improves upwards.
    fn w(job: JobId, evals: Option<&[f64]>) -> Watched<'_> {
        Watched {
            job,
            evals,
            lower_is_better: false,
        }
    }

    /// A loss target (`lower_is_better`) improves downwards: a falling
    /// loss keeps the merge, a rising or flat one splits it — the opposite
    /// of an accuracy with the same numbers.
    #[test]
    fn the_guard_reads_a_loss_target_downwards() {
        let (a, b) = (job(1), job(2));
        let falling = [0.9, 0.7];
        let rising = [0.7, 0.9];
        let loss = |job, evals| Watched {
            job,
            evals: Some(evals),
            lower_is_better: true,
        };
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[loss(b, &falling)]),
            GuardVerdict::Keep
        );
        assert!(matches!(
            guard_verdict(MergeMode::Temporal, &[w(b, Some(&falling))]),
            GuardVerdict::Split(_)
        ));
        let GuardVerdict::Split(why) =
            guard_verdict(MergeMode::Spatial, &[loss(a, &falling), loss(b, &rising)])
        else {
            panic!("a rising loss must split the pair")
        };
        assert!(
            why.contains(&b.to_string()) && why.contains("lower is better"),
            "{why}"
        );
        assert_eq!(
            guard_verdict(
                MergeMode::Spatial,
                &[loss(a, &falling), w(b, Some(&rising))]
            ),
            GuardVerdict::Keep
        );
    }

    #[test]
    fn the_guard_waits_for_two_epochs_of_every_watched_job() {
        let (a, b) = (job(1), job(2));
        let one = [0.6];
        let two = [0.6, 0.7];
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[w(b, None)]),
            GuardVerdict::Wait
        );
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[w(b, Some(&one))]),
            GuardVerdict::Wait
        );
        // Spatial: one job improving is not enough while the other is unknown.
        assert_eq!(
            guard_verdict(MergeMode::Spatial, &[w(a, Some(&two)), w(b, Some(&one))]),
            GuardVerdict::Wait
        );
        assert_eq!(
            guard_verdict(MergeMode::Spatial, &[w(a, Some(&two)), w(b, Some(&two))]),
            GuardVerdict::Keep
        );
        assert_eq!(
            guard_verdict(MergeMode::Temporal, &[w(b, Some(&two))]),
            GuardVerdict::Keep
        );
    }

    #[test]
    fn one_task_without_gain_splits_the_merge_naming_it() {
        let (a, b) = (job(1), job(2));
        let flat = [0.5, 0.5];
        let worse = [0.62, 0.58];
        let better = [0.5, 0.7];
        // Spatial: either task stalling splits (even before the other has
        // two epochs), and the reason names the task.
        let GuardVerdict::Split(why) = guard_verdict(
            MergeMode::Spatial,
            &[w(a, Some(&better)), w(b, Some(&flat))],
        ) else {
            panic!("a stalled task must split the pair")
        };
        assert!(
            why.contains(&b.to_string()) && why.contains("0.5000 → 0.5000"),
            "{why}"
        );
        assert!(matches!(
            guard_verdict(MergeMode::Spatial, &[w(a, Some(&worse)), w(b, None)]),
            GuardVerdict::Split(_)
        ));
        // Temporal: B's accuracy with A's weights.
        let GuardVerdict::Split(why) = guard_verdict(MergeMode::Temporal, &[w(b, Some(&worse))])
        else {
            panic!("no gain for B must split A ↦ B")
        };
        assert!(why.contains("evaluated with A's weights"), "{why}");
    }
}
