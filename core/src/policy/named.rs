//! Every policy by name ([`POLICY_NAMES`]), built with its paper's knobs
//! or with some of them changed ([`with_knobs`]): the one place the
//! service's `scheduling.policy`/`scheduling.knobs`, AutoSched's tuner and
//! fmsim's `--policy`/`--knob` turn a name into a policy.
//!
//! Owns: the names, each policy's knob list and the knobs' checks. Does
//! not own what a knob does (each policy's config).

use std::collections::BTreeMap;

use super::Policy;
use super::baselines::{Fifo, Optimus, Pollux, Srtf, Themis, Tiresias};
use super::deadline::{Edf, Hydra, UniSched, UniSchedConfig};
use super::icefrog::{IceFrog, IceFrogConfig, Lucid};
use super::lyra::{Gandiva, Lyra};
use super::ymir::{Ymir, YmirConfig};

type BoxedPolicy = Box<dyn Policy + Send + Sync>;

/// Every policy by name, with its paper's knobs.
pub fn by_name(name: &str) -> Option<BoxedPolicy> {
    with_knobs(name, &BTreeMap::new()).ok()
}

/// A policy by name with some knobs changed (`knob = value`). Every policy
/// takes `interval_s`; the others are listed in the error for a knob the
/// policy does not have. Booleans are 0 / 1.
pub fn with_knobs(name: &str, knobs: &BTreeMap<String, f64>) -> Result<BoxedPolicy, String> {
    let Some(known) = knob_names(name) else {
        return Err(format!(
            "unknown policy {name:?}; expected one of {}",
            POLICY_NAMES.join(", ")
        ));
    };
    let mut k = Knobs(knobs.iter().map(|(k, v)| (k.as_str(), *v)).collect());
    let policy = match name {
        "fifo" | "srtf" | "tiresias" | "optimus" | "themis" | "pollux" => baseline(name, &mut k),
        "edf" | "hydra" | "unisched" | "chronus" => deadline(name, &mut k),
        "icefrog" | "icefrog-no-sharing" | "lucid" | "lyra" | "gandiva" => elastic(name, &mut k),
        "ymir" | "ymir-no-merge" => ymir(name, &mut k),
        other => unreachable!("knob_names knows {other:?} but with_knobs does not"),
    };
    if let Some((k, _)) = k.0.into_iter().next() {
        return Err(format!(
            "policy {name} has no knob {k:?}; its knobs: {}",
            known.join(", ")
        ));
    }
    if let Some((k, v)) = knobs.iter().find(|(_, v)| !v.is_finite() || **v < 0.0) {
        return Err(format!("knob {k} = {v}: must be a finite number >= 0"));
    }
    if policy.interval_s() < 1.0 {
        return Err(format!(
            "knob interval_s = {}: must be at least 1 second",
            policy.interval_s()
        ));
    }
    Ok(policy)
}

/// The knobs not yet taken by the policy being built.
struct Knobs<'a>(BTreeMap<&'a str, f64>);

impl Knobs<'_> {
    /// Sets `into` to the knob's value, if given, and marks it taken.
    fn take(&mut self, key: &str, into: &mut f64) {
        if let Some(v) = self.0.remove(key) {
            *into = v;
        }
    }
}

