//! Wires the estimator together: config → default profiles → Postgres
//! (+ migrations, + what was learned before) → gRPC with health and
//! reflection.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fmsched_proto::MAX_MESSAGE_BYTES;
use fmsched_proto::v1::estimator_service_server::EstimatorServiceServer;
use fmsched_runtime::LogConfig;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

use crate::persistence::Persistence;
use crate::service::{EstimatorApi, EstimatorState, restore};

/// Estimator configuration (defaults → TOML → `FMSCHED_ESTIMATOR_*`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen_addr: SocketAddr,
    /// Postgres URL for what the estimator learns (LUT updates, imports,
    /// merge outcomes). Unset: `DATABASE_URL`; with neither, the estimator
    /// runs from its profiles alone and says that updates are not kept.
    pub database_url: Option<String>,
    pub database_max_connections: u32,
    /// Extra profile CSVs in fmsched's layout loaded over the defaults
    /// (every `*.csv` of the folder, in name order).
    pub profiles_dir: Option<PathBuf>,
    /// Prometheus `/metrics` address (unset = no metrics endpoint).
    pub metrics_addr: Option<SocketAddr>,
    pub log: LogConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen_addr: "127.0.0.1:50052".parse().expect("valid default"),
            database_url: None,
            database_max_connections: 8,
            profiles_dir: None,
            metrics_addr: None,
            log: LogConfig::default(),
        }
    }
}

/// Loads every `*.csv` of `dir` (fmsched layout) into the state.
pub fn load_profiles_dir(
    state: &mut EstimatorState,
    dir: &std::path::Path,
) -> anyhow::Result<usize> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("profiles_dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    let mut rows = 0;
    for f in &files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        rows += state
            .lut
            .import_csv("", "", "fmsched", &f.display().to_string(), &text)
            .with_context(|| format!("profiles_dir: {}", f.display()))?;
    }
    tracing::info!(files = files.len(), rows, dir = %dir.display(), "loaded operator profiles");
    Ok(rows)
}

/// Runs the estimator on `listener` until `shutdown` resolves.
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut state = EstimatorState::with_defaults().context("building the default profiles")?;
    if let Some(dir) = &cfg.profiles_dir {
        load_profiles_dir(&mut state, dir)?;
    }
    let url = cfg
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok());
    let persistence = match url {
        Some(url) => {
            let max = cfg.database_max_connections;
            let p = fmsched_runtime::retry_connect("Postgres", Duration::from_secs(60), || {
                Persistence::connect(&url, max)
            })
            .await
            .context("connecting to Postgres")?;
            p.migrate().await.context("applying estimator migrations")?;
            let learned = p.load().await.context("loading learned state")?;
            tracing::info!(
                imports = learned.imports.len(),
                measurements = learned.measurements.len(),
                merge_outcomes = learned.outcomes.len(),
                "restored what the estimator learned"
            );
            restore(&mut state, learned);
            Some(p)
        }
        None => {
            tracing::warn!(
                "no database_url: LUT updates and merge outcomes are kept in memory only"
            );
            None
        }
    };
    let api = EstimatorApi::new(state, persistence);
    if let Some(addr) = cfg.metrics_addr {
        let m = api.clone();
        let render: fmsched_runtime::metrics::Render = std::sync::Arc::new(move || {
            let m = m.clone();
            Box::pin(async move { m.render_metrics() })
        });
        tokio::spawn(async move {
            if let Err(e) = fmsched_runtime::metrics::serve(addr, render).await {
                tracing::error!(%addr, error = %e, "metrics endpoint failed");
            }
        });
    }
    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::Serving).await;
    health
        .set_serving::<EstimatorServiceServer<EstimatorApi>>()
        .await;
    let (reflection, reflection_alpha) = fmsched_proto::reflection_services()?;
    tracing::info!(addr = %listener.local_addr()?, "estimator serving");
    tonic::transport::Server::builder()
        .add_service(health_svc)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(
            EstimatorServiceServer::new(api)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(64 * 1024 * 1024),
        )
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}
