//! `fmsched.v1.EstimatorService`: the estimator library served over gRPC.
//!
//! Each RPC validates its request (INVALID_ARGUMENT naming the field), runs
//! the pure computation, and — for the RPCs that teach the estimator
//! something (RecordStepTimes, ImportProfile, RecordTransferOutcome) —
//! persists what was learned *before* changing the in-memory state, so an
//! acknowledged update survives a restart and a failed write changes
//! nothing. CPU-heavy calls run on the blocking pool.

use fmsched_runtime::metrics::{Exposition, Kind};
use std::sync::{Arc, RwLock};

use fmsched_proto::v1 as pb;
use fmsched_proto::v1::estimator_service_server::EstimatorService;
use tonic::{Request, Response, Status};

use crate::analytic;
use crate::loss_curve::{self, FitError, LossCurve, PLATEAU_THRESHOLD, TargetPrediction};
use crate::lut::{
    Lut, LutError, Measured, Recorded, ThroughputKey, Variant, canonical_placement, expert_group,
};
use crate::persistence::{ImportedProfile, Persistence};
use crate::times::{self, JobInput, MergeMode, PairInput, TimeError};
use crate::transfer::{self, GainModel, TaskEmbedding};

/// Largest number of tasks one ScoreTransfer call may compare.
pub const MAX_TASKS: usize = 2_000;
/// Largest number of jobs / pairs in one PredictJobTimes call.
pub const MAX_TIME_JOBS: usize = 10_000;
pub const MAX_TIME_PAIRS: usize = 200_000;
pub const MAX_SAMPLES: usize = 10_000;
/// Longest name (model, GPU type, layout, job id) accepted.
const MAX_NAME: usize = 256;
/// Largest CSV accepted by ImportProfile (the server refuses requests over
/// 4 MiB anyway).
const MAX_CSV: usize = 4 * 1024 * 1024;

/// What the estimator knows: the LUT and the score → gain regression.
/// Owns no IO; [`EstimatorApi`] persists before it mutates.
#[derive(Debug, Default)]
pub struct EstimatorState {
    pub lut: Lut,
    pub gain: GainModel,
}

impl EstimatorState {
    /// The shipped default profiles plus everything learned so far.
    pub fn with_defaults() -> Result<Self, LutError> {
        Ok(Self {
            lut: analytic::default_lut()?,
            gain: GainModel::default(),
        })
    }
}

/// Calls, errors and latency per RPC, for `/metrics`.
#[derive(Debug, Default)]
pub struct RpcMetrics {
    by_rpc: std::sync::Mutex<std::collections::BTreeMap<&'static str, (u64, u64, f64)>>,
}

/// Records one call when dropped; an error unless [`CallGuard::ok`] ran.
pub struct CallGuard<'a> {
    metrics: &'a RpcMetrics,
    rpc: &'static str,
    started: std::time::Instant,
    ok: bool,
}

impl CallGuard<'_> {
    pub fn ok(mut self) {
        self.ok = true;
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let mut m = self
            .metrics
            .by_rpc
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let e = m.entry(self.rpc).or_default();
        e.0 += 1;
        e.1 += u64::from(!self.ok);
        e.2 += self.started.elapsed().as_secs_f64();
    }
}

