//! Deadline-aware policies (thesis Ch. 5): **UniSched**'s reward ILP, its
//! predecessor **Chronus**, and EDF and a Hydra-style priority order for
//! comparison. A job is an SLO job when its `deadlines` (reward steps,
//! [`crate::slo`]) still hold a step it can earn; otherwise it is
//! best-effort (an SLO job whose last step has passed finishes as one).
//!
//! | policy | rule | interval |
//! |---|---|---|
//! | EDF | earliest upcoming deadline first, then best-effort by arrival; preemptive, backfilling | 60 s |
//! | Hydra-style | SLO above best-effort, shortest remaining time first inside each; no preemption | 60 s |
//! | UniSched | the reward ILP below over SLO and best-effort jobs together; leases of 10 min (SLO) and 5 min (best-effort) | 60 s |
//! | Chronus | the same ILP over SLO jobs only, at their requested GPUs, strict consolidation (Eq. 5.14); best-effort jobs take what is left, shortest remaining time first; a job that stops on a metric target is planned at its maximum iterations (no iteration estimator) | 60 s |
//!
//! The thesis runs a round per best-effort lease (5 min). Here rounds run
//! every minute and the leases keep their lengths: a job under a lease is
//! not moved before it ends, but GPUs a finished job frees, and a new job's
//! profiling, do not wait up to five minutes for the next cycle. On a
//! generated MIX1 workload (150 jobs, 12 × 8 A100) that wait alone took
//! the weighted SLO violation from 4.8 % to 30.1 %: deadlines of 1.1–2 ×
//! a job's time alone leave a short job less slack than one cycle.
//! Rounds on events (`scheduling.event_round_gap`, `fmsim --event-gap`;
//! [`crate::round::round_after_event`]) cut the wait further, for every
//! policy: on the generated workloads of docs/fmsim/deadlines.md UniSched's
//! violation over reachable deadlines falls from 3.9 to 1.7 % (SLO, 100 %).
//!
//! **Stopping criteria (§5.3.2.2).** A job that stops on a metric target
//! ends when it reaches it, before its user's maximum iterations. UniSched
//! plans it at the estimator's prediction; Chronus as published has no
//! such estimator and plans it at the maximum, reserving lease terms it
//! will not use and giving up deadlines that the maximum would miss
//! ([`Policy::iteration_estimator`]; the knob `iteration_estimator=1` gives
//! "Chronus with the Estimator", the thesis' §5.6.3 variant, and `0` on
//! UniSched is Fig. 5.9b's ablation). The policy sees times; the service
//! and fmsim build them by this flag.
//!
//! ## The UniSched ILP (Eq. 5.4–5.14), as built here
//! Time is cut into SLO lease terms of `T_lease` seconds; slot 0 is the
//! term starting now. For job `i` at GPU count `a_p` (a few counts around
//! its request: UniSched's policy generator, §5.3.3.3, with the GPU count
//! instead of the cell shape — placement picks the shape):
//! - `T_exe = T_sr + N_iter·T_iter` (Eq. 5.1): the snapshot's remaining time
//!   at `a_p` (plus the restart when `a_p` is not what it holds), plus the
//!   expected suspend/resume overhead `T_sr` of Eq. 5.3
//!   ([`crate::slo::slo_suspend_resume_s`]) over the terms to its first
//!   deadline;
//! - `L_{i,p} = ⌈T_exe/T_lease⌉` terms to finish, and before step `f`,
//!   `Q_{f,i} = ⌊(D_{f,i} − now)/T_lease⌋` terms (a job that finishes by
//!   `D_f` running from now on counts as meeting it even when its last
//!   term ends after `D_f`).
//!
//! Variables: `y_{i,p}` (Eq. 5.9, the allocation, Eq. 5.13 at most one),
//! `s_{f,i}` as `w_{i,p,f} ≤ y_{i,p}` (Eq. 5.5–5.6: at most one step is
//! earned; the products `s·y` are linearised by giving each (p, f) its own
//! binary), `x_{0,i,p}` (runs in slot 0) and, for the later terms,
//! `n_{i,p,e}` — how many terms of window `e` it gets. The windows group the
//! terms between consecutive deadlines (at most
//! [`UniSchedConfig::windows`]; a deadline falling inside a window counts
//! only the windows before it, which is stricter, never looser): one
//! integer per window instead of a binary per term keeps the model small
//! enough to solve every round, and within a window any order of its terms
//! is equivalent for the deadlines.
//!
//! - **Eq. 5.7 / 5.12 fixed.** As printed, `Σ_{k<Q} s·x_k ≤ s·L` caps the
//!   terms a job gets before its deadline at what it needs — it is
//!   satisfied by giving it none. The intent (the text: "guarantees all SLO
//!   jobs need to be finished before the deadlines") is `≥`:
//!   `x_{0,i,p} + Σ_{e before Q_f} n_{i,p,e} ≥ L_{i,p}·w_{i,p,f}`.
//!   `printed_inequality_rewards_an_slo_job_it_never_runs` shows the
//!   printed form earning a deadline with no GPU.
//! - **Per-term capacity the text omits.** Eq. 5.10 bounds only the cells
//!   of the round; nothing bounds later terms, so every SLO job could be
//!   promised the whole cluster at once. Here `Σ a_p·x_{0,i,p} ≤ M` for slot 0
//!   (with the best-effort jobs that run now) and `Σ a_p·n_{i,p,e} ≤ M·|e|`
//!   for every window.
//! - **Objective (Eq. 5.4)**: `Σ V_{f,i}·w_{i,p,f}` plus the best-effort
//!   rewards of the jobs run now: "a reciprocal of the estimated remaining
//!   time", here `min(1, T_BE-lease / T_{i,a})` scaled by `1/(N_BE + 1)` so
//!   that all of them together stay below 1 — the profiler's reward and a
//!   hundredth of an SLO step, the 1 : 100 ratio of §5.3.3.2, for any
//!   number of jobs: an SLO job that fits is never dropped for best-effort
//!   work. An SLO job run now with slack earns
//!   [`UniSchedConfig::slack_weight`] (1) of the same over its own lease,
//!   `min(1, T_SLO-lease / T_{i,a})`, on the same scale: a job whose lease
//!   secures twice the progress earns up to twice the reward, and
//!   otherwise the classes are ranked alike, shortest remaining time first.
//!   Idle GPUs are not left idle, and a shorter best-effort job goes first
//!   while an SLO job is not at risk (the Selector's point). Measured on
//!   `fmsim`'s generated SLO, MIX1 and MIX2 workloads at 100 % and 160 %
//!   density (96 × 8 A100; docs/fmsim/deadlines.md), weighted violation over the
//!   reachable deadlines (by the floor of then, which left out the profiling
//!   run's length; docs/fmsim/deadlines.md has the figures by today's):
//!   - weight 0.3 (best-effort work first unless the SLO job is much
//!     shorter): 7.8 / 9.1 % (SLO), 9.0 / 9.6 % (MIX1), 5.7 / 6.0 % (MIX2),
//!     best-effort JCT 2.20–2.41 h;
//!   - weight 1: 7.8 / 9.0 %, 8.1 / 8.6 %, 5.3 / 5.7 %, lower on five of
//!     the six and equal on one, for 2.7–4.3 % more best-effort JCT
//!     (2.26–2.49 h); with 0.001 (best-effort always first) deferred SLO
//!     jobs met their deadline less often still;
//!   - ranking both classes over the best-effort lease (the SLO bonus over
//!     `T_BE-lease`) was never the best of the three, and worse than both
//!     on three of the six;
//!   - scaling the slack bonuses with the best-effort rewards so that they
//!     too stay below 1 (`1/(N_BE + N_SLO + 1)`) was worse on SLO-only
//!     workloads (8.1 / 9.4 %). The bonuses are not bounded so: with
//!     hundreds of SLO jobs, running them now can outweigh one deadline the
//!     model could still promise on later terms, and measured that is the
//!     better bet — the later terms' promise does not see jobs yet to
//!     arrive.
//! - **Uncertain estimates**: a reward step asks for the terms `L` of the
//!   pessimistic `T·(1 + κ·spread/2)` (knob `risk_weight` κ, default 1;
//!   the spread is the estimate's relative p10–p90 width, the rule Ymir's
//!   merger uses) while the step can still be met so, else the median's:
//!   an SLO job whose estimate is unsure starts while its deadline is safe
//!   at the pessimistic time, and is not given up on when only the median
//!   still makes it. Taking `T_exe` pessimistic throughout declared such
//!   jobs hopeless: on the published FM-1 workloads with learned estimates
//!   (`--slo-mix mix1` and `slo`) it missed 1–3 more deadlines per workload
//!   than the median. This rule misses as many as the median in all (216
//!   of 988 SLO jobs over the eight runs; vit-large MIX1 5 → 3, vit and
//!   vit-large SLO one more each) with best-effort JCT equal or lower.
//! - **A stop costs a restart** (the text counts `T_exe` once): a job
//!   holding a count needs `L` terms there only if it keeps running now;
//!   stopped now, it pays its restart when it resumes and needs
//!   `L_stopped` (Eq. 5.1 with the restart). The deadline rows ask for
//!   `L_stopped·w − (L_stopped − L)·x_0` terms, exact at every corner of
//!   the binaries. Counting `L` either way stopped running SLO jobs on the
//!   promise of terms that could no longer finish them; the next round saw
//!   the restart and either lost the deadline or started the job again,
//!   swapping the GPUs at every lease end
//!   (`a_running_slo_job_is_not_stopped_on_terms_its_restart_would_overrun`).
//! - **Leases** (§5.3.3.1): a job whose lease has not run out keeps its GPUs.
//! - **Consolidation (Eq. 5.14)**: in Chronus, jobs of 1, 2, 4 and 8b GPUs
//!   must fit the free buddy cells of the nodes (a 16-GPU node is two
//!   level-3 cells; on 4-GPU nodes the largest cell is level 2 and an 8-GPU
//!   job counts as two of them). UniSched relaxes it (§5.1: "we relax strict
//!   consolidation constraints") for data-parallel jobs, which the shared
//!   placement packs on the fewest nodes it can, and keeps it for replicas
//!   that must sit on one node (a pipeline's four stages, an expert group).
//! - **Time limit**: HiGHS stops after [`UniSchedConfig::time_limit_s`]; on a
//!   miss the previous solution is reused (every running job keeps its GPUs,
//!   waiting jobs fill what is free in EDF order) and `stats.fallback` says so.

