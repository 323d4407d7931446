//! A test cluster of the real binaries: a database of its own, a folder
//! for logs and the agents' work, free ports, a `scheduler-svc` and
//! `node-agent`s with fake GPUs, all torn down when dropped (the agents,
//! then the scheduler, then every trainer process the test's agents
//! started, then the folder and the database).
//!
//! ```no_run
//! # async fn demo() {
//! use fmsched_integration::cluster::Cluster;
//! let c = Cluster::builder("fmsched_demo")
//!     .scheduler_env(&[("FMSCHED_SCHEDULING__PROFILING", "false")])
//!     .agent("node-a")
//!     .start()
//!     .await;
//! // c.port: the scheduler's gRPC port; c.dir(): logs and work folders.
//! # }
//! ```
//!
//! The pieces are public too ([`scheduler_command`], [`agent_command`]) for
//! the tests that restart, replace or add processes as they go.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{Proc, TestDb, bin, db_url, fmctl, free_port, wait_for};

/// The admin's API token of every test scheduler.
pub const ROOT: &str = "root-token-0123456789ab";

/// The join token of every test scheduler and agent.
pub const JOIN: &str = "join-token-0123456789abc";

/// The command of a scheduler on the database at `url`, serving on `port`
/// (and `/metrics` on `metrics`). `env` overrides the defaults below:
/// 1 s rounds, and liveness relaxed enough not to flip on a loaded test
/// machine.
pub fn scheduler_command(
    url: &str,
    port: u16,
    metrics: Option<u16>,
    env: &[(&str, &str)],
) -> Command {
    let mut c = Command::new(bin("scheduler-svc"));
    if let Some(m) = metrics {
        c.env("FMSCHED_METRICS_ADDR", format!("127.0.0.1:{m}"));
    }
    c.env("FMSCHED_SCHEDULING__RETRY_BACKOFF", "300ms");
    c.env("FMSCHED_DATABASE_URL", url)
        .env("FMSCHED_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("FMSCHED_API_TOKENS", format!("root={ROOT}"))
        .env("FMSCHED_JOIN_TOKEN", JOIN)
        .env("FMSCHED_AUTH__ADMINS", "root")
        .env("FMSCHED_LIVENESS__HEARTBEAT_INTERVAL", "200ms")
        .env("FMSCHED_LIVENESS__SUSPECT_AFTER", "3s")
        .env("FMSCHED_LIVENESS__OFFLINE_AFTER", "6s")
        .env("FMSCHED_LIVENESS__CHECK_INTERVAL", "100ms")
        .env("FMSCHED_SCHEDULING__INTERVAL", "1s")
        .env("FMSCHED_LEADER_REFRESH", "500ms")
        .env("FMSCHED_LEADER_LEASE", "4s")
        .env("RUST_LOG", "info");
    c.envs(env.iter().copied());
    c
}

/// The command of an agent for node `node` with `gpus` fake GPUs, dialling
/// `endpoints`, working under `dir/<node>` (and `/metrics` on `metrics`).
/// Fake GPUs are A100s unless `env` names another model
/// (`FMSCHED_AGENT_GPU__FAKE_MODEL`). `env` overrides every default below;
/// an empty value unsets it.
pub fn agent_command(
    node: &str,
    endpoints: &str,
    dir: &Path,
    metrics: Option<u16>,
    gpus: u32,
    env: &[(&str, &str)],
) -> Command {
    let mut c = Command::new(bin("node-agent"));
    let model = env
        .iter()
        .find(|e| e.0 == "FMSCHED_AGENT_GPU__FAKE_MODEL")
        .map_or("A100-80GB", |e| e.1);
    if let Some(m) = metrics {
        c.env("FMSCHED_AGENT_METRICS_ADDR", format!("127.0.0.1:{m}"));
    }
    // Every test node runs on this host: peers reach it at 127.0.0.1 (the
    // MASTER_ADDR of a gang whose rank 0 runs there).
    c.env("FMSCHED_AGENT_ADDRESS", "127.0.0.1");
    c.args(["--scheduler", endpoints, "--node-id", node])
        .args(["--fake-gpus", &gpus.to_string(), "--fake-gpu-model", model])
        .env("FMSCHED_JOIN_TOKEN", JOIN)
        // Test trainers run as the test's own user (they are the test's
        // binaries); the tenant tests set processes.run_as instead.
        .env("FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER", "true")
        .env("FMSCHED_AGENT_PROCESSES__WORK_DIR", dir.join(node))
        .env("FMSCHED_AGENT_PROCESSES__GRACE", "3s")
        .env("FMSCHED_AGENT_PROCESSES__CHECKPOINT_TIMEOUT", "3s")
        .env("FMSCHED_AGENT_PROCESSES__CHECKPOINT_INTERVAL", "1s")
        .env("FMSCHED_AGENT_RECONNECT__INITIAL_DELAY", "100ms")
        .env("FMSCHED_AGENT_RECONNECT__MAX_DELAY", "1s")
        .env("RUST_LOG", "info");
    for (k, v) in env {
        if v.is_empty() {
            c.env_remove(k);
        } else {
            c.env(k, v);
        }
    }
    c
}

/// Waits (30 s at most) until a scheduler answers on `port`.
pub fn wait_up(what: &str, port: u16) {
    wait_for(what, Duration::from_secs(30), || {
        fmctl(port, ROOT, &["summary"]).map(|_| ())
    });
}

/// Kills every process whose environment names `needle` (the trainers a
/// test's agents started run in process groups of their own, and a warm
/// process waits for its next task after its agent was killed); returns
/// how many.
pub fn kill_processes_with_env(needle: &str) -> usize {
    let mut killed = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if String::from_utf8_lossy(&env).contains(needle) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            killed += 1;
        }
    }
    killed
}

