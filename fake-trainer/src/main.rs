//! `fake-trainer`: a FAKE training process for tests and demos. It needs no
//! GPU and no model, but obeys fmsched's training-process contract
//! (`docs/trainer-contract.md`) exactly:
//!
//! - reads its tasks, mode, checkpoint folder, resume path, initial weights
//!   and ranks from the environment;
//! - advances at the speed the throughput LUT (the shipped analytic
//!   profiles) gives for its model, batch, GPU count and training settings
//!   (precision, activation checkpointing, PETL, frozen layers — the same
//!   variant the scheduler estimates with), divided by a time compression
//!   factor (`FMSCHED_FAKE_TIME_COMPRESSION`, default 1000: an hour of
//!   training takes 3.6 s);
//! - learns less per iteration with frozen layers: ICEFROG's frozen penalty
//!   ψ (Eq. 3) of a fake per-layer gradient variance that grows with depth
//!   ([`frozen_penalty_of`]), so freezing trades faster steps for more of
//!   them, as the paper measures;
//! - evaluates its target metric every epoch — an accuracy that rises, or,
//!   for a target with `lower_is_better`, a validation loss that falls — and
//!   stops when it reaches the target in that sense;
//! - reports loss along a Ymir Eq. 3 curve with noise, an evaluation metric
//!   every epoch, and in profile mode a Task2Vec-style embedding;
//! - writes real checkpoint files (periodically, on SIGUSR2 and on SIGTERM)
//!   and resumes from them where they stopped;
//! - starts up like a real trainer: its data loader takes
//!   `FMSCHED_FAKE_LOADER_S` simulated seconds (default 2) before the first
//!   step; launched in standby (`FMSCHED_STANDBY=1`) it does that ahead,
//!   reports `prewarmed` and waits for SIGUSR1 (Ymir §6.2). Before that it
//!   loads the runtime and the weights: for a prompt-tuning task PromptTuner's
//!   `T_cold` of its model (`prompttuner::cold_start_s`), for others
//!   nothing beyond the loader unless `FMSCHED_FAKE_WEIGHTS_S` says so;
//! - exits 0 when every task reached its target, after writing its output;
//!   launched warm (`FMSCHED_WARM=1`, PromptTuner's warm pools) it reports
//!   `warm` instead and waits: on SIGUSR1 it runs the task of
//!   `FMSCHED_NEXT_TASK` without loading the weights again (its log says
//!   "warm start"), on SIGTERM it exits 0.
//!
//! Merges behave by one fake transfer law ([`true_gain`]): tasks whose
//! Task2Vec-style embeddings are close help each other, as Ymir assumes.
//! - temporal (`A ↦ B`): B started from A's weights (`FMSCHED_INIT_WEIGHTS`)
//!   learns `1 + G` times as fast; while A trains, an `eval_only` task B is
//!   evaluated every epoch of A and improves only when `G > 0`;
//! - spatial (`A ‖ B`, two trained tasks): each task learns `1 + G` times as
//!   fast from its own samples, and not at all when `G < 0` (interference:
//!   its accuracy stalls, which the merge guard must catch).
//!
//! Prompt-tuning tasks (`petl` = prompt_tuning) write `prompt.json` with 16
//! fake activation features of their task ([`prompt_features`]) and report
//! them with `done`. Given a Prompt Bank (`prompt_bank`), one walks it as
//! the contract says, scoring a candidate 1 + the cosine distance of its
//! features to its own task's ([`prompt_score`]), reports `prompt_init`, and
//! learns up to 1.5 times as fast from a prompt of its own task.
//!
//! Jobs over several nodes (`NNODES` > 1) rendezvous like torchrun's: the
//! process of `NODE_RANK` 0 listens at `MASTER_ADDR:MASTER_PORT` and waits
//! for the other nodes' processes to connect (at most
//! `FMSCHED_FAKE_RENDEZVOUS_TIMEOUT_S`, default 60 s; then it exits 4). It
//! trains, checkpoints and reports; it tells the others of every checkpoint
//! it wrote and of the end. The others report nothing but the checkpoints
//! rank 0 wrote (when asked for one), exit 0 at the end and 5 when rank 0
//! goes away; rank 0 exits 5 when another node's process goes away and it
//! is not stopped within its grace. A broken rendezvous fails loudly; a
//! process stopped (SIGTERM) while it waits in the rendezvous exits at once,
//! rank 0 closing its listener (after a checkpoint of the state it started
//! from, also written on SIGUSR2 there).
//!
//! Test knobs: `FMSCHED_FAKE_IGNORE_SIGTERM=1` ignores SIGTERM (to test the
//! agent's SIGKILL), `FMSCHED_FAKE_CRASH_AT=N` exits 3 at iteration N,
//! `FMSCHED_FAKE_GPU_TYPE` (default: the node's `FMSCHED_GPU_MODEL`, else V100), `FMSCHED_FAKE_PROFILE_STEPS`,
//! `FMSCHED_FAKE_GAIN_OFFSET=x` adds `x` to every transfer gain (a negative
//! offset makes merges harmful, to test the guard),
//! `FMSCHED_FAKE_FAIL_JOIN_ONCE=1` makes a gang's non-zero node exit 3
//! before it joins rank 0, the first time it starts on its node.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fmsched_core::trainer::{Control, Report, TaskAssignment, env};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::{Lut, Variant, packed_placement};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};

