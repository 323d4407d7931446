//! Deadlines and service classes (UniSched, thesis Ch. 5): the reward step
//! function of a job (Fig. 5.5a), the suspend/resume overhead an SLO job
//! should expect (Eq. 5.3), and the weighted SLO violation rate the
//! simulator reports (Eq. 5.15).
//!
//! A job's reward is a step function of its finish time with values in
//! [0, 100]: a strict SLO job earns 100 when it finishes by its deadline
//! and nothing after; a soft SLO job earns 100 / 80 / 50 / 20 by 1.0 /
//! 1.1 / 1.2 / 1.5 × its deadline (measured from submission, §5.4.2); a
//! best-effort job has no steps (the policies reward it by its remaining
//! time instead). Times are seconds on the caller's clock, like
//! `Snapshot::now`.

use serde::{Deserialize, Serialize};

/// A job's service class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloClass {
    #[default]
    BestEffort,
    /// Must finish before its deadline (UniSched's strict SLO).
    Slo,
    /// Should finish by its deadline; finishing by 1.1 / 1.2 / 1.5 × it
    /// still earns part of the reward (UniSched's soft SLO,
    /// [`SOFT_STEPS`]).
    SoftSlo,
}

impl SloClass {
    pub fn as_str(self) -> &'static str {
        match self {
            SloClass::BestEffort => "best_effort",
            SloClass::Slo => "slo",
            SloClass::SoftSlo => "soft_slo",
        }
    }

    /// A class with a deadline to meet.
    pub fn has_deadline(self) -> bool {
        !matches!(self, SloClass::BestEffort)
    }

    /// The one default class rule of every entry point (gRPC, YAML, SDK,
    /// fmsim workloads): the class named, else SLO when there is a
    /// deadline (UniSched: a deadline is what makes a job an SLO job), else
    /// best-effort.
    pub fn or_default_for(named: Option<SloClass>, has_deadline: bool) -> SloClass {
        named.unwrap_or(if has_deadline {
            SloClass::Slo
        } else {
            SloClass::BestEffort
        })
    }
}

impl std::str::FromStr for SloClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [SloClass::BestEffort, SloClass::Slo, SloClass::SoftSlo]
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not best_effort, slo or soft_slo"))
    }
}

/// One step of a reward function: finishing by `by` earns `reward`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RewardStep {
    /// Seconds on the caller's clock.
    pub by: f64,
    /// In [0, 100].
    pub reward: f64,
}

/// The reward of meeting a strict deadline (and of a soft one's first step).
pub const FULL_REWARD: f64 = 100.0;

/// A soft SLO job's steps as (multiple of its relative deadline, reward),
/// from the user survey the thesis follows (§5.4.2: "additional soft SLO
/// deadlines at 1.1, 1.2, and 1.5 times D_{0,i}, with corresponding reward
/// values of 80, 50, and 20").
pub const SOFT_STEPS: [(f64, f64); 4] = [(1.0, 100.0), (1.1, 80.0), (1.2, 50.0), (1.5, 20.0)];

/// One step of a soft SLO job's own reward function (the spec's
/// `reward_steps`): `reward` for finishing by `at` × its relative deadline.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftStep {
    pub at: f64,
    pub reward: f64,
}

/// [`reward_steps`] with a soft SLO job's own steps (`custom`, validated by
/// the spec: the first at 1 × the deadline, later ones later and worth no
/// more); empty `custom`, or another class: [`reward_steps`].
pub fn reward_steps_with(
    class: SloClass,
    submitted_at: f64,
    deadline: Option<f64>,
    custom: &[SoftStep],
) -> Vec<RewardStep> {
    match (class, deadline) {
        (SloClass::SoftSlo, Some(d)) if !custom.is_empty() => {
            let span = (d - submitted_at).max(0.0);
            custom
                .iter()
                .map(|s| RewardStep {
                    by: submitted_at + s.at * span,
                    reward: s.reward,
                })
                .collect()
        }
        _ => reward_steps(class, submitted_at, deadline),
    }
}

/// The reward steps of a job of `class` submitted at `submitted_at` with
/// its deadline at `deadline` (same clock), earliest first. Best-effort
/// jobs (and a class without a deadline) have none.
pub fn reward_steps(class: SloClass, submitted_at: f64, deadline: Option<f64>) -> Vec<RewardStep> {
    let Some(d) = deadline else {
        return Vec::new();
    };
    match class {
        SloClass::BestEffort => Vec::new(),
        SloClass::Slo => vec![RewardStep {
            by: d,
            reward: FULL_REWARD,
        }],
        SloClass::SoftSlo => {
            let span = (d - submitted_at).max(0.0);
            SOFT_STEPS
                .iter()
                .map(|&(x, reward)| RewardStep {
                    by: submitted_at + x * span,
                    reward,
                })
                .collect()
        }
    }
}

