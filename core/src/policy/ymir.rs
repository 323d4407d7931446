//! Ymir's task merger (Ymir §5.1, Eq. 6–13) as a MILP solved by HiGHS
//! through `good_lp`, with the fixes listed in the seeds README.
//!
//! Phases:
//! 1. **units** — every job not in a kept merge is a unit; every kept merge
//!    (decided in an earlier round) is one unit whose size alone is
//!    re-optimised.
//! 2. **filter** — candidate pairs that cannot help are dropped *before* the
//!    model is built: different models, same task, a job with
//!    `sharing = false`, pipeline mixed with data-parallel, spatial pairs
//!    with progress, temporal pairs whose second job has progress (it would
//!    restart from the first's weights), and pairs whose `TranWt` is below 1
//!    at every allocation. At most [`YmirConfig::pairs_per_job`] best pairs
//!    are kept per job, which bounds the model on large clusters.
//! 3. **model** — binaries `x[u][a]` (unit `u` gets `a` GPUs) and `y[p][a]`
//!    (pair `p` is merged and gets `a` GPUs).
//!    - one choice per job: `Σ_a x[i][a] + Σ_{p ∋ i} Σ_a y[p][a] ≤ 1`
//!      (Eq. 9–10; choosing nothing is `a = 0`, the job waits);
//!    - capacity, **Eq. 11 fixed** (the printed sum is mis-indexed): the GPUs
//!      of solo units plus those of each merged pair, each pair counted
//!      once, `Σ a·x + Σ a·y ≤ R`.
//!    - objective, **Eq. 6/7 fixed**: as printed, Eq. 6 minimises
//!      `T_{i,ā}/T_{i,a}`, which rewards fewer GPUs and is 0 at `a = 0`. We
//!      *maximise* the speedups `T_{i,ā}/T_{i,a}` (0 for a waiting job, so an
//!      idle GPU always goes to a waiting job — `idle_gpu_goes_to_a_waiting_job`
//!      shows it), a merged pair counting as two jobs weighted by its
//!      `TranWt`: `2·TranWt(p, a)·T_{p,2ā}/T_{p,a}` (Eq. 7). A (re)start
//!      adds the job's restart time to `T_{i,a}` for every `a` other than
//!      what it holds, so moving running work must pay for itself (and a
//!      plan solved twice does not change). [`YmirConfig::srtf_weight`] adds
//!      `λ·τ/T_{i,a}` (τ = the median fair-share time), a shortest-remaining-
//!      time preference among jobs the fairness term rates equally, and
//!      [`YmirConfig::wait_weight`] `ω·W_i/T_{i,a}` (`W_i` the seconds job
//!      `i` has waited since it arrived): together the response ratio
//!      `(λτ + ωW_i)/T` of HRRN, so a job that has waited grows in rank.
//! 4. **solve** — HiGHS with a per-round time limit. If the limit is hit or
//!    the solver fails, the previous plan is repaired greedily
//!    ([`fallback`]) and `stats.fallback` says so.

use good_lp::solvers::highs::highs;
use good_lp::{
    Expression, ProblemVariables, Solution, SolutionStatus, SolverModel, Variable, variable,
};

use super::{MergeMode, Plan, PlanEntry, Policy, Snapshot, SolveStats, usable_allocations};

