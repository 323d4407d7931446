//! Where the scheduling loop gets its estimates: the estimator service
//! (`[estimates] endpoint`) — which learns from imported profiles, measured
//! step times and merge outcomes — or, when none is configured or it does
//! not answer in time, the same estimator code in-process with the shipped
//! profiles. A fallback is logged and counted, never silent.
//!
//! Owns: the client connection. Does not own: what is estimated (the round
//! builds the inputs) nor the estimator's learned state.

use std::time::Duration;

use fmsched_estimator::lut::Lut;
use fmsched_estimator::times::{self, JobInput, PairInput, PairTimes, TimeTable};
use fmsched_estimator::transfer::{GainModel, TaskEmbedding, spatial_score, temporal_score};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::estimator_service_client::EstimatorServiceClient;
use tonic::transport::Channel;

/// Predicted gains of the pairs of a set of embeddings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gains {
    /// `(a, b) → G_{A,B}` for A ↦ B, every ordered pair.
    pub temporal: std::collections::BTreeMap<(usize, usize), f64>,
    /// `(a, b) → G` for A ‖ B with a < b (the spatial score is symmetric).
    pub spatial: std::collections::BTreeMap<(usize, usize), f64>,
}

/// The estimator the loop talks to.
pub struct EstimatorClient {
    /// The client (its channel carries the timeout) and the endpoint for
    /// error messages.
    remote: Option<(EstimatorServiceClient<Channel>, String)>,
    /// Processes (task id, pid) whose step time the service was sent.
    taught: std::sync::Mutex<std::collections::BTreeSet<(String, u32)>>,
}