use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, variable};

use super::baselines::{by_arrival, in_order, keep_running, sort_entries, srtf_sort};
use super::{
    Plan, PlanEntry, Policy, Snapshot, SolveStats, requested_allocation, usable_allocations,
};
use crate::slo::{RewardStep, slo_suspend_resume_s};

/// The reward steps job `i` can still earn (those not yet past).
fn open_steps(snap: &Snapshot, i: usize) -> impl Iterator<Item = &RewardStep> {
    snap.jobs[i]
        .deadlines
        .iter()
        .filter(move |s| s.by > snap.now)
}

/// Whether job `i` is an SLO job now (a step it can still earn).
pub fn is_slo(snap: &Snapshot, i: usize) -> bool {
    open_steps(snap, i).next().is_some()
}

/// The earliest deadline job `i` can still meet (`+∞` for best-effort).
fn next_deadline(snap: &Snapshot, i: usize) -> f64 {
    open_steps(snap, i)
        .map(|s| s.by)
        .fold(f64::INFINITY, f64::min)
}

/// Earliest deadline first: SLO jobs by their next deadline, then
/// best-effort jobs by arrival; preemptive, later jobs backfill.
#[derive(Clone, Debug)]
pub struct Edf {
    pub interval_s: f64,
}

impl Default for Edf {
    fn default() -> Self {
        Self { interval_s: 60.0 }
    }
}

