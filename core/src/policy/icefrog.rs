//! ICEFROG's cluster scheduler (TPDS'25 §IV-B): the IceShare max-min ILP
//! with a shared-GPU column, and the Lucid-style sharing baseline it is
//! compared with (§V-B).
//!
//! **IceShare** (`icefrog`), on HiGHS through `good_lp`:
//! - Eq. 16: `T^acc_k(a) = T^age_k + P_k / max_{m,ℓ} E(a, s, m, ℓ)`. The
//!   snapshot's `remaining_s[a]` is `P_k / max E` already: the estimator
//!   puts the layer tuner's best `(m, ℓ)` per allocation into it (Eq. 15;
//!   `times::seconds_per_effective_iteration` live, the engine in fmsim), so here
//!   `T^acc(a) = (now − submitted) + remaining_s[a]`, plus the job's
//!   restart when `a` changes what it holds (ICEFROG's 60 s reallocation
//!   overhead, §V-E, is that restart).
//! - The shared column (`s = 1`, "jobs that accept single GPU training";
//!   the paper's X has `M + 2` columns: none, 1..M GPUs, shared):
//!   `T^acc = T^age + remaining_s[1] / λ` with `λ = 0.9` (Eq. 8, fixed; see
//!   [`super::SHARED_SLOWDOWN`]). The column is half a GPU, offered to jobs
//!   that fit half of one by Eq. 8's rules (utilisation ≤ 50 %, padded
//!   memory ≤ half the GPU's), so any two jobs that take it may share and
//!   the ILP needs no pair variables; an integer counts the shared GPUs
//!   (`Σ x_{k,s} ≤ 2·p`). The jobs it picks are paired afterwards, pairs
//!   that share now first ([`pair_up`]). A first version had a binary per
//!   candidate pair: on 30 identical jobs and 10 GPUs HiGHS spent its whole
//!   5 s limit on the matching's symmetry; the column solves in
//!   milliseconds.
//! - Eq. 17: `IceShare_k(a) = min_{a'} T^acc_k(a') / T^acc_k(a)` over the
//!   job's allocations, the shared column included; 0 GPUs gives 0.
//! - Eq. 18: `max min_k w_k Σ_a x_{k,a} IceShare_k(a)`, `w_k = 1` (as the
//!   paper sets it), with one allocation per job and the cluster's
//!   capacity. **fmsched's addition**: the max-min alone is 0 whenever some
//!   job must wait (more jobs than GPUs), and then says nothing about who
//!   runs. The objective is `z + mean_k IceShare_k`: the minimum first
//!   where everyone can run, the mean (the cluster's total benefit) when
//!   not. The test `iceshare_max_min_alone_is_blind_when_jobs_outnumber_gpus`
//!   shows the printed form choosing nothing over something.
//! - The previous solution is the solver's starting point (what the jobs
//!   hold now; the paper caches its last solution); on a time limit without
//!   an incumbent at least that good, the round falls back to a greedy plan
//!   (counted in `stats.fallback`).
//! - Partitions (§IV-B "scheduling scalability"): more than
//!   [`IceFrogConfig::partition_jobs`] jobs are dealt round-robin in arrival
//!   order into parts, each solved on its share of the GPUs (and of each
//!   queue's budget) on up to four threads; GPUs a part leaves go to
//!   waiting jobs greedily.
//!
//! **Lucid-style** (`lucid`; Hu et al., ASPLOS'23, as ICEFROG uses it: GPU
//! sharing without elasticity): running jobs keep their GPUs (no
//! preemption), waiting jobs start at their request shortest-estimated
//! first where GPUs are free, and a one-GPU job that finds none free is
//! packed onto the GPU of a running one-GPU job it may share with (Lucid's
//! "indolent packing": only when the cluster is full).

use std::collections::BTreeMap;

use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, variable};

use super::{
    MergeMode, Plan, PlanEntry, Policy, QueueRoom, SHARE_MEMORY_MARGIN, SHARED_SLOWDOWN, Snapshot,
    SolveStats, may_share, requested_allocation, share_memory_gib, trains_on_one_gpu,
    usable_allocations,
};

/// Knobs of the IceShare policy.
#[derive(Clone, Debug, PartialEq)]
pub struct IceFrogConfig {
    /// Seconds between rounds (ICEFROG §V-B: 300 s).
    pub interval_s: f64,
    /// HiGHS time limit of a round (shared by its parts when partitioned).
    pub time_limit_s: f64,
    /// Offer the shared-GPU column (false: IceShare without GPU sharing).
    pub sharing: bool,
    /// Solve in parts above this many jobs (0 = never).
    pub partition_jobs: usize,
}

