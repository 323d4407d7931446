//! End to end through the scheduling loop: Postgres + the real
//! `scheduler-svc` (Ymir policy, 1 s rounds) + two `node-agent`s with fake
//! GPUs running the FAKE trainer. Jobs submitted with `fmctl` are placed,
//! run as real processes, complete with their output recorded; a `kill -9`
//! of the scheduler in the middle loses and restarts nothing.

mod autosched;
mod crash_and_failover;
mod deadlines;
mod fmctl;
mod gangs;
mod hardening;
mod icefrog;
mod lyra;
mod merges;
mod prompt;
mod queues_admin;
mod real_trainer;
mod tenants;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use fmsched_integration::*;
use serde_json::Value;
use sqlx::Connection;

use crate::crash_and_failover::{fail_over, led_epoch, plan_epoch, processes_per_job};

pub(crate) use fmsched_integration::cluster::{
    JOIN, ROOT, TrainersOf, agent_command, kill_processes_with_env, wait_up,
};

pub(crate) const NO_MERGING: &[(&str, &str)] = &[("FMSCHED_SCHEDULING__MERGING", "false")];

pub(crate) fn scheduler(db: &str, port: u16, dir: &std::path::Path) -> Proc {
    scheduler_with(db, port, dir, None)
}

fn scheduler_with(db: &str, port: u16, dir: &std::path::Path, metrics: Option<u16>) -> Proc {
    scheduler_env(db, port, dir, metrics, &[])
}

/// A scheduler; `env` overrides the defaults below (liveness is relaxed
/// enough not to flip under a loaded test machine).
pub(crate) fn scheduler_env(
    db: &str,
    port: u16,
    dir: &std::path::Path,
    metrics: Option<u16>,
    env: &[(&str, &str)],
) -> Proc {
    scheduler_at(&db_url(db), port, dir, metrics, env)
}

/// A scheduler whose jobs start without a profiling run.
pub(crate) fn scheduler_without_profiling(db: &str, port: u16, dir: &std::path::Path) -> Proc {
    scheduler_env(
        db,
        port,
        dir,
        None,
        &[("FMSCHED_SCHEDULING__PROFILING", "false")],
    )
}

/// A scheduler on the database at `url`.
pub(crate) fn scheduler_at(
    url: &str,
    port: u16,
    dir: &std::path::Path,
    metrics: Option<u16>,
    env: &[(&str, &str)],
) -> Proc {
    Proc::spawn(
        "scheduler",
        fmsched_integration::cluster::scheduler_command(url, port, metrics, env),
        dir,
    )
}

pub(crate) fn agent(node: &str, port: u16, dir: &std::path::Path) -> Proc {
    agent_with(node, port, dir, None)
}

pub(crate) fn agent_with(
    node: &str,
    port: u16,
    dir: &std::path::Path,
    metrics: Option<u16>,
) -> Proc {
    agent_endpoints(node, &format!("http://127.0.0.1:{port}"), dir, metrics)
}

pub(crate) fn agent_endpoints(
    node: &str,
    endpoints: &str,
    dir: &std::path::Path,
    metrics: Option<u16>,
) -> Proc {
    agent_env(node, endpoints, dir, metrics, &[])
}

pub(crate) fn agent_env(
    node: &str,
    endpoints: &str,
    dir: &std::path::Path,
    metrics: Option<u16>,
    env: &[(&str, &str)],
) -> Proc {
    agent_gpus(node, endpoints, dir, metrics, 4, env)
}

/// [`agent_env`] with `gpus` fake GPUs.
pub(crate) fn agent_gpus(
    node: &str,
    endpoints: &str,
    dir: &std::path::Path,
    metrics: Option<u16>,
    gpus: u32,
    env: &[(&str, &str)],
) -> Proc {
    Proc::spawn(
        node,
        agent_command(node, endpoints, dir, metrics, gpus, env),
        dir,
    )
}

/// Waits until all `n` jobs are completed (failing at once if one fails);
/// returns id → (state, output path).
pub(crate) fn all_completed(
    port: u16,
    n: usize,
    timeout: Duration,
) -> BTreeMap<String, (String, String)> {
    wait_for("every job completed", timeout, || {
        let j = jobs(port)?;
        let finished = j.values().filter(|s| s.0 == "completed").count();
        if j.len() == n && finished == n {
            Ok(j)
        } else if j.values().any(|s| s.0 == "failed") {
            panic!("a job failed: {j:?}")
        } else {
            Err(format!("{finished} of {n} completed: {j:?}"))
        }
    })
}