/// Deterministic number in [0, 1) from a name.
fn unit(name: &str) -> f64 {
    let mut h = fmsched_core::hash::fnv1a(name.as_bytes());
    h ^= h >> 31;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Per-task state, also what a checkpoint and the output weights store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct TaskState {
    job_id: String,
    iteration: u64,
    samples: u64,
    done: bool,
    #[serde(default)]
    model: String,
    #[serde(default)]
    task: String,
    /// Iterations' worth of learning on this task (differs from `iteration`
    /// under a merge: faster with a positive gain, none with a negative one).
    #[serde(default)]
    effective: f64,
    /// Transfer gain inherited from the initial weights (temporal merges).
    #[serde(default)]
    gain: f64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Checkpoint {
    format: String,
    tasks: Vec<TaskState>,
}

/// The Task2Vec-style embedding the fake reports for a task: tasks fall
/// into one of three families per model (the family's heavy-tailed Fisher
/// mass dominates, so tasks of one family are close and others far), plus a
/// task-specific share and a small per-draw perturbation.
fn embedding_of(model: &str, task: &str, repeat: bool) -> Vec<f64> {
    let family = (unit(&format!("{model}|{task}|family")) * 3.0) as u32;
    (0..64)
        .map(|d| {
            let shared = 2.0 * unit(&format!("{model}|family{family}|dim{d}")).powi(4);
            let own = 0.6 * unit(&format!("{model}|{task}|dim{d}")).powi(4);
            let draw = 0.01 * unit(&format!("{model}|{task}|dim{d}|{repeat}"));
            0.02 + shared + own + draw
        })
        .collect()
}

/// The fake world's prompt features (PromptTuner §4.4.3.1): a prompt tuned
/// for `task` of `model` has these 16 activation features — the task's own
/// direction plus a small per-job draw, so prompts of one task are alike
/// and prompts of other tasks are not.
fn prompt_features(model: &str, task: &str, job_id: &str) -> Vec<f64> {
    (0..16)
        .map(|d| {
            2.0 * unit(&format!("{model}|{task}|prompt{d}")) - 1.0
                + 0.1 * (unit(&format!("{job_id}|prompt{d}")) - 0.5)
        })
        .collect()
}

/// The fake world's Eq. 4.1: the mean loss of `task` started from a bank
/// candidate's prompt, without tuning — 1 + the cosine distance between
/// the candidate's features (its `prompt.json`) and the task's own; an
/// unreadable candidate scores +∞.
fn prompt_score(model: &str, task: &str, c: &fmsched_core::trainer::BankCandidate) -> f64 {
    // A prompt file, or a prompt directory holding `prompt.json` (the
    // Python helper's output).
    let path = Path::new(&c.path);
    let file = if path.is_dir() {
        path.join("prompt.json")
    } else {
        path.to_path_buf()
    };
    let features = std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| serde_json::from_value::<Vec<f64>>(v["features"].clone()).ok());
    match features {
        Some(f) if !f.is_empty() => {
            let own = prompt_features(model, task, "");
            1.0 + fmsched_core::policy::prompttuner::cosine_distance(&f, &own)
        }
        _ => {
            eprintln!(
                "fake-trainer: Prompt Bank: {} has no features; skipped",
                c.path
            );
            f64::INFINITY
        }
    }
}

/// Picks a prompt-tuning task's initial prompt from its Prompt Bank file
/// (the contract's two-layer walk). The pick's transfer gain: a prompt
/// with the task's own features (score 1) speeds learning up 1.5 times,
/// an unrelated one (score ≥ 2) not at all.
fn pick_from_bank(t: &TaskAssignment, file: &str) -> anyhow::Result<Option<(Report, f64)>> {
    use fmsched_core::trainer::{BankCandidate, bank_clusters, walk_bank};
    let text = std::fs::read(file).with_context(|| format!("prompt_bank: reading {file}"))?;
    let bank: Vec<BankCandidate> =
        serde_json::from_slice(&text).with_context(|| format!("prompt_bank: {file}"))?;
    let clusters = bank_clusters(&bank);
    let Some((best, score, scored)) = walk_bank(&clusters, |c| prompt_score(&t.model, &t.task, c))
    else {
        return Ok(None);
    };
    if !score.is_finite() {
        return Ok(None);
    }
    let gain = 0.5 * (2.0 - score).clamp(0.0, 1.0);
    eprintln!(
        "fake-trainer: Prompt Bank: starting from job {}'s prompt (score {score:.3}; {scored} of {} prompts scored; transfer gain {gain:.3})",
        best.id,
        bank.len()
    );
    let r = Report::PromptInit {
        job_id: t.job_id.clone(),
        from: best.id.clone(),
        score,
        scored: scored as u32,
        candidates: bank.len() as u32,
    };
    Ok(Some((r, gain)))
}

/// The fake world's transfer law: the gain `G` that training on `from` gives
/// `to` (Ymir Eq. 1). It follows Task2Vec's premise with the estimator's
/// prior line (`fmsched_estimator::transfer::GainModel`) plus a deterministic
/// per-pair deviation of up to ±0.08, so the estimator is good, not exact.
fn true_gain(model: &str, from: &str, to: &str, spatial: bool) -> f64 {
    use fmsched_estimator::transfer::{GainModel, TaskEmbedding, spatial_score, temporal_score};
    let emb = |t: &str| TaskEmbedding {
        fisher: embedding_of(model, t, false),
        fisher_repeat: embedding_of(model, t, true),
    };
    let (a, b) = (emb(from), emb(to));
    let s = if spatial {
        spatial_score(&a, &b)
    } else {
        temporal_score(&a, &b)
    };
    let offset: f64 = var("FMSCHED_FAKE_GAIN_OFFSET")
        .and_then(|o| o.parse().ok())
        .unwrap_or(0.0);
    let wobble = 0.16 * (unit(&format!("{model}|{from}->{to}")) - 0.5);
    (GainModel::default().predict(s) + wobble + offset).max(-0.9)
}

/// The synthetic learning behaviour of one task.
struct Curve {
    beta0: f64,
    beta1: f64,
    beta2: f64,
    /// Iterations to half of the metric's headroom.
    half: f64,
    metric_max: f64,
}

impl Curve {
    fn for_task(model: &str, task: &str) -> Curve {
        let k = format!("{model}|{task}");
        let beta1 = 1.0 / (1.0 + 1.5 * unit(&format!("{k}|a")));
        let h = 100.0 + 900.0 * unit(&format!("{k}|h"));
        Curve {
            beta0: 0.1 + 0.3 * unit(&format!("{k}|floor")),
            beta1,
            beta2: beta1 / h,
            half: h,
            metric_max: 0.80 + 0.18 * unit(&format!("{k}|m")),
        }
    }

    /// Ymir Eq. 3 with β3 = 0 at `x` iterations' worth of learning, scaled
    /// by an inherited transfer gain: `L/(1+G)` (seeds README fix of Eq. 2).
    fn loss(&self, x: f64, gain: f64) -> f64 {
        (1.0 / (self.beta2 * x + self.beta1) + self.beta0) / (1.0 + gain)
    }

    /// A saturating metric at `x` iterations' worth of learning.
    fn metric(&self, x: f64) -> f64 {
        0.5 + (self.metric_max - 0.5) * x / (x + self.half)
    }

    /// The evaluation at `x`: the accuracy-like [`Curve::metric`], or for a
    /// lower-is-better target the validation loss (the noiseless curve).
    fn evaluation(&self, x: f64, lower_is_better: bool) -> f64 {
        if lower_is_better {
            self.loss(x, 0.0)
        } else {
            self.metric(x)
        }
    }
}

/// The fake world's per-layer gradient variance
/// ([`fmsched_estimator::icefrog::synthetic_layer_variance`]): what a
/// layer-elastic fake trainer reports each epoch.
fn fake_layer_variance(layers: u32) -> Vec<f64> {
    fmsched_estimator::icefrog::synthetic_layer_variance(layers)
}

/// ICEFROG Eq. 3 for the fake world: `ψ(ℓ)` over [`fake_layer_variance`].
/// Freezing half of 12 layers gives ψ = 57/78 ≈ 0.73.
fn frozen_penalty_of(frozen: u32, layers: u32) -> f64 {
    fmsched_estimator::icefrog::synthetic_frozen_penalty(frozen, layers)
}

/// Seconds per iteration with `ℓ` frozen layers (None: no profile fits).
type StepOf = Box<dyn Fn(u32) -> Option<f64>>;

struct Trainer {
    tasks: Vec<TaskAssignment>,
    state: Vec<TaskState>,
    curves: Vec<Curve>,
    profile: bool,
    /// Learning speed of each task in this process (1 alone; `1 + G` or 0
    /// in a spatial merge).
    speed: Vec<f64>,
    ckpt_dir: PathBuf,
    out_dir: PathBuf,
    seconds_per_iteration: f64,
    samples_per_epoch: Vec<u64>,
    reporter: Reporter,
    noise: u64,
    /// Layer elasticity: the frozen layers it trains with, the model's
    /// layers, the speed of each task without the frozen penalty, the step
    /// time by frozen layers, and the control file it reads each epoch.
    frozen: u32,
    layers: u32,
    base_speed: Vec<f64>,
    step_of: StepOf,
    control: Option<PathBuf>,
    /// Another process shares its GPU: it runs at λ = 0.9 of its speed
    /// (ICEFROG Eq. 8), from launch or from the control file.
    shared: bool,
    /// Rank 0 of a job over several nodes: the other nodes' processes.
    followers: Vec<tokio::net::tcp::OwnedWriteHalf>,
}

/// Writes report lines to the socket (or standard output without one).
enum Reporter {
    Socket(tokio::net::UnixStream),
    Stdout,
}

impl Reporter {
    async fn send(&mut self, r: &Report) {
        let line = r.to_line();
        match self {
            Reporter::Socket(s) => {
                if s.write_all(line.as_bytes()).await.is_err() {
                    eprintln!("fake-trainer: report socket closed; reporting on stdout");
                    *self = Reporter::Stdout;
                    print!("{line}");
                }
            }
            Reporter::Stdout => {
                print!("{line}");
                let _ = std::io::stdout().flush();
            }
        }
    }
}

/// This process's place in a job over several nodes (torchrun's
/// variables, docs/trainer-contract.md).
struct GangEnv {
    nnodes: u32,
    node_rank: u32,
    master: String,
    timeout: Duration,
}

impl GangEnv {
    fn from_env() -> anyhow::Result<Option<GangEnv>> {
        let nnodes: u32 = var(env::NNODES).and_then(|n| n.parse().ok()).unwrap_or(1);
        if nnodes <= 1 {
            return Ok(None);
        }
        let node_rank: u32 = var(env::NODE_RANK)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("{} > 1 but {} is not set", env::NNODES, env::NODE_RANK))?;
        let addr = var(env::MASTER_ADDR)
            .with_context(|| format!("{} > 1 but {} is not set", env::NNODES, env::MASTER_ADDR))?;
        let port = var(env::MASTER_PORT)
            .with_context(|| format!("{} > 1 but {} is not set", env::NNODES, env::MASTER_PORT))?;
        let timeout = Duration::from_secs_f64(
            var("FMSCHED_FAKE_RENDEZVOUS_TIMEOUT_S")
                .and_then(|t| t.parse().ok())
                .unwrap_or(60.0),
        );
        Ok(Some(GangEnv {
            nnodes,
            node_rank,
            master: format!("{addr}:{port}"),
            timeout,
        }))
    }
}