/// The baselines of thesis Ch. 2 (Ymir §7.1).
fn baseline(name: &str, k: &mut Knobs) -> BoxedPolicy {
    match name {
        "fifo" => {
            let mut p = Fifo::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        "srtf" => {
            let mut p = Srtf::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        "tiresias" => {
            let mut p = Tiresias::default();
            k.take("interval_s", &mut p.interval_s);
            k.take("starvation_factor", &mut p.starvation_factor);
            let mut threshold = p.thresholds_gpu_s.first().copied().unwrap_or(0.0) / 3600.0;
            k.take("threshold_gpu_h", &mut threshold);
            p.thresholds_gpu_s = vec![threshold * 3600.0];
            Box::new(p)
        }
        "optimus" => {
            let mut p = Optimus::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        "themis" => {
            let mut p = Themis::default();
            k.take("interval_s", &mut p.interval_s);
            k.take("lease_s", &mut p.lease_s);
            Box::new(p)
        }
        _ => {
            let mut p = Pollux::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
    }
}

/// The deadline-aware policies (UniSched thesis Ch. 5 and its baselines).
fn deadline(name: &str, k: &mut Knobs) -> BoxedPolicy {
    match name {
        "edf" => {
            let mut p = Edf::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        "hydra" => {
            let mut p = Hydra::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        _ => {
            let mut c = UniSchedConfig {
                chronus: name == "chronus",
                iteration_estimator: name == "unisched",
                ..Default::default()
            };
            let (mut windows, mut horizon) = (c.windows as f64, f64::from(c.horizon_terms));
            let mut estimator = if c.iteration_estimator { 1.0 } else { 0.0 };
            k.take("interval_s", &mut c.interval_s);
            k.take("be_lease_s", &mut c.be_lease_s);
            k.take("slo_lease_s", &mut c.slo_lease_s);
            k.take("time_limit_s", &mut c.time_limit_s);
            k.take("windows", &mut windows);
            k.take("horizon_terms", &mut horizon);
            k.take("future_capacity", &mut c.future_capacity);
            k.take("slack_weight", &mut c.slack_weight);
            k.take("deadline_margin_s", &mut c.deadline_margin_s);
            k.take("risk_weight", &mut c.risk_weight);
            k.take("iteration_estimator", &mut estimator);
            c.iteration_estimator = estimator != 0.0;
            c.windows = windows.max(1.0) as usize;
            c.horizon_terms = horizon.clamp(1.0, 1e6) as u32;
            Box::new(UniSched::new(c))
        }
    }
}

/// The elastic and sharing policies: ICEFROG, Lucid, Lyra, Gandiva.
fn elastic(name: &str, k: &mut Knobs) -> BoxedPolicy {
    match name {
        "icefrog" | "icefrog-no-sharing" => {
            let mut c = IceFrogConfig {
                sharing: name == "icefrog",
                ..Default::default()
            };
            let mut sharing = if c.sharing { 1.0 } else { 0.0 };
            let mut parts = c.partition_jobs as f64;
            k.take("interval_s", &mut c.interval_s);
            k.take("time_limit_s", &mut c.time_limit_s);
            k.take("sharing", &mut sharing);
            k.take("partition_jobs", &mut parts);
            c.sharing = sharing != 0.0;
            c.partition_jobs = parts.clamp(0.0, 1e9) as usize;
            Box::new(IceFrog::new(c))
        }
        "lucid" => {
            let mut p = Lucid::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        "lyra" => {
            let mut p = Lyra::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
        _ => {
            let mut p = Gandiva::default();
            k.take("interval_s", &mut p.interval_s);
            Box::new(p)
        }
    }
}

/// Ymir, with or without merging.
fn ymir(name: &str, k: &mut Knobs) -> BoxedPolicy {
    let mut c = YmirConfig {
        merging: name == "ymir",
        ..Default::default()
    };
    let mut merging = if c.merging { 1.0 } else { 0.0 };
    let mut warm = if c.warm_starts { 1.0 } else { 0.0 };
    let mut displace = if c.displace_longer { 1.0 } else { 0.0 };
    let mut pairs = c.pairs_per_job as f64;
    let mut partition = c.partition_units as f64;
    let mut milp = c.milp_units as f64;
    k.take("interval_s", &mut c.interval_s);
    k.take("time_limit_s", &mut c.time_limit_s);
    k.take("srtf_weight", &mut c.srtf_weight);
    k.take("wait_weight", &mut c.wait_weight);
    k.take("resize_horizon_s", &mut c.resize_horizon_s);
    k.take("risk_weight", &mut c.risk_weight);
    k.take("merging", &mut merging);
    k.take("warm_starts", &mut warm);
    k.take("displace_longer", &mut displace);
    k.take("pairs_per_job", &mut pairs);
    k.take("partition_units", &mut partition);
    k.take("milp_units", &mut milp);
    c.merging = merging != 0.0;
    c.warm_starts = warm != 0.0;
    c.displace_longer = displace != 0.0;
    c.pairs_per_job = pairs.max(0.0) as usize;
    c.partition_units = partition.clamp(0.0, 1e9) as usize;
    c.milp_units = milp.clamp(0.0, 1e9) as usize;
    Box::new(Ymir::new(c))
}

/// The knobs a policy takes ([`with_knobs`]), or None for an unknown
/// policy.
pub fn knob_names(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "fifo" | "srtf" | "optimus" | "pollux" | "edf" | "hydra" | "lyra" | "gandiva" | "lucid" => {
            &["interval_s"]
        }
        "tiresias" => &["interval_s", "starvation_factor", "threshold_gpu_h"],
        "themis" => &["interval_s", "lease_s"],
        "icefrog" | "icefrog-no-sharing" => {
            &["interval_s", "time_limit_s", "sharing", "partition_jobs"]
        }
        "unisched" | "chronus" => &[
            "interval_s",
            "be_lease_s",
            "slo_lease_s",
            "time_limit_s",
            "windows",
            "horizon_terms",
            "future_capacity",
            "slack_weight",
            "deadline_margin_s",
            "risk_weight",
            "iteration_estimator",
        ],
        "ymir" | "ymir-no-merge" => &[
            "interval_s",
            "time_limit_s",
            "srtf_weight",
            "wait_weight",
            "resize_horizon_s",
            "risk_weight",
            "merging",
            "warm_starts",
            "displace_longer",
            "pairs_per_job",
            "partition_units",
            "milp_units",
        ],
        _ => return None,
    })
}

/// Names accepted by [`by_name`].
pub const POLICY_NAMES: [&str; 17] = [
    "ymir",
    "ymir-no-merge",
    "fifo",
    "srtf",
    "tiresias",
    "optimus",
    "themis",
    "pollux",
    "unisched",
    "chronus",
    "edf",
    "hydra",
    "lyra",
    "gandiva",
    "icefrog",
    "icefrog-no-sharing",
    "lucid",
];
