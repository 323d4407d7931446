//! Placement: maps each group's GPU count onto nodes (Ymir §5.1: "pack each
//! workload with as few nodes as possible").
//!
//! Rules, in order:
//! 1. A group whose size did not change keeps its GPUs where they are
//!    (moving running work costs a context switch).
//! 2. Remaining groups are placed largest first (ties by first job index)
//!    on the node with the fewest free GPUs that still fits them (best fit,
//!    which keeps roomier nodes whole for large groups and avoids
//!    fragmenting them). Node size is each node's own (4, 8, 16 GPUs…).
//!    On a mixed cluster a group takes the family where it fits on the
//!    fewest nodes, then where it runs fastest, then best fit
//!    (`fit_typed`).
//! 3. A data-parallel group that fits no single node spreads over the
//!    fewest nodes (roomiest first, the last by best fit). A
//!    pipeline-parallel group is placed in replicas of [`PIPELINE_STAGES`]
//!    GPUs, an expert-parallel one in its expert groups
//!    ([`super::Replica`]), each inside one node, on as few nodes as
//!    that allows; if a replica fits nowhere the group waits and the round
//!    reports it as unplaced. Under [`PlacementRule::FewestNodes`] (the authors'
//!    simulator) a data-parallel spread over more nodes than the cluster's
//!    largest nodes would need is refused too: the group waits.
//! 4. A job alone that stayed (rule 1) moves to a faster family whose GPUs
//!    the round left free, when the time it saves is more than twice its
//!    restart (`move_for_speed`).
//! 5. Before rule 4: a group that can run on some families only (its
//!    members do not fit the others, or name one) and found them full gets
//!    room there from a job alone that stayed and can run elsewhere, once
//!    the group has waited longer than the move costs that job
//!    (`make_room`).
//! 6. After rule 5, under [`place_shortest_first`] (Ymir): such a group
//!    that still found no room takes the GPUs of a group that stayed
//!    there and has longer to run than it plus its own restart, once it
//!    has waited longer than that restart (`displace_longer`); judged on
//!    the adverse ends of the two estimates' spreads, so an unsure
//!    estimate does not displace a job.

#[cfg(doc)]
use super::PIPELINE_STAGES;
use super::{PlacementRule, Plan, Snapshot};

/// Places every entry of `plan`; entries that cannot be placed are dropped
/// from the plan (their jobs stay queued) and counted in `stats.unplaced`.
pub fn place(snap: &Snapshot, plan: Plan) -> Plan {
    place_with(snap, plan, &|_| Preference::default())
}

/// Where a policy would rather see a group (Lyra §3.5.3). Rules 1–3 hold
/// as in [`place`]; a preference only orders the nodes they try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preference {
    /// `Some(true)`: loaned nodes first ([`super::NodeCap::loaned`]);
    /// `Some(false)`: the others first; None: no preference.
    pub loaned: Option<bool>,
    /// Place the first this-many GPUs (a job's base demand) and the rest
    /// (its flexible workers) on separate nodes where they fit apart, so a
    /// reclaim can take the flexible nodes without a preemption.
    pub split_base: Option<u32>,
}

/// [`place`] with a preference per entry.
pub fn place_with(
    snap: &Snapshot,
    plan: Plan,
    prefer: &dyn Fn(&super::PlanEntry) -> Preference,
) -> Plan {
    place_inner(snap, plan, prefer, None)
}

/// [`place`] with rule 6: a group that can run on some families only and
/// found them full takes the GPUs of one there that has longer to run
/// (`displace_longer`); for a policy that runs the shortest remaining
/// time first (Ymir's SRTF term). `risk_weight` κ weighs the estimates'
/// spreads as the policy's merger does (the exchange is judged on the
/// waiting group's `T·(1 + κ·s/2)` against the displaced one's
/// `T·max(0, 1 − κ·s/2)`); 0 = on the median estimates.
pub fn place_shortest_first(snap: &Snapshot, plan: Plan, risk_weight: f64) -> Plan {
    place_inner(snap, plan, &|_| Preference::default(), Some(risk_weight))
}

