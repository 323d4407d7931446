//! Per-job tables in the layout of the Ymir authors' `job-epochs-FM-1.csv`
//! (`--job-epochs`, `--job-max-gpus`, and `fmsim fidelity`'s anchor runs):
//! reading one, and applying it to a workload.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use fmsched_sim::workload;
use fmsched_sim::workload::WorkloadJob;

/// What a per-job file replaces (`--job-epochs`, `--job-max-gpus`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PerJob {
    Epochs,
    MaxGpus,
}

/// Sets each job's epochs (and reads its target metric as the authors'
/// parser does) or its max GPUs from a per-job table; every job must have a
/// row.
pub(crate) fn apply_job_file(
    jobs: &mut [WorkloadJob],
    table: &BTreeMap<String, (f64, f64, u32)>,
    what: PerJob,
    source: &str,
) -> anyhow::Result<()> {
    for j in jobs {
        let (epochs, _, max_gpus) = *table
            .get(&j.name)
            .ok_or_else(|| anyhow::anyhow!("{source}: no row for job {}", j.name))?;
        match what {
            PerJob::Epochs => {
                j.epochs = Some(epochs);
                // Their parser reads the target one unit in the last place
                // high; merged curves are read the same way so both paths
                // compare.
                j.target_metric = j.target_metric.map(f64::next_up);
            }
            PerJob::MaxGpus => j.max_gpus = max_gpus.max(j.gpus),
        }
    }
    Ok(())
}

/// Reads a per-job file in the layout of the authors' `job-epochs-FM-1.csv`
/// (`job`, `epochs_pandas_default`, `progress_per_epoch`, `max_num_gpus`).
pub(crate) fn job_file(path: &Path) -> anyhow::Result<BTreeMap<String, (f64, f64, u32)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let csv = workload::Csv::parse(&path.display().to_string(), &text)?;
    let col = |n: &str| {
        csv.col(n)
            .ok_or_else(|| anyhow::anyhow!("{}: missing column {n}", path.display()))
    };
    let (job, ep, ppe, maxg) = (
        col("job")?,
        col("epochs_pandas_default")?,
        col("progress_per_epoch")?,
        col("max_num_gpus")?,
    );
    let mut out = BTreeMap::new();
    for (line, r) in &csv.rows {
        let num = |c: usize| -> anyhow::Result<f64> {
            r[c].trim()
                .parse()
                .with_context(|| format!("{} line {line}: {:?}", path.display(), r[c]))
        };
        out.insert(
            r[job].trim().to_string(),
            (num(ep)?, num(ppe)?, num(maxg)? as u32),
        );
    }
    Ok(out)
}
