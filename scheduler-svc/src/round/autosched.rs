//! AutoSched live: the IO around `fmsched_sim::tune` (the same tuner `fmsim
//! tune` replays). A tuning reads the active policy, the nodes and the
//! stored jobs with their service, predicts the next hour and searches the
//! knobs in the simulator on a blocking thread, then adopts through the
//! persisted, audited `SetPolicy` path. The leader tunes every
//! `autosched.every` when `autosched.enabled`; `AdminService.Tune` tunes on
//! demand.

use std::collections::BTreeMap;

use chrono::Utc;
use fmsched_sim::engine::{NodeGroup, ObservedState, SimConfig};
use fmsched_sim::tune::{self, Forecast, LiveJob, SearchConfig, TuneDecision, Tuner};

use fmsched_core::FieldError;

use crate::persistence::{PersistenceError, PolicySetting, TuningRecord};
use crate::service::Service;

/// Why a tuning did not run or did not finish. The gRPC edge maps it to a
/// status (`api`); the leader's loop logs it.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// A request's field is out of range.
    #[error("{0}")]
    InvalidArgument(FieldError),
    /// The policy in force or the cluster cannot be tuned now.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The tuner failed or proposed what cannot be adopted.
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Persistence(#[from] PersistenceError),
}

/// The actor of AutoSched's own changes in the audit log.
pub const ACTOR: &str = "autosched";

/// One tuning's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub policy: String,
    pub before: BTreeMap<String, f64>,
    pub threshold: f64,
    pub decision: TuneDecision,
}

/// Node groups of the simulated cluster: the nodes not offline, by GPU
/// model and count.
fn cluster(nodes: &[crate::persistence::NodeRecord]) -> Result<Vec<NodeGroup>, String> {
    let mut groups: BTreeMap<(String, u32), u32> = BTreeMap::new();
    for n in nodes {
        if n.state == fmsched_core::NodeState::Offline || n.gpus.is_empty() {
            continue;
        }
        let gpus = n.gpus.len() as u32;
        if gpus > 9 {
            return Err(format!(
                "node {} has {gpus} GPUs; AutoSched's simulator models nodes of 1-9",
                n.id
            ));
        }
        *groups.entry((n.gpus[0].model.clone(), gpus)).or_default() += 1;
    }
    if groups.is_empty() {
        return Err("no node with GPUs is up: nothing to simulate".into());
    }
    Ok(groups
        .into_iter()
        .map(|((model, gpus), count)| NodeGroup::new(&model, count, gpus))
        .collect())
}

/// Runs one tuning now; adopts unless `dry_run`.
pub async fn tune_once(
    state: &Service,
    dry_run: bool,
    threshold: Option<f64>,
    asked_by: &str,
) -> Result<Outcome, TuneError> {
    let cfg = &state.config.autosched;
    let threshold = threshold.unwrap_or(cfg.threshold);
    if !(threshold.is_finite() && threshold >= 1.0) {
        return Err(TuneError::InvalidArgument(FieldError::new(
            "threshold",
            "must be at least 1",
        )));
    }
    let stored = state.persistence.policy_setting().await?;
    let active = state.config.scheduling.with_setting(stored.as_ref());
    let policy = active.policy.clone();
    if tune::knob_space(&policy).is_none() {
        return Err(TuneError::FailedPrecondition(format!(
            "AutoSched tunes tiresias or themis; the active policy is {policy}"
        )));
    }
    let nodes = state.persistence.list_nodes().await?;
    let groups = cluster(&nodes).map_err(TuneError::FailedPrecondition)?;
    let now = Utc::now();
    let since = now - chrono::Duration::from_std(cfg.history).unwrap_or(chrono::Duration::days(14));
    let records = state.persistence.tuning_records(since).await?;
    let (live, now_s) = live_jobs(&records, now);
    let me = state.autosched.clone();
    let knobs = active.knobs.clone();
    let samples = cfg.samples;
    let pol = policy.clone();
    let (before, decision) = tokio::task::spawn_blocking(move || {
        let mut slot = me.tuner.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|t| t.policy != pol) {
            *slot = Some(Tuner::new(
                &pol,
                knobs.clone(),
                SimConfig {
                    cluster: groups.clone(),
                    ..SimConfig::default()
                },
                me.lut.clone(),
                me.catalog.clone(),
                Forecast::AutoSched,
                SearchConfig {
                    samples,
                    ..SearchConfig::default()
                },
            )?);
        }
        let tuner = slot.as_mut().unwrap_or_else(|| unreachable!("set above"));
        tuner.set_knobs(&knobs);
        tuner.set_cluster(groups);
        tuner.search.threshold = threshold;
        let before = tuner.knobs().clone();
        let specs = tune::live_specs(&live, &me.catalog, "roberta-base");
        let obs = tune::live_observation(now_s, &live, &specs);
        Ok::<_, String>((before, tuner.decide(&obs, !dry_run)))
    })
    .await
    .map_err(|e| TuneError::Internal(format!("the tuner stopped: {e}")))?
    .map_err(TuneError::FailedPrecondition)?;
    let detail = describe(&decision, threshold, asked_by);
    if decision.adopted {
        let setting = PolicySetting {
            policy: policy.clone(),
            knobs: decision.knobs.clone(),
            set_by: ACTOR.to_string(),
            set_at: Utc::now(),
        };
        // The same checks as SetPolicy's: what the tuner proposes is a
        // configuration of the policy's own knobs, in range.
        state
            .config
            .scheduling
            .with_setting(Some(&setting))
            .build_policy()
            .map_err(|e| {
                TuneError::Internal(format!("AutoSched proposed an invalid setting: {e}"))
            })?;
        state.persistence.set_policy(&setting).await?;
    }
    state
        .persistence
        .audit(
            ACTOR,
            if dry_run {
                "autosched_dry_run"
            } else {
                "autosched_tune"
            },
            &policy,
            &detail,
        )
        .await?;
    state.metrics.update(|m| {
        m.autosched_tunings += 1;
        m.autosched_adopted += u64::from(decision.adopted);
        m.autosched_last_gain = decision.gain;
        m.autosched_last_seconds = decision.wall_s;
        if let Some(g) = decision.realised_gain {
            m.autosched_realised_gain = g;
        }
    });
    tracing::info!(%policy, gain = decision.gain, adopted = decision.adopted, dry_run,
        knobs = %fmt_knobs(&decision.knobs), "AutoSched tuning");
    Ok(Outcome {
        policy,
        before,
        threshold,
        decision,
    })
}

