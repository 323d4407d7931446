//! `fmsim sweep`: Ymir against the best baseline over estimate noise,
//! transfer-gain noise and Ymir's knobs.

use std::collections::BTreeMap;

use anyhow::bail;
use fmsched_core::policy::with_knobs;
use fmsched_sim::engine::{SimConfig, Simulation};
use fmsched_sim::report;

use crate::cmd::args::{EstimateSource, SimArgs};
use crate::cmd::setup::{check_learnable, numbers, parse_knobs, sim_setup};

/// A point of the sweep: estimates for everyone, or a Ymir knob.
struct Point {
    label: String,
    cfg: SimConfig,
    ymir_knobs: BTreeMap<String, f64>,
    baselines: bool,
}

/// `fmsim sweep`: one row per point, Ymir against the best baseline there.
pub(crate) fn sweep(
    a: &SimArgs,
    baselines: &str,
    (noise, gain_noise): (&str, &str),
    ymir_knobs: [(&str, &str); 3],
) -> anyhow::Result<()> {
    if a.estimate_noise > 0.0 || a.gain_noise > 0.0 || a.estimates != EstimateSource::Exact {
        bail!(
            "sweep sets the estimates itself: leave out --estimate-noise, --gain-noise and --estimates"
        );
    }
    let noise = numbers("--noise", noise)?;
    if let Some(e) = noise.iter().find(|e| !(0.0..1.0).contains(*e)) {
        bail!("--noise: {e} is outside [0, 1)");
    }
    let gain_noise = numbers("--gain-noise-levels", gain_noise)?;
    if let Some(e) = gain_noise.iter().find(|e| !(0.0..1.0).contains(*e)) {
        bail!("--gain-noise-levels: {e} is outside [0, 1)");
    }
    let baselines: Vec<String> = baselines
        .split(',')
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect();
    if baselines.is_empty() {
        bail!("--baselines: name at least one");
    }
    let knobs = parse_knobs(&a.knobs)?;
    for b in &baselines {
        with_knobs(b, &knobs).map_err(|e| anyhow::anyhow!("--baselines: {e}"))?;
    }
    let (cfg, lut, catalog, jobs) = sim_setup(a)?;
    let learnable = check_learnable(&catalog, &jobs);
    let mut points: Vec<Point> = noise
        .iter()
        .map(|&e| Point {
            label: format!("noise={e}"),
            cfg: SimConfig {
                estimate_noise: e,
                ..cfg.clone()
            },
            ymir_knobs: knobs.clone(),
            baselines: true,
        })
        .collect();
    match &learnable {
        Ok(()) => points.push(Point {
            label: "learned".into(),
            cfg: SimConfig {
                learned_estimates: true,
                ..cfg.clone()
            },
            ymir_knobs: knobs.clone(),
            baselines: true,
        }),
        Err(e) => eprintln!("no learned-estimates row: {e}"),
    }
    // Gain noise touches merges only: Ymir's rows, against the baselines
    // of exact estimates.
    points.extend(gain_noise.iter().filter(|&&e| e > 0.0).map(|&e| Point {
        label: format!("gain_noise={e}"),
        cfg: SimConfig {
            gain_noise: e,
            ..cfg.clone()
        },
        ymir_knobs: knobs.clone(),
        baselines: false,
    }));
    for (name, raw) in ymir_knobs {
        for v in numbers(name, raw)? {
            let mut k = knobs.clone();
            k.insert(name.to_string(), v);
            with_knobs("ymir", &k).map_err(|e| anyhow::anyhow!("--{name}: {e}"))?;
            points.push(Point {
                label: format!("{name}={v}"),
                cfg: cfg.clone(),
                ymir_knobs: k,
                baselines: false,
            });
        }
    }
    // Every simulation to run: (point, policy); the knob points share the
    // exact-estimate baselines.
    let mut runs: Vec<(usize, String)> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        runs.push((i, "ymir".into()));
        if p.baselines {
            runs.extend(baselines.iter().map(|b| (i, b.clone())));
        }
    }
    // A run that fails (a job left unfinished at the horizon) is a row
    // that says so, not the end of the sweep.
    let outcomes = fmsched_sim::parallel::parallel_map(
        &runs,
        fmsched_sim::parallel::all_cores(),
        |(i, name)| {
            let p = &points[*i];
            let knobs = if name == "ymir" {
                &p.ymir_knobs
            } else {
                &knobs
            };
            let out: Outcome = with_knobs(name, knobs)
                .map_err(anyhow::Error::msg)
                .and_then(|policy| {
                    let sim = Simulation::new(p.cfg.clone(), &lut, &catalog, &jobs)?;
                    Ok(sim.run(policy.as_ref(), &catalog, |_, _| {})?)
                })
                .map(|r| report::summarize(&r))
                .map_err(|e| format!("{e:#}"));
            eprintln!(
                "{} {name}: {}",
                p.label,
                if out.is_ok() { "done" } else { "failed" }
            );
            out
        },
    );
    let results: BTreeMap<(usize, String), Outcome> = runs.into_iter().zip(outcomes).collect();
    print_sweep(&points, &noise, &baselines, &results);
    Ok(())
}

