//! `fmsim` command line: run, compare, generate, catalog, fidelity,
//! bench-solver.

mod cmd;

use clap::Parser;

use crate::cmd::args::{Cli, Cmd};
use crate::cmd::bench::{bench_prompt_bank, bench_prompttuner, bench_solver};
use crate::cmd::compare::compare;
use crate::cmd::fidelity::fidelity;
use crate::cmd::generate::generate_cmd;
use crate::cmd::icefrog::icefrog_eval;
use crate::cmd::lyra::lyra_eval;
use crate::cmd::prompttuner::prompttuner_cmd;
use crate::cmd::setup::parse_knobs;
use crate::cmd::sweep::sweep;
use crate::cmd::tune::{TuneArgs, tune};
use fmsched_sim::catalog::Catalog;

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("fmsim: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Run { sim, policy: name } => compare(&sim, &[name]),
        Cmd::Compare { sim, policies } => {
            let names: Vec<String> = policies
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            compare(&sim, &names)
        }
        Cmd::Lyra { sim } => lyra_eval(&sim),
        Cmd::Icefrog {
            loads,
            seeds,
            systems,
            nodes,
            scale,
            knobs,
            trace,
            threads,
        } => icefrog_eval(
            &loads,
            &seeds,
            &systems,
            &nodes,
            scale,
            &knobs,
            trace.as_deref(),
            threads,
        ),
        Cmd::Prompttuner(args) => prompttuner_cmd(args),
        Cmd::Sweep {
            sim,
            baselines,
            noise,
            gain_noise_levels,
            srtf_weights,
            intervals,
            resize_horizons,
        } => sweep(
            &sim,
            &baselines,
            (&noise, &gain_noise_levels),
            [
                ("srtf_weight", srtf_weights.as_str()),
                ("interval_s", intervals.as_str()),
                ("resize_horizon_s", resize_horizons.as_str()),
            ],
        ),
        Cmd::Generate(args) => generate_cmd(args),
        Cmd::Tune {
            sim,
            policy,
            every,
            samples,
            fixed_samples,
            threshold,
            no_aggregate,
            modes,
            threads,
            seed,
            decisions,
        } => tune(
            &sim,
            &TuneArgs {
                policy,
                every,
                samples,
                fixed_samples,
                threshold,
                aggregate: !no_aggregate,
                modes,
                threads,
                seed,
                decisions,
            },
        ),
        Cmd::Catalog => {
            println!(
                "{}",
                serde_json::to_string_pretty(&Catalog::default_synthetic().to_json())?
            );
            Ok(())
        }
        Cmd::Fidelity {
            anchor_dir,
            out,
            only,
            policies,
            knobs,
        } => fidelity(
            &anchor_dir,
            out.as_deref(),
            only.as_deref(),
            policies.as_deref(),
            &parse_knobs(&knobs)?,
        ),
        Cmd::BenchSolver { anchor_dir, jobs } => bench_solver(anchor_dir.as_deref(), jobs),
        Cmd::BenchPrompttuner {
            requests,
            models,
            rounds,
            prompts,
            features,
        } => {
            bench_prompttuner(requests, models, rounds);
            if prompts > 0 {
                bench_prompt_bank(prompts, features);
            }
            Ok(())
        }
    }
}
