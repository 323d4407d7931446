//! In-memory view of nodes: what agents report (telemetry, observed tasks),
//! when each was last heard from, and the open agent sessions.
//!
//! Owns: observed state and liveness. Does not own: anything that must
//! survive a restart — registrations and liveness transitions are persisted
//! by the callers through [`crate::persistence::Persistence`]; telemetry is
//! relearned from the next heartbeat.
//!
//! Liveness rule: a heartbeat or registration makes a node Available; the
//! periodic sweep only ever degrades (Available → Suspect → Offline). An
//! Offline node's session is closed, so its agent must register again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use fmsched_core::{Liveness, NodeId, NodeState};
use fmsched_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::persistence::NodeRecord;

/// Messages queued to one agent session.
pub type Outbox = mpsc::Sender<Result<pb::SchedulerMessage, tonic::Status>>;

/// One node as the scheduler sees it right now.
#[derive(Clone, Debug)]
pub struct LiveNode {
    pub record: NodeRecord,
    /// State in memory (authoritative while the process runs).
    pub state: NodeState,
    /// State last written to Postgres.
    pub persisted_state: NodeState,
    pub last_heartbeat: DateTime<Utc>,
    pub telemetry: BTreeMap<String, pb::GpuTelemetry>,
    pub observed_tasks: Vec<pb::ObservedTask>,
    /// Its warm processes as last reported (PromptTuner's warm pools).
    pub warm: Vec<pb::WarmProcess>,
    pub applied_generation: i64,
    /// Id of the open session, if any.
    pub session: Option<u64>,
    /// The agent process that opened it (`Register.instance_id`).
    pub instance: String,
    outbox: Option<Outbox>,
}

/// Another agent's live session on a node id (see
/// [`NodeRegistry::live_session_of_another`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LiveSession {
    pub instance: String,
    pub hostname: String,
    pub last_heard: DateTime<Utc>,
}

impl LiveNode {
    /// A node known from Postgres with no session yet; `now` starts its
    /// grace period to reconnect.
    fn unconnected(record: NodeRecord, now: DateTime<Utc>) -> Self {
        Self {
            state: record.state,
            persisted_state: record.state,
            record,
            last_heartbeat: now,
            telemetry: BTreeMap::new(),
            observed_tasks: Vec::new(),
            warm: Vec::new(),
            applied_generation: 0,
            session: None,
            instance: String::new(),
            outbox: None,
        }
    }
}

/// Whether a process still runs (or checkpoints) on the node: ended ones
/// (suspended, done, failed) stay reported and do not count.
pub fn runs_a_process(n: &LiveNode) -> bool {
    // A warm process holds its GPUs' memory too.
    !n.warm.is_empty() || n.observed_tasks.iter().any(process_alive)
}

/// Whether a reported process still runs (starting, training or
/// checkpointing); a suspended, done or failed one stays reported.
pub fn process_alive(t: &pb::ObservedTask) -> bool {
    matches!(
        pb::TaskPhase::try_from(t.phase),
        Ok(pb::TaskPhase::Starting | pb::TaskPhase::Running | pb::TaskPhase::Checkpointing)
    )
}

/// A liveness change that must be persisted.
#[derive(Clone, Debug, PartialEq)]
pub struct StateChange {
    pub node: NodeId,
    pub from: NodeState,
    pub to: NodeState,
    pub last_heartbeat: DateTime<Utc>,
}

#[derive(Debug, Default)]
pub struct NodeRegistry {
    nodes: Mutex<BTreeMap<NodeId, LiveNode>>,
    next_session: AtomicU64,
    /// Log requests sent to agents, waiting for their answer.
    log_waiters: Mutex<BTreeMap<u64, tokio::sync::oneshot::Sender<pb::LogData>>>,
    next_request: AtomicU64,
}

impl NodeRegistry {
    /// Loads persisted nodes after a restart. Each gets a fresh grace period
    /// (`last_heartbeat = now`) to reconnect, but keeps its persisted state:
    /// an Offline node stays Offline until its agent registers again.
    pub fn load(records: Vec<NodeRecord>, now: DateTime<Utc>) -> Self {
        let nodes = records
            .into_iter()
            .map(|r| (r.id.clone(), LiveNode::unconnected(r, now)))
            .collect();
        Self {
            nodes: Mutex::new(nodes),
            next_session: AtomicU64::new(1),
            ..Default::default()
        }
    }

