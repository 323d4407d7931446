//! Deadline estimates (UniSched, thesis §5.3): a job's execution time
//! `T_exe = T_sr + N_iter · T_iter`, the expected suspend/resume overhead
//! `T_sr` (Eq. 5.3), and the best case admission compares a deadline with:
//! the job alone on the fastest allocation the cluster has for it, never
//! suspended.

use crate::lut::{Lut, Variant};

/// `C(n, k)` as a float (0 outside `0 ≤ k ≤ n`).
fn choose(n: u64, k: u64) -> f64 {
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
