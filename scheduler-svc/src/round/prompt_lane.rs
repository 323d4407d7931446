//! PromptTuner's lane (thesis 004 Ch. 4, §4.4.4): prompt-tuning jobs start
//! within ~50 ms of arriving, beside the normal round, on warm processes of
//! their model where one waits.
//!
//! - **Who owns what.** The round never starts, moves or suspends a lane
//!   job: a pending one is held back from it, a running one is pinned (it
//!   keeps its GPUs, as a non-preemptible job does). The lane takes only
//!   GPUs the plan in force leaves free (the cold pool) and warm processes
//!   (the warm pools): those the agents report idle, and those of lane
//!   jobs that finished in this pass with their process still up (the
//!   agent keeps it warm once this commit drops the job). A round that
//!   gives a warm process's GPUs to another job stops that process.
//! - **One plan.** A lane pass is a round without a policy: it observes the
//!   agents' reports as a round does (a finished prompt job is completed
//!   and leaves the plan in the same commit that may hand its warm process
//!   the next request), keeps the plan in force for everything else, adds
//!   the requests it starts, and commits under a new generation, fenced by
//!   the leader's term. Rounds and lane passes hold one lock from observe
//!   to commit, so they never grant a GPU twice.
//! - **The decision** is `fmsched_core::policy::prompttuner::place_lane`:
//!   Algorithms 1 and 2 over the pools, then concrete GPUs per request. A
//!   request's completion bound `T_i(A)` is its remaining iterations × the
//!   throughput table's step time on `A` GPUs of the family it would run
//!   on, plus [`WARM_START_S`]; a cold start adds `T_cold` of its model
//!   (`prompttuner::cold_start_s`). Its SLO is its deadline; without one,
//!   the time a cold start now would take on its best GPU count (it waits
//!   for a warm GPU only when that finishes no later).
//! - **When.** The loop wakes on a prompt-tuning submission and on agents'
//!   reports of finished processes or warm ones, waits one 50 ms tick to
//!   take a burst in together, and decides if a request is pending; else
//!   once a second. A pass that starts nothing writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use fmsched_core::policy::prompttuner::{self, LaneNode, LaneRequest, Request};
use fmsched_core::{GpuUuid, JobId, JobState, NodeState};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::{Lut, Variant};

use super::observe::{self, Observed};
use super::{RoundError, RoundKind, total_iterations};
use crate::estimates::EstimatorClient;
use crate::persistence::{Assignment, JobRecord, ServiceUpdate};
use crate::service::Service;

/// The loop's period: requests arriving within one tick are decided
/// together (the thesis' 50 ms).
pub const TICK: Duration = Duration::from_millis(50);

/// Without a wake-up the loop looks for pending requests this often (SLOs
/// shrink as requests wait; a delayed one may have to start cold).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Seconds from a lane decision to the trainer running the request on a
/// warm process: the plan's push and the hand-over (the agent writes the
/// next task and signals the process). The allocation overhead of the
/// thesis' completion bound.
pub const WARM_START_S: f64 = 1.0;

/// What one lane pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaneReport {
    /// Requests pending when it decided.
    pub pending: usize,
    /// Started on a warm process of their model / afresh.
    pub warm_starts: usize,
    pub cold_starts: usize,
    /// Waiting for warm GPUs that free up in time.
    pub delayed: usize,
    /// Seconds the decision took (pools to concrete GPUs).
    pub decide_s: f64,
    /// The generation it committed (None: it started nothing, wrote
    /// nothing).
    pub generation: Option<i64>,
}