/// Jobs in EDF order (ties by arrival, then id).
fn edf_order(snap: &Snapshot) -> Vec<usize> {
    let mut order = by_arrival(snap);
    order.sort_by(|&a, &b| next_deadline(snap, a).total_cmp(&next_deadline(snap, b)));
    order
}

impl Policy for Edf {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "edf"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut plan = Plan::default();
        in_order(snap, &edf_order(snap), snap.total_gpus(), false, &mut plan);
        sort_entries(plan)
    }
}

/// Hydra-style (as the thesis runs it, §5.4.4): SLO jobs above best-effort
/// ones, shortest remaining time first inside each class; no preemption
/// (running jobs keep their GPUs), later jobs backfill.
#[derive(Clone, Debug)]
pub struct Hydra {
    pub interval_s: f64,
}

impl Default for Hydra {
    fn default() -> Self {
        Self { interval_s: 60.0 }
    }
}

impl Policy for Hydra {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "hydra"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut plan = Plan::default();
        let free = keep_running(snap, &mut plan);
        let mut order: Vec<usize> = (0..snap.jobs.len())
            .filter(|&i| snap.jobs[i].current_gpus == 0)
            .collect();
        srtf_sort(snap, &mut order);
        // SLO jobs first; the sort is stable, so SRTF holds inside a class.
        order.sort_by_key(|&i| !is_slo(snap, i));
        in_order(snap, &order, free, false, &mut plan);
        sort_entries(plan)
    }
}

