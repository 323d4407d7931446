//! The job specification (Ymir Table 1; docs/architecture.md, "Flow of one
//! job", step 1) and the job state machine.
//!
//! `JobSpec` is the one representation of what a user asked for: fmctl parses
//! YAML into it, the gRPC layer converts protobuf into it, and the scheduler
//! stores it as JSON. Unknown YAML keys are rejected so a typo never silently
//! drops a setting.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::slo::SloClass;

/// Lifecycle of a job. See [`JobState::can_transition_to`] for the edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Accepted and persisted; waiting for a profiling allocation.
    Submitted,
    /// Running its profiling allocation.
    Profiling,
    /// Waiting for GPUs in the plan (after profiling, or suspended).
    Queued,
    /// Holds GPUs in the current plan.
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Submitted,
        JobState::Profiling,
        JobState::Queued,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// Completed, failed and cancelled jobs never change state again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled
        )
    }

    /// The edges of the state machine:
    /// `submitted → profiling → queued ⇄ running → completed`, any live state
    /// → failed / cancelled, and back to an earlier live state when a node is
    /// lost (profiling → submitted, running → queued).
    pub fn can_transition_to(self, next: JobState) -> bool {
        use JobState::*;
        if self.is_terminal() {
            return false;
        }
        matches!(
            (self, next),
            (_, Failed | Cancelled)
                | (Submitted, Profiling | Queued)
                | (Profiling, Submitted | Queued | Running)
                | (Queued, Running | Profiling)
                | (Running, Queued | Completed)
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Submitted => "submitted",
            JobState::Profiling => "profiling",
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                let names: Vec<_> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "unknown job state {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Where the data lives and what is learned from it (a task = dataset + objective).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    pub uri: String,
    pub task: String,
    #[serde(default)]
    pub objective: String,
    /// Training samples per epoch, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_samples: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    #[default]
    Adamw,
    Adam,
    Sgd,
    Adafactor,
    Lamb,
}

impl Optimizer {
    /// The name in specs and in the trainer's `FMSCHED_TASKS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Optimizer::Adamw => "adamw",
            Optimizer::Adam => "adam",
            Optimizer::Sgd => "sgd",
            Optimizer::Adafactor => "adafactor",
            Optimizer::Lamb => "lamb",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PetlMethod {
    /// Full fine-tuning.
    #[default]
    None,
    Lora,
    Adapter,
    PrefixTuning,
    PromptTuning,
}

impl PetlMethod {
    /// The name in specs and in the trainer's `FMSCHED_TASKS`; "" for full
    /// fine-tuning (the throughput table's `petl` key).
    pub fn as_str(self) -> &'static str {
        match self {
            PetlMethod::None => "",
            PetlMethod::Lora => "lora",
            PetlMethod::Adapter => "adapter",
            PetlMethod::PrefixTuning => "prefix_tuning",
            PetlMethod::PromptTuning => "prompt_tuning",
        }
    }
}

/// The kind of work a job is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Fine-tuning (full or PETL): the output is the model's weights.
    #[default]
    FineTune,
    /// Prompt tuning (PromptTuner, Table 4.2): only a soft prompt of
    /// virtual tokens is trained; the output is the tuned prompt. Never
    /// merged, pipelined, elastic or layer-elastic, never profiled; needs
    /// `target.max_iterations`.
    PromptTuning,
}

impl JobKind {
    fn is_fine_tune(&self) -> bool {
        *self == JobKind::FineTune
    }
}

/// How a prompt-tuning job's soft prompt starts and how long it is
/// (PromptTuner Table 4.2 "Hyperparam": the initial prompt).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptTuning {
    /// Virtual tokens of the prompt (0 = [`PromptTuning::DEFAULT_TOKENS`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_virtual_tokens: u32,
    /// The prompt's starting point as text (its token embeddings, repeated
    /// to the prompt's length); empty = random.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub initial_prompt: String,
}

impl PromptTuning {
    /// Virtual tokens when a spec gives none (peft's usual prompt length).
    pub const DEFAULT_TOKENS: u32 = 20;
    /// The most virtual tokens a spec may ask for.
    pub const MAX_TOKENS: u32 = 512;
    /// The longest initial prompt, in bytes.
    pub const MAX_INITIAL_PROMPT: usize = 4096;

