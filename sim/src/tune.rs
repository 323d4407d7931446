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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use fmsched_core::policy::Policy;
use fmsched_core::policy::baselines::with_knobs;
use fmsched_estimator::lut::Lut;

use crate::catalog::Catalog;
use crate::engine::{History, Observation, ObservedState, SimConfig, SimResult, Simulation};
use crate::generate::Rng;
use crate::workload::WorkloadJob;

/// Knob values by name, as `with_knobs` takes them.
pub type Knobs = BTreeMap<String, f64>;

/// One tunable knob and its range.
#[derive(Clone, Debug, PartialEq)]
pub struct Knob {
    pub name: &'static str,
    pub lo: f64,
    pub hi: f64,
    /// Sampled on a log scale.
    pub log: bool,
}

impl Knob {
    /// `v` mapped to [0, 1] on the knob's scale.
    fn unit(&self, v: f64) -> f64 {
        let v = v.clamp(self.lo, self.hi);
        if self.log {
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
    fn at_unit(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        if self.log {
            (self.lo.ln() + u * (self.hi.ln() - self.lo.ln())).exp()
        } else {
            self.lo + u * (self.hi - self.lo)
        }
    }
}

/// The knobs AutoSched tunes for a policy (thesis Table 6.1: Tiresias'
/// queue threshold and starvation limit, Themis' lease term; both their
/// round interval). None: the policy has nothing worth tuning here.
pub fn knob_space(policy: &str) -> Option<Vec<Knob>> {
    let interval = Knob {
        name: "interval_s",
        lo: 60.0,
        hi: 600.0,
        log: true,
    };
    Some(match policy {
        "tiresias" => vec![
            Knob {
                name: "threshold_gpu_h",
                lo: 0.05,
                hi: 64.0,
                log: true,
            },
            Knob {
                name: "starvation_factor",
                lo: 1.0,
                hi: 100.0,
                log: true,
            },
            interval,
        ],
        "themis" => vec![
            Knob {
                name: "lease_s",
                lo: 60.0,
                hi: 7200.0,
                log: true,
            },
            interval,
        ],
        _ => return None,
    })
}

/// What a configuration is judged by (higher is better).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    /// 1 / average JCT (Tiresias' goal).
    AvgJct,
    /// Share of jobs with Themis' ρ ≤ 1 (§6.6.4), [`crate::engine::JobResult::fair_rho`].
    FairShare,
}

impl Objective {
    pub fn for_policy(policy: &str) -> Self {
        if policy == "themis" {
            Objective::FairShare
        } else {
            Objective::AvgJct
        }
    }

    /// The score of a run, higher is better.
    pub fn score(self, r: &SimResult) -> f64 {
        if r.jobs.is_empty() {
            return 0.0;
        }
        match self {
            Objective::AvgJct => {
                let mean = r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
                1.0 / mean.max(1e-9)
            }
            Objective::FairShare => {
                r.jobs.iter().filter(|j| j.fair_rho <= 1.0 + 1e-9).count() as f64
                    / r.jobs.len() as f64
            }
        }
    }
}

impl Objective {
    /// The score of what happened: jobs that finished in `[from, to)` of
    /// the observed run. None when none did.
    pub fn observed(self, obs: &Observation<'_>, from: f64, to: f64) -> Option<f64> {
        let done: Vec<(f64, f64)> = obs
            .jobs
            .iter()
            .filter_map(|o| match o.state {
                ObservedState::Done { finish_s } if finish_s >= from && finish_s < to => Some((
                    finish_s - o.spec.submit_s,
                    o.fair_share_gpu_s / o.attained_gpu_s.max(1e-9),
                )),
                _ => None,
            })
            .collect();
        if done.is_empty() {
            return None;
        }
        let n = done.len() as f64;
        Some(match self {
            Objective::AvgJct => n / done.iter().map(|d| d.0).sum::<f64>().max(1e-9),
            Objective::FairShare => done.iter().filter(|d| d.1 <= 1.0 + 1e-9).count() as f64 / n,
        })
    }
}

/// Upper bounds of the duration buckets, seconds (the last is open).
pub const BUCKETS_S: [f64; 5] = [300.0, 1800.0, 3600.0, 7200.0, 14_400.0];

/// The bucket of a duration.
pub fn bucket_of(d: f64) -> usize {
    BUCKETS_S.iter().take_while(|&&b| d >= b).count()
}

/// A finished job as the predictor learns from it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    pub finish_s: f64,
    pub gpus: u32,
    /// Seconds it ran.
    pub duration_s: f64,
}