/// Rank 0's side of the rendezvous: listens at the master address and
/// waits for every other node's process. Returns their write halves and a
/// channel that names a node whose process went away.
async fn lead_rendezvous(
    g: &GangEnv,
) -> anyhow::Result<(
    Vec<tokio::net::tcp::OwnedWriteHalf>,
    tokio::sync::mpsc::UnboundedReceiver<u32>,
)> {
    use tokio::io::AsyncBufReadExt;
    let port = g.master.rsplit_once(':').map_or("", |p| p.1);
    let deadline = Instant::now() + g.timeout;
    // The port may still be held by this job's previous rank 0 for a moment.
    let listener = loop {
        match tokio::net::TcpListener::bind(format!("0.0.0.0:{port}")).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("fake-trainer: rendezvous: binding port {port}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("rendezvous: cannot listen on port {port}: {e}"),
        }
    };
    let (lost_tx, lost_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut followers = Vec::new();
    while followers.len() + 1 < g.nnodes as usize {
        let accepted = tokio::time::timeout_at(deadline.into(), listener.accept()).await;
        let Ok(Ok((stream, peer))) = accepted else {
            eprintln!(
                "fake-trainer: rendezvous at {} timed out after {:?}: {} of {} nodes joined",
                g.master,
                g.timeout,
                followers.len() + 1,
                g.nnodes
            );
            std::process::exit(4);
        };
        let (read, write) = stream.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        let node = match lines.next_line().await {
            Ok(Some(l)) => l.strip_prefix("hello ").and_then(|n| n.parse::<u32>().ok()),
            _ => None,
        };
        let Some(node) = node else {
            eprintln!("fake-trainer: rendezvous: {peer} did not say hello; ignored");
            continue;
        };
        eprintln!("fake-trainer: rendezvous: node {node} joined from {peer}");
        followers.push(write);
        let lost = lost_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(_)) = lines.next_line().await {}
            let _ = lost.send(node);
        });
    }
    eprintln!(
        "fake-trainer: rendezvous at {} complete: {} nodes",
        g.master, g.nnodes
    );
    Ok((followers, lost_rx))
}

/// A non-zero node's process: joins rank 0's rendezvous, then follows it
/// (see the module docs). Never returns.
async fn follow(
    g: &GangEnv,
    reporter: &mut Reporter,
    usr2: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
) -> ! {
    use tokio::io::AsyncBufReadExt;
    let deadline = Instant::now() + g.timeout;
    eprintln!(
        "fake-trainer: node {} of {}: joining rank 0 at {}",
        g.node_rank, g.nnodes, g.master
    );
    let stream = loop {
        match tokio::net::TcpStream::connect(&g.master).await {
            Ok(s) => break s,
            // Rank 0 may not listen yet (its loader is still starting).
            // Stopped meanwhile, it goes at once (it trained nothing).
            Err(_) if Instant::now() < deadline => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                    // Not joined: no checkpoint of rank 0's to report yet
                    // (consumed, so it is not taken for a later request).
                    _ = usr2.recv() => {}
                    _ = term.recv() => {
                        eprintln!("fake-trainer: stopped before joining rank 0 at {}", g.master);
                        std::process::exit(0);
                    }
                }
            }
            Err(e) => {
                eprintln!(
                    "fake-trainer: rendezvous at {} timed out after {:?}: {e}",
                    g.master, g.timeout
                );
                std::process::exit(4);
            }
        }
    };
    let (read, mut write) = stream.into_split();
    if write
        .write_all(format!("hello {}\n", g.node_rank).as_bytes())
        .await
        .is_err()
    {
        eprintln!("fake-trainer: rendezvous at {}: rank 0 went away", g.master);
        std::process::exit(5);
    }
    eprintln!(
        "fake-trainer: node {} of {} joined rank 0 at {}",
        g.node_rank, g.nnodes, g.master
    );
    let mut lines = tokio::io::BufReader::new(read).lines();
    let mut asked = false;
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(l)) if l == "done" => {
                    eprintln!("fake-trainer: rank 0 finished the job");
                    std::process::exit(0);
                }
                Ok(Some(l)) => {
                    // "ckpt <iteration> <path>": reported when asked for one.
                    let mut it = l.splitn(3, ' ');
                    if let (Some("ckpt"), Some(i), Some(path)) = (it.next(), it.next(), it.next())
                        && asked
                    {
                        asked = false;
                        reporter.send(&Report::Checkpoint {
                            path: path.to_string(),
                            iteration: i.parse().unwrap_or(0),
                        }).await;
                    }
                }
                _ => {
                    eprintln!("fake-trainer: rank 0 at {} went away; exiting", g.master);
                    std::process::exit(5);
                }
            },
            _ = usr2.recv() => asked = true,
            _ = term.recv() => {
                eprintln!("fake-trainer: stopped (rank 0 writes the checkpoint)");
                std::process::exit(0);
            }
        }
    }
}

fn var(name: &str) -> Option<String> {
    // A warm process's next task replaces the contract's per-task
    // variables (one it leaves out is unset for that task).
    if let Some(next) = overrides().as_ref()
        && fmsched_core::trainer::NEXT_TASK_KEYS.contains(&name)
    {
        return next.get(name).filter(|v| !v.trim().is_empty()).cloned();
    }
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The lease end in the control file, re-read when the file changes: due
/// once per lease end, when it is at most `ahead` seconds away.
#[derive(Default)]
struct LeaseWatch {
    seen: Option<std::time::SystemTime>,
    end: Option<f64>,
    done_for: Option<f64>,
}

impl LeaseWatch {
    /// Seconds left when a checkpoint is due now.
    fn due(&mut self, control: Option<&std::path::Path>, ahead: f64) -> Option<f64> {
        let path = control?;
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified != self.seen {
            self.seen = modified;
            self.end = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<Control>(&t).ok())
                .and_then(|c| c.lease_end);
        }
        let end = self.end.filter(|&e| Some(e) != self.done_for)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs_f64();
        let left = end - now;
        (left <= ahead).then(|| {
            self.done_for = Some(end);
            left
        })
    }
}

impl Trainer {
    /// Step time over the step time alone: 1/λ on a shared GPU.
    fn share_factor(&self) -> f64 {
        if self.shared {
            1.0 / fmsched_core::policy::SHARED_SLOWDOWN
        } else {
            1.0
        }
    }