    /// A standby became the active replica: learn the nodes registered
    /// through the old leader and give every node without a session here a
    /// fresh grace period to reconnect (as after a restart), so the first
    /// rounds keep their work in place instead of re-placing it.
    pub fn take_over(&self, records: Vec<NodeRecord>, now: DateTime<Utc>) {
        let mut nodes = self.lock();
        for r in records {
            let n = nodes
                .entry(r.id.clone())
                .or_insert_with(|| LiveNode::unconnected(r.clone(), now));
            if n.session.is_none() {
                n.record = r;
                n.state = n.record.state;
                n.persisted_state = n.record.state;
                n.last_heartbeat = now;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, LiveNode>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A session on `node` that is open, heard from within `within`, and
    /// belongs to another agent process than `instance` (an empty instance
    /// id matches none): a second agent with the same node id — a cloned
    /// host image, or anyone holding the join token — must not replace it.
    /// The same process may replace its own session (it reconnected before
    /// this side saw the old stream break).
    pub fn live_session_of_another(
        &self,
        node: &NodeId,
        instance: &str,
        now: DateTime<Utc>,
        within: std::time::Duration,
    ) -> Option<LiveSession> {
        let nodes = self.lock();
        let n = nodes.get(node)?;
        let same = !instance.is_empty() && n.instance == instance;
        let silent = (now - n.last_heartbeat).to_std().unwrap_or_default();
        (n.session.is_some() && !same && silent < within).then(|| LiveSession {
            instance: n.instance.clone(),
            hostname: n.record.hostname.clone(),
            last_heard: n.last_heartbeat,
        })
    }

    /// Records a registration that has been persisted; replaces any older
    /// session of the same node (its outbox is dropped, ending that stream).
    pub fn register(
        &self,
        record: NodeRecord,
        instance: &str,
        now: DateTime<Utc>,
        outbox: Outbox,
        tasks: Vec<pb::ObservedTask>,
        applied_generation: i64,
    ) -> u64 {
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        let mut nodes = self.lock();
        let telemetry = nodes
            .get(&record.id)
            .map(|n| n.telemetry.clone())
            .unwrap_or_default();
        nodes.insert(
            record.id.clone(),
            LiveNode {
                record,
                state: NodeState::Available,
                persisted_state: NodeState::Available,
                last_heartbeat: now,
                telemetry,
                observed_tasks: tasks,
                warm: Vec::new(),
                applied_generation,
                session: Some(session),
                instance: instance.to_string(),
                outbox: Some(outbox),
            },
        );
        session
    }

    /// Applies a heartbeat of session `session`. Returns `false` if that
    /// session is no longer current (replaced, or closed as Offline): the
    /// caller should end it.
    pub fn heartbeat(
        &self,
        node: &NodeId,
        session: u64,
        hb: pb::Heartbeat,
        now: DateTime<Utc>,
    ) -> bool {
        let mut nodes = self.lock();
        let Some(n) = nodes.get_mut(node) else {
            return false;
        };
        if n.session != Some(session) {
            return false;
        }
        n.last_heartbeat = now;
        if n.state == NodeState::Suspect {
            n.state = NodeState::Available;
        }
        n.telemetry = hb.gpus.into_iter().map(|g| (g.uuid.clone(), g)).collect();
        n.observed_tasks = hb.tasks;
        n.warm = hb.warm;
        n.applied_generation = hb.applied_generation;
        true
    }

    /// Does `tasks` (a heartbeat of `node`, before it is applied) report a
    /// task ended that its last report did not: succeeded or failed, its
    /// GPUs free or its profiling run done. Such a report is an event that
    /// may bring the next round forward (`scheduling.event_round_gap`).
    pub fn ends_a_task(&self, node: &NodeId, tasks: &[pb::ObservedTask]) -> bool {
        let ended =
            |p: i32| p == pb::TaskPhase::Succeeded as i32 || p == pb::TaskPhase::Failed as i32;
        if !tasks.iter().any(|t| ended(t.phase)) {
            // Most reports end nothing: no lock for them.
            return false;
        }
        let nodes = self.lock();
        let before = nodes.get(node).map_or(&[][..], |n| &n.observed_tasks[..]);
        tasks.iter().filter(|t| ended(t.phase)).any(|t| {
            !before
                .iter()
                .any(|b| b.task_id == t.task_id && ended(b.phase))
        })
    }

    /// Applies a task status update of session `session` (same contract as
    /// [`NodeRegistry::heartbeat`]).
    pub fn task_status(
        &self,
        node: &NodeId,
        session: u64,
        task: pb::ObservedTask,
        now: DateTime<Utc>,
    ) -> bool {
        let mut nodes = self.lock();
        let Some(n) = nodes.get_mut(node) else {
            return false;
        };
        if n.session != Some(session) {
            return false;
        }
        n.last_heartbeat = now;
        match n
            .observed_tasks
            .iter_mut()
            .find(|t| t.task_id == task.task_id)
        {
            Some(t) => *t = task,
            None => n.observed_tasks.push(task),
        }
        true
    }

    /// Ends session `session` with an error the agent reads (a message it
    /// sent was refused).
    pub fn close_with(&self, node: &NodeId, session: u64, status: tonic::Status) {
        self.end_session(node, session, Some(status));
    }

    /// The session ended (agent gone or stream broken).
    pub fn disconnect(&self, node: &NodeId, session: u64) {
        self.end_session(node, session, None);
    }

    /// Ends `session` if it is still the node's, telling the agent
    /// `status` first when there is one (dropping the outbox ends its
    /// stream).
    fn end_session(&self, node: &NodeId, session: u64, status: Option<tonic::Status>) {
        let mut nodes = self.lock();
        if let Some(n) = nodes.get_mut(node)
            && n.session == Some(session)
        {
            if let (Some(o), Some(status)) = (n.outbox.take(), status) {
                let _ = o.try_send(Err(status));
            }
            n.session = None;
        }
    }

    /// Closes every open agent session (this replica stopped leading): the
    /// agents reconnect, to the new leader. Returns how many were open.
    pub fn close_all(&self) -> usize {
        let mut nodes = self.lock();
        let mut n = 0;
        for node in nodes.values_mut() {
            if node.session.take().is_some() {
                n += 1;
            }
            node.outbox = None;
        }
        n
    }

    /// Degrades nodes that have been silent too long and returns the changes
    /// that differ from what is persisted. Offline nodes lose their session.
    pub fn sweep(&self, rule: &Liveness, now: DateTime<Utc>) -> Vec<StateChange> {
        let mut nodes = self.lock();
        let mut changes = Vec::new();
        for (id, n) in nodes.iter_mut() {
            let by_time = rule.state_at(n.last_heartbeat, now);
            // Degrade only: promotion happens on heartbeat or registration.
            let next = n.state.max(by_time);
            if next == NodeState::Offline && n.session.is_some() {
                n.session = None;
                n.outbox = None;
            }
            n.state = next;
            if n.state != n.persisted_state {
                changes.push(StateChange {
                    node: id.clone(),
                    from: n.persisted_state,
                    to: n.state,
                    last_heartbeat: n.last_heartbeat,
                });
            }
        }
        changes
    }

    /// Marks a change as written to Postgres.
    pub fn mark_persisted(&self, node: &NodeId, state: NodeState) {
        if let Some(n) = self.lock().get_mut(node) {
            n.persisted_state = state;
        }
    }

    pub fn snapshot(&self) -> Vec<LiveNode> {
        self.lock().values().cloned().collect()
    }

    pub fn get(&self, node: &NodeId) -> Option<LiveNode> {
        self.lock().get(node).cloned()
    }

    /// Queues a message to a node's session; `false` if it has none or the
    /// queue is full (the next full plan will carry the state anyway).
    pub fn send(&self, node: &NodeId, msg: pb::SchedulerMessage) -> bool {
        let outbox = self.lock().get(node).and_then(|n| n.outbox.clone());
        outbox.is_some_and(|o| o.try_send(Ok(msg)).is_ok())
    }

    /// Asks a node's agent for part of a job's log; None when the node is
    /// not connected or does not answer within `timeout`.
    pub async fn request_log(
        &self,
        node: &NodeId,
        mut req: pb::LogRequest,
        timeout: std::time::Duration,
    ) -> Option<pb::LogData> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed) + 1;
        req.request_id = id;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiters().insert(id, tx);
        let sent = self.send(
            node,
            pb::SchedulerMessage {
                msg: Some(pb::scheduler_message::Msg::LogRequest(req)),
            },
        );
        let answer = if sent {
            tokio::time::timeout(timeout, rx)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        self.waiters().remove(&id);
        answer
    }

    /// An agent's answer to [`Self::request_log`].
    pub fn deliver_log(&self, data: pb::LogData) {
        if let Some(tx) = self.waiters().remove(&data.request_id) {
            let _ = tx.send(data);
        }
    }

    fn waiters(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<u64, tokio::sync::oneshot::Sender<pb::LogData>>> {
        self.log_waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The address a node's peers reach it at: what its agent registered, else
/// its hostname, else its id.
pub(crate) fn master_addr(nodes: &[LiveNode], id: &fmsched_core::NodeId) -> String {
    nodes
        .iter()
        .find(|n| &n.record.id == id)
        .map(|n| &n.record)
        .and_then(|r| {
            [&r.address, &r.hostname]
                .into_iter()
                .find(|a| !a.is_empty())
                .cloned()
        })
        .unwrap_or_else(|| id.as_str().to_string())
}

/// A node's GPU family (its first GPU's; a node reports one model).
pub(crate) fn node_family(n: &LiveNode) -> String {
    n.record
        .gpus
        .first()
        .map(|g| fmsched_estimator::analytic::gpu_family(&g.model))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn record(id: &str, state: NodeState) -> NodeRecord {
        NodeRecord {
            id: NodeId::try_from(id.to_string()).unwrap(),
            hostname: id.into(),
            address: String::new(),
            agent_version: "test".into(),
            gpu_backend: "fake".into(),
            labels: Default::default(),
            state,
            registered_at: t(0),
            last_heartbeat_at: t(0),
            gpus: vec![],
        }
    }

    const RULE: Liveness = Liveness {
        suspect_after: Duration::from_secs(10),
        offline_after: Duration::from_secs(30),
    };

    #[test]
    fn silent_node_degrades_then_recovers_on_heartbeat() {
        let r = NodeRegistry::load(vec![], t(0));
        let (tx, mut rx) = mpsc::channel(4);
        let id = NodeId::try_from("n1".to_string()).unwrap();
        let s = r.register(
            record("n1", NodeState::Available),
            "i1",
            t(0),
            tx,
            vec![],
            0,
        );
        assert!(r.sweep(&RULE, t(5)).is_empty());
        let ch = r.sweep(&RULE, t(12));
        assert_eq!(ch.len(), 1);
        assert_eq!(
            (ch[0].from, ch[0].to),
            (NodeState::Available, NodeState::Suspect)
        );
        r.mark_persisted(&id, NodeState::Suspect);
        assert!(r.heartbeat(&id, s, pb::Heartbeat::default(), t(13)));
        assert_eq!(r.get(&id).unwrap().state, NodeState::Available);
        assert_eq!(r.sweep(&RULE, t(14))[0].to, NodeState::Available);
        r.mark_persisted(&id, NodeState::Available);
        // Silent past offline_after: Offline, and the session is closed.
        let ch = r.sweep(&RULE, t(50));
        assert_eq!(ch[0].to, NodeState::Offline);
        assert!(rx.try_recv().is_err());
        assert!(
            !r.heartbeat(&id, s, pb::Heartbeat::default(), t(51)),
            "closed session is refused"
        );
        assert_eq!(r.get(&id).unwrap().state, NodeState::Offline);
    }

    /// A task's end is an event once: when a heartbeat or a task status
    /// first reports it succeeded or failed, not while later ones repeat it.
    #[test]
    fn a_task_ends_once_for_the_round_loop() {
        let r = NodeRegistry::load(vec![], t(0));
        let (tx, _rx) = mpsc::channel(4);
        let id = NodeId::try_from("n1".to_string()).unwrap();
        let s = r.register(
            record("n1", NodeState::Available),
            "i1",
            t(0),
            tx,
            vec![],
            0,
        );
        let task = |id: &str, phase: pb::TaskPhase| pb::ObservedTask {
            task_id: id.into(),
            phase: phase as i32,
            ..Default::default()
        };
        let hb = |tasks: Vec<pb::ObservedTask>| pb::Heartbeat {
            tasks,
            ..Default::default()
        };
        let running = vec![task("a", pb::TaskPhase::Running)];
        assert!(!r.ends_a_task(&id, &running));
        assert!(r.heartbeat(&id, s, hb(running), t(1)));
        let ended = vec![
            task("a", pb::TaskPhase::Succeeded),
            task("b", pb::TaskPhase::Running),
        ];
        assert!(r.ends_a_task(&id, &ended));
        assert!(r.heartbeat(&id, s, hb(ended.clone()), t(2)));
        assert!(!r.ends_a_task(&id, &ended), "repeated, not new");
        let failed = vec![ended[0].clone(), task("b", pb::TaskPhase::Failed)];
        assert!(r.ends_a_task(&id, &failed));
        // An end sent as a task status between heartbeats is the news; the
        // heartbeat that repeats it afterwards is not (the session wakes the
        // round at the status).
        let status = task("b", pb::TaskPhase::Failed);
        assert!(r.ends_a_task(&id, std::slice::from_ref(&status)));
        assert!(r.task_status(&id, s, status, t(3)));
        assert!(!r.ends_a_task(&id, &failed), "already told by the status");
    }

    #[test]
    fn restart_keeps_offline_nodes_offline_and_grants_grace() {
        let r = NodeRegistry::load(
            vec![
                record("a", NodeState::Offline),
                record("b", NodeState::Available),
            ],
            t(100),
        );
        assert!(
            r.sweep(&RULE, t(105)).is_empty(),
            "no change inside the grace period"
        );
        let ch = r.sweep(&RULE, t(140));
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].node.as_str(), "b");
        assert_eq!(ch[0].to, NodeState::Offline);
    }

    #[test]
    fn a_live_session_of_another_instance_blocks_a_second_agent() {
        let r = NodeRegistry::load(vec![], t(0));
        let id = NodeId::try_from("n1".to_string()).unwrap();
        let within = Duration::from_secs(10);
        assert_eq!(r.live_session_of_another(&id, "b", t(0), within), None);
        let (tx, _rx) = mpsc::channel(4);
        let s = r.register(record("n1", NodeState::Available), "a", t(0), tx, vec![], 0);
        let held = r.live_session_of_another(&id, "b", t(5), within).unwrap();
        assert_eq!((held.instance.as_str(), held.last_heard), ("a", t(0)));
        assert!(
            r.live_session_of_another(&id, "", t(5), within).is_some(),
            "an agent without an instance id is another agent"
        );
        assert_eq!(
            r.live_session_of_another(&id, "a", t(5), within),
            None,
            "the same process may replace its own session"
        );
        assert_eq!(
            r.live_session_of_another(&id, "b", t(10), within),
            None,
            "silent for the whole window: no longer live"
        );
        assert!(r.heartbeat(&id, s, pb::Heartbeat::default(), t(9)));
        assert!(r.live_session_of_another(&id, "b", t(10), within).is_some());
        r.disconnect(&id, s);
        assert_eq!(
            r.live_session_of_another(&id, "b", t(10), within),
            None,
            "a closed session holds nothing"
        );
    }

    #[test]
    fn a_newer_session_replaces_the_old_one() {
        let r = NodeRegistry::load(vec![], t(0));
        let id = NodeId::try_from("n1".to_string()).unwrap();
        let (tx1, _rx1) = mpsc::channel(4);
        let (tx2, _rx2) = mpsc::channel(4);
        let s1 = r.register(
            record("n1", NodeState::Available),
            "i1",
            t(0),
            tx1,
            vec![],
            0,
        );
        let s2 = r.register(
            record("n1", NodeState::Available),
            "i1",
            t(1),
            tx2,
            vec![],
            0,
        );
        assert!(!r.heartbeat(&id, s1, pb::Heartbeat::default(), t(2)));
        assert!(r.heartbeat(&id, s2, pb::Heartbeat::default(), t(2)));
        r.disconnect(&id, s1);
        assert_eq!(
            r.get(&id).unwrap().session,
            Some(s2),
            "stale disconnect is ignored"
        );
    }
}
