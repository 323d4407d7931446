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
use crate::estimates::{Estimates, local_gains, local_times};
use crate::persistence::{
    Assignment, JobRecord, JobService, LoanState, MergeRecord, NodeCordon, NodeLoan, POOL_LABEL,
};
use crate::registry::LiveNode;
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

/// A node's GPU family (its first GPU's; a node reports one model).
pub(crate) fn node_family(n: &LiveNode) -> String {
    n.record
        .gpus
        .first()
        .map(|g| analytic::gpu_family(&g.model))
        .unwrap_or_default()
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
    est: &Estimates,
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
        .filter(|j| super::prompt_lane::in_lane(state, j))
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
    let families: BTreeSet<String> = o.nodes.iter().map(node_family).collect();
    // Warm-start sources: completed jobs of the live jobs' models that left
    // output weights (a read error leaves the round without them).
    let finished = if state.config.scheduling.merging && policy.warm_starts() {
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
    };
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
                    fmsched_estimator::icefrog::one_gpu_footprint(
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
    for n in o
        .nodes
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
    est: &Estimates,
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
    est: &Estimates,
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
pub(crate) mod tests {
    use super::*;
    use crate::persistence::{GpuRecord, NodeRecord};
    use fmsched_core::JobState;

    fn job(n: u8) -> JobId {
        format!("01a20000-0000-7000-8000-0000000000{n:02}")
            .parse()
            .unwrap()
    }

    fn record(n: u8, state: JobState) -> JobRecord {
        let spec = serde_json::json!({
            "model": "roberta-base",
            "dataset": { "uri": "file:///d", "task": format!("t{n}") },
            "hyperparameters": { "global_batch_size": 32, "learning_rate": 2e-5 },
            "target": { "max_iterations": 1000 },
            "resources": { "min_gpus": 1, "max_gpus": 2 },
            "launch": { "command": ["train"] }
        });
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        JobRecord {
            id: job(n),
            owner: fmsched_core::UserName("u".into()),
            spec: serde_json::from_value(spec).unwrap(),
            idempotency_key: None,
            state,
            state_reason: String::new(),
            output_path: None,
            created_at: now - chrono::Duration::seconds(i64::from(n)),
            updated_at: now,
            last_event_seq: 0,
        }
    }

    /// Warm-start sources (`ClusterView::finished`): completed jobs that
    /// left output weights and share, the newest of each model, task,
    /// setup and queue; the translation maps each back to its job.
    #[test]
    fn tail_the_view_lists_the_newest_finished_job_of_each_task_as_a_warm_start_source() {
        let done = |n: u8, task: &str| {
            let mut r = record(n, JobState::Completed);
            r.spec.dataset.task = task.into();
            r.output_path = Some(format!("/out/{n}"));
            r
        };
        let mut private = done(5, "mrpc");
        private.spec.sharing = false;
        let mut no_output = done(6, "sst2");
        no_output.output_path = Some(String::new());
        let mut failed = done(7, "cola");
        failed.state = JobState::Failed;
        let mut other_queue = done(8, "rte");
        other_queue.spec.queue = "research".into();
        // Newest first, as `finished_outputs` reads them.
        let finished = vec![
            done(1, "rte"),
            done(2, "rte"),
            done(3, "qnli"),
            private,
            no_output,
            failed,
            other_queue,
        ];
        let live: BTreeMap<JobId, JobRecord> = [(job(9), record(9, JobState::Queued))].into();
        let t = build_view(&ViewSources {
            nodes: &[node("x", 4)],
            live: &live,
            merges: &[],
            assignments: &[],
            progress: &BTreeMap::new(),
            service: &BTreeMap::new(),
            held_back: &BTreeSet::new(),
            pinned: &BTreeSet::new(),
            cordons: &BTreeMap::new(),
            loans: &BTreeMap::new(),
            restart_s: &|_| 0.0,
            footprint: &|_| None,
            unfit: &|_| Vec::new(),
            finished: &finished,
            now: Utc::now(),
        });
        assert_eq!(t.finished, vec![job(1), job(3), job(8)]);
        let tasks: Vec<(&str, &str)> = t
            .view
            .finished
            .iter()
            .map(|f| (f.task.as_str(), f.queue.as_str()))
            .collect();
        assert_eq!(tasks, vec![("rte", ""), ("qnli", ""), ("rte", "research")]);
        assert!(
            t.view
                .finished
                .iter()
                .all(|f| f.sharing && f.model == "roberta-base")
        );
    }

    /// The view of `live` jobs and `merges` on `nodes`, nothing placed,
    /// held back or cordoned, restarts free.
    fn plain_view(
        nodes: &[LiveNode],
        live: &BTreeMap<JobId, JobRecord>,
        merges: &[MergeRecord],
        now: DateTime<Utc>,
    ) -> Translated {
        build_view(&ViewSources {
            nodes,
            live,
            merges,
            assignments: &[],
            progress: &BTreeMap::new(),
            service: &BTreeMap::new(),
            held_back: &BTreeSet::new(),
            pinned: &BTreeSet::new(),
            cordons: &BTreeMap::new(),
            loans: &BTreeMap::new(),
            restart_s: &|_| 0.0,
            footprint: &|_| None,
            unfit: &|_| Vec::new(),
            finished: &[],
            now,
        })
    }

    pub(crate) fn node(id: &str, gpus: u32) -> LiveNode {
        let now = Utc::now();
        let record = NodeRecord {
            id: NodeId::try_from(id.to_string()).unwrap(),
            hostname: id.into(),
            address: String::new(),
            agent_version: "t".into(),
            gpu_backend: "fake".into(),
            labels: Default::default(),
            state: NodeState::Available,
            registered_at: now,
            last_heartbeat_at: now,
            gpus: (0..gpus)
                .map(|i| GpuRecord {
                    uuid: GpuUuid(format!("{id}-G{i}")),
                    index: i,
                    model: "A100-80GB".into(),
                    memory_total_bytes: 80 << 30,
                    pci_bus_id: String::new(),
                })
                .collect(),
        };
        crate::registry::NodeRegistry::load(vec![record], now)
            .snapshot()
            .remove(0)
    }

    /// A metric-target job is planned at its predicted iterations within
    /// its budget, whichever field names the budget; at its budget under a
    /// policy without an iteration estimator (Chronus as published). A job
    /// without a metric target runs its iteration budget, or its Eq. 2
    /// estimate when it names none. Before, a metric target with
    /// `max_iterations` was planned at the budget under every policy: the
    /// metric prediction was stored and not used.
    #[test]
    fn estimate_prior_metric_targets_are_planned_at_their_prediction_within_budget() {
        use super::super::expected_iterations;
        let predicted = |k: u64| crate::persistence::Estimate {
            iterations: Some(k),
            ..Default::default()
        };
        let mut j = record(1, JobState::Queued);
        // Iteration-based: the budget, whatever the loss curve says.
        assert_eq!(expected_iterations(&j, Some(&predicted(400)), true), 1000);
        assert_eq!(expected_iterations(&j, None, true), 1000);
        // A metric target with max_iterations: the prediction.
        j.spec.target.metric = Some(
            serde_json::from_value(serde_json::json!(
                { "name": "accuracy", "value": 0.8 }
            ))
            .unwrap(),
        );
        assert_eq!(expected_iterations(&j, Some(&predicted(400)), true), 400);
        assert_eq!(expected_iterations(&j, Some(&predicted(4000)), true), 1000);
        assert_eq!(expected_iterations(&j, None, true), 1000);
        // Without the iteration estimator: the budget.
        assert_eq!(expected_iterations(&j, Some(&predicted(400)), false), 1000);
        // A budget in epochs: 3 epochs of 3,200 samples at batch 32.
        j.spec.target.max_iterations = None;
        j.spec.target.max_epochs = Some(3);
        j.spec.dataset.num_samples = Some(3200);
        assert_eq!(expected_iterations(&j, Some(&predicted(120)), true), 120);
        assert_eq!(expected_iterations(&j, Some(&predicted(120)), false), 300);
        // No metric, no iteration budget: the loss curve's Eq. 2 estimate,
        // whatever the policy (a loss plateau is the job's own stop).
        j.spec.target.metric = None;
        assert_eq!(expected_iterations(&j, Some(&predicted(120)), false), 120);
    }

    /// The translation layer: GPUs by index, holds from the stored plan
    /// (profiling marked), an assignment whose GPU left its node holds
    /// nothing, B of a temporal merge whose A completed rides on A's GPUs,
    /// and the clock starts at the round.
    #[test]
    fn the_view_of_the_services_records() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let nodes = vec![node("a", 4), node("b", 2)];
        let live: BTreeMap<JobId, JobRecord> = [
            record(1, JobState::Running),
            record(2, JobState::Profiling),
            record(3, JobState::Running),
            record(5, JobState::Queued),
            record(6, JobState::Running),
        ]
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
        let at = |job: JobId, node: &str, gpus: &[&str], profile: bool| Assignment {
            job,
            node: NodeId::try_from(node.to_string()).unwrap(),
            gpus: gpus.iter().map(|g| GpuUuid(g.to_string())).collect(),
            profile,
            rank_offset: 0,
            master_port: None,
        };
        let assignments = vec![
            at(job(1), "a", &["a-G2", "a-G3"], false),
            at(job(2), "b", &["b-G1"], true),
            at(job(3), "b", &["gone-G0"], false), // its GPU is not there
            at(job(4), "a", &["a-G0"], false),    // A, completed
            // A gang: one part per node.
            at(job(6), "a", &["a-G1"], false),
            at(job(6), "b", &["b-G0"], false),
        ];
        let merges = vec![MergeRecord {
            id: 1,
            a: job(4),
            b: job(5),
            mode: MergeMode::Temporal,
            gain_ab: 0.2,
            gain_ba: 0.0,
            active: true,
            guard_passed: true,
            observed_gain: None,
        }];
        let progress: BTreeMap<JobId, (u64, Option<String>)> =
            [(job(1), (250, None))].into_iter().collect();
        let t = build_view(&ViewSources {
            nodes: &nodes,
            live: &live,
            merges: &merges,
            assignments: &assignments,
            progress: &progress,
            service: &BTreeMap::new(),
            held_back: &[job(3)].into_iter().collect(),
            pinned: &BTreeSet::new(),
            cordons: &BTreeMap::new(),
            loans: &BTreeMap::new(),
            restart_s: &|_| 42.0,
            footprint: &|_| None,
            unfit: &|_| Vec::new(),
            finished: &[],
            now,
        });
        let v = &t.view;
        assert_eq!(v.nodes.len(), 2);
        assert_eq!(t.jobs, vec![job(1), job(2), job(3), job(5), job(6)]);
        assert_eq!(
            v.jobs[4].holds,
            vec![(0, 1), (1, 0)],
            "a gang holds every part"
        );
        assert_eq!(v.jobs[0].holds, vec![(0, 2), (0, 3)]);
        assert_eq!(v.jobs[0].progress, 0.25);
        assert_eq!(v.jobs[0].submitted_at, -1.0);
        assert_eq!(v.jobs[0].restart_s, 42.0);
        assert_eq!(
            (v.jobs[1].holds.clone(), v.jobs[1].profiling_run),
            (vec![(1, 1)], true)
        );
        assert!(v.jobs[2].holds.is_empty() && v.jobs[2].held_back);
        assert_eq!(v.jobs[3].holds, vec![(0, 0)], "B rides on A's GPUs");
        assert!(v.jobs[3].ever_merged);
        assert!(
            v.merges.is_empty(),
            "A is no longer live: no merge in force"
        );
        // Parts in rank order whatever order the GPUs come in: nodes by id.
        let parts = t.parts(&[(1, 1), (0, 2), (1, 0), (0, 3)]).unwrap();
        let got: Vec<(&str, Vec<&str>, u32)> = parts
            .iter()
            .map(|p| {
                (
                    p.node.as_str(),
                    p.gpus.iter().map(|g| g.0.as_str()).collect(),
                    p.rank_offset,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", vec!["a-G2", "a-G3"], 0),
                ("b", vec!["b-G0", "b-G1"], 2)
            ]
        );
        assert!(t.parts(&[(0, 9)]).is_none(), "an unknown GPU");
    }

    /// ICEFROG Eq. 16 live: a layer-elastic job whose trainer reported its
    /// gradient variance goes to the time table with its tuner inputs, from
    /// its own floor, and its row there is its time at the best frozen
    /// layers per allocation (faster than training every layer when its
    /// early layers have settled); one without a report trains at the
    /// frozen layers the tuner last picked; a plain job has neither.
    /// On a cluster of two families, a job that trains alone learns its
    /// time on the other family relative to where it runs, from the
    /// throughput table (what placement's move to a faster family reads);
    /// a queued job learns its time on the other family at its smallest
    /// allocation (1 GPU) relative to the family its times are estimated on
    /// (the one with the most GPUs, H100: what placement's choice of family
    /// reads); a job pinned to its family learns nothing.
    #[test]
    fn a_running_job_learns_its_time_on_the_other_family() {
        use fmsched_core::round::testkit;
        let mut v100 = testkit::node("v", 4);
        v100.gpu_model = "V100".into();
        let mut h100 = testkit::node("h", 8);
        h100.gpu_model = "H100".into();
        let running = |id: &str, gpus: u32| {
            let mut j = testkit::job(id, id, JobState::Running, gpus);
            j.holds = (0..gpus).map(|g| (0, g)).collect();
            j
        };
        let mut pinned = running("pinned", 1);
        pinned.holds = vec![(0, 3)];
        pinned.gpu_model = Some("V100".into());
        let mut view = testkit::view(
            vec![v100, h100],
            vec![
                running("alone", 2),
                testkit::job("queued", "q", JobState::Queued, 2),
                pinned,
            ],
        );
        let policy = fmsched_core::policy::baselines::by_name("srtf").unwrap();
        let prepared = fmsched_core::round::prepare(
            &view,
            policy.as_ref(),
            &RoundConfig {
                profiling: false,
                ..Default::default()
            },
        );
        let input = |id: &str| times::JobInput {
            id: id.into(),
            model: "roberta-base".into(),
            gpu_type: "V100".into(),
            gpus_per_node: 4,
            global_batch: 32,
            variant: Variant::default(),
            layers: 12,
            remaining_iterations: 1000,
            done_iterations: 0,
            curve: None,
            max_iterations: 1000,
            samples_per_epoch: 3200,
            layer_tuning: None,
        };
        let inputs: Vec<times::JobInput> = prepared
            .jobs
            .iter()
            .map(|&v| input(&view.jobs[v].id))
            .collect();
        let lut = analytic::default_lut().unwrap();
        family_time_ratios(&lut, &mut view, &prepared, &inputs);
        let seconds = |family: &str, gpus: u32, per_node: u32| {
            lut.iteration_time(
                "roberta-base",
                family,
                gpus,
                per_node,
                32,
                &Variant::default(),
                12,
            )
            .unwrap()
            .seconds
        };
        let ratio = seconds("H100", 2, 8) / seconds("V100", 2, 4);
        assert!(ratio < 1.0, "H100 is faster: {ratio}");
        assert_eq!(
            view.jobs[0].family_time_ratio,
            vec![("H100".to_string(), ratio)]
        );
        let queued = seconds("V100", 1, 4) / seconds("H100", 1, 8);
        assert!(queued > 1.0, "V100 is slower: {queued}");
        assert_eq!(
            view.jobs[1].family_time_ratio,
            vec![("V100".to_string(), queued)],
            "queued"
        );
        assert!(view.jobs[2].family_time_ratio.is_empty(), "pinned");
    }

    /// An active merge of jobs `a` and `b` at predicted gain `g` both ways,
    /// not guarded or measured yet.
    fn active_merge(id: i64, (a, b): (u8, u8), mode: MergeMode, g: f64) -> MergeRecord {
        MergeRecord {
            id,
            a: job(a),
            b: job(b),
            mode,
            gain_ab: g,
            gain_ba: g,
            active: true,
            guard_passed: false,
            observed_gain: None,
        }
    }

    /// B of a kept temporal merge is planned from A's weights (1,000
    /// iterations at `G` = 0.5: 667), and also asked of the time table as
    /// it would train alone, from scratch (1,000), for the round's test of
    /// whether it would finish sooner so (`Estimates::kept_b_alone`). A
    /// spatial merge has no such row.
    #[test]
    fn tail_a_kept_temporal_merges_b_is_also_planned_alone_from_scratch() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let live: BTreeMap<JobId, JobRecord> = [
            record(1, JobState::Queued),
            record(2, JobState::Queued),
            record(3, JobState::Queued),
            record(4, JobState::Queued),
        ]
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
        let merges = vec![
            active_merge(1, (1, 2), MergeMode::Temporal, 0.5),
            active_merge(2, (3, 4), MergeMode::Spatial, 0.5),
        ];
        let o = Observed {
            live: live.clone(),
            merges: merges.clone(),
            ..Default::default()
        };
        let nodes = vec![node("a", 4)];
        let t = plain_view(&nodes, &live, &merges, now);
        let policy = fmsched_core::policy::baselines::by_name("ymir").unwrap();
        let prepared =
            fmsched_core::round::prepare(&t.view, policy.as_ref(), &RoundConfig::default());
        assert_eq!(prepared.kept.len(), 2);
        let planned = planned_jobs(&o, &t, &prepared, "A100", true);
        let b = planned
            .inputs
            .iter()
            .find(|i| i.id == job(2).to_string())
            .unwrap();
        assert_eq!(b.remaining_iterations, 667, "from A's weights");
        let alone: Vec<Option<u64>> = planned
            .kept_b_alone
            .iter()
            .map(|i| i.as_ref().map(|i| i.remaining_iterations))
            .collect();
        let temporal = prepared
            .kept
            .iter()
            .position(|&m| t.view.merges[m].mode == MergeMode::Temporal)
            .unwrap();
        assert_eq!(alone[temporal], Some(1000));
        assert_eq!(alone[1 - temporal], None, "spatial");
    }

    /// B of a warm start (A completed) plans its remaining time on the gain
    /// it showed once measured, not on the prediction that started it: 400
    /// of its 1,000 iterations done, predicted `G` = 0.5 (600 / 1.5 = 400
    /// left), measured −0.25 (600 / 0.75 = 800 left). Before the
    /// measurement, the prediction; a spatial pair's measured mean leaves
    /// each job's prediction in place.
    #[test]
    fn tail_a_warm_starts_measured_gain_replaces_its_prediction() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let live: BTreeMap<JobId, JobRecord> = [
            record(2, JobState::Queued),
            record(3, JobState::Queued),
            record(4, JobState::Queued),
        ]
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
        let left = |observed: Option<f64>, spatial_observed: Option<f64>| {
            let merges = vec![
                // Job 1 completed: not live.
                MergeRecord {
                    observed_gain: observed,
                    ..active_merge(1, (1, 2), MergeMode::Temporal, 0.5)
                },
                MergeRecord {
                    observed_gain: spatial_observed,
                    ..active_merge(2, (3, 4), MergeMode::Spatial, 0.25)
                },
            ];
            let mut o = Observed {
                live: live.clone(),
                merges: merges.clone(),
                ..Default::default()
            };
            o.progress.insert(job(2), (400, None));
            let nodes = vec![node("a", 4)];
            let t = plain_view(&nodes, &live, &merges, now);
            let policy = fmsched_core::policy::baselines::by_name("ymir").unwrap();
            let prepared =
                fmsched_core::round::prepare(&t.view, policy.as_ref(), &RoundConfig::default());
            let inputs = job_inputs(&o, &t, &prepared, "A100", true);
            let of = |n: u8| {
                inputs
                    .iter()
                    .find(|i| i.id == job(n).to_string())
                    .map(|i| i.remaining_iterations)
                    .unwrap()
            };
            (of(2), of(4))
        };
        assert_eq!(left(None, None), (400, 800), "the predictions");
        assert_eq!(left(Some(-0.25), None).0, 800, "the measured gain");
        assert_eq!(left(None, Some(-0.5)).1, 800, "a spatial mean: unchanged");
    }

    #[test]
    fn layer_elastic_jobs_reach_the_time_table_with_their_variance() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let elastic = |n: u8| {
            let mut r = record(n, JobState::Queued);
            r.spec.layer_elasticity = Some(fmsched_core::job::LayerElasticity {
                max_frozen_layers: 10,
            });
            r
        };
        let live: BTreeMap<JobId, JobRecord> =
            [elastic(1), elastic(2), record(3, JobState::Queued)]
                .into_iter()
                .map(|r| (r.id, r))
                .collect();
        let variance: Vec<f64> = (0..12).map(|i| if i < 6 { 1e-3 } else { 1.0 }).collect();
        let mut o = Observed {
            live: live.clone(),
            ..Default::default()
        };
        o.layer_variance.insert(job(1), variance.clone());
        o.frozen_layers.insert(job(2), 3);
        let nodes = vec![node("a", 4)];
        let t = plain_view(&nodes, &live, &[], now);
        let policy = fmsched_core::policy::baselines::by_name("icefrog").unwrap();
        let prepared =
            fmsched_core::round::prepare(&t.view, policy.as_ref(), &RoundConfig::default());
        let inputs = job_inputs(&o, &t, &prepared, "A100", true);
        let of = |n: u8| {
            inputs
                .iter()
                .position(|i| i.id == job(n).to_string())
                .unwrap()
        };
        let (tuned, picked, plain) = (of(1), of(2), of(3));
        assert_eq!(
            inputs[tuned].layer_tuning,
            Some(times::LayerTuning {
                variance,
                max_frozen: 10
            })
        );
        assert_eq!(
            inputs[tuned].variant.frozen_layers, 0,
            "tuned from its floor"
        );
        assert_eq!(inputs[picked].layer_tuning, None);
        assert_eq!(inputs[picked].variant.frozen_layers, 3);
        assert_eq!(inputs[plain].layer_tuning, None);
        assert_eq!(inputs[plain].variant.frozen_layers, 0);
        let lut = analytic::default_lut().unwrap();
        let table =
            crate::estimates::local_times(&lut, &inputs, &[], &prepared.allocations).unwrap();
        for (k, &a) in prepared
            .allocations
            .iter()
            .enumerate()
            .filter(|(_, a)| **a > 0)
        {
            assert!(
                table.jobs[tuned][k] < table.jobs[plain][k],
                "at {a} GPUs: {} vs {}",
                table.jobs[tuned][k],
                table.jobs[plain][k]
            );
        }
    }
}
