//! How fast each job runs: throughput from the LUT at its allocation and
//! layers, estimate noise, merged pairs' joint times, and the work left.

use fmsched_core::NodeState;
use fmsched_core::policy::{MergeMode, Replica, SHARED_SLOWDOWN};
use fmsched_estimator::icefrog;
use fmsched_estimator::lut::Variant;

use crate::catalog::Catalog;
use crate::engine::config::{
    EstimateModel, LayerMode, PROFILED_EPOCHS, SimError, titansched_iteration_s,
};
use crate::engine::{Job, Simulation, packed, placement_string};

impl<'a> Simulation<'a> {
    /// Tuned FreezeOut (ICEFROG §V-A): the schedule start `t0` (of 0, 0.1,
    /// …, 1 = never) that reaches the target soonest at `shape`, from the
    /// effective progress at each frozen-layer count it passes through.
    pub(super) fn tune_freezeout(
        &mut self,
        i: usize,
        (fam, placement): (usize, &str),
    ) -> Result<f64, SimError> {
        let max = self.jobs[i].max_frozen;
        let batch = self.jobs[i].w.batch;
        let mut e = Vec::with_capacity(max as usize + 1);
        for l in 0..=max {
            e.push(self.progress_at(i, (batch, fam, placement), EstimateModel::Exact, l)?);
        }
        let time = |t0: f64| {
            let d = (1.0 - t0) / f64::from(max);
            t0 / e[0] + (1..=max as usize).map(|k| d / e[k]).sum::<f64>()
        };
        Ok((0..=10)
            .map(|k| f64::from(k) / 10.0)
            .min_by(|&a, &b| time(a).total_cmp(&time(b)))
            .unwrap_or(1.0))
    }

    /// What a policy without an iteration estimator plans job `i` at: its
    /// user's maximum over its true remaining work (≥ 1); None for a job
    /// that stops on its budget, a merged one, or an estimating policy.
    pub(super) fn budget_factor(&self, i: usize) -> Option<f64> {
        let j = &self.jobs[i];
        if self.iteration_estimator || j.merged.is_some() {
            return None;
        }
        let budget = j.budget_epochs? * j.samples_per_epoch;
        let truth = self.remaining(i);
        (truth > 0.0).then(|| ((budget - j.done).max(truth) / truth).min(1e6))
    }

    /// The learned estimator's (epochs, spread) for job `i` now: from the
    /// epochs it has done (at least the profiled ones); None without
    /// learned estimates, while it is merged, or under a policy that plans
    /// it at its maximum.
    pub(super) fn learned_now(&self, i: usize) -> Option<(f64, f64)> {
        let j = &self.jobs[i];
        if j.predicted_epochs.is_empty() || j.merged.is_some() || self.budget_factor(i).is_some() {
            return None;
        }
        let seen = ((j.done / j.samples_per_epoch).floor() as usize)
            .max(PROFILED_EPOCHS)
            .min(j.predicted_epochs.len() - 1);
        Some(j.predicted_epochs[seen])
    }

    /// The estimation error of a spatial pair's joint time: each job's
    /// factor, weighted by the samples it has left (`need`).
    pub(super) fn joint_noise(&self, a: usize, b: usize, need: (f64, f64)) -> f64 {
        let (wa, wb) = (need.0.max(0.0), need.1.max(0.0));
        if wa + wb <= 0.0 {
            return 1.0;
        }
        (self.noise_factor(a) * wa + self.noise_factor(b) * wb) / (wa + wb)
    }

    /// The estimation-error factor of job `i` now: its maximum over its
    /// true remaining work under a policy without an iteration estimator,
    /// the learned estimator's predicted over true remaining work, or the
    /// fixed noise factor (1: exact).
    pub(super) fn noise_factor(&self, i: usize) -> f64 {
        if let Some(f) = self.budget_factor(i) {
            return f;
        }
        let j = &self.jobs[i];
        if let Some((epochs, _)) = self.learned_now(i) {
            let truth = self.remaining(i);
            let predicted = (epochs * j.samples_per_epoch - j.done).max(0.0);
            return if truth > 0.0 {
                (predicted / truth).clamp(0.05, 20.0)
            } else {
                1.0
            };
        }
        if self.cfg.estimate_noise <= 0.0 {
            return 1.0;
        }
        let h = fmsched_core::hash::fnv1a(self.jobs[i].w.name.as_bytes());
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        (1.0 + self.cfg.estimate_noise * (2.0 * u - 1.0)).max(0.05)
    }

    /// The samples job `to` is predicted to need from job `from`'s weights
    /// (or beside it), when it truly needs `need` and `alone` without
    /// them: the saving `alone − need` (the transfer gain's effect) scaled
    /// by the pair's fixed gain-noise factor in [1 − e, 1 + e]
    /// ([`SimConfig::gain_noise`]; `need` itself at e = 0).
    pub(super) fn predicted_need(&self, from: usize, to: usize, need: f64, alone: f64) -> f64 {
        let e = self.cfg.gain_noise;
        if e <= 0.0 {
            return need;
        }
        let key = format!("gain:{}>{}", self.jobs[from].w.name, self.jobs[to].w.name);
        let h = fmsched_core::hash::fnv1a(key.as_bytes());
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let f = 1.0 + e * (2.0 * u - 1.0);
        (alone - (alone - need) * f).max(0.05 * need)
    }

