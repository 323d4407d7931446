//! Phase 2b: the task-merger MILP (Ymir Eq. 7–13) on HiGHS, on large
//! rounds in parts solved apart (one per foundation model, cut further
//! along candidate pairs), with the capacity each part may take.

use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, variable};

use crate::policy::ymir::fallback::relaxation_greedy;
use crate::policy::ymir::{Pair, Unit, Ymir, effective, reference_time};
use crate::policy::{PlanEntry, Snapshot, SolveStats, time_in};

/// What [`Ymir::solve`] returns: GPUs per listed unit and pair, or None,
/// and the model's size.
pub(crate) type Solved = (Option<(Vec<u32>, Vec<u32>)>, SolveStats);

/// The objective's inputs shared by every part of a round.
pub(crate) struct Weights {
    /// The fair share `ā`.
    pub(super) share: u32,
    /// `λ·τ + ω·W_j` per job.
    pub(super) base: Vec<f64>,
}

/// One part of a partitioned round: units and pairs by index.
pub(super) struct Part {
    pub(super) units: Vec<usize>,
    pub(super) pairs: Vec<usize>,
}

impl Ymir {
    /// Phase 2b, on large rounds: parts that are solved apart. Only jobs of
    /// one foundation model can merge, so each model is a part; a model
    /// with more than [`YmirConfig::partition_units`] units is cut further,
    /// keeping jobs a candidate pair links together where it can (its
    /// components packed first-fit; a component too big is cut in order,
    /// and a pair across a cut is dropped). One part: no partitioning.
    pub(super) fn partitions(&self, snap: &Snapshot, units: &[Unit], pairs: &[Pair]) -> Vec<Part> {
        let limit = self.config.partition_units;
        if limit == 0 || units.len() <= limit {
            return vec![Part {
                units: (0..units.len()).collect(),
                pairs: (0..pairs.len()).collect(),
            }];
        }
        let mut unit_of = vec![usize::MAX; snap.jobs.len()];
        for (k, u) in units.iter().enumerate() {
            for &j in &u.jobs {
                unit_of[j] = k;
            }
        }
        // Components of the pair graph over units (union-find).
        let mut root: Vec<usize> = (0..units.len()).collect();
        fn find(root: &mut [usize], mut k: usize) -> usize {
            while root[k] != k {
                root[k] = root[root[k]];
                k = root[k];
            }
            k
        }
        for p in pairs {
            let c = &snap.candidates[p.candidate];
            let (a, b) = (find(&mut root, unit_of[c.a]), find(&mut root, unit_of[c.b]));
            if a != b {
                root[a.max(b)] = a.min(b);
            }
        }
        // Per model, its components (largest first).
        let mut by_model: std::collections::BTreeMap<
            &str,
            std::collections::BTreeMap<usize, Vec<usize>>,
        > = Default::default();
        for (k, u) in units.iter().enumerate() {
            let model = snap.jobs[u.jobs[0]].model.as_str();
            let r = find(&mut root, k);
            by_model
                .entry(model)
                .or_default()
                .entry(r)
                .or_default()
                .push(k);
        }
        let mut part_of = vec![0usize; units.len()];
        let mut parts: Vec<Part> = Vec::new();
        for comps in by_model.into_values() {
            let mut comps: Vec<Vec<usize>> = comps.into_values().collect();
            comps.sort_by_key(|c| std::cmp::Reverse(c.len()));
            let first = parts.len();
            for comp in comps {
                for chunk in comp.chunks(limit) {
                    let fit =
                        (first..parts.len()).find(|&q| parts[q].units.len() + chunk.len() <= limit);
                    let q = fit.unwrap_or_else(|| {
                        parts.push(Part {
                            units: Vec::new(),
                            pairs: Vec::new(),
                        });
                        parts.len() - 1
                    });
                    parts[q].units.extend_from_slice(chunk);
                }
            }
        }
        for (q, part) in parts.iter_mut().enumerate() {
            part.units.sort_unstable();
            for &k in &part.units {
                part_of[k] = q;
            }
        }
        for (i, p) in pairs.iter().enumerate() {
            let c = &snap.candidates[p.candidate];
            let (a, b) = (part_of[unit_of[c.a]], part_of[unit_of[c.b]]);
            if a == b {
                parts[a].pairs.push(i);
            }
        }
        parts
    }

