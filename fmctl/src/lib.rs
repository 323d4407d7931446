//! Rust client SDK for fmsched, used by the `fmctl` CLI and by any program
//! that submits or watches fine-tuning jobs.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fmctl::ClientError> {
//! let client = fmctl::Client::connect(fmctl::ClientConfig {
//!     endpoint: "http://127.0.0.1:50051".into(),
//!     token: Some("my-api-token-0123456789".into()),
//!     ..Default::default()
//! })
//! .await?;
//! let spec = fmctl::load_spec(std::path::Path::new("examples/roberta-qqp.yaml"))?;
//! let (job, created) = client.submit(&spec, Some("qqp-run-1")).await?;
//! println!("{} created={created}", job.id);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use fmsched_core::{JobSpec, JobState, NodeState};
use fmsched_proto::convert::{job_spec_to_proto, job_state_to_proto, node_state_to_proto};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::admin_service_client::AdminServiceClient;
use fmsched_proto::v1::cluster_service_client::ClusterServiceClient;
use fmsched_proto::v1::job_service_client::JobServiceClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

pub mod output;
pub mod swarm;

/// What a submission returned.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub job: pb::Job,
    /// False: an earlier submission with the same idempotency key.
    pub created: bool,
    /// What the scheduler already knows will hold the job back.
    pub warnings: Vec<String>,
}

/// Where and how to reach the scheduler.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub endpoint: String,
    pub token: Option<String>,
    /// CA certificate (PEM) for an `https://` endpoint.
    pub ca_cert: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub request_timeout: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:50051".into(),
            token: None,
            ca_cert: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Every failure of the client, printable as one line.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach scheduler at {endpoint}: {message}")]
    Connect { endpoint: String, message: String },
    #[error("{}: {message}", code_name(*.code))]
    Rpc { code: tonic::Code, message: String },
    #[error("{path}: {message}")]
    Spec { path: String, message: String },
    #[error("{0}")]
    Usage(String),
}

fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        InvalidArgument => "invalid argument",
        NotFound => "not found",
        AlreadyExists => "already exists",
        PermissionDenied => "permission denied",
        Unauthenticated => "unauthenticated",
        FailedPrecondition => "failed precondition",
        Unavailable => "unavailable",
        DeadlineExceeded => "deadline exceeded",
        ResourceExhausted | OutOfRange => "request too large",
        _ => "error",
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Rpc {
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

impl ClientError {
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Parses a job spec from YAML (JSON is YAML too). Errors carry the line.
pub fn parse_spec(origin: &str, yaml: &str) -> Result<JobSpec, ClientError> {
    let spec: JobSpec = serde_yaml_ng::from_str(yaml).map_err(|e| ClientError::Spec {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    // A value the wire reads as "not given" (`num_samples: 0`) would be
    // lost on the way: refused here, as the scheduler refuses it.
    spec.check_given_values().map_err(|e| ClientError::Spec {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    Ok(spec)
}

/// Reads and parses a job spec file (`-` = standard input).
pub fn load_spec(path: &Path) -> Result<JobSpec, ClientError> {
    let origin = path.display().to_string();
    let text = if origin == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|e| ClientError::Spec {
        path: origin.clone(),
        message: e.to_string(),
    })?;
    parse_spec(&origin, &text)
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct BearerAuth(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for BearerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, BearerAuth>;

/// Filter of [`Client::list_jobs`].
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub states: Vec<JobState>,
    pub owner: Option<String>,
    pub page_size: u32,
    pub page_token: Option<String>,
}

/// A connected client. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    jobs: JobServiceClient<Authed>,
    cluster: ClusterServiceClient<Authed>,
    admin: AdminServiceClient<Authed>,
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of sorted values; the
/// default when there are none.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A connection to the scheduler at `cfg.endpoint` (TLS when `ca_cert`
/// is set; `request_timeout` bounds every call on it).
pub async fn channel(cfg: &ClientConfig) -> Result<Channel, ClientError> {
    let conn_err = |m: String| ClientError::Connect {
        endpoint: cfg.endpoint.clone(),
        message: m,
    };
    let mut ep = Endpoint::from_shared(cfg.endpoint.clone())
        .map_err(|e| ClientError::Usage(format!("endpoint {:?}: {e}", cfg.endpoint)))?
        .connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true);
    if let Some(t) = cfg.request_timeout {
        ep = ep.timeout(t);
    }
    if let Some(ca) = &cfg.ca_cert {
        let pem = std::fs::read(ca)
            .map_err(|e| ClientError::Usage(format!("--ca-cert {}: {e}", ca.display())))?;
        ep = ep
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .map_err(|e| conn_err(e.to_string()))?;
    }
    let channel = ep.connect().await.map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        conn_err(msg)
    })?;
    Ok(channel)
}

impl Client {
    pub async fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        let channel = channel(&cfg).await?;
        let token = match &cfg.token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                ClientError::Usage("token contains characters not allowed in metadata".into())
            })?),
            None => None,
        };
        let auth = BearerAuth(token);
        Ok(Self {
            jobs: JobServiceClient::with_interceptor(channel.clone(), auth.clone()),
            cluster: ClusterServiceClient::with_interceptor(channel.clone(), auth.clone()),
            admin: AdminServiceClient::with_interceptor(channel, auth),
        })
    }

    /// Submits a job. Returns the job and whether it was newly created
    /// (false: an earlier submission with the same idempotency key).
    pub async fn submit(
        &self,
        spec: &JobSpec,
        idempotency_key: Option<&str>,
    ) -> Result<(pb::Job, bool), ClientError> {
        let s = self.submit_with_warnings(spec, idempotency_key).await?;
        Ok((s.job, s.created))
    }

    /// Submits a job and returns the scheduler's warnings with it (e.g. that
    /// no set of the registered nodes can ever hold it).
    pub async fn submit_with_warnings(
        &self,
        spec: &JobSpec,
        idempotency_key: Option<&str>,
    ) -> Result<Submitted, ClientError> {
        // What the wire cannot carry (see `JobSpec::check_given_values`).
        spec.check_given_values()
            .map_err(|e| ClientError::Usage(e.to_string()))?;
        self.submit_proto_full(job_spec_to_proto(spec), idempotency_key)
            .await
    }

    /// Submits a protobuf spec as is (for tests of server-side validation).
    pub async fn submit_proto(
        &self,
        spec: pb::JobSpec,
        idempotency_key: Option<&str>,
    ) -> Result<(pb::Job, bool), ClientError> {
        let s = self.submit_proto_full(spec, idempotency_key).await?;
        Ok((s.job, s.created))
    }

    async fn submit_proto_full(
        &self,
        spec: pb::JobSpec,
        idempotency_key: Option<&str>,
    ) -> Result<Submitted, ClientError> {
        let r = self
            .jobs
            .clone()
            .submit_job(pb::SubmitJobRequest {
                spec: Some(spec),
                idempotency_key: idempotency_key.unwrap_or_default().to_string(),
            })
            .await?
            .into_inner();
        let job = r
            .job
            .ok_or_else(|| ClientError::Usage("server returned no job".into()))?;
        Ok(Submitted {
            job,
            created: r.created,
            warnings: r.warnings,
        })
    }

    pub async fn get_job(&self, id: &str) -> Result<pb::Job, ClientError> {
        Ok(self
            .jobs
            .clone()
            .get_job(pb::GetJobRequest {
                job_id: id.to_string(),
            })
            .await?
            .into_inner())
    }

    /// One page of jobs, newest first, and the token of the next page.
    pub async fn list_jobs(
        &self,
        f: &JobFilter,
    ) -> Result<(Vec<pb::Job>, Option<String>), ClientError> {
        let r = self
            .jobs
            .clone()
            .list_jobs(pb::ListJobsRequest {
                states: f
                    .states
                    .iter()
                    .map(|s| job_state_to_proto(*s) as i32)
                    .collect(),
                owner: f.owner.clone().unwrap_or_default(),
                page_size: f.page_size,
                page_token: f.page_token.clone().unwrap_or_default(),
            })
            .await?
            .into_inner();
        let next = (!r.next_page_token.is_empty()).then_some(r.next_page_token);
        Ok((r.jobs, next))
    }

    pub async fn cancel_job(&self, id: &str, reason: &str) -> Result<pb::Job, ClientError> {
        Ok(self
            .jobs
            .clone()
            .cancel_job(pb::CancelJobRequest {
                job_id: id.to_string(),
                reason: reason.to_string(),
            })
            .await?
            .into_inner())
    }

    /// Streams a job's events (history after `after`, then live) until it
    /// reaches a terminal state.
    /// `job`'s history as of when it was read: its events up to
    /// `job.last_event_sequence` (WatchJob's history, the stream dropped
    /// before it waits for new events), oldest first.
    pub async fn job_history(&self, job: &pb::Job) -> Result<Vec<pb::JobEvent>, ClientError> {
        let mut out = Vec::new();
        if job.last_event_sequence <= 0 {
            return Ok(out);
        }
        let mut stream = self.watch_job(&job.id, 0).await?;
        // A history that never reaches the sequence read (a server that
        // kept some back) ends the read rather than wait for new events.
        let read = async {
            while let Some(ev) = stream.message().await? {
                let last = ev.sequence >= job.last_event_sequence;
                out.push(ev);
                if last {
                    break;
                }
            }
            Ok::<(), ClientError>(())
        };
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(10), read).await {
            r?;
        }
        Ok(out)
    }

    pub async fn watch_job(
        &self,
        id: &str,
        after: i64,
    ) -> Result<tonic::Streaming<pb::JobEvent>, ClientError> {
        let mut req = tonic::Request::new(pb::WatchJobRequest {
            job_id: id.to_string(),
            after_sequence: after,
        });
        // A watch may last as long as the job: no request timeout.
        req.set_timeout(Duration::from_secs(365 * 24 * 3600));
        Ok(self.jobs.clone().watch_job(req).await?.into_inner())
    }

    /// A job's process output (see `JobService.GetJobLogs`).
    /// A job's output (`req.job_id`; see `GetJobLogsRequest`).
    pub async fn job_logs(
        &self,
        req: pb::GetJobLogsRequest,
    ) -> Result<tonic::Streaming<pb::JobLogChunk>, ClientError> {
        let follow = req.follow;
        let mut req = tonic::Request::new(req);
        if follow {
            // Following lasts as long as the job: no request timeout.
            req.set_timeout(Duration::from_secs(365 * 24 * 3600));
        }
        Ok(self.jobs.clone().get_job_logs(req).await?.into_inner())
    }

    pub async fn list_nodes(&self, states: &[NodeState]) -> Result<Vec<pb::Node>, ClientError> {
        Ok(self
            .cluster
            .clone()
            .list_nodes(pb::ListNodesRequest {
                states: states
                    .iter()
                    .map(|s| node_state_to_proto(*s) as i32)
                    .collect(),
            })
            .await?
            .into_inner()
            .nodes)
    }

    pub async fn get_node(&self, id: &str) -> Result<pb::Node, ClientError> {
        Ok(self
            .cluster
            .clone()
            .get_node(pb::GetNodeRequest {
                node_id: id.to_string(),
            })
            .await?
            .into_inner())
    }

    pub async fn cluster_summary(&self) -> Result<pb::ClusterSummary, ClientError> {
        Ok(self
            .cluster
            .clone()
            .get_cluster_summary(pb::GetClusterSummaryRequest {})
            .await?
            .into_inner())
    }

    /// Admin: no new work on the node (`drain`: its jobs move off too), or
    /// back to schedulable (`Uncordon`).
    pub async fn cordon_node(
        &self,
        id: &str,
        how: Cordon,
        reason: &str,
    ) -> Result<pb::Node, ClientError> {
        let mut admin = self.admin.clone();
        let (node_id, reason) = (id.to_string(), reason.to_string());
        let r = match how {
            Cordon::Cordon => {
                admin
                    .cordon_node(pb::CordonNodeRequest { node_id, reason })
                    .await?
            }
            Cordon::Drain => {
                admin
                    .drain_node(pb::DrainNodeRequest { node_id, reason })
                    .await?
            }
            Cordon::Uncordon => {
                admin
                    .uncordon_node(pb::UncordonNodeRequest { node_id })
                    .await?
            }
        };
        Ok(r.into_inner())
    }

    /// Admin: every loan of an inference node.
    pub async fn list_loans(&self) -> Result<pb::ListLoansResponse, ClientError> {
        Ok(self
            .admin
            .clone()
            .list_loans(pb::ListLoansRequest {})
            .await?
            .into_inner())
    }

    /// Admin: lend inference nodes to training.
    pub async fn loan_nodes(
        &self,
        nodes: Vec<String>,
    ) -> Result<pb::ListLoansResponse, ClientError> {
        Ok(self
            .admin
            .clone()
            .loan_nodes(pb::LoanNodesRequest { node_ids: nodes })
            .await?
            .into_inner())
    }

    /// Admin: ask lent nodes back, by name or a count.
    pub async fn reclaim_nodes(
        &self,
        nodes: Vec<String>,
        count: u32,
        deadline: Option<std::time::Duration>,
    ) -> Result<pb::ReclaimNodesResponse, ClientError> {
        Ok(self
            .admin
            .clone()
            .reclaim_nodes(pb::ReclaimNodesRequest {
                node_ids: nodes,
                count,
                deadline: deadline.map(fmsched_proto::convert::duration_to_proto),
            })
            .await?
            .into_inner())
    }

    /// Admin: revoke a node's own token (it must enroll again with the
    /// join token) and end its session.
    pub async fn revoke_node_token(&self, id: &str, reason: &str) -> Result<pb::Node, ClientError> {
        Ok(self
            .admin
            .clone()
            .revoke_node_token(pb::RevokeNodeTokenRequest {
                node_id: id.to_string(),
                reason: reason.to_string(),
            })
            .await?
            .into_inner())
    }

    /// Admin: take a running job off its GPUs at the next round.
    pub async fn requeue_job(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<pb::RequeueJobResponse, ClientError> {
        Ok(self
            .admin
            .clone()
            .requeue_job(pb::RequeueJobRequest {
                job_id: id.to_string(),
                reason: reason.to_string(),
            })
            .await?
            .into_inner())
    }

    pub async fn get_policy(&self) -> Result<pb::PolicySetting, ClientError> {
        Ok(self
            .admin
            .clone()
            .get_policy(pb::GetPolicyRequest {})
            .await?
            .into_inner())
    }

    /// Admin: the policy and knobs of the next rounds.
    pub async fn set_policy(
        &self,
        policy: &str,
        knobs: std::collections::HashMap<String, f64>,
    ) -> Result<pb::PolicySetting, ClientError> {
        Ok(self
            .admin
            .clone()
            .set_policy(pb::SetPolicyRequest {
                policy: policy.to_string(),
                knobs,
            })
            .await?
            .into_inner())
    }

    /// Admin: one AutoSched tuning now (`dry_run`: adopt nothing).
    pub async fn tune(
        &self,
        dry_run: bool,
        threshold: Option<f64>,
    ) -> Result<pb::TuneDecision, ClientError> {
        Ok(self
            .admin
            .clone()
            .tune(pb::TuneRequest { dry_run, threshold })
            .await?
            .into_inner())
    }

    /// Admin: the queues in force and their figures now.
    pub async fn get_queues(&self) -> Result<pb::QueueSetting, ClientError> {
        Ok(self
            .admin
            .clone()
            .get_queues(pb::GetQueuesRequest {})
            .await?
            .into_inner())
    }

    /// Admin: replaces the whole queue set.
    pub async fn set_queues(
        &self,
        queues: Vec<fmsched_core::queue::QueueSpec>,
    ) -> Result<pb::QueueSetting, ClientError> {
        let queues = queues
            .iter()
            .map(fmsched_proto::convert::queue_to_proto)
            .collect();
        Ok(self
            .admin
            .clone()
            .set_queues(pb::SetQueuesRequest { queues })
            .await?
            .into_inner())
    }

    pub async fn audit_events(&self, limit: u32) -> Result<Vec<pb::AuditEvent>, ClientError> {
        Ok(self
            .admin
            .clone()
            .list_audit_events(pb::ListAuditEventsRequest { limit })
            .await?
            .into_inner()
            .events)
    }
}

