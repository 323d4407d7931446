//! Tests of `deadline`.

use proptest::prelude::*;

use super::super::testkit::*;
use super::*;
use crate::SloClass;
use crate::policy::NodeCap;
use crate::slo::reward_steps;

/// A job of `work` GPU-seconds asking for `gpus` (exactly: no smaller
/// or larger count), with a strict deadline `by` (None: best-effort).
fn rigid(id: &str, work: f64, gpus: u32, by: Option<f64>) -> crate::policy::SchedJob {
    let mut j = job(id, work, gpus, &crate::policy::ymir_allocations(64));
    j.min_gpus = gpus;
    j.max_gpus = gpus;
    j.restart_s = 0.0;
    j.deadlines = reward_steps(SloClass::Slo, 0.0, by);
    j
}

fn held(plan: &Plan) -> Vec<(String, u32)> {
    plan.entries
        .iter()
        .map(|e| (e.jobs[0].to_string(), e.gpus))
        .collect()
}

fn runs(plan: &Plan, i: usize) -> bool {
    plan.entries.iter().any(|e| e.jobs.contains(&i))
}

fn unisched() -> UniSched {
    UniSched::default()
}

fn chronus() -> UniSched {
    UniSched::new(UniSchedConfig {
        chronus: true,
        ..Default::default()
    })
}

/// A tight SLO job (its deadline is its run time from now) goes before
/// best-effort jobs that are shorter and would earn more alone.
#[test]
fn a_tight_slo_job_preempts_best_effort_work() {
    let snap = cluster(
        1,
        4,
        vec![
            rigid("be-short", 4.0 * 300.0, 4, None),
            rigid("slo", 4.0 * 1200.0, 4, Some(1200.0)),
        ],
    );
    let mut snap = snap;
    snap.jobs[0].current_gpus = 4;
    snap.jobs[0].current_placement = vec![(0, 4)];
    for p in [unisched(), chronus()] {
        let plan = p.schedule(&snap);
        assert_eq!(held(&plan), vec![("1".into(), 4)], "{}", p.name());
        assert!((plan.stats.objective - 100.0).abs() < 1.0, "{plan:?}");
    }
}

/// A running SLO job with one lease term of slack, whose restart takes
/// more than a term: stopped now for best-effort work, it could not
/// finish by its deadline once it pays the restart. It keeps its GPUs.
/// Counting its terms without the restart it would then no longer pay
/// (as the model did) stopped it, and the next round found its
/// deadline lost — or, with a far deadline, started it again: the
/// GPUs swapped at every lease end.
#[test]
fn a_running_slo_job_is_not_stopped_on_terms_its_restart_would_overrun() {
    let mut snap = cluster(
        1,
        4,
        vec![
            rigid("be", 4.0 * 300.0, 4, None),
            rigid("slo", 4.0 * 1800.0, 4, Some(3000.0)),
        ],
    );
    snap.jobs[1].current_gpus = 4;
    snap.jobs[1].current_placement = vec![(0, 4)];
    snap.jobs[1].restart_s = 700.0;
    let plan = unisched().schedule(&snap);
    assert_eq!(held(&plan), vec![("1".into(), 4)], "{plan:?}");
    assert!(plan.stats.objective >= 100.0, "{plan:?}");
    // With a restart under the slack, best-effort work goes first.
    snap.jobs[1].restart_s = 60.0;
    let plan = unisched().schedule(&snap);
    assert_eq!(held(&plan), vec![("0".into(), 4)], "{plan:?}");
    assert!(plan.stats.objective >= 100.0, "{plan:?}");
}