/// Knobs of UniSched and Chronus.
#[derive(Clone, Debug, PartialEq)]
pub struct UniSchedConfig {
    /// Seconds between rounds (the thesis: one best-effort lease, §5.3.3.4;
    /// here a minute, see the module docs).
    pub interval_s: f64,
    /// Best-effort (and profiler) lease, seconds (§5.3.3.4: 5 minutes).
    pub be_lease_s: f64,
    /// SLO lease, seconds (§5.3.3.4: 10 minutes, an integral multiple of
    /// the best-effort lease).
    pub slo_lease_s: f64,
    /// HiGHS time limit per round, seconds.
    pub time_limit_s: f64,
    /// Most windows the later lease terms are grouped into.
    pub windows: usize,
    /// Most lease terms ahead the model looks (later deadlines count as
    /// this far).
    pub horizon_terms: u32,
    /// Share of the cluster later windows may promise to SLO jobs.
    pub future_capacity: f64,
    /// Weight of running an SLO job with slack now, relative to a
    /// best-effort job's reward at the same remaining time (each over its
    /// own lease; the module docs say why 1).
    pub slack_weight: f64,
    /// Seconds before each deadline the model aims to finish by (room for
    /// a placement that has to wait, a restart the estimate missed).
    pub deadline_margin_s: f64,
    /// Chronus: SLO jobs only in the ILP, at their requested GPUs, with
    /// strict consolidation; best-effort jobs get what is left by SRTF.
    pub chronus: bool,
    /// Whether metric-target jobs are planned at the estimator's predicted
    /// iterations ([`Policy::iteration_estimator`]). UniSched has the
    /// estimator; Chronus as published plans them at their maximum (the
    /// `chronus` policy's default, knob `iteration_estimator`: 1 gives
    /// "Chronus with the Estimator" of §5.6.3).
    pub iteration_estimator: bool,
    /// κ: a job's time is planned at the pessimistic `T·(1 + κ·spread/2)`
    /// (its estimate's relative p10–p90 spread; Ymir's rule), so a
    /// deadline is not gambled on an uncertain estimate. 0 = the median.
    pub risk_weight: f64,
}

impl Default for UniSchedConfig {
    fn default() -> Self {
        Self {
            interval_s: 60.0,
            be_lease_s: 300.0,
            slo_lease_s: 600.0,
            time_limit_s: 1.0,
            windows: 8,
            horizon_terms: 1000,
            future_capacity: 1.0,
            slack_weight: 1.0,
            deadline_margin_s: 0.0,
            chronus: false,
            iteration_estimator: true,
            risk_weight: 1.0,
        }
    }
}

/// UniSched (or Chronus, with [`UniSchedConfig::chronus`]).
#[derive(Clone, Debug, Default)]
pub struct UniSched {
    pub config: UniSchedConfig,
}

/// One GPU count a job may run at, with what it costs there.
struct Choice {
    gpus: u32,
    /// `T_exe` (Eq. 5.1) at this count, seconds (at the median estimate).
    exe_s: f64,
    /// Per open reward step: (future terms before it, reward, `L_{i,p}`
    /// the lease terms to finish it needs, and the terms it needs if it
    /// does not run now — more for a job that holds this count: stopped
    /// now, it restarts later); `None` where the step cannot be met at
    /// this count.
    steps: Vec<Option<(u32, f64, u32, u32)>>,
}

/// What the model holds of one job.
struct Entry {
    job: usize,
    slo: bool,
    /// Holds an unexpired lease: runs now at `choices[0]`.
    leased: bool,
    choices: Vec<Choice>,
}

impl UniSched {
    pub fn new(config: UniSchedConfig) -> Self {
        Self { config }
    }

    /// The GPU counts job `i` is offered: its request (nearest usable), and
    /// for UniSched one usable count below and one above it.
    fn counts(&self, snap: &Snapshot, i: usize) -> Vec<u32> {
        let Some(req) = requested_allocation(snap, i) else {
            return Vec::new();
        };
        if self.config.chronus {
            return vec![req];
        }
        let usable = usable_allocations(snap, i);
        let k = usable.iter().position(|&a| a == req).unwrap_or(0);
        let lo = k.saturating_sub(1);
        let hi = (k + 1).min(usable.len() - 1);
        usable[lo..=hi].to_vec()
    }

