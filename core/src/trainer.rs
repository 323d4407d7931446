//! The training-process contract: what the node agent gives a trainer
//! (environment variables, signals) and what a trainer reports back (JSON
//! lines on a unix socket). `docs/trainer-contract.md` is the prose version;
//! the agent, the fake trainer and the Python helper all follow these names.

use serde::{Deserialize, Serialize};

/// Environment variables the agent sets for every training process.
pub mod env {
    /// The job (or, for a spatial merge, the first job) this process serves.
    pub const JOB_ID: &str = "FMSCHED_JOB_ID";
    /// `profile` or `train`.
    pub const MODE: &str = "FMSCHED_MODE";
    /// JSON list of [`super::TaskAssignment`]: one task, or two for a
    /// spatially merged (multi-task) process.
    pub const TASKS: &str = "FMSCHED_TASKS";
    /// Folder the trainer writes its checkpoints into (exists, writable).
    pub const CHECKPOINT_DIR: &str = "FMSCHED_CHECKPOINT_DIR";
    /// A checkpoint to resume from (unset = start fresh).
    pub const RESUME_FROM: &str = "FMSCHED_RESUME_FROM";
    /// Weights to start from instead of the pretrained model: the output of
    /// the first job of a temporal merge (unset = the pretrained model).
    pub const INIT_WEIGHTS: &str = "FMSCHED_INIT_WEIGHTS";
    /// Where the final weights go.
    pub const OUTPUT_DIR: &str = "FMSCHED_OUTPUT_DIR";
    /// Unix socket path for [`Report`] lines.
    pub const REPORT_SOCKET: &str = "FMSCHED_REPORT_SOCKET";
    /// Checkpoint at least this often (seconds).
    pub const CHECKPOINT_INTERVAL_S: &str = "FMSCHED_CHECKPOINT_INTERVAL_S";
    /// Seconds the trainer has after SIGTERM before SIGKILL.
    pub const GRACE_S: &str = "FMSCHED_GRACE_S";
    /// `1` when the process was started ahead of a switch (Ymir §6.2
    /// pipeline switch): prepare what needs no GPU (data loader workers,
    /// tokenised data, weights in host memory), report
    /// [`super::Report::Prewarmed`], then wait for [`super::signal::START`]
    /// before touching the GPUs. SIGTERM while waiting: exit 0.
    pub const STANDBY: &str = "FMSCHED_STANDBY";
    /// Pipeline-parallel jobs: the number of stages (= GPUs on this node).
    /// Stage `i` runs on the `i`-th device of `CUDA_VISIBLE_DEVICES`; the
    /// agent orders those devices so that a job switched in after another
    /// pipeline job runs its stages in reverse order (Ymir §6.2, Fig. 9):
    /// its first stage on the GPU of the previous job's last stage, the
    /// first one to finish its backward pass.
    pub const PIPELINE_STAGES: &str = "FMSCHED_PIPELINE_STAGES";
    /// Expert-parallel MoE jobs (`resources.expert_parallel`): GPUs per
    /// expert group. Every group lies on one node: consecutive local ranks
    /// form a group (this node's GPUs are a whole number of them).
    pub const EXPERT_PARALLEL: &str = "FMSCHED_EXPERT_PARALLEL";
    /// A JSON file ([`super::Control`]) the agent rewrites when the
    /// scheduler changes a running process's settings (ICEFROG's layer
    /// tuner: `frozen_layers`). The trainer reads it at every epoch start
    /// and applies what changed there, without a restart; absent = nothing
    /// changed.
    pub const CONTROL_FILE: &str = "FMSCHED_CONTROL_FILE";
    /// Model name of the GPUs the process runs on (as the node reports it).
    pub const GPU_MODEL: &str = "FMSCHED_GPU_MODEL";
    /// `1` when another training process shares the process's GPU (ICEFROG
    /// GPU sharing, Eq. 8): expect about 0.9 of the speed alone, and keep
    /// GPU memory within what the job's profile predicts.
    pub const SHARED_GPU: &str = "FMSCHED_SHARED_GPU";
    /// `1` when the process may serve more tasks of its model after this
    /// one (PromptTuner's warm pools, §4.4.4): after its last `done` it
    /// reports [`super::Report::Warm`] and waits, keeping the runtime and
    /// the weights loaded, for [`super::signal::START`] (then it reads
    /// [`NEXT_TASK`] and runs that task without loading the model again)
    /// or SIGTERM (then it exits 0). A trainer that cannot do this exits
    /// after `done` as without the variable.
    pub const WARM: &str = "FMSCHED_WARM";
    /// A file holding a warm process's next task: a JSON object of the
    /// contract's per-task variables ([`super::NEXT_TASK_KEYS`]) that
    /// replace the launch's values; one absent there is unset for that
    /// task ([`super::NextTask`]). Written before [`super::signal::START`].
    pub const NEXT_TASK: &str = "FMSCHED_NEXT_TASK";
    /// Torchrun-compatible rank variables. The agent runs one process per
    /// node (a launcher such as `torchrun` starts one worker per GPU):
    /// `WORLD_SIZE` is the job's GPUs on all its nodes, `RANK` the global
    /// rank of this node's first GPU, `LOCAL_RANK` 0, `LOCAL_WORLD_SIZE`
    /// this node's GPUs, `NNODES` the job's nodes and `NODE_RANK` this
    /// node's place among them. `MASTER_ADDR:MASTER_PORT` is where the
    /// process of rank 0 (`NODE_RANK` 0) listens for the rendezvous; the
    /// port is the job's own while it runs. A job over several nodes runs
    /// all its processes or none; only rank 0 writes checkpoints and reports
    /// progress; every other node's process, asked to checkpoint, reports
    /// the checkpoint rank 0 wrote once it is complete, and exits (non-zero)
    /// when rank 0 goes away.
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    pub const RANK: &str = "RANK";
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
    pub const NNODES: &str = "NNODES";
    pub const NODE_RANK: &str = "NODE_RANK";
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    pub const MASTER_PORT: &str = "MASTER_PORT";
    pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
}

