//! Tests of `lyra`.

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::super::testkit::*;
use super::*;

/// Fig. 3.5 / Table 3.1: six 8-GPU servers; job a on servers 1 and 2
/// (half each), b alone on 3, c on 4 (80 % of its GPUs) and 5, d on 6
/// (80 %) and 5. Two servers are needed: 1 and 2 preempt one job.
fn fig_3_5() -> ReclaimInput {
    let server = |id: &str, holds: Vec<(usize, u32)>| LoanedServer {
        id: id.into(),
        holds,
    };
    ReclaimInput {
        servers: vec![
            server("1", vec![(0, 4)]),
            server("2", vec![(0, 4)]),
            server("3", vec![(1, 8)]),
            server("4", vec![(2, 8)]),
            server("5", vec![(2, 2), (3, 2)]),
            server("6", vec![(3, 8)]),
        ],
        jobs: [8, 8, 10, 10]
            .map(|g| ReclaimJob { gpus: g, base: g })
            .to_vec(),
    }
}

#[test]
fn lyra_reclaim_fig_3_5_returns_servers_1_and_2_with_one_preemption() {
    let input = fig_3_5();
    let lyra = reclaim(&input, 2, ReclaimRule::Lyra);
    assert_eq!(lyra.servers, vec![0, 1]);
    assert_eq!(lyra.preempted, vec![0]);
    assert_eq!(lyra.collateral_gpus, 0);
    assert_eq!(reclaim(&input, 2, ReclaimRule::Exhaustive), lyra);
    // The plain knapsack's cost (jobs per server) sees five 1-cost
    // servers; returning 3 and 4 preempts two jobs.
    assert_eq!(input.outcome(&[2, 3]).preempted.len(), 2);
    // Collateral counted as every GPU freed elsewhere would tie-break
    // the 0.5-cost servers towards 4 (2 GPUs freed on 5) over 1 (4 on
    // 2, which then empties): 4 then 6, two preemptions.
    assert_eq!(input.outcome(&[3, 5]).preempted.len(), 2);
    // One server: the scan finds a 1-preemption, 0-collateral one.
    let one = reclaim(&input, 1, ReclaimRule::Lyra);
    assert_eq!(one.preempted.len(), 1);
    assert_eq!(one.servers, vec![2], "server 3 frees nothing elsewhere");
}

#[test]
fn lyra_reclaim_returns_flexible_only_servers_without_a_preemption() {
    // Elastic job 0: base 8 on server 0, flexible 8 on server 1;
    // inelastic job 1 on server 2; server 3 idle.
    let input = ReclaimInput {
        servers: vec![
            LoanedServer {
                id: "a".into(),
                holds: vec![(0, 8)],
            },
            LoanedServer {
                id: "b".into(),
                holds: vec![(0, 8)],
            },
            LoanedServer {
                id: "c".into(),
                holds: vec![(1, 4)],
            },
            LoanedServer {
                id: "d".into(),
                holds: vec![],
            },
        ],
        jobs: vec![
            ReclaimJob { gpus: 16, base: 8 },
            ReclaimJob { gpus: 4, base: 4 },
        ],
    };
    let o = reclaim(&input, 2, ReclaimRule::Lyra);
    assert_eq!(
        o.servers,
        vec![0, 3],
        "the idle server, then a flexible group"
    );
    assert!(o.preempted.is_empty());
    assert_eq!(o.scaled_in, vec![(0, 8)]);
    let o = reclaim(&input, 3, ReclaimRule::Lyra);
    assert_eq!(o.preempted, vec![1], "then the cheapest preemption");
    // SCF counts jobs, not what they are: an idle server, then the
    // first one-job servers (0 and 1 — the elastic job's base too).
    let scf = reclaim(&input, 3, ReclaimRule::Scf);
    assert_eq!(scf.servers, vec![0, 1, 3]);
    assert_eq!(scf.preempted, vec![0]);
}

