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
//!    restart from the first's weights; the first may have trained), pairs
//!    whose `TranWt` is not above 1 at every allocation, and temporal pairs
//!    whose A has trained and whose B would finish later than alone on its
//!    fair share of the cluster (it waits for what A has left;
//!    [`b_fares_no_worse`]). At most
//!    [`YmirConfig::pairs_per_job`] best pairs are kept per job, which
//!    bounds the model on large clusters.
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
//!      time preference among jobs the fairness term rates equally (each
//!      job of a pair by when it finishes: A of a temporal pair by its own
//!      part, B and a spatial pair's jobs by the group's time), and
//!      [`YmirConfig::wait_weight`] `ω·W_i/T_{i,a}` (`W_i` the seconds job
//!      `i` has waited since it arrived): together the response ratio
//!      `(λτ + ωW_i)/T` of HRRN, so a job that has waited grows in rank.
//! 4. **solve** — HiGHS with a per-round time limit, warm-started from what
//!    the units hold. If the limit is hit or the solver fails, the previous
//!    plan is repaired greedily ([`fallback`]) and `stats.fallback` says so.
//!    A round of more than [`YmirConfig::milp_units`] units (1,000) is
//!    solved instead by the greedy of the model's LP relaxation
//!    ([`relaxation_greedy`], `stats.relaxed`): at 5,000 queued jobs HiGHS
//!    runs to its limit (0.5–2 s) and its time-limited incumbent is worth
//!    less than the greedy's plan, which takes 35–48 ms (`fmsim
//!    bench-solver`; docs/fmsim.md, "Datacenter-size rounds").
//!
//! **Partitions** (ICEFROG §V-E, at datacenter size; off by default since
//! the relaxation took over large rounds): a round with more
//! than [`YmirConfig::partition_units`] units is solved in parts — one per
//! foundation model (only jobs of one model can merge), a large model cut
//! further along its candidate pairs — each on a share of the GPUs in
//! proportion to its demand at the fair share, on up to four threads that
//! share the time limit; the GPUs a part leaves are then handed out
//! greedily across all units. A part that fails falls back alone.

use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, variable};

use super::{
    MergeMode, Plan, PlanEntry, Policy, Snapshot, SolveStats, placement, time_in,
    usable_allocations,
};

/// Knobs of the Ymir policy.
#[derive(Clone, Debug, PartialEq)]
pub struct YmirConfig {
    /// Seconds between rounds (Ymir: 120 s).
    pub interval_s: f64,
    /// Build and use merge candidates (false = "Ymir without merging").
    pub merging: bool,
    /// With merging: a job that has not trained may start from a finished
    /// job's output weights where that saves it time (temporal transfer
    /// from an A that is done, [`crate::round::WarmKey`]).
    pub warm_starts: bool,
    /// Placement's rule 6 ([`placement::place_shortest_first`]): a group
    /// that can run on some GPU families only and found them full takes
    /// the GPUs of one there with longer to run, the SRTF exchange.
    pub displace_longer: bool,
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
    /// wide guess; placement's rule 6 judges its exchange on the same
    /// adverse ends ([`placement::place_shortest_first`]). 0 = plan on the
    /// median estimate alone.
    pub risk_weight: f64,
    /// Rounds with more units than this are solved in parts (by model, then
    /// cut to this size), each on its share of the GPUs, what they leave
    /// handed out greedily (ICEFROG §V-E); 0 (the default) = always one
    /// solve. Measured at 5,000 jobs: parts cost up to 2 % of mean JCT
    /// against one solve, and the relaxation ([`Self::milp_units`]) is both
    /// faster and better, so parts are off unless asked for.
    pub partition_units: usize,
    /// A solve (a round, or a part of one) over more units than this is
    /// not given to HiGHS but to the greedy of its LP relaxation
    /// ([`relaxation_greedy`]): milliseconds where HiGHS runs to its time
    /// limit; `stats.relaxed` says so. 0 = always HiGHS.
    pub milp_units: usize,
}

impl Default for YmirConfig {
    fn default() -> Self {
        Self {
            interval_s: 120.0,
            merging: true,
            warm_starts: true,
            displace_longer: true,
            time_limit_s: 1.0,
            pairs_per_job: 4,
            srtf_weight: 1.0,
            wait_weight: 0.0,
            resize_horizon_s: 300.0,
            risk_weight: 1.0,
            partition_units: 0,
            milp_units: 1000,
        }
    }
}

/// The Ymir policy.
#[derive(Clone, Debug, Default)]
pub struct Ymir {
    pub config: YmirConfig,
}

/// A unit of the model: a job alone or a kept merge.
struct Unit<'s> {
    jobs: Vec<usize>,
    mode: MergeMode,
    /// The snapshot's times of its job or merge (not copied: a datacenter's
    /// allocation set has thousands of sizes).
    remaining_s: &'s [f64],
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
    let usable = |k: &usize| allocations[*k] > 0 && times.get(*k).is_some_and(|t| t.is_finite());
    let k = if allocations.is_sorted() {
        // Ascending (as every allocation set is): look near `target` only.
        let end = allocations.partition_point(|&a| a <= target);
        (0..end)
            .rev()
            .find(usable)
            .or_else(|| (end..allocations.len()).find(usable))
    } else {
        let mut finite = (0..allocations.len()).filter(usable);
        let first = finite.clone().next();
        finite.rfind(|&k| allocations[k] <= target).or(first)
    };
    k.and_then(|k| times.get(k).copied())
        .unwrap_or(f64::INFINITY)
}