    fn entry(&self, snap: &Snapshot, i: usize) -> Option<Entry> {
        let j = &snap.jobs[i];
        let lease = self.config.slo_lease_s.max(1.0);
        let leased = j.current_gpus > 0 && j.lease_until > snap.now + 1e-6;
        let counts = if leased {
            vec![j.current_gpus]
        } else {
            self.counts(snap, i)
        };
        let slo = is_slo(snap, i);
        let steps: Vec<&RewardStep> = open_steps(snap, i).collect();
        let horizon = self.config.horizon_terms.max(1);
        let choices: Vec<Choice> = counts
            .into_iter()
            .filter_map(|a| {
                let median = snap.time_at(i, a);
                if !median.is_finite() {
                    return None;
                }
                let held = a == j.current_gpus;
                let restart = if held { 0.0 } else { j.restart_s };
                // T_exe (Eq. 5.1, with Eq. 5.3 over the terms to the first
                // open deadline) at a time `run` plus a restart, and its
                // terms L.
                let exe_with = |run: f64, restart: f64| {
                    let run = run + restart;
                    let n0 = (run / lease).ceil().max(1.0) as u64;
                    let m0 = steps
                        .first()
                        .map_or(n0, |s| ((s.by - snap.now) / lease).floor().max(0.0) as u64);
                    let exe_s = run + slo_suspend_resume_s(n0, m0, j.restart_s);
                    (exe_s, ((exe_s / lease).ceil().max(1.0) as u32).min(horizon))
                };
                let exe = |run: f64| exe_with(run, restart);
                // The terms a job holding this count needs if it is
                // stopped now: it pays the restart when it resumes. Without
                // them the model may stop a running SLO job on the promise
                // of terms that no longer finish it, and start it again
                // next round when they visibly do not (the GPUs swap at
                // every lease end).
                let stopped = |run: f64, terms: u32| {
                    if held {
                        exe_with(run, j.restart_s).1.max(terms)
                    } else {
                        terms
                    }
                };
                let (exe_s, terms) = exe(median);
                // The conservative quantile of an uncertain estimate.
                let pessimism = 1.0 + self.config.risk_weight * j.spread.max(0.0) / 2.0;
                let (exe_p, terms_p) = exe(median * pessimism);
                let step_terms = steps
                    .iter()
                    .map(|s| {
                        let left = s.by - snap.now - self.config.deadline_margin_s;
                        let q = ((left / lease).floor().max(0.0) as u32).min(horizon);
                        // Running from now on it finishes by D_f: met.
                        let met = |exe_s: f64, terms: u32, run: f64| {
                            let q = if exe_s <= left { q.max(terms) } else { q };
                            (q >= terms).then(|| (q - 1, s.reward, terms, stopped(run, terms)))
                        };
                        // The pessimistic time's terms while the step can
                        // be met so; else the median's (an SLO job is not
                        // given up on because its estimate is unsure).
                        met(exe_p, terms_p, median * pessimism)
                            .or_else(|| met(exe_s, terms, median))
                    })
                    .collect();
                Some(Choice {
                    gpus: a,
                    exe_s,
                    steps: step_terms,
                })
            })
            .collect();
        if choices.is_empty() {
            return None;
        }
        Some(Entry {
            job: i,
            slo: slo && choices.iter().any(|c| c.steps.iter().any(Option::is_some)),
            leased,
            choices,
        })
    }
}

/// Window bounds over the future terms: ascending distinct counts of
/// future terms before each deadline, at most `max` (quantiles of them,
/// the smallest always kept). Window `e` covers terms `(b[e-1], b[e]]`.
fn window_bounds(mut before: Vec<u32>, max: usize) -> Vec<u32> {
    before.retain(|&q| q > 0);
    before.sort_unstable();
    before.dedup();
    let max = max.max(1);
    if before.len() <= max {
        return before;
    }
    let n = before.len();
    let mut out: Vec<u32> = (0..max)
        .map(|k| before[k * (n - 1) / (max - 1).max(1)])
        .collect();
    out.dedup();
    out
}

