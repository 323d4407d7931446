//! Report intake: what one task's report says (progress, checkpoints,
//! completion, a profiling run's trace and embedding), folded into the
//! round's writes; gangs answer through rank 0.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fmsched_core::{JobId, JobState, NodeId};
use fmsched_estimator::curve_prior;
use fmsched_estimator::loss_curve::MIN_LOSS_POINTS;
use fmsched_estimator::lut::Lut;
use fmsched_estimator::transfer::TaskEmbedding;
use fmsched_proto::v1 as pb;

use crate::estimates::EstimatorClient;
use crate::persistence::{Assignment, Estimate, FreshStart, JobRecord};
use crate::registry::LiveNode;
use crate::round::observe::estimates::{learn_from_running, loss_prior_of, profile_estimate};
use crate::round::observe::failures::failed;
use crate::round::observe::telemetry::profile_step_time_sample;
use crate::round::observe::{Observed, PROFILE_SUFFIX, Reports, members_of};
use crate::service::Service;

/// A report of a job restarted from its initial weights
/// ([`fresh_start_if_it_pays`]) counts only from a process of a plan at or
/// after the restart: an older one is the dropped run (its progress and
/// checkpoints are not the job's any more). None for such a stale report;
/// else the jobs whose fresh process it shows for the first time.
pub(crate) fn fresh_run(
    fresh: &BTreeMap<JobId, FreshStart>,
    t: &pb::ObservedTask,
) -> Option<Vec<JobId>> {
    let restarted: Vec<(JobId, &FreshStart)> = members_of(&t.task_id)
        .into_iter()
        .flatten()
        .filter_map(|j| fresh.get(&j).map(|f| (j, f)))
        .collect();
    if restarted.iter().any(|(_, f)| t.generation < f.generation) {
        return None;
    }
    Some(
        restarted
            .into_iter()
            .filter(|(_, f)| f.pending)
            .map(|(j, _)| j)
            .collect(),
    )
}