/// The GPU class a job is predicted within.
fn gpu_class(g: u32) -> u8 {
    match g {
        0 | 1 => 0,
        2..=4 => 1,
        5..=8 => 2,
        _ => 3,
    }
}

/// The local predictor (§6.4.2.2): a job's total running time as a bucket,
/// from the finished jobs that ran at least as long as it has so far (the
/// survival condition), of its GPU class when there are enough of them,
/// weighted by how recently they finished (half-life `half_life_s`), so
/// that it follows drift. The predicted bucket is the heaviest one; the
/// time is drawn among those survivors' durations inside it.
#[derive(Clone, Debug)]
pub struct DurationPredictor {
    pub half_life_s: f64,
    /// Fewest survivors of the job's class before all classes are used.
    pub min_class: usize,
}

impl Default for DurationPredictor {
    fn default() -> Self {
        Self {
            half_life_s: 86_400.0,
            min_class: 8,
        }
    }
}

impl DurationPredictor {
    /// Survivors: (weight, duration) of finished jobs that ran longer than
    /// `elapsed`, of `gpus`' class if it has enough.
    fn survivors(
        &self,
        history: &[Finished],
        now: f64,
        gpus: u32,
        elapsed: f64,
    ) -> Vec<(f64, f64)> {
        let weight = |f: &Finished| 0.5f64.powf(((now - f.finish_s).max(0.0)) / self.half_life_s);
        let class = gpu_class(gpus);
        let of_class: Vec<(f64, f64)> = history
            .iter()
            .filter(|f| f.duration_s > elapsed && gpu_class(f.gpus) == class)
            .map(|f| (weight(f), f.duration_s))
            .collect();
        if of_class.len() >= self.min_class {
            return of_class;
        }
        history
            .iter()
            .filter(|f| f.duration_s > elapsed)
            .map(|f| (weight(f), f.duration_s))
            .collect()
    }

    /// The predicted bucket of the total running time of a job of `gpus`
    /// that has run `elapsed` seconds; None without history to go on.
    pub fn bucket(&self, history: &[Finished], now: f64, gpus: u32, elapsed: f64) -> Option<usize> {
        let s = self.survivors(history, now, gpus, elapsed);
        let mut mass = [0.0; BUCKETS_S.len() + 1];
        for (w, d) in &s {
            mass[bucket_of(*d)] += w;
        }
        (!s.is_empty()).then(|| {
            (0..mass.len())
                .max_by(|&a, &b| mass[a].total_cmp(&mass[b]).then(b.cmp(&a)))
                .unwrap_or(0)
        })
    }

    /// A remaining running time for such a job: a survivor's duration from
    /// the predicted bucket, less `elapsed`. Without survivors it has run
    /// longer than any finished job: it is given as long again as it has
    /// run (the median of a Pareto tail with index 1).
    pub fn remaining(
        &self,
        history: &[Finished],
        now: f64,
        gpus: u32,
        elapsed: f64,
        rng: &mut Rng,
    ) -> f64 {
        let s = self.survivors(history, now, gpus, elapsed);
        let Some(b) = self.bucket(history, now, gpus, elapsed) else {
            return elapsed.max(60.0);
        };
        let inside: Vec<(f64, f64)> = s.into_iter().filter(|(_, d)| bucket_of(*d) == b).collect();
        let total: f64 = inside.iter().map(|x| x.0).sum();
        let mut u = rng.f64() * total;
        for (w, d) in &inside {
            u -= w;
            if u <= 0.0 {
                return (d - elapsed).max(1.0);
            }
        }
        inside
            .last()
            .map_or(elapsed.max(60.0), |x| (x.1 - elapsed).max(1.0))
    }

    /// Bucket accuracy at arrival on the newest `holdout` share of
    /// `history` (by finish time), trained on the rest; None when too few.
    pub fn accuracy(&self, history: &[Finished], holdout: f64) -> Option<f64> {
        let mut h = history.to_vec();
        h.sort_by(|a, b| a.finish_s.total_cmp(&b.finish_s));
        let cut = ((h.len() as f64) * (1.0 - holdout)).round() as usize;
        if cut < 10 || cut >= h.len() {
            return None;
        }
        let (train, test) = h.split_at(cut);
        let now = train[cut - 1].finish_s;
        let hit = test
            .iter()
            .filter(|f| self.bucket(train, now, f.gpus, 0.0) == Some(bucket_of(f.duration_s)))
            .count();
        Some(hit as f64 / test.len() as f64)
    }
}