impl EstimatorClient {
    /// A lazily connecting client when `endpoint` is set.
    pub fn new(endpoint: Option<&str>, timeout: Duration) -> Result<Self, String> {
        let remote = match endpoint {
            Some(e) => {
                let ch = Channel::from_shared(e.to_string())
                    .map_err(|err| format!("estimates.endpoint: {e:?}: {err}"))?
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .connect_lazy();
                Some((EstimatorServiceClient::new(ch), e.to_string()))
            }
            None => None,
        };
        Ok(Self {
            remote,
            taught: Default::default(),
        })
    }

    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Transfer gains of every pair (Ymir §4.1: Task2Vec score → linear
    /// regression → `G`, Eq. 1). `Err` carries why the service failed; the
    /// caller falls back to [`local_gains`].
    pub async fn gains(&self, tasks: &[(String, TaskEmbedding)]) -> Result<Gains, String> {
        let Some((client, endpoint)) = &self.remote else {
            return Ok(local_gains(tasks));
        };
        if tasks.len() < 2 {
            return Ok(Gains::default());
        }
        let req = pb::ScoreTransferRequest {
            tasks: tasks
                .iter()
                .map(|(id, e)| pb::TaskEmbedding {
                    job_id: id.clone(),
                    fisher: e.fisher.clone(),
                    fisher_repeat: e.fisher_repeat.clone(),
                })
                .collect(),
        };
        let resp = client
            .clone()
            .score_transfer(req)
            .await
            .map_err(|s| format!("{endpoint}: ScoreTransfer: {}", s.message()))?
            .into_inner();
        let index: std::collections::BTreeMap<&str, usize> = tasks
            .iter()
            .enumerate()
            .map(|(k, (id, _))| (id.as_str(), k))
            .collect();
        let mut g = Gains::default();
        for p in resp.pairs {
            let (Some(&a), Some(&b)) = (index.get(p.job_a.as_str()), index.get(p.job_b.as_str()))
            else {
                continue;
            };
            match pb::TransferMode::try_from(p.mode) {
                Ok(pb::TransferMode::Temporal) => {
                    g.temporal.insert((a, b), p.gain);
                }
                Ok(pb::TransferMode::Spatial) => {
                    g.spatial.insert((a.min(b), a.max(b)), p.gain);
                }
                _ => {}
            }
        }
        Ok(g)
    }

    /// Ymir Eq. 5 table for the jobs and pairs, with `TranWt` (Eq. 12–13).
    pub async fn times(
        &self,
        jobs: &[JobInput],
        pairs: &[PairInput],
        allocations: &[u32],
    ) -> Result<TimeTable, String> {
        let Some((client, endpoint)) = &self.remote else {
            return Err("no estimator service configured".into());
        };
        let req = pb::PredictJobTimesRequest {
            jobs: jobs.iter().map(job_to_proto).collect(),
            pairs: pairs
                .iter()
                .map(|p| pb::PairInput {
                    job_a: p.a as u32,
                    job_b: p.b as u32,
                    mode: mode_to_proto(p.mode) as i32,
                    gain_ab: p.gain_ab,
                    gain_ba: p.gain_ba,
                })
                .collect(),
            allocations: allocations.to_vec(),
            max_gpus: allocations.iter().copied().max().unwrap_or(0),
        };
        let resp = client
            .clone()
            .predict_job_times(req)
            .await
            .map_err(|s| format!("{endpoint}: PredictJobTimes: {}", s.message()))?
            .into_inner();
        if resp.rows.len() != jobs.len() + pairs.len() || resp.allocations != allocations {
            return Err(format!(
                "{endpoint}: PredictJobTimes answered {} rows for {} allocations, expected {} for {}",
                resp.rows.len(),
                resp.allocations.len(),
                jobs.len() + pairs.len(),
                allocations.len()
            ));
        }
        let mut rows = resp.rows.into_iter();
        let job_rows: Vec<Vec<f64>> = rows.by_ref().take(jobs.len()).map(|r| r.seconds).collect();
        let pair_rows = pairs
            .iter()
            .zip(rows)
            .map(|(p, r)| PairTimes {
                pair: *p,
                iterations: r.iterations,
                seconds: r.seconds,
                tran_wt: r.tran_wt,
            })
            .collect();
        Ok(TimeTable {
            allocations: allocations.to_vec(),
            jobs: job_rows,
            pairs: pair_rows,
        })
    }

    /// Feeds measured step times back (the service updates its LUT online).
    /// True the first time a process (task id, pid) is named: its step time
    /// is sent once, not every round (each sample is a write on the
    /// service). Forgets everything past 100,000 processes.
    pub fn first_sample_of(&self, task_id: &str, pid: u32) -> bool {
        let mut t = self.taught.lock().unwrap_or_else(|p| p.into_inner());
        if t.len() >= 100_000 {
            t.clear();
        }
        t.insert((task_id.to_string(), pid))
    }

    /// Teaches the estimator's gain regression an observed merge outcome
    /// (Ymir §4.1: Task2Vec score → `G`). Returns the regression after it
    /// learned — (intercept, slope, merges observed) — or None when no
    /// estimator service is configured (the in-process estimator keeps its
    /// prior: it has nowhere to persist what it would learn).
    pub async fn record_transfer_outcome(
        &self,
        score: f64,
        gain: f64,
    ) -> Result<Option<(f64, f64, u64)>, String> {
        let Some((client, endpoint)) = &self.remote else {
            return Ok(None);
        };
        let r = client
            .clone()
            .record_transfer_outcome(pb::RecordTransferOutcomeRequest { score, gain })
            .await
            .map_err(|s| format!("{endpoint}: RecordTransferOutcome: {}", s.message()))?
            .into_inner();
        Ok(Some((r.intercept, r.slope, r.observed_merges)))
    }

    pub async fn record_step_times(&self, samples: Vec<pb::StepTimeSample>) -> Result<(), String> {
        let Some((client, endpoint)) = &self.remote else {
            return Ok(());
        };
        if samples.is_empty() {
            return Ok(());
        }
        client
            .clone()
            .record_step_times(pb::RecordStepTimesRequest { samples })
            .await
            .map(|_| ())
            .map_err(|s| format!("{endpoint}: RecordStepTimes: {}", s.message()))
    }
}

/// In-process gains: the estimator's prior regression (nothing learned).
pub fn local_gains(tasks: &[(String, TaskEmbedding)]) -> Gains {
    let m = GainModel::default();
    let mut g = Gains::default();
    for (a, (_, ea)) in tasks.iter().enumerate() {
        for (b, (_, eb)) in tasks.iter().enumerate() {
            if a != b {
                g.temporal.insert((a, b), m.predict(temporal_score(ea, eb)));
                if a < b {
                    g.spatial.insert((a, b), m.predict(spatial_score(ea, eb)));
                }
            }
        }
    }
    g
}

/// In-process time table.
pub fn local_times(
    lut: &Lut,
    jobs: &[JobInput],
    pairs: &[PairInput],
    allocations: &[u32],
) -> Result<TimeTable, String> {
    times::time_table(lut, jobs, pairs, allocations).map_err(|e| e.to_string())
}

fn mode_to_proto(m: times::MergeMode) -> pb::TransferMode {
    match m {
        times::MergeMode::Temporal => pb::TransferMode::Temporal,
        times::MergeMode::Spatial => pb::TransferMode::Spatial,
    }
}

fn job_to_proto(j: &JobInput) -> pb::JobTimeInput {
    pb::JobTimeInput {
        job_id: j.id.clone(),
        model: j.model.clone(),
        gpu_type: j.gpu_type.clone(),
        global_batch_size: j.global_batch,
        remaining_iterations: j.remaining_iterations,
        done_iterations: j.done_iterations,
        max_iterations: j.max_iterations,
        samples_per_epoch: j.samples_per_epoch,
        curve: j.curve.as_ref().map(|c| pb::LossCurve {
            beta0: c.beta0,
            beta1: c.beta1,
            beta2: c.beta2,
            beta3: c.beta3,
            quality: c.quality,
        }),
        pipeline_parallel: j.variant.pipeline,
        amp: j.variant.amp,
        frozen_layers: j.variant.frozen_layers,
        gradient_checkpointing: j.variant.gradient_checkpointing,
        petl: j.variant.petl.clone(),
        gpus_per_node: j.gpus_per_node,
        layer_variance: j
            .layer_tuning
            .as_ref()
            .map_or_else(Vec::new, |t| t.variance.clone()),
        max_frozen_layers: j.layer_tuning.as_ref().map_or(0, |t| t.max_frozen),
        expert_parallel: j.variant.expert_parallel,
    }
}