/// UniSched's Selector: while an SLO job has slack, a shorter
/// best-effort job runs first, and a longer one waits; Chronus runs
/// SLO jobs first regardless.
#[test]
fn best_effort_goes_first_while_slo_jobs_have_slack() {
    let mut snap = cluster(
        1,
        4,
        vec![
            rigid("be", 4.0 * 300.0, 4, None),
            rigid("slo", 4.0 * 1800.0, 4, Some(6000.0)),
        ],
    );
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 0) && !runs(&plan, 1), "{plan:?}");
    let plan = chronus().schedule(&snap);
    assert!(runs(&plan, 1) && !runs(&plan, 0), "{plan:?}");
    // A best-effort job as long as the SLO job: the SLO job, whose
    // lease secures twice the progress, goes first.
    snap.jobs[0].remaining_s = snap.jobs[1].remaining_s.clone();
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 1) && !runs(&plan, 0), "{plan:?}");
}

/// An SLO job whose estimate is unsure (spread 1.2: planned at 1.6×
/// its median time, 4 terms of its 4 before the deadline) has no slack
/// left at the pessimistic time and starts before the shorter
/// best-effort job; at the median (κ = 0, or no spread: 2 terms) it
/// waits, as above.
#[test]
fn estimate_prior_a_wide_spread_starts_an_slo_job_before_best_effort_work() {
    let mut snap = cluster(
        1,
        4,
        vec![
            rigid("be", 4.0 * 300.0, 4, None),
            rigid("slo", 4.0 * 1200.0, 4, Some(2500.0)),
        ],
    );
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 0) && !runs(&plan, 1), "sure: {plan:?}");
    snap.jobs[1].spread = 1.2;
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 1) && !runs(&plan, 0), "unsure: {plan:?}");
    let median = UniSched::new(UniSchedConfig {
        risk_weight: 0.0,
        ..Default::default()
    });
    let plan = median.schedule(&snap);
    assert!(runs(&plan, 0) && !runs(&plan, 1), "κ = 0: {plan:?}");
}

/// Idle GPUs are not left idle: an SLO job with slack runs when no
/// best-effort job wants the GPUs.
#[test]
fn an_slo_job_with_slack_uses_idle_gpus() {
    let snap = cluster(1, 8, vec![rigid("slo", 4.0 * 600.0, 4, Some(60_000.0))]);
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 0), "{plan:?}");
}

/// The per-term capacity the text omits: three jobs that each need the
/// whole cluster for one term, all due in two terms — at most two can
/// make it, and the model knows it (without the constraint it would
/// promise all three).
#[test]
fn later_terms_have_capacity_too() {
    let jobs = (0..3)
        .map(|k| rigid(&format!("s{k}"), 4.0 * 600.0, 4, Some(1200.0)))
        .collect();
    let plan = unisched().schedule(&cluster(1, 4, jobs));
    assert_eq!(plan.entries.len(), 1, "{plan:?}");
    // Two steps, and the running job's slack bonus (at most 1).
    assert!(
        (200.0..=201.0).contains(&plan.stats.objective),
        "two deadlines can be met, not three: {}",
        plan.stats.objective
    );
}

/// Eq. 5.7 as printed (`Σ_{k<Q} s·x_k ≤ s·L`) lets the model earn a
/// deadline while giving the job no term at all: the best-effort job
/// takes the GPUs and the SLO job, due when its work is done, misses.
/// With `≥` (what the text says it guarantees) the SLO job runs.
#[test]
fn printed_inequality_rewards_an_slo_job_it_never_runs() {
    let snap = cluster(
        1,
        4,
        vec![
            rigid("be", 4.0 * 300.0, 4, None),
            rigid("slo", 4.0 * 1200.0, 4, Some(1200.0)),
        ],
    );
    let fixed = unisched().solve(&snap, false);
    assert!(runs(&fixed, 1) && !runs(&fixed, 0), "{fixed:?}");
    let printed = unisched().solve(&snap, true);
    assert!(
        !runs(&printed, 1),
        "the printed form never runs the SLO job: {printed:?}"
    );
    assert!(
        printed.stats.objective >= 100.0,
        "yet it counts its deadline as met: {}",
        printed.stats.objective
    );
}

