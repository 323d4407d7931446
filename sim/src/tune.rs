//! AutoSched (thesis Ch. 6): re-tunes a policy's knobs as the workload
//! drifts. Every tuning period (an hour by default) it
//!
//! 1. **generates** the workload it expects (§6.4.2): the jobs that will
//!    arrive, by matching the last hour of 5-minute arrival counts to the
//!    most similar past segment (Manhattan distance, Table 6.5) and
//!    replaying the hour that followed it (the global generator), and the
//!    jobs already in the cluster, each with a remaining time drawn from a
//!    duration-bucket classifier (the local predictor, [`DurationPredictor`]);
//! 2. **searches** the knob space on that trace in the simulator
//!    (§6.4.3): a seeded sampler around the best known configuration plus
//!    exploration, early rejection of samples a model of past measurements
//!    predicts to lose (Algorithm 3's rejection step, with `γ = 0.95` and
//!    an exploration rate `ε`), successive halving from the aggregated trace
//!    ([`aggregate`], §6.4.3.2) to the full one, simulations on all cores;
//! 3. **adopts** the best configuration only when it beats the current one
//!    by more than a threshold (1.1×, §6.5.2) on the predicted trace.
//!
//! What differs from the thesis, and why:
//! - Arrival matching runs on the raw 5-minute counts, not on an FFT-
//!   smoothed series: the match already averages over 12 points, and the
//!   smoothing's period must itself be estimated from the history the
//!   tuner is short of in its first days.
//! - The local predictor is a recency-weighted, survival-conditioned
//!   histogram over duration buckets (5 m / 30 m / 1 h / 2 h / 4 h / more),
//!   keyed by the job's GPU class, instead of XGBoost. Table 6.2's features
//!   are arrival time, time executed so far and GPU request of the job and
//!   of the recent arrivals and completions; conditioning on "has run at
//!   least this long" and weighting recent completions carries the same
//!   information, trains in no time and is transparent to operators.
//!   `fmsim tune` prints its bucket accuracy.
//! - The rejection model is a k-nearest-neighbour regression over past
//!   measurements (knobs normalised to [0, 1] → score relative to the
//!   configuration active then), not a causal DAG learned with FCI: it
//!   serves Algorithm 3's rejection step the same way and needs no
//!   operator-drawn graph.

mod forecast;
mod knobs;

pub use forecast::{
    BIN_S, BUCKETS_S, DurationPredictor, Finished, Forecast, MIN_AGGREGATE_JOBS, PredictedTrace,
    SEGMENT_S, TraceJob, aggregate, bucket_of, matching_segment, predict_trace,
};
pub use knobs::{Knob, Knobs, Objective, default_knob, knob_space};

use std::sync::Arc;
use std::time::Instant;

use fmsched_core::policy::Policy;
use fmsched_core::policy::with_knobs;
use fmsched_estimator::lut::Lut;

use crate::catalog::Catalog;
use crate::engine::{Observation, ObservedState, SimConfig, SimResult, Simulation};
use crate::generate::Rng;
use crate::tune::knobs::round_knob;
use crate::workload::WorkloadJob;

/// Simulates `trace` under `policy` with `knobs`: its score, or None when
/// the configuration fails (never adopted).
pub fn evaluate(
    cfg: &SimConfig,
    lut: &Lut,
    catalog: &Catalog,
    trace: &[TraceJob],
    policy: &str,
    knobs: &Knobs,
    objective: Objective,
) -> Option<f64> {
    if trace.is_empty() {
        return Some(0.0);
    }
    let p = with_knobs(policy, knobs).ok()?;
    let jobs: Vec<WorkloadJob> = trace.iter().map(|t| t.job.clone()).collect();
    let mut sim = Simulation::new(cfg.clone(), lut, catalog, &jobs).ok()?;
    for (i, t) in trace.iter().enumerate() {
        if t.carried() {
            sim.seed_history(i, &t.history);
        }
    }
    let r = sim.run(p.as_ref(), catalog, |_, _| {}).ok()?;
    Some(objective.score(&r))
}