    /// Samples per second of job `i`'s configuration at `batch` on
    /// `placement` of GPU family `fam` (an index into `families`).
    pub(super) fn rate(
        &mut self,
        i: usize,
        batch: u32,
        fam: usize,
        placement: &str,
    ) -> Result<f64, SimError> {
        self.rate_as(i, batch, fam, placement, EstimateModel::Exact, 0)
    }

    /// Effective progress (ICEFROG Eq. 2, `E = ψ(ℓ) · T`) of job `i` with
    /// `frozen` layers frozen, as `model` estimates its speed.
    pub(super) fn progress_at(
        &mut self,
        i: usize,
        (batch, fam, placement): (u32, usize, &str),
        model: EstimateModel,
        frozen: u32,
    ) -> Result<f64, SimError> {
        let r = self.rate_as(i, batch, fam, placement, model, frozen)?;
        let psi = if frozen > 0 {
            icefrog::synthetic_frozen_penalty(frozen, self.jobs[i].layers)
        } else {
            1.0
        };
        Ok(psi * r)
    }

    /// Samples-equivalents per second job `i` makes on `placement` under
    /// the layer mode: the layer tuner's best ℓ (Eq. 15), the FreezeOut
    /// schedule's ℓ now (`planning`: the policy sees plain training), or
    /// plain training.
    pub(super) fn effective_rate(
        &mut self,
        i: usize,
        shape: (u32, usize, &str),
        model: EstimateModel,
        planning: bool,
    ) -> Result<f64, SimError> {
        let max = self.jobs[i].max_frozen;
        match self.cfg.layers {
            LayerMode::Tuner if max > 0 => {
                let mut best = 0.0f64;
                for l in 0..=max {
                    best = best.max(self.progress_at(i, shape, model, l)?);
                }
                Ok(best)
            }
            LayerMode::Freezeout if !planning => {
                let l = self.jobs[i].frozen;
                self.progress_at(i, shape, model, l)
            }
            _ => self.progress_at(i, shape, model, 0),
        }
    }

    /// [`Simulation::rate`] as `model` estimates it.
    pub(super) fn rate_as(
        &mut self,
        i: usize,
        batch: u32,
        fam: usize,
        placement: &str,
        model: EstimateModel,
        frozen: u32,
    ) -> Result<f64, SimError> {
        let j = &self.jobs[i];
        let key = (
            j.config,
            batch,
            model == EstimateModel::TitanSched,
            fam,
            frozen,
        );
        let gpu_type = &self.families[fam];
        if let Some(&r) = self.rate_cache.get(&key).and_then(|m| m.get(placement)) {
            return Ok(r);
        }
        let variant = Variant {
            frozen_layers: frozen,
            ..j.variant.clone()
        };
        let r = match self.lut.iteration_time_on(
            &j.lut_model,
            gpu_type,
            placement,
            batch,
            &variant,
            j.layers,
        ) {
            Ok(it) if it.feasible && it.seconds > 0.0 => {
                let seconds = match model {
                    EstimateModel::Exact => it.seconds,
                    EstimateModel::TitanSched => titansched_iteration_s(
                        self.lut,
                        &j.lut_model,
                        gpu_type,
                        placement,
                        &variant,
                        j.layers,
                        it,
                    ),
                };
                f64::from(batch) / seconds
            }
            Ok(_) => 0.0,
            Err(e) => {
                return Err(SimError::Job {
                    job: j.w.name.clone(),
                    message: e.to_string(),
                });
            }
        };
        self.rate_cache
            .entry(key)
            .or_default()
            .insert(placement.to_string(), r);
        Ok(r)
    }

    /// Samples per second job `i` makes on its own task right now.
    pub(super) fn progress_rate(&mut self, i: usize) -> Result<f64, SimError> {
        if self.current_rate.len() != self.jobs.len() {
            self.current_rate = vec![(0, 0.0); self.jobs.len()];
        }
        if self.current_rate[i].0 == self.version {
            return Ok(self.current_rate[i].1);
        }
        let r = self.compute_progress_rate(i)?;
        self.current_rate[i] = (self.version, r);
        Ok(r)
    }

