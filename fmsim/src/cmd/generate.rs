//! `fmsim generate`: a workload of Pollux-style size classes with Poisson
//! arrivals, or shaped like a cluster trace.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fmsched_estimator::analytic;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::generate::{GenConfig, generate};
use fmsched_sim::workload;

/// The flags of `fmsim generate`.
#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    #[arg(long, default_value_t = 120)]
    pub(crate) jobs: usize,
    /// Arrival window at 1x load, hours.
    #[arg(long, default_value_t = 8.0)]
    pub(crate) hours: f64,
    /// Load factor (2 = the same jobs in half the time).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) load: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Comma-separated models (from the catalog).
    #[arg(long, default_value = "roberta-base")]
    pub(crate) models: String,
    #[arg(long, default_value = "V100")]
    pub(crate) gpu_type: String,
    /// Largest expert-parallel group of a Mixture-of-Experts job (jobs of
    /// 2+ GPUs of an MoE model train in groups of the largest power of
    /// two dividing their GPUs and the experts; 0 = never).
    #[arg(long, default_value_t = 4)]
    pub(crate) max_expert_parallel: u32,
    /// Share of the jobs pinned to a GPU model (`gpu_model` column).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) pinned: f64,
    /// Comma-separated GPU models pinned jobs name (default: --gpu-type).
    #[arg(long, default_value = "")]
    pub(crate) pin_gpu_models: String,
    /// Shape arrivals like this trace (any workload format) instead of Poisson.
    #[arg(long)]
    pub(crate) arrivals_from: Option<PathBuf>,
    /// Write service classes, deadlines and stopping criteria too (see `run --slo-mix`).
    #[arg(long, value_name = "slo|mix1|mix2")]
    pub(crate) slo_mix: Option<workload::SloMix>,
    /// Instead: a cluster-trace-shaped workload that drifts (daily
    /// cycle, changing load and job lengths; written in the Helios
    /// layout), of about `--jobs` jobs over `--days` days.
    #[arg(long, value_enum)]
    pub(crate) shape: Option<fmsched_sim::generate::Shape>,
    /// Days of a shaped workload.
    #[arg(long, default_value_t = 14)]
    pub(crate) days: u32,
    /// Divide every time of a shaped workload by this (7: two weeks in
    /// two days, at the same load).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) compress: f64,
    /// Output file (default: standard output).
    #[arg(long, short)]
    pub(crate) out: Option<PathBuf>,
}

/// Runs `fmsim generate`.
pub(crate) fn generate_cmd(args: GenerateArgs) -> anyhow::Result<()> {
    let GenerateArgs {
        jobs,
        hours,
        load,
        seed,
        models,
        gpu_type,
        max_expert_parallel,
        pinned,
        pin_gpu_models,
        arrivals_from,
        slo_mix,
        shape,
        days,
        compress,
        out,
    } = args;
    let catalog = Catalog::default_synthetic();
    if let Some(shape) = shape {
        let rows = fmsched_sim::generate::shaped(shape, days, jobs, compress, seed)
            .map_err(anyhow::Error::msg)?;
        let csv = fmsched_sim::generate::helios_csv(&rows);
        match out {
            Some(p) => {
                std::fs::write(&p, csv).with_context(|| format!("writing {}", p.display()))?;
                eprintln!("wrote {} jobs to {}", rows.len(), p.display());
            }
            None => print!("{csv}"),
        }
        return Ok(());
    }
    let arrivals = match arrivals_from {
        Some(p) => Some(
            workload::read(&p, None, &catalog.tasks())?
                .iter()
                .map(|j| j.submit_s)
                .collect(),
        ),
        None => None,
    };
    let cfg = GenConfig {
        arrivals,
        jobs,
        hours,
        load,
        seed,
        models: models.split(',').map(|s| s.trim().to_string()).collect(),
        gpu_type,
        max_expert_parallel,
        pinned_fraction: pinned,
        pin_gpu_models: pin_gpu_models
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        ..Default::default()
    };
    let mut w = generate(&cfg, &catalog, &analytic::default_lut()?).map_err(anyhow::Error::msg)?;
    if let Some(mix) = slo_mix {
        workload::assign_slos(&mut w, mix, seed);
    }
    let csv = workload::to_csv(&w);
    match out {
        Some(p) => {
            std::fs::write(&p, csv).with_context(|| format!("writing {}", p.display()))?;
            eprintln!("wrote {} jobs to {}", w.len(), p.display());
        }
        None => print!("{csv}"),
    }
    Ok(())
}
