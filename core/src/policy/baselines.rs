//! The baselines the papers compare with (thesis Ch. 2; Ymir §7.1). Each
//! runs at the interval its paper (or the published simulator) uses and
//! gives every job either its requested GPUs or — for the elastic ones —
//! what its rule says; all share [`super::placement`].
//!
//! | policy | rule | interval |
//! |---|---|---|
//! | FIFO | submission order, head-of-line blocking, no preemption | on events (60 s) |
//! | SRTF | shortest remaining time (at the requested GPUs) first, preemptive, backfilling | 300 s |
//! | Tiresias | 2-D least attained service (GPU-seconds), discretised queues, FIFO inside a queue, starvation guard | 300 s |
//! | Optimus | marginal gain: each GPU step goes where remaining time falls most per GPU | 300 s |
//! | Themis | finish-time fairness ρ = T_shared / T_ideal; free (lease-expired) GPUs go to the largest ρ (or to the TitanSched simulator's rank, [`ThemisRank`]) | 60 s, 600 s leases |
//! | Pollux | goodput with fixed batch size (Ymir disables batch tuning): maximise the generalised mean (p = −1) of speedups | 60 s |

use super::{
    Plan, PlanEntry, Policy, QueueRoom, Snapshot, by_priority, requested_allocation,
    usable_allocations,
};

/// Gives each job of `order` its requested allocation while GPUs last and
/// its queue's budget allows (higher priorities first, `order` within a
/// priority). With `blocking`, the first job that does not fit stops the
/// walk (strict FIFO); else later, smaller jobs fill in (backfilling).
pub(super) fn in_order(
    snap: &Snapshot,
    order: &[usize],
    mut free: u32,
    blocking: bool,
    plan: &mut Plan,
) {
    let mut room = QueueRoom::new(snap, plan);
    let mut order = order.to_vec();
    by_priority(snap, &mut order);
    // Queues whose head waits for room in its budget (with `blocking`, a
    // queue's head blocks only its own queue's later jobs).
    let mut blocked: Vec<usize> = Vec::new();
    for i in order {
        let Some(a) = requested_allocation(snap, i) else {
            continue;
        };
        let q = snap.jobs[i].queue;
        if q.is_some_and(|q| blocked.contains(&q)) {
            continue;
        }
        if a > free {
            if blocking {
                break;
            }
        } else if !room.fits(snap, i, a) {
            if blocking && let Some(q) = q {
                blocked.push(q);
            }
        } else {
            free -= a;
            room.take(snap, i, a);
            plan.entries.push(PlanEntry::single(i, a));
        }
    }
}

/// Job indices oldest first (ties by id).
pub(super) fn by_arrival(snap: &Snapshot) -> Vec<usize> {
    let mut order: Vec<usize> = (0..snap.jobs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&snap.jobs[a], &snap.jobs[b]);
        x.submitted_at
            .total_cmp(&y.submitted_at)
            .then(x.id.cmp(&y.id))
    });
    order
}

/// Running jobs keep their GPUs (policies that do not preempt); returns
/// the GPUs left.
pub(super) fn keep_running(snap: &Snapshot, plan: &mut Plan) -> u32 {
    let mut free = snap.total_gpus();
    let mut room = QueueRoom::new(snap, plan);
    for (i, j) in snap.jobs.iter().enumerate() {
        if j.current_gpus > 0 && j.current_gpus <= free && room.fits(snap, i, j.current_gpus) {
            free -= j.current_gpus;
            room.take(snap, i, j.current_gpus);
            plan.entries.push(PlanEntry::single(i, j.current_gpus));
        }
    }
    free
}

pub(super) fn sort_entries(mut plan: Plan) -> Plan {
    plan.entries.sort_by_key(|e| e.jobs[0]);
    plan
}

/// First in, first out, without preemption.
#[derive(Clone, Debug)]
pub struct Fifo {
    pub interval_s: f64,
}

impl Default for Fifo {
    fn default() -> Self {
        // No paper sets it: FIFO never preempts, so the interval only delays
        // starts; a minute keeps that short.
        Self { interval_s: 60.0 }
    }
}