/// id → (state, output path) of every job.
pub(crate) fn jobs(port: u16) -> Result<BTreeMap<String, (String, String)>, String> {
    let v: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "jobs"])?).map_err(|e| e.to_string())?;
    Ok(v.as_array()
        .ok_or("not an array")?
        .iter()
        .map(|j| {
            (
                j["id"].as_str().unwrap_or_default().to_string(),
                (
                    j["state"].as_str().unwrap_or_default().to_string(),
                    j["output_path"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect())
}

pub(crate) fn job_yaml(name: &str, task: &str, iterations: u64, gpus: u32) -> String {
    job_yaml_env(name, task, iterations, gpus, "")
}

pub(crate) fn job_yaml_env(
    name: &str,
    task: &str,
    iterations: u64,
    gpus: u32,
    extra_env: &str,
) -> String {
    format!(
        "name: {name}\nmodel: roberta-base\ndataset: {{ uri: file:///data/{task}, task: {task}, num_samples: 3200 }}\n\
         hyperparameters: {{ global_batch_size: 32, learning_rate: 2.0e-5, amp: true }}\n\
         target: {{ max_iterations: {iterations} }}\n\
         resources: {{ min_gpus: 1, max_gpus: {gpus} }}\n\
         launch:\n  command: [\"{}\"]\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"40\"{extra_env} }}\n",
        bin("fake-trainer").display()
    )
}

/// Trainer processes under `node_dir` that resumed from a checkpoint under
/// `from_dir` (another node's folder).
pub(crate) fn resumed_from(node_dir: &std::path::Path, from_dir: &str) -> usize {
    std::fs::read_dir(node_dir)
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("stderr.log"))
                .is_ok_and(|l| l.contains("resumed from") && l.contains(from_dir))
        })
        .count()
}

pub(crate) fn walk(p: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(d) = std::fs::read_dir(p) {
        for e in d.flatten() {
            out.push(e.path().display().to_string());
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
    }
    out
}

/// Training-process launches in an agent log (profiling runs excluded).
pub(crate) fn training_launches(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(" launched") && !l.contains("-profile"))
        .count()
}

/// `submit_manifests` as the admin.
pub(crate) fn submit(
    port: u16,
    dir: &std::path::Path,
    jobs: impl IntoIterator<Item = (String, String)>,
) -> Result<String, String> {
    submit_manifests(port, ROOT, dir, jobs)
}

/// `fmctl` as the admin.
pub(crate) fn fmctl(port: u16, args: &[&str]) -> Result<String, String> {
    fmsched_integration::fmctl(port, ROOT, args)
}

/// Tasks of the generated workload and their training-set sizes.
pub(crate) const WORKLOAD_TASKS: [(&str, u64); 8] = [
    ("cola", 3200),
    ("sst2", 9600),
    ("mrpc", 3200),
    ("qqp", 12800),
    ("mnli", 12800),
    ("qnli", 6400),
    ("rte", 3200),
    ("stsb", 6400),
];

/// The fake trainer's time compression in the generated workload.
pub(crate) const COMPRESSION: f64 = 30.0;

/// [`workload`] with another time compression (a lower one runs longer).
pub(crate) fn workload_at(n: usize, compression: f64, extra_env: &str) -> Vec<(String, String)> {
    (0..n)
        .map(|k| {
            let (task, samples) = WORKLOAD_TASKS[(k * 5 + k / 8) % 8];
            let name = format!("w{k:02}-{task}");
            let manifest = format!(
                "name: {name}\nmodel: roberta-base\ndataset: {{ uri: file:///data/{task}, task: {task}, num_samples: {samples} }}\n\
                 hyperparameters: {{ global_batch_size: 32, learning_rate: 2.0e-5, amp: true }}\n\
                 target: {{ max_epochs: 6, metric: {{ name: accuracy, value: 0.72 }} }}\n\
                 resources: {{ min_gpus: 1, max_gpus: {} }}\n\
                 launch:\n  command: [\"{}\"]\n  prewarm: true\n  env: {{ FMSCHED_FAKE_TIME_COMPRESSION: \"{compression}\"{extra_env} }}\n",
                workload_gpus(k),
                bin("fake-trainer").display()
            );
            (name, manifest)
        })
        .collect()
}

/// GPUs job `k` of the generated workload asks for: 1 or 2, and up to 6
/// for every tenth (from 1: under Ymir's allocations {1, 2, 3, 4m} that is
/// at most one 4-GPU node; [`gang_wide`] makes them gangs).
pub(crate) fn workload_gpus(k: usize) -> usize {
    if k % 10 == 9 { 6 } else { 1 + k % 2 }
}

pub(crate) async fn jct_table_at(url: &str) -> BTreeMap<String, (f64, String, bool)> {
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    let rows: Vec<(String, f64, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT j.spec->>'name', EXTRACT(EPOCH FROM (j.updated_at - j.created_at))::float8,
                m.mode, m.state
         FROM jobs j LEFT JOIN merges m ON m.job_a = j.id OR m.job_b = j.id
         WHERE j.state = 'completed' ORDER BY 1",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(name, jct, mode, st)| {
            (
                name,
                (
                    jct,
                    mode.unwrap_or_else(|| "normal".into()),
                    st.as_deref() == Some("split"),
                ),
            )
        })
        .collect()
}