    /// Each listed unit's and pair's choices, in that order: (GPUs, its
    /// objective value) — the speedup over the reference time, weighted by
    /// jobs (Eq. 7, fixed: a pair's two jobs by TranWt), plus the aging
    /// term, under the estimate spread's pessimism (`risk_weight`).
    fn choice_values(
        &self,
        snap: &Snapshot,
        w: &Weights,
        (units, unit_ids): (&[Unit], &[usize]),
        (pairs, pair_ids): (&[Pair], &[usize]),
    ) -> Vec<Vec<(u32, f64)>> {
        let allocs = &snap.allocations;
        let share = w.share;
        let kappa = self.config.risk_weight;
        // Estimate uncertainty (risk_weight κ): the wider spread of a
        // unit's or pair's jobs, and the pessimistic factor 1 + κ·s/2.
        let spread = |jobs: &[usize]| {
            jobs.iter()
                .map(|&j| snap.jobs[j].spread)
                .fold(0.0f64, f64::max)
        };
        let pessimism = |jobs: &[usize]| 1.0 + kappa * spread(jobs) / 2.0;
        // Each unit's and pair's choices: (GPUs, objective value).
        let mut rows: Vec<Vec<(u32, f64)>> = Vec::with_capacity(unit_ids.len() + pair_ids.len());
        for &k in unit_ids {
            let u = &units[k];
            let weight = u.jobs.len() as f64;
            let t_ref = reference_time(allocs, u.remaining_s, share * u.jobs.len() as u32);
            // The unit's pessimism (its SRTF/aging term: `ranked`).
            let pess = pessimism(&u.jobs);
            rows.push(
                u.allowed
                    .iter()
                    .map(|&a| {
                        let t = effective(
                            time_in(allocs, u.remaining_s, a),
                            a,
                            u.current,
                            u.restart_s,
                            self.config.resize_horizon_s,
                        );
                        let aged = self.ranked(snap, w, (u.mode, &u.jobs), (a, u.current), t);
                        (a, weight * t_ref / t + aged / pess)
                    })
                    .collect(),
            );
        }
        for &k in pair_ids {
            let p = &pairs[k];
            let c = &snap.candidates[p.candidate];
            let t_ref = reference_time(allocs, &c.remaining_s, 2 * share);
            let restart = snap.jobs[c.a].restart_s.max(snap.jobs[c.b].restart_s);
            // The share of the gain over running apart kept under the
            // pair's estimate spread (risk_weight), and its pessimism.
            let keep = (1.0 - kappa * spread(&[c.a, c.b]) / 2.0).max(0.0);
            let pess = pessimism(&[c.a, c.b]);
            rows.push(
                p.allowed
                    .iter()
                    .map(|&a| {
                        // A new pair starts anew, A of a temporal one too
                        // when it trains (it is launched again with the
                        // merge guard's watch); B's start is in the
                        // group's time.
                        let t = time_in(allocs, &c.remaining_s, a) + restart;
                        let tw = 1.0 + (time_in(allocs, &c.tran_wt, a) - 1.0) * keep;
                        let aged = self.ranked(snap, w, (c.mode, &[c.a, c.b]), (a, 0), t);
                        // Eq. 7 (fixed): two jobs' speedup, weighted by TranWt.
                        (a, 2.0 * tw * t_ref / t + tw * aged / pess)
                    })
                    .collect(),
            );
        }
        rows
    }

