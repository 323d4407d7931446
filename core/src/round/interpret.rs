//! Phase 3, **interpret**: the policy's [`Plan`] in view terms: concrete
//! GPUs (a group that keeps its node and size keeps its GPUs), new merges,
//! job state transitions with their reasons, restarts, leases, released
//! merges, and the placements the executor cannot run (each named, never
//! dropped silently).

use std::collections::{BTreeMap, BTreeSet};

use super::outcome::{Estimates, Group, Prepared, Reservation, RoundOutcome, Transition};
use super::shapes::mask_replicas;
use super::view::{
    ClusterView, Gpu, JobView, RoundConfig, group_due, holds_exactly, is_training, per_node,
};
use crate::job::JobState;
use crate::node::NodeState;
use crate::policy::{MergeMode, Plan, Policy, Snapshot};

/// Phase 3: the plan in view terms (see the module docs).
pub(super) fn interpret(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    snap: &Snapshot,
    plan: &Plan,
    policy: &dyn Policy,
    cfg: &RoundConfig,
) -> RoundOutcome {
    let (groups, mut unexecutable) = assign_gpus(view, prepared, estimates, plan, cfg);
    // Waiting jobs the quota pass kept out say why (running ones through
    // their transition).
    unexecutable.extend(
        prepared
            .queue_out
            .iter()
            .filter(|(i, _)| !is_training(&view.jobs[*i]))
            .cloned(),
    );
    // So do those the plan gave GPUs and placement found no room for on
    // the GPUs they can run on (running ones through their transition).
    let said: BTreeSet<usize> = unexecutable.iter().map(|u| u.0).collect();
    let unplaced: Vec<(usize, String)> = plan
        .stats
        .unplaced_jobs
        .iter()
        .filter_map(|&(k, gpus)| Some((*prepared.jobs.get(k)?, gpus)))
        .filter(|(i, _)| !said.contains(i) && !is_training(&view.jobs[*i]))
        .map(|(i, gpus)| (i, unplaced_why(&view.jobs[i], gpus)))
        .collect();
    // So do those a rigid policy left waiting once their queue's budget
    // had no room for them.
    if !prepared.queue_short.is_empty() {
        let mut left: BTreeMap<&str, u32> = prepared
            .budgets
            .iter()
            .map(|(q, &b)| (q.as_str(), b))
            .collect();
        let mut said: BTreeSet<usize> = unexecutable.iter().map(|u| u.0).collect();
        for g in &groups {
            said.extend(&g.jobs);
            if let Some(l) = left.get_mut(view.jobs[g.jobs[0]].queue.as_str()) {
                *l = l.saturating_sub(g.gpus.len() as u32);
            }
        }
        let snap_index: BTreeMap<usize, usize> = prepared
            .jobs
            .iter()
            .enumerate()
            .map(|(k, &i)| (i, k))
            .collect();
        let short: Vec<(usize, String)> = prepared
            .queue_short
            .iter()
            .filter(|(i, _)| !said.contains(i))
            .filter(|(i, _)| {
                let size = snap_index
                    .get(i)
                    .and_then(|&k| crate::policy::requested_allocation(snap, k));
                let room = left.get(view.jobs[*i].queue.as_str()).copied();
                matches!((size, room), (Some(a), Some(l)) if a > l)
            })
            .cloned()
            .collect();
        unexecutable.extend(short);
    }
    unexecutable.sort_by_key(|u| u.0);
    // Jobs that gave their GPUs to a group with less time to run
    // (placement's rule 6), by view index.
    let gave_way: BTreeMap<usize, usize> = plan
        .stats
        .displaced
        .iter()
        .filter_map(|&(j, to)| Some((*prepared.jobs.get(j)?, *prepared.jobs.get(to)?)))
        .collect();
    let transitions = transitions(view, prepared, &groups, &gave_way, cfg);
    let leases = leases(view, &groups, policy.lease_s(), policy.slo_lease_s());
    let switches = groups.iter().map(|g| g.starts(view).count()).sum();
    let placed: usize = groups.iter().map(|g| g.jobs.len()).sum::<usize>() - prepared.pinned.len();
    RoundOutcome {
        groups,
        profiling: prepared.profiling.clone(),
        transitions,
        leases,
        unschedulable: prepared.unschedulable.clone(),
        unexecutable,
        unplaced,
        switches,
        stats: plan.stats.clone(),
        queued: snap.jobs.len().saturating_sub(placed),
        released: Vec::new(),
        warm_starts: Vec::new(),
    }
}

