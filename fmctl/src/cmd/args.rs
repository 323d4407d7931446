//! The command line: every subcommand and its flags, and the config file
//! it reads defaults from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use fmctl::ClientError;
use fmctl::output::Format;
use serde::Deserialize;

#[derive(Subcommand, Debug)]
pub(crate) enum AdminCmd {
    /// No new work starts on the node; what runs there stays.
    Cordon {
        node: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Cordon the node and move its jobs off from their checkpoints; it
    /// then stays empty (`fmctl nodes` shows draining, then drained).
    Drain {
        node: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// The node takes new work again.
    Uncordon { node: String },
    /// Revoke the node's own token and end its agent's session; it is
    /// refused until it enrolls again with the join token (rotate that to
    /// keep a lost or cloned host out).
    RevokeToken {
        node: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Take a running job off its GPUs at the next round, from its
    /// checkpoint; it is then placed again like any queued job (cordon a
    /// node first to move a job off it).
    Requeue {
        job: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Show the policy in force, its knobs and who set them.
    Policy,
    /// Set the policy and its knobs from the next round (persisted;
    /// unnamed knobs take the policy's defaults), e.g. `fmctl admin
    /// set-policy ymir --knob srtf_weight=0`.
    SetPolicy {
        policy: String,
        /// `name=value` (repeatable).
        #[arg(long = "knob", value_name = "NAME=VALUE", value_parser = parse_knob)]
        knobs: Vec<(String, f64)>,
    },
    /// The queues in force, their quotas, and each queue's GPUs and jobs
    /// now (deserved and demanded GPUs as of the scheduler's last round).
    Queues,
    /// Replace the whole queue set from a TOML file of `[[queues]]` tables
    /// (the fields of `[[scheduling.queues]]`, docs/queues.md); validated,
    /// persisted and audited, effective from the next round. Refused when a
    /// live job names a queue the file drops.
    SetQueues {
        /// The TOML file.
        file: std::path::PathBuf,
    },
    /// Inference nodes on loan to training (Lyra), returned ones too.
    Loans,
    /// Lend inference nodes (agent label fmsched.io/pool=inference) to
    /// training from the next round.
    Lend {
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// Ask lent nodes back: name them, or `--count N` chosen to preempt
    /// the fewest jobs. Their workers move off from their checkpoints; each
    /// node is returned once empty (`fmctl admin loans` shows it).
    Reclaim {
        nodes: Vec<String>,
        #[arg(long, conflicts_with = "nodes")]
        count: Option<u32>,
        /// When the inference side needs them, e.g. `5m` (default: the
        /// scheduler's loans.reclaim_deadline).
        #[arg(long, value_parser = parse_duration)]
        deadline: Option<Duration>,
    },
    /// The newest changes admins made.
    Audit {
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

fn parse_knob(s: &str) -> Result<(String, f64), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    let v: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("knob {k}: {v:?} is not a number"))?;
    Ok((k.trim().to_string(), v))
}

/// Command-line client of the fmsched scheduler.
///
/// Endpoint and token come from flags, else FMSCHED_ENDPOINT / FMSCHED_TOKEN,
/// else the config file (~/.config/fmsched/fmctl.toml: endpoint, token, ca_cert).
#[derive(Parser, Debug)]
#[command(version, about)]
pub(crate) struct Cli {
    /// Scheduler endpoint [default: http://127.0.0.1:50051].
    #[arg(long, global = true, env = "FMSCHED_ENDPOINT")]
    pub(crate) endpoint: Option<String>,
    /// API token (prefer the environment variable: flags show up in `ps`).
    #[arg(long, global = true, env = "FMSCHED_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// CA certificate (PEM) for an https:// endpoint.
    #[arg(long, global = true, env = "FMSCHED_CA_CERT")]
    pub(crate) ca_cert: Option<PathBuf>,
    /// Config file [default: ~/.config/fmsched/fmctl.toml].
    #[arg(long, global = true, env = "FMCTL_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value = "table")]
    pub(crate) output: Format,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Submit job specs from YAML files (`-` reads standard input).
    Submit {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Make the submission safe to retry: the same key and spec return
        /// the same job. With several files, `-<n>` is appended per file.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Stream the jobs' events until each is completed, failed or
        /// cancelled (reconnecting if the scheduler goes away for a while).
        /// Exit status: 0 all completed, 3 one failed, 4 one was cancelled
        /// (and none failed), 1 fmctl's own error.
        #[arg(long)]
        wait: bool,
    },
    /// List jobs (newest first).
    Jobs {
        /// Only jobs in this state (repeatable).
        #[arg(long = "state", value_name = "STATE")]
        states: Vec<String>,
        /// Only this owner's jobs (admins only for other users).
        #[arg(long)]
        owner: Option<String>,
        /// At most this many jobs.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Keep showing the list: redrawn in place on a terminal, printed
        /// again when it changed otherwise; Ctrl-C stops.
        #[arg(long, short = 'w')]
        watch: bool,
        /// How often `--watch` asks (e.g. 2s, 500ms).
        #[arg(long, value_parser = parse_duration, default_value = "2s")]
        interval: Duration,
    },
    /// Show one job.
    Job { id: String },
    /// Cancel a job.
    Cancel {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Stream a job's events until it finishes.
    Watch {
        id: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: i64,
    },
    /// Print a job's process output, read from its node through the
    /// scheduler.
    Logs {
        id: String,
        /// Keep streaming new output until the job ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
        /// Start with at most this many bytes from the end (default 64 KiB).
        #[arg(long, default_value_t = 0)]
        tail: u32,
        /// A job over several nodes: the output of the node running this
        /// global rank (default: rank 0's).
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// The output of its profiling run (the short run before it is
        /// scheduled) instead of its training process.
        #[arg(long)]
        profile: bool,
    },
    /// List nodes with their GPUs and live telemetry.
    Nodes {
        /// Only nodes in this state (repeatable): available, suspect, offline.
        #[arg(long = "state", value_name = "STATE")]
        states: Vec<String>,
    },
    /// Show one node.
    Node { id: String },
    /// GPUs and jobs of the whole cluster at a glance.
    Summary,
    /// Operators' controls (an admin's token): cordon, drain and uncordon
    /// nodes, re-queue jobs, read and set the policy live, read the audit
    /// log. Every change is recorded with who made it and acts from the
    /// next scheduling round.
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
    },
    /// Admin: one AutoSched tuning of the active policy's knobs now
    /// (Tiresias, Themis): predicts the next hour from the jobs stored,
    /// searches the knobs in the simulator and adopts the best only when it
    /// beats the active knobs by more than the threshold.
    Tune {
        /// Show the proposal; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Adopt only above this gain (default: the scheduler's
        /// `autosched.threshold`, 1.1).
        #[arg(long)]
        threshold: Option<f64>,
    },
    /// Print a shell completion script, e.g. `fmctl completions bash >
    /// /etc/bash_completion.d/fmctl` or `fmctl completions zsh >
    /// "${fpath[1]}/_fmctl"`.
    Completions { shell: clap_complete::Shell },
    /// Load test: submit M jobs from N concurrent clients and print throughput
    /// and latency; the last line is `submit_per_s=… p50_ms=… p99_ms=…`.
    BenchSubmit {
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        /// Spec to submit (default: a built-in roberta-base job).
        #[arg(long)]
        spec: Option<PathBuf>,
    },
    /// Load test of the agent protocol: N simulated agents (fake GPUs,
    /// simulated training) in this process against a scheduler, M jobs
    /// submitted to them; prints heartbeat and round latency, the
    /// scheduler's CPU and memory, and agents that had to register again.
    /// The last line is `agents=… hb_p99_ms=… round_p99_ms=… …`.
    BenchAgents {
        #[arg(long, default_value_t = 100)]
        agents: usize,
        /// GPUs per simulated node.
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        #[arg(long, default_value = "A100-80GB")]
        gpu_model: String,
        /// Heartbeat interval (e.g. 1s, 500ms).
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        /// Jobs to submit once every agent registered.
        #[arg(long, default_value_t = 0)]
        jobs: usize,
        /// Iterations of each job, and how fast a simulated process makes them.
        #[arg(long, default_value_t = 300)]
        iterations: u64,
        #[arg(long, default_value_t = 100.0)]
        it_per_s: f64,
        /// How long a simulated profiling run takes.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        profile: Duration,
        /// Stop after this long, or once every job completed.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        duration: Duration,
        /// The scheduler's metrics address (host:port of its `/metrics`):
        /// round latency, CPU and memory are read there.
        #[arg(long)]
        scheduler_metrics: Option<String>,
        #[arg(long, env = "FMSCHED_JOIN_TOKEN", hide_env_values = true)]
        join_token: String,
        /// Simulated node ids are `<prefix>-<index>`.
        #[arg(long, default_value = "swarm")]
        prefix: String,
        /// HTTP/2 connections the agents share.
        #[arg(long, default_value_t = 64)]
        connections: usize,
    },
}

/// `1s`, `500ms`, `2.5s`, `1m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((s, "s"), |i| s.split_at(i));
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration like 1s or 500ms"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s:?}: must be > 0"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(crate) endpoint: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) ca_cert: Option<PathBuf>,
}

fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("fmsched").join("fmctl.toml"))
}

pub(crate) fn load_file_config(explicit: Option<&Path>) -> Result<FileConfig, ClientError> {
    let (path, required) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => match default_config_path() {
            Some(p) => (p, false),
            None => return Ok(FileConfig::default()),
        },
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text)
            .map_err(|e| ClientError::Usage(format!("{}: {e}", path.display()))),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(FileConfig::default())
        }
        Err(e) => Err(ClientError::Usage(format!("{}: {e}", path.display()))),
    }
}