/// How many of `allocations` (ascending, as allocation sets are) are at
/// most `max`: a job or pair can use only those, and a datacenter's set has
/// thousands of sizes. A set that is not ascending is read whole.
fn upto(allocations: &[u32], max: u32) -> usize {
    if allocations.is_sorted() {
        allocations.partition_point(|&a| a <= max)
    } else {
        allocations.len()
    }
}

impl Ymir {
    pub fn new(config: YmirConfig) -> Self {
        Self { config }
    }

    fn units<'s>(&self, snap: &'s Snapshot) -> Vec<Unit<'s>> {
        let mut units = Vec::new();
        for (i, j) in snap.jobs.iter().enumerate() {
            if snap.merge_of(i).is_none() {
                units.push(Unit {
                    jobs: vec![i],
                    mode: MergeMode::Normal,
                    remaining_s: &j.remaining_s,
                    restart_s: j.restart_s,
                    current: j.current_gpus,
                    allowed: usable_allocations(snap, i),
                });
            }
        }
        for m in &snap.merges {
            let (a, b) = (&snap.jobs[m.a], &snap.jobs[m.b]);
            let max = a.max_gpus.max(b.max_gpus);
            let allowed = snap.allocations[..upto(&snap.allocations, max)]
                .iter()
                .zip(&m.remaining_s)
                .filter(|&(&x, &t)| x > 0 && x <= max && t.is_finite())
                .map(|(&x, _)| x)
                .collect();
            units.push(Unit {
                jobs: vec![m.a, m.b],
                mode: m.mode,
                remaining_s: &m.remaining_s,
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
        let share = share_of_cluster(snap);
        for (ci, c) in snap.candidates.iter().enumerate() {
            if c.a == c.b || c.a >= snap.jobs.len() || c.b >= snap.jobs.len() {
                continue;
            }
            if c.mode == MergeMode::Temporal && a_trained(snap, c) {
                let b = &snap.jobs[c.b];
                if !b_fares_no_worse(snap, &b.remaining_s, b.restart_s, &c.remaining_s, share) {
                    continue;
                }
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
            if ok && super::merge_gains(best) {
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
            let allowed: Vec<u32> = snap.allocations[..upto(&snap.allocations, max)]
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

/// A job's fair share of the cluster, `R/N` GPUs (may be under one). Not
/// Eq. 7's `ā = ⌈R/N⌉ ≥ 1`: on a busy cluster that is a whole GPU the job
/// would not get, and [`b_fares_no_worse`] would refuse every pair there.
pub fn share_of_cluster(snap: &Snapshot) -> f64 {
    f64::from(snap.total_gpus()) / snap.jobs.len().max(1) as f64
}

/// Whether B of a temporal pair whose A has trained (see [`a_trained`])
/// finishes in the pair, at the pair's best allocation (`group`: the
/// pair's times), no later than alone on `share` GPUs, its fair share of
/// the cluster ([`share_of_cluster`]; `alone`: B's times alone; its start
/// `restart_s` paid either way; a share under one GPU is one GPU for that
/// share of the time): a
/// finish-time fairness (Themis's ρ) of at most 1 for the job that waits.
/// Eq. 7 values a pair by the group's speedup, which does not see B
/// waiting behind A; behind an A with a long way to go (one that has
/// trained for hours, or a large task) B would wait far longer than its
/// fair share would make it, and on a busy cluster the pair still
/// outscores B waiting for GPUs. Ymir's filter asks it of a new pair; the
/// round asks it again of a kept one ([`crate::round::RoundOutcome::released`]).
pub fn b_fares_no_worse(
    snap: &Snapshot,
    alone: &[f64],
    restart_s: f64,
    group: &[f64],
    share: f64,
) -> bool {
    let alone = if share >= 1.0 {
        reference_time(&snap.allocations, alone, share.floor() as u32)
    } else {
        reference_time(&snap.allocations, alone, 1) / share.max(f64::MIN_POSITIVE)
    } + restart_s;
    let merged = group
        .iter()
        .zip(&snap.allocations)
        .filter(|&(t, &x)| x > 0 && t.is_finite())
        .map(|(&t, _)| t)
        .fold(f64::INFINITY, f64::min);
    merged <= alone
}

/// Whether A of the candidate `c` has trained (running or suspended) —
/// decided after it started alone, the pair puts B behind however much A
/// has left, possibly hours, so [`b_fares_no_worse`] bounds B's
/// wait. A pair of two waiting jobs is decided as Ymir decides it: both
/// wait for GPUs alike, and on a node the two would share B's fair-share
/// time is no measure of what B gets (two jobs of one 4-GPU node: the plan
/// runs A on all four and B after it, merged or not).
fn a_trained(snap: &Snapshot, c: &super::PairCandidate) -> bool {
    snap.jobs[c.a].progress > 0.0
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

impl Ymir {
    /// The SRTF/aging term `Σ_j base_j / T_j` of a unit or pair (its mode
    /// and jobs) run at `a` GPUs (holding `current` now; 0 for a new pair,
    /// which starts anew) whose group takes `t`: each job ranks by when
    /// *it* finishes. A spatial pair's jobs (and a job alone) finish
    /// with the group; A of a temporal pair finishes after its own part (B
    /// then trains from its weights), so A ranks by its own remaining time,
    /// not by A's and B's together. Ranked by the group's time, an A close
    /// to its end that took on a long B would look long, and be suspended
    /// with B waiting behind it.
    fn ranked(
        &self,
        snap: &Snapshot,
        w: &Weights,
        (mode, jobs): (MergeMode, &[usize]),
        (a, current): (u32, u32),
        t: f64,
    ) -> f64 {
        match (mode, jobs) {
            (MergeMode::Temporal, &[first, second]) => {
                let ja = &snap.jobs[first];
                let restart = ja.restart_s.max(snap.jobs[second].restart_s);
                let own = time_in(&snap.allocations, &ja.remaining_s, a);
                let ta = if own > 0.0 {
                    effective(own, a, current, restart, self.config.resize_horizon_s).min(t)
                } else {
                    t
                };
                w.base[first] / ta + w.base[second] / t
            }
            _ => jobs.iter().map(|&j| w.base[j]).sum::<f64>() / t,
        }
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

    fn warm_starts(&self) -> bool {
        self.config.merging && self.config.warm_starts
    }

    fn schedule(&self, snap: &Snapshot) -> Plan {
        let plan = self.allocate(snap);
        if self.config.displace_longer {
            placement::place_shortest_first(snap, plan, self.config.risk_weight)
        } else {
            placement::place(snap, plan)
        }
    }

    fn allocate(&self, snap: &Snapshot) -> Plan {
        let units = self.units(snap);
        let pairs = self.pairs(snap);
        let r = snap.total_gpus();
        let share = fair_share(r, snap.jobs.len());
        let allocs = &snap.allocations;
        // τ: the median fair-share time, scaling the SRTF term to the speedups.
        let mut refs: Vec<f64> = units
            .iter()
            .map(|u| reference_time(allocs, u.remaining_s, share))
            .filter(|t| t.is_finite() && *t > 0.0)
            .collect();
        refs.sort_by(f64::total_cmp);
        let tau = refs.get(refs.len() / 2).copied().unwrap_or(1.0);
        // λ·τ + ω·W_j of each job: what it counts over its time.
        let base: Vec<f64> = snap
            .jobs
            .iter()
            .map(|j| self.config.srtf_weight * tau + self.config.wait_weight * j.waited(snap.now))
            .collect();
        let w = Weights { share, base };
        let parts = self.partitions(snap, &units, &pairs);
        if parts.len() <= 1 {
            let all_units: Vec<usize> = (0..units.len()).collect();
            let all_pairs: Vec<usize> = (0..pairs.len()).collect();
            let (solved, mut stats) = self.solve(
                snap,
                &w,
                (&units, &all_units),
                (&pairs, &all_pairs),
                r,
                self.config.time_limit_s,
            );
            return match solved {
                Some((ug, pg)) => Plan {
                    entries: entries(snap, &units, &pairs, &ug, &pg),
                    stats,
                },
                None if stats.variables == 0 => Plan {
                    entries: Vec::new(),
                    stats,
                },
                None => {
                    stats.fallback = true;
                    let mut plan = fallback(snap, &units_view(&units));
                    plan.stats = stats;
                    plan
                }
            };
        }
        // Partitioned: each part solved alone on its share of the GPUs,
        // then what the parts left is handed out greedily across them.
        let caps = split_capacity(r, &parts, &units, share);
        // The parts are solved on up to `threads` threads (each HiGHS
        // model on one) within the round's time limit: each part gets an
        // even share of the limit's thread-seconds (a fixed budget, so no
        // clock is read here beyond HiGHS' own limit).
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4)
            .min(parts.len());
        let limit = self.config.time_limit_s / parts.len().div_ceil(threads) as f64;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let solved_parts: Vec<(usize, Solved)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(part) = parts.get(k) else { break };
                            out.push((
                                k,
                                self.solve(
                                    snap,
                                    &w,
                                    (&units, &part.units),
                                    (&pairs, &part.pairs),
                                    caps[k],
                                    limit,
                                ),
                            ));
                        }
                        out
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|h| h.join().expect("a part's solve does not panic"))
                .collect()
        });
        let mut by_part: Vec<Option<Solved>> = (0..parts.len()).map(|_| None).collect();
        for (k, r) in solved_parts {
            by_part[k] = Some(r);
        }
        let mut ug = vec![0u32; units.len()];
        let mut pg = vec![0u32; pairs.len()];
        let mut stats = SolveStats {
            partitions: parts.len(),
            ..Default::default()
        };
        let views = units_view(&units);
        for ((part, &cap), r) in parts.iter().zip(&caps).zip(by_part) {
            let (solved, s) = r.expect("every part is solved");
            stats.variables += s.variables;
            stats.constraints += s.constraints;
            stats.candidate_pairs += s.candidate_pairs;
            stats.objective += s.objective;
            stats.relaxed |= s.relaxed;
            stats.abandoned |= s.abandoned;
            match solved {
                Some((u, p)) => {
                    for (&k, g) in part.units.iter().zip(u) {
                        ug[k] = g;
                    }
                    for (&k, g) in part.pairs.iter().zip(p) {
                        pg[k] = g;
                    }
                }
                None if s.variables == 0 => {}
                None => {
                    stats.fallback = true;
                    let sub: Vec<&UnitView> = part.units.iter().map(|&k| &views[k]).collect();
                    let mut gpus = vec![0u32; sub.len()];
                    let mut free = cap;
                    keep_current(&sub, &mut gpus, &mut free);
                    grow(snap, &sub, &mut gpus, &mut free);
                    for (&k, g) in part.units.iter().zip(gpus) {
                        ug[k] = g;
                    }
                }
            }
        }
        // GPUs a part could not use go to any unit that gains from them
        // (not to jobs a merged pair already holds).
        let used: u32 = ug.iter().sum::<u32>() + pg.iter().sum::<u32>();
        let mut free = r.saturating_sub(used);
        let mut in_pair = vec![false; snap.jobs.len()];
        for (p, &g) in pairs.iter().zip(&pg) {
            if g > 0 {
                let c = &snap.candidates[p.candidate];
                in_pair[c.a] = true;
                in_pair[c.b] = true;
            }
        }
        let open: Vec<usize> = (0..units.len())
            .filter(|&k| !units[k].jobs.iter().any(|&j| in_pair[j]))
            .collect();
        let sub: Vec<&UnitView> = open.iter().map(|&k| &views[k]).collect();
        let mut gpus: Vec<u32> = open.iter().map(|&k| ug[k]).collect();
        grow(snap, &sub, &mut gpus, &mut free);
        for (&k, g) in open.iter().zip(gpus) {
            ug[k] = g;
        }
        Plan {
            entries: entries(snap, &units, &pairs, &ug, &pg),
            stats,
        }
    }
}

/// What [`Ymir::solve`] returns: GPUs per listed unit and pair, or None,
/// and the model's size.
type Solved = (Option<(Vec<u32>, Vec<u32>)>, SolveStats);

/// The objective's inputs shared by every part of a round.
struct Weights {
    /// The fair share `ā`.
    share: u32,
    /// `λ·τ + ω·W_j` per job.
    base: Vec<f64>,
}

/// One part of a partitioned round: units and pairs by index.
struct Part {
    units: Vec<usize>,
    pairs: Vec<usize>,
}

impl Ymir {
    /// Phase 2b, on large rounds: parts that are solved apart. Only jobs of
    /// one foundation model can merge, so each model is a part; a model
    /// with more than [`YmirConfig::partition_units`] units is cut further,
    /// keeping jobs a candidate pair links together where it can (its
    /// components packed first-fit; a component too big is cut in order,
    /// and a pair across a cut is dropped). One part: no partitioning.
    fn partitions(&self, snap: &Snapshot, units: &[Unit], pairs: &[Pair]) -> Vec<Part> {
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

    /// Phases 3–4 over the listed units and pairs on `capacity` GPUs: GPUs
    /// per listed unit and per listed pair (0 = none), or None when the
    /// model is empty or the solver gave no proven solution (the caller
    /// falls back).
    fn solve(
        &self,
        snap: &Snapshot,
        w: &Weights,
        (units, unit_ids): (&[Unit], &[usize]),
        (pairs, pair_ids): (&[Pair], &[usize]),
        capacity: u32,
        time_limit_s: f64,
    ) -> Solved {
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
        let Some(solution) =
            super::solve_usable(model, time_limit_s, |s| value_of(s), warm_value, &mut stats)
        else {
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

/// The greedy of the multiple-choice knapsack's LP relaxation (Sinha &
/// Zoltners 1979), for rounds too large to solve exactly in time. Each
/// row (a unit or a candidate pair) offers `(GPUs, value)` choices and runs
/// its `members`' jobs; at most one choice per row, rows sharing a job
/// exclusive (Eq. 9–10), GPUs within `capacity` (Eq. 11).
///
/// Each row's choices are reduced to the upper concave hull of its
/// `(GPUs, value)` points from `(0, 0)`; the hull's steps, taken in order
/// of value per GPU across all rows, solve the LP relaxation of the
/// single-capacity problem, whose optimum has at most one fractional row.
/// Here a step that does not fit closes its row, a row's first step needs
/// every member job free (so a pair and its jobs exclude each other,
/// whichever gains more per GPU first), and the GPUs left after the pass
/// go to the best-value-per-GPU step that still fits (a choice off the
/// hull included). Returns the GPUs per row and the objective.
fn relaxation_greedy(
    rows: &[Vec<(u32, f64)>],
    members: &[Vec<usize>],
    capacity: u32,
) -> (Vec<u32>, f64) {
    // Hull steps: (row, from GPUs, to GPUs, value gained).
    let mut steps: Vec<(usize, u32, u32, f64)> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let mut points: Vec<(u32, f64)> = row
            .iter()
            .copied()
            .filter(|&(a, v)| a > 0 && v.is_finite() && v > 0.0)
            .collect();
        points.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.total_cmp(&x.1)));
        points.dedup_by_key(|p| p.0);
        let mut hull: Vec<(u32, f64)> = vec![(0, 0.0)];
        for p in points {
            if p.1 <= hull.last().map_or(0.0, |h| h.1) {
                continue; // more GPUs for no more value
            }
            // Pop while the last point lies on or below the chord to p.
            while hull.len() >= 2 {
                let (b, a) = (hull[hull.len() - 1], hull[hull.len() - 2]);
                let slope_ab = (b.1 - a.1) / f64::from(b.0 - a.0);
                let slope_ap = (p.1 - a.1) / f64::from(p.0 - a.0);
                if slope_ap >= slope_ab {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(p);
        }
        for h in hull.windows(2) {
            steps.push((r, h[0].0, h[1].0, h[1].1 - h[0].1));
        }
    }
    let per_gpu = |s: &(usize, u32, u32, f64)| s.3 / f64::from(s.2 - s.1);
    steps.sort_by(|x, y| {
        per_gpu(y)
            .total_cmp(&per_gpu(x))
            .then(x.0.cmp(&y.0))
            .then(x.1.cmp(&y.1))
    });
    let jobs = members.iter().flatten().copied().max().map_or(0, |m| m + 1);
    let mut busy = vec![false; jobs];
    let mut level = vec![0u32; rows.len()];
    let mut closed = vec![false; rows.len()];
    let mut free = capacity;
    let take = |r: usize, to: u32, level: &mut [u32], free: &mut u32, busy: &mut [bool]| {
        if level[r] == 0 {
            for &j in &members[r] {
                busy[j] = true;
            }
        }
        *free -= to - level[r];
        level[r] = to;
    };
    for &(r, from, to, _) in &steps {
        if closed[r] || level[r] != from {
            continue;
        }
        if from == 0 && members[r].iter().any(|&j| busy[j]) {
            closed[r] = true;
            continue;
        }
        if to - from > free {
            closed[r] = true;
            continue;
        }
        take(r, to, &mut level, &mut free, &mut busy);
    }
    // The GPUs left: rows take the choice that fits with the most value
    // per GPU over what they hold, best first, each once.
    let value_at = |r: usize, a: u32| {
        rows[r]
            .iter()
            .find(|x| x.0 == a)
            .map_or(0.0, |x| x.1.max(0.0))
    };
    let fill = |level: &mut [u32], free: &mut u32, busy: &mut [bool]| {
        if *free == 0 {
            return;
        }
        let mut fills: Vec<(f64, usize, u32)> = Vec::new();
        for (r, row) in rows.iter().enumerate() {
            let have = value_at(r, level[r]);
            let best = row
                .iter()
                .filter(|&&(a, v)| a > level[r] && a - level[r] <= *free && v > have)
                .map(|&(a, v)| ((v - have) / f64::from(a - level[r]), a))
                .max_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)));
            if let Some((g, a)) = best {
                fills.push((g, r, a));
            }
        }
        fills.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        for (_, r, a) in fills {
            if a - level[r] > *free || (level[r] == 0 && members[r].iter().any(|&j| busy[j])) {
                continue;
            }
            take(r, a, level, free, busy);
        }
    };
    fill(&mut level, &mut free, &mut busy);
    // A pair shut out by its jobs, which went alone first (more value per
    // GPU each), replaces them where it is worth more than they are
    // together — on their GPUs and those left — then the GPUs freed are
    // handed out again.
    let mut holder: Vec<Option<usize>> = vec![None; jobs];
    for (r, m) in members.iter().enumerate() {
        if level[r] > 0 {
            for &j in m {
                holder[j] = Some(r);
            }
        }
    }
    let mut swapped = false;
    for r in 0..rows.len() {
        if members[r].len() < 2 || level[r] > 0 {
            continue;
        }
        // The rows holding its jobs now: each must hold only them.
        let mut held: Vec<usize> = members[r].iter().filter_map(|&j| holder[j]).collect();
        held.sort_unstable();
        held.dedup();
        if held
            .iter()
            .any(|&h| members[h].iter().any(|j| !members[r].contains(j)))
        {
            continue;
        }
        let gpus: u32 = held.iter().map(|&h| level[h]).sum();
        let worth: f64 = held.iter().map(|&h| value_at(h, level[h])).sum();
        let best = rows[r]
            .iter()
            .filter(|&&(a, v)| a <= free + gpus && v > worth)
            .max_by(|x, y| x.1.total_cmp(&y.1).then(y.0.cmp(&x.0)));
        if let Some(&(a, _)) = best {
            for &h in &held {
                free += level[h];
                level[h] = 0;
            }
            free -= a;
            level[r] = a;
            for &j in &members[r] {
                holder[j] = Some(r);
                busy[j] = true;
            }
            swapped = true;
        }
    }
    if swapped {
        fill(&mut level, &mut free, &mut busy);
    }
    let objective = (0..rows.len()).map(|r| value_at(r, level[r])).sum();
    (level, objective)
}

/// Plan entries from GPUs per unit and per pair (0 = not in the plan).
fn entries(
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
fn split_capacity(r: u32, parts: &[Part], units: &[Unit], share: u32) -> Vec<u32> {
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
            remaining_s: u.remaining_s.to_vec(),
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
    let units: Vec<&UnitView> = units.iter().collect();
    let mut free = snap.total_gpus();
    let mut gpus: Vec<u32> = vec![0; units.len()];
    keep_current(&units, &mut gpus, &mut free);
    grow(snap, &units, &mut gpus, &mut free);
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

/// Every unit keeps what it holds, if that is still allowed and fits.
fn keep_current(units: &[&UnitView], gpus: &mut [u32], free: &mut u32) {
    for (k, u) in units.iter().enumerate() {
        if u.current > 0 && u.allowed.contains(&u.current) && u.current <= *free {
            gpus[k] = u.current;
            *free -= u.current;
        }
    }
}

/// Free GPUs go, one allocation step at a time, to the unit whose
/// remaining time falls the most per added GPU (waiting units first get
/// their smallest allocation).
fn grow(snap: &Snapshot, units: &[&UnitView], gpus: &mut [u32], free: &mut u32) {
    loop {
        let mut best: Option<(f64, usize, u32)> = None;
        for (k, u) in units.iter().enumerate() {
            let Some(&next) = u.allowed.iter().find(|&&a| a > gpus[k]) else {
                continue;
            };
            let extra = next - gpus[k];
            if extra > *free {
                continue;
            }
            let now = time_in(&snap.allocations, &u.remaining_s, gpus[k]);
            let then = time_in(&snap.allocations, &u.remaining_s, next);
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
                *free -= next - gpus[k];
                gpus[k] = next;
            }
            _ => break,
        }
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

    /// 40 jobs of two models on 4 × 8 GPUs, one good temporal pair per
    /// model: cut into parts of at most 8 units, the round is solved in
    /// parts (at least one per model), keeps both pairs (each pair's jobs
    /// stay in one part), uses every GPU the unpartitioned solve uses, and
    /// its plan is consistent.
    #[test]
    fn partitioned_solve_keeps_pairs_within_parts_and_uses_the_gpus() {
        let mut jobs = jobs(40);
        for (i, j) in jobs.iter_mut().enumerate() {
            j.model = if i % 2 == 0 {
                "roberta-base"
            } else {
                "vit-base"
            }
            .into();
        }
        let mut snap = cluster(4, 8, jobs);
        let allocs = snap.allocations.clone();
        for (a, b) in [(0, 2), (1, 3)] {
            snap.candidates.push(PairCandidate {
                a,
                b,
                mode: MergeMode::Temporal,
                remaining_s: linear_times(&allocs, 4000.0),
                tran_wt: allocs
                    .iter()
                    .map(|&x| if x == 0 { 0.0 } else { 3.0 })
                    .collect(),
            });
        }
        let solve = |parts: usize, snap: &Snapshot| {
            Ymir::new(YmirConfig {
                partition_units: parts,
                ..Default::default()
            })
            .schedule(snap)
        };
        let whole = solve(0, &snap);
        let cut = solve(8, &snap);
        assert_eq!(whole.stats.partitions, 0);
        assert!(cut.stats.partitions >= 5, "{:?}", cut.stats);
        cut.consistency_check(&snap).unwrap();
        for pair in [vec![0, 2], vec![1, 3]] {
            assert!(
                cut.entries.iter().any(|e| e.jobs == pair),
                "{pair:?}: {cut:?}"
            );
        }
        let used = |p: &Plan| p.entries.iter().map(|e| e.gpus).sum::<u32>();
        assert_eq!(used(&cut), used(&whole));
        assert_eq!(used(&cut), 32);
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

    /// Two GPUs, four one-GPU jobs that scale sub-linearly (1,000 s on one
    /// GPU, 600 s on two), and a temporal pair A → B whose `TranWt` is
    /// exactly 1: B needs as many epochs from A's weights as alone, so the
    /// pair takes as long as A and then B (plus B's restart). Eq. 7 counts
    /// a merged pair as two jobs at twice the fair share, which on a busy
    /// cluster rates the pair on one GPU (2·1,230/2,030 = 1.21) above a job
    /// alone (1.0): the old `TranWt ≥ 1` filter let the solver merge, and
    /// B waited for all of A for no gain. A pair must gain to be a
    /// candidate; one that gains (B needs half its epochs) still merges.
    #[test]
    fn tail_no_gain_merges_are_not_candidates() {
        let alone = |a: u32| match a {
            0 => f64::INFINITY,
            1 => 1000.0,
            _ => 600.0,
        };
        let mut snap = cluster(
            1,
            2,
            ["a", "b", "c", "d"]
                .iter()
                .map(|id| job(id, 1000.0, 1, &ymir_allocations(64)))
                .collect(),
        );
        for j in &mut snap.jobs {
            j.remaining_s = snap.allocations.iter().map(|&a| alone(a)).collect();
        }
        let pair = |b_time: f64| {
            let remaining_s: Vec<f64> = snap
                .allocations
                .iter()
                .map(|&a| alone(a) + b_time * alone(a) / 1000.0 + 30.0)
                .collect();
            let tran_wt = snap
                .allocations
                .iter()
                .map(|&a| {
                    // Ymir Eq. 12 with T_A = T_B = t.
                    let (t, tab) = (alone(a), b_time * alone(a) / 1000.0);
                    (2.0 * t + t) / (2.0 * t + tab)
                })
                .collect();
            temporal_0_to_1(remaining_s, tran_wt)
        };
        let merged = |snap: &Snapshot| {
            Ymir::default()
                .allocate(snap)
                .entries
                .iter()
                .any(|e| e.jobs.len() == 2)
        };
        snap.candidates = vec![pair(1000.0)];
        assert!(snap.candidates[0].tran_wt[1..].iter().all(|&w| w == 1.0));
        assert!(
            Ymir::default().pairs(&snap).is_empty(),
            "no gain, no candidate"
        );
        assert!(!merged(&snap), "B is not made to wait for A for nothing");
        snap.candidates = vec![pair(500.0)];
        assert_eq!(Ymir::default().pairs(&snap).len(), 1);
        assert!(merged(&snap), "a pair that gains still merges");
    }

    /// The temporal candidate job 0 ↦ job 1 with these times and weights.
    fn temporal_0_to_1(remaining_s: Vec<f64>, tran_wt: Vec<f64>) -> PairCandidate {
        PairCandidate {
            a: 0,
            b: 1,
            mode: MergeMode::Temporal,
            remaining_s,
            tran_wt,
        }
    }

    /// Two GPUs, three jobs: A has trained and has 10,000 GPU-seconds
    /// left, C as long, B 1,000. B behind A would finish after A's 5,000 s
    /// or more; alone on its fair share (2/3 of a GPU) it takes 1,500 s.
    /// Eq. 7 sees the pair's speedup, not B waiting, so the pair is no
    /// candidate: B's finish-time fairness in it would be above 1. Once A
    /// is nearly done (200 GPU-seconds left), B behind it finishes sooner
    /// than alone at its share, and the pair is a candidate again.
    #[test]
    fn tail_b_never_waits_behind_a_past_its_fair_share() {
        let all = ymir_allocations(64);
        let mut snap = cluster(
            1,
            2,
            vec![
                job("a", 10_000.0, 1, &all),
                job("b", 1_000.0, 1, &all),
                job("c", 10_000.0, 1, &all),
            ],
        );
        snap.jobs[0].current_gpus = 1;
        snap.jobs[0].progress = 0.5;
        let pair = |snap: &Snapshot| {
            let (ta, tb) = (&snap.jobs[0].remaining_s, &snap.jobs[1].remaining_s);
            // B from A's weights needs half its work; Eq. 12's TranWt.
            let remaining_s = ta.iter().zip(tb).map(|(a, b)| a + b / 2.0 + 30.0).collect();
            let tran_wt = ta
                .iter()
                .zip(tb)
                .map(|(a, b)| {
                    if a.is_finite() {
                        (a + b) / (a + b / 2.0)
                    } else {
                        0.0
                    }
                })
                .collect();
            temporal_0_to_1(remaining_s, tran_wt)
        };
        snap.candidates = vec![pair(&snap)];
        assert!(snap.candidates[0].tran_wt[1] > 1.0, "the pair gains");
        assert!(
            Ymir::default().pairs(&snap).is_empty(),
            "B would wait behind A past its fair share"
        );
        let plan = Ymir::default().allocate(&snap);
        assert!(
            plan.entries.iter().all(|e| e.jobs.len() == 1),
            "no merge: {plan:?}"
        );
        let near_end = job("a", 200.0, 1, &all);
        snap.jobs[0].remaining_s = cluster(1, 2, vec![near_end]).jobs[0].remaining_s.clone();
        snap.candidates = vec![pair(&snap)];
        assert_eq!(Ymir::default().pairs(&snap).len(), 1, "A nearly done");
    }

    /// The SRTF term of a temporal pair ranks A by its own remaining time
    /// (B trains after it) and B by the group's; a spatial pair's jobs both
    /// finish with the group. Ranked by the group's time, an A close to its
    /// end that took on a long B would look as long as the two together.
    #[test]
    fn tail_a_of_a_temporal_pair_ranks_by_its_own_time() {
        let all = ymir_allocations(64);
        let snap = cluster(
            1,
            2,
            vec![job("a", 100.0, 1, &all), job("b", 1_000.0, 1, &all)],
        );
        let w = Weights {
            share: 1,
            base: vec![1.0, 1.0],
        };
        let y = Ymir::default();
        let group = 100.0 + 1_000.0 + 30.0;
        let restart = snap.jobs[0].restart_s.max(snap.jobs[1].restart_s);
        let temporal = y.ranked(&snap, &w, (MergeMode::Temporal, &[0, 1]), (1, 0), group);
        let expected = 1.0 / (100.0 + restart) + 1.0 / group;
        assert!(
            (temporal - expected).abs() < 1e-12,
            "{temporal} vs {expected}"
        );
        let spatial = y.ranked(&snap, &w, (MergeMode::Spatial, &[0, 1]), (1, 0), group);
        assert!((spatial - 2.0 / group).abs() < 1e-12);
        assert!(temporal > 4.0 * spatial, "A counts as the short job it is");
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

    /// The relaxation's greedy by hand: a row's hull skips a choice worth
    /// less per GPU than a larger one, a pair and its jobs exclude each
    /// other (the pair gains more per GPU, so it wins), a step that no
    /// longer fits closes its row, and the GPUs left go to the best choice
    /// that fits, off the hull too.
    #[test]
    fn the_relaxation_greedy_by_hand() {
        let rows = vec![
            // Job 0 alone: 2 GPUs are worth less per GPU than 4.
            vec![(1, 1.0), (2, 1.2), (4, 4.0)],
            // Job 1 alone.
            vec![(1, 0.9), (2, 1.5)],
            // Job 2 alone.
            vec![(1, 0.5)],
            // The pair (1, 2): 2 GPUs for 3.0.
            vec![(2, 3.0)],
        ];
        let members = vec![vec![0], vec![1], vec![2], vec![1, 2]];
        // 7 GPUs: job 0 takes 4 (1.0/GPU), the pair 2 (1.5/GPU) first,
        // so jobs 1 and 2 stay out; 1 GPU left: nothing fits but job 0's
        // and the pair's next steps, and they have none.
        let (g, objective) = relaxation_greedy(&rows, &members, 7);
        assert_eq!(g, vec![4, 0, 0, 2]);
        assert!((objective - 7.0).abs() < 1e-12);
        // 3 GPUs: the pair (2), then job 0's hull step of 4 does not fit
        // and closes it; the GPU left goes to job 0's 1-GPU choice.
        let (g, objective) = relaxation_greedy(&rows, &members, 3);
        assert_eq!(g, vec![1, 0, 0, 2]);
        assert!((objective - 4.0).abs() < 1e-12);
        // Nothing to give: nothing given.
        assert_eq!(relaxation_greedy(&rows, &members, 0).0, vec![0; 4]);
    }

    /// Sub-linear scaling (`a^0.8`) and lengths mixed by `seed`.
    fn sublinear_mixed_times(snap: &mut Snapshot, seed: u64) {
        let allocs = snap.allocations.clone();
        for (i, j) in snap.jobs.iter_mut().enumerate() {
            let w = 600.0 * (1 + (seed as usize + 7 * i) % 9) as f64;
            j.remaining_s = allocs
                .iter()
                .map(|&a| {
                    if a == 0 {
                        f64::INFINITY
                    } else {
                        w / f64::from(a).powf(0.8)
                    }
                })
                .collect();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// The relaxation's greedy (what a round too large for HiGHS gets)
        /// makes sound plans — capacity kept, no job twice, merges whole —
        /// worth at least 90 % of the MILP's objective on rounds of tens
        /// of jobs on 8-GPU nodes (its loss is at most about one job's
        /// value, small against a large round's; on a handful of jobs on
        /// one node it can lose a quarter).
        #[test]
        fn the_relaxation_greedy_is_sound_and_near_the_milp(n in 30usize..90, nodes in 3usize..8, seed in 0u64..1000) {
            let mut snap = cluster(nodes, 8, jobs(n));
            let allocs = snap.allocations.clone();
            sublinear_mixed_times(&mut snap, seed);
            for (i, j) in snap.jobs.iter_mut().enumerate() {
                j.max_gpus = [1, 2, 4, 8][(seed as usize + i) % 4];
                if (seed as usize + 3 * i).is_multiple_of(5) {
                    j.current_gpus = 1;
                }
            }
            for a in (0..n).step_by(3) {
                let b = (a + 1 + seed as usize % 2) % n;
                if a != b && snap.jobs[a].current_gpus == 0 && snap.jobs[b].current_gpus == 0 {
                    snap.jobs[b].task = format!("other-{b}");
                    snap.candidates.push(PairCandidate {
                        a,
                        b,
                        mode: MergeMode::Temporal,
                        remaining_s: linear_times(&allocs, 3000.0),
                        tran_wt: allocs.iter().map(|&x| if x == 0 { 0.0 } else { 1.4 }).collect(),
                    });
                }
            }
            let solve = |milp: usize| Ymir::new(YmirConfig { milp_units: milp, ..Default::default() }).schedule(&snap);
            let (exact, relaxed) = (solve(0), solve(1));
            prop_assume!(!exact.stats.fallback);
            prop_assert!(relaxed.stats.relaxed && !exact.stats.relaxed);
            prop_assert!(relaxed.consistency_check(&snap).is_ok(), "{:?}", relaxed.consistency_check(&snap));
            prop_assert!(
                relaxed.stats.objective >= 0.9 * exact.stats.objective - 1e-9,
                "greedy {} vs MILP {}: {:?} vs {:?}", relaxed.stats.objective, exact.stats.objective, relaxed.gpus_by_job(), exact.gpus_by_job()
            );
        }

        /// Capacity is never exceeded, no job appears twice, and solving
        /// the plan's own outcome again changes nothing.
        #[test]
        fn plans_are_sound_and_stable(n in 1usize..14, nodes in 1usize..4, seed in 0u64..1000) {
            let mut snap = cluster(nodes, 4, jobs(n));
            sublinear_mixed_times(&mut snap, seed);
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
