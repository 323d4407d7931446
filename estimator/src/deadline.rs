//! Deadline estimates (UniSched, thesis §5.3): a job's execution time
//! `T_exe = T_sr + N_iter · T_iter`, the expected suspend/resume overhead
//! `T_sr` (Eq. 5.3), and the best case admission compares a deadline with:
//! the job alone on the fastest allocation the cluster has for it, never
//! suspended.

use crate::lut::{Lut, Variant};

/// Eq. 5.3 and the best-effort expectation live with the policies that
/// use them (`fmsched_core::slo`); re-exported here for the estimator's
/// callers.
pub use fmsched_core::slo::{best_effort_suspend_resume_s, slo_suspend_resume_s};

/// A GPU family of the cluster as admission sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    /// GPUs of its largest node (allocations are packed onto such nodes).
    pub per_node: u32,
    /// GPUs of all its nodes.
    pub gpus: u32,
}

/// What admission knows of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct AloneJob<'a> {
    pub model: &'a str,
    pub layers: u32,
    pub variant: &'a Variant,
    pub global_batch: u32,
    /// Iterations it runs (its budget; admission checks only jobs that stop
    /// on a budget).
    pub iterations: u64,
    /// Its allocations are multiples of this (a pipeline's stages, an
    /// expert group; 1 otherwise), within `min_gpus ..= max_gpus`.
    pub unit: u32,
    pub min_gpus: u32,
    pub max_gpus: u32,
}

/// The best case of a job: its fastest allocation alone.
#[derive(Clone, Debug, PartialEq)]
pub struct Fastest {
    pub family: String,
    pub gpus: u32,
    /// `T_iter` there.
    pub iteration_s: f64,
    /// `T_exe = N_iter · T_iter` (`T_sr = 0`: alone, never suspended).
    pub seconds: f64,
}

/// The fastest `T_exe` of `job` alone on any of `families`, over every
/// allocation it may take there that fits the GPUs' memory; None when none
/// does (or no family has a profile of the model). A lower bound on its
/// execution time in the cluster: it leaves out profiling, queueing and
/// suspensions.
pub fn fastest_alone(lut: &Lut, job: &AloneJob<'_>, families: &[Family]) -> Option<Fastest> {
    let unit = job.unit.max(1);
    let mut best: Option<Fastest> = None;
    for f in families {
        let top = job.max_gpus.min(f.gpus);
        for gpus in (unit..=top).step_by(unit as usize) {
            if gpus < job.min_gpus || f.per_node == 0 {
                continue;
            }
            let Ok(it) = lut.iteration_time(
                job.model,
                &f.name,
                gpus,
                f.per_node,
                job.global_batch,
                job.variant,
                job.layers,
            ) else {
                continue;
            };
            let seconds = job.iterations as f64 * it.seconds;
            if it.feasible && best.as_ref().is_none_or(|b| seconds < b.seconds) {
                best = Some(Fastest {
                    family: f.name.clone(),
                    gpus,
                    iteration_s: it.seconds,
                    seconds,
                });
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The best case picks the fastest family and allocation, in whole
    /// units, within the job's range and the family's GPUs; a model no
    /// GPU can hold has none.
    #[test]
    fn the_fastest_allocation_alone() {
        let lut = crate::analytic::default_lut().unwrap();
        let v = Variant::base();
        let job = AloneJob {
            model: "roberta-base",
            layers: 12,
            variant: &v,
            global_batch: 64,
            iterations: 1000,
            unit: 1,
            min_gpus: 1,
            max_gpus: 4,
        };
        let v100 = Family {
            name: "V100".into(),
            per_node: 4,
            gpus: 8,
        };
        let a100 = Family {
            name: "A100".into(),
            per_node: 4,
            gpus: 2,
        };
        let f = fastest_alone(&lut, &job, std::slice::from_ref(&v100)).unwrap();
        let one = lut
            .iteration_time("roberta-base", "V100", 1, 4, 64, &v, 12)
            .unwrap();
        assert!(f.gpus > 1 && f.seconds < 1000.0 * one.seconds, "{f:?}");
        assert!((f.seconds - 1000.0 * f.iteration_s).abs() < 1e-9);
        let both = fastest_alone(&lut, &job, &[v100, a100.clone()]).unwrap();
        assert!(both.seconds <= f.seconds);
        let only_a100 = fastest_alone(&lut, &job, &[a100]).unwrap();
        assert!(only_a100.gpus <= 2, "the family's GPUs bound it");
        let pipe = AloneJob {
            unit: 4,
            min_gpus: 4,
            max_gpus: 8,
            ..job.clone()
        };
        let p = fastest_alone(
            &lut,
            &pipe,
            &[Family {
                name: "V100".into(),
                per_node: 4,
                gpus: 8,
            }],
        )
        .unwrap();
        assert!(p.gpus.is_multiple_of(4), "{p:?}");
        let huge = AloneJob {
            model: "llama-2-7b",
            layers: 32,
            max_gpus: 1,
            ..job
        };
        assert_eq!(
            fastest_alone(
                &lut,
                &huge,
                &[Family {
                    name: "V100".into(),
                    per_node: 4,
                    gpus: 4
                }]
            ),
            None,
            "7B full fine-tuning fits no single V100"
        );
    }
}
