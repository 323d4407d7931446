//! Scheduler configuration, layered: built-in defaults → TOML file →
//! `FMSCHED_*` environment variables (nested keys joined with `__`, e.g.
//! `FMSCHED_LIVENESS__SUSPECT_AFTER=20s`) → [`Config::validate`].
//!
//! Unknown keys are errors. Durations are written like `"120s"` or `"1m 30s"`.
//! Secrets never live in this struct: API tokens and the agent join token are
//! read from the environment or from files named here (see [`crate::auth`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fmsched_core::{Liveness, ModelCatalog, ModelInfo};
use fmsched_runtime::{Layering, LogConfig};
use serde::Deserialize;

/// Variables under `FMSCHED_` that are not scheduler config keys: secrets,
/// the config path, and fmctl's settings (often exported in the same shell).
pub const NOT_CONFIG_KEYS: &[&str] = &[
    "FMSCHED_API_TOKENS",
    "FMSCHED_JOIN_TOKEN",
    "FMSCHED_CONFIG",
    "FMSCHED_ENDPOINT",
    "FMSCHED_TOKEN",
    "FMSCHED_CA_CERT",
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// gRPC listen address.
    pub listen_addr: SocketAddr,
    /// Prometheus `/metrics` address (unset = no metrics endpoint).
    pub metrics_addr: Option<SocketAddr>,
    /// How often a replica renews (or tries to take) the leader lease.
    #[serde(with = "humantime_serde")]
    pub leader_refresh: Duration,
    /// How long a renewal of the leader lease lasts: a leader that stops
    /// renewing (dead, frozen, cut off from Postgres) loses leadership this
    /// long after its last renewal, and a standby takes over.
    #[serde(with = "humantime_serde")]
    pub leader_lease: Duration,
    /// This replica's name in the leader lease; unique among the replicas.
    /// Unset: `<hostname>:<listen port>`. A restarted process of the same
    /// replica takes its old lease over at once.
    pub replica_name: Option<String>,
    /// Postgres URL. Falls back to `DATABASE_URL` when unset.
    pub database_url: Option<String>,
    pub database_max_connections: u32,
    pub log: LogConfig,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    pub liveness: LivenessConfig,
    pub scheduling: SchedulingConfig,
    /// Where estimates come from.
    pub estimates: EstimatesConfig,
    /// Models accepted in addition to the built-in catalog.
    pub extra_models: Vec<ModelInfo>,
    /// AutoSched: re-tune the policy's knobs as the workload drifts.
    pub autosched: AutoschedConfig,
    /// Capacity loaned from the inference pool (Lyra).
    pub loans: LoansConfig,
}

/// `[loans]`: inference nodes (agent label `fmsched.io/pool=inference`)
/// that `AdminService.LoanNodes` may lend to training.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoansConfig {
    /// Share of the inference nodes never lent (rounded up to whole nodes;
    /// Lyra §3.7.1 keeps 2 % for traffic bursts).
    pub headroom: f64,
    /// Deadline of a reclaim that names none.
    #[serde(with = "humantime_serde")]
    pub reclaim_deadline: Duration,
}

impl Default for LoansConfig {
    fn default() -> Self {
        Self {
            headroom: 0.02,
            reclaim_deadline: Duration::from_secs(300),
        }
    }
}

impl LoansConfig {
    /// Inference nodes that must stay unlent, of `inference` nodes.
    pub fn keep(&self, inference: usize) -> usize {
        (self.headroom * inference as f64 - 1e-9).ceil().max(0.0) as usize
    }
}

/// `[autosched]`: the leader re-tunes the active policy's knobs (Tiresias,
/// Themis) every `every` on the workload it predicts for the next hour
/// (`fmsched_sim::tune`, the same code as `fmsim tune`), adopting a configuration
/// only when it beats the active one by more than `threshold`. Adoption
/// goes through the same path as `SetPolicy` (persisted, audited with the
/// actor `autosched`). `AdminService.Tune` runs one tuning on demand, with
/// or without adopting (`fmctl tune --dry-run`), whether or not this is on.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoschedConfig {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    /// Configurations sampled per tuning.
    pub samples: usize,
    /// Adopt only above this ratio (thesis §6.5.2: 1.1).
    pub threshold: f64,
    /// Finished jobs older than this are not learned from.
    #[serde(with = "humantime_serde")]
    pub history: Duration,
}

