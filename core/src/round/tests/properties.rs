//! Property tests over random views.

use super::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// With queues, priorities and preemption classes on any cluster:
    /// no queue holds more than it deserves (so never above its limit),
    /// a queue with work deserves at least its guarantee (within what
    /// the cluster has), and a running non-preemptible job on a node
    /// that still takes work keeps exactly its GPUs.
    #[test]
    fn queues_hold_within_their_share_and_pinned_jobs_stay(
        v in arb_view(),
        policy in prop::sample::select(vec!["ymir", "srtf", "tiresias", "themis", "fifo", "edf", "hydra", "chronus", "optimus", "lyra", "gandiva"]),
        ga in 0u32..6, la in prop::option::of(6u32..12), gb in 0u32..6,
        seed in any::<u64>(),
    ) {
        let mut v = v;
        for (k, j) in v.jobs.iter_mut().enumerate() {
            let bits = seed.rotate_left(k as u32 * 5);
            j.queue = if bits & 1 == 0 { "a" } else { "b" }.into();
            j.priority = ((bits >> 1) % 3) as i32;
            j.preemptible = (bits >> 3) % 4 != 0;
        }
        let cfg = RoundConfig {
            queues: two_queues(ga, la, gb, None),
            ..Default::default()
        };
        let pol = by_name(policy).unwrap();
        let p = prepare(&v, pol.as_ref(), &cfg);
        let e = estimates(&p, 7200.0);
        let d = decide(&v, &p, &e, pol.as_ref(), &cfg).unwrap();
        let u = usage(&v, &d.outcome);
        for (q, &used) in &u {
            let pinned: u32 = p.pinned.iter().filter(|&&i| v.jobs[i].queue == *q)
                .map(|&i| v.jobs[i].holds.len() as u32).sum();
            let deserved = p.deserved.get(q).copied().unwrap_or(0);
            prop_assert!(used <= deserved.max(pinned), "queue {q}: {used} > {deserved} ({pinned} pinned); groups {:?} caps {:?} deserved {:?} jobs {:?} out {:?} queues {:?} snapshot {:?}", d.outcome.groups, p.caps, p.deserved, p.jobs, p.queue_out, v.jobs.iter().map(|j| (&j.queue, j.priority, j.preemptible)).collect::<Vec<_>>(), d.snapshot.jobs.iter().map(|j| (j.min_gpus, j.max_gpus, j.requested_gpus)).collect::<Vec<_>>());
            if q == "a" && let Some(l) = la {
                prop_assert!(used <= l.max(pinned), "queue a: {used} above its limit {l}");
            }
        }
        let total: u32 = p.capacity.iter().sum::<u32>()
            + p.pinned.iter().map(|&i| v.jobs[i].holds.len() as u32).sum::<u32>();
        if total >= ga + gb && let Some(&d) = p.deserved.get("a") {
            // Each job's largest size (its requested one under a rigid
            // policy: a_rigid_policy_admits_a_job_only_at_its_requested_size),
            // a pinned job at what it holds (`QuotaOutcome::demand`; a
            // pinned job may hold more than its family offers a new one).
            let demand = p.demand.get("a").copied().unwrap_or(0);
            if !pol.rigid() {
                let size = |i: usize| if p.pinned.contains(&i) {
                    v.jobs[i].holds.len() as u32
                } else {
                    p.offered(&cfg, v.jobs[i].max_gpus, &v.jobs[i]).max(v.jobs[i].min_gpus)
                };
                let most: u32 = p.jobs.iter().chain(&p.pinned).chain(p.queue_out.iter().map(|o| &o.0))
                    .filter(|&&i| v.jobs[i].queue == "a")
                    .map(|&i| size(i))
                    .sum();
                prop_assert_eq!(demand, most);
            }
            prop_assert!(d >= ga.min(demand), "a deserves {d} < min({ga}, {demand}); total {total} cap {:?} pinned {:?} deserved {:?} jobs {:?}", p.capacity, p.pinned, p.deserved, v.jobs.iter().map(|j| (&j.queue, j.preemptible, j.state, j.holds.len())).collect::<Vec<_>>());
        }
        for (i, j) in v.jobs.iter().enumerate() {
            let healthy = j.holds.iter().all(|g| {
                let n = &v.nodes[g.0];
                n.state != NodeState::Offline && !n.drained
            });
            if !j.preemptible && j.state == JobState::Running && !j.holds.is_empty()
                && !j.profiling_run && !j.held_back && healthy
                && p.unschedulable.iter().all(|u| u.0 != i)
                // (a job no node of its GPU model can hold is no
                // candidate at all)
                && (p.jobs.contains(&i) || p.pinned.contains(&i) || p.queue_out.iter().any(|o| o.0 == i))
            {
                let g = d.outcome.groups.iter().find(|g| g.jobs.contains(&i));
                prop_assert!(g.is_some_and(|g| g.kept && g.gpus.len() == j.holds.len()),
                    "non-preemptible {} lost its GPUs", j.id);
            }
        }
    }

    /// On any cluster: no GPU given twice (profiling included), every
    /// GPU exists on a node the round may use, no job twice, merged
    /// groups are valid pairs, a kept group keeps exactly its GPUs, and
    /// the plan repeats on the same view.
    #[test]
    fn outcomes_respect_capacity_and_never_share_a_gpu(
        v in arb_view(),
        policy in prop::sample::select(vec!["ymir", "srtf", "tiresias", "optimus", "themis", "pollux", "fifo"]),
        single in any::<bool>(),
    ) {
        let cfg = RoundConfig {
            max_nodes_per_group: single.then_some(1),
            ..Default::default()
        };
        let pol = by_name(policy).unwrap();
        let p = prepare(&v, pol.as_ref(), &cfg);
        let mut e = estimates(&p, 7200.0);
        for (k, pair) in p.eligible.iter().enumerate() {
            if k % 3 == 0 {
                e.candidates.push(PairEstimate {
                    pair: *pair,
                    seconds: linear(&p, 2000.0),
                    tran_wt: p.allocations.iter().map(|&a| if a == 0 { 0.0 } else { 1.5 }).collect(),
                    gain_ab: 0.2,
                    gain_ba: 0.1,
                });
            }
        }
        let d = decide(&v, &p, &e, pol.as_ref(), &cfg).unwrap();
        let o = &d.outcome;
        let mut seen_gpu = BTreeSet::new();
        let mut seen_job = BTreeSet::new();
        for r in &o.profiling {
            for g in &r.gpus {
                prop_assert!(seen_gpu.insert(*g), "GPU {g:?} twice");
                prop_assert!(!r.new || !v.nodes[g.0].cordoned, "new profiling on a cordoned node");
            }
            prop_assert!(seen_job.insert(r.job));
        }
        for g in &o.groups {
            for gpu in &g.gpus {
                prop_assert!(gpu.1 < v.nodes[gpu.0].gpus);
                prop_assert!(v.nodes[gpu.0].state != NodeState::Offline);
                prop_assert!(!v.nodes[gpu.0].drained);
                prop_assert!(seen_gpu.insert(*gpu), "GPU {gpu:?} twice");
                // A cordoned node gets no new work: only a member that
                // trained there keeps GPUs on it.
                if v.nodes[gpu.0].cordoned {
                    prop_assert!(g.jobs.iter().any(|&j| !v.jobs[j].profiling_run
                        && v.jobs[j].holds.iter().any(|h| h.0 == gpu.0)),
                        "a new group on cordoned node {}", gpu.0);
                }
            }
            for &j in &g.jobs {
                prop_assert!(seen_job.insert(j), "job {j} twice");
            }
            if let [a, b] = g.jobs[..] {
                let (ja, jb) = (&v.jobs[a], &v.jobs[b]);
                prop_assert!(ja.model == jb.model && ja.sharing && jb.sharing && ja.task != jb.task);
            }
            if g.kept {
                let mut held = v.jobs[g.jobs[0]].holds.clone();
                held.sort_unstable();
                prop_assert_eq!(&held, &g.gpus);
            }
            if single {
                prop_assert!(g.nodes().len() <= 1);
            }
        }
        let again = decide(&v, &p, &e, pol.as_ref(), &cfg).unwrap();
        prop_assert_eq!(&again.outcome, o);
    }
}
