//! Agent configuration: defaults → TOML file → `FMSCHED_AGENT_*` environment
//! → command-line flags → [`AgentConfig::validate`]. The join token is a
//! secret: `FMSCHED_JOIN_TOKEN` or `join_token_file`, never a config value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fmsched_runtime::{Layering, LogConfig};
use serde::Deserialize;

pub const NOT_KEYS: &[&str] = &["FMSCHED_AGENT_CONFIG"];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Scheduler gRPC endpoint, `http://host:port` or `https://host:port`;
    /// several replicas as a comma-separated list (the agent moves to the
    /// next one when a session fails or a standby refuses it).
    pub scheduler_endpoint: String,
    /// Node id (default: the hostname).
    pub node_id: Option<String>,
    /// Address other nodes reach this one at (host name or IP; default: the
    /// hostname): the `MASTER_ADDR` of a job over several nodes whose rank 0
    /// runs here.
    pub address: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// File holding the join token (`FMSCHED_JOIN_TOKEN` wins when set).
    /// Needed to enroll the node; once it holds a node token (below) the
    /// join token may be removed from the host.
    pub join_token_file: Option<PathBuf>,
    /// Where the node's own token is kept (mode 0600): issued by the
    /// scheduler when the node enrolls with the join token, presented on
    /// every registration after. Default: `<processes.work_dir>/node-<node_id>.token`.
    pub node_token_file: Option<PathBuf>,
    /// Heartbeat interval used until the scheduler's acknowledgement says otherwise.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    pub reconnect: ReconnectConfig,
    pub gpu: GpuConfig,
    pub tls: ClientTlsConfig,
    pub log: LogConfig,
    pub processes: ProcessConfig,
    /// Prometheus `/metrics` address (unset = no metrics endpoint).
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// `[processes]`: how training processes are run (docs/trainer-contract.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessConfig {
    /// Each process gets a folder here (checkpoints, logs, report socket).
    pub work_dir: PathBuf,
    /// How long to wait for the checkpoint a suspension asks for.
    #[serde(with = "humantime_serde")]
    pub checkpoint_timeout: Duration,
    /// Seconds between SIGTERM and SIGKILL.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Trainers checkpoint at least this often.
    #[serde(with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// A process's `stdout.log` / `stderr.log` is rotated past this size
    /// (copied to `.1`, older copies shifted, then truncated).
    pub max_log_bytes: u64,
    /// Rotated copies kept per log.
    pub log_files: u32,
    /// At most this many processes wait in standby at once (pipeline-switch
    /// hints, Ymir §6.2); each holds its data loader and weights in host
    /// memory. 0 turns standby off on this node.
    pub max_standby: u32,
    /// Variables of the agent's own environment passed on to trainers,
    /// besides `PATH` and the locale (`driver::BASE_PASS_ENV`): a trainer's
    /// environment is built, never inherited, so no agent secret reaches a
    /// job. A name ending in `*` passes every variable with that prefix
    /// (`NCCL_*`). Names a job may not set (`LD_*`, `FMSCHED_*` …) are
    /// never passed.
    pub pass_env: Vec<String>,
    /// The Unix user trainers run as: a user name or `uid:gid`. The agent
    /// must run as root to switch to it; task folders are handed to it.
    pub run_as: Option<String>,
    /// Lets trainers run as the agent's own user when `run_as` is unset
    /// (root under a dev stack): a job could then read the agent's node
    /// token. For single-user development machines only; off by default,
    /// and an agent without `run_as` refuses to start.
    pub allow_agent_user: bool,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            work_dir: PathBuf::from("/var/lib/fmsched/agent"),
            checkpoint_timeout: Duration::from_secs(120),
            grace: Duration::from_secs(30),
            checkpoint_interval: Duration::from_secs(600),
            max_log_bytes: 64 << 20,
            log_files: 3,
            max_standby: 4,
            pass_env: Vec::new(),
            run_as: None,
            allow_agent_user: false,
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            scheduler_endpoint: "http://127.0.0.1:50051".into(),
            node_id: None,
            address: None,
            labels: BTreeMap::new(),
            join_token_file: None,
            node_token_file: None,
            heartbeat_interval: Duration::from_secs(5),
            reconnect: ReconnectConfig::default(),
            gpu: GpuConfig::default(),
            tls: ClientTlsConfig::default(),
            log: LogConfig::default(),
            processes: ProcessConfig::default(),
            metrics_addr: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconnectConfig {
    /// First retry delay; doubles per failure up to `max_delay`, with jitter.
    #[serde(with = "humantime_serde")]
    pub initial_delay: Duration,
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Drop the session when the scheduler has said nothing (every heartbeat
    /// is acknowledged) for this long, and dial the next endpoint: a frozen
    /// or partitioned leader must not hold its agents. Unset: four heartbeat
    /// intervals, at least 2 s.
    #[serde(with = "humantime_serde")]
    pub silence_timeout: Option<Duration>,
    /// A replica must answer a health check this soon after the connection
    /// opens, or the agent dials the next endpoint: a frozen process whose
    /// kernel still accepts connections answers nothing, and would hold
    /// the agent in its handshake.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// A live replica must acknowledge the registration within this long
    /// (it writes the node to Postgres; after a failover every agent
    /// registers at once, so it is generous).
    #[serde(with = "humantime_serde")]
    pub register_timeout: Duration,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        Self {
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            silence_timeout: None,
            probe_timeout: Duration::from_secs(2),
            register_timeout: Duration::from_secs(30),
        }
    }
}

