//! `JobService`: submit, get, list, cancel, watch.

use std::pin::Pin;
use std::time::Duration;

use chrono::Utc;
use fmsched_core::{JobId, JobSpec, JobState, UserName, ValidationContext};
use fmsched_estimator::analytic;
use fmsched_proto::convert::{
    job_spec_from_proto, job_spec_to_proto, job_state_from_proto, job_state_to_proto,
    timestamp_to_proto,
};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::job_service_server::JobService;
use futures_util::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{ApiError, check_len};
use crate::auth::Principal;
use crate::persistence::{JobEventRecord, JobQuery, JobRecord, JobSchedule, NewJob, SubmitOutcome};
use crate::service::Service;

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

pub struct JobApi {
    state: Service,
}

impl JobApi {
    pub fn new(state: Service) -> Self {
        Self { state }
    }

    fn principal<T>(&self, req: &Request<T>) -> Result<Principal, ApiError> {
        Ok(self.state.auth.authenticate(req.metadata())?)
    }

    /// Loads a job the caller may see; other users' jobs are NOT_FOUND so
    /// their existence does not leak.
    async fn visible_job(&self, who: &Principal, raw_id: &str) -> Result<JobRecord, ApiError> {
        let id = parse_job_id(raw_id)?;
        match self.state.persistence.get_job(id).await? {
            Some(job) if who.may_access(&job.owner.0) => Ok(job),
            _ => Err(ApiError::NotFound(format!("job {id} not found"))),
        }
    }

    fn notify(&self, id: JobId) {
        // No receivers is fine: nobody is watching.
        let _ = self.state.job_events.send(id);
    }
}

pub(crate) fn parse_job_id(raw: &str) -> Result<JobId, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::field("job_id", "is required"));
    }
    raw.parse()
        .map_err(|_| ApiError::field("job_id", format!("{:?} is not a UUID", truncate(raw, 64))))
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

pub fn job_to_proto(j: &JobRecord) -> pb::Job {
    let origin = j.created_at;
    let at = |s: f64| origin + chrono::Duration::milliseconds((s * 1000.0) as i64);
    // The steps on a clock that starts at submission (the round's rule).
    let deadline = j
        .spec
        .deadline
        .map(|d| (d - origin).num_milliseconds() as f64 / 1000.0);
    let reward_steps = j
        .spec
        .reward_steps(0.0, deadline)
        .into_iter()
        .map(|s| pb::RewardStep {
            by: Some(timestamp_to_proto(at(s.by))),
            reward: s.reward,
        })
        .collect();
    pb::Job {
        id: j.id.to_string(),
        owner: j.owner.0.clone(),
        spec: Some(job_spec_to_proto(&j.spec)),
        state: job_state_to_proto(j.state) as i32,
        state_reason: j.state_reason.clone(),
        created_at: Some(timestamp_to_proto(j.created_at)),
        updated_at: Some(timestamp_to_proto(j.updated_at)),
        output_path: j.output_path.clone().unwrap_or_default(),
        last_event_sequence: j.last_event_seq,
        idempotency_key: j.idempotency_key.clone().unwrap_or_default(),
        predicted_finish: None,
        at_risk: false,
        lease_until: None,
        reward_steps,
    }
}

/// [`job_to_proto`] with the last round's predictions and the lease.
fn scheduled_job_to_proto(j: &JobRecord, s: Option<&JobSchedule>) -> pb::Job {
    let mut p = job_to_proto(j);
    if let Some(s) = s.filter(|_| !j.state.is_terminal()) {
        p.predicted_finish = s.predicted_finish.map(timestamp_to_proto);
        p.at_risk = s.at_risk;
        p.lease_until = s.lease_until.map(timestamp_to_proto);
    }
    p
}