    /// Its virtual tokens, the default applied.
    pub fn tokens(&self) -> u32 {
        if self.num_virtual_tokens == 0 {
            Self::DEFAULT_TOKENS
        } else {
            self.num_virtual_tokens
        }
    }
}

/// Ymir Table 1 "Hyperparam".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HyperParameters {
    pub global_batch_size: u32,
    pub learning_rate: f64,
    #[serde(default)]
    pub optimizer: Optimizer,
    #[serde(default)]
    pub amp: bool,
    #[serde(default)]
    pub gradient_checkpointing: bool,
    #[serde(default)]
    pub petl: PetlMethod,
    #[serde(default)]
    pub weight_decay: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricTarget {
    pub name: String,
    pub value: f64,
    #[serde(default)]
    pub lower_is_better: bool,
}

impl MetricTarget {
    /// Does an evaluation `value` reach the target (`≤` when lower is
    /// better, e.g. a loss or perplexity; `≥` otherwise)?
    pub fn reached(&self, value: f64) -> bool {
        metric_reached(value, self.value, self.lower_is_better)
    }
}

/// `value` reaches `target` in the metric's sense.
pub fn metric_reached(value: f64, target: f64, lower_is_better: bool) -> bool {
    if lower_is_better {
        value <= target
    } else {
        value >= target
    }
}

/// `later` is better than `earlier` in the metric's sense (strictly).
pub fn metric_improved(earlier: f64, later: f64, lower_is_better: bool) -> bool {
    if lower_is_better {
        later < earlier
    } else {
        later > earlier
    }
}

/// Completion criteria: the first one met completes the job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_epochs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<MetricTarget>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub min_gpus: u32,
    pub max_gpus: u32,
    #[serde(default)]
    pub pipeline_parallel: bool,
    /// Expert parallelism of an MoE model: its experts are spread over
    /// groups of this many GPUs, each group on one node (0 or 1 = none).
    /// The job runs on whole groups.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expert_parallel: u32,
    /// Restrict to one GPU model (None = any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// An elastic job (Lyra): `min` base workers, gang-scheduled and never
    /// taken by a scale-in, and flexible workers up to `max` that join and
    /// leave at checkpoint boundaries. None: the GPU range is the inelastic
    /// case (the policy picks a size in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<Workers>,
}

/// An elastic job's worker range (Lyra §3.2). `min_gpus` / `max_gpus` must
/// be `min` / `max` workers' GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workers {
    pub min: u32,
    pub max: u32,
    #[serde(default = "one")]
    pub gpus_per_worker: u32,
}

fn one() -> u32 {
    1
}

impl Resources {
    /// GPUs that must sit together on one node: a pipeline replica, an
    /// expert group, or a multi-GPU worker.
    pub fn replica(&self) -> Replica {
        Replica::of(self.pipeline_parallel, self.expert_parallel)
            .with_workers(self.workers.map_or(0, |w| w.gpus_per_worker))
    }

    /// GPUs of the base demand: the elastic job's base workers, else what
    /// the job asks for (its maximum).
    pub fn base_gpus(&self) -> u32 {
        match self.workers {
            Some(w) => w.min * w.gpus_per_worker,
            None => self.max_gpus,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Inclusive range of frozen layers (ICEFROG §III): the transformer layers
/// `first..=last` (counted from the input, 0-based) get no weight updates.
/// Layers freeze from the input side, so `first` is 0: the backward pass
/// then stops at layer `last + 1` — a range that starts later saves no
/// backward work below it and is refused at submit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrozenLayers {
    pub first: u32,
    pub last: u32,
}

/// ICEFROG layer elasticity (§III): the scheduler's layer tuner may freeze
/// up to `max_frozen_layers` layers from the input, starting from
/// `frozen_layers` (none when unset), and change it while the job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerElasticity {
    pub max_frozen_layers: u32,
}

/// ICEFROG caps the frozen layers at 90 % of the model's (§III).
pub const MAX_FROZEN_SHARE: f64 = 0.9;

impl FrozenLayers {
    /// ℓ of ICEFROG: how many layers (from the input) are frozen.
    pub fn count(&self) -> u32 {
        self.last.saturating_sub(self.first) + 1
    }
}

impl JobSpec {
    /// A job submitted without a name (or a blank one) is named
    /// `<dataset.task>-<model>`, e.g. `qqp-roberta-base`: every listing
    /// shows something a user recognises. The API applies it at submit.
    pub fn default_name(&mut self) {
        if self.name.trim().is_empty() {
            self.name = format!("{}-{}", self.dataset.task.trim(), self.model.trim());
        }
    }