impl Default for IceFrogConfig {
    fn default() -> Self {
        Self {
            interval_s: 300.0,
            time_limit_s: 5.0,
            sharing: true,
            partition_jobs: 200,
        }
    }
}

/// ICEFROG's IceShare policy (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct IceFrog {
    pub config: IceFrogConfig,
}

/// One job's choices: (GPUs, IceShare) per allocation, and IceShare on
/// half a GPU (None: it cannot share) where it stays and where it moves.
struct Choices {
    alone: Vec<(u32, f64)>,
    shared: Option<Shared>,
}

/// IceShare on a shared GPU: staying on the one GPU it holds (its partner
/// joins it), or (re)starting.
#[derive(Clone, Copy)]
struct Shared {
    stays: f64,
    moves: f64,
}

/// Whether job `k` fits half of a GPU by Eq. 8's rules: any two such jobs
/// may share (utilisation ≤ 50 %, padded memory ≤ half of the smallest
/// GPU it may run on).
fn half_gpu(snap: &Snapshot, k: usize) -> bool {
    let j = &snap.jobs[k];
    let Some(f) = j.footprint else {
        return false;
    };
    let memory = share_memory_gib(snap, k, k);
    trains_on_one_gpu(j)
        && f.utilization_pct <= 50.0
        && 2.0 * SHARE_MEMORY_MARGIN * f.memory_gib <= memory
}

/// Eq. 16–17 for job `k`.
fn choices(snap: &Snapshot, k: usize, sharing: bool) -> Choices {
    let j = &snap.jobs[k];
    let age = (snap.now - j.submitted_at).max(0.0);
    // Of two jobs sharing a GPU now, the first keeps it when they part
    // (plan entries go in job order); the other moves.
    let keeps = j.shares_with.is_none_or(|l| k < l);
    let restart = |a: u32| {
        if a == j.current_gpus && keeps {
            0.0
        } else {
            j.restart_s
        }
    };
    // Eq. 16 per allocation.
    let alone: Vec<(u32, f64)> = usable_allocations(snap, k)
        .into_iter()
        .map(|a| (a, age + snap.time_at(k, a) + restart(a)))
        .collect();
    // The shared column: λ = 0.9 of its one-GPU speed (Eq. 8 and 4).
    let shared = (sharing && half_gpu(snap, k))
        .then(|| snap.time_at(k, 1))
        .filter(|t| t.is_finite())
        .map(|t| age + t / SHARED_SLOWDOWN);
    // Eq. 17: the best T^acc over every choice, over each choice's.
    let best = alone
        .iter()
        .map(|c| c.1)
        .chain(shared)
        .fold(f64::INFINITY, f64::min);
    Choices {
        alone: alone.into_iter().map(|(a, t)| (a, best / t)).collect(),
        shared: shared.map(|t| Shared {
            stays: best / t,
            moves: best / (t + j.restart_s),
        }),
    }
}

/// What one solve returns: GPUs per job (0 = none) and the jobs on half a
/// GPU, or None when the solver gave no usable solution.
type Solved = (Option<(Vec<u32>, Vec<usize>)>, SolveStats);

impl IceFrog {
    pub fn new(config: IceFrogConfig) -> Self {
        Self { config }
    }

