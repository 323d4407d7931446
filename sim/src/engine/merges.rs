//! Merges in the simulator: the merge guard's verdicts and what follows
//! them, released temporal merges, warm starts, and new merges.

use fmsched_core::policy::MergeMode;
use fmsched_core::round::ClusterView;
use fmsched_core::round::guard::{GUARD_EPOCHS, GuardConsequence, GuardRuling, guard_consequence};

use crate::catalog::Catalog;
use crate::engine::{Merge, Simulation};

impl<'a> Simulation<'a> {
    /// Ymir §4.3: split merges whose transfer does not help after two epochs.
    pub(super) fn guard(&mut self, catalog: &Catalog) {
        if !self.cfg.merge_guard {
            return;
        }
        for m in 0..self.merges.len() {
            if self.merges[m].guard_done {
                continue;
            }
            let Merge {
                a,
                b,
                mode,
                guard_at,
                ..
            } = self.merges[m].clone();
            let watched = if mode == MergeMode::Temporal { b } else { a };
            if self.jobs[watched].finish.is_some()
                || (self.jobs[a].finish.is_some() && mode == MergeMode::Spatial)
            {
                self.merges[m].guard_done = true;
                continue;
            }
            if self.jobs[watched].merged.is_none() && mode == MergeMode::Spatial {
                self.merges[m].guard_done = true;
                continue;
            }
            if self.jobs[watched].done < guard_at * (1.0 - 1e-9) - 1e-6 {
                continue;
            }
            self.merges[m].guard_done = true;
            let hurt = |sim: &Self, j: usize, need: Option<f64>| {
                need.is_some_and(|n| n >= sim.jobs[j].alone_epochs * sim.jobs[j].samples_per_epoch)
            };
            let ruling = match mode {
                MergeMode::Temporal => {
                    // B runs on A's output only after A finished; the guard
                    // looks at B's first two epochs, and B starts again from
                    // the pre-trained weights where that finishes it sooner
                    // than going on, its restart counted (the live rule,
                    // `policy::fresh_start_pays`, here on the catalog's truth).
                    let need = self.temporal_need(catalog, a, b);
                    let restart_pays = hurt(self, b, need) && {
                        let j = &self.jobs[b];
                        let (left, alone) = (
                            need.unwrap_or(0.0) - j.done,
                            j.alone_epochs * j.samples_per_epoch,
                        );
                        let restart_s = j.restart_s;
                        let rate = self.progress_rate(b).unwrap_or(0.0);
                        rate > 0.0
                            && fmsched_core::policy::fresh_start_pays(left, alone, restart_s * rate)
                    };
                    if restart_pays {
                        GuardRuling::RestartFresh
                    } else {
                        GuardRuling::Keep
                    }
                }
                MergeMode::Spatial => {
                    let need = self.spatial_need(catalog, a, b);
                    if hurt(self, a, need.map(|n| n.0)) || hurt(self, b, need.map(|n| n.1)) {
                        GuardRuling::Split
                    } else {
                        GuardRuling::Keep
                    }
                }
                MergeMode::Normal | MergeMode::Shared => continue,
            };
            self.apply_guard(&guard_consequence(mode, a, b, ruling));
        }
    }

    /// Applies core's [`GuardConsequence`] of a guard's ruling (the one
    /// the service applies): the jobs left alone train towards their own
    /// targets outside the merge, B leaving a spatial pair's joint process
    /// gives up its GPUs to wait for its own (A goes on in place: fmsim has
    /// no checkpoint to wait for), and a restarted job trains again from
    /// zero after its restart.
    fn apply_guard(&mut self, consequence: &GuardConsequence<usize>) {
        for &j in &consequence.alone {
            let job = &mut self.jobs[j];
            job.target = job.alone_epochs * job.samples_per_epoch;
            job.merged = None;
        }
        if let Some(b) = consequence.leaves_joint_process {
            self.jobs[b].alloc = None;
            self.version += 1;
        }
        if let Some(b) = consequence.restarts {
            let now = self.now;
            let j = &mut self.jobs[b];
            j.done = 0.0;
            if let Some(al) = &mut j.alloc {
                al.ready_at = now + j.restart_s;
                j.restarts += 1;
            }
        }
        if consequence.ends {
            self.stats.guard_splits += 1;
        }
    }

    /// Splits the kept temporal merges the round released
    /// (`RoundOutcome::released`): B leaves A's group and waits for GPUs of
    /// its own, to train from scratch (as the guard's temporal split
    /// leaves it); A trains on as a job alone.
    pub(super) fn release(&mut self, view: &ClusterView, released: &[usize], members: &[usize]) {
        for &m in released {
            let mv = &view.merges[m];
            let (a, b) = (members[mv.a], members[mv.b]);
            if let Some((_, k)) = self.jobs[b].merged {
                // B trains alone from here: nothing for the guard to watch.
                self.merges[k].guard_done = true;
            }
            for j in [a, b] {
                self.jobs[j].merged = None;
            }
            let j = &mut self.jobs[b];
            j.target = j.alone_epochs * j.samples_per_epoch;
            j.alloc = None;
            self.stats.merges_released += 1;
            self.version += 1;
        }
    }

    /// Records a warm start decided this round: B trains from the output
    /// weights of A, which is done, towards its target under transfer,
    /// and the merge guard watches it as the B of a temporal merge (two
    /// epochs in, a start that did not help sends it back to its
    /// pre-trained weights, from scratch). It merges with no one after.
    pub(super) fn warm_start(&mut self, catalog: &Catalog, a: usize, b: usize) {
        let Some(need) = self.temporal_need(catalog, a, b) else {
            return;
        };
        let m = self.merges.len();
        self.jobs[b].target = need;
        self.jobs[b].ever_merged = Some((MergeMode::Temporal, m));
        self.stats.warm_starts += 1;
        self.merges.push(Merge {
            a,
            b,
            mode: MergeMode::Temporal,
            guard_at: f64::from(GUARD_EPOCHS) * self.jobs[b].samples_per_epoch,
            guard_done: false,
        });
    }

    /// Records a merge decided this round: B's target under transfer
    /// (temporal), both jobs' joint targets (spatial), and where the merge
    /// guard looks (two epochs of the merged part, Ymir §4.3).
    pub(super) fn merge(&mut self, catalog: &Catalog, a: usize, b: usize, mode: MergeMode) {
        let m = self.merges.len();
        let guard_at = match mode {
            MergeMode::Temporal => {
                let need = self
                    .temporal_need(catalog, a, b)
                    .unwrap_or(self.jobs[b].target);
                self.jobs[b].target = need;
                self.stats.merges_temporal += 1;
                f64::from(GUARD_EPOCHS) * self.jobs[b].samples_per_epoch
            }
            _ => {
                if let Some((na, nb)) = self.spatial_need(catalog, a, b) {
                    self.jobs[a].target = na;
                    self.jobs[b].target = nb;
                }
                self.stats.merges_spatial += 1;
                // Two epochs of A's task inside the joint job.
                f64::from(GUARD_EPOCHS) * self.jobs[a].samples_per_epoch
            }
        };
        self.merges.push(Merge {
            a,
            b,
            mode,
            guard_at,
            guard_done: false,
        });
        for j in [a, b] {
            self.jobs[j].merged = Some((mode, m));
            self.jobs[j].ever_merged = Some((mode, m));
        }
    }
}
