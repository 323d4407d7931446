//! PromptTuner's evaluation (thesis 004, §4.6): prompt-tuning requests of a
//! few minutes with SLOs, replayed event by event on a GPU cluster under
//! PromptTuner (warm per-model pools fed from a shared cold pool, decided by
//! `core::policy::prompttuner::decide` — the code the live loop runs) and
//! two baselines without warm runtimes (`decide_cold`): INFless-like (GPUs
//! per request, billed while held) and ElasticFlow-like (a provisioned
//! cluster, billed whole). Reports the SLO violation rate and the GPU time
//! billed.
//!
//! Decisions run on the loop's tick: an arrival, a completion or an idle
//! release is seen at the next multiple of `tick_s` (50 ms).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use fmsched_core::policy::prompttuner::{
    ColdBaseline, Request, WarmPool, cold_start_s, decide, decide_cold, release_due,
};

use crate::generate::Rng;

/// A model prompt-tuning requests name, with what a cold start of it costs.
#[derive(Clone, Debug, PartialEq)]
pub struct LptModel {
    pub name: String,
    /// Loading the runtime and the weights on a GPU (`T_cold`), seconds.
    pub cold_start_s: f64,
    /// Median request duration on its asked GPUs (generated traces).
    pub median_s: f64,
}

impl LptModel {
    /// A model of `params_millions` parameters: its cold start is
    /// [`cold_start_s`] (12 s of runtime start-up plus its fp16 weights at
    /// 0.5 GB/s; with the medians below, start-up is 37–44 % of a
    /// request's time, as the thesis measured: Fig. 4.2a, 37–41 %).
    pub fn sized(name: &str, params_millions: f64, median_s: f64) -> Self {
        LptModel {
            name: name.into(),
            cold_start_s: cold_start_s(params_millions * 1e6),
            median_s,
        }
    }
}

/// The thesis' three LLMs (§4.6.1): GPT2-Base, GPT2-Large and Vicuna-7B.
pub fn thesis_models() -> Vec<LptModel> {
    vec![
        LptModel::sized("gpt2-base", 124.0, 20.0),
        LptModel::sized("gpt2-large", 774.0, 25.0),
        LptModel::sized("vicuna-7b", 6738.0, 55.0),
    ]
}

/// Request densities of Table 4.6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    Low,
    Medium,
    High,
}

impl Load {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "low" => Load::Low,
            "medium" => Load::Medium,
            "high" => Load::High,
            other => bail!("--load: {other:?} is not low, medium or high"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Load::Low => "low",
            Load::Medium => "medium",
            Load::High => "high",
        }
    }

    /// Requests per model in 20 minutes (Table 4.6, GPT2-B/GPT2-L/V7B).
    pub fn counts(self) -> [usize; 3] {
        match self {
            Load::Low => [41, 55, 42],
            Load::Medium => [77, 71, 65],
            Load::High => [99, 85, 76],
        }
    }
}

/// One prompt-tuning request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct LptRequest {
    pub id: String,
    pub arrival_s: f64,
    pub model: String,
    /// GPUs the trace gave it.
    pub gpus: u32,
    /// Its duration on those GPUs, seconds (start-up excluded).
    pub duration_s: f64,
}

/// A 20-minute trace at `load` over `models` (one count of Table 4.6 per
/// model, in order). Each model's requests fall into minutes by bursty
/// weights (log-normal, σ = 0.9: the busiest minute carries a few times
/// the mean, as in Fig. 4.2b) and uniformly within a minute (a Poisson
/// process given its count); 1, 2, 4 or 8 GPUs (45/30/20/5 %); durations
/// log-normal around the model's median (σ = 0.5, 15 s – 15 min).
pub fn generate(load: Load, models: &[LptModel], seed: u64) -> Vec<LptRequest> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (m, count) in models.iter().zip(load.counts()) {
        let weights: Vec<f64> = (0..20).map(|_| (0.9 * normal(&mut rng)).exp()).collect();
        let total: f64 = weights.iter().sum();
        for _ in 0..count {
            let mut u = rng.f64() * total;
            let mut minute = 0;
            while minute < 19 && u > weights[minute] {
                u -= weights[minute];
                minute += 1;
            }
            let gpus = match rng.f64() {
                x if x < 0.45 => 1,
                x if x < 0.75 => 2,
                x if x < 0.95 => 4,
                _ => 8,
            };
            out.push(LptRequest {
                id: String::new(),
                arrival_s: 60.0 * (minute as f64 + rng.f64()),
                model: m.name.clone(),
                gpus,
                duration_s: (m.median_s * (0.5 * normal(&mut rng)).exp()).clamp(15.0, 900.0),
            });
        }
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (k, r) in out.iter_mut().enumerate() {
        r.id = format!("lpt-{k}");
    }
    out
}

