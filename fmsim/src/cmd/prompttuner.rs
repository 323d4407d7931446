//! `fmsim prompttuner`: prompt-tuning request traces under PromptTuner's
//! warm pools and the INFless- and ElasticFlow-like baselines.

use std::path::Path;

use crate::cmd::args::PromptTunerArgs;
use anyhow::Context;

use crate::cmd::setup::times_lower;

pub(crate) struct PromptTunerEval<'a> {
    pub(crate) loads: &'a str,
    pub(crate) emergences: &'a str,
    pub(crate) systems: &'a str,
    pub(crate) trace: Option<&'a Path>,
    pub(crate) write_traces: Option<&'a Path>,
    pub(crate) cold_start: &'a [String],
    pub(crate) cfg: fmsched_sim::requests::LptConfig,
}

/// `fmsim prompttuner`: every system on every (load, S), one table, then
/// how many times lower PromptTuner's violations and cost are.
pub(crate) fn prompttuner_eval(e: PromptTunerEval) -> anyhow::Result<()> {
    use fmsched_sim::requests::{self, Load, LptModel, LptSystem};
    let systems = e
        .systems
        .split(',')
        .map(|s| LptSystem::parse(s.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let emergences = e
        .emergences
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .with_context(|| format!("--slo-emergence: {s:?} is not a number > 0"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut models = requests::thesis_models();
    for spec in e.cold_start {
        let (name, secs) = spec
            .split_once('=')
            .with_context(|| format!("--cold-start {spec:?}: expected NAME=SECONDS"))?;
        let secs: f64 = secs
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite() && *x >= 0.0)
            .with_context(|| format!("--cold-start {spec:?}: SECONDS must be a number ≥ 0"))?;
        match models.iter_mut().find(|m| m.name == name) {
            Some(m) => m.cold_start_s = secs,
            None => models.push(LptModel {
                name: name.to_string(),
                cold_start_s: secs,
                median_s: 60.0,
            }),
        }
    }
    let traces: Vec<(String, Vec<requests::LptRequest>)> = match e.trace {
        Some(path) => vec![(path.display().to_string(), requests::load_csv(path)?)],
        None => e
            .loads
            .split(',')
            .map(|l| {
                let load = Load::parse(l.trim())?;
                Ok((
                    load.name().to_string(),
                    requests::generate(load, &models, e.cfg.seed),
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
    };
    if let Some(dir) = e.write_traces {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, trace) in &traces {
            let path = dir.join(format!("{name}.csv"));
            std::fs::write(&path, requests::to_csv(trace))
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    println!(
        "{:<8} {:>4} {:<12} {:>8} {:>9} {:>8} {:>6} {:>8} {:>6} {:>6} {:>9} {:>13}",
        "load",
        "S",
        "system",
        "requests",
        "SLO viol",
        "GPU-h",
        "used",
        "cost $",
        "warm",
        "cold",
        "latency s",
        "decide ms",
    );
    for (name, trace) in &traces {
        for &s in &emergences {
            let cfg = fmsched_sim::requests::LptConfig {
                slo_emergence: s,
                ..e.cfg.clone()
            };
            let mut rows = Vec::new();
            for &system in &systems {
                let r = requests::simulate(system, trace, &models, &cfg)?;
                println!(
                    "{:<8} {:>4} {:<12} {:>8} {:>8.1}% {:>8.2} {:>5.0}% {:>8.2} {:>6} {:>6} {:>9.1} {:>6.3}/{:<6.3}",
                    name,
                    s,
                    system.name(),
                    r.requests,
                    100.0 * r.violation_rate(),
                    r.gpu_hours,
                    100.0 * r.used_gpu_hours / r.gpu_hours,
                    r.cost_usd,
                    r.warm_starts,
                    r.cold_starts,
                    r.mean_latency_s,
                    r.decision_ms_mean,
                    r.decision_ms_max,
                );
                rows.push(r);
            }
            let Some(pt) = rows.iter().find(|r| r.system == LptSystem::PromptTuner) else {
                continue;
            };
            for other in rows.iter().filter(|r| r.system != LptSystem::PromptTuner) {
                println!(
                    "{:<8} {:>4} prompttuner vs {}: violations {}, cost {:.2}x lower",
                    name,
                    s,
                    other.system.name(),
                    times_lower(other.violation_rate(), pt.violation_rate()),
                    other.cost_usd / pt.cost_usd
                );
            }
        }
    }
    Ok(())
}

/// Runs `fmsim prompttuner`.
pub(crate) fn prompttuner_cmd(args: PromptTunerArgs) -> anyhow::Result<()> {
    let PromptTunerArgs {
        load,
        slo_emergence,
        systems,
        gpus,
        trace,
        write_traces,
        cold_start,
        tick_ms,
        idle_release,
        init_jitter,
        estimate_error,
        seed,
    } = args;
    let idle_release_s = match idle_release.as_str() {
        "break-even" => None,
        s => Some(
            s.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .with_context(|| {
                    format!("--idle-release: {s:?} is neither seconds ≥ 0 nor break-even")
                })?,
        ),
    };
    let cfg = fmsched_sim::requests::LptConfig {
        gpus,
        tick_s: tick_ms / 1000.0,
        idle_release_s,
        init_jitter,
        estimate_error,
        seed,
        ..Default::default()
    };
    prompttuner_eval(PromptTunerEval {
        loads: &load,
        emergences: &slo_emergence,
        systems: &systems,
        trace: trace.as_deref(),
        write_traces: write_traces.as_deref(),
        cold_start: &cold_start,
        cfg,
    })
}
