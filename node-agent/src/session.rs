//! The agent's session with the scheduler: dial, register, heartbeat,
//! receive plans; on any failure reconnect with exponential backoff and
//! jitter. A refused join token or registration ends the agent (retrying
//! cannot fix a configuration error).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use fmsched_proto::convert::{duration_from_proto, timestamp_from_proto, timestamp_to_proto};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::agent_service_client::AgentServiceClient;
use fmsched_runtime::Secret;
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::config::AgentConfig;
use crate::driver::{DriverConfig, ProcessDriver};
use crate::gpu::GpuBackend;
use crate::reconcile::Reconciler;

/// Exponential backoff with "equal jitter": half the delay fixed, half random,
/// so a fleet of agents restarting together does not reconnect in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial,
        }
    }

    /// Next delay to wait, then doubles the base (capped).
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = base / 2;
        half + half.mul_f64(rng.random::<f64>())
    }

    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The scheduler refused us for a reason retrying will not fix.
    #[error("scheduler refused the agent: {0}")]
    Refused(String),
    #[error("{0}")]
    Retry(String),
}

/// A running agent: its GPUs, its identity and the newest plan generation.
pub struct Agent {
    cfg: AgentConfig,
    node_id: String,
    /// Random id of this process: the scheduler refuses a second agent with
    /// the same node id while this one's session lives.
    instance_id: String,
    join_token: Option<Secret>,
    /// The node's own credential (issued at enrolment, kept in
    /// `node_token_file`).
    node_token: std::sync::Mutex<Option<Secret>>,
    gpus: Arc<dyn GpuBackend>,
    applied_generation: AtomicI64,
    /// Newest leadership term heard from a scheduler: plans of an older
    /// term (a deposed leader's) are ignored.
    leader_epoch: AtomicI64,
    reconciler: Arc<Reconciler>,
    /// The processes a previous agent left were looked for (once, at the
    /// first registration).
    orphans_checked: std::sync::atomic::AtomicBool,
    /// Index into the endpoint list of the replica to dial next.
    endpoint: std::sync::atomic::AtomicUsize,
}