/// Standard normal draw (Box–Muller).
fn normal(rng: &mut Rng) -> f64 {
    (-2.0 * rng.f64().ln()).sqrt() * (std::f64::consts::TAU * rng.f64()).cos()
}

/// Reads a trace: CSV with the header `arrival_s,model,gpus,duration_s`.
pub fn load_csv(path: &Path) -> anyhow::Result<Vec<LptRequest>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    match lines.next() {
        Some((_, h)) if h.trim() == "arrival_s,model,gpus,duration_s" => {}
        _ => bail!(
            "{}: the first line must be the header arrival_s,model,gpus,duration_s",
            path.display()
        ),
    }
    let mut out = Vec::new();
    for (n, line) in lines {
        let at = || format!("{} line {}", path.display(), n + 1);
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 4 {
            bail!("{}: expected 4 fields, found {}", at(), f.len());
        }
        let arrival_s: f64 = f[0]
            .parse()
            .with_context(|| format!("{}: arrival_s", at()))?;
        let gpus: u32 = f[2].parse().with_context(|| format!("{}: gpus", at()))?;
        let duration_s: f64 = f[3]
            .parse()
            .with_context(|| format!("{}: duration_s", at()))?;
        if !arrival_s.is_finite() || arrival_s < 0.0 {
            bail!("{}: arrival_s must be ≥ 0", at());
        }
        if gpus == 0 {
            bail!("{}: gpus must be ≥ 1", at());
        }
        if !duration_s.is_finite() || duration_s <= 0.0 {
            bail!("{}: duration_s must be > 0", at());
        }
        out.push(LptRequest {
            id: format!("lpt-{}", out.len()),
            arrival_s,
            model: f[1].to_string(),
            gpus,
            duration_s,
        });
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(out)
}

/// Writes a trace in the format `load_csv` reads.
pub fn to_csv(trace: &[LptRequest]) -> String {
    let mut s = String::from("arrival_s,model,gpus,duration_s\n");
    for r in trace {
        s.push_str(&format!(
            "{:.3},{},{},{:.3}\n",
            r.arrival_s, r.model, r.gpus, r.duration_s
        ));
    }
    s
}

/// The systems compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LptSystem {
    PromptTuner,
    Infless,
    ElasticFlow,
}

impl LptSystem {
    pub const ALL: [LptSystem; 3] = [
        LptSystem::PromptTuner,
        LptSystem::Infless,
        LptSystem::ElasticFlow,
    ];

    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "prompttuner" => LptSystem::PromptTuner,
            "infless" => LptSystem::Infless,
            "elasticflow" => LptSystem::ElasticFlow,
            other => bail!("--systems: {other:?} is not prompttuner, infless or elasticflow"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            LptSystem::PromptTuner => "prompttuner",
            LptSystem::Infless => "infless",
            LptSystem::ElasticFlow => "elasticflow",
        }
    }
}

