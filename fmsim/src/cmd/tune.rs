//! `fmsim tune`: AutoSched's re-tuning replayed offline.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use fmsched_core::policy::with_knobs;
use fmsched_sim::engine::SimResult;
use fmsched_sim::report;

use crate::cmd::args::SimArgs;
use crate::cmd::setup::{parse_knobs, sim_setup};

pub(crate) struct TuneArgs {
    pub(crate) policy: String,
    pub(crate) every: f64,
    pub(crate) samples: usize,
    pub(crate) fixed_samples: usize,
    pub(crate) threshold: f64,
    pub(crate) aggregate: bool,
    pub(crate) modes: String,
    pub(crate) threads: Option<usize>,
    pub(crate) seed: u64,
    pub(crate) decisions: Option<PathBuf>,
}

/// `fmsim tune`: the four ways of choosing knobs, side by side.
pub(crate) fn tune(a: &SimArgs, t: &TuneArgs) -> anyhow::Result<()> {
    use fmsched_sim::tune::{self, Forecast, Knobs, Objective, SearchConfig, Tuner};
    let modes = checked_modes(t)?;
    let start = parse_knobs(&a.knobs)?;
    with_knobs(&t.policy, &start).map_err(anyhow::Error::msg)?;
    let (cfg, lut, catalog, jobs) = sim_setup(a)?;
    // Shared with each tuner (which keeps them across its tunings).
    let (lut, catalog) = (Arc::new(lut), Arc::new(catalog));
    // The tuned knobs a row starts from: `--knob`s, else the policy's own.
    let with_defaults = |k: &Knobs| {
        let mut k = k.clone();
        for knob in tune::knob_space(&t.policy).unwrap_or_default() {
            if let Some(v) = tune::default_knob(&t.policy, knob.name) {
                k.entry(knob.name.to_string()).or_insert(v);
            }
        }
        k
    };
    let threads = t
        .threads
        .unwrap_or_else(fmsched_sim::parallel::all_cores)
        .max(1);
    let objective = Objective::for_policy(&t.policy);
    eprintln!(
        "{} jobs, {} GPUs; tuning {} ({}) every {:.0} s",
        jobs.len(),
        cfg.total_gpus(),
        t.policy,
        match objective {
            Objective::AvgJct => "average JCT",
            Objective::FairShare => "jobs with rho <= 1",
        },
        t.every
    );
    // (mode, run, (tunings, changes, wall seconds of each), knobs at the end)
    let mut rows: Vec<Row> = Vec::new();
    let mut log = String::from(
        "mode,at_s,trace_jobs,aggregated_jobs,carried_over,sampled,rejected,simulations,current_score,best_score,gain,adopted,knobs,realised_gain,wall_s\n",
    );
    let mut failed: Vec<String> = Vec::new();
    for mode in &modes {
        let started = Instant::now();
        let (knobs, forecast) = match *mode {
            "default" => (with_defaults(&start), None),
            "fixed" => {
                let (k, _) = tune::best_fixed(
                    &cfg,
                    &lut,
                    &catalog,
                    &jobs,
                    &t.policy,
                    t.fixed_samples,
                    threads,
                    t.seed,
                )
                .map_err(anyhow::Error::msg)?;
                eprintln!(
                    "fixed: best of {} configurations on the whole workload: {} ({:.1} s)",
                    t.fixed_samples + 1,
                    fmt_knobs(&k),
                    started.elapsed().as_secs_f64()
                );
                (k, None)
            }
            "selftune" => (with_defaults(&start), Some(Forecast::PastHour)),
            _ => (with_defaults(&start), Some(Forecast::AutoSched)),
        };
        let result = match forecast {
            None => tune::replay(&cfg, &lut, &catalog, &jobs, &t.policy, &knobs, None),
            Some(f) => {
                let mut tuner = Tuner::new(
                    &t.policy,
                    knobs.clone(),
                    cfg.clone(),
                    lut.clone(),
                    catalog.clone(),
                    f,
                    SearchConfig {
                        samples: t.samples,
                        threshold: t.threshold,
                        aggregate: t.aggregate,
                        threads,
                        seed: t.seed,
                        ..Default::default()
                    },
                )
                .map_err(anyhow::Error::msg)?;
                let r = tune::replay(
                    &cfg,
                    &lut,
                    &catalog,
                    &jobs,
                    &t.policy,
                    &knobs,
                    Some((&mut tuner, t.every)),
                );
                log_decisions(&mut log, mode, &tuner.decisions);
                let adopted = tuner.decisions.iter().filter(|d| d.adopted).count();
                let walls: Vec<f64> = tuner.decisions.iter().map(|d| d.wall_s).collect();
                let r = match r {
                    Ok(r) => r,
                    Err(e) => {
                        // Said, and the other rows still run: a tuner that
                        // adopts a starving configuration is a finding.
                        failed.push(format!("{mode}: {e}"));
                        continue;
                    }
                };
                rows.push((
                    mode.to_string(),
                    r,
                    Some((tuner.decisions.len(), adopted, walls)),
                    fmt_knobs(tuner.knobs()),
                ));
                if *mode == "autosched"
                    && let Some(row) = rows.last()
                {
                    report_predictor(&tuner, &row.1, &jobs);
                }
                continue;
            }
        };
        match result {
            Ok(r) => rows.push((mode.to_string(), r, None, fmt_knobs(&knobs))),
            Err(e) => failed.push(format!("{mode}: {e}")),
        }
    }
    print_rows(&rows, &failed);
    if let Some(p) = &t.decisions {
        std::fs::write(p, log).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote the tuning decisions to {}", p.display());
    }
    if rows.is_empty() {
        bail!("every mode failed");
    }
    Ok(())
}