/// A plan entry whose GPUs are still to be picked.
struct Unfilled {
    entry: usize,
    members: Vec<usize>,
    /// View node → GPUs.
    placement: Vec<(usize, u32)>,
}

/// Concrete GPUs for the plan's groups: a group that keeps its node and
/// size keeps its GPUs (unless a profiling run took one of them); the rest
/// take the lowest free GPUs of the nodes the placement chose. A group the
/// executor cannot run (more nodes than `max_nodes_per_group`) waits and is
/// named with the reason. Groups come out in plan order, new merges marked
/// with the gains they rest on.
fn assign_gpus(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    plan: &Plan,
    cfg: &RoundConfig,
) -> (Vec<Group>, Vec<(usize, String)>) {
    let reserved: BTreeSet<Gpu> = prepared
        .profiling
        .iter()
        .flat_map(|r| r.gpus.iter().copied())
        .collect();
    let mut used: BTreeSet<Gpu> = reserved.clone();
    let mut unexecutable = Vec::new();
    let mut groups: Vec<(usize, Group)> = Vec::new();
    // Pinned (running non-preemptible) jobs keep their GPUs, after the
    // plan's groups.
    for (k, &i) in prepared.pinned.iter().enumerate() {
        let mut gpus = view.jobs[i].holds.clone();
        gpus.sort_unstable();
        used.extend(gpus.iter().copied());
        groups.push((
            plan.entries.len() + k,
            Group::new(vec![i], MergeMode::Normal, gpus, true),
        ));
    }
    let mut unfilled: Vec<Unfilled> = Vec::new();
    for (k, e) in plan.entries.iter().enumerate() {
        let members: Vec<usize> = e.jobs.iter().map(|&x| prepared.jobs[x]).collect();
        // Snapshot node ordinals → view node ordinals.
        let placement: Vec<(usize, u32)> = e
            .placement
            .iter()
            .map(|&(n, g)| (prepared.nodes[n], g))
            .collect();
        if let Some(max) = cfg.max_nodes_per_group
            && placement.len() > max
        {
            let names: Vec<&str> = placement
                .iter()
                .map(|p| view.nodes[p.0].id.as_str())
                .collect();
            let why = format!(
                "waiting: {} placed it on {} GPUs over nodes {}, and a job spans at most {max} node(s) here",
                cfg.policy,
                e.gpus,
                names.join(", ")
            );
            unexecutable.extend(members.iter().map(|&i| (i, why.clone())));
            continue;
        }
        let merged_before = match members[..] {
            [a, b] => view
                .merges
                .iter()
                .any(|m| (m.a, m.b) == (a, b) || (m.a, m.b) == (b, a)),
            _ => true,
        };
        // A group keeps its GPUs when its first trainer held exactly them
        // (a new joint process never does, nor does A of a new temporal
        // merge: it is launched again to evaluate B with its weights, the
        // merge guard's watch); a shared GPU stays where either sharer runs.
        let now_held = match e.mode {
            MergeMode::Spatial | MergeMode::Temporal if !merged_before => Vec::new(),
            MergeMode::Shared => group_holds(view, &members),
            _ => group_holds(view, &members[..1]),
        };
        if !now_held.is_empty()
            && per_node(&now_held) == placement
            && !now_held
                .iter()
                .any(|g| reserved.contains(g) || used.contains(g))
        {
            used.extend(now_held.iter().copied());
            // Both sharers must have been there for nothing to start.
            let kept = e.mode != MergeMode::Shared
                || members
                    .iter()
                    .all(|&i| holds_exactly(&view.jobs[i], &now_held));
            groups.push((k, Group::new(members, e.mode, now_held, kept)));
        } else {
            unfilled.push(Unfilled {
                entry: k,
                members,
                placement,
            });
        }
    }
    for u in unfilled {
        // A cordoned node keeps what runs there; a group none of whose
        // members held GPUs there does not start on it (its capacity is
        // what runs there, so this is a job taking a suspended one's GPUs).
        let new_on_cordoned = u.placement.iter().find(|&&(n, _)| {
            view.nodes[n].cordoned
                && !u.members.iter().any(|&i| {
                    let j = &view.jobs[i];
                    !j.profiling_run && j.holds.iter().any(|g| g.0 == n)
                })
        });
        if let Some(&(n, _)) = new_on_cordoned {
            let why = format!(
                "waiting: {} placed it on node {}, which is cordoned (no new work)",
                cfg.policy, view.nodes[n].id
            );
            unexecutable.extend(u.members.iter().map(|&i| (i, why.clone())));
            continue;
        }
        let mut gpus = Vec::new();
        for &(n, g) in &u.placement {
            gpus.extend(
                (0..view.nodes[n].gpus)
                    .map(|x| (n, x))
                    .filter(|x| !used.contains(x))
                    .take(g as usize),
            );
        }
        let want: u32 = u.placement.iter().map(|p| p.1).sum();
        if gpus.len() as u32 != want {
            // Placement respects capacity, so this is a bug; the group waits
            // rather than sharing a GPU.
            let why = format!(
                "waiting: no {want} free GPUs where the plan put it (placement and GPUs disagree)"
            );
            unexecutable.extend(u.members.iter().map(|&i| (i, why.clone())));
            continue;
        }
        used.extend(gpus.iter().copied());
        let mode = plan.entries[u.entry].mode;
        groups.push((u.entry, Group::new(u.members, mode, gpus, false)));
    }
    groups.sort_by_key(|(k, _)| *k);
    let mut groups: Vec<Group> = groups.into_iter().map(|(_, g)| g).collect();
    for g in &mut groups {
        if let [a, b] = g.jobs[..]
            && g.mode != MergeMode::Shared
            && !view
                .merges
                .iter()
                .any(|m| (m.a, m.b) == (a, b) || (m.a, m.b) == (b, a))
        {
            let est = estimates
                .candidates
                .iter()
                .find(|c| c.pair.a == a && c.pair.b == b && c.pair.mode == g.mode);
            g.new_merge = Some(est.map_or((0.0, 0.0), |c| (c.gain_ab, c.gain_ba)));
        }
    }
    (groups, unexecutable)
}