/// Signals of the contract (numbers are Linux's).
pub mod signal {
    /// Start training now: the GPUs of a standby process are free
    /// ([`super::env::STANDBY`]); for a warm process
    /// ([`super::env::WARM`]), its next task is in
    /// [`super::env::NEXT_TASK`]. Other processes ignore it.
    pub const START: i32 = 10; // SIGUSR1
    /// Write a checkpoint now and report it; keep training.
    pub const CHECKPOINT: i32 = 12; // SIGUSR2
    /// Checkpoint and exit within the grace period.
    pub const TERMINATE: i32 = 15; // SIGTERM
}

/// One task a process trains (two for a spatial merge).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskAssignment {
    pub job_id: String,
    pub model: String,
    pub task: String,
    pub dataset_uri: String,
    pub global_batch_size: u32,
    /// Stop after this many optimizer iterations (0 = no limit).
    #[serde(default)]
    pub max_iterations: u64,
    /// Stop when this evaluation metric reaches `metric_target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_target: Option<f64>,
    /// Training samples per epoch, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_epoch: Option<u64>,
    /// Stop after this many epochs (0 = no epoch budget).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_epochs: u32,
    /// Do not train this task: evaluate its validation set with the
    /// process's current weights once per epoch of the trained task and
    /// report an `eval` line for it. The scheduler adds B this way to A's
    /// process in a temporal merge `A ↦ B`, so the merge guard sees whether
    /// A's weights help B before B starts (Ymir §4.3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eval_only: bool,
    /// A prompt-tuning task without an initial prompt: a JSON file listing
    /// the model's Prompt Bank ([`BankCandidate`]s). The trainer scores the
    /// medoids, then the members of the best one's cluster ([`walk_bank`]),
    /// starts from the best, and reports [`Report::PromptInit`]. Absent:
    /// the bank is empty (or the task has its own initial prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_bank: Option<String>,
    /// How to train it (the spec's hyper-parameters, objective and frozen
    /// layers), in the same JSON object.
    #[serde(flatten)]
    pub settings: TrainingSettings,
}

impl TaskAssignment {
    /// Does an evaluation `value` reach this task's metric target?
    pub fn metric_reached(&self, value: f64) -> bool {
        self.metric_target.is_some_and(|t| {
            crate::job::metric_reached(value, t, self.settings.metric_lower_is_better)
        })
    }
}

