//! Workload generator in the style of Pollux's (Ymir §7.1, thesis §3.6):
//! each job is Small (< 0.5 GPU-hours), Medium (0.5–10) or Large (10–64)
//! with probabilities 0.3 / 0.6 / 0.1; its GPU-time is drawn log-uniformly
//! inside its class, its task uniformly from the model's tasks in the
//! catalog, and its epochs are set so the work takes that GPU-time on one
//! GPU. Arrivals are Poisson over `hours / load` hours, so a higher load
//! factor packs the same jobs closer together. Seeded: the same arguments
//! give the same workload.
//!
//! Jobs of a Mixture-of-Experts model that take two GPUs or more train
//! expert-parallel (Lina): in groups of the largest power of two that
//! divides their GPUs and the model's experts, at most
//! `max_expert_parallel` (default 4, the smallest common node, so a group
//! fits any node). `pinned_fraction` of the jobs name a GPU model
//! (`resources.gpu_model`), drawn from `pin_gpu_models`.

pub use crate::rng::Rng;
use fmsched_core::policy::PIPELINE_STAGES;
use fmsched_estimator::lut::{Lut, Variant, packed_placement};

use crate::catalog::Catalog;
use crate::workload::WorkloadJob;

#[derive(Clone, Debug)]
pub struct GenConfig {
    pub jobs: usize,
    pub hours: f64,
    pub load: f64,
    pub seed: u64,
    pub models: Vec<String>,
    pub gpu_type: String,
    /// Fraction of jobs that opt out of merging (Ymir §9).
    pub private_fraction: f64,
    /// Arrival times of a trace (seconds, any origin): when given, arrivals
    /// follow the trace's shape (its times rescaled onto the window)
    /// instead of a Poisson process.
    pub arrivals: Option<Vec<f64>>,
    /// Largest expert-parallel group of an MoE job (0 or 1: none).
    pub max_expert_parallel: u32,
    /// Share of the jobs pinned to a GPU model of `pin_gpu_models`
    /// (0: none, and no random draw is spent on it).
    pub pinned_fraction: f64,
    /// GPU models pinned jobs name (empty: `gpu_type`).
    pub pin_gpu_models: Vec<String>,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            jobs: 120,
            hours: 8.0,
            load: 1.0,
            seed: 1,
            models: vec!["roberta-base".into()],
            gpu_type: "V100".into(),
            private_fraction: 0.05,
            arrivals: None,
            max_expert_parallel: 4,
            pinned_fraction: 0.0,
            pin_gpu_models: Vec::new(),
        }
    }
}

/// Global batch of a model's jobs (samples per step).
fn batch_for(model: &str) -> u32 {
    if model.contains("7b") {
        16
    } else if model.starts_with("vit") {
        64
    } else {
        32
    }
}