/// Takes in one process a node reports: a profiling run that ended queues
/// its job with what it measured; a training process records progress and
/// checkpoints, teaches the estimator its step time and loss trace, and
/// completes or retries (then fails) its jobs.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn observe_task(
    state: &Service,
    lut: &Lut,
    est: &EstimatorClient,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    now: DateTime<Utc>,
    reports: Reports<'_>,
) {
    let Reports { evals, losses, own } = reports;
    // Profiling runs: "<job>-profile".
    if let Some(job_part) = t.task_id.strip_suffix(PROFILE_SUFFIX) {
        if let Ok(id) = job_part.parse::<JobId>() {
            observe_profile_run(state, est, o, n, t, id).await;
        }
        return;
    }
    // A training process: one job ("<job>") or a spatial pair ("<a>+<b>",
    // one joint process).
    let Some(members) = members_of(&t.task_id) else {
        return;
    };
    let phase = pb::TaskPhase::try_from(t.phase).unwrap_or(pb::TaskPhase::Unspecified);
    // A non-zero member of a gang: rank 0 reports progress, checkpoints and
    // completion; this process only counts when it fails (its job's gang
    // broke: the job is re-queued from rank 0's last checkpoint) as a part
    // of the job's run in force. A part of a run the plan has replaced (its
    // job moved off this node, or to other GPUs or ranks here) exits
    // non-zero by the contract once its rank 0 went away: that is the
    // replaced run's end, not a failure of the job.
    if t.rank_offset > 0 {
        if phase == pb::TaskPhase::Failed {
            for &id in &members {
                if o.live
                    .get(&id)
                    .is_some_and(|j| j.state == JobState::Running)
                    && part_in_force(&o.current.assignments, id, &n.record.id, t)
                {
                    failed(state, o, n, t, &members, id, now);
                }
            }
        }
        return;
    }
    let ckpt = Some(t.checkpoint_path.clone()).filter(|c| !c.is_empty());
    // One row per job: a job reported twice (the stale last report of a
    // lost node beside its new process) keeps its furthest report.
    let progressed = |o: &mut Observed, j: JobId, iteration: u64| {
        match o.writes.progress.iter_mut().find(|p| p.0 == j) {
            Some(p) if p.1 > iteration => {}
            Some(p) => {
                p.1 = iteration;
                if ckpt.is_some() {
                    p.2.clone_from(&ckpt);
                }
            }
            None => o.writes.progress.push((j, iteration, ckpt.clone())),
        }
        let entry = o.progress.entry(j).or_insert((0, None));
        if iteration >= entry.0 {
            entry.0 = iteration;
            if ckpt.is_some() {
                entry.1.clone_from(&ckpt);
            }
        }
    };
    if t.jobs.is_empty() && o.live.contains_key(&members[0]) {
        // An agent that reports no per-job progress.
        progressed(o, members[0], t.iteration);
    }
    // Evaluations count for the process's own jobs and, in a temporal
    // merge, for the partner it evaluates; a report naming any other job is
    // not this process's to make.
    let watched = |o: &Observed, j: JobId| {
        members.contains(&j)
            || o.merges.iter().any(|m| {
                m.active
                    && ((m.a == j && members.contains(&m.b))
                        || (m.b == j && members.contains(&m.a)))
            })
    };
    for r in &t.jobs {
        let Ok(j) = r.job_id.parse::<JobId>() else {
            continue;
        };
        if let Some(p) = &r.prompt_init
            && members.contains(&j)
            && o.live.contains_key(&j)
        {
            o.writes.first_notes.push((
                j,
                "prompt_bank".into(),
                format!(
                    "initial prompt from the Prompt Bank: job {}'s tuned prompt (score {:.4}; {} of {} prompts scored)",
                    p.from_job_id, p.score, p.scored, p.candidates
                ),
            ));
        }
        if !r.evals.is_empty() && watched(o, j) {
            evals.insert(j, r.evals.clone());
        }
        // A job's own training curve (not a partner's weights evaluated on
        // its task), per epoch — folded now, while a job that completes in
        // this report is still here to say it has a metric target.
        if members.contains(&j)
            && !r.eval_epochs.is_empty()
            && o.live
                .get(&j)
                .is_some_and(|job| job.spec.target.metric.is_some())
        {
            let mut e = o.estimates.get(&j).cloned().unwrap_or_default();
            if curve_prior::fold_evals(&mut e.evals, &r.eval_epochs, &r.evals) {
                o.estimates.insert(j, e);
                own.insert(j);
            }
        }
        // Watched (eval-only) jobs are not trained by this process.
        if members.contains(&j) && o.live.contains_key(&j) {
            progressed(o, j, r.iteration);
            if r.loss > 0.0 && r.iteration > 0 {
                losses.insert(j, (r.iteration, r.loss));
            }
        }
    }
    learn_from_running(state, lut, est, o, n, t, &members, phase).await;
    for &id in &members {
        let Some(job) = o.live.get(&id) else { continue };
        if job.state != JobState::Running {
            continue;
        }
        // A job completes when its own task reached its target, even while
        // the joint process trains its partner on.
        let output = t.outputs.get(&id.to_string()).cloned();
        if output.is_some() || phase == pb::TaskPhase::Succeeded {
            completed(o, n, t, id, output);
            continue;
        }
        if phase == pb::TaskPhase::Failed {
            failed(state, o, n, t, &members, id, now);
        }
    }
}

/// Job `id` of process `t` completed: its output (or, without one, a note
/// that none was reported) is recorded, a tuned prompt goes into its
/// model's Prompt Bank, and the job leaves the live set.
fn completed(
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    id: JobId,
    output: Option<String>,
) {
    let Some(job) = o.live.get(&id) else {
        return;
    };
    // A process that exits 0 without reporting its output (a plain
    // command that does not speak the report protocol, or a trainer
    // that broke the contract) still completes its job: exit 0 is
    // success. Its history says the output is missing, so the empty
    // path is not taken for a result.
    if output.is_none() {
        tracing::warn!(job_id = %id, node_id = %n.record.id,
            "job completed: its process exited 0 without reporting an output");
        o.writes.first_notes.push((
            id,
            "no_output".into(),
            format!(
                "process {} on node {} exited 0 without a `done` report: completed with no output recorded (the trainer contract's `done` line names it)",
                t.task_id, n.record.id
            ),
        ));
    }
    let output = output.unwrap_or_default();
    tracing::info!(job_id = %id, node_id = %n.record.id, %output, "job completed");
    // A tuned prompt goes into its model's Prompt Bank.
    if let Some(r) = t.jobs.iter().find(|r| r.job_id == id.to_string())
        && job.spec.kind == fmsched_core::JobKind::PromptTuning
        && !r.prompt_features.is_empty()
        && !output.is_empty()
    {
        let model = job.spec.model.clone();
        o.bank_new.push(crate::persistence::BankPrompt {
            job: id,
            model,
            location: output.clone(),
            features: r.prompt_features.clone(),
        });
    }
    o.writes.completions.push((id, output));
    if let Some(j) = o.live.remove(&id) {
        o.finished.insert(id, j);
    }
    o.completed += 1;
}