/// The reward a job with these steps earns finishing at `finish`: the
/// largest reward of a step it meets, 0 when it meets none.
pub fn reward_at(steps: &[RewardStep], finish: f64) -> f64 {
    steps
        .iter()
        .filter(|s| finish <= s.by)
        .map(|s| s.reward)
        .fold(0.0, f64::max)
}

/// One SLO job's share of the weighted SLO violation rate: the reward it
/// lost, `(W_max − W) / (W_max − W_min)` with `W_min = 0`, `W_max = 100`.
/// Eq. 5.15 as printed averages `(W − W_min) / (W_max − W_min)`, which is
/// the *attainment*; the thesis plots `R^slo` as a rate to reduce, so the
/// violation is one minus it (fmsim prints both).
pub fn violation(steps: &[RewardStep], finish: f64) -> f64 {
    if steps.is_empty() {
        return 0.0;
    }
    (FULL_REWARD - reward_at(steps, finish)) / FULL_REWARD
}

/// `C(n, k)` as a float (0 outside `0 ≤ k ≤ n`).
pub(crate) fn choose(n: u64, k: u64) -> f64 {
    if k > n {
        return 0.0;
    }
    let k = k.min(n - k);
    (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64)
}

/// UniSched Eq. 5.3: the expected suspend/resume overhead of an SLO job
/// that runs `n` lease terms before a deadline `m` terms away (`n ≤ m`),
/// each suspension and resumption costing `t_sr` seconds, suspensions
/// spread uniformly: `Σ_k k · t_sr · C(n−1, k) · C(m−n+1, k+1) / C(m, n)`
/// for `k` in `0 ..= min(n−1, m−n)`. `n > m` (the deadline is already
/// lost) counts as `m = n`: no room to be suspended.
pub fn slo_suspend_resume_s(n: u64, m: u64, t_sr: f64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let m = m.max(n);
    let total = choose(m, n);
    (0..=(n - 1).min(m - n))
        .map(|k| k as f64 * t_sr * choose(n - 1, k) * choose(m - n + 1, k + 1) / total)
        .sum()
}

/// UniSched §5.3.2.3: a best-effort job of `n` lease terms is suspended and
/// resumed with probability ½ per term: `n/2 · t_sr`.
pub fn best_effort_suspend_resume_s(n: u64, t_sr: f64) -> f64 {
    n as f64 / 2.0 * t_sr
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eq. 5.3 by hand: one term never waits; two terms in three can be
    /// split once (the middle term free: one of C(3,2) = 3 placements);
    /// the probabilities of Eq. 5.3 sum to 1.
    #[test]
    fn suspend_resume_expectation_by_hand() {
        assert_eq!(slo_suspend_resume_s(1, 10, 60.0), 0.0);
        assert_eq!(
            slo_suspend_resume_s(3, 3, 60.0),
            0.0,
            "no slack, no suspension"
        );
        assert!((slo_suspend_resume_s(2, 3, 60.0) - 20.0).abs() < 1e-9);
        for (n, m) in [(3u64, 7u64), (5, 12), (10, 10), (1, 4)] {
            let p: f64 = (0..=(n - 1).min(m - n))
                .map(|k| choose(n - 1, k) * choose(m - n + 1, k + 1) / choose(m, n))
                .sum();
            assert!((p - 1.0).abs() < 1e-9, "n={n} m={m}: {p}");
        }
        // More slack, more expected suspensions.
        assert!(slo_suspend_resume_s(4, 20, 1.0) > slo_suspend_resume_s(4, 6, 1.0));
        assert_eq!(best_effort_suspend_resume_s(6, 10.0), 30.0);
    }

    #[test]
    fn reward_step_functions_of_each_class() {
        assert!(reward_steps(SloClass::BestEffort, 0.0, Some(100.0)).is_empty());
        assert!(reward_steps(SloClass::Slo, 0.0, None).is_empty());
        let strict = reward_steps(SloClass::Slo, 50.0, Some(150.0));
        assert_eq!(reward_at(&strict, 150.0), 100.0);
        assert_eq!(reward_at(&strict, 150.1), 0.0);
        assert_eq!(violation(&strict, 151.0), 1.0);
        // Soft: deadline 100 s after submission at t = 50.
        let soft = reward_steps(SloClass::SoftSlo, 50.0, Some(150.0));
        let by: Vec<f64> = soft.iter().map(|s| s.by).collect();
        assert_eq!(by, vec![150.0, 160.0, 170.0, 200.0]);
        assert_eq!(reward_at(&soft, 140.0), 100.0);
        assert_eq!(reward_at(&soft, 155.0), 80.0);
        assert_eq!(reward_at(&soft, 165.0), 50.0);
        assert_eq!(reward_at(&soft, 199.0), 20.0);
        assert_eq!(reward_at(&soft, 201.0), 0.0);
        assert!((violation(&soft, 165.0) - 0.5).abs() < 1e-12);
        assert_eq!(violation(&[], 1e9), 0.0, "best-effort jobs violate nothing");
    }
}