/// The loop beside [`super::scheduling_loop`] (leaders only).
pub async fn lane_loop(state: Service, lut: Arc<Lut>, est: Arc<EstimatorClient>) {
    loop {
        tokio::select! {
            () = state.leader.prompt_lane.wake.notified() => {}
            () = tokio::time::sleep(IDLE_CHECK) => {}
        }
        // Take a burst in together.
        tokio::time::sleep(TICK).await;
        if !state.leadership.is_leader() {
            continue;
        }
        match state.persistence.prompt_jobs_pending().await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "prompt lane: looking for pending requests failed");
                continue;
            }
        }
        let started = Instant::now();
        let result = run_lane(&state, &lut, &est).await;
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(r) => {
                state.metrics.update(|m| {
                    m.prompt_decisions += 1;
                    m.prompt_decision_seconds_sum += r.decide_s;
                    m.prompt_decision_seconds_max = m.prompt_decision_seconds_max.max(r.decide_s);
                    m.prompt_pass_seconds_sum += took;
                    m.prompt_warm_starts += r.warm_starts as u64;
                    m.prompt_cold_starts += r.cold_starts as u64;
                    m.prompt_delayed = r.delayed as u64;
                });
                if let Some(g) = r.generation {
                    tracing::info!(
                        generation = g,
                        pending = r.pending,
                        warm = r.warm_starts,
                        cold = r.cold_starts,
                        delayed = r.delayed,
                        decide_ms = r.decide_s * 1e3,
                        took_ms = took * 1e3,
                        "prompt lane: requests started"
                    );
                }
            }
            Err(e) if e.is_fenced() => {
                tracing::debug!(error = %e, "prompt lane pass discarded (the plan moved on or leadership was lost)");
            }
            Err(e) => tracing::warn!(error = %e, "prompt lane pass failed; retrying"),
        }
    }
}

/// One lane pass (see the module docs).
pub async fn run_lane(
    state: &Service,
    lut: &Arc<Lut>,
    est: &EstimatorClient,
) -> Result<LaneReport, RoundError> {
    let fence = state.leadership.fence().ok_or(RoundError::NotLeader)?;
    let _one = state.leader.prompt_lane.round_lock.lock().await;
    let now = Utc::now();
    // Observing counts a shared GPU's saturated rounds in the leader's
    // memory (ICEFROG); a pass that commits nothing gives them back, so its
    // observation neither counts nor loses a split it decided.
    let streaks = Restore::new(&state.leader.saturated_gpus);
    let o = observe::observe(state, lut, est, RoundKind::Commit, now).await?;
    let pending: Vec<&JobRecord> = o
        .live
        .values()
        .filter(|j| state.in_prompt_lane(j))
        .filter(|j| matches!(j.state, JobState::Submitted | JobState::Queued))
        .filter(|j| {
            o.retries
                .get(&j.id)
                .is_none_or(|r| r.retry_after.is_none_or(|t| t <= now))
        })
        .filter(|j| !o.admin.requeues.contains_key(&j.id))
        .collect();
    let mut report = LaneReport {
        pending: pending.len(),
        ..LaneReport::default()
    };
    if pending.is_empty() {
        return Ok(report);
    }
    let kept = kept_assignments(&o);
    let mut pools = pools(state, lut, &o, &kept);
    for j in &pending {
        pools.model(&j.spec.model);
    }
    // A request no single node can hold waits (its submission said so).
    let (pending, requests): (Vec<&JobRecord>, Vec<LaneRequest>) = pending
        .into_iter()
        .filter_map(|j| Some((j, request(lut, j, &o, &pools, now)?)))
        .unzip();
    let t0 = Instant::now();
    let plan = prompttuner::place_lane(
        &requests,
        &pools.nodes,
        &pools.models,
        &pools.busy_until,
        &pools.cold_start_s,
        0.0,
    );
    report.decide_s = t0.elapsed().as_secs_f64();
    report.delayed = plan.delayed.len();
    if plan.starts.is_empty() {
        return Ok(report);
    }
    let mut w = o.writes.clone();
    w.assignments = kept;
    for s in &plan.starts {
        let job = pending[s.request];
        let node = &o.nodes[pools.node_of[s.node]];
        let gpus: Vec<GpuUuid> = s
            .gpus
            .iter()
            .filter_map(|&g| node.record.gpus.iter().find(|r| r.index == g))
            .map(|g| g.uuid.clone())
            .collect();
        if gpus.len() != s.gpus.len() {
            continue;
        }
        w.assignments.push(Assignment {
            job: job.id,
            node: node.record.id.clone(),
            gpus,
            profile: false,
            rank_offset: 0,
            master_port: None,
        });
        if job.state == JobState::Submitted {
            w.transitions.push((
                job.id,
                JobState::Queued,
                "accepted for scheduling (the prompt lane, PromptTuner)".into(),
            ));
        }
        let how = match (s.warm, s.late) {
            (true, false) => "on a warm process of its model",
            (false, false) => "loading its model afresh (no warm process of it was free)",
            (true, true) => "on a warm process of its model, best-effort: no option meets its SLO",
            (false, true) => "loading its model afresh, best-effort: no option meets its SLO",
        };
        w.transitions.push((
            job.id,
            JobState::Running,
            format!(
                "prompt lane: started {how} on {} GPU(s) {:?} of node {}",
                s.gpus.len(),
                s.gpus,
                node.record.id
            ),
        ));
        if s.warm {
            report.warm_starts += 1;
        } else {
            report.cold_starts += 1;
        }
    }
    // The round's accounting stands until the next round: its fair shares
    // accrue, its leases and predictions stay.
    w.service = ServiceUpdate {
        fair_share_gpus: state
            .leader
            .prompt_lane
            .fair_share
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        carry_over: true,
        ..ServiceUpdate::default()
    };
    let generation = state
        .persistence
        .commit_round(&fence, o.current.generation, &w, now)
        .await?;
    streaks.keep();
    report.generation = Some(generation);
    if state.leadership.fence().as_ref() != Some(&fence) {
        return Err(RoundError::NotLeader);
    }
    let leases: BTreeMap<JobId, DateTime<Utc>> = o
        .service
        .iter()
        .filter_map(|(j, s)| s.lease_until.map(|t| (*j, t)))
        .collect();
    super::push_committed(
        state,
        &o,
        &w,
        &leases,
        &BTreeMap::new(),
        generation,
        fence.epoch,
    )
    .await?;
    super::account_observed(state, est, &o).await;
    Ok(report)
}

