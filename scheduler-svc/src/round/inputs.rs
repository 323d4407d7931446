//! Phase 2 of a round: load the inputs of the shared round.
//!
//! The one translation layer between the service's records (job rows, the
//! stored plan, the node registry, service accounting) and the dense view
//! `fmsched_core::round` decides on ([`build_view`], pure), then the
//! round's first phase (`prepare`), then every estimator call the round
//! needs — transfer gains of the eligible pairs and the time table — with
//! the in-process estimator as the logged and counted fallback
//! ([`estimate`]).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fmsched_core::policy::{GpuFootprint, MergeMode};
use fmsched_core::round::{
    self, ClusterView, Estimates as RoundEstimates, FinishedView, Gpu, JobView, MergeView,
    NodeView, PairEstimate, Prepared, RoundConfig, WarmEstimate,
};
use fmsched_core::{GpuUuid, JobId, NodeId, NodeState};
use fmsched_estimator::analytic;
use fmsched_estimator::lut::{Lut, Variant};
use fmsched_estimator::times::{self, PairInput};
use fmsched_estimator::transfer::TaskEmbedding;

use super::observe::{Observed, curve_from_json, embedding};
use super::{RoundError, expected_iterations, total_iterations};
use crate::estimates::{EstimatorClient, local_gains, local_times};
use crate::persistence::{
    Assignment, JobRecord, JobService, LoanState, MergeRecord, NodeCordon, NodeLoan, POOL_LABEL,
};
use crate::registry::LiveNode;
use crate::registry::node_family;
use crate::service::Service;

/// The view of a round and how its ordinals map back to ids.
#[derive(Clone, Debug, PartialEq)]
pub struct Translated {
    pub view: ClusterView,
    /// View job → its id.
    pub jobs: Vec<JobId>,
    /// View node → its id and its GPUs by index.
    pub nodes: Vec<(NodeId, Vec<GpuUuid>)>,
    /// View merge → its record.
    pub merges: Vec<MergeRecord>,
    /// View finished job (`ClusterView::finished`) → its id.
    pub finished: Vec<JobId>,
}

impl Translated {
    /// What each job's process is predicted to take of one GPU alone
    /// (jobs that may share a GPU only).
    pub fn footprints(&self) -> BTreeMap<JobId, GpuFootprint> {
        self.jobs
            .iter()
            .zip(&self.view.jobs)
            .filter_map(|(id, j)| j.footprint.map(|f| (*id, f)))
            .collect()
    }

    pub fn job_index(&self, id: &JobId) -> Option<usize> {
        self.jobs.binary_search(id).ok()
    }

    /// View GPUs as one part per node, in rank order: nodes by id (view
    /// nodes are), GPUs by index, each part with the global rank of its
    /// first GPU. The order depends only on the GPUs, so a job that keeps
    /// its GPUs keeps its rank layout, and a pipeline's stages run across
    /// its nodes in one fixed order. None when a GPU is unknown.
    pub fn parts(&self, gpus: &[Gpu]) -> Option<Vec<NodePart>> {
        let mut sorted = gpus.to_vec();
        sorted.sort_unstable();
        let mut parts: Vec<NodePart> = Vec::new();
        for (k, g) in sorted.iter().enumerate() {
            let uuid = self.nodes.get(g.0)?.1.get(g.1 as usize)?.clone();
            match parts.last_mut() {
                Some(p) if p.view_node == g.0 => p.gpus.push(uuid),
                _ => parts.push(NodePart {
                    view_node: g.0,
                    node: self.nodes[g.0].0.clone(),
                    gpus: vec![uuid],
                    rank_offset: k as u32,
                }),
            }
        }
        Some(parts)
    }
}

/// A group's GPUs on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePart {
    pub view_node: usize,
    pub node: NodeId,
    pub gpus: Vec<GpuUuid>,
    /// Global rank of the part's first GPU.
    pub rank_offset: u32,
}

/// What [`build_view`] reads.
pub struct ViewSources<'a> {
    pub nodes: &'a [LiveNode],
    pub live: &'a BTreeMap<JobId, JobRecord>,
    pub merges: &'a [MergeRecord],
    pub assignments: &'a [Assignment],
    pub progress: &'a BTreeMap<JobId, (u64, Option<String>)>,
    pub service: &'a BTreeMap<JobId, JobService>,
    /// Jobs that wait outside this round (retry backoff, split spatial
    /// pairs).
    pub held_back: &'a BTreeSet<JobId>,
    /// Running jobs the round leaves where they are (the prompt lane's:
    /// they run as non-preemptible jobs).
    pub pinned: &'a BTreeSet<JobId>,
    /// Nodes an admin cordoned or drained.
    pub cordons: &'a BTreeMap<NodeId, NodeCordon>,
    /// Inference nodes' loans (Lyra): such a node is in the round only
    /// while lent, and drained while it is reclaimed.
    pub loans: &'a BTreeMap<NodeId, NodeLoan>,
    /// Seconds a (re)start costs, per model.
    pub restart_s: &'a dyn Fn(&str) -> f64,
    /// What a job's process takes of one GPU alone (ICEFROG Eq. 8's
    /// inputs; None: it never shares a GPU).
    pub footprint: &'a dyn Fn(&JobRecord) -> Option<GpuFootprint>,
    /// The cluster's GPU families a job cannot run on at all
    /// (`JobView::unfit_families`).
    pub unfit: &'a dyn Fn(&JobRecord) -> Vec<String>,
    /// Completed jobs that left output weights, newest first
    /// ([`crate::persistence::Persistence::finished_outputs`]): the
    /// round's warm-start sources.
    pub finished: &'a [JobRecord],
    pub now: DateTime<Utc>,
}

