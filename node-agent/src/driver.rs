//! The process driver: runs training processes under the trainer contract
//! (`docs/trainer-contract.md`, `fmsched_core::trainer`) and controls them
//! with the contract's signals.
//!
//! - **launch** — the command runs in its own process group (so signals
//!   reach the whole tree: torchrun and its workers), with the contract's
//!   environment, `CUDA_VISIBLE_DEVICES` from the plan, torchrun rank
//!   variables, stdout/stderr to files in the task's folder, and a unix
//!   socket the trainer reports JSON lines on. Launching a task that runs
//!   already does nothing (plans are repeated; every step is idempotent).
//! - **suspend** — SIGUSR2 (checkpoint now), wait for the `checkpoint`
//!   report or `checkpoint_timeout`, then SIGTERM, then SIGKILL after
//!   `grace`. Returns the newest checkpoint, which a later launch resumes.
//! - **standby / start** — a task launched with `standby` prepares its data
//!   loader while its GPUs still run another job and waits; **start**
//!   (SIGUSR1) lets it train (Ymir §6.2 pipeline switch). **terminate** stops
//!   a process without asking for a checkpoint (a standby has none to write).
//! - **warm / hand over** — a task launched `warm` (PromptTuner §4.4.4)
//!   reports `warm` after its `done` and keeps its model loaded; **hand
//!   over** gives it the next task (its variables in the process's
//!   `next.json`, then SIGUSR1) under that task's id. The process keeps its
//!   first folder's logs and socket; the new task's folder gets its
//!   checkpoints and output, and the byte range of those logs its task
//!   wrote (`log-span.json`): each task's log reads as its own.
//! - **observe** — what the reports said and whether the process lives.
//!
//! The driver owns no scheduling decisions; the agent's reconciler tells it
//! what to run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fmsched_core::trainer::{Report, TaskAssignment, env, signal};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use crate::isolation::{RunAs, give_to, passed_env, private_dir, working_dir_in};

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchSpec {
    /// Key of the process on this node (a job id, or the merge's id).
    pub id: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub profile: bool,
    pub tasks: Vec<TaskAssignment>,
    /// GPU indices on this node.
    pub gpus: Vec<u32>,
    pub resume_from: Option<PathBuf>,
    pub init_weights: Option<PathBuf>,
    /// Rank layout (one node, or this node's part of a job over several).
    pub ranks: Ranks,
    /// Start in standby (`FMSCHED_STANDBY=1`): prepare, report `prewarmed`,
    /// wait for [`ProcessDriver::start`].
    pub standby: bool,
    /// Pipeline-parallel: stage `i` on `gpus[i]` (`FMSCHED_PIPELINE_STAGES`).
    pub pipeline: bool,
    /// Expert-parallel: GPUs per expert group (`FMSCHED_EXPERT_PARALLEL`;
    /// 0 = none).
    pub expert_parallel: u32,
    /// Per prompt-tuning job: its model's Prompt Bank, written to a file in
    /// the task folder that its task's `prompt_bank` names (a fresh start
    /// only: a resumed process goes on from its checkpoint).
    pub prompt_banks: BTreeMap<String, Vec<fmsched_core::trainer::BankCandidate>>,
    /// May serve more tasks of its model after this one (`FMSCHED_WARM=1`,
    /// PromptTuner's warm pools): see [`ProcessDriver::hand_over`].
    pub warm: bool,
    /// The process's working directory, relative to its task folder
    /// (`launch.working_dir`; empty: the task folder itself). Validation
    /// refuses absolute paths and `..`; the agent checks again.
    pub working_dir: String,
}

/// Where a process stands in its job's rank layout (torchrun semantics,
/// `fmsched_core::trainer::env`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranks {
    /// The job's GPUs on all its nodes.
    pub world_size: u32,
    /// Global rank of this node's first GPU.
    pub rank_offset: u32,
    /// The job's nodes, and this node's place among them (0: rank 0's).
    pub nnodes: u32,
    pub node_rank: u32,
    /// Where rank 0's node listens for the rendezvous.
    pub master_addr: String,
    pub master_port: u16,
}

impl Ranks {
    /// A job on this node only, on `gpus` GPUs.
    pub fn single(gpus: u32) -> Ranks {
        Ranks {
            world_size: gpus.max(1),
            rank_offset: 0,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
        }
    }
}

#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Each process gets `work_dir/<id>/` (checkpoints, logs, socket).
    pub work_dir: PathBuf,
    pub checkpoint_timeout: Duration,
    pub grace: Duration,
    pub checkpoint_interval: Duration,
    /// Agent variables passed on to trainers (`processes.pass_env`).
    pub pass_env: Vec<String>,
    /// The user trainers run as (`processes.run_as`); None: the agent's.
    pub run_as: Option<RunAs>,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("task {id}: {message}")]
    Launch { id: String, message: String },
    #[error("task {0} is not running on this node")]
    NotRunning(String),
}

