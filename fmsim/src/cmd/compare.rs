//! `fmsim run` and `fmsim compare`: policies side by side on one workload.

use anyhow::bail;
use fmsched_core::policy::with_knobs;
use fmsched_sim::engine::{EstimateModel, SimConfig};
use fmsched_sim::report;

use crate::cmd::args::SimArgs;
use crate::cmd::setup::{parse_knobs, sim_setup, simulate, write_outputs};

pub(crate) fn compare(a: &SimArgs, names: &[String]) -> anyhow::Result<()> {
    let knobs = parse_knobs(&a.knobs)?;
    let policies = names
        .iter()
        .map(|n| with_knobs(n.trim(), &knobs).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (cfg, lut, catalog, jobs) = sim_setup(a)?;
    let titansched: Vec<&str> = a
        .titansched_estimates
        .as_deref()
        .map(|l| l.split(',').map(str::trim).collect())
        .unwrap_or_default();
    if let Some(n) = titansched
        .iter()
        .find(|n| !names.iter().any(|m| m.trim() == **n))
    {
        bail!("--titansched-estimates names {n:?}, which is not among the policies run");
    }
    let mut results = Vec::new();
    for (name, p) in names.iter().zip(&policies) {
        let cfg = SimConfig {
            estimate_model: if titansched.contains(&name.trim()) {
                EstimateModel::TitanSched
            } else {
                EstimateModel::Exact
            },
            ..cfg.clone()
        };
        results.push(simulate(&cfg, &lut, &catalog, &jobs, p.as_ref())?);
    }
    let rows: Vec<report::Summary> = results.iter().map(report::summarize).collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report::to_json(&rows))?);
    } else {
        print!("{}", report::table(&rows));
    }
    if let Some(out) = &a.out {
        write_outputs(out, &results, &rows)?;
    }
    Ok(())
}
