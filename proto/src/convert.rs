//! Protobuf ⇄ domain conversions. Proto → domain is fallible and names the
//! field at fault (unknown enum numbers, missing sub-messages, bad
//! timestamps); semantic checks then run in `JobSpec::validate`.

use chrono::{DateTime, Utc};
use fmsched_core as core;
use fmsched_core::FieldError;

use crate::v1 as pb;

fn missing(field: &str) -> FieldError {
    FieldError::new(field, "is required")
}

fn bad_enum(field: &str, v: i32) -> FieldError {
    FieldError::new(field, format!("unknown enum value {v}"))
}

/// Converts a protobuf timestamp, rejecting out-of-range values.
pub fn timestamp_from_proto(
    field: &str,
    t: &prost_types::Timestamp,
) -> Result<DateTime<Utc>, FieldError> {
    if !(0..1_000_000_000).contains(&t.nanos) {
        return Err(FieldError::new(
            field,
            format!("nanos {} out of range", t.nanos),
        ));
    }
    DateTime::from_timestamp(t.seconds, t.nanos as u32)
        .ok_or_else(|| FieldError::new(field, format!("seconds {} out of range", t.seconds)))
}

pub fn timestamp_to_proto(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

pub fn duration_to_proto(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

pub fn duration_from_proto(d: &prost_types::Duration) -> Option<std::time::Duration> {
    if d.seconds < 0 || d.nanos < 0 {
        return None;
    }
    Some(std::time::Duration::new(d.seconds as u64, d.nanos as u32))
}

pub fn job_state_to_proto(s: core::JobState) -> pb::JobState {
    match s {
        core::JobState::Submitted => pb::JobState::Submitted,
        core::JobState::Profiling => pb::JobState::Profiling,
        core::JobState::Queued => pb::JobState::Queued,
        core::JobState::Running => pb::JobState::Running,
        core::JobState::Completed => pb::JobState::Completed,
        core::JobState::Failed => pb::JobState::Failed,
        core::JobState::Cancelled => pb::JobState::Cancelled,
    }
}

/// `None` for UNSPECIFIED; an error for numbers this version does not know.
pub fn job_state_from_proto(field: &str, v: i32) -> Result<Option<core::JobState>, FieldError> {
    Ok(Some(
        match pb::JobState::try_from(v).map_err(|_| bad_enum(field, v))? {
            pb::JobState::Unspecified => return Ok(None),
            pb::JobState::Submitted => core::JobState::Submitted,
            pb::JobState::Profiling => core::JobState::Profiling,
            pb::JobState::Queued => core::JobState::Queued,
            pb::JobState::Running => core::JobState::Running,
            pb::JobState::Completed => core::JobState::Completed,
            pb::JobState::Failed => core::JobState::Failed,
            pb::JobState::Cancelled => core::JobState::Cancelled,
        },
    ))
}

pub fn node_state_to_proto(s: core::NodeState) -> pb::NodeState {
    match s {
        core::NodeState::Available => pb::NodeState::Available,
        core::NodeState::Suspect => pb::NodeState::Suspect,
        core::NodeState::Offline => pb::NodeState::Offline,
    }
}

pub fn node_state_from_proto(field: &str, v: i32) -> Result<Option<core::NodeState>, FieldError> {
    Ok(Some(
        match pb::NodeState::try_from(v).map_err(|_| bad_enum(field, v))? {
            pb::NodeState::Unspecified => return Ok(None),
            pb::NodeState::Available => core::NodeState::Available,
            pb::NodeState::Suspect => core::NodeState::Suspect,
            pb::NodeState::Offline => core::NodeState::Offline,
        },
    ))
}

fn optimizer_from_proto(v: i32) -> Result<core::Optimizer, FieldError> {
    let f = "spec.hyperparameters.optimizer";
    Ok(
        match pb::Optimizer::try_from(v).map_err(|_| bad_enum(f, v))? {
            pb::Optimizer::Unspecified | pb::Optimizer::Adamw => core::Optimizer::Adamw,
            pb::Optimizer::Adam => core::Optimizer::Adam,
            pb::Optimizer::Sgd => core::Optimizer::Sgd,
            pb::Optimizer::Adafactor => core::Optimizer::Adafactor,
            pb::Optimizer::Lamb => core::Optimizer::Lamb,
        },
    )
}

fn optimizer_to_proto(o: core::Optimizer) -> pb::Optimizer {
    match o {
        core::Optimizer::Adamw => pb::Optimizer::Adamw,
        core::Optimizer::Adam => pb::Optimizer::Adam,
        core::Optimizer::Sgd => pb::Optimizer::Sgd,
        core::Optimizer::Adafactor => pb::Optimizer::Adafactor,
        core::Optimizer::Lamb => pb::Optimizer::Lamb,
    }
}

fn petl_from_proto(v: i32) -> Result<core::PetlMethod, FieldError> {
    let f = "spec.hyperparameters.petl";
    Ok(
        match pb::PetlMethod::try_from(v).map_err(|_| bad_enum(f, v))? {
            pb::PetlMethod::Unspecified | pb::PetlMethod::None => core::PetlMethod::None,
            pb::PetlMethod::Lora => core::PetlMethod::Lora,
            pb::PetlMethod::Adapter => core::PetlMethod::Adapter,
            pb::PetlMethod::PrefixTuning => core::PetlMethod::PrefixTuning,
            pb::PetlMethod::PromptTuning => core::PetlMethod::PromptTuning,
        },
    )
}

fn petl_to_proto(p: core::PetlMethod) -> pb::PetlMethod {
    match p {
        core::PetlMethod::None => pb::PetlMethod::None,
        core::PetlMethod::Lora => pb::PetlMethod::Lora,
        core::PetlMethod::Adapter => pb::PetlMethod::Adapter,
        core::PetlMethod::PrefixTuning => pb::PetlMethod::PrefixTuning,
        core::PetlMethod::PromptTuning => pb::PetlMethod::PromptTuning,
    }
}

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

/// Protobuf spec → domain spec. Structural problems only; call
/// `JobSpec::validate` afterwards for the semantic checks.
/// A queue as the admin API carries it.
pub fn queue_to_proto(q: &core::queue::QueueSpec) -> pb::Queue {
    pb::Queue {
        name: q.name.clone(),
        parent: q.parent.clone().unwrap_or_default(),
        guaranteed_gpus: q.guaranteed_gpus,
        over_quota_weight: Some(q.over_quota_weight),
        limit_gpus: q.limit_gpus,
        models: q.models.clone(),
        users: q.users.clone(),
        merge_across_queues: Some(q.merge_across_queues),
    }
}

/// A queue from the admin API (absent optional fields take their
/// defaults; the set is validated by `Queues::new`).
pub fn queue_from_proto(q: pb::Queue) -> core::queue::QueueSpec {
    core::queue::QueueSpec {
        name: q.name.trim().to_string(),
        parent: Some(q.parent.trim().to_string()).filter(|p| !p.is_empty()),
        guaranteed_gpus: q.guaranteed_gpus,
        over_quota_weight: q.over_quota_weight.unwrap_or(1.0),
        limit_gpus: q.limit_gpus,
        models: q.models,
        users: q.users,
        merge_across_queues: q.merge_across_queues.unwrap_or(true),
    }
}

pub fn job_spec_from_proto(p: pb::JobSpec) -> Result<core::JobSpec, FieldError> {
    let dataset = p.dataset.ok_or_else(|| missing("spec.dataset"))?;
    let hp = p
        .hyperparameters
        .ok_or_else(|| missing("spec.hyperparameters"))?;
    let target = p.target.ok_or_else(|| missing("spec.target"))?;
    let res = p.resources.ok_or_else(|| missing("spec.resources"))?;
    let launch = p.launch.ok_or_else(|| missing("spec.launch"))?;
    let deadline = p
        .deadline
        .as_ref()
        .map(|t| timestamp_from_proto("spec.deadline", t))
        .transpose()?;
    let slo_class = match pb::SloClass::try_from(p.slo_class)
        .map_err(|_| bad_enum("spec.slo_class", p.slo_class))?
    {
        pb::SloClass::Unspecified => None,
        pb::SloClass::BestEffort => Some(core::SloClass::BestEffort),
        pb::SloClass::Slo => Some(core::SloClass::Slo),
        pb::SloClass::SoftSlo => Some(core::SloClass::SoftSlo),
    };
    Ok(core::JobSpec {
        name: p.name,
        model: p.model,
        dataset: core::DatasetSpec {
            uri: dataset.uri,
            task: dataset.task,
            objective: dataset.objective,
            num_samples: (dataset.num_samples > 0).then_some(dataset.num_samples),
        },
        hyperparameters: core::HyperParameters {
            global_batch_size: hp.global_batch_size,
            learning_rate: hp.learning_rate,
            optimizer: optimizer_from_proto(hp.optimizer)?,
            amp: hp.amp,
            gradient_checkpointing: hp.gradient_checkpointing,
            petl: petl_from_proto(hp.petl)?,
            weight_decay: hp.weight_decay,
        },
        target: core::Target {
            max_iterations: (target.max_iterations > 0).then_some(target.max_iterations),
            max_epochs: (target.max_epochs > 0).then_some(target.max_epochs),
            metric: target.metric.map(|m| core::MetricTarget {
                name: m.name,
                value: m.value,
                lower_is_better: m.lower_is_better,
            }),
        },
        resources: core::Resources {
            min_gpus: res.min_gpus,
            max_gpus: res.max_gpus,
            pipeline_parallel: res.pipeline_parallel,
            expert_parallel: res.expert_parallel,
            gpu_model: non_empty(res.gpu_model),
            workers: res.workers.map(|w| core::Workers {
                min: w.min,
                max: w.max,
                gpus_per_worker: w.gpus_per_worker.max(1),
            }),
        },
        sharing: p.sharing.unwrap_or(true),
        deadline,
        slo_class,
        reward_steps: p
            .reward_steps
            .iter()
            .map(|s| core::slo::SoftStep {
                at: s.at,
                reward: s.reward,
            })
            .collect(),
        layer_elasticity: p.layer_elasticity.map(|e| core::LayerElasticity {
            max_frozen_layers: e.max_frozen_layers,
        }),
        frozen_layers: p.frozen_layers.map(|f| core::FrozenLayers {
            first: f.first,
            last: f.last,
        }),
        launch: core::Launch {
            command: launch.command,
            env: launch.env.into_iter().collect(),
            working_dir: non_empty(launch.working_dir),
            prewarm: launch.prewarm,
        },
        labels: p.labels.into_iter().collect(),
        queue: p.queue,
        priority: p.priority,
        preemptible: p.preemptible.unwrap_or(true),
        kind: match pb::JobKind::try_from(p.kind).map_err(|_| bad_enum("spec.kind", p.kind))? {
            pb::JobKind::Unspecified | pb::JobKind::FineTune => core::JobKind::FineTune,
            pb::JobKind::PromptTuning => core::JobKind::PromptTuning,
        },
        prompt_tuning: p.prompt_tuning.map(|t| core::PromptTuning {
            num_virtual_tokens: t.num_virtual_tokens,
            initial_prompt: t.initial_prompt,
        }),
    })
}

pub fn job_spec_to_proto(s: &core::JobSpec) -> pb::JobSpec {
    pb::JobSpec {
        name: s.name.clone(),
        model: s.model.clone(),
        dataset: Some(pb::DatasetSpec {
            uri: s.dataset.uri.clone(),
            task: s.dataset.task.clone(),
            objective: s.dataset.objective.clone(),
            num_samples: s.dataset.num_samples.unwrap_or(0),
        }),
        hyperparameters: Some(pb::HyperParameters {
            global_batch_size: s.hyperparameters.global_batch_size,
            learning_rate: s.hyperparameters.learning_rate,
            optimizer: optimizer_to_proto(s.hyperparameters.optimizer) as i32,
            amp: s.hyperparameters.amp,
            gradient_checkpointing: s.hyperparameters.gradient_checkpointing,
            petl: petl_to_proto(s.hyperparameters.petl) as i32,
            weight_decay: s.hyperparameters.weight_decay,
        }),
        target: Some(pb::Target {
            max_iterations: s.target.max_iterations.unwrap_or(0),
            max_epochs: s.target.max_epochs.unwrap_or(0),
            metric: s.target.metric.as_ref().map(|m| pb::MetricTarget {
                name: m.name.clone(),
                value: m.value,
                lower_is_better: m.lower_is_better,
            }),
        }),
        resources: Some(pb::Resources {
            min_gpus: s.resources.min_gpus,
            max_gpus: s.resources.max_gpus,
            pipeline_parallel: s.resources.pipeline_parallel,
            expert_parallel: s.resources.expert_parallel,
            gpu_model: s.resources.gpu_model.clone().unwrap_or_default(),
            workers: s.resources.workers.map(|w| pb::Workers {
                min: w.min,
                max: w.max,
                gpus_per_worker: w.gpus_per_worker,
            }),
        }),
        sharing: Some(s.sharing),
        queue: s.queue.clone(),
        priority: s.priority,
        preemptible: Some(s.preemptible),
        kind: match s.kind {
            core::JobKind::FineTune => pb::JobKind::FineTune,
            core::JobKind::PromptTuning => pb::JobKind::PromptTuning,
        } as i32,
        prompt_tuning: s.prompt_tuning.as_ref().map(|t| pb::PromptTuningSpec {
            num_virtual_tokens: t.num_virtual_tokens,
            initial_prompt: t.initial_prompt.clone(),
        }),
        deadline: s.deadline.map(timestamp_to_proto),
        slo_class: match s.slo_class {
            None => pb::SloClass::Unspecified,
            Some(core::SloClass::BestEffort) => pb::SloClass::BestEffort,
            Some(core::SloClass::Slo) => pb::SloClass::Slo,
            Some(core::SloClass::SoftSlo) => pb::SloClass::SoftSlo,
        } as i32,
        reward_steps: s
            .reward_steps
            .iter()
            .map(|r| pb::SoftRewardStep {
                at: r.at,
                reward: r.reward,
            })
            .collect(),
        layer_elasticity: s.layer_elasticity.map(|e| pb::LayerElasticity {
            max_frozen_layers: e.max_frozen_layers,
        }),
        frozen_layers: s.frozen_layers.map(|f| pb::FrozenLayers {
            first: f.first,
            last: f.last,
        }),
        launch: Some(pb::Launch {
            command: s.launch.command.clone(),
            env: s.launch.env.clone().into_iter().collect(),
            working_dir: s.launch.working_dir.clone().unwrap_or_default(),
            prewarm: s.launch.prewarm,
        }),
        labels: s.labels.clone().into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> core::JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": "demo", "model": "roberta-base",
            "dataset": {"uri": "s3://d/qqp", "task": "qqp", "objective": "cls", "num_samples": 100},
            "hyperparameters": {"global_batch_size": 32, "learning_rate": 0.00002, "optimizer": "sgd", "petl": "lora", "amp": true},
            "target": {"max_epochs": 3, "metric": {"name": "f1", "value": 0.9}},
            "resources": {"min_gpus": 1, "max_gpus": 2, "gpu_model": "A100-80GB"},
            "sharing": false, "deadline": "2030-01-01T00:00:00Z", "slo_class": "slo",
            "frozen_layers": {"first": 0, "last": 3},
            "launch": {"command": ["python", "train.py"], "env": {"A": "1"}, "working_dir": "/tmp"},
            "labels": {"team": "nlp"}
        }))
        .unwrap()
    }

    #[test]
    fn spec_round_trips_through_proto() {
        let s = sample();
        assert_eq!(job_spec_from_proto(job_spec_to_proto(&s)).unwrap(), s);
        let mut prompt = sample();
        prompt.kind = core::JobKind::PromptTuning;
        prompt.prompt_tuning = Some(core::PromptTuning {
            num_virtual_tokens: 8,
            initial_prompt: "Summarize:".into(),
        });
        assert_eq!(
            job_spec_from_proto(job_spec_to_proto(&prompt)).unwrap(),
            prompt
        );
        let mut p = job_spec_to_proto(&prompt);
        p.kind = 7;
        assert_eq!(job_spec_from_proto(p).unwrap_err().field, "spec.kind");
    }

    #[test]
    fn unknown_enum_numbers_name_the_field() {
        let mut p = job_spec_to_proto(&sample());
        p.hyperparameters.as_mut().unwrap().optimizer = 99;
        let e = job_spec_from_proto(p).unwrap_err();
        assert_eq!(e.field, "spec.hyperparameters.optimizer");
        let mut p = job_spec_to_proto(&sample());
        p.slo_class = 42;
        assert_eq!(job_spec_from_proto(p).unwrap_err().field, "spec.slo_class");
    }

    #[test]
    fn missing_messages_name_the_field() {
        let mut p = job_spec_to_proto(&sample());
        p.resources = None;
        assert_eq!(job_spec_from_proto(p).unwrap_err().field, "spec.resources");
    }

    #[test]
    fn unset_sharing_means_true_and_deadline_implies_slo() {
        let mut p = job_spec_to_proto(&sample());
        p.sharing = None;
        p.slo_class = 0;
        let s = job_spec_from_proto(p).unwrap();
        assert!(s.sharing);
        assert_eq!(s.class(), core::SloClass::Slo);
        // The YAML path, a spec without a class, follows the same rule.
        let yaml: core::JobSpec = serde_json::from_value(serde_json::json!({
            "model": "roberta-base",
            "dataset": { "uri": "file:///d", "task": "rte" },
            "hyperparameters": { "global_batch_size": 8, "learning_rate": 1e-4 },
            "target": { "max_iterations": 10 },
            "resources": { "min_gpus": 1, "max_gpus": 1 },
            "deadline": "2030-01-01T00:00:00Z",
            "launch": { "command": ["train"] }
        }))
        .unwrap();
        assert_eq!(yaml.class(), core::SloClass::Slo);
        assert_eq!(
            job_spec_from_proto(job_spec_to_proto(&yaml)).unwrap(),
            yaml,
            "an unnamed class round-trips unnamed"
        );
    }

    #[test]
    fn bad_timestamp_is_rejected() {
        let mut p = job_spec_to_proto(&sample());
        p.deadline = Some(prost_types::Timestamp {
            seconds: 1,
            nanos: -1,
        });
        assert_eq!(job_spec_from_proto(p).unwrap_err().field, "spec.deadline");
    }
}