/// The training GPUs `members` hold now: those of the first that holds any,
/// sorted.
fn group_holds(view: &ClusterView, members: &[usize]) -> Vec<Gpu> {
    members
        .iter()
        .map(|&i| &view.jobs[i])
        .find(|j| !j.profiling_run && !j.holds.is_empty())
        .map(|j| {
            let mut g = j.holds.clone();
            g.sort_unstable();
            g
        })
        .unwrap_or_default()
}

/// The nodes of these GPUs (sorted, as a group's are), as a job's history
/// names them: `a+b`.
fn node_names(view: &ClusterView, gpus: &[Gpu]) -> String {
    let mut n: Vec<&str> = gpus
        .iter()
        .filter_map(|g| view.nodes.get(g.0))
        .map(|n| n.id.as_str())
        .collect();
    n.dedup();
    n.join("+")
}

/// A GPU the job holds on a node that is gone or Offline.
fn lost_gpu<'v>(view: &ClusterView, j: &'v JobView) -> Option<&'v Gpu> {
    j.holds.iter().find(|g| {
        view.nodes
            .get(g.0)
            .is_none_or(|n| n.state == NodeState::Offline)
    })
}

/// The running jobs a round restarts elsewhere with no change of state to
/// say so, each with the kind of event its history shows and the note:
/// `moved` to another GPU family (placement's move to faster GPUs, or a
/// resize that lands there), `moved` to other nodes of the same family (a
/// drained node's job placed elsewhere in the round, naming the drained
/// node, or placement), `resized` to another GPU count. Each restarts from
/// its checkpoint. Not said here: a job whose node was lost (its
/// transitions say it), the jobs of a merge decided this round (the merge
/// event says it), and a kept group (no restart). The service writes them
/// as events.
pub fn restarts(view: &ClusterView, groups: &[Group]) -> Vec<(usize, &'static str, String)> {
    let node = |gpu: &Gpu| view.nodes.get(gpu.0);
    let mut out = Vec::new();
    for g in groups.iter().filter(|g| g.new_merge.is_none()) {
        for v in g.starts(view) {
            let j = &view.jobs[v];
            if j.state != JobState::Running || j.profiling_run || j.holds.is_empty() {
                continue;
            }
            let mut held = j.holds.clone();
            held.sort_unstable();
            if lost_gpu(view, j).is_some() || held == g.gpus {
                continue;
            }
            let (Some(from), Some(to)) = (
                j.holds.first().and_then(node),
                g.gpus.first().and_then(node),
            ) else {
                continue;
            };
            let (was, now) = (node_names(view, &held), node_names(view, &g.gpus));
            let (kind, what) = if from.gpu_model != to.gpu_model {
                (
                    "moved",
                    format!(
                        "moved from {} to {} GPUs ({} on {now})",
                        from.gpu_model,
                        to.gpu_model,
                        g.gpus.len()
                    ),
                )
            } else if held.len() != g.gpus.len() {
                (
                    "resized",
                    format!(
                        "resized from {} to {} GPUs on {now}",
                        held.len(),
                        g.gpus.len()
                    ),
                )
            } else if was == now {
                (
                    "moved",
                    format!("moved to other GPUs of {now} ({})", g.gpus.len()),
                )
            } else {
                let mut off: Vec<&str> = held
                    .iter()
                    .filter_map(node)
                    .filter(|n| n.drained)
                    .map(|n| n.id.as_str())
                    .collect();
                off.dedup();
                let why = if off.is_empty() {
                    String::new()
                } else {
                    format!(" (node {} is drained)", off.join(", "))
                };
                (
                    "moved",
                    format!("moved from {was} to {now} ({} GPUs){why}", g.gpus.len()),
                )
            };
            out.push((
                v,
                kind,
                format!("{what}, from its checkpoint (iteration {})", j.iteration),
            ));
        }
    }
    out
}