impl Agent {
    /// `join_token` may be None when the node holds a node token
    /// (`node_token_file`); [`Agent::new`] reads that file.
    pub fn new(cfg: AgentConfig, join_token: Option<Secret>, gpus: Arc<dyn GpuBackend>) -> Self {
        let node_id = cfg.resolved_node_id();
        let node_token = read_node_token(&cfg.resolved_node_token_file());
        let driver = Arc::new(ProcessDriver::new(DriverConfig {
            work_dir: cfg.processes.work_dir.clone(),
            checkpoint_timeout: cfg.processes.checkpoint_timeout,
            grace: cfg.processes.grace,
            checkpoint_interval: cfg.processes.checkpoint_interval,
            pass_env: cfg.processes.pass_env.clone(),
            // Checked by `AgentConfig::validate` before an agent starts.
            run_as: cfg.trainer_identity().ok().flatten(),
        }));
        let reconciler = Arc::new(
            Reconciler::new(driver, gpus.clone()).with_max_standby(cfg.processes.max_standby),
        );
        Self {
            cfg,
            node_id,
            instance_id: format!("{:032x}", rand::random::<u128>()),
            join_token,
            node_token: std::sync::Mutex::new(node_token),
            gpus,
            applied_generation: AtomicI64::new(0),
            leader_epoch: AtomicI64::new(0),
            reconciler,
            orphans_checked: Default::default(),
            endpoint: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The reconciler that runs this node's processes.
    pub fn reconciler(&self) -> Arc<Reconciler> {
        self.reconciler.clone()
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Highest plan generation accepted.
    pub fn applied_generation(&self) -> i64 {
        self.applied_generation.load(Ordering::SeqCst)
    }

    /// The endpoint this session dials.
    fn current_endpoint(&self) -> String {
        let eps = self.cfg.endpoints();
        eps[self.endpoint.load(Ordering::SeqCst) % eps.len().max(1)].clone()
    }

    async fn channel(&self) -> Result<Channel, SessionError> {
        let endpoint = self.current_endpoint();
        let retry = |e: &dyn std::fmt::Display| {
            SessionError::Retry(format!("connecting to {endpoint}: {e}"))
        };
        let mut ep = Endpoint::from_shared(endpoint.clone())
            .map_err(|e| SessionError::Refused(format!("scheduler_endpoint: {e}")))?
            .connect_timeout(self.cfg.reconnect.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(15))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some(ca) = &self.cfg.tls.ca_cert_path {
            let pem = std::fs::read(ca).map_err(|e| {
                SessionError::Refused(format!("tls.ca_cert_path {}: {e}", ca.display()))
            })?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            if let Some(d) = &self.cfg.tls.domain_name {
                tls = tls.domain_name(d.clone());
            }
            ep = ep
                .tls_config(tls)
                .map_err(|e| SessionError::Refused(format!("tls: {e}")))?;
        }
        ep.connect().await.map_err(|e| retry(&e))
    }

    /// Asks the replica's gRPC health service whether it serves agents,
    /// within `reconnect.probe_timeout`: a frozen replica (SIGSTOP, a
    /// stalled VM) still completes the TCP handshake in its kernel but
    /// answers nothing, and the session's opening would wait on it.
    async fn probe(&self, channel: Channel) -> Result<(), SessionError> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let timeout = self.cfg.reconnect.probe_timeout;
        let mut health = HealthClient::new(channel);
        let check = health.check(HealthCheckRequest {
            service: "fmsched.v1.AgentService".into(),
        });
        match tokio::time::timeout(timeout, check).await {
            Err(_) => Err(SessionError::Retry(format!(
                "{} did not answer a health check within {timeout:?} (frozen or overloaded)",
                self.current_endpoint()
            ))),
            Ok(Ok(r)) if r.get_ref().status != ServingStatus::Serving as i32 => {
                Err(SessionError::Retry(format!(
                    "{} does not serve agents (health status {})",
                    self.current_endpoint(),
                    r.get_ref().status
                )))
            }
            // Serving; or a scheduler without the health service, which
            // the session's own answer judges.
            Ok(_) => Ok(()),
        }
    }

    fn register_message(&self) -> pb::AgentMessage {
        pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Register(pb::Register {
                node_id: self.node_id.clone(),
                hostname: crate::config::hostname(),
                gpus: self.gpus.inventory(),
                labels: self.cfg.labels.clone().into_iter().collect(),
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                join_token: self
                    .join_token
                    .as_ref()
                    .map(|t| t.expose().to_string())
                    .unwrap_or_default(),
                gpu_backend: self.gpus.kind().to_string(),
                applied_generation: self.applied_generation(),
                tasks: Vec::new(),
                address: self.cfg.address.clone().unwrap_or_default(),
                node_token: self
                    .node_token()
                    .map(|t| t.expose().to_string())
                    .unwrap_or_default(),
                instance_id: self.instance_id.clone(),
            })),
        }
    }