    /// Phases 3–4 over the listed units and pairs on `capacity` GPUs: GPUs
    /// per listed unit and per listed pair (0 = none), or None when the
    /// model is empty or the solver gave no proven solution (the caller
    /// falls back).
    pub(super) fn solve(
        &self,
        snap: &Snapshot,
        w: &Weights,
        (units, unit_ids): (&[Unit], &[usize]),
        (pairs, pair_ids): (&[Pair], &[usize]),
        capacity: u32,
        time_limit_s: f64,
    ) -> Solved {
        let rows = self.choice_values(snap, w, (units, unit_ids), (pairs, pair_ids));
        let n_vars: usize = rows.iter().map(Vec::len).sum();
        // The jobs each row's choice runs (one choice per job, Eq. 9–10).
        let members: Vec<Vec<usize>> = unit_ids
            .iter()
            .map(|&k| units[k].jobs.clone())
            .chain(pair_ids.iter().map(|&k| {
                let c = &snap.candidates[pairs[k].candidate];
                vec![c.a, c.b]
            }))
            .collect();
        if n_vars > 0 && self.config.milp_units > 0 && unit_ids.len() > self.config.milp_units {
            let (picks, objective) = relaxation_greedy(&rows, &members, capacity);
            let (ug, pg) = picks.split_at(unit_ids.len());
            let stats = SolveStats {
                variables: n_vars,
                candidate_pairs: pair_ids.len(),
                objective,
                relaxed: true,
                ..Default::default()
            };
            return (Some((ug.to_vec(), pg.to_vec())), stats);
        }
        let mut vars = ProblemVariables::new();
        let mut objective = Expression::from(0.0);
        // The objective's terms, to value a solution without cloning it.
        let mut terms: Vec<(Variable, f64)> = Vec::new();
        let mut used = Expression::from(0.0);
        let mut per_job: std::collections::BTreeMap<usize, Expression> = Default::default();
        let mut x: Vec<Vec<(u32, Variable)>> = Vec::with_capacity(unit_ids.len());
        let mut y: Vec<Vec<(u32, Variable)>> = Vec::with_capacity(pair_ids.len());
        // Warm start from what the units hold, when it fits.
        let held: u32 = unit_ids.iter().map(|&k| units[k].current).sum();
        let warm = held <= capacity;
        let mut warm_value = 0.0;
        for (r, (row, jobs)) in rows.iter().zip(&members).enumerate() {
            let current = unit_ids.get(r).map_or(0, |&k| units[k].current);
            let mut vs = Vec::with_capacity(row.len());
            let mut expr = Expression::from(0.0);
            for &(a, value) in row {
                let start = if warm && current > 0 && a == current {
                    1.0
                } else {
                    0.0
                };
                warm_value += start * value;
                let v = vars.add(variable().binary().initial(start));
                objective += value * v;
                terms.push((v, value));
                used += f64::from(a) * v;
                expr += v;
                vs.push((a, v));
            }
            for &j in jobs {
                *per_job.entry(j).or_default() += expr.clone();
            }
            if r < unit_ids.len() {
                x.push(vs);
            } else {
                y.push(vs);
            }
        }
        let mut stats = SolveStats {
            variables: n_vars,
            candidate_pairs: pair_ids.len(),
            ..Default::default()
        };
        if n_vars == 0 {
            return (None, stats);
        }
        let mut model = vars
            .maximise(objective)
            .using(highs)
            .set_time_limit(time_limit_s.max(0.001))
            .set_threads(1)
            // Presolve costs more than it saves on these small, loosely
            // coupled models (measured with `fmsim bench-solver`).
            .set_presolve(good_lp::solvers::highs::HighsPresolveType::Off)
            // The feasibility-jump heuristic looks for a first feasible
            // point, which this model has trivially (nothing scheduled);
            // it took ~45 % of a whole simulation's time (perf on FM-1-vit).
            .set_option("mip_heuristic_run_feasibility_jump", false);
        model.set_verbose(false);
        let mut constraints = 0;
        // One choice per job (Eq. 9–10).
        for e in per_job.into_values() {
            model = model.with(e.leq(1.0));
            constraints += 1;
        }
        // Capacity (Eq. 11, fixed).
        model = model.with(used.leq(f64::from(capacity)));
        constraints += 1;
        stats.constraints = constraints;
        let value_of = |s: &dyn Solution| terms.iter().map(|&(v, c)| c * s.value(v)).sum::<f64>();
        let Some(solution) = crate::policy::solve_usable(
            model,
            time_limit_s,
            |s| value_of(s),
            warm_value,
            &mut stats,
        ) else {
            return (None, stats);
        };
        stats.objective = value_of(&solution);
        let pick = |row: &Vec<(u32, Variable)>| {
            row.iter()
                .find(|(_, v)| solution.value(*v) > 0.5)
                .map_or(0, |&(a, _)| a)
        };
        (
            Some((x.iter().map(pick).collect(), y.iter().map(pick).collect())),
            stats,
        )
    }
}

/// Plan entries from GPUs per unit and per pair (0 = not in the plan).
pub(crate) fn entries(
    snap: &Snapshot,
    units: &[Unit],
    pairs: &[Pair],
    ug: &[u32],
    pg: &[u32],
) -> Vec<PlanEntry> {
    let mut entries = Vec::new();
    for (u, &a) in units.iter().zip(ug) {
        if a > 0 {
            entries.push(PlanEntry {
                jobs: u.jobs.clone(),
                mode: u.mode,
                gpus: a,
                placement: Vec::new(),
            });
        }
    }
    for (p, &a) in pairs.iter().zip(pg) {
        if a > 0 {
            let c = &snap.candidates[p.candidate];
            entries.push(PlanEntry {
                jobs: vec![c.a, c.b],
                mode: c.mode,
                gpus: a,
                placement: Vec::new(),
            });
        }
    }
    entries.sort_by_key(|e| e.jobs[0]);
    entries
}

/// Each part's GPUs: the cluster split in proportion to the parts' demand
/// at the fair share, `Σ_u min(largest allocation of u, ā·|u|)` (the
/// objective rates every job against its fair share, so that is what an
/// unpartitioned solve tends to give each part), by largest remainder.
pub(crate) fn split_capacity(r: u32, parts: &[Part], units: &[Unit], share: u32) -> Vec<u32> {
    let demand: Vec<f64> = parts
        .iter()
        .map(|p| {
            p.units
                .iter()
                .map(|&k| {
                    let u = &units[k];
                    let top = u.allowed.iter().copied().max().unwrap_or(0);
                    f64::from(top.min(share * u.jobs.len() as u32))
                })
                .sum()
        })
        .collect();
    let total: f64 = demand.iter().sum();
    if total <= 0.0 {
        return vec![0; parts.len()];
    }
    let exact: Vec<f64> = demand.iter().map(|d| f64::from(r) * d / total).collect();
    let mut caps: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    let mut left = r - caps.iter().sum::<u32>();
    for k in order {
        if left == 0 {
            break;
        }
        caps[k] += 1;
        left -= 1;
    }
    caps
}