fn place_inner(
    snap: &Snapshot,
    mut plan: Plan,
    prefer: &dyn Fn(&super::PlanEntry) -> Preference,
    displace: Option<f64>,
) -> Plan {
    let mut free: Vec<u32> = snap.nodes.iter().map(|n| n.gpus).collect();
    let mut placed: Vec<Option<Vec<(usize, u32)>>> = vec![None; plan.entries.len()];

    // Rule 1: unchanged running groups stay.
    let mut stayed = keep_unchanged(snap, &plan, &mut free, &mut placed);

    // Rule 2 and 3: the rest, largest first.
    let mut order: Vec<usize> = (0..plan.entries.len())
        .filter(|&k| placed[k].is_none())
        .collect();
    order.sort_by_key(|&k| {
        (
            std::cmp::Reverse(plan.entries[k].gpus),
            plan.entries[k].jobs[0],
        )
    });
    let mut all_families: Vec<&str> = snap.nodes.iter().map(|n| n.gpu_model.as_str()).collect();
    all_families.sort_unstable();
    all_families.dedup();
    for k in order {
        let e = &plan.entries[k];
        let unit = super::entry_replica(snap, &e.jobs);
        let model = entry_model(snap, &e.jobs);
        let pref = prefer(e);
        // Not on a family where a member cannot run at all (a list of its
        // own only for a group that has such families).
        let unfit = |f: &str| unfit_for(snap, &e.jobs, f);
        let own: Vec<&str>;
        let allowed: &[&str] = if e
            .jobs
            .iter()
            .all(|&j| snap.jobs[j].unfit_families.is_empty())
        {
            &all_families
        } else {
            own = all_families.iter().copied().filter(|f| !unfit(f)).collect();
            &own
        };
        let speed = entry_speed(snap, e);
        let fams = Families {
            allowed,
            whole_cluster: allowed.len() == all_families.len(),
            speed: &speed,
        };
        placed[k] = if pref == Preference::default() {
            fit_typed(snap, fams, &mut free, e.gpus, unit, model)
        } else {
            fit_preferring(snap, fams, &mut free, e.gpus, unit, model, pref)
        };
    }

    // Rule 5 (before rule 4 takes free GPUs for speed): a group that can
    // run on some families only, and found them full, gets room there from
    // a job that can run elsewhere, once it has waited longer than the
    // move costs.
    let moved = make_room(snap, &plan, &stayed, &mut placed, &mut free, &all_families);
    stayed.retain(|k| !moved.contains(k));
    let mut displaced = Vec::new();
    if let Some(risk_weight) = displace {
        let cluster = (&all_families[..], risk_weight);
        displaced = displace_longer(snap, &plan, &stayed, &mut placed, &mut free, cluster);
        stayed.retain(|k| !displaced.iter().any(|d| d.0 == *k));
    }

    // Rule 4: a job that stayed (rule 1) moves to a faster family whose
    // GPUs the round left free, where the time it saves pays its restart;
    // not to a family that a group which can run on some families only
    // still waits for.
    let wanted: Vec<&str> = (0..plan.entries.len())
        .filter(|&k| placed[k].is_none())
        .flat_map(|k| {
            let own = allowed_families(snap, &plan.entries[k].jobs, &all_families);
            if own.len() < all_families.len() {
                own
            } else {
                Vec::new()
            }
        })
        .collect();
    let open: Vec<&str> = all_families
        .iter()
        .copied()
        .filter(|f| !wanted.contains(f))
        .collect();
    move_for_speed(snap, &plan, &stayed, &mut placed, &mut free, &open);

    // Displaced groups' jobs, each with the first job of the group it gave
    // way to.
    let gave_way: Vec<(usize, usize)> = displaced
        .iter()
        .flat_map(|&(v, k)| {
            let to = plan.entries[k].jobs[0];
            plan.entries[v].jobs.iter().map(move |&j| (j, to))
        })
        .collect();
    plan.stats.displaced.extend(gave_way);
    let mut unplaced = 0;
    let mut kept = Vec::with_capacity(plan.entries.len());
    for (mut e, p) in plan.entries.into_iter().zip(placed) {
        match p {
            Some(p) => {
                e.placement = p;
                kept.push(e);
            }
            None => {
                unplaced += 1;
                plan.stats
                    .unplaced_jobs
                    .extend(e.jobs.iter().map(|&j| (j, e.gpus)));
            }
        }
    }
    plan.entries = kept;
    plan.stats.unplaced += unplaced;
    plan
}

/// Rule 1 of [`place_with`]: a running group the plan leaves unchanged
/// (its GPUs, one family it can run on, whole replicas, room left) stays
/// where it runs; a shared GPU stays where either sharer runs. Returns the
/// entries that stayed.
fn keep_unchanged(
    snap: &Snapshot,
    plan: &Plan,
    free: &mut [u32],
    placed: &mut [Option<Vec<(usize, u32)>>],
) -> Vec<usize> {
    let mut stayed = Vec::new();
    for (k, e) in plan.entries.iter().enumerate() {
        // A shared GPU stays where either sharer runs (the other joins it).
        let shared = e.mode == super::MergeMode::Shared;
        let current = e
            .jobs
            .iter()
            .map(|&j| &snap.jobs[j].current_placement)
            .find(|p| !shared || !p.is_empty())
            .unwrap_or(&snap.jobs[e.jobs[0]].current_placement);
        let held: u32 = current.iter().map(|p| p.1).sum();
        let same_group = e.jobs.iter().all(|&j| {
            let p = &snap.jobs[j].current_placement;
            p == current || (shared && p.is_empty())
        });
        // A pipeline group whose replicas straddle nodes (placed before
        // this rule held) is placed afresh.
        let unit = super::entry_replica(snap, &e.jobs);
        let model = entry_model(snap, &e.jobs);
        if held == e.gpus
            && one_family(snap, current, model)
            && !on_unfit(snap, current, &e.jobs)
            && held > 0
            && same_group
            && current.iter().all(|&(n, g)| n < free.len() && free[n] >= g)
            && current.iter().all(|p| p.1.is_multiple_of(unit))
        {
            for &(n, g) in current {
                free[n] -= g;
            }
            placed[k] = Some(current.clone());
            stayed.push(k);
        }
    }
    stayed
}

/// Node index → GPUs, as in [`super::PlanEntry::placement`].
type Placement = Vec<(usize, u32)>;