/// Random small instances: 3–7 loaned servers of 4 GPUs, jobs over
/// 1–3 of them, some elastic.
fn arb_instance() -> impl Strategy<Value = (ReclaimInput, usize)> {
    (3usize..=7, 1usize..=6).prop_flat_map(|(servers, jobs)| {
        (
            proptest::collection::vec((0..servers, 1usize..=3, 1u32..=2, any::<bool>()), jobs),
            1..servers,
        )
            .prop_map(move |(js, need)| {
                let mut input = ReclaimInput {
                    servers: (0..servers)
                        .map(|s| LoanedServer {
                            id: s.to_string(),
                            holds: Vec::new(),
                        })
                        .collect(),
                    jobs: Vec::new(),
                };
                let mut free = vec![4u32; servers];
                for (first, span, per, elastic) in js {
                    let mut got = 0;
                    let j = input.jobs.len();
                    for s in (first..servers).chain(0..first).take(span) {
                        let g = per.min(free[s]);
                        if g > 0 {
                            free[s] -= g;
                            input.servers[s].holds.push((j, g));
                            got += g;
                        }
                    }
                    if got > 0 {
                        let base = if elastic { got.div_ceil(2) } else { got };
                        input.jobs.push(ReclaimJob { gpus: got, base });
                    }
                }
                (input, need)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The greedy never beats the exhaustive optimum (a check of both),
    /// returns exactly the servers asked for, and preempts a job only
    /// when it is left below its base.
    #[test]
    fn lyra_reclaim_is_never_better_than_exhaustive((input, need) in arb_instance()) {
        let greedy = reclaim(&input, need, ReclaimRule::Lyra);
        let best = reclaim(&input, need, ReclaimRule::Exhaustive);
        prop_assert_eq!(greedy.servers.len(), need);
        prop_assert!(best.preempted.len() <= greedy.preempted.len());
        for (j, lost) in &greedy.scaled_in {
            prop_assert!(input.jobs[*j].gpus - lost >= input.jobs[*j].base);
        }
    }
}

/// How often the greedy matches the optimum on random instances (the
/// thesis: the same preemptions as optimal below 60 servers). Printed,
/// and held to at least 90 % so a regression shows.
#[test]
fn lyra_reclaim_matches_exhaustive_search_on_most_small_instances() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut same, mut same_scf, mut same_random, mut total) = (0, 0, 0, 0);
    for _ in 0..500 {
        let (input, need) = arb_instance().new_tree(&mut runner).unwrap().current();
        let best = reclaim(&input, need, ReclaimRule::Exhaustive)
            .preempted
            .len();
        let count = |r| reclaim(&input, need, r).preempted.len();
        same += usize::from(count(ReclaimRule::Lyra) == best);
        same_scf += usize::from(count(ReclaimRule::Scf) == best);
        same_random += usize::from(count(ReclaimRule::Random(total as u64)) == best);
        total += 1;
    }
    let share = |n: usize| 100.0 * n as f64 / total as f64;
    println!(
        "reclaim matches the exhaustive optimum on {:.1} % of {total} instances \
         (SCF {:.1} %, Random {:.1} %)",
        share(same),
        share(same_scf),
        share(same_random)
    );
    assert!(share(same) >= 90.0, "{}", share(same));
    assert!(same >= same_scf && same >= same_random);
}

/// Fig. 3.6 from the two jobs of Table 3.4: A (2 GPUs a worker, 2–3
/// workers, 100 s at 3) has one item, weight 2 and value 50; B (1 GPU
/// a worker, 2–6 workers, 20 s at 6) four, worth 20, 30, 36, 40.
#[test]
fn lyra_knapsack_items_are_fig_3_6() {
    let allocations: Vec<u32> = (0..=8).collect();
    let mut a = job("A", 600.0, 4, &allocations);
    a.max_gpus = 6;
    a.expert_parallel = 2; // two GPUs a worker
    let mut b = job("B", 120.0, 2, &allocations);
    b.max_gpus = 6;
    let mut snap = cluster(1, 8, vec![a, b]);
    snap.allocations = allocations.clone();
    snap.jobs[0].remaining_s = linear_times(&allocations, 600.0);
    // Whole workers only (the round masks the rest the same way).
    for (a, t) in allocations.iter().zip(&mut snap.jobs[0].remaining_s) {
        if a % 2 == 1 {
            *t = f64::INFINITY;
        }
    }
    snap.jobs[1].remaining_s = linear_times(&allocations, 120.0);
    let item = |i: usize, base: u32, a: u32| snap.time_at(i, base) - snap.time_at(i, a);
    assert_eq!(item(0, 4, 6), 50.0);
    let b_items: Vec<f64> = (3..=6).map(|a| item(1, 2, a)).collect();
    assert_eq!(b_items, vec![20.0, 30.0, 36.0, 40.0]);
    // Two GPUs left after the bases (4 + 2 of 8): A's item (50) beats
    // B's best two-GPU item (30).
    let plan = Lyra::default().allocate(&snap);
    let gpus = plan.gpus_by_job();
    assert_eq!((gpus[&0], gpus[&1]), (6, 2), "{plan:?}");
}

/// The DP against brute force over every combination.
#[test]
fn lyra_knapsack_matches_brute_force() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strat = proptest::collection::vec(
        proptest::collection::vec((1u32..=5, 0.0f64..50.0), 0..=3),
        1..=4,
    );
    for _ in 0..300 {
        let raw = strat.new_tree(&mut runner).unwrap().current();
        let groups: Vec<Vec<(u32, f64)>> = raw
            .into_iter()
            .map(|mut g| {
                g.insert(0, (0, 0.0));
                g
            })
            .collect();
        let cap = 6;
        let got = knapsack(&groups, cap);
        let mut best = f64::NEG_INFINITY;
        let mut pick = vec![0usize; groups.len()];
        loop {
            let w: u32 = pick.iter().zip(&groups).map(|(&k, g)| g[k].0).sum();
            if w <= cap {
                let v: f64 = pick.iter().zip(&groups).map(|(&k, g)| g[k].1).sum();
                best = best.max(v);
            }
            let mut g = 0;
            while g < groups.len() {
                pick[g] += 1;
                if pick[g] < groups[g].len() {
                    break;
                }
                pick[g] = 0;
                g += 1;
            }
            if g == groups.len() {
                break;
            }
        }
        assert!(
            (got.value - best).abs() < 1e-9,
            "{groups:?}: {} vs {best}",
            got.value
        );
        let w: u32 = got.items.iter().zip(&groups).map(|(&k, g)| g[k].0).sum();
        let v: f64 = got.items.iter().zip(&groups).map(|(&k, g)| g[k].1).sum();
        assert!(w <= cap && (v - got.value).abs() < 1e-9);
    }
}

#[test]
fn lyra_phase_one_is_sjf_without_head_of_line_blocking() {
    // 4 GPUs: a long 4-GPU job, a short 2-GPU one, a 3-GPU one that
    // does not fit after it, and a 1-GPU one that does.
    let allocs: Vec<u32> = (0..=4).collect();
    let mut snap = cluster(
        1,
        4,
        vec![
            job("long", 40_000.0, 4, &allocs),
            job("short", 100.0, 2, &allocs),
            job("three", 900.0, 3, &allocs),
            job("one", 5_000.0, 1, &allocs),
        ],
    );
    snap.allocations = allocs.clone();
    for (j, w) in snap.jobs.iter_mut().zip([40_000.0, 100.0, 900.0, 5_000.0]) {
        j.remaining_s = linear_times(&allocs, w);
        j.max_gpus = j.requested_gpus; // inelastic
    }
    let plan = Lyra::default().schedule(&snap);
    let gpus = plan.gpus_by_job();
    assert_eq!(gpus.get(&1), Some(&2), "shortest first");
    assert_eq!(gpus.get(&2), None, "3 GPUs do not fit after it");
    assert_eq!(gpus.get(&3), Some(&1), "a later job fills in");
    assert_eq!(gpus.get(&0), None);
    plan.consistency_check(&snap).unwrap();
}

#[test]
fn lyra_places_elastic_jobs_on_loaned_nodes_base_and_flexible_apart() {
    // Two training nodes, two loaned ones (4 GPUs each); an inelastic
    // 4-GPU job and an elastic one (base 4, up to 8).
    let allocs: Vec<u32> = (0..=16).collect();
    let mut snap = cluster(
        4,
        4,
        vec![
            job("rigid", 4_000.0, 4, &allocs),
            job("elastic", 8_000.0, 4, &allocs),
        ],
    );
    snap.allocations = allocs.clone();
    snap.jobs[0].max_gpus = 4;
    snap.jobs[1].max_gpus = 8;
    for (j, w) in snap.jobs.iter_mut().zip([4_000.0, 8_000.0]) {
        j.remaining_s = linear_times(&allocs, w);
    }
    snap.nodes[2].loaned = true;
    snap.nodes[3].loaned = true;
    let plan = Lyra::default().schedule(&snap);
    plan.consistency_check(&snap).unwrap();
    let on = |j: usize| {
        plan.entries
            .iter()
            .find(|e| e.jobs[0] == j)
            .unwrap()
            .placement
            .clone()
    };
    assert_eq!(on(0), vec![(0, 4)], "inelastic on a training node");
    assert_eq!(
        on(1),
        vec![(2, 4), (3, 4)],
        "elastic: base and flexible on two loaned nodes"
    );
    // Reclaiming one loaned node scales the elastic job in, preempting
    // nothing.
    let loaned = [2usize, 3];
    let (input, jobs) = ReclaimInput::from_parts(
        loaned.iter().map(|&n| snap.nodes[n].id.clone()).collect(),
        plan.entries.iter().flat_map(|e| {
            e.placement.iter().filter_map(move |&(n, g)| {
                loaned
                    .iter()
                    .position(|&l| l == n)
                    .map(|s| (s, e.jobs[0], g))
            })
        }),
        |i| ReclaimJob {
            gpus: plan.gpus_by_job()[&i],
            base: base_gpus(&snap, i).unwrap(),
        },
    );
    assert_eq!(jobs, vec![1]);
    let o = reclaim(&input, 1, ReclaimRule::Lyra);
    assert!(o.preempted.is_empty());
    assert_eq!(o.scaled_in, vec![(0, 4)]);
}

/// Two-GPU workers on three 3-GPU nodes: the job holds 2 on node 0
/// beside a 1-GPU job, and 2-GPU jobs leave one GPU free on nodes 1
/// and 2. The knapsack sees 2 free GPUs and grows the job to 4, whose
/// second worker fits no node; the job keeps running on its base
/// instead of being left out.
#[test]
fn lyra_a_size_the_nodes_cannot_hold_falls_back_to_the_base() {
    let allocs: Vec<u32> = (0..=9).collect();
    let mut snap = cluster(
        3,
        3,
        ["w", "r", "r2", "r3"]
            .iter()
            .map(|id| job(id, 8_000.0, 1, &allocs))
            .collect(),
    );
    snap.allocations = allocs.clone();
    let held = [
        (2, 4, vec![(0, 2)]),
        (1, 1, vec![(0, 1)]),
        (2, 2, vec![(1, 2)]),
        (2, 2, vec![(2, 2)]),
    ];
    for (j, (req, max, at)) in snap.jobs.iter_mut().zip(held) {
        j.remaining_s = linear_times(&allocs, 8_000.0);
        (j.requested_gpus, j.max_gpus) = (req, max);
        j.current_gpus = at.iter().map(|p| p.1).sum();
        j.current_placement = at;
    }
    snap.jobs[0].worker_gpus = 2;
    // Odd sizes are not whole workers (the round masks them so).
    for a in [1, 3] {
        snap.jobs[0].remaining_s[a] = f64::INFINITY;
    }
    assert_eq!(Lyra::default().allocate(&snap).gpus_by_job()[&0], 4);
    let plan = Lyra::default().schedule(&snap);
    plan.consistency_check(&snap).unwrap();
    assert_eq!(plan.gpus_by_job().get(&0), Some(&2), "{plan:?}");
    assert_eq!(plan.entries.len(), 4, "nobody left out: {plan:?}");
    assert_eq!(plan.stats.unplaced, 0);
}

#[test]
fn lyra_gandiva_scales_out_only_when_nothing_waits() {
    let allocs: Vec<u32> = (0..=8).collect();
    let mk = |id: &str, w: f64, req: u32, max: u32| {
        let mut j = job(id, w, req, &allocs);
        j.max_gpus = max;
        j.remaining_s = linear_times(&allocs, w);
        j
    };
    let mut snap = cluster(1, 8, vec![mk("e", 8_000.0, 2, 8), mk("r", 1_000.0, 4, 4)]);
    snap.allocations = allocs.clone();
    snap.jobs[0].remaining_s = linear_times(&allocs, 8_000.0);
    snap.jobs[1].remaining_s = linear_times(&allocs, 1_000.0);
    let g = Gandiva::default().allocate(&snap).gpus_by_job();
    assert_eq!(
        (g[&0], g[&1]),
        (4, 4),
        "nothing waits: the elastic job takes the rest"
    );
    // A third job waits for 4 GPUs: nobody scales out.
    snap.jobs.push(mk("w", 1_000.0, 4, 4));
    snap.jobs[2].remaining_s = linear_times(&allocs, 1_000.0);
    snap.jobs[0].current_gpus = 2;
    snap.jobs[0].current_placement = vec![(0, 2)];
    snap.jobs[1].current_gpus = 4;
    snap.jobs[1].current_placement = vec![(0, 4)];
    let g = Gandiva::default().allocate(&snap).gpus_by_job();
    assert_eq!((g[&0], g[&1], g.get(&2)), (2, 4, None));
}

#[test]
fn lyra_running_jobs_keep_their_base_and_a_resize_pays_its_restart() {
    let allocs: Vec<u32> = (0..=8).collect();
    let mut snap = cluster(1, 8, vec![job("e", 8_000.0, 4, &allocs)]);
    snap.allocations = allocs.clone();
    snap.jobs[0].max_gpus = 8;
    snap.jobs[0].remaining_s = linear_times(&allocs, 8_000.0);
    snap.jobs[0].current_gpus = 4;
    snap.jobs[0].current_placement = vec![(0, 4)];
    // 2,000 s at 4 GPUs, 1,000 s at 8: growing is worth it.
    assert_eq!(Lyra::default().allocate(&snap).gpus_by_job()[&0], 8);
    // With a restart dearer than the gain, it stays at 4.
    snap.jobs[0].restart_s = 1_500.0;
    assert_eq!(Lyra::default().allocate(&snap).gpus_by_job()[&0], 4);
}
