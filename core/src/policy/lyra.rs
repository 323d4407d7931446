//! Lyra (thesis 002, Ch. 3): capacity loaned from an inference cluster,
//! elastic jobs, reclaim that preempts the fewest jobs, and a two-phase
//! allocation.
//!
//! **Elastic jobs.** A job's *base demand* is its requested allocation
//! ([`requested_allocation`]) — inelastic in nature, gang-scheduled, never
//! touched by the elastic phase; its *flexible demand* is anything above
//! that up to its maximum (the usable allocations past the base). A job
//! whose maximum is its request is inelastic. Flexible workers join and
//! leave at checkpoint boundaries: a changed size restarts the job's
//! process group from its checkpoint with the new world size (the global
//! batch kept), which costs the job its `restart_s`.
//!
//! **Loaned nodes** ([`super::NodeCap::loaned`]) are inference servers on
//! loan. Elastic jobs prefer them and inelastic jobs prefer training
//! nodes (§3.5.3); an elastic job's base and flexible GPUs go on separate
//! node groups, so a reclaim can take the flexible group first without a
//! preemption.
//!
//! **Reclaim** ([`reclaim`], §3.4): which loaned servers to return when the
//! inference side asks for `N_R` of them. Returning a server removes every
//! worker on it; a job that keeps at least its base demand elsewhere only
//! scales in, any other job is preempted (from its checkpoint) on every
//! server it spans. Lyra's greedy takes, one server at a time, the one with
//! the smallest preemption cost `c_s = Σ_{j ∈ J(s)} 1/|S_j|` (J(s): the
//! jobs returning `s` would preempt; |S_j|: the loaned servers `j` spans —
//! Table 3.1's "sum of the job's server fractions"), preempts those jobs,
//! recomputes, and repeats. Servers that only hold flexible workers (or
//! nothing) cost 0 and go first. Ties go to the least *collateral*: GPUs
//! the preemptions free on servers that still hold other work afterwards
//! then the fewest GPUs of the preempted jobs (the thesis names collateral
//! damage as the tie-break without defining it for the pick; freed GPUs on a server that empties are not excess,
//! since that server is then returned at no cost — with the plain "GPUs
//! freed elsewhere" the Fig. 3.5 example picks servers 4 and 6 and
//! preempts two jobs instead of one, see the test). When one server is
//! needed every server is scanned for the fewest preemptions (§3.4).
//! Baselines: Random and SCF (smallest job count first, §3.7.1), and an
//! exhaustive search for the tests and the simulator's comparison.
//!
//! **Allocation** ([`Lyra`], §3.5.2): phase 1, shortest job first over the
//! base demands of waiting jobs (running jobs keep theirs: Lyra does not
//! preempt outside a reclaim), skipping a job that does not fit (no
//! head-of-line blocking); phase 2, a multiple-choice knapsack
//! ([`knapsack`]) over the flexible workers of every elastic job that holds
//! its base, solved by dynamic programming: a group per job, an item per
//! size `base + k` weighing its `k` extra GPUs and worth its JCT reduction.
//! The thesis values item `k` as `W_j (1/w_min − 1/(w_min + k))` under
//! linear scaling (Fig. 3.6); here it is `T_j(base) − T_j(base + k)` from
//! the round's estimates, which is the same number when scaling is linear
//! (tested on Fig. 3.6) and the right one when it is not, less the job's
//! restart cost when the size changes for a running job.

use std::collections::BTreeSet;

use super::placement::{self, Preference};
use super::{
    Plan, PlanEntry, Policy, QueueRoom, Snapshot, by_priority, nearest_request,
    requested_allocation, usable_allocations,
};

/// The Lyra two-phase policy.
#[derive(Clone, Debug)]
pub struct Lyra {
    pub interval_s: f64,
}

impl Default for Lyra {
    fn default() -> Self {
        // Lyra schedules "periodically ... in high frequency" (§3.5.2) and
        // its orchestrator every five minutes (§3.7.1): a minute here, as
        // for the other non-preemptive policies.
        Self { interval_s: 60.0 }
    }
}

/// A job's base demand in GPUs (its requested allocation), if it can run.
pub fn base_gpus(snap: &Snapshot, i: usize) -> Option<u32> {
    requested_allocation(snap, i)
}

