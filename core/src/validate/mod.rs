//! Validation of a job spec. Every error names the field (as a path rooted at
//! `spec`) so a user can fix it without reading server logs.

use std::fmt;

use chrono::{DateTime, Utc};

pub use crate::field_error::FieldError;
use crate::job::{JobSpec, SloClass};
use crate::models::{ModelCatalog, ModelInfo, expert_group_problem};

mod launch;
pub use launch::denied_env;
use launch::{has_parent_segment, plain};

/// Size limits on user input. Defaults follow the API documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest accepted string, in bytes.
    pub max_string_bytes: usize,
    /// Longest accepted identifier-like string (names, tasks, label keys).
    pub max_name_bytes: usize,
    pub max_env_vars: usize,
    pub max_labels: usize,
    pub max_command_args: usize,
    pub max_gpus_per_job: u32,
    /// Bounds on counts the scheduler multiplies (iterations × step time,
    /// epochs × samples ÷ batch): far beyond any fine-tuning job, and small
    /// enough that no product of them overflows.
    pub max_iterations: u64,
    pub max_epochs: u32,
    pub max_global_batch_size: u32,
    pub max_num_samples: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_string_bytes: 64 * 1024,
            max_name_bytes: 253,
            max_env_vars: 256,
            max_labels: 64,
            max_command_args: 1024,
            max_gpus_per_job: 4096,
            max_iterations: 1_000_000_000_000,
            max_epochs: 100_000,
            max_global_batch_size: 1 << 20,
            max_num_samples: 1_000_000_000_000,
        }
    }
}

/// What validation needs from the outside world, passed in so this stays pure.
pub struct ValidationContext<'a> {
    pub now: DateTime<Utc>,
    pub models: &'a ModelCatalog,
    pub limits: Limits,
}

type R = Result<(), FieldError>;

fn err(field: &str, msg: impl Into<String>) -> R {
    Err(FieldError::new(format!("spec.{field}"), msg))
}

fn string(field: &str, value: &str, max: usize, required: bool) -> R {
    if required && value.trim().is_empty() {
        return err(field, "must not be empty");
    }
    if value.len() > max {
        return err(
            field,
            format!("is {} bytes; at most {max} are allowed", value.len()),
        );
    }
    if value.contains('\0') {
        return err(field, "must not contain NUL characters");
    }
    Ok(())
}

fn at_most<T: PartialOrd + fmt::Display>(field: &str, v: T, max: T) -> R {
    if v > max {
        return err(field, format!("is {v}; at most {max} is accepted"));
    }
    Ok(())
}