/// Whether any GPU of the node reports Xid or uncorrectable ECC errors.
pub fn faulty(n: &LiveNode) -> bool {
    n.telemetry
        .values()
        .any(|t| t.xid_errors > 0 || t.ecc_uncorrected_errors > 0)
}

fn secs_since(t: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
    (t - now).num_milliseconds() as f64 / 1000.0
}

/// The service's records as the shared round's view (pure). Nodes by id,
/// GPUs by their index in the registration; live jobs by id, each holding
/// the GPUs of its assignment (B of a temporal merge whose A completed
/// holds A's: it continues on them, as fmsim models it); merges in force
/// between two live jobs. The view's clock starts at `now` (0 s).
pub fn build_view(s: &ViewSources<'_>) -> Translated {
    let mut gpu_at: BTreeMap<&str, Gpu> = BTreeMap::new();
    let mut nodes = Vec::with_capacity(s.nodes.len());
    let mut node_views = Vec::with_capacity(s.nodes.len());
    for (k, n) in s.nodes.iter().enumerate() {
        for (x, g) in n.record.gpus.iter().enumerate() {
            gpu_at.insert(g.uuid.0.as_str(), (k, x as u32));
        }
        node_views.push(node_view(n, s.cordons, s.loans));
        nodes.push((
            n.record.id.clone(),
            n.record.gpus.iter().map(|g| g.uuid.clone()).collect(),
        ));
    }
    // GPUs of an assignment, when every one is still where it was.
    let resolve = |a: &Assignment| -> Option<Vec<Gpu>> {
        a.gpus
            .iter()
            .map(|u| gpu_at.get(u.0.as_str()).copied())
            .collect::<Option<Vec<_>>>()
            .filter(|g| g.iter().all(|x| s.nodes[x.0].record.id == a.node))
    };
    // A job over several nodes holds the GPUs of all its parts.
    let mut held: BTreeMap<JobId, (Vec<Gpu>, bool)> = BTreeMap::new();
    for a in s.assignments {
        if let Some(g) = resolve(a) {
            let e = held.entry(a.job).or_insert((Vec::new(), a.profile));
            e.0.extend(g);
            e.0.sort_unstable();
        }
    }
    // B of a temporal merge whose A is done rides on on A's GPUs.
    for m in s
        .merges
        .iter()
        .filter(|m| m.active && m.mode == MergeMode::Temporal)
    {
        if !s.live.contains_key(&m.a)
            && s.live.contains_key(&m.b)
            && !held.contains_key(&m.b)
            && let Some((g, false)) = held.get(&m.a).cloned()
        {
            held.insert(m.b, (g, false));
        }
    }
    let ever_merged: BTreeSet<JobId> = s.merges.iter().flat_map(|m| [m.a, m.b]).collect();
    let jobs: Vec<JobId> = s.live.keys().copied().collect();
    let job_views = s
        .live
        .values()
        .map(|j| {
            let done = s.progress.get(&j.id).map_or(0, |p| p.0);
            let sv = s.service.get(&j.id).cloned().unwrap_or_default();
            let (holds, profiling_run) = held.get(&j.id).cloned().unwrap_or_default();
            let r = &j.spec.resources;
            JobView {
                id: j.id.to_string(),
                state: j.state,
                model: j.spec.model.clone(),
                task: j.spec.dataset.task.clone(),
                sharing: j.spec.may_merge(),
                pipeline: r.pipeline_parallel,
                expert_parallel: r.expert_parallel,
                worker_gpus: r.workers.map_or(0, |w| w.gpus_per_worker),
                gpu_model: r.gpu_model.as_deref().map(analytic::gpu_family),
                min_gpus: r.min_gpus,
                max_gpus: r.max_gpus,
                // A spec names a GPU range; the service asks for its top.
                // An elastic job asks for its base workers; the policy may
                // add flexible ones up to max_gpus.
                requested_gpus: r.base_gpus(),
                submitted_at: secs_since(j.created_at, s.now),
                iteration: done,
                progress: done as f64 / total_iterations(j).max(1) as f64,
                attained_gpu_s: sv.attained_gpu_s,
                executed_s: sv.executed_s,
                fair_share_gpu_s: sv.fair_share_gpu_s,
                lease_until: sv.lease_until.map_or(0.0, |t| secs_since(t, s.now)),
                restart_s: (s.restart_s)(&j.spec.model),
                holds,
                profiling_run,
                held_back: s.held_back.contains(&j.id),
                ever_merged: ever_merged.contains(&j.id),
                merge_setup: j.spec.merge_setup(),
                deadlines: j.spec.reward_steps(
                    secs_since(j.created_at, s.now),
                    j.spec.deadline.map(|d| secs_since(d, s.now)),
                ),
                queue: j.spec.queue.clone(),
                priority: j.spec.priority,
                preemptible: j.spec.preemptible && !s.pinned.contains(&j.id),
                footprint: (s.footprint)(j),
                unfit_families: (s.unfit)(j),
                skip_profiling: j.spec.skips_profiling(),
                // Filled in once the round's inputs are known
                // (`family_time_ratios`).
                family_time_ratio: Vec::new(),
            }
        })
        .collect();
    let index = |id: &JobId| jobs.binary_search(id).ok();
    let mut merges = Vec::new();
    let mut merge_views = Vec::new();
    for m in s.merges.iter().filter(|m| m.active) {
        if let (Some(a), Some(b)) = (index(&m.a), index(&m.b)) {
            merge_views.push(MergeView { a, b, mode: m.mode });
            merges.push(m.clone());
        }
    }
    let (finished_views, finished) = finished_views(s.finished);
    Translated {
        view: ClusterView {
            now: 0.0,
            nodes: node_views,
            jobs: job_views,
            merges: merge_views,
            finished: finished_views,
        },
        jobs,
        nodes,
        merges,
        finished,
    }
}