/// A run's summary, or why it failed (a job left unfinished at the
/// horizon): a row that says so, not the end of the sweep.
type Outcome = Result<report::Summary, String>;

/// One row per point, Ymir against the best baseline there, and the
/// summary line.
fn print_sweep(
    points: &[Point],
    noise: &[f64],
    baselines: &[String],
    results: &BTreeMap<(usize, String), Outcome>,
) {
    println!(
        "{:<22} {:>10} {:>10} {:<14} {:>10} {:>10} {:>9} {:>9}",
        "point",
        "ymir_avg_h",
        "ymir_p99_h",
        "best_baseline",
        "base_avg_h",
        "base_p99_h",
        "avg_ratio",
        "p99_ratio"
    );
    let (mut ahead_avg, mut ahead_p99, mut worst_avg, mut worst_p99) = (0, 0, 0.0f64, 0.0f64);
    let mut failed = 0;
    for (i, p) in points.iter().enumerate() {
        let y = match &results[&(i, "ymir".to_string())] {
            Ok(y) => y,
            Err(e) => {
                failed += 1;
                println!("{:<22} ymir failed: {e}", p.label);
                continue;
            }
        };
        // Knob points compare with the baselines of exact estimates.
        let at = if p.baselines {
            i
        } else {
            noise.iter().position(|&e| e == 0.0).unwrap_or(usize::MAX)
        };
        let best = baselines
            .iter()
            .filter_map(|b| results.get(&(at, b.clone())).and_then(|r| r.as_ref().ok()))
            .min_by(|x, y| x.avg_jct_h.total_cmp(&y.avg_jct_h));
        match best {
            Some(b) => {
                let (ra, rp) = (y.avg_jct_h / b.avg_jct_h, y.p99_jct_h / b.p99_jct_h);
                ahead_avg += usize::from(ra < 1.0);
                ahead_p99 += usize::from(rp < 1.0);
                worst_avg = worst_avg.max(ra);
                worst_p99 = worst_p99.max(rp);
                println!(
                    "{:<22} {:>10.3} {:>10.3} {:<14} {:>10.3} {:>10.3} {:>9.3} {:>9.3}",
                    p.label, y.avg_jct_h, y.p99_jct_h, b.policy, b.avg_jct_h, b.p99_jct_h, ra, rp
                );
            }
            None => println!(
                "{:<22} {:>10.3} {:>10.3} (no baseline finished at this point's estimates)",
                p.label, y.avg_jct_h, y.p99_jct_h
            ),
        }
    }
    if failed > 0 {
        println!("{failed} point(s) where Ymir did not finish every job (see above)");
    }
    println!(
        "summary: Ymir ahead of the best baseline on avg JCT at {ahead_avg}/{n} points and on p99 at {ahead_p99}/{n}; \
         worst ratios avg {worst_avg:.3} p99 {worst_p99:.3}",
        n = points.len()
    );
}
