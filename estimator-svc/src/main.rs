//! `estimator-svc` binary: serves `fmsched.v1.EstimatorService` (with gRPC
//! health and reflection), or writes the shipped default profiles.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use estimator_svc::analytic;
use estimator_svc::server::{self, Config};
use fmsched_runtime::Layering;

/// fmsched estimator service: loss-curve fits, iteration and time
/// estimates, transferability, throughput lookup table.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML config file (also FMSCHED_ESTIMATOR_CONFIG); keys can be
    /// overridden with FMSCHED_ESTIMATOR_<KEY>, nested keys joined by `__`.
    #[arg(long, short, env = "FMSCHED_ESTIMATOR_CONFIG")]
    config: Option<PathBuf>,
    /// Listen address (overrides the config).
    #[arg(long)]
    listen_addr: Option<SocketAddr>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Write the default profiles of the analytic throughput model
    /// (`default-<GPU>.csv`, fmsched layout) into DIR.
    WriteDefaultProfiles { dir: PathBuf },
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Args::parse()).await {
        eprintln!("estimator-svc: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Command::WriteDefaultProfiles { dir }) = &args.command {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for g in &analytic::GPUS {
            let path = dir.join(format!("default-{}.csv", g.name));
            std::fs::write(&path, analytic::default_profile_csv(g))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        return Ok(());
    }
    let mut cfg: Config = fmsched_runtime::load_layered(
        args.config.as_deref(),
        std::env::vars(),
        &Layering {
            env_prefix: "FMSCHED_ESTIMATOR",
            not_keys: &["FMSCHED_ESTIMATOR_CONFIG"],
            list_keys: &[],
            foreign_prefixes: &[],
        },
    )?;
    if let Some(a) = args.listen_addr {
        cfg.listen_addr = a;
    }
    fmsched_runtime::init_logging(&cfg.log);
    let listener = tokio::net::TcpListener::bind(cfg.listen_addr)
        .await
        .with_context(|| format!("binding {}", cfg.listen_addr))?;
    server::run(cfg, listener, fmsched_runtime::shutdown_signal()).await
}