impl Default for AutoschedConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            every: Duration::from_secs(3600),
            samples: 12,
            threshold: 1.1,
            history: Duration::from_secs(14 * 86_400),
        }
    }
}

/// `[estimates]`: the estimator service the scheduling loop asks for
/// transfer gains and time tables. Unset endpoint, or a service that does
/// not answer within `timeout`: the same estimator code runs in-process
/// with the shipped profiles (logged and counted, never silent).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimatesConfig {
    /// e.g. `http://127.0.0.1:50052`.
    pub endpoint: Option<String>,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for EstimatesConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            timeout: Duration::from_secs(2),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen_addr: "127.0.0.1:50051".parse().expect("valid default address"),
            metrics_addr: None,
            leader_refresh: Duration::from_secs(1),
            leader_lease: Duration::from_secs(10),
            replica_name: None,
            database_url: None,
            database_max_connections: 32,
            log: LogConfig::default(),
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            liveness: LivenessConfig::default(),
            scheduling: SchedulingConfig::default(),
            estimates: EstimatesConfig::default(),
            extra_models: Vec::new(),
            autosched: AutoschedConfig::default(),
            loans: LoansConfig::default(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// File of API tokens, one `USER TOKEN` pair per line (`#` comments).
    /// Tokens may also come from `FMSCHED_API_TOKENS` (`user=token,user=token`).
    pub tokens_file: Option<PathBuf>,
    /// Users with the admin role (see all jobs, cancel any job).
    pub admins: Vec<String>,
    /// File holding the agent join token. `FMSCHED_JOIN_TOKEN` wins when set.
    pub join_token_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain; with `key_path`, switches TLS on.
    pub cert_path: Option<PathBuf>,
    pub key_path: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address. Off by default: an
    /// unencrypted scheduler would leak bearer tokens on the network.
    pub allow_plaintext: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LivenessConfig {
    /// Heartbeat interval the scheduler asks agents to use.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub suspect_after: Duration,
    #[serde(with = "humantime_serde")]
    pub offline_after: Duration,
    /// How often node liveness is re-evaluated.
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    /// How long a new agent session may take to send `Register`.
    #[serde(with = "humantime_serde")]
    pub register_timeout: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(5),
            suspect_after: Duration::from_secs(20),
            offline_after: Duration::from_secs(60),
            check_interval: Duration::from_secs(1),
            register_timeout: Duration::from_secs(10),
        }
    }
}

