//! ICEFROG's evaluation (TPDS'25 §V) in fmsim: workloads built as the
//! paper builds them ([`crate::generate::icefrog_workload`]) on 12 × 4
//! GPUs, IceShare with the layer tuner and GPU sharing against a
//! Lucid-style sharing scheduler, Optimus and Pollux, each with and without
//! tuned FreezeOut, and a 60 s reallocation overhead (§V-E).

use std::collections::BTreeMap;

use fmsched_core::policy::with_knobs;
use fmsched_estimator::lut::Lut;

use crate::catalog::Catalog;
use crate::engine::{LayerMode, NodeGroup, SimConfig, SimError, SimResult, Simulation};
use crate::generate::{TraceRow, icefrog_workload};
use crate::parallel::parallel_map;
use crate::workload::WorkloadJob;

/// One system of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct System {
    pub label: String,
    pub policy: String,
    pub layers: LayerMode,
    pub gpu_sharing: bool,
}

/// The systems by label: `icefrog` (IceShare, layer tuner, sharing),
/// `icefrog-no-sharing`, `icefrog-no-layers`, `lucid` (sharing, no
/// elasticity), `optimus`, `pollux`; a trailing `+` adds tuned FreezeOut
/// (`lucid+`, `optimus+`, `pollux+`).
pub fn system(label: &str) -> Result<System, String> {
    let (base, freezeout) = match label.strip_suffix('+') {
        Some(b) => (b, true),
        None => (label, false),
    };
    let (policy, layers, gpu_sharing) = match base {
        "icefrog" if !freezeout => ("icefrog", LayerMode::Tuner, true),
        "icefrog-no-sharing" if !freezeout => ("icefrog-no-sharing", LayerMode::Tuner, false),
        "icefrog-no-layers" if !freezeout => ("icefrog", LayerMode::Off, true),
        "lucid" => ("lucid", LayerMode::Off, true),
        "optimus" => ("optimus", LayerMode::Off, false),
        "pollux" => ("pollux", LayerMode::Off, false),
        _ => {
            return Err(format!(
                "unknown system {label:?}; expected icefrog, icefrog-no-sharing, icefrog-no-layers, lucid[+], optimus[+], pollux[+]"
            ));
        }
    };
    Ok(System {
        label: label.to_string(),
        policy: policy.to_string(),
        layers: if freezeout {
            LayerMode::Freezeout
        } else {
            layers
        },
        gpu_sharing,
    })
}

/// What one evaluation runs.
#[derive(Clone, Debug)]
pub struct Spec {
    pub loads: Vec<f64>,
    pub seeds: Vec<u64>,
    pub systems: Vec<System>,
    pub cluster: Vec<NodeGroup>,
    /// Multiplies the nodes and the jobs (the paper's 5×, 10×, 20×).
    pub scale: u32,
    /// Policy knobs for every system that has them (e.g. partition_jobs).
    pub knobs: BTreeMap<String, f64>,
    /// Rows (id, submitted, GPUs, seconds) of a real trace to sample from.
    pub trace: Option<Vec<TraceRow>>,
}

/// One system at one load: averages over the seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub load: f64,
    pub label: String,
    pub jobs: usize,
    /// Average JCT (hours): all jobs, then small / medium / large by
    /// GPU-time (< 1, 1–10, > 10 GPU-hours).
    pub avg_jct_h: [f64; 4],
    /// Seconds per scheduling round: mean and max.
    pub round_s: (f64, f64),
    /// Jobs that finished, of the jobs.
    pub finished: usize,
    /// GPU-hours two jobs shared a GPU, per workload.
    pub shared_gpu_h: f64,
}

/// Size class of a job by its trace GPU-time (0 small, 1 medium, 2 large).
fn class(j: &WorkloadJob) -> usize {
    let h = j.trace_gpu_s.unwrap_or(0.0) / 3600.0;
    if h < 1.0 {
        0
    } else if h < 10.0 {
        1
    } else {
        2
    }
}