    /// Eq. 18 (with the mean, see the module docs) over `jobs` on
    /// `capacity` GPUs and per-queue `budgets`.
    fn solve(
        &self,
        snap: &Snapshot,
        ch: &[Choices],
        jobs: &[usize],
        capacity: u32,
        budgets: &[u32],
        time_limit_s: f64,
    ) -> Solved {
        let mut vars = ProblemVariables::new();
        let mut stats = SolveStats::default();
        // Warm start: what the jobs hold, when it fits.
        let held: u32 = jobs.iter().map(|&k| snap.jobs[k].current_gpus).sum();
        let warm = held <= capacity;
        let listed: Vec<usize> = jobs
            .iter()
            .copied()
            .filter(|&k| !ch[k].alone.is_empty() || ch[k].shared.is_some())
            .collect();
        let n = listed.len().max(1) as f64;
        let z_max = z_bound(ch, &listed, capacity);
        let z = vars.add(variable().min(0.0).max(z_max).initial(0.0));
        // GPUs the shared columns take: two jobs each.
        let pairs = vars.add(variable().integer().min(0.0).initial(0.0));
        let mut objective = Expression::from(z);
        let mut terms: Vec<(Variable, f64)> = vec![(z, 1.0)];
        let mut used = Expression::from(pairs);
        let mut halves = Expression::from(0.0);
        let mut per_queue: BTreeMap<usize, Expression> = BTreeMap::new();
        let mut rows: Vec<(Expression, Expression)> = Vec::new();
        let mut x: Vec<(usize, u32, Variable)> = Vec::new();
        // Job → its shared-column variable and its row (in `rows`).
        let mut sh: BTreeMap<usize, (Variable, usize)> = BTreeMap::new();
        let mut kept_pairs: Vec<(Variable, Variable, Variable)> = Vec::new();
        let mut warm_value = 0.0;
        for &k in &listed {
            let j = &snap.jobs[k];
            let mut share = Expression::from(0.0);
            let mut one = Expression::from(0.0);
            let mut add = |v: Variable, value: f64, gpus: f64, start: f64| {
                warm_value += start * value / n;
                objective += (value / n) * v;
                terms.push((v, value / n));
                share += value * v;
                one += v;
                if let Some(q) = j.queue {
                    *per_queue.entry(q).or_default() += gpus * v;
                }
            };
            for &(a, value) in &ch[k].alone {
                let start = f64::from(u8::from(
                    warm && a == j.current_gpus && j.shares_with.is_none(),
                ));
                let v = vars.add(variable().binary().initial(start));
                add(v, value, f64::from(a), start);
                used += f64::from(a) * v;
                x.push((k, a, v));
            }
            if let Some(c) = ch[k].shared {
                // A job alone on one GPU stays there (its partner joins);
                // one that shares now stays only beside the same partner
                // (the pair's bonus below).
                let value = if j.current_gpus == 1 && j.shares_with.is_none() {
                    c.stays
                } else {
                    c.moves
                };
                let start = f64::from(u8::from(warm && j.shares_with.is_some()));
                let v = vars.add(variable().binary().initial(start));
                add(v, value, 0.5, start);
                halves += v;
                sh.insert(k, (v, rows.len()));
            }
            rows.push((share, one));
        }
        // A pair that shares now and stays together: both keep their GPU.
        for (&k, &(vk, rk)) in &sh {
            let Some(l) = snap.jobs[k].shares_with.filter(|&l| k < l) else {
                continue;
            };
            let Some(&(vl, rl)) = sh.get(&l) else {
                continue;
            };
            let (Some(ck), Some(cl)) = (ch[k].shared, ch[l].shared) else {
                continue;
            };
            let (bk, bl) = (ck.stays - ck.moves, cl.stays - cl.moves);
            let start = f64::from(u8::from(warm));
            let y = vars.add(variable().binary().initial(start));
            warm_value += start * (bk + bl) / n;
            objective += ((bk + bl) / n) * y;
            terms.push((y, (bk + bl) / n));
            rows[rk].0 += bk * y;
            rows[rl].0 += bl * y;
            kept_pairs.push((y, vk, vl));
        }
        stats.variables = 2 + x.len() + sh.len();
        if x.is_empty() && sh.is_empty() {
            return (Some((vec![0; snap.jobs.len()], Vec::new())), stats);
        }
        let mut model = vars
            .maximise(objective)
            .using(highs)
            .set_time_limit(time_limit_s.max(0.001))
            .set_threads(1)
            // Stop within a tenth of one job's IceShare of the optimum.
            .set_option("mip_abs_gap", 0.1 / n);
        model.set_verbose(false);
        let mut count = 0;
        for (share, one) in rows {
            // Eq. 18's minimum: z ≤ w_k · IceShare_k (w_k = 1), and one
            // allocation per job (zero included).
            model = model.with(Expression::from(z).leq(share));
            model = model.with(one.leq(1.0));
            count += 2;
        }
        // A kept pair needs both on half a GPU.
        for (y, vk, vl) in kept_pairs {
            model = model.with(Expression::from(y).leq(vk));
            model = model.with(Expression::from(y).leq(vl));
            count += 2;
        }
        // Two half-GPU jobs per shared GPU; the cluster's capacity, and
        // each queue's budget.
        model = model.with(halves.leq(2.0 * pairs));
        model = model.with(used.leq(f64::from(capacity)));
        count += 2;
        for (q, e) in per_queue {
            if let Some(&b) = budgets.get(q) {
                model = model.with(e.leq(f64::from(b)));
                count += 1;
            }
        }
        stats.constraints = count;
        let value_of = |s: &dyn Solution| terms.iter().map(|&(v, c)| c * s.value(v)).sum::<f64>();
        let Some(solution) =
            super::solve_usable(model, time_limit_s, |s| value_of(s), warm_value, &mut stats)
        else {
            return (None, stats);
        };
        stats.objective = value_of(&solution);
        (Some(picked(&solution, snap.jobs.len(), &x, &sh)), stats)
    }
}