/// Predicted traces smaller than this are not aggregated.
pub const MIN_AGGREGATE_JOBS: usize = 50;

/// Length of the reference segment and of the forecast, seconds.
pub const SEGMENT_S: f64 = 3600.0;
/// Width of one arrival-count bin (§6.4.2.1: 5 minutes).
pub const BIN_S: f64 = 300.0;

/// The global generator (§6.4.2.1): given arrival times up to `now`
/// (sorted), the start of the past hour whose *preceding* hour looked most
/// like the last hour in 5-minute arrival counts (Manhattan distance;
/// ties go to the most recent). None until two hours of history exist.
pub fn matching_segment(arrivals: &[f64], origin: f64, now: f64) -> Option<f64> {
    let per = (SEGMENT_S / BIN_S).round() as usize;
    let bins = ((now - origin) / BIN_S).floor() as usize;
    if bins < 2 * per + 1 {
        return None;
    }
    // Counts of the whole bins ending at `now`.
    let start = now - bins as f64 * BIN_S;
    let mut counts = vec![0.0f64; bins];
    for &t in arrivals {
        if t >= start && t < now {
            let k = (((t - start) / BIN_S).floor() as usize).min(bins - 1);
            counts[k] += 1.0;
        }
    }
    let reference = &counts[bins - per..];
    // A candidate reference at [s, s + per) is followed by [s + per,
    // s + 2 per), which must lie wholly in the past.
    let mut best: Option<(f64, usize)> = None;
    for s in 0..=bins - 2 * per {
        let d: f64 = counts[s..s + per]
            .iter()
            .zip(reference)
            .map(|(a, b)| (a - b).abs())
            .sum();
        if best.is_none_or(|(bd, _)| d <= bd) {
            best = Some((d, s));
        }
    }
    best.map(|(_, s)| start + (s + per) as f64 * BIN_S)
}

/// A job of a predicted trace, with what it carries over from the cluster.
#[derive(Clone, Debug)]
pub struct TraceJob {
    pub job: WorkloadJob,
    /// What it carries over from the cluster (all zero for a predicted
    /// arrival).
    pub history: History,
}

impl TraceJob {
    /// A job that arrives in the trace, with no history.
    pub fn arriving(job: WorkloadJob) -> Self {
        Self {
            job,
            history: History::default(),
        }
    }
    fn carried(&self) -> bool {
        self.history != History::default()
    }
}

/// The workload a tuner expects from `obs.now` on, on a clock that starts
/// there: the jobs in the cluster (remaining times predicted) and the
/// arrivals of the next [`SEGMENT_S`] (a replayed past hour).
#[derive(Clone, Debug, Default)]
pub struct PredictedTrace {
    pub jobs: Vec<TraceJob>,
    /// Jobs carried over from the cluster (the rest arrive).
    pub existing: usize,
    /// Where the arrivals were copied from (seconds on the run's clock).
    pub replayed_from: Option<f64>,
}

/// How the future is guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forecast {
    /// AutoSched: the jobs in the cluster, with predicted remaining times,
    /// and the hour after the most similar past hour.
    AutoSched,
    /// SelfTune-like "historical adaptive" tuning (§6.3): the last hour's
    /// arrivals, replayed as they came, with nothing carried over.
    PastHour,
}

/// What the run has taught a tuner so far.
fn finished_of(obs: &Observation<'_>) -> Vec<Finished> {
    obs.jobs
        .iter()
        .filter_map(|o| match o.state {
            ObservedState::Done { finish_s } => Some(Finished {
                finish_s,
                gpus: o.spec.gpus,
                duration_s: o.executed_s,
            }),
            _ => None,
        })
        .collect()
}

/// A job of the trace: `spec` with `run_s` seconds of work at its GPUs.
fn with_duration(spec: &WorkloadJob, name: String, submit_s: f64, run_s: f64) -> WorkloadJob {
    WorkloadJob {
        name,
        submit_s,
        trace_gpu_s: Some(run_s.max(1.0) * f64::from(spec.gpus.max(1))),
        ..spec.clone()
    }
}