impl ReconnectConfig {
    /// How long a silent scheduler keeps a session, given the heartbeat
    /// interval in use.
    pub fn silence_after(&self, heartbeat: Duration) -> Duration {
        self.silence_timeout
            .unwrap_or_else(|| (heartbeat * 4).max(Duration::from_secs(2)))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Simulate this many GPUs instead of using NVML (0 = use NVML).
    pub fake_count: u32,
    /// Model the fake GPUs imitate.
    pub fake_model: String,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            fake_count: 0,
            fake_model: "A100-80GB".into(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    /// CA certificate (PEM) that signed the scheduler's certificate.
    pub ca_cert_path: Option<PathBuf>,
    /// Name to verify in the scheduler's certificate (default: endpoint host).
    pub domain_name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config: {0}")]
    Load(#[from] fmsched_runtime::ConfigError),
    #[error("config key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

impl AgentConfig {
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Ok(fmsched_runtime::load_layered(
            file,
            env,
            &Layering {
                env_prefix: "FMSCHED_AGENT",
                not_keys: NOT_KEYS,
                list_keys: &["processes.pass_env"],
                foreign_prefixes: &[],
            },
        )?)
    }

    /// The scheduler endpoints, in order of preference.
    pub fn endpoints(&self) -> Vec<String> {
        self.scheduler_endpoint
            .split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect()
    }

    /// Who trainers run as (`processes.run_as`), checked against who the
    /// agent is (`crate::isolation::trainer_identity`).
    pub fn trainer_identity(&self) -> Result<Option<crate::isolation::RunAs>, ConfigError> {
        crate::isolation::trainer_identity(
            self.processes.run_as.as_deref(),
            self.processes.allow_agent_user,
        )
        .map_err(|message| ConfigError::Invalid {
            key: "processes.run_as",
            message,
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.trainer_identity()?;
        if self.endpoints().is_empty() {
            return Err(ConfigError::Invalid {
                key: "scheduler_endpoint",
                message: "no endpoint given".into(),
            });
        }
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        for ep in self.endpoints() {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return invalid(
                    "scheduler_endpoint",
                    format!("{ep:?} must start with http:// or https://"),
                );
            }
        }
        if let Some(a) = &self.address
            && (a.is_empty()
                || a.len() > 253
                || a.contains(|c: char| c.is_whitespace() || c == '/'))
        {
            return invalid("address", format!("{a:?} is not a host name or IP address"));
        }
        if self.heartbeat_interval.is_zero() {
            return invalid("heartbeat_interval", "must be > 0".into());
        }
        if self.reconnect.initial_delay.is_zero()
            || self.reconnect.max_delay < self.reconnect.initial_delay
        {
            return invalid(
                "reconnect.max_delay",
                "need 0 < initial_delay <= max_delay".into(),
            );
        }
        if let Some(id) = &self.node_id
            && let Err(e) = fmsched_core::NodeId::try_from(id.clone())
        {
            return invalid("node_id", e);
        }
        Ok(())
    }

    /// The node id to register with: configured, else the hostname.
    pub fn resolved_node_id(&self) -> String {
        self.node_id.clone().unwrap_or_else(hostname)
    }

    /// Where the node token is kept (see [`AgentConfig::node_token_file`]).
    pub fn resolved_node_token_file(&self) -> PathBuf {
        self.node_token_file.clone().unwrap_or_else(|| {
            self.processes
                .work_dir
                .join(format!("node-{}.token", self.resolved_node_id()))
        })
    }
}

pub use fmsched_runtime::hostname;

#[cfg(test)]
mod tests {
    use super::*;

    /// The example shipped for operators stays in step with the code.
    #[test]
    fn the_shipped_example_config_parses() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/agent.toml");
        let cfg = AgentConfig::load_from(Some(&path), Vec::new())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(cfg.processes.max_log_bytes, 64 << 20);
        assert_eq!(cfg.processes.log_files, 3);
        assert_eq!(cfg.processes.max_standby, 4);
        assert_eq!(cfg.processes.run_as.as_deref(), Some("fmsched-job"));
        assert_eq!(cfg.processes.pass_env, ["NCCL_*", "HF_HOME"]);
    }

    #[test]
    fn env_layer_and_validation() {
        let cfg = AgentConfig::load_from(
            None,
            vec![
                ("FMSCHED_AGENT_GPU__FAKE_COUNT".to_string(), "4".to_string()),
                (
                    "FMSCHED_AGENT_RECONNECT__MAX_DELAY".to_string(),
                    "3s".to_string(),
                ),
            ],
        )
        .unwrap();
        assert_eq!(cfg.gpu.fake_count, 4);
        assert_eq!(cfg.reconnect.max_delay, Duration::from_secs(3));
        // Trainers would run as the agent's own user: refused by default,
        // naming the key.
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("processes.run_as"), "{e}");
        let cfg = AgentConfig::load_from(
            None,
            vec![
                ("FMSCHED_AGENT_GPU__FAKE_COUNT".to_string(), "4".to_string()),
                (
                    "FMSCHED_AGENT_PROCESSES__ALLOW_AGENT_USER".to_string(),
                    "true".to_string(),
                ),
                (
                    "FMSCHED_AGENT_PROCESSES__PASS_ENV".to_string(),
                    "NCCL_*,HF_HOME".to_string(),
                ),
            ],
        )
        .unwrap();
        assert_eq!(cfg.processes.pass_env, ["NCCL_*", "HF_HOME"]);
        cfg.validate().unwrap();

        let mut bad = cfg.clone();
        bad.scheduler_endpoint = "localhost:50051".into();
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("scheduler_endpoint")
        );
        let mut bad = cfg;
        bad.node_id = Some("no spaces allowed".into());
        assert!(bad.validate().unwrap_err().to_string().contains("node_id"));
        assert!(
            AgentConfig::load_from(None, vec![("FMSCHED_AGENT_TYPO".into(), "1".into())]).is_err()
        );
    }
}