/// Eq. 18's minimum can exceed 0 only if every job gets something:
/// when even their smallest choices overflow the GPUs, z is 0 in
/// every plan, and leaving it out spares HiGHS a pigeonhole proof
/// (30 jobs on 11 GPUs: the 5 s limit without this, ms with it).
fn z_bound(ch: &[Choices], listed: &[usize], capacity: u32) -> f64 {
    let least: f64 = listed
        .iter()
        .map(|&k| {
            let alone = ch[k]
                .alone
                .first()
                .map_or(f64::INFINITY, |c| f64::from(c.0));
            if ch[k].shared.is_some() {
                alone.min(0.5)
            } else {
                alone
            }
        })
        .sum();
    if least <= f64::from(capacity) {
        1.0
    } else {
        0.0
    }
}

/// The solution's GPUs per job (0: none) and the jobs it put on half a GPU.
fn picked(
    solution: &impl Solution,
    jobs: usize,
    x: &[(usize, u32, Variable)],
    sh: &BTreeMap<usize, (Variable, usize)>,
) -> (Vec<u32>, Vec<usize>) {
    let mut gpus = vec![0u32; jobs];
    for &(k, a, v) in x {
        if solution.value(v) > 0.5 {
            gpus[k] = a;
        }
    }
    let halves = sh
        .iter()
        .filter(|(_, (v, _))| solution.value(*v) > 0.5)
        .map(|(&k, _)| k)
        .collect();
    (gpus, halves)
}

/// Pairs up the jobs the solve put on half a GPU: pairs that share now
/// first (nothing restarts), then in arrival order with the first
/// partner Eq. 8 allows. Returns the pairs and the jobs left alone.
fn pair_up(snap: &Snapshot, halves: &[usize]) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut left: Vec<usize> = halves.to_vec();
    left.sort_by(|&a, &b| {
        let (x, y) = (&snap.jobs[a], &snap.jobs[b]);
        x.submitted_at
            .total_cmp(&y.submitted_at)
            .then(x.id.cmp(&y.id))
    });
    let mut pairs = Vec::new();
    let fits =
        |a: usize, b: usize| may_share(&snap.jobs[a], &snap.jobs[b], share_memory_gib(snap, a, b));
    for &k in halves {
        if let Some(l) = snap.jobs[k].shares_with
            && k < l
            && left.contains(&k)
            && left.contains(&l)
            && fits(k, l)
        {
            left.retain(|&m| m != k && m != l);
            pairs.push((k, l));
        }
    }
    let mut alone = Vec::new();
    while let Some(k) = left.first().copied() {
        left.remove(0);
        match left.iter().position(|&l| fits(k, l)) {
            Some(p) => pairs.push((k, left.remove(p))),
            None => alone.push(k),
        }
    }
    (pairs, alone)
}

/// Greedy plan when a solve fails: running jobs keep what they hold, then
/// waiting jobs in arrival order take their smallest allocation.
fn greedy(snap: &Snapshot, jobs: &[usize], gpus: &mut [u32], free: &mut u32, room: &mut QueueRoom) {
    for &k in jobs {
        let a = snap.jobs[k].current_gpus;
        if gpus[k] == 0
            && a > 0
            && a <= *free
            && room.fits(snap, k, a)
            && usable_allocations(snap, k).contains(&a)
        {
            gpus[k] = a;
            *free -= a;
            room.take(snap, k, a);
        }
    }
    let mut order: Vec<usize> = jobs.to_vec();
    order.sort_by(|&a, &b| {
        let (x, y) = (&snap.jobs[a], &snap.jobs[b]);
        x.submitted_at
            .total_cmp(&y.submitted_at)
            .then(x.id.cmp(&y.id))
    });
    for k in order {
        if gpus[k] > 0 {
            continue;
        }
        if let Some(&a) = usable_allocations(snap, k).first()
            && a <= *free
            && room.fits(snap, k, a)
        {
            gpus[k] = a;
            *free -= a;
            room.take(snap, k, a);
        }
    }
}