/// How a task trains: everything in the job spec that the trainer, not the
/// scheduler, acts on — plus the settings the scheduler also estimates
/// with (precision, checkpointing, PETL, frozen layers: the throughput
/// variant). Missing keys (an older scheduler) read as defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainingSettings {
    /// `hyperparameters.learning_rate` (0 = not given: the trainer's own).
    pub learning_rate: f64,
    /// `hyperparameters.optimizer`: adamw, adam, sgd, adafactor, lamb ("" =
    /// the trainer's own).
    pub optimizer: String,
    pub weight_decay: f64,
    /// Mixed precision (fp16/bf16 autocast).
    pub amp: bool,
    /// Activation (gradient) checkpointing.
    pub gradient_checkpointing: bool,
    /// "" = full fine-tuning; else lora, adapter, prefix_tuning, prompt_tuning.
    pub petl: String,
    /// ICEFROG ℓ: freeze the first this-many transformer layers (from the
    /// input); 0 = none.
    pub frozen_layers: u32,
    /// Layer-elastic (`layer_elasticity`): the scheduler may change
    /// `frozen_layers` up to this many while the process runs
    /// ([`env::CONTROL_FILE`]); the trainer reports
    /// [`Report::LayerVariance`] every epoch. 0 = not elastic.
    pub max_frozen_layers: u32,
    /// `dataset.objective` (e.g. sequence-classification, causal-lm).
    pub objective: String,
    /// The metric target is reached from above (a loss, a perplexity).
    pub metric_lower_is_better: bool,
    /// A prompt-tuning job (`petl` = prompt_tuning): the soft prompt's
    /// virtual tokens (0 on other jobs).
    #[serde(skip_serializing_if = "is_zero")]
    pub num_virtual_tokens: u32,
    /// A prompt-tuning job's starting text ("" = random).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub initial_prompt: String,
}

/// `amp=… gradient_checkpointing=… petl=… frozen_layers=… optimizer=…
/// learning_rate=… weight_decay=… objective=… metric_lower_is_better=…
/// max_frozen_layers=…`
/// (empty names as `none` / `default`), for logs.
impl std::fmt::Display for TrainingSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or = |s: &'_ str, d: &'static str| if s.is_empty() { d } else { s }.to_string();
        write!(
            f,
            "amp={} gradient_checkpointing={} petl={} frozen_layers={} optimizer={} \
             learning_rate={} weight_decay={} objective={} metric_lower_is_better={} \
             max_frozen_layers={}",
            self.amp,
            self.gradient_checkpointing,
            or(&self.petl, "none"),
            self.frozen_layers,
            or(&self.optimizer, "default"),
            self.learning_rate,
            self.weight_decay,
            or(&self.objective, "default"),
            self.metric_lower_is_better,
            self.max_frozen_layers,
        )
    }
}

impl TrainingSettings {
    /// The settings a job spec asks for.
    pub fn of(spec: &crate::job::JobSpec) -> Self {
        let h = &spec.hyperparameters;
        TrainingSettings {
            learning_rate: h.learning_rate,
            optimizer: h.optimizer.as_str().into(),
            weight_decay: h.weight_decay,
            amp: h.amp,
            gradient_checkpointing: h.gradient_checkpointing,
            petl: h.petl.as_str().into(),
            frozen_layers: spec.frozen_count(),
            max_frozen_layers: spec.layer_elasticity.map_or(0, |e| e.max_frozen_layers),
            objective: spec.dataset.objective.clone(),
            metric_lower_is_better: spec
                .target
                .metric
                .as_ref()
                .is_some_and(|m| m.lower_is_better),
            num_virtual_tokens: spec
                .prompt_tuning
                .as_ref()
                .map_or(0, crate::job::PromptTuning::tokens),
            initial_prompt: spec
                .prompt_tuning
                .as_ref()
                .map(|p| p.initial_prompt.clone())
                .unwrap_or_default(),
        }
    }
}

/// One prompt of a model's Prompt Bank as a trainer gets it (the file
/// [`TaskAssignment::prompt_bank`] names holds a JSON list of them): the
/// two-layer index the scheduler built (PromptTuner §4.4.3.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BankCandidate {
    /// The job that tuned it.
    pub id: String,
    /// Its `prompt.json` (the tuned job's output).
    pub path: String,
    /// Its cluster in the first layer.
    pub cluster: u32,
    /// The cluster's medoid (one per cluster).
    pub medoid: bool,
}