/// A job's demand: its base (GPUs) and whether it has flexible demand (a
/// usable allocation above the base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Demand {
    base: u32,
    elastic: bool,
}

/// Every job's demand, once a round (None: it cannot run).
fn demands(snap: &Snapshot) -> Vec<Option<Demand>> {
    (0..snap.jobs.len())
        .map(|i| {
            let usable = usable_allocations(snap, i);
            let base = nearest_request(&usable, snap.jobs[i].requested_gpus)?;
            Some(Demand {
                base,
                elastic: usable.iter().any(|&a| a > base),
            })
        })
        .collect()
}

/// The base of job `i` under `d`, if it has flexible demand.
fn elastic_base(d: &[Option<Demand>], i: usize) -> Option<u32> {
    d[i].filter(|d| d.elastic).map(|d| d.base)
}

impl Policy for Lyra {
    fn name(&self) -> &str {
        "lyra"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    /// Flexible workers join one at a time: every count up to the maximum.
    fn allocation_set(&self, max_gpus: u32) -> Vec<u32> {
        (0..=max_gpus).collect()
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        allocate_two_phase(snap, &demands(snap))
    }
    fn schedule(&self, snap: &Snapshot) -> Plan {
        let d = demands(snap);
        let mut plan = allocate_two_phase(snap, &d);
        let loaned = snap.nodes.iter().any(|n| n.loaned);
        let prefer = |e: &PlanEntry| {
            let flexible = elastic_base(&d, e.jobs[0]);
            Preference {
                // §3.5.3: elastic jobs on inference servers, inelastic ones
                // on training servers, as far as they fit.
                loaned: Some(flexible.is_some()),
                // Base and flexible demand on separate node groups — only
                // worth the spread when some nodes can be reclaimed.
                split_base: flexible.filter(|&b| loaned && b < e.gpus),
            }
        };
        // The knapsack counts GPUs, not node shapes: a size whose workers
        // fit in number but not on the nodes' free GPUs would leave the job
        // out altogether (a running one suspended). Such an elastic job
        // falls back to its base and the plan is placed again.
        loop {
            let placed = placement::place_with(snap, plan.clone(), &prefer);
            let mut shrunk = false;
            for e in plan.entries.iter_mut() {
                let i = e.jobs[0];
                let out = !placed.entries.iter().any(|p| p.jobs[0] == i);
                if let Some(b) = d[i].map(|d| d.base).filter(|&b| out && b < e.gpus) {
                    e.gpus = b;
                    shrunk = true;
                }
            }
            if !shrunk {
                return placed;
            }
        }
    }
}

/// Lyra's two phases over the jobs' demands `d` ([`demands`]).
fn allocate_two_phase(snap: &Snapshot, d: &[Option<Demand>]) -> Plan {
    let mut plan = Plan::default();
    let mut free = snap.total_gpus();
    let mut room = QueueRoom::new(snap, &plan);
    // Phase 1a: running jobs keep their base (inelastic: what they hold).
    for (i, j) in snap.jobs.iter().enumerate() {
        if j.current_gpus == 0 {
            continue;
        }
        let keep = match elastic_base(d, i) {
            Some(b) => b.min(j.current_gpus),
            None => j.current_gpus,
        };
        if keep <= free && room.fits(snap, i, keep) {
            free -= keep;
            room.take(snap, i, keep);
            plan.entries.push(PlanEntry::single(i, keep));
        }
    }
    // Phase 1b: SJF over waiting jobs' base demands, skipping what does
    // not fit (§3.5.2: "If the demand of j* exceeds the remaining
    // capacity, we remove it from the pool and continue").
    let mut order: Vec<(f64, usize)> = (0..snap.jobs.len())
        .filter(|&i| snap.jobs[i].current_gpus == 0)
        .filter_map(|i| d[i].map(|d| (snap.time_at(i, d.base), i)))
        .collect();
    order.sort_by(|x, y| {
        x.0.total_cmp(&y.0)
            .then(
                snap.jobs[x.1]
                    .submitted_at
                    .total_cmp(&snap.jobs[y.1].submitted_at),
            )
            .then(snap.jobs[x.1].id.cmp(&snap.jobs[y.1].id))
    });
    let mut order: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
    by_priority(snap, &mut order);
    for i in order {
        let Some(b) = d[i].map(|d| d.base) else {
            continue;
        };
        if b <= free && room.fits(snap, i, b) {
            free -= b;
            room.take(snap, i, b);
            plan.entries.push(PlanEntry::single(i, b));
        }
    }
    // Phase 2: the flexible workers, a multiple-choice knapsack over
    // the GPUs left.
    // (plan entry, its items: (size, extra GPUs, value)).
    type Item = (u32, u32, f64);
    let mut groups: Vec<(usize, Vec<Item>)> = Vec::new();
    for (k, e) in plan.entries.iter().enumerate() {
        let i = e.jobs[0];
        if elastic_base(d, i).is_none() {
            continue;
        }
        let j = &snap.jobs[i];
        let base = e.gpus;
        let t_base = snap.time_at(i, base);
        // A running job whose size changes restarts from its checkpoint.
        let change = |a: u32| {
            if j.current_gpus > 0 && a != j.current_gpus {
                j.restart_s
            } else {
                0.0
            }
        };
        let mut items = vec![(base, 0, -change(base))];
        for a in usable_allocations(snap, i) {
            if a <= base || a - base > free || !room.fits(snap, i, a) {
                continue;
            }
            // §3.5.2 / Fig. 3.6: the item's value is its JCT reduction.
            let value = t_base - snap.time_at(i, a) - change(a);
            items.push((a, a - base, value));
        }
        if items.len() > 1 || items[0].2 != 0.0 {
            groups.push((k, items));
        }
    }
    let choice = knapsack(
        &groups
            .iter()
            .map(|(_, items)| items.iter().map(|&(_, w, v)| (w, v)).collect())
            .collect::<Vec<_>>(),
        free,
    );
    for ((k, items), c) in groups.iter().zip(choice.items) {
        plan.entries[*k].gpus = items[c].0;
    }
    plan.entries.sort_by_key(|e| e.jobs[0]);
    plan
}

/// Gandiva-style elasticity, Lyra's baseline (§3.7.1): jobs in arrival
/// order at their base demand (running jobs keep theirs; later, smaller
/// jobs fill in), and only when no job waits do elastic jobs scale out
/// over the idle GPUs — first back to the size they run at, then a worker
/// at a time, oldest first ("scaling out jobs to utilize the remaining
/// resources ... when there are available resources but no pending jobs").
#[derive(Clone, Debug)]
pub struct Gandiva {
    pub interval_s: f64,
}

impl Default for Gandiva {
    fn default() -> Self {
        Self { interval_s: 60.0 }
    }
}

impl Policy for Gandiva {
    fn name(&self) -> &str {
        "gandiva"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocation_set(&self, max_gpus: u32) -> Vec<u32> {
        (0..=max_gpus).collect()
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut plan = Plan::default();
        let mut free = snap.total_gpus();
        let mut room = QueueRoom::new(snap, &plan);
        let mut order = super::baselines::by_arrival(snap);
        // Running jobs first (they are not preempted), then the queue.
        order.sort_by_key(|&i| snap.jobs[i].current_gpus == 0);
        let d = demands(snap);
        let mut waiting = false;
        for i in order {
            let j = &snap.jobs[i];
            let Some(b) = d[i].map(|d| d.base) else {
                continue;
            };
            let b = if j.current_gpus > 0 {
                b.min(j.current_gpus)
            } else {
                b
            };
            if b <= free && room.fits(snap, i, b) {
                free -= b;
                room.take(snap, i, b);
                plan.entries.push(PlanEntry::single(i, b));
            } else if j.current_gpus == 0 {
                waiting = true;
            }
        }
        if !waiting {
            let usable: Vec<Vec<u32>> = plan
                .entries
                .iter()
                .map(|e| usable_allocations(snap, e.jobs[0]))
                .collect();
            // Back to the size they run at, where it is still free.
            for (e, u) in plan.entries.iter_mut().zip(&usable) {
                let cur = snap.jobs[e.jobs[0]].current_gpus;
                if cur > e.gpus && cur - e.gpus <= free && u.contains(&cur) {
                    free -= cur - e.gpus;
                    e.gpus = cur;
                }
            }
            // Then one step at a time, oldest first, while GPUs are idle.
            loop {
                let mut grew = false;
                for (e, u) in plan.entries.iter_mut().zip(&usable) {
                    if let Some(&next) = u.iter().find(|&&a| a > e.gpus)
                        && next - e.gpus <= free
                        && elastic_base(&d, e.jobs[0]).is_some()
                    {
                        free -= next - e.gpus;
                        e.gpus = next;
                        grew = true;
                    }
                }
                if !grew {
                    break;
                }
            }
        }
        plan.entries.sort_by_key(|e| e.jobs[0]);
        plan
    }
}

/// The multiple-choice knapsack's answer: the item picked in each group.
#[derive(Clone, Debug, PartialEq)]
pub struct KnapsackChoice {
    pub items: Vec<usize>,
    pub value: f64,
}

/// Multiple-choice knapsack by dynamic programming (Sinha & Zoltners,
/// thesis [138]; Lyra §3.5.2): exactly one item `(weight, value)` from
/// every group, total weight at most `capacity`, total value maximal.
/// Every group must hold a weight-0 item (its "nothing more"), so a
/// solution always exists. Ties go to the lighter, then earlier item.
/// `O(capacity · items)` time and `O(capacity · groups)` memory.
pub fn knapsack(groups: &[Vec<(u32, f64)>], capacity: u32) -> KnapsackChoice {
    let cap = capacity as usize;
    // best[c]: the best value of the groups so far within weight c.
    let mut best = vec![0.0f64; cap + 1];
    let mut pick: Vec<Vec<u32>> = Vec::with_capacity(groups.len());
    for items in groups {
        let mut next = vec![f64::NEG_INFINITY; cap + 1];
        let mut chose = vec![u32::MAX; cap + 1];
        for c in 0..=cap {
            for (k, &(w, v)) in items.iter().enumerate() {
                let w = w as usize;
                if w > c || !best[c - w].is_finite() {
                    continue;
                }
                let val = best[c - w] + v;
                if val > next[c] {
                    next[c] = val;
                    chose[c] = k as u32;
                }
            }
        }
        best = next;
        pick.push(chose);
    }
    let mut c = cap;
    let value = best[cap];
    let mut items = vec![0usize; groups.len()];
    for g in (0..groups.len()).rev() {
        let k = pick[g][c];
        if k == u32::MAX {
            // Unreachable when every group has a weight-0 item.
            items[g] = groups[g].iter().position(|it| it.0 == 0).unwrap_or(0);
            continue;
        }
        items[g] = k as usize;
        c -= groups[g][k as usize].0 as usize;
    }
    KnapsackChoice { items, value }
}

/// One loaned server as a reclaim sees it: the GPUs each job holds there.
#[derive(Clone, Debug, PartialEq)]
pub struct LoanedServer {
    pub id: String,
    /// (job, GPUs) for every job with workers on it.
    pub holds: Vec<(usize, u32)>,
}

/// One job with workers on loaned servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimJob {
    /// GPUs it holds in all (training nodes included).
    pub gpus: u32,
    /// The fewest GPUs it can keep running on: its base demand (inelastic
    /// jobs: all of them).
    pub base: u32,
}

/// What a reclaim must choose from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReclaimInput {
    pub servers: Vec<LoanedServer>,
    pub jobs: Vec<ReclaimJob>,
}