/// `total` split in proportion to `weights` (largest remainders).
fn split(total: u32, weights: &[usize]) -> Vec<u32> {
    let sum: usize = weights.iter().sum::<usize>().max(1);
    let exact: Vec<f64> = weights
        .iter()
        .map(|&w| f64::from(total) * w as f64 / sum as f64)
        .collect();
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let mut left = total - out.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    for k in order {
        if left == 0 {
            break;
        }
        out[k] += 1;
        left -= 1;
    }
    out
}

impl Policy for IceFrog {
    fn name(&self) -> &str {
        if self.config.sharing {
            "icefrog"
        } else {
            "icefrog-no-sharing"
        }
    }
    fn interval_s(&self) -> f64 {
        self.config.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let n = snap.jobs.len();
        let ch: Vec<Choices> = (0..n)
            .map(|k| choices(snap, k, self.config.sharing))
            .collect();
        let total = snap.total_gpus();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&snap.jobs[a], &snap.jobs[b]);
            x.submitted_at
                .total_cmp(&y.submitted_at)
                .then(x.id.cmp(&y.id))
        });
        let parts = match self.config.partition_jobs {
            0 => 1,
            p => n.div_ceil(p).max(1),
        };
        let members: Vec<Vec<usize>> = (0..parts)
            .map(|p| order.iter().copied().skip(p).step_by(parts).collect())
            .collect();
        let sizes: Vec<usize> = members.iter().map(Vec::len).collect();
        let caps = split(total, &sizes);
        // Each queue's budget split like the GPUs.
        let budgets: Vec<Vec<u32>> = {
            let per_queue: Vec<Vec<u32>> =
                snap.queue_gpus.iter().map(|&b| split(b, &sizes)).collect();
            (0..parts)
                .map(|p| per_queue.iter().map(|v| v[p]).collect())
                .collect()
        };
        let solved: Vec<Solved> = if parts == 1 {
            let limit = self.config.time_limit_s;
            vec![self.solve(snap, &ch, &members[0], caps[0], &budgets[0], limit)]
        } else {
            let threads = parts.min(4);
            // Each part gets a fixed share of the round's limit: the parts
            // run `threads` at a time, so the round stays within it.
            let limit = self.config.time_limit_s * threads as f64 / parts as f64;
            let mut out: Vec<Option<Solved>> = (0..parts).map(|_| None).collect();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (ch, members, caps, budgets) = (&ch, &members, &caps, &budgets);
                        s.spawn(move || {
                            (t..parts)
                                .step_by(threads)
                                .map(|p| {
                                    let b = &budgets[p];
                                    (p, self.solve(snap, ch, &members[p], caps[p], b, limit))
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                for h in handles {
                    for (p, r) in h.join().expect("an IceShare part panicked") {
                        out[p] = Some(r);
                    }
                }
            });
            out.into_iter()
                .map(|r| r.expect("every part solved"))
                .collect()
        };
        let mut gpus = vec![0u32; n];
        let mut halves: Vec<usize> = Vec::new();
        let mut stats = SolveStats {
            partitions: if parts > 1 { parts } else { 0 },
            ..Default::default()
        };
        let mut failed: Vec<usize> = Vec::new();
        for (p, (r, st)) in solved.into_iter().enumerate() {
            stats.variables += st.variables;
            stats.constraints += st.constraints;
            stats.objective += st.objective;
            stats.abandoned |= st.abandoned;
            match r {
                Some((g, h)) => {
                    for &k in &members[p] {
                        gpus[k] = g[k];
                    }
                    halves.extend(h);
                }
                None => {
                    stats.fallback = true;
                    failed.extend(&members[p]);
                }
            }
        }
        let (pairs, alone) = pair_up(snap, &halves);
        stats.candidate_pairs = pairs.len();
        let mut free = total
            .saturating_sub(gpus.iter().sum::<u32>())
            .saturating_sub(pairs.len() as u32);
        // A half-GPU job without a partner runs alone on the GPU its pair
        // would have taken, where one is left.
        for k in alone {
            if free > 0 {
                gpus[k] = 1;
                free -= 1;
            }
        }
        // Failed parts fall back greedily, then leftovers go to waiting jobs.
        let mut plan = Plan::default();
        for &(k, l) in &pairs {
            plan.entries.push(PlanEntry {
                jobs: vec![k, l],
                mode: MergeMode::Shared,
                gpus: 1,
                placement: Vec::new(),
            });
        }
        plan.entries.extend(
            (0..n)
                .filter(|&k| gpus[k] > 0)
                .map(|k| PlanEntry::single(k, gpus[k])),
        );
        let mut room = QueueRoom::new(snap, &plan);
        let in_pairs: Vec<usize> = pairs.iter().flat_map(|&(k, l)| [k, l]).collect();
        let rest: Vec<usize> = if parts > 1 { order.clone() } else { failed };
        let rest: Vec<usize> = rest
            .into_iter()
            .filter(|k| !in_pairs.contains(k) && gpus[*k] == 0)
            .collect();
        let before = gpus.clone();
        greedy(snap, &rest, &mut gpus, &mut free, &mut room);
        plan.entries.extend(
            rest.iter()
                .filter(|&&k| before[k] == 0 && gpus[k] > 0)
                .map(|&k| PlanEntry::single(k, gpus[k])),
        );
        plan.entries.sort_by_key(|e| e.jobs[0]);
        plan.stats = stats;
        plan
    }
}