/// The job state changes of a round, with the reasons written on the jobs:
/// profiling starts (or starts again when its node was lost), trainers run,
/// everyone else waits — suspended, re-queued from a lost node, or still
/// waiting. `submitted → running` goes through `queued`, and so does a
/// running job whose node went offline and that runs elsewhere now.
fn transitions(
    view: &ClusterView,
    prepared: &Prepared,
    groups: &[Group],
    gave_way: &BTreeMap<usize, usize>,
    cfg: &RoundConfig,
) -> Vec<Transition> {
    let training: BTreeMap<usize, &Group> = groups
        .iter()
        .flat_map(|g| g.trainers().iter().map(move |&i| (i, g)))
        .collect();
    let profiled: BTreeMap<usize, &Reservation> =
        prepared.profiling.iter().map(|r| (r.job, r)).collect();
    let mut out = Vec::new();
    for (i, j) in view.jobs.iter().enumerate() {
        let mut push = |to: JobState, reason: String| out.push(Transition { job: i, to, reason });
        if let Some(r) = profiled.get(&i) {
            if j.state == JobState::Submitted {
                let on = node_names(view, &r.gpus);
                push(
                    JobState::Profiling,
                    format!("profiling on {on} ({} GPU)", r.gpus.len()),
                );
            }
            continue;
        }
        if cfg.profiling && j.state == JobState::Profiling {
            push(
                JobState::Submitted,
                "profiling node lost; profiling again".into(),
            );
            continue;
        }
        if cfg.profiling && j.state == JobState::Submitted && !j.skip_profiling {
            continue; // waits for a profiling GPU
        }
        let want = if training.contains_key(&i) {
            JobState::Running
        } else {
            JobState::Queued
        };
        let lost = lost_gpu(view, j);
        let offline = |lost: &Gpu| {
            format!(
                "node {} is offline: re-queued from its last checkpoint (iteration {})",
                view.nodes.get(lost.0).map_or("?", |n| n.id.as_str()),
                j.iteration
            )
        };
        let placed = |g: &Group| {
            format!(
                "placed on {} ({} GPUs) by {}",
                node_names(view, &g.gpus),
                g.gpus.len(),
                cfg.policy
            )
        };
        if j.state == want {
            // A job whose node went offline, placed elsewhere in the same
            // round, restarts from its checkpoint there: its history says
            // both moves, as over two rounds.
            if let (JobState::Running, Some(lost), Some(g)) = (want, lost, training.get(&i)) {
                push(JobState::Queued, offline(lost));
                push(JobState::Running, placed(g));
            }
            continue;
        }
        let reason = match (training.get(&i), j.state, lost) {
            (Some(g), ..) => placed(g),
            (None, JobState::Running, Some(lost)) => offline(lost),
            (None, JobState::Running, None) => {
                let drained = j
                    .holds
                    .iter()
                    .find(|g| view.nodes.get(g.0).is_some_and(|n| n.drained));
                match drained {
                    Some(g) => format!(
                        "node {} is drained: moved off from its checkpoint (iteration {})",
                        view.nodes[g.0].id, j.iteration
                    ),
                    None if let Some((_, why)) = prepared.queue_out.iter().find(|o| o.0 == i) => {
                        format!("{why} (iteration {})", j.iteration)
                    }
                    None if let Some(&to) = gave_way.get(&i) => format!(
                        "suspended from its checkpoint (iteration {}): its GPUs go to job {}, \
                         which has less left to run and fits only some GPU families \
                         (shortest remaining time first)",
                        j.iteration, view.jobs[to].id
                    ),
                    None if j.held_back => format!(
                        "held back this round (re-queued or retrying): suspended from its \
                         checkpoint (iteration {})",
                        j.iteration
                    ),
                    None => "suspended by the plan (checkpointed)".into(),
                }
            }
            _ => "waiting for GPUs".into(),
        };
        if j.state == JobState::Submitted && want == JobState::Running {
            push(JobState::Queued, "accepted for scheduling".into());
        }
        push(want, reason);
    }
    out
}