/// Runs every system on every load and seed (in parallel over `threads`).
pub fn evaluate(
    spec: &Spec,
    lut: &Lut,
    catalog: &Catalog,
    threads: usize,
) -> Result<Vec<Row>, SimError> {
    let scale = spec.scale.max(1);
    let cluster: Vec<NodeGroup> = spec
        .cluster
        .iter()
        .map(|g| NodeGroup::new(&g.gpu_type, g.count * scale, g.gpus))
        .collect();
    let mut workloads: Vec<(f64, u64, Vec<WorkloadJob>)> = Vec::new();
    for &load in &spec.loads {
        for &seed in &spec.seeds {
            let w = icefrog_workload(
                load * f64::from(scale),
                seed,
                catalog,
                spec.trace.as_deref(),
            )
            .map_err(SimError::Config)?;
            workloads.push((load, seed, w));
        }
    }
    let runs: Vec<(usize, usize)> = (0..workloads.len())
        .flat_map(|w| (0..spec.systems.len()).map(move |s| (w, s)))
        .collect();
    let results: Vec<Result<SimResult, SimError>> = parallel_map(&runs, threads, |&(w, s)| {
        let sys = &spec.systems[s];
        let known = fmsched_core::policy::knob_names(&sys.policy).unwrap_or(&[]);
        let knobs: BTreeMap<String, f64> = spec
            .knobs
            .iter()
            .filter(|(k, _)| known.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let policy = with_knobs(&sys.policy, &knobs).map_err(SimError::Config)?;
        let cfg = SimConfig {
            cluster: cluster.clone(),
            // ICEFROG §V-E: a 60 s reallocation overhead; no profiling.
            checkpoint_s: 30.0,
            context_switch_s: Some(30.0),
            profile_s: 0.0,
            layers: sys.layers,
            gpu_sharing: sys.gpu_sharing,
            ..Default::default()
        };
        let sim = Simulation::new(cfg, lut, catalog, &workloads[w].2)?;
        sim.run(policy.as_ref(), catalog, |_, _| {})
    });
    let mut rows: Vec<Row> = Vec::new();
    for &load in &spec.loads {
        for (s, sys) in spec.systems.iter().enumerate() {
            let mut sums = [0.0f64; 4];
            let mut counts = [0usize; 4];
            let mut rounds: Vec<f64> = Vec::new();
            let (mut jobs, mut finished, mut shared, mut runs_n) = (0, 0, 0.0, 0usize);
            for (k, &(w, ss)) in runs.iter().enumerate() {
                if ss != s || workloads[w].0 != load {
                    continue;
                }
                let r = match &results[k] {
                    Ok(r) => r,
                    Err(e) => return Err(SimError::Config(format!("{}: {e}", sys.label))),
                };
                let by_name: BTreeMap<&str, &WorkloadJob> = workloads[w]
                    .2
                    .iter()
                    .map(|j| (j.name.as_str(), j))
                    .collect();
                jobs += workloads[w].2.len();
                finished += r.jobs.len();
                for j in &r.jobs {
                    let c = by_name.get(j.name.as_str()).map_or(0, |w| class(w));
                    for slot in [0, c + 1] {
                        sums[slot] += j.jct_s / 3600.0;
                        counts[slot] += 1;
                    }
                }
                rounds.extend(&r.round_wall_s);
                shared += r.shared_gpu_s / 3600.0;
                runs_n += 1;
            }
            let avg = |k: usize| {
                if counts[k] == 0 {
                    f64::NAN
                } else {
                    sums[k] / counts[k] as f64
                }
            };
            let mean = if rounds.is_empty() {
                0.0
            } else {
                rounds.iter().sum::<f64>() / rounds.len() as f64
            };
            rows.push(Row {
                load,
                label: sys.label.clone(),
                jobs,
                avg_jct_h: [avg(0), avg(1), avg(2), avg(3)],
                round_s: (mean, rounds.iter().copied().fold(0.0, f64::max)),
                finished,
                shared_gpu_h: shared / runs_n.max(1) as f64,
            });
        }
    }
    Ok(rows)
}

/// The rows as a table, with each system's average JCT over IceFrog's
/// (above 1: ICEFROG is faster) where `icefrog` ran.
pub fn table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>5} {:<20} {:>6} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9}",
        "load",
        "system",
        "jobs",
        "avg JCT h",
        "small",
        "medium",
        "large",
        "vs icefrog",
        "shared h",
        "round ms",
        "max ms"
    );
    for r in rows {
        let ice = rows
            .iter()
            .find(|x| x.load == r.load && x.label == "icefrog")
            .map(|x| x.avg_jct_h[0]);
        let ratio = ice.map_or("-".to_string(), |i| format!("{:.2}x", r.avg_jct_h[0] / i));
        let _ = writeln!(
            s,
            "{:>4}x {:<20} {:>6} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10} {:>8.1} {:>9.1} {:>9.1}",
            r.load,
            r.label,
            if r.finished == r.jobs {
                r.jobs.to_string()
            } else {
                format!("{}/{}", r.finished, r.jobs)
            },
            r.avg_jct_h[0],
            r.avg_jct_h[1],
            r.avg_jct_h[2],
            r.avg_jct_h[3],
            ratio,
            r.shared_gpu_h,
            1000.0 * r.round_s.0,
            1000.0 * r.round_s.1
        );
    }
    s
}
