//! Listing and following jobs: `fmctl jobs [--watch]`, `submit --wait`
//! and `watch`, reconnecting through a scheduler restart.

use std::time::{Duration, Instant};

use fmctl::output::Format;
use fmctl::{Client, ClientError, JobFilter, output};
use fmsched_core::JobState;
use fmsched_proto::convert::job_state_from_proto;
use fmsched_proto::v1 as pb;

use crate::{EXIT_CANCELLED, EXIT_FAILED};

pub(crate) fn parse_states<T: std::str::FromStr<Err = String>>(
    raw: &[String],
) -> Result<Vec<T>, ClientError> {
    raw.iter()
        .map(|s| s.parse().map_err(ClientError::Usage))
        .collect()
}

/// Up to `limit` jobs matching `filter`, page by page.
pub(crate) async fn list_jobs(
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
pub(crate) async fn watch_jobs(
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
pub(crate) async fn wait_for(
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