    /// The node token held now, if any.
    pub fn node_token(&self) -> Option<Secret> {
        self.node_token
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Keeps a node token the scheduler issued: in memory for the next
    /// registrations, and in `node_token_file` for the next start. A file
    /// that cannot be written is a warning: the node enrolls again with the
    /// join token next time.
    fn keep_node_token(&self, token: &str) {
        *self.node_token.lock().unwrap_or_else(|p| p.into_inner()) = Some(Secret::new(token));
        let path = self.cfg.resolved_node_token_file();
        match write_node_token(&path, token) {
            Ok(()) => tracing::info!(path = %path.display(), "enrolled: node token kept"),
            Err(e) => tracing::warn!(path = %path.display(), error = %e,
                "enrolled, but the node token could not be saved; the join token will be needed after a restart"),
        }
    }

    async fn heartbeat(&self, seq: u64) -> pb::AgentMessage {
        let gpus = self.gpus.clone();
        let telemetry = tokio::task::spawn_blocking(move || gpus.sample())
            .await
            .unwrap_or_default();
        pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
                sequence: seq,
                time: Some(timestamp_to_proto(chrono::Utc::now())),
                gpus: telemetry,
                tasks: self.reconciler.observed().await,
                applied_generation: self.applied_generation(),
                warm: self.reconciler.warm_report(),
            })),
        }
    }

    /// Newest leadership term heard from a scheduler.
    pub fn leader_epoch(&self) -> i64 {
        self.leader_epoch.load(Ordering::SeqCst)
    }

    /// Notes the term of the scheduler that spoke; false when it is older
    /// than one heard before (a deposed leader).
    fn note_epoch(&self, epoch: i64) -> bool {
        epoch >= self.leader_epoch.fetch_max(epoch, Ordering::SeqCst)
    }

    /// Accepts a plan unless it comes from an older leadership term than
    /// one already heard from, or is older than what was already applied.
    /// Returns whether it was accepted.
    pub fn accept_plan(&self, plan: &pb::NodePlan) -> bool {
        if !self.note_epoch(plan.epoch) {
            tracing::warn!(
                generation = plan.generation,
                epoch = plan.epoch,
                newest_epoch = self.leader_epoch(),
                "ignoring a plan from a deposed leader"
            );
            return false;
        }
        let prev = self
            .applied_generation
            .fetch_max(plan.generation, Ordering::SeqCst);
        if plan.generation < prev {
            tracing::info!(
                generation = plan.generation,
                applied = prev,
                "ignoring stale plan"
            );
            return false;
        }
        tracing::info!(
            generation = plan.generation,
            epoch = plan.epoch,
            tasks = plan.tasks.len(),
            "plan received"
        );
        true
    }

    /// One session: returns when the scheduler closes it or it breaks.
    /// `on_registered` is called once the scheduler acknowledged us.
    pub async fn session_once(
        &self,
        on_registered: &mut (dyn FnMut() + Send),
    ) -> Result<(), SessionError> {
        let channel = self.channel().await?;
        self.probe(channel.clone()).await?;
        let mut client = AgentServiceClient::new(channel);
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(16);
        tx.send(self.register_message())
            .await
            .map_err(|_| SessionError::Retry("outbound closed".into()))?;
        let timeout = self.cfg.reconnect.register_timeout;
        let registered = tokio::time::timeout(timeout, async {
            let mut inbound = match client.session(ReceiverStream::new(rx)).await {
                Ok(r) => r.into_inner(),
                Err(s) => return Err(classify(s)),
            };
            let ack = register_ack(&mut inbound).await?;
            Ok((inbound, ack))
        })
        .await
        .map_err(|_| {
            SessionError::Retry(format!(
                "{} did not acknowledge the registration within {timeout:?}",
                self.current_endpoint()
            ))
        })?;
        let (mut inbound, ack) = registered?;
        if !ack.node_token.is_empty() {
            self.keep_node_token(&ack.node_token);
        }
        if !self.note_epoch(ack.epoch) {
            return Err(SessionError::Retry(format!(
                "the scheduler at {} leads an older term ({}) than one already heard ({})",
                self.current_endpoint(),
                ack.epoch,
                self.leader_epoch()
            )));
        }
        let interval = ack
            .heartbeat_interval
            .as_ref()
            .and_then(duration_from_proto)
            .filter(|d| !d.is_zero())
            .unwrap_or(self.cfg.heartbeat_interval);
        let silence = self.cfg.reconnect.silence_after(interval);
        let mut heard = tokio::time::Instant::now();
        tracing::info!(node_id = %self.node_id, endpoint = %self.current_endpoint(), heartbeat = ?interval, "registered with scheduler");
        on_registered();
        self.stop_orphans_once().await;

        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seq = 0u64;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(heard + silence) => {
                    return Err(SessionError::Retry(format!(
                        "the scheduler at {} said nothing for {silence:?} (frozen or cut off)",
                        self.current_endpoint()
                    )));
                }
                _ = tick.tick() => {
                    seq += 1;
                    let p = &self.cfg.processes;
                    let rotated = self
                        .reconciler
                        .driver()
                        .rotate_logs(p.max_log_bytes, p.log_files)
                        .await;
                    if rotated > 0 {
                        tracing::info!(rotated, "process logs rotated");
                    }
                    // Stopping an expired standby waits for its exit: off
                    // the heartbeat's path.
                    let r = self.reconciler.clone();
                    tokio::spawn(async move {
                        r.expire_standby().await;
                        r.expire_warm().await;
                    });
                    let hb = self.heartbeat(seq).await;
                    if tx.send(hb).await.is_err() {
                        return Err(SessionError::Retry("outbound stream closed".into()));
                    }
                }
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => {
                        heard = tokio::time::Instant::now();
                        self.on_message(m, &tx)?;
                    }
                    Ok(None) => return Ok(()),
                    Err(s) => return Err(classify(s)),
                }
            }
        }
    }

    /// One message of the scheduler: a heartbeat's acknowledgement (a
    /// deposed leader's ends the session), a plan or a hint (acted on in
    /// the background, so heartbeats go on), a request for a task's logs.
    fn on_message(
        &self,
        m: pb::SchedulerMessage,
        tx: &mpsc::Sender<pb::AgentMessage>,
    ) -> Result<(), SessionError> {
        match m.msg {
            Some(pb::scheduler_message::Msg::HeartbeatAck(a)) => {
                if !self.note_epoch(a.epoch) {
                    return Err(SessionError::Retry(format!(
                        "the scheduler at {} no longer leads (term {} < {})",
                        self.current_endpoint(),
                        a.epoch,
                        self.leader_epoch()
                    )));
                }
                tracing::trace!(
                    sequence = a.sequence,
                    epoch = a.epoch,
                    "heartbeat acknowledged"
                );
            }
            Some(pb::scheduler_message::Msg::Plan(p)) => {
                if self.accept_plan(&p) {
                    // Converge in the background: suspensions wait
                    // for checkpoints, heartbeats must go on. The
                    // reconciler serialises plans in arrival order.
                    let r = self.reconciler.clone();
                    tokio::spawn(async move {
                        for problem in r.apply(&p).await {
                            tracing::warn!(generation = p.generation, %problem, "plan not fully applied");
                        }
                    });
                }
            }
            Some(pb::scheduler_message::Msg::Hint(h)) => {
                if let Some(pb::hint::Hint::PrepareSwitch(ps)) = h.hint
                    && let Some(task) = ps.task
                {
                    // Standby until the plan that runs it (Ymir §6.2).
                    let lead = ps
                        .switch_at
                        .and_then(|t| timestamp_from_proto("switch_at", &t).ok())
                        .and_then(|t| (t - chrono::Utc::now()).to_std().ok())
                        .unwrap_or_default();
                    let r = self.reconciler.clone();
                    tokio::spawn(async move {
                        if r.prepare(&task, lead).await {
                            tracing::info!(task = %task.task_id, ?lead, "standby launched ahead of a switch");
                        } else {
                            tracing::debug!(task = %task.task_id, "switch hint: nothing to prepare");
                        }
                    });
                }
            }
            Some(pb::scheduler_message::Msg::LogRequest(lr)) => {
                let r = self.reconciler.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(log_data(&r, &lr).await).await;
                });
            }
            Some(pb::scheduler_message::Msg::RegisterAck(_)) | None => {}
        }
        Ok(())
    }

    /// Once the scheduler took this agent as the node's (no other agent
    /// of it lives), and before any plan starts a process: processes a
    /// previous agent left running are stopped (they checkpoint on
    /// SIGTERM). A restarted agent cannot take over their report sockets,
    /// and an orphan would hold its GPUs beside its task's new process.
    async fn stop_orphans_once(&self) {
        if !self.orphans_checked.swap(true, Ordering::SeqCst) {
            let orphans = self.reconciler.driver().stop_orphans().await;
            if orphans > 0 {
                tracing::warn!(
                    orphans,
                    "stopped processes a previous agent left running; their jobs resume from their checkpoints"
                );
            }
        }
    }

    /// Keeps a session open until `shutdown` resolves, reconnecting with
    /// backoff. Returns an error only when the scheduler refuses the agent.
    pub async fn run(
        &self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), SessionError> {
        let mut backoff = Backoff::new(
            self.cfg.reconnect.initial_delay,
            self.cfg.reconnect.max_delay,
        );
        tokio::pin!(shutdown);
        loop {
            let mut registered = false;
            let mut mark = || registered = true;
            let outcome = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                r = self.session_once(&mut mark) => r,
            };
            if registered {
                backoff.reset();
            }
            match outcome {
                Ok(()) => tracing::warn!("scheduler closed the session; reconnecting"),
                Err(SessionError::Refused(m)) => return Err(SessionError::Refused(m)),
                Err(SessionError::Retry(m)) => {
                    tracing::warn!(error = %m, "session failed");
                    // Try the next replica (a standby refuses sessions).
                    self.endpoint.fetch_add(1, Ordering::SeqCst);
                }
            }
            let delay = backoff.next_delay(&mut rand::rng());
            tracing::info!(retry_in = ?delay, "reconnecting");
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// Reads a kept node token; None when there is none (or it is unreadable,
/// with a warning: the join token enrolls the node again).
fn read_node_token(path: &std::path::Path) -> Option<Secret> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Some(Secret::new(t.trim())),
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "node token not readable");
            None
        }
    }
}