/// Buddy cells of the cluster (Eq. 5.14): free cells per level 0..=top
/// (level g = 2^g GPUs), the top level capped by the largest node.
fn cells(snap: &Snapshot) -> (usize, Vec<f64>) {
    let largest = snap.nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
    let top = (0..=3usize)
        .rev()
        .find(|&g| (1u32 << g) <= largest)
        .unwrap_or(0);
    let mut count = vec![0.0; top + 1];
    for n in &snap.nodes {
        let mut left = n.gpus;
        for g in (0..=top).rev() {
            let size = 1u32 << g;
            count[g] += f64::from(left / size);
            left %= size;
        }
    }
    (top, count)
}

/// Cells of each level a job of `a` GPUs takes when it is consolidation-
/// friendly (1, 2, 4, … up to the top cell, or a multiple of the top cell),
/// None otherwise (Remark 5.1: "an 8b-GPU job is counted as b 8-GPU jobs").
fn cell_need(a: u32, top: usize) -> Option<(usize, f64)> {
    let top_size = 1u32 << top;
    if a.is_power_of_two() && a <= top_size {
        Some((a.trailing_zeros() as usize, 1.0))
    } else if a.is_multiple_of(top_size) {
        Some((top, f64::from(a / top_size)))
    } else {
        None
    }
}

impl Policy for UniSched {
    fn rigid(&self) -> bool {
        // Chronus runs each job at its request; UniSched picks among
        // three counts around it.
        self.config.chronus
    }
    fn name(&self) -> &str {
        if self.config.chronus {
            "chronus"
        } else {
            "unisched"
        }
    }
    fn interval_s(&self) -> f64 {
        self.config.interval_s
    }
    fn lease_s(&self) -> f64 {
        self.config.be_lease_s
    }
    fn slo_lease_s(&self) -> f64 {
        self.config.slo_lease_s
    }
    fn iteration_estimator(&self) -> bool {
        self.config.iteration_estimator
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        self.solve(snap, false)
    }
}

/// The round's ILP as it is built: its variables, objective, the GPUs
/// used now and in each window, the buddy cells used per level, and the
/// constraints besides capacity.
struct Model {
    vars: ProblemVariables,
    objective: Expression,
    now_used: Expression,
    window_used: Vec<Expression>,
    cell_used: Vec<Expression>,
    constraints: Vec<good_lp::Constraint>,
    n_vars: usize,
}

/// What every entry's terms are built on: the windows' ends and lengths,
/// the buddy levels, the best-effort scale and the leases.
#[derive(Clone, Copy)]
struct Terms<'a> {
    bounds: &'a [u32],
    window_len: &'a [f64],
    top: usize,
    be_scale: f64,
    lease: f64,
    be_lease: f64,
    printed_eq_5_7: bool,
}