/// Rule 4 of [`place_with`]: each job alone, or temporal pair, in a group
/// that stayed where it runs (rule 1; `stayed`, entries of `plan`) moves,
/// the longest first, to the family where it would finish soonest among
/// those it may run on (of `families`: those no group that can run on
/// some families only still waits for) whose GPUs are still `free` after
/// the round's other groups, when that saves more than twice its restart (the restart
/// itself, and as much again for the estimate's error). Its time there is
/// its time here (at the GPUs it holds) times its ratio there
/// ([`entry_ratios`]). The policy's times are estimated on the family a
/// job runs on, so without this a long job started on slow GPUs stays on
/// them after faster ones free up (found on a mixed cluster: 30 h on 8
/// V100s while every H100 sat idle; and a temporal pair, whose A had
/// 850 epochs to train, 54 h on 4 V100s, the last 48 h with the rest of
/// the cluster idle).
fn move_for_speed(
    snap: &Snapshot,
    plan: &Plan,
    stayed: &[usize],
    placed: &mut [Option<Placement>],
    free: &mut [u32],
    families: &[&str],
) {
    let mut movable: Vec<(usize, f64)> = stayed
        .iter()
        .copied()
        .filter(|&k| entry_model(snap, &plan.entries[k].jobs).is_none())
        .filter_map(|k| entry_time(snap, &plan.entries[k]).map(|t| (k, t)))
        .filter(|&(k, _)| !entry_ratios(snap, &plan.entries[k]).is_empty())
        .collect();
    movable.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
    for (k, t) in movable {
        let e = &plan.entries[k];
        let restart = entry_restart(snap, e);
        let ratios = entry_ratios(snap, e);
        let Some(here) = placed[k].as_ref().and_then(|p| p.first()).map(|p| p.0) else {
            continue;
        };
        let here = snap.nodes[here].gpu_model.as_str();
        let unit = super::entry_replica(snap, &e.jobs);
        let mut best: Option<(f64, Placement)> = None;
        for &fam in families.iter().filter(|&&f| f != here) {
            if unfit_for(snap, &e.jobs, fam) {
                continue;
            }
            let Some(&(_, ratio)) = ratios.iter().find(|(f, _)| f == fam) else {
                continue;
            };
            let saved = t * (1.0 - ratio);
            if !(ratio > 0.0 && saved > 2.0 * restart)
                || best.as_ref().is_some_and(|b| saved <= b.0)
            {
                continue;
            }
            let mut on_fam = masked(free, &|n| snap.nodes[n].gpu_model == fam);
            if let Some(p) = fit(snap, &mut on_fam, e.gpus, unit) {
                best = Some((saved, p));
            }
        }
        if let Some((_, p)) = best {
            for &(n, g) in &p {
                free[n] -= g;
            }
            if let Some(old) = placed[k].replace(p) {
                for (n, g) in old {
                    free[n] += g;
                }
            }
        }
    }
}

/// A group's remaining time at its GPUs in the plan: a job alone's, a
/// merged pair's as the group (a kept merge's or the round's candidate's
/// times); None where it is not known.
fn entry_time(snap: &Snapshot, e: &super::PlanEntry) -> Option<f64> {
    let t = match *e.jobs.as_slice() {
        [j] => snap.time_at(j, e.gpus),
        [a, b] => {
            let times = snap
                .merges
                .iter()
                .find(|m| m.a == a && m.b == b && m.mode == e.mode)
                .map(|m| &m.remaining_s)
                .or_else(|| {
                    snap.candidates
                        .iter()
                        .find(|c| c.a == a && c.b == b && c.mode == e.mode)
                        .map(|c| &c.remaining_s)
                })?;
            super::time_in(&snap.allocations, times, e.gpus)
        }
        _ => return None,
    };
    Some(t).filter(|t| t.is_finite() && *t > 0.0)
}

/// A group's restart: its members' longest.
fn entry_restart(snap: &Snapshot, e: &super::PlanEntry) -> f64 {
    e.jobs
        .iter()
        .map(|&j| snap.jobs[j].restart_s)
        .fold(0.0, f64::max)
}