/// Writes a node token readable by its owner only, replacing any earlier
/// one atomically (a crash leaves the old token or the new one).
fn write_node_token(path: &std::path::Path, token: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("token.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Whether a node token is on file, so the agent may start without the
/// join token.
pub fn node_token_on_file(cfg: &AgentConfig) -> bool {
    read_node_token(&cfg.resolved_node_token_file()).is_some()
}

fn classify(s: tonic::Status) -> SessionError {
    match s.code() {
        tonic::Code::Unauthenticated
        | tonic::Code::InvalidArgument
        | tonic::Code::PermissionDenied => {
            SessionError::Refused(format!("{}: {}", s.code(), s.message()))
        }
        _ => SessionError::Retry(format!("{}: {}", s.code(), s.message())),
    }
}

/// Answers a log request from the task's log file.
async fn log_data(r: &crate::reconcile::Reconciler, lr: &pb::LogRequest) -> pb::AgentMessage {
    const MAX: usize = 1 << 20;
    let mut out = pb::LogData {
        request_id: lr.request_id,
        ..Default::default()
    };
    if let Some(task) = r.log_task(&lr.job_id, lr.profile).await {
        let max = (lr.max_bytes as usize).clamp(1, MAX);
        match r.driver().read_log(&task, lr.stderr, lr.offset, max) {
            Ok((data, next)) => {
                out.data = data;
                out.next_offset = next;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => out.error = format!("reading the log of {task}: {e}"),
        }
        out.task_id = task;
    }
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::LogData(out)),
    }
}

/// The scheduler's first answer on a new session: its acknowledgement of
/// the registration, or why the session must be retried.
async fn register_ack(
    inbound: &mut tonic::Streaming<pb::SchedulerMessage>,
) -> Result<pb::RegisterAck, SessionError> {
    Ok(match inbound.message().await {
        Ok(Some(pb::SchedulerMessage {
            msg: Some(pb::scheduler_message::Msg::RegisterAck(a)),
        })) => a,
        Ok(Some(other)) => {
            return Err(SessionError::Retry(format!(
                "expected RegisterAck, got {other:?}"
            )));
        }
        Ok(None) => {
            return Err(SessionError::Retry(
                "scheduler closed the session before acknowledging".into(),
            ));
        }
        Err(s) => return Err(classify(s)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<Duration> = (0..8).map(|_| b.next_delay(&mut rng)).collect();
        // Each delay lies in [base/2, base] for base = 100ms·2^k capped at 1s.
        for (k, delay) in d.iter().enumerate() {
            let base = Duration::from_millis(100 * (1 << k)).min(Duration::from_secs(1));
            assert!(*delay >= base / 2 && *delay <= base, "k={k} {delay:?}");
        }
        assert!(d.windows(2).any(|w| w[0] != w[1]));
        b.reset();
        assert!(b.next_delay(&mut rng) <= Duration::from_millis(100));
    }

    fn agent() -> Agent {
        let gpus = Arc::new(crate::gpu::fake::FakeGpuBackend::new("n", 1, "A100-80GB").unwrap());
        Agent::new(AgentConfig::default(), Some(Secret::new("x")), gpus)
    }

    #[test]
    fn a_node_token_is_kept_owner_only_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/node-n1.token");
        assert!(read_node_token(&path).is_none());
        write_node_token(&path, "fmn_first").unwrap();
        write_node_token(&path, "fmn_second").unwrap();
        assert_eq!(read_node_token(&path).unwrap().expose(), "fmn_second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only its owner reads the token");
        let cfg = AgentConfig {
            node_id: Some("n1".into()),
            node_token_file: Some(path),
            ..AgentConfig::default()
        };
        assert!(node_token_on_file(&cfg));
        let gpus = Arc::new(crate::gpu::fake::FakeGpuBackend::new("n1", 1, "A100-80GB").unwrap());
        let a = Agent::new(cfg, None, gpus);
        let Some(pb::agent_message::Msg::Register(r)) = a.register_message().msg else {
            panic!("a register message")
        };
        assert_eq!(
            (r.node_token.as_str(), r.join_token.as_str()),
            ("fmn_second", "")
        );
        assert_eq!(r.instance_id.len(), 32);
    }

    fn plan(generation: i64, epoch: i64) -> pb::NodePlan {
        pb::NodePlan {
            generation,
            tasks: vec![],
            epoch,
            warm_idle_release: None,
        }
    }

    #[test]
    fn stale_plans_are_ignored() {
        let a = agent();
        assert!(a.accept_plan(&plan(5, 1)));
        assert!(!a.accept_plan(&plan(4, 1)));
        assert!(a.accept_plan(&plan(5, 1)), "same generation is idempotent");
        assert_eq!(a.applied_generation(), 5);
    }

    /// A plan of an older leadership term is a deposed leader's: ignored
    /// even when its generation is newer than any applied.
    #[test]
    fn plans_of_a_deposed_leader_are_ignored() {
        let a = agent();
        assert!(a.accept_plan(&plan(10, 2)));
        assert_eq!(a.leader_epoch(), 2);
        assert!(!a.accept_plan(&plan(11, 1)), "term 1 was deposed");
        assert_eq!(a.applied_generation(), 10);
        assert!(a.accept_plan(&plan(12, 3)), "a newer term is followed");
        assert_eq!(a.leader_epoch(), 3);
    }

    #[test]
    fn a_silent_scheduler_is_dropped_after_four_heartbeats_or_two_seconds() {
        let r = crate::config::ReconnectConfig::default();
        assert_eq!(
            r.silence_after(Duration::from_secs(5)),
            Duration::from_secs(20)
        );
        assert_eq!(
            r.silence_after(Duration::from_millis(200)),
            Duration::from_secs(2)
        );
        let set = crate::config::ReconnectConfig {
            silence_timeout: Some(Duration::from_secs(7)),
            ..r
        };
        assert_eq!(
            set.silence_after(Duration::from_secs(5)),
            Duration::from_secs(7)
        );
    }
}
