//! One round in the simulator: the cluster view it builds, the estimates
//! it gives the round (its catalog in place of an estimator), and the
//! outcome applied to its jobs — through the same `core::round` the
//! service runs.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use fmsched_core::policy::{MergeMode, Policy};
use fmsched_core::round::{
    ClusterView, Decision, Estimates, FinishedView, JobView, MergeView, PairEstimate, Prepared,
    RoundConfig, RoundOutcome, WarmEstimate,
};
use fmsched_core::{JobState, round};
use fmsched_estimator::analytic;
use fmsched_estimator::times::{tran_wt_spatial, tran_wt_temporal};

use crate::catalog::Catalog;
use crate::engine::config::{LayerMode, SimConfig, SimError, freezeout_layers};
use crate::engine::{Alloc, Phase, Simulation, packed};

impl<'a> Simulation<'a> {
    /// One scheduling round: the shared round of `fmsched_core::round`
    /// (profiling reservations, snapshot, policy, interpretation — the same
    /// code as the scheduler service) on this simulation's view, with times
    /// from the catalog and the LUT (the oracle estimator).
    pub(super) fn round(&mut self, policy: &dyn Policy, catalog: &Catalog) -> Result<(), SimError> {
        self.version += 1;
        self.iteration_estimator = policy.iteration_estimator();
        if self.cfg.layers == LayerMode::Freezeout {
            for j in &mut self.jobs {
                let p = if j.target > 0.0 {
                    j.done / j.target
                } else {
                    0.0
                };
                j.frozen = freezeout_layers(j.freeze_t0, p, j.max_frozen);
            }
        }
        let (mut view, members, finished) = self.view();
        self.family_time_ratios(&mut view, &members)?;
        let cfg = round_config(&self.cfg, policy);
        let prepared = prepare_round(&view, policy, &cfg);
        // The set follows the GPUs in the round (loans change them).
        if self.allocations != prepared.allocations {
            self.allocations = prepared.allocations.clone();
        }
        let estimates = self.estimates(catalog, &prepared, &view, &members, &finished)?;
        let t = Instant::now();
        let decision = decide_round(&view, &prepared, &estimates, policy, &cfg).map_err(|e| {
            SimError::Plan {
                t: self.now,
                message: e.to_string(),
            }
        })?;
        self.stats.round_wall_s.push(t.elapsed().as_secs_f64());
        let stats = &decision.outcome.stats;
        if self.cfg.trace_rounds {
            eprintln!(
                "round {} t={:.0} waiting={} candidates={} vars={} solve_ms={:.1} fallback={} unplaced={}",
                self.stats.rounds,
                self.now,
                decision.snapshot.jobs.len(),
                decision.snapshot.candidates.len(),
                stats.variables,
                1000.0 * t.elapsed().as_secs_f64(),
                stats.fallback,
                stats.unplaced
            );
        }
        self.stats.rounds += 1;
        if stats.variables > 0 {
            self.stats
                .model_sizes
                .push((stats.variables, stats.constraints));
        }
        if stats.fallback {
            self.stats.fallbacks += 1;
        }
        if stats.abandoned {
            eprintln!(
                "warning: round {} t={:.0}: a MILP solve did not return long past its time limit \
                 (a solver bug); abandoned, the fallback plan used",
                self.stats.rounds, self.now
            );
        }
        for w in &decision.outcome.warm_starts {
            self.warm_start(catalog, finished[w.from], members[w.job]);
        }
        self.apply(&prepared, &decision.outcome, &members, catalog)?;
        self.release(&view, &decision.outcome.released, &members);
        Ok(())
    }

    /// [`round::family_time_ratios`] of the round's jobs, from the same
    /// throughput table their progress comes from.
    pub(super) fn family_time_ratios(
        &mut self,
        view: &mut ClusterView,
        members: &[usize],
    ) -> Result<(), SimError> {
        round::family_time_ratios(view, |v, family, gpus, per_node| {
            let i = members[v];
            let j = &self.jobs[i];
            let Some(fam) = self.families.iter().position(|f| f == family) else {
                return Ok(None);
            };
            // A spatial pair trains as one joint process: its members'
            // times are not the group's. (A temporal pair's are: A trains,
            // then B, each at its own rate.)
            let spatial = j
                .merged
                .is_some_and(|(mode, _)| mode != MergeMode::Temporal);
            if spatial || j.alloc.as_ref().is_some_and(|a| a.shared) {
                return Ok(None);
            }
            let batch = j.w.batch;
            let rate = self.rate(i, batch, fam, &packed(gpus, per_node))?;
            Ok((rate > 0.0).then(|| 1.0 / rate))
        })
    }

