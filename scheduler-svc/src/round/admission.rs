//! Deadline admission at submit (UniSched, thesis §5.3 and the issue's
//! admission rule): a job with a deadline is compared with its best case —
//! alone on the fastest allocation the registered nodes have for it, never
//! suspended ([`deadline::fastest_alone`]). A strict SLO job that cannot
//! meet its deadline even then is refused naming `deadline` and the
//! earliest deadline it could meet; a best-effort one is accepted with a
//! warning. The estimate is the shipped throughput table's, the one the
//! rounds fall back on; profiling, queueing and suspensions only add to it,
//! so a refused deadline is one no schedule could meet.
//!
//! Owns: the decision. Does not own: the estimate maths (`fmsched-estimator`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fmsched_core::job::{JobSpec, SloClass};
use fmsched_core::node::NodeState;
use fmsched_estimator::analytic;
use fmsched_estimator::deadline::{self, AloneJob, Family, Fastest};
use fmsched_estimator::lut::{Lut, Variant};

use crate::registry::LiveNode;

/// What admission makes of a job's deadline.
#[derive(Clone, Debug, PartialEq)]
pub enum DeadlineCheck {
    /// No deadline.
    Met,
    /// Its best case meets it: that many seconds from now (what rounds for
    /// deadlines need to know, `scheduling.deadline_round_gap`).
    Meets { best_s: f64 },
    /// Cannot be judged at submit (why).
    Unchecked(String),
    /// Even its best case ends after the deadline.
    Missed {
        deadline: DateTime<Utc>,
        earliest: DateTime<Utc>,
        fastest: Fastest,
        iterations: u64,
    },
}

impl DeadlineCheck {
    /// The refusal of a strict SLO job, or the warning of any other job
    /// (None: nothing to say).
    pub fn verdict(&self, class: SloClass) -> Option<(bool, String)> {
        match self {
            DeadlineCheck::Met | DeadlineCheck::Meets { .. } => None,
            DeadlineCheck::Unchecked(why) => class
                .has_deadline()
                .then(|| (false, format!("deadline not checked at submit: {why}"))),
            DeadlineCheck::Missed {
                deadline,
                earliest,
                fastest,
                iterations,
            } => {
                let why = format!(
                    "{} cannot be met: alone on {} {} GPU(s), never suspended, its {iterations} \
                     iterations take at least {:.0} s ({:.3} s each); the earliest deadline it could \
                     meet is {}",
                    deadline.to_rfc3339(),
                    fastest.gpus,
                    fastest.family,
                    fastest.seconds,
                    fastest.iteration_s,
                    earliest.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                );
                Some(match class {
                    SloClass::Slo => (
                        true,
                        format!(
                            "{why}. Move the deadline, allow more GPUs (resources.max_gpus), or \
                             submit it as slo_class: soft_slo or best_effort"
                        ),
                    ),
                    SloClass::SoftSlo => (
                        false,
                        format!(
                            "deadline {why}; accepted as a soft SLO (part of its reward is left \
                             only if it finishes by 1.5 × the deadline)"
                        ),
                    ),
                    SloClass::BestEffort => {
                        (false, format!("deadline {why}; accepted as best-effort"))
                    }
                })
            }
        }
    }
}

/// The GPU families of the nodes that are not Offline: (largest node, all
/// GPUs) each.
fn families(nodes: &[LiveNode]) -> Vec<Family> {
    let mut by: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.state != NodeState::Offline) {
        let g = n.record.gpus.len() as u32;
        if g == 0 {
            continue;
        }
        let e = by.entry(crate::registry::node_family(n)).or_default();
        e.0 = e.0.max(g);
        e.1 += g;
    }
    by.into_iter()
        .map(|(name, (per_node, gpus))| Family {
            name,
            per_node,
            gpus,
        })
        .collect()
}

/// Checks `spec`'s deadline against its best case on `nodes` at `now`.
pub fn check_deadline(
    lut: &Lut,
    nodes: &[LiveNode],
    spec: &JobSpec,
    now: DateTime<Utc>,
) -> DeadlineCheck {
    let Some(deadline) = spec.deadline else {
        return DeadlineCheck::Met;
    };
    if spec.target.metric.is_some() {
        return DeadlineCheck::Unchecked(
            "it stops on a metric target, so its iterations are known only once it has trained"
                .into(),
        );
    }
    let Some(iterations) = spec.iteration_budget() else {
        return DeadlineCheck::Unchecked(
            "its epochs cannot be counted in iterations without dataset.num_samples".into(),
        );
    };
    let asked = spec
        .resources
        .gpu_model
        .as_deref()
        .map(analytic::gpu_family);
    let fams: Vec<Family> = families(nodes)
        .into_iter()
        .filter(|f| asked.as_ref().is_none_or(|a| *a == f.name))
        .collect();
    if fams.is_empty() {
        return DeadlineCheck::Unchecked("no registered node can run it yet".into());
    }
    let variant = Variant::of_spec(spec);
    let job = AloneJob {
        model: &spec.model,
        layers: analytic::layers_of(&spec.model).unwrap_or(12),
        variant: &variant,
        global_batch: spec.hyperparameters.global_batch_size.max(1),
        iterations,
        unit: spec.resources.replica().gpus(),
        min_gpus: spec.resources.min_gpus,
        max_gpus: spec.resources.max_gpus,
    };
    let Some(fastest) = deadline::fastest_alone(lut, &job, &fams) else {
        return DeadlineCheck::Unchecked(format!(
            "no profile of {} fits the registered GPUs",
            spec.model
        ));
    };
    let earliest = now + chrono::Duration::milliseconds((fastest.seconds * 1000.0).ceil() as i64);
    if earliest <= deadline {
        DeadlineCheck::Meets {
            best_s: fastest.seconds,
        }
    } else {
        DeadlineCheck::Missed {
            deadline,
            earliest,
            fastest,
            iterations,
        }
    }
}