fn event_to_proto(e: &JobEventRecord) -> pb::JobEvent {
    let st = |s: Option<JobState>| s.map(|s| job_state_to_proto(s) as i32).unwrap_or(0);
    pb::JobEvent {
        sequence: e.seq,
        job_id: e.job_id.to_string(),
        time: Some(timestamp_to_proto(e.at)),
        kind: e.kind.clone(),
        from_state: st(e.from_state),
        to_state: st(e.to_state),
        message: e.message.clone(),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::JobEvent, Status>> + Send>>;
type LogStream = Pin<Box<dyn Stream<Item = Result<pb::JobLogChunk, Status>> + Send>>;

/// How long an agent may take to answer a log request.
const LOG_TIMEOUT: Duration = Duration::from_secs(5);

/// The node whose process serves global `rank` of `job` in `plan` (one
/// process per node serves all its ranks): Ok(None) when the job holds no
/// training GPUs now; an error naming the ranks when it runs on fewer.
fn rank_node(
    plan: &[crate::persistence::Assignment],
    job: JobId,
    rank: u32,
) -> Result<Option<fmsched_core::NodeId>, String> {
    let parts: Vec<_> = plan.iter().filter(|a| a.job == job && !a.profile).collect();
    if parts.is_empty() {
        return Ok(None);
    }
    let world: u32 = parts.iter().map(|a| a.gpus.len() as u32).sum();
    parts
        .iter()
        .find(|a| (a.rank_offset..a.rank_offset + a.gpus.len() as u32).contains(&rank))
        .map(|a| Some(a.node.clone()))
        .ok_or_else(|| {
            format!(
                "the job runs {world} ranks (0-{}) now",
                world.saturating_sub(1)
            )
        })
}

/// Finds the node holding `job`'s newest process log: where rank `rank`
/// runs now, else (rank 0 only) where any part of it runs, else any
/// connected node that has one. Returns the node and its first answer
/// (read from `offset`).
async fn find_log(
    state: &Service,
    job: JobId,
    rank: u32,
    req: &pb::LogRequest,
) -> Result<Option<(fmsched_core::NodeId, pb::LogData)>, Status> {
    let mut nodes: Vec<fmsched_core::NodeId> = Vec::new();
    let plan = state
        .persistence
        .current_plan()
        .await
        .map(|p| p.assignments)
        .unwrap_or_default();
    match rank_node(&plan, job, rank) {
        Ok(Some(n)) => nodes.push(n),
        Ok(None) if rank > 0 => {
            return Err(Status::failed_precondition(format!(
                "rank: job {job} does not run now; the output of a rank other than 0 is read while the job runs"
            )));
        }
        Ok(None) => {}
        Err(e) => {
            return Err(Status::invalid_argument(format!(
                "rank: {rank} is not a rank of job {job}: {e}"
            )));
        }
    }
    // Only the node running a rank other than 0 has its output; rank 0's
    // (or a job's that runs nowhere now) may be on any node.
    if rank == 0 {
        nodes.extend(plan.iter().filter(|a| a.job == job).map(|a| a.node.clone()));
        for n in state.registry.snapshot() {
            if !nodes.contains(&n.record.id) {
                nodes.push(n.record.id.clone());
            }
        }
    }
    for node in nodes {
        if let Some(d) = state
            .registry
            .request_log(&node, req.clone(), LOG_TIMEOUT)
            .await
            && !d.task_id.is_empty()
        {
            return Ok(Some((node, d)));
        }
    }
    Ok(None)
}

impl JobApi {
    /// A job may ask for a GPU family the estimator knows (it must estimate
    /// the job's times there) or one a registered node reports; anything
    /// else (a typo, a TPU) is refused rather than waiting forever. A known
    /// family no node has yet is accepted: the job waits with an
    /// `unschedulable` event naming it until such a node joins.
    fn check_gpu_model(&self, model: &str) -> Result<(), ApiError> {
        let fam = analytic::gpu_family(model);
        let known: Vec<&str> = analytic::GPUS.iter().map(|g| g.name).collect();
        let reported = self
            .state
            .registry
            .snapshot()
            .iter()
            .filter_map(|n| n.record.gpus.first())
            .any(|g| analytic::gpu_family(&g.model) == fam);
        if known.contains(&fam.as_str()) || reported {
            return Ok(());
        }
        Err(ApiError::field(
            "spec.resources.gpu_model",
            format!(
                "unknown GPU model {model:?}: give one of {} or a model a node of this cluster reports",
                known.join(", ")
            ),
        ))
    }

    /// The queue a job runs in: the one its spec names (it must exist,
    /// take jobs, allow the model and the user), else its user's.
    async fn queue_of(&self, spec: &JobSpec, who: &Principal) -> Result<String, ApiError> {
        let queues = match self
            .state
            .persistence
            .queue_setting()
            .await
            .map_err(ApiError::from)?
        {
            // Set live through the admin API (validated when set).
            Some(q) => fmsched_core::queue::Queues::new(q.queues).map_err(ApiError::Internal)?,
            None => self
                .state
                .config
                .scheduling
                .queue_set()
                .map_err(ApiError::Internal)?,
        };
        queues
            .resolve(&spec.queue, &who.user.0, who.admin, &spec.model)
            .map_err(|e| match e {
                fmsched_core::queue::QueueError::NotMember(f) => {
                    ApiError::PermissionDenied(f.to_string())
                }
                fmsched_core::queue::QueueError::Unknown(f)
                | fmsched_core::queue::QueueError::Model(f) => ApiError::InvalidArgument(f),
            })
    }

    /// Deadline admission at submit: whether a strict SLO job no schedule
    /// could finish in time must be refused (`(true, why)`), or a note for
    /// the user (`(false, why)`); and the job's best time alone when it
    /// meets its deadline (rounds for deadlines wait on it).
    fn admit_deadline(
        &self,
        spec: &JobSpec,
        now: chrono::DateTime<Utc>,
    ) -> (Option<(bool, String)>, Option<f64>) {
        match crate::round::shipped_lut() {
            Ok(lut) => {
                let check = crate::round::admission::check_deadline(
                    &lut,
                    &self.state.registry.snapshot(),
                    spec,
                    now,
                );
                let best_s = match check {
                    crate::round::admission::DeadlineCheck::Meets { best_s } => Some(best_s),
                    _ => None,
                };
                (check.verdict(spec.class()), best_s)
            }
            Err(e) => (
                Some((false, format!("deadline not checked at submit: {e}"))),
                None,
            ),
        }
    }

    /// A job was created: the prompt lane's wakes the lane; any other
    /// wakes the round loop, with its need and deadline for rounds for
    /// deadlines when it has one it can meet.
    fn wake_loops_for(&self, job: &JobRecord, best_s: Option<f64>, now: chrono::DateTime<Utc>) {
        if self.state.in_prompt_lane(job) {
            self.state.leader.wake_prompt_lane();
        } else {
            if let (Some(best_s), Some(by)) = (best_s, job.spec.deadline)
                && job.spec.class().has_deadline()
            {
                // Rounds for deadlines: what it needs from a round's
                // start, and by when.
                let left = (by - now).to_std().unwrap_or_default();
                self.state.leader.wait_for_deadline(
                    &job.id,
                    best_s,
                    tokio::time::Instant::now() + left,
                );
            }
            self.state.leader.wake_round();
        }
    }
}

#[tonic::async_trait]
impl JobService for JobApi {
    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let who = self.principal(&req)?;
        let req = req.into_inner();
        let limits = self.state.limits;
        check_len("idempotency_key", &req.idempotency_key, 256)?;
        let mut spec = job_spec_from_proto(
            req.spec
                .ok_or_else(|| ApiError::field("spec", "is required"))?,
        )
        .map_err(ApiError::from)?;
        spec.default_name();
        let now = Utc::now();
        spec.validate(&ValidationContext {
            now,
            models: &self.state.models,
            limits,
        })
        .map_err(ApiError::from)?;
        spec.apply_kind_defaults();
        if let Some(m) = &spec.resources.gpu_model {
            self.check_gpu_model(m)?;
        }
        spec.queue = self.queue_of(&spec, &who).await?;
        let (deadline_note, best_s) = self.admit_deadline(&spec, now);
        if let Some((true, why)) = &deadline_note {
            return Err(ApiError::FailedPrecondition(format!("spec.deadline: {why}")).into());
        }

        let key = (!req.idempotency_key.is_empty()).then_some(req.idempotency_key.as_str());
        let id = JobId::new_v7();
        let outcome = self
            .state
            .persistence
            .submit_job(NewJob {
                id,
                owner: &who.user,
                spec: &spec,
                idempotency_key: key,
                now,
            })
            .await
            .map_err(ApiError::from)?;
        // Said at once, not only by the round once the job is queued.
        let never_fits =
            crate::round::never_fits_on(&self.state.config, &self.state.registry.snapshot(), &spec);
        let warnings: Vec<String> = never_fits
            .iter()
            .map(|why| format!("no set of the registered nodes can ever hold this job: {why}; it waits until such nodes join"))
            .chain(deadline_note.map(|(_, why)| why))
            .collect();
        let (job, created) = match outcome {
            SubmitOutcome::Created(job) => {
                if let Some(why) = &never_fits
                    && let Err(e) = self
                        .state
                        .persistence
                        .note(job.id, "unschedulable", &format!("waiting: {why}"), now)
                        .await
                {
                    // The round says it again once the job is queued.
                    tracing::warn!(job_id = %job.id, error = %e, "unschedulable event not written at submit");
                }
                tracing::info!(job_id = %job.id, owner = %who.user, model = %spec.model, task = %spec.dataset.task,
                    min_gpus = spec.resources.min_gpus, max_gpus = spec.resources.max_gpus, "job submitted");
                for w in &warnings {
                    tracing::warn!(job_id = %job.id, "{w}");
                }
                self.notify(job.id);
                self.wake_loops_for(&job, best_s, now);
                (job, true)
            }
            SubmitOutcome::Existing(job) if job.spec == spec => (job, false),
            SubmitOutcome::Existing(job) => {
                return Err(ApiError::AlreadyExists(format!(
                    "idempotency_key {:?} was already used for job {} with a different spec",
                    req.idempotency_key, job.id
                ))
                .into());
            }
        };
        Ok(Response::new(pb::SubmitJobResponse {
            job: Some(job_to_proto(&job)),
            created,
            warnings,
        }))
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let who = self.principal(&req)?;
        let job = self.visible_job(&who, &req.get_ref().job_id).await?;
        let s = self
            .state
            .persistence
            .job_schedules(&[job.id])
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(scheduled_job_to_proto(&job, s.get(&job.id))))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let who = self.principal(&req)?;
        let req = req.into_inner();
        check_len("owner", &req.owner, 253)?;
        let owner = match (req.owner.is_empty(), who.admin) {
            (true, true) => None,
            (true, false) => Some(who.user.clone()),
            (false, _) if who.may_access(&req.owner) => Some(UserName(req.owner.clone())),
            (false, _) => {
                return Err(ApiError::PermissionDenied(
                    "owner: users may only list their own jobs".into(),
                )
                .into());
            }
        };
        let mut states = Vec::new();
        for (i, s) in req.states.iter().enumerate() {
            if let Some(s) =
                job_state_from_proto(&format!("states[{i}]"), *s).map_err(ApiError::from)?
            {
                states.push(s);
            }
        }
        let before =
            if req.page_token.is_empty() {
                None
            } else {
                Some(req.page_token.parse::<JobId>().map_err(|_| {
                    ApiError::field("page_token", "is not a token this server issued")
                })?)
            };
        let limit = match req.page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let jobs = self
            .state
            .persistence
            .list_jobs(&JobQuery {
                owner,
                states,
                before,
                limit,
            })
            .await
            .map_err(ApiError::from)?;
        let ids: Vec<JobId> = jobs
            .iter()
            .filter(|j| !j.state.is_terminal())
            .map(|j| j.id)
            .collect();
        let schedules = self
            .state
            .persistence
            .job_schedules(&ids)
            .await
            .map_err(ApiError::from)?;
        let next_page_token = if jobs.len() as u32 == limit {
            jobs.last().map(|j| j.id.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListJobsResponse {
            jobs: jobs
                .iter()
                .map(|j| scheduled_job_to_proto(j, schedules.get(&j.id)))
                .collect(),
            next_page_token,
        }))
    }

    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let who = self.principal(&req)?;
        let req = req.into_inner();
        check_len("reason", &req.reason, 4096)?;
        let job = self.visible_job(&who, &req.job_id).await?;
        let reason = if req.reason.is_empty() {
            format!("cancelled by {}", who.user)
        } else {
            format!("cancelled by {}: {}", who.user, req.reason)
        };
        let updated = self
            .state
            .persistence
            .transition_job(job.id, JobState::Cancelled, &reason, Utc::now())
            .await
            .map_err(ApiError::from)?;
        if job.state != updated.state {
            tracing::info!(job_id = %job.id, by = %who.user, from = %job.state, "job cancelled");
            self.notify(job.id);
        }
        Ok(Response::new(job_to_proto(&updated)))
    }

    type WatchJobStream = EventStream;
    type GetJobLogsStream = LogStream;

    async fn get_job_logs(
        &self,
        req: Request<pb::GetJobLogsRequest>,
    ) -> Result<Response<Self::GetJobLogsStream>, Status> {
        let who = self.principal(&req)?;
        let req = req.into_inner();
        let job = self.visible_job(&who, &req.job_id).await?;
        let tail = if req.tail_bytes == 0 {
            64 << 10
        } else {
            req.tail_bytes
        };
        let mut lr = pb::LogRequest {
            request_id: 0,
            job_id: job.id.to_string(),
            stderr: req.stderr,
            offset: -i64::from(tail),
            max_bytes: 1 << 20,
            profile: req.profile,
        };
        let rank = req.rank;
        let profile = req.profile;
        if profile && rank > 0 {
            return Err(ApiError::field(
                "rank",
                "a profiling run is one process on one node: only rank 0",
            )
            .into());
        }
        let Some((mut node, first)) = find_log(&self.state, job.id, rank, &lr).await? else {
            return Err(Status::not_found(format!(
                "no log of job {} on any connected node (it has not run yet, or its node is offline)",
                job.id
            )));
        };
        if !first.error.is_empty() {
            return Err(Status::unavailable(first.error));
        }
        let (tx, rx) = mpsc::channel(16);
        let state = self.state.clone();
        let follow = req.follow;
        tokio::spawn(async move {
            let mut data = first;
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                let empty = data.data.is_empty();
                if !empty {
                    let chunk = pb::JobLogChunk {
                        data: std::mem::take(&mut data.data),
                        node_id: node.to_string(),
                        task_id: data.task_id.clone(),
                    };
                    if tx.send(Ok(chunk)).await.is_err() {
                        return; // client went away
                    }
                }
                lr.offset = data.next_offset as i64;
                let task = data.task_id.clone();
                if empty {
                    if !follow {
                        return;
                    }
                    // Follow until the job (its profiling run) has ended
                    // and its log is drained.
                    match log_is_over(&state, job.id, profile).await {
                        Ok(true) => return,
                        Ok(false) => {}
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tick.tick() => {}
                    }
                    // The job moved to another node (resumed elsewhere after
                    // its node went offline, a new placement): follow its
                    // log there, from the start.
                    if !profile
                        && let Some((a, fresh, d)) =
                            moved_log(&state, job.id, rank, &node, &lr).await
                    {
                        node = a;
                        lr = fresh;
                        data = d;
                        continue;
                    }
                }
                data = match state
                    .registry
                    .request_log(&node, lr.clone(), LOG_TIMEOUT)
                    .await
                {
                    Some(d) if d.error.is_empty() => d,
                    Some(d) => {
                        let _ = tx.send(Err(Status::unavailable(d.error))).await;
                        return;
                    }
                    // The node is gone; when following, wait: it comes back,
                    // or the job moves (checked above), or it ends.
                    None if follow => pb::LogData {
                        task_id: task.clone(),
                        next_offset: lr.offset.max(0) as u64,
                        ..Default::default()
                    },
                    None => {
                        let _ = tx
                            .send(Err(Status::unavailable(format!(
                                "node {node} stopped answering"
                            ))))
                            .await;
                        return;
                    }
                };
                // Another process of the job here now (a merge, a split, a
                // standby started): its log from the start.
                if !data.task_id.is_empty() && data.task_id != task && lr.offset != 0 {
                    lr.offset = 0;
                    data = match state
                        .registry
                        .request_log(&node, lr.clone(), LOG_TIMEOUT)
                        .await
                    {
                        Some(d) if d.error.is_empty() => d,
                        // Nothing read: from the start next time.
                        _ => pb::LogData {
                            task_id: data.task_id.clone(),
                            ..Default::default()
                        },
                    };
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn watch_job(
        &self,
        req: Request<pb::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let who = self.principal(&req)?;
        let req = req.into_inner();
        let job = self.visible_job(&who, &req.job_id).await?;
        let (tx, rx) = mpsc::channel(64);
        let mut wake = self.state.job_events.subscribe();
        let persistence = self.state.persistence.clone();
        let id = job.id;
        let mut after = req.after_sequence.max(0);
        tokio::spawn(async move {
            // Poll as a fallback so events written by another scheduler
            // replica still arrive; in-process writes wake us at once.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                let events = match persistence.job_events(id, after, 500).await {
                    Ok(ev) => ev,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(ApiError::from(e)))).await;
                        return;
                    }
                };
                let mut finished = false;
                for e in &events {
                    after = e.seq;
                    finished |= e.to_state.is_some_and(JobState::is_terminal);
                    if tx.send(Ok(event_to_proto(e))).await.is_err() {
                        return; // client went away
                    }
                }
                if finished {
                    return;
                }
                if events.len() == 500 {
                    continue;
                }
                // History may end before a terminal event for a job that was
                // already terminal when its events were pruned; check state.
                if events.is_empty() {
                    match persistence.get_job(id).await {
                        Ok(Some(j)) if j.state.is_terminal() && j.last_event_seq <= after => return,
                        _ => {}
                    }
                }
                // Sleep until this job changes here, the poll tick fires, or
                // the client leaves; other jobs' events do not wake us.
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tick.tick() => break,
                        r = wake.recv() => match r {
                            Ok(changed) if changed == id => break,
                            Ok(_) => {}
                            Err(broadcast::error::RecvError::Lagged(_)) => break,
                            Err(broadcast::error::RecvError::Closed) => return,
                        },
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
/// Whether a followed log is over: its job has ended (its profiling run,
/// for a profiling log).
async fn log_is_over(state: &Service, job: JobId, profile: bool) -> Result<bool, Status> {
    match state.persistence.get_job(job).await {
        Ok(Some(j)) => Ok(j.state.is_terminal()
            || (profile && !matches!(j.state, JobState::Submitted | JobState::Profiling))),
        Ok(None) => Ok(false),
        Err(e) => Err(Status::from(ApiError::from(e))),
    }
}

/// Where a followed job's rank now runs when the plan moved it off `node`
/// (resumed elsewhere after its node went offline, a new placement): that
/// node, the request for its log from the start, and the first of it.
async fn moved_log(
    state: &Service,
    job: JobId,
    rank: u32,
    node: &fmsched_core::NodeId,
    lr: &pb::LogRequest,
) -> Option<(fmsched_core::NodeId, pb::LogRequest, pb::LogData)> {
    let plan = state.persistence.current_plan().await.ok()?;
    let a = rank_node(&plan.assignments, job, rank).ok()??;
    if &a == node {
        return None;
    }
    let fresh = pb::LogRequest {
        offset: 0,
        ..lr.clone()
    };
    let d = state
        .registry
        .request_log(&a, fresh.clone(), LOG_TIMEOUT)
        .await
        .filter(|d| d.error.is_empty() && !d.task_id.is_empty())?;
    Some((a, fresh, d))
}