/// (mode, run, (tunings, changes, wall seconds of each), knobs at the end)
type Row = (String, SimResult, Option<(usize, usize, Vec<f64>)>, String);

/// The flags' checks; the modes asked for.
fn checked_modes(t: &TuneArgs) -> anyhow::Result<Vec<&str>> {
    use fmsched_sim::tune;
    if tune::knob_space(&t.policy).is_none() {
        bail!(
            "--policy {:?}: AutoSched tunes tiresias or themis",
            t.policy
        );
    }
    if !(t.every.is_finite() && t.every >= 300.0) {
        bail!("--every must be at least 300 seconds");
    }
    if !(t.threshold.is_finite() && t.threshold >= 1.0) {
        bail!("--threshold must be at least 1");
    }
    if t.samples == 0 {
        bail!("--samples must be at least 1");
    }
    let modes: Vec<&str> = t.modes.split(',').map(str::trim).collect();
    if let Some(m) = modes
        .iter()
        .find(|m| !["default", "fixed", "selftune", "autosched"].contains(m))
    {
        bail!("--modes: unknown mode {m:?}; expected default, fixed, selftune, autosched");
    }
    Ok(modes)
}

fn fmt_knobs(k: &fmsched_sim::tune::Knobs) -> String {
    k.iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One CSV line per tuning decision (`--decisions`).
fn log_decisions(log: &mut String, mode: &str, decisions: &[fmsched_sim::tune::TuneDecision]) {
    for d in decisions {
        *log += &format!(
            "{mode},{:.0},{},{},{},{},{},{},{:.6},{:.6},{:.4},{},\"{}\",{},{:.3}\n",
            d.at_s,
            d.trace_jobs,
            d.aggregated_jobs,
            d.carried_over,
            d.sampled,
            d.rejected,
            d.simulations,
            d.current_score,
            d.best_score,
            d.gain,
            d.adopted,
            fmt_knobs(&d.knobs),
            d.realised_gain
                .map(|g| format!("{g:.4}"))
                .unwrap_or_default(),
            d.wall_s
        );
    }
}

/// How often the local predictor put a job in the right duration bucket at
/// its arrival, over the newest fifth of the jobs the run finished.
fn report_predictor(
    tuner: &fmsched_sim::tune::Tuner,
    run: &SimResult,
    jobs: &[fmsched_sim::workload::WorkloadJob],
) {
    let finished: Vec<fmsched_sim::tune::Finished> = run
        .jobs
        .iter()
        .filter_map(|j| {
            let start = j.first_start_s?;
            Some(fmsched_sim::tune::Finished {
                finish_s: j.finish_s,
                gpus: jobs.iter().find(|w| w.name == j.name).map_or(1, |w| w.gpus),
                duration_s: j.finish_s - start,
            })
        })
        .collect();
    if let Some(acc) = tuner.predictor.accuracy(&finished, 0.2) {
        eprintln!(
            "local predictor: duration bucket right at arrival for {:.0} % of the newest fifth of jobs",
            acc * 100.0
        );
    }
}

/// The table of the modes' runs, and the modes that failed.
fn print_rows(rows: &[Row], failed: &[String]) {
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>11} {:>11}  knobs (at the end)",
        "mode",
        "avg JCT h",
        "p99 JCT h",
        "rho<=1 %",
        "util %",
        "tunings",
        "changes",
        "tune s mean",
        "tune s max"
    );
    for (mode, r, tuned, knobs) in rows {
        let s = report::summarize(r);
        let fair = r.jobs.iter().filter(|j| j.fair_rho <= 1.0 + 1e-9).count() as f64
            / r.jobs.len().max(1) as f64;
        let (n, changed, mean, max) = match tuned {
            Some((n, c, w)) if !w.is_empty() => (
                n.to_string(),
                c.to_string(),
                format!("{:.2}", w.iter().sum::<f64>() / w.len() as f64),
                format!("{:.2}", w.iter().copied().fold(0.0, f64::max)),
            ),
            _ => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "{mode:<10} {:>9.3} {:>9.2} {:>9.1} {:>8.1} {n:>8} {changed:>7} {mean:>11} {max:>11}  {knobs}",
            s.avg_jct_h,
            s.p99_jct_h,
            fair * 100.0,
            s.utilisation * 100.0
        );
    }
    for f in failed {
        println!("failed     {f}");
    }
}