/// A group's time on each other GPU family relative to its time on the
/// family it is estimated on ([`super::SchedJob::family_time_ratio`]): a
/// job alone's own ratios; for a temporal pair, whose A trains and then B
/// from A's weights on the same GPUs, the ratio of `ρ_A·T_A + ρ_B·(T − T_A)`
/// to `T` (T the group's time, `T_A` A's own part), on the families where
/// both ratios are known. None for a spatial pair: one joint process,
/// whose time is not its members'.
fn entry_ratios(snap: &Snapshot, e: &super::PlanEntry) -> Vec<(String, f64)> {
    match (e.mode, e.jobs.as_slice()) {
        (super::MergeMode::Normal, [j]) => snap.jobs[*j].family_time_ratio.clone(),
        (super::MergeMode::Temporal, &[a, b]) => {
            let Some(t) = entry_time(snap, e) else {
                return Vec::new();
            };
            let ta = snap.time_at(a, e.gpus);
            let ta = if ta.is_finite() { ta.clamp(0.0, t) } else { t };
            let (ja, jb) = (&snap.jobs[a], &snap.jobs[b]);
            ja.family_time_ratio
                .iter()
                .filter_map(|(f, ra)| {
                    let (_, rb) = jb.family_time_ratio.iter().find(|(g, _)| g == f)?;
                    Some((f.clone(), (ra * ta + rb * (t - ta)) / t))
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Rule 5 of [`place_with`]: room for a group the plan runs and rules 2–3
/// could not place because the GPU families it can run on (those its
/// members fit, or the one they name) are full, while other families have
/// GPUs the plan leaves free. The round's capacity counts GPUs of every
/// family, so such a group is given GPUs round after round and placed
/// nowhere, while jobs that could run anywhere hold its families: on a
/// mixed cluster a rigid pipeline job that does not fit V100s waited for
/// hours with a quarter of the cluster idle.
///
/// A job alone or a temporal pair that stayed where it runs (rule 1), on
/// one of the group's families, moves to another family where it fits in
/// what is free and where its time is known ([`entry_ratios`]); the group
/// takes the room it leaves. The move costs the moved job its restart and
/// its slowdown there over its remaining time, `restart + T·max(0, ρ − 1)`
/// (ρ its time there over its time here), and is made only once the group
/// has waited longer than that: the ski-rental rule (wait while waiting
/// has cost less than moving, then move), which never pays more than
/// twice the better of the two. Of the moves that make room, the cheapest
/// is made. Where no one move makes room (the group needs a whole node
/// that several small jobs share), the jobs of one node move, the cheapest
/// first, until the group fits there, once it has waited longer than
/// their moves cost together ([`room_by_several_moves`]; found on
/// generated mixed loads: a short pipeline job waited 14 times its length
/// for 4 GPUs of one A100 or H100 node that 1- and 2-GPU jobs held). Each
/// job moves at most once a round. Returns the moved entries.
fn make_room(
    snap: &Snapshot,
    plan: &Plan,
    stayed: &[usize],
    placed: &mut [Option<Placement>],
    free: &mut [u32],
    all_families: &[&str],
) -> Vec<usize> {
    let mut moved = Vec::new();
    for k in 0..plan.entries.len() {
        if placed[k].is_some() {
            continue;
        }
        let e = &plan.entries[k];
        let model = entry_model(snap, &e.jobs);
        let families = allowed_families(snap, &e.jobs, all_families);
        if families.is_empty() || families.len() == all_families.len() {
            // It can run anywhere: nothing elsewhere to move for it.
            continue;
        }
        let waited = entry_waited(snap, e);
        let speed = entry_speed(snap, e);
        let fams = Families {
            allowed: &families,
            whole_cluster: false,
            speed: &speed,
        };
        let unit = super::entry_replica(snap, &e.jobs);
        // (cost, the moved entry, its placement, the group's, free after).
        let mut best: Option<(f64, usize, Placement, Placement, Vec<u32>)> = None;
        for &v in stayed {
            let ve = &plan.entries[v];
            let Some(old) = placed[v].as_ref() else {
                continue;
            };
            let Some(here) = old.first().map(|p| snap.nodes[p.0].gpu_model.as_str()) else {
                continue;
            };
            let Some(t) = entry_time(snap, ve) else {
                continue;
            };
            if moved.contains(&v)
                || entry_model(snap, &ve.jobs).is_some()
                || !families.contains(&here)
            {
                continue;
            }
            // What is free once it leaves, and its replica.
            let mut freed = free.to_vec();
            for &(n, g) in old {
                freed[n] += g;
            }
            let vunit = super::entry_replica(snap, &ve.jobs);
            let restart = entry_restart(snap, ve);
            for (fam, ratio) in &entry_ratios(snap, ve) {
                let cost = move_cost(restart, t, *ratio);
                if fam == here
                    || unfit_for(snap, &ve.jobs, fam)
                    || !(*ratio > 0.0 && cost <= waited)
                    || best.as_ref().is_some_and(|b| cost >= b.0)
                {
                    continue;
                }
                let mut trial = freed.clone();
                let mut on_fam = masked(&trial, &|n| snap.nodes[n].gpu_model == *fam);
                let Some(vp) = fit(snap, &mut on_fam, ve.gpus, vunit) else {
                    continue;
                };
                for &(n, g) in &vp {
                    trial[n] -= g;
                }
                if let Some(kp) = fit_typed(snap, fams, &mut trial, e.gpus, unit, model) {
                    best = Some((cost, v, vp, kp, trial));
                }
            }
        }
        if let Some((_, v, vp, kp, after)) = best {
            free.copy_from_slice(&after);
            placed[v] = Some(vp);
            placed[k] = Some(kp);
            moved.push(v);
        } else if let Some(room) =
            room_by_several_moves(snap, plan, stayed, placed, free, &moved, (k, fams, waited))
        {
            free.copy_from_slice(&room.free_after);
            for (v, vp) in room.moves {
                placed[v] = Some(vp);
                moved.push(v);
            }
            placed[k] = Some(room.group);
        }
    }
    moved
}

/// Rule 6 ([`place_shortest_first`]): a group that can run on some families only,
/// and found no room there even after rule 5's moves, takes the GPUs of a
/// group that stayed there and has longer to run: the exchange argument of
/// shortest-remaining-time-first. Running the waiting group (time `T_k`)
/// first and the displaced one (`T_v`, restart `r_v`) after finishes both
/// sooner in sum than the other order when `T_v > T_k + r_v`. Made once the
/// group has waited longer than the displaced group's restart (the ski
/// rental of rule 5: never more than twice the better choice), and of the
/// groups whose GPUs make room, the one the exchange gains most on. The
/// displaced group waits (the round reports it unplaced), and each is
/// displaced at most once a round. Returns each displaced entry with the
/// entry it gave way to.
///
/// Not a gamble on a wide estimate: with the risk weight κ the exchange is judged on the
/// adverse ends of the two estimates, the waiting group's `T_k·(1 +
/// κ·s_k/2)` and the displaced one's `T_v·max(0, 1 − κ·s_v/2)` (`s` a
/// group's widest relative p10–p90 spread, [`super::SchedJob::spread`];
/// the discount of Ymir's merger, `ymir.rs`), so the exchange is made only
/// where it gains although the shorter job may be longer and the longer
/// one shorter than their medians say.
fn displace_longer(
    snap: &Snapshot,
    plan: &Plan,
    stayed: &[usize],
    placed: &mut [Option<Placement>],
    free: &mut [u32],
    (all_families, risk_weight): (&[&str], f64),
) -> Vec<(usize, usize)> {
    let spread = |e: &super::PlanEntry| {
        let s = e
            .jobs
            .iter()
            .map(|&j| snap.jobs[j].spread)
            .fold(0.0, f64::max);
        risk_weight.max(0.0) * s.max(0.0) / 2.0
    };
    let mut displaced = Vec::new();
    for k in 0..plan.entries.len() {
        if placed[k].is_some() {
            continue;
        }
        let e = &plan.entries[k];
        let families = allowed_families(snap, &e.jobs, all_families);
        if families.is_empty() || families.len() == all_families.len() {
            continue;
        }
        let Some(tk) = entry_time(snap, e) else {
            continue;
        };
        let tk = tk * (1.0 + spread(e));
        let waited = entry_waited(snap, e);
        let model = entry_model(snap, &e.jobs);
        let unit = super::entry_replica(snap, &e.jobs);
        let speed = entry_speed(snap, e);
        let fams = Families {
            allowed: &families,
            whole_cluster: false,
            speed: &speed,
        };
        // (gain, the displaced entry, the group's placement, free after).
        let mut best: Option<(f64, usize, Placement, Vec<u32>)> = None;
        for &v in stayed {
            let Some(old) = placed[v].as_ref() else {
                continue;
            };
            if displaced.iter().any(|d: &(usize, usize)| d.0 == v)
                || !old
                    .iter()
                    .any(|p| families.contains(&snap.nodes[p.0].gpu_model.as_str()))
            {
                continue;
            }
            let Some(tv) = entry_time(snap, &plan.entries[v]) else {
                continue;
            };
            let tv = tv * (1.0 - spread(&plan.entries[v])).max(0.0);
            let rv = entry_restart(snap, &plan.entries[v]);
            let gain = tv - (tk + rv);
            if gain <= 0.0 || waited < rv || best.as_ref().is_some_and(|b| gain <= b.0) {
                continue;
            }
            let mut trial = free.to_vec();
            for &(n, g) in old {
                trial[n] += g;
            }
            if let Some(kp) = fit_typed(snap, fams, &mut trial, e.gpus, unit, model) {
                best = Some((gain, v, kp, trial));
            }
        }
        if let Some((_, v, kp, after)) = best {
            free.copy_from_slice(&after);
            placed[v] = None;
            placed[k] = Some(kp);
            displaced.push((v, k));
        }
    }
    displaced
}

/// How long a group has waited: its longest-waiting member's wait.
fn entry_waited(snap: &Snapshot, e: &super::PlanEntry) -> f64 {
    e.jobs
        .iter()
        .map(|&j| snap.jobs[j].waited(snap.now))
        .fold(0.0, f64::max)
}

/// What moving a group off its family costs it ([`make_room`]'s ski
/// rental): its restart, and its slowdown there over its remaining time
/// `t` (`ratio`: its time there over its time here).
fn move_cost(restart: f64, t: f64, ratio: f64) -> f64 {
    restart + t * (ratio - 1.0).max(0.0)
}

/// The GPU families of `all` a group may run on: the one its members
/// name, if any, less those where a member cannot run.
fn allowed_families<'f>(snap: &Snapshot, jobs: &[usize], all: &[&'f str]) -> Vec<&'f str> {
    let model = entry_model(snap, jobs);
    all.iter()
        .copied()
        .filter(|f| model.is_none_or(|m| m == *f) && !unfit_for(snap, jobs, f))
        .collect()
}

/// A move of entry `v` (placed at `old`) off its family to the one where
/// it costs least (`restart + T·max(0, ρ − 1)`, [`make_room`]) and fits in
/// `free` (with its own GPUs given back): its cost and placement there.
fn cheapest_move(
    snap: &Snapshot,
    plan: &Plan,
    v: usize,
    old: &[(usize, u32)],
    free: &[u32],
) -> Option<(f64, Placement)> {
    let ve = &plan.entries[v];
    let here = old.first().map(|p| snap.nodes[p.0].gpu_model.as_str())?;
    let t = entry_time(snap, ve)?;
    if entry_model(snap, &ve.jobs).is_some() {
        return None;
    }
    let mut freed = free.to_vec();
    for &(n, g) in old {
        freed[n] += g;
    }
    let unit = super::entry_replica(snap, &ve.jobs);
    let restart = entry_restart(snap, ve);
    let mut best: Option<(f64, Placement)> = None;
    for (fam, ratio) in &entry_ratios(snap, ve) {
        let cost = move_cost(restart, t, *ratio);
        if fam == here
            || unfit_for(snap, &ve.jobs, fam)
            || *ratio <= 0.0
            || best.as_ref().is_some_and(|b| cost >= b.0)
        {
            continue;
        }
        let mut on_fam = masked(&freed, &|n| snap.nodes[n].gpu_model == *fam);
        if let Some(p) = fit(snap, &mut on_fam, ve.gpus, unit) {
            best = Some((cost, p));
        }
    }
    best
}

/// Room for a group made by moving other entries: what they cost together,
/// the moves (entry, placement), the group's placement and what is free
/// after.
struct Room {
    cost: f64,
    moves: Vec<(usize, Placement)>,
    group: Placement,
    free_after: Vec<u32>,
}

/// [`make_room`] for group `k` where no one move makes room: on each node
/// of its families, the entries that stayed there (`stayed`, not `moved`
/// yet) move off, the cheapest first, each to its cheapest family where
/// it fits, until group `k` fits on what is free; made only where the
/// moves together cost no more than the group has `waited`. Of the nodes
/// where it works, the cheapest set of moves.
fn room_by_several_moves(
    snap: &Snapshot,
    plan: &Plan,
    stayed: &[usize],
    placed: &[Option<Placement>],
    free: &[u32],
    moved: &[usize],
    (k, fams, waited): (usize, Families<'_>, f64),
) -> Option<Room> {
    let e = &plan.entries[k];
    let unit = super::entry_replica(snap, &e.jobs);
    let model = entry_model(snap, &e.jobs);
    let mut best: Option<Room> = None;
    for n in
        (0..snap.nodes.len()).filter(|&n| fams.allowed.contains(&snap.nodes[n].gpu_model.as_str()))
    {
        // The entries on node n that could move, the cheapest first.
        let mut on_n: Vec<(f64, usize)> = stayed
            .iter()
            .copied()
            .filter(|v| !moved.contains(v))
            .filter_map(|v| {
                let old = placed[v].as_ref()?;
                if !old.iter().any(|p| p.0 == n) {
                    return None;
                }
                cheapest_move(snap, plan, v, old, free).map(|(c, _)| (c, v))
            })
            .collect();
        on_n.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        let mut trial = free.to_vec();
        let mut cost = 0.0;
        let mut moves = Vec::new();
        for (_, v) in on_n {
            let Some(old) = placed[v].as_ref() else {
                continue;
            };
            let Some((c, vp)) = cheapest_move(snap, plan, v, old, &trial) else {
                continue;
            };
            cost += c;
            if cost > waited || best.as_ref().is_some_and(|b| cost >= b.cost) {
                break;
            }
            for &(m, g) in old {
                trial[m] += g;
            }
            for &(m, g) in &vp {
                trial[m] -= g;
            }
            moves.push((v, vp));
            let mut after = trial.clone();
            if let Some(group) = fit_typed(snap, fams, &mut after, e.gpus, unit, model) {
                best = Some(Room {
                    cost,
                    moves: std::mem::take(&mut moves),
                    group,
                    free_after: after,
                });
                break;
            }
        }
    }
    best
}

/// The GPU family a group must run on: the first its members ask for.
pub(crate) fn entry_model<'s>(snap: &'s Snapshot, jobs: &[usize]) -> Option<&'s str> {
    jobs.iter().find_map(|&j| snap.jobs[j].gpu_model.as_deref())
}

/// The GPU families a group may be placed on (sorted, distinct), whether
/// they are all of the cluster's, and its time on each relative to one
/// of them ([`entry_speed`]; a family not listed counts as 1).
#[derive(Clone, Copy)]
struct Families<'a> {
    allowed: &'a [&'a str],
    whole_cluster: bool,
    speed: &'a [(String, f64)],
}