/// How to pick the servers to return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimRule {
    /// Lyra's greedy on the server preemption cost (§3.4).
    Lyra,
    /// Servers at random (seeded).
    Random(u64),
    /// Smallest job count first (§3.7.1's SCF).
    Scf,
    /// Every subset of the needed size (fewest preemptions, then least
    /// collateral): for tests and comparisons on small instances only.
    Exhaustive,
}

impl ReclaimRule {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "lyra" => Ok(Self::Lyra),
            "random" => Ok(Self::Random(1)),
            "scf" => Ok(Self::Scf),
            "exhaustive" => Ok(Self::Exhaustive),
            _ => Err(format!(
                "unknown reclaim rule {s:?}; expected lyra, random, scf or exhaustive"
            )),
        }
    }
}

/// A reclaim's decision and its cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReclaimOutcome {
    /// Servers returned (indices into [`ReclaimInput::servers`]), sorted.
    pub servers: Vec<usize>,
    /// Jobs preempted (removed everywhere, resumed from their checkpoints).
    pub preempted: Vec<usize>,
    /// Jobs that only scale in: (job, GPUs they give up).
    pub scaled_in: Vec<(usize, u32)>,
    /// GPUs the preemptions free on servers that are not returned (the
    /// thesis' collateral damage: vacated beyond the demand).
    pub collateral_gpus: u32,
}