    /// The finished jobs a new job may start from
    /// ([`ClusterView::finished`]): of each model, task and queue, the
    /// one that finished last (ties: the later in the workload), whose
    /// user shares its work, and the simulation job of each.
    pub(super) fn finished(&self) -> (Vec<FinishedView>, Vec<usize>) {
        let mut last: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
        for (i, j) in self.jobs.iter().enumerate() {
            if j.finish.is_none() || !j.w.sharing {
                continue;
            }
            let key = (
                j.w.model.as_str(),
                j.w.task.as_str(),
                j.w.queueing.queue.as_str(),
            );
            let later = |k: usize| j.finish >= self.jobs[k].finish;
            if last.get(&key).is_none_or(|&k| later(k)) {
                last.insert(key, i);
            }
        }
        let members: Vec<usize> = last.into_values().collect();
        let views = members
            .iter()
            .map(|&i| {
                let j = &self.jobs[i];
                FinishedView {
                    id: j.w.name.clone(),
                    model: j.w.model.clone(),
                    task: j.w.task.clone(),
                    sharing: j.w.sharing,
                    pipeline: j.w.pipeline,
                    merge_setup: String::new(),
                    queue: j.w.queueing.queue.clone(),
                }
            })
            .collect();
        (views, members)
    }

    /// The round's view of the simulation: every job that arrived and has
    /// not finished (view index → job index in `members`), the nodes, the
    /// merges in force, and the finished jobs a new job may start from
    /// (with the simulation job of each, [`Simulation::finished`]).
    pub(super) fn view(&self) -> (ClusterView, Vec<usize>, Vec<usize>) {
        let members: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| self.jobs[i].in_system() && self.jobs[i].finish.is_none())
            .collect();
        let mut ord = vec![usize::MAX; self.jobs.len()];
        for (k, &i) in members.iter().enumerate() {
            ord[i] = k;
        }
        let jobs = members
            .iter()
            .map(|&i| {
                let j = &self.jobs[i];
                let state = match (j.phase, &j.alloc) {
                    (Phase::Profiling { until }, _) if until.is_infinite() => JobState::Submitted,
                    (Phase::Profiling { .. }, _) => JobState::Profiling,
                    (_, Some(_)) => JobState::Running,
                    _ => JobState::Queued,
                };
                JobView {
                    id: j.w.name.clone(),
                    state,
                    model: j.w.model.clone(),
                    task: j.w.task.clone(),
                    sharing: j.w.sharing,
                    pipeline: j.w.pipeline,
                    expert_parallel: j.w.expert_parallel,
                    worker_gpus: 0,
                    gpu_model: j.w.gpu_model.as_deref().map(analytic::gpu_family),
                    unfit_families: j.unfit.clone(),
                    min_gpus: self.min_gpus(i),
                    max_gpus: j.w.max_gpus,
                    requested_gpus: j.w.gpus,
                    submitted_at: j.w.submit_s - j.history_s,
                    iteration: 0,
                    progress: if j.target > 0.0 {
                        j.done / j.target
                    } else {
                        0.0
                    },
                    attained_gpu_s: j.attained_gpu_s,
                    executed_s: j.executed_s,
                    fair_share_gpu_s: j.fair_share_gpu_s,
                    lease_until: j.lease_until,
                    restart_s: j.restart_s,
                    holds: j.alloc.as_ref().map(|a| a.held.clone()).unwrap_or_default(),
                    profiling_run: matches!(j.phase, Phase::Profiling { .. }),
                    held_back: false,
                    ever_merged: j.ever_merged.is_some(),
                    // The fmsim workload has one training setup (AMP, full
                    // fine-tuning): every job trains alike.
                    merge_setup: String::new(),
                    deadlines: j.deadlines.clone(),
                    queue: j.w.queueing.queue.clone(),
                    priority: j.w.queueing.priority,
                    preemptible: j.w.queueing.preemptible,
                    footprint: j.footprint,
                    skip_profiling: false,
                    // Filled in by `family_time_ratios` (it needs `&mut`).
                    family_time_ratio: Vec::new(),
                }
            })
            .collect();
        let merges = self
            .merges
            .iter()
            .filter(|m| {
                ord[m.a] != usize::MAX
                    && ord[m.b] != usize::MAX
                    && self.jobs[m.a].merged.is_some()
                    && self.jobs[m.b].merged.is_some()
            })
            .map(|m| MergeView {
                a: ord[m.a],
                b: ord[m.b],
                mode: m.mode,
            })
            .collect();
        let (finished, finished_jobs) = self.finished();
        let view = ClusterView {
            now: self.now,
            nodes: self.nodes.clone(),
            jobs,
            merges,
            finished,
        };
        (view, members, finished_jobs)
    }

    /// The oracle's estimates for a prepared round: remaining times from
    /// the catalog's work and the LUT's speed (scaled by the job's fixed
    /// estimation error), merged parts from the catalog's transfer entries
    /// with the same errors (B's for B after A, the two jobs' weighted by
    /// their samples for a joint job).
    /// A pair the catalog has no entry for is no candidate.
    pub(super) fn estimates(
        &mut self,
        catalog: &Catalog,
        prepared: &Prepared,
        view: &ClusterView,
        members: &[usize],
        finished: &[usize],
    ) -> Result<Estimates, SimError> {
        let mut out = Estimates::default();
        let mut by_job: HashMap<usize, usize> = HashMap::new();
        // The GPUs each job would run on (one rule with the service's); a
        // pair is estimated on A's.
        let shape: Vec<(usize, u32)> = view
            .jobs
            .iter()
            .map(|j| {
                let (family, per_node) = round::estimate_shape(view, j)
                    .unwrap_or_else(|| (self.families[0].clone(), self.nodes[0].gpus));
                let fam = self.families.iter().position(|f| *f == family).unwrap_or(0);
                (fam, per_node)
            })
            .collect();
        for (k, &v) in prepared.jobs.iter().enumerate() {
            let i = members[v];
            let noise = self.noise_factor(i);
            let times = self.solo_times(i, shape[v])?;
            out.jobs
                .push(times.into_iter().map(|t| t * noise).collect());
            out.spread
                .push(self.learned_now(i).map_or(0.0, |(_, spread)| spread));
            by_job.insert(v, k);
        }
        for &m in &prepared.kept {
            let mv = &view.merges[m];
            let (a, b) = (members[mv.a], members[mv.b]);
            let (times, noise) = match mv.mode {
                // B's target is already the merged one.
                MergeMode::Temporal => {
                    // B alone, from scratch, as a split would leave it
                    // (`RoundOutcome::released`; the guard's split too).
                    let merged_target = self.jobs[b].target;
                    self.jobs[b].target =
                        self.jobs[b].alone_epochs * self.jobs[b].samples_per_epoch;
                    let alone = self.solo_times(b, shape[mv.b]);
                    self.jobs[b].target = merged_target;
                    let nb = self.noise_factor(b);
                    out.kept_b_alone
                        .push(alone?.into_iter().map(|t| t * nb).collect());
                    (self.solo_times(b, shape[mv.a])?, nb)
                }
                _ => {
                    out.kept_b_alone.push(Vec::new());
                    let need = (self.remaining(a), self.remaining(b));
                    (
                        self.joint_times(a, b, need, shape[mv.a])?,
                        self.joint_noise(a, b, need),
                    )
                }
            };
            out.kept
                .push(times.into_iter().map(|t| t * noise).collect());
        }
        for pair in &prepared.eligible {
            let (a, b) = (members[pair.a], members[pair.b]);
            let ta = out.jobs[by_job[&pair.a]].clone();
            let tb = out.jobs[by_job[&pair.b]].clone();
            match pair.mode {
                MergeMode::Temporal => {
                    let Some(need) = self.temporal_need(catalog, a, b) else {
                        continue;
                    };
                    let need = self.predicted_need(a, b, need, self.remaining(b));
                    let saved = self.jobs[b].target;
                    self.jobs[b].target = need;
                    let tab = self.solo_times(b, shape[pair.a]);
                    self.jobs[b].target = saved;
                    // B's part carries B's estimation error, as B alone
                    // does: an error common to both ways of training B
                    // does not make the merge look better or worse.
                    let nb = self.noise_factor(b);
                    let tab: Vec<f64> = tab?.into_iter().map(|t| t * nb).collect();
                    let tran_wt = (0..ta.len())
                        .map(|k| tran_wt_temporal(ta[k], tb[k], tab[k]))
                        .collect();
                    out.candidates.push(PairEstimate {
                        pair: *pair,
                        seconds: tab,
                        tran_wt,
                        gain_ab: 0.0,
                        gain_ba: 0.0,
                    });
                }
                _ => {
                    let Some((na, nb)) = self.spatial_need(catalog, a, b) else {
                        continue;
                    };
                    let na = self.predicted_need(b, a, na, self.remaining(a));
                    let nb = self.predicted_need(a, b, nb, self.remaining(b));
                    let noise = self.joint_noise(a, b, (na, nb));
                    let joint: Vec<f64> = self
                        .joint_times(a, b, (na, nb), shape[pair.a])?
                        .into_iter()
                        .map(|t| t * noise)
                        .collect();
                    let tran_wt = (0..ta.len())
                        .map(|k| tran_wt_spatial(ta[k], tb[k], joint[k]))
                        .collect();
                    out.candidates.push(PairEstimate {
                        pair: *pair,
                        seconds: joint,
                        tran_wt,
                        gain_ab: 0.0,
                        gain_ba: 0.0,
                    });
                }
            }
        }
        // Warm starts: B's row at the samples it needs from A's weights.
        // Its times are its work over the same rates, so each row is B's
        // own row scaled by need / remaining (B has done nothing), and of
        // a job's starts only the one that needs least can win (Eq. 12
        // with T_A = 0 is the same ratio at every allocation): only that
        // one is estimated.
        let mut best: BTreeMap<usize, (usize, f64)> = BTreeMap::new();
        for (k, key) in prepared.warm.iter().enumerate() {
            let (a, b) = (finished[key.from], members[key.job]);
            let Some(need) = self.temporal_need(catalog, a, b) else {
                continue;
            };
            let need = self.predicted_need(a, b, need, self.remaining(b));
            if need < self.remaining(b) && best.get(&key.job).is_none_or(|x| need < x.1) {
                best.insert(key.job, (k, need));
            }
        }
        for (v, (k, need)) in best {
            let rem = self.remaining(members[v]);
            let row = &out.jobs[by_job[&v]];
            out.warm.push(WarmEstimate {
                key: prepared.warm[k],
                seconds: row.iter().map(|t| t * need / rem).collect(),
                gain: 0.0,
            });
        }
        out.warm.sort_by_key(|w| w.key);
        Ok(out)
    }

    /// Carries out a round's outcome: profiling runs start, new merges set
    /// their jobs' targets, groups that did not keep their GPUs (re)start,
    /// and every snapshot job left out of the plan is suspended.
    pub(super) fn apply(
        &mut self,
        prepared: &Prepared,
        outcome: &RoundOutcome,
        members: &[usize],
        catalog: &Catalog,
    ) -> Result<(), SimError> {
        self.version += 1;
        // The executor's rule, checked on every plan: one GPU family per
        // group, and the family a job asks for.
        let sets = outcome
            .profiling
            .iter()
            .map(|r| (vec![r.job], &r.gpus))
            .chain(outcome.groups.iter().map(|g| (g.jobs.clone(), &g.gpus)));
        for (jobs, gpus) in sets {
            let mut fams: Vec<usize> = gpus.iter().map(|g| self.node_family[g.0]).collect();
            fams.dedup();
            let names = || {
                jobs.iter()
                    .map(|&v| self.jobs[members[v]].w.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" + ")
            };
            if fams.len() > 1 {
                return Err(SimError::Plan {
                    t: self.now,
                    message: format!("{} placed over GPU families {fams:?}", names()),
                });
            }
            for &v in &jobs {
                let j = &self.jobs[members[v]];
                let asked = j.w.gpu_model.as_deref().map(analytic::gpu_family);
                if let (Some(m), Some(&f)) = (asked, fams.first())
                    && self.families[f] != m
                {
                    return Err(SimError::Plan {
                        t: self.now,
                        message: format!(
                            "{} asks for {m} and was placed on {}",
                            j.w.name, self.families[f]
                        ),
                    });
                }
            }
            for &v in &jobs {
                let ran_on = &mut self.jobs[members[v]].ran_on;
                if let Some(f) = fams.first().filter(|f| !ran_on.contains(f)) {
                    ran_on.push(*f);
                }
            }
        }
        for r in outcome.profiling.iter().filter(|r| r.new) {
            let i = members[r.job];
            let ready = self.now + self.jobs[i].restart_s;
            let j = &mut self.jobs[i];
            j.alloc = Some(Alloc::on(r.gpus.clone(), ready));
            j.phase = Phase::Profiling {
                until: ready + self.cfg.profile_s,
            };
            j.restarts += 1;
            j.first_start.get_or_insert(self.now);
        }
        let lease: HashMap<usize, f64> = outcome
            .leases
            .iter()
            .map(|&(v, t)| (members[v], t))
            .collect();
        let mut placed = vec![false; self.jobs.len()];
        for g in &outcome.groups {
            let ids: Vec<usize> = g.jobs.iter().map(|&v| members[v]).collect();
            if let ([a, b], Some(_)) = (&ids[..], g.new_merge) {
                let (a, b) = (*a, *b);
                self.merge(catalog, a, b, g.mode);
            }
            let shared = g.mode == MergeMode::Shared;
            for &i in &ids {
                placed[i] = true;
                let j = &mut self.jobs[i];
                if let Some(&t) = lease.get(&i) {
                    j.lease_until = t;
                }
                // A kept group, or a sharer already on the shared GPU,
                // goes on without a restart.
                let stays = j.alloc.as_ref().is_some_and(|a| shared && a.held == g.gpus);
                if g.kept || stays {
                    if let Some(a) = j.alloc.as_mut() {
                        a.shared = shared;
                    }
                    continue;
                }
                // A temporal B waits for A inside the group: it restarts
                // when it starts.
                let waiting_b =
                    matches!(j.merged, Some((MergeMode::Temporal, m)) if self.merges[m].b == i);
                let ready = self.now + if waiting_b { 0.0 } else { j.restart_s };
                let mut alloc = Alloc::on(g.gpus.clone(), ready);
                alloc.shared = shared;
                j.alloc = Some(alloc);
                if !waiting_b {
                    j.restarts += 1;
                }
                j.first_start.get_or_insert(self.now);
                j.first_train.get_or_insert(self.now);
            }
        }
        // Everyone else the policy saw is suspended.
        for &v in &prepared.jobs {
            let i = members[v];
            if !placed[i] {
                self.jobs[i].alloc = None;
            }
        }
        Ok(())
    }
}