/// The Prompt Bank lookup (PromptTuner §4.4.3.2): score every cluster's
/// medoid, then the other members of the best medoid's cluster; the
/// lowest score wins (Eq. 4.1: lower loss is better). `K + C/K` scorings
/// for `C` prompts in `K` clusters. `clusters` is (medoid, members — the
/// medoid among them or not). Returns the winner, its score and the
/// scorings made.
pub fn walk_bank<T>(
    clusters: &[(T, Vec<T>)],
    mut score: impl FnMut(&T) -> f64,
) -> Option<(&T, f64, usize)>
where
    T: PartialEq,
{
    let mut scored = 0;
    let mut best_cluster: Option<(f64, usize)> = None;
    for (k, (m, _)) in clusters.iter().enumerate() {
        let s = score(m);
        scored += 1;
        if best_cluster.is_none_or(|b| s < b.0) {
            best_cluster = Some((s, k));
        }
    }
    let (ms, k) = best_cluster?;
    let (m, members) = &clusters[k];
    let mut best = (ms, m);
    for p in members.iter().filter(|&p| p != m) {
        let s = score(p);
        scored += 1;
        if s < best.0 {
            best = (s, p);
        }
    }
    Some((best.1, best.0, scored))
}

/// A bank file's candidates as [`walk_bank`]'s clusters (by cluster
/// number; a cluster without a flagged medoid takes its first member).
pub fn bank_clusters(c: &[BankCandidate]) -> Vec<(&BankCandidate, Vec<&BankCandidate>)> {
    let mut by: std::collections::BTreeMap<u32, Vec<&BankCandidate>> = Default::default();
    for x in c {
        by.entry(x.cluster).or_default().push(x);
    }
    by.into_values()
        .map(|members| {
            let m = members
                .iter()
                .copied()
                .find(|x| x.medoid)
                .unwrap_or(members[0]);
            (m, members)
        })
        .collect()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One line a trainer writes to the report socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Report {
    /// Training progress of one task.
    Progress {
        job_id: String,
        iteration: u64,
        samples: u64,
        loss: f64,
        /// Seconds of the last optimizer step.
        step_time_s: f64,
    },
    /// An evaluation.
    Eval {
        job_id: String,
        iteration: u64,
        epoch: f64,
        metric: String,
        value: f64,
    },
    /// Task2Vec embedding (diagonal Fisher, twice), usually in profile mode.
    Embedding {
        job_id: String,
        fisher: Vec<f64>,
        fisher_repeat: Vec<f64>,
    },
    /// A checkpoint was written and is complete.
    Checkpoint { path: String, iteration: u64 },
    /// A standby process is ready: everything that needs no GPU is
    /// prepared; it waits for [`signal::START`].
    Prewarmed,
    /// A warm process ([`env::WARM`]) finished its tasks and waits with
    /// its model loaded for the next one.
    Warm,
    /// A task reached its target; its output (weights, or a prompt-tuning
    /// job's tuned prompt) is at `output`. A prompt-tuning task adds its
    /// tuned prompt's activation features (PromptTuner §4.4.3.1): the
    /// scheduler files the prompt in the model's Prompt Bank by them.
    Done {
        job_id: String,
        output: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        prompt_features: Vec<f64>,
    },
    /// A prompt-tuning task started from a Prompt Bank candidate
    /// ([`TaskAssignment::prompt_bank`]): the one with the lowest score
    /// (Eq. 4.1), found after `scored` of the bank's `candidates` scorings.
    PromptInit {
        job_id: String,
        /// The candidate's id (the job that tuned it).
        from: String,
        score: f64,
        scored: u32,
        candidates: u32,
    },
    /// Per-layer gradient variance of a layer-elastic task, once an epoch
    /// (ICEFROG Eq. 3): `variance[i]` for transformer layer `i` from the
    /// input — the epoch's for a trained layer, and for a frozen one the
    /// value it had when it was frozen — with the frozen layers it trains
    /// with now.
    LayerVariance {
        job_id: String,
        epoch: f64,
        frozen_layers: u32,
        variance: Vec<f64>,
    },
}

/// What [`env::NEXT_TASK`] holds: the contract's variables of a warm
/// process's next task, replacing those it was launched with (a variable
/// absent here is unset for that task).
pub type NextTask = std::collections::BTreeMap<String, String>;

/// The variables a [`NextTask`] replaces: those that differ from task to
/// task of one process.
pub const NEXT_TASK_KEYS: [&str; 7] = [
    env::JOB_ID,
    env::TASKS,
    env::CHECKPOINT_DIR,
    env::OUTPUT_DIR,
    env::CONTROL_FILE,
    env::RESUME_FROM,
    env::INIT_WEIGHTS,
];

/// What [`env::CONTROL_FILE`] holds: the settings the scheduler changed
/// while the process runs (absent keys: unchanged).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Control {
    /// Freeze the first this-many layers from the next epoch on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_layers: Option<u32>,
    /// When its lease ends (Unix seconds): the scheduler then renews it or
    /// suspends it, so a trainer checkpoints shortly before (a suspension
    /// then loses nothing and is quick).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_end: Option<f64>,
    /// Another process now shares (true) or no longer shares (false) its
    /// GPU ([`env::SHARED_GPU`] at launch says how it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_gpu: Option<bool>,
}