/// The warm-start sources of a round (`ClusterView::finished`): of each
/// model, task, training setup, pipeline layout and queue, the newest of
/// `finished` (newest first) whose user lets other jobs use its work and
/// that left output weights.
fn finished_views(finished: &[JobRecord]) -> (Vec<FinishedView>, Vec<JobId>) {
    let mut seen: BTreeSet<(String, String, String, bool, String)> = BTreeSet::new();
    let mut views = Vec::new();
    let mut ids = Vec::new();
    for j in finished.iter().filter(|j| {
        j.state == fmsched_core::JobState::Completed
            && j.spec.may_merge()
            && j.output_path.as_deref().is_some_and(|o| !o.is_empty())
    }) {
        let key = (
            j.spec.model.clone(),
            j.spec.dataset.task.clone(),
            j.spec.merge_setup(),
            j.spec.resources.pipeline_parallel,
            j.spec.queue.clone(),
        );
        if !seen.insert(key.clone()) {
            continue;
        }
        let (model, task, merge_setup, pipeline, queue) = key;
        views.push(FinishedView {
            id: j.id.to_string(),
            model,
            task,
            sharing: true,
            pipeline,
            merge_setup,
            queue,
        });
        ids.push(j.id);
    }
    (views, ids)
}

/// Everything the decide phase needs.
pub struct Inputs {
    pub t: Translated,
    pub prepared: Prepared,
    pub estimates: RoundEstimates,
    pub config: RoundConfig,
}

/// A node as the round sees it: an inference node not on loan is not the
/// round's to use (Offline); a faulty, drained or reclaimed one is drained.
pub(crate) fn node_view(
    n: &LiveNode,
    cordons: &BTreeMap<NodeId, NodeCordon>,
    loans: &BTreeMap<NodeId, NodeLoan>,
) -> NodeView {
    let inference = n
        .record
        .labels
        .get(POOL_LABEL)
        .is_some_and(|p| p == "inference");
    let loan = loans.get(&n.record.id).filter(|l| inference && l.lent());
    NodeView {
        id: n.record.id.as_str().to_string(),
        gpus: n.record.gpus.len() as u32,
        // An inference node not on loan is not the round's to use.
        state: if inference && loan.is_none() {
            NodeState::Offline
        } else {
            n.state
        },
        drained: faulty(n)
            || cordons.get(&n.record.id).is_some_and(|c| c.drain)
            || loan.is_some_and(|l| l.state == LoanState::Reclaiming),
        cordoned: cordons.contains_key(&n.record.id),
        // Its smallest GPU's memory (what a shared GPU must fit).
        gpu_memory_gib: n
            .record
            .gpus
            .iter()
            .map(|g| g.memory_total_bytes as f64 / f64::from(1u32 << 30))
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
            .unwrap_or(0.0),
        gpu_model: node_family(n),
        loaned: loan.is_some(),
    }
}