/// Evaluates every configuration on `trace`, on `threads` threads.
#[allow(clippy::too_many_arguments)]
pub fn evaluate_all(
    cfg: &SimConfig,
    lut: &Lut,
    catalog: &Catalog,
    trace: &[TraceJob],
    policy: &str,
    configs: &[Knobs],
    objective: Objective,
    threads: usize,
) -> Vec<Option<f64>> {
    crate::parallel::parallel_map(configs, threads, |k| {
        evaluate(cfg, lut, catalog, trace, policy, k, objective)
    })
}

/// How hard a tuner searches.
#[derive(Clone, Debug)]
pub struct SearchConfig {
    /// Configurations sampled per tuning (the current one comes on top).
    pub samples: usize,
    /// Successive halving keeps 1/eta of them for the full trace.
    pub eta: usize,
    /// Algorithm 3's relax factor: a sample predicted below γ × the
    /// current score is rejected unmeasured.
    pub gamma: f64,
    /// Algorithm 3's exploration rate: a sample is measured anyway with
    /// this probability.
    pub epsilon: f64,
    /// Adopt only when the best beats the current by more than this.
    pub threshold: f64,
    /// Aggregate the trace for the first stage.
    pub aggregate: bool,
    /// Draws of the predicted trace (remaining times) the finalists are
    /// scored on, averaged.
    pub draws: usize,
    pub threads: usize,
    pub seed: u64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            samples: 12,
            eta: 3,
            gamma: 0.95,
            epsilon: 0.2,
            threshold: 1.1,
            aggregate: true,
            draws: 3,
            threads: crate::parallel::all_cores(),
            seed: 1,
        }
    }
}

/// One tuning: what was looked at, what was found, what was done.
#[derive(Clone, Debug)]
pub struct TuneDecision {
    /// On the run's clock.
    pub at_s: f64,
    pub trace_jobs: usize,
    pub aggregated_jobs: usize,
    pub carried_over: usize,
    pub sampled: usize,
    pub rejected: usize,
    pub simulations: usize,
    /// Scores of the active and of the best configuration on the full
    /// predicted trace (higher is better), and their ratio.
    pub current_score: f64,
    pub best_score: f64,
    pub gain: f64,
    pub adopted: bool,
    /// The best beat the active configuration by more than the threshold
    /// (adopted unless this was a dry run).
    pub passes: bool,
    /// The best configuration found (the active one when nothing beat it).
    pub proposed: Knobs,
    /// The knobs active after this tuning.
    pub knobs: Knobs,
    /// Realised gain of the last adoption: the objective over the jobs
    /// that finished since it, over the same span just before it (> 1:
    /// better since). Workload drift moves it too; None before any
    /// adoption or without finished jobs on both sides.
    pub realised_gain: Option<f64>,
    pub wall_s: f64,
}

/// The tuner: keeps the active knobs, what it has measured, and its
/// decisions. The same code serves `fmsim tune` and a live scheduler.
pub struct Tuner {
    pub policy: String,
    pub space: Vec<Knob>,
    pub objective: Objective,
    pub forecast: Forecast,
    pub search: SearchConfig,
    pub predictor: DurationPredictor,
    cfg: SimConfig,
    lut: Arc<Lut>,
    catalog: Arc<Catalog>,
    current: Knobs,
    /// (knobs on the unit cube, score over the then-active score).
    memory: Vec<(Vec<f64>, f64)>,
    /// The best configuration of the last tuning, when not adopted.
    last_best: Option<Knobs>,
    /// When knobs were last adopted (the run's clock).
    last_adoption: Option<f64>,
    rng: Rng,
    pub decisions: Vec<TuneDecision>,
}

