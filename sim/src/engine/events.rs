//! The event loop: arrivals, profiling ends, completions, retunes, loans
//! and rounds on the shared round clock; time advancing with its service
//! accounting.

use std::time::Instant;

use fmsched_core::policy::{MergeMode, Policy};
use fmsched_core::round;

use crate::catalog::Catalog;
use crate::engine::config::SimError;
use crate::engine::results::{
    History, JobResult, Observation, ObservedJob, ObservedState, Retune, SimResult,
};
use crate::engine::{Phase, Simulation};

impl<'a> Simulation<'a> {
    /// Runs the whole workload under `policy`.
    pub fn run(
        self,
        policy: &dyn Policy,
        catalog: &Catalog,
        progress: impl FnMut(usize, usize),
    ) -> Result<SimResult, SimError> {
        self.run_retuned(policy, catalog, progress, None)
    }

    /// Lets job `index` start with history from before the simulation's
    /// clock (the jobs a tuner carries over from the live cluster into a
    /// predicted trace). Policies see it as submitted `age_s` earlier, so a
    /// job that has waited long is as close to Tiresias' starvation
    /// promotion as it is live; its JCT here counts from its arrival.
    pub fn seed_history(&mut self, index: usize, h: &History) {
        if let Some(j) = self.jobs.get_mut(index) {
            j.attained_gpu_s = h.attained_gpu_s.max(0.0);
            j.executed_s = h.executed_s.max(0.0);
            j.history_s = h.age_s.max(0.0);
            j.fair_share_gpu_s = h.fair_share_gpu_s.max(0.0);
        }
    }