/// The families of `families` job `j` cannot run on at all: one replica
/// of its model does not fit there (`Lut::runs_on`).
pub(crate) fn unfit_families(lut: &Lut, families: &BTreeSet<String>, j: &JobRecord) -> Vec<String> {
    let r = &j.spec.resources;
    let replica = fmsched_core::policy::Replica::of(r.pipeline_parallel, r.expert_parallel);
    let variant = Variant::of_spec(&j.spec);
    let batch = j.spec.hyperparameters.global_batch_size;
    let layers = analytic::layers_of(&j.spec.model).unwrap_or(12);
    families
        .iter()
        .filter(|f| !lut.runs_on(&j.spec.model, f, replica.gpus(), batch, &variant, layers))
        .cloned()
        .collect()
}

/// The GPU family of restart costs (context-switch times), and of a job's
/// estimates when no node can hold it: the first node's that is not
/// Offline.
fn gpu_family(nodes: &[LiveNode]) -> String {
    nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && !n.record.gpus.is_empty())
        .map(node_family)
        .next()
        .unwrap_or_else(|| "V100".into())
}

/// The round's settings from the scheduler's configuration: a job spans at
/// most `scheduling.max_nodes_per_job` nodes (0: any number).
pub fn round_config(config: &crate::config::Config) -> RoundConfig {
    let s = &config.scheduling;
    RoundConfig {
        profiling: s.profiling,
        merging: s.merging,
        max_nodes_per_group: (s.max_nodes_per_job > 0).then_some(s.max_nodes_per_job as usize),
        placement_rule: Default::default(),
        policy: s.policy.clone(),
        profiling_share: s.profiling_share,
        // Validated at start-up.
        queues: s.queue_set().unwrap_or_default(),
    }
}

/// Completed jobs read per round as warm-start sources, newest first (of
/// each model, task, setup and queue the newest is offered).
const FINISHED_READ_LIMIT: i64 = 500;

/// Phase 2 (see the module docs): the view, the round's preparation and
/// its estimates. `None` when no time table could be had (the current plan
/// stays).
pub(crate) async fn load(
    state: &Service,
    lut: &Lut,
    est: &EstimatorClient,
    o: &Observed,
    policy: &(dyn fmsched_core::policy::Policy + Send + Sync),
    now: DateTime<Utc>,
) -> Result<Option<Inputs>, RoundError> {
    let family = gpu_family(&o.nodes);
    let sched = &state.config.scheduling;
    let checkpoint_s = sched.checkpoint_cost.as_secs_f64();
    let switch_s = sched.context_switch.map(|d| d.as_secs_f64());
    let restart_s = |model: &str| {
        round::restart_cost(
            checkpoint_s,
            switch_s.or_else(|| lut.context_switch_s(model, &family)),
        )
    };
    let (held_back, pinned) = held_back_and_pinned(state, o, now);
    let families: BTreeSet<String> = o.nodes.iter().map(node_family).collect();
    let finished = warm_start_sources(state, o, policy).await;
    let unfit_memo: std::cell::RefCell<BTreeMap<String, Vec<String>>> = Default::default();
    let mut t = build_view(&ViewSources {
        nodes: &o.nodes,
        live: &o.live,
        merges: &o.merges,
        assignments: &o.current.assignments,
        progress: &o.progress,
        service: &o.service,
        held_back: &held_back,
        pinned: &pinned,
        cordons: &o.admin.cordons,
        loans: &o.admin.loans,
        restart_s: &restart_s,
        footprint: &|j: &JobRecord| {
            let r = &j.spec.resources;
            let one_gpu = r.min_gpus <= 1
                && !r.pipeline_parallel
                && r.expert_parallel <= 1
                && !o.no_sharing.contains(&j.id);
            let on = r
                .gpu_model
                .as_deref()
                .map_or_else(|| family.clone(), fmsched_estimator::analytic::gpu_family);
            one_gpu
                .then(|| {
                    fmsched_estimator::footprint::one_gpu_footprint(
                        lut,
                        &j.spec.model,
                        &on,
                        &Variant::of_spec(&j.spec),
                        j.spec.hyperparameters.global_batch_size.max(1),
                        o.utilization_fits.get(&(j.spec.model.clone(), on.clone())),
                    )
                })
                .flatten()
        },
        unfit: &|j: &JobRecord| {
            let r = &j.spec.resources;
            let replica = fmsched_core::policy::Replica::of(r.pipeline_parallel, r.expert_parallel);
            let variant = Variant::of_spec(&j.spec);
            let batch = j.spec.hyperparameters.global_batch_size;
            // Jobs of one setup share the answer (one table look-up per
            // family and setup a round, not per job).
            let key = format!("{}|{batch}|{}|{variant:?}", j.spec.model, replica.gpus());
            let mut memo = unfit_memo.borrow_mut();
            memo.entry(key)
                .or_insert_with(|| unfit_families(lut, &families, j))
                .clone()
        },
        finished: &finished,
        now,
    });
    warn_faulty_nodes(&o.nodes);
    let config = live_round_config(state, o);
    let prepared = super::prepare_round(&t.view, policy, &config);
    let planned = planned_jobs(o, &t, &prepared, &family, policy.iteration_estimator());
    family_time_ratios(lut, &mut t.view, &prepared, &planned.inputs);
    let Some(estimates) = estimate(state, lut, est, o, &t, &prepared, planned).await else {
        return Ok(None);
    };
    Ok(Some(Inputs {
        t,
        prepared,
        estimates,
        config,
    }))
}

