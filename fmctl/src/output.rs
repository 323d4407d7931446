//! Rendering of jobs, nodes and events as aligned tables or JSON.

use chrono::{DateTime, Utc};
use fmsched_proto::convert::job_spec_from_proto;
use fmsched_proto::v1 as pb;
use serde_json::{Value, json};

/// Output format chosen with `--output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

fn time(t: &Option<prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    t.as_ref()
        .and_then(|t| DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
}

fn time_str(t: &Option<prost_types::Timestamp>) -> String {
    time(t)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

fn rfc3339(t: &Option<prost_types::Timestamp>) -> Value {
    time(t)
        .map(|d| Value::String(d.to_rfc3339()))
        .unwrap_or(Value::Null)
}

/// `JOB_STATE_RUNNING` → `running`.
fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix)
        .unwrap_or(full)
        .to_ascii_lowercase()
}

pub fn job_state(v: i32) -> String {
    pb::JobState::try_from(v)
        .map(|s| enum_name(s.as_str_name(), "JOB_STATE_"))
        .unwrap_or_else(|_| format!("unknown({v})"))
}

pub fn node_state(v: i32) -> String {
    pb::NodeState::try_from(v)
        .map(|s| enum_name(s.as_str_name(), "NODE_STATE_"))
        .unwrap_or_else(|_| format!("unknown({v})"))
}

/// A node's scheduling hold: `schedulable`, `cordoned`, `draining`,
/// `drained`.
pub fn node_scheduling(v: i32) -> String {
    pb::NodeScheduling::try_from(v)
        .map(|s| enum_name(s.as_str_name(), "NODE_SCHEDULING_"))
        .unwrap_or_else(|_| format!("unknown({v})"))
}

/// A node's state with its hold, as the tables show it: `available`, or
/// `available,cordoned` (kubectl's `Ready,SchedulingDisabled`).
fn node_state_with_hold(n: &pb::Node) -> String {
    match pb::NodeScheduling::try_from(n.scheduling) {
        Ok(pb::NodeScheduling::Schedulable | pb::NodeScheduling::Unspecified) => {
            node_state(n.state)
        }
        _ => format!("{},{}", node_state(n.state), node_scheduling(n.scheduling)),
    }
}

/// Renders rows as a left-aligned table with a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<width$}  ", width = w[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    for r in rows {
        out.push(line(r.iter().map(String::as_str).collect()));
    }
    out.join("\n")
}

pub fn job_json(j: &pb::Job) -> Value {
    let spec = j
        .spec
        .clone()
        .and_then(|s| job_spec_from_proto(s).ok())
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    json!({
        "id": j.id,
        "owner": j.owner,
        "state": job_state(j.state),
        "state_reason": j.state_reason,
        "created_at": rfc3339(&j.created_at),
        "updated_at": rfc3339(&j.updated_at),
        "output_path": (!j.output_path.is_empty()).then_some(&j.output_path),
        "idempotency_key": (!j.idempotency_key.is_empty()).then_some(&j.idempotency_key),
        "last_event_sequence": j.last_event_sequence,
        "predicted_finish": rfc3339(&j.predicted_finish),
        "at_risk": j.at_risk,
        "lease_until": rfc3339(&j.lease_until),
        "reward_steps": j.reward_steps.iter().map(|r| json!({"by": rfc3339(&r.by), "reward": r.reward})).collect::<Vec<_>>(),
        "spec": spec,
    })
}

/// The deadline column: its time, with `(at risk)` when the last round
/// predicted a miss; `-` without one.
fn deadline_cell(j: &pb::Job, deadline: &Option<prost_types::Timestamp>) -> String {
    match deadline {
        Some(_) if j.at_risk => format!("{} (at risk)", time_str(deadline)),
        Some(_) => time_str(deadline),
        None => "-".into(),
    }
}

pub fn jobs_table(jobs: &[pb::Job]) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let s = j.spec.clone().unwrap_or_default();
            let r = s.resources.unwrap_or_default();
            vec![
                j.id.clone(),
                s.name,
                j.owner.clone(),
                s.model,
                s.dataset.map(|d| d.task).unwrap_or_default(),
                format!("{}-{}", r.min_gpus, r.max_gpus),
                job_state(j.state),
                time_str(&j.created_at),
                deadline_cell(j, &s.deadline),
                time_str(&j.predicted_finish),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "NAME",
            "OWNER",
            "MODEL",
            "TASK",
            "GPUS",
            "STATE",
            "SUBMITTED",
            "DEADLINE",
            "PREDICTED FINISH",
        ],
        &rows,
    )
}

