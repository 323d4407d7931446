//! `fmsim lyra`: capacity loaned from an inference cluster (Lyra's
//! evaluation).

use anyhow::bail;
use fmsched_core::policy::lyra::ReclaimRule;
use fmsched_core::policy::with_knobs;
use fmsched_sim::engine::{SimConfig, Simulation};
use fmsched_sim::report;

use crate::cmd::args::SimArgs;
use crate::cmd::setup::{parse_knobs, sim_setup, write_outputs};

pub(crate) fn lyra_eval(a: &SimArgs) -> anyhow::Result<()> {
    let (cfg, lut, catalog, jobs) = sim_setup(a)?;
    let Some(loans) = cfg.loans.clone() else {
        bail!("fmsim lyra needs an inference cluster: --inference-nodes TYPE:COUNT:GPUS");
    };
    let elastic = jobs.iter().filter(|j| j.max_gpus > j.gpus).count();
    if elastic == 0 {
        eprintln!(
            "note: no job of the workload is elastic (max_gpus above gpus); --elastic-share makes some"
        );
    }
    let knobs = parse_knobs(&a.knobs)?;
    // (label, policy, loans, reclaim rule)
    let scenarios: Vec<(&str, &str, bool, ReclaimRule)> = vec![
        (
            "baseline (fifo, no loans)",
            "fifo",
            false,
            ReclaimRule::Lyra,
        ),
        ("loaning alone (fifo)", "fifo", true, ReclaimRule::Lyra),
        // The inference side takes servers back without asking which:
        // training on idle inference servers at low priority.
        (
            "opportunistic (fifo)",
            "fifo",
            true,
            ReclaimRule::Random(a.slo_seed),
        ),
        ("scaling alone (lyra)", "lyra", false, ReclaimRule::Lyra),
        ("lyra", "lyra", true, ReclaimRule::Lyra),
        (
            "lyra, random reclaim",
            "lyra",
            true,
            ReclaimRule::Random(a.slo_seed),
        ),
        ("lyra, scf reclaim", "lyra", true, ReclaimRule::Scf),
        ("gandiva-style", "gandiva", false, ReclaimRule::Lyra),
        ("optimus (afs-style)", "optimus", false, ReclaimRule::Lyra),
        ("pollux", "pollux", false, ReclaimRule::Lyra),
    ];
    let runs =
        fmsched_sim::parallel::parallel_map(&scenarios, fmsched_sim::parallel::all_cores(), |s| {
            let (_, name, loaned, rule) = *s;
            let p = with_knobs(name, &knobs).map_err(anyhow::Error::msg)?;
            let cfg = SimConfig {
                loans: loaned.then(|| fmsched_sim::loans::Loans {
                    rule,
                    ..loans.clone()
                }),
                // Lyra's job model for every scheme: inelastic jobs run at
                // their request, elastic ones from it (AFS "allocating base
                // demand to each job first", §3.7.1).
                base_demands: true,
                ..cfg.clone()
            };
            let sim = Simulation::new(cfg, &lut, &catalog, &jobs)?;
            anyhow::Ok(sim.run(p.as_ref(), &catalog, |_, _| {})?)
        });
    let results = runs.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    println!(
        "{} jobs ({elastic} elastic) on {} training GPUs, {} inference GPUs to loan ({} headroom, every {:.0} s)",
        jobs.len(),
        cfg.total_gpus(),
        cfg.inference_gpus(),
        loans.headroom,
        loans.every_s
    );
    print!(
        "{}",
        report::lyra_table(&scenarios.iter().map(|s| s.0).collect::<Vec<_>>(), &results)
    );
    if let Some(out) = &a.out {
        // One file per scenario: name each run after its row.
        let mut results = results;
        for (r, s) in results.iter_mut().zip(&scenarios) {
            r.policy = s.0.replace([' ', ',', '(', ')'], "-").replace("--", "-");
            r.policy = r.policy.trim_matches('-').to_string();
        }
        let rows: Vec<report::Summary> = results.iter().map(report::summarize).collect();
        write_outputs(out, &results, &rows)?;
    }
    Ok(())
}