impl ReclaimInput {
    /// The input over the loaned `servers` (ids, in order) from the parts
    /// jobs hold there — `(server index, job key, GPUs)`, repeats summed —
    /// and `job(key)`, each job's GPUs in all and its base. Only jobs with
    /// a part on a loaned server enter; their keys come back in the
    /// input's job order.
    pub fn from_parts<K: Copy + PartialEq>(
        servers: Vec<String>,
        parts: impl IntoIterator<Item = (usize, K, u32)>,
        job: impl Fn(K) -> ReclaimJob,
    ) -> (Self, Vec<K>) {
        let mut input = ReclaimInput {
            servers: servers
                .into_iter()
                .map(|id| LoanedServer {
                    id,
                    holds: Vec::new(),
                })
                .collect(),
            jobs: Vec::new(),
        };
        let mut keys: Vec<K> = Vec::new();
        for (s, key, g) in parts {
            if g == 0 || s >= input.servers.len() {
                continue;
            }
            let j = match keys.iter().position(|&k| k == key) {
                Some(j) => j,
                None => {
                    keys.push(key);
                    input.jobs.push(job(key));
                    keys.len() - 1
                }
            };
            let holds = &mut input.servers[s].holds;
            match holds.iter_mut().find(|h| h.0 == j) {
                Some(h) => h.1 += g,
                None => holds.push((j, g)),
            }
        }
        (input, keys)
    }