/// `fmctl job`: the job, why it waits when it does ([`waiting_reason`]:
/// the state's own reason no longer says what holds it back), its spec, and
/// the last [`RECENT_EVENTS`] events of `history`.
pub fn job_detail(j: &pb::Job, history: &[pb::JobEvent]) -> String {
    let v = job_json(j);
    let spec_yaml = serde_yaml_ng::to_string(&v["spec"]).unwrap_or_default();
    let mut s = format!(
        "ID:          {}\nOwner:       {}\nState:       {}\n",
        j.id,
        j.owner,
        job_state(j.state)
    );
    if !j.state_reason.is_empty() {
        s.push_str(&format!("Reason:      {}\n", j.state_reason));
    }
    if let Some(why) = waiting_reason(j, history) {
        s.push_str(&format!("Waiting:     {why}\n"));
    }
    s.push_str(&format!(
        "Submitted:   {}\nUpdated:     {}\n",
        time_str(&j.created_at),
        time_str(&j.updated_at)
    ));
    let prompt_job = j
        .spec
        .as_ref()
        .is_some_and(|s| s.kind == pb::JobKind::PromptTuning as i32);
    if prompt_job {
        s.push_str("Kind:        prompt tuning\n");
    }
    if !j.output_path.is_empty() {
        let what = if prompt_job {
            "Prompt:     "
        } else {
            "Output:     "
        };
        s.push_str(&format!("{what} {}\n", j.output_path));
    }
    if j.predicted_finish.is_some() {
        s.push_str(&format!(
            "Finishes:    {} (predicted)\n",
            time_str(&j.predicted_finish)
        ));
    }
    if let Some(d) = j.spec.as_ref().and_then(|s| s.deadline) {
        s.push_str(&format!("Deadline:    {}\n", deadline_cell(j, &Some(d))));
    }
    if !j.reward_steps.is_empty() {
        let steps: Vec<String> = j
            .reward_steps
            .iter()
            .map(|r| format!("{} by {}", r.reward, time_str(&r.by)))
            .collect();
        s.push_str(&format!("Reward:      {}\n", steps.join(", ")));
    }
    if j.lease_until.is_some() {
        s.push_str(&format!("Lease until: {}\n", time_str(&j.lease_until)));
    }
    s.push_str("Spec:\n");
    for l in spec_yaml.lines() {
        s.push_str(&format!("  {l}\n"));
    }
    if !history.is_empty() {
        let skip = history.len().saturating_sub(RECENT_EVENTS);
        s.push_str(&format!(
            "\nEvents ({} of {}, `fmctl watch {}` for all):\n",
            history.len() - skip,
            history.len(),
            j.id
        ));
        for e in &history[skip..] {
            s.push_str(&format!("  {}\n", event_line(e)));
        }
    }
    s.trim_end().to_string()
}

/// Events `fmctl job` shows at the end, newest last.
pub const RECENT_EVENTS: usize = 10;

/// Why a job that has not started (or was put back) waits: the newest
/// `unschedulable` event after its last change of state.
pub fn waiting_reason<'e>(j: &pb::Job, history: &'e [pb::JobEvent]) -> Option<&'e str> {
    let waits = [pb::JobState::Submitted, pb::JobState::Queued]
        .iter()
        .any(|s| *s as i32 == j.state);
    if !waits {
        return None;
    }
    history
        .iter()
        .rev()
        .take_while(|e| e.to_state == 0)
        .find(|e| e.kind == "unschedulable")
        .map(|e| e.message.strip_prefix("waiting: ").unwrap_or(&e.message))
}

pub fn event_line(e: &pb::JobEvent) -> String {
    let change = if e.to_state != 0 {
        if e.from_state != 0 {
            format!("{} -> {}", job_state(e.from_state), job_state(e.to_state))
        } else {
            job_state(e.to_state)
        }
    } else {
        String::new()
    };
    format!(
        "{}  #{}  {:<14} {:<22} {}",
        time_str(&e.time),
        e.sequence,
        e.kind,
        change,
        e.message
    )
    .trim_end()
    .to_string()
}