/// Puts a leader-memory map back as it was when dropped, unless kept.
struct Restore<'a, K: Ord + Clone, V: Clone> {
    cell: &'a std::sync::Mutex<BTreeMap<K, V>>,
    before: Option<BTreeMap<K, V>>,
}

impl<'a, K: Ord + Clone, V: Clone> Restore<'a, K, V> {
    fn new(cell: &'a std::sync::Mutex<BTreeMap<K, V>>) -> Self {
        let before = cell.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Self {
            cell,
            before: Some(before),
        }
    }

    fn keep(mut self) {
        self.before = None;
    }
}

impl<K: Ord + Clone, V: Clone> Drop for Restore<'_, K, V> {
    fn drop(&mut self) {
        if let Some(b) = self.before.take() {
            *self.cell.lock().unwrap_or_else(|p| p.into_inner()) = b;
        }
    }
}

/// The plan in force, less what observing ended: training assignments of
/// jobs still running, profiling assignments of jobs still profiling.
fn kept_assignments(o: &Observed) -> Vec<Assignment> {
    o.current
        .assignments
        .iter()
        .filter(|a| {
            o.live.get(&a.job).is_some_and(|j| {
                if a.profile {
                    j.state == JobState::Profiling
                } else {
                    j.state == JobState::Running
                }
            })
        })
        .cloned()
        .collect()
}

/// The pools a lane pass decides over.
struct Pools {
    /// Usable nodes (Available, neither cordoned nor drained).
    nodes: Vec<LaneNode>,
    /// `nodes[k]` is `o.nodes[node_of[k]]`, with `node_gpus[k]` GPUs.
    node_of: Vec<usize>,
    node_gpus: Vec<usize>,
    /// Models of warm processes, running lane jobs and pending requests.
    models: Vec<String>,
    /// Per model: when each GPU running one of its lane jobs frees up
    /// (seconds from now).
    busy_until: Vec<Vec<f64>>,
    /// Per model: `T_cold`.
    cold_start_s: Vec<f64>,
    /// The cluster's usable families, most GPUs first.
    families: Vec<String>,
}

impl Pools {
    fn model(&mut self, name: &str) -> usize {
        if let Some(k) = self.models.iter().position(|m| m == name) {
            return k;
        }
        self.models.push(name.to_string());
        self.busy_until.push(Vec::new());
        self.cold_start_s.push(prompttuner::cold_start_s(
            analytic::params_of(name).unwrap_or(0.0),
        ));
        self.models.len() - 1
    }
}