/// A group's time on each GPU family relative to one of them
/// ([`entry_ratios`]), where the difference is more than twice its
/// restart (rule 4's bar: a smaller gain would not move it, and leaves the
/// faster GPUs to jobs it pays for): a job alone's or a temporal pair's;
/// none for a spatial pair (one joint process, whose time is not its
/// members').
fn entry_speed(snap: &Snapshot, e: &super::PlanEntry) -> Vec<(String, f64)> {
    let Some(t) = entry_time(snap, e) else {
        return Vec::new();
    };
    let restart = entry_restart(snap, e);
    entry_ratios(snap, e)
        .into_iter()
        .filter(|(_, r)| (t * (1.0 - r)).abs() > 2.0 * restart)
        .collect()
}

/// Whether a placement uses a family where one of `jobs` cannot run.
fn on_unfit(snap: &Snapshot, placement: &[(usize, u32)], jobs: &[usize]) -> bool {
    placement
        .iter()
        .filter(|p| p.0 < snap.nodes.len())
        .any(|p| unfit_for(snap, jobs, &snap.nodes[p.0].gpu_model))
}

/// Whether one of `jobs` cannot run on `family` at all.
fn unfit_for(snap: &Snapshot, jobs: &[usize], family: &str) -> bool {
    jobs.iter()
        .any(|&j| snap.jobs[j].unfit_families.iter().any(|u| u == family))
}