    /// What returning exactly `chosen` does.
    pub fn outcome(&self, chosen: &[usize]) -> ReclaimOutcome {
        let set: BTreeSet<usize> = chosen.iter().copied().collect();
        let mut lost = vec![0u32; self.jobs.len()];
        for &s in &set {
            for &(j, g) in &self.servers[s].holds {
                lost[j] += g;
            }
        }
        let mut out = ReclaimOutcome {
            servers: set.iter().copied().collect(),
            ..Default::default()
        };
        for (j, job) in self.jobs.iter().enumerate() {
            if lost[j] == 0 {
                continue;
            }
            if job.gpus.saturating_sub(lost[j]) < job.base.max(1) {
                out.preempted.push(j);
            } else {
                out.scaled_in.push((j, lost[j]));
            }
        }
        for (s, server) in self.servers.iter().enumerate() {
            if set.contains(&s) {
                continue;
            }
            out.collateral_gpus += server
                .holds
                .iter()
                .filter(|(j, _)| out.preempted.binary_search(j).is_ok())
                .map(|p| p.1)
                .sum::<u32>();
        }
        out
    }
}

/// Picks `need` servers to return by `rule` (all of them when fewer are
/// loaned).
pub fn reclaim(input: &ReclaimInput, need: usize, rule: ReclaimRule) -> ReclaimOutcome {
    let n = input.servers.len();
    if need >= n {
        return input.outcome(&(0..n).collect::<Vec<_>>());
    }
    if need == 0 {
        return ReclaimOutcome::default();
    }
    let chosen = match rule {
        ReclaimRule::Lyra => lyra_pick(input, need),
        ReclaimRule::Random(seed) => {
            // Fisher–Yates on a splitmix64 stream: deterministic per seed.
            let mut state = seed;
            let mut next = move || {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                super::splitmix64(state)
            };
            let mut all: Vec<usize> = (0..n).collect();
            for k in (1..n).rev() {
                all.swap(k, (next() % (k as u64 + 1)) as usize);
            }
            all.truncate(need);
            all
        }
        ReclaimRule::Scf => {
            let mut all: Vec<usize> = (0..n).collect();
            all.sort_by_key(|&s| (input.servers[s].holds.len(), s));
            all.truncate(need);
            all
        }
        ReclaimRule::Exhaustive => exhaustive(input, need),
    };
    input.outcome(&chosen)
}