/// Settings of one replay.
#[derive(Clone, Debug, PartialEq)]
pub struct LptConfig {
    /// GPUs in the cluster (the cold pool at the start).
    pub gpus: u32,
    /// SLO emergence `S`: a request's SLO is its duration × S plus its
    /// model's cold start (the allocation overhead, §4.6.1).
    pub slo_emergence: f64,
    /// The loop's period (50 ms).
    pub tick_s: f64,
    /// Idle warm GPUs go back to the cold pool after this long (the
    /// thesis: 60 s); `None`: after the model's cold start, the break-even
    /// of ski rental — idling longer costs more GPU time than loading the
    /// model again would (2-competitive against knowing the next arrival).
    pub idle_release_s: Option<f64>,
    /// Most GPUs one request runs on (one 8-GPU server).
    pub max_gpus: u32,
    /// Data-parallel overhead: each GPU beyond the first adds this share of
    /// the one-GPU step time (gradients exchanged through a cache, §4.5.1;
    /// our model, not a thesis equation).
    pub alpha: f64,
    /// A cold start on `A` GPUs lasts `T_cold · (1 + jitter · u_max)`,
    /// `u_max` the largest of `A` uniform draws: it waits for the slowest
    /// instance (Fig. 4.3b). Planners use the bound `T_cold · (1 + jitter)`.
    pub init_jitter: f64,
    /// Relative Gaussian error of the planners' duration bounds (§4.6.3.2).
    pub estimate_error: f64,
    /// Dollars per GPU-hour billed (AWS p4de.24xlarge, $40.96/h for 8
    /// A100-80GB).
    pub price_per_gpu_hour: f64,
    pub seed: u64,
}

impl Default for LptConfig {
    fn default() -> Self {
        LptConfig {
            gpus: 32,
            slo_emergence: 1.0,
            tick_s: 0.05,
            idle_release_s: Some(fmsched_core::policy::prompttuner::IDLE_RELEASE_S),
            max_gpus: 8,
            alpha: 0.05,
            init_jitter: 0.3,
            estimate_error: 0.0,
            price_per_gpu_hour: 40.96 / 8.0,
            seed: 1,
        }
    }
}

/// What one replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct LptResult {
    pub system: LptSystem,
    pub requests: usize,
    /// Requests finished after their SLO (or never).
    pub violations: usize,
    /// GPU-hours billed: warm pools (PromptTuner), GPUs held
    /// (INFless-like) or the whole cluster until the last request ends
    /// (ElasticFlow-like).
    pub gpu_hours: f64,
    pub cost_usd: f64,
    /// GPU-hours requests ran for (cold starts and idle time excluded):
    /// `used_gpu_hours / gpu_hours` is the billed GPUs' utilisation.
    pub used_gpu_hours: f64,
    /// Requests started on warm GPUs / after a cold start.
    pub warm_starts: usize,
    pub cold_starts: usize,
    /// Mean arrival-to-finish time, seconds.
    pub mean_latency_s: f64,
    /// Wall time of one loop decision, milliseconds: mean and max, and the
    /// largest queue decided over.
    pub decision_ms_mean: f64,
    pub decision_ms_max: f64,
    pub decisions: usize,
    pub max_queue: usize,
}

impl LptResult {
    pub fn violation_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.violations as f64 / self.requests as f64
        }
    }
}

/// One request as the replay tracks it.
struct Live {
    model: usize,
    arrival: f64,
    deadline: f64,
    gpus: u32,
    /// Actual seconds on `A` GPUs (`[A − 1]`).
    time: Vec<f64>,
    /// What the planners believe (`time` with the estimate error).
    bound: Vec<f64>,
    finish: Option<f64>,
}