pub fn generate(cfg: &GenConfig, catalog: &Catalog, lut: &Lut) -> Result<Vec<WorkloadJob>, String> {
    if cfg.jobs == 0
        || cfg.hours.is_nan()
        || cfg.hours <= 0.0
        || cfg.load.is_nan()
        || cfg.load <= 0.0
    {
        return Err("jobs, hours and load must be > 0".into());
    }
    if !(0.0..=1.0).contains(&cfg.pinned_fraction) {
        return Err(format!(
            "the pinned fraction must be in [0, 1], got {}",
            cfg.pinned_fraction
        ));
    }
    let pin_to: Vec<String> = if cfg.pin_gpu_models.is_empty() {
        vec![cfg.gpu_type.clone()]
    } else {
        cfg.pin_gpu_models.clone()
    };
    let models = fmsched_core::models::ModelCatalog::builtin();
    let gpu = fmsched_estimator::analytic::gpu_family(&cfg.gpu_type);
    let tasks = catalog_tasks(cfg, catalog)?;
    let mut rng = Rng::new(cfg.seed);
    let window_s = cfg.hours * 3600.0 / cfg.load;
    let mean_gap = window_s / cfg.jobs as f64;
    let shaped = shaped_arrivals(cfg, window_s)?;
    let epoch_gpu_h = epoch_gpu_hours(&tasks, lut, &gpu)?;
    let mut t = 0.0;
    let mut out = Vec::with_capacity(cfg.jobs);
    for k in 0..cfg.jobs {
        t = match &shaped {
            Some(v) => v[k],
            None => t - mean_gap * rng.f64().ln(),
        };
        let u = rng.f64();
        let ((lo, hi), gpus): ((f64, f64), &[u32]) = if u < 0.3 {
            ((0.05, 0.5), &[1])
        } else if u < 0.9 {
            ((0.5, 10.0), &[1, 2, 4])
        } else {
            ((10.0, 64.0), &[4, 8])
        };
        let gpu_h = (lo.ln() + (hi.ln() - lo.ln()) * rng.f64()).exp();
        // The model is drawn uniformly from the chosen ones (every model
        // named gets jobs); its task by GPU-time (as Pollux's generator
        // does): one of the three whose one-epoch-at-one-GPU time is
        // closest to the drawn GPU-time in epochs between 1 and 10, so a
        // small dataset is not asked for hundreds of epochs. (One model:
        // no draw, so a seed's single-model workload is what it was.)
        let of_model: Option<&str> =
            (cfg.models.len() > 1).then(|| cfg.models[rng.below(cfg.models.len())].as_str());
        let mut by_fit: Vec<(f64, usize)> = tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| of_model.is_none_or(|m| t.0 == m))
            .map(|(k, _)| {
                let epochs = gpu_h / epoch_gpu_h[k];
                let miss = if epochs < 1.0 {
                    -epochs.ln()
                } else if epochs > 10.0 {
                    (epochs / 10.0).ln()
                } else {
                    0.0
                };
                (miss, k)
            })
            .collect();
        by_fit.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let pick = by_fit[rng.below(by_fit.len().min(3))].1;
        let (model, task, samples) = tasks[pick].clone();
        let pipeline = model.contains("7b");
        let mut g = gpus[rng.below(gpus.len())];
        if pipeline {
            g = g.max(PIPELINE_STAGES).next_multiple_of(PIPELINE_STAGES);
        }
        let batch = batch_for(&model);
        let variant = Variant {
            pipeline,
            ..Variant::base()
        };
        let layers = fmsched_estimator::analytic::layers_of(&model).unwrap_or(12);
        let one = if pipeline { 4 } else { 1 };
        let it = lut
            .iteration_time_on(
                &model,
                &gpu,
                &packed_placement(one, 4),
                batch,
                &variant,
                layers,
            )
            .map_err(|e| format!("{model}: {e}"))?;
        let rate = f64::from(batch) / it.seconds;
        let epochs = (gpu_h * 3600.0 / f64::from(one) * rate / samples).max(0.01);
        let experts = models.get(&model).map_or(0, |m| m.experts);
        let expert_parallel = expert_groups(g, experts, cfg.max_expert_parallel);
        let gpu_model = (cfg.pinned_fraction > 0.0 && rng.f64() < cfg.pinned_fraction)
            .then(|| pin_to[rng.below(pin_to.len())].clone());
        out.push(WorkloadJob {
            name: format!("{model}@{task}-{k}"),
            submit_s: (t * 10.0).round() / 10.0,
            model,
            task,
            gpus: g,
            max_gpus: g,
            min_gpus: 0,
            batch,
            sharing: rng.f64() >= cfg.private_fraction,
            pipeline,
            epochs: Some((epochs * 1000.0).round() / 1000.0),
            target_metric: None,
            curve_key: None,
            trace_gpu_s: None,
            gpu_model,
            expert_parallel,
            slo: Default::default(),
            queueing: Default::default(),
            max_work_x: None,
        });
    }
    Ok(out)
}

/// (model, task, samples per epoch) of every task of the chosen models in
/// the catalog.
fn catalog_tasks(cfg: &GenConfig, catalog: &Catalog) -> Result<Vec<(String, String, f64)>, String> {
    let mut tasks: Vec<(String, String, f64)> = Vec::new();
    for m in &cfg.models {
        let mt = catalog
            .models
            .get(m)
            .ok_or_else(|| format!("model {m:?} is not in the task catalog"))?;
        if mt.tasks.is_empty() {
            return Err(format!("model {m:?} has no tasks in the task catalog"));
        }
        for (t, info) in &mt.tasks {
            tasks.push((m.clone(), t.clone(), info.samples_per_epoch));
        }
    }
    if tasks.is_empty() {
        return Err("the chosen models have no tasks".into());
    }
    Ok(tasks)
}

