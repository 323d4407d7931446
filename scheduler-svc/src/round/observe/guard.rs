//! The merge guard (Ymir §4.3): a merge whose watched metric does not
//! improve in its first epochs is split; a warm start that hurts is
//! restarted fresh; what a merge gained is recorded for the estimator.

use std::collections::{BTreeMap, BTreeSet};

use fmsched_core::policy::MergeMode;
use fmsched_core::{JobId, JobState};
use fmsched_estimator::loss_curve::LossCurve;
use fmsched_estimator::lut::Lut;
use fmsched_estimator::times;
use fmsched_estimator::transfer::{TaskEmbedding, observed_gain, spatial_score, temporal_score};

use crate::persistence::{Estimate, FreshStart, MergeRecord};
use crate::registry::LiveNode;
use crate::round::observe::curve_from_json;
use crate::round::observe::{Observed, TransferOutcome};
use crate::round::{RoundError, iteration_budget};
use crate::service::Service;
use fmsched_core::round::guard::{
    GainMeasure, GuardConsequence, GuardRuling, GuardVerdict, Watched, guard_consequence,
    guard_verdict, ruling_of,
};

/// Loss points a merged job's own trace needs before its observed gain is
/// measured (fewer at its completion: whatever it reported then).
pub(crate) const GAIN_POINTS: usize = 20;

pub(crate) const GAIN_POINTS_AT_END: usize = 5;

/// An active merge one of whose jobs ended without completing (cancelled,
/// or failed for good) is split, and the other job goes on alone: the
/// joint process of a spatial pair would otherwise go on training the
/// cancelled task beside the live one (every step takes a batch of each)
/// until it met its target. As a guard split, a spatial pair's live job
/// waits one round for the joint process's last checkpoint
/// (`split_now`). A job that completed ends nothing: a spatial pair's
/// other task trains on in the joint process, and a temporal B starts
/// from A's weights.
pub(crate) async fn split_merges_of_ended_jobs(
    state: &Service,
    o: &mut Observed,
) -> Result<(), RoundError> {
    let ended: BTreeSet<JobId> = o
        .merges
        .iter()
        .filter(|m| m.active && !o.split_now.contains(&m.id))
        .flat_map(|m| [m.a, m.b])
        .filter(|j| !o.live.contains_key(j))
        .collect();
    for job in ended {
        let Some(rec) = state.persistence.get_job(job).await? else {
            continue;
        };
        if !rec.state.is_terminal() || rec.state == JobState::Completed {
            continue;
        }
        for m in o
            .merges
            .iter_mut()
            .filter(|m| m.active && (m.a == job || m.b == job))
        {
            let other = if m.a == job { m.b } else { m.a };
            let other_name = o.live.get(&other).map_or("", |r| r.spec.name.as_str());
            let reason = format!(
                "{} ({job}) was {}; {other_name} ({other}) trains on alone",
                rec.spec.name, rec.state
            );
            tracing::info!(merge = m.id, job_id = %job, state = %rec.state, "merge split: one of its jobs ended");
            o.split_now.insert(m.id);
            o.writes.released.push((m.clone(), reason));
            m.active = false;
        }
    }
    Ok(())
}

