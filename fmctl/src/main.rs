//! `fmctl`: submit, inspect, watch and cancel fine-tuning jobs; inspect nodes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use fmctl::output::{self, Format};
use fmctl::{Client, ClientConfig, ClientError, JobFilter, percentile};
use fmsched_core::{JobState, NodeState};
use fmsched_proto::convert::job_state_from_proto;
use fmsched_proto::v1 as pb;
use serde::Deserialize;

#[derive(Subcommand, Debug)]
enum AdminCmd {
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
struct Cli {
    /// Scheduler endpoint [default: http://127.0.0.1:50051].
    #[arg(long, global = true, env = "FMSCHED_ENDPOINT")]
    endpoint: Option<String>,
    /// API token (prefer the environment variable: flags show up in `ps`).
    #[arg(long, global = true, env = "FMSCHED_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) for an https:// endpoint.
    #[arg(long, global = true, env = "FMSCHED_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Config file [default: ~/.config/fmsched/fmctl.toml].
    #[arg(long, global = true, env = "FMCTL_CONFIG")]
    config: Option<PathBuf>,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value = "table")]
    output: Format,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
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
struct FileConfig {
    endpoint: Option<String>,
    token: Option<String>,
    ca_cert: Option<PathBuf>,
}

fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("fmsched").join("fmctl.toml"))
}