/// Lyra's greedy (§3.4).
fn lyra_pick(input: &ReclaimInput, need: usize) -> Vec<usize> {
    let n = input.servers.len();
    if need == 1 {
        // One server: scan them all for the fewest preemptions.
        return (0..n)
            .min_by_key(|&s| {
                let o = input.outcome(&[s]);
                (
                    o.preempted.len(),
                    o.collateral_gpus,
                    o.scaled_in.iter().map(|p| p.1).sum::<u32>(),
                    s,
                )
            })
            .into_iter()
            .collect();
    }
    // The state as servers are taken: what each job still holds, and on
    // which servers.
    let mut holds: Vec<Vec<(usize, u32)>> = input.servers.iter().map(|s| s.holds.clone()).collect();
    let mut gpus: Vec<u32> = input.jobs.iter().map(|j| j.gpus).collect();
    let mut taken = vec![false; n];
    let mut chosen = Vec::with_capacity(need);
    while chosen.len() < need {
        let spans = |j: usize, holds: &[Vec<(usize, u32)>]| {
            (0..n)
                .filter(|&s| !taken[s] && holds[s].iter().any(|p| p.0 == j))
                .count()
                .max(1)
        };
        // (cost, (collateral, victims' GPUs, scaled-in GPUs, server)).
        type Key = (f64, (u32, u32, u32, usize));
        let mut best: Option<(Key, usize, Vec<usize>)> = None;
        for s in (0..n).filter(|&s| !taken[s]) {
            // Jobs that returning s would preempt: left below their base.
            let victims: Vec<usize> = holds[s]
                .iter()
                .filter(|&&(j, g)| gpus[j].saturating_sub(g) < input.jobs[j].base.max(1))
                .map(|p| p.0)
                .collect();
            let cost: f64 = victims.iter().map(|&j| 1.0 / spans(j, &holds) as f64).sum();
            // Collateral: what the victims free on servers that keep other
            // work.
            let mut collateral = 0;
            for t in (0..n).filter(|&t| t != s && !taken[t]) {
                let freed: u32 = holds[t]
                    .iter()
                    .filter(|p| victims.contains(&p.0))
                    .map(|p| p.1)
                    .sum();
                if freed > 0 && holds[t].iter().any(|p| !victims.contains(&p.0)) {
                    collateral += freed;
                }
            }
            let scaled: u32 = holds[s]
                .iter()
                .filter(|p| !victims.contains(&p.0))
                .map(|p| p.1)
                .sum();
            // Then the smaller victims (less work to restart), then fewer
            // flexible GPUs scaled in (an idle server first).
            let victim_gpus: u32 = victims.iter().map(|&j| gpus[j]).sum();
            let key = (cost, (collateral, victim_gpus, scaled, s));
            if best
                .as_ref()
                .is_none_or(|b| key.0.total_cmp(&b.0.0).then(key.1.cmp(&b.0.1)).is_lt())
            {
                best = Some((key, s, victims));
            }
        }
        let Some((_, s, victims)) = best else { break };
        // Take s: its victims leave every server, the rest scale in.
        for &(j, g) in &holds[s] {
            gpus[j] = gpus[j].saturating_sub(g);
        }
        for h in holds.iter_mut() {
            h.retain(|p| !victims.contains(&p.0));
        }
        holds[s].clear();
        taken[s] = true;
        chosen.push(s);
    }
    chosen
}

/// Every subset of `need` servers: fewest preemptions, then least
/// collateral, then the first in lexicographic order.
fn exhaustive(input: &ReclaimInput, need: usize) -> Vec<usize> {
    let n = input.servers.len();
    let mut idx: Vec<usize> = (0..need).collect();
    let mut best: Option<((usize, u32), Vec<usize>)> = None;
    loop {
        let o = input.outcome(&idx);
        let key = (o.preempted.len(), o.collateral_gpus);
        if best.as_ref().is_none_or(|b| key < b.0) {
            best = Some((key, idx.clone()));
        }
        // Next combination.
        let mut k = need;
        while k > 0 && idx[k - 1] == n - need + k - 1 {
            k -= 1;
        }
        if k == 0 {
            break;
        }
        idx[k - 1] += 1;
        for m in k..need {
            idx[m] = idx[m - 1] + 1;
        }
    }
    best.map(|b| b.1).unwrap_or_default()
}

#[cfg(test)]
mod tests;