fn pools(state: &Service, lut: &Lut, o: &Observed, kept: &[Assignment]) -> Pools {
    let mut p = Pools {
        nodes: Vec::new(),
        node_of: Vec::new(),
        node_gpus: Vec::new(),
        models: Vec::new(),
        busy_until: Vec::new(),
        cold_start_s: Vec::new(),
        families: Vec::new(),
    };
    let used: BTreeSet<&str> = kept
        .iter()
        .flat_map(|a| a.gpus.iter().map(|g| g.0.as_str()))
        .collect();
    // Lane jobs that finished in this pass, with the assignment they ran
    // on (looked up once, not per node).
    let finished: Vec<(&Assignment, &JobRecord)> = o
        .current
        .assignments
        .iter()
        .filter(|a| !a.profile)
        .filter_map(|a| {
            Some((
                a,
                o.finished.get(&a.job).filter(|j| state.in_prompt_lane(j))?,
            ))
        })
        .collect();
    let mut family_gpus: BTreeMap<String, usize> = BTreeMap::new();
    for (k, n) in o.nodes.iter().enumerate() {
        let v = super::inputs::node_view(n, &o.admin.cordons, &o.admin.loans);
        if v.state != NodeState::Available || v.drained || v.cordoned {
            continue;
        }
        let index_of = |u: &str| {
            n.record
                .gpus
                .iter()
                .find(|g| g.uuid.0 == u)
                .map(|g| g.index)
        };
        let mut warm_gpus: BTreeSet<u32> = BTreeSet::new();
        let mut warm = Vec::new();
        // A lane job that completed this pass, its process still alive: it
        // was launched warm and waits, its model loaded, to be kept warm
        // once the plan drops the job (this commit).
        for &(a, j) in finished.iter().filter(|(a, _)| a.node == n.record.id) {
            let alive = n.observed_tasks.iter().any(|t| {
                t.task_id == a.job.to_string()
                    && t.phase == fmsched_proto::v1::TaskPhase::Running as i32
            });
            let gpus: Option<Vec<u32>> = a.gpus.iter().map(|u| index_of(&u.0)).collect();
            if let (true, Some(mut gpus)) = (alive, gpus) {
                gpus.sort_unstable();
                warm_gpus.extend(gpus.iter().copied());
                p.model(&j.spec.model);
                warm.push((j.spec.model.clone(), gpus));
            }
        }
        for w in &n.warm {
            let gpus: Option<Vec<u32>> = w.gpu_uuids.iter().map(|u| index_of(u)).collect();
            let Some(mut gpus) = gpus else { continue };
            // A warm process whose GPUs the plan gave away is being stopped.
            if gpus.is_empty() || w.gpu_uuids.iter().any(|u| used.contains(u.as_str())) {
                continue;
            }
            gpus.sort_unstable();
            warm_gpus.extend(gpus.iter().copied());
            p.model(&w.model);
            warm.push((w.model.clone(), gpus));
        }
        let free: Vec<u32> = n
            .record
            .gpus
            .iter()
            .filter(|g| !used.contains(g.uuid.0.as_str()) && !warm_gpus.contains(&g.index))
            .map(|g| g.index)
            .collect();
        *family_gpus.entry(v.gpu_model.clone()).or_default() += n.record.gpus.len();
        p.nodes.push(LaneNode {
            family: v.gpu_model,
            free,
            warm,
        });
        p.node_of.push(k);
        p.node_gpus.push(n.record.gpus.len());
    }
    let mut families: Vec<(String, usize)> = family_gpus.into_iter().collect();
    families.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    p.families = families.into_iter().map(|f| f.0).collect();
    // Running lane jobs hold their GPUs until their bound.
    for a in kept.iter().filter(|a| !a.profile) {
        let Some(j) = o.live.get(&a.job).filter(|j| state.in_prompt_lane(j)) else {
            continue;
        };
        let family = o
            .nodes
            .iter()
            .find(|n| n.record.id == a.node)
            .map(crate::registry::node_family)
            .unwrap_or_default();
        let left = remaining(j, o) as f64 * step_s(lut, j, &family, a.gpus.len());
        // A step time the table lacks: assume a minute more.
        let until = if left.is_finite() { left } else { 60.0 };
        let m = p.model(&j.spec.model);
        p.busy_until[m].extend(std::iter::repeat_n(until, a.gpus.len()));
    }
    p
}