/// Waits (30 s at most) until a job runs; returns its id.
pub(crate) fn running_job(port: u16) -> String {
    wait_for("a job runs", Duration::from_secs(30), || {
        let j = jobs(port)?;
        j.iter()
            .find(|(_, s)| s.0 == "running")
            .map(|(id, _)| id.clone())
            .ok_or_else(|| format!("{j:?}"))
    })
}

/// The value of an unlabelled metric in a Prometheus exposition.
pub(crate) fn metric_value(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {exposition}"))
}

/// Live training processes of this test (found by their checkpoint folder
/// under `dir`): task folder name → pid.
pub(crate) fn trainer_processes(dir: &std::path::Path) -> BTreeMap<String, u32> {
    let marker = format!("FMSCHED_CHECKPOINT_DIR={}", dir.display());
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let env = String::from_utf8_lossy(&env);
        // A zombie keeps no environment; a live trainer does.
        if let Some(v) = env.split('\0').find(|v| v.starts_with(&marker)) {
            let ckpt = std::path::Path::new(&v["FMSCHED_CHECKPOINT_DIR=".len()..]);
            if let Some(task) = ckpt.parent().and_then(|t| t.file_name()) {
                out.insert(task.to_string_lossy().into_owned(), pid);
            }
        }
    }
    out
}