/// The audit log's line for a tuning: its verdict, gain, the trace it
/// simulated and what it proposed (and who asked, unless AutoSched).
fn describe(decision: &TuneDecision, threshold: f64, asked_by: &str) -> String {
    format!(
        "{} gain {:.3} (threshold {threshold}) on {} predicted jobs ({} carried over), {} simulations in {:.2} s; proposed {}{}{}",
        if decision.adopted {
            "adopted:"
        } else if decision.passes {
            "dry run, would adopt:"
        } else {
            "kept:"
        },
        decision.gain,
        decision.trace_jobs,
        decision.carried_over,
        decision.simulations,
        decision.wall_s,
        fmt_knobs(&decision.proposed),
        decision
            .realised_gain
            .map(|g| format!("; realised since the last adoption {g:.3}"))
            .unwrap_or_default(),
        if asked_by == ACTOR {
            String::new()
        } else {
            format!("; asked by {asked_by}")
        },
    )
}

/// The stored jobs as the tuner's live trace, on seconds since the oldest
/// of them was submitted, and now on that clock.
fn live_jobs(records: &[TuningRecord], now: chrono::DateTime<Utc>) -> (Vec<LiveJob>, f64) {
    let origin = records.iter().map(|r| r.created_at).min().unwrap_or(now);
    let secs = |t: chrono::DateTime<Utc>| (t - origin).num_milliseconds() as f64 / 1000.0;
    let live: Vec<LiveJob> = records
        .iter()
        .map(|r| LiveJob {
            id: r.id.to_string(),
            submitted_s: secs(r.created_at),
            model: r.model.clone(),
            gpus: r.max_gpus,
            state: match (r.ended_at, r.running) {
                (Some(t), _) => ObservedState::Done { finish_s: secs(t) },
                (None, true) => ObservedState::Running,
                (None, false) => ObservedState::Waiting,
            },
            executed_s: r.executed_s,
            attained_gpu_s: r.attained_gpu_s,
            fair_share_gpu_s: r.fair_share_gpu_s,
        })
        .collect();
    (live, secs(now))
}

fn fmt_knobs(k: &BTreeMap<String, f64>) -> String {
    k.iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The leader tunes every `autosched.every` (a standby waits).
pub async fn autosched_loop(state: Service) {
    let every = state.config.autosched.every;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !state.leadership.is_leader() {
            continue;
        }
        if let Err(e) = tune_once(&state, false, None, ACTOR).await {
            tracing::warn!(error = %e, "AutoSched tuning did not run");
        }
    }
}

/// Keeps the tuner's knobs in one place for the API's reply.
pub fn knob_map(k: &BTreeMap<String, f64>) -> std::collections::HashMap<String, f64> {
    k.iter().map(|(n, v)| (n.clone(), *v)).collect()
}
