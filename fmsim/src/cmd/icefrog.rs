//! `fmsim icefrog`: layer elasticity and GPU sharing against Lucid-style
//! sharing, Optimus and Pollux (ICEFROG's evaluation).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use fmsched_estimator::analytic;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::workload;

use crate::cmd::setup::{node_group, parse_knobs};

/// `fmsim lyra`: the scenarios of the thesis' Table 3.5 that fmsched
/// runs, side by side.
#[allow(clippy::too_many_arguments)]
pub(crate) fn icefrog_eval(
    loads: &str,
    seeds: &str,
    systems: &str,
    nodes: &[String],
    scale: u32,
    knobs: &[String],
    trace: Option<&Path>,
    threads: Option<usize>,
) -> anyhow::Result<()> {
    use fmsched_sim::iceeval;
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect()
    };
    let loads: Vec<f64> = list(loads)
        .iter()
        .map(|x| {
            x.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .with_context(|| format!("--loads: {x:?} is not a load > 0"))
        })
        .collect::<anyhow::Result<_>>()?;
    let seeds: Vec<u64> = list(seeds)
        .iter()
        .map(|x| {
            x.parse::<u64>()
                .with_context(|| format!("--seeds: {x:?} is not a seed"))
        })
        .collect::<anyhow::Result<_>>()?;
    let systems: Vec<iceeval::System> = list(systems)
        .iter()
        .map(|x| iceeval::system(x).map_err(|e| anyhow::anyhow!("--systems: {e}")))
        .collect::<anyhow::Result<_>>()?;
    if loads.is_empty() || seeds.is_empty() || systems.is_empty() {
        bail!("--loads, --seeds and --systems each need at least one value");
    }
    if scale == 0 {
        bail!("--scale must be at least 1");
    }
    let cluster = nodes
        .iter()
        .map(|n| match n.split(':').collect::<Vec<_>>()[..] {
            [ty, count, gpus] => node_group(ty, count, gpus, &format!("--nodes {n}")),
            _ => bail!("--nodes {n:?}: expected TYPE:COUNT:GPUS (e.g. A100:12:4)"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let knobs = parse_knobs(knobs)?;
    for k in knobs.keys() {
        let takes = systems.iter().any(|s| {
            fmsched_core::policy::knob_names(&s.policy).is_some_and(|n| n.contains(&k.as_str()))
        });
        if !takes {
            bail!("--knob {k}: none of the systems has this knob");
        }
    }
    let trace_rows = match trace {
        None => None,
        Some(p) => {
            let jobs = workload::read(p, None, &[("roberta-base".to_string(), "x".to_string())])?;
            let rows: Vec<fmsched_sim::generate::TraceRow> = jobs
                .iter()
                .filter_map(|j| {
                    let g = j.gpus.max(1);
                    j.trace_gpu_s
                        .map(|s| (j.name.clone(), j.submit_s, g, s / f64::from(g)))
                })
                .collect();
            if rows.is_empty() {
                bail!(
                    "{}: no job with a GPU-time (a philly or helios trace)",
                    p.display()
                );
            }
            Some(rows)
        }
    };
    let spec = iceeval::Spec {
        loads,
        seeds,
        systems,
        cluster,
        scale,
        knobs,
        trace: trace_rows,
    };
    let lut = analytic::default_lut()?;
    let catalog = Catalog::default_synthetic();
    let started = Instant::now();
    let rows = iceeval::evaluate(
        &spec,
        &lut,
        &catalog,
        threads.unwrap_or_else(fmsched_sim::parallel::all_cores),
    )?;
    print!("{}", iceeval::table(&rows));
    eprintln!(
        "{} simulations in {:.1} s",
        rows.len() * spec.seeds.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