/// What the reports of a process said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Per job: (iteration, samples, loss).
    pub progress: BTreeMap<String, (u64, u64, f64)>,
    /// (iteration, loss) of every progress report, thinned to at most
    /// [`MAX_TRACE`] points (every other point dropped when full).
    pub loss_trace: Vec<(u64, f64)>,
    pub step_time_s: Option<f64>,
    /// Per job: (iteration, epoch, metric, value), in order.
    pub evals: Vec<(String, u64, f64, String, f64)>,
    pub embeddings: BTreeMap<String, (Vec<f64>, Vec<f64>)>,
    pub last_checkpoint: Option<(PathBuf, u64)>,
    pub prewarmed: bool,
    /// A warm process finished its tasks and waits for the next.
    pub warm: bool,
    /// Jobs that reached their target, with their output path.
    pub done: BTreeMap<String, String>,
    /// Prompt-tuning jobs that are done: their tuned prompt's activation
    /// features (at most [`MAX_PROMPT_FEATURES`]; longer ones are dropped).
    pub prompt_features: BTreeMap<String, Vec<f64>>,
    /// Prompt-tuning jobs that started from a Prompt Bank candidate:
    /// (candidate id, score, scorings, candidates).
    pub prompt_init: BTreeMap<String, (String, f64, u32, u32)>,
    pub bad_lines: u64,
    /// Per layer-elastic job: the frozen layers it trains with and its
    /// latest per-layer gradient variance (ICEFROG Eq. 3).
    pub layer_variance: BTreeMap<String, (u32, Vec<f64>)>,
    /// Report connections not yet at end of stream.
    pub open_connections: u32,
}

/// A process's state as the agent reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessStatus {
    pub pid: u32,
    pub running: bool,
    /// Exit code once it ended (None while running or when killed by a signal).
    pub exit_code: Option<i32>,
    pub observed: Observed,
    pub started: Instant,
    pub dir: PathBuf,
}

struct Running {
    pgid: i32,
    observed: Arc<Mutex<Observed>>,
    started: Instant,
    dir: PathBuf,
    reader: tokio::task::JoinHandle<()>,
    /// The child and how it ended. A stop holds this lock while the
    /// trainer checkpoints and exits (seconds for a real one), never the
    /// table's: heartbeats and other tasks' work go on meanwhile.
    life: tokio::sync::Mutex<Life>,
}

struct Life {
    child: Child,
    exit: Option<std::process::ExitStatus>,
}

impl Life {
    /// Still running (records the exit when it has just ended).
    fn alive(&mut self) -> bool {
        if self.exit.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.exit = Some(s);
        }
        self.exit.is_none()
    }
}

impl Running {
    /// Whether the process runs; one being stopped still does.
    fn alive_now(&self) -> bool {
        self.life.try_lock().map_or(true, |mut l| l.alive())
    }
}

/// Counters of the driver, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverStats {
    pub launches: u64,
    pub suspends: u64,
    pub suspend_seconds_sum: f64,
    pub kills: u64,
}

/// Runs and controls this node's training processes.
pub struct ProcessDriver {
    cfg: DriverConfig,
    procs: tokio::sync::Mutex<BTreeMap<String, Arc<Running>>>,
    stats: Mutex<DriverStats>,
}

