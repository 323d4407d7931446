//! `fmctl bench-submit` and `fmctl bench-agents`: the submit path's
//! throughput and a swarm of simulated agents against a scheduler.

use std::path::Path;
use std::time::{Duration, Instant};

use fmctl::{Client, ClientConfig, ClientError, percentile};

const BENCH_SPEC: &str = r#"
name: bench
model: roberta-base
dataset: { uri: s3://bench/glue/sst2, task: sst2, objective: sequence-classification }
hyperparameters: { global_batch_size: 32, learning_rate: 0.00002 }
target: { max_epochs: 3 }
resources: { min_gpus: 1, max_gpus: 4 }
launch: { command: [python, train.py] }
"#;

pub(crate) async fn bench_submit(
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

pub(crate) async fn bench_agents(
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
    check_swarm(&swarm, iterations)?;
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
    wait_registered(&swarm, &stats, &stop, started).await?;
    let registered_after = started.elapsed();
    eprintln!(
        "  {} agents registered in {:.1} s",
        swarm.agents,
        registered_after.as_secs_f64()
    );
    let before = submit_bench_jobs(&client, &swarm.prefix, jobs, iterations).await?;
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
    print_round_phases(first, prev);
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

/// Where a round's time went: each phase's mean over the rounds run
/// between two samples of the scheduler's metrics.
fn print_round_phases(first: Option<SchedulerSample>, last: Option<SchedulerSample>) {
    if let (Some(a), Some(b)) = (first, last)
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
}

/// The flags' checks of `fmctl bench-agents`.
fn check_swarm(swarm: &fmctl::swarm::SwarmConfig, iterations: u64) -> Result<(), ClientError> {
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
    Ok(())
}

/// Waits (two heartbeats and a minute at most) until every simulated
/// agent has registered; stops the swarm and says how far it got if not.
async fn wait_registered(
    swarm: &fmctl::swarm::SwarmConfig,
    stats: &fmctl::swarm::SwarmStats,
    stop: &std::sync::atomic::AtomicBool,
    started: Instant,
) -> Result<(), ClientError> {
    use std::sync::atomic::Ordering;
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
    Ok(())
}

/// Submits `jobs` bench jobs (the built-in spec, `iterations` long, one
/// GPU each) named after `prefix`; returns the jobs completed before them.
async fn submit_bench_jobs(
    client: &Client,
    prefix: &str,
    jobs: usize,
    iterations: u64,
) -> Result<u64, ClientError> {
    let mut spec = fmctl::parse_spec("built-in bench spec", BENCH_SPEC)?;
    spec.target.max_epochs = None;
    spec.target.max_iterations = Some(iterations);
    spec.resources.max_gpus = 1;
    let before: u64 = completed_jobs(client).await?;
    for k in 0..jobs {
        spec.name = format!("{prefix}-job-{k}");
        client.submit(&spec, None).await?;
    }
    Ok(before)
}

/// Completed jobs in the cluster summary.
async fn completed_jobs(client: &Client) -> Result<u64, ClientError> {
    let s = client.cluster_summary().await?;
    Ok(s.jobs_by_state
        .iter()
        .find(|c| c.state == fmsched_proto::v1::JobState::Completed as i32)
        .map_or(0, |c| c.count))
}