fn load_file_config(explicit: Option<&Path>) -> Result<FileConfig, ClientError> {
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

const BENCH_SPEC: &str = r#"
name: bench
model: roberta-base
dataset: { uri: s3://bench/glue/sst2, task: sst2, objective: sequence-classification }
hyperparameters: { global_batch_size: 32, learning_rate: 0.00002 }
target: { max_epochs: 3 }
resources: { min_gpus: 1, max_gpus: 4 }
launch: { command: [python, train.py] }
"#;

/// `submit --wait`'s exit status when a job failed.
const EXIT_FAILED: u8 = 3;
/// `submit --wait`'s exit status when a job was cancelled (and none failed).
const EXIT_CANCELLED: u8 = 4;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Completions { shell } = cli.cmd {
        use clap::CommandFactory as _;
        clap_complete::generate(shell, &mut Cli::command(), "fmctl", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("fmctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_states<T: std::str::FromStr<Err = String>>(raw: &[String]) -> Result<Vec<T>, ClientError> {
    raw.iter()
        .map(|s| s.parse().map_err(ClientError::Usage))
        .collect()
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

async fn run(cli: Cli) -> Result<u8, ClientError> {
    let file = load_file_config(cli.config.as_deref())?;
    let cfg = ClientConfig {
        endpoint: cli
            .endpoint
            .or(file.endpoint)
            .unwrap_or_else(|| ClientConfig::default().endpoint),
        token: cli.token.or(file.token),
        ca_cert: cli.ca_cert.or(file.ca_cert),
        ..Default::default()
    };
    if cfg.token.is_none() {
        return Err(ClientError::Usage(
            "no API token: pass --token, set FMSCHED_TOKEN, or put `token = \"...\"` in the fmctl config file".into(),
        ));
    }
    let fmt = cli.output;
    if let Cmd::BenchSubmit {
        clients,
        jobs,
        spec,
    } = cli.cmd
    {
        return bench_submit(cfg, clients, jobs, spec.as_deref())
            .await
            .map(|()| 0);
    }
    if let Cmd::BenchAgents {
        agents,
        gpus,
        gpu_model,
        interval,
        jobs,
        iterations,
        it_per_s,
        profile,
        duration,
        scheduler_metrics,
        join_token,
        prefix,
        connections,
    } = cli.cmd
    {
        let swarm = fmctl::swarm::SwarmConfig {
            endpoint: cfg.endpoint.clone(),
            join_token,
            agents,
            gpus,
            gpu_model,
            interval,
            prefix,
            profile_s: profile.as_secs_f64(),
            it_per_s,
            connections,
        };
        return bench_agents(cfg, swarm, jobs, iterations, duration, scheduler_metrics)
            .await
            .map(|()| 0);
    }
    let client = Client::connect(cfg).await?;
    match cli.cmd {
        Cmd::Submit {
            files,
            idempotency_key,
            wait,
        } => {
            let specs = files
                .iter()
                .map(|f| fmctl::load_spec(f))
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = Vec::new();
            let mut submitted = Vec::new();
            for (i, spec) in specs.iter().enumerate() {
                let key = idempotency_key.as_ref().map(|k| {
                    if specs.len() > 1 {
                        format!("{k}-{}", i + 1)
                    } else {
                        k.clone()
                    }
                });
                let fmctl::Submitted {
                    job,
                    created,
                    warnings,
                } = client
                    .submit_with_warnings(spec, key.as_deref())
                    .await
                    .map_err(|e| match e {
                        ClientError::Rpc { code, message } => ClientError::Rpc {
                            code,
                            message: format!("{}: {message}", files[i].display()),
                        },
                        other => other,
                    })?;
                for w in &warnings {
                    eprintln!("warning: {}: job {}: {w}", files[i].display(), job.id);
                }
                submitted.push((spec.name.clone(), job.id.clone()));
                match fmt {
                    Format::Table => println!(
                        "{} {} ({} on {})",
                        if created {
                            "submitted"
                        } else {
                            "already submitted"
                        },
                        job.id,
                        spec.name,
                        spec.model
                    ),
                    Format::Json => out.push(
                        serde_json::json!({"created": created, "warnings": warnings, "job": output::job_json(&job)}),
                    ),
                }
            }
            if fmt == Format::Json {
                print_json(&serde_json::Value::Array(out));
            }
            if wait {
                return wait_for(&client, submitted, fmt).await;
            }
        }
        Cmd::Jobs {
            states,
            owner,
            limit,
            watch,
            interval,
        } => {
            let filter = JobFilter {
                states: parse_states(&states)?,
                owner,
                ..Default::default()
            };
            let render = |all: &[pb::Job]| match fmt {
                Format::Table => output::jobs_table(all),
                Format::Json => {
                    serde_json::Value::Array(all.iter().map(output::job_json).collect()).to_string()
                }
            };
            if !watch {
                let all = list_jobs(&client, &filter, limit).await?;
                match fmt {
                    Format::Table => println!("{}", render(&all)),
                    Format::Json => print_json(&serde_json::Value::Array(
                        all.iter().map(output::job_json).collect(),
                    )),
                }
                return Ok(0);
            }
            watch_jobs(&client, &filter, limit, interval, render).await?;
        }
        Cmd::Job { id } => {
            let job = client.get_job(&id).await?;
            match fmt {
                Format::Table => {
                    let history = client.job_history(&job).await?;
                    println!("{}", output::job_detail(&job, &history));
                }
                Format::Json => print_json(&output::job_json(&job)),
            }
        }
        Cmd::Cancel { id, reason } => {
            let job = client.cancel_job(&id, &reason).await?;
            match fmt {
                Format::Table => println!("{} {}", job.id, output::job_state(job.state)),
                Format::Json => print_json(&output::job_json(&job)),
            }
        }
        Cmd::Watch { id, after } => {
            let mut stream = client.watch_job(&id, after).await?;
            while let Some(ev) = stream.message().await? {
                match fmt {
                    Format::Table => println!("{}", output::event_line(&ev)),
                    Format::Json => println!("{}", output::event_json(&ev)),
                }
            }
        }
        Cmd::Logs {
            id,
            follow,
            stderr,
            tail,
            rank,
            profile,
        } => {
            use std::io::Write as _;
            let mut stream = client
                .job_logs(pb::GetJobLogsRequest {
                    job_id: id.clone(),
                    stderr,
                    follow,
                    tail_bytes: tail,
                    rank,
                    profile,
                })
                .await?;
            let mut out = std::io::stdout().lock();
            let mut source: Option<(String, String)> = None;
            while let Some(chunk) = stream.message().await? {
                // Following a job that moved (another node or process): say
                // so on stderr, the log itself stays on stdout.
                let here = (chunk.node_id.clone(), chunk.task_id.clone());
                if source.as_ref().is_some_and(|s| *s != here) {
                    eprintln!("--- now node {}, process {} ---", here.0, here.1);
                }
                source = Some(here);
                // A closed pipe (`| head`) ends the command quietly.
                if out
                    .write_all(&chunk.data)
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    break;
                }
            }
        }
        Cmd::Nodes { states } => {
            let states: Vec<NodeState> = parse_states(&states)?;
            let nodes = client.list_nodes(&states).await?;
            match fmt {
                Format::Table => println!("{}", output::nodes_table(&nodes)),
                Format::Json => print_json(&serde_json::Value::Array(
                    nodes.iter().map(output::node_json).collect(),
                )),
            }
        }
        Cmd::Node { id } => {
            let node = client.get_node(&id).await?;
            match fmt {
                Format::Table => println!("{}", output::nodes_table(std::slice::from_ref(&node))),
                Format::Json => print_json(&output::node_json(&node)),
            }
        }
        Cmd::Summary => {
            let s = client.cluster_summary().await?;
            match fmt {
                Format::Table => println!("{}", output::summary_table(&s)),
                Format::Json => print_json(&output::summary_json(&s)),
            }
        }
        Cmd::Admin { cmd } => admin(&client, cmd, fmt).await?,
        Cmd::Tune { dry_run, threshold } => {
            let d = client.tune(dry_run, threshold).await?;
            print_tune(&d, fmt);
        }
        Cmd::BenchSubmit { .. } | Cmd::BenchAgents { .. } | Cmd::Completions { .. } => {
            unreachable!("handled above")
        }
    }
    Ok(0)
}

async fn admin(client: &Client, cmd: AdminCmd, fmt: Format) -> Result<(), ClientError> {
    use fmctl::Cordon;
    let node = |n: pb::Node| match fmt {
        Format::Table => println!("{}", output::nodes_table(std::slice::from_ref(&n))),
        Format::Json => print_json(&output::node_json(&n)),
    };
    match cmd {
        AdminCmd::Cordon { node: id, reason } => {
            node(client.cordon_node(&id, Cordon::Cordon, &reason).await?)
        }
        AdminCmd::Drain { node: id, reason } => {
            node(client.cordon_node(&id, Cordon::Drain, &reason).await?)
        }
        AdminCmd::Uncordon { node: id } => {
            node(client.cordon_node(&id, Cordon::Uncordon, "").await?)
        }
        AdminCmd::RevokeToken { node: id, reason } => {
            node(client.revoke_node_token(&id, &reason).await?)
        }
        AdminCmd::Requeue { job, reason } => {
            client.requeue_job(&job, &reason).await?;
            match fmt {
                Format::Table => println!(
                    "job {job}: re-queue requested; the next round suspends it from its checkpoint"
                ),
                Format::Json => print_json(&serde_json::json!({"job_id": job, "requested": true})),
            }
        }
        AdminCmd::Policy => print_policy(&client.get_policy().await?, fmt),
        AdminCmd::SetPolicy { policy, knobs } => {
            let p = client
                .set_policy(&policy, knobs.into_iter().collect())
                .await?;
            print_policy(&p, fmt);
        }
        AdminCmd::Queues => print_queues(&client.get_queues().await?, fmt),
        AdminCmd::SetQueues { file } => {
            let queues = read_queue_file(&file)?;
            print_queues(&client.set_queues(queues).await?, fmt);
        }
        AdminCmd::Loans => print_loans(&client.list_loans().await?, fmt),
        AdminCmd::Lend { nodes } => print_loans(&client.loan_nodes(nodes).await?, fmt),
        AdminCmd::Reclaim {
            nodes,
            count,
            deadline,
        } => {
            let r = client
                .reclaim_nodes(nodes, count.unwrap_or(0), deadline)
                .await?;
            match fmt {
                Format::Table => {
                    println!("reclaiming {}", r.node_ids.join(", "));
                    println!(
                        "preempted ({}): {}",
                        r.preempted_job_ids.len(),
                        r.preempted_job_ids.join(" ")
                    );
                    println!(
                        "scaled in ({}): {}",
                        r.scaled_in_job_ids.len(),
                        r.scaled_in_job_ids.join(" ")
                    );
                }
                Format::Json => print_json(&serde_json::json!({
                    "node_ids": r.node_ids,
                    "preempted_job_ids": r.preempted_job_ids,
                    "scaled_in_job_ids": r.scaled_in_job_ids,
                })),
            }
        }
        AdminCmd::Audit { limit } => {
            let events = client.audit_events(limit).await?;
            match fmt {
                Format::Table => println!("{}", output::audit_table(&events)),
                Format::Json => print_json(&serde_json::Value::Array(
                    events.iter().map(output::audit_json).collect(),
                )),
            }
        }
    }
    Ok(())
}

fn print_loans(l: &pb::ListLoansResponse, fmt: Format) {
    match fmt {
        Format::Table => {
            println!(
                "{} inference node(s), {} kept unlent",
                l.inference_nodes, l.headroom_nodes
            );
            println!(
                "{:<24} {:<11} {:>8} {:<14} {:<10} PREEMPTED / SCALED IN",
                "NODE", "STATE", "GPUS", "LOANED BY", "OVERDUE"
            );
            for x in &l.loans {
                println!(
                    "{:<24} {:<11} {:>8} {:<14} {:<10} {} / {}",
                    x.node_id,
                    x.state,
                    x.gpus_in_use,
                    x.loaned_by,
                    if x.overdue { "yes" } else { "" },
                    x.preempted_job_ids.len(),
                    x.scaled_in_job_ids.len()
                );
            }
        }
        Format::Json => print_json(&serde_json::json!({
            "inference_nodes": l.inference_nodes,
            "headroom_nodes": l.headroom_nodes,
            "loans": l.loans.iter().map(|x| serde_json::json!({
                "node_id": x.node_id,
                "state": x.state,
                "gpus_in_use": x.gpus_in_use,
                "loaned_by": x.loaned_by,
                "overdue": x.overdue,
                "preempted_job_ids": x.preempted_job_ids,
                "scaled_in_job_ids": x.scaled_in_job_ids,
            })).collect::<Vec<_>>(),
        })),
    }
}

fn print_tune(d: &pb::TuneDecision, fmt: Format) {
    let knobs = |k: &std::collections::HashMap<String, f64>| {
        let mut v: Vec<String> = k.iter().map(|(n, x)| format!("{n}={x}")).collect();
        v.sort();
        v.join(" ")
    };
    match fmt {
        Format::Table => {
            println!(
                "policy {}: {}",
                d.policy,
                if d.adopted {
                    "adopted"
                } else if d.passes {
                    "would adopt (dry run)"
                } else {
                    "kept (no configuration beat the active one by the threshold)"
                }
            );
            println!("active before:  {}", knobs(&d.knobs_before));
            println!("best found:     {}", knobs(&d.proposed));
            println!("active after:   {}", knobs(&d.knobs_after));
            println!(
                "predicted gain {:.3} (threshold {}) on {} predicted jobs ({} carried over, {} after aggregation); {} simulations, {} samples rejected early; {:.2} s",
                d.predicted_gain,
                d.threshold,
                d.trace_jobs,
                d.carried_over,
                d.aggregated_jobs,
                d.simulations,
                d.rejected,
                d.wall_seconds
            );
            if let Some(g) = d.realised_gain {
                println!("realised since the last adoption: {g:.3} (objective after over before)");
            }
        }
        Format::Json => print_json(&serde_json::json!({
            "policy": d.policy,
            "knobs_before": d.knobs_before,
            "proposed": d.proposed,
            "knobs_after": d.knobs_after,
            "predicted_gain": d.predicted_gain,
            "threshold": d.threshold,
            "passes": d.passes,
            "adopted": d.adopted,
            "trace_jobs": d.trace_jobs,
            "carried_over": d.carried_over,
            "aggregated_jobs": d.aggregated_jobs,
            "simulations": d.simulations,
            "rejected": d.rejected,
            "wall_seconds": d.wall_seconds,
            "realised_gain": d.realised_gain,
        })),
    }
}

fn print_queues(q: &pb::QueueSetting, fmt: Format) {
    match fmt {
        Format::Table => println!("{}", output::queues_text(q)),
        Format::Json => print_json(&output::queues_json(q)),
    }
}

/// A TOML file of `[[queues]]` tables, checked for its shape here (the
/// scheduler validates the set).
fn read_queue_file(
    path: &std::path::Path,
) -> Result<Vec<fmsched_core::queue::QueueSpec>, ClientError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        queues: Vec<fmsched_core::queue::QueueSpec>,
    }
    let spec_err = |message: String| ClientError::Spec {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| spec_err(e.to_string()))?;
    let f: File = toml::from_str(&text).map_err(|e| spec_err(e.to_string()))?;
    Ok(f.queues)
}

fn print_policy(p: &pb::PolicySetting, fmt: Format) {
    match fmt {
        Format::Table => println!("{}", output::policy_text(p)),
        Format::Json => print_json(&output::policy_json(p)),
    }
}

/// Up to `limit` jobs matching `filter`, page by page.
async fn list_jobs(
    client: &Client,
    filter: &JobFilter,
    limit: u32,
) -> Result<Vec<pb::Job>, ClientError> {
    let mut all = Vec::new();
    let mut token = None;
    while (all.len() as u32) < limit {
        let (page, next) = client
            .list_jobs(&JobFilter {
                page_size: (limit - all.len() as u32).min(1000),
                page_token: token,
                ..filter.clone()
            })
            .await?;
        all.extend(page);
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    Ok(all)
}

/// `jobs --watch`: on a terminal the list is redrawn in place every
/// `interval`; otherwise it is printed again, after a time stamp, whenever it
/// changed. A scheduler that does not answer is said so on stderr and asked
/// again; Ctrl-C stops.
async fn watch_jobs(
    client: &Client,
    filter: &JobFilter,
    limit: u32,
    interval: Duration,
    render: impl Fn(&[pb::Job]) -> String,
) -> Result<(), ClientError> {
    use std::io::{IsTerminal as _, Write as _};
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    loop {
        match list_jobs(client, filter, limit).await {
            Ok(all) => {
                let now = chrono::Local::now().format("%Y-%m-%d %H:%M:%S");
                let text = render(&all);
                let mut out = std::io::stdout().lock();
                if tty {
                    // Home, clear, then the list under a heading.
                    let _ = write!(out, "\x1b[H\x1b[2J");
                    let _ = writeln!(out, "every {:?}: fmctl jobs   {now}\n\n{text}", interval);
                } else if text != last {
                    let _ = writeln!(out, "# {now}\n{text}");
                }
                let _ = out.flush();
                last = text;
            }
            Err(e @ (ClientError::Rpc { .. } | ClientError::Connect { .. })) if transient(&e) => {
                eprintln!("fmctl: {e} (asking again)");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(interval).await;
    }
}

/// An error worth asking again after: the scheduler is away (restarting,
/// failing over, a dropped connection), not a refusal.
fn transient(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } => true,
        ClientError::Rpc { code, .. } => matches!(
            code,
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Internal
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Aborted
        ),
        _ => false,
    }
}

/// `submit --wait`: follows every submitted job to its end and returns the
/// exit status (see [`EXIT_FAILED`], [`EXIT_CANCELLED`]).
async fn wait_for(
    client: &Client,
    jobs: Vec<(String, String)>,
    fmt: Format,
) -> Result<u8, ClientError> {
    let prefix = jobs.len() > 1;
    let mut set = tokio::task::JoinSet::new();
    for (name, id) in jobs {
        let client = client.clone();
        set.spawn(async move { follow_job(&client, &name, &id, prefix, fmt).await });
    }
    let mut code = 0;
    while let Some(r) = set.join_next().await {
        let state = r.map_err(|e| ClientError::Usage(format!("waiting for a job: {e}")))??;
        code = code.max(match state {
            JobState::Failed => EXIT_FAILED,
            JobState::Cancelled => EXIT_CANCELLED,
            _ => 0,
        });
    }
    // Failed outranks cancelled.
    Ok(code)
}

/// How long `submit --wait` keeps asking a scheduler that went away.
const WAIT_RECONNECT_FOR: Duration = Duration::from_secs(120);

/// Streams one job's events until it reaches a final state, watching again
/// after the last event seen when the stream breaks (a scheduler restart or
/// failover) for up to [`WAIT_RECONNECT_FOR`] of silence.
async fn follow_job(
    client: &Client,
    name: &str,
    id: &str,
    prefix: bool,
    fmt: Format,
) -> Result<JobState, ClientError> {
    let mut after = 0;
    let mut away_since: Option<Instant> = None;
    let mut delay = Duration::from_millis(250);
    loop {
        let broke = match client.watch_job(id, after).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(ev)) => {
                        after = after.max(ev.sequence);
                        away_since = None;
                        delay = Duration::from_millis(250);
                        match fmt {
                            Format::Table if prefix => {
                                println!("{name}: {}", output::event_line(&ev))
                            }
                            Format::Table => println!("{}", output::event_line(&ev)),
                            Format::Json => println!("{}", output::event_json(&ev)),
                        }
                    }
                    Ok(None) => break None,
                    Err(status) => break Some(ClientError::from(status)),
                }
            },
            Err(e) => Some(e),
        };
        if let Some(e) = &broke
            && !transient(e)
        {
            return Err(broke.unwrap_or_else(|| unreachable!()));
        }
        match client.get_job(id).await {
            Ok(job) => {
                let state = job_state_from_proto("state", job.state)
                    .ok()
                    .flatten()
                    .unwrap_or(JobState::Submitted);
                if state.is_terminal() {
                    if fmt == Format::Table {
                        let why = if job.state_reason.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", job.state_reason)
                        };
                        eprintln!("job {id} ({name}) {}{why}", output::job_state(job.state));
                    }
                    return Ok(state);
                }
            }
            Err(e) if transient(&e) => {}
            Err(e) => return Err(e),
        }
        let since = *away_since.get_or_insert_with(Instant::now);
        if since.elapsed() > WAIT_RECONNECT_FOR {
            return Err(broke.unwrap_or(ClientError::Usage(format!(
                "job {id}: the event stream kept ending before the job did"
            ))));
        }
        if let Some(e) = &broke {
            eprintln!("fmctl: {e}; watching job {id} again");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn bench_submit(
    cfg: ClientConfig,
    clients: usize,
    jobs: usize,
    spec: Option<&Path>,
) -> Result<(), ClientError> {
    if clients == 0 || jobs == 0 {
        return Err(ClientError::Usage(
            "--clients and --jobs must be > 0".into(),
        ));
    }
    let spec = match spec {
        Some(p) => fmctl::load_spec(p)?,
        None => fmctl::parse_spec("built-in bench spec", BENCH_SPEC)?,
    };
    // One connection per client, as N independent users would have.
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Client::connect(cfg.clone()).await?);
    }
    eprintln!(
        "bench-submit: {jobs} jobs from {clients} clients against {}",
        cfg.endpoint
    );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in conns.into_iter().enumerate() {
        let n = jobs / clients + usize::from(c < jobs % clients);
        let spec = spec.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                client.submit(&spec, None).await?;
                lat.push(t.elapsed());
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, ClientError>(lat)
        }));
    }
    let progress = {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let d = done.load(std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "  {d}/{jobs} submitted ({:.0}/s)",
                    d as f64 / started.elapsed().as_secs_f64()
                );
            }
        })
    };
    let mut lat = Vec::with_capacity(jobs);
    for t in tasks {
        lat.extend(
            t.await
                .map_err(|e| ClientError::Usage(format!("bench task: {e}")))??,
        );
    }
    let wall = started.elapsed();
    progress.abort();
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "jobs={} clients={} wall_s={:.2} mean_ms={:.2} max_ms={:.2}",
        lat.len(),
        clients,
        wall.as_secs_f64(),
        ms(lat.iter().sum::<Duration>()) / lat.len() as f64,
        ms(*lat.last().unwrap_or(&Duration::ZERO))
    );
    println!(
        "submit_per_s={:.0} p50_ms={:.2} p99_ms={:.2}",
        lat.len() as f64 / wall.as_secs_f64(),
        ms(percentile(&lat, 50.0)),
        ms(percentile(&lat, 99.0))
    );
    Ok(())
}