impl Tuner {
    /// A tuner of `policy` starting from `knobs` (missing ones at the
    /// policy's defaults, which the knob space's midpoint stands in for
    /// when the policy does not say).
    pub fn new(
        policy: &str,
        knobs: Knobs,
        cfg: SimConfig,
        lut: Arc<Lut>,
        catalog: Arc<Catalog>,
        forecast: Forecast,
        search: SearchConfig,
    ) -> Result<Self, String> {
        let space = knob_space(policy)
            .ok_or_else(|| format!("policy {policy:?} has no tunable knobs (tiresias, themis)"))?;
        with_knobs(policy, &knobs)?;
        let mut current = knobs;
        for k in &space {
            current
                .entry(k.name.to_string())
                .or_insert_with(|| default_knob(policy, k.name).unwrap_or_else(|| k.at_unit(0.5)));
        }
        let seed = search.seed;
        Ok(Self {
            objective: Objective::for_policy(policy),
            policy: policy.to_string(),
            space,
            forecast,
            search,
            predictor: DurationPredictor::default(),
            cfg,
            lut,
            catalog,
            current,
            memory: Vec::new(),
            last_best: None,
            last_adoption: None,
            rng: Rng::new(seed),
            decisions: Vec::new(),
        })
    }

    /// The active knobs.
    pub fn knobs(&self) -> &Knobs {
        &self.current
    }

    /// Follows knobs someone else set (an operator through the admin API):
    /// measurements relative to the old ones are dropped.
    pub fn set_knobs(&mut self, knobs: &Knobs) {
        let mut next = self.current.clone();
        for k in &self.space {
            if let Some(v) = knobs.get(k.name) {
                next.insert(k.name.to_string(), *v);
            } else if let Some(d) = default_knob(&self.policy, k.name) {
                next.insert(k.name.to_string(), d);
            }
        }
        if next != self.current {
            self.current = next;
            self.memory.clear();
            self.last_best = None;
        }
    }

    /// The cluster the tuner simulates (nodes come and go).
    pub fn set_cluster(&mut self, cluster: Vec<crate::engine::NodeGroup>) {
        self.cfg.cluster = cluster;
    }

    fn unit_vec(&self, k: &Knobs) -> Vec<f64> {
        self.space
            .iter()
            .map(|s| s.unit(k.get(s.name).copied().unwrap_or(s.lo)))
            .collect()
    }