    /// What a tuner may see of the run at this moment: every arrived job,
    /// its state and the time it has run, never its remaining work.
    pub(super) fn observe(&self) -> Observation<'_> {
        Observation {
            now: self.now,
            jobs: self
                .jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| !matches!(j.phase, Phase::NotArrived))
                .map(|(index, j)| ObservedJob {
                    index,
                    spec: &j.w,
                    state: match (j.finish, &j.alloc) {
                        (Some(finish_s), _) => ObservedState::Done { finish_s },
                        (None, Some(_)) => ObservedState::Running,
                        (None, None) => ObservedState::Waiting,
                    },
                    executed_s: j.executed_s,
                    attained_gpu_s: j.attained_gpu_s,
                    fair_share_gpu_s: j.fair_share_gpu_s,
                })
                .collect(),
        }
    }

    /// Runs the whole workload under `policy`; with `retune`, every
    /// `every_s` of simulated time the hook sees the run so far
    /// ([`Observation`]) and may hand back a policy (new knobs) that
    /// decides from the next round on — how AutoSched is replayed.
    pub fn run_retuned(
        mut self,
        policy: &dyn Policy,
        catalog: &Catalog,
        mut progress: impl FnMut(usize, usize),
        mut retune: Option<Retune<'_>>,
    ) -> Result<SimResult, SimError> {
        let started = Instant::now();
        self.stats.policy = policy.name().to_string();
        self.allocations = policy.allocation_set(self.total_gpus);
        let mut swapped: Option<Box<dyn Policy + Send + Sync>> = None;
        let interval = policy.interval_s().max(1.0);
        let mut order: Vec<usize> = (0..self.jobs.len()).collect();
        order.sort_by(|&a, &b| self.jobs[a].w.submit_s.total_cmp(&self.jobs[b].w.submit_s));
        let mut next_arrival = 0usize;
        let t0 = order.first().map_or(0.0, |&i| self.jobs[i].w.submit_s);
        self.now = t0;
        let mut finished = 0usize;
        let mut stalled = 0u32;
        let n = self.jobs.len();
        // `event` says whether an arrival, a completion or a profiling
        // run's end came since the round clock last heard.
        let mut clock = self.cfg.round_clock(interval, t0);
        let mut event = false;
        let mut next_retune = retune.as_ref().map_or(f64::INFINITY, |r| t0 + r.every_s);
        // The orchestrator's first decision as the trace starts.
        let mut next_loan = if self.cfg.loans.is_some() {
            t0
        } else {
            f64::INFINITY
        };
        while finished < n {
            if self.now - t0 > self.cfg.horizon_s {
                return Err(self.unfinished(n - finished));
            }
            // The next event.
            let first = order.get(next_arrival).map(|&i| self.jobs[i].w.submit_s);
            let t_next = self
                .next_event(clock.next_s().min(next_retune).min(next_loan), first)?
                .max(self.now);
            if t_next <= self.now {
                stalled += 1;
                if stalled > 100_000 {
                    return Err(SimError::Config(format!(
                        "the clock stopped at t={:.3}s (an event that never fires)",
                        self.now
                    )));
                }
            } else {
                stalled = 0;
            }
            self.advance(t_next)?;

            event |= self.complete_done(&mut finished, &mut progress)?;
            self.guard(catalog);
            event |= self.end_profiling();
            // Arrivals.
            while let Some(&i) = order.get(next_arrival) {
                if self.jobs[i].w.submit_s > self.now {
                    break;
                }
                next_arrival += 1;
                event = true;
                self.jobs[i].phase = if self.cfg.profile_s > 0.0 {
                    Phase::Profiling {
                        until: f64::INFINITY,
                    }
                } else {
                    Phase::Waiting
                };
            }
            if self.now >= next_retune
                && let Some(r) = retune.as_mut()
            {
                next_retune += r.every_s;
                let active: &dyn Policy = swapped.as_deref().map_or(policy, |p| p as &dyn Policy);
                if let Some(p) = (r.hook)(&self.observe(), active) {
                    // A changed interval takes effect from the round after
                    // the one already due.
                    clock.set_interval(p.interval_s().max(1.0));
                    swapped = Some(p);
                }
            }
            if self.now >= next_loan
                && let Some(every) = self.cfg.loans.as_ref().map(|l| l.every_s.max(1.0))
            {
                next_loan += every;
                self.orchestrate();
            }
            if std::mem::take(&mut event) {
                clock.on_event(self.now, self.deadline_needs());
            }
            if clock.is_due(self.now) {
                let active: &dyn Policy = swapped.as_deref().map_or(policy, |p| p as &dyn Policy);
                self.round(active, catalog)?;
                clock.round_started(self.now);
            }
        }
        self.sum_up();
        self.stats.wall_s = started.elapsed().as_secs_f64();
        Ok(self.stats)
    }

    /// Completions. Tolerances absorb rounding: a job within a
    /// microsecond of its target is done (else the clock could stall
    /// on steps too small to move it).
    fn complete_done(
        &mut self,
        finished: &mut usize,
        progress: &mut impl FnMut(usize, usize),
    ) -> Result<bool, SimError> {
        let n = self.jobs.len();
        let mut any = false;
        for i in 0..n {
            if self.jobs[i].alloc.is_none() || self.jobs[i].finish.is_some() {
                continue;
            }
            let rem = self.remaining(i);
            let near = rem <= 1e-6 * self.jobs[i].target.max(1.0) || {
                let ready = self.jobs[i]
                    .alloc
                    .as_ref()
                    .is_some_and(|a| a.ready_at <= self.now);
                let r = self.progress_rate(i)?;
                ready && r > 0.0 && rem / r <= 1e-6
            };
            if near {
                self.complete(i);
                any = true;
                *finished += 1;
                progress(*finished, n);
            }
        }
        Ok(any)
    }

    /// Profiling runs that ended: the job waits for its training run.
    fn end_profiling(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.jobs.len() {
            if let Phase::Profiling { until } = self.jobs[i].phase
                && until <= self.now
            {
                // The profiling run measures (loss trace, throughput,
                // Task2Vec); its weights are not kept, so the job starts
                // from zero progress and stays eligible for merging.
                self.version += 1;
                any = true;
                let j = &mut self.jobs[i];
                j.phase = Phase::Waiting;
                j.alloc = None;
                j.done = 0.0;
            }
        }
        any
    }

    /// The run's figures once every job finished: makespan, GPU
    /// utilisation (over the training cluster and the GPU-seconds on
    /// loan), each job's result and the restarts.
    fn sum_up(&mut self) {
        let first = self
            .jobs
            .iter()
            .map(|j| j.w.submit_s)
            .fold(f64::INFINITY, f64::min);
        let last = self
            .jobs
            .iter()
            .filter_map(|j| j.finish)
            .fold(first, f64::max);
        self.stats.makespan_s = (last - first).max(0.0);
        // Over the training cluster and the GPU-seconds on loan.
        let total = f64::from(self.cfg.total_gpus());
        self.stats.gpu_utilisation = if self.stats.makespan_s > 0.0 {
            self.busy_gpu_s / (total * self.stats.makespan_s + self.stats.loans.loaned_gpu_s)
        } else {
            0.0
        };
        self.stats.jobs = self
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let finish = j.finish.unwrap_or(f64::NAN);
                JobResult {
                    name: j.w.name.clone(),
                    model: j.w.model.clone(),
                    task: j.w.task.clone(),
                    submit_s: j.w.submit_s,
                    first_start_s: j.first_start,
                    first_train_s: j.first_train,
                    finish_s: finish,
                    jct_s: finish - j.w.submit_s,
                    ftf: (finish - j.w.submit_s) / j.ideal_s.max(1e-9),
                    fair_rho: j.fair_share_gpu_s / j.attained_gpu_s.max(1e-9),
                    restarts: j.restarts,
                    merged: j.ever_merged.map(|(mode, m)| {
                        let mg = &self.merges[m];
                        let other = if mg.a == i { mg.b } else { mg.a };
                        (mode, self.jobs[other].w.name.clone())
                    }),
                    gpu_types: {
                        // Distinct already; families are sorted by name.
                        let mut f = j.ran_on.clone();
                        f.sort_unstable();
                        f.iter().map(|&k| self.families[k].clone()).collect()
                    },
                    class: j.w.slo.class(),
                    deadlines: j.deadlines.clone(),
                    best_case_s: self.best_case_s(j),
                }
            })
            .collect();
        self.stats.restarts = self.jobs.iter().map(|j| j.restarts).sum();
    }

    /// The error of a run past its horizon, naming a few of the
    /// `unfinished` jobs with what they asked for.
    fn unfinished(&self, unfinished: usize) -> SimError {
        // Name a few, with what they asked for.
        let left: Vec<String> = self
            .jobs
            .iter()
            .filter(|j| !matches!(j.phase, Phase::Done))
            .take(5)
            .map(|j| {
                format!(
                    "{} ({} {}, {} GPU{})",
                    j.w.name,
                    j.w.model,
                    j.w.task,
                    j.w.gpus,
                    if j.w.gpus == 1 { "" } else { "s" }
                )
            })
            .collect();
        SimError::Config(format!(
            "{} of {} jobs unfinished after {:.0} simulated days: the policy starves them or the cluster cannot run them: {}{}",
            unfinished,
            self.jobs.len(),
            self.cfg.horizon_s / 86_400.0,
            left.join(", "),
            if unfinished > left.len() { ", …" } else { "" }
        ))
    }

    /// When the next event comes, at the latest at `t_next` (a round, a
    /// retune, a loan decision): the next arrival (`first`), a profiling
    /// run's end, a job's completion or its start after a restart, and a
    /// merge guard's first epochs.
    fn next_event(&mut self, mut t_next: f64, first: Option<f64>) -> Result<f64, SimError> {
        if let Some(at) = first {
            t_next = t_next.min(at);
        }
        for i in 0..self.jobs.len() {
            if let Phase::Profiling { until } = self.jobs[i].phase {
                t_next = t_next.min(until);
            }
            if let Some(ready_at) = self.jobs[i].alloc.as_ref().map(|a| a.ready_at) {
                let ready = ready_at.max(self.now);
                let r = self.progress_rate(i)?;
                if r > 0.0 {
                    t_next = t_next.min(ready + self.remaining(i) / r);
                } else if ready_at > self.now {
                    t_next = t_next.min(ready_at);
                }
            }
        }
        for m in 0..self.merges.len() {
            let (done, mode, a, b, guard_at) = {
                let mg = &self.merges[m];
                (mg.guard_done, mg.mode, mg.a, mg.b, mg.guard_at)
            };
            if !done {
                let i = if mode == MergeMode::Temporal { b } else { a };
                let r = self.progress_rate(i)?;
                if r > 0.0 && self.jobs[i].done < guard_at * (1.0 - 1e-9) - 1e-6 {
                    let ready = self.jobs[i]
                        .alloc
                        .as_ref()
                        .map_or(self.now, |a| a.ready_at.max(self.now));
                    t_next = t_next.min(ready + (guard_at - self.jobs[i].done) / r);
                }
            }
        }
        Ok(t_next)
    }

    /// Each job with a deadline that waits for its first start: what it
    /// needs from a round's start (its best case, [`Self::best_case_s`],
    /// once it has profiled its time alone at its request with its start)
    /// and its first deadline ([`RoundClock::on_event`]), as the policy's
    /// estimates have it.
    pub(super) fn deadline_needs(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        (0..self.jobs.len()).filter_map(|i| {
            let j = &self.jobs[i];
            let by = j.deadlines.first()?.by;
            // Its time alone as the policy sees it (`estimate_noise`
            // scales its work as it does every time the policy sees).
            let alone = (j.ideal_s - j.restart_s) * self.noise_factor(i) + j.restart_s;
            let need = match j.phase {
                Phase::Profiling { until } if until.is_infinite() => {
                    self.best_case_s(j) - j.ideal_s + alone
                }
                Phase::Waiting if j.first_train.is_none() => alone,
                _ => return None,
            };
            Some((need, by))
        })
    }

    /// Moves the clock to `t`, advancing every running job.
    pub(super) fn advance(&mut self, t: f64) -> Result<(), SimError> {
        let dt = t - self.now;
        if dt > 0.0 {
            // Every job in the system deserves an equal share of the
            // cluster, at most what it asked for (Themis's deserved service,
            // accumulated as the TitanSched simulator does).
            let present = self.jobs.iter().filter(|j| j.in_system()).count();
            let total = self.present_gpus();
            let loaned: Vec<bool> = self.nodes.iter().map(|n| n.loaned).collect();
            self.stats.loans.loaned_gpu_s += self
                .nodes
                .iter()
                .filter(|n| n.loaned)
                .map(|n| f64::from(n.gpus))
                .sum::<f64>()
                * dt;
            for j in self.jobs.iter_mut().filter(|j| j.in_system()) {
                // Every job in the system is present for the whole step:
                // arrivals are events, so a step starts at one.
                let deserved = round::fair_share(total, present, j.w.gpus);
                j.fair_share_gpu_s += round::accrue(0, deserved, dt, dt).fair_share_gpu_s;
            }
            for i in 0..self.jobs.len() {
                let Some(a) = self.jobs[i].alloc.clone() else {
                    continue;
                };
                let holder = match self.jobs[i].merged {
                    // A pair's GPUs are counted once, on A.
                    Some((_, m)) => self.merges[m].a == i,
                    None => true,
                };
                if holder {
                    // A shared GPU is counted once, half on each sharer.
                    let share = if a.shared { 0.5 } else { 1.0 };
                    self.busy_gpu_s += share * f64::from(a.gpus) * dt;
                    if a.shared {
                        self.stats.shared_gpu_s += 0.5 * dt;
                    }
                    let on_loan = a
                        .placement
                        .iter()
                        .filter(|p| loaned[p.0])
                        .map(|p| p.1)
                        .sum::<u32>();
                    self.stats.loans.loaned_busy_gpu_s += f64::from(on_loan) * dt;
                }
                let got = round::accrue(a.gpus, 0.0, dt, 0.0);
                self.jobs[i].attained_gpu_s += got.attained_gpu_s;
                self.jobs[i].executed_s += got.executed_s;
                let active = (t - a.ready_at.max(self.now)).max(0.0);
                if active > 0.0 {
                    let r = self.progress_rate(i)?;
                    let j = &mut self.jobs[i];
                    j.done = (j.done + r * active).min(j.target);
                }
            }
        }
        self.now = t;
        Ok(())
    }

    pub(super) fn complete(&mut self, i: usize) {
        self.version += 1;
        let now = self.now;
        self.jobs[i].finish = Some(now);
        self.jobs[i].phase = Phase::Done;
        let alloc = self.jobs[i].alloc.take();
        if let Some((mode, m)) = self.jobs[i].merged {
            let (a, b) = (self.merges[m].a, self.merges[m].b);
            let other = if i == a { b } else { a };
            if self.jobs[other].finish.is_none() {
                // The partner keeps the GPUs. After A of a temporal pair, B
                // starts a new process from A's weights (one restart); a
                // spatial partner's process simply continues alone.
                if let Some(mut al) = alloc {
                    if mode == MergeMode::Temporal {
                        al.ready_at = now + self.jobs[other].restart_s;
                        self.jobs[other].restarts += 1;
                    }
                    self.jobs[other].alloc = Some(al);
                }
                // The partner is on its own from now on.
                self.jobs[other].merged = None;
            }
        }
        self.jobs[i].merged = None;
    }
}