fn send_signal(pgid: i32, sig: i32) {
    // SAFETY: kill(2) with a negative pid signals the process group; no
    // memory is touched.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Longest loss trace kept per process.
pub const MAX_TRACE: usize = 2000;

/// Most prompt features reported per job (a model's hidden size; the
/// scheduler refuses more).
pub const MAX_PROMPT_FEATURES: usize = 16_384;

fn lock(o: &Mutex<Observed>) -> std::sync::MutexGuard<'_, Observed> {
    o.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes one report into what the agent observed of its process.
pub(crate) fn apply_report(o: &Mutex<Observed>, r: Report) {
    let mut o = lock(o);
    match r {
        Report::Progress {
            job_id,
            iteration,
            samples,
            loss,
            step_time_s,
        } => {
            o.progress.insert(job_id, (iteration, samples, loss));
            o.step_time_s = Some(step_time_s);
            if o.loss_trace.len() >= MAX_TRACE {
                let thinned: Vec<(u64, f64)> = o.loss_trace.iter().copied().step_by(2).collect();
                o.loss_trace = thinned;
            }
            if loss.is_finite() {
                o.loss_trace.push((iteration, loss));
            }
        }
        Report::Eval {
            job_id,
            iteration,
            epoch,
            metric,
            value,
        } => o.evals.push((job_id, iteration, epoch, metric, value)),
        Report::Embedding {
            job_id,
            fisher,
            fisher_repeat,
        } => {
            o.embeddings.insert(job_id, (fisher, fisher_repeat));
        }
        Report::Checkpoint { path, iteration } => {
            o.last_checkpoint = Some((PathBuf::from(path), iteration))
        }
        Report::Prewarmed => o.prewarmed = true,
        Report::Warm => o.warm = true,
        Report::Done {
            job_id,
            output,
            prompt_features,
        } => {
            if prompt_features.len() > MAX_PROMPT_FEATURES {
                tracing::warn!(%job_id, features = prompt_features.len(), max = MAX_PROMPT_FEATURES,
                    "prompt features too long; the prompt is not filed in the Prompt Bank");
            } else if !prompt_features.is_empty() {
                o.prompt_features.insert(job_id.clone(), prompt_features);
            }
            o.done.insert(job_id, output);
        }
        Report::PromptInit {
            job_id,
            from,
            score,
            scored,
            candidates,
        } => {
            o.prompt_init
                .insert(job_id, (from, score, scored, candidates));
        }
        Report::LayerVariance {
            job_id,
            frozen_layers,
            variance,
            ..
        } => {
            o.layer_variance.insert(job_id, (frozen_layers, variance));
        }
    }
}

impl ProcessDriver {
    pub fn new(cfg: DriverConfig) -> Self {
        Self {
            cfg,
            procs: tokio::sync::Mutex::new(BTreeMap::new()),
            stats: Mutex::new(DriverStats::default()),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> DriverStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Processes running now.
    pub async fn running(&self) -> usize {
        let procs: Vec<Arc<Running>> = self.procs.lock().await.values().cloned().collect();
        procs.iter().filter(|r| r.alive_now()).count()
    }

    /// The process record of `id` (the table is locked only to look).
    async fn entry(&self, id: &str) -> Option<Arc<Running>> {
        self.procs.lock().await.get(id).cloned()
    }

    /// Reads a task's `stdout.log` (or `stderr.log`) from byte `offset`
    /// (negative: the last `-offset` bytes), at most `max` bytes. Returns the
    /// bytes and the offset after them; a log rotated since (shorter than
    /// `offset`) is read from its start.
    pub fn read_log(
        &self,
        task_id: &str,
        stderr: bool,
        offset: i64,
        max: usize,
    ) -> std::io::Result<(Vec<u8>, u64)> {
        use std::io::{Read, Seek, SeekFrom};
        let name = if stderr { "stderr.log" } else { "stdout.log" };
        // A task a warm process ran: its part of that process's log.
        let span = LogSpan::read(&self.dir_of(task_id));
        let (path, base, end) = match &span {
            Some(sp) => {
                let (b, e) = if stderr { sp.stderr } else { sp.stdout };
                (sp.dir.join(name), b, e)
            }
            None => (self.dir_of(task_id).join(name), 0, None),
        };
        let mut f = std::fs::File::open(path)?;
        let file_len = f.metadata()?.len();
        // Rotated since (shorter than where the task began): from its start.
        let base = if base > file_len { 0 } else { base };
        let len = end.unwrap_or(file_len).min(file_len).saturating_sub(base);
        let start = if offset < 0 {
            len.saturating_sub(offset.unsigned_abs())
        } else if offset as u64 > len {
            0
        } else {
            offset as u64
        };
        f.seek(SeekFrom::Start(base + start))?;
        let mut buf = Vec::new();
        f.take((max as u64).min(len - start))
            .read_to_end(&mut buf)?;
        let next = start + buf.len() as u64;
        Ok((buf, next))
    }

    /// Rotates the logs of running processes that grew past `max_bytes`:
    /// `log.{k}` → `log.{k+1}` (the oldest of `keep` dropped), the log copied
    /// to `log.1`, then truncated. Processes write with `O_APPEND`, so they
    /// go on at the start of the emptied file (lines written between the
    /// copy and the truncation are lost — logrotate's `copytruncate`; the
    /// process keeps its file and survives an agent restart). Returns how
    /// many logs were rotated.
    pub async fn rotate_logs(&self, max_bytes: u64, keep: u32) -> usize {
        // Each process's own folder (a warm process keeps its first one).
        let dirs: Vec<(String, PathBuf)> = self
            .procs
            .lock()
            .await
            .iter()
            .map(|(id, r)| (id.clone(), r.dir.clone()))
            .collect();
        let mut rotated = 0;
        for (id, dir) in dirs {
            for name in ["stdout.log", "stderr.log"] {
                let path = dir.join(name);
                match rotate_one(&path, max_bytes, keep.max(1)) {
                    Ok(true) => rotated += 1,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(task = %id, path = %path.display(), error = %e, "log rotation failed")
                    }
                }
            }
        }
        rotated
    }

    /// Whether a task ever ran here (its folder exists).
    pub fn has_dir(&self, task_id: &str) -> bool {
        self.dir_of(task_id).is_dir()
    }

    fn dir_of(&self, id: &str) -> PathBuf {
        // Ids come from the scheduler; keep them to one path component.
        let safe: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.cfg.work_dir.join(safe)
    }

    /// Starts `spec` unless it runs already (idempotent).
    pub async fn launch(&self, spec: &LaunchSpec) -> Result<(), DriverError> {
        let err = |m: String| DriverError::Launch {
            id: spec.id.clone(),
            message: m,
        };
        let mut procs = loop {
            let mut procs = self.procs.lock().await;
            let Some(r) = procs.get(&spec.id).cloned() else {
                break procs;
            };
            match r.life.try_lock().map(|mut l| l.alive()) {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    procs.remove(&spec.id);
                    break procs;
                }
                // Being stopped: launch again once it has ended.
                Err(_) => {
                    drop(procs);
                    drop(r.life.lock().await);
                }
            }
        };
        if spec.command.is_empty() {
            return Err(err("the launch command is empty".into()));
        }
        let dir = self.dir_of(&spec.id);
        let ckpt = dir.join("checkpoints");
        let cwd = working_dir_in(&dir, &spec.working_dir).ok_or_else(|| {
            err(format!(
                "working_dir {:?} is not a relative path inside the task folder",
                spec.working_dir
            ))
        })?;
        let owner = self.cfg.run_as.as_ref();
        for d in [&dir, &ckpt, &cwd, &dir.join("tmp")] {
            private_dir(d, owner).map_err(|e| err(format!("creating {}: {e}", d.display())))?;
        }
        let sock = report_socket_path(&dir);
        let _ = std::fs::remove_file(&sock);
        // Its log is its own folder's again.
        let _ = std::fs::remove_file(dir.join(LogSpan::FILE));
        // A new process starts from its launch settings.
        let control = dir.join(CONTROL_FILE_NAME);
        let _ = std::fs::remove_file(&control);
        let listener = tokio::net::UnixListener::bind(&sock)
            .map_err(|e| err(format!("binding {}: {e}", sock.display())))?;
        give_to(&sock, owner).map_err(|e| err(format!("handing over {}: {e}", sock.display())))?;
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .map_err(|e| err(format!("opening {name}: {e}")))
        };
        let (stdout, stderr) = (open("stdout.log")?, open("stderr.log")?);
        let mut cmd = self
            .command(spec, &dir, &ckpt, &sock, &control)
            .map_err(err)?;
        cmd.stdout(stdout).stderr(stderr);
        let child = cmd
            .spawn()
            .map_err(|e| err(format!("starting {:?}: {e}", spec.command[0])))?;
        let pgid = child
            .id()
            .map(|p| p as i32)
            .ok_or_else(|| err("the process exited at once".into()))?;
        // On disk, so a restarted agent finds it (see `stop_orphans`).
        if let Some(start_ticks) = start_ticks(pgid) {
            let rec = ProcessRecord { pgid, start_ticks };
            if let Err(e) = serde_json::to_vec(&rec)
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(dir.join(PROCESS_FILE_NAME), b))
            {
                tracing::warn!(task = %spec.id, error = %e, "process record not written");
            }
        }
        let observed = Arc::new(Mutex::new(Observed::default()));
        let reader = read_reports(listener, spec.id.clone(), observed.clone());
        tracing::info!(task = %spec.id, pgid, gpus = ?spec.gpus, resume = ?spec.resume_from,
            standby = spec.standby, warm = spec.warm, "launched");
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .launches += 1;
        procs.insert(
            spec.id.clone(),
            Arc::new(Running {
                pgid,
                observed,
                started: Instant::now(),
                dir,
                reader,
                life: tokio::sync::Mutex::new(Life { child, exit: None }),
            }),
        );
        Ok(())
    }

    /// The training process's command: `spec`'s command and environment,
    /// and the trainer contract's variables (ids, mode, tasks, checkpoint
    /// and output folders, the report socket and control file, the GPUs
    /// and torchrun's ranks) set or removed, in its own process group.
    fn command(
        &self,
        spec: &LaunchSpec,
        dir: &Path,
        ckpt: &Path,
        sock: &Path,
        control: &Path,
    ) -> Result<Command, String> {
        let tasks = tasks_json(spec, dir)?;
        let gpus: Vec<String> = spec.gpus.iter().map(u32::to_string).collect();
        let mut cmd = Command::new(&spec.command[0]);
        // Built, never inherited: the agent's own variables (its join
        // token among them) stay out of every job.
        cmd.env_clear()
            .envs(passed_env(std::env::vars(), &self.cfg.pass_env))
            .env("HOME", dir)
            .env("TMPDIR", dir.join("tmp"))
            .args(&spec.command[1..])
            .current_dir(
                working_dir_in(dir, &spec.working_dir).unwrap_or_else(|| dir.to_path_buf()),
            )
            // The plan's variables: the spec's (checked at submit) and the
            // scheduler's and this agent's contract variables (FMSCHED_*);
            // a linker or interpreter hook never passes, whatever its source.
            .envs(spec.env.iter().filter(|(k, _)| {
                k.starts_with("FMSCHED_") || fmsched_core::validate::denied_env(k).is_none()
            }))
            .env(
                env::JOB_ID,
                spec.tasks
                    .first()
                    .map_or(spec.id.as_str(), |t| t.job_id.as_str()),
            )
            .env(env::MODE, if spec.profile { "profile" } else { "train" })
            .env(env::TASKS, tasks)
            .env(env::CHECKPOINT_DIR, ckpt)
            .env(env::OUTPUT_DIR, dir.join("output"))
            .env(env::REPORT_SOCKET, sock)
            .env(env::CONTROL_FILE, control)
            .env(
                env::CHECKPOINT_INTERVAL_S,
                self.cfg.checkpoint_interval.as_secs_f64().to_string(),
            )
            .env(env::GRACE_S, self.cfg.grace.as_secs_f64().to_string())
            .env(env::CUDA_VISIBLE_DEVICES, gpus.join(","))
            .env(
                env::WORLD_SIZE,
                spec.ranks
                    .world_size
                    .max(gpus.len() as u32)
                    .max(1)
                    .to_string(),
            )
            .env(env::RANK, spec.ranks.rank_offset.to_string())
            .env(env::LOCAL_RANK, "0")
            .env(env::LOCAL_WORLD_SIZE, gpus.len().max(1).to_string())
            .env(env::NNODES, spec.ranks.nnodes.max(1).to_string())
            .env(env::NODE_RANK, spec.ranks.node_rank.to_string())
            .env(env::MASTER_ADDR, &spec.ranks.master_addr)
            .env(env::MASTER_PORT, spec.ranks.master_port.to_string())
            .env_remove(env::RESUME_FROM)
            .env_remove(env::INIT_WEIGHTS)
            .env_remove(env::STANDBY)
            .env_remove(env::PIPELINE_STAGES)
            .env_remove(env::EXPERT_PARALLEL)
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(false);
        if let Some(who) = self.cfg.run_as.clone() {
            // SAFETY: the closure runs in the forked child before exec and
            // makes system calls only (`RunAs::become_user`).
            unsafe {
                cmd.pre_exec(move || who.become_user());
            }
        }
        if let Some(r) = &spec.resume_from {
            cmd.env(env::RESUME_FROM, r);
        }
        if let Some(w) = &spec.init_weights {
            cmd.env(env::INIT_WEIGHTS, w);
        }
        if spec.standby {
            cmd.env(env::STANDBY, "1");
        }
        cmd.env_remove(env::WARM).env_remove(env::NEXT_TASK);
        if spec.warm {
            cmd.env(env::WARM, "1")
                .env(env::NEXT_TASK, dir.join(NEXT_TASK_FILE_NAME));
        }
        if spec.pipeline {
            cmd.env(env::PIPELINE_STAGES, spec.gpus.len().to_string());
        }
        if spec.expert_parallel > 1 {
            cmd.env(env::EXPERT_PARALLEL, spec.expert_parallel.to_string());
        }
        Ok(cmd)
    }

    /// Checkpoints and stops a process (see the module docs); returns its
    /// newest checkpoint. Suspending a process that is not running returns
    /// the checkpoint it left, if any (idempotent).
    pub async fn suspend(&self, id: &str) -> Result<Option<(PathBuf, u64)>, DriverError> {
        self.stop(id, true).await
    }

    /// Stops a process without asking for a checkpoint first: SIGTERM, then
    /// SIGKILL after the grace (a standby process has nothing to save).
    pub async fn terminate(&self, id: &str) -> Result<(), DriverError> {
        self.stop(id, false).await.map(|_| ())
    }

    async fn stop(
        &self,
        id: &str,
        checkpoint: bool,
    ) -> Result<Option<(PathBuf, u64)>, DriverError> {
        let r = self
            .entry(id)
            .await
            .ok_or_else(|| DriverError::NotRunning(id.to_string()))?;
        let mut life = r.life.lock().await;
        if life.child.try_wait().ok().flatten().is_none() {
            let started = Instant::now();
            let mut killed = false;
            if checkpoint {
                let before = lock(&r.observed).last_checkpoint.clone();
                send_signal(r.pgid, signal::CHECKPOINT);
                let deadline = Instant::now() + self.cfg.checkpoint_timeout;
                while Instant::now() < deadline && lock(&r.observed).last_checkpoint == before {
                    if life.child.try_wait().ok().flatten().is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            send_signal(r.pgid, signal::TERMINATE);
            match tokio::time::timeout(self.cfg.grace, life.child.wait()).await {
                Ok(Ok(status)) => life.exit = Some(status),
                _ => {
                    tracing::warn!(task = id, grace = ?self.cfg.grace, "no exit after SIGTERM; killing the process group");
                    send_signal(r.pgid, libc::SIGKILL);
                    life.exit = life.child.wait().await.ok();
                    killed = true;
                }
            }
            {
                let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                if checkpoint {
                    st.suspends += 1;
                    st.suspend_seconds_sum += started.elapsed().as_secs_f64();
                }
                st.kills += u64::from(killed);
            }
            // The trainer may have written a checkpoint on SIGTERM: let the
            // reader see its last lines.
            let deadline = Instant::now() + Duration::from_millis(500);
            while lock(&r.observed).open_connections > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        r.reader.abort();
        Ok(lock(&r.observed).last_checkpoint.clone())
    }

    /// Changes a running process's settings: rewrites its control file
    /// ([`env::CONTROL_FILE`]), which it reads at its next epoch start.
    pub async fn set_control(
        &self,
        id: &str,
        control: &fmsched_core::trainer::Control,
    ) -> Result<(), DriverError> {
        let r = self
            .entry(id)
            .await
            .ok_or_else(|| DriverError::NotRunning(id.to_string()))?;
        let err = |m: String| DriverError::Launch {
            id: id.to_string(),
            message: m,
        };
        let path = r.dir.join(CONTROL_FILE_NAME);
        let tmp = r.dir.join(format!("{CONTROL_FILE_NAME}.tmp"));
        let bytes = serde_json::to_vec(control).map_err(|e| err(e.to_string()))?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| err(format!("writing {}: {e}", path.display())))
    }

    /// Gives warm process `from` (it reported `warm`) its next task,
    /// `spec`, without a launch: the task's variables go to the process's
    /// `next.json` ([`env::NEXT_TASK`]), then SIGUSR1. The process is known
    /// as `spec.id` from then on; what it reported is cleared. Its logs stay
    /// in its first folder; each task reads its own part of them.
    pub async fn hand_over(&self, from: &str, spec: &LaunchSpec) -> Result<(), DriverError> {
        let err = |m: String| DriverError::Launch {
            id: spec.id.clone(),
            message: m,
        };
        let mut procs = self.procs.lock().await;
        let r = procs
            .get(from)
            .cloned()
            .ok_or_else(|| DriverError::NotRunning(from.to_string()))?;
        if !r.alive_now() || !lock(&r.observed).warm {
            return Err(err(format!("process {from} is not waiting warm")));
        }
        if procs.get(&spec.id).is_some_and(|p| p.alive_now()) {
            return Err(err("the task runs already".into()));
        }
        let dir = self.dir_of(&spec.id);
        let ckpt = dir.join("checkpoints");
        for d in [&dir, &ckpt] {
            private_dir(d, self.cfg.run_as.as_ref())
                .map_err(|e| err(format!("creating {}: {e}", d.display())))?;
        }
        // Each task reads its own part of the process's log.
        let at = |name: &str| std::fs::metadata(r.dir.join(name)).map_or(0, |m| m.len());
        let (out, errs) = (at("stdout.log"), at("stderr.log"));
        let before = LogSpan::read(&self.dir_of(from)).unwrap_or(LogSpan {
            dir: r.dir.clone(),
            stdout: (0, None),
            stderr: (0, None),
        });
        LogSpan {
            stdout: (before.stdout.0, Some(out)),
            stderr: (before.stderr.0, Some(errs)),
            ..before
        }
        .write(&self.dir_of(from))
        .map_err(|e| err(format!("writing {from}'s log span: {e}")))?;
        LogSpan {
            dir: r.dir.clone(),
            stdout: (out, None),
            stderr: (errs, None),
        }
        .write(&dir)
        .map_err(|e| err(format!("writing the log span: {e}")))?;
        let control = r.dir.join(CONTROL_FILE_NAME);
        let _ = std::fs::remove_file(&control);
        let mut next = fmsched_core::trainer::NextTask::new();
        let job = spec
            .tasks
            .first()
            .map_or(spec.id.as_str(), |t| t.job_id.as_str());
        next.insert(env::JOB_ID.into(), job.into());
        next.insert(env::TASKS.into(), tasks_json(spec, &dir).map_err(err)?);
        next.insert(env::CHECKPOINT_DIR.into(), ckpt.display().to_string());
        next.insert(
            env::OUTPUT_DIR.into(),
            dir.join("output").display().to_string(),
        );
        next.insert(env::CONTROL_FILE.into(), control.display().to_string());
        if let Some(p) = &spec.resume_from {
            next.insert(env::RESUME_FROM.into(), p.display().to_string());
        }
        if let Some(p) = &spec.init_weights {
            next.insert(env::INIT_WEIGHTS.into(), p.display().to_string());
        }
        let path = r.dir.join(NEXT_TASK_FILE_NAME);
        let tmp = r.dir.join(format!("{NEXT_TASK_FILE_NAME}.tmp"));
        let bytes = serde_json::to_vec(&next).map_err(|e| err(e.to_string()))?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| err(format!("writing {}: {e}", path.display())))?;
        {
            let mut o = lock(&r.observed);
            let open = o.open_connections;
            *o = Observed {
                open_connections: open,
                ..Observed::default()
            };
        }
        procs.remove(from);
        procs.insert(spec.id.clone(), r.clone());
        send_signal(r.pgid, signal::START);
        tracing::info!(task = %spec.id, from, pgid = r.pgid, gpus = ?spec.gpus, "handed to a warm process");
        Ok(())
    }

    /// Lets a standby process train (SIGUSR1).
    pub async fn start(&self, id: &str) -> Result<(), DriverError> {
        let r = self
            .entry(id)
            .await
            .ok_or_else(|| DriverError::NotRunning(id.to_string()))?;
        send_signal(r.pgid, signal::START);
        Ok(())
    }

    /// The process's status and what it reported.
    pub async fn status(&self, id: &str) -> Option<ProcessStatus> {
        let r = self.entry(id).await?;
        // A process being stopped is reported running until it has ended.
        let (exit, just_ended) = match r.life.try_lock() {
            Ok(mut l) => {
                let before = l.exit.is_some();
                l.alive();
                (l.exit, !before && l.exit.is_some())
            }
            Err(_) => (None, false),
        };
        if just_ended {
            // The process is gone: let its report connections drain so its
            // last lines (done, embedding, checkpoint) are not lost.
            let deadline = Instant::now() + Duration::from_millis(500);
            while lock(&r.observed).open_connections > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        Some(ProcessStatus {
            pid: r.pgid as u32,
            running: exit.is_none(),
            exit_code: exit.and_then(|s| s.code()),
            observed: lock(&r.observed).clone(),
            started: r.started,
            dir: r.dir.clone(),
        })
    }

    /// Drops the record of a process that ended (a standby that was never
    /// started: nothing of it is worth reporting). A running one is kept.
    pub async fn forget(&self, id: &str) {
        let mut procs = self.procs.lock().await;
        if procs.get(id).is_some_and(|r| !r.alive_now())
            && let Some(r) = procs.remove(id)
        {
            r.reader.abort();
        }
    }

    /// Stops the processes a previous agent on this work folder left
    /// running: SIGTERM — a trainer checkpoints and exits on it — then
    /// SIGKILL after the grace. Returns how many it stopped. Called once,
    /// before this driver launches anything.
    ///
    /// They are found by their `process.json` (the same process by its
    /// start time), and by the process table: a group leader whose
    /// checkpoint folder lies in this work folder. The record alone misses
    /// a process whose agent was killed between starting it and writing
    /// its record.
    pub async fn stop_orphans(&self) -> usize {
        let mine: Vec<i32> = self.procs.lock().await.values().map(|r| r.pgid).collect();
        let alive = |r: &ProcessRecord| start_ticks(r.pgid) == Some(r.start_ticks);
        let mut found: Vec<(PathBuf, ProcessRecord)> = Vec::new();
        for e in std::fs::read_dir(&self.cfg.work_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let file = e.path().join(PROCESS_FILE_NAME);
            let Some(rec) = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<ProcessRecord>(&b).ok())
            else {
                continue;
            };
            let _ = std::fs::remove_file(&file);
            found.push((e.path(), rec));
        }
        found.extend(processes_of(&self.cfg.work_dir));
        let mut left: Vec<ProcessRecord> = Vec::new();
        for (folder, rec) in found {
            if mine.contains(&rec.pgid) || left.contains(&rec) || !alive(&rec) {
                continue;
            }
            tracing::warn!(folder = %folder.display(), pgid = rec.pgid,
                "a process a previous agent left running: stopping it (SIGTERM, it checkpoints)");
            send_signal(rec.pgid, signal::TERMINATE);
            left.push(rec);
        }
        // One grace for all of them.
        let deadline = Instant::now() + self.cfg.grace;
        while left.iter().any(alive) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for r in left.iter().filter(|r| alive(r)) {
            tracing::warn!(pgid = r.pgid, grace = ?self.cfg.grace, "no exit after SIGTERM; killing the process group");
            send_signal(r.pgid, libc::SIGKILL);
        }
        left.len()
    }

    /// Ids of the processes the driver knows.
    pub async fn ids(&self) -> Vec<String> {
        self.procs.lock().await.keys().cloned().collect()
    }

    /// Waits until `id` ends (or `timeout`); returns its status.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Option<ProcessStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status(id).await?;
            if !s.running || Instant::now() >= deadline {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for ProcessDriver {
    fn drop(&mut self) {
        // Processes outlive the driver (an agent's restart must not kill
        // training at once); a restarted agent stops them with a checkpoint
        // (`stop_orphans`). Only the report readers stop here.
        if let Ok(procs) = self.procs.try_lock() {
            for r in procs.values() {
                r.reader.abort();
            }
        }
    }
}

/// Where a task a warm process ran finds its log: that process's folder
/// and the byte range of each log its task wrote (`end` None: still
/// writing). Kept as `log-span.json` in the task's folder.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct LogSpan {
    dir: PathBuf,
    stdout: (u64, Option<u64>),
    stderr: (u64, Option<u64>),
}

impl LogSpan {
    const FILE: &str = "log-span.json";

    fn read(task_dir: &Path) -> Option<LogSpan> {
        let text = std::fs::read(task_dir.join(Self::FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn write(&self, task_dir: &Path) -> std::io::Result<()> {
        let tmp = task_dir.join(format!("{}.tmp", Self::FILE));
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, task_dir.join(Self::FILE))
    }
}

/// The process's tasks as `FMSCHED_TASKS` holds them: a prompt-tuning
/// task's Prompt Bank goes to a file in `dir` that its `prompt_bank` names
/// (a fresh start only: a resumed process goes on from its checkpoint).
fn tasks_json(spec: &LaunchSpec, dir: &Path) -> Result<String, String> {
    let mut tasks = spec.tasks.clone();
    if spec.resume_from.is_none() {
        for (i, t) in tasks.iter_mut().enumerate() {
            let Some(bank) = spec.prompt_banks.get(&t.job_id) else {
                continue;
            };
            let path = dir.join(format!("prompt-bank-{i}.json"));
            let json = serde_json::to_vec(bank).map_err(|e| e.to_string())?;
            std::fs::write(&path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
            t.prompt_bank = Some(path.display().to_string());
        }
    }
    serde_json::to_string(&tasks).map_err(|e| e.to_string())
}

fn rotate_one(path: &Path, max_bytes: u64, keep: u32) -> std::io::Result<bool> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= max_bytes {
        return Ok(false);
    }
    let numbered = |k: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{k}"));
        PathBuf::from(p)
    };
    let _ = std::fs::remove_file(numbered(keep));
    for k in (1..keep).rev() {
        let from = numbered(k);
        if from.exists() {
            std::fs::rename(&from, numbered(k + 1))?;
        }
    }
    std::fs::copy(path, numbered(1))?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_len(0)?;
    Ok(true)
}

/// Where a task's report socket lives: `report.sock` in its folder, or —
/// when that path is longer than a unix socket address allows (108 bytes;
/// deep work dirs, a spatial pair's long task id) — a name derived from the
/// folder in the system's temporary directory.
/// The control file of a process, in its directory.
const CONTROL_FILE_NAME: &str = "control.json";

/// A process's record in its directory (see [`ProcessDriver::stop_orphans`]).
const PROCESS_FILE_NAME: &str = "process.json";

/// What [`PROCESS_FILE_NAME`] holds: the process group, and its leader's
/// start time (clock ticks after boot) so a reused pid is not mistaken
/// for it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct ProcessRecord {
    pgid: i32,
    start_ticks: u64,
}

/// The start time of process `pid` (Linux: `/proc/<pid>/stat` field 22, in
/// clock ticks after boot); None when there is no such process, or it has
/// exited (a zombie).
fn start_ticks(pid: i32) -> Option<u64> {
    proc_stat(pid).map(|(_, start)| start)
}

/// Process `pid`'s group and start time (`/proc/<pid>/stat` fields 5 and
/// 22); None when there is no such process, or it is a zombie.
fn proc_stat(pid: i32) -> Option<(i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // From the state (field 3) on.
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    // Field 5 after the parent's pid; field 22 the 16th after it.
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((pgrp, fields.nth(16)?.parse().ok()?))
}

/// The live process-group leaders that a driver on `work_dir` started:
/// those whose [`env::CHECKPOINT_DIR`] is `work_dir/<task>/checkpoints`, as
/// [`ProcessDriver::launch`] sets it. Each with its task's folder.
fn processes_of(work_dir: &Path) -> Vec<(PathBuf, ProcessRecord)> {
    use std::os::unix::ffi::OsStrExt as _;
    let key = format!("{}=", env::CHECKPOINT_DIR);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let (pgid, start_ticks) = proc_stat(pid)?;
            if pgid != pid {
                return None;
            }
            // Readable for this user's processes only: those are the ones
            // a driver of this user started.
            let environ = std::fs::read(e.path().join("environ")).ok()?;
            let ckpt = environ
                .split(|&b| b == 0)
                .find_map(|v| v.strip_prefix(key.as_bytes()))?;
            let folder = Path::new(std::ffi::OsStr::from_bytes(ckpt)).parent()?;
            (folder.parent()? == work_dir).then(|| {
                let rec = ProcessRecord { pgid, start_ticks };
                (folder.to_path_buf(), rec)
            })
        })
        .collect()
}