/// Knobs of the Ymir policy.
#[derive(Clone, Debug, PartialEq)]
pub struct YmirConfig {
    /// Seconds between rounds (Ymir: 120 s).
    pub interval_s: f64,
    /// Build and use merge candidates (false = "Ymir without merging").
    pub merging: bool,
    /// Solver time limit per round, seconds.
    pub time_limit_s: f64,
    /// Best candidate pairs kept per job.
    pub pairs_per_job: usize,
    /// Weight λ of the shortest-remaining-time term (0 = the paper's
    /// fairness objective alone).
    pub srtf_weight: f64,
    /// Weight ω of waiting: a job counts `(λ·τ + ω·waited) / remaining`,
    /// the response ratio of HRRN (Brinch Hansen 1971) with λτ as the
    /// base, so a long job that has waited about its own remaining time
    /// ranks with a fresh job of τ and no job waits behind ever-shorter
    /// arrivals. 0 (the default): no aging. Measured (docs/fmsim.md): with
    /// λ = 1 it lowers the worst finish-time fairness but not the p99 JCT,
    /// whose jobs are the longest ones, running near their own length; with
    /// λ = 0 (the paper's objective alone, which can leave a rigid 4-GPU
    /// job waiting forever behind 1-GPU jobs) it is what ends starvation.
    pub wait_weight: f64,
    /// Seconds within which resizing a running job must pay back its
    /// restart (0 = over its whole remaining time, the plain Eq. 5 time).
    /// A resize holds only until the next change of the plan, not to the
    /// job's end: judged over the remaining time, a long job's restart
    /// looks free and the job is shrunk and grown again at every arrival
    /// and completion, paying a checkpoint and a context switch each time.
    /// With `H`, a resized job's time is `T + restart·max(1, T/H)`.
    pub resize_horizon_s: f64,
    /// Weight κ of estimate uncertainty ([`super::SchedJob::spread`]): a
    /// merge's gain over running apart, `TranWt − 1`, counts only
    /// `max(0, 1 − κ·s/2)` of itself (s the wider spread of the pair: at
    /// κ = 1 about its pessimistic p10–p90 end), and the shortest-remaining-
    /// time term sees the pessimistic `T·(1 + κ·s/2)`; so between equal
    /// gains the surer merge wins, and a job is not put ahead as short on a
    /// wide guess. 0 = plan on the median estimate alone.
    pub risk_weight: f64,
}

impl Default for YmirConfig {
    fn default() -> Self {
        Self {
            interval_s: 120.0,
            merging: true,
            time_limit_s: 1.0,
            pairs_per_job: 4,
            srtf_weight: 1.0,
            wait_weight: 0.0,
            resize_horizon_s: 300.0,
            risk_weight: 1.0,
        }
    }
}

/// The Ymir policy.
#[derive(Clone, Debug, Default)]
pub struct Ymir {
    pub config: YmirConfig,
}

/// A unit of the model: a job alone or a kept merge.
struct Unit {
    jobs: Vec<usize>,
    mode: MergeMode,
    remaining_s: Vec<f64>,
    restart_s: f64,
    /// GPUs it holds now (0 = waiting).
    current: u32,
    allowed: Vec<u32>,
}

/// A filtered candidate pair, by index into `snap.candidates`.
struct Pair {
    candidate: usize,
    allowed: Vec<u32>,
}

/// The fair share `ā = ⌈R/N⌉` (Ymir §5.1), at least 1.
pub fn fair_share(total_gpus: u32, jobs: usize) -> u32 {
    if jobs == 0 {
        return total_gpus.max(1);
    }
    total_gpus.div_ceil(jobs as u32).max(1)
}

/// `T` at the reference allocation: the largest allocation of the set not
/// above `target` where the time is finite, else the smallest finite one.
fn reference_time(allocations: &[u32], times: &[f64], target: u32) -> f64 {
    let finite = || {
        allocations
            .iter()
            .zip(times)
            .filter(|&(&a, t)| a > 0 && t.is_finite())
    };
    finite()
        .rfind(|&(&a, _)| a <= target)
        .or_else(|| finite().next())
        .map_or(f64::INFINITY, |(_, &t)| t)
}

fn time_at(allocations: &[u32], times: &[f64], a: u32) -> f64 {
    allocations
        .iter()
        .position(|&x| x == a)
        .and_then(|k| times.get(k).copied())
        .unwrap_or(f64::INFINITY)
}

impl Ymir {
    pub fn new(config: YmirConfig) -> Self {
        Self { config }
    }

