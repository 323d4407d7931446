//! What Ymir plans when the solver does not answer in time: its LP
//! relaxation rounded greedily, and the plain fallback that keeps current
//! groups and grows the rest.

use crate::policy::ymir::Unit;
use crate::policy::{MergeMode, Plan, PlanEntry, Snapshot, SolveStats, time_in};

/// The greedy of the multiple-choice knapsack's LP relaxation (Sinha &
/// Zoltners 1979), for rounds too large to solve exactly in time. Each
/// row (a unit or a candidate pair) offers `(GPUs, value)` choices and runs
/// its `members`' jobs; at most one choice per row, rows sharing a job
/// exclusive (Eq. 9–10), GPUs within `capacity` (Eq. 11).
///
/// Each row's choices are reduced to the upper concave hull of its
/// `(GPUs, value)` points from `(0, 0)`; the hull's steps, taken in order
/// of value per GPU across all rows, solve the LP relaxation of the
/// single-capacity problem, whose optimum has at most one fractional row.
/// Here a step that does not fit closes its row, a row's first step needs
/// every member job free (so a pair and its jobs exclude each other,
/// whichever gains more per GPU first), and the GPUs left after the pass
/// go to the best-value-per-GPU step that still fits (a choice off the
/// hull included). Returns the GPUs per row and the objective.
pub(crate) fn relaxation_greedy(
    rows: &[Vec<(u32, f64)>],
    members: &[Vec<usize>],
    capacity: u32,
) -> (Vec<u32>, f64) {
    let mut steps = hull_steps(rows);
    let per_gpu = |s: &(usize, u32, u32, f64)| s.3 / f64::from(s.2 - s.1);
    steps.sort_by(|x, y| {
        per_gpu(y)
            .total_cmp(&per_gpu(x))
            .then(x.0.cmp(&y.0))
            .then(x.1.cmp(&y.1))
    });
    let jobs = members.iter().flatten().copied().max().map_or(0, |m| m + 1);
    let mut busy = vec![false; jobs];
    let mut level = vec![0u32; rows.len()];
    let mut closed = vec![false; rows.len()];
    let mut free = capacity;
    let take = |r: usize, to: u32, level: &mut [u32], free: &mut u32, busy: &mut [bool]| {
        if level[r] == 0 {
            for &j in &members[r] {
                busy[j] = true;
            }
        }
        *free -= to - level[r];
        level[r] = to;
    };
    for &(r, from, to, _) in &steps {
        if closed[r] || level[r] != from {
            continue;
        }
        if from == 0 && members[r].iter().any(|&j| busy[j]) {
            closed[r] = true;
            continue;
        }
        if to - from > free {
            closed[r] = true;
            continue;
        }
        take(r, to, &mut level, &mut free, &mut busy);
    }
    // The GPUs left: rows take the choice that fits with the most value
    // per GPU over what they hold, best first, each once.
    let value_at = |r: usize, a: u32| {
        rows[r]
            .iter()
            .find(|x| x.0 == a)
            .map_or(0.0, |x| x.1.max(0.0))
    };
    let fill = |level: &mut [u32], free: &mut u32, busy: &mut [bool]| {
        if *free == 0 {
            return;
        }
        let mut fills: Vec<(f64, usize, u32)> = Vec::new();
        for (r, row) in rows.iter().enumerate() {
            let have = value_at(r, level[r]);
            let best = row
                .iter()
                .filter(|&&(a, v)| a > level[r] && a - level[r] <= *free && v > have)
                .map(|&(a, v)| ((v - have) / f64::from(a - level[r]), a))
                .max_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)));
            if let Some((g, a)) = best {
                fills.push((g, r, a));
            }
        }
        fills.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        for (_, r, a) in fills {
            if a - level[r] > *free || (level[r] == 0 && members[r].iter().any(|&j| busy[j])) {
                continue;
            }
            take(r, a, level, free, busy);
        }
    };
    fill(&mut level, &mut free, &mut busy);
    // A pair shut out by its jobs, which went alone first (more value per
    // GPU each), replaces them where it is worth more than they are
    // together — on their GPUs and those left — then the GPUs freed are
    // handed out again.
    let mut holder: Vec<Option<usize>> = vec![None; jobs];
    for (r, m) in members.iter().enumerate() {
        if level[r] > 0 {
            for &j in m {
                holder[j] = Some(r);
            }
        }
    }
    let mut swapped = false;
    for r in 0..rows.len() {
        if members[r].len() < 2 || level[r] > 0 {
            continue;
        }
        // The rows holding its jobs now: each must hold only them.
        let mut held: Vec<usize> = members[r].iter().filter_map(|&j| holder[j]).collect();
        held.sort_unstable();
        held.dedup();
        if held
            .iter()
            .any(|&h| members[h].iter().any(|j| !members[r].contains(j)))
        {
            continue;
        }
        let gpus: u32 = held.iter().map(|&h| level[h]).sum();
        let worth: f64 = held.iter().map(|&h| value_at(h, level[h])).sum();
        let best = rows[r]
            .iter()
            .filter(|&&(a, v)| a <= free + gpus && v > worth)
            .max_by(|x, y| x.1.total_cmp(&y.1).then(y.0.cmp(&x.0)));
        if let Some(&(a, _)) = best {
            for &h in &held {
                free += level[h];
                level[h] = 0;
            }
            free -= a;
            level[r] = a;
            for &j in &members[r] {
                holder[j] = Some(r);
                busy[j] = true;
            }
            swapped = true;
        }
    }
    if swapped {
        fill(&mut level, &mut free, &mut busy);
    }
    let objective = (0..rows.len()).map(|r| value_at(r, level[r])).sum();
    (level, objective)
}