    /// The rejection model: the score relative to the active
    /// configuration that the nearest past measurements suggest (inverse-
    /// distance weighted, k = 3); None with fewer than 3 measurements.
    fn predicted_relative(&self, u: &[f64]) -> Option<f64> {
        if self.memory.len() < 3 {
            return None;
        }
        let mut d: Vec<(f64, f64)> = self
            .memory
            .iter()
            .map(|(m, r)| {
                let dist = m
                    .iter()
                    .zip(u)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f64>()
                    .sqrt();
                (dist, *r)
            })
            .collect();
        d.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut w, mut s) = (0.0, 0.0);
        for (dist, r) in d.iter().take(3) {
            let wi = 1.0 / (dist + 1e-3);
            w += wi;
            s += wi * r;
        }
        Some(s / w)
    }

    /// Samples: half around the active knobs (log-normal steps), half
    /// uniform over the space (exploration), as BlueFin mixes exploitation
    /// and exploration.
    fn sample(&mut self) -> Vec<Knobs> {
        let base = self.unit_vec(&self.current);
        let mut out = Vec::with_capacity(self.search.samples);
        for s in 0..self.search.samples {
            let mut k = self.current.clone();
            for (d, knob) in self.space.iter().enumerate() {
                let u = if s % 2 == 0 {
                    // A Gaussian step of σ = 0.15 of the range (Box–Muller).
                    let (a, b) = (self.rng.f64(), self.rng.f64());
                    let z = (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos();
                    base[d] + 0.15 * z
                } else {
                    self.rng.f64()
                };
                k.insert(knob.name.to_string(), round_knob(knob.at_unit(u)));
            }
            out.push(k);
        }
        out
    }

    /// One tuning at the observed moment: the knobs to switch to, if any.
    pub fn tune(&mut self, obs: &Observation<'_>) -> Option<Knobs> {
        let d = self.decide(obs, true);
        d.adopted.then_some(d.knobs)
    }

    /// Samples configurations and rejects those the model predicts to
    /// lose (some explored anyway, ε); the active one first, and the last
    /// tuning's best measured again. Returns them and the rejected count.
    fn kept_samples(&mut self) -> (Vec<Knobs>, usize) {
        let samples = self.sample();
        let mut kept: Vec<Knobs> = vec![self.current.clone()];
        let mut rejected = 0;
        for k in samples {
            let u = self.unit_vec(&k);
            let explore = self.rng.f64() < self.search.epsilon;
            match self.predicted_relative(&u) {
                Some(r) if r <= self.search.gamma && !explore => rejected += 1,
                _ => kept.push(k),
            }
        }
        // The last tuning's best is measured again, never rejected: what
        // won on the full trace outranks what the model guesses.
        if let Some(b) = self.last_best.take()
            && !kept.contains(&b)
        {
            kept.push(b);
        }
        (kept, rejected)
    }

    /// The full-trace measurements teach the rejection model too, over
    /// what stage 1 said of the same configurations.
    fn learn_full_trace(
        &mut self,
        finalists: &[Knobs],
        second: &[Option<f64>],
        current_score: f64,
    ) {
        for (k, sc) in finalists.iter().zip(second).skip(1) {
            let u = self.unit_vec(k);
            let rel = sc.unwrap_or(0.0) / current_score.max(1e-12);
            match self.memory.iter_mut().rev().find(|m| m.0 == u) {
                Some(m) => m.1 = rel,
                None => self.memory.push((u, rel)),
            }
        }
    }

    /// The objective since the last adoption over the same span before it
    /// (None before any, or without both figures).
    fn realised_gain(&self, obs: &Observation<'_>) -> Option<f64> {
        self.last_adoption.and_then(|t| {
            let span = obs.now - t;
            let after = self.objective.observed(obs, t, obs.now)?;
            let before = self.objective.observed(obs, t - span, t)?;
            (span > 0.0 && before > 0.0).then(|| after / before)
        })
    }

    /// One tuning; with `adopt` false (a dry run) the active knobs stay
    /// whatever it finds, and the decision says what it would have done.
    pub fn decide(&mut self, obs: &Observation<'_>, adopt: bool) -> TuneDecision {
        let started = Instant::now();
        // Several draws of the remaining times: the full-trace scores are
        // averaged over them, so a configuration is not adopted for one
        // lucky draw.
        let draws: Vec<PredictedTrace> = (0..self.search.draws.max(1))
            .map(|_| predict_trace(obs, self.forecast, &self.predictor, &mut self.rng))
            .collect();
        let trace = &draws[0];
        let max_gpus = trace
            .jobs
            .iter()
            .map(|t| t.job.gpus)
            .max()
            .unwrap_or(1)
            .max(8);
        // Aggregation buys speed on large traces; on a small one it would
        // leave too few jobs to rank configurations by.
        let aggregated = self.search.aggregate && trace.jobs.len() >= MIN_AGGREGATE_JOBS;
        let small = if aggregated {
            aggregate(&trace.jobs, max_gpus)
        } else {
            trace.jobs.clone()
        };
        let (kept, rejected) = self.kept_samples();
        let threads = self.search.threads;
        let (cfg, lut, cat, pol, obj) = (
            &self.cfg,
            &self.lut,
            &self.catalog,
            self.policy.as_str(),
            self.objective,
        );
        // Stage 1: everything kept, on the aggregated trace.
        let first = evaluate_all(cfg, lut, cat, &small, pol, &kept, obj, threads);
        let mut sims = kept.len();
        let base1 = first[0].unwrap_or(0.0).max(1e-12);
        for (k, s) in kept.iter().zip(&first).skip(1) {
            self.memory
                .push((self.unit_vec(k), s.unwrap_or(0.0) / base1));
        }
        if self.memory.len() > 400 {
            let drop = self.memory.len() - 400;
            self.memory.drain(..drop);
        }
        // Stage 2: the best 1/eta (the active one always), on the full trace.
        let mut order: Vec<usize> = (1..kept.len()).collect();
        order.sort_by(|&a, &b| {
            first[b]
                .unwrap_or(f64::NEG_INFINITY)
                .total_cmp(&first[a].unwrap_or(f64::NEG_INFINITY))
        });
        let top = kept.len().div_ceil(self.search.eta.max(1)).max(1);
        let finalists: Vec<Knobs> = std::iter::once(self.current.clone())
            .chain(
                order
                    .iter()
                    .take(top)
                    .filter(|&&i| first[i].is_some())
                    .map(|&i| kept[i].clone()),
            )
            .collect();
        let mut second: Vec<Option<f64>> = vec![Some(0.0); finalists.len()];
        for (d, draw) in draws.iter().enumerate() {
            let scores = if d == 0 && !aggregated {
                // Stage 1 already ran on this very trace.
                finalists
                    .iter()
                    .map(|k| first[kept.iter().position(|x| x == k).unwrap_or(0)])
                    .collect()
            } else {
                sims += finalists.len();
                evaluate_all(cfg, lut, cat, &draw.jobs, pol, &finalists, obj, threads)
            };
            for (acc, s) in second.iter_mut().zip(scores) {
                *acc = match (*acc, s) {
                    (Some(a), Some(s)) => Some(a + s / draws.len() as f64),
                    _ => None,
                };
            }
        }
        let current_score = second[0].unwrap_or(0.0);
        let (best_i, best_score) = second
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, current_score));
        let gain = if current_score > 0.0 {
            best_score / current_score
        } else if best_score > 0.0 {
            f64::INFINITY
        } else {
            1.0
        };
        self.learn_full_trace(&finalists, &second, current_score);
        let realised_gain = self.realised_gain(obs);
        let passes = best_i != 0 && gain > self.search.threshold;
        let adopted = passes && adopt;
        if adopted {
            self.last_adoption = Some(obs.now);
        }
        self.last_best = (best_i != 0 && !adopted).then(|| finalists[best_i].clone());
        if adopted {
            self.current = finalists[best_i].clone();
            // Measurements were relative to the old configuration.
            self.memory.clear();
        }
        self.decisions.push(TuneDecision {
            at_s: obs.now,
            trace_jobs: trace.jobs.len(),
            aggregated_jobs: small.len(),
            carried_over: trace.existing,
            sampled: self.search.samples,
            rejected,
            simulations: sims,
            current_score,
            best_score,
            gain,
            adopted,
            passes,
            proposed: finalists[best_i].clone(),
            knobs: self.current.clone(),
            realised_gain,
            wall_s: started.elapsed().as_secs_f64(),
        });
        self.decisions
            .last()
            .cloned()
            .unwrap_or_else(|| unreachable!("just pushed"))
    }
}