pub fn event_json(e: &pb::JobEvent) -> Value {
    json!({
        "sequence": e.sequence,
        "job_id": e.job_id,
        "time": rfc3339(&e.time),
        "kind": e.kind,
        "from_state": (e.from_state != 0).then(|| job_state(e.from_state)),
        "to_state": (e.to_state != 0).then(|| job_state(e.to_state)),
        "message": e.message,
    })
}

const GIB: f64 = (1u64 << 30) as f64;

pub fn node_json(n: &pb::Node) -> Value {
    json!({
        "id": n.id,
        "hostname": n.hostname,
        "state": node_state(n.state),
        "scheduling": node_scheduling(n.scheduling),
        "cordoned_by": (!n.cordoned_by.is_empty()).then_some(&n.cordoned_by),
        "cordon_reason": (!n.cordon_reason.is_empty()).then_some(&n.cordon_reason),
        "cordoned_at": rfc3339(&n.cordoned_at),
        "connected": n.connected,
        "gpu_backend": n.gpu_backend,
        "agent_version": n.agent_version,
        "labels": n.labels,
        "registered_at": rfc3339(&n.registered_at),
        "last_heartbeat_at": rfc3339(&n.last_heartbeat_at),
        "gpus": n.gpus.iter().map(|g| {
            let i = g.info.clone().unwrap_or_default();
            let t = g.telemetry.as_ref();
            json!({
                "uuid": i.uuid, "index": i.index, "model": i.model,
                "memory_total_bytes": i.memory_total_bytes, "pci_bus_id": i.pci_bus_id,
                "allocated_to_job": (!g.allocated_to_job.is_empty()).then_some(&g.allocated_to_job),
                "telemetry": t.map(|t| json!({
                    "utilization_percent": t.utilization_percent,
                    "memory_used_bytes": t.memory_used_bytes,
                    "memory_total_bytes": t.memory_total_bytes,
                    "temperature_celsius": t.temperature_celsius,
                    "power_watts": t.power_watts,
                    "ecc_corrected_errors": t.ecc_corrected_errors,
                    "ecc_uncorrected_errors": t.ecc_uncorrected_errors,
                    "xid_errors": t.xid_errors,
                    "processes": t.processes.iter().map(|p| json!({"pid": p.pid, "used_memory_bytes": p.used_memory_bytes, "utilization_percent": p.utilization_percent})).collect::<Vec<_>>(),
                })),
            })
        }).collect::<Vec<_>>(),
    })
}

/// One row per GPU, grouped by node.
pub fn nodes_table(nodes: &[pb::Node]) -> String {
    let mut rows = Vec::new();
    for n in nodes {
        let hb = time_str(&n.last_heartbeat_at);
        if n.gpus.is_empty() {
            rows.push(vec![
                n.id.clone(),
                node_state_with_hold(n),
                n.gpu_backend.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                hb.clone(),
            ]);
        }
        for g in &n.gpus {
            let i = g.info.clone().unwrap_or_default();
            let (util, mem, temp, power) = match &g.telemetry {
                Some(t) => (
                    format!("{}%", t.utilization_percent),
                    format!(
                        "{:.1}/{:.0} GiB",
                        t.memory_used_bytes as f64 / GIB,
                        t.memory_total_bytes as f64 / GIB
                    ),
                    format!("{}C", t.temperature_celsius),
                    format!("{:.0}W", t.power_watts),
                ),
                None => (
                    "-".into(),
                    format!("-/{:.0} GiB", i.memory_total_bytes as f64 / GIB),
                    "-".into(),
                    "-".into(),
                ),
            };
            rows.push(vec![
                n.id.clone(),
                node_state_with_hold(n),
                n.gpu_backend.clone(),
                i.index.to_string(),
                i.model,
                util,
                mem,
                temp,
                power,
                hb.clone(),
            ]);
        }
    }
    table(
        &[
            "NODE",
            "STATE",
            "BACKEND",
            "GPU",
            "MODEL",
            "UTIL",
            "MEMORY",
            "TEMP",
            "POWER",
            "LAST HEARTBEAT",
        ],
        &rows,
    )
}

