//! Phase 1, **prepare**: the nodes the round may use and their capacity,
//! profiling reservations (Ymir Fig. 6 step 2), the jobs that enter the
//! policy's snapshot, the allocation set, the queues' quota pass, kept
//! merges, eligible pairs and warm starts, and jobs no node can hold. Its
//! [`Prepared`] tells the caller what to estimate.

use std::collections::{BTreeMap, BTreeSet};

use super::outcome::{Prepared, Reservation, offered};
use super::pairs::{eligible_pairs, warm_keys};
use super::shapes::{cannot_profile, fits_no_family_of, never_fits, node_shapes, unfit_reason};
use super::view::{ClusterView, Gpu, RoundConfig};
use crate::job::JobState;
use crate::node::NodeState;
use crate::policy::Policy;
use crate::queue::QuotaJob;

/// Phase 1 (see the module docs).
pub fn prepare(view: &ClusterView, policy: &dyn Policy, cfg: &RoundConfig) -> Prepared {
    let present: Vec<usize> = (0..view.nodes.len())
        .filter(|&n| view.nodes[n].state != NodeState::Offline && view.nodes[n].gpus > 0)
        .collect();
    let total_gpus: u32 = present.iter().map(|&n| view.nodes[n].gpus).sum();
    let mut family_nodes: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for &n in &present {
        family_nodes
            .entry(view.nodes[n].gpu_model.clone())
            .or_default()
            .push(view.nodes[n].gpus);
    }
    for sizes in family_nodes.values_mut() {
        sizes.sort_unstable_by(|a, b| b.cmp(a));
    }
    let profiling = if cfg.profiling {
        reserve_profiling(view, &present, total_gpus, cfg.profiling_share)
    } else {
        Vec::new()
    };
    let reserved: BTreeSet<Gpu> = profiling.iter().flat_map(|r| r.gpus.clone()).collect();
    let mut capacity = capacity_of(view, &present, &reserved);

    let (mut jobs, unschedulable) = round_jobs(view, &present, cfg);
    // Queues, priorities and preemption classes (crate::queue).
    let q = quota_jobs(view, &jobs, policy, cfg, &family_nodes, total_gpus);
    let quota = crate::queue::apply(&cfg.queues, &q, capacity.iter().sum(), policy.rigid());
    let pinned: Vec<usize> = quota.pinned.iter().map(|&k| jobs[k]).collect();
    for &i in &pinned {
        for g in &view.jobs[i].holds {
            if let Some(k) = present.iter().position(|&n| n == g.0) {
                capacity[k] = capacity[k].saturating_sub(1);
            }
        }
    }
    let queue_out: Vec<(usize, String)> = quota
        .out
        .iter()
        .map(|(k, why)| (jobs[*k], why.clone()))
        .collect();
    let caps: BTreeMap<usize, u32> = quota.caps.iter().map(|(&k, &c)| (jobs[k], c)).collect();
    let queue_short: Vec<(usize, String)> = quota
        .short
        .iter()
        .map(|(k, why)| (jobs[*k], why.clone()))
        .collect();
    let budgets: BTreeMap<String, u32> = if policy.rigid() {
        quota
            .deserved
            .iter()
            .map(|(q, &d)| {
                let pinned: u32 = pinned
                    .iter()
                    .filter(|&&i| view.jobs[i].queue == *q)
                    .map(|&i| view.jobs[i].holds.len() as u32)
                    .sum();
                (q.clone(), d.saturating_sub(pinned))
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let gone: BTreeSet<usize> = pinned
        .iter()
        .copied()
        .chain(queue_out.iter().map(|o| o.0))
        .collect();
    jobs.retain(|i| !gone.contains(i));
    let ord: BTreeMap<usize, usize> = jobs.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let kept = (0..view.merges.len())
        .filter(|&m| ord.contains_key(&view.merges[m].a) && ord.contains_key(&view.merges[m].b))
        .collect();
    let (eligible, warm) = if cfg.merging && policy.merges() {
        (
            eligible_pairs(view, &jobs, &cfg.queues),
            if policy.warm_starts() {
                warm_keys(view, &jobs, &cfg.queues)
            } else {
                Vec::new()
            },
        )
    } else {
        (Vec::new(), Vec::new())
    };
    // No job of the round may run wider than its maximum (a merge, than
    // the larger of its jobs'), or hold more than it holds: the set stops
    // there. A datacenter's set has thousands of sizes (Ymir's {0,1,2,3,4m}
    // reaches 2,003 at 8,000 GPUs), every estimate row spans the whole set,
    // and a round's jobs use a handful of them.
    let widest = jobs
        .iter()
        .map(|&i| {
            let j = &view.jobs[i];
            j.max_gpus.max(j.min_gpus).max(j.holds.len() as u32)
        })
        .max()
        .unwrap_or(0);
    let allocations = policy
        .allocation_set(total_gpus)
        .into_iter()
        .filter(|&a| a <= widest)
        .collect();
    Prepared {
        nodes: present,
        capacity,
        profiling,
        jobs,
        allocations,
        kept,
        eligible,
        warm,
        unschedulable,
        family_nodes,
        total_gpus,
        pinned,
        caps,
        queue_out,
        deserved: quota.deserved,
        demand: quota.demand,
        budgets,
        queue_short,
    }
}

/// Each usable node's GPUs for the policy: none of a drained node; of a
/// Suspect or cordoned one only what it runs; else its GPUs less the
/// profiling runs reserved there.
fn capacity_of(view: &ClusterView, present: &[usize], reserved: &BTreeSet<Gpu>) -> Vec<u32> {
    present
        .iter()
        .map(|&n| {
            let node = &view.nodes[n];
            if node.drained {
                0
            } else if node.state == NodeState::Suspect || node.cordoned {
                // Suspect, it may only be late; cordoned, an operator holds
                // it: either way it keeps what it runs and gets nothing new.
                view.jobs
                    .iter()
                    .filter(|j| !j.profiling_run)
                    .flat_map(|j| &j.holds)
                    .filter(|g| g.0 == n)
                    .count() as u32
            } else {
                node.gpus - reserved.iter().filter(|g| g.0 == n).count() as u32
            }
        })
        .collect()
}

/// The jobs that enter the policy's snapshot (view jobs), and those no
/// node can hold under the executor's rule, with why (said of a queued
/// job, and of a submitted one that cannot even profile here).
fn round_jobs(
    view: &ClusterView,
    present: &[usize],
    cfg: &RoundConfig,
) -> (Vec<usize>, Vec<(usize, String)>) {
    let sizes = node_shapes(view, present);
    let mut unschedulable = Vec::new();
    let mut jobs = Vec::new();
    for (i, j) in view.jobs.iter().enumerate() {
        let why = never_fits(
            j.replica(),
            j.min_gpus,
            j.gpu_model.as_deref(),
            &sizes,
            cfg.max_nodes_per_group,
        )
        .or_else(|| {
            fits_no_family_of(j, &sizes).then(|| unfit_reason(&j.model, &j.unfit_families))
        });
        if let Some(why) = why {
            // Said of a queued job, and of a submitted one that cannot
            // even profile here (the others say it once they are queued).
            let say = match j.state {
                JobState::Queued => true,
                JobState::Submitted => cfg.profiling && cannot_profile(j, &sizes),
                _ => false,
            };
            if say {
                unschedulable.push((i, format!("waiting: {why}")));
            }
            continue;
        }
        let unprofiled = cfg.profiling
            && !j.skip_profiling
            && matches!(j.state, JobState::Submitted | JobState::Profiling);
        if !(j.held_back || unprofiled || j.state.is_terminal()) {
            jobs.push(i);
        }
    }
    (jobs, unschedulable)
}

/// The snapshot jobs as the queues' quota pass sees them (`crate::queue`):
/// queue, priority, preemption class, what each holds and the GPUs it may
/// take (a rigid policy's at its request).
fn quota_jobs(
    view: &ClusterView,
    jobs: &[usize],
    policy: &dyn Policy,
    cfg: &RoundConfig,
    family_nodes: &BTreeMap<String, Vec<u32>>,
    total_gpus: u32,
) -> Vec<QuotaJob> {
    let sizes_of_policy = policy.allocation_set(total_gpus);
    let takes_work = |n: usize| {
        let node = &view.nodes[n];
        node.state != NodeState::Offline && !node.drained
    };
    jobs.iter()
        .map(|&i| {
            let j = &view.jobs[i];
            let holds: Vec<&Gpu> = j.holds.iter().filter(|_| !j.profiling_run).collect();
            let cap = |g: u32| {
                offered(
                    cfg,
                    family_nodes,
                    g,
                    j.gpu_model.as_deref(),
                    &j.unfit_families,
                )
            };
            let max_gpus = cap(j.max_gpus).max(j.min_gpus);
            // A rigid policy runs the job at its request or not at all
            // (as policy::requested_allocation picks it), so the queue
            // must find room for all of it.
            let (min_gpus, max_gpus) = if policy.rigid() {
                let unit = j.replica().gpus().max(1);
                let fits: Vec<u32> = sizes_of_policy
                    .iter()
                    .copied()
                    .filter(|&a| a > 0 && a >= j.min_gpus && a <= max_gpus && a % unit == 0)
                    .collect();
                let size = crate::policy::nearest_request(&fits, cap(j.requested_gpus))
                    .unwrap_or(max_gpus);
                // A running job counts at what it holds (a
                // non-preemptive policy keeps it so).
                let size = size.max(holds.len() as u32);
                (size, size)
            } else {
                (j.min_gpus, max_gpus)
            };
            QuotaJob {
                queue: j.queue.clone(),
                priority: j.priority,
                preemptible: j.preemptible,
                holds: holds.len() as u32,
                may_stay: holds.iter().all(|g| takes_work(g.0)),
                min_gpus,
                max_gpus,
                submitted_at: j.submitted_at,
            }
        })
        .collect()
}

/// Profiling reservations: kept ones (job still profiling, every GPU on a
/// usable node) and new ones for submitted jobs, oldest first — one
/// replica on one node ([`JobView::replica`]: 1 GPU, a pipeline's 4 stages
/// as Ymir §5.2 profiles them, or an expert group), on the GPU model it
/// asks for. Free GPUs first; GPUs held by training only
/// while profiling holds at most `share` of the cluster (at least one
/// GPU; [`RoundConfig::profiling_share`]). The first job
/// that finds no GPUs stops the walk (later ones do not overtake it); a
/// job the cluster can never hold is passed over.
fn reserve_profiling(
    view: &ClusterView,
    present: &[usize],
    total_gpus: u32,
    share: f64,
) -> Vec<Reservation> {
    let usable = |n: usize| view.nodes[n].state == NodeState::Available && !view.nodes[n].drained;
    let mut out: Vec<Reservation> = view
        .jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| {
            j.state == JobState::Profiling
                && j.profiling_run
                && !j.holds.is_empty()
                && j.holds
                    .iter()
                    .all(|g| g.0 < view.nodes.len() && usable(g.0))
        })
        .map(|(i, j)| Reservation {
            job: i,
            gpus: j.holds.clone(),
            new: false,
        })
        .collect();
    let cap = ((f64::from(total_gpus) * share.clamp(0.0, 1.0)).floor() as usize).max(1);
    let busy: BTreeSet<Gpu> = view
        .jobs
        .iter()
        .filter(|j| !j.profiling_run)
        .flat_map(|j| j.holds.iter().copied())
        .collect();
    // GPUs of running non-preemptible jobs are never taken for profiling
    // (crate::queue pins them).
    let mut taken: BTreeSet<Gpu> = out
        .iter()
        .flat_map(|r| r.gpus.clone())
        .chain(
            view.jobs
                .iter()
                .filter(|j| !j.profiling_run && !j.preemptible)
                .flat_map(|j| j.holds.iter().copied()),
        )
        .collect();
    let mut waiting: Vec<usize> = (0..view.jobs.len())
        .filter(|&i| view.jobs[i].state == JobState::Submitted && !view.jobs[i].skip_profiling)
        .collect();
    waiting.sort_by(|&x, &y| {
        view.jobs[x]
            .submitted_at
            .total_cmp(&view.jobs[y].submitted_at)
            .then(x.cmp(&y))
    });
    let shapes = node_shapes(view, present);
    for i in waiting {
        let j = &view.jobs[i];
        if cannot_profile(j, &shapes) {
            // It can never run here (the round says why): it must not
            // hold up the jobs behind it.
            continue;
        }
        // One replica: a pipeline's stages, an expert group, or 1 GPU.
        let need = j.replica().gpus() as usize;
        let on_its_gpus = |n: usize| {
            j.gpu_model
                .as_deref()
                .is_none_or(|m| view.nodes[n].gpu_model == m)
                && !j.unfit_families.contains(&view.nodes[n].gpu_model)
        };
        let used_now: usize = out.iter().map(|r| r.gpus.len()).sum();
        let mut pick = None;
        for prefer_free in [true, false] {
            if !prefer_free && used_now + need > cap {
                break;
            }
            pick = present
                .iter()
                .filter(|&&n| usable(n) && !view.nodes[n].cordoned && on_its_gpus(n))
                .find_map(|&n| {
                    let gpus: Vec<Gpu> = (0..view.nodes[n].gpus)
                        .map(|g| (n, g))
                        .filter(|g| !taken.contains(g) && (!prefer_free || !busy.contains(g)))
                        .take(need)
                        .collect();
                    (gpus.len() == need).then_some(gpus)
                });
            if pick.is_some() {
                break;
            }
        }
        let Some(gpus) = pick else { break };
        taken.extend(gpus.iter().copied());
        out.push(Reservation {
            job: i,
            gpus,
            new: true,
        });
    }
    out
}