/// A soft SLO job that cannot make its first step still earns a later
/// one: it runs rather than being dropped.
#[test]
fn a_soft_job_past_its_first_step_still_earns_the_next() {
    let mut j = rigid("soft", 4.0 * 1150.0, 4, None);
    j.deadlines = reward_steps(SloClass::SoftSlo, 0.0, Some(1000.0));
    let snap = cluster(1, 4, vec![rigid("be", 4.0 * 300.0, 4, None), j]);
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 1), "{plan:?}");
    assert!(
        (plan.stats.objective - 50.0).abs() < 1.0,
        "{}",
        plan.stats.objective
    );
}

/// Leases (§5.3.3.1): a job under an unexpired lease keeps its GPUs;
/// after it runs out the GPUs are decided again.
#[test]
fn an_unexpired_lease_keeps_the_gpus() {
    let mut snap = cluster(
        1,
        4,
        vec![
            rigid("be", 4.0 * 3000.0, 4, None),
            rigid("slo", 4.0 * 600.0, 4, Some(1300.0)),
        ],
    );
    snap.jobs[0].current_gpus = 4;
    snap.jobs[0].current_placement = vec![(0, 4)];
    snap.jobs[0].lease_until = 200.0;
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 0) && !runs(&plan, 1), "{plan:?}");
    snap.now = 200.0;
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 1) && !runs(&plan, 0), "{plan:?}");
}

/// An SLO job whose every step has passed finishes as best-effort work.
#[test]
fn a_late_slo_job_still_finishes() {
    let mut snap = cluster(1, 4, vec![rigid("late", 4.0 * 600.0, 4, Some(100.0))]);
    snap.now = 500.0;
    assert!(!is_slo(&snap, 0));
    let plan = unisched().schedule(&snap);
    assert!(runs(&plan, 0), "{plan:?}");
}

/// UniSched may give an SLO job more GPUs than it asked for when that is
/// what meets its deadline; Chronus keeps the request.
#[test]
fn unisched_grows_a_job_to_meet_its_deadline() {
    let mut j = rigid("slo", 8.0 * 600.0, 4, Some(700.0));
    j.min_gpus = 1;
    j.max_gpus = 8;
    let snap = cluster(1, 8, vec![j]);
    let plan = unisched().schedule(&snap);
    assert_eq!(plan.entries[0].gpus, 8, "{plan:?}");
    // Its step, and its slack bonus (at most 1).
    assert!((100.0..=101.0).contains(&plan.stats.objective), "{plan:?}");
    let plan = chronus().schedule(&snap);
    assert_eq!(plan.entries[0].gpus, 4, "{plan:?}");
    assert!(plan.stats.objective < 1.0, "its request cannot make it");
}

/// Eq. 5.14's buddy cells: nodes split into the largest power-of-two
/// cells up to 8 GPUs; on 4-GPU nodes an 8-GPU job takes two level-2
/// cells; 3 and 6 GPUs are consolidation-hostile.
#[test]
fn buddy_cells_of_the_nodes() {
    let mut snap = cluster(1, 8, Vec::new());
    snap.nodes[0].gpus = 16;
    snap.nodes.push(NodeCap {
        id: "b".into(),
        gpus: 7,
        gpu_model: "A100".into(),
        loaned: false,
        gpu_memory_gib: 80.0,
    });
    assert_eq!(cells(&snap), (3, vec![1.0, 1.0, 1.0, 2.0]));
    assert_eq!(cell_need(8, 2), Some((2, 2.0)));
    assert_eq!(cell_need(2, 3), Some((1, 1.0)));
    assert_eq!(cell_need(16, 3), Some((3, 2.0)));
    assert_eq!(cell_need(6, 3), None);
    assert_eq!(cell_need(3, 3), None);
}

