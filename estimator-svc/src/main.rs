//! `estimator-svc` binary: serves gRPC health and reflection for the
//! fmsched.v1 API. The estimation RPCs (`EstimatorService`) are registered
//! once their computations exist; until then the service is not advertised,
//! so clients get UNIMPLEMENTED from the transport rather than a fake answer.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use fmsched_runtime::{Layering, LogConfig};
use serde::Deserialize;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

/// fmsched estimator service.
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    listen_addr: SocketAddr,
    log: LogConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen_addr: "127.0.0.1:50052".parse().expect("valid default"),
            log: LogConfig::default(),
        }
    }
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Args::parse()).await {
        eprintln!("estimator-svc: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
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
    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::Serving).await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(fmsched_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(fmsched_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let listener = tokio::net::TcpListener::bind(cfg.listen_addr)
        .await
        .with_context(|| format!("binding {}", cfg.listen_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "estimator serving");
    tonic::transport::Server::builder()
        .add_service(health_svc)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            fmsched_runtime::shutdown_signal(),
        )
        .await?;
    Ok(())
}