    fn next_noise(&mut self) -> f64 {
        self.noise ^= self.noise << 13;
        self.noise ^= self.noise >> 7;
        self.noise ^= self.noise << 17;
        (self.noise >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }

    async fn checkpoint(&mut self) -> anyhow::Result<()> {
        let it = self.state.iter().map(|s| s.iteration).max().unwrap_or(0);
        let path = self.ckpt_dir.join(format!("ckpt-{it:09}.json"));
        let c = Checkpoint {
            format: "fmsched-fake-trainer/2".into(),
            tasks: self.state.clone(),
        };
        write_atomic(&path, &serde_json::to_vec_pretty(&c)?)?;
        self.reporter
            .send(&Report::Checkpoint {
                path: path.display().to_string(),
                iteration: it,
            })
            .await;
        self.tell_followers(&format!("ckpt {it} {}\n", path.display()))
            .await;
        Ok(())
    }

    /// Rank 0: a line to every other node's process (one gone is noticed
    /// by its reader).
    async fn tell_followers(&mut self, line: &str) {
        for f in &mut self.followers {
            let _ = f.write_all(line.as_bytes()).await;
        }
    }

    /// Task `i` reached its target: its output (weights, or a tuned
    /// prompt) is written and reported.
    async fn deliver(&mut self, i: usize) -> anyhow::Result<()> {
        self.state[i].done = true;
        let dir = self.out_dir.join(&self.tasks[i].job_id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let t = &self.tasks[i];
        let prompt = t.settings.petl == "prompt_tuning";
        let features = if prompt {
            prompt_features(&t.model, &t.task, &t.job_id)
        } else {
            Vec::new()
        };
        let out = if prompt {
            // A prompt-tuning job's output is its tuned prompt (the
            // real helper writes a peft prompt adapter), not weights.
            let out = dir.join("prompt.json");
            let prompt = serde_json::json!({
                "job_id": t.job_id,
                "model": t.model,
                "num_virtual_tokens": t.settings.num_virtual_tokens,
                "initial_prompt": t.settings.initial_prompt,
                "iteration": self.state[i].iteration,
                "features": features,
            });
            write_atomic(&out, &serde_json::to_vec_pretty(&prompt)?)?;
            out
        } else {
            let out = dir.join("weights.json");
            write_atomic(&out, &serde_json::to_vec_pretty(&self.state[i])?)?;
            out
        };
        self.reporter
            .send(&Report::Done {
                job_id: self.tasks[i].job_id.clone(),
                output: out.display().to_string(),
                prompt_features: features,
            })
            .await;
        Ok(())
    }

    /// The tasks this process trains (the others are watched, eval_only).
    fn trained(&self) -> Vec<usize> {
        (0..self.tasks.len())
            .filter(|&i| !self.tasks[i].eval_only)
            .collect()
    }

    /// Advances by `steps` joint iterations; returns true when every trained
    /// task is done.
    async fn advance(&mut self, steps: u64, crash_at: Option<u64>) -> anyhow::Result<bool> {
        let trained = self.trained();
        let total_epoch: u64 = trained.iter().map(|&i| self.samples_per_epoch[i]).sum();
        let joint_batch: u64 = trained
            .iter()
            .map(|&i| u64::from(self.tasks[i].global_batch_size))
            .sum();
        let mut epochs_passed = false;
        for &i in &trained {
            if self.state[i].done {
                continue;
            }
            // A joint (spatial) process samples both datasets in proportion.
            let batch = u64::from(self.tasks[i].global_batch_size);
            let before_epoch = self.state[i].samples / self.samples_per_epoch[i];
            self.state[i].iteration += steps;
            let own_samples = if trained.len() > 1 {
                let share = self.samples_per_epoch[i] as f64 / total_epoch as f64;
                (steps as f64 * joint_batch as f64 * share).round() as u64
            } else {
                steps * batch
            };
            self.state[i].samples += own_samples;
            // Learning counted in iterations of this task's own batch.
            self.state[i].effective += self.speed[i] * own_samples as f64 / batch.max(1) as f64;
            if let Some(c) = crash_at
                && self.state[i].iteration >= c
            {
                eprintln!(
                    "fake-trainer: simulated crash at iteration {}",
                    self.state[i].iteration
                );
                std::process::exit(3);
            }
            let x = self.state[i].effective;
            let noise = 1.0 + 0.03 * self.next_noise();
            let loss = self.curves[i].loss(x, self.state[i].gain) * noise;
            let report = Report::Progress {
                job_id: self.tasks[i].job_id.clone(),
                iteration: self.state[i].iteration,
                samples: self.state[i].samples,
                loss,
                step_time_s: self.seconds_per_iteration,
            };
            self.reporter.send(&report).await;
            let epoch = self.state[i].samples / self.samples_per_epoch[i];
            let max_it = self.tasks[i].max_iterations;
            let max_epochs = u64::from(self.tasks[i].max_epochs);
            let mut reached = (max_it > 0 && self.state[i].iteration >= max_it)
                || (max_epochs > 0 && epoch >= max_epochs);
            if epoch > before_epoch && !self.profile {
                epochs_passed |= i == trained[0];
                // An inherited gain speeds learning up (`1 + G` times).
                let lower = self.tasks[i].settings.metric_lower_is_better;
                let value = self.curves[i].evaluation(x * (1.0 + self.state[i].gain), lower);
                reached |= self.eval(i, value).await;
                // What a training script prints: one line per epoch.
                println!(
                    "epoch {epoch} {}: iteration {} loss {loss:.4} {} {value:.4}",
                    self.tasks[i].task,
                    self.state[i].iteration,
                    self.tasks[i].metric.as_deref().unwrap_or("accuracy")
                );
            }
            if reached && !self.profile {
                self.deliver(i).await?;
            }
        }
        if epochs_passed && !self.profile {
            self.epoch_start().await;
        }
        // Watched tasks (temporal merge guard): B evaluated with A's current
        // weights; it improves as A learns only when A's weights help B.
        if epochs_passed {
            let a = trained[0];
            for i in 0..self.tasks.len() {
                if self.tasks[i].eval_only {
                    let g = true_gain(
                        &self.tasks[a].model,
                        &self.tasks[a].task,
                        &self.tasks[i].task,
                        false,
                    );
                    let lower = self.tasks[i].settings.metric_lower_is_better;
                    let value =
                        self.curves[i].evaluation(g.max(0.0) * self.state[a].effective, lower);
                    self.eval(i, value).await;
                }
            }
        }
        Ok(trained.iter().all(|&i| self.state[i].done))
    }

    /// At an epoch boundary: report the per-layer gradient variance
    /// (ICEFROG Eq. 3), then apply a changed `frozen_layers` from the
    /// control file — the step time and the learning per step change, the
    /// process goes on.
    async fn epoch_start(&mut self) {
        let control: Option<Control> = self.control.as_ref().and_then(|path| {
            // Absent: nothing changed yet.
            let text = std::fs::read_to_string(path).ok()?;
            serde_json::from_str(&text)
                .map_err(|e| eprintln!("fake-trainer: {}: {e}; ignored", path.display()))
                .ok()
        });
        // A partner joined or left its GPU (ICEFROG Eq. 8: λ = 0.9).
        if let Some(shared) = control
            .as_ref()
            .and_then(|c| c.shared_gpu)
            .filter(|&s| s != self.shared)
        {
            let lambda = fmsched_core::policy::SHARED_SLOWDOWN;
            let step = if shared {
                self.seconds_per_iteration / lambda
            } else {
                self.seconds_per_iteration * lambda
            };
            eprintln!(
                "fake-trainer: {}: {:.3} → {step:.3} s/iteration",
                if shared {
                    "sharing its GPU with another process (λ = 0.9) from now on"
                } else {
                    "no longer sharing its GPU"
                },
                self.seconds_per_iteration
            );
            self.shared = shared;
            self.seconds_per_iteration = step;
        }
        if self.tasks.iter().all(|t| t.settings.max_frozen_layers == 0) {
            return; // not layer-elastic
        }
        let a = self
            .tasks
            .iter()
            .position(|t| !t.eval_only)
            .unwrap_or_default();
        let epoch = self.state[a].samples as f64 / self.samples_per_epoch[a] as f64;
        self.reporter
            .send(&Report::LayerVariance {
                job_id: self.tasks[a].job_id.clone(),
                epoch,
                frozen_layers: self.frozen,
                variance: fake_layer_variance(self.layers),
            })
            .await;
        let Some(l) = control
            .and_then(|c| c.frozen_layers)
            .filter(|&l| l != self.frozen)
        else {
            return;
        };
        let Some(step) = (self.step_of)(l) else {
            eprintln!(
                "fake-trainer: frozen layers {l}: no profile fits; kept {}",
                self.frozen
            );
            return;
        };
        eprintln!(
            "fake-trainer: frozen layers {} → {l} at epoch {epoch:.0}: {:.3} → {step:.3} s/iteration, ψ {:.3}",
            self.frozen,
            self.seconds_per_iteration,
            frozen_penalty_of(l, self.layers)
        );
        self.frozen = l;
        self.seconds_per_iteration = step * self.share_factor();
        let psi = frozen_penalty_of(l, self.layers);
        for (s, b) in self.speed.iter_mut().zip(&self.base_speed) {
            *s = b * psi;
        }
        for t in &mut self.tasks {
            t.settings.frozen_layers = l;
        }
    }

    /// Reports an evaluation of task `i`; true when it reaches the metric target.
    async fn eval(&mut self, i: usize, value: f64) -> bool {
        let metric = self.tasks[i]
            .metric
            .clone()
            .unwrap_or_else(|| "accuracy".into());
        self.reporter
            .send(&Report::Eval {
                job_id: self.tasks[i].job_id.clone(),
                iteration: self.state[i].iteration,
                epoch: self.state[i].samples as f64 / self.samples_per_epoch[i] as f64,
                metric,
                value,
            })
            .await;
        self.tasks[i].metric_reached(value)
    }
}

fn embedding(task: &TaskAssignment, repeat: bool) -> Vec<f64> {
    embedding_of(&task.model, &task.task, repeat)
}

/// `fake-trainer catalog`: the fake world as an `fmsim` task catalog
/// (fmsched layout), so the simulator can replay exactly the jobs the fake
/// trainer runs. Epochs are whole (the trainer evaluates at epoch ends) and
/// capped by the epoch budget; a spatial task under negative transfer makes
/// no progress, so it runs to the cap.
fn print_catalog(args: &[String]) -> anyhow::Result<()> {
    let usage = "usage: fake-trainer catalog --model M --tasks T:SAMPLES[,T:SAMPLES…] \
                 --batch B --metric-target X --max-epochs E";
    let mut opt = std::collections::BTreeMap::new();
    for pair in args.chunks(2) {
        match pair {
            [k, v] if k.starts_with("--") => {
                opt.insert(k.trim_start_matches("--").to_string(), v.clone());
            }
            _ => bail!("{usage}"),
        }
    }
    let get = |k: &str| {
        opt.get(k)
            .with_context(|| format!("--{k} is missing; {usage}"))
    };
    let model = get("model")?.clone();
    let batch: f64 = get("batch")?.parse().context("--batch: not a number")?;
    let target: f64 = get("metric-target")?
        .parse()
        .context("--metric-target: not a number")?;
    let cap: f64 = get("max-epochs")?
        .parse()
        .context("--max-epochs: not a number")?;
    let mut tasks = Vec::new();
    for t in get("tasks")?.split(',') {
        let (name, n) = t
            .split_once(':')
            .with_context(|| format!("--tasks: {t:?} is not TASK:SAMPLES"))?;
        let n: f64 = n
            .parse()
            .with_context(|| format!("--tasks: {n:?} is not a number"))?;
        tasks.push((name.to_string(), n));
    }
    // Epochs to the target when learning runs at `rate` times the alone speed.
    let epochs = |task: &str, samples: f64, rate: f64| -> f64 {
        let c = Curve::for_task(&model, task);
        if rate <= 0.0 || c.metric_max <= target {
            return cap;
        }
        let x = c.half * (target - 0.5) / (c.metric_max - target);
        (x / rate / (samples / batch)).ceil().clamp(1.0, cap)
    };
    let mut task_json = serde_json::Map::new();
    let mut temporal = serde_json::Map::new();
    let mut spatial = serde_json::Map::new();
    for (a, na) in &tasks {
        task_json.insert(
            a.clone(),
            serde_json::json!({"samples_per_epoch": na, "epochs": epochs(a, *na, 1.0)}),
        );
        for (b, nb) in &tasks {
            if a == b {
                continue;
            }
            let g = true_gain(&model, a, b, false);
            temporal.insert(
                format!("{a}->{b}"),
                serde_json::json!({"epochs": epochs(b, *nb, 1.0 + g)}),
            );
            if a < b {
                let rate = |from: &str, to: &str| {
                    let g = true_gain(&model, from, to, true);
                    if g < 0.0 { 0.0 } else { 1.0 + g }
                };
                spatial.insert(
                    format!("{a}|{b}"),
                    serde_json::json!({
                        a.clone(): {"epochs": epochs(a, *na, rate(b, a))},
                        b.clone(): {"epochs": epochs(b, *nb, rate(a, b))},
                    }),
                );
            }
        }
    }
    let out = serde_json::json!({"models": {model.clone(): {
        "tasks": task_json, "temporal": temporal, "spatial": spatial}}});
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("catalog") {
        if let Err(e) = print_catalog(&args[1..]) {
            eprintln!("fake-trainer: {e:#}");
            std::process::exit(2);
        }
        return;
    }
    if let Err(e) = run().await {
        eprintln!("fake-trainer: {e:#}");
        std::process::exit(2);
    }
}

/// The contract's signals, installed once for the process's life.
struct Signals {
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

/// How one task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ended {
    /// Every task reached its target and its output is written (its
    /// model, still loaded).
    Done(String),
    /// Stopped, suspended or a profiling run that ended: the process exits.
    Stopped,
}

async fn run() -> anyhow::Result<()> {
    // Handlers first: a signal that arrives while starting up must not take
    // its default action (SIGUSR1's is to terminate).
    let mut sig = Signals {
        usr1: signal(SignalKind::user_defined1())?,
        usr2: signal(SignalKind::user_defined2())?,
        term: signal(SignalKind::terminate())?,
    };
    // A warm process (PromptTuner's warm pools) serves task after task of
    // its model: the runtime and the weights load once.
    let warm = var(env::WARM).is_some_and(|v| v == "1");
    let mut loaded = false;
    loop {
        let started = Instant::now();
        let (Ended::Done(model), true) = (serve(&mut sig, loaded).await?, warm) else {
            return Ok(());
        };
        loaded = true;
        connect_reporter().await.send(&Report::Warm).await;
        eprintln!(
            "fake-trainer: warm: {model} stays loaded after {:.2} s; waiting for the next task (SIGUSR1)",
            started.elapsed().as_secs_f64()
        );
        tokio::select! {
            _ = sig.usr1.recv() => {}
            _ = sig.term.recv() => {
                eprintln!("fake-trainer: warm process stopped");
                return Ok(());
            }
        }
        let file = var(env::NEXT_TASK).with_context(|| {
            format!(
                "{} is not set (see docs/trainer-contract.md)",
                env::NEXT_TASK
            )
        })?;
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("{}: reading {file}", env::NEXT_TASK))?;
        let next: fmsched_core::trainer::NextTask =
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "{}: {file} is not a JSON object of variables",
                    env::NEXT_TASK
                )
            })?;
        eprintln!(
            "fake-trainer: warm start of job {} (no weight load)",
            next.get(env::JOB_ID).map_or("?", String::as_str)
        );
        *overrides() = Some(next);
    }
}

