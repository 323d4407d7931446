//! Lyra in the simulator: inference servers loaned while their trace is
//! low, reclaimed when it rises — flexible workers leave first, preempted
//! jobs resume from their checkpoints, and no job is lost.

mod common;

use common::{run, small};
use fmsched_core::policy::lyra::ReclaimRule;
use fmsched_sim::engine::{NodeGroup, SimConfig, SimResult};
use fmsched_sim::loans::{InferenceTrace, Loans};
use fmsched_sim::workload;

/// One training node of 4 V100s and three inference servers of 4: idle
/// for the first hour, fully busy in the second, idle again after.
fn with_loans(rule: ReclaimRule) -> SimConfig {
    SimConfig {
        loans: Some(Loans {
            inference: vec![NodeGroup::new("V100", 3, 4)],
            trace: InferenceTrace {
                points: vec![(0.0, 0.0), (3_600.0, 1.0), (7_200.0, 0.0)],
                period_s: 0.0,
            },
            headroom: 0.0,
            every_s: 300.0,
            rule,
        }),
        ..SimConfig::uniform(1, 4, "V100")
    }
}

fn mean_queue_s(r: &SimResult) -> f64 {
    r.jobs
        .iter()
        .map(|j| j.first_train_s.unwrap() - j.submit_s)
        .sum::<f64>()
        / r.jobs.len() as f64
}

#[test]
fn lyra_loans_lend_idle_servers_and_a_reclaim_loses_no_job() {
    let mut jobs = small();
    workload::make_elastic(&mut jobs, 0.5, 1);
    assert!(jobs.iter().any(|j| j.max_gpus > j.gpus));
    let r = run("lyra", &with_loans(ReclaimRule::Lyra), &jobs);
    let l = &r.loans;
    // Loaned at the start and again after the busy hour; all three
    // servers returned once it comes.
    assert!(l.loan_ops >= 2, "{l:?}");
    assert_eq!(l.reclaim_ops, 1, "{l:?}");
    assert_eq!(l.servers_reclaimed, 3, "{l:?}");
    assert!(l.loaned_busy_gpu_s > 0.0, "training used the loaned GPUs");
    assert!(
        l.preemptions + l.scale_ins > 0,
        "work was on the servers when they went back: {l:?}"
    );
    // Every job finished, the preempted ones from their checkpoints.
    assert!(r.jobs.iter().all(|j| j.finish_s.is_finite()), "no job lost");
    assert_eq!(r.jobs.len(), jobs.len());
    // The reclaim was no worse than the exhaustive search says it could be.
    assert!(l.searched_preemptions >= l.searched_optimal_preemptions);
    assert!(l.searched_reclaims >= 1);
}

#[test]
fn lyra_loaned_capacity_shortens_queuing_and_jct() {
    let jobs = small();
    let alone = run("lyra", &SimConfig::uniform(1, 4, "V100"), &jobs);
    let loaned = run("lyra", &with_loans(ReclaimRule::Lyra), &jobs);
    let (qa, ql) = (mean_queue_s(&alone), mean_queue_s(&loaned));
    let jct = |r: &SimResult| r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
    assert!(ql < qa, "queuing {ql:.0} s with loans vs {qa:.0} s without");
    assert!(jct(&loaned) < jct(&alone));
    assert_eq!(alone.loans.loaned_gpu_s, 0.0);
    // The loaned GPUs count in the utilisation's denominator.
    assert!(loaned.loans.loaned_gpu_s >= 3.0 * 4.0 * 3_000.0);
}

#[test]
fn lyra_reclaim_rules_all_keep_every_job() {
    let mut jobs = small();
    workload::make_elastic(&mut jobs, 0.5, 1);
    for rule in [ReclaimRule::Random(7), ReclaimRule::Scf] {
        let r = run("lyra", &with_loans(rule), &jobs);
        assert!(r.jobs.iter().all(|j| j.finish_s.is_finite()), "{rule:?}");
        assert_eq!(r.loans.servers_reclaimed, 3, "{rule:?}");
    }
    // FIFO on loaned servers: no scaling, reclaims preempt.
    let r = run("fifo", &with_loans(ReclaimRule::Lyra), &jobs);
    assert!(r.jobs.iter().all(|j| j.finish_s.is_finite()));
    assert_eq!(r.loans.scale_ins, 0, "FIFO jobs are rigid");
}