/// The phases of a committing round, as the scheduler's
/// `fmsched_round_phase_duration_seconds_sum{phase}` names them.
const ROUND_PHASES: [&str; 6] = fmsched_core::round::phase::ALL;

/// What the scheduler's `/metrics` said at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct SchedulerSample {
    rounds: f64,
    round_sum_s: f64,
    last_round_s: f64,
    /// Seconds summed per phase of [`ROUND_PHASES`] (0 where absent).
    phase_sum_s: [f64; ROUND_PHASES.len()],
    cpu_s: f64,
    rss: f64,
    suspect: f64,
    offline: f64,
}

async fn sample_scheduler(addr: &str) -> Option<SchedulerSample> {
    use fmctl::swarm::metric;
    let e = fmctl::swarm::scrape(addr).await?;
    Some(SchedulerSample {
        rounds: metric(&e, "fmsched_rounds_total", None)?,
        round_sum_s: metric(&e, "fmsched_round_duration_seconds_sum", None)?,
        last_round_s: metric(&e, "fmsched_round_duration_seconds_last", None)?,
        phase_sum_s: ROUND_PHASES.map(|p| {
            metric(
                &e,
                "fmsched_round_phase_duration_seconds_sum",
                Some(&format!("phase=\"{p}\"")),
            )
            .unwrap_or(0.0)
        }),
        cpu_s: metric(&e, "process_cpu_seconds_total", None).unwrap_or(0.0),
        rss: metric(&e, "process_resident_memory_bytes", None).unwrap_or(0.0),
        suspect: metric(&e, "fmsched_nodes", Some("state=\"suspect\"")).unwrap_or(0.0),
        offline: metric(&e, "fmsched_nodes", Some("state=\"offline\"")).unwrap_or(0.0),
    })
}