/// Knobs chosen once, offline, on a whole workload (the thesis' "Fixed"
/// baseline: searched on the evaluated trace itself, so stronger than any
/// fixed choice made in advance): the best of the defaults and `samples`
/// space-filling configurations, each simulated on the whole workload.
#[allow(clippy::too_many_arguments)]
pub fn best_fixed(
    cfg: &SimConfig,
    lut: &Lut,
    catalog: &Catalog,
    jobs: &[WorkloadJob],
    policy: &str,
    samples: usize,
    threads: usize,
    seed: u64,
) -> Result<(Knobs, f64), String> {
    let space =
        knob_space(policy).ok_or_else(|| format!("policy {policy:?} has no tunable knobs"))?;
    let defaults: Knobs = space
        .iter()
        .filter_map(|k| default_knob(policy, k.name).map(|v| (k.name.to_string(), v)))
        .collect();
    let mut rng = Rng::new(seed);
    let mut configs = vec![defaults];
    // Latin-hypercube samples: each knob's range cut into `samples`
    // strata, one draw per stratum, strata shuffled per knob.
    let mut strata: Vec<Vec<usize>> = space.iter().map(|_| (0..samples).collect()).collect();
    for s in &mut strata {
        for i in (1..s.len()).rev() {
            s.swap(i, rng.below(i + 1));
        }
    }
    configs.extend((0..samples).map(|i| {
        space
            .iter()
            .zip(&strata)
            .map(|(knob, s)| {
                let u = (s[i] as f64 + rng.f64()) / samples as f64;
                (knob.name.to_string(), round_knob(knob.at_unit(u)))
            })
            .collect::<Knobs>()
    }));
    let trace: Vec<TraceJob> = jobs.iter().map(|j| TraceJob::arriving(j.clone())).collect();
    let objective = Objective::for_policy(policy);
    let scores = evaluate_all(
        cfg, lut, catalog, &trace, policy, &configs, objective, threads,
    );
    scores
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (i, s)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, s)| (configs[i].clone(), s))
        .ok_or_else(|| "no configuration finished the workload".to_string())
}