/// Builds the trace a tuner evaluates configurations on.
pub fn predict_trace(
    obs: &Observation<'_>,
    forecast: Forecast,
    predictor: &DurationPredictor,
    rng: &mut Rng,
) -> PredictedTrace {
    let history = finished_of(obs);
    let now = obs.now;
    let mut out = PredictedTrace::default();
    // Total running time of an observed job: what it ran if done, else a
    // prediction.
    let total_run = |o: &crate::engine::ObservedJob<'_>, rng: &mut Rng| match o.state {
        ObservedState::Done { .. } => o.executed_s,
        _ => o.executed_s + predictor.remaining(&history, now, o.spec.gpus, o.executed_s, rng),
    };
    if forecast == Forecast::AutoSched {
        for o in &obs.jobs {
            if matches!(o.state, ObservedState::Done { .. }) {
                continue;
            }
            let rem = predictor.remaining(&history, now, o.spec.gpus, o.executed_s, rng);
            out.jobs.push(TraceJob {
                job: with_duration(o.spec, format!("live-{}", o.index), 0.0, rem),
                history: History {
                    attained_gpu_s: o.attained_gpu_s,
                    executed_s: o.executed_s,
                    age_s: (now - o.spec.submit_s).max(0.0),
                    fair_share_gpu_s: o.fair_share_gpu_s,
                },
            });
        }
        out.existing = out.jobs.len();
    }
    let mut arrivals: Vec<f64> = obs.jobs.iter().map(|o| o.spec.submit_s).collect();
    arrivals.sort_by(f64::total_cmp);
    let origin = arrivals.first().copied().unwrap_or(now);
    let from = match forecast {
        Forecast::AutoSched => matching_segment(&arrivals, origin, now).unwrap_or(now - SEGMENT_S),
        Forecast::PastHour => now - SEGMENT_S,
    };
    out.replayed_from = Some(from);
    for o in &obs.jobs {
        let t = o.spec.submit_s;
        if t >= from && t < from + SEGMENT_S && t < now {
            let run = total_run(o, rng);
            out.jobs.push(TraceJob::arriving(with_duration(
                o.spec,
                format!("next-{}", o.index),
                t - from,
                run,
            )));
        }
    }
    out
}

/// The trace aggregator (§6.4.3.2): jobs alike in arrival (the same
/// 5-minute bin), GPU request and duration bucket merge into one that
/// arrives at their mean arrival, asks for the sum of their GPUs (at most
/// `max_gpus`) and runs as long as keeps their GPU-time; carried-over
/// jobs sum their attained service and average their executed time.
pub fn aggregate(jobs: &[TraceJob], max_gpus: u32) -> Vec<TraceJob> {
    let run_s = |t: &TraceJob| t.job.trace_gpu_s.unwrap_or(0.0) / f64::from(t.job.gpus.max(1));
    let mut groups: BTreeMap<(bool, i64, u32, usize), Vec<&TraceJob>> = BTreeMap::new();
    for t in jobs {
        let carried = t.carried();
        let key = (
            carried,
            (t.job.submit_s / BIN_S).floor() as i64,
            t.job.gpus,
            bucket_of(run_s(t)),
        );
        groups.entry(key).or_default().push(t);
    }
    let mut out = Vec::new();
    for members in groups.values() {
        let mut chunk: Vec<&TraceJob> = Vec::new();
        let mut flush = |chunk: &mut Vec<&TraceJob>| {
            if chunk.len() == 1 {
                out.push(chunk[0].clone());
            } else if !chunk.is_empty() {
                let n = chunk.len() as f64;
                let gpus: u32 = chunk.iter().map(|t| t.job.gpus).sum();
                let gpu_s: f64 = chunk.iter().map(|t| t.job.trace_gpu_s.unwrap_or(0.0)).sum();
                let first = chunk[0];
                out.push(TraceJob {
                    job: WorkloadJob {
                        name: format!("agg-{}x-{}", chunk.len(), first.job.name),
                        submit_s: chunk.iter().map(|t| t.job.submit_s).sum::<f64>() / n,
                        gpus,
                        max_gpus: gpus,
                        batch: first.job.batch.max(1) / first.job.gpus.max(1) * gpus,
                        trace_gpu_s: Some(gpu_s),
                        ..first.job.clone()
                    },
                    history: History {
                        attained_gpu_s: chunk.iter().map(|t| t.history.attained_gpu_s).sum(),
                        executed_s: chunk.iter().map(|t| t.history.executed_s).sum::<f64>() / n,
                        age_s: chunk.iter().map(|t| t.history.age_s).sum::<f64>() / n,
                        fair_share_gpu_s: chunk.iter().map(|t| t.history.fair_share_gpu_s).sum(),
                    },
                });
            }
            chunk.clear();
        };
        for t in members {
            let g: u32 = chunk.iter().map(|c| c.job.gpus).sum();
            if !chunk.is_empty() && g + t.job.gpus > max_gpus {
                flush(&mut chunk);
            }
            chunk.push(t);
        }
        flush(&mut chunk);
    }
    out.sort_by(|a, b| {
        a.job
            .submit_s
            .total_cmp(&b.job.submit_s)
            .then(a.job.name.cmp(&b.job.name))
    });
    out
}

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
pub struct Decision {
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
    pub decisions: Vec<Decision>,
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