/// Chronus keeps strict consolidation: two 4-GPU SLO jobs on two nodes
/// of 6 GPUs get one node each (a 4-GPU cell per node), and a third
/// waits even though 4 GPUs are free in total.
#[test]
fn chronus_consolidates_strictly() {
    let jobs = (0..3)
        .map(|k| rigid(&format!("s{k}"), 4.0 * 600.0, 4, Some(700.0)))
        .collect();
    let snap = cluster(2, 6, jobs);
    let plan = chronus().schedule(&snap);
    assert_eq!(plan.entries.len(), 2, "{plan:?}");
}

#[test]
fn edf_and_hydra_orders() {
    let jobs = vec![
        rigid("be", 4.0 * 100.0, 4, None),
        rigid("late", 4.0 * 600.0, 4, Some(5000.0)),
        rigid("soon", 4.0 * 900.0, 4, Some(2000.0)),
    ];
    let mut snap = cluster(1, 8, jobs);
    let plan = Edf::default().schedule(&snap);
    assert_eq!(held(&plan), vec![("1".into(), 4), ("2".into(), 4)]);
    // Hydra: SLO above best-effort, shortest first: late (600) then soon.
    let plan = Hydra::default().schedule(&snap);
    assert_eq!(held(&plan), vec![("1".into(), 4), ("2".into(), 4)]);
    // Hydra does not preempt: the running best-effort job stays.
    snap.jobs[0].current_gpus = 4;
    snap.jobs[0].current_placement = vec![(0, 4)];
    let plan = Hydra::default().schedule(&snap);
    assert_eq!(held(&plan), vec![("0".into(), 4), ("1".into(), 4)]);
    // EDF does.
    let plan = Edf::default().schedule(&snap);
    assert_eq!(held(&plan), vec![("1".into(), 4), ("2".into(), 4)]);
}

/// A zero time limit reuses the previous solution and says so.
#[test]
fn a_missed_time_limit_reuses_the_previous_solution() {
    let mut snap = cluster(
        1,
        8,
        (0..6)
            .map(|k| rigid(&format!("s{k}"), 600.0 * f64::from(k + 1), 2, Some(9000.0)))
            .collect(),
    );
    snap.jobs[3].current_gpus = 2;
    snap.jobs[3].current_placement = vec![(0, 2)];
    let p = UniSched::new(UniSchedConfig {
        time_limit_s: 0.0,
        ..Default::default()
    });
    let plan = p.schedule(&snap);
    if plan.stats.fallback {
        assert!(runs(&plan, 3), "the running job keeps its GPUs: {plan:?}");
    }
    assert_eq!(plan.consistency_check(&snap), Ok(()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// An SLO job that fits is never dropped for best-effort work:
    /// SLO jobs that together fit the cluster now and each must start
    /// now to meet its deadline all run, whatever best-effort work
    /// waits (any number, any length).
    #[test]
    fn slo_jobs_that_fit_are_never_dropped_for_best_effort(
        slo in prop::collection::vec((1u32..=4, 300.0f64..5000.0), 1..5),
        be in prop::collection::vec((1u32..=8, 10.0f64..50_000.0), 0..12),
    ) {
        let mut jobs = Vec::new();
        let mut used = 0;
        for (k, &(g, t)) in slo.iter().enumerate() {
            if used + g > 16 { break; }
            used += g;
            jobs.push(rigid(&format!("s{k}"), f64::from(g) * t, g, Some(t * 1.0001)));
        }
        let n_slo = jobs.len();
        for (k, &(g, t)) in be.iter().enumerate() {
            jobs.push(rigid(&format!("b{k}"), f64::from(g) * t, g, None));
        }
        let snap = cluster(2, 8, jobs);
        let plan = unisched().schedule(&snap);
        prop_assert!(!plan.stats.fallback);
        for i in 0..n_slo {
            prop_assert!(runs(&plan, i), "SLO job {i} dropped: {:?}", plan);
        }
        let total: u32 = plan.entries.iter().map(|e| e.gpus).sum();
        prop_assert!(total <= 16);
        prop_assert_eq!(plan.consistency_check(&snap), Ok(()));
    }
}