/// Whether these placed nodes are of one GPU family, and of `model` if set.
pub(crate) fn one_family(snap: &Snapshot, placement: &[(usize, u32)], model: Option<&str>) -> bool {
    let mut fams = placement
        .iter()
        .filter(|p| p.0 < snap.nodes.len())
        .map(|p| snap.nodes[p.0].gpu_model.as_str());
    let Some(first) = fams.next() else {
        return true;
    };
    fams.all(|f| f == first) && model.is_none_or(|m| m == first)
}

/// [`fit`] on the nodes of one GPU family: `model`'s, or for a group that
/// names none, the family where it fits on the fewest nodes, then the
/// one where it runs fastest ([`Families::speed`]), then the one with the
/// least left over on those nodes (best fit across families). Without
/// the speed a new job was placed on slow GPUs while faster ones sat
/// free, and rule 4 moved it the next round, restarting it at iteration
/// 0. A group never spans two families (a gang of mixed GPUs runs at its
/// slowest member's pace, and NCCL rings over mixed NVLink generations
/// are slower still). `families` are the cluster's, sorted and distinct.
fn fit_typed(
    snap: &Snapshot,
    families: Families<'_>,
    free: &mut [u32],
    gpus: u32,
    unit: u32,
    model: Option<&str>,
) -> Option<Vec<(usize, u32)>> {
    if let ([only], true) = (families.allowed, families.whole_cluster) {
        // One family (the common case): no masking, no allocation.
        return match model {
            Some(m) if m != *only => None,
            _ => fit(snap, free, gpus, unit),
        };
    }
    // (nodes used, relative time, GPUs left free on them) and the
    // placement; the first family of equals.
    let mut best: Option<((usize, f64, u32), Placement)> = None;
    for &fam in families
        .allowed
        .iter()
        .filter(|f| model.is_none_or(|m| m == **f))
    {
        let mut masked = masked(free, &|n| snap.nodes[n].gpu_model == fam);
        if let Some(p) = fit(snap, &mut masked, gpus, unit) {
            let ratio = (families.speed.iter())
                .find(|(f, _)| f == fam)
                .map_or(1.0, |r| r.1);
            let key = (
                p.len(),
                ratio,
                p.iter().map(|&(n, _)| masked[n]).sum::<u32>(),
            );
            let better = |b: &(usize, f64, u32)| {
                key.0
                    .cmp(&b.0)
                    .then(key.1.total_cmp(&b.1))
                    .then(key.2.cmp(&b.2))
                    .is_lt()
            };
            if best.as_ref().is_none_or(|b| better(&b.0)) {
                best = Some((key, p));
            }
        }
    }
    let (_, p) = best?;
    for &(n, g) in &p {
        free[n] -= g;
    }
    Some(p)
}