    /// One tuning; with `adopt` false (a dry run) the active knobs stay
    /// whatever it finds, and the decision says what it would have done.
    pub fn decide(&mut self, obs: &Observation<'_>, adopt: bool) -> Decision {
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
        // Sample, then reject those the model predicts to lose.
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
        // The full-trace measurements teach the rejection model too, over
        // what stage 1 said of the same configurations.
        for (k, sc) in finalists.iter().zip(&second).skip(1) {
            let u = self.unit_vec(k);
            let rel = sc.unwrap_or(0.0) / current_score.max(1e-12);
            match self.memory.iter_mut().rev().find(|m| m.0 == u) {
                Some(m) => m.1 = rel,
                None => self.memory.push((u, rel)),
            }
        }
        let realised_gain = self.last_adoption.and_then(|t| {
            let span = obs.now - t;
            let after = self.objective.observed(obs, t, obs.now)?;
            let before = self.objective.observed(obs, t - span, t)?;
            (span > 0.0 && before > 0.0).then(|| after / before)
        });
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
        self.decisions.push(Decision {
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

/// Knob values rounded to what an operator would write (3 significant
/// digits), so decisions read well and repeat exactly.
fn round_knob(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    // Through decimal text, so 67.1 is the f64 nearest 67.1 and prints so.
    format!("{v:.2e}").parse().unwrap_or(v)
}

/// A policy's own default for a knob.
pub fn default_knob(policy: &str, knob: &str) -> Option<f64> {
    use fmsched_core::policy::baselines::{Themis, Tiresias};
    match (policy, knob) {
        ("tiresias", "interval_s") => Some(Tiresias::default().interval_s),
        ("tiresias", "starvation_factor") => Some(Tiresias::default().starvation_factor),
        ("tiresias", "threshold_gpu_h") => Tiresias::default()
            .thresholds_gpu_s
            .first()
            .map(|s| s / 3600.0),
        ("themis", "interval_s") => Some(Themis::default().interval_s),
        ("themis", "lease_s") => Some(Themis::default().lease_s),
        _ => None,
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
mod tests {
    use super::*;

    fn job(name: &str, submit_s: f64, gpus: u32, run_s: f64) -> WorkloadJob {
        WorkloadJob {
            name: name.into(),
            submit_s,
            model: "roberta-base".into(),
            task: "rte".into(),
            gpus,
            max_gpus: gpus,
            min_gpus: 0,
            batch: 32 * gpus,
            sharing: true,
            pipeline: false,
            epochs: None,
            target_metric: None,
            curve_key: None,
            trace_gpu_s: Some(run_s * f64::from(gpus)),
            gpu_model: None,
            expert_parallel: 0,
            slo: Default::default(),
            queueing: Default::default(),
            max_work_x: None,
        }
    }

    #[test]
    fn knobs_are_rounded_to_three_significant_digits() {
        assert_eq!(round_knob(67.100_000_000_000_01), 67.1);
        assert_eq!(round_knob(0.938_000_000_1), 0.938);
        assert_eq!(round_knob(1234.5), 1230.0);
        assert_eq!(format!("{}", round_knob(64.600_000_000_000_01)), "64.6");
    }

    #[test]
    fn buckets_split_at_five_and_thirty_minutes_one_two_and_four_hours() {
        assert_eq!(bucket_of(0.0), 0);
        assert_eq!(bucket_of(299.0), 0);
        assert_eq!(bucket_of(300.0), 1);
        assert_eq!(bucket_of(3599.0), 2);
        assert_eq!(bucket_of(7200.0), 4);
        assert_eq!(bucket_of(1e6), 5);
    }

    #[test]
    fn the_matching_segment_is_the_past_hour_that_looked_like_the_last_one() {
        // Arrivals per 5 minutes, hour by hour: quiet (1) or busy (6). The
        // last hour (5) is quiet; the past quiet hours with a known
        // successor are 0 (then busy), 2 (then quiet) and 3 (then busy);
        // the most recent of equally close matches wins, so hour 4 (busy)
        // is replayed.
        let pattern = [1, 6, 1, 1, 6, 1];
        let mut t = Vec::new();
        for (h, per_bin) in pattern.iter().enumerate() {
            for bin in 0..12 {
                for k in 0..*per_bin {
                    t.push(h as f64 * 3600.0 + bin as f64 * 300.0 + k as f64 * 10.0);
                }
            }
        }
        let from = matching_segment(&t, 0.0, 6.0 * 3600.0).unwrap();
        assert_eq!(from, 4.0 * 3600.0);
        let count = t
            .iter()
            .filter(|&&x| x >= from && x < from + 3600.0)
            .count();
        assert_eq!(count, 72, "the replayed hour is a busy one");
        // With hour 3 made busy, hour 2 is the latest quiet match: hour 3
        // is replayed.
        let t2: Vec<f64> = t
            .iter()
            .copied()
            .chain((0..60).map(|k| 3.0 * 3600.0 + k as f64 * 60.0 + 5.0))
            .collect();
        let mut t2 = t2;
        t2.sort_by(f64::total_cmp);
        assert_eq!(
            matching_segment(&t2, 0.0, 6.0 * 3600.0).unwrap(),
            3.0 * 3600.0
        );
        assert!(
            matching_segment(&t, 0.0, 1.5 * 3600.0).is_none(),
            "too little history"
        );
    }

    #[test]
    fn the_predictor_conditions_on_survival_and_follows_the_gpu_class() {
        let mut h = Vec::new();
        for k in 0..40 {
            // One-GPU jobs are short (10 min), eight-GPU jobs long (3 h).
            h.push(Finished {
                finish_s: k as f64 * 100.0,
                gpus: 1,
                duration_s: 600.0,
            });
            h.push(Finished {
                finish_s: k as f64 * 100.0,
                gpus: 8,
                duration_s: 3.0 * 3600.0,
            });
        }
        let p = DurationPredictor::default();
        assert_eq!(p.bucket(&h, 4000.0, 1, 0.0), Some(1));
        assert_eq!(p.bucket(&h, 4000.0, 8, 0.0), Some(4));
        // A one-GPU job that has run an hour is no ten-minute job.
        assert_eq!(p.bucket(&h, 4000.0, 1, 3600.0), Some(4));
        let mut rng = Rng::new(1);
        let rem = p.remaining(&h, 4000.0, 1, 3600.0, &mut rng);
        assert!((rem - 2.0 * 3600.0).abs() < 1.0, "{rem}");
        // Longer than anything seen: as long again.
        assert_eq!(
            p.remaining(&h, 4000.0, 8, 5.0 * 3600.0, &mut rng),
            5.0 * 3600.0
        );
        assert_eq!(p.accuracy(&h, 0.25), Some(1.0));
    }

    #[test]
    fn the_aggregator_keeps_gpu_time_and_merges_only_alike_jobs() {
        let jobs: Vec<TraceJob> = vec![
            job("a", 10.0, 1, 600.0),
            job("b", 20.0, 1, 700.0),
            job("c", 30.0, 1, 800.0),
            job("d", 40.0, 2, 650.0),  // other GPU count
            job("e", 50.0, 1, 4000.0), // other bucket
            job("f", 400.0, 1, 600.0), // other 5-minute bin
        ]
        .into_iter()
        .map(TraceJob::arriving)
        .collect();
        let gpu_s = |v: &[TraceJob]| v.iter().map(|t| t.job.trace_gpu_s.unwrap()).sum::<f64>();
        let agg = aggregate(&jobs, 8);
        assert_eq!(agg.len(), 4, "{agg:#?}");
        assert!((gpu_s(&agg) - gpu_s(&jobs)).abs() < 1e-6);
        let merged = agg
            .iter()
            .find(|t| t.job.name.starts_with("agg-3x"))
            .unwrap();
        assert_eq!(merged.job.gpus, 3);
        assert!((merged.job.submit_s - 20.0).abs() < 1e-9);
        // A cap of two GPUs splits the three into a pair and a single.
        assert_eq!(aggregate(&jobs, 2).len(), 5);
    }

    /// Short jobs arriving steadily on one 4-GPU node, with a few long
    /// ones: round intervals matter (a job waits for the next round).
    fn steady(hours: f64) -> Vec<WorkloadJob> {
        let mut rng = Rng::new(7);
        let mut out = Vec::new();
        let mut t = 0.0;
        let mut k = 0;
        while t < hours * 3600.0 {
            let long = k % 10 == 0;
            let run = if long {
                5400.0
            } else {
                200.0 + 400.0 * rng.f64()
            };
            out.push(job(&format!("j{k}"), t, if long { 2 } else { 1 }, run));
            t += 150.0 + 150.0 * rng.f64();
            k += 1;
        }
        out
    }

    fn setup() -> (SimConfig, Lut, Catalog) {
        let cfg = SimConfig {
            profile_s: 0.0,
            ..SimConfig::uniform(1, 4, "V100")
        };
        (
            cfg,
            fmsched_estimator::analytic::default_lut().unwrap(),
            Catalog::default_synthetic(),
        )
    }

    #[test]
    fn a_retuned_run_sees_only_the_past_and_hands_on_to_the_new_policy() {
        let (cfg, lut, cat) = setup();
        let jobs = steady(3.0);
        let slow = with_knobs("tiresias", &Knobs::from([("interval_s".into(), 600.0)])).unwrap();
        let fast = with_knobs("tiresias", &Knobs::from([("interval_s".into(), 60.0)])).unwrap();
        let run = |p: &dyn Policy| {
            Simulation::new(cfg.clone(), &lut, &cat, &jobs)
                .unwrap()
                .run(p, &cat, |_, _| {})
                .unwrap()
        };
        let (slow_r, fast_r) = (run(slow.as_ref()), run(fast.as_ref()));
        let mut calls = Vec::new();
        let mut hook =
            |obs: &Observation<'_>, active: &dyn Policy| -> Option<Box<dyn Policy + Send + Sync>> {
                // Only arrived jobs, and nothing finished after now.
                assert!(obs.jobs.iter().all(|o| o.spec.submit_s <= obs.now));
                assert!(obs.jobs.iter().all(|o| match o.state {
                    ObservedState::Done { finish_s } => finish_s <= obs.now,
                    _ => true,
                }));
                calls.push((obs.now, active.interval_s()));
                with_knobs("tiresias", &Knobs::from([("interval_s".into(), 60.0)])).ok()
            };
        let swapped = Simulation::new(cfg.clone(), &lut, &cat, &jobs)
            .unwrap()
            .run_retuned(
                slow.as_ref(),
                &cat,
                |_, _| {},
                Some(crate::engine::Retune {
                    every_s: 1800.0,
                    hook: &mut hook,
                }),
            )
            .unwrap();
        assert!(calls.len() >= 5, "{calls:?}");
        assert_eq!(
            calls[0],
            (1800.0, 600.0),
            "the first call sees the starting policy"
        );
        assert_eq!(
            calls[1].1, 60.0,
            "later calls see the policy it handed over"
        );
        let avg = |r: &SimResult| r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
        assert!(
            avg(&fast_r) < avg(&slow_r),
            "the test needs intervals to matter"
        );
        assert!(
            avg(&swapped) < avg(&slow_r),
            "the handed-over policy decides"
        );
        assert!(
            avg(&swapped) > avg(&fast_r) - 1e-9,
            "the first half hour ran slow"
        );
    }

    #[test]
    fn the_tuner_adopts_only_what_beats_the_active_knobs_by_the_threshold() {
        let (cfg, lut, cat) = setup();
        let jobs = steady(4.0);
        let start = Knobs::from([("interval_s".into(), 600.0)]);
        let search = SearchConfig {
            samples: 6,
            threads: 2,
            ..Default::default()
        };
        // A replay re-tuned hourly from `start` under `search`.
        let tuned_run = |search: SearchConfig| {
            let mut tuner = Tuner::new(
                "tiresias",
                start.clone(),
                cfg.clone(),
                Arc::new(lut.clone()),
                Arc::new(cat.clone()),
                Forecast::AutoSched,
                search,
            )
            .unwrap();
            let r = replay(
                &cfg,
                &lut,
                &cat,
                &jobs,
                "tiresias",
                &start,
                Some((&mut tuner, 3600.0)),
            )
            .unwrap();
            (r, tuner.decisions.clone(), tuner.knobs().clone())
        };
        let (tuned, decisions, knobs) = tuned_run(search.clone());
        let fixed = replay(&cfg, &lut, &cat, &jobs, "tiresias", &start, None).unwrap();
        let adopted: Vec<&Decision> = decisions.iter().filter(|d| d.adopted).collect();
        assert!(!adopted.is_empty(), "{decisions:#?}");
        assert!(adopted.iter().all(|d| d.gain > 1.1));
        assert!(
            decisions
                .iter()
                .filter(|d| !d.adopted)
                .all(|d| d.gain <= 1.1)
        );
        assert!(knobs["interval_s"] < 600.0, "{knobs:?}");
        // Realised gains: none before the first adoption, then measured
        // on the jobs that finished since.
        let first = decisions.iter().position(|d| d.adopted).unwrap();
        assert!(
            decisions[..=first]
                .iter()
                .all(|d| d.realised_gain.is_none())
        );
        assert!(
            decisions[first + 1..]
                .iter()
                .any(|d| d.realised_gain.is_some_and(|g| g > 0.0)),
            "{decisions:#?}"
        );
        let avg = |r: &SimResult| r.jobs.iter().map(|j| j.jct_s).sum::<f64>() / r.jobs.len() as f64;
        assert!(
            avg(&tuned) < avg(&fixed),
            "{} vs {}",
            avg(&tuned),
            avg(&fixed)
        );
        // A threshold nothing can pass: the knobs never move.
        let (same, decisions, knobs) = tuned_run(SearchConfig {
            threshold: 1e9,
            ..search
        });
        assert!(!decisions.is_empty());
        assert!(decisions.iter().all(|d| !d.adopted));
        assert_eq!(knobs["interval_s"], 600.0);
        assert_eq!(avg(&same), avg(&fixed));
        assert!(
            Tuner::new(
                "ymir",
                Knobs::new(),
                cfg,
                Arc::new(lut.clone()),
                Arc::new(cat.clone()),
                Forecast::AutoSched,
                SearchConfig::default()
            )
            .is_err()
        );
    }

    #[test]
    fn a_carried_over_job_keeps_its_age_for_the_starvation_rule() {
        // Both jobs have attained 100 GPU-hours (Tiresias' low queue). The
        // waiter arrives a second later, so without its history it runs
        // second; having waited ten thousand seconds after running a hundred
        // (over Tiresias' starvation factor of 10), it is promoted and runs
        // first.
        let (_, lut, cat) = setup();
        let cfg = SimConfig {
            profile_s: 0.0,
            ..SimConfig::uniform(1, 1, "V100")
        };
        let jobs = vec![job("runner", 0.0, 1, 1800.0), job("waiter", 1.0, 1, 1800.0)];
        let tiresias = with_knobs("tiresias", &Knobs::new()).unwrap();
        let waiter_start = |age: f64| {
            let mut sim = Simulation::new(cfg.clone(), &lut, &cat, &jobs).unwrap();
            let h = |executed_s: f64, age_s: f64| History {
                attained_gpu_s: 100.0 * 3600.0,
                executed_s,
                age_s,
                fair_share_gpu_s: 0.0,
            };
            sim.seed_history(0, &h(3600.0, 3600.0));
            sim.seed_history(1, &h(100.0, age));
            let r = sim.run(tiresias.as_ref(), &cat, |_, _| {}).unwrap();
            r.jobs[1].first_start_s.unwrap()
        };
        assert!(waiter_start(0.0) > 1000.0, "{}", waiter_start(0.0));
        assert!(waiter_start(10_100.0) < 300.0, "{}", waiter_start(10_100.0));
    }

    #[test]
    fn the_observed_objective_counts_only_jobs_finished_in_the_window() {
        let specs: Vec<WorkloadJob> = (0..3)
            .map(|k| job(&format!("j{k}"), 100.0 * k as f64, 1, 60.0))
            .collect();
        let live: Vec<LiveJob> = [(Some(200.0), 10.0), (Some(500.0), 10.0), (None, 5.0)]
            .iter()
            .enumerate()
            .map(|(k, (finish, fair))| LiveJob {
                id: format!("j{k}"),
                submitted_s: 100.0 * k as f64,
                model: "roberta-base".into(),
                gpus: 1,
                state: finish.map_or(ObservedState::Running, |f| ObservedState::Done {
                    finish_s: f,
                }),
                executed_s: 60.0,
                attained_gpu_s: 60.0,
                fair_share_gpu_s: *fair,
            })
            .collect();
        let obs = live_observation(600.0, &live, &specs);
        // j0: JCT 200 s, finished at 200; j1: JCT 400 s, finished at 500.
        assert_eq!(
            Objective::AvgJct.observed(&obs, 0.0, 300.0),
            Some(1.0 / 200.0)
        );
        assert_eq!(
            Objective::AvgJct.observed(&obs, 0.0, 600.0),
            Some(2.0 / 600.0)
        );
        assert_eq!(Objective::AvgJct.observed(&obs, 501.0, 600.0), None);
        assert_eq!(Objective::FairShare.observed(&obs, 0.0, 600.0), Some(1.0));
    }
}