/// Jobs the round leaves where they are: held back (waiting out a retry's
/// backoff, a spatial pair split this round or re-queued by an admin, a
/// re-queued job, a prompt-lane job not yet running) and pinned (the
/// prompt lane's running jobs, which the round leaves running where the
/// lane put them).
fn held_back_and_pinned(
    state: &Service,
    o: &Observed,
    now: DateTime<Utc>,
) -> (BTreeSet<JobId>, BTreeSet<JobId>) {
    let mut held_back: BTreeSet<JobId> = o
        .retries
        .iter()
        .filter(|(_, r)| r.retry_after.is_some_and(|t| t > now))
        .map(|(j, _)| *j)
        .collect();
    // A spatial pair runs as one process: split this round, or one of its
    // jobs re-queued by an admin, both wait a round (the joint process
    // stops at its checkpoint). Holding back one of them alone left the
    // joint process running while the history said it was suspended.
    for m in o.merges.iter().filter(|m| {
        m.mode == MergeMode::Spatial
            && (o.split_now.contains(&m.id)
                || (m.active && [m.a, m.b].iter().any(|j| o.admin.requeues.contains_key(j))))
    }) {
        held_back.extend([m.a, m.b]);
    }
    held_back.extend(o.admin.requeues.keys().copied());
    // The prompt lane starts its jobs itself and the round leaves them
    // running where it put them.
    let lane: Vec<&JobRecord> = o
        .live
        .values()
        .filter(|j| state.in_prompt_lane(j))
        .collect();
    held_back.extend(
        lane.iter()
            .filter(|j| j.state != fmsched_core::JobState::Running)
            .map(|j| j.id),
    );
    let pinned: BTreeSet<JobId> = lane
        .iter()
        .filter(|j| j.state == fmsched_core::JobState::Running)
        .map(|j| j.id)
        .collect();
    (held_back, pinned)
}

