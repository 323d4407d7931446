//! Wires the scheduler together: config → auth → Postgres (+ migrations) →
//! registry → gRPC services (with health and reflection) → background tasks.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use fmsched_core::Limits;
use fmsched_proto::MAX_MESSAGE_BYTES;
use fmsched_proto::v1::admin_service_server::AdminServiceServer;
use fmsched_proto::v1::agent_service_server::AgentServiceServer;
use fmsched_proto::v1::cluster_service_server::ClusterServiceServer;
use fmsched_proto::v1::job_service_server::JobServiceServer;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Identity, ServerTlsConfig};
use tonic_health::ServingStatus;

use crate::api::admin::AdminApi;
use crate::api::agents::AgentApi;
use crate::api::cluster::ClusterApi;
use crate::api::jobs::JobApi;
use crate::auth::Authenticator;
use crate::config::Config;
use crate::persistence::Persistence;
use crate::registry::NodeRegistry;
use crate::service::Service;

/// Connects to Postgres, retrying while it is not up yet (a scheduler
/// started before its database should wait, not crash-loop).
pub async fn connect_with_retry(
    url: &str,
    max_conns: u32,
    stuck_after: Duration,
    patience: Duration,
) -> anyhow::Result<Persistence> {
    fmsched_runtime::retry_connect("Postgres", patience, || {
        Persistence::connect(url, max_conns, stuck_after)
    })
    .await
    .context("connecting to Postgres")
}