/// Lucid-style sharing without elasticity (see the module docs).
#[derive(Clone, Debug)]
pub struct Lucid {
    pub interval_s: f64,
}

impl Default for Lucid {
    fn default() -> Self {
        // Lucid schedules on events; a minute keeps starts prompt.
        Self { interval_s: 60.0 }
    }
}

impl Policy for Lucid {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "lucid"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let n = snap.jobs.len();
        let mut plan = Plan::default();
        let mut free = snap.total_gpus();
        let mut placed = vec![false; n];
        // Running jobs keep their GPUs; pairs that share stay paired while
        // Eq. 8 still allows it.
        for k in 0..n {
            let j = &snap.jobs[k];
            if j.current_gpus == 0 || placed[k] {
                continue;
            }
            match j.shares_with {
                Some(l)
                    if may_share(j, &snap.jobs[l], share_memory_gib(snap, k, l)) && free >= 1 =>
                {
                    placed[k] = true;
                    placed[l] = true;
                    free -= 1;
                    plan.entries.push(PlanEntry {
                        jobs: vec![k, l],
                        mode: MergeMode::Shared,
                        gpus: 1,
                        placement: Vec::new(),
                    });
                }
                _ if j.current_gpus <= free => {
                    placed[k] = true;
                    free -= j.current_gpus;
                    plan.entries.push(PlanEntry::single(k, j.current_gpus));
                }
                _ => {}
            }
        }
        // Waiting jobs, shortest estimated first, where GPUs are free.
        let mut order: Vec<usize> = (0..n).filter(|&k| !placed[k]).collect();
        let at_request =
            |k: usize| requested_allocation(snap, k).map_or(f64::INFINITY, |a| snap.time_at(k, a));
        order.sort_by(|&a, &b| {
            at_request(a)
                .total_cmp(&at_request(b))
                .then(snap.jobs[a].id.cmp(&snap.jobs[b].id))
        });
        let mut room = QueueRoom::new(snap, &plan);
        for &k in &order {
            let Some(a) = requested_allocation(snap, k) else {
                continue;
            };
            if a <= free && room.fits(snap, k, a) {
                free -= a;
                room.take(snap, k, a);
                placed[k] = true;
                plan.entries.push(PlanEntry::single(k, a));
            }
        }
        // Indolent packing: a one-GPU job that found no free GPU joins a
        // running one-GPU job alone on its GPU, least summed utilisation.
        let util = |k: usize| snap.jobs[k].footprint.map_or(100.0, |f| f.utilization_pct);
        for &k in &order {
            if placed[k] || requested_allocation(snap, k) != Some(1) || !room.fits(snap, k, 1) {
                continue;
            }
            let host = plan
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.mode == MergeMode::Normal && e.gpus == 1)
                .map(|(p, e)| (p, e.jobs[0]))
                .filter(|&(_, h)| snap.jobs[h].current_gpus == 1)
                .filter(|&(_, h)| {
                    may_share(&snap.jobs[h], &snap.jobs[k], share_memory_gib(snap, h, k))
                })
                .min_by(|a, b| util(a.1).total_cmp(&util(b.1)).then(a.1.cmp(&b.1)));
            if let Some((p, h)) = host {
                room.take(snap, k, 1);
                placed[k] = true;
                plan.entries[p] = PlanEntry {
                    jobs: vec![h, k],
                    mode: MergeMode::Shared,
                    gpus: 1,
                    placement: Vec::new(),
                };
            }
        }
        plan.entries.sort_by_key(|e| e.jobs[0]);
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{cluster, job, linear_times};
    use super::super::{GpuFootprint, ymir_allocations};
    use super::*;

    fn footprint(memory_gib: f64, utilization_pct: f64) -> Option<GpuFootprint> {
        Some(GpuFootprint {
            memory_gib,
            utilization_pct,
        })
    }

    /// `n` one-GPU-capable jobs of `work` GPU-seconds each on `nodes` × `gpus`
    /// GPUs of 80 GiB, each taking 20 GiB and 40 % of a GPU alone.
    fn snap(nodes: usize, gpus: u32, n: usize, work: f64) -> Snapshot {
        let allocations = ymir_allocations(8);
        let jobs = (0..n)
            .map(|i| {
                let mut j = job(&format!("j{i}"), work, 1, &allocations);
                j.max_gpus = 8;
                j.submitted_at = i as f64;
                j.footprint = footprint(20.0, 40.0);
                j
            })
            .collect();
        let mut s = cluster(nodes, gpus, jobs);
        s.now = 100.0;
        s
    }

    fn gpus_of(plan: &Plan, k: usize) -> Option<(u32, MergeMode)> {
        plan.entries
            .iter()
            .find(|e| e.jobs.contains(&k))
            .map(|e| (e.gpus, e.mode))
    }

    #[test]
    fn eq_8_shares_only_what_fits_memory_and_utilisation() {
        let mut s = snap(1, 1, 2, 3600.0);
        assert!(may_share(&s.jobs[0], &s.jobs[1], 80.0));
        // 1.1 × (20 + 20) = 44 GiB does not fit 40 GiB.
        assert!(!may_share(&s.jobs[0], &s.jobs[1], 40.0));
        // 1.1 × (20 + 20) = 44 fits 44, not 43.9.
        assert!(may_share(&s.jobs[0], &s.jobs[1], 44.0 + 1e-9));
        assert!(!may_share(&s.jobs[0], &s.jobs[1], 43.9));
        s.jobs[1].footprint = footprint(20.0, 61.0);
        assert!(
            !may_share(&s.jobs[0], &s.jobs[1], 80.0),
            "101 % utilisation"
        );
        s.jobs[1].footprint = None;
        assert!(
            !may_share(&s.jobs[0], &s.jobs[1], 80.0),
            "unknown footprint"
        );
        s.jobs[1].footprint = footprint(20.0, 40.0);
        s.jobs[1].min_gpus = 2;
        assert!(!may_share(&s.jobs[0], &s.jobs[1], 80.0), "needs two GPUs");
        s.jobs[1].min_gpus = 1;
        assert!(
            !may_share(&s.jobs[0], &s.jobs[1], 0.0),
            "unknown GPU memory"
        );
    }

    #[test]
    fn iceshare_gives_a_waiting_job_a_shared_gpu_rather_than_nothing() {
        // Three one-GPU-capable jobs, two GPUs: without sharing one waits;
        // with it all three run and the plan is consistent.
        let s = snap(1, 2, 3, 3600.0);
        let p = IceFrog::default().schedule(&s);
        p.consistency_check(&s).unwrap();
        for k in 0..3 {
            assert!(gpus_of(&p, k).is_some(), "job {k} waits: {p:?}");
        }
        assert_eq!(
            p.entries
                .iter()
                .filter(|e| e.mode == MergeMode::Shared)
                .count(),
            1
        );
        let alone = IceFrog::new(IceFrogConfig {
            sharing: false,
            ..Default::default()
        })
        .schedule(&s);
        alone.consistency_check(&s).unwrap();
        assert_eq!((0..3).filter(|&k| gpus_of(&alone, k).is_none()).count(), 1);
    }

    #[test]
    fn iceshare_never_puts_two_jobs_over_a_gpus_memory() {
        let mut s = snap(1, 2, 3, 3600.0);
        for j in &mut s.jobs {
            j.footprint = footprint(45.0, 30.0); // 1.1 × 90 > 80 GiB
        }
        let p = IceFrog::default().schedule(&s);
        p.consistency_check(&s).unwrap();
        assert!(p.entries.iter().all(|e| e.mode != MergeMode::Shared));
        let p = Lucid::default().schedule(&s);
        assert!(p.entries.iter().all(|e| e.mode != MergeMode::Shared));
    }

    #[test]
    fn iceshare_evens_out_the_slowdown_when_everyone_can_run() {
        // Two jobs, 4 GPUs, one job scales linearly and one not at all:
        // the max-min gives the scalable one the GPUs the other cannot use.
        let mut s = snap(1, 4, 2, 3600.0);
        s.jobs[1].remaining_s = s
            .allocations
            .iter()
            .map(|&a| if a == 0 { f64::INFINITY } else { 3600.0 })
            .collect();
        for j in &mut s.jobs {
            j.footprint = None;
        }
        let p = IceFrog::default().schedule(&s);
        p.consistency_check(&s).unwrap();
        assert_eq!(gpus_of(&p, 0), Some((3, MergeMode::Normal)));
        assert_eq!(gpus_of(&p, 1), Some((1, MergeMode::Normal)));
    }

    #[test]
    fn iceshare_max_min_alone_is_blind_when_jobs_outnumber_gpus() {
        // Three jobs, no sharing, two GPUs: some job gets 0 whatever the
        // plan, so min_k IceShare_k = 0 for every plan, running nobody
        // included. The mean term makes the solver run two jobs.
        let mut s = snap(1, 2, 3, 3600.0);
        for j in &mut s.jobs {
            j.footprint = None;
        }
        let ch: Vec<Choices> = (0..3).map(|k| choices(&s, k, false)).collect();
        let min_of = |g: &[u32]| {
            (0..3)
                .map(|k| {
                    ch[k]
                        .alone
                        .iter()
                        .find(|c| c.0 == g[k])
                        .map_or(0.0, |c| c.1)
                })
                .fold(f64::INFINITY, f64::min)
        };
        assert_eq!(
            min_of(&[0, 0, 0]),
            min_of(&[1, 1, 0]),
            "the printed Eq. 18 cannot tell them apart"
        );
        let p = IceFrog::default().schedule(&s);
        assert_eq!(p.entries.iter().map(|e| e.gpus).sum::<u32>(), 2);
    }

    #[test]
    fn iceshare_keeps_a_running_pair_and_counts_its_restart() {
        // Job 0 and 1 share GPU 0 now; job 2 runs alone. Nothing changed:
        // the plan keeps the pair (restarts would cost more than a move
        // gains).
        let mut s = snap(1, 2, 3, 36_000.0);
        for k in 0..3 {
            s.jobs[k].restart_s = 600.0;
            s.jobs[k].current_gpus = 1;
        }
        s.jobs[0].current_placement = vec![(0, 1)];
        s.jobs[1].current_placement = vec![(0, 1)];
        s.jobs[2].current_placement = vec![(0, 1)];
        s.jobs[0].shares_with = Some(1);
        s.jobs[1].shares_with = Some(0);
        let p = IceFrog::default().schedule(&s);
        p.consistency_check(&s).unwrap();
        assert_eq!(gpus_of(&p, 0), Some((1, MergeMode::Shared)));
        assert_eq!(gpus_of(&p, 2), Some((1, MergeMode::Normal)));
    }

    #[test]
    fn partitioned_iceshare_uses_the_cluster_and_stays_consistent() {
        let s = snap(8, 4, 90, 7200.0);
        let p = IceFrog::new(IceFrogConfig {
            partition_jobs: 30,
            ..Default::default()
        })
        .schedule(&s);
        p.consistency_check(&s).unwrap();
        assert_eq!(p.stats.partitions, 3);
        let used: u32 = p.entries.iter().map(|e| e.gpus).sum();
        assert_eq!(used, 32, "{:?}", p.stats);
    }

    #[test]
    fn lucid_packs_only_when_the_cluster_is_full() {
        // Two GPUs, job 0 runs on one; jobs 1 and 2 wait. Job 1 takes the
        // free GPU, job 2 is packed onto a running one-GPU job's GPU.
        let mut s = snap(1, 2, 3, 3600.0);
        s.jobs[0].current_gpus = 1;
        s.jobs[0].current_placement = vec![(0, 1)];
        let p = Lucid::default().schedule(&s);
        p.consistency_check(&s).unwrap();
        assert_eq!(gpus_of(&p, 1), Some((1, MergeMode::Normal)));
        assert_eq!(gpus_of(&p, 2), Some((1, MergeMode::Shared)));
        assert_eq!(gpus_of(&p, 0), Some((1, MergeMode::Shared)));
        // With a GPU to spare nothing is packed.
        let mut roomy = s.clone();
        roomy.nodes[0].gpus = 3;
        let p = Lucid::default().schedule(&roomy);
        assert!(p.entries.iter().all(|e| e.mode == MergeMode::Normal));
        let _ = linear_times(&s.allocations, 1.0);
    }
}
