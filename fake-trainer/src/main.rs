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

mod bank;
mod gang;
mod report;
#[cfg(test)]
mod tests;
mod trainer;
mod world;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fmsched_core::trainer::{Report, TaskAssignment, env};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::{Lut, Variant, packed_placement};
use tokio::signal::unix::{SignalKind, signal};

use crate::bank::pick_from_bank;
use crate::gang::{GangEnv, follow, lead_rendezvous};
use crate::report::{LeaseWatch, connect_reporter};
use crate::trainer::{Checkpoint, StepOf, TaskState, Trainer};
use crate::world::{Curve, embedding, frozen_penalty_of, true_gain};

pub(crate) fn var(name: &str) -> Option<String> {
    // A warm process's next task replaces the contract's per-task
    // variables (one it leaves out is unset for that task).
    if let Some(next) = overrides().as_ref()
        && fmsched_core::trainer::NEXT_TASK_KEYS.contains(&name)
    {
        return next.get(name).filter(|v| !v.trim().is_empty()).cloned();
    }
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
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