/// The policy in force, as `fmctl admin policy` prints it.
pub fn policy_text(p: &pb::PolicySetting) -> String {
    let by = if p.source == "admin" {
        format!(" (set by {} at {})", p.set_by, time_str(&p.set_at))
    } else {
        " (from the scheduler's configuration)".into()
    };
    let knobs: std::collections::BTreeMap<_, _> = p.knobs.iter().collect();
    let knobs: Vec<String> = knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "policy:      {}{by}\ninterval:    {} s\nknobs:       {}\nknown knobs: {}",
        p.policy,
        p.interval_s,
        if knobs.is_empty() {
            "(defaults)".into()
        } else {
            knobs.join(" ")
        },
        p.known_knobs.join(", ")
    )
}

pub fn policy_json(p: &pb::PolicySetting) -> Value {
    json!({
        "policy": p.policy,
        "knobs": p.knobs.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "known_knobs": p.known_knobs,
        "interval_s": p.interval_s,
        "source": p.source,
        "set_by": (!p.set_by.is_empty()).then_some(&p.set_by),
        "set_at": rfc3339(&p.set_at),
    })
}

/// The queues in force, as `fmctl admin queues` prints them.
pub fn queues_text(q: &pb::QueueSetting) -> String {
    let by = if q.source == "admin" {
        format!("set by {} at {}", q.set_by, time_str(&q.set_at))
    } else {
        "from the scheduler's configuration".into()
    };
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    let rows: Vec<Vec<String>> = q
        .status
        .iter()
        .map(|st| {
            let spec = q.queues.iter().find(|s| s.name == st.name);
            vec![
                if st.name.is_empty() {
                    "(cluster)".into()
                } else {
                    st.name.clone()
                },
                spec.map_or("-".into(), |s| {
                    if s.parent.is_empty() {
                        "-".into()
                    } else {
                        s.parent.clone()
                    }
                }),
                spec.map_or("-".into(), |s| s.guaranteed_gpus.to_string()),
                spec.map_or("-".into(), |s| {
                    s.over_quota_weight.unwrap_or(1.0).to_string()
                }),
                spec.map_or("-".into(), |s| opt(s.limit_gpus)),
                opt(st.deserved_gpus),
                opt(st.demand_gpus),
                st.used_gpus.to_string(),
                st.running_jobs.to_string(),
                st.waiting_jobs.to_string(),
            ]
        })
        .collect();
    format!(
        "queues {by}\n{}",
        table(
            &[
                "QUEUE",
                "PARENT",
                "GUARANTEED",
                "WEIGHT",
                "LIMIT",
                "DESERVED",
                "DEMAND",
                "USED",
                "RUNNING",
                "WAITING",
            ],
            &rows,
        )
    )
}

pub fn queues_json(q: &pb::QueueSetting) -> Value {
    json!({
        "source": q.source,
        "set_by": (!q.set_by.is_empty()).then_some(&q.set_by),
        "set_at": rfc3339(&q.set_at),
        "queues": q.queues.iter().map(|s| json!({
            "name": s.name,
            "parent": (!s.parent.is_empty()).then_some(&s.parent),
            "guaranteed_gpus": s.guaranteed_gpus,
            "over_quota_weight": s.over_quota_weight.unwrap_or(1.0),
            "limit_gpus": s.limit_gpus,
            "models": s.models,
            "users": s.users,
            "merge_across_queues": s.merge_across_queues.unwrap_or(true),
        })).collect::<Vec<_>>(),
        "status": q.status.iter().map(|st| json!({
            "name": st.name,
            "used_gpus": st.used_gpus,
            "running_jobs": st.running_jobs,
            "waiting_jobs": st.waiting_jobs,
            "deserved_gpus": st.deserved_gpus,
            "demand_gpus": st.demand_gpus,
        })).collect::<Vec<_>>(),
    })
}

pub fn audit_table(events: &[pb::AuditEvent]) -> String {
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                time_str(&e.at),
                e.actor.clone(),
                e.action.clone(),
                e.target.clone(),
                e.detail.clone(),
            ]
        })
        .collect();
    table(&["AT", "ACTOR", "ACTION", "TARGET", "DETAIL"], &rows)
}

pub fn audit_json(e: &pb::AuditEvent) -> Value {
    json!({
        "id": e.id, "at": rfc3339(&e.at), "actor": e.actor, "action": e.action,
        "target": e.target, "detail": e.detail,
    })
}