    fn units(&self, snap: &Snapshot) -> Vec<Unit> {
        let mut units = Vec::new();
        for (i, j) in snap.jobs.iter().enumerate() {
            if snap.merge_of(i).is_none() {
                units.push(Unit {
                    jobs: vec![i],
                    mode: MergeMode::Normal,
                    remaining_s: j.remaining_s.clone(),
                    restart_s: j.restart_s,
                    current: j.current_gpus,
                    allowed: usable_allocations(snap, i),
                });
            }
        }
        for m in &snap.merges {
            let (a, b) = (&snap.jobs[m.a], &snap.jobs[m.b]);
            let max = a.max_gpus.max(b.max_gpus);
            let allowed = snap
                .allocations
                .iter()
                .zip(&m.remaining_s)
                .filter(|&(&x, &t)| x > 0 && x <= max && t.is_finite())
                .map(|(&x, _)| x)
                .collect();
            units.push(Unit {
                jobs: vec![m.a, m.b],
                mode: m.mode,
                remaining_s: m.remaining_s.clone(),
                restart_s: a.restart_s.max(b.restart_s),
                current: a.current_gpus.max(b.current_gpus),
                allowed,
            });
        }
        units
    }

    /// Phase 2: the candidate pairs worth a variable.
    fn pairs(&self, snap: &Snapshot) -> Vec<Pair> {
        if !self.config.merging {
            return Vec::new();
        }
        let mut kept: Vec<(usize, f64)> = Vec::new();
        for (ci, c) in snap.candidates.iter().enumerate() {
            if c.a == c.b || c.a >= snap.jobs.len() || c.b >= snap.jobs.len() {
                continue;
            }
            let (a, b) = (&snap.jobs[c.a], &snap.jobs[c.b]);
            let ok = c.mode != MergeMode::Normal
                && a.model == b.model
                && a.task != b.task
                && a.sharing
                && b.sharing
                && a.pipeline == b.pipeline
                && snap.merge_of(c.a).is_none()
                && snap.merge_of(c.b).is_none()
                && b.progress == 0.0
                && (c.mode != MergeMode::Spatial || a.progress == 0.0);
            let best = c
                .tran_wt
                .iter()
                .zip(&snap.allocations)
                .filter(|&(_, &x)| x > 0)
                .map(|(&w, _)| w)
                .fold(0.0, f64::max);
            if ok && best >= 1.0 {
                kept.push((ci, best));
            }
        }
        // Bound the model: the best `pairs_per_job` pairs of each job.
        kept.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
        let mut per_job = vec![0usize; snap.jobs.len()];
        let mut out = Vec::new();
        for (ci, _) in kept {
            let c = &snap.candidates[ci];
            if per_job[c.a] >= self.config.pairs_per_job
                || per_job[c.b] >= self.config.pairs_per_job
            {
                continue;
            }
            let max = snap.jobs[c.a].max_gpus.max(snap.jobs[c.b].max_gpus);
            let allowed: Vec<u32> = snap
                .allocations
                .iter()
                .zip(&c.remaining_s)
                .zip(&c.tran_wt)
                .filter(|&((&x, &t), &w)| x > 0 && x <= max && t.is_finite() && w > 0.0)
                .map(|((&x, _), _)| x)
                .collect();
            if allowed.is_empty() {
                continue;
            }
            per_job[c.a] += 1;
            per_job[c.b] += 1;
            out.push(Pair {
                candidate: ci,
                allowed,
            });
        }
        out.sort_by_key(|p| p.candidate);
        out
    }
}

/// Seconds job `j` has spent waiting since it arrived (in the system and
/// not running).
fn waited(now: f64, j: &super::SchedJob) -> f64 {
    (now - j.submitted_at - j.executed_s).max(0.0)
}

/// Effective time of running at `a` when holding `current` now: a start
/// pays the restart once, a resize as often as it takes the remaining time
/// `t` to pass `horizon` ([`YmirConfig::resize_horizon_s`]; 0 = once).
fn effective(t: f64, a: u32, current: u32, restart: f64, horizon: f64) -> f64 {
    if a == current {
        t
    } else if current == 0 || horizon <= 0.0 {
        t + restart
    } else {
        t + restart * (t / horizon).max(1.0)
    }
}

impl Policy for Ymir {
    fn name(&self) -> &str {
        if self.config.merging {
            "ymir"
        } else {
            "ymir-no-merge"
        }
    }

    fn interval_s(&self) -> f64 {
        self.config.interval_s
    }

    fn merges(&self) -> bool {
        self.config.merging
    }