/// Iterations a job has left.
fn remaining(j: &JobRecord, o: &Observed) -> u64 {
    let done = o.progress.get(&j.id).map_or(0, |p| p.0);
    total_iterations(j).saturating_sub(done).max(1)
}

/// The table's step time of `j` on `gpus` GPUs of `family` (+∞ where it
/// cannot run).
fn step_s(lut: &Lut, j: &JobRecord, family: &str, gpus: usize) -> f64 {
    if !(1..=9).contains(&gpus) {
        return f64::INFINITY;
    }
    let layers = analytic::layers_of(&j.spec.model).unwrap_or(12);
    lut.iteration_time_on(
        &j.spec.model,
        family,
        &gpus.to_string(),
        j.spec.hyperparameters.global_batch_size.max(1),
        &Variant::of_spec(&j.spec),
        layers,
    )
    .ok()
    .filter(|it| it.feasible)
    .map_or(f64::INFINITY, |it| it.seconds)
}

/// A pending job as a request: its model's pool, its SLO (seconds to its
/// deadline; without one, its fastest cold start from now), and its
/// completion bound per GPU count (up to the GPUs of one node of a family
/// it may use) on the family it would run on. None when no such node has
/// its `min_gpus`.
fn request(
    lut: &Lut,
    j: &JobRecord,
    o: &Observed,
    pools: &Pools,
    now: DateTime<Utc>,
) -> Option<LaneRequest> {
    let r = &j.spec.resources;
    let families: BTreeSet<String> = pools.families.iter().cloned().collect();
    let unfit = super::inputs::unfit_families(lut, &families, j);
    let allowed: Vec<String> = pools
        .families
        .iter()
        .filter(|f| !unfit.contains(f))
        .filter(|f| {
            r.gpu_model
                .as_deref()
                .is_none_or(|g| analytic::gpu_family(g) == **f)
        })
        .cloned()
        .collect();
    let family = allowed.first().cloned().unwrap_or_default();
    let largest = pools
        .nodes
        .iter()
        .zip(&pools.node_gpus)
        .filter(|(n, _)| allowed.contains(&n.family))
        .map(|(_, &g)| g)
        .max()
        .unwrap_or(0);
    if (r.min_gpus.max(1) as usize) > largest {
        return None;
    }
    let most = (r.max_gpus.max(r.min_gpus).max(1) as usize).min(largest);
    let left = remaining(j, o) as f64;
    let bound_s: Vec<f64> = (1..=most)
        .map(|a| {
            if (a as u32) < r.min_gpus {
                f64::INFINITY
            } else {
                left * step_s(lut, j, &family, a) + WARM_START_S
            }
        })
        .collect();
    let model = pools
        .models
        .iter()
        .position(|m| m == &j.spec.model)
        .unwrap_or(usize::MAX);
    // Without a deadline a request must not finish later than starting it
    // cold now would: it waits for a warm GPU only when that is no slower.
    let cold_now = bound_s.iter().copied().fold(f64::INFINITY, f64::min)
        + pools.cold_start_s.get(model).copied().unwrap_or(0.0);
    let slo_s = j
        .spec
        .deadline
        .map_or(cold_now, |d| (d - now).num_milliseconds() as f64 / 1e3);
    Some(LaneRequest {
        request: Request {
            id: j.id.to_string(),
            model,
            slo_s,
            bound_s,
            gpus: r.min_gpus.max(1),
        },
        families: allowed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane pass that commits nothing gives the leader's memory back as
    /// it found it; one that commits keeps what it observed.
    #[test]
    fn a_pass_that_commits_nothing_leaves_the_leaders_memory_as_it_was() {
        let cell = std::sync::Mutex::new(BTreeMap::from([("gpu-a".to_string(), 1u32)]));
        {
            let _r = Restore::new(&cell);
            cell.lock().unwrap().insert("gpu-a".into(), 2);
            cell.lock().unwrap().insert("gpu-b".into(), 1);
        }
        assert_eq!(
            *cell.lock().unwrap(),
            BTreeMap::from([("gpu-a".to_string(), 1)])
        );
        let r = Restore::new(&cell);
        cell.lock().unwrap().insert("gpu-a".into(), 3);
        r.keep();
        assert_eq!(cell.lock().unwrap()["gpu-a"], 3);
    }
}