/// The merge guard (Ymir §4.3): a merge whose watched accuracy does not
/// improve in the first two epochs is split and both jobs are scheduled on
/// their own. Temporal A ↦ B: B's accuracy with A's weights, evaluated while
/// A trains. Spatial A ‖ B: each task's accuracy in the joint job. A spatial
/// verdict also measures the pair's gain (each job's loss against its own
/// curve); a temporal split shows no gain, not how much was lost, so it is
/// recorded as 0 (an upper bound), and a kept temporal merge is measured
/// later, on B's own training.
pub(crate) fn guard(
    o: &mut Observed,
    evals: &BTreeMap<JobId, Vec<f64>>,
    losses: &BTreeMap<JobId, (u64, f64)>,
) {
    let unguarded: Vec<MergeRecord> = o
        .merges
        .iter()
        .filter(|m| m.active && !m.guard_passed && !o.split_now.contains(&m.id))
        .cloned()
        .collect();
    for m in unguarded {
        let watched: Vec<Watched<'_>> = match m.mode {
            MergeMode::Temporal => vec![m.b],
            _ => vec![m.a, m.b],
        }
        .into_iter()
        .filter_map(|j| {
            let spec = &o.live.get(&j)?.spec;
            Some(Watched {
                job: j,
                evals: evals.get(&j).map(Vec::as_slice),
                lower_is_better: spec
                    .target
                    .metric
                    .as_ref()
                    .is_some_and(|t| t.lower_is_better),
            })
        })
        .collect();
        let verdict = guard_verdict(m.mode, &watched);
        let Some(ruling) = ruling_of(&verdict) else {
            continue;
        };
        let consequence = guard_consequence(m.mode, m.a, m.b, ruling);
        let measured = match consequence.measure {
            GainMeasure::NoGain => Some(0.0),
            GainMeasure::EachAgainstOwnCurve => spatial_gain(&o.estimates, losses, &m),
            GainMeasure::Later | GainMeasure::AlreadyMeasured => None,
        };
        let reason = match verdict {
            GuardVerdict::Split(reason) => {
                tracing::warn!(merge = m.id, mode = m.mode.as_str(), %reason, "merge guard: splitting");
                Some(reason)
            }
            _ => None,
        };
        apply_consequence(o, &m, &consequence, reason);
        if let Some(gain) = measured {
            record_outcome(o, &m, gain);
        }
    }
    for m in &mut o.merges {
        m.active &= !o.split_now.contains(&m.id);
    }
}

/// A spatial pair's observed gain: the mean over its two jobs of each one's
/// loss against its own (alone) curve at the iterations it reached in the
/// joint process.
pub(crate) fn spatial_gain(
    estimates: &BTreeMap<JobId, Estimate>,
    losses: &BTreeMap<JobId, (u64, f64)>,
    m: &MergeRecord,
) -> Option<f64> {
    let gains: Vec<f64> = [m.a, m.b]
        .iter()
        .filter_map(|j| {
            let curve = estimates.get(j)?.curve.as_ref().and_then(curve_from_json)?;
            let &(it, loss) = losses.get(j)?;
            observed_gain(&curve, &[it as f64], &[loss])
        })
        .collect();
    (gains.len() == 2).then(|| (gains[0] + gains[1]) / 2.0)
}

/// B of a temporal transfer from a completed job (a warm start, or a merge
/// whose A finished) measured the gain `gain` on its own training. Where
/// the transfer hurts so much that starting again from the pre-trained
/// weights finishes B sooner, counting the restart
/// ([`times::fresh_start_pays`]), the merge is split (the guard's verdict,
/// with the figures) and B restarts from those weights: its progress and
/// checkpoint are reset in this round's commit, the plan tells its node to
/// start it afresh (`DesiredTask.fresh_start`), and reports of the dropped
/// run are ignored from then on ([`crate::persistence::FreshStart`]). The
/// merge guard's first-two-epochs rule cannot see this: from another
/// task's weights B's accuracy may still rise, only more slowly than from
/// the pre-trained ones. Only a job whose stop depends on how it learns (a
/// metric target, or a loss plateau without an iteration budget) can gain
/// by it: a fixed budget runs its iterations either way.
pub(crate) async fn fresh_start_if_it_pays(
    state: &Service,
    lut: &Lut,
    o: &mut Observed,
    n: &LiveNode,
    m: &MergeRecord,
    curve: &LossCurve,
    gain: f64,
) {
    let b = m.b;
    let Some(job) = o.live.get(&b) else {
        return;
    };
    let budget = iteration_budget(job);
    if job.spec.target.metric.is_none() && budget.is_some() {
        return;
    }
    let Some(step_s) = o
        .estimates
        .get(&b)
        .and_then(|e| e.step_time_s)
        .filter(|s| s.is_finite() && *s > 0.0)
    else {
        return;
    };
    let sched = &state.config.scheduling;
    let family = crate::registry::node_family(n);
    let restart_s = fmsched_core::round::restart_cost(
        sched.checkpoint_cost.as_secs_f64(),
        sched
            .context_switch
            .map(|d| d.as_secs_f64())
            .or_else(|| lut.context_switch_s(&job.spec.model, &family)),
    );
    let done = o.progress.get(&b).map_or(0, |p| p.0);
    let Some((left, fresh)) =
        times::fresh_start_pays(curve, gain, done, budget.unwrap_or(0), restart_s / step_s)
    else {
        return;
    };
    // A completed (a read error only costs the history its name).
    let from = match state.persistence.get_job(m.a).await {
        Ok(Some(a)) => format!("{} ({})", a.spec.name, m.a),
        _ => m.a.to_string(),
    };
    let reason = format!(
        "{} ({b}) trains worse from the output weights of {from} than from the pre-trained ones (measured gain {gain:+.3} at iteration {done}): about {left} more iterations from them against {fresh} from scratch and a {restart_s:.0} s restart, so it starts again from the pre-trained weights",
        job.spec.name
    );
    tracing::warn!(merge = m.id, job_id = %b, gain, done, left, fresh, "harmful transfer: restarting from the pre-trained weights");
    let consequence = guard_consequence(m.mode, m.a, m.b, GuardRuling::RestartFresh);
    apply_consequence(o, m, &consequence, Some(reason));
}