/// Each row's steps along the upper concave hull of its `(GPUs, value)`
/// choices from `(0, 0)`: (row, from GPUs, to GPUs, value gained).
fn hull_steps(rows: &[Vec<(u32, f64)>]) -> Vec<(usize, u32, u32, f64)> {
    let mut steps: Vec<(usize, u32, u32, f64)> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let mut points: Vec<(u32, f64)> = row
            .iter()
            .copied()
            .filter(|&(a, v)| a > 0 && v.is_finite() && v > 0.0)
            .collect();
        points.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.total_cmp(&x.1)));
        points.dedup_by_key(|p| p.0);
        let mut hull: Vec<(u32, f64)> = vec![(0, 0.0)];
        for p in points {
            if p.1 <= hull.last().map_or(0.0, |h| h.1) {
                continue; // more GPUs for no more value
            }
            // Pop while the last point lies on or below the chord to p.
            while hull.len() >= 2 {
                let (b, a) = (hull[hull.len() - 1], hull[hull.len() - 2]);
                let slope_ab = (b.1 - a.1) / f64::from(b.0 - a.0);
                let slope_ap = (p.1 - a.1) / f64::from(p.0 - a.0);
                if slope_ap >= slope_ab {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(p);
        }
        for h in hull.windows(2) {
            steps.push((r, h[0].0, h[1].0, h[1].1 - h[0].1));
        }
    }
    steps
}

/// What the fallback needs of a unit.
pub struct UnitView {
    pub jobs: Vec<usize>,
    pub mode: MergeMode,
    pub remaining_s: Vec<f64>,
    pub current: u32,
    pub allowed: Vec<u32>,
}

pub(crate) fn units_view(units: &[Unit]) -> Vec<UnitView> {
    units
        .iter()
        .map(|u| UnitView {
            jobs: u.jobs.clone(),
            mode: u.mode,
            remaining_s: u.remaining_s.to_vec(),
            current: u.current,
            allowed: u.allowed.clone(),
        })
        .collect()
}

/// The previous plan repaired greedily: every unit keeps what it holds (if
/// that is still allowed and fits), then free GPUs go, one allocation step
/// at a time, to the unit whose remaining time falls the most per added
/// GPU (waiting units first get their smallest allocation).
pub fn fallback(snap: &Snapshot, units: &[UnitView]) -> Plan {
    let units: Vec<&UnitView> = units.iter().collect();
    let mut free = snap.total_gpus();
    let mut gpus: Vec<u32> = vec![0; units.len()];
    keep_current(&units, &mut gpus, &mut free);
    grow(snap, &units, &mut gpus, &mut free);
    let entries = units
        .iter()
        .zip(&gpus)
        .filter(|&(_, &g)| g > 0)
        .map(|(u, &g)| PlanEntry {
            jobs: u.jobs.clone(),
            mode: u.mode,
            gpus: g,
            placement: Vec::new(),
        })
        .collect();
    Plan {
        entries,
        stats: SolveStats::default(),
    }
}

/// Every unit keeps what it holds, if that is still allowed and fits.
pub(crate) fn keep_current(units: &[&UnitView], gpus: &mut [u32], free: &mut u32) {
    for (k, u) in units.iter().enumerate() {
        if u.current > 0 && u.allowed.contains(&u.current) && u.current <= *free {
            gpus[k] = u.current;
            *free -= u.current;
        }
    }
}

/// Free GPUs go, one allocation step at a time, to the unit whose
/// remaining time falls the most per added GPU (waiting units first get
/// their smallest allocation).
pub(crate) fn grow(snap: &Snapshot, units: &[&UnitView], gpus: &mut [u32], free: &mut u32) {
    loop {
        let mut best: Option<(f64, usize, u32)> = None;
        for (k, u) in units.iter().enumerate() {
            let Some(&next) = u.allowed.iter().find(|&&a| a > gpus[k]) else {
                continue;
            };
            let extra = next - gpus[k];
            if extra > *free {
                continue;
            }
            let now = time_in(&snap.allocations, &u.remaining_s, gpus[k]);
            let then = time_in(&snap.allocations, &u.remaining_s, next);
            // Waiting units gain "everything": give them a GPU first.
            let gain = if gpus[k] == 0 {
                f64::MAX / 2.0 - then
            } else {
                (now - then) / f64::from(extra)
            };
            if best.is_none_or(|(g, bk, _)| gain > g || (gain == g && k < bk)) {
                best = Some((gain, k, next));
            }
        }
        match best {
            Some((gain, k, next)) if gain > 0.0 => {
                *free -= next - gpus[k];
                gpus[k] = next;
            }
            _ => break,
        }
    }
}