/// What [`Client::cordon_node`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cordon {
    Cordon,
    Drain,
    Uncordon,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_errors_name_file_and_line() {
        let e = parse_spec("job.yaml", "model: roberta-base\nbogus_key: 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("job.yaml: "), "{e}");
        assert!(e.contains("bogus_key"), "{e}");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn a_value_the_wire_reads_as_unset_is_refused_before_sending() {
        let spec = "name: a\nmodel: roberta-base\n\
            dataset: { uri: file:///d, task: rte, num_samples: NS }\n\
            hyperparameters: { global_batch_size: 32, learning_rate: 0.0001 }\n\
            target: { max_iterations: 100 }\n\
            resources: { min_gpus: 1, max_gpus: 1GPU }\n\
            launch: { command: [fake-trainer] }\n";
        let case = |ns: &str, gpu: &str| {
            parse_spec("job.yaml", &spec.replace("NS", ns).replace("GPU", gpu))
                .map(|s| (s.dataset.num_samples, s.resources.gpu_model))
                .map_err(|e| e.to_string())
        };
        // Sent, these would arrive as "not given" and the job would run
        // as if its epochs could not be counted, or on any GPU model.
        assert_eq!(
            case("0", "").unwrap_err(),
            "job.yaml: spec.dataset.num_samples: must be > 0 when given"
        );
        assert_eq!(
            case("3200", ", gpu_model: \"\"").unwrap_err(),
            "job.yaml: spec.resources.gpu_model: must not be empty"
        );
        assert_eq!(
            case("3200", ", gpu_model: A100").unwrap(),
            (Some(3200), Some("A100".to_string()))
        );
        let zero_iterations = spec
            .replace("NS", "3200")
            .replace("GPU", "")
            .replace("max_iterations: 100", "max_iterations: 0, max_epochs: 3");
        assert_eq!(
            parse_spec("job.yaml", &zero_iterations)
                .unwrap_err()
                .to_string(),
            "job.yaml: spec.target.max_iterations: must be > 0"
        );
    }

    #[test]
    fn shipped_examples_parse_and_validate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let models = fmsched_core::ModelCatalog::builtin();
        let mut n = 0;
        let demo = dir.join("demo");
        let files = std::fs::read_dir(&dir)
            .unwrap()
            .chain(std::fs::read_dir(&demo).unwrap())
            .map(|e| e.unwrap().path());
        for p in files {
            if p.extension().is_some_and(|e| e == "yaml") {
                let spec = load_spec(&p).unwrap();
                spec.validate(&fmsched_core::ValidationContext {
                    now: chrono::Utc::now(),
                    models: &models,
                    limits: Default::default(),
                })
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                n += 1;
            }
        }
        assert!(
            n >= 7,
            "examples/ and examples/demo/ should hold at least 7 job specs, found {n}"
        );
    }
}