/// A job's profiling run: once it ended, its job is queued with what it
/// measured (estimates; its step time teaches the estimator's table). A
/// run still going leaves the job profiling: it must not be scheduled yet.
async fn observe_profile_run(
    state: &Service,
    est: &EstimatorClient,
    o: &mut Observed,
    n: &LiveNode,
    t: &pb::ObservedTask,
    id: JobId,
) {
    let Some(model) = o
        .live
        .get(&id)
        .filter(|j| j.state == JobState::Profiling)
        .map(|j| j.spec.model.clone())
    else {
        return;
    };
    let fits =
        t.phase == pb::TaskPhase::Succeeded as i32 && t.trace_losses.len() >= MIN_LOSS_POINTS;
    if fits {
        loss_prior_of(state, &mut o.loss_priors, &model).await;
    }
    let Some(j) = o.live.get_mut(&id) else {
        return;
    };
    let Some((learned, reason)) = profile_estimate(j, t, o.loss_priors.get(&model)) else {
        return;
    };
    tracing::info!(job_id = %id, %reason, "profiling done");
    o.writes.estimates.push((id, learned.clone()));
    o.writes.transitions.push((id, JobState::Queued, reason));
    o.estimates.insert(id, learned);
    j.state = JobState::Queued;
    // 1 GPU, the job's batch; AMP as the shipped profiles.
    if t.step_time_s > 0.0
        && let Some(g) = n.record.gpus.first()
    {
        let sample = profile_step_time_sample(j, &g.model, t.step_time_s);
        if let Err(e) = est.record_step_times(vec![sample]).await {
            tracing::warn!(job_id = %id, error = %e, "step time not recorded");
        }
    }
}

/// Whether reported process `t` on `node` is `job`'s part there in the
/// plan in force: the same GPUs and ranks.
pub(crate) fn part_in_force(
    plan: &[Assignment],
    job: JobId,
    node: &NodeId,
    t: &pb::ObservedTask,
) -> bool {
    plan.iter().any(|a| {
        a.job == job
            && !a.profile
            && &a.node == node
            && a.rank_offset == t.rank_offset
            && a.gpus.len() == t.gpu_uuids.len()
            && a.gpus.iter().zip(&t.gpu_uuids).all(|(g, u)| &g.0 == u)
    })
}

/// Jobs of training processes that finish before a switch `lead_s`
/// seconds away, for a look-ahead round: those that reported their output
/// (with it) or ended, and those whose remaining iterations at their
/// reported step time take less than `lead_s` (Ymir §6.2: the next job
/// prepares while they finish).
pub(crate) fn finishing<'a>(
    observed: impl IntoIterator<Item = &'a pb::ObservedTask>,
    live: &BTreeMap<JobId, JobRecord>,
    estimates: &BTreeMap<JobId, Estimate>,
    lead_s: f64,
) -> Vec<(JobId, Option<String>)> {
    let mut out = Vec::new();
    for t in observed {
        if t.task_id.ends_with(PROFILE_SUFFIX) {
            continue;
        }
        let Some(members) = members_of(&t.task_id) else {
            continue;
        };
        let ended = t.phase == pb::TaskPhase::Succeeded as i32;
        for id in members {
            let Some(j) = live.get(&id) else { continue };
            let key = id.to_string();
            if let Some(o) = t.outputs.get(&key) {
                out.push((id, Some(o.clone())));
                continue;
            }
            let done = t
                .jobs
                .iter()
                .find(|r| r.job_id == key)
                .map_or(t.iteration, |r| r.iteration);
            // When it will really end: on the estimate, whatever the
            // policy plans on.
            let total = crate::round::expected_iterations(j, estimates.get(&id), true);
            // A job past its estimated iterations (a metric target the
            // estimate undershot) is not predicted to finish.
            let soon = t.step_time_s > 0.0
                && total > done
                && (total - done) as f64 * t.step_time_s <= lead_s;
            if ended || soon {
                out.push((id, None));
            }
        }
    }
    out
}

/// The Task2Vec embedding of a profiled job, when it has a usable one.
pub(crate) fn embedding(e: &Estimate) -> Option<TaskEmbedding> {
    (!e.fisher.is_empty() && e.fisher.len() == e.fisher_repeat.len()).then(|| TaskEmbedding {
        fisher: e.fisher.clone(),
        fisher_repeat: e.fisher_repeat.clone(),
    })
}