/// Runs the scheduler on `listener` until `shutdown` resolves.
pub async fn run(
    cfg: Config,
    env: HashMap<String, String>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let auth = Authenticator::from_config(&cfg.auth, &env).context("authentication setup")?;
    let url = cfg.database_url()?;
    let persistence = connect_with_retry(
        &url,
        cfg.database_max_connections,
        cfg.leader_lease,
        Duration::from_secs(60),
    )
    .await?;
    persistence.migrate().await.context("applying migrations")?;

    let state = service(cfg, auth, persistence.clone()).await?;
    let (cfg, registry) = (state.config.clone(), state.registry.clone());
    // Leadership: take it now if free (a single replica leads at once),
    // then keep renewing; a standby takes over when the leader's lease
    // lapses (it died, froze, or lost the database).
    let became = state.leadership.refresh(&persistence, &registry).await;
    tracing::info!(
        leader = became,
        holder = %state.leadership.holder(),
        "scheduler replica role: {}",
        if became { "active" } else { "standby" }
    );
    let leadership = tokio::spawn(crate::leadership::run(
        state.leadership.clone(),
        persistence.clone(),
        registry.clone(),
        cfg.leader_refresh,
    ));

    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_serving::<JobServiceServer<JobApi>>().await;
    health
        .set_serving::<ClusterServiceServer<ClusterApi>>()
        .await;
    health.set_serving::<AgentServiceServer<AgentApi>>().await;
    health.set_serving::<AdminServiceServer<AdminApi>>().await;
    health.set_service_status("", ServingStatus::Serving).await;

    let (reflection_v1, reflection_v1alpha) = fmsched_proto::reflection_services()?;

    let metrics = cfg
        .metrics_addr
        .map(|addr| serve_metrics(addr, state.clone()));
    let scheduler = cfg
        .scheduling
        .enabled
        .then(|| tokio::spawn(crate::round::scheduling_loop(state.clone())));
    let autosched = cfg
        .autosched
        .enabled
        .then(|| tokio::spawn(crate::round::autosched::autosched_loop(state.clone())));
    let background = tokio::spawn(background_tasks(
        cfg.clone(),
        persistence.clone(),
        registry.clone(),
        health.clone(),
        state.leadership.clone(),
    ));

    let mut builder = grpc_server(&cfg)?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, tls = cfg.tls.cert_path.is_some(), "scheduler serving");
    let result = builder
        .add_service(health_svc)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            JobServiceServer::new(JobApi::new(state.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            ClusterServiceServer::new(ClusterApi::new(state.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            AgentServiceServer::new(AgentApi::new(state.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            AdminServiceServer::new(AdminApi::new(state.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    background.abort();
    leadership.abort();
    // A standby takes over at once instead of waiting for the lease.
    state.leadership.resign().await;
    for t in [scheduler, metrics, autosched].into_iter().flatten() {
        t.abort();
    }
    result.context("gRPC server")?;
    tracing::info!("scheduler stopped");
    Ok(())
}

/// The service state a fresh replica starts with: the node registry as
/// stored, leadership not yet taken, the leader's memory empty.
async fn service(
    cfg: Config,
    auth: Authenticator,
    persistence: Persistence,
) -> anyhow::Result<Service> {
    let now = Utc::now();
    let nodes = persistence.list_nodes().await.context("loading nodes")?;
    tracing::info!(nodes = nodes.len(), "loaded node registry");
    let registry = Arc::new(NodeRegistry::load(nodes, now));
    let (job_events, _) = broadcast::channel(1024);
    let cfg = Arc::new(cfg);
    Ok(Service {
        persistence: persistence.clone(),
        auth: Arc::new(auth),
        registry,
        models: Arc::new(cfg.model_catalog()),
        limits: Limits::default(),
        config: cfg.clone(),
        job_events,
        metrics: Arc::new(crate::metrics::SchedulerMetrics::default()),
        leadership: Arc::new(crate::leadership::Leadership::new(
            crate::persistence::LeaderLease::new(
                &persistence,
                cfg.replica_name(),
                cfg.leader_lease,
            ),
        )),
        autosched: Arc::new(
            crate::tuner::Autosched::new().context("loading AutoSched's profiles")?,
        ),
        leader: Default::default(),
    })
}

/// Serves `/metrics` on `addr` (`metrics_addr`) until the task is aborted.
fn serve_metrics(addr: std::net::SocketAddr, state: Service) -> tokio::task::JoinHandle<()> {
    let render: fmsched_runtime::metrics::Render = Arc::new(move || {
        let st = state.clone();
        Box::pin(async move {
            crate::metrics::render_metrics(
                &st.persistence,
                &st.metrics,
                &st.registry.snapshot(),
                st.leadership.epoch(),
            )
            .await
        })
    });
    tokio::spawn(async move {
        if let Err(e) = fmsched_runtime::metrics::serve(addr, render).await {
            tracing::error!(%addr, error = %e, "metrics endpoint failed");
        }
    })
}

/// The gRPC server's transport: keepalives, and TLS when `tls.cert_path`
/// and `tls.key_path` are set.
fn grpc_server(cfg: &Config) -> anyhow::Result<tonic::transport::Server> {
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_nodelay(true);
    if let (Some(cert), Some(key)) = (&cfg.tls.cert_path, &cfg.tls.key_path) {
        let cert = std::fs::read(cert)
            .with_context(|| format!("reading tls.cert_path {}", cert.display()))?;
        let key = std::fs::read(key)
            .with_context(|| format!("reading tls.key_path {}", key.display()))?;
        builder =
            builder.tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))?;
    }
    Ok(builder)
}

/// Liveness sweeps and the database health probe.
async fn background_tasks(
    cfg: Arc<Config>,
    persistence: Persistence,
    registry: Arc<NodeRegistry>,
    health: tonic_health::server::HealthReporter,
    leadership: Arc<crate::leadership::Leadership>,
) {
    let rule = cfg.liveness.rule();
    let mut liveness = tokio::time::interval(cfg.liveness.check_interval);
    liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut db_probe = tokio::time::interval(Duration::from_secs(5));
    let mut db_ok = true;
    loop {
        tokio::select! {
            _ = liveness.tick() => {
                // A standby has no agent sessions: it must not mark the
                // leader's nodes offline (nor may a deposed leader, whose
                // writes its fence refuses anyway).
                let Some(fence) = leadership.fence() else {
                    continue;
                };
                let now = Utc::now();
                for ch in registry.sweep(&rule, now) {
                    match persistence.set_node_state(&ch.node, ch.to, ch.last_heartbeat, Some(&fence), now).await {
                        Ok(()) => {
                            registry.mark_persisted(&ch.node, ch.to);
                            tracing::info!(node_id = %ch.node, from = %ch.from, to = %ch.to,
                                silent_for = ?(now - ch.last_heartbeat).to_std().unwrap_or_default(),
                                "node liveness changed");
                        }
                        // Retried on the next sweep: memory still differs from Postgres.
                        Err(e) => tracing::warn!(node_id = %ch.node, error = %e, "persisting node state failed"),
                    }
                }
            }
            _ = db_probe.tick() => {
                let ok = persistence.ping().await.is_ok();
                if ok != db_ok {
                    db_ok = ok;
                    let status = if ok { ServingStatus::Serving } else { ServingStatus::NotServing };
                    tracing::warn!(database_ok = ok, "database health changed");
                    health.set_service_status("", status).await;
                }
            }
        }
    }
}