impl RpcMetrics {
    pub fn start(&self, rpc: &'static str) -> CallGuard<'_> {
        CallGuard {
            metrics: self,
            rpc,
            started: std::time::Instant::now(),
            ok: false,
        }
    }

    /// The Prometheus exposition of the counters.
    pub fn render(&self) -> String {
        let m = self
            .by_rpc
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut e = Exposition::default();
        e.family(
            "fmsched_estimator_requests_total",
            Kind::Counter,
            "Requests by RPC.",
        );
        for (rpc, v) in &m {
            e.sample(
                "fmsched_estimator_requests_total",
                &[("rpc", rpc)],
                v.0 as f64,
            );
        }
        e.family(
            "fmsched_estimator_errors_total",
            Kind::Counter,
            "Requests answered with an error, by RPC.",
        );
        for (rpc, v) in &m {
            e.sample(
                "fmsched_estimator_errors_total",
                &[("rpc", rpc)],
                v.1 as f64,
            );
        }
        e.family(
            "fmsched_estimator_request_seconds_sum",
            Kind::Counter,
            "Seconds spent answering, by RPC.",
        );
        for (rpc, v) in &m {
            e.sample(
                "fmsched_estimator_request_seconds_sum",
                &[("rpc", rpc)],
                v.2,
            );
        }
        e.finish()
    }
}

/// The gRPC service.
#[derive(Clone)]
pub struct EstimatorApi {
    /// Request counters (shared with the `/metrics` endpoint).
    pub metrics: Arc<RpcMetrics>,
    state: Arc<RwLock<EstimatorState>>,
    persistence: Option<Persistence>,
    /// Serialises the learn-and-persist RPCs so the stored statistics are
    /// written in the order they were computed.
    learn: Arc<tokio::sync::Mutex<()>>,
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {msg}"))
}

fn check_name(field: &str, s: &str) -> Result<(), Status> {
    if s.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if s.len() > MAX_NAME {
        return Err(invalid(field, format!("longer than {MAX_NAME} bytes")));
    }
    Ok(())
}

fn check_finite(field: &str, x: f64) -> Result<(), Status> {
    if x.is_finite() {
        Ok(())
    } else {
        Err(invalid(field, "must be a finite number"))
    }
}

fn fit_status(e: FitError) -> Status {
    Status::invalid_argument(e.to_string())
}

fn lut_status(field: &str, e: LutError) -> Status {
    match e {
        LutError::NoProfile { .. } => Status::invalid_argument(format!("{field}: {e}")),
        other => invalid(field, other),
    }
}

fn curve_from_pb(field: &str, c: Option<&pb::LossCurve>) -> Result<LossCurve, Status> {
    let c = c.ok_or_else(|| invalid(field, "is required"))?;
    for (name, v) in [
        ("beta0", c.beta0),
        ("beta1", c.beta1),
        ("beta2", c.beta2),
        ("beta3", c.beta3),
    ] {
        if !v.is_finite() || v < 0.0 {
            return Err(invalid(
                &format!("{field}.{name}"),
                "must be a finite number >= 0",
            ));
        }
    }
    if c.beta1 <= 0.0 {
        return Err(invalid(
            &format!("{field}.beta1"),
            "must be > 0 (L(0) would be infinite)",
        ));
    }
    Ok(LossCurve {
        quality: c.quality.clamp(0.0, 1.0),
        ..LossCurve::new(c.beta0, c.beta1, c.beta2, c.beta3)
    })
}

fn curve_to_pb(c: &LossCurve) -> pb::LossCurve {
    pb::LossCurve {
        beta0: c.beta0,
        beta1: c.beta1,
        beta2: c.beta2,
        beta3: c.beta3,
        quality: c.quality,
    }
}

fn petl_name(p: &str) -> String {
    let p = p.trim().to_ascii_lowercase();
    if p == "none" { String::new() } else { p }
}

/// Checks an `expert_parallel` field: 0 or 1 = none; a group needs a
/// Mixture-of-Experts model whose experts it divides (a model without an
/// architecture here, known only by its imported tables, is taken at its
/// word) and fits one node.
fn check_expert_parallel(field: &str, model: &str, ep: u32) -> Result<u32, Status> {
    let ep = expert_group(ep);
    if ep == 0 {
        return Ok(0);
    }
    if ep > MAX_EXPERT_GROUP {
        return Err(invalid(
            field,
            format!("{ep} exceeds {MAX_EXPERT_GROUP} (a group sits on one node)"),
        ));
    }
    // A model with no architecture here (one only a profile knows) has no
    // expert count to check the group against.
    let problem = analytic::MODELS
        .iter()
        .find(|m| m.name == model)
        .and_then(|m| fmsched_core::models::expert_group_problem(model, m.experts, ep));
    match problem {
        Some(why) => Err(invalid(field, why)),
        None => Ok(ep),
    }
}

/// The largest expert-parallel group a key may name: one node's GPUs (the
/// agents' limit on GPUs per node).
const MAX_EXPERT_GROUP: u32 = 64;

/// Converts and checks a protobuf key (the model must have a profile).
fn key_from_pb(
    field: &str,
    k: Option<&pb::ThroughputKey>,
    lut: &Lut,
) -> Result<(ThroughputKey, u32), Status> {
    let k = k.ok_or_else(|| invalid(field, "is required"))?;
    check_name(&format!("{field}.model"), &k.model)?;
    check_name(&format!("{field}.gpu_type"), &k.gpu_type)?;
    let gpu_type = analytic::gpu_family(&k.gpu_type);
    if !lut.has_model(&k.model) {
        return Err(invalid(
            &format!("{field}.model"),
            format!("unknown model {:?} (no throughput profile)", k.model),
        ));
    }
    let placement =
        canonical_placement(&k.placement).map_err(|e| invalid(&format!("{field}.placement"), e))?;
    if k.local_batch_size == 0 {
        return Err(invalid(&format!("{field}.local_batch_size"), "must be > 0"));
    }
    let layers = analytic::layers_of(&k.model).unwrap_or(24);
    if k.frozen_layers > layers {
        return Err(invalid(
            &format!("{field}.frozen_layers"),
            format!("{} exceeds the model's {layers} layers", k.frozen_layers),
        ));
    }
    Ok((
        ThroughputKey {
            model: k.model.clone(),
            gpu_type,
            placement,
            local_bsz: k.local_batch_size,
            grad_accum: k.gradient_accumulation.max(1),
            variant: Variant {
                amp: k.amp,
                frozen_layers: k.frozen_layers,
                gradient_checkpointing: k.gradient_checkpointing,
                petl: petl_name(&k.petl),
                pipeline: k.pipeline_parallel,
                expert_parallel: check_expert_parallel(
                    &format!("{field}.expert_parallel"),
                    &k.model,
                    k.expert_parallel,
                )?,
            },
        },
        layers,
    ))
}

fn mode_from_pb(field: &str, m: i32) -> Result<MergeMode, Status> {
    match pb::TransferMode::try_from(m) {
        Ok(pb::TransferMode::Temporal) => Ok(MergeMode::Temporal),
        Ok(pb::TransferMode::Spatial) => Ok(MergeMode::Spatial),
        Ok(other) => Err(invalid(
            field,
            format!(
                "{} is not a merge mode (TEMPORAL or SPATIAL)",
                other.as_str_name()
            ),
        )),
        Err(_) => Err(invalid(field, format!("unknown enum value {m}"))),
    }
}

fn mode_to_pb(m: MergeMode) -> pb::TransferMode {
    match m {
        MergeMode::Temporal => pb::TransferMode::Temporal,
        MergeMode::Spatial => pb::TransferMode::Spatial,
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("estimator task failed: {e}")))
}

