//! What the agents measure, learned: GPU utilisation fits (ICEFROG Eq. 8's
//! inputs), shared GPUs that run saturated, step times taught to the
//! throughput table, and the layer tuner's frozen layers.

use std::collections::{BTreeMap, BTreeSet};

use fmsched_core::JobId;
use fmsched_estimator::lut::{Lut, Variant};
use fmsched_estimator::{analytic, footprint};
use fmsched_proto::v1 as pb;

use crate::persistence::JobRecord;
use crate::registry::LiveNode;
use crate::round::observe::{Observed, members_of};
use crate::service::Service;

/// A shared GPU reporting at least this utilisation is saturated: its two
/// processes want more than the GPU has (ICEFROG Eq. 8's second rule,
/// mispredicted), so each runs slower than the λ = 0.9 planned.
const SATURATED_PCT: u32 = 98;

/// Rounds in a row a shared GPU may run saturated before its pair is split.
const SATURATED_ROUNDS: u32 = 3;

/// ICEFROG Eq. 8 measured: a GPU two training processes share that reports
/// [`SATURATED_PCT`] or more for [`SATURATED_ROUNDS`] rounds in a row is
/// split — the later-submitted of its jobs never shares a GPU again
/// (written in the round's commit, with an event on the job), so the
/// policy moves it off or suspends it.
/// ICEFROG's utilisation regression fed by measurement
/// ([`footprint::UtilizationFit`]): each one-GPU training process of one job
/// that runs alone on its GPU (no other job planned there, stepping) adds
/// its measured utilisation — its own NVML reading, else its GPU's — to
/// its model's fit on that GPU type, at its step work (its batch and its
/// variant with the frozen layers it trains with). The fits it changed are
/// written with the round; the next round's footprints predict from them.
pub(crate) fn learn_utilization(o: &mut Observed, nodes: &[LiveNode]) {
    let planned = jobs_by_gpu(&o.current.assignments);
    let mut changed: BTreeSet<(String, String)> = BTreeSet::new();
    for n in nodes {
        for t in &n.observed_tasks {
            let ([uuid], Some(members)) = (&t.gpu_uuids[..], members_of(&t.task_id)) else {
                continue;
            };
            let ([id], true) = (&members[..], t.phase == pb::TaskPhase::Running as i32) else {
                continue;
            };
            let (Some(job), Some(tel), Some(gpu)) = (
                o.live.get(id),
                n.telemetry.get(uuid),
                n.record.gpus.iter().find(|g| g.uuid.0 == *uuid),
            ) else {
                continue;
            };
            if t.step_time_s <= 0.0
                || t.world_size > 1
                || planned.get(uuid.as_str()).map(Vec::len) != Some(1)
            {
                continue;
            }
            let util = tel
                .processes
                .iter()
                .find(|p| p.pid == t.pid && p.utilization_percent > 0)
                .map_or(tel.utilization_percent, |p| p.utilization_percent);
            let frozen = t
                .jobs
                .iter()
                .find(|r| r.job_id == id.to_string() && !r.layer_variance.is_empty())
                .map_or(job.spec.frozen_count(), |r| r.frozen_layers);
            let variant = Variant {
                frozen_layers: frozen,
                ..Variant::of_spec(&job.spec)
            };
            let work = footprint::step_work(
                &job.spec.model,
                &variant,
                job.spec.hyperparameters.global_batch_size.max(1),
            );
            let key = (job.spec.model.clone(), analytic::gpu_family(&gpu.model));
            if o.utilization_fits
                .entry(key.clone())
                .or_default()
                .add(work, f64::from(util))
            {
                changed.insert(key);
            }
        }
    }
    o.writes.utilization_fits = changed
        .into_iter()
        .filter_map(|k| o.utilization_fits.get(&k).map(|f| (k.clone(), *f)))
        .collect();
}

/// The jobs the plan in force trains on each GPU (by UUID; profiling runs
/// left out): two on a shared GPU.
fn jobs_by_gpu(assignments: &[crate::persistence::Assignment]) -> BTreeMap<&str, Vec<JobId>> {
    let mut on: BTreeMap<&str, Vec<JobId>> = BTreeMap::new();
    for a in assignments.iter().filter(|a| !a.profile) {
        for g in &a.gpus {
            on.entry(g.0.as_str()).or_default().push(a.job);
        }
    }
    on
}

pub(crate) fn watch_shared_gpus(state: &Service, o: &mut Observed, nodes: &[LiveNode]) {
    let on = jobs_by_gpu(&o.current.assignments);
    let util = |uuid: &str| {
        nodes
            .iter()
            .find_map(|n| n.telemetry.get(uuid))
            .map(|t| t.utilization_percent)
    };
    let mut streaks = state
        .leader
        .saturated_gpus
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    streaks.retain(|uuid, _| on.get(uuid.as_str()).is_some_and(|j| j.len() > 1));
    for (uuid, jobs) in on.iter().filter(|(_, j)| j.len() > 1) {
        let Some(u) = util(uuid) else { continue };
        let streak = streaks.entry((*uuid).to_string()).or_default();
        *streak = if u >= SATURATED_PCT { *streak + 1 } else { 0 };
        if *streak < SATURATED_ROUNDS {
            continue;
        }
        *streak = 0;
        let later = jobs
            .iter()
            .filter_map(|j| o.live.get(j))
            .max_by_key(|r| (r.created_at, r.id))
            .map(|r| r.id);
        if let Some(j) = later.filter(|j| o.no_sharing.insert(*j)) {
            let why = format!(
                "GPU {uuid} ran at {u} % or more for {SATURATED_ROUNDS} rounds while shared: \
                 it no longer shares a GPU (ICEFROG Eq. 8)"
            );
            tracing::warn!(job_id = %j, gpu = %uuid, utilization = u, "splitting a saturated shared GPU");
            o.writes.no_sharing.push(j);
            o.writes.notes.push((j, "gpu_sharing_split".into(), why));
        }
    }
}