/// Trace-shaped arrivals: the trace's k-th quantile time for job k, over
/// `window_s` (None: exponential gaps).
fn shaped_arrivals(cfg: &GenConfig, window_s: f64) -> Result<Option<Vec<f64>>, String> {
    Ok(match &cfg.arrivals {
        Some(times) if times.len() >= 2 => {
            let mut v: Vec<f64> = times.iter().copied().filter(|t| t.is_finite()).collect();
            v.sort_by(f64::total_cmp);
            let (lo, hi) = (v[0], v[v.len() - 1]);
            let span = (hi - lo).max(1e-9);
            Some(
                (0..cfg.jobs)
                    .map(|k| {
                        let q = v[k * (v.len() - 1) / (cfg.jobs - 1).max(1)];
                        (q - lo) / span * window_s
                    })
                    .collect(),
            )
        }
        Some(_) => return Err("the arrival trace needs at least two jobs".into()),
        None => None,
    })
}

/// GPU-hours of one epoch of each task on its smallest allocation.
fn epoch_gpu_hours(
    tasks: &[(String, String, f64)],
    lut: &Lut,
    gpu: &str,
) -> Result<Vec<f64>, String> {
    let mut epoch_gpu_h = Vec::with_capacity(tasks.len());
    for (model, _, samples) in tasks {
        let pipeline = model.contains("7b");
        let one = if pipeline { 4 } else { 1 };
        let variant = Variant {
            pipeline,
            ..Variant::base()
        };
        let layers = fmsched_estimator::analytic::layers_of(model).unwrap_or(12);
        let it = lut
            .iteration_time_on(
                model,
                gpu,
                &packed_placement(one, 4),
                batch_for(model),
                &variant,
                layers,
            )
            .map_err(|e| format!("{model}: {e}"))?;
        let rate = f64::from(batch_for(model)) / it.seconds;
        epoch_gpu_h.push(samples / rate * f64::from(one) / 3600.0);
    }
    Ok(epoch_gpu_h)
}

/// The expert-parallel group of a job on `gpus` GPUs of a model with
/// `experts` experts: the largest power of two that divides both, at most
/// `max`; 0 (none) for a dense model, one GPU, or a group of one.
pub fn expert_groups(gpus: u32, experts: u32, max: u32) -> u32 {
    if experts == 0 || gpus < 2 || max < 2 {
        return 0;
    }
    let ep = 1u32
        << gpus
            .trailing_zeros()
            .min(experts.trailing_zeros())
            .min(max.ilog2());
    if ep >= 2 { ep } else { 0 }
}

/// The cluster trace a drifting workload imitates (thesis §6.2.1, §6.6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Microsoft Philly (2017): mostly one-GPU jobs, median run around
    /// half an hour, a heavy tail.
    Philly,
    /// SenseTime Helios (2020): more multi-GPU jobs (8-GPU ones common),
    /// shorter median, heavier tail.
    Helios,
}

impl Shape {
    /// GPU requests and their probabilities.
    fn gpus(self) -> &'static [(u32, f64)] {
        match self {
            Shape::Philly => &[(1, 0.70), (2, 0.10), (4, 0.12), (8, 0.06), (16, 0.02)],
            Shape::Helios => &[
                (1, 0.45),
                (2, 0.10),
                (4, 0.15),
                (8, 0.22),
                (16, 0.06),
                (32, 0.02),
            ],
        }
    }
    /// Median run (seconds) and log-normal σ.
    fn duration(self) -> (f64, f64) {
        match self {
            Shape::Philly => (1800.0, 1.6),
            Shape::Helios => (720.0, 2.0),
        }
    }
}

