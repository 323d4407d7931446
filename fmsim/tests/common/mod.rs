//! What fmsim's test files share: the shipped workload, and a run of a
//! named policy on the shipped analytic profiles.

use std::path::Path;

use fmsched_core::policy::by_name;
use fmsched_estimator::analytic;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::engine::{SimConfig, SimResult, Simulation};
use fmsched_sim::workload::{self, WorkloadJob};

/// The small workload shipped in `fmsim/data/`.
#[allow(dead_code)] // not every test file reads it
pub fn small() -> Vec<WorkloadJob> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/small-workload.csv");
    workload::read(&path, None, &[]).expect("shipped workload reads")
}

/// `jobs` under the policy named `policy` with its default knobs, on
/// `catalog` and the shipped analytic profiles.
pub fn run_on(policy: &str, cfg: &SimConfig, catalog: &Catalog, jobs: &[WorkloadJob]) -> SimResult {
    let lut = analytic::default_lut().unwrap();
    let p = by_name(policy).unwrap();
    Simulation::new(cfg.clone(), &lut, catalog, jobs)
        .unwrap()
        .run(p.as_ref(), catalog, |_, _| {})
        .unwrap_or_else(|e| panic!("{policy}: {e}"))
}

/// [`run_on`] the shipped synthetic catalog.
#[allow(dead_code)] // not every test file runs on it
pub fn run(policy: &str, cfg: &SimConfig, jobs: &[WorkloadJob]) -> SimResult {
    run_on(policy, cfg, &Catalog::default_synthetic(), jobs)
}