/// Why job `j`, whose group the plan gave `gpus` GPUs and placement could
/// not fit, waits.
fn unplaced_why(j: &JobView, gpus: u32) -> String {
    let on = match (&j.gpu_model, &j.unfit_families[..]) {
        (Some(m), _) => format!("the {m} GPUs it asks for"),
        (None, []) => "any node".to_string(),
        (None, unfit) => format!(
            "GPUs other than {} (its model does not fit those)",
            unfit.join(", ")
        ),
    };
    format!(
        "waiting: the plan runs it on {gpus} GPUs, but placement found no room for them on {on}"
    )
}

/// Leases after the round (Themis, UniSched; none when `lease_s` is 0): a
/// job that keeps its GPUs keeps its lease until it runs out; one that
/// keeps them after it ran out won them again and gets a new lease, as does
/// every job placed anew. A job with a deadline gets `slo_lease_s`.
fn leases(
    view: &ClusterView,
    groups: &[Group],
    lease_s: f64,
    slo_lease_s: f64,
) -> Vec<(usize, f64)> {
    if lease_s <= 0.0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for g in groups {
        for &i in &g.jobs {
            let running = view.jobs[i].lease_until;
            let term = if view.jobs[i].deadlines.iter().any(|s| s.by > view.now) {
                slo_lease_s
            } else {
                lease_s
            };
            let until = if g.kept && running > view.now {
                running
            } else {
                view.now + term
            };
            out.push((i, until));
        }
    }
    out
}

/// The kept temporal merges to split before the next round (indices into
/// `view.merges`; [`RoundOutcome::released`]): those whose A has trained
/// and whose B still waits behind it (it has not trained from A's
/// weights), where B alone, from scratch, on its fair share of the cluster
/// — at most the GPUs the round leaves free — would finish before the
/// group does at its best allocation: the test
/// Ymir applies to a new pair behind a trained A
/// ([`crate::policy::ymir::b_fares_no_worse`]), applied again while the
/// merge is kept. At formation A's time is its time then; the round then
/// sizes the group on the group's time, which ranks a long A with a B
/// behind it low under the shortest-remaining-time term, so on a busy
/// cluster it is kept on few GPUs and B waits for all of it (found on a
/// mixed cluster: A with 113,000 s left on one V100 for 30 h, B behind it,
/// while the cluster idled). A released B waits as any job and merges no
/// more (a job merges once). A merge that meets B's deadline is kept.
pub(super) fn released_merges(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    snap: &Snapshot,
    outcome: &RoundOutcome,
) -> Vec<usize> {
    // B alone starts on GPUs nobody was given this round, or waits: its
    // share is at most those (on a node the pair fills, B waits behind A
    // merged or not, and a release would only lose B its transfer).
    let used: usize = outcome.groups.iter().map(|g| g.gpus.len()).sum::<usize>()
        + outcome
            .profiling
            .iter()
            .map(|r| r.gpus.len())
            .sum::<usize>();
    let free = prepared
        .capacity
        .iter()
        .map(|&c| c as usize)
        .sum::<usize>()
        .saturating_sub(used);
    if free == 0 {
        return Vec::new();
    }
    let share = crate::policy::ymir::share_of_cluster(snap).min(free as f64);
    let mut out = Vec::new();
    for (k, &m) in prepared.kept.iter().enumerate() {
        let (Some(group), Some(alone)) = (snap.merges.get(k), estimates.kept_b_alone.get(k)) else {
            continue;
        };
        if group.mode != MergeMode::Temporal || alone.is_empty() {
            continue;
        }
        let (a, b) = (&snap.jobs[group.a], &snap.jobs[group.b]);
        if a.progress <= 0.0 || b.progress > 0.0 {
            continue;
        }
        // A deadline the group meets is not gambled on B's wait for GPUs
        // of its own (found on generated SLO workloads: released Bs missed
        // deadlines their groups met).
        let due = group_due(
            view,
            view.merges[m].a,
            view.merges[m].b,
            MergeMode::Temporal,
        );
        if due.is_finite() && group.remaining_s.iter().any(|&t| t <= due) {
            continue;
        }
        let alone = mask_replicas(
            &prepared.allocations,
            view.jobs[view.merges[m].b].replica().gpus(),
            b.min_gpus,
            alone,
        );
        if !crate::policy::ymir::b_fares_no_worse(
            snap,
            &alone,
            b.restart_s,
            &group.remaining_s,
            share,
        ) {
            out.push(m);
        }
    }
    out
}