    pub(super) fn compute_progress_rate(&mut self, i: usize) -> Result<f64, SimError> {
        let Some(alloc) = self.jobs[i].alloc.clone() else {
            return Ok(0.0);
        };
        let p = placement_string(&alloc.placement);
        let fam = alloc.held.first().map_or(0, |g| self.node_family[g.0]);
        match self.jobs[i].merged {
            Some((MergeMode::Spatial, m)) => {
                let (a, b) = (self.merges[m].a, self.merges[m].b);
                let batch = self.jobs[a].w.batch + self.jobs[b].w.batch;
                let joint = self.rate(a, batch, fam, &p)?;
                let (da, db) = (
                    self.jobs[a].samples_per_epoch,
                    self.jobs[b].samples_per_epoch,
                );
                let share = if i == a {
                    da / (da + db)
                } else {
                    db / (da + db)
                };
                Ok(joint * share)
            }
            Some((MergeMode::Temporal, m)) if self.merges[m].b == i => Ok(0.0), // waits for A
            _ => {
                let b = self.jobs[i].w.batch;
                let r = self.effective_rate(i, (b, fam, &p), EstimateModel::Exact, false)?;
                // ICEFROG Eq. 8 (fixed): λ = 0.9 on a shared GPU.
                Ok(if alloc.shared { SHARED_SLOWDOWN * r } else { r })
            }
        }
    }

    pub(super) fn remaining(&self, i: usize) -> f64 {
        (self.jobs[i].target - self.jobs[i].done).max(0.0)
    }

    /// Remaining seconds of job `i` alone at every allocation, packed on
    /// nodes of `per_node` GPUs of family `fam`.
    pub(super) fn solo_times(
        &mut self,
        i: usize,
        (fam, per_node): (usize, u32),
    ) -> Result<Vec<f64>, SimError> {
        let allocs = self.allocations.clone();
        let rem = self.remaining(i);
        let j = &self.jobs[i];
        let (min, max, batch) = (self.min_gpus(i), j.w.max_gpus, j.w.batch);
        let unit = Replica::of(j.w.pipeline, j.w.expert_parallel).gpus();
        allocs
            .iter()
            .map(|&a| {
                if a == 0 || a < min || a > max || !a.is_multiple_of(unit) {
                    return Ok(f64::INFINITY);
                }
                let model = self.cfg.estimate_model;
                let r = self.effective_rate(i, (batch, fam, &packed(a, per_node)), model, true)?;
                Ok(if r > 0.0 { rem / r } else { f64::INFINITY })
            })
            .collect()
    }

    /// Joint job times (Eq. 4 with honest per-task targets) for samples
    /// `need_a`, `need_b` still to do, on `shape` as in [`Self::solo_times`].
    pub(super) fn joint_times(
        &mut self,
        a: usize,
        b: usize,
        (need_a, need_b): (f64, f64),
        (fam, per_node): (usize, u32),
    ) -> Result<Vec<f64>, SimError> {
        let allocs = self.allocations.clone();
        let batch = self.jobs[a].w.batch + self.jobs[b].w.batch;
        let max = self.jobs[a].w.max_gpus.max(self.jobs[b].w.max_gpus);
        let (da, db) = (
            self.jobs[a].samples_per_epoch,
            self.jobs[b].samples_per_epoch,
        );
        allocs
            .iter()
            .map(|&x| {
                if x == 0 || x > max {
                    return Ok(f64::INFINITY);
                }
                let r = self.rate(a, batch, fam, &packed(x, per_node))?;
                if r <= 0.0 {
                    return Ok(f64::INFINITY);
                }
                Ok((need_a / (r * da / (da + db))).max(need_b / (r * db / (da + db))))
            })
            .collect()
    }

    pub(super) fn temporal_need(&self, catalog: &Catalog, a: usize, b: usize) -> Option<f64> {
        let (ja, jb) = (&self.jobs[a], &self.jobs[b]);
        let w = catalog.temporal(&ja.w.model, &ja.w.task, &jb.w.task)?;
        Some(w.epochs(jb.w.target_metric) * jb.samples_per_epoch)
    }

    pub(super) fn spatial_need(&self, catalog: &Catalog, a: usize, b: usize) -> Option<(f64, f64)> {
        let (ja, jb) = (&self.jobs[a], &self.jobs[b]);
        let (wa, wb) = catalog.spatial(&ja.w.model, &ja.w.task, &jb.w.task)?;
        Some((
            wa.epochs(ja.w.target_metric) * ja.samples_per_epoch,
            wb.epochs(jb.w.target_metric) * jb.samples_per_epoch,
        ))
    }

    /// A floor under a job's JCT from its submission
    /// ([`JobResult::best_case_s`]).
    pub(super) fn best_case_s(&self, j: &Job) -> f64 {
        j.ideal_s
            + if self.cfg.profile_s > 0.0 && j.ideal_s - j.restart_s > self.cfg.profile_s {
                // The profiling run: its start and its length.
                j.restart_s + self.cfg.profile_s
            } else {
                0.0
            }
    }

    /// The fewest GPUs job `i` runs on: its request under
    /// [`SimConfig::base_demands`], else its workload's `min_gpus` (one
    /// when unset).
    pub(super) fn min_gpus(&self, i: usize) -> u32 {
        if self.cfg.base_demands {
            self.jobs[i].w.gpus
        } else {
            self.jobs[i].w.min_gpus.max(1)
        }
    }

    /// GPUs of the nodes in the round now (training and loaned).
    pub(super) fn present_gpus(&self) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.state != NodeState::Offline)
            .map(|n| n.gpus)
            .sum()
    }
}
