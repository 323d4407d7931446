//! The merge guard's verdict (Ymir §4.3): whether a merge whose watched
//! jobs have reported their first epochs' evaluations is kept, split (and
//! why), or still waits. Pure: the service reads the evaluations its
//! trainers reported and acts on the verdict (split the pair, measure what
//! it gained); fmsim judges its merges on its catalog's curves instead
//! (`fmsched_sim::engine`, which has no evaluation trace per merge).

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
