//! `fmctl`: submit, inspect, watch and cancel fine-tuning jobs; inspect nodes.

mod cmd;

use std::process::ExitCode;

use clap::Parser;
use fmctl::output::Format;
use fmctl::{Client, ClientConfig, ClientError, JobFilter, output};
use fmsched_core::NodeState;
use fmsched_proto::v1 as pb;

use crate::cmd::admin::{admin, print_tune};
use crate::cmd::args::{Cli, Cmd, load_file_config};
use crate::cmd::bench::{bench_agents, bench_submit};
use crate::cmd::watch::{list_jobs, parse_states, wait_for, watch_jobs};

/// `submit --wait`'s exit status when a job failed.
pub(crate) const EXIT_FAILED: u8 = 3;

/// `submit --wait`'s exit status when a job was cancelled (and none failed).
pub(crate) const EXIT_CANCELLED: u8 = 4;

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

pub(crate) fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// `fmctl submit`: each spec file submitted (an idempotency key gets the
/// file's number when there are several), printed, and with `--wait`
/// followed to the end.
async fn submit(
    client: &Client,
    files: &[std::path::PathBuf],
    idempotency_key: Option<&str>,
    wait: bool,
    fmt: Format,
) -> Result<u8, ClientError> {
    let specs = files
        .iter()
        .map(|f| fmctl::load_spec(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    let mut submitted = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let key = idempotency_key.map(|k| {
            if specs.len() > 1 {
                format!("{k}-{}", i + 1)
            } else {
                k.to_string()
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
        return wait_for(client, submitted, fmt).await;
    }
    Ok(0)
}

/// `fmctl logs`: a job's log to stdout as it streams; a move to another
/// node or process is said on stderr.
async fn print_logs(client: &Client, req: pb::GetJobLogsRequest) -> Result<(), ClientError> {
    use std::io::Write as _;
    let mut stream = client.job_logs(req).await?;
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
    Ok(())
}

/// `fmctl bench-agents`: a swarm of simulated agents against the
/// scheduler, with its own connections.
async fn bench_agents_cmd(cfg: ClientConfig, cmd: Cmd) -> Result<u8, ClientError> {
    let Cmd::BenchAgents {
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
    } = cmd
    else {
        unreachable!("called for bench-agents only")
    };
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
    bench_agents(cfg, swarm, jobs, iterations, duration, scheduler_metrics)
        .await
        .map(|()| 0)
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
    if matches!(cli.cmd, Cmd::BenchAgents { .. }) {
        return bench_agents_cmd(cfg, cli.cmd).await;
    }
    let client = Client::connect(cfg).await?;
    match cli.cmd {
        Cmd::Submit {
            files,
            idempotency_key,
            wait,
        } => return submit(&client, &files, idempotency_key.as_deref(), wait, fmt).await,
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
            let req = pb::GetJobLogsRequest {
                job_id: id,
                stderr,
                follow,
                tail_bytes: tail,
                rank,
                profile,
            };
            print_logs(&client, req).await?;
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