impl Policy for Fifo {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "fifo"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut plan = Plan::default();
        let free = keep_running(snap, &mut plan);
        let order: Vec<usize> = by_arrival(snap)
            .into_iter()
            .filter(|&i| snap.jobs[i].current_gpus == 0)
            .collect();
        in_order(snap, &order, free, true, &mut plan);
        sort_entries(plan)
    }
}

/// Preemptive shortest remaining time first.
#[derive(Clone, Debug)]
pub struct Srtf {
    pub interval_s: f64,
}

impl Default for Srtf {
    fn default() -> Self {
        // Ymir §7.1: SRTF, Tiresias and Themis every 120 s.
        Self { interval_s: 120.0 }
    }
}

fn remaining_at_request(snap: &Snapshot, i: usize) -> f64 {
    requested_allocation(snap, i).map_or(f64::INFINITY, |a| snap.time_at(i, a))
}

/// Sorts job indices shortest remaining time (at the requested GPUs) first,
/// ties by id.
pub(super) fn srtf_sort(snap: &Snapshot, order: &mut [usize]) {
    order.sort_by(|&a, &b| {
        remaining_at_request(snap, a)
            .total_cmp(&remaining_at_request(snap, b))
            .then(snap.jobs[a].id.cmp(&snap.jobs[b].id))
    });
}

impl Policy for Srtf {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "srtf"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut order: Vec<usize> = (0..snap.jobs.len()).collect();
        srtf_sort(snap, &mut order);
        let mut plan = Plan::default();
        in_order(snap, &order, snap.total_gpus(), false, &mut plan);
        sort_entries(plan)
    }
}

/// Tiresias (Gu et al., NSDI'19): discretised two-dimensional least
/// attained service.
#[derive(Clone, Debug)]
pub struct Tiresias {
    pub interval_s: f64,
    /// Queue thresholds on attained service, GPU-seconds (ascending).
    pub thresholds_gpu_s: Vec<f64>,
    /// A job that has waited longer than this multiple of the time it has
    /// run goes back to the highest-priority queue.
    pub starvation_factor: f64,
}

impl Default for Tiresias {
    fn default() -> Self {
        Self {
            // Ymir §7.1: Tiresias, Themis and SRTF every 120 s.
            interval_s: 120.0,
            // Two queues split at 16 GPU-hours, as in the Pollux artifact's
            // Tiresias that the FM papers' simulators build on.
            thresholds_gpu_s: vec![16.0 * 3600.0],
            // Tiresias' STARVELIMIT: generous, or promotion and demotion
            // thrash with every restart.
            starvation_factor: 10.0,
        }
    }
}

impl Tiresias {
    /// The job's queue (0 = highest priority).
    pub fn queue(&self, snap: &Snapshot, i: usize) -> usize {
        let j = &snap.jobs[i];
        let waited = (snap.now - j.submitted_at - j.executed_s).max(0.0);
        if j.current_gpus == 0
            && j.executed_s > 0.0
            && waited > self.starvation_factor * j.executed_s
        {
            return 0;
        }
        self.thresholds_gpu_s
            .iter()
            .take_while(|&&t| j.attained_gpu_s >= t)
            .count()
    }
}

impl Policy for Tiresias {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "tiresias"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut order: Vec<usize> = (0..snap.jobs.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&snap.jobs[a], &snap.jobs[b]);
            self.queue(snap, a)
                .cmp(&self.queue(snap, b))
                .then(x.submitted_at.total_cmp(&y.submitted_at))
                .then(x.id.cmp(&y.id))
        });
        let mut plan = Plan::default();
        in_order(snap, &order, snap.total_gpus(), false, &mut plan);
        sort_entries(plan)
    }
}