/// One job of a shaped trace: (id, submitted at, GPUs, run seconds).
pub type TraceRow = (String, f64, u32, f64);

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut Rng) -> f64 {
    let (a, b) = (rng.f64(), rng.f64());
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// A Poisson draw (Knuth's product method; a normal approximation above 30).
fn poisson(rng: &mut Rng, lambda: f64) -> usize {
    if lambda > 30.0 {
        return (lambda + lambda.sqrt() * normal(rng)).round().max(0.0) as usize;
    }
    let l = (-lambda).exp();
    let (mut k, mut p) = (0usize, 1.0);
    loop {
        p *= rng.f64();
        if p <= l {
            return k;
        }
        k += 1;
    }
}

/// A cluster-trace-shaped workload that drifts (for AutoSched's
/// evaluation, thesis §6.6): `days` of arrivals with a daily cycle (peak
/// in the afternoon, trough at night), day-to-day changes of load
/// (log-normal, σ 0.35), of job length (median × log-normal, σ 0.5) and of
/// the share of multi-GPU jobs, and bursty hours (5 %: 3× arrivals). About
/// `jobs` jobs in all. `compress` divides every time (arrivals and runs)
/// so two weeks can be simulated as two days at the same load.
pub fn shaped(
    shape: Shape,
    days: u32,
    jobs: usize,
    compress: f64,
    seed: u64,
) -> Result<Vec<TraceRow>, String> {
    if days == 0 || jobs == 0 || compress.is_nan() || compress < 1.0 {
        return Err("days and jobs must be > 0 and compress >= 1".into());
    }
    let mut rng = Rng::new(seed);
    let day_load: Vec<f64> = (0..days).map(|_| (0.35 * normal(&mut rng)).exp()).collect();
    let day_len: Vec<f64> = (0..days).map(|_| (0.5 * normal(&mut rng)).exp()).collect();
    let day_big: Vec<f64> = (0..days).map(|_| (0.4 * normal(&mut rng)).exp()).collect();
    let hours = days as usize * 24;
    let weight: Vec<f64> = (0..hours)
        .map(|h| {
            let diurnal =
                1.0 + 0.6 * (std::f64::consts::TAU * ((h % 24) as f64 - 8.0) / 24.0).sin();
            let burst = if rng.f64() < 0.05 { 3.0 } else { 1.0 };
            diurnal * day_load[h / 24] * burst
        })
        .collect();
    let total: f64 = weight.iter().sum();
    let (median, sigma) = shape.duration();
    let mut out = Vec::with_capacity(jobs);
    for (h, w) in weight.iter().enumerate() {
        let d = h / 24;
        let n = poisson(&mut rng, jobs as f64 * w / total);
        let mut times: Vec<f64> = (0..n).map(|_| (h as f64 + rng.f64()) * 3600.0).collect();
        times.sort_by(f64::total_cmp);
        for t in times {
            // GPU request, with the day's tilt towards (or away from)
            // multi-GPU jobs.
            let probs: Vec<f64> = shape
                .gpus()
                .iter()
                .map(|&(g, p)| if g > 1 { p * day_big[d] } else { p })
                .collect();
            let mut u = rng.f64() * probs.iter().sum::<f64>();
            let mut gpus = shape.gpus()[0].0;
            for (k, p) in probs.iter().enumerate() {
                u -= p;
                if u <= 0.0 {
                    gpus = shape.gpus()[k].0;
                    break;
                }
            }
            let run = (median * day_len[d] * (sigma * normal(&mut rng)).exp())
                .clamp(60.0, 3.0 * 86_400.0);
            out.push((
                format!(
                    "{}-{}",
                    if shape == Shape::Philly {
                        "philly"
                    } else {
                        "helios"
                    },
                    out.len()
                ),
                ((t / compress) * 10.0).round() / 10.0,
                gpus,
                ((run / compress) * 10.0).round() / 10.0,
            ));
        }
    }
    Ok(out)
}

/// A shaped trace in the Helios layout (`fmsim run` reads it as such).
pub fn helios_csv(rows: &[TraceRow]) -> String {
    let mut s = String::from("job_id,gpu_num,submit_time,duration,state\n");
    for (id, t, g, d) in rows {
        s += &format!("{id},{g},{t},{d},COMPLETED\n");
    }
    s
}

/// ICEFROG's workload construction (§V-A): `120 × load` jobs sampled from
/// hours 3–6 of a Philly-shaped trace (their submission times and GPU
/// counts kept, arrivals counted from hour 3), each given a task that
/// matches its size (duration × GPUs, as the paper assigns Table VI's
/// tasks): under 1 GPU-hour a base model's task, 1–10 GPU-hours any, above
/// 10 a large model's; the trace's GPU-time becomes its work at its
/// requested GPUs. GPU ranges follow Table VI's classes (S up to 8 GPUs, M
/// 16, L 32), global batches are drawn 2-exponentially from four sizes per
/// model. `trace`: (id, submitted at, GPUs, run seconds) rows of a real
/// trace; None: [`shaped`]'s Philly shape, one day.
pub fn icefrog_workload(
    load: f64,
    seed: u64,
    catalog: &Catalog,
    trace: Option<&[TraceRow]>,
) -> Result<Vec<WorkloadJob>, String> {
    if load.is_nan() || load <= 0.0 {
        return Err("load must be > 0".into());
    }
    let want = (120.0 * load).round().max(1.0) as usize;
    let synthetic;
    let rows: &[TraceRow] = match trace {
        Some(r) => r,
        None => {
            synthetic = shaped(Shape::Philly, 1, 2_000 * want.div_ceil(120), 1.0, seed)?;
            &synthetic
        }
    };
    let t0 = rows.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    let window: Vec<&TraceRow> = rows
        .iter()
        .filter(|r| (3.0 * 3600.0..6.0 * 3600.0).contains(&(r.1 - t0)) && r.2 > 0)
        .collect();
    if window.is_empty() {
        return Err("the trace has no job in its hours 3-6".into());
    }
    let mut rng = Rng::new(seed ^ 0x1CEF_2065);
    // Sample without replacement while the window lasts.
    let mut pool: Vec<usize> = (0..window.len()).collect();
    let mut picked: Vec<&TraceRow> = Vec::with_capacity(want);
    for _ in 0..want {
        if pool.is_empty() {
            pool = (0..window.len()).collect();
        }
        let k = rng.below(pool.len());
        picked.push(window[pool.swap_remove(k)]);
    }
    picked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let tasks_of = |models: &[&str]| -> Vec<(String, String)> {
        models
            .iter()
            .filter_map(|m| catalog.models.get(*m).map(|mt| (m, mt)))
            .flat_map(|(m, mt)| mt.tasks.keys().map(move |t| (m.to_string(), t.clone())))
            .collect()
    };
    let small = tasks_of(&["roberta-base", "vit-base"]);
    let large = tasks_of(&["roberta-large", "vit-large"]);
    let any: Vec<(String, String)> = small.iter().chain(&large).cloned().collect();
    if small.is_empty() || large.is_empty() {
        return Err(
            "the catalog needs roberta-base/vit-base and roberta-large/vit-large tasks".into(),
        );
    }
    let mut out = Vec::with_capacity(want);
    for (k, r) in picked.into_iter().enumerate() {
        let gpus = r.2.min(32);
        let gpu_h = r.3 * f64::from(gpus) / 3600.0;
        let (class, max): (&[(String, String)], u32) = if gpu_h < 1.0 {
            (&small, 8)
        } else if gpu_h < 10.0 {
            (&any, 16)
        } else {
            (&large, 32)
        };
        let (model, task) = class[rng.below(class.len())].clone();
        // Four global batches per model, each half as likely as the last.
        let base = if model.starts_with("vit") { 16 } else { 8 };
        let u = rng.f64();
        let batch = base
            * if u < 8.0 / 15.0 {
                1
            } else if u < 12.0 / 15.0 {
                2
            } else if u < 14.0 / 15.0 {
                4
            } else {
                8
            };
        out.push(WorkloadJob {
            name: format!("{model}@{task}-{k}"),
            submit_s: ((r.1 - t0 - 3.0 * 3600.0) * 10.0).round() / 10.0,
            model,
            task,
            gpus,
            max_gpus: max.max(gpus),
            min_gpus: 0,
            batch,
            sharing: true,
            pipeline: false,
            epochs: None,
            target_metric: None,
            curve_key: None,
            trace_gpu_s: Some(r.3 * f64::from(gpus)),
            gpu_model: None,
            expert_parallel: 0,
            slo: Default::default(),
            queueing: Default::default(),
            max_work_x: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shaped_traces_cycle_daily_and_drift_between_days() {
        let rows = shaped(Shape::Helios, 14, 20_000, 1.0, 3).unwrap();
        assert_eq!(
            rows,
            shaped(Shape::Helios, 14, 20_000, 1.0, 3).unwrap(),
            "seeded"
        );
        assert!(
            (rows.len() as f64 - 20_000.0).abs() < 1500.0,
            "{}",
            rows.len()
        );
        // More arrivals in the afternoon than at night, summed over days.
        let at = |lo: f64, hi: f64| {
            rows.iter()
                .filter(|r| (lo..hi).contains(&((r.1 / 3600.0) % 24.0)))
                .count()
        };
        assert!(
            at(12.0, 16.0) > 2 * at(0.0, 4.0),
            "{} vs {}",
            at(12.0, 16.0),
            at(0.0, 4.0)
        );
        // Days differ in load and length.
        let per_day = |d: usize| {
            rows.iter()
                .filter(|r| (r.1 / 86_400.0) as usize == d)
                .count()
        };
        let counts: Vec<usize> = (0..14).map(per_day).collect();
        assert!(
            counts.iter().max().unwrap() > &(counts.iter().min().unwrap() * 3 / 2),
            "{counts:?}"
        );
        // Compression divides every time.
        let c = shaped(Shape::Helios, 14, 20_000, 7.0, 3).unwrap();
        assert!((c[100].1 - rows[100].1 / 7.0).abs() < 0.1);
        assert!((c[100].3 - (rows[100].3 / 7.0)).abs() < 0.1);
        assert!(shaped(Shape::Philly, 0, 10, 1.0, 1).is_err());
        let csv = helios_csv(&rows[..2]);
        assert!(csv.starts_with("job_id,gpu_num,submit_time,duration,state\n"));
    }

    /// MoE jobs of two GPUs or more train in expert groups that divide
    /// their GPUs and the experts (at most the cap); pinned jobs name one
    /// of the given GPU models; with neither asked for, the draws are the
    /// same as before (a seed's workload does not change).
    #[test]
    fn moe_jobs_get_expert_groups_and_a_share_is_pinned() {
        assert_eq!(expert_groups(8, 8, 4), 4);
        assert_eq!(expert_groups(2, 16, 4), 2);
        assert_eq!(expert_groups(6, 8, 8), 2);
        assert_eq!(expert_groups(1, 8, 4), 0);
        assert_eq!(expert_groups(8, 0, 4), 0);
        assert_eq!(expert_groups(8, 8, 1), 0);
        let cat = Catalog::default_synthetic();
        let lut = fmsched_estimator::analytic::default_lut().unwrap();
        let cfg = GenConfig {
            jobs: 400,
            models: vec!["switch-base-8".into(), "roberta-base".into()],
            gpu_type: "A100".into(),
            ..Default::default()
        };
        let plain = generate(&cfg, &cat, &lut).unwrap();
        // Every model named gets about its share of the jobs.
        let moe: Vec<_> = plain
            .iter()
            .filter(|j| j.model == "switch-base-8")
            .collect();
        assert!((140..260).contains(&moe.len()), "{}", moe.len());
        for j in &plain {
            match (j.model.as_str(), j.gpus) {
                ("switch-base-8", g) if g >= 2 => {
                    assert!(j.expert_parallel >= 2 && j.expert_parallel <= 4, "{j:?}");
                    assert_eq!(g % j.expert_parallel, 0, "{j:?}");
                }
                _ => assert_eq!(j.expert_parallel, 0, "{j:?}"),
            }
            assert_eq!(j.gpu_model, None);
        }
        let pinned = generate(
            &GenConfig {
                pinned_fraction: 0.25,
                pin_gpu_models: vec!["A100".into(), "H100".into()],
                ..cfg.clone()
            },
            &cat,
            &lut,
        )
        .unwrap();
        let n = pinned.iter().filter(|j| j.gpu_model.is_some()).count();
        assert!((60..140).contains(&n), "about a quarter pinned: {n}");
        assert!(
            pinned
                .iter()
                .flat_map(|j| &j.gpu_model)
                .all(|m| m == "A100" || m == "H100")
        );
        assert!(
            generate(
                &GenConfig {
                    pinned_fraction: 1.5,
                    ..cfg
                },
                &cat,
                &lut
            )
            .is_err()
        );
    }

    #[test]
    fn classes_and_determinism() {
        let cat = Catalog::default_synthetic();
        let lut = fmsched_estimator::analytic::default_lut().unwrap();
        let cfg = GenConfig {
            jobs: 2000,
            ..Default::default()
        };
        let a = generate(&cfg, &cat, &lut).unwrap();
        assert_eq!(a, generate(&cfg, &cat, &lut).unwrap(), "seeded");
        let small = a.iter().filter(|j| j.gpus == 1).count() as f64 / 2000.0;
        assert!(small > 0.3 && small < 0.7, "{small}");
        let last = a.last().unwrap().submit_s / 3600.0;
        assert!((last - 8.0).abs() < 1.0, "arrivals span the window: {last}");
        let loaded = generate(
            &GenConfig {
                load: 2.0,
                ..cfg.clone()
            },
            &cat,
            &lut,
        )
        .unwrap();
        assert!(loaded.last().unwrap().submit_s < a.last().unwrap().submit_s * 0.6);
        assert!(
            generate(
                &GenConfig {
                    models: vec!["nope".into()],
                    ..cfg
                },
                &cat,
                &lut
            )
            .is_err()
        );
    }
}
