//! `node-agent` binary.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use node_agent::config::AgentConfig;
use node_agent::gpu::GpuBackend;
use node_agent::gpu::fake::FakeGpuBackend;
use node_agent::gpu::nvml::NvmlBackend;
use node_agent::session::Agent;

/// fmsched node agent: reports this host's GPUs to the scheduler and runs the
/// training processes it is told to.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML config file (also FMSCHED_AGENT_CONFIG); keys can be overridden
    /// with FMSCHED_AGENT_<KEY>, nested keys joined by `__`.
    #[arg(long, short, env = "FMSCHED_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Scheduler endpoint, e.g. http://scheduler:50051.
    #[arg(long)]
    scheduler: Option<String>,
    /// Node id (default: hostname).
    #[arg(long)]
    node_id: Option<String>,
    /// Simulate N GPUs with the FAKE backend instead of NVML (tests, demos).
    #[arg(long, value_name = "N")]
    fake_gpus: Option<u32>,
    /// Model the fake GPUs imitate (e.g. A100-80GB, H100-80GB, V100-32GB).
    #[arg(long, value_name = "MODEL")]
    fake_gpu_model: Option<String>,
    /// Node label KEY=VALUE (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Args::parse()).await {
        eprintln!("node-agent: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = AgentConfig::load_from(args.config.as_deref(), std::env::vars())?;
    if let Some(s) = args.scheduler {
        cfg.scheduler_endpoint = s;
    }
    if let Some(n) = args.node_id {
        cfg.node_id = Some(n);
    }
    if let Some(n) = args.fake_gpus {
        cfg.gpu.fake_count = n;
    }
    if let Some(m) = args.fake_gpu_model {
        cfg.gpu.fake_model = m;
    }
    for l in &args.labels {
        let Some((k, v)) = l.split_once('=') else {
            bail!("--label {l:?}: expected KEY=VALUE")
        };
        cfg.labels.insert(k.to_string(), v.to_string());
    }
    cfg.validate()?;
    fmsched_runtime::init_logging(&cfg.log);

    let env: HashMap<String, String> = std::env::vars().collect();
    let token =
        fmsched_runtime::read_secret(&env, "FMSCHED_JOIN_TOKEN", cfg.join_token_file.as_deref())
            .context("reading join_token_file")?;
    if token.is_none() && !node_agent::session::node_token_on_file(&cfg) {
        bail!(
            "no join token: set FMSCHED_JOIN_TOKEN or join_token_file (a node that enrolled before may instead keep its node token at {})",
            cfg.resolved_node_token_file().display()
        );
    }

    let node_id = cfg.resolved_node_id();
    let gpus: Arc<dyn GpuBackend> = if cfg.gpu.fake_count > 0 {
        let b = FakeGpuBackend::new(&node_id, cfg.gpu.fake_count, &cfg.gpu.fake_model)
            .map_err(anyhow::Error::msg)?;
        tracing::warn!(gpus = cfg.gpu.fake_count, model = %cfg.gpu.fake_model,
            "using the FAKE GPU backend: simulated GPUs, for tests and demos only");
        Arc::new(b)
    } else {
        Arc::new(NvmlBackend::init().map_err(anyhow::Error::msg)?)
    };
    for g in gpus.inventory() {
        tracing::info!(index = g.index, uuid = %g.uuid, model = %g.model, memory_gib = g.memory_total_bytes >> 30, "GPU");
    }
    let metrics_addr = cfg.metrics_addr;
    let agent = Agent::new(cfg, token, gpus.clone());
    if let Some(addr) = metrics_addr {
        let (reconciler, node) = (agent.reconciler(), agent.node_id().to_string());
        let render: fmsched_runtime::metrics::Render = Arc::new(move || {
            let (r, g, n) = (reconciler.clone(), gpus.clone(), node.clone());
            Box::pin(async move { node_agent::metrics::render(&n, &g, &r).await })
        });
        tokio::spawn(async move {
            if let Err(e) = fmsched_runtime::metrics::serve(addr, render).await {
                tracing::error!(%addr, error = %e, "metrics endpoint failed");
            }
        });
    }
    agent.run(fmsched_runtime::shutdown_signal()).await?;
    tracing::info!("agent stopped");
    Ok(())
}