impl UniSched {
    /// The round's ILP; `printed_eq_5_7` builds Eq. 5.7 as the thesis
    /// prints it (`≤`), for the test that shows why it is fixed.
    fn solve(&self, snap: &Snapshot, printed_eq_5_7: bool) -> Plan {
        let entries: Vec<Entry> = (0..snap.jobs.len())
            .filter_map(|i| self.entry(snap, i))
            .collect();
        let chronus = self.config.chronus;
        let lease = self.config.slo_lease_s.max(1.0);
        let be_lease = self.config.be_lease_s.max(1.0);
        let total = snap.total_gpus();
        let in_model = |e: &Entry| e.slo || !chronus || e.leased;
        // Best-effort rewards together stay below 1, a hundredth of an
        // SLO step (the slack bonuses share the scale, not the bound: see
        // the module docs).
        let n_be = entries.iter().filter(|e| !e.slo).count();
        let be_scale = 1.0 / (n_be as f64 + 1.0);

        let bounds = window_bounds(
            entries
                .iter()
                .filter(|e| e.slo)
                .flat_map(|e| e.choices.iter().flat_map(|c| c.steps.iter().flatten()))
                .map(|&(q, _, _, _)| q)
                .collect(),
            self.config.windows,
        );
        let window_len: Vec<f64> = bounds
            .iter()
            .enumerate()
            .map(|(e, &b)| f64::from(b - if e == 0 { 0 } else { bounds[e - 1] }))
            .collect();

        let (top, free_cells) = cells(snap);
        let mut m = Model {
            vars: ProblemVariables::new(),
            objective: Expression::from(0.0),
            now_used: Expression::from(0.0),
            window_used: vec![Expression::from(0.0); bounds.len()],
            cell_used: vec![Expression::from(0.0); top + 1],
            constraints: Vec::new(),
            n_vars: 0,
        };
        let terms = Terms {
            bounds: &bounds,
            window_len: &window_len,
            top,
            be_scale,
            lease,
            be_lease,
            printed_eq_5_7,
        };
        // Per entry: (gpus, slot-0 variable) of each choice.
        let now_vars: Vec<(usize, Vec<(u32, Variable)>)> = entries
            .iter()
            .filter(|e| in_model(e))
            .map(|e| (e.job, self.add_entry(&mut m, snap, e, &terms)))
            .collect();
        let Model {
            vars,
            objective,
            now_used,
            window_used,
            cell_used,
            constraints,
            n_vars,
        } = m;

        let mut stats = SolveStats {
            variables: n_vars,
            ..Default::default()
        };
        let mut plan = Plan::default();
        let mut free = total;
        if n_vars > 0 {
            let objective_copy = objective.clone();
            let mut model = vars
                .maximise(objective)
                .using(highs)
                .set_time_limit(self.config.time_limit_s.max(0.001))
                .set_threads(1);
            model.set_verbose(false);
            // Per-term capacity (missing from the text): now and each window.
            model = model.with(now_used.leq(f64::from(total)));
            for (used, &len) in window_used.into_iter().zip(&window_len) {
                model = model.with(used.leq(self.config.future_capacity * f64::from(total) * len));
            }
            stats.constraints = constraints.len() + 1 + bounds.len() + top + 1;
            {
                // Eq. 5.14 for every level i: Σ_{g≥i} 2^{g−i}·N^con_g ≤ Σ 2^{g−i}·N^cell_g.
                for i in 0..=top {
                    let mut need = Expression::from(0.0);
                    let mut have = 0.0;
                    for g in i..=top {
                        let w = f64::from(1u32 << (g - i));
                        need += w * cell_used[g].clone();
                        have += w * free_cells[g];
                    }
                    model = model.with(need.leq(have));
                }
            }
            for c in constraints {
                model = model.with(c);
            }
            // A proven answer only: no incumbent is taken on a time limit
            // (the previous plan is reused instead).
            let solution = super::solve_usable(
                model,
                self.config.time_limit_s,
                |_| 0.0,
                f64::INFINITY,
                &mut stats,
            );
            let Some(solution) = solution else {
                stats.fallback = true;
                let mut plan = self.reuse_previous(snap);
                plan.stats = stats;
                return plan;
            };
            stats.objective = solution.eval(&objective_copy);
            for (job, row) in &now_vars {
                if let Some(&(a, _)) = row.iter().find(|(_, v)| solution.value(*v) > 0.5) {
                    plan.entries.push(PlanEntry::single(*job, a));
                    free -= a;
                }
            }
        }
        if chronus {
            // Best-effort jobs take what is left, shortest remaining first.
            let placed: Vec<usize> = plan.entries.iter().map(|e| e.jobs[0]).collect();
            let mut order: Vec<usize> = entries
                .iter()
                .filter(|e| !in_model(e) && !placed.contains(&e.job))
                .map(|e| e.job)
                .collect();
            srtf_sort(snap, &mut order);
            in_order(snap, &order, free, false, &mut plan);
        }
        plan.stats = stats;
        sort_entries(plan)
    }