/// Replays `trace` under `system`. A request naming a model outside
/// `models` is an error naming it.
pub fn simulate(
    system: LptSystem,
    trace: &[LptRequest],
    models: &[LptModel],
    cfg: &LptConfig,
) -> anyhow::Result<LptResult> {
    if cfg.gpus == 0 || cfg.max_gpus == 0 {
        bail!("--gpus and the per-request maximum must be ≥ 1");
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    let non_negative = |x: f64| x.is_finite() && x >= 0.0;
    if !positive(cfg.tick_s) {
        bail!("--tick-ms must be > 0");
    }
    if !positive(cfg.slo_emergence) {
        bail!("--slo-emergence must be > 0");
    }
    if !non_negative(cfg.init_jitter) || !non_negative(cfg.estimate_error) {
        bail!("--init-jitter and --estimate-error must be ≥ 0");
    }
    if cfg.idle_release_s.is_some_and(|w| !non_negative(w)) {
        bail!("--idle-release must be ≥ 0 seconds");
    }
    let mut rng = Rng::new(cfg.seed);
    let mut reqs = Vec::with_capacity(trace.len());
    for r in trace {
        let Some(model) = models.iter().position(|m| m.name == r.model) else {
            bail!(
                "request {}: model {:?} has no cold-start profile (known: {})",
                r.id,
                r.model,
                models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        // Work in one-GPU seconds: the trace's duration on its GPUs.
        let g = f64::from(r.gpus);
        let work = r.duration_s * g / (1.0 + cfg.alpha * (g - 1.0));
        let time: Vec<f64> = (1..=cfg.max_gpus.min(cfg.gpus))
            .map(|a| {
                let a = f64::from(a);
                work * (1.0 + cfg.alpha * (a - 1.0)) / a
            })
            .collect();
        let noise = (1.0 + cfg.estimate_error * normal(&mut rng)).max(0.1);
        reqs.push(Live {
            model,
            arrival: r.arrival_s,
            deadline: r.arrival_s + r.duration_s * cfg.slo_emergence + models[model].cold_start_s,
            gpus: r.gpus.min(cfg.max_gpus).min(cfg.gpus),
            bound: time.iter().map(|t| t * noise).collect(),
            time,
            finish: None,
        });
    }
    let cold_plan: Vec<f64> = models
        .iter()
        .map(|m| m.cold_start_s * (1.0 + cfg.init_jitter))
        .collect();
    let mut sim = Replay {
        system,
        cfg,
        models,
        cold_plan,
        reqs,
        rng,
        pools: vec![PoolState::default(); models.len()],
        cold: cfg.gpus,
        running: Vec::new(),
        billed: 0.0,
        billed_gpus: if system == LptSystem::ElasticFlow {
            cfg.gpus
        } else {
            0
        },
        t: 0.0,
        warm_starts: 0,
        cold_starts: 0,
        decision_ms: Vec::new(),
        max_queue: 0,
        used: 0.0,
    };
    sim.run();
    Ok(sim.result())
}

/// A model's warm pool in the replay: when each idle GPU went idle, and
/// when each busy one frees up.
#[derive(Clone, Debug, Default)]
struct PoolState {
    idle_since: Vec<f64>,
    busy_until: Vec<f64>,
}

struct Replay<'a> {
    system: LptSystem,
    cfg: &'a LptConfig,
    models: &'a [LptModel],
    cold_plan: Vec<f64>,
    reqs: Vec<Live>,
    rng: Rng,
    /// PromptTuner's warm pools.
    pools: Vec<PoolState>,
    /// PromptTuner's cold pool; the baselines' free GPUs.
    cold: u32,
    /// The baselines' running requests: (finish, GPUs).
    running: Vec<(f64, u32)>,
    /// GPU-seconds billed so far, and GPUs billed now.
    billed: f64,
    billed_gpus: u32,
    t: f64,
    warm_starts: usize,
    cold_starts: usize,
    decision_ms: Vec<f64>,
    max_queue: usize,
    /// GPU-seconds requests ran for.
    used: f64,
}

impl Replay<'_> {
    fn run(&mut self) {
        let mut next_arrival = 0usize;
        let mut pending: Vec<usize> = Vec::new();
        loop {
            let mut next = f64::INFINITY;
            if let Some(r) = self.reqs.get(next_arrival) {
                next = next.min(r.arrival);
            }
            for (m, p) in self.pools.iter().enumerate() {
                for &u in &p.busy_until {
                    next = next.min(u);
                }
                for &s in &p.idle_since {
                    next = next.min(s + self.window(m));
                }
            }
            for &(u, _) in &self.running {
                next = next.min(u);
            }
            // A baseline's waiting request turns late (and may start
            // best-effort on fewer GPUs) once no share can meet its SLO.
            if self.system != LptSystem::PromptTuner {
                for &i in &pending {
                    let r = &self.reqs[i];
                    let fastest = r.bound.iter().copied().fold(f64::INFINITY, f64::min);
                    let turns = r.deadline - self.cold_plan[r.model] - fastest;
                    if turns > self.t {
                        next = next.min(turns);
                    }
                }
            }
            if !next.is_finite() {
                break;
            }
            // Seen on the loop's next tick.
            let at = ((next / self.cfg.tick_s).ceil() * self.cfg.tick_s).max(next);
            self.advance(at);
            while self.reqs.get(next_arrival).is_some_and(|r| r.arrival <= at) {
                pending.push(next_arrival);
                next_arrival += 1;
            }
            self.free_up(at);
            if !pending.is_empty() {
                self.max_queue = self.max_queue.max(pending.len());
                pending = self.decide(at, &pending);
            }
        }
        // The last request has ended: nothing is billed past it.
        self.billed_gpus = 0;
    }

    /// How long model `m`'s idle warm GPUs stay warm.
    fn window(&self, m: usize) -> f64 {
        self.cfg
            .idle_release_s
            .unwrap_or(self.models[m].cold_start_s)
    }

    /// Bills the time up to `t`.
    fn advance(&mut self, t: f64) {
        if t > self.t {
            self.billed += f64::from(self.billed_gpus) * (t - self.t);
            self.t = t;
        }
    }

    /// Completions and idle releases up to `t`.
    fn free_up(&mut self, t: f64) {
        for m in 0..self.pools.len() {
            let window = self.window(m);
            let p = &mut self.pools[m];
            p.busy_until.retain(|&u| {
                if u <= t {
                    p.idle_since.push(u);
                    false
                } else {
                    true
                }
            });
            let due = release_due(&p.idle_since, t, window);
            if due > 0 {
                // The longest idle go back first.
                p.idle_since.sort_by(f64::total_cmp);
                p.idle_since.drain(..due);
                self.cold += due as u32;
                self.billed_gpus -= due as u32;
            }
        }
        let mut freed = 0;
        self.running.retain(|&(u, g)| {
            if u <= t {
                freed += g;
                false
            } else {
                true
            }
        });
        self.cold += freed;
        if self.system == LptSystem::Infless {
            self.billed_gpus -= freed;
        }
    }

    /// Seconds a cold start on `gpus` GPUs of `model` takes (the slowest
    /// instance).
    fn cold_start(&mut self, model: usize, gpus: u32) -> f64 {
        let u = (0..gpus).map(|_| self.rng.f64()).fold(0.0, f64::max);
        self.models[model].cold_start_s * (1.0 + self.cfg.init_jitter * u)
    }

    /// One decision at `now` over `pending` (arrival order); returns what
    /// still waits.
    fn decide(&mut self, now: f64, pending: &[usize]) -> Vec<usize> {
        let view: Vec<Request> = pending
            .iter()
            .map(|&i| {
                let r = &self.reqs[i];
                Request {
                    id: i.to_string(),
                    model: r.model,
                    slo_s: r.deadline - now,
                    bound_s: r.bound.clone(),
                    gpus: r.gpus,
                }
            })
            .collect();
        let mut waits = Vec::new();
        if self.system == LptSystem::PromptTuner {
            let pools: Vec<WarmPool> = self
                .pools
                .iter()
                .map(|p| WarmPool {
                    idle: p.idle_since.len() as u32,
                    busy_until: p.busy_until.clone(),
                })
                .collect();
            let clock = Instant::now();
            let d = decide(&view, &pools, self.cold, &self.cold_plan, now);
            self.decision_ms.push(clock.elapsed().as_secs_f64() * 1e3);
            for (m, &n) in d.reclaim.iter().enumerate() {
                // The longest idle go back to the cold pool.
                let p = &mut self.pools[m];
                p.idle_since.sort_by(f64::total_cmp);
                p.idle_since.drain(..n as usize);
                self.cold += n;
                self.billed_gpus -= n;
            }
            for (k, &i) in pending.iter().enumerate() {
                let m = self.reqs[i].model;
                let (warm, cold) = (d.warm[k], d.cold[k]);
                let gpus = warm + cold;
                if gpus == 0 {
                    waits.push(i);
                    continue;
                }
                // Cold GPUs first load the model; a request with any
                // starts once the slowest has.
                let load = if cold > 0 {
                    self.cold_starts += 1;
                    self.cold_start(m, cold)
                } else {
                    self.warm_starts += 1;
                    0.0
                };
                let run = self.reqs[i].time[gpus as usize - 1];
                self.used += run * f64::from(gpus);
                let end = now + load + run;
                // The most recently idle warm GPUs: the longest idle are
                // the first to go back to the cold pool.
                let p = &mut self.pools[m];
                p.idle_since.sort_by(f64::total_cmp);
                p.idle_since.truncate(p.idle_since.len() - warm as usize);
                p.busy_until.extend(std::iter::repeat_n(end, gpus as usize));
                self.cold -= cold;
                self.billed_gpus += cold;
                self.reqs[i].finish = Some(end);
            }
        } else {
            let baseline = if self.system == LptSystem::Infless {
                ColdBaseline::Infless
            } else {
                ColdBaseline::ElasticFlow
            };
            let clock = Instant::now();
            let d = decide_cold(baseline, &view, self.cold, &self.cold_plan);
            self.decision_ms.push(clock.elapsed().as_secs_f64() * 1e3);
            for (k, &i) in pending.iter().enumerate() {
                let g = d.gpus[k];
                if g == 0 {
                    waits.push(i);
                    continue;
                }
                let m = self.reqs[i].model;
                let run = self.reqs[i].time[g as usize - 1];
                self.used += run * f64::from(g);
                let end = now + self.cold_start(m, g) + run;
                self.cold -= g;
                if self.system == LptSystem::Infless {
                    self.billed_gpus += g;
                }
                self.running.push((end, g));
                self.reqs[i].finish = Some(end);
                self.cold_starts += 1;
            }
        }
        waits
    }

    fn result(&self) -> LptResult {
        let violations = self
            .reqs
            .iter()
            .filter(|r| r.finish.is_none_or(|f| f > r.deadline + 1e-9))
            .count();
        let done: Vec<f64> = self
            .reqs
            .iter()
            .filter_map(|r| r.finish.map(|f| f - r.arrival))
            .collect();
        let gpu_hours = self.billed / 3600.0;
        let n = self.decision_ms.len().max(1) as f64;
        LptResult {
            system: self.system,
            requests: self.reqs.len(),
            violations,
            gpu_hours,
            cost_usd: gpu_hours * self.cfg.price_per_gpu_hour,
            used_gpu_hours: self.used / 3600.0,
            warm_starts: self.warm_starts,
            cold_starts: self.cold_starts,
            mean_latency_s: done.iter().sum::<f64>() / done.len().max(1) as f64,
            decision_ms_mean: self.decision_ms.iter().sum::<f64>() / n,
            decision_ms_max: self.decision_ms.iter().copied().fold(0.0, f64::max),
            decisions: self.decision_ms.len(),
            max_queue: self.max_queue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(model: &str, arrival_s: f64, gpus: u32, duration_s: f64) -> LptRequest {
        LptRequest {
            id: format!("r{arrival_s}"),
            arrival_s,
            model: model.into(),
            gpus,
            duration_s,
        }
    }

    /// No instance spread: cold starts take exactly the model's `T_cold`.
    fn exact() -> LptConfig {
        LptConfig {
            init_jitter: 0.0,
            ..LptConfig::default()
        }
    }

    #[test]
    fn prompttuner_a_second_request_starts_warm_and_idle_gpus_go_back_after_60_s() {
        let models = thesis_models();
        let cold = models[0].cold_start_s;
        // One 30 s request on 1 GPU: it loads (T_cold), runs 30 s, and the
        // GPU stays warm (billed) 60 s before going back to the cold pool
        // (seen on the loop's next 50 ms tick).
        let trace = [one("gpt2-base", 0.0, 1, 30.0)];
        let r = simulate(LptSystem::PromptTuner, &trace, &models, &exact()).expect("runs");
        assert_eq!((r.cold_starts, r.warm_starts, r.violations), (1, 0, 0));
        assert!(
            (r.gpu_hours * 3600.0 - (cold + 30.0 + 60.0)).abs() <= 0.05,
            "{r:?}"
        );
        // INFless-like bills the load and the run; ElasticFlow-like the
        // whole cluster while anything runs, and with nothing waiting it
        // gives the lone request a whole server (30 s × (1 + 7α) / 8).
        let r = simulate(LptSystem::Infless, &trace, &models, &exact()).expect("runs");
        assert!(
            (r.gpu_hours * 3600.0 - (cold + 30.0)).abs() <= 0.05,
            "{r:?}"
        );
        let r = simulate(LptSystem::ElasticFlow, &trace, &models, &exact()).expect("runs");
        assert!(
            (r.gpu_hours * 3600.0 - 32.0 * (cold + 30.0 * 1.35 / 8.0)).abs() <= 32.0 * 0.05,
            "{r:?}"
        );

        // A second request 20 s after the first ended finds the GPU warm:
        // no load, and it finishes 30 s after it arrives (on the 50 ms tick).
        let second = cold + 50.0;
        let trace = [
            one("gpt2-base", 0.0, 1, 30.0),
            one("gpt2-base", second, 1, 30.0),
        ];
        let r = simulate(LptSystem::PromptTuner, &trace, &models, &exact()).expect("runs");
        assert_eq!((r.cold_starts, r.warm_starts), (1, 1));
        let r = simulate(LptSystem::Infless, &trace, &models, &exact()).expect("runs");
        assert_eq!((r.cold_starts, r.warm_starts), (2, 0));
        // Past the window it loads again; with the break-even window (its
        // cold start) already 20 s after.
        let late = [
            one("gpt2-base", 0.0, 1, 30.0),
            one("gpt2-base", cold + 100.0, 1, 30.0),
        ];
        let r = simulate(LptSystem::PromptTuner, &late, &models, &exact()).expect("runs");
        assert_eq!((r.cold_starts, r.warm_starts), (2, 0));
        let break_even = LptConfig {
            idle_release_s: None,
            ..exact()
        };
        let r = simulate(LptSystem::PromptTuner, &trace, &models, &break_even).expect("runs");
        assert_eq!((r.cold_starts, r.warm_starts), (2, 0));
    }

    #[test]
    fn prompttuner_meets_more_slos_than_both_baselines_on_every_generated_load() {
        let models = thesis_models();
        for load in [Load::Low, Load::Medium, Load::High] {
            let trace = generate(load, &models, 3);
            assert_eq!(trace.len(), load.counts().iter().sum::<usize>());
            let v = |s| {
                simulate(s, &trace, &models, &LptConfig::default())
                    .expect("runs")
                    .violations
            };
            let pt = v(LptSystem::PromptTuner);
            let (inf, ef) = (v(LptSystem::Infless), v(LptSystem::ElasticFlow));
            assert!(pt < inf && pt < ef, "{load:?}: {pt} vs {inf} and {ef}");
        }
    }

    #[test]
    fn prompttuner_trace_csv_round_trips_and_names_bad_fields() {
        let trace = generate(Load::Low, &thesis_models(), 5);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.csv");
        std::fs::write(&path, to_csv(&trace)).expect("write");
        let back = load_csv(&path).expect("reads");
        assert_eq!(back.len(), trace.len());
        assert!(back.iter().zip(&trace).all(|(a, b)| a.model == b.model
            && a.gpus == b.gpus
            && (a.arrival_s - b.arrival_s).abs() < 1e-3));
        std::fs::write(&path, "arrival_s,model,gpus,duration_s\n5,gpt2-base,2,-1\n")
            .expect("write");
        let err = load_csv(&path).expect_err("refused").to_string();
        assert!(err.contains("line 2: duration_s must be > 0"), "{err}");
        std::fs::write(&path, "at,model\n").expect("write");
        let err = load_csv(&path).expect_err("refused").to_string();
        assert!(err.contains("header"), "{err}");
    }
}