/// Greedy growth shared by Optimus and Pollux: first one allocation per
/// job in `first` order while GPUs last, then repeatedly the step with the
/// best `gain(job, from, to)` per added GPU, while it is positive.
fn grow(snap: &Snapshot, first: &[usize], gain: impl Fn(usize, u32, u32) -> f64) -> Plan {
    let n = snap.jobs.len();
    let usable: Vec<Vec<u32>> = (0..n).map(|i| usable_allocations(snap, i)).collect();
    let mut gpus = vec![0u32; n];
    let mut free = snap.total_gpus();
    for &i in first {
        if let Some(&a) = usable[i].first()
            && a <= free
        {
            gpus[i] = a;
            free -= a;
        }
    }
    loop {
        let mut best: Option<(f64, usize, u32)> = None;
        for i in 0..n {
            if gpus[i] == 0 {
                continue;
            }
            let Some(&next) = usable[i].iter().find(|&&a| a > gpus[i]) else {
                continue;
            };
            if next - gpus[i] > free {
                continue;
            }
            let g = gain(i, gpus[i], next) / f64::from(next - gpus[i]);
            if best
                .is_none_or(|(bg, bi, _)| g > bg || (g == bg && snap.jobs[i].id < snap.jobs[bi].id))
            {
                best = Some((g, i, next));
            }
        }
        match best {
            Some((g, i, next)) if g > 0.0 => {
                free -= next - gpus[i];
                gpus[i] = next;
            }
            _ => break,
        }
    }
    Plan {
        entries: (0..n)
            .filter(|&i| gpus[i] > 0)
            .map(|i| PlanEntry::single(i, gpus[i]))
            .collect(),
        ..Default::default()
    }
}

/// Optimus (Peng et al., EuroSys'18): marginal gain of one more GPU from
/// the estimated remaining time.
#[derive(Clone, Debug)]
pub struct Optimus {
    pub interval_s: f64,
}

impl Default for Optimus {
    fn default() -> Self {
        // Ymir §7.1: Pollux and Optimus every 300 s (their context switches
        // are expensive).
        Self { interval_s: 300.0 }
    }
}

impl Policy for Optimus {
    fn name(&self) -> &str {
        "optimus"
    }
    /// Optimus adds one GPU at a time (any count up to the job's maximum).
    fn allocation_set(&self, max_gpus: u32) -> Vec<u32> {
        (0..=max_gpus).collect()
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        // Every job's first GPU is its largest gain (T(0) = ∞); when there
        // are more jobs than GPUs they go in arrival order, as Optimus
        // admits jobs.
        let first = by_arrival(snap);
        grow(snap, &first, |i, from, to| {
            snap.time_at(i, from) - snap.time_at(i, to)
        })
    }
}

/// Themis (Mahajan et al., NSDI'20): finish-time fairness with leases.
#[derive(Clone, Debug)]
pub struct Themis {
    pub interval_s: f64,
    pub lease_s: f64,
    pub rank: ThemisRank,
}

/// How Themis ranks the jobs that bid for free GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThemisRank {
    /// The paper's finish-time fairness ρ = T_shared / T_ideal
    /// ([`Themis::rho`]); the largest ρ (the worst-off job) wins.
    #[default]
    FinishTimeFairness,
    /// The rank of the TitanSched simulator the Ymir authors compare with
    /// ([`Themis::titansched_fairness`]); `fmsim fidelity` uses it to replay
    /// their runs. It needs [`super::SchedJob::fair_share_gpu_s`].
    TitanSched,
}

impl Default for Themis {
    fn default() -> Self {
        Self {
            // Ymir §7.1: every 120 s, with 600 s lease terms.
            interval_s: 120.0,
            lease_s: 600.0,
            rank: ThemisRank::default(),
        }
    }
}

impl Themis {
    /// ρ = T_shared / T_ideal: (time since submission + remaining time at
    /// the requested GPUs) over the whole run alone at the requested GPUs.
    pub fn rho(&self, snap: &Snapshot, i: usize) -> f64 {
        let j = &snap.jobs[i];
        let remaining = remaining_at_request(snap, i);
        let ideal = remaining / (1.0 - j.progress.clamp(0.0, 0.99));
        if !ideal.is_finite() || ideal <= 0.0 {
            return 0.0;
        }
        (snap.now - j.submitted_at + remaining) / ideal
    }

