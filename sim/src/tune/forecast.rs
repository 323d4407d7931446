//! What AutoSched predicts: the next period's arrivals and job durations
//! (a duration predictor by class and size), aggregated into a shorter
//! trace to simulate.

use std::collections::BTreeMap;

use crate::engine::{History, Observation, ObservedState};
use crate::generate::Rng;
use crate::workload::WorkloadJob;

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
    pub(crate) fn carried(&self) -> bool {
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