impl LivenessConfig {
    pub fn rule(&self) -> Liveness {
        Liveness {
            suspect_after: self.suspect_after,
            offline_after: self.offline_after,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulingConfig {
    /// Scheduling round interval; unset: the policy's own, as fmsim runs
    /// it, from Ymir §7.1's settings: Ymir, SRTF, Tiresias and Themis 120 s,
    /// Optimus and Pollux 300 s, FIFO and the deadline policies 60 s
    /// (core/src/policy/README.md). See [`SchedulingConfig::round_interval`].
    #[serde(with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// Rounds on events: a job submitted, or a task that ended (GPUs
    /// freed, a profiling run done), brings the next round forward to now,
    /// at least this long after the last round began
    /// (`fmsched_core::round::round_after_event`; fmsim `--event-gap`).
    /// Unset: a round per interval only. On deadline workloads a round per
    /// minute alone misses short jobs' deadlines (docs/fmsim/deadlines.md).
    #[serde(with = "humantime_serde")]
    pub event_round_gap: Option<Duration>,
    /// Rounds for deadlines: a job with a deadline that would miss it
    /// waiting for the periodic round brings that round forward to now, at
    /// least this long after the last round began
    /// (`fmsched_core::round::round_for_deadline`; fmsim `--deadline-gap`).
    /// Checked on a submission and on a task's end. Other jobs wait for the
    /// periodic round, which finds them together for merging. `0s`: off.
    #[serde(with = "humantime_serde")]
    pub deadline_round_gap: Duration,
    /// Policy deciding every round (`ymir`, `srtf`, `tiresias`, `unisched`,
    /// ...).
    pub policy: String,
    /// The policy's knobs (`name = value`, as `fmsim --knob`), e.g.
    /// `slo_lease_s = 600` for `unisched`; an unknown one is refused at
    /// start-up with the policy's list.
    pub knobs: std::collections::BTreeMap<String, f64>,
    /// Run scheduling rounds (false: the API only, e.g. a read replica).
    pub enabled: bool,
    /// Give each new job a short profiling run (1 GPU, 4 for pipeline jobs)
    /// before it is scheduled; its loss trace and embedding become estimates.
    pub profiling: bool,
    /// The share of the cluster's GPUs profiling runs may take from
    /// training (free GPUs are used first; at least one GPU), in (0, 1].
    pub profiling_share: f64,
    /// Let the policy merge jobs (Ymir's task merger; needs profiling, whose
    /// Task2Vec embeddings give the transfer estimates).
    pub merging: bool,
    /// A job whose training process fails is retried this many times
    /// (resuming from its last checkpoint), then fails.
    pub max_retries: u32,
    /// Wait before a retry; doubles with every retry.
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// Pipeline switch (Ymir §6.2): this long before a round, the next
    /// round's plan is predicted and jobs about to start get a standby
    /// process on their node, so their data loader is ready when the GPUs
    /// free up. Only jobs whose launch sets `prewarm`. `0s` turns it off; at
    /// most half the interval is used.
    #[serde(with = "humantime_serde")]
    pub prewarm_lead: Duration,
    /// What writing and loading a checkpoint costs a (re)started job; with
    /// the model's context switch it is the restart cost every policy
    /// weighs (the same rule as `fmsim --checkpoint-s`).
    #[serde(with = "humantime_serde")]
    pub checkpoint_cost: Duration,
    /// A job's context switch (process start, weights, data loader); unset:
    /// the throughput profile's for its model and GPU type (as fmsim's
    /// default; `fmsim --context-switch-s` overrides it the same way).
    #[serde(with = "humantime_serde")]
    pub context_switch: Option<Duration>,
    /// Most nodes one job (or merged pair) trains on at once; 0 = no limit.
    /// A job over several nodes is a gang: one process per node with
    /// torchrun's rank variables, all started together
    /// (docs/trainer-contract.md). 1 keeps every job on one node.
    pub max_nodes_per_job: u32,
    /// Rendezvous ports (`MASTER_PORT`) handed to jobs over several nodes,
    /// `first-last` inclusive: one per run of a gang, unique per host, and
    /// never one the plan in force holds or a rank-0 process its agent
    /// reports alive still holds (round/gangs.rs).
    pub gang_ports: String,
    /// Queues with quotas (`[[scheduling.queues]]`: name, parent,
    /// guaranteed_gpus, over_quota_weight, limit_gpus, models, users,
    /// merge_across_queues; docs/queues.md). None: one implicit queue.
    pub queues: Vec<fmsched_core::queue::QueueSpec>,
    /// Most tuned prompts the Prompt Bank keeps per model (PromptTuner
    /// §4.4.3.3): past it, the member nearest its cluster's medoid is
    /// evicted.
    pub prompt_bank_cap: usize,
    /// PromptTuner's lane (thesis 004 §4.4.4): prompt-tuning jobs are
    /// started within ~50 ms of arriving by their own decision loop
    /// (Algorithms 1 and 2 over warm per-model pools and the cold GPUs the
    /// round's plan leaves free), on warm processes where one waits; the
    /// round never starts, moves or suspends them. `false`: the round
    /// schedules them like any job, and every start is cold.
    pub prompt_lane: bool,
    /// A warm process (a finished prompt-tuning job's process kept with its
    /// model loaded) idle this long is stopped and its GPUs go back to the
    /// cold pool (§4.6.3.3: 60 s).
    #[serde(with = "humantime_serde")]
    pub prompt_warm_idle_release: Duration,
}

impl SchedulingConfig {
    /// The configured queues, validated (start-up refuses a bad set).
    pub fn queue_set(&self) -> Result<fmsched_core::queue::Queues, String> {
        fmsched_core::queue::Queues::new(self.queues.clone())
    }
}

impl SchedulingConfig {
    /// The `gang_ports` range (validated at start-up).
    pub fn gang_port_range(&self) -> Result<std::ops::RangeInclusive<u16>, String> {
        let (a, b) = self
            .gang_ports
            .split_once('-')
            .ok_or_else(|| format!("{:?} is not first-last", self.gang_ports))?;
        let parse = |x: &str| {
            x.trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("{x:?} is not a port"))
        };
        let (a, b) = (parse(a)?, parse(b)?);
        if a > b {
            return Err(format!("{a} > {b}"));
        }
        Ok(a..=b)
    }

    /// The policy with its knobs.
    pub fn build_policy(
        &self,
    ) -> Result<Box<dyn fmsched_core::policy::Policy + Send + Sync>, String> {
        fmsched_core::policy::with_knobs(&self.policy, &self.knobs)
    }

    /// These settings with the policy an admin set live (`AdminService`):
    /// its policy and knobs replace `policy` and `knobs`; its `interval_s`
    /// knob, when given, replaces `interval` (else `interval`, if set, still
    /// pins the cadence).
    pub fn with_setting(&self, setting: Option<&crate::persistence::PolicySetting>) -> Self {
        let mut out = self.clone();
        if let Some(s) = setting {
            out.policy = s.policy.clone();
            out.knobs = s.knobs.clone();
            if let Some(&i) = s.knobs.get("interval_s") {
                out.interval = Some(Duration::from_secs_f64(i.max(0.0)));
            }
        }
        out
    }

    /// The interval rounds run at: `interval` if set, else the policy's own.
    pub fn round_interval(&self) -> Duration {
        self.interval.unwrap_or_else(|| {
            self.build_policy().map_or(Duration::from_secs(120), |p| {
                Duration::from_secs_f64(p.interval_s())
            })
        })
    }

    /// The look-ahead actually used: `prewarm_lead`, at most half the
    /// interval (a prediction made earlier than that is mostly stale).
    pub fn effective_prewarm_lead(&self) -> Duration {
        self.prewarm_lead.min(self.round_interval() / 2)
    }
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            interval: None,
            event_round_gap: None,
            deadline_round_gap: Duration::from_secs(5),
            policy: "ymir".into(),
            knobs: Default::default(),
            enabled: true,
            profiling: true,
            profiling_share: fmsched_core::round::DEFAULT_PROFILING_SHARE,
            merging: true,
            max_retries: 3,
            retry_backoff: Duration::from_secs(30),
            prewarm_lead: Duration::from_secs(30),
            checkpoint_cost: Duration::from_secs(30),
            context_switch: None,
            max_nodes_per_job: 0,
            gang_ports: "29500-29999".into(),
            queues: Vec::new(),
            prompt_bank_cap: 3000,
            prompt_lane: true,
            prompt_warm_idle_release: Duration::from_secs(60),
        }
    }
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config: {0}")]
    Load(#[from] fmsched_runtime::ConfigError),
    #[error("config key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

impl Config {
    /// Loads defaults → `file` (if given) → environment, then validates.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, std::env::vars())
    }

    /// Same as [`Config::load`] with an explicit environment (for tests).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let cfg: Config = fmsched_runtime::load_layered(
            file,
            env,
            &Layering {
                env_prefix: "FMSCHED",
                not_keys: NOT_CONFIG_KEYS,
                list_keys: &["auth.admins"],
                foreign_prefixes: &["FMSCHED_AGENT_", "FMSCHED_ESTIMATOR_"],
            },
        )?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let a = &self.autosched;
        if a.every < Duration::from_secs(1) {
            return Err(invalid("autosched.every", "must be at least 1s"));
        }
        if a.samples == 0 || a.samples > 1000 {
            return Err(invalid("autosched.samples", "must be in 1..=1000"));
        }
        if !(a.threshold.is_finite() && a.threshold >= 1.0) {
            return Err(invalid("autosched.threshold", "must be at least 1"));
        }
        if a.history < Duration::from_secs(3600) {
            return Err(invalid("autosched.history", "must be at least 1h"));
        }
        if !(0.0..1.0).contains(&self.loans.headroom) {
            return Err(invalid("loans.headroom", "must be in [0, 1)"));
        }
        if self.loans.reclaim_deadline < Duration::from_secs(1) {
            return Err(invalid("loans.reclaim_deadline", "must be at least 1s"));
        }
        let l = &self.liveness;
        if l.heartbeat_interval.is_zero() {
            return Err(invalid("liveness.heartbeat_interval", "must be > 0"));
        }
        if l.suspect_after <= l.heartbeat_interval {
            return Err(invalid(
                "liveness.suspect_after",
                format!(
                    "must exceed liveness.heartbeat_interval ({:?} <= {:?})",
                    l.suspect_after, l.heartbeat_interval
                ),
            ));
        }
        if l.offline_after <= l.suspect_after {
            return Err(invalid(
                "liveness.offline_after",
                "must exceed liveness.suspect_after",
            ));
        }
        if l.check_interval.is_zero() {
            return Err(invalid("liveness.check_interval", "must be > 0"));
        }
        if fmsched_core::policy::by_name(&self.scheduling.policy).is_none() {
            return Err(invalid(
                "scheduling.policy",
                format!(
                    "unknown policy {:?}; expected one of {}",
                    self.scheduling.policy,
                    fmsched_core::policy::POLICY_NAMES.join(", ")
                ),
            ));
        }
        if let Err(e) = self.scheduling.build_policy() {
            return Err(invalid("scheduling.knobs", e));
        }
        if self.leader_refresh.is_zero() || self.leader_refresh * 2 > self.leader_lease {
            return Err(invalid(
                "leader_lease",
                format!(
                    "must be at least twice leader_refresh ({:?} vs {:?}): a leader renews it several times before it lapses",
                    self.leader_lease, self.leader_refresh
                ),
            ));
        }
        let share = self.scheduling.profiling_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err(invalid(
                "scheduling.profiling_share",
                format!("{share} is not in (0, 1]"),
            ));
        }
        if let Err(e) = self.scheduling.queue_set() {
            return Err(invalid("scheduling.queues", e));
        }
        if let Err(e) = self.scheduling.gang_port_range() {
            return Err(invalid("scheduling.gang_ports", e));
        }
        if self.scheduling.prompt_bank_cap == 0 {
            return Err(invalid("scheduling.prompt_bank_cap", "must be >= 1"));
        }
        if self.scheduling.prompt_warm_idle_release < Duration::from_secs(1) {
            return Err(invalid(
                "scheduling.prompt_warm_idle_release",
                "must be >= 1s",
            ));
        }
        if self.scheduling.round_interval() < Duration::from_millis(100) {
            return Err(invalid("scheduling.interval", "must be >= 100ms"));
        }
        if self
            .scheduling
            .event_round_gap
            .is_some_and(|g| g < Duration::from_millis(100))
        {
            return Err(invalid(
                "scheduling.event_round_gap",
                "must be >= 100ms (unset: a round per interval only)",
            ));
        }
        let g = self.scheduling.deadline_round_gap;
        if !g.is_zero() && g < Duration::from_millis(100) {
            return Err(invalid(
                "scheduling.deadline_round_gap",
                "must be 0s (off) or >= 100ms",
            ));
        }
        if self.database_max_connections == 0 {
            return Err(invalid("database_max_connections", "must be >= 1"));
        }
        if self.tls.cert_path.is_some() != self.tls.key_path.is_some() {
            return Err(invalid(
                "tls.key_path",
                "tls.cert_path and tls.key_path go together",
            ));
        }
        if self.tls.cert_path.is_none()
            && !self.listen_addr.ip().is_loopback()
            && !self.tls.allow_plaintext
        {
            return Err(invalid(
                "tls.allow_plaintext",
                format!(
                    "refusing to serve plaintext on non-loopback {}: set tls.cert_path/tls.key_path, \
                     or tls.allow_plaintext = true if a proxy terminates TLS",
                    self.listen_addr
                ),
            ));
        }
        for m in &self.extra_models {
            if m.name.trim().is_empty() || m.layers == 0 {
                return Err(invalid(
                    "extra_models",
                    format!("model {:?} needs a name and layers > 0", m.name),
                ));
            }
            if (m.experts == 0) != (m.top_k == 0) || m.top_k > m.experts {
                return Err(invalid(
                    "extra_models",
                    format!(
                        "model {:?}: an MoE model needs experts > 0 and 1 <= top_k <= experts (a dense one neither)",
                        m.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The name this replica holds the leader lease under.
    pub fn replica_name(&self) -> String {
        self.replica_name.clone().unwrap_or_else(|| {
            format!(
                "{}:{}",
                fmsched_runtime::hostname(),
                self.listen_addr.port()
            )
        })
    }

    pub fn database_url(&self) -> Result<String, ConfigError> {
        self.database_url
            .clone()
            .or_else(|| std::env::var("DATABASE_URL").ok())
            .ok_or_else(|| {
                invalid(
                    "database_url",
                    "not set (config file, FMSCHED_DATABASE_URL or DATABASE_URL)",
                )
            })
    }

    pub fn model_catalog(&self) -> ModelCatalog {
        let mut c = ModelCatalog::builtin();
        for m in &self.extra_models {
            c.insert(m.clone());
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_apply_in_order() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            f,
            "listen_addr = \"127.0.0.1:6000\"\n[liveness]\nsuspect_after = \"30s\"\noffline_after = \"2m\"\n[scheduling]\ninterval = \"90s\""
        )
        .unwrap();
        let cfg = Config::load_from(
            Some(f.path()),
            env(&[
                ("FMSCHED_SCHEDULING__INTERVAL", "45s"),
                ("FMSCHED_AUTH__ADMINS", "alice,bob"),
                ("FMSCHED_JOIN_TOKEN", "secret-is-not-a-key"),
                ("FMSCHED_TOKEN", "fmctl-token-is-not-a-key"),
                ("FMSCHED_AGENT_GPU__FAKE_COUNT", "4"),
                ("OTHER", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.listen_addr.port(), 6000);
        assert_eq!(cfg.liveness.suspect_after, Duration::from_secs(30));
        assert_eq!(cfg.liveness.offline_after, Duration::from_secs(120));
        assert_eq!(
            cfg.scheduling.round_interval(),
            Duration::from_secs(45),
            "env beats file"
        );
        assert_eq!(
            cfg.auth.admins,
            vec!["alice".to_string(), "bob".to_string()]
        );
        // The replica's name in the lease: host and port unless named.
        assert!(
            cfg.replica_name().ends_with(":6000"),
            "{}",
            cfg.replica_name()
        );
    }

    /// Rounds on events are off unless `event_round_gap` is set; a gap
    /// under 100 ms is refused naming the key.
    #[test]
    fn the_event_round_gap_is_off_by_default_and_checked() {
        let load = |v: &[(&str, &str)]| Config::load_from(None, env(v));
        assert_eq!(load(&[]).unwrap().scheduling.event_round_gap, None);
        let on = load(&[("FMSCHED_SCHEDULING__EVENT_ROUND_GAP", "5s")]).unwrap();
        assert_eq!(on.scheduling.event_round_gap, Some(Duration::from_secs(5)));
        let e = load(&[("FMSCHED_SCHEDULING__EVENT_ROUND_GAP", "10ms")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("scheduling.event_round_gap"), "{e}");
    }

    /// Rounds for deadlines are on (5 s) unless `deadline_round_gap` is
    /// `0s`; a gap under 100 ms is refused naming the key.
    #[test]
    fn the_deadline_round_gap_is_on_by_default_and_checked() {
        let load = |v: &[(&str, &str)]| Config::load_from(None, env(v));
        let gap = |c: Config| c.scheduling.deadline_round_gap;
        assert_eq!(gap(load(&[]).unwrap()), Duration::from_secs(5));
        let off = load(&[("FMSCHED_SCHEDULING__DEADLINE_ROUND_GAP", "0s")]).unwrap();
        assert_eq!(gap(off), Duration::ZERO);
        let e = load(&[("FMSCHED_SCHEDULING__DEADLINE_ROUND_GAP", "10ms")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("scheduling.deadline_round_gap"), "{e}");
    }

    /// Without `interval` rounds run at the policy's own interval.
    #[test]
    fn the_round_interval_defaults_to_the_policys() {
        let interval = |policy: &str| {
            Config::load_from(None, env(&[("FMSCHED_SCHEDULING__POLICY", policy)]))
                .unwrap()
                .scheduling
                .round_interval()
        };
        assert_eq!(interval("ymir"), Duration::from_secs(120));
        // Ymir §7.1's settings (core/src/policy/README.md).
        assert_eq!(interval("themis"), Duration::from_secs(120));
        assert_eq!(interval("tiresias"), Duration::from_secs(120));
        assert_eq!(interval("pollux"), Duration::from_secs(300));
        assert_eq!(interval("unisched"), Duration::from_secs(60));
    }

    /// The profiling share is a fraction in (0, 1]; anything else is
    /// refused naming the key.
    #[test]
    fn the_profiling_share_is_a_fraction() {
        let load = |v: &str| {
            Config::load_from(None, env(&[("FMSCHED_SCHEDULING__PROFILING_SHARE", v)]))
                .map(|c| c.scheduling.profiling_share)
                .map_err(|e| e.to_string())
        };
        assert_eq!(load("0.25").unwrap(), 0.25);
        for bad in ["0", "1.5", "-0.1"] {
            let e = load(bad).unwrap_err();
            assert!(e.contains("scheduling.profiling_share"), "{e}");
        }
    }

    /// The prompt lane is on by default with PromptTuner's 60 s idle
    /// release; a release under a second is refused naming the key.
    #[test]
    fn the_prompt_lane_defaults_and_its_idle_release_is_checked() {
        let load = |v: &[(&str, &str)]| {
            Config::load_from(None, env(v))
                .map(|c| {
                    (
                        c.scheduling.prompt_lane,
                        c.scheduling.prompt_warm_idle_release,
                    )
                })
                .map_err(|e| e.to_string())
        };
        assert_eq!(load(&[]).unwrap(), (true, Duration::from_secs(60)));
        assert_eq!(
            load(&[
                ("FMSCHED_SCHEDULING__PROMPT_LANE", "false"),
                ("FMSCHED_SCHEDULING__PROMPT_WARM_IDLE_RELEASE", "5s"),
            ])
            .unwrap(),
            (false, Duration::from_secs(5))
        );
        let e = load(&[("FMSCHED_SCHEDULING__PROMPT_WARM_IDLE_RELEASE", "100ms")]).unwrap_err();
        assert!(e.contains("scheduling.prompt_warm_idle_release"), "{e}");
    }

    /// `[[scheduling.queues]]` from the config file are validated at
    /// start-up, a bad set refused naming the key, the queue and the field.
    #[test]
    fn queues_come_from_the_config_file_and_a_bad_set_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let load = |toml: &str| {
            let f = dir.path().join("s.toml");
            std::fs::write(&f, toml).unwrap();
            Config::load_from(Some(f.as_path()), env(&[])).map_err(|e| e.to_string())
        };
        let c =
            load("[[scheduling.queues]]\nname = \"a\"\nguaranteed_gpus = 2\nusers = [\"alice\"]\n")
                .unwrap();
        let q = c.scheduling.queue_set().unwrap();
        assert_eq!(q.specs()[0].guaranteed_gpus, 2);
        let e = load("[[scheduling.queues]]\nname = \"a\"\nguaranteed_gpus = 4\nlimit_gpus = 2\n")
            .unwrap_err();
        assert!(
            e.contains("scheduling.queues") && e.contains("queues[0].limit_gpus"),
            "{e}"
        );
    }

    /// `[loans]`: the headroom keeps whole inference nodes back (rounded
    /// up), and values out of range are refused naming the key.
    #[test]
    fn lyra_loans_headroom_rounds_up_to_whole_nodes_and_is_checked() {
        let cfg = Config::load_from(None, env(&[])).unwrap();
        assert_eq!(cfg.loans.headroom, 0.02);
        assert_eq!(cfg.loans.keep(0), 0);
        assert_eq!(cfg.loans.keep(2), 1, "2 % of 2 nodes is one whole node");
        assert_eq!(cfg.loans.keep(50), 1);
        assert_eq!(cfg.loans.keep(51), 2);
        let zero = Config::load_from(None, env(&[("FMSCHED_LOANS__HEADROOM", "0")])).unwrap();
        assert_eq!(zero.loans.keep(8), 0);
        for (k, v) in [
            ("FMSCHED_LOANS__HEADROOM", "1"),
            ("FMSCHED_LOANS__RECLAIM_DEADLINE", "0s"),
        ] {
            let e = Config::load_from(None, env(&[(k, v)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("loans."), "{k}: {e}");
        }
    }

    /// A policy set through the admin API replaces the configured policy
    /// and knobs; the configured interval still paces rounds unless the
    /// setting names `interval_s`.
    #[test]
    fn a_live_policy_setting_replaces_the_configured_one() {
        let cfg = Config::load_from(
            None,
            env(&[
                ("FMSCHED_SCHEDULING__POLICY", "ymir"),
                ("FMSCHED_SCHEDULING__INTERVAL", "30s"),
                ("FMSCHED_SCHEDULING__KNOBS__SRTF_WEIGHT", "0.5"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.scheduling.with_setting(None), cfg.scheduling);
        let mut set = crate::persistence::PolicySetting {
            policy: "tiresias".into(),
            knobs: [("starvation_factor".to_string(), 4.0)]
                .into_iter()
                .collect(),
            set_by: "root".into(),
            set_at: chrono::Utc::now(),
        };
        let s = cfg.scheduling.with_setting(Some(&set));
        assert_eq!(s.policy, "tiresias");
        assert_eq!(s.knobs, set.knobs, "ymir's srtf_weight is gone");
        assert!(s.build_policy().is_ok());
        assert_eq!(s.round_interval(), Duration::from_secs(30));
        set.knobs.insert("interval_s".into(), 5.0);
        let s = cfg.scheduling.with_setting(Some(&set));
        assert_eq!(s.round_interval(), Duration::from_secs(5));
    }

    /// `[autosched]` is off by default, hourly when on, and a bad value is
    /// refused at start-up naming it.
    #[test]
    fn autosched_settings_are_checked() {
        let cfg = Config::load_from(None, env(&[])).unwrap();
        assert!(!cfg.autosched.enabled);
        assert_eq!(cfg.autosched.every, Duration::from_secs(3600));
        let cfg = Config::load_from(
            None,
            env(&[
                ("FMSCHED_AUTOSCHED__ENABLED", "true"),
                ("FMSCHED_AUTOSCHED__EVERY", "30m"),
                ("FMSCHED_AUTOSCHED__THRESHOLD", "1.2"),
            ]),
        )
        .unwrap();
        assert!(cfg.autosched.enabled);
        assert_eq!(cfg.autosched.every, Duration::from_secs(1800));
        assert_eq!(cfg.autosched.threshold, 1.2);
        for (key, value, field) in [
            ("FMSCHED_AUTOSCHED__THRESHOLD", "0.9", "autosched.threshold"),
            ("FMSCHED_AUTOSCHED__SAMPLES", "0", "autosched.samples"),
            ("FMSCHED_AUTOSCHED__EVERY", "0s", "autosched.every"),
            ("FMSCHED_AUTOSCHED__HISTORY", "10m", "autosched.history"),
        ] {
            let e = Config::load_from(None, env(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{key}={value}: {e}");
        }
    }

    /// `scheduling.knobs` reach the policy; one it does not have is refused
    /// at start-up naming the field and listing the policy's.
    #[test]
    fn policy_knobs_act_or_are_refused() {
        let cfg = Config::load_from(
            None,
            env(&[
                ("FMSCHED_SCHEDULING__POLICY", "unisched"),
                ("FMSCHED_SCHEDULING__KNOBS__INTERVAL_S", "30"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.scheduling.round_interval(), Duration::from_secs(30));
        let e = Config::load_from(
            None,
            env(&[
                ("FMSCHED_SCHEDULING__POLICY", "srtf"),
                ("FMSCHED_SCHEDULING__KNOBS__SLO_LEASE_S", "60"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("scheduling.knobs") && e.contains("slo_lease_s") && e.contains("interval_s"),
            "{e}"
        );
    }

    /// The example shipped for operators stays in step with the code.
    #[test]
    fn the_shipped_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/scheduler.toml");
        let cfg = Config::load_from(
            Some(&path),
            env(&[("FMSCHED_JOIN_TOKEN", "join-token-0123456789abc")]),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(cfg.scheduling.merging && cfg.scheduling.profiling);
        assert_eq!(cfg.scheduling.policy, "ymir");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[liveness]\nsuspect_afterr = \"30s\"").unwrap();
        let e = Config::load_from(Some(f.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("suspect_afterr"), "{e}");
        let e = Config::load_from(None, env(&[("FMSCHED_NOT_A_KEY", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not_a_key"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = Config::load_from(None, env(&[("FMSCHED_LIVENESS__OFFLINE_AFTER", "5s")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("liveness.offline_after"), "{e}");
        let e = Config::load_from(None, env(&[("FMSCHED_SCHEDULING__INTERVAL", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("interval"), "{e}");
        let e = Config::load_from(None, env(&[("FMSCHED_LISTEN_ADDR", "0.0.0.0:50051")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.allow_plaintext"), "{e}");
        // A lease the leader could not renew twice before it lapses.
        let e = Config::load_from(
            None,
            env(&[
                ("FMSCHED_LEADER_LEASE", "1500ms"),
                ("FMSCHED_LEADER_REFRESH", "1s"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("leader_lease"), "{e}");
    }
}
