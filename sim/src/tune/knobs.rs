//! What AutoSched tunes: each policy's knob space, the objective it
//! scores a simulated replay by, and the knobs' defaults.

use std::collections::BTreeMap;

use crate::engine::{Observation, ObservedState, SimResult};

/// Knob values by name, as `with_knobs` takes them.
pub type Knobs = BTreeMap<String, f64>;

/// One tunable knob and its range.
#[derive(Clone, Debug, PartialEq)]
pub struct Knob {
    pub name: &'static str,
    pub lo: f64,
    pub hi: f64,
    /// Sampled on a log scale.
    pub log: bool,
}

impl Knob {
    /// `v` mapped to [0, 1] on the knob's scale.
    pub(crate) fn unit(&self, v: f64) -> f64 {
        let v = v.clamp(self.lo, self.hi);
        if self.log {
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
    pub(crate) fn at_unit(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        if self.log {
            (self.lo.ln() + u * (self.hi.ln() - self.lo.ln())).exp()
        } else {
            self.lo + u * (self.hi - self.lo)
        }
    }
}

/// The knobs AutoSched tunes for a policy (thesis Table 6.1: Tiresias'
/// queue threshold and starvation limit, Themis' lease term; both their
/// round interval). None: the policy has nothing worth tuning here.
pub fn knob_space(policy: &str) -> Option<Vec<Knob>> {
    let interval = Knob {
        name: "interval_s",
        lo: 60.0,
        hi: 600.0,
        log: true,
    };
    Some(match policy {
        "tiresias" => vec![
            Knob {
                name: "threshold_gpu_h",
                lo: 0.05,
                hi: 64.0,
                log: true,
            },
            Knob {
                name: "starvation_factor",
                lo: 1.0,
                hi: 100.0,
                log: true,
            },
            interval,
        ],
        "themis" => vec![
            Knob {
                name: "lease_s",
                lo: 60.0,
                hi: 7200.0,
                log: true,
            },
            interval,
        ],
        _ => return None,
    })
}

/// What a configuration is judged by (higher is better).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    /// 1 / average JCT (Tiresias' goal).
    AvgJct,
    /// Share of jobs with Themis' ρ ≤ 1 (§6.6.4), [`crate::engine::JobResult::fair_rho`].
    FairShare,
}

impl Objective {
    pub fn for_policy(policy: &str) -> Self {
        if policy == "themis" {
            Objective::FairShare
        } else {
            Objective::AvgJct
        }
    }

    /// The score of a run, higher is better.
    pub fn score(self, r: &SimResult) -> f64 {
        if r.jobs.is_empty() {
            return 0.0;
        }
        match self {
            Objective::AvgJct => {
                let mean = r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
                1.0 / mean.max(1e-9)
            }
            Objective::FairShare => {
                r.jobs.iter().filter(|j| j.fair_rho <= 1.0 + 1e-9).count() as f64
                    / r.jobs.len() as f64
            }
        }
    }
}

impl Objective {
    /// The score of what happened: jobs that finished in `[from, to)` of
    /// the observed run. None when none did.
    pub fn observed(self, obs: &Observation<'_>, from: f64, to: f64) -> Option<f64> {
        let done: Vec<(f64, f64)> = obs
            .jobs
            .iter()
            .filter_map(|o| match o.state {
                ObservedState::Done { finish_s } if finish_s >= from && finish_s < to => Some((
                    finish_s - o.spec.submit_s,
                    o.fair_share_gpu_s / o.attained_gpu_s.max(1e-9),
                )),
                _ => None,
            })
            .collect();
        if done.is_empty() {
            return None;
        }
        let n = done.len() as f64;
        Some(match self {
            Objective::AvgJct => n / done.iter().map(|d| d.0).sum::<f64>().max(1e-9),
            Objective::FairShare => done.iter().filter(|d| d.1 <= 1.0 + 1e-9).count() as f64 / n,
        })
    }
}

/// Knob values rounded to what an operator would write (3 significant
/// digits), so decisions read well and repeat exactly.
pub(crate) fn round_knob(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    // Through decimal text, so 67.1 is the f64 nearest 67.1 and prints so.
    format!("{v:.2e}").parse().unwrap_or(v)
}

/// A policy's own default for a knob.
pub fn default_knob(policy: &str, knob: &str) -> Option<f64> {
    use fmsched_core::policy::baselines::{Themis, Tiresias};
    match (policy, knob) {
        ("tiresias", "interval_s") => Some(Tiresias::default().interval_s),
        ("tiresias", "starvation_factor") => Some(Tiresias::default().starvation_factor),
        ("tiresias", "threshold_gpu_h") => Tiresias::default()
            .thresholds_gpu_s
            .first()
            .map(|s| s / 3600.0),
        ("themis", "interval_s") => Some(Themis::default().interval_s),
        ("themis", "lease_s") => Some(Themis::default().lease_s),
        _ => None,
    }
}
