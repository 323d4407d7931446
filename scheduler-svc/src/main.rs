//! `scheduler-svc` binary.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use scheduler_svc::config::Config;
use scheduler_svc::server;

/// fmsched scheduler: job and cluster APIs, agent sessions, cluster state in Postgres.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML config file (also FMSCHED_CONFIG). Every key can be overridden
    /// with FMSCHED_<KEY>, nested keys joined by `__`.
    #[arg(long, short, env = "FMSCHED_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    print_config: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("scheduler-svc: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    if args.print_config {
        println!("{cfg:#?}");
        return Ok(());
    }
    fmsched_runtime::init_logging(&cfg.log);
    let listener = tokio::net::TcpListener::bind(cfg.listen_addr)
        .await
        .with_context(|| format!("binding {}", cfg.listen_addr))?;
    let env = std::env::vars().collect();
    server::run(cfg, env, listener, fmsched_runtime::shutdown_signal()).await
}