/// Warm-start sources: completed jobs of the live jobs' models that left
/// output weights (a read error leaves the round without them).
async fn warm_start_sources(
    state: &Service,
    o: &Observed,
    policy: &(dyn fmsched_core::policy::Policy + Send + Sync),
) -> Vec<JobRecord> {
    if state.config.scheduling.merging && policy.warm_starts() {
        let mut models: Vec<String> = o.live.values().map(|j| j.spec.model.clone()).collect();
        models.sort_unstable();
        models.dedup();
        match state
            .persistence
            .finished_outputs(&models, FINISHED_READ_LIMIT)
            .await
        {
            Ok(f) => f,
            Err(err) => {
                tracing::warn!(error = %err, "finished jobs not read; no warm starts this round");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    }
}

/// Logs each node drained this round for GPUs reporting Xid or
/// uncorrectable ECC errors.
fn warn_faulty_nodes(nodes: &[LiveNode]) {
    for n in nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && faulty(n))
    {
        let bad: Vec<&str> = n
            .telemetry
            .values()
            .filter(|t| t.xid_errors > 0 || t.ecc_uncorrected_errors > 0)
            .map(|t| t.uuid.as_str())
            .collect();
        tracing::warn!(node_id = %n.record.id, gpus = ?bad, "draining node: GPUs report Xid or uncorrectable ECC errors");
    }
}

/// The round's configuration: the configured one, with the policy and
/// queues an admin set live.
fn live_round_config(state: &Service, o: &Observed) -> RoundConfig {
    let mut config = round_config(&state.config);
    if let Some(p) = &o.admin.policy {
        config.policy = p.policy.clone(); // set live through the admin API
    }
    if let Some(q) = &o.admin.queues {
        // Set live through the admin API (validated when set).
        match fmsched_core::queue::Queues::new(q.queues.clone()) {
            Ok(queues) => config.queues = queues,
            Err(e) => tracing::error!(error = %e,
                "the queues set through the admin API are not valid; using the configured ones"),
        }
    }
    config
}

/// The estimates of a prepared round: each snapshot job's remaining time
/// (iterations from its target or its Eq. 2 estimate, transferred when it
/// is merged), kept merges' times, and for the eligible pairs of profiled
/// jobs the transfer gains (Ymir §4.1: score → regression → `G`, Eq. 1) —
/// only pairs the estimator classifies as positive transfer (Table 2's
/// `G ≥ 0`) are estimated and offered. The estimator service answers, or
/// the same code in-process (logged and counted).
async fn estimate(
    state: &Service,
    lut: &Lut,
    est: &EstimatorClient,
    o: &Observed,
    t: &Translated,
    prepared: &Prepared,
    planned: Planned,
) -> Option<RoundEstimates> {
    let Planned {
        mut inputs,
        spread,
        kept_b_alone,
    } = planned;
    // B alone of each kept temporal merge: rows after the jobs' own, in
    // the kept merges' order.
    let jobs = inputs.len();
    let has_alone: Vec<bool> = kept_b_alone.iter().map(Option::is_some).collect();
    inputs.extend(kept_b_alone.into_iter().flatten());
    let row = rows_by_job(prepared);
    let time_mode = |m: MergeMode| match m {
        MergeMode::Spatial => times::MergeMode::Spatial,
        _ => times::MergeMode::Temporal,
    };
    let mut pairs: Vec<PairInput> = prepared
        .kept
        .iter()
        .map(|&m| {
            let (mv, rec) = (&t.view.merges[m], &t.merges[m]);
            PairInput {
                a: row[&mv.a],
                b: row[&mv.b],
                mode: time_mode(mv.mode),
                gain_ab: rec.gain_ab,
                gain_ba: rec.gain_ba,
            }
        })
        .collect();
    let (candidates, warm) = candidate_gains(state, est, o, t, prepared).await;
    for (pair, gab, gba) in &candidates {
        pairs.push(PairInput {
            a: row[&pair.a],
            b: row[&pair.b],
            mode: time_mode(pair.mode),
            gain_ab: *gab,
            gain_ba: *gba,
        });
    }
    // A warm start is B of a temporal pair whose A is done: a row of no
    // remaining work stands for A (B's own inputs, nothing left), so the
    // pair's merged part is B's time from A's weights, `T_{A↦B}`.
    for (key, g) in &warm {
        let b = row[&key.job];
        let mut done_a = inputs[b].clone();
        done_a.id = format!("{}-from-{}", done_a.id, t.finished[key.from]);
        done_a.remaining_iterations = 0;
        inputs.push(done_a);
        pairs.push(PairInput {
            a: inputs.len() - 1,
            b,
            mode: times::MergeMode::Temporal,
            gain_ab: *g,
            gain_ba: 0.0,
        });
    }
    let remote = if est.is_remote() && !inputs.is_empty() {
        match est.times(&inputs, &pairs, &prepared.allocations).await {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "estimator service failed; time table from the in-process estimator");
                state.metrics.update(|m| m.estimator_fallbacks += 1);
                None
            }
        }
    } else {
        None
    };
    let table = match remote.map_or_else(
        || local_times(lut, &inputs, &pairs, &prepared.allocations),
        Ok,
    ) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "time estimates failed; keeping the current plan");
            return None;
        }
    };
    let kept = prepared.kept.len();
    let mut rows = table.jobs;
    let mut alone_rows = rows.split_off(jobs.min(rows.len())).into_iter();
    Some(RoundEstimates {
        jobs: rows,
        kept: table.pairs[..kept]
            .iter()
            .map(|p| p.seconds.clone())
            .collect(),
        candidates: table.pairs[kept..kept + candidates.len()]
            .iter()
            .zip(&candidates)
            .map(|(pt, (pair, gab, gba))| PairEstimate {
                pair: *pair,
                seconds: pt.seconds.clone(),
                tran_wt: pt.tran_wt.clone(),
                gain_ab: *gab,
                gain_ba: *gba,
            })
            .collect(),
        warm: table.pairs[kept + candidates.len()..]
            .iter()
            .zip(&warm)
            .map(|(pt, (key, g))| WarmEstimate {
                key: *key,
                seconds: pt.seconds.clone(),
                gain: *g,
            })
            .collect(),
        spread,
        kept_b_alone: has_alone
            .iter()
            .map(|&has| has.then(|| alone_rows.next()).flatten().unwrap_or_default())
            .collect(),
    })
}

/// What the time table is asked of a prepared round's jobs.
struct Planned {
    /// Each snapshot job's inputs ([`job_inputs`]).
    inputs: Vec<times::JobInput>,
    /// How sure each one's estimate is (a metric target's p10-p90 spread;
    /// none for a job planned at its budget).
    spread: Vec<f64>,
    /// Per kept merge: B of a temporal merge as it would train alone, from
    /// scratch (`Estimates::kept_b_alone`); none for a spatial one.
    kept_b_alone: Vec<Option<times::JobInput>>,
}