/// The round settings a simulation runs with: profiling when it has a
/// profiling time, merge candidates for a merging policy, groups on any
/// number of nodes (fmsim runs gangs), the configured placement rule.
pub fn round_config(cfg: &SimConfig, policy: &dyn Policy) -> RoundConfig {
    RoundConfig {
        profiling: cfg.profile_s > 0.0,
        merging: true,
        max_nodes_per_group: None,
        placement_rule: cfg.placement_rule,
        policy: policy.name().to_string(),
        queues: cfg.queues.clone(),
        ..Default::default()
    }
}

/// The shared round's first phase as the simulation runs it (a golden test
/// holds it to the live round's).
pub fn prepare_round(view: &ClusterView, policy: &dyn Policy, cfg: &RoundConfig) -> Prepared {
    round::prepare(view, policy, cfg)
}

/// The shared round's decision as the simulation runs it (a golden test
/// holds it to the live round's).
pub fn decide_round(
    view: &ClusterView,
    prepared: &Prepared,
    estimates: &Estimates,
    policy: &dyn Policy,
    cfg: &RoundConfig,
) -> Result<Decision, round::RoundError> {
    round::decide(view, prepared, estimates, policy, cfg)
}

/// Model names of published profiles that differ from fmsched's catalog.
pub(crate) fn alias(model: &str) -> &str {
    match model {
        "vit" => "vit-base",
        "vit-base" => "vit",
        other => other,
    }
}