/// A warm process's next task ([`env::NEXT_TASK`]), in its directory.
const NEXT_TASK_FILE_NAME: &str = "next.json";

fn report_socket_path(dir: &Path) -> PathBuf {
    const SUN_PATH_MAX: usize = 107;
    let own = dir.join("report.sock");
    if own.as_os_str().len() <= SUN_PATH_MAX {
        return own;
    }
    let h = fmsched_core::hash::fnv1a(dir.as_os_str().as_encoded_bytes());
    std::env::temp_dir().join(format!("fmsched-report-{h:016x}.sock"))
}

/// The folder a task's files live in (for tests and operators).
pub fn task_dir(work_dir: &Path, id: &str) -> PathBuf {
    ProcessDriver::new(DriverConfig {
        work_dir: work_dir.to_path_buf(),
        checkpoint_timeout: Duration::ZERO,
        grace: Duration::ZERO,
        checkpoint_interval: Duration::ZERO,
        pass_env: Vec::new(),
        run_as: None,
    })
    .dir_of(id)
}

/// Reads the reports of a task's training process: every connection to
/// its socket is a stream of JSON lines, each applied to `obs`; a
/// malformed line is counted.
fn read_reports(
    listener: tokio::net::UnixListener,
    task: String,
    obs: Arc<Mutex<Observed>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let obs = obs.clone();
            lock(&obs).open_connections += 1;
            let task = task.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stream).lines();
                loop {
                    match lines.next_line().await {
                        Ok(Some(line)) => match Report::parse(&line) {
                            Ok(r) => apply_report(&obs, r),
                            Err(_) => lock(&obs).bad_lines += 1,
                        },
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(%task, error = %e, "report connection broken");
                            break;
                        }
                    }
                }
                lock(&obs).open_connections -= 1;
            });
        }
    })
}

#[cfg(test)]
mod tests;