    /// A prompt-tuning job trains its prompt only: its PETL method is
    /// `prompt_tuning` (what the throughput table estimates it by) and its
    /// prompt settings default. Applied at submit, after validation (which
    /// refuses any other PETL method on such a job).
    pub fn apply_kind_defaults(&mut self) {
        if self.kind == JobKind::PromptTuning {
            self.hyperparameters.petl = PetlMethod::PromptTuning;
            let p = self.prompt_tuning.get_or_insert_with(Default::default);
            p.num_virtual_tokens = p.tokens();
        }
    }

    /// May this job be merged with another (Ymir §9's `sharing` opt-out;
    /// a prompt-tuning job trains a prompt of its own and is never merged).
    pub fn may_merge(&self) -> bool {
        self.sharing && self.kind == JobKind::FineTune
    }

    /// Is it scheduled without a profiling run of its own? A prompt-tuning
    /// job is: PromptTuner bounds it by its maximum iterations at the
    /// model's profiled step time, and it is never merged, so its own loss
    /// curve and Task2Vec embedding would serve nothing.
    pub fn skips_profiling(&self) -> bool {
        self.kind == JobKind::PromptTuning
    }

    /// The job's service class ([`SloClass::or_default_for`]).
    pub fn class(&self) -> SloClass {
        SloClass::or_default_for(self.slo_class, self.deadline.is_some())
    }

    /// Its reward steps on a clock where it was submitted at `submitted_at`
    /// and its deadline is at `deadline` ([`crate::slo::reward_steps_with`]
    /// with its own soft steps, if it gives any).
    pub fn reward_steps(
        &self,
        submitted_at: f64,
        deadline: Option<f64>,
    ) -> Vec<crate::slo::RewardStep> {
        crate::slo::reward_steps_with(self.class(), submitted_at, deadline, &self.reward_steps)
    }

    /// Iterations its budget allows: the smaller of `max_iterations` and
    /// `max_epochs` in iterations (when the dataset size is known); None
    /// when neither is known. A metric target may end it sooner.
    pub fn iteration_budget(&self) -> Option<u64> {
        let t = &self.target;
        let batch = u64::from(self.hyperparameters.global_batch_size.max(1));
        let epochs = t
            .max_epochs
            .zip(self.dataset.num_samples)
            .map(|(e, n)| (u64::from(e) * n).div_ceil(batch));
        match (t.max_iterations, epochs) {
            (Some(i), Some(e)) => Some(i.min(e)),
            (i, e) => i.or(e),
        }
    }

    /// ℓ: the frozen layers (0 = none).
    pub fn frozen_count(&self) -> u32 {
        self.frozen_layers.map_or(0, |f| f.count())
    }