/// Replays `jobs` under `policy`, re-tuned every `every_s` by `tuner`
/// (None: the knobs stay fixed).
pub fn replay(
    cfg: &SimConfig,
    lut: &Lut,
    catalog: &Catalog,
    jobs: &[WorkloadJob],
    policy: &str,
    knobs: &Knobs,
    tuner: Option<(&mut Tuner, f64)>,
) -> Result<SimResult, String> {
    let p = with_knobs(policy, knobs)?;
    let sim = Simulation::new(cfg.clone(), lut, catalog, jobs).map_err(|e| e.to_string())?;
    match tuner {
        None => sim
            .run(p.as_ref(), catalog, |_, _| {})
            .map_err(|e| e.to_string()),
        Some((tuner, every_s)) => {
            let name = policy.to_string();
            let mut hook =
                |obs: &Observation<'_>, _: &dyn Policy| -> Option<Box<dyn Policy + Send + Sync>> {
                    let k = tuner.tune(obs)?;
                    with_knobs(&name, &k).ok()
                };
            sim.run_retuned(
                p.as_ref(),
                catalog,
                |_, _| {},
                Some(crate::engine::Retune {
                    every_s,
                    hook: &mut hook,
                }),
            )
            .map_err(|e| e.to_string())
        }
    }
}

/// One job of a live cluster as the scheduler stores it: what a live
/// tuner builds its [`Observation`] from.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveJob {
    pub id: String,
    /// Seconds on any clock shared by all the jobs and `now`.
    pub submitted_s: f64,
    pub model: String,
    /// GPUs it asks for.
    pub gpus: u32,
    pub state: ObservedState,
    pub executed_s: f64,
    pub attained_gpu_s: f64,
    pub fair_share_gpu_s: f64,
}

/// The simulator's view of live jobs: each as a trace job of its model
/// when the catalog knows it (else `fallback_model`), on the model's first
/// task; its length is what the tuner predicts, never read from here.
pub fn live_specs(jobs: &[LiveJob], catalog: &Catalog, fallback_model: &str) -> Vec<WorkloadJob> {
    let first_task = |m: &str| {
        catalog
            .models
            .get(m)
            .and_then(|mt| mt.tasks.keys().next().cloned())
    };
    jobs.iter()
        .map(|j| {
            let (model, task) = match first_task(&j.model) {
                Some(t) => (j.model.clone(), t),
                None => (
                    fallback_model.to_string(),
                    first_task(fallback_model).unwrap_or_default(),
                ),
            };
            let gpus = j.gpus.max(1);
            WorkloadJob {
                name: j.id.clone(),
                submit_s: j.submitted_s,
                model,
                task,
                gpus,
                max_gpus: gpus,
                min_gpus: 0,
                batch: 32 * gpus,
                sharing: false,
                pipeline: false,
                epochs: None,
                target_metric: None,
                curve_key: None,
                trace_gpu_s: Some(3600.0 * f64::from(gpus)),
                gpu_model: None,
                expert_parallel: 0,
                slo: Default::default(),
                queueing: Default::default(),
                max_work_x: None,
            }
        })
        .collect()
}

/// The observation of live jobs (`specs` from [`live_specs`] of the same
/// jobs, in the same order).
pub fn live_observation<'a>(
    now: f64,
    jobs: &[LiveJob],
    specs: &'a [WorkloadJob],
) -> Observation<'a> {
    Observation {
        now,
        jobs: jobs
            .iter()
            .zip(specs)
            .enumerate()
            .map(|(index, (j, spec))| crate::engine::ObservedJob {
                index,
                spec,
                state: j.state,
                executed_s: j.executed_s,
                attained_gpu_s: j.attained_gpu_s,
                fair_share_gpu_s: j.fair_share_gpu_s,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