/// Runs a future to completion from synchronous code (inside `wait_for`).
pub(crate) fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// (id, state) of the job named `name`.
pub(crate) fn job_named(port: u16, name: &str) -> Result<(String, String), String> {
    let v: Value =
        serde_json::from_str(&fmctl(port, &["-o", "json", "jobs"])?).map_err(|e| e.to_string())?;
    v.as_array()
        .and_then(|a| a.iter().find(|j| j["spec"]["name"] == name))
        .map(|j| {
            (
                j["id"].as_str().unwrap_or_default().to_string(),
                j["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .ok_or_else(|| format!("no job {name}"))
}

/// `text` without terminal colour sequences (`ESC [ … m`).
pub(crate) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A node as `fmctl nodes` shows it: (connected, GPU models).
pub(crate) fn node_view(port: u16, id: &str) -> Result<(bool, Vec<String>), String> {
    let out = fmctl(port, &["-o", "json", "nodes"])?;
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    let n = v
        .as_array()
        .and_then(|a| a.iter().find(|n| n["id"] == id))
        .ok_or_else(|| format!("no node {id}: {out}"))?;
    let models = n["gpus"]
        .as_array()
        .map(|g| {
            g.iter()
                .map(|g| g["model"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    Ok((n["connected"] == true, models))
}

pub(crate) async fn scrape(port: u16) -> String {
    fmsched_runtime::metrics::scrape(([127, 0, 0, 1], port).into())
        .await
        .expect("metrics endpoint")
}

/// Prints every job event (name, kind, from → to and message) and returns
/// them as (name, kind, from, to + message, at).
pub(crate) async fn print_events(
    c: &mut sqlx::PgConnection,
) -> Vec<(
    String,
    String,
    String,
    String,
    chrono::DateTime<chrono::Utc>,
)> {
    let all: Vec<(String, String, String, String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as(
            "SELECT j.name, e.kind, coalesce(e.from_state, ''), coalesce(e.to_state, '') || ' ' || e.message, e.at
             FROM job_events e JOIN jobs j ON j.id = e.job_id ORDER BY e.seq",
        )
        .fetch_all(c)
        .await
        .unwrap();
    for e in &all {
        let msg: String = e.3.chars().take(160).collect();
        eprintln!(
            "{} {} {} {} -> {msg}",
            e.4.format("%H:%M:%S%.3f"),
            e.0,
            e.1,
            e.2
        );
    }
    all
}

/// `fmctl -o json node <id>`'s scheduling hold and the jobs holding its
/// GPUs.
pub(crate) fn node_hold(port: u16, node: &str) -> Result<(String, Vec<String>), String> {
    let v: Value = serde_json::from_str(&fmctl(port, &["-o", "json", "node", node])?)
        .map_err(|e| e.to_string())?;
    let jobs = v["gpus"]
        .as_array()
        .ok_or("no gpus")?
        .iter()
        .filter_map(|g| g["allocated_to_job"].as_str().map(str::to_string))
        .collect();
    Ok((
        v["scheduling"].as_str().unwrap_or_default().to_string(),
        jobs,
    ))
}

/// Waits until node-a and node-b are registered.
pub(crate) fn wait_two_nodes(port: u16) {
    wait_for("two nodes", Duration::from_secs(20), || {
        let out = fmctl(port, &["nodes"])?;
        (out.contains("node-a") && out.contains("node-b"))
            .then_some(())
            .ok_or(out)
    });
}

/// Job events whose message contains `needle`.
pub(crate) async fn events_saying(db: &str, needle: &str) -> Vec<(String, String)> {
    let mut c = sqlx::PgConnection::connect(&db_url(db)).await.unwrap();
    sqlx::query_as(
        "SELECT job_id::text, message FROM job_events WHERE message LIKE '%' || $1 || '%' ORDER BY seq",
    )
    .bind(needle)
    .fetch_all(&mut c)
    .await
    .unwrap()
}

/// The iteration of the fake trainer's checkpoint an agent log line names
/// (`…/ckpt-000003892.json`).
pub(crate) fn checkpoint_iteration(line: &str) -> Option<i64> {
    line.split("ckpt-")
        .nth(1)
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
}

/// A small deterministic generator (xorshift64*), so a soak can be replayed
/// from its seed.
struct Chaos(u64);

impl Chaos {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The chaos soak: `SOAK_JOBS` jobs (default 200) arrive over the first
/// half of `SOAK_MINUTES` (default 30) on three 4-GPU fake nodes and two
/// scheduler replicas sharing a private Postgres; every 10–30 s one of:
/// `kill -9` of the active replica (restarted a few seconds later), `kill
/// -9` of an agent with its trainers (back after 2–10 s, sometimes past
/// `offline_after`), `kill -9` of one trainer process, a Postgres stop and
/// start. A sampler measures every time a job has two live processes (a
/// move to another node overlaps for a moment; longer than a move allows
/// is a duplicate); each failover checks that every process whose job kept its
/// GPUs is the same process. At the end every job must have completed
/// exactly once with its output. Prints `lost=… duplicated=…
/// healthy_restarts=…` (all 0) or panics with the counterexample.
/// `SOAK_SEED` replays a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak of many minutes: scripts/soak.sh"]
async fn soak_chaos_replicas_agents_trainers_and_postgres_lose_nothing() {
    let minutes: f64 = env_or("SOAK_MINUTES", 30.0);
    let n: usize = env_or("SOAK_JOBS", 200);
    let seed: u64 = env_or(
        "SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1,
    );
    eprintln!("soak: {minutes} min, {n} jobs, SOAK_SEED={seed}");
    let mut rng = Chaos(seed);
    let tmp = tempfile::tempdir().unwrap();
    // SOAK_KEEP=1 keeps the processes' logs and work folders afterwards.
    let dir = tmp.path().to_path_buf();
    if std::env::var_os("SOAK_KEEP").is_some() {
        eprintln!("soak: keeping {}", dir.display());
        std::mem::forget(tmp);
    }
    let pgc = PrivatePostgres::start(dir.as_path());
    let url = pgc.url();
    // Trainer kills are the soak's doing, not the jobs' bugs: retries are
    // not what is measured here.
    let env = [("FMSCHED_SCHEDULING__MAX_RETRIES", "1000")];
    let ports = [free_port(), free_port()];
    let endpoints = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        ports[0], ports[1]
    );
    let mut starts = 0;
    let mut start_replica = |k: usize| {
        starts += 1;
        let d = dir.as_path().join(format!("s{k}-{starts}"));
        std::fs::create_dir_all(&d).unwrap();
        scheduler_at(&url, ports[k], &d, None, &env)
    };
    let mut replicas = [start_replica(0), start_replica(1)];
    wait_up("replica 0 up", ports[0]);
    wait_up("replica 1 up", ports[1]);
    let nodes = ["node-a", "node-b", "node-c"];
    let mut agents: Vec<Proc> = nodes
        .iter()
        .map(|n| agent_endpoints(n, &endpoints, dir.as_path(), None))
        .collect();
    // Sampler: how long each job had two live processes at once. A move to
    // another node overlaps for a moment (the new node launches while the
    // old one checkpoints and exits: at most the agents' checkpoint timeout
    // plus grace, 6 s here); longer is a duplicate.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, d) = (stop.clone(), dir.as_path().to_path_buf());
        std::thread::spawn(move || {
            let mut since: BTreeMap<String, Instant> = BTreeMap::new();
            let mut overlaps: Vec<(String, f64)> = Vec::new();
            loop {
                let now = Instant::now();
                let done = stop.load(std::sync::atomic::Ordering::Relaxed);
                let twice: Vec<String> = processes_per_job(&d)
                    .into_iter()
                    .filter(|(_, k)| *k > 1 && !done)
                    .map(|(j, _)| j)
                    .collect();
                for j in &twice {
                    since.entry(j.clone()).or_insert(now);
                }
                let ended: Vec<String> = since
                    .keys()
                    .filter(|j| !twice.contains(j))
                    .cloned()
                    .collect();
                for j in ended {
                    let t = since.remove(&j).unwrap();
                    overlaps.push((j, (now - t).as_secs_f64()));
                }
                if done {
                    return overlaps;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    // Sized so the work keeps the 12 GPUs about 60 % busy: a workload job
    // trains about 100 s / compression (measured: 6.5 s JCT at 26×, with
    // a round and a start-up), so n jobs of ~1.5 GPUs fill 60 % of 12 GPUs
    // over the run at compression ≈ 21·n / run seconds (200 jobs in
    // 30 min: 2.3×, jobs of about 45 s).
    let compression = (21.0 * n as f64 / (minutes * 60.0)).max(0.5);
    let workload: Vec<(String, String)> = workload_at(n, compression, "")
        .into_iter()
        .map(|(name, m)| (name, m.replace("max_gpus: 6", "max_gpus: 2")))
        .collect();
    let start = Instant::now();
    let run = Duration::from_secs_f64(minutes * 60.0);
    let batches = 10;
    let mut submitted = 0;
    let mut counts = BTreeMap::<&str, usize>::new();
    let mut kept_total = 0;
    let up_port = |replicas: &mut [Proc; 2]| {
        (0..2)
            .find(|&k| replicas[k].is_running())
            .map(|k| ports[k])
            .unwrap()
    };
    while start.elapsed() < run.mul_f64(0.75) {
        // Arrivals: batch b at b/batches of the first half.
        while submitted < batches
            && start.elapsed() >= run.mul_f64(0.5 * submitted as f64 / batches as f64)
        {
            let chunk = workload
                .iter()
                .skip(submitted * n / batches)
                .take((submitted + 1) * n / batches - submitted * n / batches)
                .cloned();
            let port = up_port(&mut replicas);
            wait_for("a batch submitted", Duration::from_secs(60), || {
                submit(port, dir.as_path(), chunk.clone())
            });
            submitted += 1;
        }
        std::thread::sleep(Duration::from_secs(rng.range(10, 30)));
        match rng.range(0, 4) {
            0 => {
                // The active replica: the one whose last term is the plan's.
                let epoch = plan_epoch(&url).await.1;
                let Some(k) = (0..2).find(|&k| led_epoch(&replicas[k].log_text()) == Some(epoch))
                else {
                    continue; // a takeover in progress: try later
                };
                let other = 1 - k;
                let (a, b) = if k == 0 {
                    let (x, y) = replicas.split_at_mut(1);
                    (&mut x[0], &y[0])
                } else {
                    let (x, y) = replicas.split_at_mut(1);
                    (&mut y[0], &x[0])
                };
                kept_total += fail_over(&url, dir.as_path(), a, b, ports[other])
                    .await
                    .len();
                std::thread::sleep(Duration::from_secs(rng.range(1, 5)));
                replicas[k] = start_replica(k);
                wait_up("a killed replica back", ports[k]);
                *counts.entry("scheduler_kills").or_default() += 1;
            }
            1 => {
                let k = rng.range(0, 3) as usize;
                agents[k].kill9();
                kill_processes_with_env(&format!("{}", dir.as_path().join(nodes[k]).display()));
                std::thread::sleep(Duration::from_secs(rng.range(2, 10)));
                agents[k] = agent_endpoints(nodes[k], &endpoints, dir.as_path(), None);
                *counts.entry("agent_kills").or_default() += 1;
            }
            2 => {
                let procs: Vec<u32> = trainer_processes(dir.as_path()).into_values().collect();
                if procs.is_empty() {
                    continue;
                }
                let pid = procs[rng.range(0, procs.len() as u64) as usize];
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                *counts.entry("trainer_kills").or_default() += 1;
            }
            _ => {
                pgc.ctl("stop");
                std::thread::sleep(Duration::from_secs(rng.range(1, 5)));
                pgc.ctl("start");
                *counts.entry("postgres_restarts").or_default() += 1;
            }
        }
        eprintln!("soak: {:.0} s, {counts:?}", start.elapsed().as_secs_f64());
    }
    // Everything must finish: jobs that failed or never completed are lost.
    // (Read from Postgres: every job, not a page of them.)
    let deadline = Duration::from_secs_f64((minutes * 60.0).max(600.0));
    let waited = Instant::now();
    let finals: BTreeMap<String, (String, String)> = loop {
        let rows: Vec<(String, String, Option<String>)> =
            match sqlx::PgConnection::connect(&url).await {
                Ok(mut db) => sqlx::query_as("SELECT id::text, state, output_path FROM jobs")
                    .fetch_all(&mut db)
                    .await
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
        let j: BTreeMap<String, (String, String)> = rows
            .into_iter()
            .map(|(id, st, out)| (id, (st, out.unwrap_or_default())))
            .collect();
        let open = j
            .values()
            .filter(|s| s.0 != "completed" && s.0 != "failed")
            .count();
        if (j.len() == n && open == 0) || waited.elapsed() > deadline {
            break j;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let overlaps = sampler.join().unwrap();
    const LONGEST_MOVE_S: f64 = 12.0; // 3 s checkpoint timeout + 3 s grace + start, exit and sampling
    let twice: Vec<&(String, f64)> = overlaps.iter().filter(|o| o.1 > LONGEST_MOVE_S).collect();
    let longest = overlaps.iter().map(|o| o.1).fold(0.0, f64::max);
    let lost: Vec<String> = finals
        .iter()
        .filter(|(_, s)| s.0 != "completed" || !std::path::Path::new(&s.1).exists())
        .map(|(id, s)| format!("{id}: {} {:?}", s.0, s.1))
        .collect();
    let lost_n = lost.len() + n.saturating_sub(finals.len());
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    let completed_twice: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT job_id, count(*) FROM job_events WHERE to_state = 'completed'
         GROUP BY job_id HAVING count(*) <> 1",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    let duplicated = completed_twice.len() + twice.len();
    // A healthy process restarted by a failover panics in `fail_over`
    // with the job, its GPUs and both pids: reaching here means none was.
    let avg = {
        let t = jct_table_at(&url).await;
        t.values().map(|v| v.0).sum::<f64>() / t.len().max(1) as f64
    };
    println!(
        "soak: {:.1} min, {n} jobs, seed {seed}, {counts:?}, {kept_total} healthy processes kept through failovers, avg JCT {avg:.1} s, \
         {} moves overlapped old and new process (longest {longest:.1} s)\n\
         lost={lost_n} duplicated={duplicated} healthy_restarts=0",
        start.elapsed().as_secs_f64() / 60.0,
        overlaps.len()
    );
    assert!(
        lost.is_empty() && lost_n == 0,
        "lost jobs: {lost:?} ({} of {n} seen)",
        finals.len()
    );
    assert!(
        completed_twice.is_empty(),
        "jobs completed more than once: {completed_twice:?}"
    );
    assert!(
        twice.is_empty(),
        "jobs with two live processes for longer than a move: {twice:?}"
    );
    for r in &replicas {
        assert!(!r.log_text().contains("panicked"), "a replica panicked");
    }
    drop(agents);
}

pub(crate) const LYRA_ENV: [(&str, &str); 4] = [
    ("FMSCHED_SCHEDULING__PROFILING", "false"),
    ("FMSCHED_SCHEDULING__MERGING", "false"),
    ("FMSCHED_SCHEDULING__POLICY", "lyra"),
    ("FMSCHED_LOANS__HEADROOM", "0"),
];