    /// The TitanSched simulator's fairness, largest first:
    /// `staying / (t_isolated + t_remaining)` with
    /// `t_isolated = running · attained / deserved + (staying − running)`,
    /// where `deserved` is the GPU-seconds of an equal share of the cluster
    /// ([`super::SchedJob::fair_share_gpu_s`]); 1 while nothing is deserved
    /// yet. Unlike ρ it is not a slowdown: it grows as a job nears its end
    /// (small `t_remaining`), so it also favours short remaining work.
    pub fn titansched_fairness(&self, snap: &Snapshot, i: usize) -> f64 {
        let j = &snap.jobs[i];
        if j.fair_share_gpu_s <= 0.0 {
            return 1.0;
        }
        let staying = (snap.now - j.submitted_at).max(0.0);
        let running = j.executed_s.min(staying);
        let isolated = running * j.attained_gpu_s / j.fair_share_gpu_s + (staying - running);
        let denominator = isolated + remaining_at_request(snap, i);
        if !denominator.is_finite() || denominator <= 0.0 {
            return 0.0;
        }
        staying / denominator
    }

    fn rank_of(&self, snap: &Snapshot, i: usize) -> f64 {
        match self.rank {
            ThemisRank::FinishTimeFairness => self.rho(snap, i),
            ThemisRank::TitanSched => self.titansched_fairness(snap, i),
        }
    }
}