pub fn summary_table(s: &pb::ClusterSummary) -> String {
    let mut out = format!(
        "GPUs: {} total, {} free (on available nodes)\n",
        s.gpus_total, s.gpus_free
    );
    for m in &s.gpus_by_model {
        out.push_str(&format!(
            "  {:<16} {} total, {} free\n",
            m.model, m.total, m.free
        ));
    }
    out.push_str("Nodes:");
    for n in &s.nodes_by_state {
        out.push_str(&format!(" {}={}", node_state(n.state), n.count));
    }
    out.push_str("\nJobs: ");
    for j in &s.jobs_by_state {
        out.push_str(&format!(" {}={}", job_state(j.state), j.count));
    }
    out
}

pub fn summary_json(s: &pb::ClusterSummary) -> Value {
    json!({
        "gpus_total": s.gpus_total,
        "gpus_free": s.gpus_free,
        "gpus_by_model": s.gpus_by_model.iter().map(|m| json!({"model": m.model, "total": m.total, "free": m.free})).collect::<Vec<_>>(),
        "nodes_by_state": s.nodes_by_state.iter().map(|n| (node_state(n.state), n.count)).collect::<std::collections::BTreeMap<_, _>>(),
        "jobs_by_state": s.jobs_by_state.iter().map(|j| (job_state(j.state), j.count)).collect::<std::collections::BTreeMap<_, _>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "LONGER"],
            &[
                vec!["xxxx".into(), "y".into()],
                vec!["z".into(), "w".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "A     LONGER");
        assert_eq!(lines[1], "xxxx  y");
        assert_eq!(lines[2], "z     w");
    }

    fn event(seq: i64, kind: &str, to: pb::JobState, message: &str) -> pb::JobEvent {
        pb::JobEvent {
            sequence: seq,
            kind: kind.into(),
            to_state: to as i32,
            message: message.into(),
            ..Default::default()
        }
    }

    /// `fmctl job` says why a waiting job waits (the newest `unschedulable`
    /// event since its last change of state, which its state's reason no
    /// longer says) and shows its last events; a running job or one whose
    /// `unschedulable` event came before a later change shows no such line.
    #[test]
    fn a_waiting_job_says_why_and_shows_its_last_events() {
        let too_wide = "waiting: needs at least 16 GPUs and the cluster has 4";
        let mut history = vec![event(
            1,
            "submitted",
            pb::JobState::Submitted,
            "job submitted",
        )];
        for k in 0..12 {
            history.push(event(
                2 + k,
                "unschedulable",
                pb::JobState::Unspecified,
                too_wide,
            ));
        }
        history.push(event(14, "state_changed", pb::JobState::Queued, "profiled"));
        history.push(event(
            15,
            "unschedulable",
            pb::JobState::Unspecified,
            too_wide,
        ));
        let mut job = pb::Job {
            id: "j".into(),
            state: pb::JobState::Queued as i32,
            state_reason: "profiled".into(),
            last_event_sequence: 15,
            ..Default::default()
        };
        assert_eq!(
            waiting_reason(&job, &history),
            Some("needs at least 16 GPUs and the cluster has 4")
        );
        let text = job_detail(&job, &history);
        let lines: Vec<&str> = text.lines().collect();
        let reason = lines.iter().position(|l| l.starts_with("Reason:")).unwrap();
        assert_eq!(
            lines[reason + 1],
            "Waiting:     needs at least 16 GPUs and the cluster has 4"
        );
        assert!(
            text.contains("Events (10 of 15, `fmctl watch j` for all):"),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| l.contains("#")).count(),
            10,
            "{text}"
        );
        assert!(text.trim_end().ends_with(too_wide), "newest last:\n{text}");
        // A change of state after the note: it no longer says why.
        history.push(event(
            16,
            "state_changed",
            pb::JobState::Queued,
            "re-queued",
        ));
        assert_eq!(waiting_reason(&job, &history), None);
        // Running: nothing waits.
        history.pop();
        job.state = pb::JobState::Running as i32;
        assert_eq!(waiting_reason(&job, &history), None);
        // No history, no events section.
        assert!(!job_detail(&job, &[]).contains("Events"));
    }

    #[test]
    fn enum_names_are_short() {
        assert_eq!(job_state(pb::JobState::Running as i32), "running");
        assert_eq!(node_state(pb::NodeState::Suspect as i32), "suspect");
        assert_eq!(job_state(99), "unknown(99)");
    }
}