/// The time table's inputs of a prepared round ([`Planned`]).
fn planned_jobs(
    o: &Observed,
    t: &Translated,
    prepared: &Prepared,
    family: &str,
    estimator: bool,
) -> Planned {
    let spread = prepared
        .jobs
        .iter()
        .map(|&v| {
            let id = t.jobs[v];
            match o.estimates.get(&id) {
                Some(e) if !super::planned_at_budget(&o.live[&id], estimator) => e.spread,
                _ => 0.0,
            }
        })
        .collect();
    let inputs = job_inputs(o, t, prepared, family, estimator);
    let row = rows_by_job(prepared);
    let kept_b_alone = prepared
        .kept
        .iter()
        .map(|&m| {
            let mv = &t.view.merges[m];
            if mv.mode != MergeMode::Temporal {
                return None;
            }
            let &k = row.get(&mv.b)?;
            let id = t.jobs[mv.b];
            let mut input = inputs[k].clone();
            input.id = format!("{id} alone");
            input.remaining_iterations = remaining_alone(o, id, estimator);
            Some(input)
        })
        .collect();
    Planned {
        inputs,
        spread,
        kept_b_alone,
    }
}

/// Each snapshot job's row of the time table's inputs (the order of
/// `prepared.jobs`), by its index in the view.
fn rows_by_job(prepared: &Prepared) -> BTreeMap<usize, usize> {
    prepared
        .jobs
        .iter()
        .enumerate()
        .map(|(k, &v)| (v, k))
        .collect()
}

/// Job `id`'s iterations left were it to train alone: its target or its
/// Eq. 2 estimate, less what it did.
fn remaining_alone(o: &Observed, id: JobId, estimator: bool) -> u64 {
    let done = o.progress.get(&id).map_or(0, |p| p.0);
    expected_iterations(&o.live[&id], o.estimates.get(&id), estimator)
        .saturating_sub(done)
        .max(1)
}

/// [`round::family_time_ratios`] of the snapshot's jobs, from the
/// throughput table their estimates come from (`JobView::family_time_ratio`,
/// for placement's move to a faster family).
fn family_time_ratios(
    lut: &Lut,
    view: &mut round::ClusterView,
    prepared: &Prepared,
    inputs: &[times::JobInput],
) {
    let input: BTreeMap<usize, &times::JobInput> =
        prepared.jobs.iter().copied().zip(inputs).collect();
    let seconds = |v: usize, family: &str, gpus: u32, per_node: u32| {
        let Some(input) = input.get(&v) else {
            return Ok::<_, std::convert::Infallible>(None);
        };
        Ok(lut
            .iteration_time(
                &input.model,
                family,
                gpus,
                per_node,
                input.global_batch,
                &input.variant,
                input.layers,
            )
            .ok()
            .filter(|it| it.feasible)
            .map(|it| it.seconds))
    };
    let Ok(()) = round::family_time_ratios(view, seconds);
}

/// What the time table needs of each snapshot job: its remaining
/// iterations (its target or its Eq. 2 estimate, less what it did;
/// transferred when it is merged — B of a temporal merge from A, each job
/// of a spatial merge from the other, Eq. 2 with `L/(1+G)`), its model,
/// batch and variant, on the GPUs it would run on ([`round::estimate_shape`]).
/// `estimator`: the policy plans metric-target jobs on predicted iterations
/// (else at their budget; [`super::expected_iterations`]).
fn job_inputs(
    o: &Observed,
    t: &Translated,
    prepared: &Prepared,
    family: &str,
    estimator: bool,
) -> Vec<times::JobInput> {
    let mut gain_for: BTreeMap<JobId, (f64, MergeMode)> = BTreeMap::new();
    for m in o.merges.iter().filter(|m| m.active) {
        // B of a temporal merge that has trained from A's weights showed
        // its gain (measured on its loss against its own curve): its
        // remaining time is planned on that, not on the prediction that
        // made the merge (a harmful transfer would otherwise stay planned
        // as a help). A spatial pair's measured gain is the mean of its
        // two jobs' and leaves each one's prediction in place.
        let gain_b = match (m.mode, m.observed_gain) {
            (MergeMode::Temporal, Some(g)) if g.is_finite() => g,
            _ => m.gain_ab,
        };
        gain_for.insert(m.b, (gain_b, m.mode));
        if m.mode == MergeMode::Spatial {
            gain_for.insert(m.a, (m.gain_ba, m.mode));
        }
    }
    prepared
        .jobs
        .iter()
        .map(|&v| {
            let id = t.jobs[v];
            let j = &o.live[&id];
            let done = o.progress.get(&id).map_or(0, |p| p.0);
            let e = o.estimates.get(&id);
            // A layer-elastic job with a reported variance is tuned per
            // allocation by the table (ICEFROG Eq. 16) from its own floor;
            // else it trains at the frozen layers the tuner last picked.
            let layers = analytic::layers_of(&j.spec.model).unwrap_or(12);
            let layer_tuning = j.spec.layer_elasticity.and_then(|el| {
                o.layer_variance.get(&id).map(|v| times::LayerTuning {
                    variance: v.clone(),
                    max_frozen: el
                        .max_frozen_layers
                        .min(layers)
                        .max(j.spec.frozen_count().min(layers)),
                })
            });
            let frozen_layers = if layer_tuning.is_some() {
                j.spec.frozen_count().min(layers)
            } else {
                o.frozen_layers
                    .get(&id)
                    .copied()
                    .unwrap_or(j.spec.frozen_count())
            };
            // The GPUs it would run on (one rule with fmsim's).
            let (fam, per_node) = round::estimate_shape(&t.view, &t.view.jobs[v])
                .unwrap_or_else(|| (family.to_string(), 4));
            let mut input =
                times::JobInput {
                    id: id.to_string(),
                    model: j.spec.model.clone(),
                    gpu_type: fam,
                    gpus_per_node: per_node.clamp(1, 9),
                    global_batch: j.spec.hyperparameters.global_batch_size.max(1),
                    variant: Variant {
                        frozen_layers,
                        ..Variant::of_spec(&j.spec)
                    },
                    layers,
                    layer_tuning,

                    remaining_iterations: remaining_alone(o, id, estimator),
                    done_iterations: done,
                    curve: e.and_then(|e| e.curve.as_ref()).and_then(curve_from_json),
                    max_iterations: total_iterations(j),
                    samples_per_epoch: j.spec.dataset.num_samples.unwrap_or(
                        u64::from(j.spec.hyperparameters.global_batch_size.max(1)) * 100,
                    ),
                };
            if let Some(&(g, mode)) = gain_for.get(&id) {
                input.remaining_iterations = match mode {
                    MergeMode::Temporal => times::iterations_from_weights(&input, g),
                    _ => times::transferred_iterations(&input, g),
                }
                .max(1);
            }
            input
        })
        .collect()
}