/// A profiling run's measured step time as a sample for the estimator's
/// table: one replica (1 GPU; a pipeline's 4 stages at the job's global
/// batch; an expert-parallel group's GPUs sharing it) in the job's own
/// variant (precision, checkpointing, PETL, frozen layers, expert group).
pub(crate) fn profile_step_time_sample(
    job: &JobRecord,
    gpu_model: &str,
    step_time_s: f64,
) -> pb::StepTimeSample {
    let r = &job.spec.resources;
    let gpus = r.replica().gpus().max(1);
    let global = job.spec.hyperparameters.global_batch_size;
    pb::StepTimeSample {
        key: Some(pb::ThroughputKey {
            model: job.spec.model.clone(),
            gpu_type: analytic::gpu_family(gpu_model),
            placement: gpus.to_string(),
            local_batch_size: if r.pipeline_parallel {
                global
            } else {
                global.div_ceil(gpus)
            },
            gradient_accumulation: 1,
            ..variant_key(&Variant::of_spec(&job.spec))
        }),
        step_time_seconds: step_time_s,
        sync_time_seconds: 0.0,
    }
}

/// ICEFROG's layer tuner (Eq. 2, 15) for a layer-elastic job running alone
/// in its process, from the per-layer gradient variance its trainer
/// reported: `ℓ* = argmax ψ(ℓ)·T(a, s, m, ℓ)` over its frozen layers'
/// range (`frozen_layers` .. `layer_elasticity.max_frozen_layers`), `T` on
/// this node's part of its allocation in the throughput table. Run every
/// round, so at every reallocation and every epoch's new variance.
pub(crate) fn tune_layers(
    lut: &Lut,
    job: &JobRecord,
    r: &pb::JobReport,
    family: &str,
    t: &pb::ObservedTask,
) -> Option<u32> {
    let e = job.spec.layer_elasticity?;
    if r.layer_variance.is_empty() {
        return None;
    }
    let model = &job.spec.model;
    let batch = job.spec.hyperparameters.global_batch_size.max(1);
    let layers = analytic::layers_of(model).unwrap_or(r.layer_variance.len() as u32);
    let placement = (t.gpu_uuids.len().clamp(1, 9)).to_string();
    let base = Variant::of_spec(&job.spec);
    let from = job.spec.frozen_count().min(e.max_frozen_layers);
    fmsched_estimator::icefrog::tune_frozen_layers(
        &r.layer_variance,
        from..=e.max_frozen_layers,
        |l| {
            let v = Variant {
                frozen_layers: l,
                ..base.clone()
            };
            lut.iteration_time_on(model, family, &placement, batch, &v, layers)
                .ok()
                .filter(|it| it.feasible)
                // Eq. 4 without sharing (λ = 1, the Eq. 8 fix).
                .map(|it| {
                    fmsched_estimator::icefrog::layer_aware_throughput(
                        f64::from(batch),
                        it.seconds,
                        1.0,
                    )
                })
        },
    )
    .map(|(l, _)| l)
}

/// A throughput key naming only a variant (the rest left default).
fn variant_key(v: &Variant) -> pb::ThroughputKey {
    pb::ThroughputKey {
        amp: v.amp,
        frozen_layers: v.frozen_layers,
        gradient_checkpointing: v.gradient_checkpointing,
        petl: v.petl.clone(),
        pipeline_parallel: v.pipeline,
        expert_parallel: v.expert_parallel,
        ..Default::default()
    }
}

/// A running data-parallel job's measured step time as a sample for the
/// estimator's table: the job's model and global batch on `gpus` GPUs of
/// one node of `gpu_model` in the job's variant, under the local
/// batch and gradient accumulation the table itself picks for that batch
/// (so the sample lands on the key the table is asked for).
pub(crate) fn running_step_time_sample(
    lut: &Lut,
    job: &JobRecord,
    gpu_model: &str,
    placement: &str,
    frozen_layers: u32,
    step_time_s: f64,
) -> pb::StepTimeSample {
    let gpu_type = analytic::gpu_family(gpu_model);
    let gpus: u32 = placement
        .bytes()
        .map(|b| u32::from(b - b'0'))
        .sum::<u32>()
        .max(1);
    let placement = placement.to_string();
    let global = job.spec.hyperparameters.global_batch_size.max(1);
    let variant = Variant {
        frozen_layers,
        ..Variant::of_spec(&job.spec)
    };
    let layers = analytic::layers_of(&job.spec.model).unwrap_or(12);
    let (local, accum) = lut
        .iteration_time_on(
            &job.spec.model,
            &gpu_type,
            &placement,
            global,
            &variant,
            layers,
        )
        .map_or((global.div_ceil(gpus), 1), |it| {
            (it.local_bsz, it.grad_accum)
        });
    pb::StepTimeSample {
        key: Some(pb::ThroughputKey {
            model: job.spec.model.clone(),
            gpu_type,
            placement,
            local_batch_size: local,
            gradient_accumulation: accum,
            ..variant_key(&variant)
        }),
        step_time_seconds: step_time_s,
        sync_time_seconds: 0.0,
    }
}