async fn bench_agents(
    cfg: ClientConfig,
    swarm: fmctl::swarm::SwarmConfig,
    jobs: usize,
    iterations: u64,
    duration: Duration,
    metrics: Option<String>,
) -> Result<(), ClientError> {
    use fmctl::swarm::{SwarmStats, run_agent};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    if swarm.agents == 0 || swarm.gpus == 0 || swarm.connections == 0 {
        return Err(ClientError::Usage(
            "--agents, --gpus and --connections must be > 0".into(),
        ));
    }
    if swarm.join_token.is_empty() {
        return Err(ClientError::Usage(
            "no join token: pass --join-token or set FMSCHED_JOIN_TOKEN".into(),
        ));
    }
    if !(swarm.it_per_s.is_finite() && swarm.it_per_s > 0.0) || iterations == 0 {
        return Err(ClientError::Usage(
            "--it-per-s and --iterations must be > 0".into(),
        ));
    }
    let client = Client::connect(cfg.clone()).await?;
    // Sessions live as long as the bench: no per-call timeout on them.
    let session_cfg = ClientConfig {
        request_timeout: None,
        ..cfg.clone()
    };
    let mut channels = Vec::new();
    for _ in 0..swarm.connections.min(swarm.agents) {
        channels.push(fmctl::channel(&session_cfg).await?);
    }
    let swarm = Arc::new(swarm);
    let stats = Arc::new(SwarmStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    eprintln!(
        "bench-agents: {} agents x {} GPUs, heartbeat every {:?}, {} connections, against {}",
        swarm.agents,
        swarm.gpus,
        swarm.interval,
        channels.len(),
        cfg.endpoint
    );
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..swarm.agents {
        handles.push(tokio::spawn(run_agent(
            swarm.clone(),
            i,
            channels[i % channels.len()].clone(),
            stats.clone(),
            stop.clone(),
        )));
    }
    let deadline = started + swarm.interval * 2 + Duration::from_secs(60);
    while stats.registered.load(Ordering::Relaxed) < swarm.agents {
        if Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
            return Err(ClientError::Usage(format!(
                "only {} of {} agents registered within a minute ({} refusals)",
                stats.registered.load(Ordering::Relaxed),
                swarm.agents,
                stats.refusals.load(Ordering::Relaxed)
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let registered_after = started.elapsed();
    eprintln!(
        "  {} agents registered in {:.1} s",
        swarm.agents,
        registered_after.as_secs_f64()
    );
    // The jobs: the built-in spec, `iterations` long, one GPU each.
    let mut spec = fmctl::parse_spec("built-in bench spec", BENCH_SPEC)?;
    spec.target.max_epochs = None;
    spec.target.max_iterations = Some(iterations);
    spec.resources.max_gpus = 1;
    let before: u64 = completed_jobs(&client).await?;
    for k in 0..jobs {
        spec.name = format!("{}-job-{k}", swarm.prefix);
        client.submit(&spec, None).await?;
    }
    if jobs > 0 {
        eprintln!(
            "  {jobs} jobs submitted in {:.1} s",
            (started.elapsed() - registered_after).as_secs_f64()
        );
    }
    let t0 = Instant::now();
    let first = match &metrics {
        Some(a) => sample_scheduler(a).await,
        None => None,
    };
    let mut prev = first;
    let mut rounds_ms: Vec<f64> = Vec::new();
    let (mut rss_max, mut suspect_max, mut offline_max) = (0f64, 0f64, 0f64);
    let mut done = 0u64;
    while t0.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(a) = &metrics
            && let Some(s) = sample_scheduler(a).await
        {
            if let Some(p) = prev
                && s.rounds > p.rounds
            {
                // One sample per new round; a busy second with several
                // rounds adds their mean for each.
                let n = (s.rounds - p.rounds) as usize;
                let mean = (s.round_sum_s - p.round_sum_s) / n as f64;
                rounds_ms.push(s.last_round_s * 1000.0);
                rounds_ms.extend(std::iter::repeat_n(mean * 1000.0, n - 1));
            }
            rss_max = rss_max.max(s.rss);
            suspect_max = suspect_max.max(s.suspect);
            offline_max = offline_max.max(s.offline);
            prev = Some(s);
        }
        done = completed_jobs(&client).await?.saturating_sub(before);
        let (p50, p99, _) = stats.heartbeat_ms();
        eprintln!(
            "  t={:>4.0}s jobs completed {done}/{jobs}  heartbeat p50 {p50:.1} ms p99 {p99:.1} ms  re-registrations {}",
            t0.elapsed().as_secs_f64(),
            stats.reregistrations.load(Ordering::Relaxed)
        );
        if jobs > 0 && done >= jobs as u64 {
            break;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.abort();
    }
    let (hb50, hb99, hbmax) = stats.heartbeat_ms();
    if jobs > 0 && rounds_ms.is_empty() && stats.plans.load(Ordering::Relaxed) == 0 {
        eprintln!(
            "warning: no scheduling round ran in {wall:.0} s: the scheduler's round interval \
             (scheduling.interval, FMSCHED_SCHEDULING__INTERVAL; Ymir's default is 120 s) may be \
             longer than the run"
        );
    }
    rounds_ms.sort_by(f64::total_cmp);
    let q = |f: f64| percentile(&rounds_ms, f * 100.0);
    let cpu = match (first, prev) {
        (Some(a), Some(b)) => (b.cpu_s - a.cpu_s) / wall,
        _ => 0.0,
    };
    println!(
        "agents={} gpus={} jobs={jobs} completed={done} wall_s={wall:.1} heartbeats={}",
        swarm.agents,
        swarm.agents as u64 * u64::from(swarm.gpus),
        stats.heartbeats.lock().map_or(0, |v| v.len())
    );
    println!(
        "heartbeat_ack_ms p50={hb50:.2} p99={hb99:.2} max={hbmax:.2}  rounds={} round_ms p50={:.1} p99={:.1} max={:.1}",
        rounds_ms.len(),
        q(0.5),
        q(0.99),
        rounds_ms.last().copied().unwrap_or(0.0)
    );
    // Where a round's time went: each phase's mean over the rounds run.
    if let (Some(a), Some(b)) = (first, prev)
        && b.rounds > a.rounds
    {
        let n = b.rounds - a.rounds;
        let phases: Vec<String> = ROUND_PHASES
            .iter()
            .zip(a.phase_sum_s.iter().zip(&b.phase_sum_s))
            .map(|(p, (x, y))| format!("{}={:.1}", p.replace(' ', "_"), (y - x) / n * 1000.0))
            .collect();
        println!("round_phase_mean_ms {}", phases.join(" "));
    }
    println!(
        "scheduler cpu_cores={cpu:.2} rss_max_mib={:.0}  suspect_max={suspect_max} offline_max={offline_max} re_registrations={} refusals={} plans={} suspended={}",
        rss_max / (1 << 20) as f64,
        stats.reregistrations.load(Ordering::Relaxed),
        stats.refusals.load(Ordering::Relaxed),
        stats.plans.load(Ordering::Relaxed),
        stats.suspended.load(Ordering::Relaxed),
    );
    println!(
        "agents={} jobs={jobs} completed={done} hb_p50_ms={hb50:.2} hb_p99_ms={hb99:.2} round_p50_ms={:.1} round_p99_ms={:.1} sched_cpu_cores={cpu:.2} sched_rss_mib={:.0} suspect_max={suspect_max} re_registrations={}",
        swarm.agents,
        q(0.5),
        q(0.99),
        rss_max / (1 << 20) as f64,
        stats.reregistrations.load(Ordering::Relaxed),
    );
    Ok(())
}

/// Completed jobs in the cluster summary.
async fn completed_jobs(client: &Client) -> Result<u64, ClientError> {
    let s = client.cluster_summary().await?;
    Ok(s.jobs_by_state
        .iter()
        .find(|c| c.state == fmsched_proto::v1::JobState::Completed as i32)
        .map_or(0, |c| c.count))
}