/// The eligible pairs of profiled jobs (both have Task2Vec embeddings) that
/// the estimator classifies as positive transfer, with their gains
/// `(G_{A,B}, G_{B,A})` (a temporal pair's B gains; a spatial pair's both);
/// and the warm starts of the round (`Prepared::warm`) whose finished job
/// and job both have embeddings and whose temporal gain `G_{A,B}` is
/// positive transfer, with that gain.
async fn candidate_gains(
    state: &Service,
    est: &EstimatorClient,
    o: &Observed,
    t: &Translated,
    prepared: &Prepared,
) -> (Vec<(round::PairKey, f64, f64)>, Vec<(round::WarmKey, f64)>) {
    if prepared.eligible.is_empty() && prepared.warm.is_empty() {
        return (Vec::new(), Vec::new());
    }
    // Everyone a gain is asked for: view jobs, then finished jobs.
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Who {
        Job(usize),
        Done(usize),
    }
    let wanted: BTreeSet<Who> = prepared
        .eligible
        .iter()
        .flat_map(|p| [Who::Job(p.a), Who::Job(p.b)])
        .chain(
            prepared
                .warm
                .iter()
                .flat_map(|w| [Who::Job(w.job), Who::Done(w.from)]),
        )
        .collect();
    let id_of = |w: Who| match w {
        Who::Job(v) => t.jobs[v],
        Who::Done(f) => t.finished[f],
    };
    let mut named: Vec<(String, TaskEmbedding)> = Vec::new();
    let mut at: BTreeMap<Who, usize> = BTreeMap::new();
    for w in wanted {
        let id = id_of(w);
        if let Some(e) = o.estimates.get(&id).and_then(embedding) {
            at.insert(w, named.len());
            named.push((id.to_string(), e));
        }
    }
    let gains = match est.gains(&named).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(error = %e, "estimator service failed; transfer gains from the in-process estimator");
            state.metrics.update(|m| m.estimator_fallbacks += 1);
            local_gains(&named)
        }
    };
    let g = |m: &BTreeMap<(usize, usize), f64>, a, b| {
        m.get(&(a, b)).copied().unwrap_or(f64::NEG_INFINITY)
    };
    let mut out = Vec::new();
    for p in &prepared.eligible {
        let (Some(&x), Some(&y)) = (at.get(&Who::Job(p.a)), at.get(&Who::Job(p.b))) else {
            continue; // not profiled: no transfer estimate
        };
        let (gab, gba) = match p.mode {
            MergeMode::Spatial => {
                let s = g(&gains.spatial, x.min(y), x.max(y));
                (s, s)
            }
            _ => (g(&gains.temporal, x, y), 0.0),
        };
        // Only positive transfer (Ymir Table 2's G ≥ 0 class): a joint job
        // can out-run two separate ones on throughput alone, but a merge is
        // for transfer, and negative transfer costs accuracy.
        if gab >= 0.0 && gba >= 0.0 {
            out.push((*p, gab, gba));
        }
    }
    let mut warm = Vec::new();
    for w in &prepared.warm {
        let (Some(&x), Some(&y)) = (at.get(&Who::Done(w.from)), at.get(&Who::Job(w.job))) else {
            continue;
        };
        // The same class rule: a start from weights that transfer
        // negatively is no start, whatever its time.
        let gab = g(&gains.temporal, x, y);
        if gab >= 0.0 {
            warm.push((*w, gab));
        }
    }
    (out, warm)
}

#[cfg(test)]
pub(crate) mod tests;