/// Kills, when dropped (also when the test fails), every process whose
/// environment names its folder ([`kill_processes_with_env`]).
pub struct TrainersOf(String);

impl TrainersOf {
    pub fn new(dir: &Path) -> Self {
        Self(dir.display().to_string())
    }
}

impl Drop for TrainersOf {
    fn drop(&mut self) {
        kill_processes_with_env(&self.0);
    }
}

/// One agent a [`ClusterBuilder`] starts.
struct AgentSpec {
    node: String,
    gpus: u32,
    metrics: bool,
    env: Vec<(String, String)>,
}

/// What a [`Cluster`] starts with; [`ClusterBuilder::start`] starts it.
pub struct ClusterBuilder {
    db: String,
    env: Vec<(String, String)>,
    metrics: bool,
    agents: Vec<AgentSpec>,
}

impl ClusterBuilder {
    /// Scheduler settings over [`scheduler_command`]'s defaults.
    pub fn scheduler_env(mut self, env: &[(&str, &str)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// The scheduler serves `/metrics` ([`Cluster::metrics_port`]).
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// An agent with 4 fake A100s.
    pub fn agent(self, node: &str) -> Self {
        self.agent_with(node, 4, &[])
    }

    /// An agent with `gpus` fake GPUs and `env` over
    /// [`agent_command`]'s defaults.
    pub fn agent_with(mut self, node: &str, gpus: u32, env: &[(&str, &str)]) -> Self {
        self.agents.push(AgentSpec {
            node: node.to_string(),
            gpus,
            metrics: false,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
        self
    }

    /// The last agent added serves `/metrics` ([`Cluster::agent_metrics`]).
    pub fn with_agent_metrics(mut self) -> Self {
        if let Some(a) = self.agents.last_mut() {
            a.metrics = true;
        }
        self
    }

    /// Creates the database and the folder, starts the scheduler and waits
    /// until it answers, then starts the agents (not waiting for them to
    /// register: [`Cluster::wait_nodes`]).
    pub async fn start(self) -> Cluster {
        let db = TestDb::create(&self.db).await;
        let dir = tempfile::tempdir().expect("a test folder");
        let port = free_port();
        let metrics_port = self.metrics.then(free_port);
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let scheduler = Proc::spawn(
            "scheduler",
            scheduler_command(&db_url(&db), port, metrics_port, &env),
            dir.path(),
        );
        wait_up("scheduler up", port);
        let trainers = TrainersOf::new(dir.path());
        let mut c = Cluster {
            agents: Vec::new(),
            scheduler,
            trainers,
            port,
            metrics_port,
            agent_metrics: Vec::new(),
            dir,
            db,
        };
        for a in self.agents {
            let env: Vec<(&str, &str)> = a
                .env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let metrics = a.metrics.then(free_port);
            if let Some(m) = metrics {
                c.agent_metrics.push((a.node.clone(), m));
            }
            c.add_agent(&a.node, a.gpus, metrics, &env);
        }
        c
    }
}

/// A running test cluster (see the module docs). Fields drop in their
/// order: agents, scheduler, trainer processes, folder, database.
pub struct Cluster {
    /// The agents started, in order.
    pub agents: Vec<Proc>,
    pub scheduler: Proc,
    trainers: TrainersOf,
    /// The scheduler's gRPC port.
    pub port: u16,
    /// The scheduler's `/metrics` port, when asked for.
    pub metrics_port: Option<u16>,
    /// (node, port) of the agents that serve `/metrics`.
    pub agent_metrics: Vec<(String, u16)>,
    pub dir: tempfile::TempDir,
    pub db: TestDb,
}

impl Cluster {
    /// A cluster on a database named after `db` (a prefix; each test
    /// gets its own).
    pub fn builder(db: &str) -> ClusterBuilder {
        ClusterBuilder {
            db: db.to_string(),
            env: Vec::new(),
            metrics: false,
            agents: Vec::new(),
        }
    }

    /// The test's folder: process logs (`scheduler.log`, `<node>.log`) and
    /// each agent's work folder (`<node>/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The scheduler's address as an agent dials it.
    pub fn endpoints(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts one more agent (`gpus` fake GPUs, `env` over the defaults).
    pub fn add_agent(
        &mut self,
        node: &str,
        gpus: u32,
        metrics: Option<u16>,
        env: &[(&str, &str)],
    ) -> &mut Proc {
        let cmd = agent_command(node, &self.endpoints(), self.dir(), metrics, gpus, env);
        self.agents.push(Proc::spawn(node, cmd, self.dir.path()));
        self.agents.last_mut().expect("just pushed")
    }

    /// The agent of node `node`.
    pub fn agent(&self, node: &str) -> &Proc {
        self.agents
            .iter()
            .find(|a| a.name == node)
            .unwrap_or_else(|| panic!("no agent {node} in this cluster"))
    }

    /// The agent of node `node`, to kill or restart.
    pub fn agent_mut(&mut self, node: &str) -> &mut Proc {
        self.agents
            .iter_mut()
            .find(|a| a.name == node)
            .unwrap_or_else(|| panic!("no agent {node} in this cluster"))
    }

    /// Waits (20 s at most) until every agent started has registered.
    pub fn wait_nodes(&self) {
        let names: Vec<&str> = self.agents.iter().map(|a| a.name.as_str()).collect();
        wait_for("every node registered", Duration::from_secs(20), || {
            let out = fmctl(self.port, ROOT, &["nodes"])?;
            names
                .iter()
                .all(|n| out.contains(n))
                .then_some(())
                .ok_or(out)
        });
    }

    /// The database's URL.
    pub fn db_url(&self) -> String {
        db_url(&self.db)
    }

    /// Kills every trainer process this cluster's agents started (as
    /// dropping the cluster does); returns how many.
    pub fn kill_trainers(&self) -> usize {
        kill_processes_with_env(&self.trainers.0)
    }
}
