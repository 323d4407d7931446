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
//!    bench-solver`; docs/fmsim/datacenter.md, "Datacenter-size rounds").
//!
//! **Partitions** (ICEFROG §V-E, at datacenter size; off by default since
//! the relaxation took over large rounds): a round with more
//! than [`YmirConfig::partition_units`] units is solved in parts — one per
//! foundation model (only jobs of one model can merge), a large model cut
//! further along its candidate pairs — each on a share of the GPUs in
//! proportion to its demand at the fair share, on up to four threads that
//! share the time limit; the GPUs a part leaves are then handed out
//! greedily across all units. A part that fails falls back alone.

mod fallback;
mod solve;

pub use fallback::{UnitView, fallback};

use super::{
    MergeMode, Plan, Policy, Snapshot, SolveStats, placement, time_in, usable_allocations,
};
use crate::policy::ymir::fallback::{grow, keep_current, units_view};
use crate::policy::ymir::solve::{Part, Solved, Weights, entries, split_capacity};

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
    /// arrivals. 0 (the default): no aging. Measured (docs/experiments/2026-11-ymir-tail-on-fm1.md): with
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
pub(crate) struct Unit<'s> {
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
pub(crate) struct Pair {
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
pub(crate) fn reference_time(allocations: &[u32], times: &[f64], target: u32) -> f64 {
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
pub(crate) fn effective(t: f64, a: u32, current: u32, restart: f64, horizon: f64) -> f64 {
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

    /// The parts are solved on up to `threads` threads (each HiGHS
    /// model on one) within the round's time limit: each part gets an
    /// even share of the limit's thread-seconds (a fixed budget, so no
    /// clock is read here beyond HiGHS' own limit).
    fn solve_parts(
        &self,
        snap: &Snapshot,
        w: &Weights,
        (units, pairs): (&[Unit], &[Pair]),
        parts: &[Part],
        caps: &[u32],
    ) -> Vec<Option<Solved>> {
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
                                    w,
                                    (units, &part.units),
                                    (pairs, &part.pairs),
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
        by_part
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
        let by_part = self.solve_parts(snap, &w, (&units, &pairs), &parts, &caps);
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

#[cfg(test)]
mod tests;