/// `free` with the nodes `keep` refuses counted as full.
fn masked(free: &[u32], keep: &dyn Fn(usize) -> bool) -> Vec<u32> {
    (0..free.len())
        .map(|n| if keep(n) { free[n] } else { 0 })
        .collect()
}

/// [`fit_typed`] on the preferred nodes first, then on any; with
/// `split_base`, the base part first and the rest on other nodes (of the
/// same family) where it fits apart, else wherever it fits.
fn fit_preferring(
    snap: &Snapshot,
    families: Families<'_>,
    free: &mut [u32],
    gpus: u32,
    unit: u32,
    model: Option<&str>,
    pref: Preference,
) -> Option<Vec<(usize, u32)>> {
    // One fit on the nodes `allowed` keeps, committed to `free`.
    let try_on = |free: &mut [u32],
                  gpus: u32,
                  model: Option<&str>,
                  allowed: &dyn Fn(usize) -> bool|
     -> Option<Placement> {
        let mut masked = masked(free, allowed);
        let p = fit_typed(snap, families, &mut masked, gpus, unit, model)?;
        for &(n, g) in &p {
            free[n] -= g;
        }
        Some(p)
    };
    let preferred = |n: usize| pref.loaned.is_none_or(|l| snap.nodes[n].loaned == l);
    let fit_one = |free: &mut [u32], gpus: u32, model: Option<&str>, avoid: &[usize]| {
        try_on(free, gpus, model, &|n| preferred(n) && !avoid.contains(&n))
            .or_else(|| try_on(free, gpus, model, &|n| !avoid.contains(&n)))
    };
    let Some(base) = pref
        .split_base
        .filter(|&b| b > 0 && b < gpus && b.is_multiple_of(unit))
    else {
        return fit_one(free, gpus, model, &[]);
    };
    let mut trial = free.to_vec();
    let Some(first) = fit_one(&mut trial, base, model, &[]) else {
        return fit_one(free, gpus, model, &[]);
    };
    // The rest on the first part's family, on other nodes.
    let family = first
        .first()
        .map(|p| snap.nodes[p.0].gpu_model.as_str())
        .or(model);
    let used: Vec<usize> = first.iter().map(|p| p.0).collect();
    let Some(rest) = fit_one(&mut trial, gpus - base, family, &used) else {
        return fit_one(free, gpus, model, &[]);
    };
    free.copy_from_slice(&trial);
    let mut all: std::collections::BTreeMap<usize, u32> = Default::default();
    for (n, g) in first.into_iter().chain(rest) {
        *all.entry(n).or_default() += g;
    }
    Some(all.into_iter().collect())
}