    /// Adds entry `e`'s choices to the round's ILP: a slot-0 variable per
    /// GPU count (now), and for an SLO job its terms per window and a
    /// variable per reward step with Eq. 5.7/5.12 (fixed: `≥`), Eq. 5.6
    /// (one step earned) and Eq. 5.13 (one count); a best-effort job earns
    /// the reciprocal of its remaining time, scaled below 1. Returns each
    /// choice's (GPUs, slot-0 variable).
    fn add_entry(
        &self,
        m: &mut Model,
        snap: &Snapshot,
        e: &Entry,
        terms: &Terms<'_>,
    ) -> Vec<(u32, Variable)> {
        let Terms {
            bounds,
            window_len,
            top,
            be_scale,
            lease,
            be_lease,
            printed_eq_5_7,
        } = *terms;
        let j = &snap.jobs[e.job];
        let mut one = Expression::from(0.0);
        let mut row = Vec::with_capacity(e.choices.len());
        let mut chosen = Expression::from(0.0);
        let mut earned = Expression::from(0.0);
        for c in &e.choices {
            let a = f64::from(c.gpus);
            let x0 = m.vars.add(variable().binary());
            m.n_vars += 1;
            m.now_used += a * x0;
            if let Some((g, k)) = self.cells_of(snap, e.job, c.gpus, top) {
                m.cell_used[g] += k * x0;
            }
            row.push((c.gpus, x0));
            if e.leased {
                m.constraints.push(Expression::from(x0).eq(1.0));
            }
            if !e.slo {
                // Best-effort (or an SLO job past every step): the
                // reciprocal of its remaining time, scaled below 1.
                let t = snap.time_at(e.job, c.gpus)
                    + if c.gpus == j.current_gpus {
                        0.0
                    } else {
                        j.restart_s
                    };
                m.objective += be_scale * (be_lease / t).min(1.0) * x0;
                one += x0;
                continue;
            }
            let y = m.vars.add(variable().binary());
            m.n_vars += 1;
            one += y;
            m.constraints.push((x0 - y).leq(0.0));
            // Slack bonus: `slack_weight` of the reward a best-effort
            // job would earn at the same remaining time, over this
            // job's (SLO) lease.
            let t = c.exe_s.max(1.0);
            m.objective += self.config.slack_weight * be_scale * (lease / t).min(1.0) * x0;
            let mut got = Expression::from(x0);
            let mut got_by: Vec<Expression> = Vec::with_capacity(bounds.len());
            let mut ns: Vec<Variable> = Vec::with_capacity(bounds.len());
            for (w, &len) in window_len.iter().enumerate() {
                let n = m.vars.add(variable().integer().min(0.0).max(len));
                m.n_vars += 1;
                m.constraints.push((n - len * y).leq(0.0));
                m.window_used[w] += a * n;
                got += n;
                got_by.push(got.clone());
                ns.push(n);
            }
            for &(before, reward, terms, if_stopped) in c.steps.iter().flatten() {
                let w = m.vars.add(variable().binary());
                m.n_vars += 1;
                m.constraints.push((w - y).leq(0.0));
                earned += w;
                m.objective += reward * w;
                // Eq. 5.7/5.12 fixed (≥): the terms before D_f cover L.
                // A deadline inside a window counts that window's
                // terms pro rata.
                let k = bounds.iter().rposition(|&b| b <= before);
                let (mut have, done) = match k {
                    Some(k) => (got_by[k].clone(), bounds[k]),
                    None => (Expression::from(x0), 0),
                };
                let next = k.map_or(0, |k| k + 1);
                if before > done && next < ns.len() {
                    have += (f64::from(before - done) / window_len[next]) * ns[next];
                }
                // Run now, it needs L; stopped now, what it needs
                // then: `need = L_stopped·w − (L_stopped − L)·x0`
                // (x0 ≤ y and w ≤ y: exact at every corner).
                let need = f64::from(if_stopped) * w - f64::from(if_stopped - terms) * x0;
                m.constraints.push(if printed_eq_5_7 {
                    (have - need).leq(0.0)
                } else {
                    (have - need).geq(0.0)
                });
            }
            chosen += y;
        }
        if e.slo {
            // Eq. 5.6: one step earned at most; Eq. 5.13: one count.
            m.constraints.push(earned.leq(1.0));
            m.constraints.push(chosen.leq(1.0));
        } else {
            m.constraints.push(one.leq(1.0));
        }
        row
    }

    /// The buddy cells job `i` at `a` GPUs takes (Eq. 5.14): Chronus
    /// counts every consolidation-friendly job; UniSched only the replicas
    /// that must sit on one node (pipeline stages, expert groups) — its
    /// data-parallel jobs may spread (the relaxed consolidation of §5.1).
    fn cells_of(&self, snap: &Snapshot, i: usize, a: u32, top: usize) -> Option<(usize, f64)> {
        if self.config.chronus {
            return cell_need(a, top);
        }
        let unit = snap.jobs[i].replica().gpus();
        if unit <= 1 || !unit.is_power_of_two() || unit > (1 << top) {
            return None;
        }
        Some((unit.trailing_zeros() as usize, f64::from(a / unit)))
    }

    /// The previous round's solution, as the cluster runs it: every running
    /// job keeps its GPUs; waiting jobs fill what is free in EDF order.
    fn reuse_previous(&self, snap: &Snapshot) -> Plan {
        let mut plan = Plan::default();
        let free = keep_running(snap, &mut plan);
        let order: Vec<usize> = edf_order(snap)
            .into_iter()
            .filter(|&i| snap.jobs[i].current_gpus == 0)
            .collect();
        in_order(snap, &order, free, false, &mut plan);
        sort_entries(plan)
    }
}

#[cfg(test)]
mod tests;