impl Policy for Themis {
    fn rigid(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "themis"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn lease_s(&self) -> f64 {
        self.lease_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        let mut plan = Plan::default();
        let mut free = snap.total_gpus();
        // GPUs under an unexpired lease stay with their job.
        let mut room = QueueRoom::new(snap, &plan);
        for (i, j) in snap.jobs.iter().enumerate() {
            if j.current_gpus > 0
                && j.lease_until > snap.now
                && j.current_gpus <= free
                && room.fits(snap, i, j.current_gpus)
            {
                free -= j.current_gpus;
                room.take(snap, i, j.current_gpus);
                plan.entries.push(PlanEntry::single(i, j.current_gpus));
            }
        }
        let leased: Vec<bool> = {
            let mut v = vec![false; snap.jobs.len()];
            for e in &plan.entries {
                v[e.jobs[0]] = true;
            }
            v
        };
        // The rest is auctioned to the worst-off jobs first.
        let rank: Vec<f64> = (0..snap.jobs.len())
            .map(|i| {
                if leased[i] {
                    0.0
                } else {
                    self.rank_of(snap, i)
                }
            })
            .collect();
        let mut order: Vec<usize> = (0..snap.jobs.len()).filter(|&i| !leased[i]).collect();
        order.sort_by(|&a, &b| {
            rank[b]
                .total_cmp(&rank[a])
                .then(snap.jobs[a].id.cmp(&snap.jobs[b].id))
        });
        in_order(snap, &order, free, false, &mut plan);
        sort_entries(plan)
    }
}

/// Pollux-style goodput allocation with the batch size fixed.
#[derive(Clone, Debug)]
pub struct Pollux {
    pub interval_s: f64,
}

impl Default for Pollux {
    fn default() -> Self {
        // Ymir §7.1: Pollux and Optimus every 300 s (the authors' simulator
        // too); Pollux's own paper re-allocates every 60 s.
        Self { interval_s: 300.0 }
    }
}

impl Policy for Pollux {
    fn name(&self) -> &str {
        "pollux"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn allocate(&self, snap: &Snapshot) -> Plan {
        // Oldest jobs get their first GPU first (Pollux weighs by age).
        let first = by_arrival(snap);
        // Speedup over one GPU; p = −1 mean: maximise −Σ 1/speedup.
        let speedup = |i: usize, a: u32| {
            let base = usable_allocations(snap, i)
                .first()
                .map_or(f64::INFINITY, |&m| snap.time_at(i, m));
            base / snap.time_at(i, a)
        };
        grow(snap, &first, |i, from, to| {
            1.0 / speedup(i, from) - 1.0 / speedup(i, to)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::named::{POLICY_NAMES, by_name, knob_names, with_knobs};
    use super::super::testkit::*;
    use super::*;

    /// `knob_names` is the list `with_knobs` takes, for every policy: each
    /// named knob is accepted, and one more is refused with the list.
    #[test]
    fn every_policy_names_the_knobs_it_takes() {
        for name in POLICY_NAMES {
            let known = knob_names(name).unwrap();
            let all: BTreeMap<String, f64> = known.iter().map(|k| (k.to_string(), 2.0)).collect();
            assert!(with_knobs(name, &all).is_ok(), "{name}");
            let mut more = all.clone();
            more.insert("no_such_knob".into(), 1.0);
            let e = with_knobs(name, &more).err().unwrap();
            assert!(e.contains("no_such_knob") && e.contains(known[0]), "{e}");
        }
        assert!(knob_names("afs").is_none());
    }

    #[test]
    fn fifo_blocks_behind_the_head_and_never_preempts() {
        let mut snap = cluster(1, 4, jobs(3));
        snap.jobs[0].requested_gpus = 3;
        snap.jobs[1].requested_gpus = 2;
        snap.jobs[2].requested_gpus = 1;
        for (i, j) in snap.jobs.iter_mut().enumerate() {
            j.submitted_at = i as f64;
        }
        let p = Fifo::default().allocate(&snap);
        assert_eq!(
            p.gpus_by_job().into_iter().collect::<Vec<_>>(),
            vec![(0, 3)],
            "job 2 may not pass job 1"
        );
        snap.jobs[2].current_gpus = 1;
        let p = Fifo::default().allocate(&snap);
        assert_eq!(
            p.gpus_by_job().get(&2),
            Some(&1),
            "running jobs keep their GPUs"
        );
    }

    #[test]
    fn srtf_runs_the_shortest_first_and_backfills() {
        let mut snap = cluster(1, 4, jobs(3));
        snap.jobs[0].requested_gpus = 4; // long
        snap.jobs[1].requested_gpus = 2;
        snap.jobs[2].requested_gpus = 2;
        let t = |w: f64| linear_times(&snap.allocations, w);
        snap.jobs[0].remaining_s = t(100.0);
        snap.jobs[1].remaining_s = t(10_000.0);
        snap.jobs[2].remaining_s = t(5_000.0);
        let p = Srtf::default().allocate(&snap);
        assert_eq!(
            p.gpus_by_job().into_iter().collect::<Vec<_>>(),
            vec![(0, 4)]
        );
        snap.jobs[0].remaining_s = t(100_000.0);
        let p = Srtf::default().allocate(&snap);
        assert_eq!(
            p.gpus_by_job().into_iter().collect::<Vec<_>>(),
            vec![(1, 2), (2, 2)]
        );
    }

    #[test]
    fn tiresias_prefers_least_attained_service_and_rescues_the_starved() {
        let mut snap = cluster(1, 1, jobs(2));
        for j in &mut snap.jobs {
            j.requested_gpus = 1;
        }
        // 20 GPU-hours attained: past the 16 GPU-hour threshold.
        snap.jobs[0].attained_gpu_s = 72_000.0;
        snap.jobs[0].executed_s = 7200.0;
        let t = Tiresias::default();
        assert_eq!(t.queue(&snap, 0), 1);
        assert_eq!(
            Tiresias::default()
                .allocate(&snap)
                .gpus_by_job()
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1]
        );
        // Job 0 has waited more than ten times as long as it ran: back to
        // queue 0, and it was submitted first.
        snap.now = 7200.0 * 12.0;
        assert_eq!(t.queue(&snap, 0), 0);
        assert_eq!(
            t.allocate(&snap)
                .gpus_by_job()
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![0]
        );
    }

    #[test]
    fn optimus_gives_gpus_where_they_shorten_most() {
        let mut snap = cluster(1, 4, jobs(2));
        // Job 0 scales perfectly, job 1 not at all past one GPU.
        snap.jobs[0].remaining_s = snap
            .allocations
            .iter()
            .map(|&a| {
                if a == 0 {
                    f64::INFINITY
                } else {
                    1000.0 / f64::from(a)
                }
            })
            .collect();
        snap.jobs[1].remaining_s = snap
            .allocations
            .iter()
            .map(|&a| if a == 0 { f64::INFINITY } else { 1000.0 })
            .collect();
        let g = Optimus::default().allocate(&snap).gpus_by_job();
        assert_eq!((g[&0], g[&1]), (3, 1));
    }

    #[test]
    fn themis_keeps_leases_and_auctions_the_rest_by_unfairness() {
        let mut snap = cluster(1, 2, jobs(3));
        for j in &mut snap.jobs {
            j.requested_gpus = 1;
        }
        snap.now = 1000.0;
        snap.jobs[0].current_gpus = 1;
        snap.jobs[0].lease_until = 1500.0;
        snap.jobs[2].submitted_at = 0.0;
        snap.jobs[1].submitted_at = 900.0;
        let g = Themis::default().allocate(&snap).gpus_by_job();
        assert_eq!(
            g.keys().copied().collect::<Vec<_>>(),
            vec![0, 2],
            "the longest-waiting job is the worst off"
        );
        snap.jobs[0].lease_until = 900.0;
        let th = Themis::default();
        assert!(th.rho(&snap, 2) > th.rho(&snap, 1));
    }

    /// The TitanSched simulator's rank, by hand: `staying / (t_isolated +
    /// t_remaining)` with `t_isolated = running · attained / deserved +
    /// (staying − running)`. Of two jobs alike but for the service they
    /// got, the one that got less than its equal share wins the free GPU
    /// (the paper's ρ cannot tell them apart: same age, same remaining).
    #[test]
    fn themis_titansched_rank_favours_the_job_that_got_less_than_its_share() {
        let mut snap = cluster(1, 1, jobs(2));
        snap.now = 1000.0;
        for j in &mut snap.jobs {
            j.requested_gpus = 1;
            j.submitted_at = 0.0;
            j.remaining_s = linear_times(&snap.allocations, 500.0);
            j.executed_s = 400.0;
            j.fair_share_gpu_s = 800.0;
        }
        // j0 got half its share, j1 all of it.
        snap.jobs[0].attained_gpu_s = 400.0;
        snap.jobs[1].attained_gpu_s = 800.0;
        snap.jobs[1].executed_s = 800.0;
        let th = Themis {
            rank: ThemisRank::TitanSched,
            ..Default::default()
        };
        // j0: isolated = 400 · 400/800 + 600 = 800 → 1000 / (800 + 500).
        assert!((th.titansched_fairness(&snap, 0) - 1000.0 / 1300.0).abs() < 1e-12);
        // j1: isolated = 800 · 800/800 + 200 = 1000 → 1000 / (1000 + 500).
        assert!((th.titansched_fairness(&snap, 1) - 1000.0 / 1500.0).abs() < 1e-12);
        let g = th.allocate(&snap).gpus_by_job();
        assert_eq!(g.keys().copied().collect::<Vec<_>>(), vec![0]);
        let paper = Themis::default();
        assert_eq!(paper.rho(&snap, 0), paper.rho(&snap, 1));
        // Nothing deserved yet (just arrived): 1, as theirs.
        snap.jobs[1].fair_share_gpu_s = 0.0;
        assert_eq!(th.titansched_fairness(&snap, 1), 1.0);
    }

    #[test]
    fn every_policy_yields_a_sound_plan() {
        for name in POLICY_NAMES {
            let snap = cluster(2, 4, jobs(9));
            let p = by_name(name).unwrap();
            let plan = p.schedule(&snap);
            plan.consistency_check(&snap)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!plan.entries.is_empty(), "{name} ran nothing");
        }
        assert!(by_name("nope").is_none());
    }

    #[test]
    fn knobs_change_policies_and_unknown_knobs_are_named() {
        let k = |pairs: &[(&str, f64)]| {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), *b))
                .collect::<BTreeMap<_, _>>()
        };
        let p = with_knobs("themis", &k(&[("interval_s", 30.0), ("lease_s", 120.0)])).unwrap();
        assert_eq!(p.interval_s(), 30.0);
        let e = with_knobs("srtf", &k(&[("lease_s", 1.0)])).err().unwrap();
        assert!(
            e.contains("no knob \"lease_s\"") && e.contains("interval_s"),
            "{e}"
        );
        assert!(with_knobs("ymir", &k(&[("interval_s", 0.0)])).is_err());
        assert!(with_knobs("ymir", &k(&[("srtf_weight", f64::NAN)])).is_err());
        let y = with_knobs("ymir", &k(&[("merging", 0.0)])).unwrap();
        assert!(!y.merges());
    }
}