    fn allocate(&self, snap: &Snapshot) -> Plan {
        let units = self.units(snap);
        let pairs = self.pairs(snap);
        let r = snap.total_gpus();
        let n_jobs = snap.jobs.len();
        let share = fair_share(r, n_jobs);
        let allocs = &snap.allocations;
        // τ: the median fair-share time, scaling the SRTF term to the speedups.
        let mut refs: Vec<f64> = units
            .iter()
            .map(|u| reference_time(allocs, &u.remaining_s, share))
            .filter(|t| t.is_finite() && *t > 0.0)
            .collect();
        refs.sort_by(f64::total_cmp);
        let tau = refs.get(refs.len() / 2).copied().unwrap_or(1.0);
        let lambda = self.config.srtf_weight;
        // Estimate uncertainty (risk_weight κ): the wider spread of a
        // unit's or pair's jobs, and the pessimistic factor 1 + κ·s/2.
        let kappa = self.config.risk_weight;
        let spread = |jobs: &[usize]| {
            jobs.iter()
                .map(|&j| snap.jobs[j].spread)
                .fold(0.0f64, f64::max)
        };
        let pessimism = |jobs: &[usize]| 1.0 + kappa * spread(jobs) / 2.0;
        // λ·τ + ω·W_j of each job: what it counts over its time.
        let base: Vec<f64> = snap
            .jobs
            .iter()
            .map(|j| lambda * tau + self.config.wait_weight * waited(snap.now, j))
            .collect();

        // Phase 3: the model.
        let mut vars = ProblemVariables::new();
        let mut objective = Expression::from(0.0);
        let mut used = Expression::from(0.0);
        let mut per_job: Vec<Expression> = vec![Expression::from(0.0); n_jobs];
        let mut per_unit_expr: Vec<Expression> = Vec::with_capacity(units.len());
        let mut x: Vec<Vec<(u32, Variable)>> = Vec::with_capacity(units.len());
        let mut n_vars = 0;
        for u in &units {
            let weight = u.jobs.len() as f64;
            let t_ref = reference_time(allocs, &u.remaining_s, share * u.jobs.len() as u32);
            // The SRTF/aging term's numerator and the unit's pessimism.
            let aged: f64 = u.jobs.iter().map(|&j| base[j]).sum();
            let pess = pessimism(&u.jobs);
            let mut row = Vec::with_capacity(u.allowed.len());
            let mut expr = Expression::from(0.0);
            for &a in &u.allowed {
                let t = effective(
                    time_at(allocs, &u.remaining_s, a),
                    a,
                    u.current,
                    u.restart_s,
                    self.config.resize_horizon_s,
                );
                let value = weight * t_ref / t + aged / (t * pess);
                let v = vars.add(variable().binary());
                n_vars += 1;
                objective += value * v;
                used += f64::from(a) * v;
                expr += v;
                row.push((a, v));
            }
            for &j in &u.jobs {
                per_job[j] += expr.clone();
            }
            per_unit_expr.push(expr);
            x.push(row);
        }
        let mut y: Vec<Vec<(u32, Variable)>> = Vec::with_capacity(pairs.len());
        for p in &pairs {
            let c = &snap.candidates[p.candidate];
            let t_ref = reference_time(allocs, &c.remaining_s, 2 * share);
            let restart = snap.jobs[c.a].restart_s.max(snap.jobs[c.b].restart_s);
            // The share of the gain over running apart kept under the
            // pair's estimate spread (risk_weight), and its pessimism.
            let keep = (1.0 - kappa * spread(&[c.a, c.b]) / 2.0).max(0.0);
            let (aged, pess) = (base[c.a] + base[c.b], pessimism(&[c.a, c.b]));
            let mut row = Vec::with_capacity(p.allowed.len());
            for &a in &p.allowed {
                let t = time_at(allocs, &c.remaining_s, a) + restart;
                let w = 1.0 + (time_at(allocs, &c.tran_wt, a) - 1.0) * keep;
                // Eq. 7 (fixed): two jobs' speedup, weighted by TranWt.
                let value = 2.0 * w * t_ref / t + w * aged / (t * pess);
                let v = vars.add(variable().binary());
                n_vars += 1;
                objective += value * v;
                used += f64::from(a) * v;
                per_job[c.a] += v;
                per_job[c.b] += v;
                row.push((a, v));
            }
            y.push(row);
        }
        let mut stats = SolveStats {
            variables: n_vars,
            candidate_pairs: pairs.len(),
            ..Default::default()
        };
        if n_vars == 0 {
            return Plan {
                entries: Vec::new(),
                stats,
            };
        }
        let mut model = vars
            .maximise(objective)
            .using(highs)
            .set_time_limit(self.config.time_limit_s.max(0.001))
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
        for e in per_job.into_iter() {
            model = model.with(e.leq(1.0));
            constraints += 1;
        }
        // Capacity (Eq. 11, fixed).
        model = model.with(used.leq(f64::from(r)));
        constraints += 1;
        stats.constraints = constraints;
        drop(per_unit_expr);

        let solved = model.solve();
        let solution = match solved {
            Ok(s)
                if matches!(
                    s.status(),
                    SolutionStatus::Optimal | SolutionStatus::GapLimit
                ) =>
            {
                s
            }
            // Time limit without proof, infeasible (cannot happen: all-zero
            // is feasible) or a solver error: repair the previous plan.
            Ok(_) | Err(_) => {
                stats.fallback = true;
                let mut plan = fallback(snap, &units_view(&units));
                plan.stats = stats;
                return plan;
            }
        };
        let mut entries = Vec::new();
        for (u, row) in units.iter().zip(&x) {
            if let Some(&(a, _)) = row.iter().find(|(_, v)| solution.value(*v) > 0.5) {
                entries.push(PlanEntry {
                    jobs: u.jobs.clone(),
                    mode: u.mode,
                    gpus: a,
                    placement: Vec::new(),
                });
            }
        }
        for (p, row) in pairs.iter().zip(&y) {
            if let Some(&(a, _)) = row.iter().find(|(_, v)| solution.value(*v) > 0.5) {
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
        Plan { entries, stats }
    }
}

/// What the fallback needs of a unit.
pub struct UnitView {
    pub jobs: Vec<usize>,
    pub mode: MergeMode,
    pub remaining_s: Vec<f64>,
    pub current: u32,
    pub allowed: Vec<u32>,
}

fn units_view(units: &[Unit]) -> Vec<UnitView> {
    units
        .iter()
        .map(|u| UnitView {
            jobs: u.jobs.clone(),
            mode: u.mode,
            remaining_s: u.remaining_s.clone(),
            current: u.current,
            allowed: u.allowed.clone(),
        })
        .collect()
}

/// The previous plan repaired greedily: every unit keeps what it holds (if
/// that is still allowed and fits), then free GPUs go, one allocation step
/// at a time, to the unit whose remaining time falls the most per added
/// GPU (waiting units first get their smallest allocation).
pub fn fallback(snap: &Snapshot, units: &[UnitView]) -> Plan {
    let mut free = snap.total_gpus();
    let mut gpus: Vec<u32> = vec![0; units.len()];
    for (k, u) in units.iter().enumerate() {
        if u.current > 0 && u.allowed.contains(&u.current) && u.current <= free {
            gpus[k] = u.current;
            free -= u.current;
        }
    }
    loop {
        let mut best: Option<(f64, usize, u32)> = None;
        for (k, u) in units.iter().enumerate() {
            let Some(&next) = u.allowed.iter().find(|&&a| a > gpus[k]) else {
                continue;
            };
            let extra = next - gpus[k];
            if extra > free {
                continue;
            }
            let now = time_at(&snap.allocations, &u.remaining_s, gpus[k]);
            let then = time_at(&snap.allocations, &u.remaining_s, next);
            // Waiting units gain "everything": give them a GPU first.
            let gain = if gpus[k] == 0 {
                f64::MAX / 2.0 - then
            } else {
                (now - then) / f64::from(extra)
            };
            if best.is_none_or(|(g, bk, _)| gain > g || (gain == g && k < bk)) {
                best = Some((gain, k, next));
            }
        }
        match best {
            Some((gain, k, next)) if gain > 0.0 => {
                free -= next - gpus[k];
                gpus[k] = next;
            }
            _ => break,
        }
    }
    let entries = units
        .iter()
        .zip(&gpus)
        .filter(|&(_, &g)| g > 0)
        .map(|(u, &g)| PlanEntry {
            jobs: u.jobs.clone(),
            mode: u.mode,
            gpus: g,
            placement: Vec::new(),
        })
        .collect();
    Plan {
        entries,
        stats: SolveStats::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::{PairCandidate, SchedJob, ymir_allocations};
    use super::*;
    use proptest::prelude::*;

    fn ymir() -> Ymir {
        Ymir::new(YmirConfig {
            srtf_weight: 0.0,
            ..Default::default()
        })
    }

    /// A running job on 3 of 4 GPUs that would be 5 % faster on 4: judged
    /// over its whole remaining time the restart (30 s) is nothing and it
    /// is resized; with the resize horizon (300 s: a resize must win more
    /// than 1 + 30/300 = 10 %) it keeps its GPUs.
    #[test]
    fn tail_resize_must_pay_back_its_restart_within_the_horizon() {
        let mut j = job("long", 0.0, 3, &[]);
        j.current_gpus = 3;
        j.current_placement = vec![(0, 3)];
        let mut snap = cluster(1, 4, vec![j]);
        let t3 = 100.0 * 3600.0;
        snap.jobs[0].remaining_s = snap
            .allocations
            .iter()
            .map(|&a| match a {
                0 => f64::INFINITY,
                4 => t3 / 1.05,
                a => t3 * 3.0 / f64::from(a),
            })
            .collect();
        let gpus = |horizon: f64| {
            let y = Ymir::new(YmirConfig {
                resize_horizon_s: horizon,
                ..Default::default()
            });
            y.allocate(&snap).entries[0].gpus
        };
        assert_eq!(gpus(0.0), 4, "without the horizon a 5 % gain resizes");
        assert_eq!(gpus(300.0), 3, "a 5 % gain does not pay 10 %");
        assert_eq!(
            effective(1000.0, 4, 0, 30.0, 300.0),
            1030.0,
            "a start pays its restart once"
        );
        assert_eq!(effective(3000.0, 4, 2, 30.0, 300.0), 3300.0);
        assert_eq!(effective(100.0, 4, 2, 30.0, 300.0), 130.0);
    }

    /// One GPU, a long job that has waited 100,000 s and a fresh short one:
    /// pure shortest-remaining-time (ω = 0) starts the short one; with the
    /// waiting term (ω = 1) the long one has waited far more than its own
    /// length and goes first.
    #[test]
    fn tail_waiting_ages_a_long_job_ahead_of_fresh_short_ones() {
        let mut long = job("long", 5000.0, 1, &ymir_allocations(64));
        long.submitted_at = 0.0;
        let mut short = job("short", 1000.0, 1, &ymir_allocations(64));
        short.submitted_at = 100_000.0;
        let mut snap = cluster(1, 1, vec![long, short]);
        snap.now = 100_000.0;
        let first = |omega: f64| {
            let y = Ymir::new(YmirConfig {
                wait_weight: omega,
                ..Default::default()
            });
            let plan = y.allocate(&snap);
            assert_eq!(plan.entries.len(), 1, "{plan:?}");
            snap.jobs[plan.entries[0].jobs[0]].id.clone()
        };
        assert_eq!(first(0.0), "short");
        assert_eq!(first(1.0), "long");
    }

    /// The paper's objective alone (λ = 0) rates a rigid 4-GPU job at a
    /// quarter of four 1-GPU jobs, round after round: it never runs while
    /// 1-GPU jobs keep coming (found by `fmsim sweep`). Waiting (ω > 0)
    /// ends that.
    #[test]
    fn tail_waiting_ends_the_starvation_of_a_rigid_wide_job() {
        let all = ymir_allocations(64);
        let mut wide = job("wide", 4000.0, 4, &all);
        (wide.min_gpus, wide.max_gpus) = (4, 4);
        let mut jobs = vec![wide];
        for i in 0..4 {
            let mut j = job(&format!("narrow{i}"), 1000.0, 1, &all);
            (j.min_gpus, j.max_gpus, j.submitted_at) = (1, 1, 10_000.0);
            jobs.push(j);
        }
        let mut snap = cluster(1, 4, jobs);
        snap.now = 10_000.0;
        let runs_wide = |omega: f64| {
            let y = Ymir::new(YmirConfig {
                srtf_weight: 0.0,
                wait_weight: omega,
                ..Default::default()
            });
            let plan = y.allocate(&snap);
            plan.entries.iter().any(|e| e.jobs == [0] && e.gpus == 4)
        };
        assert!(!runs_wide(0.0), "λ = 0, ω = 0: the wide job waits");
        assert!(runs_wide(1.0), "ω = 1: it has waited 10,000 s and runs");
    }

    /// Seeds README: the objective must prefer giving an idle GPU to a
    /// waiting job. As printed (minimising T_ā/T_a, 0 at a = 0) it would
    /// leave every job waiting.
    #[test]
    fn idle_gpu_goes_to_a_waiting_job() {
        let snap = cluster(1, 4, jobs(3));
        let plan = ymir().allocate(&snap);
        assert_eq!(plan.entries.len(), 3, "{plan:?}");
        assert_eq!(
            plan.entries.iter().map(|e| e.gpus).sum::<u32>(),
            4,
            "no GPU idle"
        );
        // The printed form, for contrast: every a > 0 costs more than a = 0.
        let t = &snap.jobs[0].remaining_s;
        let printed = |a: usize| if a == 0 { 0.0 } else { t[1] / t[a] };
        assert!(
            printed(0) < printed(1),
            "minimising the printed Eq. 6 leaves the job waiting"
        );
    }

    #[test]
    fn capacity_counts_each_pair_once_and_a_good_merge_is_taken() {
        let mut snap = cluster(1, 2, jobs(2));
        // A ↦ B saves a third of the pair's time at every allocation.
        let allocs = snap.allocations.clone();
        let pair_time: Vec<f64> = allocs
            .iter()
            .map(|&a| {
                if a == 0 {
                    f64::INFINITY
                } else {
                    4000.0 / f64::from(a)
                }
            })
            .collect();
        let tran_wt = allocs
            .iter()
            .map(|&a| if a == 0 { 0.0 } else { 1.5 })
            .collect();
        snap.candidates.push(PairCandidate {
            a: 0,
            b: 1,
            mode: MergeMode::Temporal,
            remaining_s: pair_time,
            tran_wt,
        });
        let plan = ymir().allocate(&snap);
        assert_eq!(plan.entries.len(), 1, "{plan:?}");
        assert_eq!(plan.entries[0].jobs, vec![0, 1]);
        assert_eq!(
            plan.entries[0].gpus, 2,
            "the pair uses both GPUs, counted once"
        );
        let placed = ymir().schedule(&snap);
        placed.consistency_check(&snap).unwrap();
    }

    /// Two merges with equal gains on one GPU: the one whose estimates are
    /// surer is taken, whichever it is; without the risk weight the wide
    /// guess counts as much as the sure one.
    #[test]
    fn estimate_prior_the_surer_merge_wins_when_gains_are_equal() {
        let all = ymir_allocations(64);
        let four: Vec<SchedJob> = ["a0", "a1", "b0", "b1"]
            .iter()
            .map(|id| job(id, 3600.0, 1, &all))
            .collect();
        let mut snap = cluster(1, 1, four);
        let allocs = snap.allocations.clone();
        let row = |v: f64| -> Vec<f64> {
            allocs
                .iter()
                .map(|&a| if a == 0 { f64::INFINITY } else { v })
                .collect()
        };
        for (a, b) in [(0, 1), (2, 3)] {
            snap.candidates.push(PairCandidate {
                a,
                b,
                mode: MergeMode::Temporal,
                remaining_s: row(5000.0),
                tran_wt: row(1.5),
            });
        }
        let merged = |snap: &Snapshot, risk: f64| {
            let y = Ymir::new(YmirConfig {
                risk_weight: risk,
                ..Default::default()
            });
            let plan = y.allocate(snap);
            assert_eq!(plan.entries.len(), 1, "{plan:?}");
            plan.entries[0].jobs.clone()
        };
        snap.jobs[0].spread = 0.8;
        assert_eq!(merged(&snap, 1.0), [2, 3], "a0's estimate is a wide guess");
        snap.jobs[0].spread = 0.0;
        snap.jobs[3].spread = 0.8;
        assert_eq!(merged(&snap, 1.0), [0, 1], "now b1's is");
        // The gain's discount: 1 + (1.5 − 1)·(1 − 0.8/2) = 1.3.
        let w = 1.0 + (1.5 - 1.0) * (1.0 - 1.0 * 0.8 / 2.0f64).max(0.0);
        assert!((w - 1.3).abs() < 1e-12);
    }

    #[test]
    fn useless_or_forbidden_pairs_are_filtered_before_the_model() {
        let mut snap = cluster(1, 4, jobs(4));
        snap.jobs[2].sharing = false;
        snap.jobs[3].task = snap.jobs[0].task.clone();
        let n = snap.allocations.len();
        let cand = |a, b, w: f64| PairCandidate {
            a,
            b,
            mode: MergeMode::Spatial,
            remaining_s: vec![100.0; n],
            tran_wt: vec![w; n],
        };
        snap.candidates = vec![
            cand(0, 1, 0.9),
            cand(0, 2, 2.0),
            cand(0, 3, 2.0),
            cand(1, 0, 1.2),
        ];
        let pairs = Ymir::default().pairs(&snap);
        assert_eq!(
            pairs.len(),
            1,
            "TranWt < 1, sharing = false and same task are dropped"
        );
        assert_eq!(pairs[0].candidate, 3);
        snap.jobs[1].progress = 0.3;
        assert!(
            Ymir::default().pairs(&snap).is_empty(),
            "spatial pairs need zero progress"
        );
        let no_merge = Ymir::new(YmirConfig {
            merging: false,
            ..Default::default()
        });
        snap.jobs[1].progress = 0.0;
        assert!(no_merge.pairs(&snap).is_empty());
    }

    #[test]
    fn fallback_keeps_running_work_and_fills_free_gpus() {
        let mut snap = cluster(1, 4, jobs(3));
        snap.jobs[0].current_gpus = 2;
        let units = units_view(&Ymir::default().units(&snap));
        let plan = fallback(&snap, &units);
        let g = plan.gpus_by_job();
        assert_eq!(g.get(&0), Some(&2));
        assert_eq!(g.values().sum::<u32>(), 4);
        assert!(
            g.len() == 3,
            "waiting jobs get a GPU before anyone gets more: {g:?}"
        );
    }

    #[test]
    fn a_zero_time_limit_falls_back_and_says_so() {
        let snap = cluster(2, 4, jobs(12));
        let y = Ymir::new(YmirConfig {
            time_limit_s: 0.0,
            ..Default::default()
        });
        let plan = y.allocate(&snap);
        // HiGHS may still prove optimality in presolve; either way the plan is sound.
        let placed = super::super::placement::place(&snap, plan);
        placed.consistency_check(&snap).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Capacity is never exceeded, no job appears twice, and solving
        /// the plan's own outcome again changes nothing.
        #[test]
        fn plans_are_sound_and_stable(n in 1usize..14, nodes in 1usize..4, seed in 0u64..1000) {
            let mut snap = cluster(nodes, 4, jobs(n));
            let allocs = snap.allocations.clone();
            for (i, j) in snap.jobs.iter_mut().enumerate() {
                // Sub-linear scaling and mixed lengths.
                let w = 600.0 * (1 + (seed as usize + 7 * i) % 9) as f64;
                j.remaining_s = allocs.iter().map(|&a| if a == 0 { f64::INFINITY } else { w / f64::from(a).powf(0.8) }).collect();
            }
            let y = Ymir::default();
            let plan = y.schedule(&snap);
            prop_assert!(plan.consistency_check(&snap).is_ok(), "{:?}", plan.consistency_check(&snap));
            prop_assert!(!plan.stats.fallback);
            // Apply the plan and solve again.
            let mut next = snap.clone();
            for e in &plan.entries {
                for &j in &e.jobs {
                    next.jobs[j].current_gpus = e.gpus;
                    next.jobs[j].current_placement = e.placement.clone();
                }
            }
            let again = y.schedule(&next);
            prop_assert_eq!(plan.gpus_by_job(), again.gpus_by_job());
        }
    }
}