/// Applies core's [`GuardConsequence`] of a ruling on merge `m` to the
/// round's observed state (`reason`: why it ends). An ending merge goes
/// into `split_now`: it is inactive from this round, the guard's split is
/// recorded with its reason, and a spatial pair's jobs (`alone`, B leaving
/// the joint process) are held back a round while the joint process
/// writes its last checkpoint (`inputs::held_back_and_pinned`). A kept
/// merge is recorded as passed. A restarted job's progress, evaluations
/// and reports of the dropped run are reset (`FreshStart`).
fn apply_consequence(
    o: &mut Observed,
    m: &MergeRecord,
    consequence: &GuardConsequence<JobId>,
    reason: Option<String>,
) {
    if !consequence.ends {
        o.writes.guard.push((m.clone(), None));
        return;
    }
    o.split_now.insert(m.id);
    o.guard_splits += 1;
    o.writes.guard.push((m.clone(), reason));
    if let Some(rec) = o.merges.iter_mut().find(|x| x.id == m.id) {
        rec.active = false;
    }
    let Some(b) = consequence.restarts else {
        return;
    };
    // What it trained from the other job's weights is dropped.
    o.writes.fresh_starts.push(b);
    o.progress.insert(b, (0, None));
    if let Some(e) = o.estimates.get_mut(&b)
        && !e.evals.is_empty()
    {
        e.evals.clear();
        let e = e.clone();
        o.writes.estimates.retain(|(j, _)| *j != b);
        o.writes.estimates.push((b, e));
    }
    o.fresh.insert(
        b,
        FreshStart {
            generation: o.current.generation + 1,
            pending: true,
        },
    );
}

/// Queues a merge outcome (score from the two jobs' Task2Vec embeddings)
/// and marks the merge as measured, once.
pub(crate) fn record_outcome(o: &mut Observed, m: &MergeRecord, gain: f64) {
    if m.observed_gain.is_some() || o.outcomes.iter().any(|x| x.merge == m.id) {
        return;
    }
    let emb = |j: &JobId| {
        o.estimates
            .get(j)
            .filter(|e| !e.fisher.is_empty() && e.fisher.len() == e.fisher_repeat.len())
            .map(|e| TaskEmbedding {
                fisher: e.fisher.clone(),
                fisher_repeat: e.fisher_repeat.clone(),
            })
    };
    let (Some(ea), Some(eb)) = (emb(&m.a), emb(&m.b)) else {
        return;
    };
    let score = match m.mode {
        MergeMode::Spatial => spatial_score(&ea, &eb),
        _ => temporal_score(&ea, &eb),
    };
    if !(score.is_finite() && gain.is_finite()) {
        return;
    }
    tracing::info!(
        merge = m.id,
        mode = m.mode.as_str(),
        score,
        gain,
        predicted = m.gain_ab,
        "merge outcome measured"
    );
    o.writes.observed_gains.push((m.id, gain));
    // This round plans on it already (`inputs::job_inputs`).
    if let Some(rec) = o.merges.iter_mut().find(|x| x.id == m.id) {
        rec.observed_gain = Some(gain);
    }
    o.outcomes.push(TransferOutcome {
        merge: m.id,
        score,
        gain,
    });
}