/// A dataset location: a URI with a scheme (`s3://`, `gs://`, `hf://`,
/// `file://`, `https://` …) or an absolute path, with no `..` segment (a
/// trainer resolves it on a shared host: `../../etc/passwd` is not data),
/// however percent-encoded (`..%2f`, `%252e%252e`).
fn dataset_uri(field: &str, uri: &str) -> R {
    let scheme = uri.split_once("://").map(|(s, _)| s).filter(|s| {
        let mut c = s.chars();
        c.next().is_some_and(|c| c.is_ascii_alphabetic())
            && c.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if scheme.is_none() && !uri.starts_with('/') {
        return err(
            field,
            format!(
                "{uri:?} must be a URI with a scheme (s3://, gs://, hf://, file://, https://…) or an absolute path"
            ),
        );
    }
    if has_parent_segment(uri) {
        return err(field, format!("{uri:?} must not contain a `..` segment"));
    }
    if uri.chars().any(char::is_control) {
        return err(field, "must not contain control characters");
    }
    Ok(())
}

fn finite(field: &str, v: f64) -> R {
    if !v.is_finite() {
        return err(field, format!("must be a finite number, got {v}"));
    }
    Ok(())
}

/// The cluster's Mixture-of-Experts models, for messages.
fn moe_models(ctx: &ValidationContext<'_>) -> String {
    let moe: Vec<&str> = ctx
        .models
        .names()
        .filter(|n| ctx.models.get(n).is_some_and(|m| m.is_moe()))
        .collect();
    if moe.is_empty() {
        "this cluster knows none".into()
    } else {
        format!("this cluster knows {}", moe.join(", "))
    }
}

impl JobSpec {
    /// Values given explicitly that the gRPC wire cannot tell from "not
    /// given" (proto3: a zero count, an empty name). Sent as they are, they
    /// would vanish on the way and the job would run as if the field were
    /// absent (`num_samples: 0` silently unset), so [`JobSpec::validate`]
    /// refuses them, and clients (fmctl, the Rust SDK) refuse them before
    /// sending, with the same error.
    pub fn check_given_values(&self) -> Result<(), FieldError> {
        if self.dataset.num_samples == Some(0) {
            return err("dataset.num_samples", "must be > 0 when given");
        }
        if self.target.max_iterations == Some(0) {
            return err("target.max_iterations", "must be > 0");
        }
        if self.target.max_epochs == Some(0) {
            return err("target.max_epochs", "must be > 0");
        }
        if let Some(m) = &self.resources.gpu_model {
            string("resources.gpu_model", m, usize::MAX, true)?;
        }
        Ok(())
    }

    /// Checks every field; returns the first problem found.
    /// The rules of its kind: a prompt-tuning job trains a prompt only and
    /// ends by its iteration budget (PromptTuner Table 4.2's termination
    /// condition); the prompt settings belong to that kind alone.
    fn validate_kind(&self) -> Result<(), FieldError> {
        use crate::job::{JobKind, PetlMethod, PromptTuning};
        let r = &self.resources;
        match self.kind {
            JobKind::FineTune => {
                if self.prompt_tuning.is_some() {
                    return err(
                        "prompt_tuning",
                        "only a prompt-tuning job (kind: prompt_tuning) has a prompt",
                    );
                }
                if self.hyperparameters.petl == PetlMethod::PromptTuning {
                    return err(
                        "hyperparameters.petl",
                        "prompt tuning is a job kind: set kind: prompt_tuning (its output is the \
                         tuned prompt, not weights)",
                    );
                }
            }
            JobKind::PromptTuning => {
                let refuse = |field: &str, what: &str| {
                    err(
                        field,
                        format!("a prompt-tuning job trains its prompt only: {what}"),
                    )
                };
                if self.target.max_iterations.is_none() {
                    return err(
                        "target.max_iterations",
                        "a prompt-tuning job needs a maximum number of iterations (its \
                         termination condition, with an optional metric target)",
                    );
                }
                if !matches!(
                    self.hyperparameters.petl,
                    PetlMethod::None | PetlMethod::PromptTuning
                ) {
                    return refuse("hyperparameters.petl", "leave it unset or prompt_tuning");
                }
                if self.frozen_layers.is_some() {
                    return refuse("frozen_layers", "every layer of the model stays frozen");
                }
                if self.layer_elasticity.is_some() {
                    return refuse("layer_elasticity", "it has no layers to unfreeze");
                }
                if r.pipeline_parallel {
                    return refuse("resources.pipeline_parallel", "it runs data-parallel");
                }
                if r.expert_parallel > 1 {
                    return refuse("resources.expert_parallel", "it runs data-parallel");
                }
                if r.workers.is_some() {
                    return refuse(
                        "resources.workers",
                        "its GPUs are chosen per request, not by elastic workers",
                    );
                }
                if let Some(p) = &self.prompt_tuning {
                    if p.num_virtual_tokens > PromptTuning::MAX_TOKENS {
                        return err(
                            "prompt_tuning.num_virtual_tokens",
                            format!(
                                "at most {}, got {}",
                                PromptTuning::MAX_TOKENS,
                                p.num_virtual_tokens
                            ),
                        );
                    }
                    string(
                        "prompt_tuning.initial_prompt",
                        &p.initial_prompt,
                        PromptTuning::MAX_INITIAL_PROMPT,
                        false,
                    )?;
                }
            }
        }
        Ok(())
    }

    pub fn validate(&self, ctx: &ValidationContext<'_>) -> Result<(), FieldError> {
        let l = &ctx.limits;
        string("name", &self.name, l.max_name_bytes, false)?;
        plain("name", &self.name)?;
        if self.name.chars().any(char::is_control) {
            return err(
                "name",
                "must not contain control characters (newlines, tabs…)",
            );
        }

        // Model: known to the cluster.
        string("model", &self.model, l.max_name_bytes, true)?;
        plain("model", &self.model)?;
        let Some(model) = ctx.models.get(&self.model) else {
            let known: Vec<&str> = ctx.models.names().collect();
            return err(
                "model",
                format!(
                    "unknown model {:?}; this cluster knows: {}",
                    self.model,
                    known.join(", ")
                ),
            );
        };

        // Dataset.
        string("dataset.uri", &self.dataset.uri, l.max_string_bytes, true)?;
        dataset_uri("dataset.uri", &self.dataset.uri)?;
        string("dataset.task", &self.dataset.task, l.max_name_bytes, true)?;
        plain("dataset.task", &self.dataset.task)?;
        string(
            "dataset.objective",
            &self.dataset.objective,
            l.max_name_bytes,
            false,
        )?;
        plain("dataset.objective", &self.dataset.objective)?;
        self.check_given_values()?;
        if let Some(n) = self.dataset.num_samples {
            at_most("dataset.num_samples", n, l.max_num_samples)?;
        }

        // Hyper-parameters.
        let hp = &self.hyperparameters;
        if hp.global_batch_size == 0 {
            return err("hyperparameters.global_batch_size", "must be > 0");
        }
        at_most(
            "hyperparameters.global_batch_size",
            hp.global_batch_size,
            l.max_global_batch_size,
        )?;
        finite("hyperparameters.learning_rate", hp.learning_rate)?;
        if hp.learning_rate <= 0.0 {
            return err(
                "hyperparameters.learning_rate",
                format!("must be > 0, got {}", hp.learning_rate),
            );
        }
        finite("hyperparameters.weight_decay", hp.weight_decay)?;
        if hp.weight_decay < 0.0 {
            return err("hyperparameters.weight_decay", "must be >= 0");
        }

        // Target: something must end the job.
        let t = &self.target;
        if t.max_iterations.is_none() && t.max_epochs.is_none() {
            return err(
                "target",
                "set max_iterations or max_epochs (a metric target alone may never be reached)",
            );
        }
        if let Some(n) = t.max_iterations {
            at_most("target.max_iterations", n, l.max_iterations)?;
        }
        if let Some(n) = t.max_epochs {
            at_most("target.max_epochs", n, l.max_epochs)?;
        }
        if let Some(m) = &t.metric {
            string("target.metric.name", &m.name, l.max_name_bytes, true)?;
            plain("target.metric.name", &m.name)?;
            finite("target.metric.value", m.value)?;
        }

        self.validate_resources(ctx, model)?;
        self.validate_deadline(ctx)?;
        self.validate_layers(model)?;

        // Prompt tuning (PromptTuner).
        self.validate_kind()?;

        self.validate_launch(l)?;

        // Queue (whether it exists and the user may use it is the
        // service's check, against its configured queues) and priority.
        string("queue", &self.queue, l.max_name_bytes, false)?;
        if !self.queue.is_empty() && !crate::queue::valid_name(&self.queue) {
            return err(
                "queue",
                format!(
                    "{:?}: a queue name has 1-63 letters, digits, '-', '_' or '.'",
                    self.queue
                ),
            );
        }
        if !(-1000..=1000).contains(&self.priority) {
            return err(
                "priority",
                format!("{} is out of range; -1000 to 1000", self.priority),
            );
        }
        Ok(())
    }

    /// GPU range, pipeline and expert parallelism, GPU model, elastic workers.
    fn validate_resources(
        &self,
        ctx: &ValidationContext<'_>,
        model: &ModelInfo,
    ) -> Result<(), FieldError> {
        let l = &ctx.limits;
        // Resources.
        let r = &self.resources;
        if r.min_gpus == 0 {
            return err("resources.min_gpus", "must be >= 1");
        }
        if r.min_gpus > r.max_gpus {
            return err(
                "resources.min_gpus",
                format!(
                    "must be <= resources.max_gpus (got min {} > max {})",
                    r.min_gpus, r.max_gpus
                ),
            );
        }
        if r.max_gpus > l.max_gpus_per_job {
            return err(
                "resources.max_gpus",
                format!("must be <= {}", l.max_gpus_per_job),
            );
        }
        if r.pipeline_parallel && r.max_gpus < 4 {
            return err(
                "resources.max_gpus",
                "pipeline-parallel jobs run on whole 4-GPU servers; must be >= 4",
            );
        }
        if r.expert_parallel > 1 {
            let ep = r.expert_parallel;
            if let Some(why) = expert_group_problem(&self.model, model.experts, ep) {
                let why = if model.is_moe() {
                    why
                } else {
                    format!("{why} ({})", moe_models(ctx))
                };
                return err("resources.expert_parallel", why);
            }
            if r.pipeline_parallel {
                return err(
                    "resources.expert_parallel",
                    "cannot be combined with resources.pipeline_parallel",
                );
            }
            if r.max_gpus < ep {
                return err(
                    "resources.max_gpus",
                    format!(
                        "an expert-parallel job runs on whole groups of {ep} GPUs; must be >= {ep}"
                    ),
                );
            }
        }
        if let Some(m) = &r.gpu_model {
            string("resources.gpu_model", m, l.max_name_bytes, true)?;
        }
        // Elastic workers (Lyra): the GPU range is the workers' range.
        if let Some(w) = r.workers {
            if w.min == 0 {
                return err("resources.workers.min", "must be >= 1");
            }
            if w.max < w.min {
                return err(
                    "resources.workers.max",
                    format!("must be >= resources.workers.min ({})", w.min),
                );
            }
            if w.gpus_per_worker == 0 {
                return err("resources.workers.gpus_per_worker", "must be >= 1");
            }
            if r.pipeline_parallel || r.expert_parallel > 1 {
                return err(
                    "resources.workers",
                    "elastic workers cannot be combined with pipeline or expert parallelism",
                );
            }
            let g = w.gpus_per_worker;
            if r.min_gpus != w.min * g || r.max_gpus != w.max * g {
                return err(
                    "resources.workers",
                    format!(
                        "resources.min_gpus and max_gpus must be the workers' GPUs: {} and {} (got {} and {})",
                        w.min * g,
                        w.max * g,
                        r.min_gpus,
                        r.max_gpus
                    ),
                );
            }
        }
        Ok(())
    }

    /// Deadline, SLO class and reward steps (UniSched).
    fn validate_deadline(&self, ctx: &ValidationContext<'_>) -> Result<(), FieldError> {
        // Deadline and SLO class (UniSched).
        if let Some(d) = self.deadline
            && d <= ctx.now
        {
            return err(
                "deadline",
                format!("{} is not in the future", d.to_rfc3339()),
            );
        }
        if self.slo_class.is_some_and(SloClass::has_deadline) && self.deadline.is_none() {
            return err("slo_class", "SLO jobs (strict or soft) need a deadline");
        }
        if !self.reward_steps.is_empty() {
            if self.class() != SloClass::SoftSlo {
                return err(
                    "reward_steps",
                    "only a soft_slo job has reward steps of its own (a strict SLO earns 100 by \
                     its deadline, a best-effort job none)",
                );
            }
            if self.reward_steps.len() > 8 {
                return err("reward_steps", "at most 8 steps");
            }
            let mut before: Option<crate::slo::SoftStep> = None;
            for (k, s) in self.reward_steps.iter().enumerate() {
                let field = format!("reward_steps[{k}]");
                if !(s.reward > 0.0 && s.reward <= crate::slo::FULL_REWARD) {
                    return err(
                        &format!("{field}.reward"),
                        format!("{} is not in (0, 100]", s.reward),
                    );
                }
                if !(1.0..=10.0).contains(&s.at) {
                    return err(
                        &format!("{field}.at"),
                        format!("{} is not in [1, 10] (multiples of the deadline)", s.at),
                    );
                }
                match before {
                    None if s.at != 1.0 => {
                        return err(
                            &format!("{field}.at"),
                            "the first step is the deadline itself: at 1",
                        );
                    }
                    Some(b) if s.at <= b.at || s.reward > b.reward => {
                        return err(
                            &field,
                            "steps come later and are worth no more than the one before",
                        );
                    }
                    _ => {}
                }
                before = Some(*s);
            }
        }
        Ok(())
    }

    /// Frozen layers and layer elasticity (ICEFROG), against the model's layers.
    fn validate_layers(&self, model: &ModelInfo) -> Result<(), FieldError> {
        // Frozen layers (ICEFROG).
        if let Some(f) = self.frozen_layers {
            if f.first != 0 {
                return err(
                    "frozen_layers.first",
                    format!(
                        "must be 0: layers freeze from the input side (ICEFROG §III), so the \
                         backward pass stops below the first trained layer; a range starting \
                         at layer {} would still run the backward pass through it and save \
                         nothing the scheduler or the trainer can act on",
                        f.first
                    ),
                );
            }
            if f.first > f.last {
                return err(
                    "frozen_layers.first",
                    format!("must be <= last (got {} > {})", f.first, f.last),
                );
            }
            if f.last >= model.layers {
                return err(
                    "frozen_layers.last",
                    format!(
                        "{} has {} layers (0..{}), got {}",
                        model.name,
                        model.layers,
                        model.layers - 1,
                        f.last
                    ),
                );
            }
        }

        // Layer elasticity (ICEFROG): a range the tuner may move in.
        if let Some(e) = self.layer_elasticity {
            let cap = (f64::from(model.layers) * crate::job::MAX_FROZEN_SHARE).floor() as u32;
            if e.max_frozen_layers > cap {
                return err(
                    "layer_elasticity.max_frozen_layers",
                    format!(
                        "at most {cap} of {}'s {} layers may be frozen (90 %, ICEFROG §III), got {}",
                        model.name, model.layers, e.max_frozen_layers
                    ),
                );
            }
            if e.max_frozen_layers < self.frozen_count() {
                return err(
                    "layer_elasticity.max_frozen_layers",
                    format!(
                        "must be >= the {} layers frozen_layers freezes",
                        self.frozen_count()
                    ),
                );
            }
            if self.resources.pipeline_parallel {
                return err(
                    "layer_elasticity",
                    "not with resources.pipeline_parallel: a changed frozen prefix unbalances the \
                     pipeline's stages (planned)",
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::job::*;
    use std::collections::BTreeMap;

    pub fn spec() -> JobSpec {
        JobSpec {
            name: "qqp".into(),
            model: "roberta-base".into(),
            dataset: DatasetSpec {
                uri: "s3://data/glue/qqp".into(),
                task: "qqp".into(),
                objective: "sequence-classification".into(),
                num_samples: Some(90962),
            },
            hyperparameters: HyperParameters {
                global_batch_size: 64,
                learning_rate: 2e-5,
                optimizer: Optimizer::Adamw,
                amp: true,
                gradient_checkpointing: false,
                petl: PetlMethod::None,
                weight_decay: 0.01,
            },
            target: Target {
                max_iterations: None,
                max_epochs: Some(10),
                metric: Some(MetricTarget {
                    name: "f1".into(),
                    value: 0.88,
                    lower_is_better: false,
                }),
            },
            resources: Resources {
                workers: None,
                min_gpus: 1,
                max_gpus: 4,
                pipeline_parallel: false,
                expert_parallel: 0,
                gpu_model: None,
            },
            sharing: true,
            deadline: None,
            slo_class: None,
            reward_steps: Vec::new(),
            frozen_layers: None,
            layer_elasticity: None,
            launch: Launch {
                command: vec!["python".into(), "train.py".into()],
                env: BTreeMap::new(),
                working_dir: None,
                prewarm: false,
            },
            labels: BTreeMap::new(),
            queue: String::new(),
            priority: 0,
            preemptible: true,
            kind: crate::job::JobKind::FineTune,
            prompt_tuning: None,
        }
    }

    #[test]
    fn a_prompt_tuning_job_trains_a_prompt_and_ends_by_its_iterations() {
        use crate::job::{JobKind, PetlMethod, PromptTuning};
        let prompt = || {
            let mut s = spec();
            s.kind = JobKind::PromptTuning;
            s.target.max_iterations = Some(300);
            s
        };
        assert_eq!(check(&prompt()), Ok(()));
        let mut s = prompt();
        s.apply_kind_defaults();
        assert_eq!(s.hyperparameters.petl, PetlMethod::PromptTuning);
        assert_eq!(s.prompt_tuning.as_ref().unwrap().num_virtual_tokens, 20);
        assert!(!s.may_merge(), "a prompt-tuning job is never merged");
        assert!(spec().may_merge());
        let field = |s: JobSpec| field_of(&s);
        let mut s = prompt();
        s.target.max_iterations = None;
        s.target.max_epochs = Some(3);
        assert_eq!(field(s), "spec.target.max_iterations");
        let mut s = prompt();
        s.hyperparameters.petl = PetlMethod::Lora;
        assert_eq!(field(s), "spec.hyperparameters.petl");
        let mut s = prompt();
        s.frozen_layers = Some(FrozenLayers { first: 0, last: 1 });
        assert_eq!(field(s), "spec.frozen_layers");
        let mut s = prompt();
        s.resources.pipeline_parallel = true;
        s.resources.max_gpus = 4;
        assert_eq!(field(s), "spec.resources.pipeline_parallel");
        let mut s = prompt();
        s.prompt_tuning = Some(PromptTuning {
            num_virtual_tokens: 513,
            ..Default::default()
        });
        assert_eq!(field(s), "spec.prompt_tuning.num_virtual_tokens");
        let mut s = prompt();
        s.prompt_tuning = Some(PromptTuning {
            num_virtual_tokens: 8,
            initial_prompt: "x".repeat(4097),
        });
        assert_eq!(field(s), "spec.prompt_tuning.initial_prompt");
        // The prompt settings and the PETL method belong to the kind.
        let mut s = spec();
        s.prompt_tuning = Some(PromptTuning::default());
        assert_eq!(field(s), "spec.prompt_tuning");
        let mut s = spec();
        s.hyperparameters.petl = PetlMethod::PromptTuning;
        assert_eq!(field(s), "spec.hyperparameters.petl");
    }

    #[test]
    fn priority_out_of_range_and_a_bad_queue_name_are_refused() {
        let mut s = spec();
        s.priority = 1001;
        assert_eq!(check(&s).unwrap_err().field, "spec.priority");
        s.priority = -1000;
        assert!(check(&s).is_ok());
        s.queue = "a\nb".into();
        assert_eq!(check(&s).unwrap_err().field, "spec.queue");
    }

    pub(crate) fn check(s: &JobSpec) -> Result<(), FieldError> {
        let models = ModelCatalog::builtin();
        let now = DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z")
            .unwrap()
            .to_utc();
        s.validate(&ValidationContext {
            now,
            models: &models,
            limits: Limits::default(),
        })
    }

    fn field_of(s: &JobSpec) -> String {
        check(s).expect_err("spec should be rejected").field
    }

    #[test]
    fn a_good_spec_passes() {
        check(&spec()).unwrap();
    }

    /// The inputs a hardening pass found accepted: each is refused naming
    /// its field, and the limits themselves still pass.
    #[test]
    fn numbers_past_the_limits_and_unsafe_uris_are_refused() {
        let l = Limits::default();
        type Mutation = Box<dyn Fn(&mut JobSpec)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                "spec.target.max_iterations",
                Box::new(|s| s.target.max_iterations = Some(i64::MAX as u64)),
            ),
            (
                "spec.target.max_epochs",
                Box::new(|s| s.target.max_epochs = Some(u32::MAX)),
            ),
            (
                "spec.hyperparameters.global_batch_size",
                Box::new(|s| s.hyperparameters.global_batch_size = 1 << 31),
            ),
            (
                "spec.dataset.num_samples",
                Box::new(|s| s.dataset.num_samples = Some(u64::MAX)),
            ),
            (
                "spec.dataset.uri",
                Box::new(|s| s.dataset.uri = "../../etc/passwd".into()),
            ),
            (
                "spec.dataset.uri",
                Box::new(|s| s.dataset.uri = "file:///data/../../etc/passwd".into()),
            ),
            (
                "spec.dataset.uri",
                Box::new(|s| s.dataset.uri = "s3://b/%2E%2E/x".into()),
            ),
            (
                "spec.dataset.uri",
                Box::new(|s| s.dataset.uri = "glue/qqp".into()),
            ),
            (
                "spec.dataset.uri",
                Box::new(|s| s.dataset.uri = "://x".into()),
            ),
            (
                "spec.dataset.uri",
                Box::new(|s| s.dataset.uri = "s3://b/x\n".into()),
            ),
            ("spec.name", Box::new(|s| s.name = "two\nlines".into())),
        ];
        for (field, mutate) in &cases {
            let mut s = spec();
            mutate(&mut s);
            let e = check(&s).expect_err(field);
            assert_eq!(&e.field, field, "{e}");
        }
        let mut s = spec();
        s.target.max_iterations = Some(l.max_iterations);
        s.hyperparameters.global_batch_size = l.max_global_batch_size;
        s.dataset.num_samples = Some(l.max_num_samples);
        s.target.max_epochs = Some(l.max_epochs);
        check(&s).unwrap();
        // The largest product the estimates form stays finite and exact
        // enough in f64, and samples × epochs fits u64.
        assert!(
            l.max_num_samples
                .checked_mul(u64::from(l.max_epochs))
                .is_some()
        );
        for uri in [
            "/data/glue/qqp",
            "hf://glue/qqp",
            "s3://b/a..b/c",
            "file:///d",
        ] {
            s.dataset.uri = uri.into();
            check(&s).unwrap_or_else(|e| panic!("{uri}: {e}"));
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut s = spec();
        s.model = "".into();
        assert_eq!(field_of(&s), "spec.model");
        s.model = "gpt-17".into();
        let e = check(&s).unwrap_err();
        assert_eq!(e.field, "spec.model");
        assert!(
            e.message.contains("roberta-base"),
            "lists known models: {e}"
        );

        let mut s = spec();
        s.resources.min_gpus = 5;
        assert_eq!(field_of(&s), "spec.resources.min_gpus");

        let mut s = spec();
        s.hyperparameters.global_batch_size = 0;
        assert_eq!(field_of(&s), "spec.hyperparameters.global_batch_size");

        let mut s = spec();
        s.hyperparameters.learning_rate = f64::NAN;
        assert_eq!(field_of(&s), "spec.hyperparameters.learning_rate");
        s.hyperparameters.learning_rate = f64::INFINITY;
        assert_eq!(field_of(&s), "spec.hyperparameters.learning_rate");
        s.hyperparameters.learning_rate = -1.0;
        assert_eq!(field_of(&s), "spec.hyperparameters.learning_rate");

        let mut s = spec();
        s.target.metric.as_mut().unwrap().value = f64::NEG_INFINITY;
        assert_eq!(field_of(&s), "spec.target.metric.value");

        let mut s = spec();
        s.target.max_epochs = None;
        assert_eq!(field_of(&s), "spec.target");
        s.target.max_iterations = Some(0);
        assert_eq!(field_of(&s), "spec.target.max_iterations");

        let mut s = spec();
        s.dataset.uri = "x".repeat(64 * 1024 + 1);
        assert_eq!(field_of(&s), "spec.dataset.uri");

        let mut s = spec();
        for i in 0..257 {
            s.launch.env.insert(format!("V{i}"), "1".into());
        }
        assert_eq!(field_of(&s), "spec.launch.env");

        let mut s = spec();
        s.launch.env.insert("1BAD".into(), "1".into());
        assert!(field_of(&s).starts_with("spec.launch.env["));

        let mut s = spec();
        s.deadline = Some(
            DateTime::parse_from_rfc3339("2026-05-01T00:00:00Z")
                .unwrap()
                .to_utc(),
        );
        assert_eq!(field_of(&s), "spec.deadline");

        let mut s = spec();
        s.slo_class = Some(SloClass::Slo);
        assert_eq!(field_of(&s), "spec.slo_class");

        let mut s = spec();
        s.frozen_layers = Some(FrozenLayers { first: 0, last: 12 });
        assert_eq!(field_of(&s), "spec.frozen_layers.last");
        s.frozen_layers = Some(FrozenLayers { first: 3, last: 2 });
        assert_eq!(field_of(&s), "spec.frozen_layers.first");
        // A range that does not start at the input saves no backward pass:
        // nothing could act on it.
        s.frozen_layers = Some(FrozenLayers { first: 2, last: 5 });
        let e = check(&s).unwrap_err();
        assert_eq!(e.field, "spec.frozen_layers.first");
        assert!(e.message.contains("must be 0"), "{e}");
        s.frozen_layers = Some(FrozenLayers { first: 0, last: 5 });
        check(&s).unwrap();
        assert_eq!(s.frozen_count(), 6);
        // Layer elasticity: up to 90 % of the layers, from the frozen ones.
        s.layer_elasticity = Some(LayerElasticity {
            max_frozen_layers: 10,
        });
        check(&s).unwrap();
        s.layer_elasticity = Some(LayerElasticity {
            max_frozen_layers: 11,
        });
        assert_eq!(field_of(&s), "spec.layer_elasticity.max_frozen_layers");
        s.layer_elasticity = Some(LayerElasticity {
            max_frozen_layers: 4,
        });
        assert_eq!(field_of(&s), "spec.layer_elasticity.max_frozen_layers");

        let mut s = spec();
        s.launch.command.clear();
        assert_eq!(field_of(&s), "spec.launch.command");

        let mut s = spec();
        s.resources.pipeline_parallel = true;
        s.resources.max_gpus = 2;
        assert_eq!(field_of(&s), "spec.resources.max_gpus");
        s.resources.max_gpus = 4;
        check(&s).unwrap();

        // Expert parallelism: MoE models only, dividing their experts, not
        // with a pipeline, on at least one whole group.
        let mut s = spec();
        s.resources.expert_parallel = 4;
        assert_eq!(field_of(&s), "spec.resources.expert_parallel");
        s.model = "switch-base-8".into();
        check(&s).unwrap();
        s.resources.expert_parallel = 3;
        assert_eq!(field_of(&s), "spec.resources.expert_parallel");
        s.resources.expert_parallel = 8;
        assert_eq!(field_of(&s), "spec.resources.max_gpus");
        s.resources.expert_parallel = 2;
        s.resources.pipeline_parallel = true;
        assert_eq!(field_of(&s), "spec.resources.expert_parallel");
        s.resources.pipeline_parallel = false;
        s.resources.expert_parallel = 1;
        check(&s).unwrap();
    }

    #[test]
    fn future_deadline_and_slo_pass() {
        let mut s = spec();
        s.deadline = Some(
            DateTime::parse_from_rfc3339("2026-07-01T00:00:00Z")
                .unwrap()
                .to_utc(),
        );
        s.slo_class = Some(SloClass::Slo);
        check(&s).unwrap();
    }

    /// A soft SLO job's own reward steps act (they are its steps) or are
    /// refused naming the step and what is wrong.
    #[test]
    fn own_reward_steps_are_a_soft_slos_and_well_formed() {
        use crate::slo::SoftStep;
        let step = |at, reward| SoftStep { at, reward };
        let mut s = spec();
        s.deadline = Some(
            DateTime::parse_from_rfc3339("2026-07-01T00:00:00Z")
                .unwrap()
                .to_utc(),
        );
        s.reward_steps = vec![step(1.0, 100.0), step(2.0, 40.0)];
        s.slo_class = Some(SloClass::Slo);
        assert_eq!(field_of(&s), "spec.reward_steps", "a strict SLO has none");
        s.slo_class = Some(SloClass::SoftSlo);
        check(&s).unwrap();
        let steps = s.reward_steps(0.0, Some(100.0));
        assert_eq!(
            steps.iter().map(|r| (r.by, r.reward)).collect::<Vec<_>>(),
            [(100.0, 100.0), (200.0, 40.0)]
        );
        s.reward_steps = vec![step(1.5, 100.0)];
        assert_eq!(field_of(&s), "spec.reward_steps[0].at");
        s.reward_steps = vec![step(1.0, 100.0), step(1.0, 50.0)];
        assert_eq!(field_of(&s), "spec.reward_steps[1]");
        s.reward_steps = vec![step(1.0, 50.0), step(1.2, 80.0)];
        assert_eq!(field_of(&s), "spec.reward_steps[1]", "worth no more");
        s.reward_steps = vec![step(1.0, 120.0)];
        assert_eq!(field_of(&s), "spec.reward_steps[0].reward");
        s.reward_steps = vec![step(1.0, 100.0), step(11.0, 10.0)];
        assert_eq!(field_of(&s), "spec.reward_steps[1].at");
        s.reward_steps = Vec::new();
        assert_eq!(s.reward_steps(0.0, Some(100.0)).len(), 4, "UniSched's four");
    }

    #[test]
    fn yaml_rejects_unknown_keys_and_defaults_sharing_to_true() {
        let yaml = r#"
model: roberta-base
dataset: { uri: s3://d/qqp, task: qqp }
hyperparameters: { global_batch_size: 32, learning_rate: 0.00002 }
target: { max_epochs: 3 }
resources: { min_gpus: 1, max_gpus: 2 }
launch: { command: [python, train.py] }
"#;
        let s: JobSpec = serde_yaml_ng::from_str(yaml).unwrap();
        assert!(s.sharing);
        check(&s).unwrap();
        let typo = yaml.replace("max_epochs", "max_epoch");
        let e = serde_yaml_ng::from_str::<JobSpec>(&typo)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_epoch"), "{e}");
    }

    /// An elastic job's workers must describe its GPU range; each broken
    /// rule names its field.
    #[test]
    fn lyra_workers_must_match_the_gpu_range() {
        use crate::job::Workers;
        let w = |min, max, g| {
            Some(Workers {
                min,
                max,
                gpus_per_worker: g,
            })
        };
        let mut s = spec();
        s.resources.min_gpus = 2;
        s.resources.max_gpus = 4;
        s.resources.workers = w(2, 4, 1);
        assert_eq!(s.resources.base_gpus(), 2);
        check(&s).unwrap();
        s.resources.workers = w(1, 4, 1);
        assert_eq!(field_of(&s), "spec.resources.workers");
        s.resources.workers = w(0, 4, 1);
        assert_eq!(field_of(&s), "spec.resources.workers.min");
        s.resources.workers = w(3, 2, 1);
        assert_eq!(field_of(&s), "spec.resources.workers.max");
        s.resources.workers = w(1, 2, 0);
        assert_eq!(field_of(&s), "spec.resources.workers.gpus_per_worker");
        // One to two workers of two GPUs: 2 GPUs at the base, 4 at most.
        s.resources.workers = w(1, 2, 2);
        s.resources.max_gpus = 2;
        assert_eq!(field_of(&s), "spec.resources.workers");
        s.resources.max_gpus = 4;
        check(&s).unwrap();
        assert_eq!(s.resources.base_gpus(), 2);
        assert_eq!(s.resources.replica().gpus(), 2);
        s.resources.workers = None;
        assert_eq!(s.resources.base_gpus(), 4, "inelastic: what it asks for");
    }
}