impl Report {
    /// Parses one line, naming what is wrong.
    pub fn parse(line: &str) -> Result<Report, String> {
        serde_json::from_str(line.trim()).map_err(|e| format!("bad report line: {e}"))
    }

    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("reports serialise");
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec's settings reach the task JSON flat, under the contract's
    /// names; a task of an older scheduler (no settings) reads as defaults.
    #[test]
    fn training_settings_come_from_the_spec_and_read_flat() {
        use crate::job::{FrozenLayers, PetlMethod};
        let mut spec = crate::validate::tests::spec();
        spec.hyperparameters.petl = PetlMethod::PrefixTuning;
        spec.hyperparameters.gradient_checkpointing = true;
        spec.frozen_layers = Some(FrozenLayers { first: 0, last: 3 });
        spec.target.metric.as_mut().unwrap().lower_is_better = true;
        let s = TrainingSettings::of(&spec);
        assert_eq!(
            s.to_string(),
            "amp=true gradient_checkpointing=true petl=prefix_tuning frozen_layers=4 \
             optimizer=adamw learning_rate=0.00002 weight_decay=0.01 \
             objective=sequence-classification metric_lower_is_better=true max_frozen_layers=0"
        );
        let t = TaskAssignment {
            job_id: "j".into(),
            model: spec.model.clone(),
            task: "qqp".into(),
            dataset_uri: "s3://d".into(),
            global_batch_size: 64,
            max_iterations: 0,
            metric: Some("loss".into()),
            metric_target: Some(0.5),
            samples_per_epoch: None,
            max_epochs: 0,
            eval_only: false,
            prompt_bank: None,
            settings: s,
        };
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["frozen_layers"], 4);
        assert_eq!(json["petl"], "prefix_tuning");
        assert_eq!(serde_json::from_value::<TaskAssignment>(json).unwrap(), t);
        assert!(
            t.metric_reached(0.4) && !t.metric_reached(0.6),
            "a loss is reached from above"
        );
        let old: TaskAssignment = serde_json::from_str(
            r#"{"job_id":"j","model":"m","task":"t","dataset_uri":"d","global_batch_size":8}"#,
        )
        .unwrap();
        assert_eq!(old.settings, TrainingSettings::default());
    }

    #[test]
    fn reports_round_trip_as_json_lines() {
        let r = Report::Progress {
            job_id: "j".into(),
            iteration: 10,
            samples: 320,
            loss: 1.5,
            step_time_s: 0.2,
        };
        let line = r.to_line();
        assert!(line.starts_with("{\"type\":\"progress\""), "{line}");
        assert_eq!(Report::parse(&line).unwrap(), r);
        assert!(
            Report::parse("{\"type\":\"nope\"}")
                .unwrap_err()
                .contains("bad report line")
        );
        // A done line without features (every trainer before the Prompt
        // Bank) reads as none; a prompt job's carries them.
        let d = Report::parse(r#"{"type":"done","job_id":"j","output":"/o"}"#).unwrap();
        assert_eq!(
            d,
            Report::Done {
                job_id: "j".into(),
                output: "/o".into(),
                prompt_features: vec![]
            }
        );
        assert!(!d.to_line().contains("prompt_features"));
        let p = Report::Done {
            job_id: "j".into(),
            output: "/o/prompt.json".into(),
            prompt_features: vec![0.5, -1.0],
        };
        assert_eq!(Report::parse(&p.to_line()).unwrap(), p);
        let init = Report::parse(
            r#"{"type":"prompt_init","job_id":"j","from":"a","score":1.2,"scored":3,"candidates":9}"#,
        )
        .unwrap();
        assert!(
            matches!(init, Report::PromptInit { ref from, scored: 3, candidates: 9, .. } if from == "a")
        );
        let c = Report::parse(r#"{"type":"checkpoint","path":"/c/1","iteration":3}"#).unwrap();
        assert_eq!(
            c,
            Report::Checkpoint {
                path: "/c/1".into(),
                iteration: 3
            }
        );
    }
}
