//! Lyra's loans in the simulator: lending inference servers to training
//! and reclaiming them with the fewest preemptions.

use std::time::Instant;

use fmsched_core::NodeState;
use fmsched_core::policy::lyra::ReclaimRule;
use fmsched_core::round::Gpu;

use crate::engine::{Alloc, Phase, Simulation};

impl<'a> Simulation<'a> {
    /// The loan orchestrator (Lyra §3.4): loans the inference servers the
    /// trace leaves idle, or reclaims what the inference side needs back.
    pub(super) fn orchestrate(&mut self) {
        let Some(loans) = self.cfg.loans.clone() else {
            return;
        };
        let first = self.nodes.len()
            - loans
                .inference
                .iter()
                .map(|g| g.count as usize)
                .sum::<usize>();
        let inference: Vec<usize> = (first..self.nodes.len()).collect();
        let target = loans.loanable(inference.len(), self.now);
        let on_loan: Vec<usize> = inference
            .iter()
            .copied()
            .filter(|&n| self.nodes[n].loaned)
            .collect();
        if target > on_loan.len() {
            let more: Vec<usize> = inference
                .iter()
                .copied()
                .filter(|&n| !self.nodes[n].loaned)
                .take(target - on_loan.len())
                .collect();
            for &n in &more {
                self.nodes[n].loaned = true;
                self.nodes[n].state = NodeState::Available;
            }
            self.version += 1;
            self.stats.loans.loan_ops += 1;
            self.stats.loans.servers_loaned += more.len() as u32;
        } else if target < on_loan.len() {
            self.reclaim(&on_loan, on_loan.len() - target, loans.rule);
        }
    }

    /// Returns `need` of the loaned servers `on_loan`, chosen by `rule`:
    /// jobs left below their base demand are preempted (back to the
    /// queue, resumed later from their checkpoints), the others scale in
    /// (restart with fewer workers from their checkpoints).
    pub(super) fn reclaim(&mut self, on_loan: &[usize], need: usize, rule: ReclaimRule) {
        use fmsched_core::policy::lyra::{self, ReclaimInput, ReclaimJob};
        // One reclaim job per group of GPUs (a merged pair shares them).
        let mut reps: Vec<Vec<usize>> = Vec::new();
        for i in 0..self.jobs.len() {
            let Some(a) = &self.jobs[i].alloc else {
                continue;
            };
            if !a.placement.iter().any(|p| on_loan.contains(&p.0)) {
                continue;
            }
            match reps.iter_mut().find(|r| {
                self.jobs[r[0]]
                    .alloc
                    .as_ref()
                    .is_some_and(|b| b.held == a.held)
            }) {
                Some(r) => r.push(i),
                None => reps.push(vec![i]),
            }
        }
        // Group k's parts on the loaned servers.
        let parts = reps.iter().enumerate().flat_map(|(k, r)| {
            let placement = self.jobs[r[0]]
                .alloc
                .as_ref()
                .map(|a| a.placement.as_slice());
            placement
                .unwrap_or_default()
                .iter()
                .filter_map(move |&(n, g)| on_loan.iter().position(|&l| l == n).map(|s| (s, k, g)))
        });
        let (input, order) = ReclaimInput::from_parts(
            on_loan.iter().map(|&n| self.nodes[n].id.clone()).collect(),
            parts,
            |k| {
                let (r, j) = (&reps[k], &self.jobs[reps[k][0]]);
                let held = j.alloc.as_ref().map_or(0, |a| a.gpus);
                // An elastic job keeps running on its base demand (its
                // request); any other (profiling runs included) needs all
                // it holds.
                let elastic =
                    r.len() == 1 && matches!(j.phase, Phase::Waiting) && j.w.max_gpus > j.w.gpus;
                ReclaimJob {
                    gpus: held,
                    base: if elastic { j.w.gpus.min(held) } else { held },
                }
            },
        );
        // The input's jobs in the order they first hold a part.
        let reps: Vec<Vec<usize>> = order.iter().map(|&k| reps[k].clone()).collect();
        let t = Instant::now();
        let out = lyra::reclaim(&input, need, rule);
        self.stats
            .loans
            .reclaim_wall_s
            .push(t.elapsed().as_secs_f64());
        if on_loan.len() <= 16 {
            let best = lyra::reclaim(&input, need, ReclaimRule::Exhaustive);
            self.stats.loans.searched_reclaims += 1;
            self.stats.loans.searched_preemptions += out.preempted.len() as u32;
            self.stats.loans.searched_optimal_preemptions += best.preempted.len() as u32;
        }
        let returned: Vec<usize> = out.servers.iter().map(|&s| on_loan[s]).collect();
        self.version += 1;
        for &k in &out.preempted {
            for &i in &reps[k] {
                let j = &mut self.jobs[i];
                j.alloc = None;
                if matches!(j.phase, Phase::Profiling { .. }) {
                    // Its profiling run starts over.
                    j.phase = Phase::Profiling {
                        until: f64::INFINITY,
                    };
                }
            }
        }
        for &(k, _) in &out.scaled_in {
            for &i in &reps[k] {
                let ready = self.now + self.jobs[i].restart_s;
                let j = &mut self.jobs[i];
                if let Some(a) = &j.alloc {
                    let held: Vec<Gpu> = a
                        .held
                        .iter()
                        .copied()
                        .filter(|g| !returned.contains(&g.0))
                        .collect();
                    j.alloc = Some(Alloc::on(held, ready));
                    j.restarts += 1;
                }
            }
        }
        for &n in &returned {
            self.nodes[n].loaned = false;
            self.nodes[n].state = NodeState::Offline;
        }
        let l = &mut self.stats.loans;
        l.reclaim_ops += 1;
        l.servers_reclaimed += returned.len() as u32;
        l.preemptions += out
            .preempted
            .iter()
            .map(|&k| reps[k].len() as u32)
            .sum::<u32>();
        l.scale_ins += out.scaled_in.len() as u32;
        l.collateral_gpus += out.collateral_gpus;
    }
}
