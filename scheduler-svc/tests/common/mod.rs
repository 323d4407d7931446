//! Test harness: a scheduler on an ephemeral port over its own fresh
//! Postgres database, dropped at teardown.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use fmctl::{Client, ClientConfig};
use scheduler_svc::config::Config;
use sqlx::Connection;
use tokio::sync::oneshot;

pub const ALICE: &str = "alice-token-0123456789";
pub const BOB: &str = "bob-token-0123456789ab";
pub const ROOT: &str = "root-token-0123456789a";
pub const JOIN: &str = "join-token-0123456789";

pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// URL of database `name` on the same server as `admin_url()`.
pub fn db_url(name: &str) -> String {
    let base = admin_url();
    let (prefix, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL has a database path");
    format!("{prefix}/{name}")
}

pub async fn create_db() -> String {
    let name = format!("fmsched_t_{}", uuid::Uuid::new_v4().simple());
    let mut c = sqlx::PgConnection::connect(&admin_url())
        .await
        .expect("connect to Postgres (DATABASE_URL)");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut c)
        .await
        .unwrap();
    name
}

pub async fn drop_db(name: &str) {
    if let Ok(mut c) = sqlx::PgConnection::connect(&admin_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut c)
            .await;
    }
}

pub struct TestScheduler {
    pub addr: SocketAddr,
    pub db: String,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn test_config(db: &str) -> Config {
    let mut cfg = Config {
        database_url: Some(db_url(db)),
        database_max_connections: 8,
        ..Default::default()
    };
    cfg.auth.admins = vec!["root".into()];
    cfg.liveness.heartbeat_interval = Duration::from_millis(200);
    cfg.liveness.suspect_after = Duration::from_millis(800);
    cfg.liveness.offline_after = Duration::from_millis(1600);
    cfg.liveness.check_interval = Duration::from_millis(100);
    cfg.liveness.register_timeout = Duration::from_secs(2);
    // API tests drive agent sessions by hand; no scheduling rounds.
    cfg.scheduling.enabled = false;
    cfg
}

pub fn test_env() -> HashMap<String, String> {
    [
        (
            "FMSCHED_API_TOKENS".to_string(),
            format!("alice={ALICE},bob={BOB},root={ROOT}"),
        ),
        ("FMSCHED_JOIN_TOKEN".to_string(), JOIN.to_string()),
    ]
    .into()
}

impl TestScheduler {
    pub async fn start() -> Self {
        let db = create_db().await;
        Self::start_on(db, None).await
    }

    /// Starts on an existing database (to test restarts), optionally on a fixed address.
    pub async fn start_on(db: String, addr: Option<SocketAddr>) -> Self {
        Self::start_with(db, addr, |_| {}).await
    }

    /// Starts with an adjusted configuration; does not wait for readiness
    /// when TLS is on (the plaintext probe cannot talk to it).
    pub async fn start_with(
        db: String,
        addr: Option<SocketAddr>,
        edit: impl FnOnce(&mut Config),
    ) -> Self {
        let mut cfg = test_config(&db);
        edit(&mut cfg);
        let tls = cfg.tls.cert_path.is_some();
        let listener =
            tokio::net::TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
                .await
                .unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let handle = tokio::spawn(scheduler_svc::server::run(
            cfg,
            test_env(),
            listener,
            async {
                let _ = rx.await;
            },
        ));
        let s = Self {
            addr,
            db,
            stop: Some(tx),
            handle: Some(handle),
        };
        if !tls {
            s.wait_ready().await;
        }
        s
    }

    async fn wait_ready(&self) {
        for _ in 0..100 {
            if self.client(ALICE).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("scheduler did not come up on {}", self.addr);
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self, token: &str) -> Result<Client, fmctl::ClientError> {
        Client::connect(ClientConfig {
            endpoint: self.endpoint(),
            token: Some(token.to_string()),
            ..Default::default()
        })
        .await
    }

    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(self.endpoint())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Stops the server, keeping the database.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
    }

    pub async fn teardown(mut self) {
        self.stop().await;
        drop_db(&self.db).await;
    }

    pub async fn pool(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&db_url(&self.db)).await.unwrap()
    }
}

/// A valid job spec as YAML.
pub const SPEC: &str = r#"
name: qqp
model: roberta-base
dataset: { uri: s3://d/glue/qqp, task: qqp, objective: sequence-classification }
hyperparameters: { global_batch_size: 64, learning_rate: 0.00002, amp: true }
target: { max_epochs: 3, metric: { name: f1, value: 0.88 } }
resources: { min_gpus: 1, max_gpus: 4 }
launch: { command: [python, train.py], env: { A: "1" } }
"#;

pub fn spec() -> fmsched_core::JobSpec {
    fmctl::parse_spec("test", SPEC).unwrap()
}