impl EstimatorApi {
    pub fn new(state: EstimatorState, persistence: Option<Persistence>) -> Self {
        Self {
            metrics: Arc::new(RpcMetrics::default()),
            state: Arc::new(RwLock::new(state)),
            persistence,
            learn: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, EstimatorState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, EstimatorState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Everything `/metrics` shows: the RPC counters and the transfer-gain
    /// regression as it stands (Ymir §4.1: `G = intercept + slope · S`,
    /// learned from the merge outcomes the scheduler records).
    pub fn render_metrics(&self) -> String {
        let (intercept, slope) = self.read().gain.coefficients();
        let observed = self.read().gain.observed();
        let mut e = Exposition::default();
        e.scalar(
            "fmsched_estimator_gain_intercept",
            Kind::Gauge,
            "Intercept of the Task2Vec score → transfer gain regression.",
            intercept,
        );
        e.scalar(
            "fmsched_estimator_gain_slope",
            Kind::Gauge,
            "Slope of the Task2Vec score → transfer gain regression.",
            slope,
        );
        e.scalar(
            "fmsched_estimator_gain_observed_merges",
            Kind::Gauge,
            "Merge outcomes the regression has learned from (RecordTransferOutcome).",
            observed as f64,
        );
        self.metrics.render() + &e.finish()
    }

    fn unavailable(e: impl std::fmt::Display) -> Status {
        Status::unavailable(format!(
            "could not persist the update, nothing was changed: {e}"
        ))
    }
}

fn time_input(i: usize, j: &pb::JobTimeInput, lut: &Lut) -> Result<JobInput, Status> {
    let f = |name: &str| format!("jobs[{i}].{name}");
    check_name(&f("job_id"), &j.job_id)?;
    check_name(&f("model"), &j.model)?;
    check_name(&f("gpu_type"), &j.gpu_type)?;
    if !lut.has_model(&j.model) {
        return Err(invalid(
            &f("model"),
            format!("unknown model {:?} (no throughput profile)", j.model),
        ));
    }
    if j.global_batch_size == 0 {
        return Err(invalid(&f("global_batch_size"), "must be > 0"));
    }
    let layers = analytic::layers_of(&j.model).unwrap_or(24);
    if j.frozen_layers > layers {
        return Err(invalid(
            &f("frozen_layers"),
            format!("{} exceeds the model's {layers} layers", j.frozen_layers),
        ));
    }
    let curve = match &j.curve {
        Some(c) => Some(curve_from_pb(&f("curve"), Some(c))?),
        None => None,
    };
    let layer_tuning = if j.layer_variance.is_empty() {
        None
    } else {
        if let Some(k) = j
            .layer_variance
            .iter()
            .position(|v| !v.is_finite() || *v < 0.0)
        {
            return Err(invalid(
                &f(&format!("layer_variance[{k}]")),
                "must be a finite number >= 0",
            ));
        }
        if j.max_frozen_layers > layers || j.max_frozen_layers < j.frozen_layers {
            return Err(invalid(
                &f("max_frozen_layers"),
                format!(
                    "{} must lie between frozen_layers ({}) and the model's {layers} layers",
                    j.max_frozen_layers, j.frozen_layers
                ),
            ));
        }
        Some(times::LayerTuning {
            variance: j.layer_variance.clone(),
            max_frozen: j.max_frozen_layers,
        })
    };
    Ok(JobInput {
        id: j.job_id.clone(),
        model: j.model.clone(),
        gpu_type: analytic::gpu_family(&j.gpu_type),
        gpus_per_node: if j.gpus_per_node == 0 {
            4
        } else {
            j.gpus_per_node.min(9)
        },
        global_batch: j.global_batch_size,
        variant: Variant {
            amp: j.amp,
            frozen_layers: j.frozen_layers,
            gradient_checkpointing: j.gradient_checkpointing,
            petl: petl_name(&j.petl),
            pipeline: j.pipeline_parallel,
            expert_parallel: check_expert_parallel(
                &f("expert_parallel"),
                &j.model,
                j.expert_parallel,
            )?,
        },
        layers,
        remaining_iterations: j.remaining_iterations,
        done_iterations: j.done_iterations,
        curve,
        max_iterations: j.max_iterations,
        samples_per_epoch: j.samples_per_epoch,
        layer_tuning,
    })
}

#[tonic::async_trait]
impl EstimatorService for EstimatorApi {
    async fn fit_loss_curve(
        &self,
        req: Request<pb::FitLossCurveRequest>,
    ) -> Result<Response<pb::FitLossCurveResponse>, Status> {
        let guard = self.metrics.start("FitLossCurve");
        let r = req.into_inner();
        let points = r.iterations.len();
        let curve = blocking(move || loss_curve::fit_loss_curve(&r.iterations, &r.losses))
            .await?
            .map_err(fit_status)?;
        guard.ok();
        Ok(Response::new(pb::FitLossCurveResponse {
            curve: Some(curve_to_pb(&curve)),
            points: points as u32,
        }))
    }

    async fn predict_iterations(
        &self,
        req: Request<pb::PredictIterationsRequest>,
    ) -> Result<Response<pb::PredictIterationsResponse>, Status> {
        let guard = self.metrics.start("PredictIterations");
        let r = req.into_inner();
        let curve = curve_from_pb("curve", r.curve.as_ref())?;
        check_finite("threshold", r.threshold)?;
        check_finite("gain", r.gain)?;
        if r.threshold < 0.0 || r.threshold >= 1.0 {
            return Err(invalid(
                "threshold",
                "must be in [0, 1) (0 = the paper's 0.001)",
            ));
        }
        if r.gain <= -1.0 {
            return Err(invalid(
                "gain",
                "must be > -1 (L / (1 + G) would not be a loss)",
            ));
        }
        let threshold = if r.threshold == 0.0 {
            PLATEAU_THRESHOLD
        } else {
            r.threshold
        };
        let cap = if r.max_iterations == 0 {
            u64::MAX / 4
        } else {
            r.max_iterations
        };
        let mut out = pb::PredictIterationsResponse {
            iterations: loss_curve::iterations_to_converge(&curve, r.gain, threshold, cap),
            ..Default::default()
        };
        if !r.metric_iterations.is_empty() || !r.metric_values.is_empty() {
            check_finite("metric_target", r.metric_target)?;
            let (xs, ys, lower) = (
                r.metric_iterations,
                r.metric_values,
                r.metric_lower_is_better,
            );
            let m = blocking(move || loss_curve::fit_metric_curve(&xs, &ys, lower))
                .await?
                .map_err(fit_status)?;
            match m.first_reaching(r.metric_target) {
                TargetPrediction::At(k) => {
                    out.metric_target_iteration = k.ceil().min(cap as f64) as u64;
                }
                TargetPrediction::Unreachable { .. } => out.target_unreachable = true,
            }
            out.metric_asymptote = if m.lower_is_better { -m.c } else { m.c };
        }
        guard.ok();
        Ok(Response::new(out))
    }

    async fn score_transfer(
        &self,
        req: Request<pb::ScoreTransferRequest>,
    ) -> Result<Response<pb::ScoreTransferResponse>, Status> {
        let guard = self.metrics.start("ScoreTransfer");
        let r = req.into_inner();
        if r.tasks.len() < 2 {
            return Err(invalid("tasks", "need at least two tasks to score"));
        }
        if r.tasks.len() > MAX_TASKS {
            return Err(invalid(
                "tasks",
                format!("{} tasks, {MAX_TASKS} at most", r.tasks.len()),
            ));
        }
        let dim = r.tasks[0].fisher.len();
        let mut tasks = Vec::with_capacity(r.tasks.len());
        for (i, t) in r.tasks.into_iter().enumerate() {
            check_name(&format!("tasks[{i}].job_id"), &t.job_id)?;
            let e = TaskEmbedding {
                fisher: t.fisher,
                fisher_repeat: t.fisher_repeat,
            };
            e.validate(Some(dim))
                .map_err(|err| invalid(&format!("tasks[{i}]"), err))?;
            tasks.push((t.job_id, e));
        }
        let gain = self.read().gain.clone();
        let pairs = blocking(move || {
            let (ids, embeddings): (Vec<String>, Vec<TaskEmbedding>) = tasks.into_iter().unzip();
            let temporal = transfer::temporal_scores(&embeddings);
            // S(i ↦ j) by (i, j), for the spatial means.
            let n = ids.len();
            let mut by_pair = vec![0.0; n * n];
            for &(i, j, s) in &temporal {
                by_pair[i * n + j] = s;
            }
            let mut out = Vec::with_capacity(temporal.len() * 3 / 2);
            let mut push = |i: usize, j: usize, mode: pb::TransferMode, s: f64| {
                let g = gain.predict(s);
                out.push(pb::PairScore {
                    job_a: ids[i].clone(),
                    job_b: ids[j].clone(),
                    mode: mode as i32,
                    score: s,
                    gain: g,
                    positive: g >= 0.0,
                });
            };
            for &(i, j, s) in &temporal {
                push(i, j, pb::TransferMode::Temporal, s);
                if i < j {
                    // Spatial score: mean of both directions (Ymir §4.1).
                    push(
                        i,
                        j,
                        pb::TransferMode::Spatial,
                        0.5 * (s + by_pair[j * n + i]),
                    );
                }
            }
            (out, gain.coefficients(), gain.observed())
        })
        .await?;
        let (pairs, (intercept, slope), observed) = pairs;
        guard.ok();
        Ok(Response::new(pb::ScoreTransferResponse {
            pairs,
            intercept,
            slope,
            observed_merges: observed,
        }))
    }

    async fn record_transfer_outcome(
        &self,
        req: Request<pb::RecordTransferOutcomeRequest>,
    ) -> Result<Response<pb::RecordTransferOutcomeResponse>, Status> {
        let guard = self.metrics.start("RecordTransferOutcome");
        let r = req.into_inner();
        check_finite("score", r.score)?;
        check_finite("gain", r.gain)?;
        let _learn = self.learn.lock().await;
        if let Some(p) = &self.persistence {
            p.save_outcome(r.score, r.gain)
                .await
                .map_err(Self::unavailable)?;
        }
        let mut st = self.write();
        st.gain.observe(r.score, r.gain);
        let (intercept, slope) = st.gain.coefficients();
        tracing::info!(
            score = r.score,
            gain = r.gain,
            intercept,
            slope,
            "merge outcome recorded"
        );
        guard.ok();
        Ok(Response::new(pb::RecordTransferOutcomeResponse {
            intercept,
            slope,
            observed_merges: st.gain.observed(),
        }))
    }

    async fn predict_job_times(
        &self,
        req: Request<pb::PredictJobTimesRequest>,
    ) -> Result<Response<pb::PredictJobTimesResponse>, Status> {
        let guard = self.metrics.start("PredictJobTimes");
        let r = req.into_inner();
        if r.jobs.is_empty() {
            return Err(invalid("jobs", "must not be empty"));
        }
        if r.jobs.len() > MAX_TIME_JOBS {
            return Err(invalid(
                "jobs",
                format!("{} jobs, {MAX_TIME_JOBS} at most", r.jobs.len()),
            ));
        }
        if r.pairs.len() > MAX_TIME_PAIRS {
            return Err(invalid(
                "pairs",
                format!("{} pairs, {MAX_TIME_PAIRS} at most", r.pairs.len()),
            ));
        }
        let allocations = if r.allocations.is_empty() {
            if r.max_gpus == 0 {
                return Err(invalid("max_gpus", "give allocations or max_gpus > 0"));
            }
            times::ymir_allocations(r.max_gpus.min(4096))
        } else {
            if r.allocations.len() > 1024 {
                return Err(invalid("allocations", "1024 values at most"));
            }
            if let Some(i) = r.allocations.iter().position(|&a| a > 4096) {
                return Err(invalid(&format!("allocations[{i}]"), "4096 GPUs at most"));
            }
            r.allocations
        };
        let mut pairs = Vec::with_capacity(r.pairs.len());
        for (i, p) in r.pairs.iter().enumerate() {
            let mode = mode_from_pb(&format!("pairs[{i}].mode"), p.mode)?;
            check_finite(&format!("pairs[{i}].gain_ab"), p.gain_ab)?;
            check_finite(&format!("pairs[{i}].gain_ba"), p.gain_ba)?;
            for (name, idx) in [("job_a", p.job_a), ("job_b", p.job_b)] {
                if idx as usize >= r.jobs.len() {
                    return Err(invalid(
                        &format!("pairs[{i}].{name}"),
                        format!("index {idx} is past the {} jobs", r.jobs.len()),
                    ));
                }
            }
            if p.job_a == p.job_b {
                return Err(invalid(
                    &format!("pairs[{i}].job_b"),
                    "a pair needs two different jobs",
                ));
            }
            pairs.push(PairInput {
                a: p.job_a as usize,
                b: p.job_b as usize,
                mode,
                gain_ab: p.gain_ab,
                gain_ba: p.gain_ba,
            });
        }
        let state = self.state.clone();
        let table = blocking(move || {
            let st = state.read().unwrap_or_else(|p| p.into_inner());
            let jobs = r
                .jobs
                .iter()
                .enumerate()
                .map(|(i, j)| time_input(i, j, &st.lut))
                .collect::<Result<Vec<_>, Status>>()?;
            let t =
                times::time_table(&st.lut, &jobs, &pairs, &allocations).map_err(|e| match e {
                    TimeError::Lut { .. } | TimeError::Pair { .. } | TimeError::Zero { .. } => {
                        Status::invalid_argument(e.to_string())
                    }
                })?;
            Ok::<_, Status>((jobs, t))
        })
        .await??;
        let (jobs, t) = table;
        let mut rows: Vec<pb::TimeRow> = jobs
            .iter()
            .zip(&t.jobs)
            .map(|(j, secs)| pb::TimeRow {
                job_a: j.id.clone(),
                job_b: String::new(),
                mode: pb::TransferMode::Normal as i32,
                seconds: secs.clone(),
                tran_wt: Vec::new(),
                iterations: j.remaining_iterations,
            })
            .collect();
        rows.extend(t.pairs.iter().map(|p| pb::TimeRow {
            job_a: jobs[p.pair.a].id.clone(),
            job_b: jobs[p.pair.b].id.clone(),
            mode: mode_to_pb(p.pair.mode) as i32,
            seconds: p.seconds.clone(),
            tran_wt: p.tran_wt.clone(),
            iterations: p.iterations,
        }));
        guard.ok();
        Ok(Response::new(pb::PredictJobTimesResponse {
            allocations: t.allocations,
            rows,
        }))
    }

    async fn lookup_throughput(
        &self,
        req: Request<pb::LookupThroughputRequest>,
    ) -> Result<Response<pb::LookupThroughputResponse>, Status> {
        let guard = self.metrics.start("LookupThroughput");
        let r = req.into_inner();
        let st = self.read();
        let (key, layers) = key_from_pb("key", r.key.as_ref(), &st.lut)?;
        let s = st
            .lut
            .step_time(&key, layers)
            .map_err(|e| lut_status("key", e))?;
        guard.ok();
        Ok(Response::new(pb::LookupThroughputResponse {
            step_time_seconds: s.step,
            sync_time_seconds: s.sync,
            feasible: s.feasible,
            interpolated: s.interpolated,
            context_switch_seconds: st
                .lut
                .context_switch_s(&key.model, &key.gpu_type)
                .unwrap_or(0.0),
        }))
    }

    async fn record_step_times(
        &self,
        req: Request<pb::RecordStepTimesRequest>,
    ) -> Result<Response<pb::RecordStepTimesResponse>, Status> {
        let guard = self.metrics.start("RecordStepTimes");
        let r = req.into_inner();
        if r.samples.is_empty() {
            return Err(invalid("samples", "must not be empty"));
        }
        if r.samples.len() > MAX_SAMPLES {
            return Err(invalid(
                "samples",
                format!("{} samples, {MAX_SAMPLES} at most", r.samples.len()),
            ));
        }
        let _learn = self.learn.lock().await;
        // Compute on a copy; persist; then swap in — a failed write leaves
        // the served table as it was.
        let (updated, accepted, rejected) = {
            let st = self.read();
            let mut lut = st.lut.clone();
            let (mut accepted, mut rejected) = (0u32, 0u32);
            let mut touched = Vec::new();
            for (i, s) in r.samples.iter().enumerate() {
                let f = format!("samples[{i}]");
                let (key, layers) = key_from_pb(&format!("{f}.key"), s.key.as_ref(), &lut)?;
                check_finite(&format!("{f}.step_time_seconds"), s.step_time_seconds)?;
                check_finite(&format!("{f}.sync_time_seconds"), s.sync_time_seconds)?;
                if s.step_time_seconds <= 0.0 {
                    return Err(invalid(&format!("{f}.step_time_seconds"), "must be > 0"));
                }
                if s.sync_time_seconds < 0.0 || s.sync_time_seconds > s.step_time_seconds {
                    return Err(invalid(
                        &format!("{f}.sync_time_seconds"),
                        "must be in [0, step_time_seconds]",
                    ));
                }
                match lut
                    .record(&key, s.step_time_seconds, s.sync_time_seconds, layers)
                    .map_err(|e| lut_status(&format!("{f}.key"), e))?
                {
                    Recorded::Accepted => {
                        accepted += 1;
                        touched.push(key);
                    }
                    Recorded::Outlier => rejected += 1,
                }
            }
            touched.sort();
            touched.dedup();
            let rows: Vec<(ThroughputKey, Measured)> = lut
                .measured()
                .filter(|(k, _)| touched.binary_search(k).is_ok())
                .map(|(k, m)| (k.clone(), *m))
                .collect();
            ((lut, rows), accepted, rejected)
        };
        let (lut, rows) = updated;
        if let Some(p) = &self.persistence {
            p.save_measurements(&rows)
                .await
                .map_err(Self::unavailable)?;
        }
        self.write().lut = lut;
        tracing::debug!(accepted, rejected, "step times recorded");
        guard.ok();
        Ok(Response::new(pb::RecordStepTimesResponse {
            accepted,
            rejected_outliers: rejected,
        }))
    }

    async fn import_profile(
        &self,
        req: Request<pb::ImportProfileRequest>,
    ) -> Result<Response<pb::ImportProfileResponse>, Status> {
        let guard = self.metrics.start("ImportProfile");
        let r = req.into_inner();
        let layout = r.layout.trim().to_string();
        check_name("layout", &layout)?;
        if layout != "fmsched" {
            check_name("model", &r.model)?;
            check_name("gpu_type", &r.gpu_type)?;
        }
        if r.model.len() > MAX_NAME || r.gpu_type.len() > MAX_NAME {
            return Err(invalid(
                "model",
                format!("model and gpu_type are {MAX_NAME} bytes at most"),
            ));
        }
        if r.csv.len() > MAX_CSV {
            return Err(invalid(
                "csv",
                format!("{} bytes, {MAX_CSV} at most", r.csv.len()),
            ));
        }
        let imported = ImportedProfile {
            model: r.model.clone(),
            gpu_type: analytic::gpu_family(&r.gpu_type),
            layout,
            csv: r.csv,
        };
        let _learn = self.learn.lock().await;
        let (lut, rows) = {
            let mut lut = self.read().lut.clone();
            let rows = lut
                .import_csv(
                    &imported.model,
                    &imported.gpu_type,
                    &imported.layout,
                    "csv",
                    &imported.csv,
                )
                .map_err(|e| match e {
                    LutError::Layout(_) => invalid("layout", e),
                    other => invalid("csv", other),
                })?;
            (lut, rows)
        };
        if let Some(p) = &self.persistence {
            p.save_import(&imported).await.map_err(Self::unavailable)?;
        }
        self.write().lut = lut;
        tracing::info!(model = %imported.model, gpu_type = %imported.gpu_type, layout = %imported.layout, rows, "profile imported");
        guard.ok();
        Ok(Response::new(pb::ImportProfileResponse {
            rows: rows as u32,
        }))
    }
}

/// Applies what was persisted to a fresh state (at start-up). Imports that
/// no longer parse are skipped with a warning rather than blocking start.
pub fn restore(state: &mut EstimatorState, learned: crate::persistence::Learned) {
    for imp in learned.imports {
        if let Err(e) = state.lut.import_csv(
            &imp.model,
            &imp.gpu_type,
            &imp.layout,
            "stored import",
            &imp.csv,
        ) {
            tracing::warn!(model = %imp.model, gpu_type = %imp.gpu_type, error = %e, "skipping a stored profile import");
        }
    }
    for (k, m) in learned.measurements {
        state.lut.restore_measured(k, m);
    }
    for (s, g) in learned.outcomes {
        state.gain.observe(s, g);
    }
}