    /// The process-wide training settings two jobs must share to merge
    /// (one process trains both tasks of a spatial merge; a temporal merge
    /// hands A's weights — full or adapter — to B): precision, activation
    /// checkpointing, PETL method and frozen layers.
    pub fn merge_setup(&self) -> String {
        let h = &self.hyperparameters;
        format!(
            "amp={} ckpt={} petl={} frozen={}",
            h.amp,
            h.gradient_checkpointing,
            h.petl.as_str(),
            self.frozen_count()
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The trainer implements standby (`FMSCHED_STANDBY`,
    /// `docs/trainer-contract.md`): the scheduler may start it ahead of the
    /// round that gives it GPUs, so its data loader is ready when they free
    /// up (Ymir §6.2). Off by default: a trainer that ignores standby would
    /// touch GPUs another job still uses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prewarm: bool,
}

fn default_true() -> bool {
    true
}

/// Everything a user specifies about a fine-tuning job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default)]
    pub name: String,
    pub model: String,
    pub dataset: DatasetSpec,
    pub hyperparameters: HyperParameters,
    pub target: Target,
    pub resources: Resources,
    /// May this job be merged with others? Default true; false is the privacy
    /// opt-out of Ymir §9.
    #[serde(default = "default_true")]
    pub sharing: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// Service class; None = by the one default rule of every entry point
    /// (gRPC, YAML, SDK): [`JobSpec::class`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_class: Option<SloClass>,
    /// A soft SLO job's own reward steps (empty: UniSched's 100 / 80 / 50 /
    /// 20 at 1 / 1.1 / 1.2 / 1.5 × the deadline, [`crate::slo::SOFT_STEPS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reward_steps: Vec<crate::slo::SoftStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_layers: Option<FrozenLayers>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_elasticity: Option<LayerElasticity>,
    pub launch: Launch,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The queue it runs in (empty: its user's; [`crate::queue`]). The
    /// service stores the resolved name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
    /// Priority within its queue, -1000..=1000 (higher first; default 0):
    /// a higher-priority job takes GPUs from lower ones of its queue.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub priority: i32,
    /// May be suspended once running (default true). A non-preemptible job
    /// starts only within its queue's guarantee, keeps its GPUs until it
    /// ends, and is never merged.
    #[serde(default = "default_true")]
    pub preemptible: bool,
    /// What the job is (default: fine-tuning).
    #[serde(default, skip_serializing_if = "JobKind::is_fine_tune")]
    pub kind: JobKind,
    /// A prompt-tuning job's prompt (None on other kinds; a prompt-tuning
    /// job without one gets the defaults at submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tuning: Option<PromptTuning>,
}

fn is_zero_i32(p: &i32) -> bool {
    *p == 0
}

/// Stages of a pipeline-parallel job, i.e. GPUs of one pipeline replica
/// (Ymir §5.2: "we restrict the resource allocation set as A = {4m | m ∈ N},
/// reserving entire GPU servers for each pipeline-parallel workload" — on
/// their 4-GPU servers a replica is a server). fmsched keeps each replica's
/// four stages on one node of any size: half an 8-GPU server, a quarter of
/// a 16-GPU one. Allocations of a pipeline job are multiples of this.
pub const PIPELINE_STAGES: u32 = 4;

/// One replica of a job: GPUs that must sit on one node — a pipeline's
/// [`PIPELINE_STAGES`], an expert-parallel group's `expert_parallel` GPUs
/// (Lina: the all-to-all between experts is a third of a step's time even
/// over NVLink, Table 4.1 — across the network it would dominate), else
/// one GPU. A job's allocations are multiples of [`Replica::gpus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replica {
    Gpu,
    /// [`PIPELINE_STAGES`] stages.
    Pipeline,
    /// An expert-parallel group of this many GPUs (> 1).
    Experts(u32),
    /// An elastic job's worker of this many GPUs (> 1; Lyra): a worker's
    /// GPUs sit on one node, and the job grows and shrinks by workers.
    Worker(u32),
}

impl Replica {
    pub fn of(pipeline: bool, expert_parallel: u32) -> Self {
        if pipeline {
            Replica::Pipeline
        } else if expert_parallel > 1 {
            Replica::Experts(expert_parallel)
        } else {
            Replica::Gpu
        }
    }

    /// This replica, or a worker of `gpus_per_worker` GPUs for a
    /// data-parallel job with multi-GPU workers.
    pub fn with_workers(self, gpus_per_worker: u32) -> Self {
        match self {
            Replica::Gpu if gpus_per_worker > 1 => Replica::Worker(gpus_per_worker),
            other => other,
        }
    }

    pub fn gpus(self) -> u32 {
        match self {
            Replica::Gpu => 1,
            Replica::Pipeline => PIPELINE_STAGES,
            Replica::Experts(n) | Replica::Worker(n) => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_name_defaults_to_task_and_model_and_a_given_one_is_kept() {
        let mut s = crate::validate::tests::spec();
        s.name = "  ".into();
        s.default_name();
        assert_eq!(s.name, "qqp-roberta-base");
        s.name = "mine".into();
        s.default_name();
        assert_eq!(s.name, "mine");
    }

    #[test]
    fn terminal_states_have_no_exits() {
        for from in [JobState::Completed, JobState::Failed, JobState::Cancelled] {
            for to in JobState::ALL {
                assert!(!from.can_transition_to(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn main_path_and_requeue_are_allowed() {
        use JobState::*;
        for (a, b) in [
            (Submitted, Profiling),
            (Profiling, Queued),
            (Queued, Running),
            (Running, Queued),
            (Running, Completed),
            (Queued, Cancelled),
        ] {
            assert!(a.can_transition_to(b), "{a} -> {b}");
        }
        assert!(!Submitted.can_transition_to(Completed));
        assert!(!Queued.can_transition_to(Submitted));
    }

    #[test]
    fn state_names_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
        }
        assert!(
            "bogus"
                .parse::<JobState>()
                .unwrap_err()
                .contains("expected one of")
        );
    }
}