/// A warm process's next task's variables ([`env::NEXT_TASK`]): they
/// replace the launch environment's contract variables.
fn overrides() -> std::sync::MutexGuard<'static, Option<fmsched_core::trainer::NextTask>> {
    static NEXT: std::sync::Mutex<Option<fmsched_core::trainer::NextTask>> =
        std::sync::Mutex::new(None);
    NEXT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The report socket (standard output without one).
async fn connect_reporter() -> Reporter {
    match var(env::REPORT_SOCKET) {
        Some(p) => match tokio::net::UnixStream::connect(&p).await {
            Ok(s) => Reporter::Socket(s),
            Err(e) => {
                eprintln!("fake-trainer: cannot connect {p}: {e}; reporting on stdout");
                Reporter::Stdout
            }
        },
        None => Reporter::Stdout,
    }
}

/// Trains (or profiles) the tasks the environment names. `loaded`: a warm
/// process that has its model loaded already.
async fn serve(sig: &mut Signals, loaded: bool) -> anyhow::Result<Ended> {
    let begun = Instant::now();
    let Signals { usr1, usr2, term } = sig;
    let tasks_json = var(env::TASKS)
        .with_context(|| format!("{} is not set (see docs/trainer-contract.md)", env::TASKS))?;
    let tasks: Vec<TaskAssignment> = serde_json::from_str(&tasks_json)
        .with_context(|| format!("{}: not a JSON list of tasks", env::TASKS))?;
    let trained = tasks.iter().filter(|t| !t.eval_only).count();
    if trained == 0 || trained > 2 || tasks.len() > 4 {
        bail!(
            "{}: one trained task, or two for a spatial merge (plus watched eval_only tasks); got {} trained of {}",
            env::TASKS,
            trained,
            tasks.len()
        );
    }
    let profile = match var(env::MODE).as_deref() {
        Some("profile") => true,
        Some("train") | None => false,
        Some(o) => bail!("{}: {o:?} is neither profile nor train", env::MODE),
    };
    let ckpt_dir = PathBuf::from(
        var(env::CHECKPOINT_DIR).with_context(|| format!("{} is not set", env::CHECKPOINT_DIR))?,
    );
    std::fs::create_dir_all(&ckpt_dir)
        .with_context(|| format!("creating {}", ckpt_dir.display()))?;
    let out_dir = var(env::OUTPUT_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| ckpt_dir.join("output"));
    let world: u32 = var(env::WORLD_SIZE)
        .and_then(|w| w.parse().ok())
        .unwrap_or(1)
        .max(1);
    let compression: f64 = var("FMSCHED_FAKE_TIME_COMPRESSION")
        .and_then(|c| c.parse().ok())
        .unwrap_or(1000.0);
    // The GPU it pretends to run on: the test knob, else the node's GPUs.
    let gpu = analytic::gpu_family(
        &var("FMSCHED_FAKE_GPU_TYPE")
            .or_else(|| var(env::GPU_MODEL))
            .unwrap_or_else(|| "V100".into()),
    );
    let crash_at: Option<u64> = var("FMSCHED_FAKE_CRASH_AT").and_then(|c| c.parse().ok());
    let ignore_term = var("FMSCHED_FAKE_IGNORE_SIGTERM").is_some_and(|v| v == "1");
    let interval = Duration::from_secs_f64(
        var(env::CHECKPOINT_INTERVAL_S)
            .and_then(|c| c.parse().ok())
            .unwrap_or(60.0),
    );

    // Speed from the LUT: the joint batch of all tasks on `world` GPUs.
    let lut: Lut = analytic::default_lut()?;
    let model = tasks[0].model.clone();
    let batch: u32 = tasks
        .iter()
        .filter(|t| !t.eval_only)
        .map(|t| t.global_batch_size.max(1))
        .sum();
    let layers = analytic::layers_of(&model).unwrap_or(12);
    // The variant it trains in: one process, one setting (the scheduler
    // merges only jobs that train alike).
    let settings = tasks[0].settings.clone();
    let variant = Variant::of_settings(
        &settings,
        var(env::PIPELINE_STAGES).is_some(),
        var(env::EXPERT_PARALLEL)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let it = lut
        .iteration_time_on(
            &model,
            &gpu,
            &packed_placement(world, 4),
            batch,
            &variant,
            layers,
        )
        .or_else(|_| {
            lut.iteration_time_on(
                "roberta-base",
                &gpu,
                &packed_placement(world, 4),
                batch,
                &variant,
                12,
            )
        })
        .context("throughput lookup")?;
    // A shared GPU (ICEFROG Eq. 8): λ = 0.9 of the speed alone.
    let shared = var(env::SHARED_GPU).is_some_and(|v| v == "1");
    let share = if shared {
        1.0 / fmsched_core::policy::SHARED_SLOWDOWN
    } else {
        1.0
    };
    let seconds_per_iteration = it.seconds * share;
    if shared {
        eprintln!("fake-trainer: sharing its GPU with another process (λ = 0.9)");
    }
    eprintln!(
        "fake-trainer: {} {} on {world} {gpu} GPU(s): {seconds_per_iteration:.3} s/iteration, time compressed {compression}×",
        if profile { "profiling" } else { "training" },
        tasks
            .iter()
            .map(|t| format!(
                "{}{}",
                t.task,
                if t.eval_only { " (eval only)" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join(" + ")
    );

    eprintln!("fake-trainer: settings: {settings}");
    if let Some(stages) = var(env::PIPELINE_STAGES) {
        eprintln!(
            "fake-trainer: pipeline of {stages} stages, stage i on device i of CUDA_VISIBLE_DEVICES={}",
            var(env::CUDA_VISIBLE_DEVICES).unwrap_or_default()
        );
    }
    let mut state: Vec<TaskState> = tasks
        .iter()
        .map(|t| TaskState {
            job_id: t.job_id.clone(),
            iteration: 0,
            samples: 0,
            done: false,
            model: t.model.clone(),
            task: t.task.clone(),
            effective: 0.0,
            gain: 0.0,
        })
        .collect();
    // Temporal transfer: the initial weights carry A's gain for B.
    if let Some(init) = var(env::INIT_WEIGHTS) {
        let text = std::fs::read_to_string(&init)
            .with_context(|| format!("{}: reading {init}", env::INIT_WEIGHTS))?;
        let from: TaskState = serde_json::from_str(&text)
            .with_context(|| format!("{}: {init} is not fake weights", env::INIT_WEIGHTS))?;
        let from_task = if from.task.is_empty() {
            from.job_id.clone()
        } else {
            from.task.clone()
        };
        state[0].gain = true_gain(&tasks[0].model, &from_task, &tasks[0].task, false);
        eprintln!(
            "fake-trainer: starting from {init} ({from_task}); transfer gain {:.3}",
            state[0].gain
        );
    }
    // A prompt-tuning task without an initial prompt starts from the best
    // prompt of its model's Prompt Bank (a fresh start only).
    let mut prompt_init = None;
    if let (Some(file), None) = (&tasks[0].prompt_bank, var(env::RESUME_FROM))
        && tasks[0].settings.initial_prompt.is_empty()
        && let Some((report, gain)) = pick_from_bank(&tasks[0], file)?
    {
        state[0].gain = gain;
        prompt_init = Some(report);
    }
    if let Some(resume) = var(env::RESUME_FROM) {
        let text = std::fs::read_to_string(&resume)
            .with_context(|| format!("{}: reading {resume}", env::RESUME_FROM))?;
        let c: Checkpoint = serde_json::from_str(&text)
            .with_context(|| format!("{}: {resume} is not a checkpoint", env::RESUME_FROM))?;
        for mut s in c.tasks {
            if let Some(mine) = state.iter_mut().find(|m| m.job_id == s.job_id) {
                if s.effective == 0.0 && s.iteration > 0 {
                    s.effective = s.iteration as f64; // a checkpoint of format 1
                }
                s.model.clone_from(&mine.model);
                s.task.clone_from(&mine.task);
                *mine = s;
            }
        }
        eprintln!(
            "fake-trainer: resumed from {resume} at iteration {}",
            state[0].iteration
        );
    }
    let mut reporter = connect_reporter().await;
    if let Some(r) = &prompt_init {
        reporter.send(r).await;
    }
    let samples_per_epoch: Vec<u64> = tasks
        .iter()
        .map(|t| {
            t.samples_per_epoch
                .unwrap_or(u64::from(t.global_batch_size.max(1)) * 100)
                .max(1)
        })
        .collect();
    let curves = tasks
        .iter()
        .map(|t| Curve::for_task(&t.model, &t.task))
        .collect();
    // Spatial merge: each trained task learns at 1 + G from the other, and
    // not at all under negative transfer.
    let trained_tasks: Vec<&TaskAssignment> = tasks.iter().filter(|t| !t.eval_only).collect();
    // Frozen layers: each iteration teaches ψ(ℓ) as much (ICEFROG Eq. 2:
    // effective progress E = ψ · T).
    let psi = frozen_penalty_of(settings.frozen_layers, layers);
    let base_speed: Vec<f64> = tasks
        .iter()
        .map(|t| match trained_tasks.as_slice() {
            [a, b] if !t.eval_only => {
                let other = if a.job_id == t.job_id { b } else { a };
                let g = true_gain(&t.model, &other.task, &t.task, true);
                if g < 0.0 { 0.0 } else { 1.0 + g }
            }
            _ => 1.0,
        })
        .collect();
    let speed = base_speed.iter().map(|b| psi * b).collect();
    let step_of: StepOf = {
        let (model, gpu, variant) = (model.clone(), gpu.clone(), variant.clone());
        let placement = packed_placement(world, 4);
        Box::new(move |l| {
            let v = Variant {
                frozen_layers: l,
                ..variant.clone()
            };
            lut.iteration_time_on(&model, &gpu, &placement, batch, &v, layers)
                .ok()
                .filter(|it| it.feasible)
                .map(|it| it.seconds)
        })
    };
    let mut tr = Trainer {
        noise: 0x2545_F491_4F6C_DD1D ^ state[0].iteration.wrapping_mul(0x9E37),
        tasks,
        state,
        curves,
        profile,
        speed,
        ckpt_dir,
        out_dir,
        seconds_per_iteration,
        samples_per_epoch,
        reporter,
        followers: Vec::new(),
        frozen: settings.frozen_layers,
        shared,
        layers,
        base_speed,
        step_of,
        control: var(env::CONTROL_FILE).map(PathBuf::from),
    };

    // Start-up: the data loader (workers, tokenised data). A standby does
    // it while another job still has the GPUs, then waits to be started.
    let loader = Duration::from_secs_f64(
        var("FMSCHED_FAKE_LOADER_S")
            .and_then(|c| c.parse::<f64>().ok())
            .unwrap_or(2.0)
            .max(0.0)
            / compression,
    );
    let standby = var(env::STANDBY).is_some_and(|v| v == "1");
    // The runtime and the weights: loaded once per process (a warm process
    // serves its next task without it). A prompt-tuning task's model takes
    // PromptTuner's T_cold; other tasks' loading is part of their loader
    // time unless FMSCHED_FAKE_WEIGHTS_S says otherwise.
    let weights_s = var("FMSCHED_FAKE_WEIGHTS_S")
        .and_then(|c| c.parse::<f64>().ok())
        .unwrap_or_else(|| {
            if settings.petl == "prompt_tuning" {
                fmsched_core::policy::prompttuner::cold_start_s(
                    analytic::params_of(&model).unwrap_or(0.0),
                )
            } else {
                0.0
            }
        })
        .max(0.0);
    let weights = Duration::from_secs_f64(weights_s / compression);
    if !loaded && weights_s > 0.0 {
        eprintln!(
            "fake-trainer: loading the runtime and the weights of {model} ({weights_s:.1} s, {weights:?} compressed)"
        );
    }
    let weights = if loaded { Duration::ZERO } else { weights };
    tokio::select! {
        () = tokio::time::sleep(weights + loader) => {}
        _ = term.recv() => return Ok(Ended::Stopped), // nothing trained yet
    }
    if standby {
        tr.reporter.send(&Report::Prewarmed).await;
        eprintln!("fake-trainer: standby: data loader ready after {loader:?}; waiting for SIGUSR1");
        tokio::select! {
            _ = usr1.recv() => eprintln!("fake-trainer: started"),
            _ = term.recv() => {
                eprintln!("fake-trainer: stopped in standby");
                return Ok(Ended::Stopped);
            }
        }
    }
    // A job over several nodes: rendezvous first, as torchrun's workers do.
    // Stopped while it waits for the other nodes, it goes at once: its
    // listener must not outlive the stop, or a later start of the job on
    // this port could be joined by nodes that then lose it.
    let gang = GangEnv::from_env()?;
    let mut lost = None;
    if let Some(g) = &gang {
        if g.node_rank == 0 {
            let rendezvous = lead_rendezvous(g);
            tokio::pin!(rendezvous);
            loop {
                tokio::select! {
                    joined = &mut rendezvous => {
                        let (followers, rx) = joined?;
                        tr.followers = followers;
                        lost = Some(rx);
                        break;
                    }
                    // Nothing trained since it started: its checkpoint is
                    // the state it resumed from (or its first).
                    _ = usr2.recv() => tr.checkpoint().await?,
                    _ = term.recv() => {
                        eprintln!("fake-trainer: stopped in its rendezvous at {}", g.master);
                        tr.checkpoint().await?;
                        return Ok(Ended::Stopped);
                    }
                }
            }
        } else {
            // Test knob: this node's part fails before it joins, once per
            // node (a marker in its checkpoint folder), as a part whose
            // node cannot start it would.
            let marker = tr.ckpt_dir.join("failed-to-join-once");
            if var("FMSCHED_FAKE_FAIL_JOIN_ONCE").is_some_and(|v| v == "1") && !marker.exists() {
                std::fs::write(&marker, b"1")?;
                eprintln!("fake-trainer: failing before joining rank 0 (test knob)");
                std::process::exit(3);
            }
            follow(g, &mut tr.reporter, usr2, term).await;
        }
    }
    let grace = Duration::from_secs_f64(
        var(env::GRACE_S)
            .and_then(|c| c.parse().ok())
            .unwrap_or(3.0),
    );
    // Wall seconds per iteration after compression; steps are taken in
    // ticks of at least 20 ms so a fast job does not busy-loop.
    // Whole steps per tick, and the tick exactly that many steps long (a
    // rounded step count over a fixed tick would run up to 25 % fast).
    let pace = |seconds_per_iteration: f64| {
        let wall_per_it = (seconds_per_iteration / compression).max(1e-6);
        let steps = ((0.02 / wall_per_it).ceil() as u64).max(1);
        (steps, Duration::from_secs_f64(wall_per_it * steps as f64))
    };
    let (mut steps_per_tick, tick) = pace(tr.seconds_per_iteration);
    let mut paced_at = tr.seconds_per_iteration;
    let profile_steps: u64 = var("FMSCHED_FAKE_PROFILE_STEPS")
        .and_then(|c| c.parse().ok())
        .unwrap_or(50);
    let mut profiled = 0u64;
    let mut last_ckpt = Instant::now();
    let mut lease = LeaseWatch::default();
    let mut first_step = Some(begun);
    // Resumed from a checkpoint in which every task it trains had already
    // reached its target (the process that reached it stopped before the
    // scheduler took its output): as a trainer resumed at its last step
    // saves its model and reports it, the outputs are written again and
    // reported, not left out of an exit with nothing done.
    let trained = tr.trained();
    if !tr.profile && !trained.is_empty() && trained.iter().all(|&i| tr.state[i].done) {
        for i in trained {
            tr.deliver(i).await?;
        }
    }
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let done = tr.advance(steps_per_tick, crash_at).await?;
                if let Some(t) = first_step.take() {
                    eprintln!(
                        "fake-trainer: first step {:.3} s after its start-up began ({})",
                        t.elapsed().as_secs_f64(),
                        if loaded { "warm: no weight load" } else { "cold" }
                    );
                }
                // A new frozen-layer count changed the step time.
                if tr.seconds_per_iteration != paced_at {
                    paced_at = tr.seconds_per_iteration;
                    let (steps, tick) = pace(paced_at);
                    steps_per_tick = steps;
                    ticker = tokio::time::interval(tick);
                    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    ticker.tick().await;
                }
                if tr.profile {
                    profiled += steps_per_tick;
                    if profiled >= profile_steps {
                        for t in tr.tasks.clone() {
                            tr.reporter.send(&Report::Embedding {
                                job_id: t.job_id.clone(),
                                fisher: embedding(&t, false),
                                fisher_repeat: embedding(&t, true),
                            }).await;
                        }
                        return Ok(Ended::Stopped);
                    }
                } else if done {
                    tr.checkpoint().await?;
                    tr.tell_followers("done\n").await;
                    return Ok(Ended::Done(tr.tasks[0].model.clone()));
                }
                if !tr.profile && last_ckpt.elapsed() >= interval {
                    tr.checkpoint().await?;
                    last_ckpt = Instant::now();
                }
                // Checkpoint ahead of the lease's end (a suspension at the
                // end then loses nothing): a tick or a second before it.
                let ahead = ticker.period().max(Duration::from_secs(1)).as_secs_f64();
                if let (false, Some(left)) = (tr.profile, lease.due(tr.control.as_deref(), ahead)) {
                    eprintln!("fake-trainer: checkpoint ahead of the lease ending in {left:.1} s");
                    tr.checkpoint().await?;
                    last_ckpt = Instant::now();
                }
            }
            Some(node) = async { match lost.as_mut() { Some(rx) => rx.recv().await, None => None } } => {
                // Another node's process went away: the job cannot go on
                // (as a collective would fail). Stopped within the grace,
                // it is a suspension, not a failure.
                eprintln!("fake-trainer: node {node}'s process went away");
                tokio::select! {
                    () = tokio::time::sleep(grace) => {
                        eprintln!("fake-trainer: the gang is broken; exiting");
                        std::process::exit(5);
                    }
                    _ = term.recv() => {
                        tr.checkpoint().await?;
                        return Ok(Ended::Stopped);
                    }
                }
            }
            _ = usr1.recv() => {} // only a standby waits for it
            _ = usr2.recv() => {
                tr.checkpoint().await?;
                last_ckpt = Instant::now();
            }
            _ = term.recv() => {
                if ignore_term {
                    eprintln!("fake-trainer: ignoring SIGTERM (test knob)");
                    continue;
                }
                if !tr.profile {
                    tr.checkpoint().await?;
                }
                return Ok(Ended::Stopped);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASKS: [&str; 8] = ["cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "stsb"];

    /// ψ by hand (Eq. 3 on σ²[i] ∝ i): 1 with nothing frozen, 57/78 with
    /// half of 12 layers, 0 with all. Freezing half of roberta-base makes a
    /// step faster and each step teach less: effective progress per second
    /// (Eq. 2) stays near full training's, the trade ICEFROG's tuner
    /// weighs.
    #[test]
    fn frozen_layers_trade_step_time_for_learning_per_step() {
        assert_eq!(frozen_penalty_of(0, 12), 1.0);
        assert!((frozen_penalty_of(6, 12) - 57.0 / 78.0).abs() < 1e-12);
        assert_eq!(frozen_penalty_of(12, 12), 0.0);
        assert!(frozen_penalty_of(3, 12) > frozen_penalty_of(9, 12));
        let lut = analytic::default_lut().unwrap();
        let step = |frozen| {
            let v = Variant {
                frozen_layers: frozen,
                ..Variant::base()
            };
            lut.iteration_time_on("roberta-base", "A100", "1", 32, &v, 12)
                .unwrap()
                .seconds
        };
        let (full, half) = (step(0), step(6));
        assert!(
            half < full,
            "frozen layers make a step faster ({half} < {full})"
        );
        // Effective progress (Eq. 2) per second, relative to full training.
        let e = frozen_penalty_of(6, 12) * full / half;
        assert!(e > 0.9 && e < 1.3, "{e}");
    }

    /// A loss target is evaluated as a falling validation loss and reached
    /// from above; an accuracy target from below.
    #[test]
    fn a_lower_is_better_target_is_reached_from_above() {
        let c = Curve::for_task("roberta-base", "rte");
        let (early, late) = (c.evaluation(10.0, true), c.evaluation(5000.0, true));
        assert!(late < early, "a validation loss falls: {early} → {late}");
        assert!(c.evaluation(5000.0, false) > c.evaluation(10.0, false));
        let mut t = TaskAssignment {
            job_id: "j".into(),
            model: "roberta-base".into(),
            task: "rte".into(),
            dataset_uri: "file:///d".into(),
            global_batch_size: 32,
            max_iterations: 0,
            metric: Some("loss".into()),
            metric_target: Some((early + late) / 2.0),
            samples_per_epoch: None,
            max_epochs: 0,
            eval_only: false,
            prompt_bank: None,
            settings: Default::default(),
        };
        t.settings.metric_lower_is_better = true;
        assert!(!t.metric_reached(early) && t.metric_reached(late));
        t.settings.metric_lower_is_better = false;
        assert!(t.metric_reached(early) && !t.metric_reached(late));
    }

    /// The fake world has helpful and harmful pairs, as real task mixes do
    /// (Ymir Fig. 3: gains from about −30 % to +30 %), so the merger has
    /// something to choose and the guard something to catch.
    #[test]
    fn transfer_law_has_helpful_and_harmful_pairs() {
        let mut gains = Vec::new();
        for a in TASKS {
            for b in TASKS {
                if a != b {
                    gains.push(true_gain("roberta-base", a, b, false));
                }
            }
        }
        let positive = gains.iter().filter(|&&g| g > 0.0).count();
        let (lo, hi) = gains
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &g| (l.min(g), h.max(g)));
        eprintln!(
            "{positive}/{} positive, range {lo:.3}..{hi:.3}",
            gains.len()
        );
        assert!(positive >= gains.len() / 4, "{positive} of {}", gains.len());
        assert!(positive < gains.len(), "no harmful pair");
        assert!(lo > -0.5 && hi < 0.5, "{lo}..{hi}");
    }

    /// A task learns faster from a closer task: the law follows the
    /// embeddings it reports (what the estimator sees).
    #[test]
    fn closer_embeddings_transfer_better() {
        use fmsched_estimator::transfer::{TaskEmbedding, temporal_score};
        let emb = |t: &str| TaskEmbedding {
            fisher: embedding_of("roberta-base", t, false),
            fisher_repeat: embedding_of("roberta-base", t, true),
        };
        let mut pts: Vec<(f64, f64)> = Vec::new();
        for a in TASKS {
            for b in TASKS.iter().filter(|b| **b != a) {
                let s = temporal_score(&emb(a), &emb(b));
                pts.push((s, true_gain("roberta-base", a, b, false)));
            }
        }
        pts.sort_by(|x, y| x.0.total_cmp(&y.0));
        let n = pts.len() / 4;
        let mean = |v: &[(f64, f64)]| v.iter().map(|p| p.1).sum::<f64>() / v.len() as f64;
        assert!(
            mean(&pts[..n]) > mean(&pts[pts.len() - n..]) + 0.1,
            "closest quarter {:.3} vs farthest {:.3}",
            mean(&pts[..n]),
            mean(&pts[pts.len() - n..])
        );
    }
}