/// Places `gpus` in replicas of `unit` GPUs, each inside one node.
fn fit(snap: &Snapshot, free: &mut [u32], gpus: u32, unit: u32) -> Option<Vec<(usize, u32)>> {
    if gpus == 0 {
        return Some(Vec::new());
    }
    if unit > 1 {
        return fit_replicas(free, gpus, unit);
    }
    // Best fit inside one node.
    if let Some(n) = best_fit(free, gpus) {
        free[n] -= gpus;
        return Some(vec![(n, gpus)]);
    }
    let authors = snap.placement_rule == PlacementRule::FewestNodes;
    let nodes = fewest_nodes(free, gpus, !authors)?;
    if authors && nodes.len() > fewest_possible(snap, gpus) {
        // The authors' rule: no more nodes than the size needs.
        return None;
    }
    let mut left = gpus;
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        let take = free[n].min(left);
        free[n] -= take;
        left -= take;
        out.push((n, take));
    }
    out.sort_unstable();
    Some(out)
}

/// The node with the fewest free GPUs that still holds `gpus` (lowest id
/// on ties): it keeps roomier nodes whole for larger groups.
fn best_fit(free: &[u32], gpus: u32) -> Option<usize> {
    (0..free.len())
        .filter(|&n| free[n] >= gpus)
        .min_by_key(|&n| (free[n], n))
}

/// The nodes a data-parallel group of `gpus` spreads over: as few as
/// possible, the roomiest first. With `best_fit_last` the last one is
/// chosen by best fit for what is left, so a 6-GPU group on free nodes of
/// 4, 4, 4 and 2 GPUs takes 4 + 2 and leaves two whole nodes; without it
/// (the authors' simulator, whose runs `fmsim fidelity` replays) the
/// roomiest nodes are taken to the end: 4 + 4, of which 2 are used. Node
/// sizes may differ (4, 8, 16 GPUs).
fn fewest_nodes(free: &[u32], gpus: u32, best_fit_last: bool) -> Option<Vec<usize>> {
    let mut by_free: Vec<usize> = (0..free.len()).filter(|&n| free[n] > 0).collect();
    by_free.sort_by_key(|&n| (std::cmp::Reverse(free[n]), n));
    let mut left = gpus;
    let mut out = Vec::new();
    for (k, &n) in by_free.iter().enumerate() {
        if free[n] >= left {
            let last = if best_fit_last {
                by_free[k..]
                    .iter()
                    .copied()
                    .filter(|&m| free[m] >= left)
                    .min_by_key(|&m| (free[m], m))
                    .unwrap_or(n)
            } else {
                n
            };
            out.push(last);
            return Some(out);
        }
        left -= free[n];
        out.push(n);
    }
    None
}

/// Fewest nodes of this cluster (by size, not by what is free now) that
/// can hold `gpus`.
fn fewest_possible(snap: &Snapshot, gpus: u32) -> usize {
    let mut sizes: Vec<u32> = snap.nodes.iter().map(|n| n.gpus).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let mut left = gpus;
    let mut k = 0;
    for s in sizes {
        if left == 0 {
            break;
        }
        left = left.saturating_sub(s);
        k += 1;
    }
    k.max(1)
}

/// A group of replicas of `unit` GPUs that must each sit on one node: a
/// pipeline-parallel group (Ymir §5.2: allocations `{4m}`, whole GPU
/// servers) of `gpus / PIPELINE_STAGES` pipeline replicas — the stages of
/// a replica talk every micro-batch and must not cross the network — or an
/// expert-parallel group of `gpus / ep` expert groups (Lina: the experts'
/// all-to-all stays on NVLink). The whole group goes on one node when one
/// holds it (best fit); else replica by replica, each by best fit, so on
/// 8-GPU servers a 4-stage job takes half a server and a 16-GPU job two
/// whole ones. A node smaller than a replica is never used (the
/// cluster-wide check that some node can hold one is in
/// `round::never_fits`). Nothing is taken unless every replica fits.
fn fit_replicas(free: &mut [u32], gpus: u32, unit: u32) -> Option<Vec<(usize, u32)>> {
    if !gpus.is_multiple_of(unit) {
        return None;
    }
    if let Some(n) = best_fit(free, gpus) {
        free[n] -= gpus;
        return Some(vec![(n, gpus)]);
    }
    let mut trial = free.to_vec();
    let mut per_node: std::collections::BTreeMap<usize, u32> = Default::default();
    for _ in 0..gpus / unit {
        let n = best_fit(&trial, unit)?;
        trial[n] -= unit;
        *per_node.entry(n).or_default() += unit;
    }
    free.copy_from_slice(&trial);
    Some(per_node.into_iter().collect())
}

#[cfg(test)]
mod tests;
